"""Frozen tasks: each prepares train / selection / test splits; the engine keeps selection and test labels."""

from __future__ import annotations

from ralph_ray.config import Config
from ralph_ray.tasks.base import DataError, Labels, Splits

__all__ = ["DataError", "Labels", "Splits", "prepare_splits"]


def prepare_splits(cfg: Config) -> Splits:
    """The task's deterministic splits (raises DataError with the fix when data is missing)."""
    if cfg.task.name == "digits":
        from ralph_ray.tasks import digits

        return digits.prepare(cfg.task.split_seed, cfg.task.selection_fraction, cfg.task.test_fraction)
    if cfg.task.name == "cifar10":
        from ralph_ray.tasks import cifar10

        return cifar10.prepare(cfg.data, cfg.task.split_seed, cfg.task.selection_fraction)
    raise ValueError(f"unknown task {cfg.task.name!r}")  # config validation names the fix first
