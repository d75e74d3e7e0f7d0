"""The Trials page shows a PBT trial's segments (scheduler=pbt), read through the app's snapshot of the KB."""

from __future__ import annotations

import shutil
from pathlib import Path

from app_support import kb_with_run, open_page, texts

from ralph_ray.kb import KnowledgeBase, damaged_parts


def pbt_kb(root: Path, with_segments: bool = True) -> Path:
    """A KB with two trials of one cycle: `t1` took `t2`'s weights at epoch 2 (an exploit step), `t2` did not."""
    kb_root = kb_with_run(root, "finished", stop_reason="max_cycles")
    kb = KnowledgeBase(kb_root)
    trial = {"run_id": "r1", "cycle": 1, "variant_id": "seed", "status": "completed", "epochs": 4}
    kb.append("trials", [trial | {"trial_id": "t1"}, trial | {"trial_id": "t2"}], "r1-t")
    if not with_segments:
        shutil.rmtree(kb.parquet / "segments", ignore_errors=True)  # a KB from before scheduler=pbt
        return kb_root
    segment = {"run_id": "r1", "cycle": 1, "variant_id": "seed"}
    kb.append(
        "segments",
        [
            segment | {"trial_id": "t1", "segment": 1, "from_epoch": 1, "to_epoch": 2, "knobs": '{"LR": 0.05}'},
            segment
            | {
                "trial_id": "t1",
                "segment": 2,
                "from_epoch": 3,
                "to_epoch": 4,
                "knobs": '{"LR": 0.06}',
                "donor_trial_id": "t2",
                "donor_epoch": 2,
            },
            segment | {"trial_id": "t2", "segment": 1, "from_epoch": 1, "to_epoch": 4, "knobs": '{"LR": 0.1}'},
        ],
        "r1-segments",
    )
    return kb_root


def test_trials_page_shows_a_pbt_trials_segments_and_its_donor(tmp_path: Path):
    at = open_page(pbt_kb(tmp_path), "views/trials.py", trials_pick="t1")
    assert len(at.dataframe) == 2  # the trials, then the picked trial's segments
    shown = at.dataframe[1].value
    assert list(shown["from_epoch"]) == [1, 3] and list(shown["to_epoch"]) == [2, 4]
    assert list(shown["donor_trial_id"].fillna("")) == ["", "t2"] and list(shown["knobs"])[1] == '{"LR": 0.06}'
    assert "2 segment(s), 1 exploit step(s)" in texts(at)

    at = open_page(pbt_kb(tmp_path / "again"), "views/trials.py", trials_pick="t2")
    assert list(at.dataframe[1].value["to_epoch"]) == [4]


def test_trials_page_without_segments_shows_none(tmp_path: Path):
    kb_root = pbt_kb(tmp_path, with_segments=False)
    assert not (kb_root / "parquet" / "segments").exists()
    at = open_page(kb_root, "views/trials.py", trials_pick="t1")
    assert len(at.dataframe) == 1 and "Segments" not in texts(at)  # the trials table alone


def test_a_damaged_segments_part_is_found(tmp_path: Path):
    kb_root = pbt_kb(tmp_path)
    part = next((kb_root / "parquet" / "segments").glob("r1-segments*.parquet"))
    part.write_bytes(part.read_bytes()[:20])  # truncated, as by a crash mid-write on a filesystem without rename
    assert part.resolve() in {p.resolve() for p in damaged_parts(kb_root / "parquet")}
