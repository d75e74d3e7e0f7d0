"""What the app and `status` show when things go wrong: a damaged KB part, a missing kb.duckdb, a dead driver."""

from __future__ import annotations

import io
import shutil
import warnings
from datetime import timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import streamlit as st
from app_support import PAGES, Tiny, kb_with_run, open_page, texts, tiny_fixture  # noqa: F401 (the `tiny` fixture)
from rich.console import Console

from ralph_ray import commands
from ralph_ray.kb import DB_FILE, SCHEMAS, DamagedPartWarning, KnowledgeBase, now, open_reader


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


# A page's empty state, and what it blames when its rows are missing (user trial: "Run a campaign with an agent")
EMPTY_BLAMES = {
    "views/interventions.py": "Run a campaign with an agent",
    "views/board.py": "before any trial finished",
    "views/lineage.py": "before any trial finished",
    "views/status.py": "the first one comes at the end of cycle 1",
}


@pytest.mark.parametrize("page", sorted(EMPTY_BLAMES))
def test_an_empty_page_past_a_damaged_part_says_its_rows_may_be_in_it(tmp_path: Path, page: str):
    """User trial: with the campaign's interventions part damaged, the Interventions page warned of the part, then
    said under it that no intervention was measured yet and to run a campaign with an agent; they were measured, and
    in that part. A page left empty by a skipped part says so and names the repair."""
    root = kb_with_run(tmp_path, "finished", stop_reason="max_cycles")
    kb = KnowledgeBase(root)
    variants = [{"run_id": "r1", "variant_id": "kid", "parent_id": "seedv", "cycle": 2, "status": "kept"}]
    trials = [{"run_id": "r1", "cycle": 2, "trial_id": "t1", "variant_id": "kid", "status": "completed"}]
    effect = {"run_id": "r1", "task": "digits", "cycle": 2, "variant_id": "kid", "parent_id": "seedv"}
    effect |= {
        "intervention": "batchnorm",
        "parent_score": 0.9,
        "child_score": 0.95,
        "delta": 0.05,
        "basis": "best_trial",
    }
    decision = {"run_id": "r1", "cycle": 1, "decision": "stop", "reason": "max_cycles", "exit_code": 0}
    parts = [
        kb.append("variants", variants, "r1-v"),
        kb.append("trials", trials, "r1-t"),
        kb.append("interventions", [effect], "r1-i"),
        kb.append("decisions", [decision], "r1-d"),
    ]
    for part in parts:
        assert part is not None
        truncate(part)
    shown = texts(open_page(root, page, run_id="r1"))
    assert EMPTY_BLAMES[page] not in shown
    if page in ("views/board.py", "views/lineage.py"):  # its status is still said (review: it was dropped)
        assert "campaign `r1` ended (max_cycles) with none of its trials in the readable parts" in shown, shown
    assert "may be in the damaged part" in shown
    assert f"python -m ralph_ray kb check --repair --kb {root}" in shown


def _finished_run(kb: KnowledgeBase, run_id: str) -> None:
    """A finished campaign `run_id` with one trial and one decision, each in a part of its own."""
    kb.append(
        "runs",
        [{"run_id": run_id, "experiment": "digits", "task": "digits", "status": "finished", "config": "{}"}],
        run_id,
    )
    kb.put(
        "trials",
        [{"run_id": run_id, "cycle": 1, "trial_id": "t1", "variant_id": "w1", "status": "completed"}],
        f"{run_id}-c0001-trials",
    )
    kb.put("decisions", [{"run_id": run_id, "cycle": 1, "decision": "stop", "exit_code": 0}], f"{run_id}-c0001-d")


def _in_order(at, first: str, then: str) -> bool:
    """Whether an element showing `first` comes before one showing `then` on the page."""
    shown = [str(getattr(node, "value", "")) for node in at.main]
    at_first = [i for i, text in enumerate(shown) if first in text]
    at_then = [i for i, text in enumerate(shown) if then in text]
    return bool(at_first and at_then) and at_first[0] < at_then[0]


NO_TRIAL_PAGES = ("views/board.py", "views/lineage.py", "views/curves.py", "views/trials.py", "views/status.py")
RUNNING_R1 = "yet: campaign `r1` is running (cycle 1, phase train)"


@pytest.mark.parametrize("page", NO_TRIAL_PAGES)
def test_another_runs_damaged_part_leaves_a_running_campaigns_empty_state_as_it_is(tmp_path: Path, page: str):
    """Review: another campaign's truncated `trials/other-all.parquet` made the empty pages of a campaign running with
    no trial yet say "Nothing to show here ... may be in the damaged part(s)" instead of its status: the damaged parts
    counted are the viewed campaign's own."""
    root = kb_with_run(tmp_path, "running")
    kb = KnowledgeBase(root)
    _finished_run(kb, "other")
    assert kb.compact_run("other")
    bad = [kb.parquet / table / "other-all.parquet" for table in ("trials", "decisions")]
    for part in bad:
        truncate(part)
    shown = texts(open_page(root, page, run_id="r1"))
    assert "may be in the damaged part" not in shown, shown
    assert all(f"Skipped a damaged part of the knowledge base: `{part}`" in shown for part in bad)  # still named
    assert (RUNNING_R1 if page != "views/status.py" else "No decision yet") in shown, shown


def test_a_damaged_compacted_file_counts_for_the_runs_its_manifest_records(tmp_path: Path):
    """A damaged `_kb-*` file is the viewed campaign's own where its manifest records the campaign's rows in it (the
    note after the page's status); where the manifest records none (written before it did), any campaign's."""

    def damaged_kb(folder: Path, recorded: bool) -> Path:
        root = kb_with_run(folder, "running")
        kb = KnowledgeBase(root)
        _finished_run(kb, "other")
        kb.compact_run("other")
        kb.compact_kb()
        if not recorded:  # a manifest from before the record (written before any page opened the KB)
            manifest = kb.parquet / "trials" / "_m-000001.manifest"
            pq.write_table(pq.read_table(manifest).drop_columns(["run_ids"]), manifest)
        truncate(kb.parquet / "trials" / "_kb-000001.parquet")
        return root

    root = damaged_kb(tmp_path / "recorded", recorded=True)
    running = open_page(root, "views/board.py", run_id="r1")
    assert f"No finished trial {RUNNING_R1}" in texts(running) and "may be in the damaged part" not in texts(running)
    other = open_page(root, "views/board.py", run_id="other")
    assert "No finished trial: campaign `other` ended" in texts(other), texts(other)
    assert _in_order(other, "No finished trial: campaign `other` ended", "may be in the damaged part")
    assert "_kb-000001.parquet" in texts(other) and "before any trial finished" not in texts(other)
    # A manifest from before the record: whose rows the file holds is unknown, so every campaign's page says so
    root = damaged_kb(tmp_path / "unrecorded", recorded=False)
    running = open_page(root, "views/board.py", run_id="r1")
    assert _in_order(running, f"No finished trial {RUNNING_R1}", "may be in the damaged part"), texts(running)


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


def test_a_running_campaign_whose_driver_died_is_stale_though_it_just_wrote(tmp_path: Path):
    # Its state.json records its driver's process; the app beside it reads the process table (liveness.driver_alive).
    import subprocess
    import sys

    from ralph_ray import liveness
    from ralph_ray.state import CampaignState

    process = subprocess.Popen([sys.executable, "-c", "pass"])
    driver = {**liveness.this_driver(), "pid": process.pid, "started": liveness._start_ticks(process.pid) or "0"}
    process.wait()
    root = kb_with_run(tmp_path, "running")
    CampaignState("r1", driver=driver).save(tmp_path / "runs" / "r1")
    at = open_page(root, "views/status.py")
    assert f"its driver (PID {process.pid} on {driver['host']}) is no longer running" in texts(at)
    assert {m.label: m.value for m in at.metric}["status"] == "stale" and not at.button


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


def test_the_status_page_shows_the_picks_final_training_and_waits_for_it(tmp_path: Path):
    # A campaign in its final training writes nothing for up to its share of the clock: not stale. Once the final
    # trial's row lands, the page shows its scores under the pick.
    quiet_since = now() - timedelta(minutes=7)
    config = '{"safeguards": {"max_cycles": 3, "campaign_time_s": 1800, "final_share": 0.25}, "trial": {"grace_s": 60}}'
    root = kb_with_run(tmp_path, "running", written_at=quiet_since, started_at=quiet_since, config=config)
    kb = KnowledgeBase(root)
    search = {"run_id": "r1", "cycle": 1, "variant_id": "v1", "status": "completed", "seconds": 1.0, "epochs": 2}
    kb.append("trials", [{**search, "trial_id": "t1", "selection_score": 0.90, "written_at": quiet_since}], "r1-t1")
    at = open_page(root, "views/status.py")
    assert "stopped unexpectedly" not in texts(at) and "Final training" not in texts(at)

    final = {**search, "trial_id": "t2", "selection_score": 0.93, "test_score": 0.925, "final": True, "epochs": 20}
    kb.append("trials", [final], "r1-t2")
    st.cache_data.clear()  # what the cache TTL and the snapshot's refresh interval do before the next redraw
    st.cache_resource.clear()
    shown = texts(open_page(root, "views/status.py"))
    assert "Final training of the pick (its best knobs, trained longer after the search): selection 0.9300" in shown
    assert "test **0.9250**" in shown
    assert "Pick (rank 1): **v1**, by its best trial" in shown  # the final trial does not rank: v1's best is 0.90
    board = open_reader(root).execute("select selection_score, final_test_score from leaderboard").fetchall()
    assert board == [(0.90, 0.925)]

    # Two candidates (safeguards.final_candidates=2): the long run with the best selection score is named, whatever
    # its rank in the search.
    kb.append("trials", [{**search, "variant_id": "v2", "trial_id": "t3", "selection_score": 0.89}], "r1-t3")
    runner_up = {**final, "variant_id": "v2", "trial_id": "t4", "selection_score": 0.94, "test_score": 0.931}
    kb.append("trials", [runner_up], "r1-t4")
    st.cache_data.clear()
    st.cache_resource.clear()
    shown = texts(open_page(root, "views/status.py"))
    assert "Final training of 2 candidates" in shown and "won by **v2** (rank 2 in the search)" in shown
    assert "selection 0.9400, test **0.9310**" in shown
    assert "Final training of the pick" not in shown


def test_a_min_metrics_scores_are_shown_as_its_values_on_every_page(tmp_path: Path):
    # lm-like: bits per byte, lower is better; the KB stores -value (oriented), the pages show the value and rank by
    # it (3.05 beats 3.20), and a target of 3.1 is met by 0.05 ("-0.0500": below it).
    config = (
        '{"task": {"metric": "bits_per_byte", "direction": "min"}, "target": {"selection_score": 3.1}, '
        '"safeguards": {"max_cycles": 3}}'
    )
    root = kb_with_run(tmp_path, "finished", config=config)
    kb = KnowledgeBase(root)
    kb.append(
        "variants",
        [
            {"run_id": "r1", "variant_id": "seedv", "cycle": 1, "status": "seed"},
            {"run_id": "r1", "variant_id": "kid", "parent_id": "seedv", "cycle": 2, "status": "kept"},
        ],
        "r1-v",
    )
    base = {"run_id": "r1", "status": "completed", "seconds": 1.0, "epochs": 2, "knobs": '{"LR": 0.1}'}
    kb.append(
        "trials",
        [
            {**base, "cycle": 1, "trial_id": "t1", "variant_id": "seedv", "selection_score": -3.2, "test_score": -3.25},
            {**base, "cycle": 2, "trial_id": "t2", "variant_id": "kid", "selection_score": -3.05, "test_score": -3.07},
            {**base, "cycle": 2, "trial_id": "t3", "variant_id": "kid", "selection_score": -3.15, "test_score": -3.16},
        ],
        "r1-t",
    )
    board = open_page(root)
    metrics = {m.label: (m.value, m.delta) for m in board.metric}
    assert metrics["best selection score"] == ("3.0500", "-0.0500 vs target")
    assert metrics["its test score"][0] == "3.0700" and metrics["target"][0] == "3.1000"
    shown = board.dataframe[0].value
    assert list(shown["variant_id"]) == ["kid", "seedv"]  # ranked by the stored score: the lower value first
    assert list(shown["selection_score"]) == [3.05, 3.2] and list(shown["test_score"]) == [3.07, 3.25]
    assert "bits_per_byte, lower is better" in texts(board)
    # The filter is a ceiling in the metric's units
    ceiling = open_page(root, board_min=3.1).dataframe[0].value
    assert list(ceiling["variant_id"]) == ["kid"]

    status = open_page(root, "views/status.py")
    assert {m.label: m.value for m in status.metric}["best selection score"] == "3.0500"
    assert "Pick (rank 1): **kid**" in texts(status)

    trials = open_page(root, "views/trials.py").dataframe[0].value.set_index("trial_id")
    assert trials.loc["t2", "selection_score"] == 3.05 and trials.loc["t1", "test_score"] == 3.25
    assert set(trials["kind"]) == {"search"}

    # A final training (trained longer) joins the Trials page as `final` and stays off the Knobs page's samples.
    final = {**base, "cycle": 2, "trial_id": "t4", "variant_id": "kid", "selection_score": -2.9, "final": True}
    KnowledgeBase(root).append("trials", [final], "r1-t4")
    st.cache_data.clear()
    st.cache_resource.clear()
    assert open_page(root, "views/trials.py").dataframe[0].value.set_index("trial_id").loc["t4", "kind"] == "final"
    scheduled = {**final, "trial_id": "t5", "final_added": "cosine + flip_tta"}  # one with what it added named
    KnowledgeBase(root).append("trials", [scheduled], "r1-t5")
    # A KB written before `final_added` named the additions in three columns: read as the same names
    legacy = pa.schema([*SCHEMAS["trials"], ("final_schedule", pa.string()), ("final_augment", pa.string())])
    legacy = legacy.append(pa.field("final_deepen", pa.bool_())).remove(legacy.get_field_index("final_added"))
    old = {**final, "trial_id": "t6", "final_schedule": "cosine", "final_augment": "shift + flip", "final_deepen": True}
    old["written_at"] = now()
    pq.write_table(pa.Table.from_pylist([old], schema=legacy), KnowledgeBase(root).parquet / "trials" / "r1-t6.parquet")
    st.cache_data.clear()
    st.cache_resource.clear()
    kinds = open_page(root, "views/trials.py").dataframe[0].value.set_index("trial_id")["kind"]
    assert kinds["t5"] == "final + cosine + flip_tta" and kinds["t4"] == "final"
    assert kinds["t6"] == "final + cosine + shift + flip + deepen"
    assert "3 scored trial(s)" in texts(open_page(root, "views/knobs.py"))

    lineage = open_page(root, "views/lineage.py")
    assert "3.0500" in lineage.selectbox(key="lineage_variant").format_func("kid")
    assert {m.label: m.value for m in lineage.metric}["selection score"] == "3.0500"

    compare = open_page(root, "views/compare.py").dataframe[0].value
    assert sorted(compare["selection_score"]) == [3.05]  # this campaign's best, as its value
