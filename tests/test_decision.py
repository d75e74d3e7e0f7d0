"""The decision engine: every stop rule, its order, and its exit code."""

from __future__ import annotations

from dataclasses import replace

import pytest

from ralph_ray.config import SafeguardsConfig, load_config
from ralph_ray.decision import (
    CUT_BY_STOP_REASON,
    NO_SCORE_REASON,
    CycleFacts,
    StopReason,
    child_verdict,
    decide,
    gate_fail_streak,
    improved,
    plateau_length,
    spent_budgets,
    unjudged_note,
)
from ralph_ray.variants import VariantStatus


def facts(**overrides) -> CycleFacts:
    base = dict(
        cycle=2,
        best_by_cycle=[0.90, 0.95],
        target=None,
        tokens_cycle=0,
        tokens_campaign=0,
        cost_campaign=0.0,
        gate_fail_streak=0,
        elapsed_s=10.0,
        manual_stop=False,
    )
    return CycleFacts(**{**base, **overrides})


def test_plateau_length_counts_cycles_since_a_real_rise():
    assert plateau_length([0.9, 0.95, 0.951, 0.9515], 0.002) == 2
    assert plateau_length([0.9, 0.95, 0.953], 0.002) == 0
    assert plateau_length([None, 0.9], 0.002) == 0
    assert plateau_length([0.9, None, 0.9], 0.0) == 2  # a missing cycle and an equal best are no rise


def test_improved_by_min_delta_rises_by_at_least_it_and_beyond_by_more():
    assert improved(0.95, None, 0.01) and not improved(None, 0.9, 0.01) and not improved(None, None, 0.0)
    assert improved(0.75, 0.5, 0.25) and not improved(0.75, 0.5, 0.25, beyond=True)  # a gain of exactly min_delta
    assert improved(0.76, 0.5, 0.25, beyond=True) and not improved(0.74, 0.5, 0.25)
    assert not improved(0.9, 0.9, 0.0) and not improved(0.9, 0.9, 0.0, beyond=True)  # an equal score is no gain


@pytest.mark.parametrize(
    "trials, failed, score, parent, reason, expected",
    [
        (2, 2, None, 0.9, None, (VariantStatus.crashed, "every trial failed")),
        (2, 1, 0.95, 0.9, None, (VariantStatus.kept, None)),
        (1, 0, 0.95, None, None, (VariantStatus.kept, None)),  # the seed's knob child has no parent score to beat
        (2, 0, 0.905, 0.9, None, (VariantStatus.discarded, None)),  # not by more than min_delta=0.01
        (0, 0, None, 0.9, None, (VariantStatus.discarded, "not trained (stopped)")),
        (0, 0, None, 0.9, "earlier reason", (VariantStatus.discarded, "earlier reason")),
        (2, 1, None, 0.9, None, (VariantStatus.discarded, NO_SCORE_REASON)),  # one failed, one stopped by ASHA
    ],
)
def test_child_verdict(trials, failed, score, parent, reason, expected):
    assert child_verdict(trials, failed, score, parent, 0.01, reason) == expected


def test_a_child_the_campaigns_stop_cut_is_not_judged_and_the_scheduler_is_not_blamed():
    """User trial: a 180 s budget cut both trials of a child at epoch 0; its verdict blamed the scheduler."""
    discarded = VariantStatus.discarded
    assert child_verdict(2, 0, None, 0.9, 0.01, None, cut=2) == (discarded, CUT_BY_STOP_REASON)
    assert child_verdict(2, 1, None, 0.9, 0.01, None, cut=1) == (discarded, CUT_BY_STOP_REASON)  # one crashed
    assert child_verdict(2, 0, None, 0.9, 0.01, None, cut=1) == (discarded, NO_SCORE_REASON)  # ASHA stopped one
    assert child_verdict(2, 0, 0.95, 0.9, 0.01, None, cut=1) == (VariantStatus.kept, None)  # one completed: judged
    assert child_verdict(2, 2, None, 0.9, 0.01, None, cut=0)[0] is VariantStatus.crashed
    assert "scheduler" not in CUT_BY_STOP_REASON


def test_gate_fail_streak_grows_only_when_a_coder_got_every_child_rejected():
    rejected, kept = VariantStatus.rejected, VariantStatus.kept
    assert gate_fail_streak(1, [rejected, rejected], coder=True) == 2
    assert gate_fail_streak(1, [rejected, kept], coder=True) == 0
    assert gate_fail_streak(1, [], coder=True) == 1  # no child asked for: the streak stands
    assert gate_fail_streak(1, [rejected], coder=False) == 0  # agent=none: knob children are never gated away


@pytest.mark.parametrize(
    "overrides, guards, reason, code",
    [
        ({}, {}, StopReason.none, 0),
        ({"manual_stop": True, "target": 0.9}, {}, StopReason.manual_stop, 0),
        ({"target": 0.95}, {"tokens_per_campaign": 1}, StopReason.target_met, 0),
        ({"best_by_cycle": [None, None]}, {}, StopReason.no_trial_completed, 4),
        ({"tokens_cycle": 11}, {"tokens_per_cycle": 10}, StopReason.token_budget, 2),
        ({"tokens_campaign": 101}, {"tokens_per_campaign": 100}, StopReason.token_budget, 2),
        ({"cost_campaign": 1.5}, {"cost_per_campaign": 1.0}, StopReason.cost_budget, 2),
        ({"gate_fail_streak": 2}, {"gate_fail_cycles": 2}, StopReason.gate_failures, 2),
        ({"best_by_cycle": [0.9, 0.9, 0.9, 0.9], "cycle": 4}, {"plateau_cycles": 3}, StopReason.plateau, 3),
        ({"elapsed_s": 61.0}, {"campaign_time_s": 60.0}, StopReason.campaign_time, 2),
        ({"cycle": 5}, {"max_cycles": 5}, StopReason.max_cycles, 0),
    ],
)
def test_each_rule_and_its_exit_code(overrides, guards, reason, code):
    decision = decide(facts(**overrides), SafeguardsConfig(**guards))
    assert decision.reason is reason
    assert decision.exit_code == code
    assert decision.stop is (reason is not StopReason.none)
    assert decision.rationale
    assert decision.as_json()["decision"] == ("stop" if decision.stop else "continue")


def test_target_is_met_on_equality_and_reports_the_best():
    decision = decide(facts(target=0.95), SafeguardsConfig())
    assert decision.reason is StopReason.target_met and decision.best_selection_score == 0.95


def test_rationales_show_scores_at_four_decimals_and_the_decision_keeps_the_full_value():
    best = 0.9637883008356546
    going = decide(facts(best_by_cycle=[best]), SafeguardsConfig())
    assert going.rationale.startswith("continue: best 0.9638, ") and going.best_selection_score == best
    met = decide(facts(best_by_cycle=[best], target=0.95), SafeguardsConfig())
    assert "best selection score 0.9638 reached the target 0.9500" in met.rationale


def test_the_search_stops_at_its_share_of_the_clock_and_says_why():
    cfg = load_config(["safeguards.campaign_time_s=600", "safeguards.final_share=0.25", "safeguards.max_cycles=100"])
    facts_ = facts(elapsed_s=451.0)
    decision = decide(facts_, cfg.safeguards)
    assert decision.stop and decision.reason is StopReason.campaign_time
    assert "search time 450s" in decision.rationale and "final_share=0.25" in decision.rationale
    assert not decide(facts(elapsed_s=449.0), cfg.safeguards).stop


@pytest.mark.parametrize(
    ("guards", "used", "override"),
    [
        (dict(campaign_time_s=240.0), dict(elapsed_s=248.0), "safeguards.campaign_time_s=488"),
        (dict(campaign_time_s=600.0, final_share=0.25), dict(elapsed_s=451.0), "safeguards.campaign_time_s=1202"),
        (dict(max_cycles=2), {}, "safeguards.max_cycles=4"),
        (dict(tokens_per_campaign=1000), dict(tokens_campaign=1200), "safeguards.tokens_per_campaign=2200"),
        (dict(cost_per_campaign=0.5), dict(cost_campaign=0.75), "safeguards.cost_per_campaign=1.2500"),
    ],
)
def test_a_spent_budget_names_the_override_that_gives_as_much_again(guards, used, override):
    """What a resume must raise: each budget decide() stops on whatever the scores, and an override after which it
    goes on (a user trial's resume of a run stopped on its time said only `decide stop (campaign_time)`)."""
    spent_facts = facts(cycle=2, **used)
    limits = SafeguardsConfig(**{"max_cycles": 10, **guards})
    spent = spent_budgets(2, spent_facts.elapsed_s, spent_facts.tokens_campaign, spent_facts.cost_campaign, limits)
    assert [s.override for s in spent] == [override]
    stopped = decide(spent_facts, limits)  # the same rule: its reason, and what was used as its rationale
    assert stopped.stop and (stopped.reason, stopped.rationale) == (spent[0].reason, spent[0].used)
    key, value = override.removeprefix("safeguards.").split("=")
    raised = replace(limits, **{key: type(getattr(limits, key) or 0)(float(value))})
    assert not decide(spent_facts, raised).stop
    assert spent_budgets(2, spent_facts.elapsed_s, spent_facts.tokens_campaign, spent_facts.cost_campaign, raised) == []


def test_a_min_metrics_rationales_show_its_own_values_and_an_upper_bound():
    """User trial: an MSE run's report read "the 90% lower bound of the best replicated variant -0.0282 reached the
    target -0.0290", two lines under "target (selection recon_mse): 0.029"."""
    cfg = load_config(["task=diabetes", "target.selection_score=0.029"])
    assert cfg.metric_sign() == -1.0 and cfg.target_score() == -0.029  # compared oriented: higher is better
    guards = replace(cfg.safeguards, plateau_cycles=5)
    oriented = facts(best_by_cycle=[-0.0477, -0.0287], target=cfg.target_score(), sign=cfg.metric_sign())
    met = decide(replace(oriented, floor_by_cycle=[None, -0.0282]), guards)
    assert met.reason is StopReason.target_met and met.best_selection_score == -0.0287  # the KB keeps it oriented
    assert "the 90% upper bound of the best replicated variant 0.0282 is at or below the target 0.0290" in (
        met.rationale
    )
    going = decide(replace(oriented, target=None), guards)
    assert going.rationale.startswith("continue: best 0.0287, ")
    flat = decide(replace(oriented, target=None, best_by_cycle=[-0.0287, -0.0287]), replace(guards, plateau_cycles=1))
    assert flat.reason is StopReason.plateau and "best selection score has not fallen by min_delta" in flat.rationale


def test_a_continue_names_the_figures_its_rules_read_with_replicates():
    """User trials: "continue: best 0.9805, 1 cycle(s) without improvement" while the best trial had risen from 0.9721
    (the count read the replicates' lower bound); and a run with best trial 0.8435 against target 0.84 went on
    without saying the target reads that bound."""
    floored = facts(best_by_cycle=[0.9721, 0.9805], floor_by_cycle=[0.9512, 0.9515], target=0.99)
    going = decide(floored, SafeguardsConfig(max_cycles=5))
    assert not going.stop
    assert going.rationale == (
        "continue: the best variant's 90% lower bound 0.9515 (best single trial 0.9805), 1 cycle(s) without the "
        "lower bound rising by min_delta, target 0.9900 not yet met: the best variant's 90% lower bound is 0.9515, "
        "3 cycle(s) left"
    )
    looks_met = decide(facts(best_by_cycle=[0.8435], floor_by_cycle=[0.79], target=0.84), SafeguardsConfig())
    assert not looks_met.stop
    assert "target 0.8400 not yet met: the best variant's 90% lower bound is 0.7900" in looks_met.rationale
    nothing_yet = decide(facts(floor_by_cycle=[None, None], target=0.99), SafeguardsConfig(plateau_cycles=5))
    assert nothing_yet.rationale.startswith("continue: no lower bound yet (nothing replicated) (best single trial")
    plain = decide(facts(target=0.99), SafeguardsConfig())  # no replicates: the best trial is what the rules read
    assert "target 0.9900 not yet met: the best selection score is 0.9500" in plain.rationale


def test_a_child_the_scheduler_stopped_in_every_trial_is_not_judged_and_the_console_line_says_how_to_judge_it():
    """User trial: 6 of 8 children (1-2 trials each) were all stopped by ASHA at epoch 2, and the console said only
    `discarded`: the reason (events.jsonl's) now names the fix, and the verdict line shows it."""
    status, reason = child_verdict(2, 0, None, 0.9, 0.01, None)
    assert status is VariantStatus.discarded
    assert reason is not None and reason.startswith("not judged: no trial completed")
    assert "raise scheduler.grace_period or population.trials_per_child" in reason
    assert unjudged_note(reason, None) == f" ({reason})"
    assert unjudged_note("beat its parent by 0.02", 0.95) == ""


def test_an_async_campaign_records_one_decision_per_generation_and_the_last_names_one_that_exists():
    """User trial: an async campaign (1 x 2, every child generation 2) printed `generation 3 decide stop
    (max_cycles)` (the decisions' count of closed generations, not a generation of its variants), and another printed
    `generation 4 decide continue` then `generation 4 decide stop` for the one row the KB keeps. A generation's
    decision is its last: a continue is recorded once a deeper generation has a verdict, a stop names the deepest."""
    from ralph_ray.decision import generation_decided

    # (deepest generation with a verdict, last generation with a decisions row, the decision stops or is the last)
    steps = [(1, 0, False), (2, 0, False), (2, 1, False), (2, 1, True)]  # seed closes, 2 children judged, then 2 more
    assert [generation_decided(*step) for step in steps] == [None, 1, None, 2]
    assert generation_decided(4, 3, False) is None  # generation 4's continue waits for generation 5: never twice
    assert generation_decided(4, 3, True) == 4
    assert generation_decided(5, 3, False) == 4  # a deeper verdict closes the one before it
    assert generation_decided(1, 0, True) == 1  # a stop before any child: the seed's generation
    # A resumed older run's rows count closed generations: its stop follows its last row, never goes under it.
    assert generation_decided(2, 3, True) == 3 and generation_decided(3, 3, False) is None


def test_the_budgets_line_counts_the_closed_generations_the_rule_reads_not_the_generation_named():
    from ralph_ray.decision import budgets_line

    guards = SafeguardsConfig(max_cycles=3)
    decision = replace(decide(facts(cycle=3, best_by_cycle=[0.9, 0.95, 0.95]), guards), cycle=2)
    assert decision.reason is StopReason.max_cycles
    assert "budgets: cycle 3/3," in budgets_line(decision, facts(cycle=3), guards)
