"""What every page shares: the KB and campaign pickers, the empty states, and the live refresh."""

from __future__ import annotations

import importlib
import json
import os
import sys
import threading
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import figures
import kbdata
import streamlit as st

from ralph_ray import kb, liveness, sql

REFRESH_S = 3  # while a campaign runs, each page redraws itself this often
# A campaign that says "running" but has written nothing for RALPH_APP_STALE_S (300 s; longer where a trial may run
# longer before its row lands) is shown as stopped unexpectedly: ralph_ray.liveness, the rule `ralph-ray status`
# applies too.
# What only some pages import, on their first use (the Knobs page's importance evaluators, the intervals' t
# distribution): loaded once per server in the background after the first page has rendered, so a page visited
# later does not pay for it on its first visit (bench/app_render.py).
LATER_IMPORTS = ("optuna.importance", "scipy.stats")


@dataclass(frozen=True)
class Campaign:
    """The campaign the sidebar picked, as its newest `runs` row says."""

    kb_root: str
    run_id: str
    experiment: str
    task: str
    status: str
    stop_reason: str | None
    run_dir: str
    started_at: Any
    finished_at: Any
    cycle: int | None
    phase: str | None
    config: dict[str, Any]
    quiet_s: float | None = None  # seconds since the campaign last wrote to the KB
    driver: dict[str, Any] | None = None  # its driver process, as state.json records it (liveness.driver_alive)

    @property
    def live(self) -> bool:
        """True while the runs row says running (pages keep redrawing: a quiet campaign may come back)."""
        return self.status == "running"

    @property
    def stale(self) -> bool:
        """Says running, but silent past `stale_after_s`: its driver is gone (killed, machine lost)."""
        return liveness.is_stale(self.status, self.quiet_s, self.config, self.driver)

    @property
    def stale_after_s(self) -> float:
        """How long a running campaign may be silent (liveness.stale_after_s)."""
        return liveness.stale_after_s(self.config)

    @property
    def running(self) -> bool:
        """True while the orchestrator runs: the runs row says so and it still writes."""
        return self.live and not self.stale

    @property
    def asynchronous(self) -> bool:
        """True for a campaign of overlapping generations in one Tune run (`population.mode` async, as load_config
        resolved it and the runs row's config records it); False for barrier cycles and configs without it."""
        return (self.config.get("population") or {}).get("mode") == "async"

    @property
    def sign(self) -> float:
        """-1 for a min metric (its stored scores are -value: pages show `sign * score`), else 1."""
        return -1.0 if (self.config.get("task") or {}).get("direction") == "min" else 1.0

    @property
    def metric_note(self) -> str:
        """The task's metric and which way is better, for the pages' captions."""
        metric = (self.config.get("task") or {}).get("metric") or "score"
        return f"{metric}, {'lower' if self.sign < 0 else 'higher'} is better"

    @property
    def target(self) -> float | None:
        """The campaign's target as a selection score (None: no target): oriented like the KB's scores, so a min
        metric's target (an MSE to get below) is -value, as its scores are."""
        target = (self.config.get("target") or {}).get("selection_score")
        minimise = (self.config.get("task") or {}).get("direction") == "min"
        return -target if target is not None and minimise else target


def _import_all(names: tuple[str, ...]) -> None:
    """Import each module; one that fails is left for its page to import (and report) as before."""
    for name in names:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - a warm-up must never take the server down; the page says what is wrong
            continue


@st.cache_resource(show_spinner=False)
def warm_imports() -> threading.Thread:
    """Start importing LATER_IMPORTS in a daemon thread, once per server process (the thread, for tests to join)."""
    thread = threading.Thread(target=_import_all, args=(LATER_IMPORTS,), name="ralph-app-warm-imports", daemon=True)
    thread.start()
    return thread


def kb_root() -> str:
    """The KB root this session reads (first from `-- --kb`, $RALPH_KB or ./kb; then the sidebar's field)."""
    if not st.session_state.get("kb_root"):
        st.session_state.kb_root = str(kbdata.kb_from_args(sys.argv[1:], dict(os.environ)))
    return st.session_state.kb_root


def sidebar() -> None:
    """The KB path and the campaign picker (newest first); their values live in st.session_state."""
    root = kb_root()
    with st.sidebar:
        st.text_input(
            "Knowledge base", key="kb_root", help="A KB root (`paths.kb` of a campaign): `-- --kb PATH` or $RALPH_KB"
        )
        if not kbdata.kb_exists(root):
            return
        runs = kbdata.runs(root)
        if runs.empty:
            return
        ids = list(runs["run_id"])
        if st.session_state.get("run_id") not in ids:
            st.session_state.pop("run_id", None)  # a run of another KB: start from the newest
        # Plain run ids as the options: the binding writes the shown text to the URL (`?run_id=<id>`).
        picked = st.selectbox("Campaign", ids, key="run_id", bind="query-params", help="newest first")
        rec = figures.records(runs[runs["run_id"] == picked])[0]
        started = (
            f"started {rec['started_at']:%Y-%m-%d %H:%M} UTC" if rec["started_at"] is not None else "start unknown"
        )
        st.caption(
            f"{rec['experiment']} · {rec['status']} · {started}  \n"
            f"{len(ids)} campaign(s) in this KB · refreshes every {REFRESH_S} s while one runs"
        )


def campaign() -> Campaign | None:
    """The picked campaign (the newest when none is picked); None when the KB has none."""
    root = kb_root()
    if not kbdata.kb_exists(root):
        return None
    runs = kbdata.runs(root)
    if runs.empty:
        return None
    picked = runs[runs["run_id"] == st.session_state.get("run_id")]
    rec = figures.records((picked if not picked.empty else runs).head(1))[0]
    quiet = driver = None
    if rec.get("status") == "running":
        quiet = figures.records(kbdata.frame(root, sql.APP_LAST_WRITE, (rec["run_id"],)))[0]["quiet_s"]
        driver = liveness.recorded_driver(rec.get("run_dir") or "")  # where the app runs beside the driver
    return Campaign(
        root,
        rec["run_id"],
        rec.get("experiment") or "?",
        rec.get("task") or "?",
        rec.get("status") or "?",
        rec.get("stop_reason"),
        rec.get("run_dir") or "",
        rec.get("started_at"),
        rec.get("finished_at"),
        None if rec.get("cycle") is None else int(rec["cycle"]),
        rec.get("phase"),
        json.loads(rec.get("config") or "{}"),
        None if quiet is None else float(quiet),
        driver,
    )


def page(title: str, body: Callable[[Campaign], None]) -> None:
    """Render a page: title, campaign banner, and `body` in a fragment that redraws itself while the campaign runs."""
    st.title(title)
    run = campaign()
    if run is None:
        empty_kb(kb_root())
        return
    running = run.live

    @st.fragment(run_every=REFRESH_S if running else None)
    def live() -> None:
        current = campaign()
        if current is None or current.run_id != run.run_id or current.live != running:
            st.rerun()  # it just finished or crashed (or vanished): redraw everything once, with or without the timer
        damaged(current.kb_root)
        banner(current)
        body(current)

    live()


def empty_kb(root: str) -> None:
    """No KB at all, or a KB without a campaign: say what to run, and come alive when one appears."""
    if not kbdata.kb_exists(root):
        st.info(
            f"No knowledge base at `{root}` yet.\n\n"
            f"Start a campaign that writes there: `python -m ralph_ray paths.kb={root}`, or point the app at an "
            "existing one: `streamlit run app/leaderboard.py -- --kb PATH` (or set `RALPH_KB`).",
            icon=":material/database:",
        )
    else:
        st.info(
            f"The knowledge base at `{root}` holds no campaign yet: run `python -m ralph_ray paths.kb={root}`.",
            icon=":material/hourglass_empty:",
        )

    @st.fragment(run_every=REFRESH_S)
    def poll() -> None:
        if campaign() is not None:
            st.rerun()

    poll()


def repair_command(root: str) -> str:
    """The command that moves the KB's damaged parts aside (to `<kb>/damaged/`; nothing is deleted)."""
    return f"python -m ralph_ray kb check --repair --kb {root}"


def damaged(root: str) -> None:
    """Name every part of the KB that could not be read: the pages show the rest."""
    for path, why in kbdata.damaged(root).items():
        st.warning(
            f"Skipped a damaged part of the knowledge base: `{path}` ({why}). Everything else is shown; move "
            f"the file aside to silence this: `{repair_command(root)}`.",
            icon=":material/broken_image:",
        )


def skipped_parts(root: str, tables: tuple[str, ...] = (), runs: Collection[str] | None = None) -> list[Path]:
    """The skipped damaged parts of `tables` (any table: none named) that may hold rows of `runs` (None: any run's).

    A run's own part is told by its name (kb.part_run); a `_kb-*` file by the runs its manifest recorded in it
    (kb.compacted_run_ids). Where that is unknown (a manifest written before the record, a damaged manifest), the
    part counts for every run: a page that may miss rows says so."""
    parts = [path for path in kbdata.damaged(root) if not tables or path.parent.name in tables]
    if runs is None or not parts:
        return parts
    known = set(kbdata.runs(root)["run_id"]) | set(runs)
    held = {folder: kb.compacted_run_ids(folder) for folder in {path.parent for path in parts}}

    def may_hold(path: Path) -> bool:
        owner = kb.part_run(path, known)
        if owner is not None:
            return owner in runs
        recorded = held[path.parent].get(path.name)
        return recorded is None or not recorded.isdisjoint(runs)

    return [path for path in parts if may_hold(path)]


def skipped_here(root: str, tables: tuple[str, ...] = (), runs: Collection[str] | None = None) -> bool:
    """Where damaged parts of `tables` that may hold rows of `runs` were skipped (skipped_parts), say that a page's
    missing rows may be in them, with the repair, and return True: the page's own empty state would blame the campaign
    or the user."""
    parts = skipped_parts(root, tables, runs)
    if not parts:
        return False
    names = ", ".join(f"`{path.parent.name}/{path.name}`" for path in parts)
    st.warning(
        f"Nothing to show here from the readable parts of the knowledge base: it may be in the damaged part(s) "
        f"named above ({names}). Move them aside with `{repair_command(root)}` (to `{root}/damaged/`, nothing is "
        "deleted); their rows stay missing until the file is restored, from a backup or a copy of the KB.",
        icon=":material/broken_image:",
    )
    return True


def empty(
    root: str, text: str, tables: tuple[str, ...] = (), icon: str | None = None, runs: Collection[str] | None = None
) -> None:
    """A page's empty state: `text`, unless damaged parts of `tables` that may hold rows of `runs` (None: any run's)
    were skipped (`skipped_here` says so then)."""
    if not skipped_here(root, tables, runs):
        st.info(text, icon=icon)


def banner(run: Campaign) -> None:
    """One line on the campaign's state; a crashed, interrupted or silent campaign says how to resume."""
    where = f"cycle {run.cycle}, phase {run.phase}" if run.cycle is not None else ""
    if run.stale:
        resume = liveness.resume_command(run.run_id, f"paths.kb={run.kb_root}")
        why = liveness.why_stale(run.quiet_s, run.config, run.driver)  # the rule's own words, as `status` says it
        st.error(
            f"Campaign `{run.run_id}` **stopped unexpectedly** (stale): {why}. Continue it with `{resume}`.",
            icon=":material/heart_broken:",
        )
    elif run.status == "crashed":
        st.error(
            f"Campaign `{run.run_id}` crashed: {run.stop_reason or 'no reason recorded'}.\n\n"
            f"Its run dir is `{run.run_dir}`; continue it with `python -m ralph_ray resume={run.run_id} "
            f"paths.kb={run.kb_root}`.",
            icon=":material/error:",
        )
    elif run.status == "interrupted":
        st.warning(
            f"Campaign `{run.run_id}` was interrupted ({run.stop_reason or 'Ctrl-C'}) at {where or 'its start'}: "
            "what finished is kept. Continue it with "
            f"`python -m ralph_ray resume={run.run_id} paths.kb={run.kb_root}`.",
            icon=":material/pause_circle:",
        )
    elif run.running:
        st.caption(f":green-badge[:material/sync: running] `{run.run_id}` · {run.experiment} · {where} · live")
    else:
        st.caption(f":gray-badge[finished] `{run.run_id}` · {run.experiment} · stopped: {run.stop_reason or '-'}")


def no_trials_yet(run: Campaign, what: str) -> None:
    """The empty state of a campaign with nothing finished yet (`what` names the missing thing): its status, then,
    where a damaged part that may hold its trials was skipped, that they may be in it."""
    skipped = skipped_parts(run.kb_root, ("trials", "variants"), (run.run_id,))
    # its trials may be in a damaged part: not "before any trial finished"
    before = "with none of its trials in the readable parts" if skipped else "before any trial finished"
    if run.status == "crashed":
        st.warning(f"No {what}: the campaign crashed {before}. Fix the cause above, then resume it.")
    elif run.status == "interrupted":
        st.info(f"No {what}: the campaign was interrupted {before}; resume it as said above.")
    elif run.running:
        st.info(
            f"No {what} yet: campaign `{run.run_id}` is running (cycle {run.cycle or 1}, phase "
            f"{run.phase or 'select'}); "
            f"finished trials appear here within {REFRESH_S} s.",
            icon=":material/hourglass_top:",
        )
    else:
        st.info(
            f"No {what}: campaign `{run.run_id}` ended ({run.stop_reason or 'no reason recorded'}) {before}. "
            f"Start another with `python -m ralph_ray paths.kb={run.kb_root}`."
        )
    if skipped:
        skipped_here(run.kb_root, ("trials", "variants"), (run.run_id,))
