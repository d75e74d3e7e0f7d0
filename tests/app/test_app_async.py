"""Every page over a campaign of the default mode (auto: one asynchronous Tune run); its generations are cycles."""

from __future__ import annotations

import io
from collections.abc import Iterator

import pytest
import streamlit as st
from app_support import PAGES, open_page, texts
from rich.console import Console

from ralph_ray import sandbox, sql
from ralph_ray.campaign import Outcome, run
from ralph_ray.config import load_config
from ralph_ray.kb import open_reader

RUN_ID = "app-async"


@pytest.fixture(scope="module")
def async_run(ray_session: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Outcome]:
    root = tmp_path_factory.mktemp("app_async")
    overrides = [
        f"paths.runs={root / 'runs'}",
        f"paths.kb={root / 'kb'}",
        f"run_id={RUN_ID}",  # no population.mode: the default
        "safeguards.max_cycles=2",
        "search.num_samples=2",
        "safeguards.replicates=0",
        "search.max_concurrent=2",
        "scheduler.max_t=2",
        "scheduler.grace_period=1",
        "safeguards.trial_timeout_s=180",
        "+search.space.EPOCHS={type: choice, values: [2]}",
        "population.parents=1",
        "population.children_per_parent=2",
        "population.trials_per_child=1",
        "population.breeder_nice=0",  # the breeder at the trials' priority (tests/test_async.py's TINY)
    ]
    if sandbox.available() is not None:
        overrides.append("sandbox=none")
    cfg = load_config(overrides)
    assert cfg.population.mode == "async"
    yield run(cfg, Console(file=io.StringIO()))
    st.cache_resource.clear()  # the app's snapshots hold DuckDB connections


def test_the_board_shows_the_async_campaigns_variants_by_generation(async_run: Outcome):
    at = open_page(async_run.kb_root, run_id=RUN_ID)
    con = open_reader(async_run.kb_root)
    expected = con.execute(sql.APP_LEADERBOARD, [RUN_ID]).fetchdf()
    assert len(expected) >= 3  # the seed and its two children
    assert list(at.dataframe[0].value["variant_id"]) == list(expected["variant_id"])
    assert {m.label: m.value for m in at.metric}["best selection score"] == f"{expected['selection_score'][0]:.4f}"


@pytest.mark.parametrize("page", PAGES)
def test_every_page_renders_an_async_campaign(async_run: Outcome, page: str):
    at = open_page(async_run.kb_root, page, run_id=RUN_ID)
    assert not at.error, [e.value for e in at.error]
    shown = texts(at)
    assert "Traceback" not in shown
    con = open_reader(async_run.kb_root)
    if page == "views/interventions.py":
        # A page across campaigns, by intervention: it names every intervention the KB measured, or says none was
        # (whether a child of a two-generation run is judged before the stop depends on the machine's speed).
        effects = con.execute(sql.APP_EFFECTS).fetchdf()
        if effects.empty:
            assert "No intervention measured yet" in shown
        else:
            table = next(df.value for df in at.dataframe if "intervention" in df.value.columns)
            assert set(table["intervention"]) == set(effects[effects["task"] == "digits"]["intervention"])
        return
    # Each page shows the run's data: a table, a chart or text that names one of its variants.
    variants = [v for (v,) in con.execute("select variant_id from variants where run_id = ?", [RUN_ID]).fetchall()]
    tables = [df.value.to_string() for df in at.dataframe]
    charts = at.get("vega_lite_chart") + at.get("plotly_chart") + at.get("graphviz_chart")
    assert charts or any(v[:8] in "\n".join([shown, *tables]) for v in variants), page


def test_the_status_page_shows_the_stop_and_one_decision_per_generation(async_run: Outcome):
    at = open_page(async_run.kb_root, "views/status.py", run_id=RUN_ID)
    assert "Stopped: max_cycles" in texts(at)
    con = open_reader(async_run.kb_root)
    decisions = con.execute("select cycle from decisions where run_id = ? order by cycle", [RUN_ID]).fetchall()
    assert [c for (c,) in decisions][-1] == 2  # generations are the KB's cycles
    shown = next(df.value for df in at.dataframe if "reason" in df.value.columns)  # the decisions table
    assert len(shown) == len(decisions) and 2 in list(shown["cycle"])
