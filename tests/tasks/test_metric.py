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


@pytest.mark.parametrize(("name", "near"), [("acc", "accuracy"), ("acuracy", "accuracy"), ("macro-f1", "macro_f1")])
def test_an_unknown_name_near_a_builtin_names_it(name: str, near: str):
    """A user trial's `"name": "acc"` got the list of built-ins and no word of which one it meant."""
    with pytest.raises(MetricError, match=f"did you mean '{near}'"):
        declared_metric({"name": name, "direction": "max"}, None)
    with pytest.raises(MetricError) as refused:
        declared_metric({"name": "bleu", "direction": "max"}, None)
    assert "did you mean" not in str(refused.value)


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


def _single_logit() -> tuple[np.ndarray, np.ndarray, Labels]:
    """A binary classifier with one output logit (logistic regression on breast_cancer): its selection and test
    logits, and the engine's labels (both classes held, 37% class 0)."""
    from sklearn.datasets import load_breast_cancer
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler

    x, y = load_breast_cancer(return_X_y=True)
    x = StandardScaler().fit_transform(x)
    model = LogisticRegression(max_iter=1000).fit(x[:343], y[:343])
    accuracy = declared_metric({"name": "accuracy", "direction": "max"}, None)
    labels = Labels(selection=y[343:456], test=y[456:], metric=accuracy)
    return model.decision_function(x[343:456]), model.decision_function(x[456:]), labels


def test_float_predictions_of_a_single_logit_are_refused_naming_what_to_save():
    """The hint for float predictions covers a single logit and probabilities, not only the argmax of many logits."""
    selection, test, labels = _single_logit()
    for floats in (selection, 1 / (1 + np.exp(-selection))):  # logits, then probabilities
        with pytest.raises(ScoringError, match=r"\(logits > 0\)\.long\(\)`, for probabilities .*\(probs > 0\.5\)"):
            score_encoded(_encoded(floats, test), labels)
    right = score_encoded(_encoded((selection > 0).astype(np.int64), (test > 0).astype(np.int64)), labels)
    assert right.selection > 0.9 and right.warning is None


def test_argmax_over_a_single_logit_is_scored_but_warned_of():
    """The user trial: `model(x).argmax(1)` on (N, 1) logits saves class 0 for every input; it scored the share of
    class 0 with no word. It is still scored (not failed), with a warning that names the cause and the fix."""
    selection, test, labels = _single_logit()
    scores = score_encoded(_encoded(selection[:, None].argmax(1), test[:, None].argmax(1)), labels)
    assert scores.selection == pytest.approx(np.mean(labels.selection == 0))
    assert scores.warning == (
        "every prediction is class 0 while the labels hold 2 classes (a model with a single output logit? "
        "argmax(1) over it is always 0: save `(logits > 0).long()`)"
    )
    ones = score_encoded(_encoded(np.ones_like(labels.selection), np.ones_like(labels.test)), labels)
    assert (
        ones.warning == "every prediction is class 1 while the labels hold 2 classes (a model that learnt one class?)"
    )
    # ten classes: no single-logit hint (a single logit is a binary model's); still warned of
    ten = Labels(selection=np.arange(20) % 10, test=np.arange(10), metric=labels.metric)
    zeros = score_encoded(_encoded(np.zeros(20, np.int64), np.zeros(10, np.int64)), ten).warning
    assert zeros == "every prediction is class 0 while the labels hold 10 classes (a model that learnt one class?)"
    one_class = Labels(selection=np.zeros(3, np.int64), test=np.zeros(2, np.int64), metric=labels.metric)
    assert score_encoded(_encoded(np.zeros(3, np.int64), np.zeros(2, np.int64)), one_class).warning is None


def _digits_autoencoder() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """A 2-layer autoencoder (64 -> 8 -> 64) trained briefly on digits' 8x8 images: its reconstructions of held-out
    images shaped like them (N, 1, 8, 8), and those images, for selection and test."""
    import torch
    from sklearn.datasets import load_digits

    torch.manual_seed(0)
    images = torch.as_tensor(load_digits().images[:300, None] / 16.0, dtype=torch.float32)
    train, selection, test = images[:200], images[200:250], images[250:]
    model = torch.nn.Sequential(
        torch.nn.Flatten(), torch.nn.Linear(64, 8), torch.nn.ReLU(), torch.nn.Linear(8, 64), torch.nn.Sigmoid()
    )
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    for _ in range(100):
        loss = torch.nn.functional.mse_loss(model(train).view(-1, 1, 8, 8), train)
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        reconstruct = [model(x).view(-1, 1, 8, 8).numpy() for x in (selection, test)]
    return reconstruct[0], reconstruct[1], selection.numpy(), test.numpy()


@pytest.mark.parametrize(("name", "error"), [("mse", np.square), ("mae", np.abs)])
def test_builtin_regression_metrics_score_image_targets_per_pixel(name: str, error):
    """User trial: the built-in mse on a denoiser's (N, 1, 28, 28) targets failed every trial in scoring ("Found array
    with dim 4"). Each metric is the mean over every pixel, whether the trainer saves images or flattened rows."""
    selection, test, selection_y, test_y = _digits_autoencoder()
    metric = declared_metric({"name": name, "direction": "min"}, None)
    labels = Labels(selection=selection_y, test=test_y, metric=metric)
    scores = score_encoded(_encoded(selection, test), labels)
    assert scores.selection == pytest.approx(-float(error(selection - selection_y).mean()), rel=1e-6)
    assert scores.test == pytest.approx(-float(error(test - test_y).mean()), rel=1e-6)
    assert 0 < -scores.selection < float(error(selection_y - selection_y.mean()).mean())  # it learnt something
    flat = score_encoded(_encoded(selection.reshape(len(selection), -1), test.reshape(len(test), -1)), labels)
    assert flat.selection == pytest.approx(scores.selection) and flat.test == pytest.approx(scores.test)
    with pytest.raises(ScoringError, match="shaped like the targets"):  # another number of pixels is still refused
        score_encoded(_encoded(selection[:, :, :4], test), labels)
