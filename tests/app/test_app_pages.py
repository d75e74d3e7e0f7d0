"""Every page of the leaderboard app (AppTest, in-process) against the KB of a real tiny campaign."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import streamlit as st
from app_support import ENTRY, PAGES, Tiny, copy_run_dir, kb_with_run, open_page, texts, tiny_fixture  # noqa: F401 (the `tiny` fixture)

from ralph_ray import sql
from ralph_ray.front import cost_seconds
from ralph_ray.kb import SCHEMAS as KB_SCHEMAS
from ralph_ray.kb import KnowledgeBase, now, open_reader
from ralph_ray.statuses import TrialStatus

BOARD_COLUMNS = [
    "variant_id",
    "parent_id",
    "status",
    "selection_score",
    "test_score",
    "completed",
    "stopped_early",
    "failed",
    "rank",
]


def view_rows(kb_root: Path, query: str, params: list) -> list[dict]:
    cursor = open_reader(kb_root).execute(query, params)
    names = [d[0] for d in cursor.description]
    return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]


def chart_rows(at, index: int = 0) -> list[pa.Table]:
    """The data sets behind one altair chart on the page."""
    chart = at.get("vega_lite_chart")[index]
    return [pa.ipc.open_stream(d.data.data).read_all() for d in chart.proto.datasets]


def stop_marks(at, index: int = 0) -> pa.Table:
    """The data set behind the cross layer (ASHA's stops) of one altair chart on the page, empty when none stopped."""
    chart = at.get("vega_lite_chart")[index]
    # Found by its mark, not by position: altair names data sets by content and drops duplicates, so an index could
    # point at the lines' data set.
    layer = next(layer for layer in json.loads(chart.proto.spec)["layer"] if layer["mark"].get("shape") == "cross")
    data = next(d for d in chart.proto.datasets if d.name == layer["data"]["name"])
    return pa.ipc.open_stream(data.data.data).read_all()


def test_leaderboard_rows_match_the_kb_view(tiny: Tiny):
    at = open_page(tiny.kb_root)
    expected = view_rows(tiny.kb_root, sql.APP_LEADERBOARD, [tiny.run_id])
    shown = at.dataframe[0].value
    assert len(expected) >= 2  # the seed and at least one child
    assert list(shown["variant_id"]) == [r["variant_id"] for r in expected]
    for got, want in zip(shown[BOARD_COLUMNS].to_dict("records"), expected, strict=True):
        for column in BOARD_COLUMNS:
            value = got[column]
            assert (value is None or value != value) if want[column] is None else value == want[column], (
                column,
                got,
                want,
            )
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["best selection score"] == f"{expected[0]['selection_score']:.4f}"
    assert metrics["trials"] == str(sum(r["trials"] for r in expected))
    assert at.selectbox(key="run_id").value == tiny.run_id


def test_leaderboard_filters_by_status_and_min_score(tiny: Tiny):
    at = open_page(tiny.kb_root)
    at.number_input(key="board_min").set_value(1.01).run()
    assert at.dataframe[0].value.empty
    at.number_input(key="board_min").set_value(None).run()
    at.multiselect(key="board_status").set_value(["seed"]).run()
    assert list(at.dataframe[0].value["status"]) == ["seed"]


def test_lineage_graph_holds_the_seed_and_its_children(tiny: Tiny):
    at = open_page(tiny.kb_root, "views/lineage.py")
    variants = view_rows(tiny.kb_root, sql.VARIANTS_FOR_RUN, [tiny.run_id])
    seed = next(v for v in variants if v["parent_id"] is None)
    children = [v for v in variants if v["parent_id"] == seed["variant_id"]]
    assert children
    tables = chart_rows(at)
    nodes = {n["variant_id"]: n for n in next(t for t in tables if "aria" in t.column_names).to_pylist()}
    edges = {e["variant_id"]: e for e in next(t for t in tables if "x2" in t.column_names).to_pylist()}
    assert set(nodes) == {v["variant_id"] for v in variants}
    for child in children:
        edge = edges[child["variant_id"]]
        assert edge["parent_id"] == seed["variant_id"]
        assert edge["label"] == (", ".join(json.loads(child["interventions"])) or "knobs")
        assert nodes[child["variant_id"]]["x"] > nodes[seed["variant_id"]]["x"]  # a column per generation
    picker = at.selectbox(key="lineage_variant")
    picker.set_value(children[0]["variant_id"]).run()
    assert {m.label: m.value for m in at.metric}["status"] == children[0]["status"]
    assert seed["variant_id"] in at.table[0].value.to_string()  # its parent


def test_curves_page_draws_every_epoch_and_the_progress(tiny: Tiny):
    at = open_page(tiny.kb_root, "views/curves.py")
    chosen = at.multiselect(key="curves_variants").value
    curves = [
        r
        for r in view_rows(tiny.kb_root, "select * from curves where run_id = ?", [tiny.run_id])
        if r["variant_id"] in chosen
    ]
    lines = chart_rows(at, 0)[0]
    assert lines.num_rows == len(curves) > 0
    assert set(lines.column("trial_id").to_pylist()) == {r["trial_id"] for r in curves}
    stopped = {r["trial_id"] for r in curves if r["status"] == "stopped_early"}
    # Holds with or without an ASHA stop in this campaign (then no cross); a KB with stops: the next test
    assert set(stop_marks(at).column("trial_id").to_pylist()) == stopped
    trials = view_rows(tiny.kb_root, sql.TRIAL_TIMELINE, [tiny.run_id])
    progress = chart_rows(at, 1)
    assert sum(t.num_rows for t in progress[:2]) == len(trials)  # scored points + unscored ticks: every trial
    at.selectbox(key="curves_metric").set_value("val_loss").run()
    assert "val_loss" in chart_rows(at, 0)[0].column_names


def test_curves_page_marks_each_asha_stop_at_its_last_epoch(tmp_path: Path):
    """Every stopped_early trial gets one cross at its last epoch and value, for each metric; completed ones none."""
    kb = KnowledgeBase(kb_with_run(tmp_path, "finished", stop_reason="max_cycles"))
    # (variant, trial, status, epochs): each variant mixes a stop and a completion (so marking by variant is wrong
    # too), and the stops end at different epochs, both before the completions' last
    trials = [
        ("seed", "t1", TrialStatus.completed, 3),
        ("seed", "t2", TrialStatus.stopped_early, 1),
        ("kid", "t3", TrialStatus.stopped_early, 2),
        ("kid", "t4", TrialStatus.completed, 3),
    ]
    for variant, parent in (("seed", None), ("kid", "seed")):
        kb.append(
            "variants",
            [{"run_id": "r1", "variant_id": variant, "parent_id": parent, "cycle": 1, "status": "kept"}],
            f"r1-{variant}",
        )
    # (trial, epoch) -> the metrics it reported, distinct for every point so a cross's y names the point it sits on
    values: dict[tuple[str, int], dict[str, float]] = {}
    for n, (variant, trial_id, status, epochs) in enumerate(trials):
        done = status is TrialStatus.completed
        row = {
            "run_id": "r1",
            "cycle": 1,
            "trial_id": trial_id,
            "variant_id": variant,
            "status": status.value,
            "epochs": epochs,
            "selection_score": 0.9 if done else None,  # as the ledger writes them: only completed trials are scored
            "test_score": 0.89 if done else None,
        }
        kb.append("trials", [row], f"r1-{trial_id}")
        for epoch in range(epochs, 0, -1):  # last epoch first: the cross must follow the epoch, not the row order
            values[trial_id, epoch] = {"val_acc": 0.5 + 0.1 * n + 0.01 * epoch, "val_loss": n + 1.0 / epoch}
        points = [
            {"run_id": "r1", "trial_id": trial_id, "epoch": epoch, "metric": metric, "value": value}
            for (trial, epoch), metrics in values.items()
            if trial == trial_id
            for metric, value in metrics.items()
        ]
        kb.append("epochs", points, f"r1-{trial_id}")
    stopped = {trial_id: epochs for _, trial_id, status, epochs in trials if status is TrialStatus.stopped_early}

    at = open_page(kb.root, "views/curves.py")
    assert set(at.multiselect(key="curves_variants").value) == {"seed", "kid"}
    assert set(chart_rows(at, 0)[0].column("trial_id").to_pylist()) == {"t1", "t2", "t3", "t4"}  # all drawn
    assert "4 trial(s) of 2 variant(s); 2 stopped early by ASHA" in texts(at)
    for metric in ("val_acc", "val_loss"):
        at.selectbox(key="curves_metric").set_value(metric).run()
        marks = stop_marks(at).to_pylist()
        assert len(marks) == len(stopped)  # one cross per stop, none for t1 and t4
        assert {m["trial_id"]: (m["epoch"], m[metric]) for m in marks} == {
            trial_id: (last, values[trial_id, last][metric]) for trial_id, last in stopped.items()
        }


def test_diff_page_shows_the_change_against_parent_and_seed(tiny: Tiny):
    at = open_page(tiny.kb_root, "views/diff.py")
    picked = at.selectbox(key="diff_variant").value
    variants = {v["variant_id"]: v for v in view_rows(tiny.kb_root, sql.VARIANTS_FOR_RUN, [tiny.run_id])}
    assert variants[picked]["parent_id"] is not None  # a child comes first, not the seed
    diffs = [c.value for c in at.code]
    assert diffs and all(c.language == "diff" for c in at.code)
    assert any("+++ b/" in d for d in diffs)
    assert "Agent's rationale" in texts(at)


def test_diff_page_survives_a_deleted_variant_folder(tiny: Tiny, tmp_path: Path):
    kb = KnowledgeBase(kb_with_run(tmp_path, "finished", run_id=tiny.run_id))
    rows = view_rows(tiny.kb_root, sql.VARIANTS_FOR_RUN, [tiny.run_id])
    kb.put(
        "variants",
        [{k: v for k, v in r.items() if k != "written_at"} | {"files_dir": str(tmp_path / "gone")} for r in rows],
        "v",
    )
    at = open_page(kb.root, "views/diff.py")
    assert "files are gone" in texts(at)


def test_interventions_page_lists_the_measured_effects(tiny: Tiny):
    at = open_page(tiny.kb_root, "views/interventions.py")
    effects = view_rows(tiny.kb_root, sql.APP_EFFECTS, [])
    shown = at.dataframe[0].value
    assert len(shown) == len(effects) > 0
    assert list(shown["intervention"]) == [e["intervention"] for e in effects]
    assert {"mean_delta", "ci_low", "ci_high", "n", "win_rate", "diagnosis", "task"} <= set(shown.columns)


def test_status_page_shows_the_stop_reason_budgets_and_decisions(tiny: Tiny):
    at = open_page(tiny.kb_root, "views/status.py")
    run = view_rows(tiny.kb_root, sql.RUN, [tiny.run_id])[0]
    assert run["status"] == "finished"
    assert f"Stopped: {run['stop_reason']}" in at.success[0].value
    decisions = view_rows(tiny.kb_root, sql.DECISIONS_FOR_RUN, [tiny.run_id])
    assert list(at.dataframe[0].value["reason"]) == [d["reason"] for d in decisions]
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["cycle"] == "2 / 2" and metrics["phase"] == "done"
    assert any("cycles" in p.text for p in at.get("progress"))
    assert not at.button  # a finished campaign has nothing to stop
    env = json.loads(run["environment"])
    line = next(c.value for c in at.caption if c.value.startswith("Python "))
    assert f"Python {env['python']} · torch {env['packages']['torch']}" in line and env["hostname"] in line
    assert at.json and json.loads(at.json[0].value)["python"] == env["python"]  # env.json in full, in an expander


def test_stop_button_writes_the_stop_file(tiny: Tiny, tmp_path: Path):
    run_dir = copy_run_dir(tiny.run_dir, tmp_path / "runs" / "r1")
    kb_root = kb_with_run(tmp_path, "running", run_dir)
    at = open_page(kb_root, "views/status.py")
    assert "running" in texts(at)
    at.button(key="stop").click().run()
    assert not (run_dir / "STOP").exists() and "Stop campaign `r1`?" in texts(at)  # it asks first
    at.button(key="stop_confirm").click().run()
    assert not at.exception
    assert (run_dir / "STOP").read_text().strip().endswith("app")
    assert (tiny.run_dir / "STOP").exists() is False
    at.run()
    assert "Stop requested" in texts(at) and not at.button


def test_a_running_campaign_shows_new_trials_on_the_next_refresh(tmp_path: Path):
    kb_root = kb_with_run(tmp_path, "running")
    at = open_page(kb_root)
    assert "No finished trial yet" in texts(at)
    kb = KnowledgeBase(kb_root)
    kb.append("epochs", [{"run_id": "r1", "trial_id": "t1", "epoch": 1, "metric": "val_acc", "value": 0.5}], "r1-t1")
    kb.append(
        "trials",
        [
            {
                "run_id": "r1",
                "cycle": 1,
                "trial_id": "t1",
                "variant_id": "v1",
                "status": "completed",
                "selection_score": 0.7,
                "test_score": 0.69,
                "seconds": 1.0,
                "epochs": 1,
            }
        ],
        "r1-t1",
    )
    time.sleep(1.1)  # the snapshot looks for new parts at most once a second
    st.cache_data.clear()  # what the 2 s cache TTL does between two live refreshes
    at.run()
    assert list(at.dataframe[0].value["variant_id"]) == ["v1"]


def test_the_app_reaches_the_engine_only_through_the_kb_reader_and_control(tiny: Tiny):
    # Every page, in a fresh interpreter: no Ray, and of the engine only the KB reader, its SQL and the statuses it
    # names, the cost front's, the final winner's and the staleness rule's pure rules, and the stop control.
    script = textwrap.dedent(f"""
        import sys
        from streamlit.testing.v1 import AppTest
        for page in {list(PAGES)!r}:
            at = AppTest.from_file({str(ENTRY)!r}, default_timeout=60)
            at.session_state["kb_root"] = {str(tiny.kb_root)!r}
            at.switch_page(page).run()
            assert not at.exception, (page, at.exception)
        print(sorted(m for m in sys.modules if m.split(".")[0] in ("ray", "ralph_ray")))
    """)
    out = subprocess.run([sys.executable, "-c", script], check=False, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    loaded = json.loads(out.stdout.strip().splitlines()[-1].replace("'", '"'))
    allowed = {"ralph_ray", "ralph_ray.kb", "ralph_ray.sql", "ralph_ray.front", "ralph_ray.finals", "ralph_ray.control"}
    allowed |= {"ralph_ray.statuses", "ralph_ray.liveness"}
    allowed |= {"ralph_ray.scoring"}  # the built-in metrics' ranges the leaderboard view clips intervals to (pure)
    assert set(loaded) <= allowed, loaded


def seed_and_child(tmp_path: Path, old_kb: bool) -> Path:
    """A KB with a seed and one child (their folders on disk) and cycle 2's row; `old_kb`: cycles without
    cycle_dir and analysis, as a KB written before they existed."""
    kb_root = kb_with_run(tmp_path, "finished", stop_reason="max_cycles")
    kb = KnowledgeBase(kb_root)
    for name, lr in (("seed", 0.1), ("kid", 0.2)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "train.py").write_text(f"LR = {lr}  # learning rate\nEPOCHS = 3\n")
    seed = {
        "run_id": "r1",
        "variant_id": "seed",
        "parent_id": None,
        "cycle": 1,
        "status": "seed",
        "files_dir": str(tmp_path / "seed"),
    }
    kid = {
        "run_id": "r1",
        "variant_id": "kid",
        "parent_id": "seed",
        "cycle": 2,
        "status": "kept",
        "files_dir": str(tmp_path / "kid"),
        "interventions": '["raise_lr"]',
        "rationale": "it learns too slowly",
    }
    kb.put("variants", [seed, kid], "r1-variants")
    kb.append(
        "trials",
        [
            {
                "run_id": "r1",
                "cycle": c,
                "trial_id": f"t{c}",
                "variant_id": v,
                "status": "completed",
                "selection_score": score,
                "seconds": 1.0,
                "epochs": 3,
            }
            for c, v, score in ((1, "seed", 0.9), (2, "kid", 0.95))
        ],
        "r1-t",
    )
    cycle = {"run_id": "r1", "cycle": 2, "trials": 1, "best_selection_score": 0.95, "phase": "decide"}
    if old_kb:
        schema = pa.schema([f for f in KB_SCHEMAS["cycles"] if f.name not in ("cycle_dir", "analysis")])
        pq.write_table(schema.empty_table(), kb.parquet / "cycles" / "_schema.parquet")
        old_part = pa.Table.from_pylist([cycle | {"written_at": now()}], schema)
        pq.write_table(old_part, kb.parquet / "cycles" / "r1-2.parquet")
    else:
        kb.put(
            "cycles",
            [
                cycle
                | {
                    "cycle_dir": str(tmp_path / "runs" / "r1" / "cycle_0002"),
                    "analysis": "# Cycle 2\n\n## parent seed\n\nunderfitting: raise the LR\n",
                }
            ],
            "r1-2",
        )
    return kb_root


def test_diff_page_reads_the_analysis_from_the_kb_and_diffs_against_the_seed(tmp_path: Path):
    at = open_page(seed_and_child(tmp_path, old_kb=False), "views/diff.py")
    assert at.selectbox(key="diff_variant").value == "kid"
    assert any("-LR = 0.1" in c.value and "+LR = 0.2" in c.value for c in at.code)
    shown = texts(at)
    assert "underfitting: raise the LR" in shown and "cycle_0002/analysis.md" in shown


def test_diff_page_renders_a_kb_from_before_the_analysis_column(tmp_path: Path):
    at = open_page(seed_and_child(tmp_path, old_kb=True), "views/diff.py")
    assert any("+LR = 0.2" in c.value for c in at.code)
    assert "No analysis recorded" in texts(at)


def test_status_page_reads_where_a_running_campaign_is_from_the_kb(tmp_path: Path):
    # No state.json anywhere: the runs row says the cycle and the phase.
    at = open_page(kb_with_run(tmp_path, "running", cycle=2, phase="analyse"), "views/status.py")
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["status"] == "running" and metrics["cycle"] == "2 / 3" and metrics["phase"] == "analyse"


def test_trials_page_shows_the_node_each_trial_ran_on(tiny: Tiny):
    import ray

    reported = "select node from trials where run_id = ? and epochs > 0"
    nodes = {r["node"] for r in view_rows(tiny.kb_root, reported, [tiny.run_id])}
    assert nodes == {ray.util.get_node_ip_address()}  # one local node: every trial that reported ran there
    at = open_page(tiny.kb_root, "views/trials.py")
    assert set(at.dataframe[0].value["node"].dropna()) == nodes
    assert f"node {next(iter(nodes))}" in texts(at)  # the picked trial's line


def test_trials_page_shows_each_trials_peak_memory(tiny: Tiny):
    rows = view_rows(
        tiny.kb_root, "select trial_id, epochs, peak_rss_mb, peak_gpu_mb from trials where run_id = ?", [tiny.run_id]
    )
    peaks = [r for r in rows if (r["epochs"] or 0) > 0]  # the trials that reported
    # Python, numpy and torch alone pass 50 MiB; a CPU campaign never started CUDA: NULL, not 0.
    assert peaks and all(r["peak_rss_mb"] > 50 and r["peak_gpu_mb"] is None for r in peaks)
    kb = {r["trial_id"]: r for r in rows}
    table = open_page(tiny.kb_root, "views/trials.py").dataframe[0].value
    assert sorted(table["trial_id"]) == sorted(kb)
    for row in table.to_dict("records"):  # each trial's own peaks, as the KB holds them (NaN where it holds none)
        for column in ("peak_rss_mb", "peak_gpu_mb"):
            expected, shown = kb[row["trial_id"]][column], row[column]
            assert (shown == expected) if expected is not None else shown != shown, (column, row)


def test_trials_page_shows_each_trials_cost_next_to_its_wall_seconds(tiny: Tiny):
    con = open_reader(tiny.kb_root)
    wall = dict(con.execute("select trial_id, seconds from trials where run_id = ?", [tiny.run_id]).fetchall())
    train = dict(con.execute(sql.TRAIN_SECONDS_PER_TRIAL, [tiny.run_id]).fetchall())
    assert train and all(train[t] < wall[t] for t in train)  # training seconds leave out start-up: cost < wall
    table = open_page(tiny.kb_root, "views/trials.py").dataframe[0].value
    assert len(table) == len(wall)
    for row in table.to_dict("records"):
        expected = cost_seconds(train.get(row["trial_id"]), wall[row["trial_id"]])
        assert (row["cost_s"] == expected) if expected is not None else row["cost_s"] != row["cost_s"], row  # NaN
    assert table["cost_s"].notna().sum() >= len(train)


def test_trials_page_reads_a_kb_from_before_the_node_column(tmp_path: Path):
    kb_root = kb_with_run(tmp_path, "finished", stop_reason="max_cycles")
    folder = kb_root / "parquet" / "trials"
    old = pa.schema([f for f in KB_SCHEMAS["trials"] if f.name not in ("node", "replicate")])
    pq.write_table(old.empty_table(), folder / "_schema.parquet")  # no part of an old KB has `node`
    row = {"run_id": "r1", "cycle": 1, "trial_id": "t1", "variant_id": "seed", "status": "completed", "epochs": 2}
    pq.write_table(
        pa.Table.from_pylist([row | {"selection_score": 0.9, "written_at": now()}], old), folder / "r1.parquet"
    )
    at = open_page(kb_root, "views/trials.py")
    table = at.dataframe[0].value
    assert list(table["trial_id"]) == ["t1"] and table["node"].isna().all()
    assert "node not recorded" in texts(at)
