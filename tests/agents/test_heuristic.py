"""The heuristic analyst and coder, on hand-built curves and real copies of the digits trainer."""

from __future__ import annotations

import dataclasses
import math
import re
import shutil
import warnings
from pathlib import Path

import pytest

from ralph_ray import PROJECT_ROOT
from ralph_ray.agents import make_agents
from ralph_ray.agents.base import (
    AgentError,
    CannotApply,
    ChildSeen,
    Diagnosis,
    EpochPoint,
    InterventionEffect,
    ParentView,
    Recommendation,
    TrialSummary,
    Usage,
)
from ralph_ray.agents.catalog import NotApplicable, apply, apply_files, check_files, load_catalog, model_file
from ralph_ray.agents.heuristic import (
    MIN_RECOMMENDATIONS,
    TOO_SLOW_EPOCH_SECONDS,
    AnalystWarning,
    HeuristicAnalyst,
    HeuristicCoder,
    Watched,
    diagnose,
    score,
    smoothing_floor,
)
from ralph_ray.config import load_config
from ralph_ray.gate import Gate, write_smoke_data
from ralph_ray.knobs import rewrite_knobs
from ralph_ray.tasks.digits import prepare
from ralph_ray.variants import unified_diff

SEED_TRAINER = PROJECT_ROOT / "trainers" / "digits" / "train.py"
CATALOG = load_catalog()


def curve(
    train: list[float],
    val_loss: list[float],
    val_acc: list[float],
    grad: list[float] | None = None,
    seconds: float = 0.05,
) -> list[EpochPoint]:
    grad = grad or [1.0] * len(train)
    return [
        EpochPoint(epoch=i + 1, train_loss=t, val_loss=v, val_acc=a, lr=0.05, grad_norm=g, epoch_seconds=seconds)
        for i, (t, v, a, g) in enumerate(zip(train, val_loss, val_acc, grad))
    ]


def trial(
    points: list[EpochPoint],
    status: str = "completed",
    reason: str | None = None,
    score: float | None = 0.95,
    knobs: dict | None = None,
    trial_id: str = "t0",
) -> TrialSummary:
    # By default it ran the epochs it was given (a trial that ends before its EPOCHS stops itself: longer_training
    # is then not proposed)
    return TrialSummary(
        trial_id, status, reason, knobs if knobs is not None else {"EPOCHS": len(points)}, score, points
    )


# Hand-built curves, one per diagnosis (eight epochs each).
HEALTHY = curve(
    [1.0, 0.5, 0.3, 0.2, 0.15, 0.12, 0.11, 0.10],
    [0.9, 0.5, 0.3, 0.22, 0.195, 0.193, 0.192, 0.191],
    [0.80, 0.90, 0.94, 0.960, 0.965, 0.966, 0.968, 0.969],
)
OVERFIT_RISE = curve(
    [1.0, 0.5, 0.3, 0.15, 0.08, 0.04, 0.02, 0.01],
    [0.9, 0.5, 0.3, 0.25, 0.27, 0.31, 0.36, 0.40],
    [0.80, 0.90, 0.94, 0.95, 0.952, 0.953, 0.954, 0.955],
)
OVERFIT_GAP = curve(
    [1.0, 0.5, 0.3, 0.1, 0.05, 0.03, 0.02, 0.02],
    [1.0, 0.6, 0.4, 0.3, 0.3, 0.3, 0.3, 0.3],
    [0.80, 0.90, 0.94, 0.95, 0.955, 0.956, 0.957, 0.958],
)
UNDERFIT = curve(
    [2.3, 1.9, 1.6, 1.45, 1.4, 1.38, 1.37, 1.36],
    [2.2, 1.9, 1.6, 1.5, 1.45, 1.44, 1.43, 1.43],
    [0.30, 0.40, 0.50, 0.55, 0.560, 0.561, 0.562, 0.562],
)
PLATEAU = curve(
    [1.0, 0.5, 0.3, 0.2, 0.18, 0.17, 0.17, 0.17],
    [0.9, 0.5, 0.3, 0.2, 0.19, 0.19, 0.19, 0.19],
    [0.80, 0.90, 0.94, 0.96, 0.961, 0.961, 0.960, 0.961],
)
UNDERTRAINED = curve(
    [2.0, 1.5, 1.0, 0.7, 0.5, 0.35, 0.25, 0.18],
    [1.9, 1.4, 1.0, 0.7, 0.5, 0.36, 0.27, 0.20],
    [0.50, 0.60, 0.70, 0.78, 0.84, 0.88, 0.91, 0.93],
)
DIVERGING = curve(
    [1.0, 0.6, 0.5, 0.7, 0.9, 1.2, 1.5, 1.8],
    [0.9, 0.6, 0.5, 0.7, 0.9, 1.2, 1.5, 1.8],
    [0.80, 0.85, 0.86, 0.80, 0.75, 0.70, 0.60, 0.55],
)


def names(findings) -> list[Diagnosis]:
    return [f.diagnosis for f in findings]


# -----------------------------------------------------------------------------
# Diagnoses


@pytest.mark.parametrize(
    ("points", "expected"),
    [
        (HEALTHY, Diagnosis.healthy),
        (OVERFIT_RISE, Diagnosis.overfitting),
        (OVERFIT_GAP, Diagnosis.overfitting),
        (UNDERFIT, Diagnosis.underfitting),
        (PLATEAU, Diagnosis.plateau),
        (UNDERTRAINED, Diagnosis.undertrained),
        (DIVERGING, Diagnosis.divergence),
    ],
)
def test_each_diagnosis_from_its_curve(points: list[EpochPoint], expected: Diagnosis):
    findings = diagnose([trial(points)], {})
    assert names(findings)[0] is expected
    assert all(f.evidence for f in findings)


def test_overfitting_evidence_quotes_the_numbers():
    (finding, *_) = diagnose([trial(OVERFIT_RISE)], {})
    assert "0.25" in finding.evidence and "0.4" in finding.evidence and "epoch 4" in finding.evidence


def test_nan_failures_mean_divergence_and_silence_other_readings():
    failed = trial([], status="failed", reason="non-finite train_loss=nan at epoch 3", trial_id="t1")
    findings = diagnose([trial(OVERFIT_RISE), failed], {})
    assert names(findings) == [Diagnosis.divergence]
    assert "non-finite" in findings[0].evidence


def test_a_minority_of_nan_failures_is_read_beside_the_curve():
    failed = trial([], status="failed", reason="non-finite val_loss=inf at epoch 2", trial_id="t9")
    trials = [trial(OVERFIT_RISE, trial_id=f"t{i}") for i in range(3)] + [failed]
    assert names(diagnose(trials, {})) == [Diagnosis.divergence, Diagnosis.overfitting]


def test_non_finite_curve_and_grad_spike_mean_divergence():
    nan_curve = curve([1.0, 0.5, math.nan], [0.9, 0.5, math.nan], [0.8, 0.9, 0.1])
    assert names(diagnose([trial(nan_curve)], {})) == [Diagnosis.divergence]
    grads = [1.0, 0.8, 0.6, 0.5, 9.0, 0.5, 0.4, 0.4]
    spiky = curve([p.train_loss for p in HEALTHY], [p.val_loss for p in HEALTHY], [p.val_acc for p in HEALTHY], grads)
    findings = diagnose([trial(spiky)], {})
    assert names(findings) == [Diagnosis.divergence] and "epoch 5" in findings[0].evidence


def test_too_slow_from_epoch_seconds_and_timeouts():
    slow = curve(
        [p.train_loss for p in HEALTHY],
        [p.val_loss for p in HEALTHY],
        [p.val_acc for p in HEALTHY],
        seconds=TOO_SLOW_EPOCH_SECONDS * 2,
    )
    assert names(diagnose([trial(slow)], {})) == [Diagnosis.too_slow, Diagnosis.healthy]
    timeout = trial([], status="failed", reason="timeout: train.py ran past safeguards.trial_timeout_s=120s")
    assert Diagnosis.too_slow in names(diagnose([timeout], {}))


def test_label_smoothing_raises_the_underfitting_floor():
    # A train loss of 0.6 is underfitting for plain cross-entropy... (flat, well above 0.5)
    flat = curve(
        [2.0, 1.0, 0.7, 0.62, 0.61, 0.6, 0.6, 0.6],
        [1.9, 0.9, 0.5, 0.4, 0.38, 0.37, 0.37, 0.37],
        [0.70, 0.85, 0.90, 0.92, 0.925, 0.926, 0.926, 0.926],
    )
    assert Diagnosis.underfitting not in names(diagnose([trial(flat)], {"LABEL_SMOOTHING": 0.1}))
    assert smoothing_floor(0.1) == pytest.approx(0.50, abs=0.01)
    high = curve(
        [2.3, 1.9, 1.4, 1.3, 1.28, 1.27, 1.27, 1.27],
        [2.2, 1.8, 1.3, 1.2, 1.2, 1.2, 1.2, 1.2],
        [0.3, 0.4, 0.5, 0.55, 0.55, 0.55, 0.55, 0.55],
    )
    assert Diagnosis.underfitting in names(diagnose([trial(high)], {"LABEL_SMOOTHING": 0.1}))


def test_best_completed_trial_is_read():
    worse = trial(DIVERGING, score=0.5, trial_id="bad")
    better = trial(UNDERTRAINED, score=0.93, trial_id="good")
    assert names(diagnose([worse, better], {}))[0] is Diagnosis.undertrained


def test_no_curves_is_healthy():
    assert names(diagnose([], {})) == [Diagnosis.healthy]


# -----------------------------------------------------------------------------
# Ranking


def parent_view(
    tmp_path: Path, points: list[EpochPoint], lineage: tuple[str, ...] = (), variant: str = "v1"
) -> ParentView:
    files = tmp_path / variant
    files.mkdir(exist_ok=True)
    source = SEED_TRAINER.read_text()
    for name in lineage:
        source = apply(CATALOG.get(name), source)
    (files / "train.py").write_text(source)
    return ParentView(variant, files, 0.95, [trial(points)], list(lineage[-1:]), list(lineage), "program")


def effect(name: str, diagnosis: Diagnosis, count: int, delta: float | None) -> InterventionEffect:
    return InterventionEffect(name, diagnosis.value, count, delta, None if delta is None else float(delta > 0))


def ranked_names(analysis) -> list[str]:
    return [r.intervention for r in analysis.recommendations]


def test_analysis_answers_the_diagnosis_with_evidence(tmp_path: Path):
    usage = Usage()
    analysis = HeuristicAnalyst().analyse(parent_view(tmp_path, OVERFIT_RISE), [], usage)
    assert analysis.variant_id == "v1" and analysis.diagnoses[0] is Diagnosis.overfitting
    assert len(analysis.recommendations) >= MIN_RECOMMENDATIONS
    top = analysis.recommendations[0]
    assert Diagnosis.overfitting in CATALOG.get(top.intervention).answers and top.diagnosis is Diagnosis.overfitting
    assert "0.25" in top.rationale
    assert "overfitting" in analysis.summary and "0.4" in analysis.summary
    priorities = [r.priority for r in analysis.recommendations]
    assert priorities == sorted(priorities, reverse=True)
    assert usage.calls == 1 and usage.seconds > 0 and usage.tokens == 0


def test_measured_effects_decide_between_equals(tmp_path: Path):
    parent = parent_view(tmp_path, OVERFIT_RISE)
    good = [effect("dropout", Diagnosis.overfitting, 3, +0.01), effect("weight_decay", Diagnosis.overfitting, 3, -0.01)]
    bad = [effect("dropout", Diagnosis.overfitting, 3, -0.01), effect("weight_decay", Diagnosis.overfitting, 3, +0.01)]
    for effects, winner, loser in ((good, "dropout", "weight_decay"), (bad, "weight_decay", "dropout")):
        order = ranked_names(HeuristicAnalyst(exploration=0.0).analyse(parent, effects, Usage()))
        assert order.index(winner) < order.index(loser)


def test_untried_interventions_get_the_exploration_bonus(tmp_path: Path):
    parent = parent_view(tmp_path, OVERFIT_RISE)
    # Everything answering overfitting was measured at 0.0 ten times, except label_smoothing.
    effects = [
        effect(i.name, Diagnosis.overfitting, 10, 0.0)
        for i in CATALOG
        if Diagnosis.overfitting in i.answers and i.name != "label_smoothing"
    ]
    assert ranked_names(HeuristicAnalyst(exploration=0.01).analyse(parent, effects, Usage()))[0] == "label_smoothing"
    untried, _ = score(CATALOG.get("label_smoothing"), Diagnosis.overfitting, effects, 0.01)
    tried, _ = score(CATALOG.get("dropout"), Diagnosis.overfitting, effects, 0.01)
    total = 10 * len(effects)
    assert untried == pytest.approx(CATALOG.get("label_smoothing").prior + 0.01 * math.sqrt(math.log(total + 1)))
    assert tried == pytest.approx(0.0 + 0.01 * math.sqrt(math.log(total + 1) / 11))


def test_tries_that_trained_but_were_never_scored_count_as_no_gain(tmp_path: Path):
    # Every answer to overfitting measured at 0.0 ten times but two: label_smoothing (the highest prior, 0.003) tried
    # 3 times, each child stopped at an ASHA rung (no score), and augmentation (prior 0.002) untried. Before, the
    # stopped tries left no trace: label_smoothing kept its prior and full bonus and was proposed first again.
    others = [
        effect(i.name, Diagnosis.overfitting, 10, 0.0)
        for i in CATALOG
        if Diagnosis.overfitting in i.answers and i.name not in ("label_smoothing", "augmentation")
    ]
    stopped = InterventionEffect("label_smoothing", Diagnosis.overfitting.value, 0, None, None, unscored=3)
    total = 10 * len(others) + 3
    value, note = score(CATALOG.get("label_smoothing"), Diagnosis.overfitting, [*others, stopped], 0.01)
    assert value == pytest.approx(0.0 + 0.01 * math.sqrt(math.log(total + 1) / 4))
    assert "3 more trained unscored" in note and "no gain" in note
    parent = parent_view(tmp_path, OVERFIT_RISE)
    order = ranked_names(HeuristicAnalyst(exploration=0.01).analyse(parent, [*others, stopped], Usage()))
    assert order.index("augmentation") < order.index("label_smoothing")
    # Beside scored tries: a gain is diluted by the unscored ones, a loss is not softened by them.
    gain = InterventionEffect("dropout", Diagnosis.overfitting.value, 2, 0.006, 1.0, unscored=2)
    loss = InterventionEffect("dropout", Diagnosis.overfitting.value, 2, -0.006, 0.0, unscored=2)
    assert score(CATALOG.get("dropout"), Diagnosis.overfitting, [gain], 0.0)[0] == pytest.approx(0.003)
    assert score(CATALOG.get("dropout"), Diagnosis.overfitting, [loss], 0.0)[0] == pytest.approx(-0.006)


def test_an_intervention_unmeasured_under_a_diagnosis_is_scored_by_its_tries_under_others():
    # hard_example_replay answers plateau, underfitting and undertrained. Measured at -0.009 over 4 children under
    # plateau and 2 under underfitting, it used to come back under undertrained with its prior and full bonus (bred 6
    # times in 5 airbench_style cycles); now those 6 tries follow it there.
    replay = CATALOG.get("hard_example_replay")
    measured = [
        InterventionEffect(replay.name, Diagnosis.plateau.value, 4, -0.010, 0.0),
        InterventionEffect(replay.name, Diagnosis.underfitting.value, 2, -0.007, 0.5, unscored=1),
        effect("longer_training", Diagnosis.undertrained, 5, 0.001),
    ]
    value, note = score(replay, Diagnosis.undertrained, measured, 0.01)
    mean = (4 * -0.010 + 2 * -0.007) / 6
    gain = (mean * 6 + mean * 1) / 7  # the unscored try counts at the (negative) mean
    assert value == pytest.approx(gain + 0.01 * math.sqrt(math.log(7 + 1) / 8))
    assert "pooled over plateau, underfitting" in note and "win rate 17%" in note
    assert value < replay.prior + 0.01 * math.sqrt(math.log(5 + 1))  # what it scored before
    # Measured under the diagnosis itself, that measure wins over the pool.
    own = [*measured, InterventionEffect(replay.name, Diagnosis.undertrained.value, 1, 0.004, 1.0)]
    value, note = score(replay, Diagnosis.undertrained, own, 0.0)
    assert value == pytest.approx(0.004) and note.startswith("under undertrained")
    # Measured nowhere: the prior.
    value, note = score(replay, Diagnosis.undertrained, measured[2:], 0.0)
    assert value == pytest.approx(replay.prior) and "not measured yet" in note


def test_same_inputs_same_recommendations(tmp_path: Path):
    parent = parent_view(tmp_path, PLATEAU)
    effects = [effect("lower_lr", Diagnosis.plateau, 2, 0.003)]
    first = HeuristicAnalyst(seed=7).analyse(parent, effects, Usage())
    second = HeuristicAnalyst(seed=7).analyse(parent, effects, Usage())
    assert first.recommendations == second.recommendations and first.summary == second.summary


def test_lineage_and_applied_code_are_skipped_but_repeatable_stay(tmp_path: Path):
    parent = parent_view(tmp_path, PLATEAU, lineage=("batchnorm", "lower_lr"))
    analysis = HeuristicAnalyst().analyse(parent, [], Usage())
    order = ranked_names(analysis)
    assert "batchnorm" not in order and "grokfast_filter" not in order  # in the lineage; conflicts with BatchNorm
    assert "lower_lr" in order  # repeatable
    assert "`batchnorm`: already in the lineage" in analysis.summary
    assert "`grokfast_filter`: the model uses BatchNorm" in analysis.summary  # the transform's own reason


def test_moves_of_knobs_the_trainer_lacks_are_neither_proposed_nor_listed_as_skipped(tmp_path: Path):
    """User trial: a classifier's analysis.md and not_applicable view listed GRPO's TEMPERATURE, BETA, LORA_RANK moves
    as skipped; a knob move for a knob the trainer does not have says nothing about that trainer."""
    parent = parent_view(tmp_path, PLATEAU)
    analyst = HeuristicAnalyst()
    applicable, skipped = analyst._applicable(parent, (parent.files_dir / "train.py").read_text())
    absent = {"hotter_sampling", "cooler_sampling", "stronger_kl", "weaker_kl", "larger_lora_rank"}
    assert absent <= {i.name for i in CATALOG} and not absent & (set(skipped) | {i.name for i in applicable})
    assert "lower_lr" in {i.name for i in applicable}  # a move of a knob it has stays a candidate
    assert "adamw_optimizer" in {i.name for i in applicable} | set(skipped)  # code edits: proposed or said why
    # on the GRPO trainer, which has those knobs, the same moves are candidates
    grpo = tmp_path / "grpo"
    grpo.mkdir()
    (grpo / "train.py").write_text((SEED_TRAINER.parents[1] / "grpo" / "train.py").read_text())
    grpo_view = ParentView("g1", grpo, 0.5, [trial(PLATEAU)], [], [], "program")
    assert {"hotter_sampling", "stronger_kl"} <= {
        i.name for i in analyst._applicable(grpo_view, (grpo / "train.py").read_text())[0]
    }


def test_knob_moves_the_search_would_undo_are_skipped_with_the_reason(tmp_path: Path):
    """The campaign's analyst and coder get the search space: a move past it is not proposed, and says why."""
    parent = parent_view(tmp_path, PLATEAU)
    source = rewrite_knobs((parent.files_dir / "train.py").read_text(), {"WIDTH": 32})
    (parent.files_dir / "train.py").write_text(source)
    cfg = load_config([f"paths.runs={tmp_path / 'runs'}", f"paths.kb={tmp_path / 'kb'}"])  # digits: WIDTH of 8-32
    analyst, coder = make_agents(cfg)
    applicable, skipped = analyst._applicable(parent, source)
    assert "widen" not in {i.name for i in applicable}
    assert skipped["widen"] == "the move WIDTH 32 -> 64 leaves search.space, and its trials would train 32"
    assert "widen" in {i.name for i in HeuristicAnalyst()._applicable(parent, source)[0]}  # no space: proposed
    with pytest.raises(CannotApply, match="leaves search.space"):
        coder.write(parent, Recommendation("widen", Diagnosis.underfitting, "r"), parent.files_dir, None, Usage())
    # sampled outright (search.relative=false): the first trial runs the child's own value, clipped: still held
    absolute = load_config([f"paths.runs={tmp_path / 'runs'}", "search.relative=false"])
    applicable, skipped = make_agents(absolute)[0]._applicable(parent, source)
    assert "lower_lr" in {i.name for i in applicable} and "its trials would train 32" in skipped["widen"]


def test_under_a_time_budget_a_move_of_epochs_alone_is_skipped(tmp_path: Path):
    parent = parent_view(tmp_path, UNDERTRAINED)
    free = HeuristicAnalyst().analyse(parent, [], Usage())
    assert ranked_names(free)[0] == "longer_training"  # the undertrained reading's answer
    timed = HeuristicAnalyst(timed=True).analyse(parent, [], Usage())
    assert "longer_training" not in ranked_names(timed)
    assert "`longer_training`: trial.budget_s holds every trial to the same training time: EPOCHS is ignored" in (
        timed.summary
    )
    assert set(ranked_names(free)) - {"longer_training"} <= set(ranked_names(timed))  # the code edits stay


def test_more_epochs_are_not_proposed_to_a_parent_whose_trials_end_before_their_epochs(tmp_path: Path):
    """User trial: early stopping ended the parent at epochs 24-30 of 60, and `longer_training` (60 -> 80) was bred
    three times; each child scored its parent's score to the digit."""
    parent = parent_view(tmp_path, UNDERTRAINED)
    assert ranked_names(HeuristicAnalyst().analyse(parent, [], Usage()))[0] == "longer_training"
    stops = dataclasses.replace(parent, trials=[trial(UNDERTRAINED, knobs={"EPOCHS": 60})])
    analysis = HeuristicAnalyst().analyse(stops, [], Usage())
    assert "longer_training" not in ranked_names(analysis)
    assert (
        "- `longer_training`: the parent's trials end before their EPOCHS by themselves (its longest ran 8 of 60"
        in (analysis.summary)
    )
    # epochs counted from 0 (`for epoch in range(EPOCHS)`: the last reported is EPOCHS - 1) ran their course (review)
    from_zero = [dataclasses.replace(p, epoch=p.epoch - 1) for p in UNDERTRAINED]
    counted = dataclasses.replace(parent, trials=[trial(from_zero, knobs={"EPOCHS": len(from_zero)})])
    assert "longer_training" in ranked_names(HeuristicAnalyst().analyse(counted, [], Usage()))
    # one trial that ran its epochs out (another knob sample) is enough to keep it
    both = dataclasses.replace(stops, trials=[*stops.trials, trial(UNDERTRAINED, trial_id="t1")])
    assert "longer_training" in ranked_names(HeuristicAnalyst().analyse(both, [], Usage()))


# -----------------------------------------------------------------------------
# The campaign's own metric (user trial ut_textclf: a trainer reporting only val_f1 read "healthy (val_acc n/a)" in
# every analysis, with no warning; one reporting both was read from accuracy though the task scored macro-F1)


def others(points: list[EpochPoint], name: str, values: list[float], keep_acc: bool = True) -> list[EpochPoint]:
    """`points` with `name` reported beside them (as the KB hands a metric the curves view does not pivot)."""
    return [
        dataclasses.replace(p, others={name: v}, val_acc=p.val_acc if keep_acc else None)
        for p, v in zip(points, values, strict=True)
    ]


RISING_F1 = [0.40, 0.45, 0.50, 0.55, 0.60, 0.66, 0.72, 0.78]
FLAT_F1 = [0.60, 0.70, 0.74, 0.751, 0.751, 0.750, 0.751, 0.751]


def test_progress_is_read_from_the_search_metric_alone_when_no_val_acc_is_reported():
    f1 = Watched("val_f1")
    only_f1 = others(PLATEAU, "val_f1", RISING_F1, keep_acc=False)
    (finding,) = [f for f in diagnose([trial(only_f1)], {}, f1) if f.diagnosis is Diagnosis.undertrained]
    assert finding.evidence.startswith("val_f1 reached 0.7800 in the last 3 epochs, up 0.1800")
    flat = others(PLATEAU, "val_f1", FLAT_F1, keep_acc=False)
    assert Diagnosis.plateau in names(diagnose([trial(flat)], {}, f1))


def test_the_search_metric_wins_over_val_acc_where_both_are_reported():
    # accuracy still climbing, macro-F1 flat: the task's metric has stalled (imbalanced classes)
    climbing = [dataclasses.replace(p, val_acc=u.val_acc) for p, u in zip(PLATEAU, UNDERTRAINED, strict=True)]
    both = others(climbing, "val_f1", FLAT_F1)
    assert Diagnosis.undertrained in names(diagnose([trial(both)], {}))  # read from val_acc by default
    read = diagnose([trial(both)], {}, Watched("val_f1"))
    assert Diagnosis.plateau in names(read) and "val_f1 flat" in read[0].evidence
    # and the other way round: accuracy flat, F1 still rising
    rising = others(PLATEAU, "val_f1", RISING_F1)
    assert Diagnosis.undertrained in names(diagnose([trial(rising)], {}, Watched("val_f1")))


def test_a_lower_is_better_metric_reads_a_falling_curve_as_still_improving():
    """search.mode=min inverts the comparison: an MSE still falling 10% per epoch is undertrained, one that stopped
    falling is a plateau; read as an accuracy, the falling MSE was a plateau (its max long behind it)."""
    mse = Watched("val_mse", lower_is_better=True)
    falling = others(PLATEAU, "val_mse", [9.0, 7.0, 5.5, 4.5, 4.0, 3.6, 3.2, 2.9], keep_acc=False)
    (finding,) = [f for f in diagnose([trial(falling)], {}, mse) if f.diagnosis is Diagnosis.undertrained]
    assert "val_mse reached 2.9 in the last 3 epochs, down 1.1 on the earlier best 4" in finding.evidence
    assert Diagnosis.plateau in names(diagnose([trial(falling)], {}, Watched("val_mse")))  # as if higher were better
    stalled = others(PLATEAU, "val_mse", [9.0, 7.0, 5.5, 4.5, 4.0, 4.01, 3.99, 4.02], keep_acc=False)
    assert Diagnosis.plateau in names(diagnose([trial(stalled)], {}, mse))


def test_a_metric_reported_at_too_few_epochs_leaves_the_reading_to_val_acc():
    """Review: a trainer reporting val_f1 at the last epoch only and val_acc every epoch had its metric taken from one
    point: nothing was read and the analysis said "no warning sign" with no note. Now val_acc's curve is read, and
    where neither has more than 3 finite epochs the analysis says what each had."""
    f1 = Watched("val_f1")
    once = [*UNDERTRAINED[:-1], dataclasses.replace(UNDERTRAINED[-1], others={"val_f1": 0.9})]
    (finding,) = [f for f in diagnose([trial(once)], {}, f1) if f.diagnosis is Diagnosis.undertrained]
    assert finding.evidence.startswith("val_acc reached 0.9300")
    healthy = [*HEALTHY[:-1], dataclasses.replace(HEALTHY[-1], others={"val_f1": 0.9})]
    (finding,) = diagnose([trial(healthy)], {}, f1)
    assert finding.evidence == (
        "no warning sign in the best curve (read from val_acc: the best trial reported val_f1 (search.metric) at 1 "
        "epoch only)"
    )
    blind = [dataclasses.replace(p, val_acc=None) for p in healthy]
    (finding,) = diagnose([trial(blind)], {}, f1)
    assert finding.evidence.endswith(
        "(the best trial reported val_f1 (search.metric) at 1 epoch only and no val_acc: undertrained and plateau "
        "need more than 3 epochs of finite values and were not read)"
    )


# A reward levelling near 0 after -0.02; one flat at -0.001 +- 0.0001; one still rising across 0.
LEVELLED = [-0.02, -0.012, -0.006, -0.002, 0.0011, 0.0013, 0.0014, 0.0015]
FLAT_NEAR_ZERO = [-0.0010, -0.0009, -0.0011, -0.00095, -0.0010, -0.0011, -0.00085, -0.0010]
CROSSING = [-0.05, -0.04, -0.03, -0.02, -0.01, 0.0, 0.01, 0.02]


@pytest.mark.parametrize(
    ("values", "expected"),
    [(LEVELLED, Diagnosis.plateau), (FLAT_NEAR_ZERO, Diagnosis.plateau), (CROSSING, Diagnosis.undertrained)],
)
def test_a_metric_near_or_across_zero_is_read_against_its_span_and_noise(values: list[float], expected: Diagnosis):
    """Review: a gain was relative to the earlier best's size, which blows up near 0: a reward levelled at
    0.0011-0.0015 after -0.02 read "undertrained, up 0.0004" (36%), a flat -0.001 +- 0.0001 read undertrained."""
    reward = others(PLATEAU, "mean_return", values, keep_acc=False)
    found = names(diagnose([trial(reward)], {}, Watched("mean_return")))
    assert expected in found and ({Diagnosis.plateau, Diagnosis.undertrained} - {expected}).isdisjoint(found)


def test_a_loss_near_zero_falling_on_is_not_undertrained():
    """Review: val_loss 1e-4 -> 9e-5 over the window (10%, of nothing) read undertrained, from val_acc's fallback
    check and as the search metric under search.mode=min."""
    tiny = curve(
        [0.4, 0.04, 0.004, 8e-4, 8e-5, 7e-5, 6e-5, 5e-5],
        [0.5, 0.05, 0.005, 0.001, 1e-4, 9.7e-5, 9.4e-5, 9e-5],
        [0.90, 0.99, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0],
    )
    assert names(diagnose([trial(tiny)], {})) == [Diagnosis.plateau]
    assert names(diagnose([trial(tiny)], {}, Watched("val_loss", lower_is_better=True))) == [Diagnosis.plateau]


def test_the_best_value_shown_is_formatted_as_its_series_is_read(tmp_path: Path):
    """A val_mse ending at 0.9 was shown as "best val_mse 0.9000" (four decimals for any value in [0, 1]) while its
    reading wrote 0.9: one format per series now."""
    mse = others(PLATEAU, "val_mse", [9.0, 7.0, 5.5, 4.5, 4.0, 3.0, 2.0, 0.9], keep_acc=False)
    parent = dataclasses.replace(parent_view(tmp_path, PLATEAU), trials=[trial(mse)])
    summary = HeuristicAnalyst(metric=Watched("val_mse", lower_is_better=True)).analyse(parent, [], Usage()).summary
    assert "best val_mse 0.9 at epoch 8." in summary and "val_mse reached 0.9 in the last 3 epochs" in summary


def test_an_analyst_with_neither_metric_says_so_once_and_in_its_analysis(tmp_path: Path):
    blind = others(PLATEAU, "worst_class_f1", RISING_F1, keep_acc=False)
    parent = dataclasses.replace(parent_view(tmp_path, PLATEAU), trials=[trial(blind)])
    analyst = HeuristicAnalyst(metric=Watched("val_f1"))
    with pytest.warns(AnalystWarning, match=r"no val_f1 \(search.metric\) nor val_acc"):
        analysis = analyst.analyse(parent, [], Usage())
    assert analysis.diagnoses == [Diagnosis.healthy]
    assert "undertrained and plateau were not read" in analysis.summary
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once: the second parent adds no warning
        analyst.analyse(parent, [], Usage())
    # the metric it did read is the one the analysis shows, at its best epoch
    shown = HeuristicAnalyst(metric=Watched("val_f1")).analyse(
        dataclasses.replace(parent, trials=[trial(others(PLATEAU, "val_f1", RISING_F1, keep_acc=False))]), [], Usage()
    )
    assert "val_f1 0.78" in shown.summary and "best val_f1 0.7800 at epoch 8" in shown.summary


def test_the_campaign_tells_the_analyst_its_search_metric_and_mode(tiny_config):
    analyst, _ = make_agents(tiny_config())
    assert analyst.metric == Watched("val_acc", lower_is_better=False)
    analyst, _ = make_agents(tiny_config("search.metric=val_loss", "search.mode=min"))
    assert analyst.metric == Watched("val_loss", lower_is_better=True)


def test_the_campaign_tells_the_analyst_of_a_time_budget(tiny_config):
    analyst, _ = make_agents(tiny_config("trial.budget_s=10"))
    assert isinstance(analyst, HeuristicAnalyst) and analyst.timed
    assert not make_agents(tiny_config())[0].timed


def test_gpu_only_interventions_are_not_proposed_to_cpu_trials(tmp_path: Path, tiny_config):
    """Autocast and channels-last change nothing on a CPU: on 2 cores both were kept on noise, wasting two children."""
    parent = parent_view(tmp_path, PLATEAU)
    gpu_only = {i.name for i in load_catalog() if i.needs_gpu}
    assert gpu_only == {"mixed_precision", "channels_last"}
    cpu = HeuristicAnalyst(gpu=False).analyse(parent, [], Usage())
    assert not gpu_only & set(ranked_names(cpu))
    assert "`mixed_precision`: trials run on the CPU (resources.gpu=0)" in cpu.summary
    assert "trials run on the CPU" not in HeuristicAnalyst(gpu=True).analyse(parent, [], Usage()).summary
    # the campaign says which: resources.gpu
    assert make_agents(tiny_config())[0].gpu is False
    assert make_agents(tiny_config("resources.gpu=0.5"))[0].gpu is True


def test_flips_are_not_proposed_where_the_task_says_mirroring_changes_the_label(tmp_path: Path, tiny_config):
    """A flipped digits child lost 0.033 selection: the digits task declares task.mirror_invariant=false."""
    parent = parent_view(tmp_path, OVERFIT_GAP)
    mirroring = {i.name for i in load_catalog() if i.mirrors_images}
    assert mirroring == {"flip_augmentation", "flip_tta"}
    garments = ranked_names(HeuristicAnalyst(mirror_invariant=True).analyse(parent, [], Usage()))
    assert {"flip_augmentation", "flip_tta"} <= set(garments)
    digits = HeuristicAnalyst(mirror_invariant=False).analyse(parent, [], Usage())
    assert not mirroring & set(ranked_names(digits))
    assert "`flip_augmentation`: the task says mirroring changes an input's label" in digits.summary
    assert "`flip_tta`: the task says mirroring changes an input's label" in digits.summary
    # the task folder says which: trainers/digits/task.yaml sets it false, a garment task keeps the default
    assert make_agents(tiny_config())[0].mirror_invariant is False
    assert load_config(["task=fashion"]).task.mirror_invariant is True


def test_image_interventions_are_not_proposed_where_the_inputs_are_not_images(tmp_path: Path, tiny_config):
    """User trial: shifts and flips ranked #3/#4 for 30 table columns (breast_cancer); with 16, 25 or 64 columns they
    would pass the gate and shift or mirror table rows. task.images=false rules them out, with the reason."""
    parent = parent_view(tmp_path, OVERFIT_GAP)
    images = {i.name for i in load_catalog() if i.needs_images}
    assert images == {"augmentation", "flip_augmentation", "flip_tta", "channels_last"}
    unknown = ranked_names(HeuristicAnalyst(gpu=True).analyse(parent, [], Usage()))
    assert {"augmentation", "flip_augmentation", "flip_tta"} <= set(unknown)  # not known: nothing skipped for it
    assert ranked_names(HeuristicAnalyst(gpu=True, images=True).analyse(parent, [], Usage())) == unknown
    table = HeuristicAnalyst(gpu=True, images=False).analyse(parent, [], Usage())
    assert not images & set(ranked_names(table))
    for name in sorted(images):
        assert f"- `{name}`: the task's inputs are not images (task.images)" in table.summary
    # the config says which: digits' task.yaml sets images, the command line (or a task.yaml) overrides it
    assert make_agents(tiny_config())[0].images is True
    assert make_agents(tiny_config("task.images=false"))[0].images is False


def test_what_the_gate_refused_for_a_parent_is_skipped_and_what_was_bred_goes_last(tmp_path: Path):
    """User trial: the refused `augmentation` ranked first in all 8 analyses of one parent, and a 1x1 campaign bred
    `batchnorm` twice from one parent (the two children's code differed in knob values only)."""
    parent = parent_view(tmp_path, PLATEAU)
    before = ranked_names(HeuristicAnalyst().analyse(parent, [], Usage()))
    top, second = before[:2]
    gate_said = (
        f"coder: the heuristic coder cannot repair {second!r} after the validation gate rejected it (catalog edits "
        "are fixed; the engine should move on); gate said: smoke run failed: train.py exited with code 1:\n"
        "ValueError: shift_images: (32, 30) is neither (N, C, H, W) nor flattened square images"
    )
    seen = [
        ChildSeen("c1", [top], "candidate"),  # training now: bred, whatever it scores
        ChildSeen("c2", [second], "rejected", gate_said),
        ChildSeen("c3", [before[2]], "crashed", "every trial failed"),  # maybe the machine's fault: no penalty
        # rejections that say nothing of the code (review): the next cycle may write them
        ChildSeen("c4", [before[2]], "rejected", "token budget for this cycle spent after 9000 tokens"),
        ChildSeen("c5", [before[2]], "rejected", "coder: the endpoint timed out after 3 retries"),
        ChildSeen("c6", [before[2]], "rejected", "coder crashed: KeyError: 'choices'"),
    ]
    analysis = HeuristicAnalyst().analyse(dataclasses.replace(parent, children=seen), [], Usage())
    after = ranked_names(analysis)
    assert second not in after
    assert (
        f"- `{second}`: refused for this parent (child c2): smoke run failed: train.py exited with code 1: "
        "ValueError: shift_images: (32, 30) is neither (N, C, H, W) nor flattened square images" in analysis.summary
    )  # the gate's words on one line, as the not_applicable view reads them
    assert after[0] == before[2] and after[-1] == top  # bred already: the last resort
    assert "already bred from this parent (child c1)" in analysis.recommendations[-1].rationale
    assert [r.priority for r in analysis.recommendations] == sorted(
        (r.priority for r in analysis.recommendations), reverse=True
    )  # ordered by priority, as the engine sorts them
    # a kept or discarded child counts as bred too
    for status in ("kept", "discarded"):
        ranked = ranked_names(
            HeuristicAnalyst().analyse(
                dataclasses.replace(parent, children=[ChildSeen("c", [top], status)]), [], Usage()
            )
        )
        assert ranked[-1] == top and ranked[0] == second
    # variants.rejected_by decides where the KB has it, whatever the reason's words: a coder that gave up after the
    # gate's refusal without quoting it is the gate's; a coder's own failure quoting a gate is not
    by_column = [
        ChildSeen("c2", [second], "rejected", "coder: gave up", "gate"),
        ChildSeen("c5", [before[2]], "rejected", gate_said, "coder"),
        ChildSeen("c4", [before[2]], "rejected", gate_said, "budget"),
    ]
    ranked = ranked_names(HeuristicAnalyst().analyse(dataclasses.replace(parent, children=by_column), [], Usage()))
    assert second not in ranked and before[2] in ranked


def test_falls_back_to_healthy_answers_when_the_diagnosis_has_few(tmp_path: Path):
    # Divergence has four answers in the catalog; with batchnorm spent, three are left.
    analysis = HeuristicAnalyst().analyse(parent_view(tmp_path, DIVERGING, lineage=("batchnorm",)), [], Usage())
    recs = analysis.recommendations
    assert analysis.diagnoses == [Diagnosis.divergence]
    assert len(recs) >= MIN_RECOMMENDATIONS and len({r.intervention for r in recs}) == len(recs)
    assert {r.intervention for r in recs[:3]} == {"lower_lr", "lr_warmup", "gradient_clipping"}
    assert all(r.diagnosis is Diagnosis.healthy for r in recs[3:])
    assert Diagnosis.healthy in CATALOG.get(recs[3].intervention).answers
    priorities = [r.priority for r in recs]
    assert priorities == sorted(priorities, reverse=True)  # fallbacks never outrank the diagnosis' answers


def test_missing_trainer_is_an_agent_error(tmp_path: Path):
    parent = ParentView("v", tmp_path / "nowhere", None, [], [], [], "")
    with pytest.raises(AgentError, match="train.py does not exist"):
        HeuristicAnalyst().analyse(parent, [], Usage())


# -----------------------------------------------------------------------------
# Coder


def workdir_copy(tmp_path: Path) -> Path:
    work = tmp_path / "child"
    work.mkdir()
    shutil.copy(SEED_TRAINER, work / "train.py")
    return work


def recommendation(name: str) -> Recommendation:
    return Recommendation(name, Diagnosis.overfitting, "because the curve says so", 1.0)


def test_coder_applies_in_place(tmp_path: Path):
    parent = parent_view(tmp_path, OVERFIT_RISE)
    work = workdir_copy(tmp_path)
    usage = Usage()
    draft = HeuristicCoder().write(parent, recommendation("label_smoothing"), work, None, usage)
    assert draft.files_dir == work and draft.interventions == ["label_smoothing"]
    assert "label_smoothing=LABEL_SMOOTHING" in (work / "train.py").read_text()
    assert "because the curve says so" in draft.rationale
    assert usage.calls == 1 and usage.seconds > 0 and draft.usage.calls == 1


def test_coder_cannot_fix_rejected_code(tmp_path: Path):
    work = workdir_copy(tmp_path)
    usage = Usage()
    with pytest.raises(AgentError, match="cannot repair 'dropout'.*smoke run failed"):
        HeuristicCoder().write(
            parent_view(tmp_path, PLATEAU), recommendation("dropout"), work, "smoke run failed", usage
        )
    assert usage.calls == 1


def test_coder_reports_why_an_intervention_does_not_apply(tmp_path: Path):
    work = workdir_copy(tmp_path)
    (work / "train.py").write_text(apply(CATALOG.get("batchnorm"), SEED_TRAINER.read_text()))
    with pytest.raises(AgentError, match="cannot apply batchnorm.*already has normalisation layers"):
        HeuristicCoder().write(parent_view(tmp_path, PLATEAU), recommendation("batchnorm"), work, None, Usage())
    with pytest.raises(AgentError, match="no intervention 'teleport'"):
        HeuristicCoder().write(parent_view(tmp_path, PLATEAU), recommendation("teleport"), work, None, Usage())


def test_skipped_interventions_and_their_reasons_are_queryable_in_the_kb(tmp_path: Path):
    from ralph_ray.kb import KnowledgeBase, open_reader

    analyst = HeuristicAnalyst()
    parents = [
        parent_view(tmp_path, PLATEAU, lineage=("batchnorm",), variant="p1"),
        parent_view(tmp_path, OVERFIT_RISE, variant="p2"),
    ]
    text = "# cycle 2: analysis\n\n" + "\n".join(analyst.analyse(p, [], Usage()).summary for p in parents)
    kb = KnowledgeBase(tmp_path / "kb")
    kb.init()
    kb.append("cycles", [{"run_id": "r", "cycle": 2, "analysis": text}, {"run_id": "r", "cycle": 1}], "cycle")
    rows = open_reader(kb.root).execute("select parent_id, intervention, reason from not_applicable").fetchall()
    for parent in parents:
        _, skipped = analyst._applicable(parent, (parent.files_dir / "train.py").read_text())
        assert skipped and {i: why for p, i, why in rows if p == parent.variant_id} == skipped
    assert ("p1", "batchnorm", "already in the lineage") in rows


# -----------------------------------------------------------------------------
# A model class kept in a second file (`from models import BlockCNN`, models.py beside train.py)

MULTIFILE = PROJECT_ROOT / "tests" / "fixtures" / "multifile" / "block_cnn"
LAYER_INTERVENTIONS = ["batchnorm", "add_dropout", "deepen", "widen_layers"]


@pytest.fixture(scope="module")
def smoke_gate(tmp_path_factory: pytest.TempPathFactory) -> Gate:
    smoke = write_smoke_data(prepare(0, 0.2, 0.2), tmp_path_factory.mktemp("smoke"), "digits")
    return Gate(smoke, (), timeout_s=120)


def multifile_parent(tmp_path: Path) -> ParentView:
    files = tmp_path / "parent"
    shutil.copytree(MULTIFILE, files, ignore=shutil.ignore_patterns("__pycache__"))
    return ParentView("p", files, 0.9, [trial(UNDERFIT)], [], [], "program")


@pytest.mark.parametrize("name", LAYER_INTERVENTIONS)
def test_layer_interventions_edit_the_model_class_in_the_module_train_py_imports(
    smoke_gate: Gate, tmp_path: Path, name: str
):
    """User trials keep the model in models.py: every layer intervention was refused as "defined in `models`
    (imported)". The analyst proposes it, the coder edits models.py's model class (its block class too, not the
    probe class train.py does not train), train.py stays as it was, and the pair passes the gate's smoke run."""
    parent = multifile_parent(tmp_path)
    applicable, skipped = HeuristicAnalyst()._applicable(parent, (parent.files_dir / "train.py").read_text())
    assert name in {i.name for i in applicable}, skipped.get(name)
    child = tmp_path / "child"
    shutil.copytree(parent.files_dir, child)
    HeuristicCoder().write(parent, recommendation(name), child, None, Usage())
    assert (child / "train.py").read_text() == (MULTIFILE / "train.py").read_text()
    models = (child / "models.py").read_text()
    assert models != (MULTIFILE / "models.py").read_text()
    assert "self.fc = nn.Linear(64, classes)\n" in models and "_fc" not in models  # the probe is no part of it
    if name == "batchnorm":  # the block's conv is the model's too, its classifier's output gets none
        assert "self.bn_conv = torch.nn.BatchNorm2d(cout)" in models and "bn_out" not in models
    diff = unified_diff(parent.files_dir, child)  # the variant's diff.patch
    assert "+++ b/models.py" in diff and "b/train.py" not in diff
    smoke_gate.check(child, parent.files_dir)


def test_the_analyst_and_the_coder_agree_on_a_model_kept_in_a_second_file(tmp_path: Path):
    """For every catalog entry: the analyst's check passes where the coder's edit does, and refuses with its words."""
    parent = multifile_parent(tmp_path)
    files = {path: (parent.files_dir / path).read_text() for path in ("train.py", "models.py")}
    applicable, skipped = HeuristicAnalyst()._applicable(parent, files["train.py"])
    proposed = {i.name for i in applicable}
    assert set(LAYER_INTERVENTIONS) <= proposed, skipped
    for intervention in CATALOG:
        if intervention.name not in proposed | set(skipped):
            continue  # a move of knobs this trainer lacks (another kind of trainer's): not checked
        try:
            changed = apply_files(intervention, files)
        except NotApplicable as reason:
            assert skipped.get(intervention.name) == str(reason).removeprefix(f"{intervention.name}: ")
            continue
        assert intervention.name in proposed
        expected = {"models.py"} if intervention.name in LAYER_INTERVENTIONS else {"train.py"}
        assert set(changed) == expected, intervention.name


def test_a_layer_intervention_on_a_model_from_outside_the_folder_says_why(tmp_path: Path):
    """A models.py missing from the folder, a torchvision model: refused, naming where the model is."""
    parent = multifile_parent(tmp_path)
    (parent.files_dir / "models.py").unlink()
    _, skipped = HeuristicAnalyst()._applicable(parent, (parent.files_dir / "train.py").read_text())
    missing = "the model's class `BlockCNN` is imported from `models.py`, not a file of the variant's folder"
    assert missing in skipped["batchnorm"] and missing in skipped["widen_layers"]
    with pytest.raises(CannotApply, match=re.escape(missing)):
        HeuristicCoder().write(parent, recommendation("add_dropout"), parent.files_dir, None, Usage())
    source = (MULTIFILE / "train.py").read_text()
    library = source.replace("from models import BlockCNN\n", "from torchvision.models import resnet18\n")
    library = library.replace("BlockCNN(data.num_classes)", "resnet18(num_classes=data.num_classes)")
    with pytest.raises(NotApplicable, match=r"`resnet18` comes from `torchvision\.models` \(a library\)"):
        apply_files(CATALOG.get("deepen"), {"train.py": library})


@pytest.mark.parametrize(
    ("imports", "built", "expected"),
    [
        ("from models import BlockCNN as Net", "Net(10)", ("models.py", "BlockCNN")),
        ("from pkg.models import Net", "Net(10).to(device)", ("pkg/models.py", "Net")),
        ("from pkg import models", "models.Net(10)", ("pkg/models.py", "Net")),
        ("from . import models", "models.Net(10)", ("models.py", "Net")),
        ("import pkg.models as pm", "pm.Net(10)", ("pkg/models.py", "Net")),
        ("from torchvision.models import resnet18", "resnet18()", None),
    ],
)
def test_the_model_file_is_read_from_the_import(imports: str, built: str, expected: tuple[str, str] | None):
    source = (MULTIFILE / "train.py").read_text().replace("from models import BlockCNN", imports)
    assert model_file(source.replace("BlockCNN(data.num_classes)", built)) == expected


def test_a_wrapper_of_the_model_is_not_taken_for_its_class():
    """User trial: on the digits seed, `model = harness.wrap(model)` was read as the model's construction, and
    widen_layers and add_dropout were refused as "the model's class `wrap` is imported from `ralph_ray/harness.py`"
    (its class Net is in train.py). A call given the model itself wraps it: the class is the one it wraps."""
    seed = (PROJECT_ROOT / "trainers" / "digits" / "train.py").read_text()
    assert "model = harness.wrap(model)" in seed and model_file(seed) is None
    for name in ("widen_layers", "add_dropout"):
        with pytest.raises(NotApplicable) as refused:
            check_files(CATALOG.get(name), {"train.py": seed})
        assert "harness" not in str(refused.value) and "wrap" not in str(refused.value)
    source = (MULTIFILE / "train.py").read_text()
    compiled = source.replace(
        "BlockCNN(data.num_classes)", "BlockCNN(data.num_classes)\n    model = torch.compile(model)", 1
    )
    assert "torch.compile(model)" in compiled and model_file(compiled) == ("models.py", "BlockCNN")


def test_a_rule_about_the_models_contents_reads_the_module_it_is_imported_from(tmp_path: Path):
    """Grokfast refuses a BatchNorm model (it destabilised training on digits), but read train.py only: with the
    model in models.py (a user's ResNet, BatchNorm in every block) it was proposed. It reads the model's module too."""
    parent = multifile_parent(tmp_path)
    files = {path: (parent.files_dir / path).read_text() for path in ("train.py", "models.py")}
    assert set(apply_files(CATALOG.get("grokfast_filter"), files)) == {"train.py"}  # no BatchNorm: it applies
    normed = files["models.py"].replace(
        "self.conv = nn.Conv2d(cin, cout, kernel_size=3, padding=1)",
        "self.conv = nn.Sequential(nn.Conv2d(cin, cout, kernel_size=3, padding=1), nn.BatchNorm2d(cout))",
    )
    assert normed != files["models.py"]
    (parent.files_dir / "models.py").write_text(normed)
    _, skipped = HeuristicAnalyst()._applicable(parent, files["train.py"])
    assert "the model uses BatchNorm" in skipped["grokfast_filter"]
    with pytest.raises(NotApplicable, match="the model uses BatchNorm"):
        apply_files(CATALOG.get("grokfast_filter"), {**files, "models.py": normed})
