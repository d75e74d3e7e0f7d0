"""The frozen side of a task: splits, the metric, and the public files a trial may read."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from ralph_ray.harness import PUBLIC_FILES


class DataError(RuntimeError):
    """A dataset is missing or corrupt; the message says how to fix it."""


# What preparing a task reads from the config. Protocols, not the config's classes: config imports the task
# registry to validate task names, so the tasks must not import config.
class TaskSettings(Protocol):
    """Which task and how to split it (`config.TaskConfig` is one)."""

    name: str
    split_seed: int
    selection_fraction: float
    test_fraction: float


class DataSource(Protocol):
    """Where a dataset that does not ship with the code lives, and how to fetch it (`config.DataConfig` is one)."""

    root: str | None
    download: bool
    url: str
    md5: str


class Experiment(Protocol):
    """The parts of a config a task's preparation reads (`config.Config` is one)."""

    @property
    def task(self) -> TaskSettings: ...

    @property
    def data(self) -> DataSource: ...


@dataclass(frozen=True)
class Splits:
    """All three splits. Selection and test labels never leave the engine."""

    train_x: np.ndarray
    train_y: np.ndarray
    selection_x: np.ndarray
    selection_y: np.ndarray
    test_x: np.ndarray
    test_y: np.ndarray
    num_classes: int

    def labels(self) -> Labels:
        """The engine-side labels used for frozen scoring."""
        return Labels(selection=self.selection_y.astype(np.int64), test=self.test_y.astype(np.int64))


@dataclass(frozen=True)
class Labels:
    """Selection and test labels, kept by the engine to score predictions."""

    selection: np.ndarray
    test: np.ndarray


def accuracy(predictions: np.ndarray, labels: np.ndarray) -> float:
    """The frozen metric: fraction of correct class predictions (higher is better)."""
    predictions = np.asarray(predictions).reshape(-1)
    if predictions.shape != labels.shape:
        raise ValueError(f"expected {labels.shape[0]} predictions, got {predictions.shape[0]}")
    return float((predictions == labels).mean())


def stratified_split(
    y: np.ndarray, fractions: tuple[float, ...], seed: int
) -> list[np.ndarray]:
    """Split indices per class so each part keeps the class balance; the rest goes to the first part."""
    rng = np.random.default_rng(seed)
    parts: list[list[np.ndarray]] = [[] for _ in range(len(fractions) + 1)]
    for cls in np.unique(y):
        idx = rng.permutation(np.flatnonzero(y == cls))
        start = 0
        for i, fraction in enumerate(fractions, start=1):
            count = int(round(fraction * len(idx)))
            parts[i].append(idx[start : start + count])
            start += count
        parts[0].append(idx[start:])
    return [np.sort(np.concatenate(p)) for p in parts]


def write_public(splits: Splits, out_dir: Path, task: str) -> dict[str, str]:
    """Write what a trial may read (no selection/test labels) and return each file's sha256."""
    out_dir.mkdir(parents=True, exist_ok=True)
    arrays = {
        "train_x.npy": splits.train_x,
        "train_y.npy": splits.train_y.astype(np.int64),
        "selection_x.npy": splits.selection_x,
        "test_x.npy": splits.test_x,
    }
    for name, array in arrays.items():
        _atomic_save(out_dir / name, np.ascontiguousarray(array))
    meta = {
        "task": task,
        "num_classes": splits.num_classes,
        "shapes": {name: list(array.shape) for name, array in arrays.items()},
    }
    (out_dir / "meta.json").write_text(json.dumps(meta, indent=2))
    return {name: sha256_file(out_dir / name) for name in PUBLIC_FILES}


def sha256_file(path: Path) -> str:
    """Content hash of a file, read in chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _atomic_save(path: Path, array: np.ndarray) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("wb") as handle:
        np.save(handle, array)
    os.replace(tmp, path)
