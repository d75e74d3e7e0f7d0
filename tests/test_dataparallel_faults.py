"""A data-parallel trial loses a worker: Ray Train restarts the whole group from its last checkpoint, the trial
finishes, and no process of the lost group (Ray workers, trainers, a trainer's own child) survives."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
from procs import pid_alive
from taskdirs import DIGITS_TASK, digits_task

from ralph_ray import sandbox
from ralph_ray.campaign import run
from ralph_ray.config import load_config
from ralph_ray.dataparallel import rank_dir
from ralph_ray.kb import open_reader

WAITING = "waiting"  # in rank 1's work dir: its first attempt reached epoch 2 and waits to be killed

# The first attempt (no checkpoint restored) of rank 1 starts a child and hangs at epoch 2, until the test kills its
# Ray Train worker; the restarted group resumes from epoch 1's checkpoint and runs to the end.
HANG = """        if epoch < first_epoch:
            continue  # trained before this trial was retried on another node
        if epoch == 2 and harness.rank() == 1 and first_epoch == 1:
            import subprocess

            subprocess.Popen(["sleep", "600"])  # the trainer's own child: it must die with the group
            open("waiting", "w").close()
            time.sleep(120)
"""


def hanging_trainer(folder: Path) -> Path:
    source = (DIGITS_TASK / "train.py").read_text()
    old = HANG.split("        if epoch == 2")[0]
    assert old in source, "the digits seed's resume loop changed: update HANG"
    return digits_task(folder, source.replace(old, HANG))


def checkpoint_registered(runs: Path, trial_id: str) -> bool:
    """Ray Train holds a checkpoint of the trial: it registers a report at its next poll of the workers (every 2 s),
    and a group lost before that poll loses the reports since the last one (then the restart starts afresh)."""
    for snapshot in runs.glob(f"**/*_workers/{trial_id}/checkpoint_manager_snapshot.json"):
        if json.loads(snapshot.read_text()).get("latest_checkpoint_result"):
            return True
    return False


def kill_waiting_worker(runs: Path, group: list[int], killed: list[int], timeout_s: float = 240) -> None:
    """When rank 1 waits and epoch 1's checkpoint is Ray Train's, note every process of the group (both Ray workers
    and what they started), then SIGKILL rank 1's Ray Train worker, as the kernel's OOM killer would."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = sorted(runs.glob(f"**/*.rank1/{WAITING}"))
        rank0 = found[0].parent.with_name(found[0].parent.name.removesuffix(".rank1")) if found else None
        if rank0 is not None and checkpoint_registered(runs, rank0.name):
            rank1 = found[0].parent
            actors = [json.loads((folder / "node.json").read_text())["pid"] for folder in (rank0, rank1)]
            time.sleep(0.5)  # the trainer's child has started (it did before the file was written)
            group.extend(actors)
            group.extend(child.pid for pid in actors for child in psutil.Process(pid).children(recursive=True))
            os.kill(actors[1], signal.SIGKILL)
            killed.append(actors[1])
            return
        time.sleep(0.2)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["none", "bwrap"])
def test_a_killed_worker_restarts_the_group_from_its_checkpoint_and_leaves_no_process(
    ray_session, tmp_path: Path, mode: str
):
    if mode == "bwrap" and sandbox.available() is not None:
        pytest.skip(f"bubblewrap cannot run here: {sandbox.available()}")
    if mode == "none" and sandbox._cgroup_parent("pids") is None:
        pytest.skip("no cgroup to make here: sandbox=none cannot find a lost worker's orphans")
    task = hanging_trainer(tmp_path / "task")
    overrides = [
        f"paths.runs={tmp_path / 'runs'}",
        f"paths.kb={tmp_path / 'kb'}",
        f"task.trainer={task}",
        "run_id=lost",
        "agent=none",
        "safeguards.max_cycles=1",
        "safeguards.replicates=0",
        "safeguards.max_failures=1",
        "safeguards.trial_timeout_s=200",
        "search.num_samples=1",
        "search.max_concurrent=1",
        "scheduler=fifo",
        "scheduler.max_t=3",
        "+search.space.EPOCHS={type: choice, values: [3]}",
        "resources.workers_per_trial=2",
        f"sandbox={mode}",
    ]
    group: list[int] = []
    killed: list[int] = []
    killer = threading.Thread(target=kill_waiting_worker, args=(tmp_path / "runs", group, killed), daemon=True)
    killer.start()
    outcome = run(load_config(overrides))
    killer.join(timeout=5)
    assert killed, "rank 1 never reached epoch 2"
    assert outcome.exit_code == 0

    con = open_reader(tmp_path / "kb")
    status, epochs, score, work = con.execute(
        "select status, epochs, selection_score, work_dir from trials where run_id = 'lost'"
    ).fetchone()
    assert (status, epochs) == ("completed", 3) and score > 0.5
    curve = con.execute("select epoch from epochs where run_id = 'lost' and metric = 'val_acc' order by epoch")
    assert [epoch for (epoch,) in curve.fetchall()] == [1, 2, 3]  # each epoch once: the restart's, not twice
    # The second attempt: both ranks in fresh Ray workers, resumed from epoch 1's checkpoint, rank 1 past epoch 2.
    restarted = [json.loads((rank_dir(Path(work), rank) / "node.json").read_text()) for rank in (0, 1)]
    assert all(info["restored_checkpoint"] for info in restarted)
    assert killed[0] not in {info["pid"] for info in restarted}
    assert not (rank_dir(Path(work), 1) / WAITING).exists()
    lines = (rank_dir(Path(work), 1) / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["epoch"] for line in lines] == [2, 3]

    assert len(group) >= 5  # two Ray workers, two trainers, the hanging trainer's child (and sandboxes, warm servers)
    deadline = time.monotonic() + 30
    while any(pid_alive(pid) for pid in group) and time.monotonic() < deadline:
        time.sleep(0.5)
    left = [f"{pid} {psutil.Process(pid).cmdline()[:3]}" for pid in group if pid_alive(pid)]
    assert not left, f"processes of the lost group survived: {left}"


ORPHAN_MAKER = """
import os, subprocess, sys
from pathlib import Path
from ralph_ray.sandbox import Jail, Policy, SandboxMode, View
jail = Jail(Policy(mode=SandboxMode.none), View(writable=(Path(sys.argv[1]),)))
quiet = subprocess.DEVNULL  # the orphan keeps no pipe of ours open
child = subprocess.Popen(["sleep", "600"], preexec_fn=jail.enter, start_new_session=True, stdout=quiet, stderr=quiet)
print(child.pid, flush=True)
os._exit(0)  # as a SIGKILLed Ray worker: no jail.close()
"""


def test_the_next_jail_kills_what_a_dead_engine_process_left_in_its_cgroups(tmp_path: Path):
    if sandbox._cgroup_parent("pids") is None:
        pytest.skip("no cgroup to make here")
    made = subprocess.run(
        [sys.executable, "-c", ORPHAN_MAKER, str(tmp_path)], capture_output=True, text=True, timeout=60, check=True
    )
    orphan = int(made.stdout)
    assert pid_alive(orphan)  # outlived the process that started it, as a trainer's child outlives a lost worker
    assert sandbox.reap_orphans() >= 1
    assert not pid_alive(orphan)
