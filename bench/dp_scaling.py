"""Data-parallel scaling of one trial: a plain single trial against Ray Train worker groups (digits unless --task).

Each run is a one-cycle campaign of one trial with the seed's own knobs (FIFO, EPOCHS epochs): the trial's wall
seconds (Ray Train's worker group included), its median epoch seconds as the trainer measured them, and its
scores. Runs (--runs): `plain` is today's single trial (one process, no group); `one` a group of one through Ray
Train (`resources.ray_train=true`: the process group, NCCL on a GPU, DDP, the data-parallel path whole); a number N
a group of N workers (`resources.workers_per_trial=N`, gloo on CPU). Digits is tiny (1 ms of compute per step): on
CPU this measures the path's overhead, not a speed-up.

    python bench/dp_scaling.py [--runs plain,2] [--epochs 4]
    python bench/dp_scaling.py --task fashion --runs plain,one --epochs 8 --name dp_scaling_gpu -- resources=gpu \
        resources.gpu=1 resources.cpu=4 sandbox=none data.root=/tmp/fm        # one GPU: NCCL group of one
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


def shape(run_kind: str) -> list[str]:
    """The overrides that make a run of this kind: plain, a group of one, or N workers."""
    if run_kind == "plain":
        return []
    if run_kind == "one":
        return ["resources.ray_train=true"]
    return [f"resources.workers_per_trial={int(run_kind)}"]


def one(root: Path, run_kind: str, args: argparse.Namespace) -> dict[str, object]:
    """One trial of this kind: wall, epoch seconds, scores."""
    name = f"dp-{run_kind}"
    overrides = [
        *([f"task={args.task}"] if args.task != "digits" else []),
        "agent=none",
        "safeguards.replicates=0",
        "safeguards.trial_timeout_s=1800",
        "search.num_samples=1",
        "search.max_concurrent=1",
        "scheduler=fifo",
        f"scheduler.max_t={args.epochs}",
        f"+search.space.EPOCHS={{type: choice, values: [{args.epochs}]}}",
        *shape(run_kind),
    ]
    if sandbox.available() is not None:
        overrides.append("sandbox=none")
    began = time.monotonic()
    outcome = run(config(root, name, *overrides, *args.overrides))
    wall = time.monotonic() - began
    con = open_reader(root / "kb")
    trial = rows(con, "select trial_id, seconds, selection_score, test_score from trials where run_id = ?", [name])[0]
    seconds = [
        r["epoch_seconds"]
        for r in rows(con, "select epoch_seconds from curves where run_id = ? order by epoch", [name])
        if r["epoch_seconds"] is not None
    ]
    return {
        "run": run_kind,
        "exit_code": int(outcome.exit_code),
        "campaign_wall_s": round(wall, 1),
        "trial_s": round(float(trial["seconds"]), 1),
        "median_epoch_s": round(statistics.median(seconds), 4) if seconds else None,
        "selection_score": trial["selection_score"],
        "test_score": trial["test_score"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", default="plain,2", help="comma-separated: plain, one, or a worker count N")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--task", default="digits")
    parser.add_argument("--cpus", type=int, default=2, help="CPUs of the local Ray instance")
    parser.add_argument("--name", default="dp_scaling", help="the results file's name under bench/results")
    parser.add_argument("--note", default=None, help="what the table is (default: the 2-core CPU run's caveat)")
    parser.add_argument("overrides", nargs="*", help="config overrides for every run (after --)")
    args = parser.parse_args()
    set_ray_env("token")
    ensure_ray(num_cpus=args.cpus)
    with tempfile.TemporaryDirectory() as tmp:
        results = [one(Path(tmp), kind, args) for kind in args.runs.split(",")]
    lines = [
        args.note
        or (
            f"One {args.task} trial, seed knobs, {args.epochs} epochs, CPU (gloo), REDUCED: a 2-core machine shared "
            "with other jobs (load average well above 2), so times are upper bounds and noisy."
        ),
        "",
        "| run | trial s | median epoch s | selection | test | campaign wall s |",
        "| --- | --- | --- | --- | --- | --- |",
        *(
            f"| {r['run']} | {r['trial_s']} | {r['median_epoch_s']} | {r['selection_score']:.4f} | "
            f"{r['test_score']:.4f} | {r['campaign_wall_s']} |"
            for r in results
            if r["selection_score"] is not None
        ),
    ]
    save(args.name, {"epochs": args.epochs, "task": args.task, "runs": results}, lines)


if __name__ == "__main__":
    main()
