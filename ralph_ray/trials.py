"""The Tune trainable: one trial = one variant's train.py, run by the Ray-free `runner` in the trial's work dir.

This adapter adds what only Tune needs: the variant and knobs from the trial's config, the work dir on this node,
the GPUs Ray gave the trial, epoch reports (with checkpoints) forwarded to `tune.report`, Tune's stop request,
and the predictions sent back to the driver (which holds the labels and scores them).

On a cluster it assumes no shared filesystem: the spec carries code and data, the data is cached per node,
a trial on another node than the driver's works in a node-local folder, and the trainer's checkpoint goes to
Tune's storage with the epoch report, so a trial retried after its node was lost resumes on any node.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ralph_ray import harness, modeleval, runner
from ralph_ray.datacache import PublicData, check_frozen, materialise_data
from ralph_ray.knobs import Bounds, KnobError, epochs_knob, read_knobs, resolve_knobs
from ralph_ray.peakmemory import USAGE_FILE, PeakMemory
from ralph_ray.runner import CHECKPOINT_DIR, Limits, Status, Trainer, TrialFailed
from ralph_ray.scoring import PREDICTIONS_KEY, encode_predictions
from ralph_ray.workdir import read_files, set_knobs, write_variant

__all__ = [
    "Code",
    "PublicData",
    "Schedule",
    "TrialSpec",
    "TrialFailed",
    "read_files",
    "run_trial",
]  # names others import

HELD_KEY = "held_epochs"  # epochs held back past the last rung, sent (as JSON) with the final report
# The result key that ends a trial the trainer itself failed (crash, NaN, timeout...): such a failure is final,
# so it ends the trial as a result, not an exception, which Tune would retry (FailureConfig is for lost nodes).
FAILED_KEY = "trial_failed"
# The result key of a trial the runner stopped past its time budget: recorded as stopped early with this reason,
# its reported epochs (the curve, its last validation metric) kept; unscored, as it wrote no predictions.
STOPPED_KEY = "trial_stopped"
NODE_FILE = "node.json"  # in the work dir: where the trial ran (node, GPUs, data cache), for people and tests
ENV_WORK_DIR = "RALPH_WORK_DIR"  # a node's folder for the work dirs of trials from a driver on another node
# Config keys of a replicate trial (noise.py): its own seed (else the spec's) and the mark the ledger records.
SEED_KEY = "_seed"
REPLICATE_KEY = "_replicate"
FINAL_KEY = "_final"  # the final training of the pick (finaltrain.py)
FINAL_ADDED_KEY = "_final_added"  # what it added to the pick's code (safeguards.final_additions): "cosine + shift"
FINAL_BUDGET_KEY = "_final_budget_s"  # the training seconds it was given (its trial.budget_s): export's reproduce


@dataclass(frozen=True)
class Code:
    """What the trials of one Tune run execute: every variant's files, their own knobs, and the harness they import."""

    variants: dict[str, dict[str, bytes]]  # variant id -> relative path -> file bytes
    harness_sha256: str
    entry: str = "train.py"
    own_knobs: dict[str, dict[str, Any]] = field(default_factory=dict)  # variant id -> its knob values
    # A relative search samples these knobs as factors on each variant's own values (knobs.resolve_knobs).
    relative: dict[str, Bounds] = field(default_factory=dict)  # name -> its declared space


@dataclass(frozen=True)
class Schedule:
    """How a trial talks to Tune: the ranking metric, the epochs held for the last rung, checkpoints."""

    # The ranking metric and its direction: a failed trial reports the worst value with its reason.
    metric: str = "val_acc"
    mode: str = "max"
    # Reports from this epoch on (scheduler.max_t; a trial's own EPOCHS where less: hold_from) are held back and sent
    # with the predictions: ASHA's last rung would otherwise stop a fully trained trial between its last epoch and
    # its predictions.
    hold_from_epoch: int | None = None
    # The trainer checkpoints at most this often (seconds; 0: every epoch) and each new checkpoint goes to
    # Tune's storage with its epoch's report; None: no checkpoints (see raycluster.checkpoint_interval).
    checkpoint_every_s: float | None = None


@dataclass(frozen=True)
class TrialSpec:
    """Everything a trial needs besides its config; shipped once through the object store.

    Code and public data travel inside it, so a trial runs on any node without a shared filesystem.
    Selection/test labels are not here: the driver scores predictions.
    """

    code: Code
    data: PublicData
    limits: Limits
    trials_root: str  # the driver's node keeps work dirs here (see `work_dir`)
    schedule: Schedule = Schedule()
    seed: int = 0
    env: dict[str, str] = field(default_factory=dict)
    driver_node_id: str | None = None  # trials on other nodes work in a node-local folder
    model_scored: bool = False  # the task scores the trainer's exported model, not its predictions (modeleval)


def run_trial(config: dict[str, Any], spec: TrialSpec) -> None:
    """Tune function trainable: run one trial to completion, stop or failure."""
    from ray import tune

    trial_id = tune.get_context().get_trial_id() or "manual"
    peak = PeakMemory()
    try:
        _run_trial(config, spec, work_dir(spec, trial_id), peak=peak)
    except TrialFailed as err:
        # Final: Tune retries exceptions (max_failures), which must spend retries on lost nodes, not on a
        # trainer that would crash, diverge or hang again. The ledger records the reason (and the peak memory).
        worst = float("-inf") if spec.schedule.mode == "max" else float("inf")
        tune.report({spec.schedule.metric: worst, FAILED_KEY: str(err), **peak.fields()})


def _run_trial(
    config: dict[str, Any],
    spec: TrialSpec,
    work: Path,
    report: Any = None,
    checkpoint: Any = None,
    extra_env: dict[str, str] | None = None,
    predicts: bool = True,
    peak: PeakMemory | None = None,
) -> None:
    """Run train.py in `work`; a data-parallel worker (dataparallel) passes Ray Train's report, checkpoint, env
    (and `predicts=False` on the ranks whose trainers leave predictions to rank 0). Every report carries the
    trainer's peak memory so far (`peak`), so a trial stopped early still has one."""
    from ray import tune

    peak = peak or PeakMemory()

    report = report or tune.report
    if report is tune.report:
        checkpoint = tune.get_checkpoint()
    code = spec.code
    data_dir = materialise_data(spec.data)
    frozen = {str(data_dir / name): digest for name, digest in spec.data.hashes.items()}
    check_frozen(frozen | {harness.__file__: code.harness_sha256})
    variant = str(config.get("variant", ""))
    if variant not in code.variants:
        raise TrialFailed(f"unknown variant {variant!r} (this cycle runs {', '.join(code.variants)})")
    write_variant(code.variants[variant], work)
    set_knobs(work, resolve_knobs(config, code.own_knobs.get(variant, {}), code.relative), entry=code.entry)
    restored = restore_checkpoint(checkpoint, work / CHECKPOINT_DIR)
    env = {**spec.env, **gpu_env(), **(extra_env or {})}
    write_node_info(work, data_dir, restored, env)
    seed = int(config.get(SEED_KEY, spec.seed))
    trainer = Trainer(work, data_dir, code.entry, seed, env, spec.schedule.checkpoint_every_s)
    forward = report if spec.schedule.checkpoint_every_s is None else CheckpointForwarder(work / CHECKPOINT_DIR, report)

    def every_epoch(record: dict[str, Any]) -> None:
        peak.read_usage(work / USAGE_FILE)  # the harness wrote it with this report
        forward({**record, **peak.fields()})

    hold = hold_from(spec.schedule.hold_from_epoch, work / code.entry)
    outcome = runner.run(trainer, spec.limits, every_epoch, hold, _stop_requested, peak)
    if outcome.status is Status.stopped and outcome.reason and outcome.last is not None:  # past its time budget
        final = {**outcome.last, STOPPED_KEY: outcome.reason, **peak.fields()}
        report({**final, HELD_KEY: json.dumps(outcome.held)} if outcome.held else final)
        return
    if outcome.status is Status.stopped:
        return  # Tune stopped the trial (ASHA or a stop rule)
    if outcome.status is Status.failed or outcome.last is None:
        raise TrialFailed(outcome.reason or "train.py failed")
    if not predicts:  # its last report keeps it in step with rank 0's final one
        last = {**outcome.last, **peak.fields()}
        report({**last, HELD_KEY: json.dumps(outcome.held)} if outcome.held else last)
        return
    predictions = outcome.predictions
    if spec.model_scored:  # run the trainer's exported model on the held-out inputs; its own predictions don't count
        predictions = modeleval.evaluate(work, data_dir, spec.limits, trainer.seed)
    if predictions is None:
        raise TrialFailed(
            f"train.py finished without writing {runner.PREDICTIONS_FILE}: "
            "call harness.save_predictions(selection=..., test=...)"
        )
    final = {**outcome.last, **peak.fields()}
    if outcome.held:  # the held epochs before the last ride along, so the curve keeps every epoch
        final[HELD_KEY] = json.dumps(outcome.held)
    # The driver scores these against labels that never leave it.
    report({**final, PREDICTIONS_KEY: encode_predictions(predictions)})


def hold_from(max_t: int | None, entry: Path) -> int | None:
    """The epoch from which a trial's reports are held for its predictions: `max_t`, or the trial's own EPOCHS where
    that comes first. A user's EPOCHS=2 trial under max_t 6 (a rung at 2) was stopped by ASHA at its last epoch,
    after it had trained and written its predictions, and was recorded stopped_early, never scored."""
    if max_t is None:
        return None
    try:
        knobs = read_knobs(entry.read_text())
    except (OSError, SyntaxError, ValueError, KnobError):
        return max_t  # the runner reports what is wrong with the trainer
    name = epochs_knob(knobs)
    epochs = None if name is None else knobs[name]
    return max_t if epochs is None or epochs < 1 else min(max_t, epochs)


def work_dir(spec: TrialSpec, trial_id: str) -> Path:
    """The trial's work dir: under the run dir on the driver's node; on any other node in a node-local folder.

    Another node may lack the head's paths (another user, another disk layout), so it uses $RALPH_WORK_DIR or
    its temp dir, keeping the run/cycle/trials tail of the path so work dirs of several campaigns never mix.
    """
    if spec.driver_node_id is None or spec.driver_node_id == _node_id():
        return Path(spec.trials_root) / trial_id
    root = Path(os.environ.get(ENV_WORK_DIR) or Path(tempfile.gettempdir()) / "ralph_ray_trials")
    return root.joinpath(*Path(spec.trials_root).parts[-3:], trial_id)


def restore_checkpoint(checkpoint: Any, folder: Path) -> bool:
    """Materialise a retried trial's last checkpoint (from Tune's storage) where its trainer looks; True if any.

    An earlier attempt's files go first: a trainer runs ahead of the reports Tune has taken, so its own last
    checkpoint may be epochs past the one Tune restarts it from (or Tune has none, and it must start fresh).
    """
    shutil.rmtree(folder, ignore_errors=True)
    if checkpoint is None:
        return False
    folder.mkdir(parents=True)
    checkpoint.to_directory(str(folder))
    return (folder / harness.CHECKPOINT_FILE).exists()


class CheckpointForwarder:
    """Sends epoch reports to Tune, each with the checkpoint the trainer saved for that epoch (if it saved one).

    The trainer may be epochs ahead of the report being sent (Tune holds a report while it pauses or
    synchronises trials), so the checkpoint goes by the epoch's own file (`harness.epoch_checkpoint`), never
    the latest one; it is moved out for the upload, and the files of epochs never sent are dropped.
    """

    def __init__(self, folder: Path, report: Any = None) -> None:
        self.folder, self._report = folder, report
        self.count = 0

    def __call__(self, record: dict[str, Any]) -> None:
        from ray import tune

        report = self._report or tune.report
        epoch = _epoch_of(record)
        kept = self.folder / harness.epoch_checkpoint(epoch) if epoch is not None else None
        if kept is None or not kept.exists():
            report(record)
            return
        self.count += 1
        snapshot = self.folder.parent / f".checkpoint_{self.count}"
        shutil.rmtree(snapshot, ignore_errors=True)
        snapshot.mkdir()
        try:
            os.replace(kept, snapshot / harness.CHECKPOINT_FILE)
            self._drop_before(epoch)
            report(
                record, checkpoint=tune.Checkpoint.from_directory(str(snapshot))
            )  # copied to storage before it returns
        finally:
            shutil.rmtree(snapshot, ignore_errors=True)

    def _drop_before(self, epoch: int) -> None:
        """Remove kept checkpoints of earlier epochs (held reports, never sent with their own)."""
        for path in self.folder.glob(harness.epoch_checkpoint("*")):
            number = path.name.split(".", 1)[0].removeprefix("epoch-")
            if number.isdigit() and int(number) < epoch:
                path.unlink(missing_ok=True)


def _epoch_of(record: dict[str, Any]) -> int | None:
    """The epoch a report names (None: it names none, so no epoch checkpoint goes with it)."""
    try:
        return int(record["epoch"])
    except (KeyError, TypeError, ValueError):
        return None


def gpu_env() -> dict[str, str]:
    """The trainer sees only the GPUs Ray gave its trial: Ray sets CUDA_VISIBLE_DEVICES for a trial with GPUs
    (the trainer inherits it) but leaves it alone for one without, which would then see every GPU of its node."""
    import ray

    return {} if ray.get_gpu_ids() else {"CUDA_VISIBLE_DEVICES": ""}


def write_node_info(work: Path, data_dir: Path, restored: bool, env: dict[str, str]) -> None:
    """Record where this attempt of the trial runs: node, GPUs it was given, data cache, resumed or not."""
    import ray

    info = {
        "node_id": _node_id(),
        "hostname": socket.gethostname(),
        "pid": os.getpid(),
        "cuda_visible_devices": env.get("CUDA_VISIBLE_DEVICES", os.environ.get("CUDA_VISIBLE_DEVICES")),
        "gpu_ids": [str(g) for g in ray.get_gpu_ids()],
        "data_dir": str(data_dir),
        "work_dir": str(work),
        "restored_checkpoint": restored,
        "started_at": time.time(),
    }
    (work / NODE_FILE).write_text(json.dumps(info, indent=2))


def _node_id() -> str:
    import ray

    return ray.get_runtime_context().get_node_id()


def _stop_requested() -> bool:
    """True once Tune has asked this trial to stop.

    Tune only raises the stop inside the *next* `tune.report`; peeking at the session's stop event lets
    a trial between epochs die at once instead of training another epoch.
    """
    try:
        from ray.train._internal.session import get_session
    except ImportError:
        return False
    session = get_session()
    event = getattr(session, "stop_event", None)
    return bool(event is not None and event.is_set())
