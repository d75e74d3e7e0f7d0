"""Population based training inside a cycle: Ray Tune's `PopulationBasedTraining`, and what the KB keeps of it.

Every `scheduler.perturbation_interval` epochs the bottom `quantile_fraction` of a cycle's trials copy the
checkpoint and the whole config of a top trial (its code variant included: the variant is part of a trial's
config) and perturb the knobs in `scheduler.mutate`. A trial then trains in segments: from an epoch, with one
variant and one set of knobs, from its own weights or from a donor's. `SegmentLog` records them, driver-side:
the scheduler says who exploited whom, the ledger says from which epoch the trial trained again.

Only trainers that resume from a checkpoint can take part (`ralph_ray.resumable` names what a trainer lacks).
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

from ray.tune.experiment import Trial
from ray.tune.schedulers import PopulationBasedTraining, TrialScheduler
from ray.tune.schedulers.pb2 import PB2
from ray.tune.search.sample import Categorical, Float

from ralph_ray.scoring import PREDICTIONS_KEY
from ralph_ray.trials import FAILED_KEY, STOPPED_KEY

# Results that end a trial (predictions, a failure, a budget stop): PBT must not pause or clone into them.
_FINAL_KEYS = (PREDICTIONS_KEY, FAILED_KEY, STOPPED_KEY)


def mutations(space: dict[str, Any], mutate: list[str] | None) -> dict[str, Any]:
    """PBT's hyperparam_mutations from a cycle's Tune search space: domains stay domains, choices become lists.

    A list is perturbed to a neighbouring value, a numeric domain multiplied by 0.8 or 1.2 (or resampled).
    `mutate` limits which knobs move (None: every knob of the space); the variant never mutates, it is copied.
    """
    names = [name for name in space if name != "variant" and (mutate is None or name in mutate)]
    return {name: _choices(space[name]) if isinstance(space[name], Categorical) else space[name] for name in names}


def _choices(domain: Categorical) -> list[Any]:
    """A choice's values in order (numbers ascending), so a shift left or right is a step down or up."""
    values = list(domain.categories)
    numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
    return sorted(values) if numeric else values


@dataclass
class Segment:
    """Epochs a trial trained with one variant and one config, from its own weights or a donor's."""

    from_epoch: int
    to_epoch: int
    config: dict[str, Any]
    donor_trial_id: str | None = None  # None: its own weights (or scratch, for the first segment)
    donor_epoch: int | None = None  # the donor's epoch whose checkpoint it started from


@dataclass
class _Exploit:
    donor: str
    donor_epoch: int
    # Tune hands a result to the scheduler before the callbacks: when that very result made this trial exploit,
    # the ledger still sees it afterwards, and it belongs to the segment before the exploit.
    before: int | None = None


@dataclass
class SegmentLog:
    """Each trial's segments, built on the driver from PBT's exploit steps and the epochs trials report."""

    segments: dict[str, list[Segment]] = field(default_factory=dict)
    exploits: int = 0
    _pending: dict[str, _Exploit] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __getstate__(self) -> dict[str, Any]:
        # Tune pickles its scheduler with the run's state; the live log stays in this driver process.
        return {"segments": {}, "exploits": 0, "_pending": {}}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, _lock=threading.Lock())

    def exploited(self, trial_id: str, donor: str, donor_epoch: int, before: int | None = None) -> None:
        """PBT cloned `donor` (its checkpoint of `donor_epoch`) into `trial_id`; its next report opens a segment
        (but a report of epoch `before`, the result that triggered the exploit, still closes the old one)."""
        with self._lock:
            self._pending[trial_id] = _Exploit(donor, donor_epoch, before)
            self.exploits += 1

    def observe(self, trial_id: str, epoch: int, config: dict[str, Any]) -> None:
        """A report of `epoch` by `trial_id`, running `config`."""
        with self._lock:
            segments = self.segments.setdefault(trial_id, [])
            pending = self._pending.get(trial_id)
            if pending is not None and pending.before == epoch:  # the old segment's last report, seen late
                if segments and segments[-1].to_epoch == epoch - 1:
                    segments[-1].to_epoch = epoch
                pending.before = None
                return
            self._pending.pop(trial_id, None)
            # A restart (exploit, pause, retry) trains again from a checkpoint: epochs from here on are replaced.
            while segments and segments[-1].from_epoch >= epoch:
                segments.pop()
            if segments:
                segments[-1].to_epoch = min(segments[-1].to_epoch, epoch - 1)
            if pending is not None:
                segments.append(Segment(epoch, epoch, dict(config), pending.donor, pending.donor_epoch))
            elif segments and segments[-1].config == config and segments[-1].to_epoch == epoch - 1:
                segments[-1].to_epoch = epoch
            else:
                segments.append(Segment(epoch, epoch, dict(config)))

    def rows(
        self, run_id: str, cycle: int, trial_id: str, knobs: Callable[[dict[str, Any]], dict[str, Any]]
    ) -> list[dict[str, Any]]:
        """The KB rows of a trial's segments; `knobs` turns a config into the knob values the trial ran."""
        with self._lock:
            segments = list(self.segments.get(trial_id, []))
        return [
            {
                "run_id": run_id,
                "cycle": cycle,
                "trial_id": trial_id,
                "segment": index,
                "from_epoch": s.from_epoch,
                "to_epoch": s.to_epoch,
                "variant_id": str(s.config.get("variant")),
                "knobs": json.dumps(knobs(s.config), sort_keys=True, default=str),
                "donor_trial_id": s.donor_trial_id,
                "donor_epoch": s.donor_epoch,
            }
            for index, s in enumerate(segments, start=1)
        ]


def bounds(space: dict[str, Any], mutate: list[str] | None) -> dict[str, list[float]]:
    """PB2's hyperparam_bounds: each real-valued knob's [low, high] (the config refused pb2 over other knobs)."""
    names = [name for name in space if name != "variant" and (mutate is None or name in mutate)]
    return {name: [space[name].lower, space[name].upper] for name in names if isinstance(space[name], Float)}


class _Recording(PopulationBasedTraining):
    """Tune's PBT (or PB2) that tells a `SegmentLog` of each exploit and leaves a trial's final report alone.

    The final report carries the predictions: pausing or cloning into a trial there would restart a trainer that
    has nothing left to train.
    """

    def __init__(self, log: SegmentLog, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.log = log

    def on_trial_result(self, tune_controller: Any, trial: Trial, result: dict[str, Any]) -> str:
        if any(key in result for key in _FINAL_KEYS):
            return TrialScheduler.CONTINUE
        self._current = (trial.trial_id, result.get("epoch"))
        try:
            return super().on_trial_result(tune_controller, trial, result)
        finally:
            self._current = None

    def _exploit(self, tune_controller: Any, trial: Trial, trial_to_clone: Trial) -> None:
        donor_epoch = int(self._trial_state[trial_to_clone].last_train_time)
        super()._exploit(tune_controller, trial, trial_to_clone)
        current = getattr(self, "_current", None)
        before = int(current[1]) if current and current[0] == trial.trial_id and current[1] is not None else None
        self.log.exploited(trial.trial_id, trial_to_clone.trial_id, donor_epoch, before)
        drop_stale_decision(tune_controller, trial)


def drop_stale_decision(tune_controller: Any, trial: Trial) -> None:
    """Forget what Tune cached for a trial that an exploit just paused: its actor, and the save it waited for, are gone.

    Ray Tune (2.60) bug, ray-project/ray#57906 (fix proposed in PR #61448): synchronous PBT exploits a trial whose own
    pause is still saving; Tune's stop then caches a STOP "for after the save", but drops the save. The stale STOP
    outlives the pause and ends the restarted trial at its first checkpoint, before its last epoch and predictions
    (3 of 12 two-cycle campaigns of tests/test_pbt.py lost a trial so, `stopped_early` at epoch 3; none of 28 since).
    """
    controller = getattr(tune_controller, "_tune_controller", tune_controller)  # schedulers get a wrapper
    decisions = getattr(controller, "_cached_trial_decisions", None)
    if isinstance(decisions, dict) and trial.status == Trial.PAUSED:
        decisions.pop(trial.trial_id, None)


class RecordingPBT(_Recording):
    """Tune's PBT, recording its segments."""


class RecordingPB2(_Recording, PB2):
    """Tune's PB2 (a Gaussian-process bandit picks the explored knobs), recording its segments."""


def scheduler(
    log: SegmentLog,
    space: dict[str, Any],
    perturbation_interval: int,
    quantile_fraction: float,
    resample_probability: float,
    mutate: list[str] | None,
    synch: bool,
    bandit: bool = False,
) -> PopulationBasedTraining:
    """PBT over epochs (the harness's report key), perturbing the knobs of `space` named in `mutate`; `bandit`: PB2."""
    # Both: epochs are the clock, the KB's segments table is the record (not Tune's config log).
    common = dict(
        time_attr="epoch",
        perturbation_interval=perturbation_interval,
        quantile_fraction=quantile_fraction,
        log_config=False,
        synch=synch,
    )
    if bandit:
        return RecordingPB2(log, hyperparam_bounds=bounds(space, mutate), **common)
    return RecordingPBT(
        log, hyperparam_mutations=mutations(space, mutate), resample_probability=resample_probability, **common
    )
