"""The Ray-free trial runner with real subprocesses: reports, predictions, NaN, timeout, output flood, crashes.

The runner's own logic runs here without bubblewrap (host pids stay visible to the test); tests/test_sandbox.py
runs hostile trainers inside it."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
from procs import pid_alive

from ralph_ray.runner import JsonLinesTail, Limits, Status, Trainer, TrialFailed, run
from ralph_ray.sandbox import Policy, SandboxMode
from ralph_ray.workdir import prepare_workdir

PLAIN = Policy(SandboxMode.none)  # the limits (cgroups, rlimits) without the isolation
HEADER = (
    "import os, sys, time, json, subprocess\nimport numpy as np\nfrom ralph_ray import harness\n"
    "SLEEP = 0.0  # seconds\n"
)


def trainer(tmp_path: Path, body: str, knobs: dict | None = None) -> Trainer:
    """A trainer folder written by the test, prepared into a work dir as a trial's would be."""
    folder = tmp_path / "variant"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "train.py").write_text(HEADER + textwrap.dedent(body))
    work = tmp_path / "trials" / "t1"
    prepare_workdir(folder, work, knobs or {})
    return Trainer(work, tmp_path / "data")


def metrics(record: dict | None) -> dict:
    """A report without the harness's own bookkeeping keys (the training seconds it adds)."""
    return {key: value for key, value in (record or {}).items() if key != "train_seconds"}


def test_runner_does_not_import_ray():
    probe = (
        "import sys, ralph_ray.runner, ralph_ray.workdir; "
        "print(any(m == 'ray' or m.startswith('ray.') for m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


def test_two_epochs_and_predictions(tmp_path: Path):
    job = trainer(
        tmp_path,
        """
        for e in range(1, 3):
            harness.report(epoch=e, val_acc=e / 10, train_loss=1.0 / e)
        harness.save_predictions(selection=np.array([1, 2]), test=np.array([3]))
    """,
    )
    seen: list[dict] = []
    outcome = run(job, Limits(sandbox=PLAIN, timeout_s=30), seen.append)
    assert outcome.status is Status.finished and outcome.reason is None
    assert [r["epoch"] for r in seen] == [1, 2]
    assert metrics(outcome.last) == {"epoch": 2, "val_acc": 0.2, "train_loss": 0.5}
    assert outcome.predictions == job.work / "predictions.npz"
    with np.load(outcome.predictions) as saved:
        assert saved["selection"].tolist() == [1, 2] and saved["test"].tolist() == [3]


def test_no_predictions_is_left_to_the_caller(tmp_path: Path):
    outcome = run(trainer(tmp_path, "harness.report(epoch=1, val_acc=0.5)\n"), Limits(sandbox=PLAIN, timeout_s=30))
    assert outcome.status is Status.finished and outcome.predictions is None


def test_knobs_are_rewritten_in_the_trial_copy(tmp_path: Path):
    job = trainer(tmp_path, "harness.report(epoch=1, slept=SLEEP)\n", knobs={"SLEEP": 0.25})
    seen: list[dict] = []
    run(job, Limits(sandbox=PLAIN, timeout_s=30), seen.append)
    assert "SLEEP = 0.25  # seconds" in (job.work / "train.py").read_text()
    assert json.loads((job.work / "knobs.json").read_text()) == {"SLEEP": 0.25}
    assert seen[0]["slept"] == 0.25
    assert "SLEEP = 0.0" in (tmp_path / "variant" / "train.py").read_text()  # the variant itself is untouched


def test_nan_fails_fast(tmp_path: Path):
    job = trainer(
        tmp_path,
        """
        harness.report(epoch=1, val_loss=float("nan"))
        time.sleep(60)
    """,
    )
    start = time.monotonic()
    outcome = run(job, Limits(sandbox=PLAIN, timeout_s=30))
    assert outcome.status is Status.failed and "non-finite val_loss" in (outcome.reason or "")
    assert time.monotonic() - start < 30


def test_timeout_fails_and_leaves_no_child(tmp_path: Path):
    job = trainer(
        tmp_path,
        """
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
        open("child.pid", "w").write(str(child.pid))
        harness.report(epoch=1, val_acc=0.1)
        time.sleep(120)
    """,
    )
    outcome = run(job, Limits(sandbox=PLAIN, timeout_s=3))
    assert outcome.status is Status.failed and (outcome.reason or "").startswith("timeout")
    assert metrics(outcome.last) == {"epoch": 1, "val_acc": 0.1}
    child = int((job.work / "child.pid").read_text())
    deadline = time.monotonic() + 5
    while pid_alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not pid_alive(child)


def test_output_flood_is_stopped(tmp_path: Path):
    job = trainer(
        tmp_path,
        """
        for _ in range(4096):
            print("x" * 1024, flush=True)
        time.sleep(60)
    """,
    )
    outcome = run(job, Limits(sandbox=PLAIN, timeout_s=30, output_bytes=1 << 20))
    assert outcome.status is Status.failed and (outcome.reason or "").startswith("output:")


def test_crash_reports_the_last_stderr_line(tmp_path: Path):
    outcome = run(trainer(tmp_path, "raise ValueError('broken model')\n"), Limits(sandbox=PLAIN, timeout_s=30))
    assert outcome.status is Status.failed
    assert "exited with code 1: ValueError: broken model" in (outcome.reason or "")


def test_no_epoch_reported_is_a_failure(tmp_path: Path):
    outcome = run(trainer(tmp_path, "print('trained silently')\n"), Limits(sandbox=PLAIN, timeout_s=30))
    assert outcome.status is Status.failed and "without reporting an epoch" in (outcome.reason or "")


def test_a_stop_request_ends_the_run(tmp_path: Path):
    job = trainer(
        tmp_path,
        """
        harness.report(epoch=1, val_acc=0.1)
        time.sleep(60)
    """,
    )
    seen: list[dict] = []
    start = time.monotonic()
    outcome = run(job, Limits(sandbox=PLAIN, timeout_s=60), seen.append, should_stop=lambda: bool(seen))
    assert outcome.status is Status.stopped and time.monotonic() - start < 30


def test_reports_from_the_last_rung_are_held_for_the_predictions(tmp_path: Path):
    # ASHA could stop a trial on its final epoch's report before its predictions arrive; those reports wait.
    job = trainer(
        tmp_path,
        """
        for e in range(1, 5):
            harness.report(epoch=e, val_acc=e / 10)
    """,
    )
    seen: list[dict] = []
    outcome = run(job, Limits(sandbox=PLAIN, timeout_s=30), seen.append, hold_from_epoch=3)
    assert [r["epoch"] for r in seen] == [1, 2]
    assert [metrics(r) for r in outcome.held] == [
        {"epoch": 3, "val_acc": 0.3}
    ]  # the earlier held epochs ride along with the last
    assert metrics(outcome.last) == {"epoch": 4, "val_acc": 0.4}


def test_tail_waits_for_whole_lines(tmp_path: Path):
    path = tmp_path / "metrics.jsonl"
    tail = JsonLinesTail(path)
    assert tail.read_new() == []
    path.write_text('{"epoch": 1, "val_acc": 0.5}\n{"epoch": 2, "va')
    assert tail.read_new() == [{"epoch": 1, "val_acc": 0.5}]
    with path.open("a") as handle:
        handle.write('l_acc": 0.6}\n')
    assert tail.read_new() == [{"epoch": 2, "val_acc": 0.6}]


def test_tail_rejects_garbage(tmp_path: Path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("not json\n")
    with pytest.raises(TrialFailed, match="not JSON"):
        JsonLinesTail(path).read_new()
