"""The app's snapshot across `KnowledgeBase.compact_kb`: the same rows before, during (replaced parts still on disk,
hidden by the `_kb-*` file that lists them) and after."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from ralph_ray import PROJECT_ROOT
from ralph_ray.kb import KnowledgeBase

sys.path.insert(0, str(PROJECT_ROOT / "app"))  # the app's modules, as `streamlit run` finds them
from snapshot import Snapshot  # noqa: E402

QUERY = "select run_id, trial_id, status from trials order by all"
EPOCHS = "select run_id, trial_id, epoch, metric, value from epochs order by all"


def finished_run(kb: KnowledgeBase, run_id: str) -> None:
    for cycle in (1, 2):
        tag = f"{run_id}-c{cycle}"
        trials = [{"run_id": run_id, "cycle": cycle, "trial_id": f"{tag}-{t}", "status": "completed"} for t in (0, 1)]
        kb.put("trials", trials, f"{tag}-trials")
        epochs = [{"run_id": run_id, "trial_id": r["trial_id"], "epoch": 1, "metric": "val_acc", "value": 0.5}
                  for r in trials]  # fmt: skip
        kb.put("epochs", epochs, f"{tag}-epochs")
    kb.put("runs", [{"run_id": run_id, "status": "finished"}], run_id)
    kb.compact_run(run_id)


def rows(snap: Snapshot, query: str) -> list[tuple]:
    return [tuple(row.values()) for row in snap.query(query, []).to_pylist()]


def test_snapshot_reads_each_row_once_across_a_compaction(tmp_path: Path, monkeypatch):
    kb = KnowledgeBase(tmp_path / "kb")
    kb.init()
    kb.compact_grace_s = 0.0
    for run in ("r1", "r2", "r3"):
        finished_run(kb, run)
    snap = Snapshot(kb.root, min_interval_s=0)
    before, before_epochs = rows(snap, QUERY), rows(snap, EPOCHS)
    assert len(before) == 12 and len(before_epochs) == 12

    def crash(self: Path, missing_ok: bool = False) -> None:
        raise KeyboardInterrupt  # stop between the commit and deleting the replaced parts

    monkeypatch.setattr(Path, "unlink", crash)
    with pytest.raises(KeyboardInterrupt):
        kb.compact_kb()
    monkeypatch.undo()
    assert (kb.parquet / "trials" / "r1-all.parquet").exists()  # still on disk, listed hidden by _m-000001
    assert rows(snap, QUERY) == before and rows(snap, EPOCHS) == before_epochs
    kb.compact_kb()  # deletes them
    assert rows(snap, QUERY) == before and rows(snap, EPOCHS) == before_epochs
    fresh = Snapshot(kb.root, min_interval_s=0)
    assert rows(fresh, QUERY) == before
