"""`python -m ralph_ray kb check [--repair] [--kb DIR]`: list the knowledge base's damaged Parquet parts, and with
--repair move them aside to `<kb>/damaged/<table>/` (nothing is deleted). Readers already skip a damaged part with a
warning naming it, whose rows are missing and this repair (`kb.open_reader`, a campaign's `KnowledgeBase.reader`);
this names them all at once and makes the warnings stop.

`python -m ralph_ray kb compact [--kb DIR]`: merge every finished campaign's parts into one sorted file per table
(`KnowledgeBase.compact_kb`), safe beside running campaigns and open readers.

`python -m ralph_ray kb sql "QUERY" [--csv] [--kb DIR]`: one query over the KB's views (`kb.open_reader`: no lock, no
DuckDB shell needed), printed as a table, or as CSV with --csv."""

from __future__ import annotations

import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import duckdb
from rich.console import Console
from rich.markup import escape

from ralph_ray.exit_codes import ExitCode
from ralph_ray.kb import DAMAGED_DIR, PARQUET_DIR, KnowledgeBase, damaged_parts, open_reader, repair_command


@dataclass(frozen=True)
class Damaged:
    """One unreadable part: where it was, why, and where --repair moved it (None: left in place)."""

    path: Path
    why: str
    moved_to: Path | None = None


def check(kb_root: Path, repair: bool = False) -> list[Damaged]:
    """Every damaged part of the KB at `kb_root`; with `repair`, each moved under `<kb>/damaged/<table>/`."""
    parquet = kb_root.resolve() / PARQUET_DIR
    if not parquet.is_dir():
        raise FileNotFoundError(f"no knowledge base at {kb_root}: pass --kb DIR (where paths.kb points)")
    found = []
    for path, why in damaged_parts(parquet).items():
        moved = None
        if repair:
            moved = kb_root.resolve() / DAMAGED_DIR / path.parent.name / path.name
            moved.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(path, moved)
        found.append(Damaged(path, why, moved))
    return found


def main(args: list[str], kb: Path, console: Console) -> int:
    """`kb check [--repair]`: 0 when the KB is whole (or was repaired), 2 when damaged parts remain.

    `kb compact`: 0 once the finished campaigns' parts are merged (or there were none)."""
    if args == ["compact"]:
        return compact(kb, console)
    if args[:1] == ["sql"] and len([a for a in args if a != "--csv"]) == 2:
        return query(kb, next(a for a in args[1:] if a != "--csv"), "--csv" in args, console)
    if args[:1] != ["check"] or any(a not in ("check", "--repair") for a in args):
        console.print(
            "[red]error:[/] usage: python -m ralph_ray kb check [--repair] [--kb DIR] | kb compact [--kb DIR] | "
            'kb sql "QUERY" [--csv] [--kb DIR]',
            highlight=False,
        )
        return ExitCode.safeguard_or_config
    repair = "--repair" in args
    try:
        found = check(kb, repair)
    except FileNotFoundError as err:
        console.print(f"[red]error:[/] {err}", markup=False, highlight=False)
        return ExitCode.safeguard_or_config
    if not found:
        console.print(f"{kb}: every part reads")
        return ExitCode.ok
    for part in found:
        where = f" -> moved to {part.moved_to}" if part.moved_to else ""
        console.print(f"damaged: {part.path} ({part.why}){where}", markup=False, highlight=False)
    if repair:
        console.print(f"{len(found)} damaged part(s) moved aside; the KB's views read the rest")
        return ExitCode.ok
    console.print(f"{len(found)} damaged part(s); move them aside with: {repair_command(kb)}")
    return ExitCode.safeguard_or_config


def query(kb: Path, statement: str, csv: bool, console: Console) -> int:
    """`kb sql`: run one query over the KB's views and print its rows (a table, or CSV on stdout); 2 on an error."""
    try:
        con = open_reader(kb)
    except FileNotFoundError as err:
        console.print(f"[red]error:[/] {escape(str(err))} (pass --kb DIR)", highlight=False)
        return ExitCode.safeguard_or_config
    try:
        relation = con.sql(statement)
        if relation is None:  # a statement that returns nothing (the reader's views are in memory: nothing persists)
            return ExitCode.ok
        if csv:
            relation.to_df().to_csv(sys.stdout, index=False)
        else:
            relation.show(max_rows=10_000, max_width=10_000)
    except duckdb.Error as err:
        console.print(f"[red]error:[/] {escape(str(err))}", highlight=False)
        console.print("the views: " + ", ".join(sorted(r[0] for r in con.sql("show tables").fetchall())))
        return ExitCode.safeguard_or_config
    return ExitCode.ok


def compact(kb: Path, console: Console) -> int:
    """`kb compact`: fold every finished campaign's parts (`<run_id>-all`) into the KB's one sorted file per table."""
    if not (kb.resolve() / PARQUET_DIR / "trials" / "_schema.parquet").exists():
        console.print(
            f"[red]error:[/] no knowledge base at {kb}: pass --kb DIR (where paths.kb points)", highlight=False
        )
        return ExitCode.safeguard_or_config
    merged = KnowledgeBase(kb).compact_kb()
    if not merged:
        console.print(f"{kb}: nothing to compact (no finished campaign's parts outside the compacted files)")
        return ExitCode.ok
    folded = ", ".join(f"{table} {n}" for table, n in merged.items())
    console.print(f"{kb}: merged finished campaigns' parts into one sorted file per table ({folded} parts)")
    return ExitCode.ok
