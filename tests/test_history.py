"""A campaign's history read back from a real KB of hand-written rows: parents, a parent's view, cycle facts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ralph_ray import history, sql
from ralph_ray.kb import KnowledgeBase
from ralph_ray.population import Candidate
from ralph_ray.state import CampaignState
from ralph_ray.statuses import STOPPED_WITH_CYCLE

RUN = "r1"


def trial(
    trial_id: str,
    variant: str,
    status: str,
    score: float | None,
    cycle: int = 1,
    reason: str | None = None,
    knobs: dict | None = None,
) -> dict:
    return {
        "run_id": RUN,
        "cycle": cycle,
        "trial_id": trial_id,
        "variant_id": variant,
        "status": status,
        "reason": reason,
        "knobs": json.dumps(knobs or {}),
        "epochs": 2,
        "selection_score": score,
        "test_score": score,
        "seconds": 1.0,
    }


def variant(variant_id: str, parent: str | None, interventions: list[str], cycle: int) -> dict:
    return {
        "run_id": RUN,
        "variant_id": variant_id,
        "parent_id": parent,
        "cycle": cycle,
        "interventions": json.dumps(interventions),
        "status": "kept",
    }


@pytest.fixture
def kb(tmp_path: Path) -> KnowledgeBase:
    # seed -> a (+wider) -> b (+batchnorm); seed -> c (+lower_lr); c's only trial failed.
    kb = KnowledgeBase(tmp_path / "kb")
    kb.init()
    kb.put(
        "variants",
        [
            variant("seed", None, [], 1),
            variant("a", "seed", ["wider"], 2),
            variant("b", "a", ["batchnorm"], 3),
            variant("c", "seed", ["lower_lr"], 2),
        ],
        "v",
    )
    kb.append(
        "trials",
        [
            trial("t1", "seed", "completed", 0.90, knobs={"LR": 0.1}),
            trial("t2", "seed", "completed", 0.92, knobs={"LR": 0.3}),
        ],
        "c1",
    )
    kb.append(
        "trials",
        [
            trial("t3", "a", "completed", 0.95, 2, knobs={"LR": 0.5}),
            trial("t4", "a", "stopped_early", None, 2),
            trial("t5", "c", "failed", None, 2, "timeout"),
            trial("t6", "a", "stopped_early", None, 2, "stopped with the cycle"),
        ],
        "c2",
    )
    kb.append(
        "epochs",
        [
            {"run_id": RUN, "trial_id": "t3", "epoch": e, "metric": "val_acc", "value": v}
            for e, v in ((1, 0.8), (2, 0.9))
        ]
        + [
            {"run_id": RUN, "trial_id": "t3", "epoch": e, "metric": name, "value": v}
            for e, v in ((1, 0.6), (2, 0.7))
            for name in ("val_f1", "train_seconds")  # every report carries train_seconds (harness.TRAIN_SECONDS)
        ],
        "e",
    )
    kb.append(
        "agent_usage",
        [
            {"run_id": RUN, "cycle": 2, "role": "coder", "tokens_in": 100, "tokens_out": 20, "cost": 0.5, "calls": 1},
            {"run_id": RUN, "cycle": 1, "role": "analyst", "tokens_in": 7, "tokens_out": 3, "cost": 0.25, "calls": 1},
        ],
        "u",
    )
    return kb


def test_ranked_parents_are_best_first_with_their_best_knobs_and_branch(kb: KnowledgeBase):
    ranked = history.ranked(kb.reader(), RUN)
    assert [(c.variant_id, c.selection_score, c.best_knobs, c.branch) for c in ranked] == [
        ("a", 0.95, {"LR": 0.5}, "a"),
        ("seed", 0.92, {"LR": 0.3}, "seed"),
    ]
    assert history.known_variants(kb.reader(), RUN) == {"seed", "a", "b", "c"}
    assert history.variant_scores(kb.reader(), RUN) == {"a": (0.95, 0.95), "seed": (0.92, 0.92)}
    assert history.best_trial(kb.reader(), RUN) == "t3"
    assert history.best_trial(kb.reader(), "no-such-run") is None


def test_parents_are_ranked_as_the_pick_so_a_discarded_childs_lucky_trial_breeds_nothing(tmp_path: Path):
    # User trial: cycle 3 bred from a discarded child (best trial 0.8446, replicate mean 0.8294) while the seed was
    # rank 1 (mean 0.8348) and the console had said "kept: none": parents were ranked by best single trial.
    kb = KnowledgeBase(tmp_path / "kb")
    kb.init()
    kb.put(
        "variants",
        [
            {**variant("seed", None, [], 1), "status": "seed"},
            {**variant("kid", "seed", ["raise_lr"], 2), "status": "discarded"},
        ],
        "v",
    )
    rows = [trial("s0", "seed", "completed", 0.8400, knobs={"LR": 0.1}), trial("k0", "kid", "completed", 0.8446, 2)]
    for i, (v, score) in enumerate((("seed", 0.8348), ("seed", 0.8348), ("kid", 0.8294), ("kid", 0.8294))):
        knobs = {"LR": 0.1} if v == "seed" else {}
        rows.append({**trial(f"r{i}", v, "completed", score, knobs=knobs), "replicate": True})
    kb.append("trials", rows, "c")
    ranked = history.ranked(kb.reader(), RUN)
    assert [(c.variant_id, c.selection_score) for c in ranked] == [("seed", 0.84), ("kid", 0.8446)]
    pick = kb.reader().execute(sql.PICK, [RUN]).fetchone()
    assert pick == (ranked[0].variant_id,) == (history.pick(kb.reader(), RUN),)
    assert history.discarded(kb.reader(), RUN) == {"kid"}
    # Each keeps its best trial's score: a child's verdict compares best trials.
    assert history.variant_scores(kb.reader(), RUN) == {"seed": (0.84, 0.84), "kid": (0.8446, 0.8446)}


def test_parents_carry_the_leaderboards_rank_not_their_place_among_scored_variants(tmp_path: Path):
    # Review: the select line's "rank N" was the place in this list; a variant whose only scored trial ASHA stopped
    # (the leaderboard ranks it by that score, parent selection reads completed trials only) shifted every later one.
    # Another run in the KB ranks apart (the run's filter applies before the leaderboard's window).
    kb = KnowledgeBase(tmp_path / "kb")
    kb.init()
    kb.put("variants", [{**variant(v, None, [], 1), "status": "seed"} for v in ("a", "b", "c")], "v")
    rows = [trial("a0", "a", "completed", 0.80), trial("c0", "c", "completed", 0.70)]
    rows += [trial("b0", "b", "stopped_early", 0.75)]
    rows += [{**trial("o0", "a", "completed", 0.99), "run_id": "other"}]
    kb.append("trials", rows, "t")
    rows = history.ranked_with_ranks(kb.reader(), RUN)
    board = dict(kb.reader().execute("select variant_id, rank from leaderboard where run_id = ?", [RUN]).fetchall())
    assert [(c.variant_id, rank) for c, rank in rows] == [("a", 1), ("c", 3)]
    assert all(board[c.variant_id] == rank for c, rank in rows)


def test_lineage_walks_to_the_seed_and_survives_a_loop():
    variants = {"seed": (None, []), "a": ("seed", ["wider"]), "b": ("a", ["batchnorm", "lower_lr"])}
    assert history.lineage(variants, "b") == ["wider", "batchnorm", "lower_lr"]
    assert history.lineage(variants, "seed") == []
    assert history.lineage({"x": ("y", ["1"]), "y": ("x", ["2"])}, "x") == ["2", "1"]  # bounded, no hang


def test_parent_view_bakes_the_best_knobs_and_reads_trials_curves_lineage(kb: KnowledgeBase, tmp_path: Path):
    files = tmp_path / "variants" / "a" / "files"
    files.mkdir(parents=True)
    (files / "train.py").write_text("LR = 0.1  # learning rate\nprint(LR)\n")
    trainer = tmp_path / "trainer"
    trainer.mkdir()
    (trainer / "program.md").write_text("be brief")
    parent = Candidate("a", 0.95, {"LR": 0.5, "ABSENT": 3}, "a")
    view = history.parent_view(kb.reader(), RUN, parent, tmp_path / "variants", tmp_path / "baked" / "a", trainer)
    assert view.files_dir == tmp_path / "baked" / "a"
    assert "LR = 0.5" in (view.files_dir / "train.py").read_text()  # the parent as its best trial ran it
    assert (files / "train.py").read_text().startswith("LR = 0.1")  # the variant itself is untouched
    assert [t.trial_id for t in view.trials] == ["t3", "t4", "t6"]
    assert [p.val_acc for p in view.trials[0].curve] == [0.8, 0.9] and view.trials[1].curve == []
    # a metric the curves view does not pivot (a search.metric=val_f1) reaches the analyst beside them; the
    # harness's own train_seconds does not (the curve's seconds say it)
    assert [p.others for p in view.trials[0].curve] == [{"val_f1": 0.6}, {"val_f1": 0.7}]
    assert view.interventions == ["wider"] and view.lineage == ["wider"] and view.program == "be brief"


def test_cycle_facts_count_trials_spend_and_the_state(kb: KnowledgeBase):
    con = kb.reader()
    assert history.trial_counts(con, RUN, 2) == {"a": (3, 0, 0), "c": (1, 1, 0)}  # t6's reason is not the ledger's
    assert sorted(history.trials_done(con, RUN, 2, "stopped with the cycle")) == ["a", "a", "c"]
    assert history.spend(con, RUN, 2) == history.Spend(120, 130, 0.75)
    state = CampaignState(RUN, cycle=2, best_by_cycle=[0.92, 0.95], gate_fail_streak=1)
    facts = history.cycle_facts(con, state, 0.99, 12.5, False)
    assert (facts.cycle, facts.best_by_cycle, facts.target, facts.tokens_cycle, facts.tokens_campaign) == (
        2,
        [0.92, 0.95],
        0.99,
        120,
        130,
    )
    assert (facts.cost_campaign, facts.gate_fail_streak, facts.elapsed_s, facts.manual_stop) == (0.75, 1, 12.5, False)


def test_effects_and_start_time_of_an_empty_history(kb: KnowledgeBase):
    con = kb.reader()
    assert history.effects(con, "digits", None, None) == []
    assert history.started_at(con, RUN) is None
    kb.append(
        "interventions",
        [
            {
                "run_id": RUN,
                "task": "digits",
                "cycle": 2,
                "variant_id": "a",
                "intervention": "wider",
                "diagnosis": "underfitting",
                "delta": 0.03,
                "outcome": "kept",
            }
        ],
        "i",
    )
    [effect] = history.effects(kb.reader(), "digits", None, None)  # no runs row: metric unknown
    assert (effect.intervention, effect.diagnosis, effect.count, effect.win_rate) == ("wider", "underfitting", 1, 1.0)
    assert effect.mean_delta == pytest.approx(0.03)


def test_children_that_trained_but_got_no_score_are_counted_apart_from_gate_rejections(kb: KnowledgeBase):
    def row(variant: str, delta: float | None, outcome: str) -> dict:
        return {
            "run_id": RUN,
            "task": "digits",
            "cycle": 2,
            "variant_id": variant,
            "intervention": "replay",
            "diagnosis": "plateau",
            "delta": delta,
            "outcome": outcome,
        }

    # Stopped at a rung (discarded, no score), every trial crashed, refused by the gate, and one scored loss.
    rows = [row("a", None, "discarded"), row("b", None, "crashed"), row("c", None, "rejected")]
    kb.append("interventions", [*rows, row("d", -0.004, "discarded")], "i")
    [effect] = history.effects(kb.reader(), "digits", None, None)  # no runs row: metric unknown
    assert (effect.count, effect.unscored) == (1, 2)  # the gate's refusal trained nothing: not a try
    assert effect.mean_delta == pytest.approx(-0.004)
    tried, rejected, unscored = (
        kb.reader()
        .execute("select tried, rejected, unscored from intervention_effects where intervention = 'replay'")
        .fetchone()
    )
    assert (tried, rejected, unscored) == (4, 1, 2)


def test_a_child_the_campaigns_own_stop_cut_is_no_try_of_its_intervention(kb: KnowledgeBase):
    """User trial: cycle 3 of a 180 s campaign started with 17 s left; both trials of a one_cycle_schedule child were
    cut at epoch 0 by the time budget. The child was recorded as the scheduler's doing and intervention_effects
    counted it as an unscored try (tried 5, unscored 1), lowering the intervention for every later campaign. Its
    trials say what happened, so a KB written before the fix is read the same."""

    def row(variant: str) -> dict:
        return {
            "run_id": RUN,
            "task": "digits",
            "cycle": 3,
            "variant_id": variant,
            "intervention": "one_cycle",
            "diagnosis": "plateau",
            "delta": None,
            "outcome": "discarded",
        }

    def t(trial_id: str, variant: str, status: str, reason: str | None) -> dict:
        return trial(trial_id, variant, status, None, 3, reason)

    kb.append(
        "trials",
        [
            t("u1", "cut", "stopped_early", STOPPED_WITH_CYCLE),  # both cut at epoch 0 by the time budget
            t("u2", "cut", "stopped_early", STOPPED_WITH_CYCLE),
            t("u3", "cut_and_failed", "failed", "boom"),
            t("u4", "cut_and_failed", "stopped_early", STOPPED_WITH_CYCLE),
            t("u5", "rung", "stopped_early", None),  # ASHA stopped it at a rung: a judged try without a score
            t("u6", "rung_then_cut", "stopped_early", None),
            t("u7", "rung_then_cut", "stopped_early", STOPPED_WITH_CYCLE),
        ],
        "c3",
    )
    kb.append("interventions", [row(v) for v in ("cut", "cut_and_failed", "rung", "rung_then_cut")], "i3")
    con = kb.reader()
    assert history.trial_counts(con, RUN, 3) == {
        "cut": (2, 0, 2),
        "cut_and_failed": (2, 1, 1),
        "rung": (1, 0, 0),
        "rung_then_cut": (2, 0, 1),
    }
    tried, unscored = con.execute(
        "select tried, unscored from intervention_effects where intervention = 'one_cycle'"
    ).fetchone()
    assert (tried, unscored) == (2, 2)  # the scheduler stopped a trial of `rung` and of `rung_then_cut` only
    [effect] = history.effects(con, "digits", None, None)
    assert (effect.count, effect.unscored) == (0, 2)


def test_effects_are_measured_per_metric_as_each_run_declared_it(kb: KnowledgeBase):
    """User trial: a run that minimised R^2 by mistake (METRIC direction "min") and the fixed run after it, same task
    name, same KB: the two deltas of ema_weights (-0.0035 on -R^2, +0.0016 on R^2) were averaged into one effect of
    -0.001, which the offline agent ranked on. Each run's metric is in its runs row's config."""

    def run(run_id: str, direction: str, delta: float) -> None:
        config = {"task": {"name": "regtask", "metric": "r2", "direction": direction}}
        kb.append("runs", [{"run_id": run_id, "task": "regtask", "config": json.dumps(config)}], f"r-{run_id}")
        row = {"run_id": run_id, "task": "regtask", "cycle": 2, "variant_id": f"v{run_id}", "intervention": "ema"}
        kb.append("interventions", [{**row, "diagnosis": "healthy", "delta": delta, "outcome": "kept"}], f"i-{run_id}")

    run("mistake", "min", -0.0035)
    run("fixed", "max", 0.0016)
    [effect] = history.effects(kb.reader(), "regtask", "r2", "max")
    assert (effect.count, effect.mean_delta) == (1, pytest.approx(0.0016))
    [effect] = history.effects(kb.reader(), "regtask", "r2", "min")
    assert effect.mean_delta == pytest.approx(-0.0035)
    assert history.effects(kb.reader(), "regtask", "mse", "min") == []
    shown = kb.reader().execute("select metric, direction, n from intervention_effects order by direction").fetchall()
    assert shown == [("r2", "max", 1), ("r2", "min", 1)]
