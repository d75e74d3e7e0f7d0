"""What one more addition to the final training buys: the final trial of a finished campaign trained again, as it ran
and with the offline agent's transform(s) added, arms interleaved per seed in one run, each arm scored by the
engine's frozen evaluator on the official test split.

    python bench/final_additions.py /tmp/bench-fashion-XXXX/heuristic-1 --arms batchnorm --seeds 0 1

The first argument is a campaign folder of bench/fashion.py (its `runs/` and `kb/`). The final trial's code as run
(the pick's files with `safeguards.final_additions` added, `runs/<id>/final/code/`) is the
baseline arm ("as_run"); every other arm applies the named transforms of `ralph_ray.agents.transforms` on top, and
its NAME=value parts override knobs ("batchnorm+WIDTH=32"). Each
trial is a one-trial campaign of the same task with the final's knobs and budget, on --cpus CPUs. Never in CI.

--code PATH makes another train.py the baseline, to measure an addition the final already had: the pick's files with
every addition but that one (`finaltrain.with_additions`), against the arm that adds it back:

    python bench/final_additions.py /tmp/bench-fashion-XXXX/heuristic-1 --code /tmp/no-deepen/train.py --arms deepen
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from _common import config, fixed_knobs, save

from ralph_ray import PROJECT_ROOT, sql
from ralph_ray.agents.transforms import apply_transform
from ralph_ray.campaign import run
from ralph_ray.finals import final_winner
from ralph_ray.kb import open_reader
from ralph_ray.report import fetch_rows

BASELINE = "as_run"


def final_trial(folder: Path) -> tuple[str, dict[str, object], Path]:
    """The campaign's final trial (the winner, with several): its run id, knobs and code as run."""
    (run_dir,) = (folder / "runs").iterdir()
    con = open_reader(folder / "kb")
    best = final_winner(fetch_rows(con, sql.FINAL_TRIAL, [run_dir.name]))
    if best is None:
        raise SystemExit(f"{folder}: the campaign has no final trial (safeguards.final_share=0, or it was stopped)")
    variant = str(best["variant_id"])
    code = run_dir / "final" / "code" / variant  # the additions' copy; absent when none applied
    if not code.exists():
        code = run_dir / "variants" / variant / "files"
    return run_dir.name, json.loads(str(best["knobs"]) or "{}"), code / "train.py"


def split(arm: str) -> tuple[list[str], dict[str, object]]:
    """An arm's transforms and knob overrides: "batchnorm+WIDTH=32" -> (["batchnorm"], {"WIDTH": 32})."""
    parts = [p for p in arm.split("+") if p and p != BASELINE]
    knobs = {k: json.loads(v) for k, v in (p.split("=", 1) for p in parts if "=" in p)}
    return [p for p in parts if "=" not in p], knobs


def trainer(root: Path, task_trainer: Path, source: str, transforms: list[str]) -> Path:
    """A task folder for one arm: the task's own files with train.py replaced by `source` plus `transforms`."""
    for name in transforms:
        source = apply_transform(name, source)  # NotApplicable ends the bench: an arm that is not one is no figure
    folder = root / "+".join(transforms or [BASELINE])
    if not folder.exists():
        shutil.copytree(task_trainer, folder)
        (folder / "train.py").write_text(source)
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("campaign", type=Path, help="a bench/fashion.py campaign folder (runs/ and kb/)")
    parser.add_argument("--arms", nargs="+", default=["batchnorm"], help="each: transforms joined by '+'")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    parser.add_argument("--budget-s", type=float, default=295.0, help="training seconds (the final's, 30-min run)")
    parser.add_argument("--cpus", type=int, default=2)
    parser.add_argument("--task", default="fashion")
    parser.add_argument("--name", default="final_additions")
    parser.add_argument("--code", type=Path, help="the baseline's train.py instead of the final's as run")
    args = parser.parse_args()

    run_id, knobs, code = final_trial(args.campaign)
    code = args.code or code
    root = Path(tempfile.mkdtemp(prefix="bench-final-additions-"))
    task_trainer = PROJECT_ROOT / "trainers" / args.task
    arms = {BASELINE: (trainer(root, task_trainer, code.read_text(), []), knobs)}
    for arm in args.arms:
        transforms, overrides = split(arm)
        arms[arm] = (trainer(root, task_trainer, code.read_text(), transforms), {**knobs, **overrides})
    print(f"{run_id}: final knobs {json.dumps(knobs)}, code {code}; arms {list(arms)}; work in {root}", flush=True)

    results: list[dict[str, object]] = []
    for seed in args.seeds:  # arms interleaved per seed: both see the same stretch of machine load
        for arm, (folder, arm_knobs) in arms.items():
            began = time.monotonic()
            cfg = config(
                root,
                f"{arm}-{seed}".replace("+", "_").replace("=", ""),
                f"task={args.task}",
                f"task.trainer={folder}",
                "agent=none",
                "scheduler=fifo",
                "search.num_samples=1",
                "search.max_concurrent=1",
                f"search.seed={seed}",
                f"resources.cpu={args.cpus}",
                f"trial.budget_s={args.budget_s}",
                "trial.grace_s=60",
                "safeguards.replicates=0",
            )
            record = run(fixed_knobs(cfg, **arm_knobs)).records[0]
            results.append(
                {
                    "arm": arm,
                    "seed": seed,
                    "knobs": arm_knobs,
                    "status": record.status.value,
                    "epochs": record.epochs,
                    "selection": record.selection_score,
                    "test": record.test_score,
                    "wall_s": round(time.monotonic() - began, 1),
                }
            )
            print(json.dumps(results[-1]), flush=True)

    lines = [
        f"final trial of {run_id} ({args.campaign}), knobs {json.dumps(knobs)}, {args.budget_s:g} s on "
        f"{args.cpus} CPU(s), seeds {args.seeds}, arms interleaved per seed"
        + (f"; baseline code {args.code} (--code), not the final's as run" if args.code else "")
    ]
    summary: dict[str, dict[str, float]] = {}
    for arm in arms:
        mine = [r for r in results if r["arm"] == arm and r["test"] is not None]
        tests = [float(r["test"]) for r in mine]  # type: ignore[arg-type]
        if not tests:
            lines.append(f"- {arm}: no scored trial")
            continue
        summary[arm] = {
            "test_mean": round(statistics.mean(tests), 4),
            "test_std": round(statistics.stdev(tests), 4) if len(tests) > 1 else 0.0,
            "selection_mean": round(statistics.mean(float(r["selection"]) for r in mine), 4),  # type: ignore[arg-type]
            "epochs_mean": round(statistics.mean(int(r["epochs"]) for r in mine), 1),  # type: ignore[arg-type]
        }
        s = summary[arm]
        lines.append(
            f"- {arm}: test {s['test_mean']:.4f} ± {s['test_std']:.4f}, selection {s['selection_mean']:.4f}, "
            f"{s['epochs_mean']:g} epochs"
        )
    base = summary.get(BASELINE)
    for arm, s in summary.items():
        if base and arm != BASELINE:
            lines.append(
                f"- {arm} vs {BASELINE}: test {s['test_mean'] - base['test_mean']:+.4f}, "
                f"ratio of errors {(1 - s['test_mean']) / (1 - base['test_mean']):.3f}"
            )
    save(
        args.name, {"run_id": run_id, "knobs": knobs, "code": str(code), "results": results, "summary": summary}, lines
    )


if __name__ == "__main__":
    main()
