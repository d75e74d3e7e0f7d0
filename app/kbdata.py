"""The app's only door to the knowledge base: cached, read-only queries from `ralph_ray.sql`.

Everything a page shows comes from here; the app imports nothing else of the engine but `ralph_ray.kb` (the
reader), `ralph_ray.sql`, `ralph_ray.front` (the score-against-cost front, the report's rule) and
`ralph_ray.control` (the Stop button).

One snapshot per KB root (`snapshot.Snapshot`: the KB's own views over a compacted private copy of its
Parquet parts, refreshed incrementally; never a file lock, never half a part), shared by every browser
session; results cached for `TTL_S` seconds so a page's widgets and every open tab share one read.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pandas as pd
import streamlit as st
from snapshot import Snapshot

from ralph_ray import sql
from ralph_ray.kb import DEFAULT_KB, KB_ENV, PARQUET_DIR

TTL_S = 2


def kb_from_args(argv: list[str], env: dict[str, str]) -> Path:
    """The KB root: `-- --kb PATH` after `streamlit run`, else $RALPH_KB, else ./kb."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--kb")
    known, _ = parser.parse_known_args(argv)
    return Path(known.kb or env.get(KB_ENV) or DEFAULT_KB).expanduser().resolve()


def kb_exists(kb_root: str) -> bool:
    """True once a campaign has initialised a KB at this root."""
    return (Path(kb_root) / PARQUET_DIR / "trials" / "_schema.parquet").exists()


@st.cache_resource(show_spinner=False, max_entries=8)
def _snapshot(kb_root: str) -> Snapshot:
    return Snapshot(Path(kb_root), min_interval_s=TTL_S / 2)


@st.cache_data(ttl=TTL_S, show_spinner=False, max_entries=256)
def frame(kb_root: str, query: str, params: tuple[Any, ...] = ()) -> pd.DataFrame:
    """Rows of one `ralph_ray.sql` query as a DataFrame (cached for TTL_S seconds)."""
    return _snapshot(kb_root).query(query, [list(p) if isinstance(p, tuple) else p for p in params]).to_pandas()


def runs(kb_root: str) -> pd.DataFrame:
    """Every campaign in the KB, newest first."""
    return frame(kb_root, sql.APP_RUNS)


def cycle(kb_root: str, run_id: str, number: int) -> dict[str, Any]:
    """A cycle's `cycles` row ({} before it is recorded); `cycle_dir` and `analysis` are absent in older KBs."""
    found = frame(kb_root, sql.APP_CYCLE, (run_id, number))
    return {k: (None if pd.isna(v) else v) for k, v in found.iloc[0].items()} if not found.empty else {}


def damaged(kb_root: str) -> dict[Path, str]:
    """The KB's parts the snapshot could not read (left out of every page until they change), and why."""
    return _snapshot(kb_root).damaged_now()  # a fresh snapshot behind cached query results has read nothing yet
