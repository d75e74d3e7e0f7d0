"""Time to a target selection score: asynchronous vs generations, 3 campaign seeds each (digits unless overridden).

    python bench/clock_target.py [TARGET] [CAP_S] [OVERRIDES...]
    python bench/clock_target.py 0.87 300 +experiment=fashion trial.budget_s=30   # Fashion-MNIST, 30-s trials
    BENCH_SEEDS=3,4 python bench/clock_target.py ...                               # more seeds, saved apart

Each campaign stops at the target (target.selection_score) or at CAP_S seconds (safeguards.campaign_time_s).
Reported: seconds from the run's start to the first trial at or above the target, per seed (None: not within CAP_S).
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

from _clock import measure
from _common import config, save

from ralph_ray.campaign import run

DEFAULT_TARGET = 0.98
TARGET = float(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_TARGET
CAP_S = int(sys.argv[2]) if len(sys.argv) > 2 else 150
EXTRA = sys.argv[3:]  # more config overrides for every campaign (another task, its trial budget)
DEFAULT_SEEDS = (0, 1, 2)
SEEDS = tuple(int(s) for s in os.environ["BENCH_SEEDS"].split(",")) if "BENCH_SEEDS" in os.environ else DEFAULT_SEEDS


def main() -> None:
    root = Path(tempfile.mkdtemp(prefix="bench-target-"))
    figures: dict[str, list] = {"generations": [], "async": []}
    task = config(root, "probe", *EXTRA).task.name
    for seed in SEEDS:  # the modes alternate, so a busy spell of the machine falls on both alike
        for mode in figures:
            outcome = run(
                config(
                    root,
                    f"{mode}-s{seed}",
                    "safeguards.max_cycles=1000",
                    "safeguards.plateau_cycles=1000",
                    f"safeguards.campaign_time_s={CAP_S}",
                    f"target.selection_score={TARGET}",
                    f"agent.seed={seed}",
                    f"search.seed={seed}",
                    *EXTRA,
                    f"population.mode={mode}",
                )
            )
            figures[mode].append(measure(outcome, mode, 2, TARGET))
    lines = [
        f"{task}, heuristic agent, time to selection >= {TARGET} (cap {CAP_S}s), campaign seeds {SEEDS}"
        + (f", overrides `{' '.join(EXTRA)}`" if EXTRA else "")
        + ":",
        "| mode | seconds to target per seed | mean of those reached | utilisation |",
        "| --- | --- | --- | --- |",
    ]
    for mode, runs in figures.items():
        times = [f.seconds_to_target for f in runs]
        reached = [t for t in times if t is not None]
        mean = f"{statistics.mean(reached):.0f} s ({len(reached)}/{len(times)})" if reached else "never"
        lines.append(
            f"| {mode} | {', '.join('-' if t is None else f'{t:.0f}' for t in times)} | **{mean}** | "
            f"{statistics.mean(f.utilisation for f in runs):.2f} |"
        )
    save(
        # one file per task and target, so a harder target's run keeps the easier one's record
        ("clock_target" if task == "digits" and TARGET == DEFAULT_TARGET else f"clock_target_{task}_{TARGET:g}")
        + ("" if SEEDS == DEFAULT_SEEDS else "_s" + "".join(map(str, SEEDS))),
        {"target": TARGET, "cap_s": CAP_S, **{m: [asdict(f) for f in r] for m, r in figures.items()}},
        lines,
    )


if __name__ == "__main__":
    main()
