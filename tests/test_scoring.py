"""Frozen scoring of predictions against engine-held labels."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ralph_ray.scoring import ScoringError, score_predictions
from ralph_ray.tasks.base import Labels, accuracy

LABELS = Labels(selection=np.array([0, 1, 2, 3]), test=np.array([1, 1, 1]))


def test_accuracy():
    assert accuracy(np.array([0, 1, 0, 3]), LABELS.selection) == 0.75


def test_scores_from_file(tmp_path: Path):
    np.savez(tmp_path / "p.npz", selection=np.array([0, 1, 2, 0]), test=np.array([1, 0, 1]))
    scores = score_predictions(tmp_path / "p.npz", LABELS)
    assert scores.selection == 0.75 and scores.test == pytest.approx(2 / 3)


def test_missing_file_names_the_call(tmp_path: Path):
    with pytest.raises(ScoringError, match="save_predictions"):
        score_predictions(tmp_path / "p.npz", LABELS)


def test_wrong_length(tmp_path: Path):
    np.savez(tmp_path / "p.npz", selection=np.array([0, 1]), test=np.array([1, 0, 1]))
    with pytest.raises(ScoringError, match="expected 4 predictions, got 2"):
        score_predictions(tmp_path / "p.npz", LABELS)


def test_predictions_travel_as_text_and_score_on_the_driver(tmp_path: Path):
    from ralph_ray.scoring import encode_predictions, score_encoded

    labels = Labels(selection=np.array([0, 1, 2, 3]), test=np.array([1, 1]))
    path = tmp_path / "predictions.npz"
    np.savez(path, selection=np.array([0, 1, 2, 0]), test=np.array([1, 0]))
    scores = score_encoded(encode_predictions(path), labels)
    assert (scores.selection, scores.test) == (0.75, 0.5)
    with pytest.raises(ScoringError, match="unreadable predictions"):
        score_encoded("not base64!", labels)


def test_every_built_in_metric_has_a_range_and_a_min_metrics_is_negated():
    """The leaderboard and export clip intervals to these ranges: a built-in metric without one would go unclipped."""
    from ralph_ray.scoring import METRIC_RANGES, clip_interval, score_range
    from ralph_ray.tasks.base import BUILTIN

    assert set(METRIC_RANGES) == set(BUILTIN)
    assert score_range("mse", "min") == (None, -0.0) and score_range("own_score", "max") == (None, None)
    assert clip_interval(0.9149, 1.0211, "accuracy", "max") == (0.9149, 1.0, True)
    assert clip_interval(0.9149, 1.0211, "own_score", "max") == (0.9149, 1.0211, False)  # a task's own: as computed
    assert clip_interval(-0.2, 0.1, "mae", "min") == (-0.2, 0.0, True)  # an MAE below 0, negated
