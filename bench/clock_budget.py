"""Under an equal time budget per trial (trial.budget_s): the best variant's gain over the seed at the same trial
seconds, and the campaign's wall time against trials x budget / slots; asynchronous vs generations.

    python bench/clock_budget.py [BUDGET_S]

Each campaign runs 3 generations (the seed's 4-trial knob search, then 2 x 2 children of 1 trial each), every trial
at most BUDGET_S training seconds.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
from pathlib import Path

from _clock import measure
from _common import config, save

from ralph_ray import sql
from ralph_ray.campaign import run
from ralph_ray.kb import open_reader

BUDGET_S = float(sys.argv[1]) if len(sys.argv) > 1 else 5.0
SLOTS = 2


def main() -> None:
    root = Path(tempfile.mkdtemp(prefix="bench-budget-"))
    figures, lines = (
        {},
        [
            f"digits, heuristic agent, trial.budget_s={BUDGET_S:g}, {SLOTS} slots, 3 generations "
            "(2 parents x 2 children, 1 trial each, seed 4 trials):",
            "| mode | seed best selection / test | best variant selection / test | gain (test) | "
            "train s per trial (seed / best) | trials | wall s | trials x budget / slots |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |",
        ],
    )
    for mode in ("generations", "async"):
        outcome = run(
            config(
                root,
                mode,
                "safeguards.max_cycles=3",
                "safeguards.plateau_cycles=1000",
                f"trial.budget_s={BUDGET_S}",
                "search.num_samples=4",
                "population.parents=2",
                "population.children_per_parent=2",
                "population.trials_per_child=1",
                f"population.mode={mode}",
                f"search.max_concurrent={SLOTS}",
            )
        )
        f = measure(outcome, mode, SLOTS)
        con = open_reader(outcome.kb_root)
        spans = con.execute(sql.TRIAL_SPANS, [outcome.run_id]).fetchall()
        train = dict(con.execute(sql.TRAIN_SECONDS_PER_TRIAL, [outcome.run_id]).fetchall())
        seed = [r for r in spans if r[8] == 1 and r[5] is not None]
        seed_best = max(seed, key=lambda r: r[5])
        best = max((r for r in spans if r[5] is not None), key=lambda r: r[5])
        ideal = f.trials * BUDGET_S / SLOTS
        seed_train = statistics.mean(train.get(r[9], 0.0) for r in seed)
        best_train = train.get(best[9], 0.0)
        figures[mode] = {
            **f.__dict__,
            "seed_selection": seed_best[5],
            "seed_test": seed_best[6],
            "best_variant": best[7],
            "best_selection": best[5],
            "best_test": best[6],
            "gain_test": best[6] - seed_best[6],
            "ideal_wall_s": ideal,
            "seed_train_s": seed_train,
            "best_train_s": best_train,
        }
        lines.append(
            f"| {mode} | {seed_best[5]:.4f} / {seed_best[6]:.4f} | {best[5]:.4f} / {best[6]:.4f} | "
            f"**{best[6] - seed_best[6]:+.4f}** | {seed_train:.1f} / {best_train:.1f} | {f.trials} | "
            f"{f.wall_s} | "
            f"{ideal:.0f} |"
        )
    save("clock_budget", {"budget_s": BUDGET_S, "slots": SLOTS, **figures}, lines)


if __name__ == "__main__":
    main()
