"""False keeps (digits by default): how many kept children are really better than their parents, before (one trial beats
the parent's by min_delta) and after (replicates + a one-sided Welch test at safeguards.confidence).

Each campaign's kept children are re-run with 5 new seeds (101-105), and so are their parents (at the knobs the
child was judged against: the parent's best search trial's); a keep is true when the child's 5-seed mean beats
its parent's. Reduced to fit a 2-core box shared with other jobs: 2 campaigns per mode (not 3), 6 epochs per
trial (not 12, so seed noise is larger than the default trainer's), 3 cycles of 1 parent x 2 children.

    python bench/false_keeps.py [campaigns per mode] [index of the first: adds to the recorded ones] [OVERRIDE ...]
        [--name NAME]
    python bench/false_keeps.py 2 0 task=fashion task.subsample=20000 --name false_keeps_fashion   # real data

OVERRIDEs go to every campaign and check (another task: its own space, plus EPOCHS fixed at 6 as here); --name is the
results' name under bench/results/ (a later batch adds to that name's recorded campaigns).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from _common import RESULTS, config, save
from rich.console import Console

from ralph_ray import history, replicates
from ralph_ray.campaign import run
from ralph_ray.config import TaskConfig
from ralph_ray.kb import open_reader
from ralph_ray.ledger import TrialRecord
from ralph_ray.rundir import write_data
from ralph_ray.tasks import prepare_splits
from ralph_ray.trials import REPLICATE_KEY, SEED_KEY

CHECK_SEEDS = [101, 102, 103, 104, 105]
CAMPAIGN = [
    "agent=heuristic",
    "safeguards.max_cycles=3",
    "safeguards.plateau_cycles=3",
    "population.parents=1",
    "population.children_per_parent=2",
    "population.trials_per_child=1",
    "search.num_samples=3",
    "scheduler.max_t=6",
    "+search.space.EPOCHS={type: choice, values: [6]}",
]
MODES = {"before (one trial, min_delta)": ["safeguards.replicates=0"], "after (replicates=3, Welch 90%)": []}


def check(root: Path, name: str, overrides: list[str]) -> list[dict]:
    """Run one campaign, then re-run each kept child and its parent with 5 new seeds."""
    cfg = config(root, name, *overrides, *CAMPAIGN)
    outcome = run(cfg)
    con = open_reader(outcome.kb_root)
    kept = con.execute(
        "select variant_id, parent_id from variants where run_id = ? and status = 'kept'", [name]
    ).fetchall()
    if not kept:
        return []
    knobs = replicates.best_knobs(con, name)
    variants = sorted({v for pair in kept for v in pair})
    configs = [
        {"variant": v, **knobs[v], SEED_KEY: seed, REPLICATE_KEY: True} for v in variants for seed in CHECK_SEEDS
    ]
    scores: dict[str, list[float]] = {v: [] for v in variants}

    def sink(trial: TrialRecord, _rows: list) -> None:
        if trial.selection_score is not None:
            scores[trial.variant_id].append(trial.selection_score)

    data, _ = write_data(prepare_splits(cfg), root / "check" / name, cfg.task.name)
    files = {v: outcome.run_dir / "variants" / v / "files" for v in variants}
    replicates.run(
        cfg,
        name,
        99,
        root / "check" / name,
        files,
        configs,
        data,
        prepare_splits(cfg).labels(),
        sink,
        Console(quiet=True),
        root / "check" / name,
        None,
    )
    reasons = dict(con.execute("select variant_id, reason from variants where run_id = ?", [name]).fetchall())
    judged = {v: s for v, (s, _) in history.variant_scores(con, name).items()}
    rows = []
    for child, parent in kept:
        child_mean, parent_mean = statistics.fmean(scores[child]), statistics.fmean(scores[parent])
        rows.append(
            {
                "campaign": name,
                "child": child,
                "parent": parent,
                "judged_on": reasons.get(child) or f"best trial {judged.get(child)} vs {judged.get(parent)}",
                "child_5_seeds": scores[child],
                "parent_5_seeds": scores[parent],
                "really_better": child_mean > parent_mean,
                "gain": child_mean - parent_mean,
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("repeats", nargs="?", type=int, default=2, help="campaigns per mode")
    parser.add_argument("first", nargs="?", type=int, default=0, help="a later batch adds to the recorded ones")
    parser.add_argument("overrides", nargs="*", help="config overrides for every campaign (task=fashion ...)")
    parser.add_argument("--name", default="false_keeps", help="the results' name under bench/results/")
    args = parser.parse_args()
    repeats, first = args.repeats, args.first
    root = Path(tempfile.mkdtemp(prefix="bench-false-keeps-"))
    task = _task(config(root, "probe", *args.overrides, *CAMPAIGN).task)
    recorded = RESULTS / f"{args.name}.json"
    results = json.loads(recorded.read_text())["modes"] if first and recorded.exists() else {}
    for mode, overrides in MODES.items():
        rows = results.get(mode, [])
        for i in range(first, first + repeats):
            tag = "before" if "before" in mode else "after"
            rows += check(root, f"{tag}-{i}", [*args.overrides, *overrides, f"search.seed={i}", f"agent.seed={i}"])
        results[mode] = rows
    lines = [
        f"{task}, {first + repeats} campaign(s) per mode (3 cycles, 1 parent x 2 children, 6 epochs per trial); "
        f"every kept child and its parent re-run with seeds {CHECK_SEEDS}: a keep is true when the child's mean "
        "beats the parent's.",
        "",
        "| mode | kept children | really better | share | mean gain of the kept (5-seed means) |",
        "| --- | --- | --- | --- | --- |",
    ]
    for mode, rows in results.items():
        true = sum(r["really_better"] for r in rows)
        share = f"{true / len(rows):.0%}" if rows else "-"
        gain = f"{statistics.fmean(r['gain'] for r in rows):+.4f}" if rows else "-"
        lines.append(f"| {mode} | {len(rows)} | {true} | {share} | {gain} |")
    lines += ["", "Each keep (what it was judged on; the 5-seed means):"]
    for mode, rows in results.items():
        for r in rows:
            lines.append(
                f"- {mode}, {r['campaign']}: {r['child']} over {r['parent']}: "
                f"{statistics.fmean(r['child_5_seeds']):.4f} vs {statistics.fmean(r['parent_5_seeds']):.4f} "
                f"({'true' if r['really_better'] else 'FALSE'} keep); judged on: {r['judged_on']}"
            )
    data = {"repeats": first + repeats, "overrides": args.overrides, "check_seeds": CHECK_SEEDS, "modes": results}
    save(args.name, data, lines)


def _task(task: TaskConfig) -> str:
    """The task as the config resolved it (with its subsample where one is kept): the results' first words."""
    return f"{task.name} (task.subsample={task.subsample})" if task.subsample else task.name


if __name__ == "__main__":
    main()
