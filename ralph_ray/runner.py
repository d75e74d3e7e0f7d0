"""The trial runner, free of Ray: start a trainer in its work dir, tail its reports, enforce its limits, return how it ended.

A trainer is `train.py` in a work dir that already holds its code and knobs (see `workdir`). The runner starts
it as a subprocess in its own process group with secrets stripped from its environment, hands each epoch's
JSON-lines report to a callback, fails fast on NaN/inf, a timeout or too much output, and always kills the
whole process group before it returns. Tune's trainable (`trials`) and the gate's smoke run both call `run`.
"""

from __future__ import annotations

import ctypes
import enum
import json
import math
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from ralph_ray import harness
from ralph_ray.secretenv import public_env

POLL_S = 0.05
OUTPUT_LIMIT_BYTES = 50 * 1024 * 1024  # a trial's stdout and stderr together
CHECKPOINT_DIR = "checkpoint"  # in the work dir: RALPH_CHECKPOINT_DIR of the trainer
METRICS_FILE = "metrics.jsonl"
PREDICTIONS_FILE = "predictions.npz"

# Loaded once in the parent: the forked child must not import or dlopen before exec.
try:
    _PRCTL = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):  # not Linux
    _PRCTL = None
_PR_SET_PDEATHSIG = 1

Record = dict[str, Any]


class TrialFailed(RuntimeError):
    """A trial that cannot finish: the message is the reason recorded in the knowledge base."""


class Status(str, enum.Enum):
    """How a trainer's run ended."""

    finished = "finished"  # exited 0 after reporting at least one epoch
    stopped = "stopped"  # the caller asked it to stop (ASHA, a stop rule)
    failed = "failed"  # crash, NaN/inf, timeout, output limit, bad report


@dataclass(frozen=True)
class Limits:
    """What one trainer may spend."""

    timeout_s: float
    output_bytes: int = OUTPUT_LIMIT_BYTES
    threads: int = 1  # OMP/MKL threads


@dataclass(frozen=True)
class Trainer:
    """One trainer to start: a prepared work dir, the public data it reads, and what its environment adds."""

    work: Path
    data_dir: Path
    entry: str = "train.py"
    seed: int = 0
    env: Mapping[str, str] = field(default_factory=dict)
    # The trainer checkpoints at most this often (seconds; 0: every epoch); None: no checkpoints.
    checkpoint_every_s: float | None = None


@dataclass(frozen=True)
class Outcome:
    """How a run ended: its status, the reason of a failure, its last report and the epochs held back."""

    status: Status
    reason: str | None = None
    last: Record | None = None
    held: list[Record] = field(default_factory=list)  # held-back epochs before the last one (see `run`)
    predictions: Path | None = None  # the trainer's predictions file, when it wrote one


def run(trainer: Trainer, limits: Limits, on_epoch: Callable[[Record], None] = lambda record: None,
        hold_from_epoch: int | None = None, should_stop: Callable[[], bool] = lambda: False) -> Outcome:
    """Run a trainer to its end; every epoch report goes to `on_epoch` unless its epoch is `hold_from_epoch` or later.

    Held reports come back in the outcome instead (the last one as `last`, the earlier ones as `held`): ASHA's
    last rung would otherwise stop a fully trained trial between its last epoch and its predictions.
    """
    proc = start(trainer, limits)
    try:
        return tail(proc, trainer, limits, on_epoch, hold_from_epoch, should_stop)
    finally:
        kill_group(proc)


def start(trainer: Trainer, limits: Limits) -> subprocess.Popen[bytes]:
    """Start the trainer in its own process group, with its threads capped, its output to files, and no secrets."""
    work = trainer.work
    threads = str(max(1, limits.threads))
    env = {
        **public_env(),
        **trainer.env,
        harness.ENV_DATA_DIR: str(trainer.data_dir),
        harness.ENV_METRICS_FILE: str(work / METRICS_FILE),
        harness.ENV_PREDICTIONS_FILE: str(work / PREDICTIONS_FILE),
        harness.ENV_SEED: str(trainer.seed),
        "OMP_NUM_THREADS": threads,
        "MKL_NUM_THREADS": threads,
        "PYTHONUNBUFFERED": "1",
    }
    if trainer.checkpoint_every_s is not None:
        env[harness.ENV_CHECKPOINT_DIR] = str(work / CHECKPOINT_DIR)
        env[harness.ENV_CHECKPOINT_EVERY_S] = str(trainer.checkpoint_every_s)
    with (work / "stdout.log").open("wb") as out, (work / "stderr.log").open("wb") as err:
        return subprocess.Popen(
            [sys.executable, trainer.entry],
            cwd=work,
            env=env,
            stdout=out,
            stderr=err,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # own process group: one killpg reaches every child
            preexec_fn=_die_with_parent,
        )


def tail(proc: subprocess.Popen[bytes], trainer: Trainer, limits: Limits, on_epoch: Callable[[Record], None],
         hold_from_epoch: int | None = None, should_stop: Callable[[], bool] = lambda: False) -> Outcome:
    """Follow a started trainer until it exits, fails a limit, or `should_stop` says so."""
    work = trainer.work
    reports = JsonLinesTail(work / METRICS_FILE)
    deadline = time.monotonic() + limits.timeout_s
    last: Record | None = None
    held: list[Record] = []
    try:
        while True:
            exited = proc.poll() is not None  # read the lines after checking, so none written before exit is missed
            for record in reports.read_new():
                check_finite(record)
                if hold_from_epoch is not None and _epoch(record) >= hold_from_epoch:
                    held.append(record)
                else:
                    on_epoch(record)
                last = record
            if exited:
                break
            if should_stop():
                return Outcome(Status.stopped, last=last)
            if time.monotonic() > deadline:
                raise TrialFailed(f"timeout: train.py ran past safeguards.trial_timeout_s={limits.timeout_s:g}s")
            if _output_bytes(work) > limits.output_bytes:
                raise TrialFailed(f"output limit: train.py wrote more than {limits.output_bytes} bytes to stdout/stderr")
            time.sleep(POLL_S)
        if proc.returncode != 0:
            raise TrialFailed(f"train.py exited with code {proc.returncode}: {_last_error_line(work)}")
        if last is None:
            raise TrialFailed("train.py exited without reporting an epoch: call harness.report(epoch=..., ...) each epoch")
    except TrialFailed as err:
        return Outcome(Status.failed, str(err), last=last)
    predictions = work / PREDICTIONS_FILE
    return Outcome(Status.finished, last=last, held=held[:-1] if len(held) > 1 else [],
                   predictions=predictions if predictions.exists() else None)


class JsonLinesTail:
    """Reads whole JSON lines appended to a file since the last call."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.partial = b""

    def read_new(self) -> list[Record]:
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


def check_finite(record: Record) -> None:
    """Fail fast on NaN/inf: a diverged run only wastes the slot."""
    for key, value in record.items():
        if isinstance(value, float) and not math.isfinite(value):
            raise TrialFailed(f"non-finite {key}={value} at epoch {record.get('epoch')}")


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the trainer's whole process group and reap the trainer."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # the group is already gone
    proc.wait()


def _epoch(record: Record) -> float:
    value = record.get("epoch")
    return float(value) if isinstance(value, (int, float)) else float("-inf")


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL if the thread that started it goes away."""
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _output_bytes(work: Path) -> int:
    return sum((work / name).stat().st_size for name in ("stdout.log", "stderr.log") if (work / name).exists())


def _last_error_line(work: Path) -> str:
    lines = [line for line in (work / "stderr.log").read_text(errors="replace").splitlines() if line.strip()]
    return lines[-1].strip()[:500] if lines else "no stderr"
