"""The background breeder: its CPU priority (its thread, and the processes it starts, the gate's smoke runs, run
nicer than the trials, while the driver's other threads keep theirs), and how it rests when out of ideas."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
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


def _pool_with_a_child_out() -> tuple:
    """A judged seed whose every idea is known, and one child (gen 2) queued, its trial not finished yet."""
    from test_popsearch import finish, member, pool

    p = pool(parents=1)
    p.add(member("seed", None, 1))
    finish(p, "t1", p.suggest("t1"), 0.90)
    p.add(member("child", "seed", 2))
    return p, finish, p.suggest("t2")


def _breeder(p, grow) -> tuple:
    from ralph_ray.breeder import BackgroundBreeder, BreedingPlan

    plan = BreedingPlan(
        ahead=2, children_budget=100, max_generation=100, parents=1, explore=0.0, one_per_lineage=True, seed=0
    )
    logged: list[str] = []
    return BackgroundBreeder(p, plan, 0, grow, logged.append), logged


def test_out_of_ideas_it_waits_for_a_child_still_out_and_breeds_from_it_once_it_leads():
    # With one parent, the seed's ideas ran out while its first child's trial was still out; that child scored
    # best a moment later. Breeding must go on from it (it used to end for good at the fourth empty pick).
    p, finish, child_trial = _pool_with_a_child_out()
    picked: list[str] = []
    bred_from_child = threading.Event()

    def grow(parent, generation):  # no new child from any parent: the test asks whom it breeds from, and when
        picked.append(parent.variant_id)
        if parent.variant_id == "child":
            bred_from_child.set()
        return []

    breeder, logged = _breeder(p, grow)
    breeder.start()
    deadline = time.monotonic() + 10
    while len(picked) < 4 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.3)
    assert picked == ["seed"] * 4 and not breeder.done  # resting, not ended: the child's trial is still out
    assert any("waiting for the trials out" in line for line in logged)
    finish(p, "t2", child_trial, 0.93)  # the child scores best: a would-be parent not tried out
    assert bred_from_child.wait(10), logged
    assert any("child became a would-be parent; breeding again" in line for line in logged)
    breeder.stop()
    breeder.join(10)


def test_out_of_ideas_with_no_trial_out_breeding_ends():
    p, finish, child_trial = _pool_with_a_child_out()
    finish(p, "t2", child_trial, 0.85)  # judged, and below the seed: no new would-be parent can come
    breeder, logged = _breeder(p, lambda parent, generation: [])
    breeder.start()
    breeder.join(10)
    assert not breeder.is_alive() and breeder.done and breeder.out_of_ideas
    assert logged == ["  breeder: no trial still out can add a parent; breeding ends"]  # nothing to wait for
