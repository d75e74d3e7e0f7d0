"""task=grpo (GRPO + LoRA post-training of a tiny policy): the seed script's held-out exact-match accuracy and the
best variant's after a short campaign, with wall time.

    python bench/posttrain.py [CYCLES] [CAP_S] [OVERRIDES...]
    python bench/posttrain.py 5 600 resources=gpu sandbox=none     # on a GPU (bench/device/posttrain.sh): posttrain_gpu

One campaign (heuristic agent, barrier generations, the task's own search space and population from
trainers/grpo/task.yaml), stopped after CYCLES generations or CAP_S seconds. The base policy is built first (and
cached), so the wall time is the campaign's. The pre-trained base's own accuracy is recorded too: the seed's
post-training is measured against it. Scores come from the KB (the engine's greedy generation, exact match).
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from _common import config, rows, save

from ralph_ray import PROJECT_ROOT, sql
from ralph_ray.campaign import run
from ralph_ray.kb import open_reader
from ralph_ray.tasks import prepare_splits, tinypolicy
from ralph_ray.tasks.folder import prepare_module

CYCLES = int(sys.argv[1]) if len(sys.argv) > 1 else 5
CAP_S = int(sys.argv[2]) if len(sys.argv) > 2 else 1800
OVERRIDES = sys.argv[3:]  # for every campaign setting; resources=gpu saves as posttrain_gpu
NAME = "posttrain_gpu" if "resources=gpu" in OVERRIDES else "posttrain"


def _score(value: float | None) -> str:
    """A score to three places; '-' where no trial completed (the campaign's log says why)."""
    return "-" if value is None else f"{value:.3f}"


def main() -> None:
    root = Path(tempfile.mkdtemp(prefix="bench-posttrain-"))
    start = time.monotonic()
    cfg = config(
        root,
        "posttrain",
        "task=grpo",
        f"safeguards.max_cycles={CYCLES}",
        "safeguards.plateau_cycles=1000",
        f"safeguards.campaign_time_s={CAP_S}",
        *OVERRIDES,
    )
    splits = prepare_splits(cfg)  # builds (or finds) the cached base policy
    prepared = time.monotonic() - start
    spec = prepare_module(PROJECT_ROOT / "trainers" / "grpo").SPEC
    model, tok = tinypolicy.load(tinypolicy.base_policy(spec))
    base = {
        "selection": tinypolicy.exact_match(model, tok, np.asarray(splits.selection_y)[0]),
        "test": tinypolicy.exact_match(model, tok, np.asarray(splits.test_y)[0]),
    }
    start = time.monotonic()
    outcome = run(cfg)
    wall = time.monotonic() - start
    board = rows(open_reader(root / "kb"), sql.BENCH_LEADERBOARD, ["posttrain"])
    seed = next(r for r in board if r["status"] == "seed")
    best = board[0]
    figures = {
        "cycles": CYCLES,
        "cap_s": CAP_S,
        "overrides": OVERRIDES,
        "prepare_s": round(prepared, 1),
        "wall_s": round(wall, 1),
        "exit_code": int(outcome.exit_code),
        "variants": len(board),
        "trials": sum(int(r["trials"]) for r in board),
        "base_policy": base,
        "seed": {k: seed[k] for k in ("variant_id", "selection_score", "test_score")},
        "best": {k: best[k] for k in ("variant_id", "selection_score", "test_score", "interventions")},
    }
    lines = [
        f"task=grpo (two-digit addition, 200 held-out problems per split; exact match of the engine's greedy "
        f"answers), heuristic agent, up to {CYCLES} generations or {CAP_S} s: {figures['trials']} trials over "
        f"{figures['variants']} variants in {wall:.0f} s (exit {figures['exit_code']}; preparing the data and "
        f"finding or building the base: {prepared:.0f} s)"
        + (f"; overrides: {' '.join(OVERRIDES)}" if OVERRIDES else ""),
        "| policy | selection exact match | test exact match |",
        "| --- | --- | --- |",
        f"| pre-trained base (no post-training) | {base['selection']:.3f} | {base['test']:.3f} |",
        f"| seed {seed['variant_id']} (GRPO + LoRA, best knob sample) | {_score(seed['selection_score'])} | "
        f"{_score(seed['test_score'])} |",
        f"| best {best['variant_id']} ({best['interventions']}) | {_score(best['selection_score'])} | "
        f"{_score(best['test_score'])} |",
    ]
    save(NAME, figures, lines)


if __name__ == "__main__":
    main()
