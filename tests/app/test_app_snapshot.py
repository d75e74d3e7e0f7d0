"""The app's snapshot of a KB: the same rows as the KB's own views, kept current part by part."""

from __future__ import annotations

import sys
from pathlib import Path

from ralph_ray import PROJECT_ROOT, sql
from ralph_ray.kb import KnowledgeBase

sys.path.insert(0, str(PROJECT_ROOT / "app"))  # the app's modules, as `streamlit run` finds them
from snapshot import MAX_DELTAS, Snapshot  # noqa: E402


def trial(trial_id: str, score: float | None, status: str = "completed") -> dict:
    return {
        "run_id": "r1",
        "cycle": 1,
        "trial_id": trial_id,
        "variant_id": "v1",
        "status": status,
        "selection_score": score,
        "test_score": score,
        "seconds": 1.0,
        "epochs": 2,
    }


def snap_rows(snap: Snapshot, query: str, params: list) -> list[tuple]:
    return [tuple(row.values()) for row in snap.query(query, params).to_pylist()]


def kb_rows(kb: KnowledgeBase, query: str, params: list) -> list[tuple]:
    return kb.reader().execute(query, params).fetchall()


def test_snapshot_answers_like_the_kb_and_takes_in_new_and_replaced_parts(tmp_path: Path):
    kb = KnowledgeBase(tmp_path / "kb")
    kb.init()
    snap = Snapshot(kb.root, min_interval_s=0)
    assert snap_rows(snap, sql.APP_LEADERBOARD, ["r1"]) == []
    kb.append("trials", [trial("a", 0.9), trial("b", None, "stopped_early")], "r1-a")
    kb.put("variants", [{"run_id": "r1", "variant_id": "v1", "status": "candidate", "cycle": 1}], "r1-c1")
    kb.put("interventions", [{"run_id": "r1", "task": "digits", "intervention": "lower_lr", "delta": 0.01}], "r1-c1")
    board = snap_rows(snap, sql.APP_LEADERBOARD, ["r1"])
    assert board == kb_rows(kb, sql.APP_LEADERBOARD, ["r1"]) and board[0][4] == "candidate"

    # `put` replaces a part whole (a resumed cycle re-records): the snapshot drops the old rows, keeps no duplicate.
    kb.put("interventions", [{"run_id": "r1", "task": "digits", "intervention": "lower_lr", "delta": 0.03}], "r1-c1")
    kb.put("variants", [{"run_id": "r1", "variant_id": "v1", "status": "kept", "cycle": 1}], "r1-c1")
    kb.append("trials", [trial("c", 0.95)], "r1-c")
    assert snap_rows(snap, sql.APP_EFFECTS, []) == kb_rows(kb, sql.APP_EFFECTS, [])
    assert snap_rows(snap, "select count(*), max(delta) from interventions", []) == [(1, 0.03)]
    board = snap_rows(snap, sql.APP_LEADERBOARD, ["r1"])
    assert board == kb_rows(kb, sql.APP_LEADERBOARD, ["r1"]) and board[0][4] == "kept" and board[0][6] == 0.95


def test_snapshot_reads_each_part_once_and_keeps_few_files(tmp_path: Path):
    kb = KnowledgeBase(tmp_path / "kb")
    kb.init()
    for i in range(5):
        kb.append("trials", [trial(f"t{i}", 0.5 + i / 100)], f"r1-t{i}")
    snap = Snapshot(kb.root, min_interval_s=0)
    assert snap_rows(snap, "select count(*) from trials", []) == [(5,)]
    assert len(list(snap.folder.rglob("*.parquet"))) == len(sql.ALL_TABLES)  # one file per table, whatever the parts
    read_before = dict(snap._seen["trials"])
    kb.append("trials", [trial("t9", 0.99)], "r1-t9")
    assert snap_rows(snap, "select count(*) from trials", []) == [(6,)]
    assert set(snap._seen["trials"]) - set(read_before) == {
        p.name for p in (kb.parquet / "trials").glob("r1-t9-*.parquet")
    }
    for i in range(MAX_DELTAS + 2):  # a live campaign: a part per refresh; the deltas are folded back into one file
        kb.append("trials", [trial(f"u{i}", 0.6)], f"r1-u{i}")
        assert snap_rows(snap, "select count(*) from trials", []) == [(7 + i,)]
    assert len(list((snap.folder / "trials").glob("*.parquet"))) <= MAX_DELTAS + 1
    assert snap_rows(snap, sql.APP_LEADERBOARD, ["r1"]) == kb_rows(kb, sql.APP_LEADERBOARD, ["r1"])


def test_a_fresh_snapshot_reports_a_damaged_part_before_any_query(tmp_path: Path):
    """Investigation: `damaged` was filled only by a query's refresh, so a Snapshot made anew while the pages' query
    results were still cached (Streamlit's 2-s cache_data outlives an evicted cache_resource) reported no damaged
    part and the page showed no warning; `damaged_now` takes in the parts first."""
    kb = KnowledgeBase(tmp_path / "kb")
    kb.init()
    kb.append("trials", [trial("t1", 0.9)], "r1-t")
    bad = next((kb.parquet / "trials").glob("r1-t*.parquet"))
    bad.write_bytes(bad.read_bytes()[:100])
    snap = Snapshot(tmp_path / "kb")
    assert set(snap.damaged_now()) == {bad}
