"""The learning-curve forecaster: the power-law fit on known curves, and the stopper's decisions and reasons."""

from __future__ import annotations

import numpy as np
import pytest

from ralph_ray.forecast import ForecastStopper, fit, power_law

EPOCHS = [1, 2, 3, 4, 5]


def test_the_fit_recovers_a_power_law_curve_and_its_final_value():
    truth = power_law(np.arange(1, 13, dtype=float), 0.95, 0.4, 0.8)
    noisy = truth[:5] + np.array([0.002, -0.001, 0.0015, -0.002, 0.001])
    forecast = fit(EPOCHS, list(noisy), 12)
    assert forecast is not None and forecast.epochs == 5 and forecast.at == 12
    assert forecast.mean == pytest.approx(truth[-1], abs=0.02)
    assert forecast.sd > 0 and forecast.upper(0.9) > forecast.mean
    assert fit([1, 2, 3], [0.5, 0.6, 0.65], 12) is None  # three points: no residual to judge the spread by
    assert fit(EPOCHS, [0.5, 0.6, float("nan"), 0.7, 0.72], 12) is None


def feed(stopper: ForecastStopper, trial: str, values: list[float]) -> list[bool]:
    return [stopper(trial, {"epoch": e, "val_acc": v}) for e, v in enumerate(values, start=1)]


def test_the_stopper_stops_a_trial_whose_forecast_cannot_win_and_says_why():
    stopper = ForecastStopper("val_acc", "max", last_epoch=12, confidence=0.9)
    laggard = list(power_law(np.arange(1, 6, dtype=float), 0.70, 0.4, 1.0))
    assert feed(stopper, "early", laggard) == [False] * 5  # no trial has finished: nothing to beat yet
    assert not any(feed(stopper, "winner", [0.5, 0.8, 0.9, 0.93, 0.95, 0.96, 0.965, 0.97, 0.972, 0.973, 0.974, 0.975]))
    assert stopper.best == pytest.approx(0.975)
    decisions = feed(stopper, "laggard", laggard)
    assert decisions[:3] == [False] * 3 and decisions[3]  # stopped at the first epoch a fit is allowed
    reason = stopper.reason("laggard")
    assert reason is not None and reason.startswith("forecast stop: power-law fit of 4 epochs")
    assert "best so far 0.9750" in reason and stopper.reason("winner") is None
    # A trial forecast to pass the best is left alone.
    close = list(power_law(np.arange(1, 6, dtype=float), 1.1, 0.5, 0.7))  # 1.01 at epoch 12
    assert not any(feed(stopper, "hopeful", close))


def test_a_min_metric_is_oriented_once():
    stopper = ForecastStopper("val_loss", "min", last_epoch=10, confidence=0.9)
    for epoch, loss in enumerate([1.0, 0.6, 0.4, 0.3, 0.25, 0.22, 0.2, 0.19, 0.185, 0.18], start=1):
        assert not stopper("good", {"epoch": epoch, "val_loss": loss})
    bad = [stopper("bad", {"epoch": e, "val_loss": v}) for e, v in enumerate([2.0, 1.6, 1.45, 1.4, 1.38], start=1)]
    assert any(bad) and "best so far 0.1800" in (stopper.reason("bad") or "")
