"""The trial driver: one Tune trial = the variant's train.py in its own work dir and process group.

It copies the variant's files, rewrites the sampled knobs, runs `train.py` as a subprocess, tails its
JSON-lines reports into `ray.tune.report`, enforces the timeout and output limit, fails fast on NaN/inf,
scores the predictions with the frozen metric, and always kills the whole process group in `finally`
(which is what makes `reuse_actors` safe).
"""

from __future__ import annotations

import ctypes
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ralph_ray import harness
from ralph_ray.knobs import KnobError, rewrite_knobs
from ralph_ray.scoring import ScoringError, score_predictions
from ralph_ray.tasks.base import Labels, sha256_file

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
class TrialSpec:
    """Everything a trial needs besides its sampled knobs; shipped once through the object store."""

    trainer_dir: str
    trials_root: str
    data_dir: str
    frozen: dict[str, str]  # path -> sha256, checked before every trial
    labels: Labels
    timeout_s: float
    output_limit_bytes: int
    threads: int
    seed: int = 0
    entry: str = "train.py"
    env: dict[str, str] = field(default_factory=dict)


def run_trial(config: dict[str, Any], spec: TrialSpec) -> None:
    """Tune function trainable: run one trial to completion, stop or failure."""
    from ray import tune

    trial_id = tune.get_context().get_trial_id() or "manual"
    work = Path(spec.trials_root) / trial_id
    check_frozen(spec.frozen)
    knobs = {key: value for key, value in config.items() if key.isupper()}
    prepare_workdir(Path(spec.trainer_dir), work, knobs, entry=spec.entry)
    proc = start_trainer(work, spec)
    try:
        last = tail_reports(proc, work, spec, tune.report)
        if last is None:
            return  # Tune stopped the trial (ASHA or a stop rule)
        try:
            scores = score_predictions(work / "predictions.npz", spec.labels)
        except ScoringError as err:
            raise TrialFailed(str(err)) from None
        tune.report({**last, "selection_score": scores.selection, "test_score": scores.test})
    finally:
        kill_group(proc)


def check_frozen(frozen: dict[str, str]) -> None:
    """Refuse to run if any frozen file (data, harness) differs from its hash at campaign start."""
    for path, expected in frozen.items():
        if not Path(path).exists():
            raise TrialFailed(f"frozen file {path} is missing")
        if sha256_file(Path(path)) != expected:
            raise TrialFailed(f"frozen file {path} changed since the campaign started")


def prepare_workdir(trainer_dir: Path, work: Path, knobs: dict[str, Any], entry: str = "train.py") -> None:
    """Copy the variant's files into the trial's work dir and write the sampled knobs into its code."""
    if work.exists():
        shutil.rmtree(work)  # a retried trial starts from a clean copy
    shutil.copytree(trainer_dir, work, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    source = (work / entry).read_text()
    try:
        (work / entry).write_text(rewrite_knobs(source, knobs))
    except (KnobError, SyntaxError) as err:
        raise TrialFailed(f"cannot set knobs {sorted(knobs)}: {err}") from None
    (work / "knobs.json").write_text(json.dumps(knobs, indent=2, sort_keys=True, default=str))


def start_trainer(work: Path, spec: TrialSpec) -> subprocess.Popen[bytes]:
    """Start train.py in its own process group, with its threads capped and its output to files."""
    threads = str(max(1, spec.threads))
    env = {
        **os.environ,
        **spec.env,
        harness.ENV_DATA_DIR: spec.data_dir,
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
