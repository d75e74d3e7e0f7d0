"""Frozen tasks and their one registry: each prepares train / selection / test splits; the engine keeps selection
and test labels.

`TASKS` is the list of tasks: config validates `task.name` against it and `prepare_splits` dispatches through it.
This package imports no config (config imports it), so the registry adds no import cycle.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ralph_ray.tasks.base import DataError, DataSource, Experiment, Labels, Splits, TaskSettings

__all__ = ["TASKS", "DataError", "Labels", "Splits", "Task", "prepare_splits"]


@dataclass(frozen=True)
class Task:
    """A shipped task: how its splits are prepared, and what `data.root` must hold (None: it needs no data root)."""

    name: str
    prepare: Callable[[TaskSettings, DataSource], Splits]
    data_root: str | None = None


def _digits(task: TaskSettings, data: DataSource) -> Splits:
    from ralph_ray.tasks import digits  # scikit-learn loads only when the task runs

    return digits.prepare(task.split_seed, task.selection_fraction, task.test_fraction)


def _cifar10(task: TaskSettings, data: DataSource) -> Splits:
    from ralph_ray.tasks import cifar10

    return cifar10.prepare(data, task.split_seed, task.selection_fraction)


TASKS: dict[str, Task] = {task.name: task for task in (
    Task("digits", _digits),
    Task("cifar10", _cifar10, data_root="the folder holding or to hold cifar-10-batches-py"),
)}


def prepare_splits(cfg: Experiment) -> Splits:
    """The task's deterministic splits (raises DataError with the fix when data is missing)."""
    task = TASKS.get(cfg.task.name)
    if task is None:
        raise ValueError(f"unknown task {cfg.task.name!r}")  # config validation names the fix first
    return task.prepare(cfg.task, cfg.data)
