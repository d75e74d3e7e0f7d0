"""Data-parallel scaling of one digits trial: 1 worker against N gloo workers (resources.workers_per_trial) on CPU.

Each run is a one-cycle campaign of one trial with the seed's own knobs (FIFO, EPOCHS epochs): the trial's wall
seconds (Ray Train's worker group included), its median epoch seconds as the trainer measured them, and its
scores. Digits is tiny (1 ms of compute per step): this measures the path's overhead, not a speed-up.

    python bench/dp_scaling.py [--workers 2] [--epochs 4]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from _common import config, rows, save

from ralph_ray import sandbox
from ralph_ray.campaign import run
from ralph_ray.kb import open_reader
from ralph_ray.raycluster import ensure_ray, set_ray_env


def one(root: Path, workers: int, epochs: int) -> dict[str, object]:
    """One trial on `workers` workers: wall, epoch seconds, scores."""
    name = f"dp{workers}"
    overrides = [
        "agent=none",
        "safeguards.replicates=0",
        "safeguards.trial_timeout_s=1800",
        "search.num_samples=1",
        "search.max_concurrent=1",
        "scheduler=fifo",
        f"scheduler.max_t={epochs}",
        f"+search.space.EPOCHS={{type: choice, values: [{epochs}]}}",
        f"resources.workers_per_trial={workers}",
    ]
    if sandbox.available() is not None:
        overrides.append("sandbox=none")
    began = time.monotonic()
    outcome = run(config(root, name, *overrides))
    wall = time.monotonic() - began
    con = open_reader(root / "kb")
    trial = rows(con, "select trial_id, seconds, selection_score, test_score from trials where run_id = ?", [name])[0]
    seconds = [
        r["epoch_seconds"]
        for r in rows(con, "select epoch_seconds from curves where run_id = ? order by epoch", [name])
        if r["epoch_seconds"] is not None
    ]
    return {
        "workers": workers,
        "exit_code": int(outcome.exit_code),
        "campaign_wall_s": round(wall, 1),
        "trial_s": round(float(trial["seconds"]), 1),
        "median_epoch_s": round(statistics.median(seconds), 4) if seconds else None,
        "selection_score": trial["selection_score"],
        "test_score": trial["test_score"],
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=4)
    args = parser.parse_args()
    set_ray_env("token")
    ensure_ray(num_cpus=2)
    with tempfile.TemporaryDirectory() as tmp:
        results = [one(Path(tmp), n, args.epochs) for n in (1, args.workers)]
    lines = [
        f"One digits trial, seed knobs, {args.epochs} epochs, CPU (gloo), REDUCED: a 2-core machine shared with "
        "other jobs (load average well above 2), so times are upper bounds and noisy.",
        "",
        "| workers | trial s | median epoch s | selection | test | campaign wall s |",
        "| --- | --- | --- | --- | --- | --- |",
        *(
            f"| {r['workers']} | {r['trial_s']} | {r['median_epoch_s']} | {r['selection_score']:.4f} | "
            f"{r['test_score']:.4f} | {r['campaign_wall_s']} |"
            for r in results
            if r["selection_score"] is not None
        ),
    ]
    save("dp_scaling", {"epochs": args.epochs, "runs": results}, lines)


if __name__ == "__main__":
    main()
