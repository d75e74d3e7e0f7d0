"""The embedded default task: scikit-learn's bundled 8x8 digits (1,797 images), fully offline."""

from __future__ import annotations

import numpy as np
from sklearn.datasets import load_digits

from ralph_ray.tasks.base import Splits, stratified_split


def prepare(split_seed: int, selection_fraction: float, test_fraction: float) -> Splits:
    """Stratified train / selection / test split of digits; images scaled to [0, 1], shape (N, 1, 8, 8)."""
    bunch = load_digits()
    x = (bunch.images.astype(np.float32) / 16.0)[:, None, :, :]
    y = bunch.target.astype(np.int64)
    train, selection, test = stratified_split(y, (selection_fraction, test_fraction), split_seed)
    return Splits(
        train_x=x[train], train_y=y[train],
        selection_x=x[selection], selection_y=y[selection],
        test_x=x[test], test_y=y[test],
        num_classes=10,
    )
