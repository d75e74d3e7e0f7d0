"""The fashion task: its prepare against small files in the real idx/gzip format that the tests write (and corrupt),
the missing-data exit, and a 2-cycle campaign on a stratified subsample of the real data (Debian's package)."""

from __future__ import annotations

import gzip
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ralph_ray import PROJECT_ROOT, sandbox
from ralph_ray.__main__ import main
from ralph_ray.config import DataConfig, TaskConfig
from ralph_ray.kb import open_reader
from ralph_ray.knobs import rewrite_knobs
from ralph_ray.tasks import TASKS
from ralph_ray.tasks.base import DataError, write_public
from ralph_ray.tasks.folder import prepare_module

fashion = prepare_module(TASKS["fashion"].folder)
PER_CLASS = 12  # official-train images per class in the written files
PER_CLASS_TEST = 3


def write_idx(path: Path, magic: int, array: np.ndarray) -> None:
    """A gzipped idx file as the dataset ships it: big-endian magic, one uint32 per dimension, then the bytes."""
    header = magic.to_bytes(4, "big") + b"".join(int(n).to_bytes(4, "big") for n in array.shape)
    path.write_bytes(gzip.compress(header + np.ascontiguousarray(array, dtype=np.uint8).tobytes()))


def write_dataset(folder: Path) -> dict[str, np.ndarray]:
    """The four files with random 28x28 images, each class equally often; returns what was written."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    written = {}
    for prefix, per_class in (("train", PER_CLASS), ("t10k", PER_CLASS_TEST)):
        labels = rng.permutation(np.repeat(np.arange(10, dtype=np.uint8), per_class))
        images = rng.integers(0, 256, (len(labels), 28, 28), dtype=np.uint8)
        write_idx(folder / f"{prefix}-images-idx3-ubyte.gz", fashion.IMAGES_MAGIC, images)
        write_idx(folder / f"{prefix}-labels-idx1-ubyte.gz", fashion.LABELS_MAGIC, labels)
        written[f"{prefix}_images"], written[f"{prefix}_labels"] = images, labels
    return written


def settings(subsample: int = 0) -> TaskConfig:
    return TaskConfig(name="fashion", trainer="trainers/fashion", subsample=subsample)


def test_prepare_reads_the_idx_format(tmp_path: Path):
    written = write_dataset(tmp_path)
    splits = fashion.prepare(settings(), DataConfig(root=str(tmp_path)))
    assert splits.num_classes == 10
    assert splits.train_x.shape == (100, 1, 28, 28) and splits.train_x.dtype == np.uint8
    assert splits.selection_x.shape == (20, 1, 28, 28)  # a sixth of the official train set, as 10,000 of 60,000
    assert np.bincount(splits.selection_y).tolist() == [2] * 10  # stratified
    assert np.array_equal(splits.test_x[:, 0], written["t10k_images"])  # the official test set, as it is
    assert np.array_equal(splits.test_y, written["t10k_labels"])
    # every official train image is in train or selection, once, with its own label
    pool = {written["train_images"][i].tobytes(): written["train_labels"][i] for i in range(10 * PER_CLASS)}
    seen = [
        (x[0].tobytes(), y)
        for x, y in zip(
            np.concatenate([splits.train_x, splits.selection_x]), np.concatenate([splits.train_y, splits.selection_y])
        )
    ]
    assert len({image for image, _ in seen}) == 10 * PER_CLASS and all(pool[image] == y for image, y in seen)
    again = fashion.prepare(settings(), DataConfig(root=str(tmp_path)))
    assert np.array_equal(again.selection_x, splits.selection_x)  # a fixed seed: the same split every time
    other = fashion.split(tmp_path, split_seed=1)
    assert not np.array_equal(other.selection_x, splits.selection_x)


def test_subsample_is_stratified_and_split_alike(tmp_path: Path):
    write_dataset(tmp_path)
    splits = fashion.prepare(settings(subsample=60), DataConfig(root=str(tmp_path)))
    assert [len(splits.train_y), len(splits.selection_y), len(splits.test_y)] == [50, 10, 10]
    for labels in (splits.train_y, splits.selection_y, splits.test_y):
        assert len(set(np.bincount(labels, minlength=10).tolist())) == 1  # every class equally often
    with pytest.raises(DataError, match="task.subsample=7 is out of range"):
        fashion.prepare(settings(subsample=7), DataConfig(root=str(tmp_path)))


def test_missing_data_names_the_package_and_data_root(tmp_path: Path):
    with pytest.raises(DataError) as info:
        fashion.prepare(settings(), DataConfig(root=str(tmp_path)))
    message = str(info.value)
    assert "apt-get install dataset-fashion-mnist" in message and "data.root=" in message
    assert "train-images-idx3-ubyte.gz" in message and str(tmp_path) in message
    assert fashion.root(DataConfig(root=None)) == Path("/usr/share/datasets/fashion-mnist")


def test_a_wrong_magic_number_is_named(tmp_path: Path):
    write_dataset(tmp_path)
    labels = np.zeros(10 * PER_CLASS, dtype=np.uint8)  # a labels file where the images should be
    write_idx(tmp_path / "train-images-idx3-ubyte.gz", fashion.LABELS_MAGIC, labels)
    with pytest.raises(DataError, match="magic number 2049 where an idx file of this kind has 2051"):
        fashion.prepare(settings(), DataConfig(root=str(tmp_path)))


def test_a_truncated_file_is_named(tmp_path: Path):
    write_dataset(tmp_path)
    target = tmp_path / "t10k-images-idx3-ubyte.gz"
    whole = target.read_bytes()
    target.write_bytes(whole[: len(whole) // 2])  # a download cut off half way
    with pytest.raises(DataError, match=r"t10k-images-idx3-ubyte.gz is not a whole gzip file \(EOFError"):
        fashion.prepare(settings(), DataConfig(root=str(tmp_path)))
    raw = gzip.decompress(whole)
    target.write_bytes(gzip.compress(raw[:-100]))  # whole gzip, but fewer image bytes than its header says
    with pytest.raises(DataError, match=r"the header says \(30, 28, 28\) \(23536 bytes\) but the file holds 23436"):
        fashion.prepare(settings(), DataConfig(root=str(tmp_path)))


def test_the_seed_trainer_runs_on_the_prepared_files(tmp_path: Path):
    write_dataset(tmp_path / "raw")
    splits = fashion.prepare(settings(), DataConfig(root=str(tmp_path / "raw")))
    write_public(splits, tmp_path / "data", "fashion")
    work = tmp_path / "work"
    work.mkdir()
    source = (PROJECT_ROOT / "trainers" / "fashion" / "train.py").read_text()
    (work / "train.py").write_text(rewrite_knobs(source, {"EPOCHS": 2, "BATCH_SIZE": 32}))
    env = {
        **os.environ,
        "RALPH_DATA_DIR": str(tmp_path / "data"),
        "RALPH_DEVICE": "cpu",
        "OMP_NUM_THREADS": "1",
        "PYTHONWARNINGS": "error::UserWarning",  # e.g. torch's warning on a read-only (memory-mapped) array
    }
    done = subprocess.run([sys.executable, "train.py"], cwd=work, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    records = [json.loads(line) for line in (work / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in records] == [1, 2]
    assert {"train_loss", "val_loss", "val_acc", "lr", "grad_norm", "epoch_seconds"} <= set(records[-1])
    predictions = np.load(work / "predictions.npz")
    assert predictions["selection"].shape == (20,) and predictions["test"].shape == (30,)
    assert 0 <= predictions["test"].min() and predictions["test"].max() < 10


def test_missing_data_exits_2_before_a_run_starts(tmp_path: Path):
    done = subprocess.run(
        [sys.executable, "-m", "ralph_ray", "+experiment=fashion", f"data.root={tmp_path / 'nowhere'}"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert "apt-get install dataset-fashion-mnist" in done.stderr
    assert "Traceback" not in done.stderr and "fashion-mnist" in done.stderr  # one clear message, no trace


@pytest.mark.slow
@pytest.mark.skipif(
    not (fashion.DEFAULT_ROOT / fashion.TRAIN_FILES[0]).is_file(),
    reason=f"Debian's dataset-fashion-mnist is not installed ({fashion.DEFAULT_ROOT} is missing): "
    "apt-get install dataset-fashion-mnist",
)
def test_a_two_cycle_campaign_on_a_subsample_of_the_real_data(
    ray_session, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.chdir(tmp_path)
    overrides = [
        "task=fashion",
        "task.subsample=1200",  # 1,000 train, 200 selection, 200 test images, stratified
        "run_id=fashion-small",
        "population.mode=generations",  # the barrier loop's cycle folders and records (the default auto runs async)
        "safeguards.max_cycles=2",
        "search.num_samples=2",
        "search.max_concurrent=2",
        "+search.space.EPOCHS={type: choice, values: [2]}",
        "++search.space.BATCH_SIZE={type: choice, values: [32]}",  # 56 steps: enough to learn the clothes apart
        "++search.space.LR={type: choice, values: [0.03]}",
        "safeguards.replicates=0",  # one trial per variant: 4 trials in all
        "scheduler.max_t=2",
        "scheduler.grace_period=1",
        "population.parents=1",
        "population.children_per_parent=1",
        "safeguards.trial_timeout_s=300",
    ]
    if sandbox.available() is not None:
        overrides.append("sandbox=none")
    assert main(overrides) == 0
    con = open_reader(tmp_path / "kb")
    config = json.loads(con.execute("select config from runs where run_id = ?", ["fashion-small"]).fetchone()[0])
    assert config["task"]["name"] == "fashion" and config["task"]["subsample"] == 1200
    scores = con.execute(
        "select cycle, selection_score, test_score from trials where run_id = ? and status = 'completed'",
        ["fashion-small"],
    ).fetchall()
    assert {cycle for cycle, _, _ in scores} == {1, 2}, scores  # both cycles ran trials
    # 900 training images, 2 epochs: far above chance (0.1) on the real clothes, and scored on 200 of each split
    assert max(selection for _, selection, _ in scores) > 0.5
    assert all(abs(selection * 200 - round(selection * 200)) < 1e-9 for _, selection, _ in scores)


def start_trainer(work: Path, data: Path, knobs: dict, **env: str) -> subprocess.Popen:
    """The fashion seed trainer as a real subprocess in `work`, its knobs rewritten, `env` added."""
    work.mkdir()
    source = (PROJECT_ROOT / "trainers" / "fashion" / "train.py").read_text()
    (work / "train.py").write_text(rewrite_knobs(source, knobs))
    environ = {**os.environ, "RALPH_DATA_DIR": str(data), "RALPH_DEVICE": "cpu", "OMP_NUM_THREADS": "1", **env}
    return subprocess.Popen(
        [sys.executable, "train.py"], cwd=work, env=environ, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def finished(process: subprocess.Popen) -> None:
    _, stderr = process.communicate(timeout=300)
    assert process.returncode == 0, stderr[-2000:]


def prepared(tmp_path: Path) -> Path:
    write_dataset(tmp_path / "raw")
    write_public(fashion.prepare(settings(), DataConfig(root=str(tmp_path / "raw"))), tmp_path / "data", "fashion")
    return tmp_path / "data"


def test_the_seed_trainer_trains_as_two_gloo_workers_on_disjoint_shards(tmp_path: Path):
    data = prepared(tmp_path)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    group = {"RALPH_GROUP": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    ranks = [
        start_trainer(
            tmp_path / f"rank{r}", data, {"EPOCHS": 2, "BATCH_SIZE": 16}, RANK=str(r), LOCAL_RANK=str(r), **group
        )
        for r in (0, 1)
    ]
    try:
        for process in ranks:
            finished(process)
    finally:
        for process in ranks:  # a rank left waiting for its peer must not outlive the test
            process.kill()
    shards = [json.loads((tmp_path / f"rank{r}" / "shard.json").read_text()) for r in (0, 1)]
    first, second = (set(s["rows"]) for s in shards)
    rows = len(np.load(data / "train_x.npy", mmap_mode="r"))
    train_rows = rows - int(rows * 0.1)  # the trainer's VAL_FRACTION stays out of training
    assert not first & second and len(first) == len(second) == train_rows // 2
    # Only rank 0 writes predictions; every rank reports the group's mean train loss (the same number).
    assert (tmp_path / "rank0" / "predictions.npz").exists() and not (tmp_path / "rank1" / "predictions.npz").exists()
    losses = [
        [json.loads(line)["train_loss"] for line in (tmp_path / f"rank{r}" / "metrics.jsonl").read_text().splitlines()]
        for r in (0, 1)
    ]
    assert len(losses[0]) == 2 and losses[0] == pytest.approx(losses[1])


def test_a_resumed_trial_trains_with_its_own_knobs_not_the_checkpoints(tmp_path: Path):
    """PBT resumes a trial from a donor's checkpoint with perturbed knobs: the optimizer must take this run's LR."""
    data = prepared(tmp_path)
    checkpoints = str(tmp_path / "checkpoints")
    finished(start_trainer(tmp_path / "donor", data, {"EPOCHS": 1, "LR": 0.05}, RALPH_CHECKPOINT_DIR=checkpoints))
    finished(start_trainer(tmp_path / "clone", data, {"EPOCHS": 2, "LR": 0.011}, RALPH_CHECKPOINT_DIR=checkpoints))
    records = [json.loads(line) for line in (tmp_path / "clone" / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in records] == [2]  # it continued after the donor's epoch
    assert records[0]["lr"] == pytest.approx(0.011)
