"""Whom a campaign bred from: per run of a KB, the children, those that never scored, and those bred from a parent
well behind the best score known when the child's first trial started (read from the KB's trial times).

    python bench/breeding.py KB_DIR [KB_DIR ...] [--gap 0.01] [--name NAME]

Also per run: the median full epoch's seconds and a completed trial's epochs (under `trial.budget_s`, the CPU it got).
Made for the clock_target KBs (`bench/clock_target.py` leaves them under /tmp/bench-target-*/kb), to ask why the
asynchronous mode, with more children per wall second, found no better variants than generations on Fashion-MNIST.
Scores are the KB's oriented ones (higher is better).
"""

from __future__ import annotations

import argparse
import statistics
from collections import defaultdict

from _common import save

from ralph_ray.kb import open_reader

# Per child: whether it scored, its best, its parent's best before its first trial started, the run's best before then.
CHILDREN = """
with v as (select run_id, variant_id, any_value(parent_id) as parent_id from variants group by all),
t as (select run_id, variant_id, epoch(written_at) - seconds as started, epoch(written_at) as ended,
             selection_score as s from trials),
first as (select run_id, variant_id, min(started) as started, count(s) as scored, max(s) as best
           from t group by all)
select f.run_id, f.variant_id, f.scored, f.best,
  (select max(s) from t p where p.run_id = f.run_id and p.variant_id = v.parent_id and p.ended <= f.started),
  (select max(s) from t b where b.run_id = f.run_id and b.ended <= f.started)
from first f join v using (run_id, variant_id) where v.parent_id is not null order by 1, f.started
"""
# Per run: the median seconds of a full epoch (every epoch but a trial's last, which a time budget may cut short)
# and the mean epochs of a completed trial (under a time budget, the CPU it got); the mean over trials, not over
# epoch rows (that would weight a trial by its epochs).
PACE = """
with e as (select run_id, epoch, value, max(epoch) over (partition by run_id, trial_id) as last
           from epochs where metric = 'epoch_seconds')
select e.run_id, median(e.value) filter (where e.epoch < e.last),
  (select avg(t.epochs) from trials t where t.run_id = e.run_id and t.status = 'completed')
from e group by e.run_id
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("kbs", nargs="+")
    parser.add_argument("--gap", type=float, default=0.01, help="a parent this far behind the best counts as behind")
    parser.add_argument("--name", default="breeding")
    args = parser.parse_args()
    runs: dict[str, list[tuple]] = defaultdict(list)
    pace: dict[str, tuple[float, float]] = {}
    for kb in args.kbs:
        pace |= {run_id: (epoch_s, epochs) for run_id, epoch_s, epochs in open_reader(kb).execute(PACE).fetchall()}
        for run_id, _, scored, own, parent, best in open_reader(kb).execute(CHILDREN).fetchall():
            gap = None if parent is None or best is None else best - parent
            runs[run_id].append((scored, gap, own is not None and parent is not None and own > parent))
    lines = [
        f"children per run; 'behind': bred from a parent more than {args.gap} below the best score known when the "
        "child's first trial started",
        "| run | children | never scored | beat their parent | behind | mean gap to the best | median full epoch s "
        "| epochs of a completed trial |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    figures: dict[str, dict] = {}
    for run_id, rows in sorted(runs.items()):
        gaps = [g for _, g, _ in rows if g is not None]
        figures[run_id] = {
            "children": len(rows),
            "never_scored": sum(1 for scored, _, _ in rows if scored == 0),
            "beat_parent": sum(1 for _, _, beat in rows if beat),
            "median_epoch_s": round(pace[run_id][0], 2) if run_id in pace else None,
            "completed_trial_epochs": round(pace[run_id][1], 2) if run_id in pace and pace[run_id][1] else None,
            "behind": sum(1 for g in gaps if g > args.gap),
            "mean_gap": round(statistics.mean(gaps), 4) if gaps else None,
        }
        f = figures[run_id]
        lines.append(
            f"| {run_id} | {f['children']} | {f['never_scored']} | {f['beat_parent']} | {f['behind']} "
            f"| {f['mean_gap']} | {f['median_epoch_s']} | {f['completed_trial_epochs']} |"
        )
    for mode in sorted({r.split("-s")[0] for r in figures}):
        mine = [f for r, f in figures.items() if r.split("-s")[0] == mode]
        lines.append(
            f"| **{mode}, all** | {sum(f['children'] for f in mine)} | {sum(f['never_scored'] for f in mine)} | "
            f"{sum(f['beat_parent'] for f in mine)} | {sum(f['behind'] for f in mine)} | | | |"
        )
    save(args.name, {"gap": args.gap, "kbs": args.kbs, "runs": figures}, lines)


if __name__ == "__main__":
    main()
