"""Shared by the app tests: one real tiny campaign per session, KBs written with the real writer, AppTest helpers."""

from __future__ import annotations

import io
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import pytest
import streamlit as st
from rich.console import Console
from streamlit.testing.v1 import AppTest

from ralph_ray import PROJECT_ROOT
from ralph_ray.kb import KnowledgeBase, now

ENTRY = PROJECT_ROOT / "app" / "leaderboard.py"
PAGES = (
    "views/board.py",
    "views/trials.py",
    "views/knobs.py",
    "views/lineage.py",
    "views/curves.py",
    "views/compare.py",
    "views/diff.py",
    "views/interventions.py",
    "views/status.py",
)
RUN_ID = "app-tiny"
AGENT = "heuristic"


@dataclass(frozen=True)
class Tiny:
    """The finished tiny campaign every page test reads."""

    kb_root: Path
    run_dir: Path
    run_id: str


_built: dict[str, Tiny] = {}


def build_tiny(root: Path) -> Tiny:
    """Run the real two-cycle digits campaign once per test session (every module's fixture shares it)."""
    if "tiny" not in _built:
        from ralph_ray.campaign import run
        from ralph_ray.config import load_config

        cfg = load_config(
            [
                f"paths.runs={root / 'runs'}",
                f"paths.kb={root / 'kb'}",
                f"run_id={RUN_ID}",
                f"agent={AGENT}",
                "search.num_samples=4",
                "safeguards.replicates=0",  # one trial decides (replicates: tests/test_noise.py)
                "search.max_concurrent=2",
                "scheduler.max_t=3",
                "scheduler.grace_period=1",
                "safeguards.max_cycles=2",
                "safeguards.trial_timeout_s=120",
                "population.parents=1",
                "population.children_per_parent=2",
                "population.trials_per_child=1",
                "+search.space.EPOCHS={type: choice, values: [3]}",
                "population.mode=generations",  # two barrier cycles, page by page (the default auto runs async)
            ]
        )
        outcome = run(cfg, Console(file=io.StringIO()))
        _built["tiny"] = Tiny(outcome.kb_root, outcome.run_dir, outcome.run_id)
    return _built["tiny"]


@pytest.fixture(scope="session", name="tiny")
def tiny_fixture(ray_session: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tiny]:
    """The tiny campaign's KB and run dir (read only: tests that change things copy them)."""
    yield build_tiny(tmp_path_factory.mktemp("app_campaign"))
    st.cache_resource.clear()  # the app's snapshots hold DuckDB connections: close them before the interpreter ends


def open_page(kb_root: Path, page: str = PAGES[0], **state: Any) -> AppTest:
    """Run the app on one page over `kb_root` (as `-- --kb` would set it), with extra session state."""
    at = AppTest.from_file(str(ENTRY), default_timeout=60)
    at.session_state["kb_root"] = str(kb_root)
    for key, value in state.items():
        at.session_state[key] = value
    at.switch_page(page).run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def texts(at: AppTest) -> str:
    """Every text the page shows in info/warning/error/success/caption/markdown elements, joined."""
    parts = [
        e.value for kind in ("info", "warning", "error", "success", "caption", "markdown") for e in getattr(at, kind)
    ]
    return "\n".join(str(p) for p in parts)


def kb_with_run(root: Path, status: str, run_dir: Path | None = None, **run: Any) -> Path:
    """A KB holding one campaign's `runs` row (as the orchestrator writes it at its start), nothing else."""
    kb = KnowledgeBase(root / "kb")
    kb.init()
    run_dir = run_dir or root / "runs" / "r1"
    run_dir.mkdir(parents=True, exist_ok=True)
    row = {
        "run_id": "r1",
        "experiment": "digits",
        "task": "digits",
        "run_dir": str(run_dir),
        "status": status,
        "config": '{"target": {"selection_score": 0.99}, "safeguards": {"max_cycles": 3, "campaign_time_s": 600}}',
        "started_at": now(),
        "cycle": 1,
        "phase": "train",
        **run,
    }
    kb.append("runs", [row], "r1")
    return kb.root


def copy_run_dir(source: Path, target: Path) -> Path:
    """A copy of a run dir's state (so a test may write STOP without touching the shared campaign)."""
    target.mkdir(parents=True)
    shutil.copy(source / "state.json", target / "state.json")
    return target
