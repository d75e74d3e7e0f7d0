"""The checkpoint contract: harness.save/load_checkpoint, the trial driver's forwarding of new checkpoints,
both seed trainers resuming exactly where they left off, and where Tune's storage goes (paths.storage)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ralph_ray import PROJECT_ROOT, harness
from ralph_ray.config import load_config
from ralph_ray.knobs import rewrite_knobs
from ralph_ray.search import storage_path
from ralph_ray.tasks.base import Splits, write_public
from ralph_ray.tasks.digits import prepare
from ralph_ray.trials import CheckpointForwarder

HARNESS_RUN = """
import json, os, sys
from ralph_ray import harness
assert harness.load_checkpoint() is None
for epoch in (1, 2, 3):
    harness.save_checkpoint({"epoch": epoch})
print(json.dumps(harness.load_checkpoint()))
"""


def run_python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("RALPH_")}
    return subprocess.run(
        [sys.executable, "-c", code], env={**clean, **env}, capture_output=True, text=True, timeout=120
    )


def test_save_and_load_only_where_the_engine_asks_for_checkpoints(tmp_path: Path):
    by_hand = run_python(HARNESS_RUN)
    assert by_hand.returncode == 0, by_hand.stderr
    assert by_hand.stdout.strip() == "null"  # no RALPH_CHECKPOINT_DIR: nothing saved, nothing to resume

    every_epoch = run_python(HARNESS_RUN, RALPH_CHECKPOINT_DIR=str(tmp_path / "a"), RALPH_CHECKPOINT_EVERY_S="0")
    assert json.loads(every_epoch.stdout) == {"epoch": 3}
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == [harness.CHECKPOINT_FILE]  # no temp file left

    throttled = run_python(HARNESS_RUN, RALPH_CHECKPOINT_DIR=str(tmp_path / "b"), RALPH_CHECKPOINT_EVERY_S="600")
    assert json.loads(throttled.stdout) == {"epoch": 1}  # the first save, then none within 600 s


AHEAD_RUN = """
from ralph_ray import harness
for epoch in (1, 2, 3, 4):
    if epoch != 3:  # epoch 3 saves nothing (a throttled save)
        harness.save_checkpoint({"epoch": epoch})
    harness.report(epoch=epoch, val_acc=0.5)
"""


def test_forwarder_sends_each_epoch_its_own_checkpoint_though_the_trainer_ran_ahead(tmp_path: Path):
    folder, metrics = tmp_path / "checkpoint", tmp_path / "metrics.jsonl"
    # The trainer finishes all its epochs before the driver reads a single report (as while Tune holds one).
    ran = run_python(
        AHEAD_RUN, RALPH_CHECKPOINT_DIR=str(folder), RALPH_CHECKPOINT_EVERY_S="0", RALPH_METRICS_FILE=str(metrics)
    )
    assert ran.returncode == 0, ran.stderr
    sent: list[tuple[int, int | None]] = []

    def report(record: dict, checkpoint=None) -> None:
        import torch

        saved = None
        if checkpoint is not None:
            saved = torch.load(Path(checkpoint.path) / harness.CHECKPOINT_FILE, weights_only=False)["epoch"]
        sent.append((record["epoch"], saved))

    forward = CheckpointForwarder(folder, report)
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    forward(records[1])  # epoch 1's report was held back (the last rung): never sent with its checkpoint
    for record in records[2:]:
        forward(record)
    assert sent == [(2, 2), (3, None), (4, 4)]  # each report with its own epoch's weights, not the latest
    assert sorted(p.name for p in folder.iterdir()) == [harness.CHECKPOINT_FILE]  # kept copies all gone
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint", "metrics.jsonl"]  # no snapshot left


def test_a_restart_never_resumes_from_an_earlier_attempts_own_checkpoint(tmp_path: Path):
    from ray import tune

    from ralph_ray.trials import restore_checkpoint

    folder = tmp_path / "checkpoint"
    folder.mkdir()
    (folder / harness.CHECKPOINT_FILE).write_bytes(b"epoch 4: ahead of what Tune took")
    assert restore_checkpoint(None, folder) is False and not folder.exists()  # Tune has none: start fresh
    tunes = tmp_path / "tunes"
    tunes.mkdir()
    (tunes / harness.CHECKPOINT_FILE).write_bytes(b"epoch 2")
    folder.mkdir()
    (folder / harness.epoch_checkpoint(3)).write_bytes(b"epoch 3")
    assert restore_checkpoint(tune.Checkpoint.from_directory(str(tunes)), folder) is True
    assert sorted(p.name for p in folder.iterdir()) == [harness.CHECKPOINT_FILE]
    assert (folder / harness.CHECKPOINT_FILE).read_bytes() == b"epoch 2"


def run_trainer(task: str, data: Path, work: Path, knobs: dict, checkpoint: Path) -> tuple[list[dict], dict]:
    work.mkdir()
    (work / "train.py").write_text(rewrite_knobs((PROJECT_ROOT / "trainers" / task / "train.py").read_text(), knobs))
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("RALPH_")},
        "RALPH_DATA_DIR": str(data),
        "RALPH_METRICS_FILE": str(work / "m.jsonl"),
        "RALPH_PREDICTIONS_FILE": str(work / "p.npz"),
        "OMP_NUM_THREADS": "1",
        "RALPH_DEVICE": "cpu",
        "RALPH_CHECKPOINT_DIR": str(checkpoint),
        "RALPH_CHECKPOINT_EVERY_S": "600",
    }
    result = subprocess.run(
        [sys.executable, "train.py"], cwd=work, env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-2000:]
    predictions = np.load(work / "p.npz")
    return [json.loads(line) for line in (work / "m.jsonl").read_text().splitlines()], {
        k: predictions[k] for k in predictions.files
    }


def cifar_like(tmp_path: Path) -> Path:
    rng = np.random.default_rng(0)
    image = lambda n: rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8)  # noqa: E731
    labels = lambda n: rng.integers(0, 10, n)  # noqa: E731
    write_public(
        Splits(image(300), labels(300), image(24), labels(24), image(16), labels(16), 10), tmp_path / "data", "cifar10"
    )
    return tmp_path / "data"


@pytest.mark.parametrize(
    "task,knobs",
    [
        ("digits", {"EPOCHS": 3}),
        ("cifar10", {"EPOCHS": 2, "BATCH_SIZE": 128, "WIDTH1": 8, "WIDTH2": 16, "WIDTH3": 16, "VAL_FRACTION": 0.1}),
    ],
)
def test_seed_trainer_resumed_from_its_first_epoch_matches_an_uninterrupted_run(task: str, knobs: dict, tmp_path: Path):
    if task == "digits":
        write_public(prepare(0, 0.2, 0.2), tmp_path / "data", "digits")
        data = tmp_path / "data"
    else:
        data = cifar_like(tmp_path)
    # Throttled to one checkpoint per 600 s, the whole run leaves the checkpoint of its first epoch:
    # what a trial lost during its second epoch would resume from.
    whole, whole_predictions = run_trainer(task, data, tmp_path / "whole", knobs, tmp_path / "checkpoint")
    resumed, resumed_predictions = run_trainer(task, data, tmp_path / "resumed", knobs, tmp_path / "checkpoint")
    assert [r["epoch"] for r in resumed] == [r["epoch"] for r in whole][1:]
    for before, after in zip(whole[1:], resumed):
        for key in ("train_loss", "val_loss", "val_acc", "lr", "grad_norm"):
            assert after[key] == pytest.approx(before[key], rel=1e-5, abs=1e-7), key
    for split in ("selection", "test"):
        assert (resumed_predictions[split] == whole_predictions[split]).all()


def test_tune_storage_is_the_run_dir_or_its_mirror_under_paths_storage(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(tmp_path)
    local = tmp_path / "runs" / "r1" / "cycle_0002" / "tune"
    assert storage_path(load_config([f"paths.runs={tmp_path / 'runs'}"]), local) == str(local)
    for storage, expected in (
        ("s3://bucket/ralph/", "s3://bucket/ralph/r1/cycle_0002/tune"),
        ("file:///mnt/shared", "file:///mnt/shared/r1/cycle_0002/tune"),
        ("shared", f"{tmp_path / 'shared'}/r1/cycle_0002/tune"),
    ):
        cfg = load_config([f"paths.runs={tmp_path / 'runs'}", f"paths.storage={storage}"])
        assert storage_path(cfg, local) == expected
