"""Frozen: the diabetes task's splits and metric. scikit-learn's bundled diabetes data (442 patients, 10 standardised
features, a disease-progression score one year later), fully offline; the metric is MSE, lower is better.

Runs on the driver only; trials never see this file or the selection/test targets it returns.
"""

from __future__ import annotations

import numpy as np

from ralph_ray.tasks.base import DataSource, Splits, TaskSettings, random_split

METRIC = {"name": "mse", "direction": "min"}  # mean squared error of the predicted progression score


def prepare(settings: TaskSettings, data: DataSource) -> Splits:
    """A random train / selection / test split; inputs float32 (N, 10), targets float64 (N,) in the original units."""
    from sklearn.datasets import load_diabetes  # scikit-learn loads only when the task runs

    bunch = load_diabetes()
    x = bunch.data.astype(np.float32)
    y = bunch.target.astype(np.float64)
    train, selection, test = random_split(
        len(y), (settings.selection_fraction, settings.test_fraction), settings.split_seed
    )
    return Splits(
        train_x=x[train],
        train_y=y[train],
        selection_x=x[selection],
        selection_y=y[selection],
        test_x=x[test],
        test_y=y[test],
    )
