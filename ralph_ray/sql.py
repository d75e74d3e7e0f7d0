"""Every SQL statement of the engine, the app and the benchmarks: the views over Parquet, the KB file's
bookkeeping, and the parameterised queries.

The engine, the app and the benchmarks share these (tests may state their own checks). DDL takes no parameters
in DuckDB, so the file paths in views and in ATTACH are quoted literals (`parquet_glob`, `attach_kb_file`).
"""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path

from ralph_ray.statuses import LEGACY_STOPPED_WITH_CYCLE, STOPPED_WITH_CYCLE

# Base tables: one Parquet folder each, append-only. Tables listed in LATEST keep the newest row per key
# (a run or a variant is re-written as its status changes).
TABLES = ("runs", "cycles", "variants", "trials", "epochs", "interventions", "decisions", "agent_usage")
# Every Parquet folder of a KB: the base tables, then those added later that an old KB lacks (view_statements reads
# them as empty).
ALL_TABLES = (*TABLES, "segments")
LATEST = {"runs": "run_id", "variants": "run_id, variant_id", "cycles": "run_id, cycle", "decisions": "run_id, cycle"}

# Student's t at 97.5% for 1..30 degrees of freedom (normal beyond): the views' 95% intervals over replicates.
T975 = (
    "[12.7062, 4.3027, 3.1824, 2.7764, 2.5706, 2.4469, 2.3646, 2.3060, 2.2622, 2.2281, 2.2010, 2.1788, 2.1604, "
    "2.1448, 2.1314, 2.1199, 2.1098, 2.1009, 2.0930, 2.0860, 2.0796, 2.0739, 2.0687, 2.0639, 2.0595, 2.0555, "
    "2.0518, 2.0484, 2.0452, 2.0423]"
)

# The segments view of a KB without segment parts (written before scheduler=pbt): typed, empty.
SEGMENTS_EMPTY = (
    "select null::varchar as run_id, null::integer as cycle, null::varchar as trial_id, null::integer as segment, "
    "null::integer as from_epoch, null::integer as to_epoch, null::varchar as variant_id, null::varchar as knobs, "
    "null::varchar as donor_trial_id, null::integer as donor_epoch, null::timestamptz as written_at where false"
)
EPOCH_METRICS = ("train_loss", "val_loss", "val_acc", "lr", "grad_norm", "epoch_seconds")
# harness.probes: pivoted into the curves view too, after the metrics every trainer reports
# (agents.base.EpochPoint's order)
PROBE_METRICS = ("gen_gap", "weight_norm", "update_norm", "update_ratio", "eff_rank", "plateau")
# RL post-training telemetry (task=grpo's trainer): pivoted after the probes, in EpochPoint's order
RL_METRICS = ("reward_mean", "reward_std", "kl", "entropy", "completion_length", "zero_spread_frac")


# KnowledgeBase.compact_kb's files: `_kb-<generation>.parquet` (the merged rows) and its manifest
# `_m-<generation>.manifest` (Parquet rows of `part`, `hidden`, `run_ids`: the merged file, live, with the runs
# it holds, and each part it replaced, hidden; not `*.parquet`, so never read as rows of the table). The manifest's
# rename is the commit: a `_kb-*` file counts only once a manifest lists it live, and every view leaves out the parts
# a manifest lists hidden.
COMPACTED_PREFIX = "_kb-"
MANIFEST_PREFIX = "_m-"
MANIFEST_SUFFIX = ".manifest"


def _compacted_state(parquet_root: Path, table: str, files: list[Path] | None) -> str:
    """SQL for the state the manifests of `table` give, as one listing sees them: one row per full path (`name`),
    `hidden` true for a replaced part, false for a live `_kb-*` file; `files`: the `_*` files to read (None: a glob
    of `_schema.parquet`, always there, and the manifests)."""
    folder = (parquet_root / table).resolve()
    source = _quoted(str(folder / "_[ms]*"))
    if files is not None:
        source = "[" + ", ".join(_quoted(str(path)) for path in files) + "]"
    # DuckDB 2.0 fails (internal error) on parquet_kv_metadata inside the lineage view's recursive CTE: plain rows
    return (
        f"select {_quoted(str(folder) + '/')} || part as name, bool_or(hidden) as hidden from ("
        f"select * from read_parquet({source}, union_by_name = true) "
        "union all by name select null::varchar as part, null::boolean as hidden where false"
        ") where part is not null group by part"
    )


def _read_parts(parquet_root: Path, table: str, files: str, skipped: Collection[Path] = ()) -> str:
    """A subquery of the rows of `table`'s parts (`files`) as of one consistent state of its compaction.

    The manifests are read first (DuckDB binds the FROM clause left to right, listing files as it binds): a
    `_kb-*` file's rows count only if a manifest that read saw lists it live, and then the parts it lists hidden
    do not. So a query that binds across a compaction's commit reads the old parts (kept for kb.COMPACT_GRACE_S
    after it) or the new file, never both, never neither. The right join is an anti join that keeps the filters
    on the parts' own columns pushed into their scan. `skipped`: damaged files to leave out.
    """
    folder = (parquet_root / table).resolve()
    found = [
        p.resolve() for p in folder.glob("_*") if p.name == "_schema.parquet" or p.name.startswith(MANIFEST_PREFIX)
    ]
    kept = [p for p in found if p not in skipped]
    if not kept:
        return f"read_parquet({files}, union_by_name = true)"  # no `_*` file (an app snapshot's copy): none replaced
    compacted = _quoted(str(folder / COMPACTED_PREFIX))
    state = _compacted_state(parquet_root, table, sorted(kept) if len(kept) < len(found) else None)
    return (
        f"(select p.* exclude (_part) from ({state}) seen "
        f"right join read_parquet({files}, union_by_name = true, filename = '_part') p on seen.name = p._part "
        f"where coalesce(not seen.hidden, not starts_with(p._part, {compacted})))"
    )


def parquet_glob(root: Path, table: str) -> str:
    """A quoted SQL string literal for one table's Parquet parts (absolute, so any cwd works)."""
    return _quoted(str((root / table / "*.parquet").resolve()))


def _quoted(text: str) -> str:
    """A SQL string literal."""
    return "'" + text.replace("'", "''") + "'"


# The kb.duckdb file: views attached under the schema `kb`, and a fingerprint of them (rewritten only when stale).
CREATE_KB_META = "create or replace table kb.kb_meta (fingerprint varchar)"
INSERT_KB_META = "insert into kb.kb_meta values (?)"
DETACH_KB_FILE = "detach kb"
KB_META_FINGERPRINT = "select fingerprint from kb_meta"


def attach_kb_file(db: Path, storage_version: str) -> str:
    """ATTACH the kb.duckdb file as `kb`, written in a storage version older duckdb shells read."""
    return f"attach {_quoted(str(db))} as kb (storage_version {_quoted(storage_version)})"


# The trials columns that held a final training's additions before `final_added` (KBs of 2026-11-28/29), and the
# `final_added` they read as: "cosine + shift + flip + deepen", the names safeguards.final_additions uses.
LEGACY_FINAL_COLUMNS = ("final_schedule", "final_augment", "final_deepen")
CUT_REASON = (
    f"case when reason = {_quoted(LEGACY_STOPPED_WITH_CYCLE)} then {_quoted(STOPPED_WITH_CYCLE)} else reason end"
)
LEGACY_FINAL_ADDED = (
    "coalesce(final_added, nullif(concat_ws(' + ', final_schedule, final_augment, "
    "case when final_deepen then 'deepen' end), ''))"
)


def view_statements(parquet_root: Path, schema: str | None = None, skip: Collection[Path] = ()) -> list[str]:
    """CREATE VIEW statements for the base tables and the derived views, in dependency order.

    `skip`: damaged parts to leave out (a table with one is read from the list of its other parts).
    """
    p = f"{schema}." if schema else ""
    statements = []
    skipped = {Path(path).resolve() for path in skip}
    for table in TABLES:
        files = parquet_glob(parquet_root, table)
        if any(path.parent.name == table for path in skipped):
            found = sorted(path.resolve() for path in (parquet_root / table).glob("*.parquet"))
            kept = [path for path in found if path not in skipped]
            files = "[" + ", ".join(_quoted(str(path)) for path in kept) + "]"
        source = _read_parts(parquet_root, table, files, skipped)
        if table == "variants":
            # A KB written before `refusals` (2026-12-02) reads it as NULL. A verdict re-writes the row without them
            # where a resumed driver rebuilt the child from the KB: the row keeps those its first rows recorded.
            body = (
                f"select * replace (max(refusals) over (partition by {LATEST[table]}) as refusals) from (select * "
                f"from {source} union all by name select cast(null as varchar) as refusals where false) qualify "
                f"row_number() over (partition by {LATEST[table]} order by written_at desc) = 1"
            )
        elif table in LATEST:
            body = (
                f"select * from {source} qualify row_number() "
                f"over (partition by {LATEST[table]} order by written_at desc) = 1"
            )
        elif table == "trials":
            # A trial is written once; a resumed campaign never re-writes it, but stay safe against a double part.
            # A KB written before replicates (or nodes, peak memory, final trainings) has no `replicate` (`node`,
            # `peak_*_mb`, `final`, `final_budget_s`, `final_added`) column: it reads as NULL (UNION BY NAME adds it).
            # One written before `final_added` recorded its final's additions in three columns: read into it.
            source = (
                f"(select * exclude ({', '.join(LEGACY_FINAL_COLUMNS)}) replace ({LEGACY_FINAL_ADDED} as final_added) "
                f"from (select * from {source} union all by name "
                "select cast(null as boolean) as replicate, cast(null as varchar) as node, "
                "cast(null as double) as peak_rss_mb, cast(null as double) as peak_gpu_mb, "
                "cast(null as boolean) as final, cast(null as double) as final_budget_s, "
                "cast(null as varchar) as final_added, cast(null as varchar) as final_schedule, "
                "cast(null as varchar) as final_augment, cast(null as boolean) as final_deepen where false))"
            )
            # A trial cut by its Tune run's end reads as STOPPED_WITH_CYCLE under the reason older KBs gave it.
            body = (
                f"select * replace ({CUT_REASON} as reason) from {source} qualify row_number() "
                "over (partition by run_id, trial_id order by written_at) = 1"
            )
        elif table == "interventions":
            # A KB written before `basis` (records.EffectBasis, 2026-12-01) reads it as NULL: a delta of unknown kind.
            body = f"select * from {source} union all by name select cast(null as varchar) as basis where false"
        else:
            body = f"select * from {source}"
        statements.append(f"create or replace view {p}{table} as {body}")
    # Added after KBs were written without it: an old KB (no parts yet) reads it as an empty table.
    all_parts = sorted(path.resolve() for path in (parquet_root / "segments").glob("*.parquet"))
    kept = [path for path in all_parts if path not in skipped]
    files = parquet_glob(parquet_root, "segments")
    if len(kept) < len(all_parts):
        files = "[" + ", ".join(_quoted(str(path)) for path in kept) + "]"
    segments = (
        f"select * from {_read_parts(parquet_root, 'segments', files, skipped)} "
        "qualify row_number() over (partition by run_id, trial_id, segment order by written_at) = 1"
        if kept
        else SEGMENTS_EMPTY
    )
    statements.append(f"create or replace view {p}segments as {segments}")
    for name, body in (
        ("leaderboard", _leaderboard(p)),
        ("curves", _curves(p)),
        ("lineage", _lineage(p)),
        ("intervention_effects", _intervention_effects(p)),
        ("budgets", _budgets(p)),
        ("not_applicable", _not_applicable(p)),
    ):
        statements.append(f"create or replace view {p}{name} as {body}")
    return statements


def _leaderboard(p: str) -> str:
    # One row per variant: its best completed search trial by selection score, how its trials ended, and the
    # mean of its replicates (fresh seeds of the best knobs) with a 95% Student-t interval (none below n = 2).
    # Only replicates of the knobs its best trial ran count: a later search trial may have moved its best since it
    # was replicated, and a mean of other knobs beside those best_knobs described knobs nobody shows (user trial:
    # the seed's mean 0.9485 of old knobs sat beside new best knobs that scored 0.9777). Such a variant has no
    # replicates here until its new best runs again (replicates.py).
    # Rank: replicated variants first, by their replicate mean, then the rest by their best search trial. A best
    # trial is the luckiest of a variant's samples (and a variant with more trials draws more), so where fresh
    # seeds measured a variant they, not that trial, place it: what the report, export and app call "best".
    # A discarded variant ranks below every other (the seed, kept, not yet judged): its verdict, the campaign's own
    # test, found it no better than its parent, and the pick must not contradict it (user trials: a discarded child
    # was exported as best on a mean equal to the seed's, and, on a higher mean not shown better at 90%, named best
    # beside "kept: none"). Exact ties go to the earlier variant (its ancestor), then the first written: a
    # replicated variant's best trial, its luckiest sample, breaks no tie.
    # The final training of the pick (finaltrain.py) is neither: it trained longer than any search trial, so it is
    # shown in its own columns and never ranks.
    search = "not coalesce(t.replicate, false) and not coalesce(t.final, false)"
    # The best trial is one row, the same on every read: ties on the selection score (one image apart is common)
    # go to the first written (as finals.final_winner's), then the smallest trial id. `arg_max` over ties may answer
    # from a different row per column and per read (the app, `status` and `export --search` named different trials).
    best = "order by t.selection_score desc, t.written_at, t.trial_id"
    scored = "t.selection_score is not null"
    replica = (
        "coalesce(t.replicate, false) and t.status = 'completed' and t.selection_score is not null"
        " and t.knobs = k.best_knobs"
    )
    final = "coalesce(t.final, false) and t.status = 'completed'"
    return f"""
select l.*,
       case when half_width is not null then greatest(mean_score - half_width, coalesce(b.floor, '-inf'::double))
            end as ci_low,
       case when half_width is not null then least(mean_score + half_width, coalesce(b.ceiling, 'inf'::double))
            end as ci_high,
       coalesce(mean_score - half_width < b.floor or mean_score + half_width > b.ceiling, false) as ci_clipped
from (
select t.run_id, t.variant_id, any_value(v.parent_id) as parent_id, any_value(v.cycle) as cycle,
       any_value(v.status) as status, any_value(v.interventions) as interventions,
       max(t.selection_score) filter (where {search}) as selection_score,
       first(t.test_score {best}) filter (where {search} and {scored}) as test_score,
       first(t.trial_id {best}) filter (where {search} and {scored}) as best_trial_id,
       first(t.knobs {best}) filter (where {search} and {scored}) as best_knobs,
       count(*) as trials,
       count(*) filter (where t.status = 'completed') as completed,
       count(*) filter (where t.status = 'stopped_early') as stopped_early,
       count(*) filter (where t.status = 'failed') as failed,
       sum(t.seconds) / 3600.0 as trial_hours,
       rank() over (
           partition by t.run_id
           order by coalesce(any_value(v.status) = 'discarded', false),
                    avg(t.selection_score) filter (where {replica}) desc nulls last,
                    case when count(*) filter (where {replica}) = 0
                         then max(t.selection_score) filter (where {search}) end desc nulls last,
                    any_value(v.cycle) nulls last, min(t.written_at)
       ) as rank,
       count(*) filter (where {replica}) as replicates,
       max(t.selection_score) filter (where {final}) as final_selection_score,
       first(t.test_score {best}) filter (where {final} and {scored}) as final_test_score,
       avg(t.selection_score) filter (where {replica}) as mean_score,
       avg(t.test_score) filter (where {replica}) as mean_test_score,
       stddev_samp(t.selection_score) filter (where {replica}) / sqrt(count(*) filter (where {replica}))
           * case when count(*) filter (where {replica}) > 31 then 1.96
                  else list_extract({T975}, (count(*) filter (where {replica}) - 1)::integer) end as half_width
from {p}trials t left join {p}variants v on v.run_id = t.run_id and v.variant_id = t.variant_id
left join (
    select t.run_id, t.variant_id, first(t.knobs {best}) as best_knobs from {p}trials t
    where {search} and {scored} group by t.run_id, t.variant_id
) k on k.run_id = t.run_id and k.variant_id = t.variant_id
group by t.run_id, t.variant_id
) l
left join ({_score_ranges(p)}) b on b.ranged_run = l.run_id
order by l.rank, mean_score desc nulls last, selection_score desc nulls last, test_score desc nulls last,
         l.run_id, variant_id
"""


def _score_ranges(p: str) -> str:
    # Each run's range of oriented scores where its metric is a built-in of known range (scoring.METRIC_RANGES): a
    # replicate mean's t interval at n=2 spans accuracy 0.95 +- 0.12, past 1; the leaderboard clips it (ci_clipped).
    # A metric of another name (the task's own score) has no known range: nothing is clipped.
    from ralph_ray.scoring import METRIC_RANGES, score_range

    rows = [
        f"({_quoted(name)}, {_quoted(direction)}, {_number(floor)}, {_number(ceiling)})"
        for name in METRIC_RANGES
        for direction in ("max", "min")
        for floor, ceiling in [score_range(name, direction)]
    ]
    return f"""
select r.run_id as ranged_run, k.floor, k.ceiling
from (select run_id, any_value(json_extract_string(config, '$.task.metric')) as metric,
             any_value(coalesce(json_extract_string(config, '$.task.direction'), 'max')) as direction
      from {p}runs group by run_id) r
join (values {", ".join(rows)}) k(metric, direction, floor, ceiling)
  on k.metric = r.metric and k.direction = r.direction
"""


def _number(value: float | None) -> str:
    """A SQL double literal (NULL for None)."""
    return "null::double" if value is None else f"{float(value)!r}::double"


def _curves(p: str) -> str:
    # Long per-epoch metrics pivoted to the columns the analyst and the app read. Inner join: epochs of a
    # trial whose row was never written (the driver died in between) are not part of the record.
    columns = ",\n       ".join(
        f"max(e.value) filter (where e.metric = '{m}') as {m}" for m in EPOCH_METRICS + PROBE_METRICS + RL_METRICS
    )
    return f"""
select e.run_id, e.trial_id, any_value(t.variant_id) as variant_id, any_value(t.cycle) as cycle,
       any_value(t.status) as status, e.epoch,
       {columns}
from {p}epochs e join {p}trials t on t.run_id = e.run_id and t.trial_id = e.trial_id
group by e.run_id, e.trial_id, e.epoch
order by e.run_id, e.trial_id, e.epoch
"""


def _lineage(p: str) -> str:
    # Each variant with its parent, depth from the seed and the chain of interventions that produced it, readable (the
    # one place this text is made): `step` is the variant's own (`batchnorm`, `raise_lr + mixup`; `knobs` for knob
    # moves only, `seed` for the root), `path` the steps from the seed (`seed > batchnorm > knobs`).
    return f"""
with recursive steps as (
    select run_id, variant_id, parent_id, coalesce(
        nullif(array_to_string(from_json(coalesce(interventions, '[]'), '["VARCHAR"]'), ' + '), ''),
        case when parent_id is null then 'seed' else 'knobs' end
    ) as step
    from {p}variants
),
tree(run_id, variant_id, parent_id, depth, path) as (
    select run_id, variant_id, parent_id, 0, step from steps where parent_id is null
    union all
    select s.run_id, s.variant_id, s.parent_id, tree.depth + 1, tree.path || ' > ' || s.step
    from steps s join tree on s.run_id = tree.run_id and s.parent_id = tree.variant_id
    where s.variant_id <> s.parent_id and tree.depth < 1000
)
select v.run_id, v.variant_id, v.parent_id, v.cycle, v.status, v.interventions, v.diagnosis, v.reason,
       tree.depth, s.step, tree.path, v.parent_score, l.selection_score, l.test_score, l.trials
from {p}variants v
join steps s on s.run_id = v.run_id and s.variant_id = v.variant_id
left join (select run_id, variant_id, min(depth) as depth, arg_min(path, depth) as path from tree group by all) tree
       on tree.run_id = v.run_id and tree.variant_id = v.variant_id
left join {p}leaderboard l on l.run_id = v.run_id and l.variant_id = v.variant_id
order by v.run_id, v.cycle, l.selection_score desc nulls last
"""


def _intervention_effects(p: str) -> str:
    # Measured effects across every campaign in this KB: mean delta with a 95% Student-t interval (none below n = 2),
    # win rate. Each delta is between replicate means where child and parent were replicated (records.py); otherwise it
    # is the child's best trial against its parent's best trial, or against its parent's replicate mean where the
    # child was not worth replicating: the row's `basis` (records.EffectBasis). Two estimators of different noise, so
    # the view counts and averages the replicate-mean deltas apart (n_replicates, mean_delta_replicates). Per task
    # *and* its metric as the run declared it (runs.config): a delta is a difference of oriented scores, so a run
    # that minimised R^2 by mistake measured every effect with the opposite sign, and a task folder whose METRIC
    # changed (mse to r2) measured another quantity; averaged together they cancelled (user trial).
    # A child no trial of which completed, none stopped by the scheduler and at least one cut by the campaign's own
    # stop (a stop request, the time budget: STOPPED_WITH_CYCLE) was never judged: it is no try of its interventions.
    # Read from its trials, so a KB written before decision.CUT_BY_STOP_REASON existed is read the same (user trial:
    # two trials cut at epoch 0 by a 180 s budget counted as an unscored try of one_cycle_schedule in later campaigns).
    t = f"case when count(delta) > 31 then 1.96 else list_extract({T975}, (count(delta) - 1)::integer) end"
    cut = "'" + STOPPED_WITH_CYCLE.replace("'", "''") + "'"
    return f"""
with declared as (
    select run_id, any_value(json_extract_string(config, '$.task.metric')) as metric,
           any_value(json_extract_string(config, '$.task.direction')) as direction
    from {p}runs group by run_id
),
cut as (
    select run_id, cycle, variant_id from {p}trials
    where not coalesce(replicate, false) and not coalesce(final, false)
    group by run_id, cycle, variant_id
    having count(*) filter (where reason = {cut}) > 0
       and count(*) filter (where status <> 'failed' and reason is distinct from {cut}) = 0
),
judged as (
    select i.* from {p}interventions i
    where i.delta is not null or i.outcome <> 'discarded'
       or not exists (
           select 1 from cut c where c.run_id = i.run_id and c.cycle = i.cycle and c.variant_id = i.variant_id
       )
)
select task, metric, direction, intervention, diagnosis, count(delta) as n, count(*) as tried,
       avg(delta) as mean_delta, stddev_samp(delta) as sd_delta,
       avg(delta) - {t} * stddev_samp(delta) / sqrt(count(delta)) as ci_low,
       avg(delta) + {t} * stddev_samp(delta) / sqrt(count(delta)) as ci_high,
       avg(case when delta > 0 then 1.0 else 0.0 end) filter (where delta is not null) as win_rate,
       count(delta) filter (where basis = 'replicates') as n_replicates,
       avg(delta) filter (where basis = 'replicates') as mean_delta_replicates,
       count(delta) filter (where basis in ('best_trial', 'best_trial_vs_replicates')) as n_best_trial,
       count(*) filter (where outcome = 'kept') as kept,
       count(*) filter (where outcome = 'rejected') as rejected,
       -- trained but never scored: every trial stopped at an ASHA rung or crashed (the analyst's "no gain" tries)
       count(*) filter (where delta is null and outcome in ('discarded', 'crashed')) as unscored
from judged left join declared using (run_id)
group by task, metric, direction, intervention, diagnosis
order by mean_delta desc nulls last
"""


def _budgets(p: str) -> str:
    # Per run: what was spent (trial time, agent tokens and cost) and the latest decision. Grouped joins, not
    # subqueries per row: a filter on run_id (BUDGET_FOR_RUN) reaches every table's scan, so one run's budget
    # reads that run's rows only.
    return f"""
select r.run_id, r.experiment, r.task, r.status, r.stop_reason, r.started_at, r.finished_at,
       coalesce(c.cycles, 0) as cycles, coalesce(t.trials, 0) as trials, coalesce(t.trial_hours, 0) as trial_hours,
       coalesce(u.tokens, 0) as tokens, coalesce(u.cost, 0) as cost, d.best_selection_score
from {p}runs r
left join (select run_id, count(*) as cycles from {p}cycles group by run_id) c on c.run_id = r.run_id
left join (select run_id, count(*) as trials, sum(seconds) / 3600.0 as trial_hours from {p}trials group by run_id) t
       on t.run_id = r.run_id
left join (
    select run_id, sum(tokens_in + tokens_out) as tokens, sum(cost) as cost from {p}agent_usage group by run_id
) u on u.run_id = r.run_id
left join (
    select run_id, max(best_selection_score) as best_selection_score from {p}decisions group by run_id
) d on d.run_id = r.run_id
order by r.started_at desc
"""


def _not_applicable(p: str) -> str:
    # Per parent analysed: each catalog intervention the offline analyst skipped and why (NotApplicable's reason,
    # or "already in the lineage"), read from the **Skipped** list of its section (`### Parent `id``) in the
    # cycle's analysis, which agents/heuristic.py writes as "- `name`: reason" lines. The coder's own failures stay
    # on the rejected child's variants.reason.
    return rf"""
with sections as (
    -- union by name: a KB from before the analysis column reads it as NULL (no rows), not a binder error
    select run_id, cycle, unnest(string_split(analysis, '### Parent `')[2:]) as section
    from (select * from {p}cycles union all by name select null::varchar as analysis where false)
), skipped as (
    select run_id, cycle, split_part(section, '`', 1) as parent_id,
           unnest(regexp_extract_all(split_part(section, '**Skipped**', 2), '\n- `[^`]+`: [^\n]*')) as line
    from sections
)
select run_id, cycle, parent_id, regexp_extract(line, '`([^`]+)`', 1) as intervention,
       regexp_extract(line, '`: (.*)$', 1) as reason
from skipped
"""


# Opens every part's footer once (count(*) reads only metadata): a damaged part fails here, so readers skip it.
PROBE_TABLES = "select " + ", ".join(f"(select count(*) from {table})" for table in TABLES)

# ---------------------------------------------------------------------------------------------
# Queries (parameterised with ?)

LEADERBOARD_FOR_RUN = "select * from leaderboard where run_id = ? order by rank limit ?"
LEADERBOARD_ROW = "select * from leaderboard where run_id = ? and variant_id = ?"
# The campaign's pick: the leaderboard's rank 1 (discarded variants last, then replicate mean where replicated), what
# every surface calls "the best variant" (the MLflow tag, the Lineage page's border). The rank breaks ties itself (the
# earlier variant, then the first written); `variant_id` only orders two variants whose trials share a timestamp.
PICK = """
select variant_id from leaderboard where run_id = ? and selection_score is not null order by rank, variant_id limit 1
"""
TRIALS_FOR_RUN = "select * from trials where run_id = ? order by cycle, trial_id"
TRIAL_STATUS_COUNTS = "select status, count(*) as n from trials where run_id = ? group by status order by status"
SEGMENTS_FOR_RUN = "select * from segments where run_id = ? order by cycle, trial_id, segment"
CURVES_FOR_TRIAL = "select * from curves where run_id = ? and trial_id = ? order by epoch"
RUN = "select * from runs where run_id = ?"
RUN_IDS = "select distinct run_id from runs where run_id is not null"
RUN_CONFIG = "select config from runs where run_id = ?"
RUN_DIR = "select run_dir from runs where run_id = ?"
EPOCHS_TRAINED = "select count(distinct (trial_id, epoch)) from epochs where run_id = ?"
# Search trials only: a replicate re-runs knobs already chosen, and its luck must not pick the best.
BEST_TRIAL = """
select trial_id, selection_score, test_score, knobs from trials
where run_id = ? and status = 'completed' and not coalesce(replicate, false) and not coalesce(final, false)
order by selection_score desc, written_at, trial_id limit 1
"""
# Each variant's best completed search trial (a child's verdict compares it with its parent's) and its leaderboard
# rank, in the pick's order: what parent selection reads, so the first parent is the pick (user trial: a discarded
# child, below the seed on its replicate mean, was bred from on its luckier best trial beside "kept: none"). Run every
# cycle: the leaderboard is read for this run only (`board`), and DuckDB pushes that filter through its window to
# every Parquet scan (EXPLAIN: each READ_PARQUET filters run_id), so a KB of many runs costs this run's rows alone.
VARIANT_SCORES = """
with board as (select variant_id, rank from leaderboard where run_id = $1)
select s.variant_id, s.selection_score, s.best_knobs, s.test_score, b.rank from (
  select variant_id, max(selection_score) as selection_score,
         first(knobs order by selection_score desc, written_at, trial_id) as best_knobs,
         first(test_score order by selection_score desc, written_at, trial_id) as test_score
  from trials
  where run_id = $1 and status = 'completed' and not coalesce(replicate, false) and not coalesce(final, false)
  group by variant_id
) s left join board b on b.variant_id = s.variant_id
order by b.rank nulls last, s.selection_score desc, s.variant_id
"""
# The final training (finaltrain.py): the (variant, knobs) pairs already trained (one a stop cut short, reason ?,
# runs again; a resume whose search found another pick trains that one),
FINAL_TRIALS_DONE = """
select variant_id, knobs from trials
where run_id = ? and coalesce(final, false) and reason is distinct from ?
"""
FINAL_TRIAL = """
select t.trial_id, t.variant_id, t.status, t.reason, t.epochs, t.seconds, t.selection_score, t.test_score,
       t.knobs, t.final_added, t.final_budget_s, t.work_dir, t.seed,
       (select max(value) from epochs e where e.run_id = t.run_id
        and e.trial_id = t.trial_id and e.metric = 'train_seconds') as train_seconds
from trials t where t.run_id = ? and coalesce(t.final, false) order by t.written_at
"""
# and the candidates it trains (safeguards.final_candidates): first the pick, the leaderboard's rank 1 with its best
# search trial's knobs (ties: the first trial), then every other distinct (variant, knobs) pair, best search trial's
# selection score first; each with its variant's cycle (the pick's: the final trials'). finaltrain drops the pairs
# that would train the same code as one before them (a knob child with its parent's knobs) and keeps the first N.
FINAL_CANDIDATES = """
with searched as (
  select l.variant_id, t.knobs, l.cycle, l.rank, t.selection_score, t.trial_id from leaderboard l
  join trials t on t.run_id = l.run_id and t.variant_id = l.variant_id and t.status = 'completed'
   and not coalesce(t.replicate, false) and not coalesce(t.final, false) and t.selection_score is not null
  where l.run_id = ?
),
pick as (select * from searched order by rank, variant_id, selection_score desc, trial_id limit 1),
others as (
  select variant_id, knobs, any_value(cycle) as cycle, max(selection_score) as score, min(trial_id) as first
  from searched s
  where not exists (select 1 from pick p where p.variant_id = s.variant_id and p.knobs = s.knobs)
  group by variant_id, knobs
),
listed as (
  select 0 as part, 1 as nth, variant_id, knobs, cycle from pick
  union all
  select 1, row_number() over (order by score desc, variant_id, first), variant_id, knobs, cycle from others
)
select variant_id, knobs, cycle from listed order by part, nth
"""
# Every replicate trial so far (replicates.Tally: by variant and knobs), with its scores where it completed.
REPLICATES_FOR_RUN = """
select variant_id, knobs, seed,
       case when status = 'completed' then selection_score end, case when status = 'completed' then test_score end
from trials where run_id = ? and coalesce(replicate, false) and reason is distinct from ? order by written_at, seed
"""
VARIANTS_FOR_RUN = "select * from variants where run_id = ? order by cycle, variant_id"

# The orchestrator's reads (it is the only writer; these read back what earlier phases recorded).
RUN_STARTED_AT = "select started_at from runs where run_id = ?"
VARIANT_PARENTS = "select variant_id, parent_id, interventions from variants where run_id = ?"
# A parent's children in this run, as each stands now (the variants view keeps a variant's newest row).
VARIANT_CHILDREN = """
select variant_id, interventions, status, reason, rejected_by from variants
where run_id = ? and parent_id = ? and variant_id <> parent_id order by written_at, variant_id
"""
VARIANT_TRIALS = """
select trial_id, status, reason, knobs, selection_score from trials
where run_id = ? and variant_id = ? order by trial_id
"""
# One query for every curve of a variant (the analyst reads them all), grouped by trial on the engine side.
VARIANT_CURVES = """
select trial_id, epoch, train_loss, val_loss, val_acc, lr, grad_norm, epoch_seconds,
       gen_gap, weight_norm, update_norm, update_ratio, eff_rank, plateau,
       reward_mean, reward_std, kl, entropy, completion_length, zero_spread_frac
from curves where run_id = ? and variant_id = ? order by trial_id, epoch
"""
# The metrics of a variant's epochs the curves view does not pivot (a search.metric such as val_f1), by trial and epoch;
# not harness.TRAIN_SECONDS, which every report carries (the curve's `seconds` says the same per epoch).
VARIANT_OTHER_METRICS = f"""
select e.trial_id, e.epoch, e.metric, max(e.value) from epochs e
join trials t on t.run_id = e.run_id and t.trial_id = e.trial_id
where e.run_id = ? and t.variant_id = ?
  and e.metric not in ({", ".join(f"'{m}'" for m in EPOCH_METRICS + PROBE_METRICS + RL_METRICS + ("train_seconds",))})
group by e.trial_id, e.epoch, e.metric
"""
# What each earlier trial of a run reported, epoch by epoch (ASHA's metric and, under trial.budget_s, its time
# attribute), in the order the trials ended; of one cycle where a cycle is given (the barrier loop's: each cycle is a
# Tune run of its own), else of the whole run (the asynchronous one: one Tune run). The trials the engine counts as
# done: a trial the end of a run cut short runs again. Read by asha.rung_history.
RUNG_HISTORY = """
select e.trial_id, coalesce(t.replicate, false), e.epoch, e.metric, e.value
from epochs e join trials t on t.run_id = e.run_id and t.trial_id = e.trial_id
where e.run_id = ? and t.reason is distinct from ? and not coalesce(t.final, false) and coalesce(t.cycle = ?, true)
  and e.metric in (?, ?)
  and (not coalesce(t.replicate, false) or t.status = 'completed')  -- Tune records a replicate only on completion
order by t.written_at, e.trial_id, e.epoch
"""
# Trials of a cycle that count as done: those a stop cut short (reason ?) run again on resume.
CYCLE_TRIALS_DONE = """
select variant_id from trials
where run_id = ? and cycle = ? and reason is distinct from ? and not coalesce(replicate, false)
  and not coalesce(final, false)
"""
# Per variant of a cycle: search trials run, and how many failed (a child whose every trial failed crashed).
CYCLE_TRIAL_COUNTS = """
select variant_id, count(*), count(*) filter (where status = 'failed'), count(*) filter (where reason = ?) from trials
where run_id = ? and cycle = ? and not coalesce(replicate, false) and not coalesce(final, false)
group by variant_id
"""
EFFECTS_FOR_TASK = """
select intervention, diagnosis, n, mean_delta, win_rate, unscored from intervention_effects
where task = ? and metric is not distinct from ? and direction is not distinct from ?
"""
INTERVENTIONS_FOR_RUN = "select * from interventions where run_id = ? order by cycle, variant_id"
DECISIONS_FOR_RUN = "select * from decisions where run_id = ? order by cycle"
USAGE_FOR_RUN = """
select coalesce(sum(calls), 0), coalesce(sum(tokens_in + tokens_out), 0), coalesce(sum(cost), 0),
    coalesce(sum(seconds), 0)
from agent_usage where run_id = ?
"""
USAGE_FOR_CYCLE = """
select coalesce(sum(tokens_in + tokens_out), 0), coalesce(sum(cost), 0) from agent_usage where run_id = ? and cycle = ?
"""
BUDGET_FOR_RUN = "select * from budgets where run_id = ?"
TRIAL_TIMELINE = """
select t.trial_id, t.cycle, t.variant_id, t.status, t.selection_score, t.written_at, v.status as variant_status,
       coalesce(t.replicate, false) as replicate
from trials t left join variants v on v.run_id = t.run_id and v.variant_id = t.variant_id
where t.run_id = ? and not coalesce(t.final, false) order by t.written_at
"""

# ---------------------------------------------------------------------------------------------
# app queries (the Streamlit leaderboard in app/; read-only, parameterised with ?)

APP_RUNS = """
select run_id, experiment, task, status, stop_reason, run_dir, started_at, finished_at, cycle, phase, config
from runs order by started_at desc nulls last, run_id desc
"""
APP_LEADERBOARD = "select * from leaderboard where run_id = ? order by rank, variant_id"
# Each trial's training seconds (its last report's train_seconds; the cost of its score), joined as `e` on
# the trial named after it: one subquery for every query that shows a cost.
_TRAIN_SECONDS_JOIN = """
left join (
    select trial_id, max(value) as train_seconds from epochs where run_id = $1 and metric = 'train_seconds'
    group by trial_id
) e on e.trial_id ="""

# The leaderboard with each variant's recorded reason (why it was discarded, rejected or crashed) and what its best
# trial cost: wall seconds and training seconds (its last report's train_seconds), for front.cost_seconds.
APP_BOARD = (
    """
select l.*, v.reason, b.seconds as best_seconds, e.train_seconds as best_train_seconds
from leaderboard l
left join variants v on v.run_id = l.run_id and v.variant_id = l.variant_id
left join trials b on b.run_id = l.run_id and b.trial_id = l.best_trial_id
"""
    + _TRAIN_SECONDS_JOIN
    + """ l.best_trial_id
where l.run_id = $1 order by l.rank, l.variant_id
"""
)
# Every trial of a campaign with what the Trials and Knobs pages show (knobs as recorded: a JSON object), and its
# training seconds (its last report's train_seconds) for front.cost_seconds.
APP_TRIALS = (
    """
select t.trial_id, t.variant_id, t.cycle, t.status, t.reason, t.knobs, t.seed, t.epochs, t.val_metric,
       t.selection_score, t.test_score, t.seconds, e.train_seconds, t.peak_rss_mb, t.peak_gpu_mb, t.node, t.work_dir,
       t.written_at, v.status as variant_status,
       case when coalesce(t.final, false)
            then 'final' || coalesce(' + ' || t.final_added, '')
            when coalesce(t.replicate, false) then 'replicate'
            else 'search' end as kind
from trials t left join variants v on v.run_id = t.run_id and v.variant_id = t.variant_id
"""
    + _TRAIN_SECONDS_JOIN
    + """ t.trial_id
where t.run_id = $1 order by t.written_at, t.trial_id
"""
)
# One trial's PBT segments for the Trials page (none outside scheduler=pbt).
APP_SEGMENTS = """
select segment, from_epoch, to_epoch, variant_id, knobs, donor_trial_id, donor_epoch
from segments where run_id = ? and trial_id = ? order by segment
"""
# Every scored variant of every campaign in the KB, for the Compare page's pickers.
APP_COMPARABLE = """
select l.run_id, l.variant_id, l.status, l.selection_score, l.test_score, l.rank, r.experiment, r.task, r.started_at,
       json_extract_string(r.config, '$.task.direction') as direction
from leaderboard l join runs r on r.run_id = l.run_id
where l.selection_score is not null order by r.started_at desc nulls last, l.run_id, l.rank
"""
# The curves of chosen (run, variant) pairs, across campaigns: `?` is a list of 'run_id/variant_id' keys.
APP_CURVES_ACROSS = """
select * from curves where list_contains(?, run_id || '/' || variant_id) order by run_id, trial_id, epoch
"""
# Replicates: a variant's completed trials that share their knobs (seeds apart), with their spread.
APP_REPLICATES = """
select variant_id, knobs, count(selection_score) as n, avg(selection_score) as mean, stddev_samp(selection_score) as sd
from trials where run_id = ? and status = 'completed' and not coalesce(final, false)
group by variant_id, knobs having count(selection_score) > 1
"""
APP_LINEAGE = """
select l.*, v.rationale, v.files_dir, v.diff
from lineage l left join variants v on v.run_id = l.run_id and v.variant_id = l.variant_id
where l.run_id = ? order by l.cycle, l.variant_id
"""
APP_CURVES = "select * from curves where run_id = ? and list_contains(?, variant_id) order by trial_id, epoch"
# The newest row a campaign wrote anywhere (its sign of life), and the seconds since, by the KB's clock of UTC.
APP_LAST_WRITE = """
with written as (
    select written_at from runs where run_id = $1
    union all select written_at from cycles where run_id = $1
    union all select written_at from variants where run_id = $1
    union all select written_at from trials where run_id = $1
    union all select written_at from decisions where run_id = $1
    union all select written_at from agent_usage where run_id = $1
)
select max(written_at) as last_write, epoch(now()) - epoch(max(written_at)) as quiet_s from written
"""
# A cycle's row: `select *` because a KB written before cycles had cycle_dir and analysis lacks those columns.
APP_CYCLE = "select * from cycles where run_id = ? and cycle = ?"
APP_EFFECTS = "select * from intervention_effects order by task, mean_delta desc nulls last, intervention"
# How much evidence the effects table rests on.
APP_EFFECTS_SCOPE = (
    "select count(distinct run_id) as campaigns, count(distinct task) as tasks, count(*) as tried from interventions"
)
# The app's snapshot reads a batch of new parts of one table (a list of paths), tagging each row with its part;
# no progress bar on the server's terminal when the first read of a large KB takes seconds.
APP_READ_PARTS = "select * from read_parquet(?, union_by_name = true, filename = '_part')"
APP_READER_SETUP = "set enable_progress_bar = false"

# ---------------------------------------------------------------------------------------------
# benchmark queries (bench/*.py; read-only, parameterised with ?)

BENCH_LEADERBOARD = "select * from leaderboard where run_id = ? order by rank"
# What each trial of a chaos run ended as, and how many rows each of its epochs' metrics has (1 unless doubled).
BENCH_TRIAL_ENDS = "select trial_id, status, epochs, reason from trials where run_id = ?"
BENCH_EPOCH_ROWS = "select trial_id, epoch, metric, count(*) from epochs where run_id = ? group by all"

# ---------------------------------------------------------------------------------------------
# The asynchronous campaign's reads (asyncrun: rebuilding the population from the KB on resume)

# The deepest cycle (generation) a run has a decision for (also the benchmarks' count of cycles decided).
CYCLES_DECIDED = "select max(cycle) from decisions where run_id = ?"

ASYNC_VARIANTS = """
select variant_id, parent_id, cycle, status, files_dir, diff, interventions, diagnosis, rationale, reason, parent_score
from variants where run_id = ? order by written_at, variant_id
"""
# Trials that count: those the end of a run cut short (reason ?) run again; a final training is not the pool's.
ASYNC_TRIALS = """
select trial_id, variant_id, status, knobs, selection_score, coalesce(replicate, false), seed, test_score from trials
where run_id = ? and reason is distinct from ? and not coalesce(final, false) order by written_at
"""
TRIALS_PER_CYCLE = """
select cycle, count(*) from trials where run_id = ? and not coalesce(final, false) group by cycle order by cycle
"""

# The clock benchmarks (bench/clock_*.py): how busy the slots were, and the campaign's wall time.
RUN_SPAN = "select epoch(started_at), epoch(finished_at) from runs where run_id = ?"
TRIAL_SPANS = """
select epoch(written_at) - seconds as started, epoch(written_at) as ended, seconds, status, reason, selection_score,
       test_score, variant_id, cycle, trial_id, node
from trials where run_id = ? order by started, trial_id
"""
# The trainers' peak memory over a run's trials (peakmemory.py; NULL where not recorded, GPU only where CUDA ran).
PEAK_MEMORY_FOR_RUN = """
select max(peak_rss_mb), median(peak_rss_mb), count(peak_rss_mb), max(peak_gpu_mb), count(peak_gpu_mb)
from trials where run_id = ?
"""
# Each trial's training seconds (its last report's train_seconds): the cost of its score under a time budget.
TRAIN_SECONDS_PER_TRIAL = """
select trial_id, max(value) from epochs where run_id = ? and metric = 'train_seconds' group by trial_id
"""
# ---------------------------------------------------------------------------------------------
# Trackers and export (tracking.py, export.py): a campaign's whole record, read once.
EPOCHS_FOR_RUN = "select trial_id, epoch, metric, value from epochs where run_id = ? order by trial_id, epoch, metric"
VARIANT_LINEAGE = APP_LINEAGE  # each variant with its lineage path, scores, files and diff
# A variant's completed trials at its best knobs (seeds apart): the spread its exported score is quoted with.
# A variant's replicates as the leaderboard's interval counts them (completed, scored fresh-seed runs of its best
# knobs).
EXPORT_REPLICATES = """
select selection_score, test_score, seed from trials t
where run_id = ? and variant_id = ? and coalesce(replicate, false) and status = 'completed'
  and selection_score is not null
  and knobs = (select l.best_knobs from leaderboard l where l.run_id = t.run_id and l.variant_id = t.variant_id)
order by seed, trial_id
"""
