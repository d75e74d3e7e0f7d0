"""Frozen: the digits task's splits and metric. scikit-learn's bundled 8x8 digits (1,797 images), fully offline.

Runs on the driver only; trials never see this file or the selection/test labels it returns.
"""

from __future__ import annotations

import numpy as np

from ralph_ray.tasks.base import DataSource, Splits, TaskSettings, stratified_split

METRIC = {"name": "accuracy", "direction": "max"}  # selection accuracy, higher is better


def prepare(settings: TaskSettings, data: DataSource) -> Splits:
    """The task's splits from the config (task.split_seed, task.selection_fraction, task.test_fraction)."""
    return split(settings.split_seed, settings.selection_fraction, settings.test_fraction)


def split(split_seed: int, selection_fraction: float, test_fraction: float) -> Splits:
    """Stratified train / selection / test split of digits; images scaled to [0, 1], shape (N, 1, 8, 8)."""
    from sklearn.datasets import load_digits  # scikit-learn loads only when the task runs

    bunch = load_digits()
    x = (bunch.images.astype(np.float32) / 16.0)[:, None, :, :]
    y = bunch.target.astype(np.int64)
    train, selection, test = stratified_split(y, (selection_fraction, test_fraction), split_seed)
    return Splits(
        train_x=x[train],
        train_y=y[train],
        selection_x=x[selection],
        selection_y=y[selection],
        test_x=x[test],
        test_y=y[test],
        num_classes=10,
    )
