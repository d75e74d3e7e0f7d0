"""ASHA against running every config to the end: wall, epochs, and whether the best-at-end config survives.

`python bench/asha.py [R] [N] [OVERRIDE ...] [--name NAME] [--tolerance T]`: R repeats (default 10), each with its own
campaign seed (search.seed = 1..R), so each repeat trains other configs with another training seed; digits unless the
overrides name another task (`task=fashion task.subsample=20000`: Fashion-MNIST's real files, a stratified 20,000).
In each repeat three one-cycle campaigns (agent=none, safeguards.replicates=0) run the same N configs (default 10:
Optuna's first 10 are the seed's own knobs and seeded random samples, whatever the scheduler does), 2 at a time, in
one Ray that is started before any clock:

- all to the end (scheduler=fifo): the counterfactual, which gives the best-at-end config (highest frozen selection
  score after scheduler.max_t epochs: digits 12, fashion 4; ties count as one set) and the wall that ASHA is
  measured against;
- the old rule: plain ASHA, grace 2, reduction 2, no margin (`scheduler.margin=0`);
- the new rule: the defaults (the task's rungs: digits' trainers/digits/task.yaml grace 4, reduction 3; fashion's
  grace 1, reduction 2; the margin in conf/scheduler/asha.yaml: `scheduler.margin=auto`, ralph_ray/asha.py).

The three run in a rotating order per repeat, so drift in the machine's load falls on each alike. Kept: a config of
the best-at-end set completed under that rule (so the rule's own best equals the all-to-the-end best).
Also printed: a trial's fixed cost (start, data, predictions, bookkeeping) and its per-epoch cost, from a least-
squares fit of every trial's seconds on its epochs; their ratio bounds the wall ASHA can save on this task. The wall
ratio is noisy on a shared machine, so two steadier ratios are printed beside it: the trials' own seconds summed,
and each run's trials priced at that one fitted cost (the modelled wall ratio: epochs and trial counts only).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
from _common import config, save

from ralph_ray.campaign import run
from ralph_ray.raycluster import ensure_ray

RULES = {
    "all to the end": ["scheduler=fifo"],
    "old rule": ["scheduler=asha", "scheduler.margin=0", "scheduler.grace_period=2", "scheduler.reduction_factor=2"],
    "new rule": ["scheduler=asha"],
}
_parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
_parser.add_argument("repeats", nargs="?", type=int, default=10)
_parser.add_argument("configs", nargs="?", type=int, default=10)
_parser.add_argument("overrides", nargs="*", help="config overrides for every campaign (task=fashion ...)")
_parser.add_argument("--name", default="asha", help="the results' name under bench/results/")
_parser.add_argument(
    "--tolerance", type=float, default=0.0043, help="'near the best': digits' seed-to-seed selection spread by default"
)


def campaign(root: Path, name: str, seed: int, n: int, overrides: list[str]) -> dict:
    """One one-cycle campaign; its wall and each trial's outcome, keyed by its knobs."""
    start = time.perf_counter()
    outcome = run(
        config(
            root,
            name,
            f"search.num_samples={n}",
            f"search.seed={seed}",
            "agent=none",
            "safeguards.replicates=0",
            "population.mode=async",  # the default campaign's mode (bench's config() pins the barrier loop)
            *overrides,
        )
    )
    wall = time.perf_counter() - start
    trials: dict[str, dict] = {}
    for r in outcome.records:
        # A trial started as the cycle ended ("stopped with the cycle") is no sample of the N; keep the N's rows.
        if r.knobs in trials and trials[r.knobs]["status"] == "completed":
            continue
        trials[r.knobs] = {"status": r.status.value, "epochs": r.epochs, "selection": r.selection_score}
    return {
        "wall_s": round(wall, 2),
        "epochs": sum(r.epochs for r in outcome.records),
        "trial_costs": [(r.epochs, round(r.seconds, 3)) for r in outcome.records],
        "trials": trials,
    }


def main() -> None:
    args = _parser.parse_args()
    repeats, n, overrides = args.repeats, args.configs, args.overrides
    root = Path(tempfile.mkdtemp(prefix="bench-asha-"))
    probe = config(root, "probe", *overrides)  # the task's rungs and name, as every campaign below reads them
    max_t, task = probe.scheduler.max_t, probe.task.name
    ensure_ray(2)  # started before any clock: no campaign pays ray.init
    rows = []
    names = list(RULES)
    for rep in range(repeats):
        seed = rep + 1
        order = names[rep % 3 :] + names[: rep % 3]
        runs = {
            name: campaign(root, f"s{seed}-{name.replace(' ', '-')}", seed, n, [*overrides, *RULES[name]])
            for name in order
        }
        full = runs["all to the end"]["trials"]
        scored = {
            k: t["selection"] for k, t in full.items() if t["status"] == "completed" and t["selection"] is not None
        }
        best = max(scored.values())
        best_set = [k for k, v in scored.items() if v == best]
        row = {"seed": seed, "order": order, "best_at_end": best, "best_set": [json.loads(k) for k in best_set]}
        for name in ("old rule", "new rule"):
            got = runs[name]
            same = set(got["trials"]) >= set(scored)
            completed = [k for k, t in got["trials"].items() if t["status"] == "completed" and k in scored]
            row[name] = {
                "kept": any(got["trials"].get(k, {}).get("status") == "completed" for k in best_set),
                "its_best_at_end": max((scored[k] for k in completed), default=None),
                "best_config_status": [got["trials"].get(k, {}).get("status", "not run") for k in best_set],
                "wall_ratio": round(got["wall_s"] / runs["all to the end"]["wall_s"], 3),
                "epochs_fraction": round(got["epochs"] / runs["all to the end"]["epochs"], 3),
                "same_configs": same,
            }
        row["runs"] = runs
        rows.append(row)
        print(
            f"repeat {rep + 1}/{repeats} (seed {seed}): all-to-end {runs['all to the end']['wall_s']:.1f} s; "
            + "; ".join(
                f"{name} kept {row[name]['kept']} wall {row[name]['wall_ratio']:.2f} epochs "
                f"{row[name]['epochs_fraction']:.2f}"
                for name in ("old rule", "new rule")
            ),
            flush=True,
        )

    costs = [c for row in rows for r in row["runs"].values() for c in r["trial_costs"] if c[0] > 0]
    epochs = np.array([c[0] for c in costs], float)
    seconds = np.array([c[1] for c in costs], float)
    per_epoch, fixed = np.polyfit(epochs, seconds, 1)

    def modelled(run: dict) -> float:
        """The run's trial-seconds under the fitted cost, the same for every run: wall without the load's noise."""
        return sum(fixed + per_epoch * e for e, _ in run["trial_costs"])

    summary = {}
    for name in ("old rule", "new rule"):
        walls = [row[name]["wall_ratio"] for row in rows]
        measured = [
            sum(s for _, s in row["runs"][name]["trial_costs"])
            / sum(s for _, s in row["runs"]["all to the end"]["trial_costs"])
            for row in rows
        ]
        summary[name] = {
            "kept": sum(row[name]["kept"] for row in rows),
            "mean_wall_ratio": round(statistics.mean(walls), 3),
            "median_wall_ratio": round(statistics.median(walls), 3),
            "mean_trial_seconds_ratio": round(statistics.mean(measured), 3),
            "modelled_ratio": round(
                statistics.mean(modelled(row["runs"][name]) / modelled(row["runs"]["all to the end"]) for row in rows),
                3,
            ),
            "mean_epochs_fraction": round(statistics.mean(row[name]["epochs_fraction"] for row in rows), 3),
            "within_one_selection_sd": sum(
                (row[name]["its_best_at_end"] or -1.0) >= row["best_at_end"] - args.tolerance for row in rows
            ),
            "same_configs": sum(row[name]["same_configs"] for row in rows),
        }
    walls = [row["runs"]["all to the end"]["wall_s"] for row in rows]
    lines = [
        f"ASHA vs every config to the end: {repeats} repeats (campaign seeds 1-{repeats}), {n} {task} configs each "
        f"(max {max_t} epochs, 2 at a time, async, agent=none, no replicates); all to the end took "
        f"{statistics.mean(walls):.1f} s on average ({min(walls):.1f}-{max(walls):.1f})",
        "",
        f"| rule | best-at-end config kept | its best within {args.tolerance:g} of it | wall ratio: mean / median | "
        "trial-seconds ratio | modelled wall ratio | epochs fraction |",
        "| --- | --- | --- | --- | --- | --- | --- |",
        *(
            f"| {name} | {s['kept']} of {repeats} | {s['within_one_selection_sd']} of {repeats} | "
            f"{s['mean_wall_ratio']:.2f} / {s['median_wall_ratio']:.2f} | {s['mean_trial_seconds_ratio']:.2f} | "
            f"{s['modelled_ratio']:.2f} | {s['mean_epochs_fraction']:.2f} |"
            for name, s in summary.items()
        ),
        "",
        "old rule: grace 2, reduction 2, scheduler.margin=0 (plain ASHA); new rule: the defaults (the task's rungs: "
        f"grace {probe.scheduler.grace_period}, reduction {probe.scheduler.reduction_factor} for {task}; "
        "scheduler.margin=auto, ralph_ray/asha.py)",
        *([f"overrides: `{' '.join(overrides)}`"] if overrides else []),
        f"a trial's cost: {fixed:.2f} s fixed + {per_epoch:.3f} s per epoch (least squares over {len(costs)} trials); "
        f"a trial stopped after 1 of {max_t} epochs still costs "
        f"{(fixed + per_epoch) / (fixed + max_t * per_epoch):.2f} of a full one",
        "ratios are to all-to-the-end in the same repeat, averaged over repeats; trial-seconds: the trials' own "
        "seconds summed; modelled: each run's trials priced at the fitted cost (the same for every run), which takes "
        "the machine's load out",
        "2-core machine shared with other jobs: walls are noisy.",
    ]
    save(
        args.name,
        {
            "repeats": repeats,
            "configs": n,
            "task": task,
            "overrides": overrides,
            "summary": summary,
            "trial_fixed_s": round(float(fixed), 3),
            "trial_per_epoch_s": round(float(per_epoch), 4),
            "rows": rows,
        },
        lines,
    )


if __name__ == "__main__":
    main()
