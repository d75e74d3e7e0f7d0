"""Chaos: a multi-cycle digits campaign on a 3-node local cluster while a killer removes worker nodes.

Every 10 s the killer removes a random worker node with probability p (SIGKILL of all its processes, as
Ray's own chaos tests do; p = 0.03 is their rate) and a fresh node joins in its place, as a replacement
machine would. Each node has its own data cache and work folder; checkpoints go through Tune's storage
(`paths.storage`), so a trial lost with its node resumes from its last epoch on another (up to
`safeguards.max_failures` times). Reported: trials finished / trials started (goal 100%) and knowledge-base
rows lost or doubled (goal 0), per p. A higher p is run too, for a visible effect.

Trials started are read from the trial driver's node.json files (one per attempt, in every node's work
folder, which outlives the node on this machine); rows from the KB.
"""

from __future__ import annotations

import json
import random
import re
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from _common import save

from ralph_ray.raycluster import set_ray_env

set_ray_env()

from ray.cluster_utils import Cluster  # noqa: E402

from ralph_ray.campaign import run  # noqa: E402
from ralph_ray.config import load_config  # noqa: E402
from ralph_ray.kb import open_reader  # noqa: E402

PERIOD_S = 10.0
FAULT = re.compile(r"actor|node|died|worker", re.IGNORECASE)  # Ray's words for a lost actor or node
RATES = (0.03, 0.3)
SEED = 0
CAMPAIGN = ["agent=heuristic", "safeguards.max_cycles=3", "safeguards.plateau_cycles=5", "population.parents=1",
            "population.children_per_parent=2", "population.trials_per_child=2", "search.num_samples=4", "search.max_concurrent=2",
            "scheduler.max_t=8", "scheduler.grace_period=2", "safeguards.trial_timeout_s=300",
            "+search.space.EPOCHS={type: choice, values: [8]}", "safeguards.max_failures=3"]


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


class Killer(threading.Thread):
    """Every PERIOD_S, with probability p: remove a random worker node, then let a fresh one join."""

    def __init__(self, cluster: Cluster, nodes: dict[str, Any], out: Path, p: float, rng: random.Random) -> None:
        super().__init__(daemon=True)
        self.cluster, self.nodes, self.out, self.p, self.rng = cluster, nodes, out, p, rng
        self.kills: list[dict[str, Any]] = []
        self.done = threading.Event()

    def run(self) -> None:
        start = time.monotonic()
        while not self.done.wait(PERIOD_S):
            if self.rng.random() >= self.p:
                continue
            victim = self.rng.choice(sorted(self.nodes))
            running = [m.parent.name for m in (self.out / victim / "work").rglob("metrics.jsonl") if not (m.parent / "predictions.npz").exists()]
            self.cluster.remove_node(self.nodes.pop(victim), allow_graceful=False)
            fresh = f"node{len(self.kills) + len(self.nodes) + 1}"
            self.nodes[fresh] = add_node(self.cluster, self.out, fresh)
            self.kills.append({"at_s": round(time.monotonic() - start, 1), "node": victim, "replaced_by": fresh, "trials_running": running})


def chaos_run(root: Path, p: float) -> dict[str, Any]:
    out = root / f"p{p}"
    cluster, nodes = start_cluster(out, ["node1", "node2"])
    killer = Killer(cluster, nodes, out, p, random.Random(SEED))
    cfg = load_config(["cluster=address", f"cluster.address={cluster.address}", f"paths.runs={out / 'runs'}", f"paths.kb={out / 'kb'}",
                       f"paths.storage=file://{out / 'storage'}", f"run_id=chaos-p{p}", *CAMPAIGN])
    start = time.perf_counter()
    killer.start()
    try:
        outcome = run(cfg)
    finally:
        killer.done.set()
        killer.join()
    wall = time.perf_counter() - start
    attempts = [json.loads(path.read_text()) | {"trial_id": path.parent.name} for path in out.glob("*/work/**/node.json")]
    stop_cluster(cluster)

    con = open_reader(out / "kb")
    run_id = f"chaos-p{p}"
    rows = con.execute("select trial_id, status, epochs, reason from trials where run_id = ?", [run_id]).fetchall()
    started = {a["trial_id"] for a in attempts}
    recorded = {r[0] for r in rows}
    # A trial ends as completed, stopped early by ASHA, or failed by its own trainer (a child that diverges):
    # all finished. Lost to the faults: a trial whose retries ran out (Tune's error: its actor or node died).
    lost = [r for r in rows if r[1] == "failed" and FAULT.search(r[3] or "")]
    finished = [r for r in rows if r not in lost]
    epoch_rows = con.execute("select trial_id, epoch, metric, count(*) from epochs where run_id = ? group by all", [run_id]).fetchall()
    missing_epochs = sum(1 for trial_id, _, epochs, _ in rows for e in range(1, epochs + 1)
                         if not any(t == trial_id and ep == e for t, ep, _, _ in epoch_rows))
    return {
        "p": p, "exit_code": int(outcome.exit_code), "stop_reason": outcome.stop_reason, "wall_s": round(wall, 1),
        "kills": killer.kills, "nodes_killed": len(killer.kills),
        "trials_started": len(started), "trials_finished": len(finished), "finished_over_started": round(len(finished) / len(started), 3),
        "trials_lost_to_faults": len(lost), "trials_failed": sorted((r[0], r[3]) for r in rows if r[1] == "failed"),
        "attempts": len(attempts), "resumed_from_checkpoint": sum(a["restored_checkpoint"] for a in attempts),
        "kb_trial_rows_lost": len(started - recorded), "kb_trial_rows_doubled": len(rows) - len(recorded),
        "kb_epoch_rows_doubled": sum(c - 1 for *_, c in epoch_rows if c > 1), "kb_epochs_missing": missing_epochs,
    }


def main() -> None:
    rates = tuple(float(a) for a in sys.argv[1:]) or RATES
    root = Path(tempfile.mkdtemp(prefix="bench-chaos-"))
    results = [chaos_run(root, p) for p in rates]
    lines = [f"chaos: 3-cycle digits campaign (heuristic agent) on a head + 2 worker nodes; every {PERIOD_S:.0f} s a worker "
             "node is killed with probability p and replaced; checkpoints via paths.storage, safeguards.max_failures=3"]
    for r in results:
        lines.append(f"  p={r['p']:<5} {r['nodes_killed']} node(s) killed in {r['wall_s']:.0f} s; trials finished/started "
                     f"{r['trials_finished']}/{r['trials_started']} ({100 * r['finished_over_started']:.0f}%), "
                     f"{r['resumed_from_checkpoint']} resumed from a checkpoint; KB rows lost {r['kb_trial_rows_lost']}, "
                     f"doubled {r['kb_trial_rows_doubled']} (epoch rows doubled {r['kb_epoch_rows_doubled']}, missing {r['kb_epochs_missing']}); "
                     f"exit {r['exit_code']} ({r['stop_reason']})")
    save("chaos", {"period_s": PERIOD_S, "seed": SEED, "campaign": CAMPAIGN, "runs": results}, lines)


if __name__ == "__main__":
    main()
