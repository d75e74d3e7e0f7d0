"""The learning-curve forecaster beside ASHA: epochs and wall saved, and whether the best-at-end config survives.

The same N knob configs (Optuna's seeded random start-up samples, so every run draws the same ones) run four
ways on digits: FIFO (every config to the end: which one is best at the end), ASHA alone, ASHA with the
forecaster (scheduler.forecast=true), and the forecaster alone (FIFO + forecast). Reduced to fit a 2-core box:
N = 10 configs, one campaign per way.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

from _common import RESULTS, config, save

from ralph_ray.campaign import run

N = 10  # Optuna's TPE samples its first 10 at random from its seed: the same configs in every run
WAYS = {
    "fifo": ["scheduler=fifo"],
    "asha": ["scheduler=asha"],
    "asha+forecast": ["scheduler=asha", "scheduler.forecast=true"],
    "fifo+forecast": ["scheduler=fifo", "scheduler.forecast=true"],  # the forecaster alone
}


def one(root: Path, name: str, overrides: list[str]) -> dict:
    """One campaign of N configs; what it trained and how each config ended."""
    start = time.perf_counter()
    outcome = run(config(root, name, f"search.num_samples={N}", "agent=none", "safeguards.replicates=0", *overrides))
    wall = time.perf_counter() - start
    trials = {
        r.knobs: {"status": r.status.value, "epochs": r.epochs, "selection": r.selection_score, "reason": r.reason}
        for r in outcome.records
    }
    return {
        "wall_s": round(wall, 1),
        "epochs_trained": sum(r.epochs for r in outcome.records),
        "completed": sum(r.status.value == "completed" for r in outcome.records),
        "forecast_stops": sum(bool(r.reason and r.reason.startswith("forecast stop")) for r in outcome.records),
        "best_selection": max(
            (r.selection_score for r in outcome.records if r.selection_score is not None), default=None
        ),
        "trials": trials,
    }


def main() -> None:
    root = Path(tempfile.mkdtemp(prefix="bench-forecast-"))
    # `python bench/forecast.py WAY ...` runs only those ways and keeps the others' recorded figures.
    wanted = sys.argv[1:] or list(WAYS)
    recorded = RESULTS / "forecast.json"
    ways = json.loads(recorded.read_text())["ways"] if sys.argv[1:] and recorded.exists() else {}
    ways |= {name: one(root, name.replace("+", "-"), WAYS[name]) for name in wanted}
    ways = {name: ways[name] for name in WAYS if name in ways}
    fifo = ways["fifo"]["trials"]
    finished = {k: t["selection"] for k, t in fifo.items() if t["selection"] is not None}
    best_knobs = max(finished, key=finished.get)
    lines = [
        f"{N} digits configs (12 epochs each, 2 at a time), the same configs each way; the best at the end (FIFO, "
        f"every config to the end): selection {finished[best_knobs]:.4f} with {best_knobs}",
        "",
        "| way | epochs trained | of all | wall s | completed | forecast stops | best-at-end config | best selection |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, way in ways.items():
        ended = way["trials"].get(best_knobs, {}).get("status", "not run")
        lines.append(
            f"| {name} | {way['epochs_trained']} | {way['epochs_trained'] / (N * 12):.2f} | {way['wall_s']} | "
            f"{way['completed']} | {way['forecast_stops']} | {ended} | {way['best_selection']:.4f} |"
        )
    stops = [
        f"{name}: {t['reason']}"
        for name, way in ways.items()
        for t in way["trials"].values()
        if (t["reason"] or "").startswith("forecast")
    ]
    lines += ["", "Forecast stops (as recorded in the trials' reason):", *[f"- {s}" for s in stops]]
    lines += ["", "Reduced: one campaign per way on a shared 2-core box (wall times include other jobs' load)."]
    save("forecast", {"configs": N, "best_at_end": json.loads(best_knobs), "ways": ways}, lines)


if __name__ == "__main__":
    sys.exit(main())
