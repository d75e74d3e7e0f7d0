"""One intervention's effect on one trainer, outside a campaign: the parent and its child trained in full, side by side.

    python bench/intervention_effect.py self_model_head --trainer airbench_style --seeds 4 --lr 0.2 0.6

Each arm (the trainer as written, and the trainer with the intervention's transform applied) trains as a real
subprocess on digits (the task's own splits, written in the on-disk format trials read), once per seed and learning
rate; the figure is the selection accuracy, mean and minimum over the seeds that finished (a run that crashed is
counted apart, as failed), and the child's mean minus the parent's; beside it each arm's seconds per run (the whole
process, start-up included) and their ratio, the arms interleaved seed by seed.
A campaign mixes an intervention's effect with the knobs Optuna samples and ASHA's stops; this isolates it, which is
how a child that breaks its trainer (an unstable auxiliary loss, a diverging schedule) shows up in minutes.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from _common import save
from interventions import trainer_dirs

from ralph_ray.agents.catalog import NotApplicable
from ralph_ray.agents.transforms import apply_transform
from ralph_ray.knobs import read_knobs, rewrite_knobs
from ralph_ray.tasks.base import write_public
from ralph_ray.tasks.digits import prepare


def trainer_source(name: str) -> str:
    """A fixture trainer's or a seed trainer's train.py (the trainers bench/interventions.py compares)."""
    folders = {k: v for k, v in trainer_dirs().items() if k != "cifar10"}  # the bench trains on digits
    if name not in folders:
        raise SystemExit(f"no trainer {name!r}: one of {', '.join(folders)}")
    return (folders[name] / "train.py").read_text()


def selection_accuracy(source: str, data_dir: Path, work: Path, seed: int, truth: np.ndarray) -> tuple[float, float]:
    """Train `source` once (a fresh process, one thread): its selection accuracy (NaN if it failed) and seconds."""
    work.mkdir(parents=True)
    (work / "train.py").write_text(source)
    env = os.environ | {
        "RALPH_DATA_DIR": str(data_dir),
        "RALPH_SEED": str(seed),
        "RALPH_DEVICE": "cpu",
        "OMP_NUM_THREADS": "1",
    }
    start = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "train.py"], cwd=work, env=env, capture_output=True, text=True, check=False
    )
    seconds = time.perf_counter() - start
    if result.returncode != 0:
        print(f"    seed {seed} failed: {result.stderr.strip().splitlines()[-1] if result.stderr.strip() else '?'}")
        return float("nan"), seconds
    return float((np.load(work / "predictions.npz")["selection"] == truth).mean()), seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("intervention", help="a code intervention of the catalog, e.g. self_model_head")
    parser.add_argument("--trainer", default="airbench_style", help="a fixture trainer or a seed trainer (digits)")
    parser.add_argument("--seeds", type=int, default=4)
    parser.add_argument(
        "--lr", type=float, nargs="*", default=[], help="learning rates to run at (default: the trainer's)"
    )
    parser.add_argument(
        "--name", default=None, help="result file name (default intervention_effect_<intervention>_<trainer>)"
    )
    args = parser.parse_args()

    parent = trainer_source(args.trainer)
    try:
        child = apply_transform(args.intervention, parent)
    except (NotApplicable, KeyError) as reason:  # KeyError: no transform of that name
        raise SystemExit(f"{args.intervention} does not apply to {args.trainer}: {reason}") from None
    knobs = read_knobs(parent)
    if "LR" not in knobs:
        raise SystemExit(f"{args.trainer}'s train.py has no LR knob (UPPER_CASE constant) to run at")
    lrs = args.lr or [float(knobs["LR"])]
    splits = prepare(0, 0.2, 0.2)
    figures: dict[str, dict] = {}
    lines = [f"`{args.intervention}` on `{args.trainer}`: selection accuracy over {args.seeds} seeds", ""]
    lines += [
        "| LR | parent mean (min) | child mean (min) | child - parent | seconds per run, parent / child (ratio) |",
        "|---|---|---|---|---|",
    ]
    with tempfile.TemporaryDirectory(prefix="ralph-effect-") as tmp:
        root = Path(tmp)
        write_public(splits, root / "data", "digits")
        for lr in lrs:
            sources = {"parent": rewrite_knobs(parent, {"LR": lr}), "child": rewrite_knobs(child, {"LR": lr})}
            runs: dict[str, list[tuple[float, float]]] = {"parent": [], "child": []}
            for s in range(args.seeds):  # the arms interleaved, so a busy minute weighs on both alike
                for arm, source in sources.items():
                    work = root / f"{arm}_{lr}_{s}"
                    runs[arm].append(selection_accuracy(source, root / "data", work, s, splits.selection_y))
            arms = {}
            for arm, done in runs.items():
                accs = [a for a, _ in done]
                finite = [a for a in accs if a == a]  # a run that crashed (a diverged model, say) has no score
                arms[arm] = {
                    "accuracies": accs,
                    "mean": statistics.fmean(finite) if finite else float("nan"),
                    "min": min(finite) if finite else float("nan"),
                    "failed": len(accs) - len(finite),
                    "seconds": statistics.fmean(t for _, t in done),
                }
                print(f"LR {lr:g} {arm:6s} mean {arms[arm]['mean']:.4f} min {arms[arm]['min']:.4f} {accs}", flush=True)
            delta = arms["child"]["mean"] - arms["parent"]["mean"]
            ratio = arms["child"]["seconds"] / arms["parent"]["seconds"]
            figures[str(lr)] = arms | {"delta": delta, "seconds_ratio": ratio}
            parent_arm, child_arm = arms["parent"], arms["child"]
            failed = f", {child_arm['failed']} failed" if child_arm["failed"] else ""
            lines.append(
                f"| {lr:g} | {parent_arm['mean']:.4f} ({parent_arm['min']:.4f}) | "
                f"{child_arm['mean']:.4f} ({child_arm['min']:.4f}){failed} | {delta:+.4f} | "
                f"{parent_arm['seconds']:.1f} / {child_arm['seconds']:.1f} ({ratio:.2f}x) |"
            )
            print(f"LR {lr:g}: child - parent = {delta:+.4f}")
    save(args.name or f"intervention_effect_{args.intervention}_{args.trainer}", {"effects": figures}, lines)


if __name__ == "__main__":
    main()
