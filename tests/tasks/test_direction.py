"""A min task end to end: the verdict, the plateau rule, the target, ASHA, Optuna and the leaderboard all pick the
lowest error. Each check fails if its part picks the highest (the scores come from the real frozen scoring)."""

from __future__ import annotations

import base64
import io

import numpy as np
import pytest

from ralph_ray.config import load_config
from ralph_ray.decision import CycleFacts, StopReason, child_verdict, decide, plateau_length
from ralph_ray.scoring import score_encoded
from ralph_ray.search import scheduler
from ralph_ray.tasks import prepare_splits
from ralph_ray.variants import VariantStatus


@pytest.fixture(scope="module")
def diabetes():
    cfg = load_config(
        ["task=diabetes", "target.selection_score=2500", "safeguards.min_delta=5", "safeguards.plateau_cycles=2"]
    )
    return cfg, prepare_splits(cfg).labels()


def _score(labels, mse: float) -> float:
    """The engine's selection score of predictions whose selection MSE is exactly `mse` (a constant offset)."""
    buffer = io.BytesIO()
    np.savez(buffer, selection=labels.selection + np.sqrt(mse), test=labels.test)
    return score_encoded(base64.b64encode(buffer.getvalue()).decode(), labels).selection


def test_the_verdict_keeps_the_child_with_the_lower_error(diabetes):
    cfg, labels = diabetes
    parent, better, worse = _score(labels, 3000.0), _score(labels, 2900.0), _score(labels, 3100.0)
    assert parent == pytest.approx(-3000.0)
    assert child_verdict(2, 0, better, parent, cfg.safeguards.min_delta, None)[0] is VariantStatus.kept
    assert child_verdict(2, 0, worse, parent, cfg.safeguards.min_delta, None)[0] is VariantStatus.discarded
    # within min_delta (5 MSE units) is no improvement
    assert (
        child_verdict(2, 0, _score(labels, 2997.0), parent, cfg.safeguards.min_delta, None)[0]
        is VariantStatus.discarded
    )


def test_the_plateau_and_the_target_read_a_falling_error_as_progress(diabetes):
    cfg, labels = diabetes
    falling = [_score(labels, m) for m in (3000.0, 2800.0, 2600.0)]
    rising = [_score(labels, m) for m in (3000.0, 3000.0, 3000.0)]
    assert plateau_length(falling, cfg.safeguards.min_delta) == 0
    assert plateau_length(rising, cfg.safeguards.min_delta) == 2
    assert cfg.target_score() == -2500.0

    def decision(bests: list[float]):
        facts = CycleFacts(len(bests), bests, cfg.target_score(), 0, 0, 0.0, 0, 1.0, False)
        return decide(facts, cfg.safeguards)

    assert decision(falling).reason is StopReason.none  # 2600 is above the target MSE 2500: go on
    assert decision([*falling, _score(labels, 2400.0)]).reason is StopReason.target_met  # below it: done
    assert decision(rising).reason is StopReason.plateau


def test_asha_and_optuna_pick_the_lowest_reported_loss(ray_session, diabetes, tmp_path):
    from ray import tune
    from ray.tune.search.optuna import OptunaSearch

    cfg, _ = diabetes
    assert (cfg.search.metric, cfg.search.mode) == ("val_loss", "min")

    def trainable(config: dict) -> None:
        for epoch in range(1, 5):
            tune.report({"epoch": epoch, "val_loss": config["x"] * 1000 + 10 / epoch})

    searcher = OptunaSearch(points_to_evaluate=[{"x": x} for x in (0.9, 0.1, 0.8, 0.7)], seed=0)
    grid = tune.Tuner(
        trainable,
        param_space={"x": tune.uniform(0.0, 1.0)},
        tune_config=tune.TuneConfig(
            metric=cfg.search.metric,
            mode=cfg.search.mode,
            search_alg=searcher,
            scheduler=scheduler(load_config(["task=diabetes", "scheduler.max_t=4", "scheduler.grace_period=1"])),
            num_samples=4,
            max_concurrent_trials=1,
        ),
        run_config=tune.RunConfig(storage_path=str(tmp_path), name="direction", verbose=0),
    ).fit()
    epochs = {r.config["x"]: r.metrics["epoch"] for r in grid}
    assert grid.get_best_result().config["x"] == pytest.approx(0.1)
    assert epochs[0.1] == 4  # the lowest loss trains to the end...
    assert min(epochs[0.8], epochs[0.7]) < 4  # ...while ASHA stops a higher one at a rung (mode=max would keep them)
    study = searcher._ot_study
    assert study.direction.name == "MINIMIZE" and study.best_trial.params["x"] == pytest.approx(0.1)
