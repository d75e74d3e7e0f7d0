"""Both seed trainers run by hand as real subprocesses against prepared data and keep the contract."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ralph_ray import PROJECT_ROOT
from ralph_ray.knobs import rewrite_knobs
from ralph_ray.tasks.base import Splits, write_public
from ralph_ray.tasks.digits import prepare

REQUIRED = {"epoch", "train_loss", "val_loss", "val_acc", "lr", "grad_norm", "epoch_seconds"}


def run_trainer(task: str, data_dir: Path, work: Path, knobs: dict) -> tuple[list[dict], np.lib.npyio.NpzFile]:
    work.mkdir()
    source = (PROJECT_ROOT / "trainers" / task / "train.py").read_text()
    (work / "train.py").write_text(rewrite_knobs(source, knobs))
    env = {
        **os.environ,
        "RALPH_DATA_DIR": str(data_dir),
        "RALPH_METRICS_FILE": str(work / "m.jsonl"),
        "RALPH_PREDICTIONS_FILE": str(work / "p.npz"),
        "OMP_NUM_THREADS": "1",
        "RALPH_DEVICE": "cpu",
    }
    result = subprocess.run(
        [sys.executable, "train.py"], cwd=work, env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-2000:]
    records = [json.loads(line) for line in (work / "m.jsonl").read_text().splitlines()]
    return records, np.load(work / "p.npz")


def check_contract(records: list[dict], epochs: int, predictions, n_selection: int, n_test: int) -> None:
    assert [r["epoch"] for r in records] == list(range(1, epochs + 1))
    for record in records:
        assert REQUIRED <= set(record)
        assert all(math.isfinite(v) for v in record.values())
    assert predictions["selection"].shape == (n_selection,) and predictions["test"].shape == (n_test,)
    assert predictions["test"].min() >= 0 and predictions["test"].max() < 10


def test_digits_trainer_learns(tmp_path: Path):
    splits = prepare(0, 0.2, 0.2)
    write_public(splits, tmp_path / "data", "digits")
    records, predictions = run_trainer("digits", tmp_path / "data", tmp_path / "work", {"EPOCHS": 6})
    check_contract(records, 6, predictions, len(splits.selection_y), len(splits.test_y))
    assert records[-1]["val_acc"] > 0.8
    assert np.mean(predictions["selection"] == splits.selection_y) > 0.8


def test_cifar10_trainer_runs_on_cpu(tmp_path: Path):
    rng = np.random.default_rng(0)
    image = lambda n: rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8)  # noqa: E731
    labels = lambda n: rng.integers(0, 10, n)  # noqa: E731
    splits = Splits(image(300), labels(300), image(24), labels(24), image(16), labels(16), 10)
    write_public(splits, tmp_path / "data", "cifar10")
    knobs = {"EPOCHS": 2, "BATCH_SIZE": 128, "WIDTH1": 8, "WIDTH2": 16, "WIDTH3": 16, "VAL_FRACTION": 0.1}
    records, predictions = run_trainer("cifar10", tmp_path / "data", tmp_path / "work", knobs)
    check_contract(records, 2, predictions, 24, 16)
    assert records[0]["lr"] > 0


@pytest.mark.parametrize("task", ["digits", "cifar10"])
def test_trainer_by_hand_without_data_says_how_to_prepare(task: str, tmp_path: Path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("RALPH_")}
    result = subprocess.run(
        [sys.executable, str(PROJECT_ROOT / "trainers" / task / "train.py")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode != 0
    assert "python -m ralph_ray.prepare" in result.stderr


def cifar_train_module():
    """The CIFAR-10 seed trainer imported as a module (its functions and classes, without running main)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("cifar_train", PROJECT_ROOT / "trainers" / "cifar10" / "train.py")
    assert spec is not None and spec.loader is not None
    train = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(train)
    return train


def test_cifar10_warm_up_leaves_the_model_and_optimizer_as_they_started():
    """The GPU warm-up trains throwaway steps: the weights, BatchNorm statistics and momentum must be the start's."""
    import contextlib

    import torch

    train = cifar_train_module()
    model = train.Net(10)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True)
    start = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    x, y = torch.randn(16, 3, 32, 32), torch.randint(0, 10, (16,))
    steps: list[int] = []
    optimizer.register_step_post_hook(lambda *_: steps.append(1))
    train.warm_up(model, optimizer, x, y, x[:4], contextlib.nullcontext)
    assert len(steps) == train.WARMUP_STEPS > 0  # it did train (a no-op warm-up would restore nothing)
    assert all(torch.equal(start[name], tensor) for name, tensor in model.state_dict().items())
    assert len(optimizer.state) == 0
    model.train()
    loss = torch.nn.functional.cross_entropy(model(x), y)  # the steps did change the weights before the restore
    loss.backward()
    optimizer.step()
    assert not all(torch.equal(start[name], tensor) for name, tensor in model.state_dict().items())


def test_cifar10_whitening_decorrelates_the_patches():
    """init_whiten: the first 12 filters decorrelate their 2x2 patches to unit variance; the other 12 negate them."""
    import torch

    train = cifar_train_module()
    model = train.Net(10)
    # correlated channels and neighbours, as in real images, more along rows than columns (a patch layout with rows
    # and columns swapped would not whiten them)
    shared = torch.randn(64, 1, 32, 32, generator=torch.Generator().manual_seed(0))
    shared = shared + 0.8 * shared.roll(1, 3) + 0.3 * shared.roll(1, 2)
    images = shared + 0.3 * torch.randn(64, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    model.init_whiten(images)
    weight = model.whiten.weight.detach()
    assert weight.dtype == torch.float32 and weight.shape == (24, 3, 2, 2)
    assert torch.equal(weight[12:], -weight[:12])
    out = torch.nn.functional.conv2d(images, weight[:12]).permute(0, 2, 3, 1).reshape(-1, 12).double()
    covariance = out.T @ out / len(out)  # uncentred, as the fit
    assert torch.allclose(covariance, torch.eye(12, dtype=torch.float64), atol=0.02)
