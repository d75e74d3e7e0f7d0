"""ASHA's saving: epochs trained / epochs if every trial ran to the end, and whether the best survived."""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

from _common import config, save

from ralph_ray.campaign import run

N = 12


def main() -> None:
    root = Path(tempfile.mkdtemp(prefix="bench-asha-"))
    start = time.perf_counter()
    asha = run(config(root, "asha", f"search.num_samples={N}"))
    asha_wall = time.perf_counter() - start
    start = time.perf_counter()
    fifo = run(config(root, "fifo", f"search.num_samples={N}", "scheduler=fifo"))
    fifo_wall = time.perf_counter() - start

    max_t = 12
    trained = sum(r.epochs for r in asha.records)
    same = sorted(r.knobs for r in asha.records) == sorted(r.knobs for r in fifo.records)
    best_fifo = max((r for r in fifo.records if r.selection_score is not None), key=lambda r: r.selection_score)
    survivor = next(r for r in asha.records if r.knobs == best_fifo.knobs)
    best_asha = max((r for r in asha.records if r.selection_score is not None), key=lambda r: r.selection_score)
    figures = {
        "trials": N, "max_epochs": max_t, "epochs_trained": trained, "epochs_if_all_ran": N * max_t,
        "fraction": round(trained / (N * max_t), 3), "same_configs_in_both_runs": same,
        "fifo_best_knobs": json.loads(best_fifo.knobs), "fifo_best_selection": best_fifo.selection_score,
        "fifo_best_status_under_asha": survivor.status.value, "asha_best_selection": best_asha.selection_score,
        "asha_best_test": best_asha.test_score, "fifo_best_test": best_fifo.test_score,
        "asha_wall_s": round(asha_wall, 1), "fifo_wall_s": round(fifo_wall, 1),
        "completed_under_asha": sum(r.status.value == "completed" for r in asha.records),
    }
    lines = [
        f"ASHA on {N} digits trials (max {max_t} epochs, grace 2, reduction 2):",
        f"  epochs trained {trained} / {N * max_t} if all ran = {trained / (N * max_t):.2f}",
        f"  wall: ASHA {asha_wall:.1f} s vs FIFO {fifo_wall:.1f} s (ratio {asha_wall / fifo_wall:.2f}); same sampled configs: {same}",
        f"  FIFO's best config (selection {best_fifo.selection_score:.4f}) under ASHA: {survivor.status.value}",
        f"  best selection: ASHA {best_asha.selection_score:.4f} (test {best_asha.test_score:.4f}) vs FIFO {best_fifo.selection_score:.4f} (test {best_fifo.test_score:.4f})",
    ]
    save("asha", figures, lines)


if __name__ == "__main__":
    main()
