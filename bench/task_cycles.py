"""The diabetes regression task (MSE, lower is better): the seed's selection/test MSE and the best variant's after a
short campaign, to show the direction end to end.

    python bench/diabetes.py [CYCLES] [CAP_S]

One campaign (heuristic agent, asynchronous mode, the task's own search space from trainers/diabetes/task.yaml),
stopped after CYCLES generations or CAP_S seconds. Scores come from the KB, where a min metric is stored as -value.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from _common import config, rows, save

from ralph_ray import sql
from ralph_ray.campaign import run
from ralph_ray.kb import open_reader

CYCLES = int(sys.argv[1]) if len(sys.argv) > 1 else 5
CAP_S = int(sys.argv[2]) if len(sys.argv) > 2 else 300


def main() -> None:
    root = Path(tempfile.mkdtemp(prefix="bench-diabetes-"))
    start = time.monotonic()
    outcome = run(
        config(
            root,
            "diabetes",
            "task=diabetes",
            f"safeguards.max_cycles={CYCLES}",
            "safeguards.plateau_cycles=1000",
            f"safeguards.campaign_time_s={CAP_S}",
        )
    )
    wall = time.monotonic() - start
    board = rows(open_reader(root / "kb"), sql.BENCH_LEADERBOARD, ["diabetes"])
    mse = lambda score: None if score is None else -score  # noqa: E731 - stored oriented: -MSE
    seed = next(r for r in board if r["status"] == "seed")
    best = board[0]
    figures = {
        "cycles": CYCLES,
        "cap_s": CAP_S,
        "wall_s": round(wall, 1),
        "exit_code": int(outcome.exit_code),
        "variants": len(board),
        "trials": sum(int(r["trials"]) for r in board),
        "seed": {
            "variant_id": seed["variant_id"],
            "selection_mse": mse(seed["selection_score"]),
            "test_mse": mse(seed["test_score"]),
        },
        "best": {
            "variant_id": best["variant_id"],
            "selection_mse": mse(best["selection_score"]),
            "test_mse": mse(best["test_score"]),
            "interventions": best["interventions"],
        },
    }
    lines = [
        f"diabetes (scikit-learn, 442 rows; MSE, lower is better), heuristic agent, up to {CYCLES} generations or "
        f"{CAP_S} s: {figures['trials']} trials over {figures['variants']} variants in {wall:.0f} s (exit "
        f"{figures['exit_code']})",
        "| variant | selection MSE | test MSE |",
        "| --- | --- | --- |",
        f"| seed {seed['variant_id']} (best knob sample) | {mse(seed['selection_score']):.1f} | "
        f"{mse(seed['test_score']):.1f} |",
        f"| best {best['variant_id']} ({best['interventions']}) | {mse(best['selection_score']):.1f} | "
        f"{mse(best['test_score']):.1f} |",
    ]
    save("diabetes", figures, lines)


if __name__ == "__main__":
    main()
