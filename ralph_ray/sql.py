"""Every SQL statement of the project: the view definitions over Parquet, and the parameterised queries.

The engine, the app and the tests share these. Views are the only DDL; the file paths inside them are
literals because DuckDB does not take parameters in DDL (`parquet_glob` quotes them).
"""

from __future__ import annotations

from pathlib import Path

# Base tables: one Parquet folder each, append-only. `runs` keeps the latest event per run.
TABLES = ("runs", "cycles", "variants", "trials", "epochs")

EPOCH_METRICS = ("train_loss", "val_loss", "val_acc", "lr", "grad_norm", "epoch_seconds")


def parquet_glob(root: Path, table: str) -> str:
    """A quoted SQL string literal for one table's Parquet parts (absolute, so any cwd works)."""
    path = str((root / table / "*.parquet").resolve()).replace("'", "''")
    return f"'{path}'"


def view_statements(parquet_root: Path, schema: str | None = None) -> list[str]:
    """CREATE VIEW statements for the base tables and the derived views, in dependency order."""
    prefix = f"{schema}." if schema else ""
    statements = []
    for table in TABLES:
        source = f"read_parquet({parquet_glob(parquet_root, table)}, union_by_name = true)"
        if table == "runs":
            body = f"select * from {source} qualify row_number() over (partition by run_id order by written_at desc) = 1"
        else:
            body = f"select * from {source}"
        statements.append(f"create or replace view {prefix}{table} as {body}")
    statements.append(f"create or replace view {prefix}leaderboard as {_leaderboard(prefix)}")
    statements.append(f"create or replace view {prefix}curves as {_curves(prefix)}")
    return statements


def _leaderboard(p: str) -> str:
    # One row per variant: its best completed trial by selection score, and how its trials ended.
    return f"""
select t.run_id, t.variant_id, any_value(v.parent_id) as parent_id, min(t.cycle) as cycle,
       max(t.selection_score) as selection_score,
       arg_max(t.test_score, t.selection_score) as test_score,
       arg_max(t.trial_id, t.selection_score) as best_trial_id,
       arg_max(t.knobs, t.selection_score) as best_knobs,
       count(*) as trials,
       count(*) filter (where t.status = 'completed') as completed,
       count(*) filter (where t.status = 'stopped_early') as stopped_early,
       count(*) filter (where t.status = 'failed') as failed,
       sum(t.seconds) / 3600.0 as trial_hours,
       rank() over (partition by t.run_id order by max(t.selection_score) desc nulls last) as rank
from {p}trials t left join {p}variants v on v.run_id = t.run_id and v.variant_id = t.variant_id
group by t.run_id, t.variant_id
order by selection_score desc nulls last, test_score desc nulls last
"""


def _curves(p: str) -> str:
    # Long per-epoch metrics pivoted to the columns the analyst and the app read.
    columns = ",\n       ".join(f"max(e.value) filter (where e.metric = '{m}') as {m}" for m in EPOCH_METRICS)
    return f"""
select e.run_id, e.trial_id, any_value(t.variant_id) as variant_id, any_value(t.cycle) as cycle,
       any_value(t.status) as status, e.epoch,
       {columns}
from {p}epochs e left join {p}trials t on t.run_id = e.run_id and t.trial_id = e.trial_id
group by e.run_id, e.trial_id, e.epoch
order by e.run_id, e.trial_id, e.epoch
"""


# ---------------------------------------------------------------------------------------------
# Queries (parameterised with ?)

LEADERBOARD_FOR_RUN = "select * from leaderboard where run_id = ? order by rank limit ?"
TRIALS_FOR_RUN = "select * from trials where run_id = ? order by cycle, trial_id"
TRIAL_STATUS_COUNTS = "select status, count(*) as n from trials where run_id = ? group by status order by status"
CURVES_FOR_TRIAL = "select * from curves where run_id = ? and trial_id = ? order by epoch"
RUN = "select * from runs where run_id = ?"
EPOCHS_TRAINED = "select count(distinct (trial_id, epoch)) from epochs where run_id = ?"
BEST_TRIAL = """
select trial_id, selection_score, test_score, knobs from trials
where run_id = ? and status = 'completed' order by selection_score desc limit 1
"""
