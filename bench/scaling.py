"""Scaling: the same fixed set of short trials on 1, 2 and 4 logical nodes; throughput efficiency vs 1 node.

Each node is a Ray node of a `ray.cluster_utils.Cluster` on this machine, with one CPU (one trial at a time)
and its own data cache and work folder; the driver sits on a head without CPUs, joined with
`cluster=address` as on a real cluster. This machine has 2 cores, so the trials wait rather than compute
(a trainer that sleeps per epoch, like a trial bound by its GPU or its I/O): what is measured is how well
the orchestration (Tune, Optuna, the trial driver, shipping code and data, the driver-side ledger) keeps
n nodes busy. Efficiency at n nodes = (wall at 1 node / wall at n nodes) / n; the goal is >= 0.9 at 4.

Each setting first runs one trial per node (node start-up: worker processes, imports), then times the
fixed set through the same `run_search` a campaign's training phase uses. Two walls: the whole Tune run
(including Tune's start of a run, ~2-3 s here, paid once per cycle whatever the number of nodes), and the
trial span (first trial start to last trial end, from the trial driver's node.json and the trainers'
predictions files): the throughput a cycle sustains once running.
"""

from __future__ import annotations

import json
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
from ralph_ray.runner import Limits
from ralph_ray.search import SearchPlan, run_search
from ralph_ray.tasks.base import sha256_file, write_public
from ralph_ray.tasks.digits import prepare
from ralph_ray.trials import Code, PublicData, Schedule, TrialSpec

NODES = (1, 2, 4)
TRIALS, EPOCHS, SLEEP = 32, 4, 0.5  # 32 trials of 4 epochs x 0.5 s of waiting
WAITER = f"""
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
"""


def timed_search(root: Path, nodes: int, count: int, name: str) -> tuple[float, list[TrialRecord]]:
    """Run `count` waiter trials, `nodes` at a time, through run_search; (wall seconds, records)."""
    cfg = load_config(
        [
            f"paths.runs={root / 'runs'}",
            f"paths.kb={root / 'kb'}",
            "cluster=address",
            "scheduler=fifo",
            "population.mode=generations",  # one barrier cycle, as recorded
            f"scheduler.max_t={EPOCHS}",
            f"search.max_concurrent={nodes}",
            "~search.space",
            f"+search.space={{SLEEP: {{type: choice, values: [{SLEEP}]}}}}",
            "safeguards.trial_timeout_s=120",
        ]
    )
    splits = prepare(0, 0.2, 0.2)
    hashes = write_public(splits, root / "data", "digits")
    spec = TrialSpec(
        Code({"waiter": {"train.py": textwrap.dedent(WAITER).encode()}}, sha256_file(Path(harness.__file__))),
        PublicData({n: (root / "data" / n).read_bytes() for n in hashes}, hashes),
        Limits(120, 1 << 20),
        str(root / "runs" / name / "trials"),
        Schedule(hold_from_epoch=EPOCHS),
        driver_node_id=driver_node_id(),
    )
    records: list[TrialRecord] = []
    ledger = TrialLedger(
        name, 1, splits.labels(), spec.trials_root, 0, "val_acc", lambda record, rows: records.append(record)
    )
    start = time.perf_counter()
    run_search(cfg, spec, SearchPlan(["waiter"], [], count, 0), root / "runs" / name / "tune", name, [ledger])
    wall = time.perf_counter() - start
    assert len(records) == count and all(r.status.value == "completed" for r in records), [
        (r.status, r.reason) for r in records
    ]
    return wall, records


def trial_span(out: Path, name: str) -> float:
    """Seconds from the first trial's start to the last trial's end (as written on the nodes)."""
    starts, ends = [], []
    for info in out.glob(f"*/work/runs/{name}/trials/*/node.json"):
        starts.append(json.loads(info.read_text())["started_at"])
        ends.append((info.parent / "predictions.npz").stat().st_mtime)
    return max(ends) - min(starts)


def main() -> None:
    root = Path(tempfile.mkdtemp(prefix="bench-scaling-"))
    walls: dict[int, float] = {}
    spans: dict[int, float] = {}
    trial_s: dict[int, float] = {}
    for nodes in NODES:
        out = root / f"n{nodes}"
        cluster, _ = start_cluster(out, [f"node{i}" for i in range(nodes)])
        ensure_ray(cluster=load_config(["cluster=address", f"cluster.address={cluster.address}"]).cluster)
        timed_search(out, nodes, nodes, "warmup")  # one trial per node: worker processes start, imports load
        walls[nodes], records = timed_search(out, nodes, TRIALS, "measured")
        spans[nodes] = trial_span(out, "measured")
        trial_s[nodes] = sum(r.seconds for r in records) / len(records)
        stop_cluster(cluster)
        print(f"{nodes} node(s): {walls[nodes]:.1f} s for {TRIALS} trials, span {spans[nodes]:.1f} s", flush=True)
    efficiency = {n: walls[1] / walls[n] / n for n in NODES}
    steady = {n: spans[1] / spans[n] / n for n in NODES}
    ideal = TRIALS * EPOCHS * SLEEP
    figures = {
        "trials": TRIALS,
        "epochs": EPOCHS,
        "sleep_s": SLEEP,
        "nodes": list(NODES),
        "wall_s": {n: round(w, 2) for n, w in walls.items()},
        "trial_span_s": {n: round(w, 2) for n, w in spans.items()},
        "mean_trial_s": {n: round(t, 2) for n, t in trial_s.items()},
        "throughput_trials_per_min": {n: round(60 * TRIALS / w, 1) for n, w in spans.items()},
        "efficiency_vs_1_node_wall": {n: round(e, 3) for n, e in efficiency.items()},
        "efficiency_vs_1_node_span": {n: round(e, 3) for n, e in steady.items()},
    }
    lines = [
        f"scaling: {TRIALS} trials of {EPOCHS} epochs x {SLEEP} s waiting ({ideal / TRIALS:.1f} s of work each), one "
        "trial per node at a time:",
        "  nodes  trial span  (ideal)  trials/min  efficiency | whole Tune run  efficiency | mean trial",
    ]
    for n in NODES:
        lines.append(
            f"  {n:>5}  {spans[n]:8.1f} s  ({ideal / n:5.1f})  {60 * TRIALS / spans[n]:10.1f}  {steady[n]:10.3f} | "
            f"{walls[n]:12.1f} s  {efficiency[n]:10.3f} | {trial_s[n]:.2f} s"
        )
    lines.append(
        f"  goal: efficiency >= 0.9 at 4 nodes -> trial span {steady[4]:.3f} "
        f"({'met' if steady[4] >= 0.9 else 'NOT met'}), "
        f"whole run {efficiency[4]:.3f} ({'met' if efficiency[4] >= 0.9 else 'NOT met'}; Tune's start of a run is "
        "fixed)"
    )
    save("scaling", figures, lines)


if __name__ == "__main__":
    main()
