"""A private, compacted copy of a KB's Parquet parts that the app's views read.

The KB's views glob every part at every query, and a campaign writes a part per trial (and per phase), so
on a KB of 10,000 trials each query opens ~25,000 files: seconds per query, every few seconds per browser.
The snapshot reads each part once, keeps one file per table in a temp folder, and on refresh reads only
the parts that are new or were replaced (a part is written once, or replaced whole by `put`, always by an
atomic rename: the snapshot never holds half a part). Its views are the KB's own (`kb.connect_views`),
so every query means exactly what it means on the KB.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
import weakref
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ralph_ray import sql
from ralph_ray.kb import PARQUET_DIR, connect_views

PART_COLUMN = "_part"  # which part a row came from (dropped in the snapshot's files)
SNAPSHOT_FILE = "snapshot.parquet"


class Snapshot:
    """One KB's tables, one Parquet file each, refreshed incrementally; `cursor()` queries the KB's views over them."""

    def __init__(self, kb_root: Path, min_interval_s: float = 1.0) -> None:
        self.source = kb_root.resolve() / PARQUET_DIR
        self.folder = Path(tempfile.mkdtemp(prefix="ralph_ray_app-")) / PARQUET_DIR
        self.min_interval_s = min_interval_s
        self._seen: dict[str, dict[str, tuple[int, int]]] = {}
        self._rows: dict[str, pa.Table] = {}
        self._lock = threading.Lock()
        self._checked = float("-inf")
        self._reader = duckdb.connect()
        self._reader.execute(sql.APP_READER_SETUP)
        self._con: duckdb.DuckDBPyConnection | None = None
        weakref.finalize(self, shutil.rmtree, self.folder.parent, True)

    def refresh(self) -> None:
        """Take in the parts written since the last refresh (at most every `min_interval_s`; one thread at a time)."""
        if self._fresh():
            return
        with self._lock:
            if self._fresh():
                return  # another session's thread refreshed while this one waited
            for table in sql.TABLES:
                self._refresh_table(table)
            if self._con is None:
                self._con = connect_views(self.folder)
            self._checked = time.monotonic()

    def _fresh(self) -> bool:
        return self._con is not None and time.monotonic() - self._checked < self.min_interval_s

    def cursor(self) -> duckdb.DuckDBPyConnection:
        """A connection (one per thread) with the KB's views over the snapshot."""
        self.refresh()
        assert self._con is not None
        return self._con.cursor()

    def _refresh_table(self, table: str) -> None:
        folder = self.source / table
        parts = {entry.name: (entry.stat().st_mtime_ns, entry.stat().st_size)
                 for entry in os.scandir(folder) if entry.name.endswith(".parquet") and not entry.name.startswith(".")}
        seen = self._seen.get(table, {})
        fresh = [name for name, signature in parts.items() if seen.get(name) != signature]
        stale = [name for name in seen if parts.get(name) != seen[name]]  # replaced or removed
        if table in self._rows and not fresh and not stale:
            return
        rows = self._rows.get(table)
        if rows is not None and stale:
            rows = rows.filter(pc.invert(pc.is_in(rows[PART_COLUMN], value_set=pa.array([str(folder / n) for n in stale]))))
        if fresh:
            try:
                new = self._reader.sql(sql.APP_READ_PARTS, params=[[str(folder / n) for n in fresh]]).to_arrow_table()
            except duckdb.IOException:
                return  # a part was replaced while we read: take it in at the next refresh
            rows = new if rows is None else pa.concat_tables([rows, new], promote_options="permissive")
        self._rows[table], self._seen[table] = rows, parts
        out = self.folder / table
        out.mkdir(parents=True, exist_ok=True)
        tmp = out / f".{SNAPSHOT_FILE}.tmp"
        pq.write_table(rows.drop_columns([PART_COLUMN]), tmp)
        os.replace(tmp, out / SNAPSHOT_FILE)  # a query running now keeps reading the file it opened
