"""What the app and `status` show when things go wrong: a damaged KB part, a missing kb.duckdb, a dead driver."""

from __future__ import annotations

import io
import shutil
import warnings
from datetime import timedelta
from pathlib import Path

import pytest
from app_support import PAGES, Tiny, kb_with_run, open_page, texts, tiny_fixture  # noqa: F401 (the `tiny` fixture)
from rich.console import Console

from ralph_ray import commands
from ralph_ray.kb import DB_FILE, DamagedPartWarning, KnowledgeBase, now, open_reader


def two_campaigns(tmp_path: Path) -> tuple[Path, Path]:
    """A KB with campaigns r1 (intact) and r2; returns the root and r2's trials part."""
    root = kb_with_run(tmp_path, "finished", stop_reason="max_cycles")
    kb = KnowledgeBase(root)
    kb.append(
        "runs",
        [
            {
                "run_id": "r2",
                "experiment": "digits",
                "task": "digits",
                "status": "finished",
                "started_at": now() - timedelta(hours=1),
                "config": "{}",
            }
        ],
        "r2",
    )
    kb.append(
        "trials",
        [
            {
                "run_id": "r1",
                "cycle": 1,
                "trial_id": "t1",
                "variant_id": "v1",
                "status": "completed",
                "selection_score": 0.91,
                "seconds": 1.0,
                "epochs": 2,
                "knobs": '{"LR": 0.1}',
            }
        ],
        "r1-t",
    )
    bad = kb.append(
        "trials",
        [
            {
                "run_id": "r2",
                "cycle": 1,
                "trial_id": "t1",
                "variant_id": "w1",
                "status": "completed",
                "selection_score": 0.5,
                "seconds": 1.0,
                "epochs": 2,
            }
        ],
        "r2-t",
    )
    assert bad is not None
    return root, bad


def truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


@pytest.mark.parametrize("page", PAGES)
def test_every_page_renders_the_intact_campaigns_past_a_truncated_part(tmp_path: Path, page: str):
    root, bad = two_campaigns(tmp_path)
    truncate(bad)
    (root / DB_FILE).unlink()  # readers never need the shell's file
    at = open_page(root, page, run_id="r1")
    shown = texts(at)
    assert f"Skipped a damaged part of the knowledge base: `{bad}`" in shown
    assert "Traceback" not in shown and "InvalidInput" not in shown
    if page == "views/board.py":
        assert list(at.dataframe[0].value["variant_id"]) == ["v1"]


def test_the_reader_skips_a_damaged_part_with_a_warning_naming_it(tmp_path: Path):
    root, bad = two_campaigns(tmp_path)
    truncate(bad)
    with pytest.warns(DamagedPartWarning, match=bad.name):
        con = open_reader(root)
    assert con.execute("select run_id, variant_id from leaderboard").fetchall() == [("r1", "v1")]


def test_kb_check_names_damaged_parts_and_repair_moves_them_aside(tmp_path: Path):
    root, bad = two_campaigns(tmp_path)
    truncate(bad)
    broken = bad.read_bytes()

    def kb_check(*flags: str) -> tuple[int, str]:
        out = io.StringIO()
        return commands.main(["kb", "check", *flags, "--kb", str(root)], Console(file=out, width=400)), out.getvalue()

    code, said = kb_check()
    assert code == 2 and str(bad) in said and "--repair" in said and bad.exists()  # a check alone moves nothing
    code, said = kb_check("--repair")
    moved = root / "damaged" / bad.parent.name / bad.name
    assert code == 0 and not bad.exists() and moved.read_bytes() == broken  # aside, not deleted
    with warnings.catch_warnings():
        warnings.simplefilter("error", DamagedPartWarning)  # no part left to warn about
        assert open_reader(root).execute("select run_id, variant_id from leaderboard").fetchall() == [("r1", "v1")]
    assert kb_check() == (0, f"{root}: every part reads\n")


def test_status_command_survives_a_damaged_part(tiny: Tiny, tmp_path: Path):
    kb_root = Path(shutil.copytree(tiny.kb_root, tmp_path / "kb"))
    runs = tmp_path / "runs"
    shutil.copytree(tiny.run_dir, runs / tiny.run_id)
    part = min((kb_root / "parquet" / "decisions").glob("[!_]*.parquet"))
    truncate(part)
    (kb_root / DB_FILE).unlink()
    out = io.StringIO()
    with pytest.warns(DamagedPartWarning, match=part.name):
        code = commands.main(
            ["status", tiny.run_id, "--runs", str(runs), "--kb", str(kb_root)], Console(file=out, width=200)
        )
    assert code == 0
    assert "leaderboard" in out.getvalue()


def test_a_running_campaign_that_stopped_writing_is_shown_stale_without_stop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    stale_at = now() - timedelta(minutes=30)
    root = kb_with_run(tmp_path, "running", written_at=stale_at, started_at=stale_at)
    at = open_page(root, "views/status.py")
    assert "stopped unexpectedly" in texts(at) and "resume=r1" in texts(at)
    assert {m.label: m.value for m in at.metric}["status"] == "stale"
    assert not at.button  # nobody left to stop


def test_a_running_campaign_that_writes_is_live_with_stop(tmp_path: Path):
    at = open_page(kb_with_run(tmp_path, "running"), "views/status.py")
    assert "stopped unexpectedly" not in texts(at)
    assert at.button(key="stop")


def test_status_best_is_the_leaderboards_best_mid_cycle(tmp_path: Path):
    # A trial scored after the last decision: the Status page shows it as the Leaderboard does.
    root = kb_with_run(tmp_path, "running", cycle=2, phase="train")
    kb = KnowledgeBase(root)
    kb.append(
        "decisions",
        [{"run_id": "r1", "cycle": 1, "decision": "continue", "best_selection_score": 0.9610, "elapsed_s": 5.0}],
        "r1-d1",
    )
    kb.append(
        "trials",
        [
            {
                "run_id": "r1",
                "cycle": c,
                "trial_id": f"t{c}",
                "variant_id": f"v{c}",
                "status": "completed",
                "selection_score": s,
                "seconds": 1.0,
                "epochs": 2,
            }
            for c, s in ((1, 0.9610), (2, 0.9889))
        ],
        "r1-t",
    )
    status = {m.label: m.value for m in open_page(root, "views/status.py").metric}
    board = {m.label: m.value for m in open_page(root).metric}
    assert status["best selection score"] == board["best selection score"] == "0.9889"
    assert "Pick (rank 1): **v2**, by its best trial (not replicated" in texts(open_page(root, "views/status.py"))


def test_a_quiet_campaign_whose_trials_may_take_longer_is_not_stale(tmp_path: Path):
    # 30 minutes without a row is normal where one trial may run for an hour (its row lands when it ends).
    quiet_since = now() - timedelta(minutes=30)
    config = '{"safeguards": {"max_cycles": 3, "trial_timeout_s": 3600}}'
    root = kb_with_run(tmp_path, "running", written_at=quiet_since, started_at=quiet_since, config=config)
    at = open_page(root, "views/status.py")
    assert "stopped unexpectedly" not in texts(at) and at.button(key="stop")
