"""The app's empty states (no KB, no campaign, nothing finished, a crash) and its pure helpers."""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd
import pytest
from app_support import PAGES, kb_with_run, open_page, texts

from ralph_ray import PROJECT_ROOT
from ralph_ray.kb import KnowledgeBase

sys.path.insert(0, str(PROJECT_ROOT / "app"))  # the app's modules, as `streamlit run` finds them
import figures  # noqa: E402
import kbdata  # noqa: E402


@pytest.mark.parametrize("page", PAGES)
def test_no_kb_says_how_to_make_one(tmp_path: Path, page: str):
    at = open_page(tmp_path / "nothing", page)
    assert "No knowledge base at" in texts(at) and "python -m ralph_ray paths.kb=" in texts(at)


def test_a_kb_without_a_campaign_says_what_to_run(tmp_path: Path):
    KnowledgeBase(tmp_path / "kb").init()
    at = open_page(tmp_path / "kb")
    assert "holds no campaign yet" in texts(at) and "python -m ralph_ray" in texts(at)


# Each page's own empty state (the banner's "running" caption is on every page, so it proves nothing)
RUNNING = "yet: campaign `r1` is running (cycle 1, phase train)"
EMPTY_STATE = {
    "views/board.py": f"No finished trial {RUNNING}",
    "views/trials.py": f"No trial {RUNNING}",
    "views/knobs.py": f"No scored trial with knobs {RUNNING}",
    "views/lineage.py": f"No variant {RUNNING}",
    "views/curves.py": f"No curve {RUNNING}",
    "views/compare.py": f"No scored variant {RUNNING}",
    "views/diff.py": f"No variant {RUNNING}",
    "views/interventions.py": "No intervention measured yet: effects appear once a campaign's children",
    "views/status.py": "No decision yet: the first one comes at the end of cycle 1.",
}


@pytest.mark.parametrize("page", PAGES)
def test_a_campaign_with_no_finished_trial(tmp_path: Path, page: str):
    at = open_page(kb_with_run(tmp_path, "running"), page)
    shown = texts(at)
    assert EMPTY_STATE[page] in shown, shown
    if page == "views/status.py":
        assert "trials: none finished yet" in shown and at.button(key="stop")


def test_an_async_campaign_says_when_its_first_decision_comes(tmp_path: Path):
    """Review: an async campaign writes one decisions row per generation, the first once a generation-2 child is
    judged (or at its stop), not "at the end of cycle 1" as a barrier campaign does."""
    config = '{"population": {"mode": "async"}, "safeguards": {"max_cycles": 3}}'
    shown = texts(open_page(kb_with_run(tmp_path, "running", config=config), "views/status.py"))
    assert "end of cycle 1" not in shown, shown
    assert "No decision yet: this async campaign writes one per generation" in shown, shown
    assert "once a generation-2 child has its verdict" in shown, shown


@pytest.mark.parametrize("page", PAGES)
def test_a_crashed_campaign_says_how_to_resume(tmp_path: Path, page: str):
    kb_root = kb_with_run(tmp_path, "crashed", stop_reason="RuntimeError: the trial driver died", finished_at=None)
    at = open_page(kb_root, page)
    assert "crashed: RuntimeError: the trial driver died" in at.error[0].value
    assert "python -m ralph_ray resume=r1" in at.error[0].value


@pytest.mark.parametrize("page", PAGES)
def test_an_interrupted_campaign_says_how_to_resume(tmp_path: Path, page: str):
    """Ctrl-C records the run `interrupted` (exit 130): a warning with the resume line, never "finished"."""
    kb_root = kb_with_run(tmp_path, "interrupted", stop_reason="SIGINT (Ctrl-C)", finished_at=None)
    at = open_page(kb_root, page)
    warning = at.warning[0].value
    assert "was interrupted (SIGINT (Ctrl-C))" in warning and "python -m ralph_ray resume=r1" in warning
    assert "[finished]" not in texts(at) and not at.error


def test_kb_location_comes_from_the_args_then_the_env_then_the_default(tmp_path: Path):
    assert kbdata.kb_from_args(["--kb", str(tmp_path / "a")], {"RALPH_KB": str(tmp_path / "b")}) == tmp_path / "a"
    assert kbdata.kb_from_args(["--other", "x"], {"RALPH_KB": str(tmp_path / "b")}) == tmp_path / "b"
    assert kbdata.kb_from_args([], {}) == Path("kb").resolve()


def test_the_env_var_points_the_app_at_a_kb(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from app_support import ENTRY
    from streamlit.testing.v1 import AppTest

    monkeypatch.setenv("RALPH_KB", str(kb_with_run(tmp_path, "running")))
    at = AppTest.from_file(str(ENTRY), default_timeout=60).run()
    assert at.session_state["kb_root"] == str(tmp_path / "kb") and at.selectbox(key="run_id").value == "r1"


def test_lineage_graph_lays_out_generations_and_styles_nodes():
    row = {"status": "kept", "selection_score": 0.95, "interventions": "[]", "cycle": 2}
    tree = pd.DataFrame(
        [
            row | {"variant_id": "seed", "parent_id": None, "status": "seed", "selection_score": 0.9, "cycle": 1},
            row | {"variant_id": "kid", "parent_id": "seed", "status": "rejected", "selection_score": None},
            row | {"variant_id": "kid2", "parent_id": "seed", "interventions": '["say \\"hi\\""]'},
            row | {"variant_id": "orphan", "parent_id": "gone", "status": "discarded"},  # its parent is not in the run
        ]
    )
    nodes, edges = figures.lineage_frames(tree, best_id="kid2")
    x = dict(zip(nodes["variant_id"], nodes["x"]))
    assert x["kid"] == x["kid2"] > x["seed"] == x["orphan"]
    assert list(zip(edges["parent_id"], edges["variant_id"], edges["label"])) == [
        ("seed", "kid", "knobs"),
        ("seed", "kid2", 'say "hi"'),
    ]
    fill = dict(zip(nodes["variant_id"], nodes["fill"]))
    assert fill["kid"] == figures.NO_SCORE_FILL and fill["seed"] != fill["kid2"]
    assert list(nodes.loc[nodes["best"], "variant_id"]) == ["kid2"]
    spec = figures.lineage_chart(tree, best_id="kid2").to_dict()
    assert [p["name"] for p in spec["params"]] == [figures.LINEAGE_PICK]  # the click selection the page reads
    assert spec["usermeta"]["embedOptions"]["renderer"] == "svg"  # nodes are elements a browser can click


@pytest.mark.parametrize("siblings", [1, 2, 3, 5])
def test_siblings_in_one_generation_get_rows_of_their_own(siblings: int):
    """User trial (async): two children of one parent in one generation, `eb60fd00ccea · 0.9805` and `a1fa4d88e0a6 ·
    -`, were drawn on top of each other. Their positions differed, but the chart was 80 px a row (180 at least) with
    no autosize of its own, so Streamlit's default, `fit`, squeezed the bottom legend, the labels and the scale's
    padding into that height: 25 px between two siblings, less than a node and its label. Now each node has its own
    row, and the chart's height is its rows' alone (`fit-x`), ROW_PX each."""
    kids = [f"kid{i}" for i in range(siblings)]
    tree = pd.DataFrame(
        [
            {"variant_id": "seed", "parent_id": None, "status": "seed", "selection_score": 0.9805, "cycle": 1},
            {"variant_id": "mid", "parent_id": "seed", "status": "kept", "selection_score": 0.9833, "cycle": 2},
        ]
        + [
            {"variant_id": k, "parent_id": "mid", "status": "candidate", "selection_score": s, "cycle": 3}
            for k, s in zip(kids, [0.9805, None, 0.9805, 0.97, None])  # equal scores and none: no collision either
        ]
    ).assign(interventions="[]")
    nodes, edges = figures.lineage_frames(tree)
    assert len(set(zip(nodes["x"], nodes["y"]))) == len(nodes)  # no two nodes share a position
    rows = nodes.set_index("variant_id").loc[kids]
    assert rows["x"].nunique() == 1 and sorted(rows["y"].diff().dropna().abs()) == [1.0] * (siblings - 1)
    assert set(edges["variant_id"]) == {"mid", *kids}
    spec = figures.lineage_chart(tree).to_dict()
    # The height is the plot's own: Streamlit's `fit` would fit the legend and labels into it too
    assert spec["autosize"] == {"type": "fit-x", "contains": "padding"}
    low, high = spec["layer"][2]["encoding"]["y"]["scale"]["domain"]  # the nodes' layer
    assert low <= rows["y"].min() - 0.5 and high >= rows["y"].max() + 0.5  # half a row above and below the outermost
    assert spec["height"] / (high - low) >= figures.ROW_PX  # every row gets its pixels


def test_budgets_compare_spending_with_the_safeguards():
    config = {"safeguards": {"max_cycles": 4, "campaign_time_s": 100, "tokens_per_campaign": None}}
    rows = {b.name: b for b in figures.budgets(config, {"tokens": 50, "cost": 0.0, "trial_hours": 0.5}, 150.0, 2)}
    assert rows["cycles"].share == 0.5 and rows["campaign time"].share == 1.0
    assert rows["agent tokens"].share is None and rows["agent tokens"].text() == "50 tokens (no limit)"


def test_the_app_knows_every_variant_status():
    # The board's status filter and the lineage styles list the statuses without importing the engine.
    from ralph_ray.variants import VariantStatus

    assert list(figures.STATUS_STYLE) == [s.value for s in VariantStatus]


def test_the_app_knows_every_trial_status():
    # The Trials page's status filter lists the statuses without importing the engine.
    from ralph_ray.statuses import TrialStatus

    assert figures.TRIAL_STATUSES == [s.value for s in TrialStatus]


def test_rationales_show_floats_at_four_decimals():
    assert (
        figures.round_floats("best 0.9637883008356546 (-0.00123456) v1.2.3456789")
        == "best 0.9638 (-0.0012) v1.2.3456789"
    )


def test_the_score_chart_orders_variants_by_rank():
    board = pd.DataFrame(
        {
            "variant_id": ["kid", "seed"],
            "rank": [1, 2],
            "status": ["kept", "kept"],
            "selection_score": [0.97, 0.99],
            "test_score": [0.97, 0.99],
        }
    )
    x = figures.score_chart(board, None).to_dict()["layer"][0]["encoding"]["x"]
    assert x["sort"]["field"] == "rank" and x["sort"]["order"] == "ascending"
    assert x["title"] == "variant (by rank, the pick first)"


def test_the_running_best_leaves_replicates_out():
    """A replicate's lucky seed is not progress: the Curves page's line follows the search trials, as progress.png."""
    timeline = pd.DataFrame(
        {
            "trial_id": ["a", "b", "c", "d"],
            "selection_score": [0.80, 0.86, 0.84, None],
            "written_at": pd.to_datetime(
                ["2026-01-01 00:00", "2026-01-01 00:01", "2026-01-01 00:02", "2026-01-01 00:03"]
            ),
            "replicate": [False, True, False, False],
        }
    )
    assert figures.progress_frame(timeline)["running best"].tolist() == [0.80, 0.80, 0.84, 0.84]
