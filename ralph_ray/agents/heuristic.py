"""The heuristic agent: offline and deterministic, the default backend.

The analyst reads a parent's curves (the best completed trial's, plus why others failed), names what
it sees (`Diagnosis`) with the numbers as evidence, and ranks catalog interventions that answer it:
score = the knowledge base's measured mean delta for (intervention, diagnosis), else its mean pooled over the
diagnoses it was measured under, else the catalog's prior, plus a UCB exploration bonus so untried interventions
get their turn. The coder applies the chosen intervention to the child's copy of `train.py` (a layer intervention
to the model's class in the module of the variant's folder train.py imports it from, `models.py`).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import random
import re
import statistics
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from ralph_ray.agents import rl
from ralph_ray.agents.base import (
    AgentError,
    Analysis,
    CannotApply,
    Diagnosis,
    Draft,
    EpochPoint,
    InterventionEffect,
    ParentView,
    Recommendation,
    TrialSummary,
    Usage,
)
from ralph_ray.agents.catalog import (
    TRAINER,
    Catalog,
    Intervention,
    NotApplicable,
    Searched,
    apply_files,
    check_files,
    load_catalog,
    model_file,
)
from ralph_ray.agents.siblings import GATE_SAID, bred_from, refusals
from ralph_ray.config import AgentConfig
from ralph_ray.knobs import read_knobs
from ralph_ray.statuses import TrialStatus

T = TypeVar("T")

# -----------------------------------------------------------------------------
# Thresholds (each says why it sits where it does)

# Epochs at the end of a curve read as "lately": long enough to average out one noisy epoch
# (digits' val split is ~160 images, so val_acc moves in steps of ~0.006), short enough to be recent.
WINDOW = 3
# val_acc gained over the window above this means the run was still learning when it stopped
# (about one val image on digits); below PLATEAU_DELTA it has stalled. These hold for any higher-is-better fraction
# (val_acc, val_f1 in [0, 1]); a metric of other units (a loss, an MSE, a reward) is read relative to its value:
# UNDERTRAINED_LOSS_DROP and PLATEAU_REL below.
UNDERTRAINED_DELTA = 0.005
PLATEAU_DELTA = 0.002
PLATEAU_REL = 0.01
# The curve the undertrained and plateau readings come from where the campaign's search.metric was never reported.
FALLBACK_METRIC = "val_acc"
# val_loss still falling this much (relative) over the window, at its minimum, also means undertrained; the absolute
# floor ignores a loss already near zero falling on (1e-4 -> 9e-5 nats is 10% of nothing).
UNDERTRAINED_LOSS_DROP = 0.05
UNDERTRAINED_LOSS_DROP_ABS = 0.01
# val_loss this far (relative, and absolute) above its minimum while train_loss keeps falling is
# overfitting; the absolute floor ignores wobbles between tiny losses.
OVERFIT_VAL_RISE = 0.10
OVERFIT_VAL_RISE_ABS = 0.01
# A final val/train loss ratio above this with a gap above OVERFIT_MIN_GAP nats: the net fits its
# train split far better than held-out data.
OVERFIT_GAP_RATIO = 3.0
OVERFIT_MIN_GAP = 0.05
# Train loss this many nats above its floor (0, or the label-smoothing entropy) and no longer
# falling by UNDERFIT_FLAT_DROP (relative) over the window: the net cannot fit its train split.
UNDERFIT_TRAIN_LOSS = 0.5
UNDERFIT_FLAT_DROP = 0.10
# Label smoothing raises the train-loss floor; both shipped tasks have 10 classes and the floor
# only shifts the underfitting threshold, so an assumed class count is close enough.
ASSUMED_CLASSES = 10
# Train loss ending this many times above its minimum: the optimisation is going backwards.
DIVERGE_LOSS_RATIO = 1.5
# An epoch's mean grad norm this many times the previous epoch's: a blow-up, even if it recovered.
# (Compared epoch to epoch, not to the median: norms shrink naturally as the loss falls, so the
# first epochs of a healthy run sit far above the median.)
GRAD_SPIKE_RATIO = 10.0
# Seconds per epoch above this: trials cost more than a cycle's budget comfortably holds (digits
# runs ~0.05 s per epoch, cifar10 on a GPU well under 5 s).
TOO_SLOW_EPOCH_SECONDS = 5.0
# Telemetry probes (harness.probes), where a trainer reports them: the generalisation gap (val_loss - train_loss)
# growing by more than GAP_RISE nats over the window, ending at its widest, reads as overfitting (it moves before
# val_loss turns up); the relative update norm ending below UPDATE_COLLAPSE of its peak while the plateau probe
# is set reads as a plateau whose steps have stopped moving the weights (a spent schedule, a dead learning rate).
GAP_RISE = 0.05
UPDATE_COLLAPSE = 0.05
PROBES = ("gen_gap", "update_ratio", "eff_rank", "plateau")  # shown in the analysis when reported
# Failure reasons (as the trial driver words them) that mean divergence or slowness.
DIVERGED_REASON = re.compile(r"non-finite|\bnan\b|\binf\b|diverg|overflow", re.IGNORECASE)
TIMEOUT_REASON = re.compile(r"timeout|timed out", re.IGNORECASE)
# At least this share of a parent's trials diverging makes divergence the only reading that counts.
DIVERGED_SHARE = 0.5

# Fewer candidates than this for the parent's diagnoses: add interventions that suit a healthy run
# (a cycle grows several children per parent, so a short list would leave slots empty).
MIN_RECOMMENDATIONS = 5
# Severity order: what to fix first when several diagnoses hold.
SEVERITY = (
    Diagnosis.divergence,
    Diagnosis.overfitting,
    Diagnosis.underfitting,
    Diagnosis.plateau,
    Diagnosis.undertrained,
    Diagnosis.too_slow,
    Diagnosis.healthy,
)


@dataclass(frozen=True)
class Finding:
    """One diagnosis with the numbers that support it."""

    diagnosis: Diagnosis
    evidence: str


@dataclass(frozen=True)
class Watched:
    """The metric whose curve says whether a run was still improving: the campaign's search.metric and its mode."""

    name: str = FALLBACK_METRIC
    lower_is_better: bool = False

    def read_in(self, curve: list[EpochPoint]) -> Watched | None:
        """The metric to read in `curve`: this one where it has a curve to read (more than WINDOW epochs, all finite),
        else val_acc (higher is better) where it has, else None. A metric reported at the last epoch alone would hide
        a full val_acc curve and leave nothing read."""
        for watched in (self, Watched()):
            if _readable(_series(curve, watched.name)):
                return watched
        return None

    def best(self, values: list[T], key: Callable[[T], float] | None = None) -> T:
        """The best of `values` in this metric's direction (by `key`, for (epoch, value) pairs)."""
        return (min if self.lower_is_better else max)(values, key=key)

    def is_fraction(self, values: list[float]) -> bool:
        """Whether `values` read as a fraction to maximise (an accuracy, an F1): gains count in its own units and
        print with four decimals; anything else is read relative to its scale."""
        return not self.lower_is_better and all(0 <= v <= 1 for v in values)


class AnalystWarning(UserWarning):
    """The heuristic analyst could not read what it diagnoses from (shown once on the console)."""


# -----------------------------------------------------------------------------
# Reading curves


def best_trial(trials: list[TrialSummary]) -> TrialSummary | None:
    """The completed trial with the best selection score (else the best stopped-early one) with a curve."""
    for status in (TrialStatus.completed, TrialStatus.stopped_early):
        pool = [t for t in trials if t.status == status and t.curve]
        if pool:
            return max(pool, key=lambda t: -math.inf if t.selection_score is None else t.selection_score)
    return None


def diagnose(trials: list[TrialSummary], knobs: dict[str, Any], metric: Watched | None = None) -> list[Finding]:
    """What the trials show, most severe first; `[healthy]` when nothing is wrong. Whether a run was still improving
    is read from `metric` (the campaign's search.metric), else from val_acc."""
    best = best_trial(trials)
    watched = metric or Watched()
    from_curve = _curve_findings(best.curve, {**knobs, **best.knobs}, watched) if best is not None else []
    findings = _failure_findings(trials) + from_curve
    diverged = sum(bool(t.status is TrialStatus.failed and DIVERGED_REASON.search(t.reason or "")) for t in trials)
    if any(f.diagnosis is Diagnosis.divergence for f in from_curve) or (
        diverged and diverged >= DIVERGED_SHARE * len(trials)
    ):
        # A run that blows up says nothing trustworthy about over- or underfitting: fix that first.
        # (A minority of diverged trials is the sampler probing a large LR; the best curve still counts.)
        findings = [f for f in findings if f.diagnosis in (Diagnosis.divergence, Diagnosis.too_slow)]
    findings = _first_per_diagnosis(findings)
    if not any(f.diagnosis is not Diagnosis.too_slow for f in findings):
        evidence = "no trial has a curve yet" if best is None else "no warning sign in the best curve"
        read = None if best is None else watched.read_in(best.curve)
        if best is not None and read is None:
            evidence += f" ({_unread(watched, best.curve)})"
        elif best is not None and read.name != watched.name:
            evidence += f" (read from {read.name}: the best trial reported {_had(best.curve, watched.name)})"
        findings.append(Finding(Diagnosis.healthy, evidence))
    return sorted(findings, key=lambda f: SEVERITY.index(f.diagnosis))


def _first_per_diagnosis(findings: list[Finding]) -> list[Finding]:
    seen: dict[Diagnosis, Finding] = {}
    for finding in findings:
        seen.setdefault(finding.diagnosis, finding)
    return list(seen.values())


def _failure_findings(trials: list[TrialSummary]) -> list[Finding]:
    failed = [t for t in trials if t.status is TrialStatus.failed and t.reason]
    findings = []
    diverged = [t for t in failed if DIVERGED_REASON.search(t.reason or "")]
    if diverged:
        findings.append(
            Finding(Diagnosis.divergence, f"{len(diverged)} of {len(trials)} trials failed: {diverged[0].reason}")
        )
    timed_out = [t for t in failed if TIMEOUT_REASON.search(t.reason or "")]
    if timed_out:
        findings.append(
            Finding(Diagnosis.too_slow, f"{len(timed_out)} of {len(trials)} trials timed out: {timed_out[0].reason}")
        )
    return findings


def _series(curve: list[EpochPoint], metric: str) -> list[tuple[int, float]]:
    """(epoch, value) pairs of one metric (a field of EpochPoint, or one of its `others`), skipping epochs that did
    not report it."""
    values = [(p.epoch, _value(p, metric)) for p in curve]
    return [(epoch, value) for epoch, value in values if value is not None]


def _value(point: EpochPoint, metric: str) -> float | None:
    """One epoch's value of a metric (a field of EpochPoint, or one of its `others`), None where not reported."""
    return getattr(point, metric, None) if metric in EPOCH_FIELDS else point.others.get(metric)


EPOCH_FIELDS = frozenset(f.name for f in dataclasses.fields(EpochPoint)) - {"epoch", "others"}


def _readable(series: list[tuple[int, float]]) -> bool:
    """Whether a metric's curve can say if the run was still improving: more than WINDOW epochs, all finite."""
    return len(series) > WINDOW and all(math.isfinite(v) for _, v in series)


def _unread(watched: Watched, curve: list[EpochPoint]) -> str:
    """Why the undertrained and plateau readings were not made: what `curve` had of each metric they read."""
    names = list(dict.fromkeys((watched.name, FALLBACK_METRIC)))
    if not any(_series(curve, name) for name in names):
        labels = " nor ".join(_label(name) for name in names)
        return f"the best trial reported no {labels}: undertrained and plateau were not read"
    return (
        f"the best trial reported {' and '.join(_had(curve, name) for name in names)}: undertrained and plateau need "
        f"more than {WINDOW} epochs of finite values and were not read"
    )


def _had(curve: list[EpochPoint], name: str) -> str:
    """What `curve` had of one metric, where it is too little to read."""
    points = _series(curve, name)
    if not points:
        return f"no {_label(name)}"
    if not all(math.isfinite(v) for _, v in points):
        return f"{_label(name)} with a non-finite value"
    return f"{_label(name)} at {len(points)} epoch{'s' if len(points) > 1 else ''} only"


def _label(name: str) -> str:
    return name if name == FALLBACK_METRIC else f"{name} (search.metric)"


def _curve_findings(curve: list[EpochPoint], knobs: dict[str, Any], watched: Watched) -> list[Finding]:
    checks = (_divergence, _overfitting, _gap_widening, _underfitting, _update_collapse, _too_slow)
    found = [finding for check in checks if (finding := check(curve, knobs)) is not None]
    if (progress := _progress(curve, watched)) is not None:
        found.append(progress)  # order within a diagnosis: the probes' plateau reading stays first
    # RL post-training telemetry first: its readings are more specific than the generic ones from val_acc.
    return [Finding(d, evidence) for d, evidence in rl.findings(curve, knobs)] + found


def _divergence(curve: list[EpochPoint], knobs: dict[str, Any]) -> Finding | None:
    for metric in ("train_loss", "val_loss"):
        bad = [(e, v) for e, v in _series(curve, metric) if not math.isfinite(v)]
        if bad:
            return Finding(Diagnosis.divergence, f"{metric} is {bad[0][1]} at epoch {bad[0][0]}")
    train = _series(curve, "train_loss")
    if len(train) >= 2:
        low_epoch, low = min(train, key=lambda ev: ev[1])
        end_epoch, end = train[-1]
        if low > 0 and end > DIVERGE_LOSS_RATIO * low:
            return Finding(
                Diagnosis.divergence,
                f"train_loss climbed from {low:.4g} (epoch {low_epoch}) to {end:.4g} (epoch {end_epoch})",
            )
    norms = _series(curve, "grad_norm")
    for (_, previous), (epoch, norm) in itertools.pairwise(norms):
        if previous > 0 and norm > GRAD_SPIKE_RATIO * previous:
            return Finding(Diagnosis.divergence, f"grad_norm jumped from {previous:.3g} to {norm:.3g} at epoch {epoch}")
    return None


def _overfitting(curve: list[EpochPoint], knobs: dict[str, Any]) -> Finding | None:
    val, train = _series(curve, "val_loss"), dict(_series(curve, "train_loss"))
    if len(val) < 2 or not train:
        return None
    low_epoch, low = min(val, key=lambda ev: ev[1])
    end_epoch, end = val[-1]
    train_end = train.get(end_epoch)
    train_at_low = train.get(low_epoch)
    rose = end > low * (1 + OVERFIT_VAL_RISE) and end - low > OVERFIT_VAL_RISE_ABS
    if rose and train_end is not None and train_at_low is not None and train_end < train_at_low:
        return Finding(
            Diagnosis.overfitting,
            f"val_loss rose from {low:.4g} (epoch {low_epoch}) to {end:.4g} (epoch {end_epoch}) "
            f"while train_loss fell from {train_at_low:.4g} to {train_end:.4g}",
        )
    if (
        train_end is not None
        and train_end > 0
        and end / train_end > OVERFIT_GAP_RATIO
        and end - train_end > OVERFIT_MIN_GAP
    ):
        return Finding(
            Diagnosis.overfitting, f"final val_loss {end:.4g} is {end / train_end:.1f}x train_loss {train_end:.4g}"
        )
    return None


def _gap_widening(curve: list[EpochPoint], knobs: dict[str, Any]) -> Finding | None:
    """Overfitting read from the gap probe: val_loss - train_loss widening over the window, widest at the end."""
    gap = _series(curve, "gen_gap")
    if len(gap) <= WINDOW:
        return None
    (start_epoch, before), (end_epoch, end) = gap[-1 - WINDOW], gap[-1]
    if end - before > GAP_RISE and end >= max(v for _, v in gap):
        return Finding(
            Diagnosis.overfitting,
            f"gap widening: gen_gap (val_loss - train_loss) grew from {before:.3g} "
            f"(epoch {start_epoch}) to {end:.3g} (epoch {end_epoch})",
        )
    return None


def _update_collapse(curve: list[EpochPoint], knobs: dict[str, Any]) -> Finding | None:
    """A plateau read from the probes: the plateau flag is set and the weights have almost stopped moving."""
    ratios, flags = _series(curve, "update_ratio"), _series(curve, "plateau")
    if len(ratios) <= WINDOW or not flags or flags[-1][1] < 1:
        return None
    peak_epoch, peak = max(ratios, key=lambda ev: ev[1])
    end_epoch, end = ratios[-1]
    if peak > 0 and end < UPDATE_COLLAPSE * peak:
        return Finding(
            Diagnosis.plateau,
            f"update norm collapsed: update_ratio {end:.2g} at epoch {end_epoch} vs "
            f"{peak:.2g} at epoch {peak_epoch}, and the plateau probe is set",
        )
    return None


def _underfitting(curve: list[EpochPoint], knobs: dict[str, Any]) -> Finding | None:
    train = _series(curve, "train_loss")
    if len(train) <= WINDOW:
        return None
    floor = smoothing_floor(float(knobs.get("LABEL_SMOOTHING") or 0.0))
    before, end = train[-1 - WINDOW][1], train[-1][1]
    flat = before - end < UNDERFIT_FLAT_DROP * before
    if end - floor > UNDERFIT_TRAIN_LOSS and flat:
        return Finding(
            Diagnosis.underfitting,
            f"train_loss is still {end:.4g} (floor {floor:.3g}) and fell only {before - end:.3g} over the last "
            f"{WINDOW} epochs",
        )
    return None


def smoothing_floor(label_smoothing: float, classes: int = ASSUMED_CLASSES) -> float:
    """The lowest cross-entropy reachable against smoothed labels (the smoothed target's entropy)."""
    if label_smoothing <= 0:
        return 0.0
    right, wrong = 1 - label_smoothing + label_smoothing / classes, label_smoothing / classes
    return -(right * math.log(right) + (classes - 1) * wrong * math.log(wrong))


def _progress(curve: list[EpochPoint], watched: Watched) -> Finding | None:
    """Undertrained (still improving at the end) or plateau (flat over the last epochs), read from the campaign's
    metric in its direction (else val_acc); a fraction to maximise gains in its own units, anything else against its
    scale and noise (`_scale`)."""
    metric = watched.read_in(curve)
    if metric is None:
        return None
    series = [v for _, v in _series(curve, metric.name)]
    earlier, recent = metric.best(series[:-WINDOW]), metric.best(series[-WINDOW:])
    gain = earlier - recent if metric.lower_is_better else recent - earlier
    fraction = metric.is_fraction(series)
    undertrained, plateau = (UNDERTRAINED_DELTA, PLATEAU_DELTA) if fraction else (UNDERTRAINED_LOSS_DROP, PLATEAU_REL)
    scale, noise = (1.0, 0.0) if fraction else _scale(series, earlier, recent)
    name, window, f = metric.name, f"the last {WINDOW} epochs", ".4f" if fraction else ".4g"
    if gain / scale > undertrained and gain > noise:
        return Finding(
            Diagnosis.undertrained,
            f"{name} reached {recent:{f}} in {window}, {'down' if metric.lower_is_better else 'up'} {gain:{f}} on "
            f"the earlier best {earlier:{f}}",
        )
    loss = _series(curve, "val_loss")
    if len(loss) > WINDOW:
        before, end = loss[-1 - WINDOW][1], loss[-1][1]
        drop = before - end
        if (
            end <= min(v for _, v in loss)
            and drop > UNDERTRAINED_LOSS_DROP * before
            and drop > UNDERTRAINED_LOSS_DROP_ABS
        ):
            return Finding(
                Diagnosis.undertrained,
                f"val_loss is still falling at the last epoch ({before:.4g} -> {end:.4g} over {window})",
            )
    if gain / scale < plateau or gain <= noise:  # no gain beyond its own wobble is flat too
        return Finding(Diagnosis.plateau, f"{name} flat: best {recent:{f}} in {window} vs {earlier:{f}} before")
    return None


def _scale(series: list[float], earlier: float, recent: float) -> tuple[float, float]:
    """What a gain of a metric in other units than a fraction is measured against: its size, or the span of its run
    where that is larger (a reward near or across 0 has no size to be relative to: -0.02 levelling at 0.0015 is not
    "up 30%"); and its noise, the median epoch-to-epoch wobble around its trend (second differences: a steady trend
    has none), which a gain must clear (a reward flat at -0.001 +- 0.0001 setting a new best by 0.00005 is noise)."""
    scale = max(abs(earlier), abs(recent), max(series) - min(series))
    wobble = [abs(a - 2 * b + c) for a, b, c in zip(series, series[1:], series[2:], strict=False)]
    return max(scale, 1e-12), statistics.median(wobble) / 2


def _too_slow(curve: list[EpochPoint], knobs: dict[str, Any]) -> Finding | None:
    seconds = [v for _, v in _series(curve, "epoch_seconds")]
    if seconds and statistics.median(seconds) > TOO_SLOW_EPOCH_SECONDS:
        return Finding(
            Diagnosis.too_slow,
            f"median epoch takes {statistics.median(seconds):.1f} s (threshold {TOO_SLOW_EPOCH_SECONDS:g} s)",
        )
    return None


# -----------------------------------------------------------------------------
# Ranking


@dataclass(frozen=True)
class Candidate:
    """An applicable intervention scored against one diagnosis."""

    intervention: Intervention
    finding: Finding
    score: float
    note: str  # how the score came about (measured or prior, bonus)


def score(
    intervention: Intervention, diagnosis: Diagnosis, effects: list[InterventionEffect], exploration: float
) -> tuple[float, str]:
    """Measured gain per try (or the catalog prior while untried) plus the UCB bonus exploration*sqrt(log(N+1)/(n+1)),
    n counting this intervention's tries and N every try under the diagnosis.

    A try that trained but never got a score (every trial stopped at an ASHA rung, or crashed) counts as no gain, or
    as the measured mean where that is a loss: without it such a child left no trace, and an intervention that never
    survives a rung kept its prior and its full bonus (hard_example_replay: 5 children of a 30-min Fashion campaign,
    none scored).

    Unmeasured under this diagnosis but measured under others, the intervention is scored by its tries pooled over
    those: an intervention answering three diagnoses otherwise got its prior and full bonus three times over
    (hard_example_replay, bred 6 times at -0.009 in 5 cycles of airbench_style, 2026-11-27).
    """
    same = [e for e in effects if e.diagnosis == diagnosis.value]
    total = sum(e.count + e.unscored for e in same)
    mine = [e for e in same if e.intervention == intervention.name and e.count + e.unscored > 0]
    where = f"under {diagnosis.value}"
    if not mine:
        mine = [e for e in effects if e.intervention == intervention.name and e.count + e.unscored > 0]
        where = f"not under {diagnosis.value} but pooled over {', '.join(sorted({e.diagnosis for e in mine}))}"
    if not mine:
        bonus = exploration * math.sqrt(math.log(total + 1))
        return (
            intervention.prior + bonus,
            f"not measured yet: prior {intervention.prior:+.4f}, exploration bonus {bonus:.3g}",
        )
    count = sum(e.count for e in mine)
    unscored = sum(e.unscored for e in mine)
    # N never below the intervention's own tries, so a pooled n can't outweigh the diagnosis' total.
    bonus = exploration * math.sqrt(math.log(max(total, count + unscored) + 1) / (count + unscored + 1))
    mean = _weighted(mine, "mean_delta") or 0.0
    gain = (mean * count + min(0.0, mean) * unscored) / (count + unscored)
    notes = []
    if count:
        win_rate = _weighted(mine, "win_rate")
        win = f" (win rate {win_rate:.0%})" if win_rate is not None else ""
        notes.append(f"measured {mean:+.4f} over {count} children{win}")
    if unscored:
        notes.append(f"{unscored} more trained unscored (stopped at a rung or crashed), counted as no gain")
    return gain + bonus, f"{where}: {'; '.join(notes)}: {gain:+.4f} per try; exploration bonus {bonus:.3g}"


def _weighted(effects: list[InterventionEffect], field: str) -> float | None:
    """The mean of a per-child field over several effect rows, weighted by their scored children."""
    rows = [(getattr(e, field), e.count) for e in effects if e.count and getattr(e, field) is not None]
    return sum(v * n for v, n in rows) / sum(n for _, n in rows) if rows else None


def _best_candidate(
    intervention: Intervention, findings: list[Finding], effects: list[InterventionEffect], exploration: float
) -> Candidate | None:
    """The intervention scored against whichever of the parent's diagnoses it answers best."""
    best: Candidate | None = None
    for finding in findings:
        if finding.diagnosis not in intervention.answers:
            continue
        value, note = score(intervention, finding.diagnosis, effects, exploration)
        if best is None or value > best.score:
            best = Candidate(intervention, finding, value, note)
    return best


# The knob a trainer's harness.epochs() ignores under trial.budget_s (it trains until the time is spent): a move of
# this knob alone changes nothing there. A 900-s lm campaign with trial.budget_s=10 bred such children (2026-11-26).
EPOCHS = "EPOCHS"


def _moves_only_absent_knobs(intervention: Intervention, knobs: set[str]) -> bool:
    """A pure knob move (no code edit) of knobs the trainer does not have: not a candidate, and no reason worth
    recording in analysis.md or the not_applicable view."""
    return (
        bool(intervention.knobs)
        and not intervention.changes_code
        and not any(edit.knob in knobs for edit in intervention.knobs)
    )


def _ends_before_its_epochs(trials: list[TrialSummary], knobs: dict[str, Any]) -> str | None:
    """Why more EPOCHS would change nothing, or None: every trial of the parent that completed ended before its
    EPOCHS (the trainer's own early stopping, or the scheduler's max_t). User trial: `longer_training` was bred three
    times from a parent whose early stopping ended it at epochs 24-30 of 60; each child was its parent to the digit."""
    ran = [  # epochs reported, not the last one's number: `range(EPOCHS)` reports 0 .. EPOCHS - 1
        (len({p.epoch for p in t.curve}), t.knobs.get(EPOCHS, knobs.get(EPOCHS)))
        for t in trials
        if t.status is TrialStatus.completed and t.curve
    ]
    if not ran or not all(isinstance(epochs, int | float) and last < epochs for last, epochs in ran):
        return None
    last, epochs = max(ran)
    return (
        f"the parent's trials end before their {EPOCHS} by themselves (its longest ran {last} of {epochs:g}: early "
        "stopping or scheduler.max_t): more epochs change nothing"
    )


def _epochs_only(intervention: Intervention) -> bool:
    """Whether the intervention only moves EPOCHS (no code edit, no transform, no new knob)."""
    return (
        bool(intervention.knobs)
        and all(edit.knob == EPOCHS for edit in intervention.knobs)
        and not intervention.changes_code
    )


# -----------------------------------------------------------------------------
# The agents


class HeuristicAnalyst:
    """Diagnoses a parent's curves and ranks applicable catalog interventions by measured effect."""

    def __init__(
        self,
        seed: int = 0,
        exploration: float = AgentConfig.exploration,
        catalog: Catalog | None = None,
        timed: bool = False,
        gpu: bool | None = None,
        mirror_invariant: bool = True,
        images: bool | None = None,
        searched: Searched | None = None,
        metric: Watched | None = None,
    ) -> None:
        if exploration < 0:
            raise ValueError(f"exploration must be >= 0, got {exploration}")
        self.seed = seed
        self.exploration = exploration
        self.catalog = catalog if catalog is not None else load_catalog()
        self.timed = timed  # trial.budget_s is set: every trial trains for the same time, whatever its EPOCHS
        self.gpu = gpu  # whether trials get a GPU (resources.gpu > 0); None: not known, nothing skipped for it
        self.mirror_invariant = mirror_invariant  # task.mirror_invariant: False skips interventions that mirror inputs
        self.images = images  # task.images: False skips image interventions; None: not known, nothing skipped for it
        self.searched = searched or {}  # search.space: a knob move its trials would undo is not proposed
        self.metric = metric or Watched()  # search.metric and its mode: what "still improving" is read from
        self._said_unread = False  # the console is told once when no curve has the metric nor val_acc

    def analyse(self, parent: ParentView, effects: list[InterventionEffect], usage: Usage) -> Analysis:
        """Diagnose `parent` and rank recommendations; add what the call cost to `usage`."""
        start = time.perf_counter()
        try:
            source = _read_trainer(parent.files_dir)
            findings = diagnose(parent.trials, read_knobs(source), self.metric)
            self._say_if_unread(parent.trials)
            applicable, skipped = self._applicable(parent, source)
            ranked = self._rank(parent, findings, applicable, effects)
            summary = _summary(parent, findings, ranked, skipped, self.metric)
            return Analysis(parent.variant_id, [f.diagnosis for f in findings], summary, ranked)
        finally:
            usage.add(Usage(calls=1, seconds=time.perf_counter() - start))

    def _say_if_unread(self, trials: list[TrialSummary]) -> None:
        """Warn once per campaign when the best curve has neither the search metric nor val_acc: every parent would
        otherwise read "healthy" with no word that nothing was looked at (a trainer reporting only val_f1)."""
        best = best_trial(trials)
        if self._said_unread or best is None or self.metric.read_in(best.curve) is not None:
            return
        self._said_unread = True
        warnings.warn(
            f"the heuristic analyst {_unread(self.metric, best.curve)}; fix: report the campaign's metric each epoch "
            f"(harness.report(epoch=..., {self.metric.name}=...)) or set search.metric to a metric the trainer reports",
            AnalystWarning,
            stacklevel=2,
        )

    def _applicable(self, parent: ParentView, source: str) -> tuple[list[Intervention], dict[str, str]]:
        """Interventions that apply to the parent's code (train.py's `source`, and the module of its folder the model
        is imported from), suit the task and are neither spent along its lineage nor refused for this parent
        already."""
        applicable, skipped = [], {}
        refused = refusals(parent)
        files = _with_model_file(parent.files_dir, source)
        values = read_knobs(source)
        knobs = set(values)
        ends_early = _ends_before_its_epochs(parent.trials, values)
        for intervention in self.catalog:
            if _moves_only_absent_knobs(intervention, knobs):
                continue  # another kind of trainer's knob (a classifier has no TEMPERATURE): nothing to say about it
            why = self._unsuited(intervention, parent, refused)
            if why is None and ends_early and _epochs_only(intervention):
                why = ends_early
            if why is None:
                try:
                    check_files(intervention, files, self.searched)
                except NotApplicable as reason:
                    why = str(reason).removeprefix(f"{intervention.name}: ")
            if why is None:
                applicable.append(intervention)
            else:
                skipped[intervention.name] = why
        return applicable, skipped

    def _unsuited(self, intervention: Intervention, parent: ParentView, refused: dict[str, str]) -> str | None:
        """Why the intervention is not proposed for this parent whatever its code says, or None."""
        if intervention.name in parent.lineage and not intervention.repeatable:
            return "already in the lineage"
        if self.timed and _epochs_only(intervention):
            return f"trial.budget_s holds every trial to the same training time: {EPOCHS} is ignored"
        if intervention.needs_gpu and self.gpu is False:
            return "trials run on the CPU (resources.gpu=0): it only changes GPU steps"
        return intervention.unsuited_to(self.images, self.mirror_invariant) or refused.get(intervention.name)

    def _rank(
        self,
        parent: ParentView,
        findings: list[Finding],
        applicable: list[Intervention],
        effects: list[InterventionEffect],
    ) -> list[Recommendation]:
        """Candidates for the diagnoses first, then (if too few) healthy-run and any other applicable ones; last, those
        already bred from this parent in this run (its children's code would differ in knob values at most)."""
        # Ties go to a draw seeded by (seed, parent): repeatable runs, but sibling parents differ.
        rng = random.Random(f"{self.seed}:{parent.variant_id}")
        draws = {i.name: rng.random() for i in sorted(applicable, key=lambda i: i.name)}
        bred = bred_from(parent)
        primary = self._scored(applicable, findings, effects, draws)
        chosen = {c.intervention.name for c in primary}
        fallback: list[Candidate] = []
        if sum(c.intervention.name not in bred for c in primary) < MIN_RECOMMENDATIONS:
            healthy = Finding(Diagnosis.healthy, "few interventions answer the diagnoses; this one generally helps")
            rest = [i for i in applicable if i.name not in chosen]
            answers_healthy = [i for i in rest if Diagnosis.healthy in i.answers]
            others = [i for i in rest if Diagnosis.healthy not in i.answers]
            fallback = self._scored(answers_healthy, [healthy], effects, draws)
            fallback += self._scored_as(others, healthy, effects, draws)
        fresh = [c for c in primary + fallback if c.intervention.name not in bred]
        again = [
            dataclasses.replace(
                c, note=f"{c.note}; already bred from this parent (child {bred[c.intervention.name]}): last resort"
            )
            for c in primary + fallback
            if c.intervention.name in bred
        ]
        return _monotone([_recommendation(c) for c in fresh + again])

    def _scored(
        self,
        interventions: list[Intervention],
        findings: list[Finding],
        effects: list[InterventionEffect],
        draws: dict[str, float],
    ) -> list[Candidate]:
        found = [c for i in interventions if (c := _best_candidate(i, findings, effects, self.exploration)) is not None]
        return sorted(found, key=lambda c: (-c.score, draws[c.intervention.name]))

    def _scored_as(
        self,
        interventions: list[Intervention],
        finding: Finding,
        effects: list[InterventionEffect],
        draws: dict[str, float],
    ) -> list[Candidate]:
        """Score interventions under `finding` even though they do not list it (last-resort fallback)."""
        found = []
        for intervention in interventions:
            value, note = score(intervention, finding.diagnosis, effects, self.exploration)
            found.append(Candidate(intervention, finding, value, note))
        return sorted(found, key=lambda c: (-c.score, draws[c.intervention.name]))


class HeuristicCoder:
    """Applies a catalog intervention to the child's copy of `train.py` (or of its model's module); it cannot repair
    rejected code."""

    def __init__(self, catalog: Catalog | None = None, searched: Searched | None = None) -> None:
        self.catalog = catalog if catalog is not None else load_catalog()
        self.searched = searched or {}  # search.space: knob moves stay where its trials can train them

    def write(
        self, parent: ParentView, recommendation: Recommendation, workdir: Path, feedback: str | None, usage: Usage
    ) -> Draft:
        """Edit `workdir/train.py` (or the module its model is imported from) in place with the recommendation."""
        start = time.perf_counter()
        call = Usage(calls=1)
        try:
            intervention = self._edit(recommendation, Path(workdir), feedback)
        finally:
            call.seconds = time.perf_counter() - start  # counted on failure too: the attempt happened
            usage.add(call)
        rationale = (
            f"{intervention.name} ({recommendation.diagnosis.value}): {intervention.description} "
            f"{recommendation.rationale}"
        )
        return Draft(files_dir=workdir, interventions=[intervention.name], rationale=rationale, usage=call)

    def _edit(self, recommendation: Recommendation, workdir: Path, feedback: str | None) -> Intervention:
        name = recommendation.intervention
        if feedback is not None:
            raise AgentError(
                f"the heuristic coder cannot repair {name!r} after the validation gate rejected it "
                f"(catalog edits are fixed; the engine should move on); {GATE_SAID}{feedback.strip()[:500]}"
            )
        try:
            intervention = self.catalog.get(name)
        except KeyError as error:
            raise AgentError(error.args[0]) from None
        files = _with_model_file(workdir, _read_trainer(workdir))
        try:
            edited = apply_files(intervention, files, self.searched)
        except NotApplicable as reason:
            raise CannotApply(f"cannot apply {name} to {workdir / TRAINER}: {reason}") from None
        for path, source in edited.items():
            (workdir / path).write_text(source)
        return intervention


# -----------------------------------------------------------------------------
# Text


def _read_trainer(files_dir: Path) -> str:
    path = Path(files_dir) / TRAINER
    if not path.is_file():
        raise AgentError(f"{path} does not exist: the heuristic agent edits a variant's {TRAINER}")
    return path.read_text()


def _with_model_file(files_dir: Path, source: str) -> dict[str, str]:
    """train.py's `source` by its name, and the module of the variant's folder its model is imported from
    (`models.py`; `src/pkg/models.py` where train.py puts `src` on sys.path), where that file is there: what the
    catalog's layer transforms edit."""
    files = {TRAINER: source}
    found = model_file(source, Path(files_dir))
    if found is not None and (Path(files_dir) / found[0]).is_file():
        files[found[0]] = (Path(files_dir) / found[0]).read_text()
    return files


def _monotone(ranked: list[Recommendation]) -> list[Recommendation]:
    """Cap each priority at the one before it, so sorting by priority keeps the ranking (fallbacks last)."""
    out: list[Recommendation] = []
    for rec in ranked:
        if out and rec.priority > out[-1].priority:
            rec = dataclasses.replace(rec, priority=out[-1].priority)
        out.append(rec)
    return out


def _recommendation(candidate: Candidate) -> Recommendation:
    finding = candidate.finding
    rationale = f"Answers {finding.diagnosis.value} ({finding.evidence}); {candidate.note}."
    return Recommendation(
        intervention=candidate.intervention.name,
        diagnosis=finding.diagnosis,
        rationale=rationale,
        priority=round(candidate.score, 6),
        details=candidate.intervention.description,
    )


def _summary(
    parent: ParentView,
    findings: list[Finding],
    ranked: list[Recommendation],
    skipped: dict[str, str],
    metric: Watched | None = None,
) -> str:
    """The analysis as markdown: the evidence, the diagnoses, the ranking, what was skipped and why."""
    # The score is in analysis.md's heading above this, as the metric's value: the view's is stored oriented (a min
    # metric's -value, which the note showed beside the heading's positive MSE).
    unscored = " (unscored)" if parent.selection_score is None else ""
    lines = [f"### Parent `{parent.variant_id}`{unscored}", ""]
    lines += _curve_lines(parent.trials, metric or Watched())
    lines += ["", "**Diagnoses**", ""]
    lines += [f"- **{f.diagnosis.value}**: {f.evidence}" for f in findings]
    lines += ["", "**Recommendations**", ""]
    lines += [
        f"{n}. `{r.intervention}` ({r.diagnosis.value}, priority {r.priority:.4g})" for n, r in enumerate(ranked, 1)
    ]
    if not ranked:
        lines.append("none: no catalog intervention applies to this trainer")
    if skipped:
        lines += ["", "**Skipped**", ""]
        lines += [f"- `{name}`: {why}" for name, why in skipped.items()]
    return "\n".join(lines) + "\n"


def _curve_lines(trials: list[TrialSummary], metric: Watched) -> list[str]:
    best = best_trial(trials)
    statuses = ", ".join(f"{sum(t.status is s for t in trials)} {s.value}" for s in sorted({t.status for t in trials}))
    lines = [f"Trials: {len(trials)} ({statuses or 'none'})."]
    if best is None:
        return lines + ["No trial reported a curve."]
    last = best.curve[-1]
    read = metric.read_in(best.curve)
    peak = ""
    if read is not None:
        series = _series(best.curve, read.name)
        epoch, value = read.best(series, key=lambda ev: ev[1])
        f = ".4f" if read.is_fraction([v for _, v in series]) else ".4g"  # as the readings print it
        peak = f"; best {read.name} {value:{f}} at epoch {epoch}"
    shown = ("train_loss", "val_loss", "val_acc", "grad_norm", "epoch_seconds")
    if metric.name not in shown:  # the campaign's own metric beside the standard ones (val_f1)
        shown = (*shown[:3], metric.name, *shown[3:])
    lines.append(
        f"Best trial `{best.trial_id}` ({best.status.value}, {len(best.curve)} epochs): final "
        + ", ".join(f"{m} {_fmt(_value(last, m))}" for m in shown)
        + "".join(f", {m} {_fmt(_value(last, m))}" for m in PROBES if _value(last, m) is not None)
        + peak
        + "."
    )
    failed = [t for t in trials if t.status is TrialStatus.failed]
    if failed:
        lines.append(f"Failed: {len(failed)} (first: {failed[0].reason or 'no reason recorded'}).")
    return lines


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4g}"
