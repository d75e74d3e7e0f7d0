"""Frozen scoring: the engine, never the trainer, turns predictions into selection and test scores."""

from __future__ import annotations

import base64
import io
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ralph_ray.tasks.base import Labels, accuracy


# The key of a trial's last result that carries its predictions back to the driver.
PREDICTIONS_KEY = "predictions"


class ScoringError(ValueError):
    """Predictions that cannot be scored (missing file, wrong length, bad classes)."""


@dataclass(frozen=True)
class Scores:
    """A finished trial's frozen scores (higher is better)."""

    selection: float
    test: float


def score_predictions(path: Path, labels: Labels) -> Scores:
    """Score a trainer's predictions.npz against the engine-held labels."""
    if not path.exists():
        raise ScoringError(f"train.py finished without writing {path.name}: call harness.save_predictions(selection=..., test=...)")
    try:
        with np.load(path) as saved:
            selection, test = saved["selection"], saved["test"]
    except (OSError, ValueError, KeyError) as err:
        raise ScoringError(f"unreadable {path.name}: {err}") from None
    try:
        return Scores(selection=accuracy(selection, labels.selection), test=accuracy(test, labels.test))
    except ValueError as err:
        raise ScoringError(f"{path.name}: {err}") from None


def encode_predictions(path: Path) -> str:
    """A trial's predictions.npz as text that travels in a Tune result to the driver."""
    return base64.b64encode(path.read_bytes()).decode("ascii")


def score_encoded(text: str, labels: Labels) -> Scores:
    """Score predictions sent back by a trial (see `encode_predictions`)."""
    try:
        raw = base64.b64decode(text.encode("ascii"), validate=True)
        with np.load(io.BytesIO(raw)) as saved:
            selection, test = saved["selection"], saved["test"]
    except (OSError, ValueError, KeyError) as err:
        raise ScoringError(f"unreadable predictions: {err}") from None
    try:
        return Scores(selection=accuracy(selection, labels.selection), test=accuracy(test, labels.test))
    except ValueError as err:
        raise ScoringError(f"predictions: {err}") from None
