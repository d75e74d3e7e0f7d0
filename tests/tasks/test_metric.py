"""Metrics with a direction: declarations, kinds, and frozen scores oriented so that higher is always better."""

from __future__ import annotations

import base64
import io

import numpy as np
import pytest

from ralph_ray.scoring import ScoringError, score_encoded
from ralph_ray.tasks.base import (
    Direction,
    Labels,
    MetricError,
    MetricKind,
    declared_metric,
    describe,
    unusual_direction,
)


def _encoded(selection: np.ndarray, test: np.ndarray) -> str:
    buffer = io.BytesIO()
    np.savez(buffer, selection=selection, test=test)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def test_builtin_metrics_bring_kind_and_direction():
    assert declared_metric({"name": "accuracy", "direction": "max"}, None).kind is MetricKind.classification
    f1 = declared_metric({"name": "macro_f1", "direction": "max"}, None)
    assert f1.score(np.array([0, 0, 1, 1]), np.array([0, 1, 1, 1])) == pytest.approx(0.7333, abs=1e-3)
    mse = declared_metric({"name": "mse", "direction": "min"}, None)
    assert (mse.kind, mse.direction, mse.sign) == (MetricKind.regression, Direction.min, -1.0)
    assert mse.score(np.array([1.0, 3.0]), np.array([2.0, 2.0])) == 1.0
    mae = declared_metric({"name": "mae", "direction": "min"}, None)
    assert mae.score(np.array([0.0, 4.0]), np.array([2.0, 2.0])) == 2.0


@pytest.mark.parametrize(
    ("declaration", "message"),
    [
        ({"name": "mse"}, "direction None"),
        ({"name": "bleu", "direction": "higher"}, "say whether higher or lower is better"),
        ({"name": "mse", "direction": "max"}, 'set "direction": "min"'),
        ({"name": "bleu", "direction": "max"}, "def score"),
        ("accuracy", "must be a dict"),
    ],
)
def test_a_declaration_without_a_usable_direction_names_the_fix(declaration, message):
    with pytest.raises(MetricError, match=message):
        declared_metric(declaration, None)


def _r2(predictions: np.ndarray, targets: np.ndarray) -> float:
    return float(1 - ((targets - predictions) ** 2).sum() / ((targets - targets.mean()) ** 2).sum())


def test_a_builtin_name_keeps_its_direction_with_a_score_of_its_own_and_that_score_is_used():
    # A user trial: {"name": "mse", "direction": "max"} passed (as a custom metric) once prepare.py had a score()
    with pytest.raises(MetricError, match='better when lower: set "direction": "min"'):
        declared_metric({"name": "mse", "direction": "max"}, _r2)
    with pytest.raises(MetricError, match='better when higher: set "direction": "max"'):
        declared_metric({"name": "accuracy", "direction": "min"}, _r2)
    own = declared_metric({"name": "mse", "direction": "min"}, _r2)
    assert (own.fn, own.kind, own.direction) == (_r2, MetricKind.custom, Direction.min)
    assert "prepare.py's own score() (kind custom), not the built-in mse" in describe(own)
    assert "scored by the built-in mse" in describe(declared_metric({"name": "mse", "direction": "min"}, None))


@pytest.mark.parametrize("score", [None, _r2])
def test_a_builtin_name_in_other_letters_is_refused_naming_its_spelling(score):
    # "MSE" became a custom metric (any direction) beside a score(), and "not built in" without one
    with pytest.raises(MetricError, match='built-in metric \'mse\': write "name": "mse"'):
        declared_metric({"name": "MSE", "direction": "min"}, score)
    with pytest.raises(MetricError, match='"name": "macro_f1"'):
        declared_metric({"name": "Macro_F1", "direction": "max"}, score)


@pytest.mark.parametrize(
    ("name", "direction", "usual"),
    [
        ("r2", "min", "max"),
        ("val-AUC", "min", "max"),
        ("top1_acc", "min", "max"),
        ("rmse", "max", "min"),
        ("bits_per_byte", "max", "min"),
        ("test_loss", "max", "min"),
    ],
)
def test_a_well_known_name_declared_the_other_way_is_warned_of(name, direction, usual):
    metric = declared_metric({"name": name, "direction": direction}, _r2)
    warning = unusual_direction(metric)
    assert warning is not None and f'set "direction": "{usual}"' in warning and repr(name) in warning


@pytest.mark.parametrize(
    ("name", "direction"),
    [("r2", "max"), ("rmse", "min"), ("bleu_delta", "max"), ("sharpness", "min"), ("error_vs_accuracy", "min")],
)
def test_a_usual_or_unknown_direction_is_not_warned_of(name, direction):
    assert unusual_direction(declared_metric({"name": name, "direction": direction}, _r2)) is None


def test_a_task_supplied_score_function_with_its_own_direction():
    metric = declared_metric({"name": "max_error", "direction": "min"}, lambda p, t: float(np.abs(p - t).max()))
    assert (metric.kind, metric.direction) == (MetricKind.custom, Direction.min)
    labels = Labels(selection=np.array([1.0, 2.0]), test=np.array([0.0]), metric=metric)
    scores = score_encoded(_encoded(np.array([1.0, 5.0]), np.array([0.5])), labels)
    assert (scores.selection, scores.test) == (-3.0, -0.5)


def test_a_min_metric_scores_the_lower_error_higher():
    mse = declared_metric({"name": "mse", "direction": "min"}, None)
    labels = Labels(selection=np.array([1.0, 2.0, 3.0]), test=np.array([0.0, 0.0]), metric=mse)
    close = score_encoded(_encoded(np.array([1.0, 2.0, 3.5]), np.zeros(2)), labels)
    far = score_encoded(_encoded(np.array([3.0, 0.0, 3.0]), np.ones(2)), labels)
    assert close.selection == pytest.approx(-0.25 / 3) and far.selection == pytest.approx(-8 / 3)
    assert close.selection > far.selection and close.test > far.test  # higher score = lower MSE


def test_predictions_that_do_not_fit_the_kind_are_refused():
    accuracy = declared_metric({"name": "accuracy", "direction": "max"}, None)
    labels = Labels(selection=np.array([0, 1]), test=np.array([1]), metric=accuracy)
    with pytest.raises(ScoringError, match="argmax"):
        score_encoded(_encoded(np.array([[0.1, 0.9], [0.8, 0.2]]), np.array([1])), labels)
    mse = declared_metric({"name": "mse", "direction": "min"}, None)
    with pytest.raises(ScoringError, match="expected 2 predictions"):
        score_encoded(_encoded(np.array([1.0]), np.array([1.0])), Labels(np.array([1.0, 2.0]), np.array([1.0]), mse))
    with pytest.raises(ScoringError, match="NaN"):
        score_encoded(
            _encoded(np.array([np.nan, 1.0]), np.array([1.0])), Labels(np.array([1.0, 2.0]), np.array([1.0]), mse)
        )
