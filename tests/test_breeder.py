"""The background breeder's CPU priority: its thread, and the processes it starts (the gate's smoke runs), run
nicer than the trials, while the driver's other threads keep theirs."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from ralph_ray.breeder import lower_priority


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread niceness is Linux's")
def test_the_breeder_thread_and_what_it_starts_run_nicer_than_the_trials():
    seen: dict[str, int] = {}
    logged: list[str] = []

    def breeder() -> None:
        tid = threading.get_native_id()
        before = os.getpriority(os.PRIO_PROCESS, tid)
        seen["expected"] = min(19, before + 5) - before  # a test run already at nice 15+ is clamped at 19
        lower_priority(5, logged.append)
        seen["thread"] = os.getpriority(os.PRIO_PROCESS, tid) - before
        child = subprocess.run([sys.executable, "-c", "import os; print(os.nice(0))"], capture_output=True, text=True)
        seen["subprocess"] = int(child.stdout) - before

    main_before = os.nice(0)
    thread = threading.Thread(target=breeder)
    thread.start()
    thread.join()
    assert seen["expected"] > 0 and seen["thread"] == seen["subprocess"] == seen["expected"]
    assert not logged
    assert os.nice(0) == main_before  # the driver's own thread (Tune's loop, the records) keeps its priority


def test_nice_zero_leaves_the_priority_alone():
    tid = threading.get_native_id()
    before = os.getpriority(os.PRIO_PROCESS, tid)
    lower_priority(0, lambda line: pytest.fail(line))
    assert os.getpriority(os.PRIO_PROCESS, tid) == before


def test_trials_on_a_local_ray_keep_the_drivers_priority_so_the_breeder_is_the_nicer(ray_session):
    import ray

    @ray.remote(num_cpus=0)
    def niceness() -> int:
        return os.nice(0)

    # Ray's own default starts workers 15 nicer than the driver: the breeder (at +10) would then outrank the trials.
    assert ray.get(niceness.remote()) == os.nice(0)


@pytest.mark.skipif(not Path("/proc/self/autogroup").exists(), reason="no scheduler autogroups on this kernel")
def test_a_trainer_started_by_the_breeder_gets_a_nicer_autogroup_than_the_trials(tmp_path: Path):
    # Each trainer is a session of its own, so a scheduler autogroup of its own, where only the group's nice weighs
    # against the trials: the breeder's gate smoke runs must carry its niceness there too.
    from ralph_ray.runner import Limits, Status, Trainer, run
    from ralph_ray.sandbox import Policy, SandboxMode

    (tmp_path / "train.py").write_text(
        "from pathlib import Path\nfrom ralph_ray import harness\n"
        "Path('group.txt').write_text(Path('/proc/self/autogroup').read_text())\nharness.report(epoch=1, val_acc=0.5)\n"
    )
    outcomes = {}

    def start(name: str, nice: int) -> None:
        lower_priority(nice, pytest.fail)
        work = tmp_path / name
        work.mkdir()
        (work / "train.py").write_text((tmp_path / "train.py").read_text())
        outcomes[name] = run(Trainer(work, tmp_path), Limits(60, sandbox=Policy(SandboxMode.none)))

    for name, nice in (("breeder", 5), ("trial", 0)):
        thread = threading.Thread(target=start, args=(name, nice))
        thread.start()
        thread.join()
    assert all(o.status is Status.finished for o in outcomes.values()), outcomes
    base = os.nice(0)
    assert (tmp_path / "breeder" / "group.txt").read_text().split()[-1] == str(min(19, base + 5))
    assert (tmp_path / "trial" / "group.txt").read_text().split()[-1] == "0"
