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
report until the predictions are in, so the trial completes and is scored either way). Tune places a rung at
grace_period x reduction_factor^k wherever that is below its max_t, the last epoch + 1 (grace 4, reduction 3: 4, 12).
"""

from __future__ import annotations

import math
import sys
from typing import Any

import numpy as np
from ray.tune.schedulers import ASHAScheduler
from ray.tune.schedulers.async_hyperband import _Bracket

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

    def cutoff(self, recorded: dict[str, float]) -> Any:
        cut = super().cutoff(recorded)
        return None if cut is None else cut - self.owner.margin_at(float(cut))


class NoiseAwareASHA(ASHAScheduler):
    """ASHAScheduler whose rung cutoffs are lowered by a noise margin: a fixed one (`margin`), or, with
    margin=None, `z` standard errors of an accuracy over the split size its reported values reveal."""

    def __init__(self, *, margin: float | None, z: float, last: float | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.fixed_margin, self.z = margin, z
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

    def rungs(self) -> list[float]:
        """The milestones at which trials can be stopped, in order."""
        return sorted(float(milestone) for bracket in self._brackets for milestone, _ in bracket._rungs)

    def margin_at(self, cutoff: float) -> float:
        """The margin below `cutoff` a trial may fall before it stops (oriented: cutoff is -value for mode=min)."""
        if self.fixed_margin is not None:
            return self.fixed_margin
        examples = self.examples
        return 0.0 if examples is None else binomial_margin(cutoff, examples, self.z)

    def observe(self, value: float) -> None:
        """Narrow the split size by one reported value; say once what the margin is when the size becomes known."""
        known = self.examples
        self._split.observe(value)
        if self.examples is None or self.examples == known:
            return
        # A size read off few values can be a factor of the true one (k/68 with every k even reads as 34; a user
        # trial's console said 34): a value that rules it out grows it, and the console says so again.
        grown = "" if known is None else f" (not {known}: {value:.6g} is no multiple of 1/{known})"
        print(
            f"ASHA: {self._metric} reads as an accuracy over {self.examples} examples{grown}: a trial stops at a rung "
            f"only below its cutoff by more than {self.z:g} standard errors "
            f"({binomial_margin(0.9, self.examples, self.z):.3f} at 0.9; scheduler.margin)",
            file=sys.stderr,
        )

    def on_trial_result(self, tune_controller: Any, trial: Any, result: dict[str, Any]) -> str:
        value = result.get(self._metric) if self._metric else None
        if self.fixed_margin is None and isinstance(value, (int, float)) and math.isfinite(value):
            self.observe(float(value))
        return super().on_trial_result(tune_controller, trial, result)
