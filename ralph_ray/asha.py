"""Ray Tune's ASHAScheduler with a noise margin at its rungs (`scheduler.margin`). A thin adapter: Tune's own
brackets, rungs and bookkeeping; only the cutoff a trial must reach is lowered by the margin.

Plain ASHA stops a trial at a rung when its metric is below the top 1/reduction_factor of the trials recorded there
so far, however small the gap. On a small validation split that gap is often noise: digits' trainer validates on
161 images (one image is 0.0062 of accuracy), and the config that is best after 12 epochs was stopped at epoch 2
(bench/asha.py). With a margin, a trial stops only when it is below the cutoff by more than `margin`:

    stop at a rung  <=>  metric < cutoff - margin

`scheduler.margin=auto` (the default) reads the margin off the metric's own sampling noise: an accuracy measured
on n examples is a multiple of 1/n, so n is the smallest count that every value reported so far fits (accuracies
reported as float32 included), and the margin is `scheduler.margin_z` standard errors of a proportion at the
cutoff, z * sqrt(p (1 - p) / n) (p held at least 1/n from 0 and 1). Digits' 161 images at p = 0.95 and z = 2:
0.034. Where the values fit no such n (a loss, a score that is no proportion), or too few distinct values were
reported yet, the margin is 0: plain ASHA, as before. A number sets the margin by hand (0: plain ASHA).

Rungs at or past the trainer's last epoch are dropped: a stop there saves no epoch (the engine holds that epoch's
report until the predictions are in, so the trial completes and is scored either way; a trial whose own EPOCHS is
below max_t has its last epoch held the same: trials.hold_from). Each stop's reason (rung, value, cutoff, margin)
goes to `stops`, which the ledger records as the trial's reason. Tune places a rung at
grace_period x reduction_factor^k wherever that is below its max_t, the last epoch + 1 (grace 4, reduction 3: 4, 12).
"""

from __future__ import annotations

import math
import sys
from typing import TYPE_CHECKING, Any

import numpy as np
from ray.tune.schedulers import ASHAScheduler
from ray.tune.schedulers.async_hyperband import _Bracket

from ralph_ray import sql
from ralph_ray.config import Config, SchedulerKind, SpaceKind
from ralph_ray.knobs import KnobError, epochs_knob, read_knobs
from ralph_ray.statuses import STOPPED_WITH_CYCLE

if TYPE_CHECKING:
    import duckdb

MAX_EXAMPLES = 10_000  # the largest split a margin is inferred for (beyond it the noise is below 0.01 anyway)
MIN_DISTINCT = 3  # distinct values in (0, 1) needed before a split size is trusted
RELATIVE_TOLERANCE = 1e-6  # how far v * n may sit from an integer (float32 rounding is 6e-8 of v)


def fitting(value: float, counts: np.ndarray) -> np.ndarray:
    """Those of `counts` (example counts n) for which `value` is a multiple of 1/n."""
    scaled = value * counts
    return counts[np.abs(scaled - np.round(scaled)) <= RELATIVE_TOLERANCE * counts + 1e-9]


ALL_COUNTS = np.arange(1, MAX_EXAMPLES + 1, dtype=np.float64)


class SplitSize:
    """The split size n an accuracy's values reveal: the smallest n such that every value seen is a multiple of 1/n.
    Fed one value at a time (the scheduler narrows it as reports arrive); None while fewer than MIN_DISTINCT
    distinct values strictly between 0 and 1 are seen, once a value outside [0, 1] is (no proportion), or when no
    n up to MAX_EXAMPLES fits."""

    def __init__(self) -> None:
        self._counts, self._distinct, self._seen = ALL_COUNTS, 0, set[float]()

    @property
    def examples(self) -> int | None:
        return int(self._counts[0]) if self._distinct >= MIN_DISTINCT and len(self._counts) else None

    def observe(self, value: float) -> None:
        """Narrow the sizes the values fit (a value outside [0, 1] rules every size out)."""
        if not len(self._counts) or value in self._seen:
            return
        self._seen.add(value)
        if not 0.0 <= value <= 1.0:
            self._counts = ALL_COUNTS[:0]
        elif 0.0 < value < 1.0:
            self._counts = fitting(value, self._counts)
            self._distinct += 1


def examples_behind(values: list[float] | set[float]) -> int | None:
    """The split size a batch of values reveals (SplitSize, fed them all)."""
    size = SplitSize()
    for value in values:
        size.observe(float(value))
    return size.examples


def binomial_margin(cutoff: float, examples: int, z: float) -> float:
    """z standard errors of a proportion near `cutoff` measured on `examples` examples."""
    p = min(max(abs(cutoff), 1.0 / examples), 1.0 - 1.0 / examples)
    return z * math.sqrt(p * (1.0 - p) / examples)


class _MarginBracket(_Bracket):
    """Tune's bracket; its cutoff lowered by the scheduler's current margin."""

    owner: NoiseAwareASHA
    last_cut: tuple[float, float, int] = (0.0, 0.0, 0)  # the last cutoff computed: (cutoff, margin, trials recorded)

    def cutoff(self, recorded: dict[str, float]) -> Any:
        cut = super().cutoff(recorded)
        if cut is None:
            return None
        margin = self.owner.margin_at(float(cut))
        self.last_cut = (float(cut), margin, len(recorded))  # what a stop's reason names (on_result)
        return cut - margin

    def on_result(self, trial: Any, cur_iter: int, cur_rew: float | None) -> str:
        action = super().on_result(trial, cur_iter, cur_rew)
        if action == "STOP" and cur_rew is not None:
            # The rung the result was just recorded at: the highest milestone it reached (rungs run descending).
            # Tune's bracket records every result it stops on; were a later Tune to stop one it did not record,
            # the stop goes unexplained rather than raising StopIteration inside Tune's scheduler loop.
            rungs = (m for m, recorded in self._rungs if cur_iter >= m and trial.trial_id in recorded)
            if (milestone := next(rungs, None)) is not None:
                self.owner.note_stop(trial.trial_id, milestone, cur_iter, cur_rew, *self.last_cut)
        return action


def rung_history(
    con: duckdb.DuckDBPyConnection, run_id: str, metric: str, time_attr: str, cycle: int | None = None
) -> list[tuple[str, list[tuple[float, float]]]]:
    """Each earlier trial's (time, metric) reports as ASHA saw them (of `cycle`'s trials only, where given): every
    epoch, but a replicate's last only (ASHA never judged a replicate; Tune recorded only its final result, at
    on_trial_complete). What `NoiseAwareASHA.replay` takes."""
    reports: dict[str, dict[int, dict[str, float]]] = {}
    replicate: dict[str, bool] = {}
    for trial_id, is_replicate, epoch, name, value in con.execute(
        sql.RUNG_HISTORY, [run_id, STOPPED_WITH_CYCLE, cycle, metric, time_attr]
    ).fetchall():
        reports.setdefault(trial_id, {}).setdefault(int(epoch), {})[name] = value
        replicate[trial_id] = bool(is_replicate)
    history: list[tuple[str, list[tuple[float, float]]]] = []
    for trial_id, epochs in reports.items():
        points = [
            (float(epoch) if time_attr == "epoch" else float(row[time_attr]), float(row[metric]))
            for epoch, row in sorted(epochs.items())
            if row.get(metric) is not None and (time_attr == "epoch" or row.get(time_attr) is not None)
        ]
        if points:
            history.append((trial_id, points[-1:] if replicate[trial_id] else points))
    return history


class _Replayed:
    """What Tune's bracket reads of a trial an earlier Tune run of the campaign reported (NoiseAwareASHA.replay)."""

    def __init__(self, trial_id: str) -> None:
        self.trial_id = trial_id


class NoiseAwareASHA(ASHAScheduler):
    """ASHAScheduler whose rung cutoffs are lowered by a noise margin: a fixed one (`margin`), or, with
    margin=None, `z` standard errors of an accuracy over the split size its reported values reveal."""

    def __init__(
        self,
        *,
        margin: float | None,
        z: float,
        last: float | None = None,
        stops: dict[str, str] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.fixed_margin, self.z = margin, z
        # trial id -> why ASHA stopped it (the ledger records it as the trial's reason; the KB had NULL for ASHA)
        self.stops: dict[str, str] = {} if stops is None else stops
        self._split = SplitSize()  # margin=None: the split size the values reported so far reveal
        for bracket in self._brackets:
            bracket.__class__ = _MarginBracket
            bracket.owner = self  # type: ignore[attr-defined]
            if last is not None:
                bracket._rungs = [(milestone, recorded) for milestone, recorded in bracket._rungs if milestone < last]

    @property
    def examples(self) -> int | None:
        """The split size the reported values reveal (SplitSize), None while unknown or when none fits."""
        return self._split.examples

    @property
    def time_attr(self) -> str:
        """The result key the rungs count (epoch, or training seconds under trial.budget_s)."""
        return self._time_attr

    def replay(self, history: list[tuple[str, list[tuple[float, float]]]], metric: str, mode: str) -> int:
        """Record what earlier trials reported, each (trial id, [(time, value), ...]) in report order, at the rungs
        Tune's bracket would have recorded them; returns how many trials were replayed.

        A resumed campaign starts a new Tune run, whose scheduler starts with empty rungs: its first trial was cut
        against one trial's result instead of the run's (a user's kill -9 and resume). Tune keeps no scheduler
        state across a driver's death (`save`/`restore` pickle a live one), so the KB's epochs are replayed through
        Tune's own `_Bracket.on_result`: no stop is decided or noted, only the records and the split size.
        `metric` and `mode` are the search's (Tune sets the scheduler's own later, when the run starts)."""
        sign = 1.0 if mode == "max" else -1.0
        bracket = self._brackets[0]  # search.scheduler builds one bracket (Tune's default)
        for trial_id, reports in history:
            trial = _Replayed(trial_id)
            for at, value in reports:
                if self.fixed_margin is None and math.isfinite(value):
                    self.observe(value, metric)  # as on_trial_result: a resumed run's margin is the one it had
                _Bracket.on_result(bracket, trial, at, sign * value)  # the base's: records, notes no stop
        return len(history)

    def rungs(self) -> list[float]:
        """The milestones at which trials can be stopped, in order."""
        return sorted(float(milestone) for bracket in self._brackets for milestone, _ in bracket._rungs)

    def recorded(self) -> dict[float, dict[str, float]]:
        """Each rung's records: trial id -> the value recorded there (oriented: -value for mode=min)."""
        return {float(milestone): dict(there) for bracket in self._brackets for milestone, there in bracket._rungs}

    def margin_at(self, cutoff: float) -> float:
        """The margin below `cutoff` a trial may fall before it stops (oriented: cutoff is -value for mode=min)."""
        if self.fixed_margin is not None:
            return self.fixed_margin
        examples = self.examples
        return 0.0 if examples is None else binomial_margin(cutoff, examples, self.z)

    def observe(self, value: float, metric: str | None = None) -> None:
        """Narrow the split size by one reported value of `metric` (default: the scheduler's); say once what the
        margin is when the size becomes known."""
        known = self.examples
        self._split.observe(value)
        if self.examples is None or self.examples == known:
            return
        # A size read off few values can be a factor of the true one (k/68 with every k even reads as 34; a user
        # trial's console said 34): a value that rules it out grows it, and the console says so again.
        grown = "" if known is None else f" (not {known}: {value:.6g} is no multiple of 1/{known})"
        print(
            f"ASHA: {metric or self._metric} reads as an accuracy over {self.examples} examples{grown}: a trial stops "
            f"at a rung only below its cutoff by more than {self.z:g} standard errors "
            f"({binomial_margin(0.9, self.examples, self.z):.3f} at 0.9; scheduler.margin)",
            file=sys.stderr,
        )

    def note_stop(
        self, trial_id: str, milestone: float, at: float, oriented: float, cut: float, margin: float, there: int
    ) -> None:
        """Why a trial stops at a rung, in the metric's own direction (values are oriented: -value for mode=min)."""
        sign = float(self._metric_op)
        unit = "epoch " if self._time_attr == "epoch" else f"{self._time_attr}="
        less = f" less a margin of {margin:.4g} (scheduler.margin)" if margin else ""
        self.stops[trial_id] = (
            f"ASHA: {self._metric} {sign * oriented:.4g} at {unit}{at:g} is {'below' if sign > 0 else 'above'} the "
            f"cutoff {sign * (cut - margin):.4g} of the rung at {unit}{milestone:g} (the top "
            f"1/{self._reduction_factor:g} of the {there} trial(s) recorded there{less})"
        )

    def on_trial_result(self, tune_controller: Any, trial: Any, result: dict[str, Any]) -> str:
        value = result.get(self._metric) if self._metric else None
        if self.fixed_margin is None and isinstance(value, (int, float)) and math.isfinite(value):
            self.observe(float(value))
        return super().on_trial_result(tune_controller, trial, result)


def most_epochs(cfg: Config) -> tuple[str, int] | None:
    """The seed trainer's epochs knob and the most epochs a search trial of it can train: its space's high (or
    largest choice) where it is searched, else its literal; None where the trainer has no integer EPOCHS knob."""
    try:
        knobs = read_knobs(cfg.seed_entry().read_text())
    except (OSError, SyntaxError, ValueError, KnobError):
        return None  # the config checks and the gate say what is wrong with the trainer
    name = epochs_knob(knobs, cfg.search.space)
    if name is None:
        return None
    if (space := cfg.search.space.get(name)) is None:
        return name, knobs[name]
    ends = [*(space.values or [])] if space.type is SpaceKind.choice else [space.high]
    whole = [int(v) for v in ends if isinstance(v, (int, float)) and not isinstance(v, bool)]
    return (name, max(whole)) if whole else None


def epochs_past_max_t(cfg: Config) -> str | None:
    """A warning when trials can train past scheduler.max_t (the epochs ASHA's rungs and the forecaster count);
    else None. max_t does not cap training as in Ray Tune: a user's max_t=3 over EPOCHS=6 trained 6 epochs, and an
    EPOCHS range up to 12 under max_t=6 trained 9, with no rung past max_t."""
    sched = cfg.scheduler
    if cfg.trial.budget_s is not None or not (sched.name is SchedulerKind.asha or sched.forecast):
        return None  # under a budget the rungs count seconds, as shares of max_t
    found = most_epochs(cfg)
    if found is None or found[1] <= sched.max_t:
        return None
    name, epochs = found
    return (
        f"scheduler.max_t={sched.max_t} is below the {epochs} epochs a trial can train ({name}): max_t places the "
        f"rungs and the forecaster's last epoch but does not cap training, so trials train all their {name} with no "
        f"early stop past epoch {sched.max_t}; set scheduler.max_t={epochs} (or lower {name})"
    )
