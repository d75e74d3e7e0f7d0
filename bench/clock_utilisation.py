"""Slot utilisation and best test score at an equal wall budget: asynchronous vs generations, on digits.

    python bench/clock_utilisation.py [heuristic|llm] [BUDGET_S] [OVERRIDES...]
    python bench/clock_utilisation.py heuristic 600 +experiment=fashion trial.budget_s=30   # Fashion-MNIST

`heuristic`: the offline agent. `llm`: agent=openai against a loopback server that answers every call after
20 s (tests/agents/slow_llm.py), as a hosted model would. Each mode runs the digits experiment (2 slots, the seed's
knob search trimmed to 4 trials) for the same campaign time (safeguards.campaign_time_s) with no other stop rule.
Utilisation = the trials'
seconds / (slots x the campaign's wall time, Ray's start and the report included). Goal: >= 0.95 (async).
"""

from __future__ import annotations

import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

from _clock import measure
from _common import config, save

from ralph_ray.campaign import run

AGENT = sys.argv[1] if len(sys.argv) > 1 else "heuristic"
BUDGET_S = int(sys.argv[2]) if len(sys.argv) > 2 else 180
SLOTS = 2
EXTRA = sys.argv[3:]  # more config overrides for both modes (another task, its trial budget)
# The seed's knob search trimmed to 4 trials so that a few minutes reach the agents on a 2-core machine.
FREE = [
    "safeguards.max_cycles=1000",
    "safeguards.plateau_cycles=1000",
    f"safeguards.campaign_time_s={BUDGET_S}",
    f"search.max_concurrent={SLOTS}",
    "search.num_samples=4",
]


def main() -> None:
    root = Path(tempfile.mkdtemp(prefix="bench-clock-"))
    agent: list[str] = []
    llm = None
    if AGENT == "llm":
        from slow_llm import SlowLLM

        llm = SlowLLM(delay_s=20.0)
        agent = llm.overrides()
    figures = {}
    try:
        for mode in ("generations", "async"):
            outcome = run(config(root, f"{AGENT}-{mode}", *FREE, *EXTRA, f"population.mode={mode}", *agent))
            figures[mode] = measure(outcome, mode, SLOTS)
    finally:
        if llm is not None:
            llm.close()
    task = config(root, "probe", *EXTRA).task.name
    name = f"clock_utilisation_{AGENT}" + ("" if task == "digits" else f"_{task}")
    lines = [
        f"{task}, agent {AGENT}{' (20 s per call)' if llm else ''}, {SLOTS} slots, equal wall budget {BUDGET_S}s"
        + (f", overrides `{' '.join(EXTRA)}`" if EXTRA else "")
        + ":",
        "| mode | utilisation (campaign wall) | busy within the trials' span | trials | trial s | wall s | "
        "best selection | its test |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for f in figures.values():
        lines.append(
            f"| {f.mode} | **{f.utilisation:.2f}** | {f.busy_in_span:.2f} | {f.trials} | {f.trial_s} | "
            f"{f.wall_s} | "
            f"{f.best_selection or 0:.4f} | {f.best_test or 0:.4f} |"
        )
    figures_json = {m: asdict(f) for m, f in figures.items()}
    save(name, {"agent": AGENT, "budget_s": BUDGET_S, "slots": SLOTS, "overrides": EXTRA, **figures_json}, lines)


if __name__ == "__main__":
    main()
