"""Chaos: a multi-cycle digits campaign on a 3-node local cluster while a killer removes worker nodes.

Every 10 s the killer removes a random worker node with probability p (SIGKILL of all its processes, as
Ray's own chaos tests do; p = 0.03 is their rate) and a fresh node joins in its place, as a replacement
machine would (`ray start --address=...`; each worker node is such a process group, killed whole). Each node has its
own data cache and work folder; checkpoints go through Tune's storage
(`paths.storage`), so a trial lost with its node resumes from its last epoch on another (up to
`safeguards.max_failures` times). Reported: trials finished / trials started (goal 100%) and knowledge-base
rows lost or doubled (goal 0), per p. A higher p is run too, for a visible effect.

Trials started are read from the trial driver's node.json files (one per attempt, in every node's work
folder, which outlives the node on this machine); rows from the KB.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from _common import save

from ralph_ray.raycluster import set_ray_env

set_ray_env()
# Clusters of our own, with a Ray temp dir of their own (short: socket paths live under it): their session files
# and address file (ray_current_cluster) never meet another Ray on this machine.
os.environ.setdefault("RAY_TMPDIR", tempfile.mkdtemp(prefix="rb", dir="/tmp"))

from ray.cluster_utils import Cluster  # noqa: E402

from ralph_ray import sql  # noqa: E402
from ralph_ray.campaign import run  # noqa: E402
from ralph_ray.config import load_config  # noqa: E402
from ralph_ray.kb import open_reader  # noqa: E402
from ralph_ray.raycluster import ensure_ray  # noqa: E402

PERIOD_S = 10.0
FAULT = re.compile(r"actor|node|died|worker", re.IGNORECASE)  # Ray's words for a lost actor or node
RATES = (0.03, 0.5)
SEED = 0
MAX_T = 20
CYCLES = 6
CAMPAIGN = [
    "agent=heuristic",
    f"safeguards.max_cycles={CYCLES}",
    "safeguards.plateau_cycles=5",
    "population.parents=1",
    "population.children_per_parent=2",
    "population.trials_per_child=2",
    "search.num_samples=4",
    "search.max_concurrent=2",
    f"scheduler.max_t={MAX_T}",
    "scheduler.grace_period=4",
    "safeguards.trial_timeout_s=300",
    f"+search.space.EPOCHS={{type: choice, values: [{MAX_T}]}}",
    "safeguards.max_failures=3",
]


def start_cluster(out: Path, names: list[str], cpus: int = 1) -> tuple[Cluster, dict[str, Any]]:
    """A head without CPUs (the driver's node) plus named worker nodes, each with its own cache and work folder."""
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    nodes = {name: add_node(cluster, out, name, cpus) for name in names}
    cluster.wait_for_nodes()
    return cluster, nodes


def add_node(cluster: Cluster, out: Path, name: str, cpus: int = 1) -> Any:
    env = {"RALPH_CACHE_DIR": str(out / name / "cache"), "RALPH_WORK_DIR": str(out / name / "work")}
    return cluster.add_node(num_cpus=cpus, env_vars=env)


def stop_cluster(cluster: Cluster) -> None:
    """Disconnect the driver, then take every node down."""
    import ray

    ray.shutdown()
    cluster.shutdown()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class WorkerNode:
    """A worker node that joins like a machine would (`ray start --address --block`), in its own process group."""

    def __init__(self, address: str, out: Path, name: str) -> None:
        env = {**os.environ, "RALPH_CACHE_DIR": str(out / name / "cache"), "RALPH_WORK_DIR": str(out / name / "work")}
        self.name = name
        # The dashboard agent's port defaults to a fixed one: two nodes on one machine need their own.
        self.proc = subprocess.Popen(
            [
                str(Path(sys.executable).parent / "ray"),
                "start",
                f"--address={address}",
                "--num-cpus=1",
                f"--dashboard-agent-listen-port={free_port()}",
                "--disable-usage-stats",
                "--block",
            ],
            env=env,
            start_new_session=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def kill(self) -> None:
        """SIGKILL the whole node (raylet, workers, agents) at once: a machine that vanishes."""
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


class Killer(threading.Thread):
    """Every PERIOD_S, with probability p: kill a random worker node, then let a fresh one join."""

    def __init__(self, address: str, nodes: list[WorkerNode], out: Path, p: float, rng: random.Random) -> None:
        super().__init__(daemon=True)
        self.address, self.nodes, self.out, self.p, self.rng = address, nodes, out, p, rng
        self.kills: list[dict[str, Any]] = []
        self.done = threading.Event()
        self.joined = len(nodes)

    def run(self) -> None:
        start = time.monotonic()
        while not self.done.wait(PERIOD_S):
            if self.rng.random() >= self.p:
                continue
            victim = self.rng.choice(self.nodes)
            victim.kill()
            self.nodes.remove(victim)
            self.joined += 1
            self.nodes.append(WorkerNode(self.address, self.out, f"node{self.joined}"))
            self.kills.append(
                {"at_s": round(time.monotonic() - start, 1), "node": victim.name, "replaced_by": self.nodes[-1].name}
            )


def wait_for_nodes(count: int, timeout_s: float = 120) -> None:
    import ray

    deadline = time.monotonic() + timeout_s
    while sum(node["Alive"] for node in ray.nodes()) < count:
        assert time.monotonic() < deadline, f"fewer than {count} nodes joined"
        time.sleep(0.5)


def chaos_run(root: Path, p: float) -> dict[str, Any]:
    out = root / f"p{p}"
    cluster, _ = start_cluster(out, [])
    ensure_ray(cluster=load_config(["cluster=address", f"cluster.address={cluster.address}"]).cluster)
    workers = []
    for i in (1, 2):  # one after the other: nodes starting at once on one machine race for their socket names
        workers.append(WorkerNode(cluster.address, out, f"node{i}"))
        wait_for_nodes(1 + i)
    killer = Killer(cluster.address, workers, out, p, random.Random(SEED))
    cfg = load_config(
        [
            "cluster=address",
            f"cluster.address={cluster.address}",
            f"paths.runs={out / 'runs'}",
            f"paths.kb={out / 'kb'}",
            f"paths.storage=file://{out / 'storage'}",
            "population.mode=generations",  # one barrier cycle, as recorded
            f"run_id=chaos-p{p}",
            *CAMPAIGN,
        ]
    )
    start = time.perf_counter()
    killer.start()
    try:
        outcome = run(cfg)
    finally:
        killer.done.set()
        killer.join()
    wall = time.perf_counter() - start
    attempts = [
        json.loads(path.read_text()) | {"trial_id": path.parent.name} for path in out.glob("*/work/**/node.json")
    ]
    for node in killer.nodes:
        node.kill()
    stop_cluster(cluster)

    con = open_reader(out / "kb")
    run_id = f"chaos-p{p}"
    rows = con.execute(sql.BENCH_TRIAL_ENDS, [run_id]).fetchall()
    started = {a["trial_id"] for a in attempts}
    recorded = {r[0] for r in rows}
    # A trial ends as completed, stopped early by ASHA, or failed by its own trainer (a child that diverges):
    # all finished. Lost to the faults: a trial whose retries ran out (Tune's error: its actor or node died).
    lost = [r for r in rows if r[1] == "failed" and FAULT.search(r[3] or "")]
    finished = [r for r in rows if r not in lost]
    epoch_rows = con.execute(sql.BENCH_EPOCH_ROWS, [run_id]).fetchall()
    # Reported epochs: every one below max_t, then the last (the trial driver holds the rest for the predictions).
    seen = {(t, e) for t, e, _, _ in epoch_rows}
    missing_epochs = sum(
        1
        for trial_id, _, epochs, _ in rows
        for e in set(range(1, min(epochs, MAX_T - 1) + 1)) | {epochs}
        if epochs and (trial_id, e) not in seen
    )
    return {
        "p": p,
        "exit_code": int(outcome.exit_code),
        "stop_reason": outcome.stop_reason,
        "wall_s": round(wall, 1),
        "kills": killer.kills,
        "nodes_killed": len(killer.kills),
        "trials_started": len(started),
        "trials_finished": len(finished),
        "finished_over_started": round(len(finished) / len(started), 3),
        "trials_lost_to_faults": len(lost),
        "trials_failed": sorted((r[0], r[3]) for r in rows if r[1] == "failed"),
        "attempts": len(attempts),
        "trials_retried": len(attempts) - len(started),
        "resumed_from_checkpoint": sum(a["restored_checkpoint"] for a in attempts),
        "kb_trial_rows_lost": len(started - recorded),
        "kb_trial_rows_doubled": len(rows) - len(recorded),
        "kb_epoch_rows_doubled": sum(c - 1 for *_, c in epoch_rows if c > 1),
        "kb_epochs_missing": missing_epochs,
    }


def main() -> None:
    rates = tuple(float(a) for a in sys.argv[1:]) or RATES
    root = Path(tempfile.mkdtemp(prefix="bench-chaos-"))
    results = [chaos_run(root, p) for p in rates]
    lines = [
        f"chaos: {CYCLES}-cycle digits campaign (heuristic agent, {MAX_T}-epoch trials) on a head + 2 worker nodes; "
        "every "
        f"{PERIOD_S:.0f} s a worker node is killed with probability p and replaced; checkpoints via paths.storage, "
        "safeguards.max_failures=3"
    ]
    for r in results:
        lines.append(
            f"  p={r['p']:<5} {r['nodes_killed']} node(s) killed in {r['wall_s']:.0f} s "
            f"(expected {r['p'] * r['wall_s'] / PERIOD_S:.1f}); trials finished/started "
            f"{r['trials_finished']}/{r['trials_started']} ({100 * r['finished_over_started']:.0f}%), "
            f"{r['trials_retried']} "
            f"retried after a kill, {r['resumed_from_checkpoint']} of them from a checkpoint; KB rows lost "
            f"{r['kb_trial_rows_lost']}, "
            f"doubled {r['kb_trial_rows_doubled']} (epoch rows doubled {r['kb_epoch_rows_doubled']}, missing "
            f"{r['kb_epochs_missing']}); "
            f"exit {r['exit_code']} ({r['stop_reason']})"
        )
    save("chaos", {"period_s": PERIOD_S, "seed": SEED, "campaign": CAMPAIGN, "runs": results}, lines)


if __name__ == "__main__":
    main()
