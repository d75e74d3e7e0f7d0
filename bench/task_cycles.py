"""One task's seed against the best variant after a campaign of CYCLES generations (for a `min` task the direction
end to end): the seed's selection/test score and the best variant's, with wall time and trials per cycle.

    python bench/task_cycles.py TASK [CYCLES] [CAP_S] [--repeats N] [key=value ...]

TASK is `diabetes` (MSE) or `lm` (held-out bits per byte). Each repeat is one campaign in a fresh root (heuristic
agent, generations mode, the task's own search space from trainers/TASK/task.yaml), plateau stop off
(safeguards.plateau_cycles=1000), stopped after CYCLES cycles (the first is the seed's own knob samples) or, past
CAP_S seconds, before the next cycle starts. Extra key=value overrides are passed on. Scores come from the KB, where
a min metric is stored as -value; "best" is the leaderboard's top (a discarded child can rank first: it scored
lower than its parent but its replicates did not beat the parent's at safeguards.confidence), "best kept" the top
seed or kept variant. Saved as bench/results/TASK.md/json.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from _common import config, rows, save

from ralph_ray import sql
from ralph_ray.campaign import run
from ralph_ray.kb import open_reader
from ralph_ray.variants import VariantStatus

# Each task's score: its name and units, what the data is, and how to print it.
METRICS = {
    "diabetes": ("MSE", "scikit-learn diabetes, 442 rows; MSE, lower is better", "{:.1f}"),
    "lm": ("bits per byte", "stdlib bytes, 2 x 512 held-out contexts; bits per byte, lower is better", "{:.3f}"),
}
ROLES = ("seed", "best", "best_kept")


def campaign(task: str, cycles: int, cap_s: int, extra: list[str]) -> dict:
    """One campaign; its wall time, exit code, trials per cycle, and the seed's, best and best kept variant's scores."""
    root = Path(tempfile.mkdtemp(prefix=f"bench-{task}-"))
    start = time.monotonic()
    overrides = [f"safeguards.max_cycles={cycles}", "safeguards.plateau_cycles=1000"]
    outcome = run(config(root, task, f"task={task}", *overrides, f"safeguards.campaign_time_s={cap_s}", *extra))
    wall = time.monotonic() - start
    kb = open_reader(root / "kb")
    board = rows(kb, sql.BENCH_LEADERBOARD, [task])
    picks = {
        "seed": next(r for r in board if r["status"] == VariantStatus.seed),
        "best": board[0],
        "best_kept": next(r for r in board if r["status"] in (VariantStatus.kept, VariantStatus.seed)),
    }
    value = lambda score: None if score is None else -score  # noqa: E731 - stored oriented: -value
    return {
        "wall_s": round(wall, 1),
        "exit_code": int(outcome.exit_code),
        "cycles_decided": kb.execute(sql.CYCLES_DECIDED, [task]).fetchone()[0],
        "trials_per_cycle": {int(c): int(n) for c, n in kb.execute(sql.TRIALS_PER_CYCLE, [task]).fetchall()},
        "variants": len(board),
        "trials": sum(int(r["trials"]) for r in board),
        **{
            role: {
                "variant_id": r["variant_id"],
                "status": r["status"],
                "selection": value(r["selection_score"]),
                "test": value(r["test_score"]),
                "interventions": r["interventions"],
            }
            for role, r in picks.items()
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("task", choices=sorted(METRICS))
    parser.add_argument("cycles", type=int, nargs="?", default=5)
    parser.add_argument("cap_s", type=int, nargs="?", default=1500)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    unit, about, fmt = METRICS[args.task]
    runs = [campaign(args.task, args.cycles, args.cap_s, args.overrides) for _ in range(args.repeats)]
    show = lambda v: "-" if v is None else fmt.format(v)  # noqa: E731
    median = {
        role: {split: statistics.median(r[role][split] for r in runs) for split in ("selection", "test")}
        for role in ROLES
    }
    figures = {
        "task": args.task,
        "unit": unit,
        "cycles": args.cycles,
        "cap_s": args.cap_s,
        "overrides": args.overrides,
        "median": median,
        "runs": runs,
    }
    lines = [
        f"{args.task} ({about}), heuristic agent, {args.repeats} campaign(s) of up to {args.cycles} cycles or "
        f"{args.cap_s} s each" + (f" ({' '.join(args.overrides)})" if args.overrides else "") + ":",
        f"| run | wall s | exit | cycles | trials (per cycle) | seed selection / test {unit} | best selection / test "
        f"(status, edits) | best kept selection / test (status, edits) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
        *(
            f"| {i} | {r['wall_s']:.0f} | {r['exit_code']} | {r['cycles_decided']} | {r['trials']} "
            f"({', '.join(map(str, r['trials_per_cycle'].values()))}) | "
            + " | ".join(
                f"{show(r[role]['selection'])} / {show(r[role]['test'])}"
                + ("" if role == "seed" else f" ({r[role]['status']}, {r[role]['interventions']})")
                for role in ROLES
            )
            + " |"
            for i, r in enumerate(runs, 1)
        ),
        "| median | | | | | "
        + " | ".join(f"{show(median[role]['selection'])} / {show(median[role]['test'])}" for role in ROLES)
        + " |",
    ]
    save(args.task, figures, lines)


if __name__ == "__main__":
    main()
