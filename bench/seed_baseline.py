"""The digits seed trainer's frozen selection and test accuracy with its default knobs, over 3 seeds."""

from __future__ import annotations

import statistics
import tempfile
from pathlib import Path

from _common import config, save

from ralph_ray.campaign import run


def main() -> None:
    root = Path(tempfile.mkdtemp(prefix="bench-seed-"))
    selection, test = [], []
    for seed in (0, 1, 2):
        cfg = config(root, f"seed{seed}", "scheduler=fifo", "search.num_samples=1", f"search.seed={seed}")
        cfg.search.space = {}  # the trainer's own knob values
        record = run(cfg).records[0]
        selection.append(record.selection_score)
        test.append(record.test_score)
    figures = {
        "selection": selection,
        "test": test,
        "selection_mean": round(statistics.mean(selection), 4),
        "selection_std": round(statistics.stdev(selection), 4),
        "test_mean": round(statistics.mean(test), 4),
        "test_std": round(statistics.stdev(test), 4),
    }
    lines = [
        f"digits seed trainer (default knobs): selection {figures['selection_mean']:.4f} ± "
        f"{figures['selection_std']:.4f}, "
        f"test {figures['test_mean']:.4f} ± {figures['test_std']:.4f} (3 seeds: {selection} / {test})"
    ]
    save("seed_baseline", figures, lines)


if __name__ == "__main__":
    main()
