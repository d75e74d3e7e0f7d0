"""The knowledge base at scale: 100k trials and 1M epoch rows (6M long metric rows), ingest and view queries.

    python bench/kb_scale.py [--trials 100000] [--campaigns 50] [--keep DIR] [--reuse DIR]

--keep DIR keeps the built KB (DIR/base) and its ingest figures (DIR/build.json); --reuse DIR measures the queries
on that KB again without building it (a 100k-trial build is 15 s on a quiet machine, minutes on a busy one).

Writes, through the real `KnowledgeBase.put`, the layout campaigns leave: 50 campaigns x 10 cycles, each cycle's
trials and epochs as one part per table (200 trials of 10 epochs x 6 metrics per cycle), each finished campaign
folded into one part per table (`compact_run`, as campaign.py does at the end), the newest still running.
Ingest is rows per second of `put` (dict rows, as the engine hands them over, to an atomically renamed Parquet
part). Then, on a fresh reader (`open_reader`: the views the app, the agents and the duckdb shell use), the
median of 5 runs of the queries the engine and the app issue: leaderboard of a run and of every run, a trial's
curve, a variant's curves, a run's budgets, the app's board. Goal: each <= 100 ms, ingest >= 200k rows/s.

Side by side on one copy of the KB: the queries on the layout campaigns leave (one folded part per finished
campaign: before `compact_kb`, the only layout there was), then `KnowledgeBase.compact_kb` (`python -m ralph_ray kb
compact`) and the same queries on its one sorted file per table. The build keeps compact_run from calling compact_kb
(COMPACT_KB_AFTER) so that the "before" layout is the old one. The load average is recorded: on 2 shared cores the
figures move several-fold with other work (the 2026-11-23 record was taken at a load of 20-36).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import save  # noqa: E402

from ralph_ray import kb as kbmod  # noqa: E402
from ralph_ray import sql  # noqa: E402
from ralph_ray.kb import KnowledgeBase, now, open_reader  # noqa: E402

CAMPAIGNS, CYCLES, CHILDREN, EPOCHS = 50, 10, 10, 10
METRICS = ("val_acc", "val_loss", "train_loss", "lr", "grad_norm", "epoch_seconds")
GOAL_MS, GOAL_ROWS_S = 100.0, 200_000


def build(root: Path, trials: int, seed: int = 0, campaigns: int = CAMPAIGNS) -> dict[str, float]:
    """Write the KB; returns ingest figures (rows and seconds spent in `put` per table)."""
    rng = random.Random(seed)
    kb = KnowledgeBase(root)
    kb.init()
    per_cycle = max(1, trials // (campaigns * CYCLES))
    spent = {"epochs_rows": 0, "epochs_s": 0.0, "trials_rows": 0, "trials_s": 0.0, "compact_s": 0.0}
    clock = now() - timedelta(days=30)
    for c in range(campaigns):
        run_id = f"2026{c:04d}-scale"
        run = {"run_id": run_id, "experiment": "digits", "task": "digits", "started_at": clock, "status": "running"}
        seed_id = f"{rng.getrandbits(48):012x}"
        variants = [{"run_id": run_id, "variant_id": seed_id, "cycle": 1, "status": "seed", "interventions": "[]"}]
        for cycle in range(1, CYCLES + 1):
            tag = f"{run_id}-c{cycle:04d}"
            children = [
                {
                    "run_id": run_id,
                    "variant_id": f"{rng.getrandbits(48):012x}",
                    "parent_id": seed_id,
                    "cycle": cycle,
                    "status": "kept",
                    "interventions": '["lower_lr"]',
                }
                for _ in range(CHILDREN if cycle > 1 else 0)
            ]
            kb.put("variants", children + (variants if cycle == 1 else []), f"{tag}-variants")
            runnable = [v["variant_id"] for v in children] or [seed_id]
            trial_rows, epoch_rows = [], []
            for t in range(per_cycle):
                trial_id = f"{rng.getrandbits(40):010x}"
                status = rng.choices(("completed", "stopped_early", "failed"), (0.45, 0.5, 0.05))[0]
                score = 0.9 + rng.random() * 0.09 if status == "completed" else None
                clock += timedelta(seconds=1)
                trial_rows.append(
                    {
                        "run_id": run_id,
                        "cycle": cycle,
                        "trial_id": trial_id,
                        "variant_id": runnable[t % len(runnable)],
                        "status": status,
                        "seed": t,
                        "knobs": '{"LR": 0.05}',
                        "epochs": EPOCHS,
                        "selection_score": score,
                        "test_score": None if score is None else score - 0.01,
                        "seconds": 3.0,
                        "written_at": clock,
                    }
                )
                epoch_rows.extend(
                    {"run_id": run_id, "trial_id": trial_id, "epoch": e, "metric": m, "value": rng.random()}
                    for e in range(1, EPOCHS + 1)
                    for m in METRICS
                )
            start = time.perf_counter()
            kb.put("epochs", epoch_rows, f"{tag}-epochs")
            spent["epochs_s"] += time.perf_counter() - start
            start = time.perf_counter()
            kb.put("trials", trial_rows, f"{tag}-trials")
            spent["trials_s"] += time.perf_counter() - start
            spent["epochs_rows"] += len(epoch_rows)
            spent["trials_rows"] += len(trial_rows)
            kb.put("cycles", [{"run_id": run_id, "cycle": cycle, "trials": per_cycle}], f"{tag}-cycle")
            kb.put("decisions", [{"run_id": run_id, "cycle": cycle, "decision": "continue"}], f"{tag}-decision")
        kb.put("runs", [{**run, "status": "finished", "finished_at": clock}], run_id)
        if c < campaigns - 1:  # a finished campaign folds its parts (campaign.py); the newest is still running
            start = time.perf_counter()
            kb.compact_run(run_id)
            spent["compact_s"] += time.perf_counter() - start
    return spent


def timed(con, query: str, params: list, repeats: int = 5) -> tuple[float, int]:
    """Median milliseconds of `repeats` runs (after one warm-up) and the row count."""
    rows = len(con.execute(query, params).fetchall())
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        con.execute(query, params).fetchall()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times), rows


def measure(root: Path) -> dict[str, object]:
    """open_reader's time, then the median time and row count of each query, on a fresh reader."""
    start = time.perf_counter()
    con = open_reader(root)
    open_ms = (time.perf_counter() - start) * 1000
    run_id = con.execute("select run_id from runs order by started_at desc limit 1").fetchone()[0]
    old_run = con.execute("select run_id from runs order by started_at limit 1").fetchone()[0]
    trial_id, variant_id = con.execute(
        "select trial_id, variant_id from trials where run_id = ? order by trial_id limit 1", [old_run]
    ).fetchone()
    queries = {
        "leaderboard of a run (LEADERBOARD_FOR_RUN)": (sql.LEADERBOARD_FOR_RUN, [run_id, 20]),
        "leaderboard of every run, top 20": ("select * from leaderboard limit 20", []),
        "the app's board (APP_BOARD)": (sql.APP_BOARD, [run_id]),
        "a trial's curve (CURVES_FOR_TRIAL)": (sql.CURVES_FOR_TRIAL, [old_run, trial_id]),
        "a variant's curves (VARIANT_CURVES)": (sql.VARIANT_CURVES, [old_run, variant_id]),
        "a run's budgets (BUDGET_FOR_RUN)": (sql.BUDGET_FOR_RUN, [old_run]),
        "every run's budgets": ("select * from budgets", []),
    }
    results = {name: timed(con, query, params) for name, (query, params) in queries.items()}
    counts = {t: con.execute(f"select count(*) from {t}").fetchone()[0] for t in ("trials", "epochs")}
    parts = len(list((root / "parquet" / "trials").glob("*.parquet")))
    con.close()
    return {"open_ms": open_ms, "results": results, "counts": counts, "trial_parts": parts}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=int, default=100_000)
    parser.add_argument("--campaigns", type=int, default=CAMPAIGNS)
    parser.add_argument("--keep", type=Path, default=None)
    parser.add_argument("--reuse", type=Path, default=None)
    args = parser.parse_args()
    load_before = os.getloadavg()
    if args.reuse:
        folder = args.reuse
        spent = json.loads((folder / "build.json").read_text())
    else:
        folder = args.keep or Path(tempfile.mkdtemp(prefix="bench-kb-scale-"))
        shutil.rmtree(folder / "base", ignore_errors=True)
        kbmod.COMPACT_KB_AFTER = 10**9  # the layout before compact_kb: one folded part per finished campaign
        start = time.perf_counter()
        spent = build(folder / "base", args.trials, campaigns=args.campaigns)
        spent["build_s"] = time.perf_counter() - start
        (folder / "build.json").write_text(json.dumps(spent))
    root = folder / "work"
    shutil.rmtree(root, ignore_errors=True)
    shutil.copytree(folder / "base", root)
    before = measure(root)
    kb = KnowledgeBase(root)
    kb.compact_grace_s = 0.0  # no reader runs beside it here: the grace is idle time, not work
    start = time.perf_counter()
    kb.compact_kb()
    compact_s = time.perf_counter() - start
    after = measure(root)
    load_after = os.getloadavg()
    counts = after["counts"]
    assert counts == before["counts"], (before["counts"], counts)
    epochs_rate = spent["epochs_rows"] / spent["epochs_s"]
    trials_rate = spent["trials_rows"] / spent["trials_s"]
    per_part = spent["trials_rows"] / (args.campaigns * CYCLES)
    epochs_per_part = spent["epochs_rows"] / (args.campaigns * CYCLES)
    figures = {
        "campaigns": args.campaigns,
        "trials": counts["trials"],
        "epoch_rows": counts["epochs"] // len(METRICS),
        "epoch_metric_rows": counts["epochs"],
        "trial_parts_before": before["trial_parts"],
        "trial_parts_after": after["trial_parts"],
        "compact_run_s_per_campaign": round(spent["compact_s"] / (args.campaigns - 1), 2),
        "compact_kb_s": round(compact_s, 2),
        "build_s": round(spent["build_s"], 1),
        "ingest_epoch_rows_per_s": round(epochs_rate),
        "ingest_trial_rows_per_s": round(trials_rate),
        "trial_rows_per_part": per_part,
        "epoch_metric_rows_per_part": epochs_per_part,
        "open_reader_ms": {"before": round(before["open_ms"], 1), "after": round(after["open_ms"], 1)},
        "queries_ms": {
            name: {"before": round(ms, 1), "after": round(after["results"][name][0], 1)}
            for name, (ms, _) in before["results"].items()
        },
        "load_average_1m": {"start": round(load_before[0], 2), "end": round(load_after[0], 2)},
        "goal_ms": GOAL_MS,
        "goal_rows_per_s": GOAL_ROWS_S,
    }
    worst = max(after["results"].values())[0]
    lines = [
        f"KB at scale: {counts['trials']:,} trials, {counts['epochs'] // len(METRICS):,} epoch rows "
        f"({counts['epochs']:,} metric rows), {args.campaigns} campaigns; built in {spent['build_s']:.0f} s "
        f"(folding a finished campaign, compact_run: {figures['compact_run_s_per_campaign']} s)",
        f"  load average (1 min, 2 cores): {load_before[0]:.2f} at the start, {load_after[0]:.2f} at the end",
        f"  ingest (KnowledgeBase.put, dict rows -> Parquet part): epochs {epochs_rate:,.0f} metric rows/s "
        f"({epochs_per_part:,.0f} a part), trials {trials_rate:,.0f} rows/s ({per_part:g} a part; a part costs ~1 ms "
        f"whatever its size) (goal >= {GOAL_ROWS_S:,})",
        f"  compact_kb (python -m ralph_ray kb compact): {compact_s:.1f} s; trials parts "
        f"{before['trial_parts']} -> {after['trial_parts']}",
        f"  {'ms, median of 5':45s} {'before':>8s} {'after':>8s}  ratio",
        f"  {'open_reader (views over every part)':45s} {before['open_ms']:8.1f} {after['open_ms']:8.1f}  "
        f"{after['open_ms'] / before['open_ms']:.2f}",
        *(
            f"  {name:45s} {ms:8.1f} {after['results'][name][0]:8.1f}  {after['results'][name][0] / ms:.2f}"
            f"  ({rows} rows)"
            for name, (ms, rows) in before["results"].items()
        ),
        f"  goal: each query <= {GOAL_MS:g} ms; worst after compact_kb: {worst:.1f} ms",
    ]
    save("kb_scale" if args.campaigns == CAMPAIGNS else f"kb_scale_{args.campaigns}", figures, lines)
    if args.keep is None and args.reuse is None:
        shutil.rmtree(folder, ignore_errors=True)
    else:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
