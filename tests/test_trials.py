"""The trial driver with real subprocesses: reports, NaN fail-fast, timeout, process-group kill, frozen check."""

from __future__ import annotations

import json
import textwrap
import time
from pathlib import Path

import pytest

from conftest import pid_alive
from ralph_ray.tasks.base import sha256_file
from ralph_ray.trials import (
    JsonLinesTail,
    PublicData,
    TrialFailed,
    TrialSpec,
    check_frozen,
    kill_group,
    materialise_data,
    prepare_workdir,
    start_trainer,
    tail_reports,
)

HEADER = "import os, sys, time, json, subprocess\nfrom ralph_ray import harness\nSLEEP = 0.0  # seconds\n"


def make_trainer(folder: Path, body: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "train.py").write_text(HEADER + textwrap.dedent(body))
    return folder


def make_spec(tmp_path: Path, timeout_s: float = 30.0, hold_from_epoch: int | None = None) -> TrialSpec:
    return TrialSpec(
        variants={}, trials_root=str(tmp_path / "trials"), data=PublicData({}, {}), harness_sha256="",
        timeout_s=timeout_s, output_limit_bytes=1 << 20, threads=1, hold_from_epoch=hold_from_epoch,
    )


def launch(tmp_path: Path, body: str, knobs: dict | None = None, timeout_s: float = 30.0, hold_from_epoch: int | None = None):
    trainer = make_trainer(tmp_path / "variant", body)
    spec = make_spec(tmp_path, timeout_s=timeout_s, hold_from_epoch=hold_from_epoch)
    work = Path(spec.trials_root) / "t1"
    prepare_workdir(trainer, work, knobs or {})
    return spec, work, start_trainer(work, spec, tmp_path / "data")


def test_reports_are_forwarded_in_order(tmp_path: Path):
    spec, work, proc = launch(tmp_path, """
        for e in range(1, 4):
            harness.report(epoch=e, val_acc=e / 10, train_loss=1.0 / e)
    """)
    seen: list[dict] = []
    try:
        last = tail_reports(proc, work, spec, seen.append)
    finally:
        kill_group(proc)
    assert [r["epoch"] for r in seen] == [1, 2, 3]
    assert last == {"epoch": 3, "val_acc": 0.3, "train_loss": pytest.approx(1 / 3)}


def test_knobs_are_rewritten_in_the_trial_copy(tmp_path: Path):
    spec, work, proc = launch(tmp_path, "harness.report(epoch=1, slept=SLEEP)\n", knobs={"SLEEP": 0.25})
    seen: list[dict] = []
    try:
        tail_reports(proc, work, spec, seen.append)
    finally:
        kill_group(proc)
    assert "SLEEP = 0.25  # seconds" in (work / "train.py").read_text()
    assert json.loads((work / "knobs.json").read_text()) == {"SLEEP": 0.25}
    assert seen[0]["slept"] == 0.25
    assert "SLEEP = 0.0" in (tmp_path / "variant" / "train.py").read_text()  # the variant itself is untouched


def test_nan_fails_fast(tmp_path: Path):
    spec, work, proc = launch(tmp_path, """
        harness.report(epoch=1, val_loss=float("nan"))
        time.sleep(60)
    """)
    start = time.monotonic()
    with pytest.raises(TrialFailed, match="non-finite val_loss"):
        try:
            tail_reports(proc, work, spec, lambda r: None)
        finally:
            kill_group(proc)
    assert time.monotonic() - start < 30
    assert proc.returncode is not None


def test_timeout_fails_and_kill_leaves_no_child(tmp_path: Path):
    spec, work, proc = launch(tmp_path, """
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
        open("child.pid", "w").write(str(child.pid))
        harness.report(epoch=1, val_acc=0.1)
        time.sleep(120)
    """, timeout_s=3)
    with pytest.raises(TrialFailed, match="timeout"):
        try:
            tail_reports(proc, work, spec, lambda r: None)
        finally:
            kill_group(proc)
    child = int((work / "child.pid").read_text())
    deadline = time.monotonic() + 5
    while pid_alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not pid_alive(child)
    assert not pid_alive(proc.pid)


def test_crash_reports_the_last_stderr_line(tmp_path: Path):
    spec, work, proc = launch(tmp_path, "raise ValueError('broken model')\n")
    with pytest.raises(TrialFailed, match="exited with code 1: ValueError: broken model"):
        try:
            tail_reports(proc, work, spec, lambda r: None)
        finally:
            kill_group(proc)


def test_no_epoch_reported_is_a_failure(tmp_path: Path):
    spec, work, proc = launch(tmp_path, "print('trained silently')\n")
    with pytest.raises(TrialFailed, match="without reporting an epoch"):
        try:
            tail_reports(proc, work, spec, lambda r: None)
        finally:
            kill_group(proc)


def test_output_limit(tmp_path: Path):
    spec, work, proc = launch(tmp_path, """
        for _ in range(4096):
            print("x" * 1024, flush=True)
        time.sleep(60)
    """)
    with pytest.raises(TrialFailed, match="output limit"):
        try:
            tail_reports(proc, work, spec, lambda r: None)
        finally:
            kill_group(proc)


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


def test_frozen_file_change_is_refused(tmp_path: Path):
    frozen_file = tmp_path / "train_x.npy"
    frozen_file.write_bytes(b"original")
    manifest = {str(frozen_file): sha256_file(frozen_file)}
    check_frozen(manifest)
    frozen_file.write_bytes(b"tampered")
    with pytest.raises(TrialFailed, match="changed since the campaign started"):
        check_frozen(manifest)
    frozen_file.unlink()
    with pytest.raises(TrialFailed, match="missing"):
        check_frozen(manifest)


def test_reports_from_the_last_rung_are_held_for_the_predictions(tmp_path: Path):
    # ASHA could stop a trial on its final epoch's report before its predictions arrive; those reports wait.
    spec, work, proc = launch(tmp_path, """
        for e in range(1, 5):
            harness.report(epoch=e, val_acc=e / 10)
    """, hold_from_epoch=3)
    seen: list[dict] = []
    try:
        last = tail_reports(proc, work, spec, seen.append)
    finally:
        kill_group(proc)
    assert [r["epoch"] for r in seen] == [1, 2]
    # The last epoch comes back with the earlier held ones, so the curve keeps every epoch.
    assert json.loads(last.pop("held_epochs")) == [{"epoch": 3, "val_acc": 0.3}]
    assert last == {"epoch": 4, "val_acc": 0.4}


def test_public_data_is_materialised_once_per_node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("RALPH_CACHE_DIR", str(tmp_path / "cache"))
    files = {"train_x.npy": b"abc", "meta.json": b"{}"}
    data = PublicData(files, {name: __import__("hashlib").sha256(content).hexdigest() for name, content in files.items()})
    first = materialise_data(data)
    assert {p.name: p.read_bytes() for p in first.iterdir()} == files
    (first / "train_x.npy").touch()
    assert materialise_data(data) == first  # reused, not rewritten
    check_frozen({str(first / name): digest for name, digest in data.hashes.items()})
