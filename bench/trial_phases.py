"""Where a trial's wall time goes, outside Ray: the trainer's start, its epochs, the time between them, its end.

Runs the task's seed trainer N times one after another through the runner (`ralph_ray.runner.run`, warm starts on,
the call Tune's trainable makes) and splits each trial by the arrival time of its reports:
  start     request -> the trainer's first epoch begins (the fork, CUDA's start, data to the device, the model, any
            warm-up): the first report's arrival minus its `train_seconds` (the harness's clock since the loop began);
  epochs    the sum of the trainer's own `epoch_seconds` (where it reports them);
  between   the loop's wall minus the epochs' (checkpoints, the reports, validation outside the epoch's timer);
  end       the last report -> the process has exited (the final predictions, test-time augmentation, exit).
The first trial also starts the warm server and is shown apart. Prints the medians and wall / epochs' time.

    python bench/trial_phases.py [--trials 4] [--threads 8] [--name trial_phases] -- <config overrides>
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from _common import config, save

from ralph_ray import harness, sandbox, warmstart
from ralph_ray.rundir import write_data
from ralph_ray.runner import Limits, Status, Trainer, run
from ralph_ray.sandbox import Policy, SandboxMode
from ralph_ray.tasks import prepare_splits

PHASES = ("start", "epochs", "between", "end", "wall")


def one(root: Path, data: Path, source: Path, index: int, threads: int, policy: Policy) -> dict[str, float]:
    """Run one trial of the trainer in `source` and split its wall time into PHASES (seconds)."""
    work = root / "trials" / f"t{index}"
    shutil.copytree(source, work)
    arrivals: list[tuple[float, dict]] = []
    began = time.monotonic()
    outcome = run(
        Trainer(work, data, seed=index, checkpoint_every_s=0.0),
        Limits(900, threads=threads, sandbox=policy, warm=True),
        on_epoch=lambda record: arrivals.append((time.monotonic(), record)),
    )
    ended = time.monotonic()
    if outcome.status is not Status.finished or not arrivals:
        sys.exit(f"trial {index}: {outcome.status.value} {outcome.reason or 'no report'}")
    first_at, first = arrivals[0]
    loop_began = first_at - float(first.get(harness.TRAIN_SECONDS, 0.0))
    last_at = arrivals[-1][0]
    epochs = sum(float(r.get("epoch_seconds", 0.0)) for _, r in arrivals)
    return {
        "start": loop_began - began,
        "epochs": epochs,
        "between": (last_at - loop_began) - epochs,
        "end": ended - last_at,
        "wall": ended - began,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--name", default="trial_phases")
    parser.add_argument("--note", default="")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-trial-phases-"))
    cfg = config(root, "phases", *args.overrides)
    write_data(prepare_splits(cfg), root, cfg.task.name)
    data = root / "data"
    policy = Policy(SandboxMode.bwrap if sandbox.available() is None else SandboxMode.none)
    trials = [one(root, data, cfg.trainer_dir(), i, args.threads, policy) for i in range(args.trials)]
    if warmstart.reason():
        sys.exit(f"warm starts did not work: {warmstart.reason()}")
    warmstart.close_all()
    first, rest = trials[0], trials[1:] or trials
    median = {p: statistics.median(t[p] for t in rest) for p in PHASES}
    ratio = median["wall"] / median["epochs"] if median["epochs"] else float("nan")
    figures = {
        "task": cfg.task.name,
        "trials": args.trials,
        "threads": args.threads,
        "sandbox": policy.mode.value,
        **{f"median_{p}_s": round(median[p], 3) for p in PHASES},
        "wall_over_epochs": round(ratio, 2),
        **{f"first_{p}_s": round(first[p], 3) for p in PHASES},
        "per_trial": [{p: round(t[p], 3) for p in PHASES} for t in trials],
    }
    lines = [
        *([args.note, ""] if args.note else []),
        f"{cfg.task.name}'s seed trainer, {args.trials} warm trials one after another through the runner "
        f"(sandbox {policy.mode.value}, {args.threads} threads); medians of trials 2..{args.trials} (the first also "
        "starts the warm server):",
        "",
        "| phase | median s | first trial s |",
        "| --- | --- | --- |",
        *(f"| {p} | {median[p]:.3f} | {first[p]:.3f} |" for p in PHASES),
        "",
        f"wall / epochs' time: **{ratio:.2f}**",
    ]
    save(args.name, figures, lines)  # prints the lines too


if __name__ == "__main__":
    main()
