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


def test_a_resumed_forecaster_starts_from_the_best_final_value_of_the_runs_earlier_trials(tmp_path):
    """After a resume the forecaster was empty: no best to beat until a trial of the new Tune run reached its last
    epoch, so the first trials after a resume were never forecast. It is rebuilt from the KB's recorded curves: the
    best final value of the run's earlier search trials (not a replicate's, not one the run's stop cut short)."""
    from ralph_ray.forecast import rebuild
    from ralph_ray.kb import KnowledgeBase
    from ralph_ray.ledger import STOPPED_WITH_CYCLE

    kb = KnowledgeBase(tmp_path / "kb")
    kb.init()
    winner = [0.5, 0.8, 0.9, 0.93, 0.95, 0.96, 0.965, 0.97, 0.972, 0.973, 0.974, 0.975]
    curves = {
        "winner": (winner, False, None),
        "lucky_replicate": ([0.99] * 12, True, None),  # a replicate runs outside the search: it sets no best
        "cut": ([0.99] * 12, False, STOPPED_WITH_CYCLE),  # cut short by the stop: it runs again
        "other_run": ([0.999] * 12, False, None),
    }
    kb.append(
        "trials",
        [
            {"run_id": "other" if t == "other_run" else "r", "cycle": 1, "trial_id": t, "variant_id": "v",
             "status": "completed", "knobs": "{}", "epochs": 12, "selection_score": v[-1], "test_score": v[-1],
             "seconds": 1.0, "replicate": rep, "reason": reason}
            for t, (v, rep, reason) in curves.items()
        ],
        "t",
    )  # fmt: skip
    kb.append(
        "epochs",
        [
            {"run_id": "other" if t == "other_run" else "r", "trial_id": t, "epoch": e, "metric": "val_acc",
             "value": value}
            for t, (v, _, _) in curves.items()
            for e, value in enumerate(v, start=1)
        ],
        "e",
    )  # fmt: skip
    stopper = ForecastStopper("val_acc", "max", last_epoch=12, confidence=0.9)
    rebuild(stopper, kb.reader(), "r")
    assert stopper.best == pytest.approx(0.975)
    laggard = list(power_law(np.arange(1, 6, dtype=float), 0.70, 0.4, 1.0))
    decisions = feed(stopper, "laggard", laggard)  # the new Tune run's first trial is forecast at once
    assert decisions[:3] == [False] * 3 and decisions[3]
    assert "best so far 0.9750" in (stopper.reason("laggard") or "")
    fresh = ForecastStopper("val_acc", "max", last_epoch=12, confidence=0.9)
    rebuild(fresh, kb.reader(), "nothing_yet")  # a run with no trials: nothing to beat yet
    assert fresh.best is None


def test_a_resumed_barrier_cycles_forecaster_starts_from_that_cycles_recorded_trials_only(tmp_path):
    """Review: the barrier loop's resumed cycle replays its ASHA rungs from the KB but started its forecaster empty,
    so its first trials were not forecast. Its forecaster is rebuilt from the cycle's own trials (each cycle's Tune
    run starts a forecaster of its own: another cycle's best is not this one's to beat)."""
    from ralph_ray.config import load_config
    from ralph_ray.forecast import for_cycle
    from ralph_ray.kb import KnowledgeBase

    kb = KnowledgeBase(tmp_path / "kb")
    kb.init()
    curves = {"c1": (1, [0.99] * 12), "c2": (2, [0.9] * 11 + [0.95]), "c2_low": (2, [0.8] * 12)}
    kb.append(
        "trials",
        [
            {"run_id": "r", "cycle": cycle, "trial_id": t, "variant_id": "v", "status": "completed", "knobs": "{}",
             "epochs": 12, "selection_score": v[-1], "test_score": v[-1], "seconds": 1.0, "replicate": False}
            for t, (cycle, v) in curves.items()
        ],
        "t",
    )  # fmt: skip
    kb.append(
        "epochs",
        [
            {"run_id": "r", "trial_id": t, "epoch": e, "metric": "val_acc", "value": value}
            for t, (_, v) in curves.items()
            for e, value in enumerate(v, start=1)
        ],
        "e",
    )  # fmt: skip
    cfg = load_config(["scheduler.forecast=true", "scheduler.max_t=12", "search.metric=val_acc", "search.mode=max"])
    resumed = for_cycle(cfg, kb.reader(), "r", 2)
    assert resumed is not None and resumed.best == pytest.approx(0.95)  # cycle 2's best final, not cycle 1's 0.99
    fresh = for_cycle(cfg, None, "r", 2)  # a cycle that starts afresh has nothing to beat yet
    assert fresh is not None and fresh.best is None
    assert for_cycle(load_config(["scheduler.forecast=false"]), kb.reader(), "r", 2) is None
