"""Trial outcomes as the driver sees them: a Tune callback that turns each finished trial into KB rows.

It runs on the driver, so it works the same on one machine and on a cluster. It also does the frozen
scoring: a finished trial sends its predictions back, and the ledger scores them against labels that never
leave the driver. Rows are handed to a sink as soon as a trial ends, so a crash mid-cycle loses no finished trial.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from ray.tune import Callback
from ray.tune.experiment import Trial
from ray.tune.result import AUTO_RESULT_KEYS, DONE, NODE_IP, TRIAL_ID

from ralph_ray.knobs import Bounds, resolve_knobs
from ralph_ray.pbt import SegmentLog
from ralph_ray.peakmemory import GPU_KEY, RSS_KEY
from ralph_ray.scoring import PREDICTIONS_KEY, ScoringError, score_encoded
from ralph_ray.statuses import STOPPED_WITH_CYCLE as STOPPED_WITH_CYCLE  # Ray-free home; imported from here too
from ralph_ray.statuses import TrialStatus
from ralph_ray.tasks.base import Labels
from ralph_ray.trials import (
    FAILED_KEY,
    FINAL_ADDED_KEY,
    FINAL_BUDGET_KEY,
    FINAL_KEY,
    HELD_KEY,
    REPLICATE_KEY,
    SEED_KEY,
    STOPPED_KEY,
)

# Keys Tune adds to every result; everything else numeric came from the trainer (or frozen scoring).
_TUNE_KEYS = set(AUTO_RESULT_KEYS) | {DONE, TRIAL_ID, "should_checkpoint", "experiment_tag"}
_SKIP_KEYS = {PREDICTIONS_KEY, FAILED_KEY, HELD_KEY, STOPPED_KEY, "variant", RSS_KEY, GPU_KEY}
# How a failed trial's reason starts when the trainer ran to its end and the driver could not score its predictions
SCORING_FAILED = "scoring failed on the driver (the trainer finished and sent its predictions)"


@dataclass
class TrialRecord:
    """One row of the `trials` table."""

    run_id: str
    cycle: int
    trial_id: str
    variant_id: str
    status: TrialStatus
    reason: str | None
    knobs: str
    seed: int
    epochs: int
    val_metric: float | None
    selection_score: float | None
    test_score: float | None
    seconds: float
    work_dir: str
    replicate: bool = False  # a fresh-seed run of its variant's best knobs (noise.py), not a search sample
    peak_rss_mb: float | None = None  # the trainer's peak memory (peakmemory.py); GPU only where it used CUDA
    peak_gpu_mb: float | None = None
    node: str | None = None  # the IP of the Ray node it ran on (its last result's); None if it never reported
    final: bool = False  # the final training of the campaign's pick (finaltrain.py), not a search sample
    final_budget_s: float | None = None  # the final training's seconds of training (its trial.budget_s); None: search
    final_added: str | None = None  # what the final training added to the pick's code ("cosine + shift"); None: none

    def row(self) -> dict[str, Any]:
        """As a KB row (status as its plain value)."""
        return {**self.__dict__, "status": self.status.value}


Sink = Callable[[TrialRecord, list[dict[str, Any]]], None]


class TrialLedger(Callback):
    """Collects each trial's per-epoch metrics and final outcome, and passes them to `sink`."""

    def __init__(
        self,
        run_id: str,
        cycle: int,
        labels: Labels,
        trials_root: str,
        seed: int,
        metric: str,
        sink: Sink,
        relative: Mapping[str, Bounds] | None = None,
        own_knobs: dict[str, dict[str, Any]] | None = None,
        segments: SegmentLog | None = None,
        segment_sink: Callable[[list[dict[str, Any]]], None] | None = None,
        on_silent_error: Callable[[str], None] | None = None,
    ) -> None:
        self.run_id, self.cycle, self.labels = run_id, cycle, labels
        self.relative, self.own_knobs = relative or {}, own_knobs or {}  # to record the knob values trials ran
        self.trials_root, self.seed, self.metric, self.sink = trials_root, seed, metric, sink
        # scheduler=pbt: the trial's segments (variant and knobs from an epoch on), written before its row
        self.segments, self.segment_sink = segments, segment_sink
        self.started: dict[str, float] = {}
        self.epochs: dict[str, dict[int, dict[str, float]]] = {}
        self.peaks: dict[str, dict[str, float]] = {}  # trial -> the largest peak memory any of its reports carried
        self.records: list[TrialRecord] = []
        # Told the id of a trial Tune failed without telling its searcher (an actor reset that failed): the async
        # run frees the trial's slot in its ConcurrencyLimiter, which would otherwise count it live for good.
        self.on_silent_error = on_silent_error
        # trial id -> why the scheduler stopped it (asha.NoiseAwareASHA fills it: `scheduler(cfg, ledger.stop_reasons)`)
        self.stop_reasons: dict[str, str] = {}

    def __getstate__(self) -> dict[str, Any]:
        # Tune pickles its run config; the sink (KB writer, console) lives only in this driver process.
        return {}

    def on_trial_start(self, iteration: int, trials: list[Trial], trial: Trial, **info: Any) -> None:
        self.started.setdefault(trial.trial_id, time.time())
        self.epochs.setdefault(trial.trial_id, {})

    def on_trial_result(
        self, iteration: int, trials: list[Trial], trial: Trial, result: dict[str, Any], **info: Any
    ) -> None:
        peaks = self.peaks.setdefault(trial.trial_id, {})
        for key in (RSS_KEY, GPU_KEY):
            value = _float(result.get(key))
            if value is not None:
                peaks[key] = max(value, peaks.get(key, value))
        epoch = result.get("epoch")
        if epoch is None:
            return
        for record in [*json.loads(result.get(HELD_KEY) or "[]"), result]:  # held: epochs past the last rung
            self._epoch_metrics(trial, record)
            if self.segments is not None:
                self.segments.observe(trial.trial_id, int(record["epoch"]), dict(trial.config or {}))

    def _epoch_metrics(self, trial: Trial, result: dict[str, Any]) -> None:
        epoch = result["epoch"]
        metrics = {
            k: float(v)
            for k, v in result.items()
            if k not in _TUNE_KEYS and k not in _SKIP_KEYS and k != "epoch" and _is_number(v)
        }
        epochs = self.epochs.setdefault(trial.trial_id, {})
        # A retried trial (its node was lost) reports again from its checkpoint's epoch, or from 1 without one:
        # the epochs it keeps are overwritten, the ones past it (from the lost attempt) dropped. So each epoch
        # appears once, and a resumed trial keeps the epochs from before its checkpoint.
        for stale in [e for e in epochs if e > int(epoch)]:
            del epochs[stale]
        epochs[int(epoch)] = metrics

    def on_trial_complete(self, iteration: int, trials: list[Trial], trial: Trial, **info: Any) -> None:
        failed = (trial.last_result or {}).get(FAILED_KEY)
        if failed is not None:  # the trainer's own failure, reported by the trial driver (never retried)
            self._finish(trial, TrialStatus.failed, str(failed))
            return
        encoded = (trial.last_result or {}).get(PREDICTIONS_KEY)
        if encoded is None:
            # the runner's budget stop says why in its result; an ASHA stop, in the scheduler's stop_reasons
            reason = (trial.last_result or {}).get(STOPPED_KEY) or self.stop_reasons.get(trial.trial_id)
            self._finish(trial, TrialStatus.stopped_early, reason)
            return
        try:
            scores = score_encoded(str(encoded), self.labels)
        except ScoringError as err:  # the trainer finished: its own log says nothing of this
            self._finish(trial, TrialStatus.failed, f"{SCORING_FAILED}: {err}")
            return
        # A completed trial's reason is a warning only: predictions scored but suspect (all one class).
        self._finish(trial, TrialStatus.completed, scores.warning, scores.selection, scores.test)

    def on_trial_error(self, iteration: int, trials: list[Trial], trial: Trial, **info: Any) -> None:
        self._finish(trial, TrialStatus.failed, failure_reason(trial))

    def on_step_end(self, iteration: int, trials: list[Trial], **info: Any) -> None:
        # Tune fails a trial whose reused actor could not be reset ("Trainable runner reuse requires reset_config()")
        # with no callback and no word to the searcher: record it as soon as the controller's step has marked it.
        errored = [trial for trial in trials if trial.status == Trial.ERROR]
        finished = {record.trial_id for record in self.records} if errored else set()
        for trial in errored:
            if trial.trial_id not in finished:
                self._finish(trial, TrialStatus.failed, failure_reason(trial))
                if self.on_silent_error is not None:
                    self.on_silent_error(trial.trial_id)

    def on_experiment_end(self, trials: list[Trial], **info: Any) -> None:
        # A stop of the whole run (STOP file, campaign time) ends running trials without a completion
        # callback; they were stopped early, and they are recorded so no started trial goes missing.
        # A trial Tune failed before it started calls no callback either (a reused actor whose reset timed out:
        # "Trainable runner reuse requires reset_config()"): it is recorded failed with Tune's reason.
        finished = {record.trial_id for record in self.records}
        for trial in trials:
            if trial.trial_id in finished:
                continue
            if trial.status == Trial.ERROR:
                self._finish(trial, TrialStatus.failed, failure_reason(trial))
            elif trial.trial_id in self.started:
                self._finish(trial, TrialStatus.stopped_early, STOPPED_WITH_CYCLE)

    def _finish(
        self,
        trial: Trial,
        status: TrialStatus,
        reason: str | None,
        selection: float | None = None,
        test: float | None = None,
    ) -> None:
        epochs = self.epochs.get(trial.trial_id, {})
        config = trial.config or {}
        knobs = resolve_knobs(config, self.own_knobs.get(str(config.get("variant")), {}), self.relative)
        record = TrialRecord(
            run_id=self.run_id,
            cycle=self.cycle,
            trial_id=trial.trial_id,
            variant_id=str((trial.config or {}).get("variant")),
            status=status,
            reason=reason,
            knobs=json.dumps(knobs, sort_keys=True, default=str),
            seed=int(config.get(SEED_KEY, self.seed)),
            epochs=max(epochs, default=0),
            val_metric=_float(epochs[max(epochs)].get(self.metric)) if epochs else None,
            selection_score=selection,
            test_score=test,
            seconds=time.time() - self.started.get(trial.trial_id, time.time()),
            work_dir=f"{self.trials_root}/{trial.trial_id}",
            replicate=bool(config.get(REPLICATE_KEY, False)),
            final=bool(config.get(FINAL_KEY, False)),
            final_budget_s=config.get(FINAL_BUDGET_KEY),
            final_added=config.get(FINAL_ADDED_KEY),
            peak_rss_mb=self.peaks.get(trial.trial_id, {}).get(RSS_KEY),
            peak_gpu_mb=self.peaks.get(trial.trial_id, {}).get(GPU_KEY),
            node=(trial.last_result or {}).get(NODE_IP),  # a retried trial: the node of its last attempt
        )
        rows = [
            {"run_id": self.run_id, "trial_id": trial.trial_id, "epoch": epoch, "metric": name, "value": value}
            for epoch, metrics in sorted(epochs.items())
            for name, value in metrics.items()
        ]
        self.records.append(record)
        if self.segments is not None and self.segment_sink is not None:
            own = self.own_knobs
            self.segment_sink(
                self.segments.rows(
                    self.run_id,
                    self.cycle,
                    trial.trial_id,
                    lambda c: resolve_knobs(c, own.get(str(c.get("variant")), {}), self.relative),
                )
            )
        self.sink(record, rows)


def failure_reason(trial: Trial) -> str:
    """The one-line reason of a failed trial (our TrialFailed message, or the error's last line)."""
    error = trial.get_pickled_error()
    if error is not None:
        cause = error
        while getattr(cause, "__cause__", None) is not None:
            cause = cause.__cause__  # type: ignore[assignment]
        text = str(cause).strip() or type(cause).__name__
    else:
        text = trial.error_file and _last_line_of(trial.error_file) or "unknown error"
    for prefix in ("ralph_ray.runner.TrialFailed: ", "TrialFailed: "):
        text = text.split(prefix)[-1]
    return last_line(text)[:500] or "unknown error"


def last_line(text: str) -> str:
    """The last non-empty line of a failure (a traceback's exception), stripped, for a one-line reason ("": none)."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def _last_line_of(path: str) -> str:
    try:
        with open(path) as handle:
            return last_line(handle.read())
    except OSError:
        return ""


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _float(value: Any) -> float | None:
    if value is None or not _is_number(value) or not math.isfinite(float(value)):
        return None
    return float(value)
