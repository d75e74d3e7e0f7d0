"""app/knobstats.py: parameter importance (PED-ANOVA) ranks the knob that moves the score, on real-sized tables."""

from __future__ import annotations

import sys

import numpy as np
import pandas as pd
import pytest

from ralph_ray import PROJECT_ROOT

sys.path.insert(0, str(PROJECT_ROOT / "app"))  # the app's modules, as `streamlit run` finds them
import knobstats  # noqa: E402


def campaign_like(trials: int, seed: int = 0) -> pd.DataFrame:
    """Trials whose score peaks at LR 10^-2.5 under a campaign's noise; BATCH_SIZE and the variant are noise only."""
    rng = np.random.default_rng(seed)
    lr = 10 ** rng.uniform(-4, -1, trials)
    return pd.DataFrame(
        {
            "LR": lr,
            "BATCH_SIZE": rng.integers(16, 256, trials).astype(float),
            knobstats.VARIANT: rng.integers(0, 5, trials).astype(str),
            knobstats.SCORE: 0.95 - 0.05 * np.abs(np.log10(lr) + 2.5) + rng.normal(0, 0.01, trials),
        }
    )


@pytest.mark.parametrize("trials", [200, 1000])
def test_the_knob_that_moves_the_score_ranks_first_over_noise_knobs(trials: int):
    found = knobstats.importances(campaign_like(trials), ["LR", "BATCH_SIZE", knobstats.VARIANT])
    assert max(found, key=found.get) == "LR"
    assert found["LR"] > 0.6 and sum(found.values()) == pytest.approx(1.0)


def test_at_fifty_trials_the_knob_that_matters_ranks_first_in_most_campaigns():
    # A top tenth of 5 trials can share a noise knob's value by chance (seed 0 here: 4 of 5 small batches).
    first = [
        max(found, key=found.get)
        for found in (knobstats.importances(campaign_like(50, s), ["LR", "BATCH_SIZE"]) for s in range(8))
    ]
    assert first.count("LR") >= 6, first


def spikes(trials: int) -> pd.DataFrame:
    """A high score needs A near 0.5, a low score B near 0.5: the best and the worst trials differ in which knob."""
    rng = np.random.default_rng(0)
    a, b = rng.uniform(0, 1, trials), rng.uniform(0, 1, trials)
    score = np.exp(-(((a - 0.5) / 0.05) ** 2)) - np.exp(-(((b - 0.5) / 0.05) ** 2)) + rng.normal(0, 0.01, trials)
    return pd.DataFrame({"A": a, "B": b, knobstats.SCORE: score})


def test_a_loss_ranks_the_same_knob_first_when_minimised_and_the_direction_matters():
    table = spikes(200)
    loss = table.assign(**{knobstats.SCORE: -table[knobstats.SCORE]})
    first = {
        "max": knobstats.importances(table, ["A", "B"]),
        "min": knobstats.importances(loss, ["A", "B"], minimize=True),
        "a loss read as a score": knobstats.importances(loss, ["A", "B"]),
    }
    assert {how: max(found, key=found.get) for how, found in first.items()} == {
        "max": "A",
        "min": "A",
        "a loss read as a score": "B",
    }


def test_a_categorical_knob_that_moves_the_score_ranks_first():
    rng = np.random.default_rng(0)
    optimiser = rng.choice(["adam", "sgd", "rmsprop"], 40)
    table = pd.DataFrame(
        {
            "OPTIMIZER": optimiser,
            "ACTIVATION": rng.choice(["relu", "gelu", "silu"], 40),
            knobstats.SCORE: 0.05 * (optimiser == "adam") + rng.normal(0, 0.01, 40),
        }
    )
    found = knobstats.importances(table, ["OPTIMIZER", "ACTIVATION"])
    assert max(found, key=found.get) == "OPTIMIZER"


def test_the_top_group_is_a_tenth_but_never_fewer_than_three_trials_nor_more_than_half():
    assert knobstats.top_quantile(1000) == 0.1
    assert knobstats.top_quantile(20) == pytest.approx(0.15)
    assert knobstats.top_quantile(4) == 0.5
    assert knobstats.top_quantile(3) == 0.5


def test_too_few_trials_or_nothing_varying_gives_no_importance():
    assert knobstats.importances(campaign_like(2), ["LR"]) == {}
    constant = campaign_like(20).assign(LR=0.01)
    assert knobstats.importances(constant, ["LR"]) == {}
    tied = campaign_like(20).assign(**{knobstats.SCORE: 0.9})  # no best group: not equal shares of 1
    assert knobstats.importances(tied, ["LR", "BATCH_SIZE"]) == {}
