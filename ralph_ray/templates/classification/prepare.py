"""Frozen: this task's splits and metric. The engine runs it on the driver only; trials never see this file, and
never see the selection/test labels it returns (they get inputs only and are scored on their predictions).

YOUR DATA GOES HERE: replace `load()` with code that loads your inputs X and integer class labels y (numpy arrays).
The template's stand-in is a small synthetic problem from scikit-learn, so the folder runs as it is.
"""

from __future__ import annotations

import numpy as np

from ralph_ray.tasks.base import DataSource, Splits, TaskSettings, stratified_split

# The metric the engine scores selection/test predictions with: "accuracy" or "macro_f1" (both higher is better),
# or a name of your own with `def score(predictions, targets) -> float` below and its direction.
METRIC = {"name": "accuracy", "direction": "max"}
# Raw data with your labels under /usr, /etc, /opt or inside the Python environment (every trial may read those) must
# be named so the sandbox hides it: `def hidden_paths(data): return [Path("/usr/share/my-dataset")]`. Your data.root
# and this folder are hidden anyway; other folders (/data, /srv, your home) are never bound into a trial.


def load() -> tuple[np.ndarray, np.ndarray, int]:
    """Inputs (N, ...) float32, labels (N,) int64 in [0, num_classes), and num_classes. Replace with your data."""
    from sklearn.datasets import make_classification

    x, y = make_classification(n_samples=600, n_features=20, n_informative=8, n_classes=3, random_state=0)
    # e.g. x = np.load("/path/to/features.npy"); y = np.load("/path/to/labels.npy")
    return x.astype(np.float32), y.astype(np.int64), 3


def prepare(settings: TaskSettings, data: DataSource) -> Splits:
    """Stratified train / selection / test split (task.split_seed, task.selection_fraction, task.test_fraction)."""
    x, y, num_classes = load()
    train, selection, test = stratified_split(
        y, (settings.selection_fraction, settings.test_fraction), settings.split_seed
    )
    return Splits(
        train_x=x[train],
        train_y=y[train],
        selection_x=x[selection],
        selection_y=y[selection],
        test_x=x[test],
        test_y=y[test],
        num_classes=num_classes,
    )
