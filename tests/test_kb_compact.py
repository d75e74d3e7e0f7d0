"""KnowledgeBase.compact_kb: finished runs' parts merged into one sorted `_kb-<g>` file per table, committed by its
manifest `_m-<g>`, crash-safe, with readers never seeing a row twice or missing one (real Parquet, real DuckDB)."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ralph_ray import kb as kbmod
from ralph_ray import sql
from ralph_ray.kb import KnowledgeBase, open_reader

QUERIES = {
    "trials": "select run_id, trial_id, variant_id, status, selection_score from trials order by all",
    "epochs": "select run_id, trial_id, epoch, metric, value from epochs order by all",
    "runs": "select run_id, status from runs order by all",
    "variants": "select run_id, variant_id, status from variants order by all",
    "leaderboard": "select run_id, variant_id, selection_score, trials, rank from leaderboard order by all",
    "curves": "select run_id, trial_id, epoch, val_acc, val_loss from curves order by all",
    "budgets": "select run_id, cycles, trials, trial_hours from budgets order by all",
    "lineage": "select run_id, variant_id, depth from lineage order by all",  # a recursive CTE over variants
}


def write_run(kb: KnowledgeBase, run_id: str, trials: int = 3, cycles: int = 2, fold: bool = True) -> None:
    """A campaign as the engine leaves it: per-cycle parts, then (finished) folded by compact_run."""
    kb.put("runs", [{"run_id": run_id, "status": "running"}], run_id)
    for cycle in range(1, cycles + 1):
        tag = f"{run_id}-c{cycle:04d}"
        kb.put("variants", [{"run_id": run_id, "variant_id": f"v{cycle}", "cycle": cycle, "status": "kept"}], tag)
        rows = [
            {
                "run_id": run_id,
                "cycle": cycle,
                "trial_id": f"{run_id}-{cycle}-{t}",
                "variant_id": f"v{cycle}",
                "status": "completed",
                "selection_score": 0.5 + t / 100 + cycle / 10,
                "seconds": 2.0,
            }
            for t in range(trials)
        ]
        kb.put("trials", rows, f"{tag}-trials")
        epochs = [
            {"run_id": run_id, "trial_id": r["trial_id"], "epoch": e, "metric": m, "value": e / 10}
            for r in rows
            for e in (1, 2)
            for m in ("val_acc", "val_loss")
        ]
        kb.put("epochs", epochs, f"{tag}-epochs")
        kb.put("cycles", [{"run_id": run_id, "cycle": cycle, "trials": trials}], f"{tag}-cycle")
    if fold:
        kb.put("runs", [{"run_id": run_id, "status": "finished"}], run_id)
        kb.compact_run(run_id)


def snapshot(kb_root: Path) -> dict[str, list]:
    con = open_reader(kb_root)
    try:
        return {name: con.execute(query).fetchall() for name, query in QUERIES.items()}
    finally:
        con.close()


@pytest.fixture
def kb(tmp_path: Path) -> KnowledgeBase:
    store = KnowledgeBase(tmp_path / "kb")
    store.init()
    store.compact_grace_s = 0.0
    return store


def parts(kb: KnowledgeBase, table: str) -> list[str]:
    return sorted(p.name for p in (kb.parquet / table).iterdir() if not p.name.startswith("."))


def test_compact_kb_folds_finished_runs_into_one_sorted_file_and_reads_the_same(kb: KnowledgeBase):
    for run in ("r1", "r2", "r3"):
        write_run(kb, run)
    write_run(kb, "r4", fold=False)  # still running: its cycle parts stay as they are
    before = snapshot(kb.root)
    assert kb.compact_kb() == {t: 3 for t in ("runs", "cycles", "variants", "trials", "epochs")}
    assert parts(kb, "trials") == ["_kb-000001.parquet", "_m-000001.manifest", "_schema.parquet",
                                   "r4-c0001-trials.parquet", "r4-c0002-trials.parquet"]  # fmt: skip
    assert snapshot(kb.root) == before
    compacted = pq.read_table(kb.parquet / "epochs" / "_kb-000001.parquet")
    keys = list(zip(*(compacted.column(k).to_pylist() for k in kbmod.SORT_KEYS["epochs"])))
    assert keys == sorted(keys) and len(keys) == 3 * 2 * 3 * 4
    # the run finishes later: its parts fold, then into the next generation with the previous file
    kb.put("runs", [{"run_id": "r4", "status": "finished"}], "r4")
    kb.compact_run("r4")
    assert kb.compact_kb()["trials"] == 1
    assert parts(kb, "trials") == ["_kb-000002.parquet", "_m-000002.manifest", "_schema.parquet"]
    after = snapshot(kb.root)
    assert after["trials"] == before["trials"] and after["epochs"] == before["epochs"]
    assert ("r4", "finished") in after["runs"]
    assert kb.compact_kb() == {}  # nothing new: nothing rewritten
    assert parts(kb, "trials") == ["_kb-000002.parquet", "_m-000002.manifest", "_schema.parquet"]


def test_a_run_filter_reads_one_row_group_of_the_compacted_file(kb: KnowledgeBase, monkeypatch):
    monkeypatch.setattr(kbmod, "ROW_GROUP_ROWS", 12)  # one run's 12 epoch rows per row group
    for run in ("r1", "r2", "r3", "r4"):
        write_run(kb, run, trials=3, cycles=1)
    kb.compact_kb()
    assert pq.ParquetFile(kb.parquet / "epochs" / "_kb-000001.parquet").metadata.num_row_groups == 4
    con = open_reader(kb.root)
    plan = con.execute("explain analyze " + sql.CURVES_FOR_TRIAL, ["r3", "r3-1-0"]).fetchall()[0][1]
    scans = [(int(a), int(b)) for a, b in re.findall(r"Row Groups Scanned: (\d+) / (\d+)", plan)]
    assert scans and all(read <= 1 for read, _ in scans), scans  # r3's epochs only (min/max of run_id, trial_id)
    assert max(total for _, total in scans) >= 4, scans
    # the budgets view filters every table's scan by run, not after computing every run
    plan = con.execute("explain analyze " + sql.BUDGET_FOR_RUN, ["r2"]).fetchall()[0][1]
    scanned = re.findall(r"Row Groups Scanned: (\d+) / (\d+)", plan)
    assert scanned and all(int(read) <= 1 for read, _ in scanned), scanned
    assert con.execute(sql.BUDGET_FOR_RUN, ["r2"]).fetchone()[7:9] == (1, 3)


def test_a_crash_after_the_commit_leaves_each_row_once_and_the_next_call_cleans_up(kb: KnowledgeBase, monkeypatch):
    for run in ("r1", "r2"):
        write_run(kb, run)
    before = snapshot(kb.root)

    def crash(self: Path, missing_ok: bool = False) -> None:
        raise KeyboardInterrupt  # killed between the rename (commit) and deleting what it replaced

    monkeypatch.setattr(Path, "unlink", crash)
    with pytest.raises(KeyboardInterrupt):
        kb.compact_kb()
    monkeypatch.undo()
    assert "_kb-000001.parquet" in parts(kb, "trials") and "r1-all.parquet" in parts(kb, "trials")
    assert snapshot(kb.root) == before  # the replaced parts are still there, hidden: no row twice
    assert kb.compact_kb() == {}  # leftovers deleted first; nothing new to merge
    assert parts(kb, "trials") == ["_kb-000001.parquet", "_m-000001.manifest", "_schema.parquet"]
    assert snapshot(kb.root) == before


def test_a_crash_before_the_commit_changes_nothing(kb: KnowledgeBase, monkeypatch):
    for run in ("r1", "r2"):
        write_run(kb, run)
    before = snapshot(kb.root)
    real_replace = kbmod.os.replace

    def crash(src, dst):
        if Path(dst).name.startswith(kbmod.MANIFEST_PREFIX) and Path(dst).parent.name == "epochs":
            raise KeyboardInterrupt  # killed with epochs' merged file in place but its manifest not yet renamed
        real_replace(src, dst)

    monkeypatch.setattr(kbmod.os, "replace", crash)
    with pytest.raises(KeyboardInterrupt):
        kb.compact_kb()
    monkeypatch.undo()
    assert "_kb-000001.parquet" in parts(kb, "epochs") and "_m-000001.manifest" not in parts(kb, "epochs")
    assert "r1-all.parquet" in parts(kb, "epochs")  # and the parts it would replace
    assert snapshot(kb.root) == before  # the merged file counts only once a manifest lists it: no row twice
    kb.compact_kb()  # moves the uncommitted file aside (and deletes the other tables' leftovers), then merges
    assert parts(kb, "epochs") == ["_kb-000001.parquet", "_m-000001.manifest", "_schema.parquet"]
    assert snapshot(kb.root) == before


def test_a_resumed_run_never_reuses_a_folded_name(kb: KnowledgeBase):
    write_run(kb, "r1")
    write_run(kb, "r2")
    kb.compact_kb()
    # r1 resumed: one more cycle, folded again at its end; a leftover r1-all (hidden) must not hide the new rows
    hidden = kbmod.replaced_parts(kb.parquet / "trials")
    assert "r1-all.parquet" in hidden
    kb.put("trials", [{"run_id": "r1", "cycle": 3, "trial_id": "r1-3-0", "variant_id": "v3"}], "r1-c0003-trials")
    kb.compact_run("r1")
    assert "r1-all-r2.parquet" in parts(kb, "trials")
    con = open_reader(kb.root)
    assert con.execute("select count(*) from trials where run_id = 'r1'").fetchone() == (7,)
    kb.compact_kb()
    assert open_reader(kb.root).execute("select count(*) from trials where run_id = 'r1'").fetchone() == (7,)


def test_kb_compact_command(kb: KnowledgeBase, tmp_path: Path):
    write_run(kb, "r1")
    cmd = [sys.executable, "-m", "ralph_ray", "kb", "compact", "--kb", str(kb.root)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "merged" in out.stdout and "_kb-000001.parquet" in parts(kb, "epochs")
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and "nothing to compact" in again.stdout
    missing = subprocess.run([*cmd[:-1], str(tmp_path / "none")], capture_output=True, text=True, timeout=120)
    assert missing.returncode != 0 and "no knowledge base" in missing.stdout


def test_readers_in_other_processes_see_every_row_once_while_compactions_run(kb: KnowledgeBase, monkeypatch):
    """Readers count rows in a tight loop (each query lists the files anew) while six compactions commit and
    delete: every count is the whole KB's, never doubled, never short. A query that listed a part just before
    it was deleted fails (an IO error naming the file, to retry), as beside compact_run and compact."""
    kb.compact_grace_s = 3.0  # as in use (5 s), on a 2-core machine shared with the readers
    runs = [f"r{i:02d}" for i in range(12)]
    for run in runs:
        write_run(kb, run)
    expected = snapshot(kb.root)
    totals = (len(expected["epochs"]), len(expected["trials"]), len(expected["runs"]))
    script = textwrap.dedent(
        f"""
        import sys, time
        from pathlib import Path
        import duckdb
        from ralph_ray.kb import open_reader
        seen, queries, vanished = set(), 0, 0
        while True:
            try:
                con = open_reader(Path({str(kb.root)!r}))
                break
            except duckdb.IOException:  # a part deleted between listing and reading: open again
                vanished += 1
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not Path({str(kb.root / "STOP")!r}).exists():
            try:
                seen.add(con.execute("select (select count(*) from epochs), (select count(*) from trials), "
                                     "(select count(*) from runs)").fetchone())
                queries += 1
            except duckdb.IOException as err:  # a part deleted between this query's listing and its read
                assert "No such file" in str(err), err
                vanished += 1
        print(queries, vanished, sorted(seen))
        """
    )
    readers = [
        subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    try:
        # Each call folds two more finished runs with the previous file. The runs were folded (compact_run) before
        # the readers started, as compact_run may briefly show a row twice (the views absorb it, a raw count not);
        # narrowing FOLDED_PART is the one way to have six compact_kb commits over the same rows
        for k in range(2, len(runs) + 1, 2):
            monkeypatch.setattr(kbmod, "FOLDED_PART", re.compile(rf"^({'|'.join(runs[:k])})-all\.parquet$"))
            assert kb.compact_kb()["epochs"] == 2
    finally:
        (kb.root / "STOP").write_text("")
        outputs = [reader.communicate(timeout=120) for reader in readers]
    assert parts(kb, "epochs") == ["_kb-000006.parquet", "_m-000006.manifest", "_schema.parquet"]
    assert snapshot(kb.root) == expected
    for out, err in outputs:
        assert out.strip(), err[-2000:]
        queries, vanished, seen = out.split(" ", 2)
        assert int(queries) > 20 and int(vanished) < int(queries) / 10, out  # they ran across the compactions
        assert eval(seen) == [totals], err[-2000:]  # noqa: S307 - our own subprocess's repr of int tuples


def test_a_kb_from_before_final_added_compacts_with_its_finals_additions_read_into_it(kb: KnowledgeBase):
    """Parts written with the three columns `final_added` replaced (final_schedule, final_augment, final_deepen) fold
    into today's schema, their additions named in `final_added` as the trials view reads them, by every compaction."""
    legacy = kbmod.SCHEMAS["trials"].remove(kbmod.SCHEMAS["trials"].get_field_index("final_added"))
    legacy = pa.schema([*legacy, ("final_schedule", pa.string()), ("final_augment", pa.string())])
    legacy = legacy.append(pa.field("final_deepen", pa.bool_()))
    base = {"run_id": "r1", "cycle": 1, "variant_id": "v1", "status": "completed", "seconds": 2.0, "final": True}
    old = [
        {**base, "trial_id": "a", "final_schedule": "cosine", "final_augment": "shift + flip", "final_deepen": True},
        {**base, "trial_id": "b", "final_deepen": True},
        {**base, "trial_id": "c", "final": False},
    ]
    folder = kb.parquet / "trials"
    pq.write_table(pa.Table.from_pylist(old, schema=legacy), folder / "r1-c0001-old.parquet")
    kb.append("trials", [{**base, "trial_id": "d", "final_added": "cosine + flip_tta"}], "r1-c0002")
    expected = [("a", "cosine + shift + flip + deepen"), ("b", "deepen"), ("c", None), ("d", "cosine + flip_tta")]

    def read() -> list[tuple]:
        con = open_reader(kb.root)
        try:
            return con.execute("select trial_id, final_added from trials order by trial_id").fetchall()
        finally:
            con.close()

    assert read() == expected  # the view, before any compaction
    assert kb.compact("trials", "r1-c", "r1-cycles") == 2  # a cycle's parts
    assert read() == expected
    pq.write_table(pa.Table.from_pylist([{**old[1], "trial_id": "e"}], schema=legacy), folder / "r1-c0003-old.parquet")
    kb.put("runs", [{"run_id": "r1", "status": "finished"}], "r1")
    assert kb.compact_run("r1") >= 2  # a finished run's
    assert read() == [*expected, ("e", "deepen")]
    assert kb.compact_kb()["trials"] == 1  # the KB's sorted file
    assert read() == [*expected, ("e", "deepen")]
    (written,) = folder.glob("_kb-*.parquet")
    assert pq.read_schema(written).names == kbmod.SCHEMAS["trials"].names  # today's columns, the old three gone
