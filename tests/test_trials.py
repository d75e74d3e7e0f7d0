"""The Tune adapter and what it prepares: a real Tune run of tiny trainers, the data cache, the frozen check."""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path

import numpy as np
import pytest

from ralph_ray import harness
from ralph_ray.datacache import PublicData, check_frozen, materialise_data
from ralph_ray.runner import Limits, TrialFailed
from ralph_ray.scoring import PREDICTIONS_KEY
from ralph_ray.tasks.base import sha256_file
from ralph_ray.trials import FAILED_KEY, HELD_KEY, Code, Schedule, TrialSpec, run_trial
from ralph_ray.workdir import set_knobs

GOOD = """\
import numpy as np
from ralph_ray import harness
EPOCHS = 3  # epochs
data = harness.load_data()
for epoch in range(1, EPOCHS + 1):
    harness.report(epoch=epoch, val_acc=epoch / 10)
harness.save_predictions(selection=np.zeros(len(data.selection_x), int), test=np.zeros(len(data.test_x), int))
"""
DIVERGES = """\
from ralph_ray import harness
EPOCHS = 3  # epochs
harness.report(epoch=1, val_acc=float("nan"))
"""


def as_public(files: dict[str, bytes]) -> PublicData:
    """Public files as a trial receives them: their bytes and hashes."""
    return PublicData(files, {name: hashlib.sha256(content).hexdigest() for name, content in files.items()})


def public_data() -> PublicData:
    rng = np.random.default_rng(0)
    files = {}
    for name, array in {
        "train_x": rng.random((8, 2)),
        "train_y": np.arange(8) % 2,
        "selection_x": rng.random((3, 2)),
        "test_x": rng.random((2, 2)),
    }.items():
        buffer = io.BytesIO()
        np.save(buffer, array)
        files[f"{name}.npy"] = buffer.getvalue()
    files["meta.json"] = json.dumps({"num_classes": 2}).encode()
    return as_public(files)


def test_public_data_loads_writable_without_touching_its_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """User trial: every trial's stderr held torch's "The given NumPy array is not writable" (read-only memory maps);
    they map copy-on-write now: writable, and a write never reaches the read-only file."""
    import warnings

    import torch

    for name, content in public_data().files.items():
        (tmp_path / name).write_bytes(content)
        (tmp_path / name).chmod(0o444)
    monkeypatch.setenv(harness.ENV_DATA_DIR, str(tmp_path))
    data = harness.load_data()
    before = (tmp_path / "train_x.npy").read_bytes()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch's warning would raise here
        tensor = torch.as_tensor(data.train_x)
    data.train_x[0, 0] = 5.0
    assert tensor[0, 0] == 5.0 and data.train_x.flags.writeable  # shared with the tensor, as before: no copy
    assert (tmp_path / "train_x.npy").read_bytes() == before
    assert harness.load_data().train_x[0, 0] != 5.0


def test_a_tune_run_of_the_adapter(ray_session, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from ray import tune

    monkeypatch.setenv("RALPH_CACHE_DIR", str(tmp_path / "cache"))
    code = Code(
        {"good": {"train.py": GOOD.encode()}, "nan": {"train.py": DIVERGES.encode()}},
        sha256_file(Path(harness.__file__)),
    )
    spec = TrialSpec(code, public_data(), Limits(timeout_s=60), str(tmp_path / "trials"), Schedule(hold_from_epoch=2))
    tuner = tune.Tuner(
        tune.with_parameters(run_trial, spec=spec),
        param_space={"variant": tune.grid_search(["good", "nan"])},
        run_config=tune.RunConfig(storage_path=str(tmp_path / "tune"), verbose=0),
    )
    results = {r.config["variant"]: r for r in tuner.fit()}
    good = results["good"].metrics
    assert (
        good["epoch"] == 3 and [r["val_acc"] for r in json.loads(good[HELD_KEY])] == [0.2] and PREDICTIONS_KEY in good
    )
    assert "non-finite val_acc" in results["nan"].metrics[FAILED_KEY]
    assert results["nan"].metrics["val_acc"] == float("-inf")


def test_bad_knobs_fail_the_trial(tmp_path: Path):
    (tmp_path / "train.py").write_text("LR = 0.1  # rate\n")
    with pytest.raises(TrialFailed, match="cannot set knobs"):
        set_knobs(tmp_path, {"LR": object()})


def test_frozen_file_change_is_refused(tmp_path: Path):
    frozen_file = tmp_path / "train_x.npy"
    frozen_file.write_bytes(b"original")
    manifest = {str(frozen_file): sha256_file(frozen_file)}
    check_frozen(manifest)
    frozen_file.write_bytes(b"tampered")
    with pytest.raises(TrialFailed, match="changed since the campaign started"):
        check_frozen(manifest)
    frozen_file.unlink()
    with pytest.raises(TrialFailed, match="missing"):
        check_frozen(manifest)


def test_public_data_is_materialised_once_per_node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("RALPH_CACHE_DIR", str(tmp_path / "cache"))
    files = {"train_x.npy": b"abc", "meta.json": b"{}"}
    data = as_public(files)
    first = materialise_data(data)
    assert {p.name: p.read_bytes() for p in first.iterdir()} == files
    stamps = {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in first.iterdir()}

    def no_rewrite(path: Path, content: bytes) -> int:
        raise AssertionError(f"{path} was written again")

    with monkeypatch.context() as m:  # the second trial on this node writes nothing: it reuses the cached files
        m.setattr(Path, "write_bytes", no_rewrite)
        assert materialise_data(data) == first
    assert {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in first.iterdir()} == stamps
    assert [p.name for p in first.parent.iterdir()] == [first.name]  # no temp folder left beside it
    check_frozen({str(first / name): digest for name, digest in data.hashes.items()})

    (first / "meta.json").unlink()  # a cleaner of /tmp took one file: the next trial puts it back, leaves the other
    assert materialise_data(data) == first
    assert {p.name: p.read_bytes() for p in first.iterdir()} == files
    assert (first / "train_x.npy").stat().st_ino == stamps["train_x.npy"][0]
    assert [p.name for p in first.parent.iterdir()] == [first.name]
    check_frozen({str(first / name): digest for name, digest in data.hashes.items()})


def test_a_data_cache_it_cannot_mend_fails_the_trial_with_what_is_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("RALPH_CACHE_DIR", str(tmp_path / "cache"))
    files = {"train_x.npy": b"abc"}
    data = as_public(files)
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / data.key).write_text("a file where the cache folder goes")
    root = materialise_data(data)  # no OSError out of it (Tune would retry the trial): the frozen check says why
    assert [p.name for p in root.parent.iterdir()] == [data.key]  # and no temp folder is left
    with pytest.raises(TrialFailed, match="missing"):
        check_frozen({str(root / name): digest for name, digest in data.hashes.items()})


LAST_EPOCH_TRAINER = """\
import time
import numpy as np
from ralph_ray import harness
EPOCHS = {epochs}
data = harness.load_data()
for epoch in harness.epochs(EPOCHS):
    harness.report(epoch=epoch, val_acc={value})
time.sleep(1)  # its prediction pass: ASHA's answer to the last report arrives before the predictions
harness.save_predictions(selection=np.zeros(len(data.selection_x), int), test=np.zeros(len(data.test_x), int))
"""


def test_a_trial_whose_epochs_end_on_a_rung_is_held_for_its_predictions_not_stopped_there(
    ray_session, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """User trial: with EPOCHS searched, an EPOCHS=2 trial under max_t 6 (rungs at 2 and 4) trained both epochs and
    wrote its predictions, but ASHA stopped it at its epoch-2 report: recorded stopped_early, never scored. Its last
    epoch's report is held for its predictions now, as at max_t."""
    from ray import tune

    from ralph_ray.asha import NoiseAwareASHA

    monkeypatch.setenv("RALPH_CACHE_DIR", str(tmp_path / "cache"))
    code = Code(
        {
            "long": {"train.py": LAST_EPOCH_TRAINER.format(epochs=6, value=0.9).encode()},
            "short": {"train.py": LAST_EPOCH_TRAINER.format(epochs=2, value=0.1).encode()},
        },
        sha256_file(Path(harness.__file__)),
    )
    # As search.trial_spec and search.scheduler build them for scheduler.max_t=6, grace 2, reduction 2, margin 0
    spec = TrialSpec(code, public_data(), Limits(timeout_s=60), str(tmp_path / "trials"), Schedule(hold_from_epoch=6))
    asha = NoiseAwareASHA(margin=0.0, z=2.0, last=6, time_attr="epoch", max_t=7, grace_period=2, reduction_factor=2)
    tuner = tune.Tuner(
        tune.with_parameters(run_trial, spec=spec),
        param_space={"variant": tune.grid_search(["long", "short"])},
        tune_config=tune.TuneConfig(metric="val_acc", mode="max", scheduler=asha, max_concurrent_trials=1),
        run_config=tune.RunConfig(storage_path=str(tmp_path / "tune"), verbose=0),
    )
    results = {r.config["variant"]: r.metrics for r in tuner.fit()}
    assert results["long"]["epoch"] == 6 and PREDICTIONS_KEY in results["long"]
    short = results["short"]
    assert short["epoch"] == 2 and short["val_acc"] == 0.1  # below the rung-2 cutoff (0.5): plain ASHA stops it
    assert PREDICTIONS_KEY in short  # its last epoch was held for its predictions: the ledger scores it
