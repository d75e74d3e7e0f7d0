"""One intervention's effect on one trainer, outside a campaign: the parent and its child trained in full, side by side.

    python bench/intervention_effect.py self_model_head --trainer airbench_style --seeds 4 --lr 0.2 0.6
    python bench/intervention_effect.py hard_example_replay --trainer lm --seeds 4

Each arm (the trainer as written, and the trainer with the intervention's transform applied) trains as a real
subprocess on its task's own splits (digits for the fixture trainers and the digits seed, `task=lm` for the lm
seed; `--task` chooses another), written in the on-disk format trials read, once per seed and learning rate. Each
run is scored as a campaign scores it: the task's frozen metric on the selection split, on the trainer's
predictions, or, for a task scored by its model (lm), on the outputs of the engine's frozen evaluator run on the
exported model. The figure is the selection metric (accuracy; bits per byte for lm, lower is better), mean and
worst over the seeds that finished (a run that crashed is counted apart, as failed), and the child's mean minus the
parent's; beside it each arm's seconds per run (the whole process, start-up included; the evaluation apart) and
their ratio, the arms interleaved seed by seed.
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

from _common import config, save
from interventions import SEEDS, trainer_dirs

from ralph_ray import modeleval
from ralph_ray.agents.catalog import NotApplicable
from ralph_ray.agents.transforms import apply_transform
from ralph_ray.knobs import read_knobs, rewrite_knobs
from ralph_ray.runner import Limits, TrialFailed
from ralph_ray.sandbox import Policy, SandboxMode
from ralph_ray.scoring import ScoringError, score_predictions
from ralph_ray.tasks import prepare_splits
from ralph_ray.tasks.base import Direction, Labels, ScoredBy, write_public

EVAL_TIMEOUT_S = 600.0


def trainer_folders() -> dict[str, Path]:
    """The trainers this bench runs: the fixtures, the digits seed and the lm seed (cifar10 needs its own data)."""
    return {k: v for k, v in trainer_dirs().items() if k != "cifar10"} | {"lm": SEEDS / "lm"}


def trainer_source(name: str) -> str:
    """A fixture trainer's or a seed trainer's train.py."""
    folders = trainer_folders()
    if name not in folders:
        raise SystemExit(f"no trainer {name!r}: one of {', '.join(folders)}")
    return (folders[name] / "train.py").read_text()


def selection_metric(source: str, data_dir: Path, work: Path, seed: int, labels: Labels) -> tuple[float, float]:
    """Train `source` once (a fresh process, one thread) and score it as a campaign does: its selection metric
    (NaN if it failed) and the training process's seconds."""
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
    predictions = work / "predictions.npz"
    try:
        if labels.metric.scored_by is ScoredBy.model:  # the trainer's own outputs count for nothing
            limits = Limits(timeout_s=EVAL_TIMEOUT_S, sandbox=Policy(mode=SandboxMode.none))
            predictions = modeleval.evaluate(work, data_dir, limits, seed)
        score = score_predictions(predictions, labels).selection
    except (TrialFailed, ScoringError) as err:
        print(f"    seed {seed} unscored: {err}")
        return float("nan"), seconds
    return labels.metric.oriented(score), seconds  # the metric's own value (oriented twice)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("intervention", help="a code intervention of the catalog, e.g. self_model_head")
    parser.add_argument("--trainer", default="airbench_style", help="a fixture trainer or a seed trainer (digits, lm)")
    parser.add_argument("--task", default=None, help="the task whose splits it trains on (default: the trainer's)")
    parser.add_argument("--seeds", type=int, default=4)
    parser.add_argument(
        "--lr", type=float, nargs="*", default=[], help="learning rates to run at (default: the trainer's)"
    )
    parser.add_argument(
        "--name", default=None, help="result file name (default intervention_effect_<intervention>_<trainer>)"
    )
    args = parser.parse_args()

    parent = trainer_source(args.trainer)
    folder = trainer_folders()[args.trainer]
    task = args.task or (folder.name if folder.parent == SEEDS else "digits")  # a seed's own task; fixtures: digits
    try:
        child = apply_transform(args.intervention, parent)
    except (NotApplicable, KeyError) as reason:  # KeyError: no transform of that name
        raise SystemExit(f"{args.intervention} does not apply to {args.trainer}: {reason}") from None
    knobs = read_knobs(parent)
    if "LR" not in knobs:
        raise SystemExit(f"{args.trainer}'s train.py has no LR knob (UPPER_CASE constant) to run at")
    lrs = args.lr or [float(knobs["LR"])]
    figures: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="ralph-effect-") as tmp:
        root = Path(tmp)
        cfg = config(root, "effect", f"task={task}")
        splits = prepare_splits(cfg)
        labels = splits.labels()
        metric = labels.metric
        worst, better = (min, "higher") if metric.direction is Direction.max else (max, "lower")
        lines = [
            f"`{args.intervention}` on `{args.trainer}` (task={task}): selection {metric.name} ({better} is "
            f"better) over {args.seeds} seeds",
            "",
            "| LR | parent mean (worst) | child mean (worst) | child - parent "
            "| seconds per run, parent / child (ratio) |",
            "|---|---|---|---|---|",
        ]
        write_public(splits, root / "data", cfg.task.name)
        for lr in lrs:
            sources = {"parent": rewrite_knobs(parent, {"LR": lr}), "child": rewrite_knobs(child, {"LR": lr})}
            runs: dict[str, list[tuple[float, float]]] = {"parent": [], "child": []}
            for s in range(args.seeds):  # the arms interleaved, so a busy minute weighs on both alike
                for arm, source in sources.items():
                    work = root / f"{arm}_{lr}_{s}"
                    runs[arm].append(selection_metric(source, root / "data", work, s, labels))
            arms = {}
            for arm, done in runs.items():
                values = [v for v, _ in done]
                finite = [v for v in values if v == v]  # a run that crashed (a diverged model, say) has no score
                arms[arm] = {
                    "values": values,
                    "mean": statistics.fmean(finite) if finite else float("nan"),
                    "worst": worst(finite) if finite else float("nan"),
                    "failed": len(values) - len(finite),
                    "seconds": statistics.fmean(t for _, t in done),
                }
                print(f"LR {lr:g} {arm:6s} mean {arms[arm]['mean']:.4f} worst {arms[arm]['worst']:.4f} {values}")
            delta = arms["child"]["mean"] - arms["parent"]["mean"]
            ratio = arms["child"]["seconds"] / arms["parent"]["seconds"]
            figures[str(lr)] = arms | {"delta": delta, "seconds_ratio": ratio}
            parent_arm, child_arm = arms["parent"], arms["child"]
            failed = f", {child_arm['failed']} failed" if child_arm["failed"] else ""
            lines.append(
                f"| {lr:g} | {parent_arm['mean']:.4f} ({parent_arm['worst']:.4f}) | "
                f"{child_arm['mean']:.4f} ({child_arm['worst']:.4f}){failed} | {delta:+.4f} | "
                f"{parent_arm['seconds']:.1f} / {child_arm['seconds']:.1f} ({ratio:.2f}x) |"
            )
            print(f"LR {lr:g}: child - parent = {delta:+.4f} ({better} is better)", flush=True)
    save(
        args.name or f"intervention_effect_{args.intervention}_{args.trainer}",
        {"task": task, "metric": metric.name, "direction": metric.direction.value, "effects": figures},
        lines,
    )


if __name__ == "__main__":
    main()
