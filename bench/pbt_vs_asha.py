"""PBT against ASHA at the same wall budget: one cycle of knob search on the digits seed, best test score, epochs.

    python bench/pbt_vs_asha.py                    # the REDUCED run recorded in bench/results (7.5 minutes)
    python bench/pbt_vs_asha.py --budget-s 600 --task fashion --epochs 12   # on 2 CPU cores PBT finishes no trial
    python bench/pbt_vs_asha.py --task fashion --epochs 24 --budget-s 120 --cpus 16 --gpus 1 --asha-slots 4 \
        --name pbt_vs_asha_fashion_gpu -- resources=gpu sandbox=none data.root=/tmp/fm   # one GPU (bench/device)
    python bench/pbt_vs_asha.py --task fashion --epochs 6 --budget-s 720 --kinds asha,pbt \
        --name pbt_vs_asha_fashion_cpu6                   # Fashion on 2 CPU cores, sized so PBT's population finishes

Each kind is one `agent=none` cycle (the seed's knob search) under the same Tune time budget
(`safeguards.cycle_time_s`) on the same machine share (--cpus, --gpus; by default 2 CPUs): ASHA samples many configs
(Optuna), --asha-slots at a time (2: 1 CPU each), and stops laggards; PBT trains a population of 4 together (a
quarter of the share each), every 2 epochs the bottom half copying a top trial's weights and knobs and perturbing
LR; `pbt8` a population of 8 (an eighth each, the bottom quarter). Overrides after `--` go to every kind.
Figures per kind: the best trial's (by selection score) test score, trials completed and stopped, epochs trained,
exploit steps, wall seconds. Never in CI.
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import time
from pathlib import Path

from _common import config, save
from rich.console import Console

from ralph_ray.campaign import run
from ralph_ray.kb import open_reader


def kinds(args: argparse.Namespace) -> dict[str, list[str]]:
    """Each kind's overrides: its scheduler and population, with the machine share split among its slots."""

    def share(slots: int) -> list[str]:
        gpu = [f"resources.gpu={args.gpus / slots:g}"] if args.gpus else []
        return [f"search.max_concurrent={slots}", f"resources.cpu={args.cpus / slots:g}", *gpu]

    def pbt(population: int, quantile: float) -> list[str]:
        return [
            "scheduler=pbt",
            "scheduler.perturbation_interval=2",
            f"scheduler.quantile_fraction={quantile}",
            "scheduler.mutate=[LR]",
            f"search.num_samples={population}",
            *share(population),
        ]

    return {
        "asha": ["scheduler=asha", "scheduler.grace_period=1", "search.num_samples=64", *share(args.asha_slots)],
        "pbt": pbt(4, 0.5),
        # A population twice as large on the same share: PBT stops no trial, so its population sets its work.
        "pbt8": pbt(8, 0.25),
    }


def one(root: Path, kind: str, args: argparse.Namespace) -> dict:
    """One cycle of `kind` under the budget; its figures from the KB."""
    cfg = config(
        root,
        kind,
        *kinds(args)[kind],
        *([f"task={args.task}"] if args.task != "digits" else []),
        "agent=none",
        "safeguards.replicates=0",
        f"safeguards.cycle_time_s={args.budget_s}",
        f"safeguards.trial_timeout_s={args.budget_s + 60}",
        f"scheduler.max_t={args.epochs}",
        f"+search.space.EPOCHS={{type: choice, values: [{args.epochs}]}}",
        f"search.seed={args.seed}",
        *args.overrides,
    )
    start = time.monotonic()
    run(cfg, Console(file=io.StringIO()))
    wall = time.monotonic() - start
    con = open_reader(root / "kb")
    counts = dict(
        con.execute("select status, count(*) from trials where run_id = ? group by status", [kind]).fetchall()
    )
    epochs = con.execute("select coalesce(sum(epochs), 0) from trials where run_id = ?", [kind]).fetchone()[0]
    best = con.execute(
        "select trial_id, selection_score, test_score, knobs from trials where run_id = ? "
        "and selection_score is not null order by selection_score desc limit 1",
        [kind],
    ).fetchone()
    exploits = con.execute(
        "select count(*) from segments where run_id = ? and donor_trial_id is not null", [kind]
    ).fetchone()[0]
    return {
        "wall_s": round(wall, 1),
        "trials": counts,
        "epochs_trained": int(epochs),
        "best_trial": best[0] if best else None,
        "best_selection": best[1] if best else None,
        "best_test": best[2] if best else None,
        "best_knobs": best[3] if best else None,
        "exploits": int(exploits),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budget-s", type=float, default=150.0, help="Tune's time budget per kind (cycle_time_s)")
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--task", default="digits")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--root", type=Path, default=None)
    parser.add_argument("--cpus", type=float, default=2.0, help="CPUs every kind shares among its slots")
    parser.add_argument("--gpus", type=float, default=0.0, help="GPUs every kind shares among its slots")
    parser.add_argument("--asha-slots", type=int, default=2, help="ASHA's concurrent trials")
    parser.add_argument("--name", default="pbt_vs_asha", help="the results file's name under bench/results")
    parser.add_argument("--note", default=None, help="the REDUCED line (default: the digits run's)")
    parser.add_argument("--kinds", default="asha,pbt,pbt8", help="which kinds to run, comma-separated")
    parser.add_argument("overrides", nargs="*", help="config overrides for every kind (after --)")
    args = parser.parse_args()
    root = args.root or Path(os.environ.get("TMPDIR", "/tmp")) / f"pbt_vs_asha_{int(time.time())}"
    load = os.getloadavg()[0]
    results: dict[str, dict] = {}
    chosen = [kind for kind in kinds(args) if kind in args.kinds.split(",")]
    if not chosen:
        parser.error(f"--kinds {args.kinds!r} names none of {', '.join(kinds(args))}")
    for kind in chosen:  # saved after each kind: a run cut short (a device call's limit) keeps what it has
        results[kind] = one(root / kind, kind, args)
        report(args, load, results)


def report(args: argparse.Namespace, load: float, results: dict[str, dict]) -> None:
    """Write bench/results/<name>.{json,md} with the kinds measured so far."""
    lines = [
        f"# PBT vs ASHA at the same wall budget ({args.task}, {args.budget_s:.0f} s of Tune budget each, "
        f"{args.epochs}-epoch trials, {args.cpus:g} CPUs" + (f", {args.gpus:g} GPU)" if args.gpus else ")"),
        "",
        args.note
        or (
            "REDUCED: one seed, one cycle per kind, digits (Fashion-MNIST's 20-s epochs on these 2 cores would not "
            "fit 8 minutes for all), 150-s budgets, populations of 4 and 8; the machine is shared (load at start "
            f"{load:.1f})."
        ),
        "",
        "| kind | best test | its selection | trials (status: count) | epochs trained | exploits | wall s |",
        "|---|---|---|---|---|---|---|",
    ]
    for kind, r in results.items():
        test = "-" if r["best_test"] is None else f"{r['best_test']:.4f}"
        sel = "-" if r["best_selection"] is None else f"{r['best_selection']:.4f}"
        lines.append(
            f"| {kind} | {test} | {sel} | {r['trials']} | {r['epochs_trained']} | {r['exploits']} | {r['wall_s']} |"
        )
    figures = {"args": {k: str(v) for k, v in vars(args).items()}, "load_at_start": load, "results": results}
    save(args.name, figures, lines)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
