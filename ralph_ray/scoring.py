"""Frozen scoring: the engine, never the trainer, turns predictions into selection and test scores.

The one place a metric's direction is applied: a score is `metric.oriented(value)` (higher is better), so every rule
downstream (verdict, plateau, target, parent choice, the KB's leaderboard) compares scores one way.
"""

from __future__ import annotations

import base64
import io
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # sql.py reads the ranges below: importing the tasks package here would weigh on every KB reader
    from ralph_ray.tasks.base import Labels

# The key of a trial's last result that carries its predictions back to the driver.
PREDICTIONS_KEY = "predictions"

# The value range of each built-in metric (tasks.base.BUILTIN), by name; None: unbounded on that side. A metric of any
# other name is the task's own score, of no known range. A replicate mean's Student-t interval at n=2 is wide enough
# to leave the range (accuracy 0.95 +- 0.12): the leaderboard and export clip it to these bounds and say so.
METRIC_RANGES: dict[str, tuple[float | None, float | None]] = {
    "accuracy": (0.0, 1.0),
    "macro_f1": (0.0, 1.0),
    "mse": (0.0, None),
    "mae": (0.0, None),
}


class ScoringError(ValueError):
    """Predictions that cannot be scored (missing file, wrong length, bad classes)."""


@dataclass(frozen=True)
class Scores:
    """A finished trial's frozen scores, oriented: higher is better (for a min metric, the metric's value negated)."""

    selection: float
    test: float
    warning: str | None = None  # scored, but oddly (every selection prediction one class): said with the trial


def score_range(metric: str | None, direction: str | None) -> tuple[float | None, float | None]:
    """The range of a metric's oriented scores (a min metric's value negated), by its name and direction; (None, None)
    for a metric of no known range."""
    low, high = METRIC_RANGES.get(metric or "", (None, None))
    if direction == "min":
        return (None if high is None else -high, None if low is None else -low)
    return low, high


def clip_interval(low: float, high: float, metric: str | None, direction: str | None) -> tuple[float, float, bool]:
    """An interval of oriented scores cut to the metric's range, and whether it was cut."""
    floor, ceiling = score_range(metric, direction)
    clipped_low = low if floor is None else max(low, floor)
    clipped_high = high if ceiling is None else min(high, ceiling)
    return clipped_low, clipped_high, (clipped_low, clipped_high) != (low, high)


def score_predictions(path: Path, labels: Labels) -> Scores:
    """Score a trainer's predictions.npz against the engine-held labels."""
    if not path.exists():
        raise ScoringError(
            f"train.py finished without writing {path.name}: call harness.save_predictions(selection=..., test=...)"
        )
    return _score(path.read_bytes(), labels, path.name)


def encode_predictions(path: Path) -> str:
    """A trial's predictions.npz as text that travels in a Tune result to the driver."""
    return base64.b64encode(path.read_bytes()).decode("ascii")


def score_encoded(text: str, labels: Labels) -> Scores:
    """Score predictions sent back by a trial (see `encode_predictions`)."""
    try:
        raw = base64.b64decode(text.encode("ascii"), validate=True)
    except ValueError as err:
        raise ScoringError(f"unreadable predictions: {err}") from None
    return _score(raw, labels, "predictions")


def _score(npz: bytes, labels: Labels, name: str) -> Scores:
    """The task's frozen metric on an npz holding `selection` and `test` predictions, as oriented scores."""
    try:
        with np.load(io.BytesIO(npz)) as saved:
            selection, test = saved["selection"], saved["test"]
    except (OSError, ValueError, KeyError) as err:
        raise ScoringError(f"unreadable {name}: {err}") from None
    try:
        metric = labels.metric
        return Scores(
            selection=metric.oriented(metric.score(selection, labels.selection)),
            test=metric.oriented(metric.score(test, labels.test)),
            warning=metric.one_class(selection, labels.selection),
        )
    except Exception as err:  # noqa: BLE001 - a task's own score function may raise anything: the trial is unscored
        if not isinstance(err, ValueError):
            raise ScoringError(f"{name}: the task's score function failed ({type(err).__name__}: {err})") from None
        raise ScoringError(f"{name}: {err}") from None
