"""ASHA's saving: epochs trained / epochs if every trial ran to the end, and whether the best survived."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from _common import config, save

from ralph_ray import PROJECT_ROOT
from ralph_ray.campaign import run
from ralph_ray.knobs import rewrite_knobs
from ralph_ray.scoring import score_predictions
from ralph_ray.tasks.base import write_public
from ralph_ray.tasks.digits import prepare

N = 12


def run_to_the_end(root: Path, knobs: dict) -> float:
    """Train one config for all its epochs outside Ray and return its frozen selection score."""
    data = root / "data"
    if not data.exists():
        write_public(prepare(0, 0.2, 0.2), data, "digits")
    work = Path(tempfile.mkdtemp(dir=root, prefix="full-"))
    (work / "train.py").write_text(rewrite_knobs((PROJECT_ROOT / "trainers/digits/train.py").read_text(), knobs))
    env = {
        **os.environ,
        "RALPH_DATA_DIR": str(data),
        "RALPH_METRICS_FILE": str(work / "m.jsonl"),
        "RALPH_PREDICTIONS_FILE": str(work / "p.npz"),
        "OMP_NUM_THREADS": "1",
    }
    subprocess.run([sys.executable, "train.py"], cwd=work, env=env, check=True, capture_output=True)
    return score_predictions(work / "p.npz", prepare(0, 0.2, 0.2).labels()).selection


def main() -> None:
    root = Path(tempfile.mkdtemp(prefix="bench-asha-"))
    start = time.perf_counter()
    asha = run(config(root, "asha", f"search.num_samples={N}"))
    asha_wall = time.perf_counter() - start

    # The counterfactual: every config ASHA sampled, trained to the end (2 at a time, as the campaign).
    start = time.perf_counter()
    with ThreadPoolExecutor(2) as pool:
        full = list(pool.map(lambda r: run_to_the_end(root, json.loads(r.knobs)), asha.records))
    full_wall = time.perf_counter() - start

    max_t = 12
    trained = sum(r.epochs for r in asha.records)
    best_index = max(range(N), key=lambda i: full[i])
    best = asha.records[best_index]
    best_asha = max((r for r in asha.records if r.selection_score is not None), key=lambda r: r.selection_score)
    figures = {
        "trials": N,
        "max_epochs": max_t,
        "epochs_trained": trained,
        "epochs_if_all_ran": N * max_t,
        "fraction": round(trained / (N * max_t), 3),
        "best_config_if_all_ran": json.loads(best.knobs),
        "its_selection_if_run_to_the_end": full[best_index],
        "its_status_under_asha": best.status.value,
        "asha_best_selection": best_asha.selection_score,
        "asha_best_test": best_asha.test_score,
        "asha_wall_s": round(asha_wall, 1),
        "all_to_the_end_wall_s": round(full_wall, 1),
        "completed_under_asha": sum(r.status.value == "completed" for r in asha.records),
    }
    lines = [
        f"ASHA on {N} digits trials (max {max_t} epochs, grace 2, reduction 2):",
        f"  epochs trained {trained} / {N * max_t} if all ran = {trained / (N * max_t):.2f}",
        f"  the best config when every config runs to the end (selection {full[best_index]:.4f}) was "
        f"{best.status.value} under ASHA",
        f"  ASHA's best: selection {best_asha.selection_score:.4f}, test {best_asha.test_score:.4f}; "
        f"{sum(r.status.value == 'completed' for r in asha.records)} of {N} completed",
        f"  wall: campaign with ASHA {asha_wall:.1f} s; the same configs run to the end outside Ray {full_wall:.1f} s",
    ]
    save("asha", figures, lines)


if __name__ == "__main__":
    main()
