"""The trial driver: one Tune trial = the variant's train.py in its own work dir and process group.

It writes the variant's files (shipped in the spec), rewrites the sampled knobs, runs `train.py` as a
subprocess, tails its JSON-lines reports into `ray.tune.report`, enforces the timeout and output limit,
fails fast on NaN/inf, sends the predictions back to the driver (which holds the labels and scores them),
and always kills the whole process group in `finally` (which is what makes `reuse_actors` safe).

On a cluster it assumes no shared filesystem: the spec carries code and data, the data is cached per node,
a trial on another node than the driver's works in a node-local folder, and the trainer's checkpoint goes to
Tune's storage with the epoch report, so a trial retried after its node was lost resumes on any node.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ralph_ray import harness
from ralph_ray.knobs import KnobError, resolve_knobs, rewrite_knobs
from ralph_ray.scoring import PREDICTIONS_KEY, encode_predictions
from ralph_ray.tasks.base import sha256_file

POLL_S = 0.05
HELD_KEY = "held_epochs"  # epochs held back past the last rung, sent (as JSON) with the final report
STOPPED_BY_TUNE = "stopped"
# The result key that ends a trial the trainer itself failed (crash, NaN, timeout...): such a failure is final,
# so it ends the trial as a result, not an exception, which Tune would retry (FailureConfig is for lost nodes).
FAILED_KEY = "trial_failed"
CHECKPOINT_DIR = "checkpoint"  # in the work dir: RALPH_CHECKPOINT_DIR of the trainer
NODE_FILE = "node.json"  # in the work dir: where the trial ran (node, GPUs, data cache), for people and tests
ENV_WORK_DIR = "RALPH_WORK_DIR"  # a node's folder for the work dirs of trials from a driver on another node

# Loaded once in the parent: the forked child must not import or dlopen before exec.
try:
    _PRCTL = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):  # not Linux
    _PRCTL = None
_PR_SET_PDEATHSIG = 1


class TrialFailed(RuntimeError):
    """A trial that cannot finish: the message is the reason recorded in the knowledge base."""


@dataclass(frozen=True)
class PublicData:
    """The public split files (bytes) and their hashes: shipped through the object store to any node."""

    files: dict[str, bytes]
    hashes: dict[str, str]

    @property
    def key(self) -> str:
        """One name for this exact content (the node-local cache folder)."""
        return hashlib.sha256(json.dumps(self.hashes, sort_keys=True).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class TrialSpec:
    """Everything a trial needs besides its config; shipped once through the object store.

    The code of every variant in the cycle and the public data travel inside it, so a trial runs on any
    node without a shared filesystem. Selection/test labels are not here: the driver scores predictions.
    """

    variants: dict[str, dict[str, bytes]]  # variant id -> relative path -> file bytes
    trials_root: str
    data: PublicData
    harness_sha256: str
    timeout_s: float
    output_limit_bytes: int
    threads: int
    seed: int = 0
    entry: str = "train.py"
    env: dict[str, str] = field(default_factory=dict)
    # Reports from this epoch on are held back and sent with the predictions: ASHA's last rung would
    # otherwise stop a fully trained trial between its last epoch and its predictions.
    hold_from_epoch: int | None = None
    # A relative search samples these knobs as factors on each variant's own values (knobs.resolve_knobs).
    relative: frozenset[str] = frozenset()
    own_knobs: dict[str, dict[str, Any]] = field(default_factory=dict)  # variant id -> its knob values
    # The ranking metric and its direction: a failed trial reports the worst value with its reason.
    metric: str = "val_acc"
    mode: str = "max"
    # The trainer checkpoints at most this often (seconds; 0: every epoch) and each new checkpoint goes to
    # Tune's storage with its epoch's report; None: no checkpoints (see raycluster.checkpoint_interval).
    checkpoint_every_s: float | None = None
    # The driver's Ray node: its trials work under trials_root, trials elsewhere in a node-local folder.
    driver_node_id: str | None = None


def run_trial(config: dict[str, Any], spec: TrialSpec) -> None:
    """Tune function trainable: run one trial to completion, stop or failure."""
    from ray import tune

    trial_id = tune.get_context().get_trial_id() or "manual"
    try:
        _run_trial(config, spec, work_dir(spec, trial_id))
    except TrialFailed as err:
        # Final: Tune retries exceptions (max_failures), which must spend retries on lost nodes, not on a
        # trainer that would crash, diverge or hang again. The ledger records the reason.
        tune.report({spec.metric: float("-inf") if spec.mode == "max" else float("inf"), FAILED_KEY: str(err)})


def _run_trial(config: dict[str, Any], spec: TrialSpec, work: Path) -> None:
    from ray import tune

    data_dir = materialise_data(spec.data)
    check_frozen({str(data_dir / name): digest for name, digest in spec.data.hashes.items()} | {harness.__file__: spec.harness_sha256})
    variant = str(config.get("variant", ""))
    if variant not in spec.variants:
        raise TrialFailed(f"unknown variant {variant!r} (this cycle runs {', '.join(spec.variants)})")
    knobs = resolve_knobs(config, spec.own_knobs.get(variant, {}), spec.relative)
    write_variant(spec.variants[variant], work)
    set_knobs(work, knobs, entry=spec.entry)
    restored = restore_checkpoint(tune.get_checkpoint(), work / CHECKPOINT_DIR)
    spec = replace(spec, env={**spec.env, **gpu_env()})
    write_node_info(work, data_dir, restored, spec.env)
    proc = start_trainer(work, spec, data_dir)
    try:
        forward = tune.report if spec.checkpoint_every_s is None else CheckpointForwarder(work / CHECKPOINT_DIR)
        last = tail_reports(proc, work, spec, forward)
        if last is None:
            return  # Tune stopped the trial (ASHA or a stop rule)
        predictions = work / "predictions.npz"
        if not predictions.exists():
            raise TrialFailed(f"train.py finished without writing {predictions.name}: call harness.save_predictions(selection=..., test=...)")
        # The driver scores these against labels that never leave it.
        tune.report({**last, PREDICTIONS_KEY: encode_predictions(predictions)})
    finally:
        kill_group(proc)


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
    """Materialise a retried trial's last checkpoint (from Tune's storage) where its trainer looks; True if any."""
    if checkpoint is None:
        return False
    folder.mkdir(parents=True, exist_ok=True)
    checkpoint.to_directory(str(folder))
    return (folder / harness.CHECKPOINT_FILE).exists()


class CheckpointForwarder:
    """Sends epoch reports to Tune, each with the trainer's checkpoint if it is new since the last one sent.

    The trainer saves its checkpoint right before it reports the epoch, so a new file present when a report
    is read belongs to that epoch. A hard link freezes it for the upload: the trainer's next save replaces the
    file (a new inode) instead of writing into the one being copied.
    """

    def __init__(self, folder: Path, report: Any = None) -> None:
        self.folder, self._report = folder, report
        self.sent: tuple[int, int, int] | None = None
        self.count = 0

    def __call__(self, record: dict[str, Any]) -> None:
        from ray import tune

        report = self._report or tune.report
        path = self.folder / harness.CHECKPOINT_FILE
        signature = _signature(path)
        if signature is None or signature == self.sent:
            report(record)
            return
        self.count += 1
        snapshot = self.folder.parent / f".checkpoint_{self.count}"
        shutil.rmtree(snapshot, ignore_errors=True)
        snapshot.mkdir()
        try:
            try:
                os.link(path, snapshot / harness.CHECKPOINT_FILE)
            except OSError:  # a filesystem without hard links
                shutil.copy2(path, snapshot / harness.CHECKPOINT_FILE)
            report(record, checkpoint=tune.Checkpoint.from_directory(str(snapshot)))  # copied to storage before it returns
        finally:
            shutil.rmtree(snapshot, ignore_errors=True)
        self.sent = signature


def gpu_env() -> dict[str, str]:
    """The trainer sees only the GPUs Ray gave its trial: Ray sets CUDA_VISIBLE_DEVICES for a trial with GPUs
    (the trainer inherits it) but leaves it alone for one without, which would then see every GPU of its node."""
    import ray

    return {} if ray.get_gpu_ids() else {"CUDA_VISIBLE_DEVICES": ""}


def write_node_info(work: Path, data_dir: Path, restored: bool, env: dict[str, str]) -> None:
    """Record where this attempt of the trial runs: node, GPUs it was given, data cache, resumed or not."""
    import ray

    info = {
        "node_id": _node_id(), "hostname": socket.gethostname(), "pid": os.getpid(),
        "cuda_visible_devices": env.get("CUDA_VISIBLE_DEVICES", os.environ.get("CUDA_VISIBLE_DEVICES")),
        "gpu_ids": [str(g) for g in ray.get_gpu_ids()],
        "data_dir": str(data_dir), "work_dir": str(work), "restored_checkpoint": restored, "started_at": time.time(),
    }
    (work / NODE_FILE).write_text(json.dumps(info, indent=2))


def materialise_data(data: PublicData) -> Path:
    """Write the public files once per node into a local cache (atomically) and return the folder."""
    root = Path(os.environ.get("RALPH_CACHE_DIR", Path(tempfile.gettempdir()) / "ralph_ray_data")) / data.key
    if all((root / name).exists() for name in data.files):
        return root
    tmp = root.with_name(f".{root.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.mkdir(parents=True, exist_ok=True)
    for name, content in data.files.items():
        (tmp / name).write_bytes(content)
    try:
        os.replace(tmp, root)
    except OSError:  # another trial on this node got there first
        shutil.rmtree(tmp, ignore_errors=True)
    return root


def check_frozen(frozen: dict[str, str]) -> None:
    """Refuse to run if any frozen file (data, harness) differs from its hash at campaign start."""
    for path, expected in frozen.items():
        if not Path(path).exists():
            raise TrialFailed(f"frozen file {path} is missing")
        if sha256_file(Path(path)) != expected:
            raise TrialFailed(f"frozen file {path} changed since the campaign started")


def write_variant(files: dict[str, bytes], work: Path) -> None:
    """Write a variant's files into a clean trial work dir."""
    if work.exists():
        shutil.rmtree(work)  # a retried trial starts from a clean copy
    for relative, content in files.items():
        target = work / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content)
    work.mkdir(parents=True, exist_ok=True)


def set_knobs(work: Path, knobs: dict[str, Any], entry: str = "train.py") -> None:
    """Write the sampled knobs into the trial's copy of the code (so its exact code is kept) and knobs.json."""
    source = (work / entry).read_text()
    try:
        (work / entry).write_text(rewrite_knobs(source, knobs))
    except (KnobError, SyntaxError) as err:
        raise TrialFailed(f"cannot set knobs {sorted(knobs)}: {err}") from None
    (work / "knobs.json").write_text(json.dumps(knobs, indent=2, sort_keys=True, default=str))


def prepare_workdir(trainer_dir: Path, work: Path, knobs: dict[str, Any], entry: str = "train.py") -> None:
    """Copy a trainer folder into a work dir and write the knobs into its code (hand runs, the gate)."""
    write_variant(read_files(trainer_dir), work)
    set_knobs(work, knobs, entry=entry)


def read_files(folder: Path) -> dict[str, bytes]:
    """A folder's files (relative path -> bytes), skipping caches and run outputs."""
    from ralph_ray.variants import variant_files

    return {str(path.relative_to(folder)): path.read_bytes() for path in variant_files(folder)}


# Variables whose names look like credentials never reach trainer code (agents write it; an API key must not leak).
SECRET_ENV = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL", re.IGNORECASE)


def start_trainer(work: Path, spec: TrialSpec, data_dir: Path) -> subprocess.Popen[bytes]:
    """Start train.py in its own process group, with its threads capped, its output to files, and no secrets."""
    threads = str(max(1, spec.threads))
    env = {
        **{name: value for name, value in os.environ.items() if not SECRET_ENV.search(name)},
        **spec.env,
        harness.ENV_DATA_DIR: str(data_dir),
        harness.ENV_METRICS_FILE: str(work / "metrics.jsonl"),
        harness.ENV_PREDICTIONS_FILE: str(work / "predictions.npz"),
        harness.ENV_SEED: str(spec.seed),
        "OMP_NUM_THREADS": threads,
        "MKL_NUM_THREADS": threads,
        "PYTHONUNBUFFERED": "1",
    }
    if spec.checkpoint_every_s is not None:
        env[harness.ENV_CHECKPOINT_DIR] = str(work / CHECKPOINT_DIR)
        env[harness.ENV_CHECKPOINT_EVERY_S] = str(spec.checkpoint_every_s)
    with (work / "stdout.log").open("wb") as out, (work / "stderr.log").open("wb") as err:
        return subprocess.Popen(
            [sys.executable, spec.entry],
            cwd=work,
            env=env,
            stdout=out,
            stderr=err,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # own process group: one killpg reaches every child
            preexec_fn=_die_with_parent,
        )


def tail_reports(proc: subprocess.Popen[bytes], work: Path, spec: TrialSpec, report: Any) -> dict[str, Any] | None:
    """Forward each epoch line to Tune until train.py exits; None if Tune asked the trial to stop."""
    tail = JsonLinesTail(work / "metrics.jsonl")
    deadline = time.monotonic() + spec.timeout_s
    last: dict[str, Any] | None = None
    held: list[dict[str, Any]] = []
    while True:
        exited = proc.poll() is not None  # read the lines after checking, so none written before exit is missed
        for record in tail.read_new():
            check_finite(record)
            if spec.hold_from_epoch is not None and _epoch(record) >= spec.hold_from_epoch:
                held.append(record)
            else:
                report(record)
            last = record
        if exited:
            break
        if _stop_requested():
            return None
        if time.monotonic() > deadline:
            raise TrialFailed(f"timeout: train.py ran past safeguards.trial_timeout_s={spec.timeout_s:g}s")
        if _output_bytes(work) > spec.output_limit_bytes:
            raise TrialFailed(f"output limit: train.py wrote more than {spec.output_limit_bytes} bytes to stdout/stderr")
        time.sleep(POLL_S)
    if proc.returncode != 0:
        raise TrialFailed(f"train.py exited with code {proc.returncode}: {_last_error_line(work)}")
    if last is None:
        raise TrialFailed("train.py exited without reporting an epoch: call harness.report(epoch=..., ...) each epoch")
    if len(held) > 1:  # the held epochs before the last ride along, so the curve keeps every epoch
        return {**last, HELD_KEY: json.dumps(held[:-1])}
    return last


class JsonLinesTail:
    """Reads whole JSON lines appended to a file since the last call."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.partial = b""

    def read_new(self) -> list[dict[str, Any]]:
        """Complete records written since the previous call (a half-written line waits)."""
        if not self.path.exists():
            return []
        with self.path.open("rb") as handle:
            handle.seek(self.offset)
            chunk = handle.read()
        self.offset += len(chunk)
        data = self.partial + chunk
        *lines, self.partial = data.split(b"\n")
        records = []
        for line in lines:
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                raise TrialFailed(f"metrics.jsonl holds a line that is not JSON: {line[:120]!r}") from None
            if not isinstance(record, dict) or "epoch" not in record:
                raise TrialFailed(f"metrics.jsonl record without an epoch: {line[:120]!r}")
            records.append(record)
        return records


def check_finite(record: dict[str, Any]) -> None:
    """Fail fast on NaN/inf: a diverged run only wastes the slot."""
    for key, value in record.items():
        if isinstance(value, float) and not math.isfinite(value):
            raise TrialFailed(f"non-finite {key}={value} at epoch {record.get('epoch')}")


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the trial's whole process group and reap the trainer."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # the group is already gone
    proc.wait()


def _node_id() -> str:
    import ray

    return ray.get_runtime_context().get_node_id()


def _signature(path: Path) -> tuple[int, int, int] | None:
    try:
        stat = path.stat()
    except FileNotFoundError:
        return None
    return stat.st_ino, stat.st_mtime_ns, stat.st_size


def _epoch(record: dict[str, Any]) -> float:
    value = record.get("epoch")
    return float(value) if isinstance(value, (int, float)) else float("-inf")


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


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL if the Ray worker thread that started it goes away."""
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _output_bytes(work: Path) -> int:
    return sum((work / name).stat().st_size for name in ("stdout.log", "stderr.log") if (work / name).exists())


def _last_error_line(work: Path) -> str:
    lines = [line for line in (work / "stderr.log").read_text(errors="replace").splitlines() if line.strip()]
    return lines[-1].strip()[:500] if lines else "no stderr"
