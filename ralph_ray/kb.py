"""The knowledge base: append-only Parquet parts (the truth) and a `kb.duckdb` of views over them.

The orchestrator is the only writer. Each part is written to a temp name and renamed, so a reader never
sees half a file. Readers in Python use an in-memory DuckDB with the same views (no file lock at all);
`kb.duckdb` is for the duckdb shell and other tools.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import time
import uuid
import warnings
from collections.abc import Collection
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Sequence

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ralph_ray import sql

DB_FILE = "kb.duckdb"
PARQUET_DIR = "parquet"
# The KB root where none is given: $RALPH_KB, else ./kb (the CLI, the app, and conf/paths/default.yaml by name).
KB_ENV = "RALPH_KB"
DEFAULT_KB = "kb"
# The duckdb shell on PyPI (duckdb-cli 1.5) cannot read files in 2.0's default storage format.
STORAGE_VERSION = "v1.4.0"
TS = pa.timestamp("us", tz="UTC")
# `compact_kb`: every finished run's folded part (`<run_id>-all`) merged into one sorted file per table, named
# `_kb-<generation>.parquet`, committed by its manifest `_m-<generation>.manifest` (it live, what it replaced hidden).
DAMAGED_DIR = "damaged"  # under the KB root: parts `kb check --repair` and compact_kb moved aside, by table
COMPACTED_PREFIX = sql.COMPACTED_PREFIX
MANIFEST_PREFIX = sql.MANIFEST_PREFIX
MANIFEST_SUFFIX = sql.MANIFEST_SUFFIX
# `run_ids`: on the live row, the runs whose rows the `_kb-*` file holds (whose damaged file it is: check_parts);
# null on the hidden rows, and in every row of a manifest written before 2026-12-02 (read as null: a fallback rule)
MANIFEST = pa.schema([("part", pa.string()), ("hidden", pa.bool_()), ("run_ids", pa.list_(pa.string()))])
FOLDED_PART = re.compile(r"^[^_.].*-all(-r[0-9]+)?\.parquet$")  # a finished run's part, written by compact_run
# A run's part names: `<run>` (runs), `<run>-c<cycle>-...` (a cycle's, a trial's), `<run>-all[-r<k>]` (compact_run)
RUN_OF_PART = re.compile(r"^(.+?)(?:-all(?:-r[0-9]+)?|-c[0-9]+(?:-.*)?)?\.parquet$")
# compact_kb keeps the parts it replaced this long after its commit: a query lists the compacted files' metadata, then
# the parts (milliseconds apart; seconds on a machine under heavy load), and must find what it listed.
COMPACT_GRACE_S = 5.0
COMPACT_KB_AFTER = 32  # compact_run calls compact_kb once this many finished runs' parts sit beside the file
LOCK_FILE = ".compact.lock"  # held by every compaction: two never pick the same parts
ROW_GROUP_ROWS = 122_880  # DuckDB's own row-group size: min/max of run_id prune by run, few footer entries
# The compacted file's order: a run's rows are contiguous, so row-group statistics prune by run_id (and trial_id).
SORT_KEYS: dict[str, tuple[str, ...]] = {
    "runs": ("run_id", "written_at"),
    "cycles": ("run_id", "cycle", "written_at"),
    "variants": ("run_id", "variant_id", "written_at"),
    "interventions": ("run_id", "cycle", "variant_id"),
    "decisions": ("run_id", "cycle", "written_at"),
    "agent_usage": ("run_id", "cycle", "written_at"),
    "trials": ("run_id", "trial_id", "written_at"),
    "epochs": ("run_id", "trial_id", "epoch", "metric"),
    "segments": ("run_id", "trial_id", "segment"),
}

SCHEMAS: dict[str, pa.Schema] = {
    "runs": pa.schema(
        [
            ("run_id", pa.string()),
            ("experiment", pa.string()),
            ("task", pa.string()),
            ("status", pa.string()),
            ("stop_reason", pa.string()),
            ("run_dir", pa.string()),
            ("config", pa.string()),
            ("started_at", TS),
            ("finished_at", TS),
            ("written_at", TS),
            ("cycle", pa.int32()),
            ("phase", pa.string()),
            (
                "environment",
                pa.string(),
            ),  # environment.capture() as JSON: versions, git commit, hardware (also env.json)
        ]
    ),
    "cycles": pa.schema(
        [
            ("run_id", pa.string()),
            ("cycle", pa.int32()),
            ("started_at", TS),
            ("finished_at", TS),
            ("trials", pa.int32()),
            ("best_selection_score", pa.float64()),
            ("written_at", TS),
            ("parents", pa.string()),
            ("children", pa.int32()),
            ("rejected", pa.int32()),
            ("phase", pa.string()),
            ("cycle_dir", pa.string()),
            ("analysis", pa.string()),  # the cycle's folder and its analysis.md text
        ]
    ),
    "variants": pa.schema(
        [
            ("run_id", pa.string()),
            ("variant_id", pa.string()),
            ("parent_id", pa.string()),
            ("cycle", pa.int32()),
            ("files_dir", pa.string()),
            ("diff", pa.string()),
            ("written_at", TS),
            ("status", pa.string()),
            ("interventions", pa.string()),
            ("diagnosis", pa.string()),
            ("rationale", pa.string()),
            ("reason", pa.string()),
            ("rejected_by", pa.string()),  # a rejected child's RejectedBy (gate, coder, budget); NULL before 2026-11-30
            ("parent_score", pa.float64()),
            ("selection_score", pa.float64()),
            ("backend", pa.string()),
            # every gate refusal of its attempts, a JSON list of "attempt N: why" (one that passed later too: an engine
            # import or a path outside its work dir the gate caught); NULL: none, or a KB from before 2026-12-02
            ("refusals", pa.string()),
        ]
    ),
    "interventions": pa.schema(
        [
            ("run_id", pa.string()),
            ("task", pa.string()),
            ("cycle", pa.int32()),
            ("variant_id", pa.string()),
            ("parent_id", pa.string()),
            ("intervention", pa.string()),
            ("diagnosis", pa.string()),
            ("parent_score", pa.float64()),
            ("child_score", pa.float64()),
            ("delta", pa.float64()),
            ("outcome", pa.string()),
            ("written_at", TS),
            # what the delta compares (records.EffectBasis: replicate means, or best trials); NULL before 2026-12-01
            ("basis", pa.string()),
        ]
    ),
    "decisions": pa.schema(
        [
            ("run_id", pa.string()),
            ("cycle", pa.int32()),
            ("decision", pa.string()),
            ("reason", pa.string()),
            ("exit_code", pa.int32()),
            ("rationale", pa.string()),
            ("best_selection_score", pa.float64()),
            ("best_variant_id", pa.string()),
            ("elapsed_s", pa.float64()),
            ("tokens", pa.int64()),
            ("cost", pa.float64()),
            ("written_at", TS),
        ]
    ),
    "agent_usage": pa.schema(
        [
            ("run_id", pa.string()),
            ("cycle", pa.int32()),
            ("role", pa.string()),
            ("backend", pa.string()),
            ("variant_id", pa.string()),
            ("calls", pa.int32()),
            ("tokens_in", pa.int64()),
            ("tokens_out", pa.int64()),
            ("seconds", pa.float64()),
            ("cost", pa.float64()),
            ("estimated", pa.bool_()),
            ("written_at", TS),
        ]
    ),
    "trials": pa.schema(
        [
            ("run_id", pa.string()),
            ("cycle", pa.int32()),
            ("trial_id", pa.string()),
            ("variant_id", pa.string()),
            ("status", pa.string()),
            ("reason", pa.string()),
            ("knobs", pa.string()),
            ("seed", pa.int64()),
            ("epochs", pa.int32()),
            ("val_metric", pa.float64()),
            ("selection_score", pa.float64()),
            ("test_score", pa.float64()),
            ("seconds", pa.float64()),
            ("work_dir", pa.string()),
            ("written_at", TS),
            ("replicate", pa.bool_()),  # a fresh-seed run of the variant's best knobs (noise.py); NULL in old KBs
            ("peak_rss_mb", pa.float64()),  # the trainer's peak memory in MiB (peakmemory.py); NULL in old KBs
            ("peak_gpu_mb", pa.float64()),  # its CUDA peak (max_memory_allocated); NULL without a GPU
            ("node", pa.string()),  # the IP of the Ray node the trial ran on (Tune's node_ip); NULL in old KBs
            ("final", pa.bool_()),  # the final training of the pick (finaltrain.py); NULL in old KBs
            ("final_budget_s", pa.float64()),  # the final training's seconds of training; NULL: search (or old)
            # what the final training added to its code, in order ("cosine + shift + deepen"); NULL: none (or search)
            ("final_added", pa.string()),
        ]
    ),
    "epochs": pa.schema(
        [
            ("run_id", pa.string()),
            ("trial_id", pa.string()),
            ("epoch", pa.int32()),
            ("metric", pa.string()),
            ("value", pa.float64()),
            ("written_at", TS),
        ]
    ),
    # scheduler=pbt: the epochs a trial trained with one variant and knobs, from its weights or a donor's
    # (ralph_ray.pbt); a KB written before this table reads it as empty (sql.SEGMENTS_EMPTY).
    "segments": pa.schema(
        [
            ("run_id", pa.string()),
            ("cycle", pa.int32()),
            ("trial_id", pa.string()),
            ("segment", pa.int32()),
            ("from_epoch", pa.int32()),
            ("to_epoch", pa.int32()),
            ("variant_id", pa.string()),
            ("knobs", pa.string()),
            ("donor_trial_id", pa.string()),
            ("donor_epoch", pa.int32()),
            ("written_at", TS),
        ]
    ),
}


def now() -> datetime:
    """The current UTC time (KB timestamps are all UTC)."""
    return datetime.now(timezone.utc)


class KnowledgeBase:
    """Writes Parquet parts under `<root>/parquet/<table>/` and keeps `kb.duckdb`'s views pointing at them."""

    def __init__(self, root: Path) -> None:
        self.root = root.resolve()
        self.parquet = self.root / PARQUET_DIR
        self.compact_grace_s = COMPACT_GRACE_S
        self.damaged: dict[Path, str] = {}  # parts found unreadable, with why: `reader()` leaves them out
        self._checked = False  # check_parts ran: a part found damaged later is warned of where reader() finds it

    def init(self) -> None:
        """Create the folders, an empty schema part per table, and the views in kb.duckdb (if stale)."""
        for table, schema in SCHEMAS.items():
            folder = self.parquet / table
            folder.mkdir(parents=True, exist_ok=True)
            # An empty part with the current schema: views bind before the first row, columns are typed,
            # and columns added since an older KB was written read as NULL in its old parts.
            schema_part = folder / "_schema.parquet"
            if not schema_part.exists() or _schema_of(schema_part) != schema:  # a damaged one is written again
                self._write(schema_part, schema.empty_table())
        self._write_views_if_stale()

    def append(self, table: str, rows: Sequence[dict[str, Any]], tag: str) -> Path | None:
        """Write rows as one new immutable part of `table`; `tag` makes the file name readable."""
        if not rows:
            return None
        part = self.parquet / table / f"{tag}-{int(time.time() * 1000)}-{uuid.uuid4().hex[:8]}.parquet"
        self._write(part, self._table(table, rows))
        return part

    def _table(self, table: str, rows: Sequence[dict[str, Any]]) -> pa.Table:
        schema = SCHEMAS[table]
        unknown = set().union(*rows) - set(schema.names)
        if unknown:
            raise ValueError(f"{table} has no columns {sorted(unknown)}")
        # Arrow builds the columns in C++ (a Python loop per cell ran at ~40k rows/s); a missing written_at is now.
        built = pa.Table.from_pylist(list(rows), schema=schema)
        index = schema.get_field_index("written_at")
        stamp = pa.scalar(now(), schema.field(index).type)
        return built.set_column(index, "written_at", pc.fill_null(built.column(index), stamp))

    def put(self, table: str, rows: Sequence[dict[str, Any]], name: str) -> Path | None:
        """Write rows as the part named `name`, replacing an earlier part of that name (idempotent on resume)."""
        if not rows:
            return None
        part = self.parquet / table / f"{name}.parquet"
        self._write(part, self._table(table, rows))
        return part

    def compact(self, table: str, prefix: str, name: str) -> int:
        """Merge the parts of `table` whose names start with `prefix` into the part `name`; returns parts merged.

        Readers pay per file opened, so a cycle's one-part-per-trial rows become one part once the cycle is
        recorded. The merged part is written (atomically) before the small ones go, so a reader never misses
        a row; it may briefly see one twice, which the views absorb (trials keep one row per trial_id, curves
        take one value per epoch). Idempotent: running it again folds any new parts into the same file.
        """
        folder = self.parquet / table
        target = folder / f"{name}.parquet"
        with self._compaction_lock():
            hidden = replaced_parts(folder)  # left over from a compact_kb cut short: already in `_kb-*`
            sources = sorted(p for p in folder.glob(f"{prefix}*.parquet") if p != target and p.name not in hidden)
            if not sources:
                return 0
            parts = ([pq.read_table(target)] if target.exists() else []) + [pq.read_table(p) for p in sources]
            self._write(target, conform(table, pa.concat_tables(parts, promote_options="default")))
            for path in sources:
                path.unlink()
            return len(sources)

    def compact_run(self, run_id: str) -> int:
        """Merge every part of a finished run into one per table; returns the parts merged.

        Readers pay per file opened (a query over a KB of many campaigns opened thousands): a campaign that ends
        folds its cycles' parts into `<run_id>-all`. Parts are picked by name and kept only if every row is this
        run's (another run's id may start with this one's). Same atomic order as `compact`. Once COMPACT_KB_AFTER
        runs' parts have piled up this way, they are merged into the KB's sorted file (`compact_kb`).
        """
        merged = 0
        with self._compaction_lock():
            for table in SCHEMAS:
                folder = self.parquet / table
                hidden = replaced_parts(folder)
                target = folder / f"{run_id}-all.parquet"
                k = 1
                while target.name in hidden:  # folded into `_kb-*` already (a resumed run): never reuse a hidden name
                    k += 1
                    target = folder / f"{run_id}-all-r{k}.parquet"
                found = sorted(folder.glob(f"{run_id}*.parquet"))
                sources = [p for p in found if p != target and p.name not in hidden and _only_run(p, run_id)]
                if not sources:
                    continue
                parts = ([pq.read_table(target)] if target.exists() else []) + [pq.read_table(p) for p in sources]
                self._write(target, conform(table, pa.concat_tables(parts, promote_options="default")))
                for path in sources:
                    path.unlink()
                merged += len(sources)
        folded = [p for p in (self.parquet / "trials").glob("*-all*.parquet") if FOLDED_PART.search(p.name)]
        if len(folded) >= COMPACT_KB_AFTER:  # enough finished campaigns apart: one sorted file again (compact_kb)
            self.compact_kb()
        return merged

    def compact_kb(self) -> dict[str, int]:
        """Merge every finished run's part (`<run_id>-all*`, from `compact_run`) into one sorted file per table.

        Readers pay per file opened: a KB of 500 campaigns is 500 parts per table and every query opens them all.
        This folds them, with the previous `_kb-<g>` file, into `_kb-<g+1>.parquet`, sorted by run (SORT_KEYS) in
        row groups of ROW_GROUP_ROWS so a run's query reads its row groups only. Crash-safe and invisible to
        readers: the new file is written (temp name, rename), then its manifest `_m-<g+1>.parquet` (the commit),
        which lists it live and the parts it replaces hidden. A query reads the manifests first: a `_kb-*` file
        counts only if a manifest it read lists it live, and the parts listed hidden do not (sql.py
        `_read_parts`). So every query reads each row once, from the old parts or from the new file. The replaced
        parts are deleted COMPACT_GRACE_S after the commit (a query that listed them before it still reads them);
        a run cut short before that leaves them listed (hidden), and the next call deletes them first.
        Runs under the compaction lock (never beside compact_run or another compact_kb). Returns parts merged per
        table (tables with nothing to merge left out).
        """
        merged: dict[str, int] = {}
        done: list[Path] = []
        with self._compaction_lock():
            for table in SCHEMAS:
                folder = self.parquet / table
                if not folder.is_dir():
                    continue
                schema_part = folder / "_schema.parquet"  # the views' glob of `_*` files never comes up empty
                if not schema_part.exists():
                    self._write(schema_part, SCHEMAS[table].empty_table())
                if any(_schema_of(p) is None for p in folder.glob(f"{MANIFEST_PREFIX}*{MANIFEST_SUFFIX}")):
                    continue  # a damaged manifest: which `_kb-*` file is live is unknown, so none is deleted or merged
                hidden, live = compaction_state(folder)
                for name in sorted(hidden):  # left over from a call cut short after its commit
                    (folder / name).unlink(missing_ok=True)
                for path in folder.glob(f"{COMPACTED_PREFIX}*.parquet"):
                    if path.name not in live:  # written by a call cut short before its commit: never counted
                        # Moved aside, not deleted: after `kb check --repair` moved its damaged manifest away, an
                        # unlisted file is the only copy of the runs it holds (review: their rows were lost for good).
                        aside = self.root / DAMAGED_DIR / table / f"{path.name}.unlisted"
                        aside.parent.mkdir(parents=True, exist_ok=True)
                        shutil.move(path, aside)
                manifests = sorted(folder.glob(f"{MANIFEST_PREFIX}*{MANIFEST_SUFFIX}"))
                current = sorted(folder.glob(f"{COMPACTED_PREFIX}*.parquet"))
                sources = sorted(p for p in folder.glob("*-all*.parquet") if FOLDED_PART.search(p.name))
                # A damaged part stays where it is for `kb check` to name (merging it would fail or drop its rows);
                # a damaged `_kb-*` file leaves the table as it is (its rows cannot be carried into the next one).
                sources = [p for p in sources if _schema_of(p) is not None]
                if not sources or any(_schema_of(p) is None for p in current):
                    continue
                generation = 1 + max((_generation(p) for p in manifests + current), default=0)
                target = folder / f"{COMPACTED_PREFIX}{generation:06d}.parquet"
                held = _write_compacted(target, table, current, sources)
                replaced = current + sources + manifests
                manifest = pa.table(
                    {
                        "part": [target.name] + [p.name for p in replaced],
                        "hidden": [False] + [True] * len(replaced),
                        "run_ids": [sorted(held)] + [None] * len(replaced),
                    },
                    schema=MANIFEST,
                )
                self._write(folder / f"{MANIFEST_PREFIX}{generation:06d}{MANIFEST_SUFFIX}", manifest)  # the commit
                merged[table] = len(sources)
                done.extend(replaced)
            if done:
                time.sleep(self.compact_grace_s)  # a query that listed its files before the commit may still read them
            for path in done:  # each is listed hidden by a committed manifest: out of the views already
                path.unlink()
        return merged

    def _compaction_lock(self) -> _FileLock:
        return _FileLock(self.root / LOCK_FILE)

    def reader(self) -> duckdb.DuckDBPyConnection:
        """An in-memory connection with the KB's views: never takes a lock on kb.duckdb.

        A damaged part (another run's, say) is left out, as `open_reader` leaves it out: one bad file never stops a
        campaign (user trial: every new campaign on the KB exited 4). `check_parts` names them at the start.
        """
        while True:
            try:
                return connect_views(self.parquet, skip=self.damaged)
            except duckdb.Error:  # binding the views reads every part's footer: a damaged one fails (many ways)
                found = {p: why for p, why in damaged_parts(self.parquet).items() if p not in self.damaged}
                if not found:
                    raise
                self.damaged.update(found)
                if self._checked:  # damaged since check_parts named the rest: said here
                    for path, why in found.items():
                        warnings.warn(self.damaged_note(path, why), DamagedPartWarning, stacklevel=2)

    def check_parts(self, run_id: str) -> tuple[dict[Path, str], dict[Path, str]]:
        """Every damaged part, left out of `reader()` from now on: those of `run_id`, then the others (with why)."""
        self._checked = True
        try:  # the views bind and every footer opens: nothing damaged, and no part's metadata read twice
            connect_views(self.parquet).execute(sql.PROBE_TABLES).fetchall()
            self.damaged = {}
            return {}, {}
        except duckdb.Error:  # a truncated part (InvalidInputException), a bad footer length (plain Error), ...
            self.damaged = damaged_parts(self.parquet)
            if not self.damaged:
                raise  # not a damaged part: not ours to hide
        runs = self._run_ids()
        own = {path for path in self.damaged if part_run(path, runs | {run_id}) == run_id}
        compacted = [path for path in self.damaged if path.name.startswith((COMPACTED_PREFIX, MANIFEST_PREFIX))]
        for folder in sorted({path.parent for path in compacted}):
            held = compacted_run_ids(folder)
            unknown = [path for path in compacted if path.parent == folder and path.name not in held]
            own.update(path for path in compacted if run_id in held.get(path.name, ()))
            # No record to read (a manifest from before it, a damaged manifest, a `_kb-*` file no manifest lists live):
            # the rule by the run's parts, which may count a file as the own part of a run it holds none of (a
            # refusal to repair first), never the other way
            if unknown and self._compacted_in(folder, run_id, runs):
                own.update(unknown)
        mine = {path: why for path, why in self.damaged.items() if path in own}
        return mine, {path: why for path, why in self.damaged.items() if path not in own}

    def _compacted_in(self, folder: Path, run_id: str, runs: set[str]) -> bool:
        """Whether `run_id`'s rows of this table may be in its `_kb-*` files (a damaged one there is then its own).

        Yes where no readable runs row names the run (its own may be in a damaged file), where a readable manifest
        of the table lists a part of it replaced, or where compact_kb merged the run (`_compacted`) and no folded
        `-all` part of it stands in the table (a table whose `_kb-*` file is damaged is not compacted again, so the
        runs that end after the damage keep their rows there: a new campaign is never refused
        over an older run's damaged file). A run compact_kb never merged: no. The fallback where the manifests record
        no run ids (check_parts): a run compacted later with no rows in this table, or resumed and folded again, can be
        told wrong by it.
        """
        if run_id not in runs:
            return True
        hidden, _ = compaction_state(folder)
        if any(part_run(Path(name), runs) == run_id for name in hidden):
            return True
        folded = [
            path
            for path in folder.glob(f"{run_id}-all*.parquet")
            if path not in self.damaged and path.name not in hidden and part_run(path, runs) == run_id
        ]
        return not folded and self._compacted(run_id, runs)

    def _compacted(self, run_id: str, runs: set[str]) -> bool:
        """Whether compact_kb merged `run_id`'s parts into the `_kb-*` files: a readable live one of some table holds
        a row of it, or a readable manifest lists a part of it replaced."""
        for table in SCHEMAS:
            folder = self.parquet / table
            hidden, live = compaction_state(folder)
            if any(part_run(Path(name), runs) == run_id for name in hidden):
                return True
            for name in live:
                path = folder / name
                if path in self.damaged:
                    continue
                try:  # the row groups' run_id statistics prune it to the few that may hold the run (SORT_KEYS)
                    if pq.read_table(path, columns=["run_id"], filters=[("run_id", "=", run_id)]).num_rows:
                        return True
                except (OSError, pa.ArrowException):
                    continue  # gone since the listing (a newer compaction) or damaged since: not read
        return False

    def damaged_note(self, path: Path, why: str) -> str:
        """One damaged part in words: the file, why, whose rows are missing, and the command that moves it aside."""
        return damaged_note(path, why, self.root, self._run_ids())

    def _run_ids(self) -> set[str]:
        """The run ids the readable parts hold (to tell which run a damaged part's name names)."""
        try:
            con = connect_views(self.parquet, skip=self.damaged)
            return {row[0] for row in con.execute(sql.RUN_IDS).fetchall()}
        except duckdb.Error:
            return set()

    def _write(self, path: Path, table: pa.Table) -> None:
        tmp = path.with_name(f".{path.name}.tmp")
        pq.write_table(table, tmp)
        os.replace(tmp, path)  # atomic: readers see the whole part or none

    def _write_views_if_stale(self) -> None:
        """Rewrite kb.duckdb's views only when they point elsewhere or changed: each write locks the file."""
        statements = sql.view_statements(self.parquet, schema="kb")
        fingerprint = json.dumps({"root": str(self.parquet), "views": statements})
        db = self.root / DB_FILE
        if db.exists() and _stored_fingerprint(db) == fingerprint:
            return
        con = duckdb.connect()
        try:
            con.execute(sql.attach_kb_file(db, STORAGE_VERSION))
            for statement in statements:
                con.execute(statement)
            con.execute(sql.CREATE_KB_META)
            con.execute(sql.INSERT_KB_META, [fingerprint])
            con.execute(sql.DETACH_KB_FILE)
        except duckdb.Error:
            # A damaged part fails the views' binding: the shell's file waits (its fingerprint unwritten, so the
            # next start after `kb check --repair` writes it); the Python readers leave the part out meanwhile.
            if not damaged_parts(self.parquet):
                raise  # not a damaged part (kb.duckdb locked by another process, say): said as it is
        finally:
            con.close()


class _FileLock:
    """An exclusive flock on a file under the KB root, for the duration of a `with` block (across processes)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    def __enter__(self) -> _FileLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._fd is not None
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
        self._fd = None


# The columns sql.LEGACY_FINAL_ADDED reads, typed: conform gives them to a part that lacks one, so the rule can run
LEGACY_FINAL_TYPES = {
    "final_added": pa.string(),
    "final_schedule": pa.string(),
    "final_augment": pa.string(),
    "final_deepen": pa.bool_(),
}


def conform(table: str, rows: pa.Table) -> pa.Table:
    """Rows of any age as `table`'s schema today: a column added since reads as nulls, and a final training's
    additions recorded in the columns `final_added` replaced are read into it (sql.LEGACY_FINAL_ADDED's rule)."""
    schema = SCHEMAS[table]
    if any(name in rows.column_names for name in sql.LEGACY_FINAL_COLUMNS):  # the view's rule, in one place
        for name, kind in LEGACY_FINAL_TYPES.items():
            if name not in rows.column_names:
                rows = rows.append_column(name, pa.nulls(rows.num_rows, kind))
        folded = (
            f"select * exclude ({', '.join(sql.LEGACY_FINAL_COLUMNS)}) "
            f"replace ({sql.LEGACY_FINAL_ADDED} as final_added) from part"
        )
        con = duckdb.connect()
        try:
            con.register("part", rows)
            rows = con.sql(folded).to_arrow_table()
        finally:
            con.close()
    for name in set(schema.names) - set(rows.column_names):  # rows written before a column was added
        rows = rows.append_column(name, pa.nulls(rows.num_rows, schema.field(name).type))
    return rows.select(schema.names).cast(schema)


def _write_compacted(target: Path, table: str, compacted: list[Path], parts: list[Path]) -> set[str]:
    """Write `target` (temp name, then rename): the rows of the earlier `_kb-*` files as they are (already in
    order), then each part's rows sorted by SORT_KEYS (a part is one run's), in row groups of ROW_GROUP_ROWS;
    one row group and one part in memory at a time. It counts once its manifest is written. Returns the run ids
    of the rows written (the manifest's record)."""
    schema = SCHEMAS[table]
    tmp = target.with_name(f".{target.name}.tmp")
    pending: list[pa.Table] = []
    held: set[str] = set()

    def flush(writer: pq.ParquetWriter, final: bool) -> None:
        rows = pa.concat_tables(pending) if pending else schema.empty_table()
        whole = rows.num_rows if final else rows.num_rows - rows.num_rows % ROW_GROUP_ROWS
        if whole:
            writer.write_table(rows.slice(0, whole), row_group_size=ROW_GROUP_ROWS)
        pending[:] = [rows.slice(whole)] if whole < rows.num_rows else []

    def add(rows: pa.Table, writer: pq.ParquetWriter) -> None:
        rows = conform(table, rows)
        held.update(run for run in pc.unique(rows.column("run_id")).to_pylist() if run is not None)
        pending.append(rows)
        if sum(t.num_rows for t in pending) >= ROW_GROUP_ROWS:
            flush(writer, final=False)

    with pq.ParquetWriter(tmp, schema) as writer:
        for path in compacted:
            for batch in pq.ParquetFile(path).iter_batches(batch_size=ROW_GROUP_ROWS):
                add(pa.Table.from_batches([batch]), writer)
        for path in parts:
            rows = pq.read_table(path)
            add(rows.sort_by([(key, "ascending") for key in SORT_KEYS[table]]), writer)
        flush(writer, final=True)
    os.replace(tmp, target)  # not counted yet: the manifest's rename is the commit
    return held


def _generation(path: Path) -> int:
    """The generation number of a `_kb-<g>.parquet` file (0 if its name has none)."""
    digits = path.stem[len(COMPACTED_PREFIX) :]
    return int(digits) if digits.isdigit() else 0


def compaction_state(folder: Path, among: Collection[str] | None = None) -> tuple[set[str], set[str]]:
    """The names a table folder's manifests list hidden (replaced parts) and live (`_kb-*` files that count).

    `among`: a listing of the folder taken earlier; only its manifests count (a reader consistent with it).
    """
    found = folder.glob(f"{MANIFEST_PREFIX}*{MANIFEST_SUFFIX}")
    if among is not None:
        found = (folder / n for n in among if n.startswith(MANIFEST_PREFIX) and n.endswith(MANIFEST_SUFFIX))
    hidden: set[str] = set()
    listed: set[str] = set()
    for path in found:
        try:
            rows = pq.read_table(path, schema=MANIFEST).to_pylist()
        except (OSError, pa.ArrowException):
            continue  # gone since the listing (a newer compaction), or damaged (the readers name it)
        hidden.update(row["part"] for row in rows if row["hidden"])
        listed.update(row["part"] for row in rows if not row["hidden"])
    return hidden, listed - hidden


def compacted_run_ids(folder: Path) -> dict[str, frozenset[str]]:
    """The run ids each live `_kb-*` file of a table folder holds, as its manifest recorded them at compaction time.

    Left out: a file whose manifest has no record (written before it), and every file of a folder with a damaged
    manifest (which of them is live, and what it holds, is unknown)."""
    held: dict[str, set[str]] = {}
    for path in folder.glob(f"{MANIFEST_PREFIX}*{MANIFEST_SUFFIX}"):
        try:
            rows = pq.read_table(path, schema=MANIFEST).to_pylist()
        except FileNotFoundError:
            continue  # replaced since the listing (a newer compaction)
        except (OSError, pa.ArrowException):
            return {}
        for row in rows:
            if not row["hidden"] and row["run_ids"] is not None:
                held.setdefault(row["part"], set()).update(row["run_ids"])
    _, live = compaction_state(folder)
    return {name: frozenset(ids) for name, ids in held.items() if name in live}


def replaced_parts(folder: Path, among: Collection[str] | None = None) -> set[str]:
    """Names of the parts that a manifest of this table's folder lists as replaced (the views leave them out)."""
    return compaction_state(folder, among)[0]


def _only_run(path: Path, run_id: str) -> bool:
    """True when every row of the part belongs to `run_id` (read from its run_id column alone)."""
    try:
        column = pq.read_table(path, columns=["run_id"]).column("run_id")
    except (OSError, KeyError, pa.ArrowInvalid):
        return False  # a damaged part stays where it is, for the readers to skip and name
    return column.null_count == 0 and set(column.unique().to_pylist()) <= {run_id}


class DamagedRunError(RuntimeError):
    """A run's own rows are in a damaged part: what would go on without them (a report) refuses; the message names
    the part and the repair. Not rundir.CampaignError: the report, which raises it, must not reach Ray (rundir does)."""


class DamagedPartWarning(UserWarning):
    """A Parquet part of the KB could not be read and was left out of the views."""


def part_run(path: Path, runs: Collection[str] = ()) -> str | None:
    """The run whose rows a part holds, read from its name (RUN_OF_PART); None for the KB's own `_*` files (the
    compacted `_kb-*` holds many runs). `runs`: the KB's run ids, so of `r1` and `r1-b` the longer names its parts."""
    if path.name.startswith("_"):
        return None
    stem = path.name.removesuffix(".parquet")
    named = [run for run in runs if stem == run or stem.startswith(f"{run}-")]
    if named:
        return max(named, key=len)
    match = RUN_OF_PART.match(path.name)
    return match.group(1) if match else stem


def repair_command(kb_root: Path) -> str:
    """The command that moves a KB's damaged parts aside (kbcheck.py)."""
    return f"python -m ralph_ray kb check --repair --kb {kb_root}"


def damaged_run_message(
    run_id: str, parts: dict[Path, str], kb_root: Path, would: str, again: str = "run this command again"
) -> str:
    """A refusal over damaged parts of `run_id`'s own (`would`: what going on would do without their rows; `again`:
    what to do once they are repaired)."""
    named = "; ".join(f"{path} ({why})" for path, why in parts.items())
    return (
        f"run {run_id}'s rows are in {len(parts)} damaged part(s) of the knowledge base: {named}; {would}. "
        f"fix: restore the file from a backup, or move it aside with `{repair_command(kb_root)}` (its rows are then "
        f"gone from the KB; the trials' files stay in the run dir), then {again}"
    )


# What a resume of a run would do with its own rows in a damaged part (`resume=` and Campaign refuse it).
RESUME_WOULD = "a resume would go on without their rows (its best, its trials and verdicts)"


def own_damaged(
    kb: KnowledgeBase | str | Path, run_id: str, would: str, again: str = "run this command again"
) -> str | None:
    """The refusal naming the damaged parts that hold `run_id`'s rows and the repair (damaged_run_message); None
    where none does, or where no KB was initialised yet (`trials/_schema.parquet`, as open_reader checks). Every
    damaged part found is in `kb.damaged` after: where None, all are other runs'."""
    kb = kb if isinstance(kb, KnowledgeBase) else KnowledgeBase(Path(kb))
    if not (kb.parquet / "trials" / "_schema.parquet").exists():
        return None  # no KB yet (an empty folder): nothing of the run's in it to lose
    mine, _ = kb.check_parts(run_id)
    return damaged_run_message(run_id, mine, kb.root, would, again) if mine else None


def damaged_note(path: Path, why: str, kb_root: Path, runs: Collection[str] = ()) -> str:
    """A damaged part in words: the file, why, whose rows are missing from what is read, and the repair."""
    run, table = part_run(path, runs), path.parent.name
    if run is not None:
        missing = f"run {run}'s {table} rows in it are missing"
    elif path.name.startswith(COMPACTED_PREFIX):
        missing = f"the {table} rows of the finished runs compacted into it are missing"
    elif path.name.startswith(MANIFEST_PREFIX):
        missing = f"the compacted {table} file it lists may be missing"
    else:
        missing = "no rows are missing (an empty schema part; the next campaign writes it again)"
    return (
        f"skipped a damaged part of the knowledge base: {path} ({why}); {missing}; move it aside with "
        f"`{repair_command(kb_root)}` (nothing is deleted; the other parts are read as usual)"
    )


def connect_views(parquet_root: Path, skip: Collection[Path] = ()) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB connection with every KB view over the Parquet parts under `parquet_root` (but `skip`)."""
    con = duckdb.connect()
    for statement in sql.view_statements(parquet_root, skip=skip):
        con.execute(statement)
    return con


def open_reader(kb_root: str | Path) -> duckdb.DuckDBPyConnection:
    """A reader over an existing KB root (a path or a str); a clear error when there is none yet.

    A damaged part (truncated, not Parquet) is left out with a `DamagedPartWarning` naming it, so one bad file
    never hides the rest of the KB; kb.duckdb is not needed (the views live in memory).
    """
    parquet = Path(kb_root).resolve() / PARQUET_DIR
    if not (parquet / "trials" / "_schema.parquet").exists():
        raise FileNotFoundError(
            f"no knowledge base at {kb_root}: run a campaign first (python -m ralph_ray paths.kb={kb_root})"
        )
    try:
        con = connect_views(parquet)  # binding the views reads the parts' schemas: a damaged one fails here
        con.execute(sql.PROBE_TABLES).fetchall()  # or here, where every part's footer is opened (not mid-page)
        return con
    except duckdb.Error:  # a truncated part (InvalidInputException), a bad footer length (plain Error), ...
        damaged = damaged_parts(parquet)
        if not damaged:
            raise
    con = connect_views(parquet, skip=damaged)
    runs = {row[0] for row in con.execute(sql.RUN_IDS).fetchall()}
    for path, why in damaged.items():
        warnings.warn(damaged_note(path, why, parquet.parent, runs), DamagedPartWarning, stacklevel=2)
    return con


def damaged_parts(parquet_root: Path) -> dict[Path, str]:
    """Every part under `parquet_root` whose Parquet footer cannot be read, with the reason."""
    damaged: dict[Path, str] = {}
    for table in sql.ALL_TABLES:
        folder = parquet_root / table
        for path in sorted([*folder.glob("*.parquet"), *folder.glob(f"{MANIFEST_PREFIX}*{MANIFEST_SUFFIX}")]):
            try:
                pq.read_metadata(path)
            except FileNotFoundError:
                continue  # compacted away since the listing: gone, not damaged
            except (OSError, pa.ArrowException) as err:
                damaged[path] = str(err).splitlines()[0][:200]
    return damaged


def _schema_of(path: Path) -> pa.Schema | None:
    """A part's schema (None when the part is damaged)."""
    try:
        return pq.read_schema(path).remove_metadata()
    except (OSError, pa.ArrowException):
        return None


def _stored_fingerprint(db: Path) -> str | None:
    try:
        con = duckdb.connect(str(db), read_only=True)
    except duckdb.Error:
        return None
    try:
        row = con.execute(sql.KB_META_FINGERPRINT).fetchone()
        return row[0] if row else None
    except duckdb.Error:
        return None
    finally:
        con.close()
