"""Equal wall budget on digits: the population loop vs the serial Ralph loop (1x1) vs knob search only.

Each mode gets the same campaign time budget (safeguards.campaign_time_s) and no other stop rule, 3 repeats.
Reported: the best selection score reached, and the minutes until the best first reached TARGET.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
from pathlib import Path

from _common import config, rows, save

from ralph_ray import sql
from ralph_ray.campaign import run
from ralph_ray.kb import open_reader

BUDGET_S = int(sys.argv[1]) if len(sys.argv) > 1 else 240
TARGET = 0.985
MODES = {
    "population (2 parents x 3 children)": [],
    "serial Ralph loop (1 x 1)": ["population.parents=1", "population.children_per_parent=1"],
    "knob search only (agent=none)": ["agent=none"],
}
FREE = ["safeguards.max_cycles=1000", "safeguards.plateau_cycles=1000", f"safeguards.campaign_time_s={BUDGET_S}"]


def one(root: Path, name: str, overrides: list[str], seed: int) -> dict[str, float | None]:
    """One budgeted campaign: best selection and minutes to TARGET (None if never)."""
    outcome = run(config(root, name, *FREE, f"agent.seed={seed}", f"search.seed={seed}", *overrides))
    con = open_reader(outcome.kb_root)
    timeline = rows(con, sql.TRIAL_TIMELINE, [outcome.run_id])
    started = con.execute(sql.RUN_STARTED_AT, [outcome.run_id]).fetchone()[0]
    reached = next((t["written_at"] for t in timeline if (t["selection_score"] or 0) >= TARGET), None)
    return {
        "best": outcome.best_selection_score,
        "minutes_to_target": round((reached - started).total_seconds() / 60, 2) if reached else None,
    }


def main() -> None:
    root = Path(tempfile.mkdtemp(prefix="bench-modes-"))
    figures: dict[str, object] = {"budget_s": BUDGET_S, "target": TARGET}
    lines = [f"digits, equal wall budget {BUDGET_S}s per campaign, 3 repeats; target selection {TARGET}:"]
    for index, (mode, overrides) in enumerate(MODES.items()):
        results = [one(root, f"m{index}-s{seed}", overrides, seed) for seed in (0, 1, 2)]
        best = [r["best"] for r in results]
        times = [r["minutes_to_target"] for r in results]
        reached = [t for t in times if t is not None]
        figures[mode] = {"best": best, "minutes_to_target": times}
        lines.append(
            f"- {mode}: best selection {statistics.mean(best):.4f} ± {statistics.stdev(best):.4f}; "
            f"reached {TARGET} in {len(reached)}/3 runs, mean {statistics.mean(reached):.1f} min"
            if reached
            else f"- {mode}: best selection {statistics.mean(best):.4f} ± {statistics.stdev(best):.4f}; "
            f"never reached {TARGET}"
        )
    save("loop_vs_serial", figures, lines)


if __name__ == "__main__":
    main()
