"""The trial driver: one Tune trial = the variant's train.py in its own work dir and process group.

It writes the variant's files (shipped in the spec), rewrites the sampled knobs, runs `train.py` as a
subprocess, tails its JSON-lines reports into `ray.tune.report`, enforces the timeout and output limit,
fails fast on NaN/inf, sends the predictions back to the driver (which holds the labels and scores them),
and always kills the whole process group in `finally` (which is what makes `reuse_actors` safe).
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ralph_ray import harness
from ralph_ray.knobs import KnobError, rewrite_knobs
from ralph_ray.scoring import PREDICTIONS_KEY, encode_predictions
from ralph_ray.tasks.base import sha256_file

POLL_S = 0.05
STOPPED_BY_TUNE = "stopped"

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


def run_trial(config: dict[str, Any], spec: TrialSpec) -> None:
    """Tune function trainable: run one trial to completion, stop or failure."""
    from ray import tune

    trial_id = tune.get_context().get_trial_id() or "manual"
    work = Path(spec.trials_root) / trial_id
    data_dir = materialise_data(spec.data)
    check_frozen({str(data_dir / name): digest for name, digest in spec.data.hashes.items()} | {harness.__file__: spec.harness_sha256})
    variant = str(config.get("variant", ""))
    if variant not in spec.variants:
        raise TrialFailed(f"unknown variant {variant!r} (this cycle runs {', '.join(spec.variants)})")
    knobs = {key: value for key, value in config.items() if key.isupper()}
    write_variant(spec.variants[variant], work)
    set_knobs(work, knobs, entry=spec.entry)
    proc = start_trainer(work, spec, data_dir)
    try:
        last = tail_reports(proc, work, spec, tune.report)
        if last is None:
            return  # Tune stopped the trial (ASHA or a stop rule)
        predictions = work / "predictions.npz"
        if not predictions.exists():
            raise TrialFailed(f"train.py finished without writing {predictions.name}: call harness.save_predictions(selection=..., test=...)")
        # The driver scores these against labels that never leave it.
        tune.report({**last, PREDICTIONS_KEY: encode_predictions(predictions)})
    finally:
        kill_group(proc)


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


def start_trainer(work: Path, spec: TrialSpec, data_dir: Path) -> subprocess.Popen[bytes]:
    """Start train.py in its own process group, with its threads capped and its output to files."""
    threads = str(max(1, spec.threads))
    env = {
        **os.environ,
        **spec.env,
        harness.ENV_DATA_DIR: str(data_dir),
        harness.ENV_METRICS_FILE: str(work / "metrics.jsonl"),
        harness.ENV_PREDICTIONS_FILE: str(work / "predictions.npz"),
        harness.ENV_SEED: str(spec.seed),
        "OMP_NUM_THREADS": threads,
        "MKL_NUM_THREADS": threads,
        "PYTHONUNBUFFERED": "1",
    }
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
    while True:
        exited = proc.poll() is not None  # read the lines after checking, so none written before exit is missed
        for record in tail.read_new():
            check_finite(record)
            held = spec.hold_from_epoch is not None and _epoch(record) >= spec.hold_from_epoch
            if not held:
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
