"""A private, compacted copy of a KB's Parquet parts that the app's views read.

The KB's views glob every part at every query, and a campaign writes a part per trial (and per phase), so
on a KB of 10,000 trials each query opens ~25,000 files: seconds per query, every few seconds per browser.
The snapshot reads each part once, keeps a few files per table in a temp folder (one, plus small files of
the rows appended since), and on refresh reads only the parts that are new or were replaced (a part is
written once, or replaced whole by `put`, always by an atomic rename: the snapshot never holds half a
part). Its views are the KB's own (`kb.connect_views`), so every query means what it means on the KB.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
import weakref
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ralph_ray import sql
from ralph_ray.kb import COMPACTED_PREFIX, PARQUET_DIR, SCHEMAS, compaction_state, connect_views

PART_COLUMN = "_part"  # which part a row came from (dropped in the snapshot's files)
MAX_DELTAS = 16  # new rows go to small delta files; past this many, a table is rewritten as one file
READ_TRIES = 3


class Snapshot:
    """One KB's tables in a few Parquet files each, refreshed incrementally; `query()` runs the KB's views over them."""

    def __init__(self, kb_root: Path, min_interval_s: float = 1.0) -> None:
        self.source = kb_root.resolve() / PARQUET_DIR
        self.folder = Path(tempfile.mkdtemp(prefix="ralph_ray_app-")) / PARQUET_DIR
        self.min_interval_s = min_interval_s
        self._seen: dict[str, dict[str, tuple[int, int]]] = {}
        self._rows: dict[str, pa.Table] = {}
        self._files: dict[str, list[Path]] = {}
        self._written = 0
        self.damaged: dict[Path, str] = {}  # parts that could not be read (left out until they change), and why
        # Queries and refreshes take turns: a refresh may delete files a query would otherwise be reading.
        self._lock = threading.Lock()
        self._checked = float("-inf")
        self._reader = duckdb.connect()
        self._reader.execute(sql.APP_READER_SETUP)
        self._con: duckdb.DuckDBPyConnection | None = None
        weakref.finalize(self, shutil.rmtree, self.folder.parent, True)

    def query(self, text: str, params: list[Any]) -> pa.Table:
        """Rows of one query over the KB's views, after taking in any new parts."""
        with self._lock:
            self._refresh()
            assert self._con is not None
            cursor = self._con.cursor()
            try:
                return cursor.sql(text, params=params).to_arrow_table()
            finally:
                cursor.close()

    def damaged_now(self) -> dict[Path, str]:
        """The parts that could not be read, after taking in new ones (`damaged` alone is as of the last query)."""
        with self._lock:
            self._refresh()
            return dict(self.damaged)

    def _refresh(self) -> None:
        """Take in the parts written since the last look (at most every `min_interval_s`)."""
        if self._con is not None and time.monotonic() - self._checked < self.min_interval_s:
            return
        for table in sql.ALL_TABLES:
            self._refresh_table(table)
        if self._con is None:
            self._con = connect_views(self.folder)
        self._checked = time.monotonic()

    def _refresh_table(self, table: str) -> None:
        folder = self.source / table
        for _ in range(READ_TRIES):
            listing = {
                entry.name: (entry.stat().st_mtime_ns, entry.stat().st_size)
                for entry in (os.scandir(folder) if folder.is_dir() else ())  # a KB from before the table: empty
                if not entry.name.startswith(".")
            }
            # As the KB's views: a part that a manifest of this listing lists as replaced (kb.compact_kb) counts as
            # removed (its rows are in a `_kb-*` file), and a `_kb-*` file counts once a manifest lists it live.
            hidden, live = compaction_state(folder, among=list(listing))
            parts = {
                name: signature
                for name, signature in listing.items()
                if name.endswith(".parquet")
                and name not in hidden
                and (name in live or not name.startswith(COMPACTED_PREFIX))
            }
            seen = self._seen.get(table, {})
            fresh = [name for name, signature in parts.items() if seen.get(name) != signature]
            stale = [name for name in seen if parts.get(name) != seen[name]]  # replaced or removed since
            if table in self._rows and not fresh and not stale:
                return
            try:
                new = self._read(folder, fresh)
                break
            except duckdb.IOException:
                continue  # a part was replaced between the listing and the read: list again
        else:
            return  # still changing: take it in at the next refresh
        rows = self._rows.get(table)
        if rows is not None and stale:
            rows = rows.filter(
                pc.invert(pc.is_in(rows[PART_COLUMN], value_set=pa.array([str(folder / n) for n in stale])))
            )
        if new is not None:
            rows = new if rows is None else pa.concat_tables([rows, new], promote_options="permissive")
        if rows is None:  # every part of the table is damaged: an empty table of its columns
            rows = SCHEMAS[table].empty_table().append_column(PART_COLUMN, pa.array([], pa.string()))
        for path in [p for p in self.damaged if p.parent == folder and p.name not in parts]:
            del self.damaged[path]  # moved aside
        self._rows[table], self._seen[table] = rows, parts
        files = self._files.setdefault(table, [])
        if stale or not files or len(files) > MAX_DELTAS:
            old, files[:] = list(files), [self._write(table, rows)]
            for path in old:
                path.unlink()
        elif new is not None:
            files.append(self._write(table, new))  # appended parts only: a small delta file

    def _read(self, folder: Path, names: list[str]) -> pa.Table | None:
        """The rows of these parts (None for none); a damaged part is left out and named in `damaged`."""
        if not names:
            return None
        try:
            return self._reader.sql(sql.APP_READ_PARTS, params=[[str(folder / n) for n in names]]).to_arrow_table()
        except duckdb.IOException:
            raise
        except duckdb.Error:
            pass  # one of them is damaged (truncated, not Parquet): read them one by one to find it
        tables = []
        for name in names:
            try:
                tables.append(self._reader.sql(sql.APP_READ_PARTS, params=[[str(folder / name)]]).to_arrow_table())
                self.damaged.pop(folder / name, None)
            except duckdb.IOException:
                raise
            except duckdb.Error as err:
                self.damaged[folder / name] = str(err).splitlines()[0][:200]
        return pa.concat_tables(tables, promote_options="permissive") if tables else None

    def _write(self, table: str, rows: pa.Table) -> Path:
        out = self.folder / table
        out.mkdir(parents=True, exist_ok=True)
        self._written += 1
        path = out / f"{self._written:08d}.parquet"
        tmp = out / f".{path.name}.tmp"
        pq.write_table(rows.drop_columns([PART_COLUMN]), tmp)
        os.replace(tmp, path)
        return path
