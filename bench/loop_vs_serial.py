"""Equal wall budget: the population loop vs the serial Ralph loop (1x1) vs knob search (TPE) vs random search.

    python bench/loop_vs_serial.py [BUDGET_S] [REPEATS] [OVERRIDES...]
    python bench/loop_vs_serial.py 300 2                                   # digits, 2 repeats of 300 s per kind
    python bench/loop_vs_serial.py 300 2 population.mode=generations       # the barrier loop (the 2026-11-22 record)
    python bench/loop_vs_serial.py 300 2 --kinds knob                      # only the kinds whose name starts so
    python bench/loop_vs_serial.py 300 3 --kinds population,serial --tag reps   # replicates on and off, interleaved
    python bench/loop_vs_serial.py 300 3 task=lm --target 3.1              # the lm task (bits per byte: lower wins)
    python bench/loop_vs_serial.py 900 1 task=lm --target 3.05 --tag 900s  # a longer budget, saved apart

Each kind gets the same campaign time budget (safeguards.campaign_time_s) and no other stop rule, in the default
population mode (asynchronous) unless the overrides say otherwise; the kinds alternate within each repeat, so a busy
spell of the machine falls on each alike. Reported per kind: the best selection score (mean ± sd over repeats), its
trial's test score, and the minutes until a trial first reached TARGET
(measured from the KB; no campaign stops at it).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from dataclasses import asdict
from pathlib import Path

from _clock import measure
from _common import config, save

from ralph_ray.campaign import run

_parser = argparse.ArgumentParser(description="population loop vs serial 1x1 vs knob search, equal wall budget")
_parser.add_argument("budget_s", nargs="?", type=int, default=240)
_parser.add_argument("repeats", nargs="?", type=int, default=3)
_parser.add_argument("overrides", nargs="*", help="config overrides for every campaign (task=lm, population.mode=...)")
_parser.add_argument(
    "--kinds",
    default="",
    help="only kinds whose name starts with one of these comma-separated prefixes (knob, serial, population, random); "
    "`population` and `serial` include their runs without replicates",
)
_parser.add_argument("--target", type=float, help="selection score to time, in the metric's units (digits: 0.985)")
_parser.add_argument("--first-seed", type=int, default=0, help="more repeats of a run: seeds from here (saved apart)")
_parser.add_argument("--tag", default="", help="appended to the results name (another budget of a recorded run)")
_ARGS = _parser.parse_args()
BUDGET_S, REPEATS, EXTRA = _ARGS.budget_s, _ARGS.repeats, _ARGS.overrides
ONLY = tuple(prefix.strip() for prefix in _ARGS.kinds.split(",") if prefix.strip())
TARGET = 0.985 if _ARGS.target is None else _ARGS.target
KINDS = {
    "population (2 parents x 3 children)": [],
    "serial Ralph loop (1 x 1)": ["population.parents=1", "population.children_per_parent=1"],
    # Replicates off: a 2x3 generation waits for its children's replicates, which short budgets may punish
    "population without replicates (safeguards.replicates=0)": ["safeguards.replicates=0"],
    "serial without replicates (safeguards.replicates=0)": [
        "population.parents=1",
        "population.children_per_parent=1",
        "safeguards.replicates=0",
    ],
    "knob search only (agent=none)": ["agent=none"],
    "random search (agent=none, search.sampler=random)": ["agent=none", "search.sampler=random"],
}
FREE = ["safeguards.max_cycles=1000", "safeguards.plateau_cycles=1000", f"safeguards.campaign_time_s={BUDGET_S}"]


def _stat(values: list[float]) -> str:
    """Mean ± sd (sd only from two values on)."""
    mean = statistics.mean(values)
    return f"{mean:.4f} ± {statistics.stdev(values):.4f}" if len(values) > 1 else f"{mean:.4f}"


def main() -> None:
    root = Path(tempfile.mkdtemp(prefix="bench-modes-"))
    probe = config(root, "probe", "population.mode=async", *EXTRA)
    lower = probe.task.direction == "min"
    if _ARGS.target is None and (lower or probe.task.name != "digits"):
        _parser.error(f"task {probe.task.name}: name the target in its metric ({probe.task.metric}): --target VALUE")
    sign = -1.0 if lower else 1.0  # shown in the metric's own units: a loss (lm's bits per byte) positive
    # No --kinds: the four recorded kinds (the runs without replicates are asked for by name)
    wanted = ONLY or ("population (", "serial Ralph", "knob", "random")
    results: dict[str, list] = {kind: [] for kind in KINDS if kind.startswith(wanted)}
    for seed in range(_ARGS.first_seed, _ARGS.first_seed + REPEATS):
        for index, (kind, overrides) in enumerate(KINDS.items()):
            if kind not in results:
                continue
            cfg = config(
                root,
                f"k{index}-s{seed}",
                *FREE,
                f"agent.seed={seed}",
                f"search.seed={seed}",
                "population.mode=async",  # the default (bench's config() pins the barrier loop)
                *overrides,
                *EXTRA,
            )
            # The KB's scores are oriented (higher is better; a min metric's value negated), so is the target.
            figures = measure(run(cfg), probe.population.mode, probe.search.max_concurrent, sign * TARGET)
            results[kind].append(figures)
    lines = [
        f"{probe.task.name}, equal wall budget {BUDGET_S}s per campaign, {REPEATS} repeat(s) (seeds from "
        f"{_ARGS.first_seed}), population.mode="
        f"{probe.population.mode}; target selection {'<=' if lower else '>='} {TARGET} ({probe.task.metric})"
        + (f"; overrides `{' '.join(EXTRA)}`" if EXTRA else "")
        + ":",
        "| kind | best selection | its test | trials | reached the target | minutes to it (each) |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for kind, runs in results.items():
        times = [None if f.seconds_to_target is None else round(f.seconds_to_target / 60, 2) for f in runs]
        lines.append(
            f"| {kind} | **{_stat([sign * (f.best_selection or 0.0) for f in runs])}** "
            f"| {_stat([sign * (f.best_test or 0.0) for f in runs])} "
            f"| {statistics.mean(f.trials for f in runs):.0f} | {sum(t is not None for t in times)}/{len(runs)} "
            f"| {', '.join('-' if t is None else str(t) for t in times)} |"
        )
    save(
        "loop_vs_serial"
        + "".join(f"_{o.split('=')[-1]}" for o in EXTRA)
        + "".join(f"_{prefix.split()[0]}" for prefix in ONLY)
        + (f"_s{_ARGS.first_seed}" if _ARGS.first_seed else "")
        + (f"_{_ARGS.tag}" if _ARGS.tag else ""),
        {"budget_s": BUDGET_S, "repeats": REPEATS, "target": TARGET, "overrides": EXTRA}
        | {kind: [asdict(f) for f in runs] for kind, runs in results.items()},
        lines,
    )


if __name__ == "__main__":
    main()
