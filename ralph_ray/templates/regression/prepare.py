"""Frozen: this task's splits and metric. The engine runs it on the driver only; trials never see this file, and
never see the selection/test targets it returns (they get inputs only and are scored on their predictions).

YOUR DATA GOES HERE: replace `load()` with code that loads your inputs X and real-valued targets y (numpy arrays).
The template's stand-in is a small synthetic problem from scikit-learn, so the folder runs as it is.
"""

from __future__ import annotations

import numpy as np

from ralph_ray.tasks.base import DataSource, Splits, TaskSettings, random_split

# The metric the engine scores selection/test predictions with: "mse" or "mae" (both lower is better), or a name
# of your own with `def score(predictions, targets) -> float` below and its direction ("max" or "min").
METRIC = {"name": "mse", "direction": "min"}
# Raw data with your labels under /usr, /etc, /opt or inside the Python environment (every trial may read those) must
# be named so the sandbox hides it: `def hidden_paths(data): return [Path("/usr/share/my-dataset")]`. Your data.root
# and this folder are hidden anyway; other folders (/data, /srv, your home) are never bound into a trial.


def load() -> tuple[np.ndarray, np.ndarray]:
    """Inputs (N, ...) float32 and targets (N,) float64. Replace with your data."""
    from sklearn.datasets import make_regression

    x, y = make_regression(n_samples=500, n_features=12, n_informative=6, noise=10.0, random_state=0)
    # e.g. x = np.load("/path/to/features.npy"); y = np.load("/path/to/targets.npy")
    return x.astype(np.float32), y.astype(np.float64)


def prepare(settings: TaskSettings, data: DataSource) -> Splits:
    """Random train / selection / test split (task.split_seed, task.selection_fraction, task.test_fraction)."""
    x, y = load()
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
