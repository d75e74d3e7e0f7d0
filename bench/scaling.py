"""Scaling: the same fixed set of short trials on 1, 2 and 4 logical nodes; throughput efficiency vs 1 node.

Each node is a Ray node of a `ray.cluster_utils.Cluster` on this machine, with one CPU (one trial at a time)
and its own data cache and work folder; the driver sits on a head without CPUs, joined with
`cluster=address` as on a real cluster. This machine has 2 cores, so the trials wait rather than compute
(a trainer that sleeps per epoch, like a trial bound by its GPU or its I/O): what is measured is how well
the orchestration (Tune, Optuna, the trial driver, shipping code and data, the driver-side ledger) keeps
n nodes busy. Efficiency at n nodes = (wall at 1 node / wall at n nodes) / n; the goal is >= 0.9 at 4.

Each setting first runs one trial per node (node start-up: worker processes, imports), then times the
fixed set through the same `run_search` a campaign's training phase uses.
"""

from __future__ import annotations

import tempfile
import textwrap
import time
from pathlib import Path

from _common import save
from chaos import start_cluster, stop_cluster

from ralph_ray import harness
from ralph_ray.config import load_config
from ralph_ray.ledger import TrialLedger, TrialRecord
from ralph_ray.raycluster import driver_node_id, ensure_ray
from ralph_ray.search import SearchPlan, run_search
from ralph_ray.tasks.base import sha256_file, write_public
from ralph_ray.tasks.digits import prepare
from ralph_ray.trials import PublicData, TrialSpec

NODES = (1, 2, 4)
TRIALS, EPOCHS, SLEEP = 16, 4, 0.5  # 16 trials of 4 epochs x 0.5 s of waiting
WAITER = f'''
import time
import numpy as np
from ralph_ray import harness

EPOCHS = {EPOCHS}  # epochs
SLEEP = {SLEEP}  # seconds per epoch: waiting, not computing

data = harness.load_data()
for epoch in range(1, EPOCHS + 1):
    time.sleep(SLEEP)
    harness.report(epoch=epoch, val_acc=epoch / EPOCHS, train_loss=1.0 / epoch)
harness.save_predictions(selection=np.zeros(len(data.selection_x)), test=np.zeros(len(data.test_x)))
'''


def timed_search(root: Path, nodes: int, count: int, name: str) -> tuple[float, list[TrialRecord]]:
    """Run `count` waiter trials, `nodes` at a time, through run_search; (wall seconds, records)."""
    cfg = load_config([f"paths.runs={root / 'runs'}", f"paths.kb={root / 'kb'}", "cluster=address", "scheduler=fifo",
                       f"scheduler.max_t={EPOCHS}", f"search.max_concurrent={nodes}", "~search.space",
                       f"+search.space={{SLEEP: {{type: choice, values: [{SLEEP}]}}}}", "safeguards.trial_timeout_s=120"])
    splits = prepare(0, 0.2, 0.2)
    hashes = write_public(splits, root / "data", "digits")
    spec = TrialSpec(variants={"waiter": {"train.py": textwrap.dedent(WAITER).encode()}}, trials_root=str(root / "runs" / name / "trials"),
                     data=PublicData({n: (root / "data" / n).read_bytes() for n in hashes}, hashes),
                     harness_sha256=sha256_file(Path(harness.__file__)), timeout_s=120, output_limit_bytes=1 << 20, threads=1,
                     hold_from_epoch=EPOCHS, driver_node_id=driver_node_id())
    records: list[TrialRecord] = []
    ledger = TrialLedger(name, 1, splits.labels(), spec.trials_root, 0, "val_acc", lambda record, rows: records.append(record))
    start = time.perf_counter()
    run_search(cfg, spec, SearchPlan(["waiter"], [], count, 0), root / "runs" / name / "tune", name, [ledger])
    wall = time.perf_counter() - start
    assert len(records) == count and all(r.status.value == "completed" for r in records), [(r.status, r.reason) for r in records]
    return wall, records


def main() -> None:
    root = Path(tempfile.mkdtemp(prefix="bench-scaling-"))
    walls: dict[int, float] = {}
    trial_s: dict[int, float] = {}
    for nodes in NODES:
        out = root / f"n{nodes}"
        cluster, _ = start_cluster(out, [f"node{i}" for i in range(nodes)])
        ensure_ray(cluster=load_config(["cluster=address", f"cluster.address={cluster.address}"]).cluster)
        timed_search(out, nodes, nodes, "warmup")  # one trial per node: worker processes start, imports load
        walls[nodes], records = timed_search(out, nodes, TRIALS, "measured")
        trial_s[nodes] = sum(r.seconds for r in records) / len(records)
        stop_cluster(cluster)
        print(f"{nodes} node(s): {walls[nodes]:.1f} s for {TRIALS} trials (mean trial {trial_s[nodes]:.2f} s)", flush=True)
    efficiency = {n: walls[1] / walls[n] / n for n in NODES}
    ideal = TRIALS * EPOCHS * SLEEP
    figures = {"trials": TRIALS, "epochs": EPOCHS, "sleep_s": SLEEP, "nodes": list(NODES),
               "wall_s": {n: round(w, 2) for n, w in walls.items()}, "mean_trial_s": {n: round(t, 2) for n, t in trial_s.items()},
               "throughput_trials_per_min": {n: round(60 * TRIALS / w, 1) for n, w in walls.items()},
               "efficiency_vs_1_node": {n: round(e, 3) for n, e in efficiency.items()}}
    lines = [f"scaling: {TRIALS} trials of {EPOCHS} epochs x {SLEEP} s waiting ({ideal / TRIALS:.1f} s of work each), one trial per node at a time:"]
    for n in NODES:
        lines.append(f"  {n} node(s)  wall {walls[n]:6.1f} s  ({ideal / n:5.1f} s ideal)  {60 * TRIALS / walls[n]:5.1f} trials/min  "
                     f"mean trial {trial_s[n]:.2f} s  efficiency {efficiency[n]:.3f}")
    lines.append(f"  goal: efficiency >= 0.9 at 4 nodes -> {'met' if efficiency[4] >= 0.9 else 'NOT met'}")
    save("scaling", figures, lines)


if __name__ == "__main__":
    main()
