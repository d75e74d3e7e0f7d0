"""The sandbox's cost per trial on digits, sandbox (bwrap) vs none, side by side in one run.

    python bench/sandbox.py [--repeats 5] [--epochs 6]

Two trainers run through the real runner (no Ray), alternating the two modes so both see the same machine load:
- start: a trainer that reports one epoch at its first line (`import harness` then `report`): the wall from
  `runner.run` to that report is the per-trial start cost (process, bwrap + namespaces + cgroups, Python, numpy);
- epochs: the digits seed trainer (its default knobs, EPOCHS fixed) timed between consecutive epoch reports,
  the first epoch left out (warm-up): the per-epoch slowdown.
Results: bench/results/sandbox.json and .md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import save  # noqa: E402

from ralph_ray import PROJECT_ROOT  # noqa: E402
from ralph_ray.runner import Limits, Status, Trainer, run  # noqa: E402
from ralph_ray.sandbox import Policy, SandboxMode, available  # noqa: E402
from ralph_ray.tasks.base import write_public  # noqa: E402
from ralph_ray.tasks.digits import prepare  # noqa: E402
from ralph_ray.workdir import prepare_workdir, write_variant  # noqa: E402

FIRST_LINE = b"from ralph_ray import harness\nharness.report(epoch=1, val_acc=0.0)\n"
MODES = (SandboxMode.none, SandboxMode.bwrap)


def start_cost(root: Path, data: Path, mode: SandboxMode, i: int) -> float:
    """Seconds from runner.run to the trainer's first report, for a trainer whose first line reports."""
    work = root / f"start-{mode.value}-{i}"
    write_variant({"train.py": FIRST_LINE}, work)
    seen: list[float] = []
    start = time.perf_counter()
    outcome = run(
        Trainer(work, data), Limits(60, sandbox=Policy(mode)), lambda record: seen.append(time.perf_counter())
    )
    assert outcome.status is Status.finished and seen, outcome.reason
    return seen[0] - start


def epoch_times(root: Path, data: Path, mode: SandboxMode, i: int, epochs: int) -> tuple[list[float], float]:
    """The digits seed's epoch durations after the first, and the whole trial's wall."""
    work = root / f"seed-{mode.value}-{i}"
    prepare_workdir(PROJECT_ROOT / "trainers" / "digits", work, {"EPOCHS": epochs})
    seen: list[float] = []
    start = time.perf_counter()
    outcome = run(
        Trainer(work, data, seed=i), Limits(600, sandbox=Policy(mode)), lambda record: seen.append(time.perf_counter())
    )
    wall = time.perf_counter() - start
    assert outcome.status is Status.finished and len(seen) == epochs, outcome.reason
    return [b - a for a, b in zip(seen[1:-1], seen[2:])] if len(seen) > 2 else [], wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=6)
    args = parser.parse_args()
    problem = available()
    if problem:
        sys.exit(f"bubblewrap cannot run here ({problem}): apt-get install bubblewrap")
    load_before = os.getloadavg()[
        0
    ]  # other work on the machine: the side-by-side order keeps the ratio fair, not exact
    root = Path(tempfile.mkdtemp(prefix="ralph-bench-sandbox-"))
    data = root / "data"
    write_public(prepare(0, 0.2, 0.2), data, "digits")
    starts: dict[SandboxMode, list[float]] = {m: [] for m in MODES}
    epochs: dict[SandboxMode, list[float]] = {m: [] for m in MODES}
    walls: dict[SandboxMode, list[float]] = {m: [] for m in MODES}
    for i in range(args.repeats):
        for mode in MODES if i % 2 == 0 else MODES[::-1]:  # alternate the order: neither side always goes first
            starts[mode].append(start_cost(root, data, mode, i))
            times, wall = epoch_times(root, data, mode, i, args.epochs)
            epochs[mode] += times
            walls[mode].append(wall)
            print(
                f"repeat {i + 1} {mode.value:<5} start {starts[mode][-1]:.3f} s, epoch {statistics.median(times):.3f} "
                "s, "
                f"trial {wall:.1f} s",
                flush=True,
            )
    med = {
        m: {
            "start_s": statistics.median(starts[m]),
            "epoch_s": statistics.median(epochs[m]),
            "trial_s": statistics.median(walls[m]),
        }
        for m in MODES
    }
    none, box = med[SandboxMode.none], med[SandboxMode.bwrap]
    figures = {
        "repeats": args.repeats,
        "epochs_per_trial": args.epochs,
        "load_average": [load_before, os.getloadavg()[0]],
        "median": {m.value: v for m, v in med.items()},
        "start_extra_s": box["start_s"] - none["start_s"],
        "start_ratio": box["start_s"] / none["start_s"],
        "epoch_ratio": box["epoch_s"] / none["epoch_s"],
        "trial_ratio": box["trial_s"] / none["trial_s"],
        "raw": {m.value: {"start_s": starts[m], "epoch_s": epochs[m], "trial_s": walls[m]} for m in MODES},
    }
    lines = [
        f"sandbox cost on digits, {args.repeats} repeats alternating bwrap and none (medians):",
        "  mode   start (to first report)   epoch (seed, after the first)   whole trial",
        *(
            f"  {m.value:<5}  {med[m]['start_s']:>8.3f} s {'':<14} {med[m]['epoch_s']:>8.3f} s {'':<19} "
            f"{med[m]['trial_s']:>6.1f} s"
            for m in MODES
        ),
        f"  ratio bwrap/none: start {figures['start_ratio']:.2f} ({figures['start_extra_s']:+.3f} s per trial), "
        f"epoch {figures['epoch_ratio']:.3f}, whole trial {figures['trial_ratio']:.3f}",
        f"  (load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after)",
    ]
    save("sandbox", figures, lines)


if __name__ == "__main__":
    main()
