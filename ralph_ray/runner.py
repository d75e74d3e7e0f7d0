"""The trial runner, free of Ray: start a trainer in its work dir, tail its reports, enforce its limits, say how it
ended.

A trainer is `train.py` in a work dir that already holds its code and knobs (see `workdir`). The runner starts
it inside the sandbox (`sandbox`: its work dir, the public data and the harness, nothing else; memory, process
and file-size limits) in its own process group with secrets stripped from its environment, hands each epoch's
JSON-lines report to a callback, fails fast on NaN/inf, a timeout or too much output (stdout and stderr are
capped; the rest is dropped with a marker), names the breach behind a failure, and always kills the whole
process group (and whatever is left in its cgroups) before it returns. Tune's trainable (`trials`) and the
gate's smoke run both call `run`.
"""

from __future__ import annotations

import ctypes
import dataclasses
import enum
import json
import math
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Callable, Mapping

from ralph_ray import harness, warmstart
from ralph_ray.peakmemory import USAGE_FILE, PeakMemory
from ralph_ray.sandbox import (
    INSTALL_FIX,
    Breach,
    Jail,
    Policy,
    SandboxMode,
    View,
    classify,
    interpreter,
    keep_niceness_in_session,
    python_dirs,
)
from ralph_ray.secretenv import public_env

POLL_S = 0.05
OUTPUT_LIMIT_BYTES = 50 * 1024 * 1024  # a trial's stdout and stderr together
OUTPUT_MARKER = "\n[ralph_ray: output past the limit of {limit} bytes (stdout and stderr together) was dropped]\n"
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
    failed = "failed"  # crash, NaN/inf, a breach of the sandbox's limits (timeout, output, memory...), bad report


@dataclass(frozen=True)
class Limits:
    """What one trainer may spend and reach."""

    timeout_s: float
    output_bytes: int = OUTPUT_LIMIT_BYTES
    threads: int = 1  # OMP/MKL threads
    sandbox: Policy = Policy()  # isolation, memory, processes, file size, network
    # An equal time budget (trial.budget_s): the trainer sees it as harness.time_left(); past budget_s + grace_s of
    # training (from the start its first report gives) it is stopped, not failed (BUDGET_REASON); its epochs stand.
    budget_s: float | None = None
    grace_s: float = 10.0
    # Fork the trainer from a warm server of this process (`warmstart`: torch already imported, same sandbox);
    # where one cannot run, the trainer starts cold.
    warm: bool = False
    prestart: bool = True  # with warm: the server may hand this trainer to a spare forked ahead (`zygote`)


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
    reason: str | None = None  # a breach's reason starts with the breach's name ("memory: ...")
    breach: Breach | None = None
    last: Record | None = None
    held: list[Record] = field(default_factory=list)  # held-back epochs before the last one (see `run`)
    predictions: Path | None = None  # the trainer's predictions file, when it wrote one
    peak_rss_mb: float | None = None  # its peak memory (`peakmemory`): CPU RSS, and GPU where it used CUDA
    peak_gpu_mb: float | None = None


def run(
    trainer: Trainer,
    limits: Limits,
    on_epoch: Callable[[Record], None] = lambda record: None,
    hold_from_epoch: int | None = None,
    should_stop: Callable[[], bool] = lambda: False,
    peak: PeakMemory | None = None,
) -> Outcome:
    """Run a trainer to its end; every epoch report goes to `on_epoch` unless its epoch is `hold_from_epoch` or later.

    Held reports come back in the outcome instead (the last one as `last`, the earlier ones as `held`): ASHA's
    last rung would otherwise stop a fully trained trial between its last epoch and its predictions. `peak` (if
    given) follows the trainer's peak memory as it runs, for a caller that reports it with each epoch.
    """
    peak = peak or PeakMemory()
    try:
        running = start(trainer, limits)
    except TrialFailed as err:  # the sandbox could not start on this node: final, not a lost node to retry
        return Outcome(Status.failed, str(err))
    try:
        outcome = tail(running, trainer, limits, on_epoch, hold_from_epoch, should_stop, peak)
    finally:
        peak.sample(running.proc.pid, force=True)  # a trainer stopped mid-run: its last mark before the kill
        running.stop()
    peak.read_usage(trainer.work / USAGE_FILE)
    return dataclasses.replace(outcome, peak_rss_mb=peak.rss_mb, peak_gpu_mb=peak.gpu_mb)


Process = subprocess.Popen[bytes] | warmstart.WarmProcess  # a cold start's Popen or a warm start's fork


class Running:
    """A started trainer: its process, its sandbox and its capped output."""

    def __init__(self, proc: Process, jail: Jail, output: CappedOutput) -> None:
        self.proc, self.jail, self.output = proc, jail, output

    def stop(self) -> None:
        """Kill the process group and whatever is left in the sandbox's cgroups; flush the logs."""
        kill_group(self.proc)
        self.jail.close()
        self.output.join()


def start(trainer: Trainer, limits: Limits) -> Running:
    """Start the trainer in its sandbox and own process group, threads capped, output capped to files, no secrets."""
    work = trainer.work
    threads = str(max(1, limits.threads))
    env = {
        **public_env(),
        **trainer.env,
        harness.ENV_DATA_DIR: str(trainer.data_dir),
        harness.ENV_METRICS_FILE: str(work / METRICS_FILE),
        harness.ENV_PREDICTIONS_FILE: str(work / PREDICTIONS_FILE),
        harness.ENV_SEED: str(trainer.seed),
        harness.ENV_USAGE_FILE: str(work / USAGE_FILE),
        "OMP_NUM_THREADS": threads,
        "MKL_NUM_THREADS": threads,
        "PYTHONUNBUFFERED": "1",
    }
    if trainer.checkpoint_every_s is not None:
        env[harness.ENV_CHECKPOINT_DIR] = str(work / CHECKPOINT_DIR)
        env[harness.ENV_CHECKPOINT_EVERY_S] = str(trainer.checkpoint_every_s)
    (work / USAGE_FILE).unlink(missing_ok=True)  # a retried trial's earlier attempt is not this one's peak
    jail = Jail(limits.sandbox, View(writable=(work,), readable=(trainer.data_dir,)))
    if limits.warm:
        warm = _start_warm(trainer, limits, jail, env)
        if warm is not None:
            return Running(warm, jail, CappedOutput(warm, work, limits.output_bytes))

    def enter() -> None:  # in the child, before exec
        _die_with_parent()
        keep_niceness_in_session()
        jail.enter()

    try:
        proc = subprocess.Popen(
            jail.command([interpreter(), trainer.entry], cwd=work),
            cwd=work,
            env=jail.env(env),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # own process group: one killpg reaches every child
            preexec_fn=enter,
        )
    except OSError as err:  # bwrap missing on this node (the driver checked its own)
        jail.close()
        raise TrialFailed(f"cannot start train.py in the sandbox on this node: {err}; fix: {INSTALL_FIX}") from None
    except BaseException:
        jail.close()
        raise
    return Running(proc, jail, CappedOutput(proc, work, limits.output_bytes))


def _start_warm(trainer: Trainer, limits: Limits, jail: Jail, env: dict[str, str]) -> warmstart.WarmProcess | None:
    """Fork the trainer from this process's warm server for its kind of trial; None: start it cold."""
    key = warmstart.Key(limits.sandbox, max(1, limits.threads), trainer.work.resolve().parent, trainer.data_dir)
    server = warmstart.server(key)
    if server is None:
        return None
    try:
        return server.spawn(warm_request(trainer, jail, env, limits.threads, key, limits.prestart), jail.group_files())
    except warmstart.WarmStartError as err:
        warmstart.disable(key, str(err))
        return None


def warm_request(
    trainer: Trainer, jail: Jail, env: Mapping[str, str], threads: int, key: warmstart.Key, prestart: bool = True
) -> dict:
    """What the fork server needs to start one trainer as `start` would: the same view, environment and limits."""
    work = trainer.work.resolve()
    keep = [[str(work), True]] + ([[str(trainer.data_dir.resolve()), False]] if trainer.data_dir.exists() else [])
    # The trainer gets a fresh /tmp: a Python environment under /tmp (a CI checkout there) is bound back read-only.
    keep += [[str(folder), False] for folder in python_dirs() if folder.is_relative_to("/tmp")]
    return {
        "entry": trainer.entry,
        "cwd": str(work),
        "env": jail.env(dict(env)),
        "threads": max(1, threads),
        "isolate": jail.policy.mode is SandboxMode.bwrap,
        "network": jail.policy.network or jail.view.network,
        "keep": keep,
        "hide": [str(key.root)],
        "rlimits": jail.rlimits(),
        # A trainer that sets CUDA's environment itself must start CUDA after it: no trainer forked ahead for it.
        "prestart": prestart and not warmstart.sets_cuda_env(work),
        # The calling thread's niceness, as a cold start's child inherits it: the breeder's smoke runs run nicer
        # than the trials (population.breeder_nice), also when forked from a server started at another niceness.
        "nice": os.getpriority(os.PRIO_PROCESS, 0),
    }


def tail(
    running: Running,
    trainer: Trainer,
    limits: Limits,
    on_epoch: Callable[[Record], None],
    hold_from_epoch: int | None = None,
    should_stop: Callable[[], bool] = lambda: False,
    peak: PeakMemory | None = None,
) -> Outcome:
    """Follow a started trainer until it exits, fails a limit, or `should_stop` says so (sampling its peak memory)."""
    work, proc = trainer.work, running.proc
    reports = JsonLinesTail(work / METRICS_FILE)
    deadline = time.monotonic() + limits.timeout_s
    # The time budget runs on the trainer's training clock (start-up is not training time): anchored at its first
    # report, which says how long it has trained; before that, only the timeout guards the trial.
    overrun: float | None = None
    last: Record | None = None
    held: list[Record] = []
    # Where no memory cgroup holds the trainer on a CUDA node (`sandbox.Jail.rss_watch_mb`), its memory (the sum of
    # its processes' Pss) is watched here.
    watch = running.jail.rss_watch_mb
    peak = peak if peak is not None or watch is None else PeakMemory()
    if watch is not None and peak is not None:
        peak.track_current = True
    try:
        while True:
            if peak is not None:
                peak.sample(proc.pid)
            if watch is not None and peak is not None and peak.current_mb > watch:
                running.jail.rss_breached = True
                raise Breached(
                    Breach.memory,
                    f"{_BREACH_TEXT[Breach.memory].format(policy=limits.sandbox)}: {peak.current_mb:.0f} MiB in use "
                    "(watched by the runner: no memory cgroup here, and RLIMIT_AS would stop CUDA)",
                )
            exited = proc.poll() is not None  # read the lines after checking, so none written before exit is missed
            for record in reports.read_new():
                check_finite(record)
                if limits.budget_s is not None and overrun is None:
                    trained = record.get(harness.TRAIN_SECONDS)
                    trained = float(trained) if isinstance(trained, (int, float)) else 0.0
                    overrun = time.monotonic() - trained + limits.budget_s + limits.grace_s
                if hold_from_epoch is not None and _epoch(record) >= hold_from_epoch:
                    held.append(record)
                else:
                    on_epoch(record)
                last = record
            if exited:
                break
            if should_stop():
                return Outcome(Status.stopped, last=last)
            if overrun is not None and time.monotonic() > overrun:
                return Outcome(
                    Status.stopped, budget_reason(limits), last=last, held=held[:-1] if len(held) > 1 else []
                )
            if time.monotonic() > deadline:
                raise Breached(Breach.timeout, f"train.py ran past safeguards.trial_timeout_s={limits.timeout_s:g}s")
            if running.output.exceeded:
                raise Breached(
                    Breach.output,
                    f"train.py wrote more than {limits.output_bytes} bytes to stdout/stderr "
                    "(sandbox.output_mb; the rest was dropped)",
                )
            time.sleep(POLL_S)
        if proc.returncode != 0:
            running.output.join()
            breach = classify(proc.returncode, _stderr_tail(work), running.jail, work)
            said = f"train.py exited with code {proc.returncode}: {_last_error_line(work)}"
            if breach is None:
                raise TrialFailed(said)
            raise Breached(breach, f"{_BREACH_TEXT[breach].format(policy=limits.sandbox)}; {said}")
        if last is None:
            raise TrialFailed(
                "train.py exited without reporting an epoch: call harness.report(epoch=..., ...) each epoch"
            )
    except Breached as err:
        return Outcome(Status.failed, str(err), last=last, breach=err.breach)
    except TrialFailed as err:
        return Outcome(Status.failed, str(err), last=last)
    predictions = work / PREDICTIONS_FILE
    return Outcome(
        Status.finished,
        last=last,
        held=held[:-1] if len(held) > 1 else [],
        predictions=predictions if predictions.exists() else None,
    )


BUDGET_REASON = "budget"  # the reason of a trainer stopped past its time budget (its first word)


def budget_reason(limits: Limits) -> str:
    """Why a trainer was stopped at its time budget."""
    return f"{BUDGET_REASON}: train.py ran past trial.budget_s={limits.budget_s:g}s + trial.grace_s={limits.grace_s:g}s"


class Breached(TrialFailed):
    """A failure that is a breach of the sandbox or its limits; the reason starts with the breach's name."""

    def __init__(self, breach: Breach, detail: str) -> None:
        super().__init__(f"{breach.value}: {detail}")
        self.breach = breach


_BREACH_TEXT = {
    Breach.memory: "train.py reached the memory limit (sandbox.memory_mb={policy.memory_mb})",
    Breach.processes: "train.py reached the process limit (sandbox.processes={policy.processes})",
    Breach.output: "train.py wrote a file larger than sandbox.file_size_mb={policy.file_size_mb}",
    Breach.network: "train.py tried to reach the network (sandbox.network is off)",
    Breach.forbidden_path: "train.py reached for a path outside its work dir, the public data and the harness",
    Breach.timeout: "train.py ran out of time",
}


class CappedOutput:
    """Copies the trainer's stdout and stderr to files, together at most `limit` bytes; the rest cut with a marker."""

    def __init__(self, proc: Process, work: Path, limit: int) -> None:
        self.limit, self.written, self.exceeded = limit, 0, False
        self._lock = threading.Lock()
        self._threads = [
            threading.Thread(target=self._copy, args=(stream, work / name), daemon=True)
            for stream, name in ((proc.stdout, "stdout.log"), (proc.stderr, "stderr.log"))
        ]
        for thread in self._threads:
            thread.start()

    def _copy(self, stream: IO[bytes] | None, path: Path) -> None:
        if stream is None:
            return
        with stream, path.open("wb") as out:
            while chunk := stream.read1(65536):  # type: ignore[attr-defined]
                with self._lock:
                    room = self.limit - self.written
                    keep = chunk[: max(0, room)]
                    self.written += len(keep)
                    dropping = len(keep) < len(chunk) and not self.exceeded
                    self.exceeded = self.exceeded or len(keep) < len(chunk)
                if keep:
                    out.write(keep)
                    out.flush()
                if dropping:
                    out.write(OUTPUT_MARKER.format(limit=self.limit).encode())
                    out.flush()

    def join(self, timeout: float = 2.0) -> None:
        """Wait (briefly: a leftover child may hold the pipes) until both streams are copied."""
        for thread in self._threads:
            thread.join(timeout)


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


def kill_group(proc: Process) -> None:
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


def _stderr_tail(work: Path, size: int = 4096) -> str:
    path = work / "stderr.log"
    if not path.exists():
        return ""
    with path.open("rb") as handle:
        handle.seek(max(0, path.stat().st_size - size))
        return handle.read().decode(errors="replace")


def error_tail(work: Path, count: int = 10) -> list[str]:
    """The last `count` lines of a trainer's stderr.log (the end of its traceback), the engine's own notes left out."""
    lines = [line for line in _stderr_tail(work).splitlines() if line.strip() and not line.startswith("[ralph_ray:")]
    return lines[-count:]


def _last_error_line(work: Path) -> str:
    lines = error_tail(work, 1)
    return lines[-1].strip()[:500] if lines else "no stderr"
