"""How fast the Streamlit leaderboard shows each page, in a real browser, against a bare Streamlit page.

    python bench/app_render.py [--trials 10000] [--rounds 3] [--keep DIR]    # Chromium, the goal below
    python bench/app_render.py --kb-compact [--skip-live]                      # the 10k KB before/after kb compact
    python bench/app_render.py --apptest                                       # the in-process figures only

Browser (the default): `streamlit run` serves the app with one more page in its navigation, a bare one-table page
(the baseline: same server, same moment, the app's sidebar skipped for it), and, beside it, the same bare page on a
server of its own (the earlier figures' baseline, kept for comparison: two servers warm up differently); headless
Chromium (Debian's, driven by Playwright) opens each page in a fresh browser context (no HTTP cache: the browser
loads Streamlit's scripts anew, as a first visit does) and times from navigation to the page's content (its table,
chart, code or metric). Goal: every page within 1.5x of the bare page. Two KBs: a live one (a real digits campaign
with the offline agent, measured while it runs) and one of 10,000 trials in parts per table and cycle (`--kb-
compact`: also folded and compacted, below). Round 1 is each page's first visit on a fresh server (the first page
visited also reads the KB into the app's snapshot); the median is over every round.

`--kb-compact`: the 10,000-trial KB measured three times in the same run, on a fresh server each time: in cycle
parts (the layout above, of the earlier figures); as campaigns leave it today (each finished campaign's cycle
parts folded into one part per table by `compact_run`, as campaign.py does at the end; compact_run's own call of
compact_kb held off, as bench/kb_scale.py does); then after `KnowledgeBase.compact_kb()` (`python -m ralph_ray kb
compact`: one sorted `_kb-*` file per table).
`--skip-live`: no live campaign (the previous run's live-KB figure is carried over into the record, marked so).

`--apptest`: the first `AppTest.from_file(app/leaderboard.py)` run of each page with every cache cleared and a
live refresh after a new trial, over two layouts of the 10,000-trial KB (one part per trial, as a cycle in
training still writes; and compacted per cycle). No browser; goal <= 2 s.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from importlib.metadata import version
from pathlib import Path
from typing import Any

import duckdb

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import save  # noqa: E402

from ralph_ray import kb as kbmod  # noqa: E402
from ralph_ray import sql  # noqa: E402
from ralph_ray.kb import KnowledgeBase, now, open_reader  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
ENTRY = ROOT / "app" / "leaderboard.py"
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
GOAL_S = 2.0  # --apptest
GOAL_RATIO = 1.5  # browser: time to content against the bare page's
# What shows that a page has drawn its content (the first such element, visible), by URL path ("" = the bare page).
CONTENT = {
    "": '[data-testid="stDataFrame"]',
    "views/board.py": '[data-testid="stDataFrame"]',
    "views/trials.py": '[data-testid="stDataFrame"]',
    "views/knobs.py": '[data-testid="stVegaLiteChart"]',
    "views/lineage.py": '[aria-label^="variant "]',  # a node of the (SVG) lineage graph
    "views/curves.py": '[data-testid="stVegaLiteChart"]',
    "views/compare.py": '[data-testid="stVegaLiteChart"]',
    "views/diff.py": '[data-testid="stCode"]',
    "views/interventions.py": '[data-testid="stVegaLiteChart"]',
    "views/status.py": '[data-testid="stMetric"]',
}
BARE_PAGE = 'import streamlit as st\n\nst.title("bare")\nst.dataframe({"a": [1, 2, 3], "b": [4, 5, 6]})\n'
# The app as served for the bench: app/leaderboard.py run as is, with one more page, the bare page, in its navigation
# (same server, same process, same moment as the pages it is the baseline of; the app's shell skipped for it). So
# the ratio reads a page's own cost, not the difference between two servers' warm-up. Written into the work dir.
SAME_SERVER_ENTRY = """
import runpy
import sys
from pathlib import Path

import streamlit as st

APP = Path({app!r})
sys.path.insert(0, str(APP))
import shell  # noqa: E402

chosen = []  # the page st.navigation picked in this run


def bare() -> None:
    st.title("bare")
    st.dataframe({{"a": [1, 2, 3], "b": [4, 5, 6]}})


def page(target, *args, **kwargs):  # the app's page paths are relative to app/, not to this file
    if isinstance(target, str):
        target = str(APP / target)
    return ORIGINAL["page"](target, *args, **kwargs)


def navigation(pages, **kwargs):
    chosen[:] = [ORIGINAL["navigation"]([*pages, ORIGINAL["page"](bare, title="bare", url_path="bare")], **kwargs)]
    return chosen[0]


def sidebar(*args, **kwargs):
    if chosen and chosen[0].url_path == "bare":
        return None
    return ORIGINAL["sidebar"](*args, **kwargs)


ORIGINAL = getattr(st, "_bench_original", None) or {{
    "page": st.Page, "navigation": st.navigation, "sidebar": shell.sidebar
}}
st._bench_original = ORIGINAL
st.Page, st.navigation, shell.sidebar = page, navigation, sidebar
runpy.run_path(str(APP / "leaderboard.py"), run_name="__main__")
"""
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
# The live campaign: a real digits campaign with the offline agent, long enough to outlast the measurement.
LIVE_OVERRIDES = (
    "agent=heuristic",
    "safeguards.max_cycles=40",
    "safeguards.campaign_time_s=3600",
    "safeguards.replicates=0",
    "safeguards.plateau_cycles=40",  # a plateau would end it mid-measurement
    "search.num_samples=4",
    "search.max_concurrent=1",
    "population.parents=1",
    "population.children_per_parent=2",
    "population.trials_per_child=1",
)
CAMPAIGNS, CYCLES = 50, 10  # 500 cycles; trials per cycle = trials / 500 (20 for 10,000)
PARENTS, CHILDREN = 2, 5
EPOCHS = 10
INTERVENTIONS = (
    "lower_lr",
    "raise_lr",
    "cosine_lr_schedule",
    "lr_warmup",
    "adamw_optimizer",
    "weight_decay",
    "dropout",
    "label_smoothing",
    "augmentation",
    "batchnorm",
    "widen",
    "deepen",
    "longer_training",
    "ema_weights",
    "gradient_clipping",
)
DIAGNOSES = ("underfitting", "overfitting", "plateau", "undertrained", "healthy")
DIFF = """--- a/train.py
+++ b/train.py
@@ -18,7 +18,7 @@
 # knobs
-LR = {old}  # learning rate
+LR = {new}  # learning rate
 BATCH_SIZE = 64  # examples per step
 WIDTH = 16  # channels of the first conv
 EPOCHS = 10  # passes over the training data
"""


class Writer:
    """Sends rows to the real KB writer: one part per trial (as campaigns do today) or one per table and cycle."""

    def __init__(self, kb: KnowledgeBase, compact: bool) -> None:
        self.kb, self.compact, self.pending = kb, compact, {}

    def trial(self, tag: str, trial: dict[str, Any], epochs: list[dict[str, Any]]) -> None:
        if self.compact:
            self.pending.setdefault("epochs", []).extend(epochs)
            self.pending.setdefault("trials", []).append(trial)
        else:
            self.kb.append("epochs", epochs, tag)
            self.kb.append("trials", [trial], tag)

    def run_row(self, tag: str, row: dict[str, Any]) -> None:
        if self.compact:
            self.pending["runs"] = [row]  # the newest row is what the view keeps
        else:
            self.kb.append("runs", [row], tag)

    def flush(self, tag: str) -> None:
        for table, rows in self.pending.items():
            self.kb.put(table, rows, f"{tag}-{table}")
        self.pending = {}


def run_name(campaign: int) -> str:
    """The run id of the n-th campaign (later ones start later: the last is the newest)."""
    return f"2026{campaign:04d}-bench"


def build(root: Path, trials: int, compact: bool, seed: int = 0) -> dict[str, int]:
    """A KB of `trials` trials over CAMPAIGNS x CYCLES cycles with realistic rows; returns the part counts."""
    rng = random.Random(seed)
    kb = KnowledgeBase(root)
    kb.init()
    writer = Writer(kb, compact)
    per_cycle = max(1, trials // (CAMPAIGNS * CYCLES))
    clock = now() - timedelta(days=30)
    for c in range(CAMPAIGNS):
        run_id = run_name(c)
        config = {
            "experiment": "digits",
            "task": {"name": "digits"},
            "target": {"selection_score": 0.99},
            "safeguards": {
                "max_cycles": CYCLES,
                "campaign_time_s": 3600,
                "tokens_per_campaign": 200_000,
                "cost_per_campaign": 5.0,
            },
            "population": {"parents": PARENTS, "children_per_parent": CHILDREN},
        }
        run = {
            "run_id": run_id,
            "experiment": "digits",
            "task": "digits",
            "run_dir": str(root.parent / "runs" / run_id),
            "config": json.dumps(config),
            "started_at": clock,
        }
        seed_id = f"{rng.getrandbits(48):012x}"
        scores = {seed_id: 0.90 + rng.random() * 0.03}
        variants = [
            {
                "run_id": run_id,
                "variant_id": seed_id,
                "parent_id": None,
                "cycle": 1,
                "status": "seed",
                "interventions": "[]",
                "diagnosis": "healthy",
                "rationale": "the seed trainer",
                "files_dir": f"/gone/{seed_id}/files",
                "diff": "",
            }
        ]
        elapsed = 0.0
        for cycle in range(1, CYCLES + 1):
            tag = f"{run_id}-c{cycle:04d}"
            parents = [seed_id] if cycle == 1 else sorted(scores, key=scores.get, reverse=True)[:PARENTS]
            children = []
            for parent in parents if cycle > 1 else []:
                for _ in range(CHILDREN):
                    vid, name = f"{rng.getrandbits(48):012x}", rng.choice(INTERVENTIONS)
                    rejected = rng.random() < 0.1
                    children.append(
                        {
                            "run_id": run_id,
                            "variant_id": vid,
                            "parent_id": parent,
                            "cycle": cycle,
                            "status": "rejected" if rejected else "candidate",
                            "interventions": json.dumps([name]),
                            "diagnosis": rng.choice(DIAGNOSES),
                            "parent_score": scores[parent],
                            "backend": "heuristic",
                            "rationale": f"{name}: the parent's curves suggest it "
                            f"(measured effect so far +0.00{rng.randint(1, 9)})",
                            "reason": "gate: smoke run failed" if rejected else None,
                            "files_dir": f"/gone/{vid}/files",
                            "diff": DIFF.format(old=0.05, new=round(0.05 * rng.choice((0.5, 2.0)), 4)),
                        }
                    )
            runnable = [v["variant_id"] for v in children if v["status"] == "candidate"] or parents
            for phase in ("analyse", "write", "train", "record", "decide", "select"):
                writer.run_row(tag, {**run, "status": "running", "cycle": cycle, "phase": phase})
            kb.put("variants", children + (variants if cycle == 1 else []), f"{tag}-write")
            for t in range(per_cycle):
                vid = runnable[t % len(runnable)]
                base = scores.get(vid) or scores[parents[0]]
                status = rng.choices(("completed", "stopped_early", "failed"), (0.45, 0.5, 0.05))[0]
                n = EPOCHS if status == "completed" else rng.randint(1, EPOCHS // 2)
                score = min(0.999, base + rng.gauss(0.002, 0.01)) if status == "completed" else None
                trial_id = f"{rng.getrandbits(32):08x}"
                clock += timedelta(seconds=rng.uniform(2, 10))
                epochs = [
                    {"run_id": run_id, "trial_id": trial_id, "epoch": e, "metric": m, "value": v}
                    for e in range(1, n + 1)
                    for m, v in (
                        ("val_acc", base * (1 - 0.5**e)),
                        ("val_loss", 2.3 * 0.7**e),
                        ("train_loss", 2.3 * 0.65**e),
                        ("lr", 0.05),
                        ("grad_norm", 1 + rng.random()),
                        ("epoch_seconds", 0.2 + rng.random() / 10),
                    )
                ]
                writer.trial(
                    f"{tag}-{trial_id}",
                    {
                        "run_id": run_id,
                        "cycle": cycle,
                        "trial_id": trial_id,
                        "variant_id": vid,
                        "status": status,
                        "reason": "nan loss" if status == "failed" else None,
                        "seed": t,
                        "knobs": json.dumps(
                            {"LR": round(rng.uniform(0.003, 0.3), 5), "BATCH_SIZE": rng.choice((32, 64, 128))}
                        ),
                        "epochs": n,
                        "val_metric": base,
                        "selection_score": score,
                        "test_score": None if score is None else score - 0.01,
                        "seconds": n * 0.3,
                        "work_dir": f"/gone/{trial_id}",
                        "written_at": clock,
                    },
                    epochs,
                )
                if score is not None:
                    scores[vid] = max(scores.get(vid, 0.0), score)
            for child in children:
                if child["status"] == "candidate":
                    got = scores.get(child["variant_id"])
                    child["selection_score"] = got
                    child["status"] = "kept" if got is not None and got > child["parent_score"] + 0.002 else "discarded"
            kb.put("variants", children, f"{tag}-record")
            kb.put(
                "interventions",
                [
                    {
                        "run_id": run_id,
                        "task": "digits",
                        "cycle": cycle,
                        "variant_id": v["variant_id"],
                        "parent_id": v["parent_id"],
                        "intervention": json.loads(v["interventions"])[0],
                        "diagnosis": v["diagnosis"],
                        "parent_score": v["parent_score"],
                        "child_score": v.get("selection_score"),
                        "delta": None if v.get("selection_score") is None else v["selection_score"] - v["parent_score"],
                        "outcome": v["status"],
                    }
                    for v in children
                ],
                tag,
            )
            kb.put(
                "agent_usage",
                [
                    {
                        "run_id": run_id,
                        "cycle": cycle,
                        "role": "coder",
                        "backend": "heuristic",
                        "variant_id": v["variant_id"],
                        "calls": 1,
                        "tokens_in": 0,
                        "tokens_out": 0,
                        "seconds": 0.01,
                        "cost": 0.0,
                        "estimated": False,
                    }
                    for v in children
                ],
                tag,
            )
            best = max(scores.values())
            kb.put(
                "cycles",
                [
                    {
                        "run_id": run_id,
                        "cycle": cycle,
                        "trials": per_cycle,
                        "best_selection_score": best,
                        "phase": "decide",
                        "children": len(children),
                        "rejected": sum(v["status"] == "rejected" for v in children),
                    }
                ],
                tag,
            )
            elapsed += per_cycle * 3.0
            last = cycle == CYCLES
            kb.put(
                "decisions",
                [
                    {
                        "run_id": run_id,
                        "cycle": cycle,
                        "decision": "stop" if last else "continue",
                        "reason": "max_cycles" if last else "none",
                        "exit_code": 0,
                        "best_selection_score": best,
                        "rationale": f"cycle {cycle} of safeguards.max_cycles={CYCLES}" if last else "continue",
                        "elapsed_s": elapsed,
                        "tokens": 0,
                        "cost": 0.0,
                    }
                ],
                tag,
            )
            writer.flush(tag)
        kb.append("runs", [{**run, "status": "finished", "stop_reason": "max_cycles", "finished_at": clock}], run_id)
    return part_counts(root)


def part_counts(root: Path) -> dict[str, int]:
    """Parquet files per table (the `_schema` file compact_kb adds counted too: the views open it)."""
    return {
        table: len(list((root / "parquet" / table).glob("*.parquet")))
        for table in ("runs", "variants", "trials", "epochs")
    }


def fold_finished(root: Path) -> float:
    """Each finished campaign's parts folded into one per table (`compact_run`, as campaign.py does at the end).

    compact_run's own call of compact_kb (after COMPACT_KB_AFTER runs) is held off: the layout before `kb compact`.
    Returns seconds.
    """
    kb, held = KnowledgeBase(root), kbmod.COMPACT_KB_AFTER
    kbmod.COMPACT_KB_AFTER = 10**9
    start = time.perf_counter()
    try:
        for c in range(CAMPAIGNS):
            kb.compact_run(run_name(c))
    finally:
        kbmod.COMPACT_KB_AFTER = held
    return time.perf_counter() - start


def compact_all(root: Path) -> float:
    """`KnowledgeBase.compact_kb()` (what `python -m ralph_ray kb compact` runs); returns seconds."""
    kb = KnowledgeBase(root)
    kb.compact_grace_s = 0.0  # no reader runs beside it here: the grace is idle time, not work
    start = time.perf_counter()
    kb.compact_kb()
    return time.perf_counter() - start


def time_pages(kb_root: Path) -> dict[str, dict[str, float]]:
    """Seconds of the first run of each page (all caches cleared) and of a live refresh after a new trial."""
    import streamlit as st
    from streamlit.testing.v1 import AppTest

    kb = KnowledgeBase(kb_root)
    run_id = run_name(CAMPAIGNS - 1)  # the newest: the one the app opens on
    out = {}
    for n, page in enumerate(PAGES):
        st.cache_data.clear()
        st.cache_resource.clear()
        at = AppTest.from_file(str(ENTRY), default_timeout=300).switch_page(page)
        at.session_state["kb_root"] = str(kb_root)
        start = time.perf_counter()
        at.run()
        first = time.perf_counter() - start
        if at.exception:
            raise RuntimeError(f"{page}: {at.exception[0].value}")
        trial_id = f"live{n:04d}"
        kb.append(
            "epochs",
            [{"run_id": run_id, "trial_id": trial_id, "epoch": 1, "metric": "val_acc", "value": 0.5}],
            f"{run_id}-{trial_id}",
        )
        kb.append(
            "trials",
            [
                {
                    "run_id": run_id,
                    "cycle": CYCLES,
                    "trial_id": trial_id,
                    "variant_id": "live",
                    "status": "stopped_early",
                    "epochs": 1,
                    "seconds": 0.3,
                }
            ],
            f"{run_id}-{trial_id}",
        )
        time.sleep(1.1)  # past the snapshot's look-again interval, as between two live refreshes
        st.cache_data.clear()  # the query cache's TTL has run out
        start = time.perf_counter()
        at.run()
        out[page] = {"first_s": round(first, 3), "refresh_s": round(time.perf_counter() - start, 3)}
        print(
            f"  {page:24s} first {first:6.2f} s ({first / GOAL_S:.2f} x goal)  live refresh "
            f"{out[page]['refresh_s']:.2f} s",
            flush=True,
        )
    return out


SAME_SERVER = "bare"  # the bare page in the app's own navigation (SAME_SERVER_ENTRY), at /bare


def url_path(page: str) -> str:
    """The page's URL path under the app (st.navigation names it after its file; the default page is `/`)."""
    return "" if page in ("", "views/board.py") else Path(page).stem


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def served(script: Path, log: Path, *args: str) -> Iterator[str]:
    """`streamlit run script` on a free loopback port with the app's own flags; yields its URL."""
    port = free_port()
    flags = ["--server.headless", "true", "--server.port", str(port), "--server.address", "127.0.0.1"]
    flags += ["--browser.gatherUsageStats", "false", "--client.toolbarMode", "viewer"]
    with log.open("w") as out:
        server = subprocess.Popen(
            [sys.executable, "-m", "streamlit", "run", str(script), *flags, "--", *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            yield f"http://127.0.0.1:{port}"
        finally:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(timeout=30)


def time_to_content(browser: Any, url: str, selector: str, timeout_s: float = 180) -> float:
    """Seconds from navigating a fresh browser context (no cache) to `selector` being visible."""
    context = browser.new_context(viewport={"width": 1440, "height": 900})
    page = context.new_page()
    try:
        start = time.perf_counter()
        page.goto(url, wait_until="commit", timeout=timeout_s * 1000)
        page.locator(selector).first.wait_for(state="visible", timeout=timeout_s * 1000)
        return time.perf_counter() - start
    finally:
        context.close()


def wait_until_up(url: str, wait_s: float = 60) -> None:
    """Until the server answers its health check."""
    import urllib.request

    deadline = time.monotonic() + wait_s
    while True:
        try:
            with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.3)


def browser_pages(kb_root: Path, work: Path, rounds: int) -> dict[str, Any]:
    """Time to content of the bare page and of every app page over `kb_root`, `rounds` times each, interleaved."""
    from playwright.sync_api import sync_playwright

    bare = work / "bare" / "bare.py"
    bare.parent.mkdir(parents=True, exist_ok=True)
    bare.write_text(BARE_PAGE)
    entry = work / "bench_entry" / "leaderboard_bench.py"
    entry.parent.mkdir(parents=True, exist_ok=True)
    entry.write_text(SAME_SERVER_ENTRY.format(app=str(ENTRY.parent)))
    # "": the bare page on its own server (the earlier figures' baseline); SAME_SERVER: the bare page of the app's.
    times: dict[str, list[float]] = {"": [], SAME_SERVER: [], **{page: [] for page in PAGES}}
    with (
        served(bare, work / "bare.log") as bare_url,
        served(entry, work / "app.log", "--kb", str(kb_root)) as app_url,
        sync_playwright() as pw,
    ):
        wait_until_up(bare_url)
        wait_until_up(app_url)
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            for n in range(rounds):
                for page in times:  # the bare page first in every round: the pages are measured around it
                    url = f"{bare_url}/" if page == "" else f"{app_url}/{url_path(page)}"
                    selector = CONTENT["" if page == SAME_SERVER else page]
                    seconds = time_to_content(browser, url, selector)
                    times[page].append(round(seconds, 3))
                    print(f"  round {n + 1} {page or 'bare page':24s} {seconds:6.2f} s", flush=True)
        finally:
            browser.close()
    # The baseline: the bare page served by the app's own server (the separate server's kept beside it).
    bare_first, bare_median = times[SAME_SERVER][0], statistics.median(times[SAME_SERVER])
    pages = {
        page: {
            "seconds": got,
            "first_s": got[0],
            "median_s": statistics.median(got),
            "ratio_first": round(got[0] / bare_first, 2),
            "ratio_median": round(statistics.median(got) / bare_median, 2),
        }
        for page, got in times.items()
        if page not in ("", SAME_SERVER)
    }
    separate = times[""]
    return {
        "bare": {"seconds": times[SAME_SERVER], "first_s": bare_first, "median_s": bare_median, "server": "same"},
        "bare_separate_server": {
            "seconds": separate,
            "first_s": separate[0],
            "median_s": statistics.median(separate),
            "ratio_median": round(statistics.median(separate) / bare_median, 2),
        },
        "pages": pages,
        "worst_ratio_median": max(p["ratio_median"] for p in pages.values()),
        "worst_ratio_first": max(p["ratio_first"] for p in pages.values()),
    }


@contextmanager
def live_campaign(root: Path, min_trials: int = 6, wait_s: float = 1200) -> Iterator[tuple[Path, str]]:
    """A real digits campaign running in the background; yields its KB once every page has something to draw.

    That is `min_trials` trials and a recorded cycle of children (an intervention's measured effect): before it,
    the Knobs and Interventions pages show only why they are empty, and their charts never come.
    """
    kb_root, run_id = root / "kb", "live-bench"
    overrides = [f"paths.runs={root / 'runs'}", f"paths.kb={kb_root}", f"run_id={run_id}", *LIVE_OVERRIDES]
    root.mkdir(parents=True, exist_ok=True)
    with (root / "campaign.log").open("w") as out:
        campaign = subprocess.Popen(
            [sys.executable, "-m", "ralph_ray", *overrides],
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            deadline = time.monotonic() + wait_s
            while _trials(kb_root, run_id) < min_trials or _count(kb_root, sql.INTERVENTIONS_FOR_RUN, run_id) < 1:
                if campaign.poll() is not None:
                    raise RuntimeError(
                        f"the live campaign ended early (exit {campaign.returncode}): {root}/campaign.log"
                    )
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the live campaign recorded < {min_trials} trials in {wait_s} s")
                time.sleep(5)
            yield kb_root, run_id
        finally:
            still_running = campaign.poll() is None
            os.killpg(campaign.pid, signal.SIGTERM)
            try:
                campaign.wait(timeout=120)
            except subprocess.TimeoutExpired:
                os.killpg(campaign.pid, signal.SIGKILL)
                campaign.wait()
            if not still_running:
                raise RuntimeError(f"the live campaign ended during the measurement: {root}/campaign.log")


def _previous_live() -> dict[str, Any] | None:
    """The live-KB figures of the last recorded run (bench/results/app_render.json), marked with its date."""
    path = ROOT / "bench" / "results" / "app_render.json"
    try:
        old = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    live = old.get("kbs", {}).get("live")
    if live is None:
        return None
    return {
        **live,
        "carried_from": live.get("carried_from") or f"the run of {old.get('date')} (`{old.get('command')}`)",
    }


def _trials(kb_root: Path, run_id: str) -> int:
    return _count(kb_root, sql.BENCH_TRIAL_ENDS, run_id)


def _count(kb_root: Path, query: str, run_id: str) -> int:
    """Rows of a query over the KB (0 while there is no KB yet)."""
    try:
        return len(open_reader(kb_root).execute(query, [run_id]).fetchall())
    except (FileNotFoundError, duckdb.Error):
        return 0  # no KB yet, or its first parts are being written


def browser_main(args: argparse.Namespace, root: Path) -> None:
    """Both KBs in the browser; writes bench/results/app_render.{json,md}."""
    figures: dict[str, Any] = {
        "mode": "browser",
        "trials": args.trials,
        "rounds": args.rounds,
        "goal_ratio": GOAL_RATIO,
        "streamlit": version("streamlit"),
        "playwright": version("playwright"),
        "chromium": subprocess.run([str(CHROMIUM), "--version"], capture_output=True, text=True).stdout.strip(),
        "load_average_before": [round(x, 2) for x in os.getloadavg()],
        "kbs": {},
    }
    if args.skip_live:
        previous = _previous_live()
        if previous is not None:
            figures["kbs"]["live"] = previous
    else:
        with live_campaign(root / "live") as (kb_root, run_id):
            trials = _trials(kb_root, run_id)
            print(f"live: campaign {run_id} running, {trials} trials recorded; measuring", flush=True)
            figures["kbs"]["live"] = {"trials_at_start": trials, **browser_pages(kb_root, root / "live", args.rounds)}
            figures["kbs"]["live"]["trials_at_end"] = _trials(kb_root, run_id)
    kb_root = root / "big" / "kb"
    start = time.perf_counter()
    parts = build(kb_root, args.trials, compact=True)
    print(f"big: built in {time.perf_counter() - start:.1f} s, parts {parts}", flush=True)
    if not args.kb_compact:
        figures["kbs"]["big"] = {"parts": parts, **browser_pages(kb_root, root / "big", args.rounds)}
    else:
        steps = (
            ("big_cycle_parts", lambda _root: 0.0, "no_step_s"),  # the layout of the earlier figures
            ("big_folded", fold_finished, "fold_s"),
            ("big_kb_compact", compact_all, "compact_kb_s"),
        )
        for name, step, key in steps:
            seconds = step(kb_root)
            parts = part_counts(kb_root)
            print(f"{name}: {key} {seconds:.1f} s, parts {parts}; load {os.getloadavg()[0]:.2f}", flush=True)
            figures["kbs"][name] = {
                "parts": parts,
                key: round(seconds, 2),
                "load_average_before": [round(x, 2) for x in os.getloadavg()],
                **browser_pages(kb_root, root / name, args.rounds),
            }
    figures["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    lines = [
        f"# time to content in Chromium, each page against a bare Streamlit page in the same run; goal: every page "
        f"within {GOAL_RATIO}x of the bare page",
        "",
        f"{figures['chromium']}, Playwright {figures['playwright']}, Streamlit {figures['streamlit']}; a fresh browser "
        f"context per visit (no HTTP cache); {args.rounds} rounds, pages interleaved with the bare page.",
        "",
        f"load average (1, 5, 15 min) before {figures['load_average_before']}, after {figures['load_average_after']}: "
        "**the machine was busy** (2 cores shared with other sessions' tests and campaigns), so the seconds are "
        "inflated and noisy; the ratios to the bare page, measured in the same minutes, are the figure to read.",
        "",
    ]
    big = f"{args.trials:,}-trial KB ({CAMPAIGNS} campaigns x {CYCLES} cycles"
    titles = {
        "big": f"{big}, compacted per cycle; parts {figures['kbs'].get('big', {}).get('parts')})",
        "big_cycle_parts": f"{big}) in cycle parts (one part per table and cycle: the layout of the earlier "
        "figures, before campaigns folded their parts at the end)",
        "big_folded": f"{big}) as campaigns leave it: each finished campaign's cycle parts folded into one part per "
        "table (`compact_run`, campaign.py's end; no `kb compact` yet)",
        "big_kb_compact": f"{big}) after `kb compact` (`KnowledgeBase.compact_kb()`: one sorted `_kb-*` file per "
        "table), the same KB, a fresh server",
    }
    for name, data in figures["kbs"].items():
        if name == "live":
            title = (
                "live KB: a real digits campaign (offline agent) running during the measurement "
                f"({data['trials_at_start']} -> {data['trials_at_end']} trials)"
            )
            if data.get("carried_from"):
                title += f"; **not re-measured in this run (`--skip-live`): the figures of {data['carried_from']}**"
        else:
            title = titles[name]
        bare = data["bare"]
        lines += [f"## {title}", ""]
        if name.startswith("big_"):
            if "fold_s" in data:
                step = f"`compact_run` x {CAMPAIGNS}: {data['fold_s']:.1f} s"
            elif "compact_kb_s" in data:
                step = f"`compact_kb`: {data['compact_kb_s']:.1f} s"
            else:
                step = "as built"
            lines += [
                f"parts {data['parts']}; {step}; load average at the start {data['load_average_before']}",
                "",
            ]
        # Records from before the same-server baseline (a carried live figure) timed the bare page on its own server.
        where = "the app's own server" if bare.get("server") == "same" else "a server of its own"
        lines += [
            "| page | first visit s | median s | first / bare first | median / bare median |",
            "| --- | --- | --- | --- | --- |",
            f"| bare Streamlit page, {where} (the baseline) | {bare['first_s']:.2f} | "
            f"{bare['median_s']:.2f} | 1.00 | 1.00 |",
        ]
        if "bare_separate_server" in data:
            other = data["bare_separate_server"]
            lines.append(
                f"| bare Streamlit page, a server of its own | {other['first_s']:.2f} | {other['median_s']:.2f} | "
                f"{other['first_s'] / bare['first_s']:.2f} | {other['ratio_median']:.2f} |"
            )
        lines += [
            f"| {page} | {p['first_s']:.2f} | {p['median_s']:.2f} | {p['ratio_first']:.2f} | {p['ratio_median']:.2f} |"
            for page, p in data["pages"].items()
        ]
        met = "met" if data["worst_ratio_median"] <= GOAL_RATIO else "NOT met"
        worst = max(data["pages"], key=lambda page: data["pages"][page]["ratio_median"])
        lines += [
            "",
            f"worst page: **{data['worst_ratio_median']:.2f}x** the bare page (median; {worst}), "
            f"{data['worst_ratio_first']:.2f}x on first visits; goal {GOAL_RATIO}x: {met}",
            "",
        ]
    save("app_render", figures, lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3, help="browser: visits per page")
    parser.add_argument("--apptest", action="store_true", help="the in-process AppTest figures instead (no browser)")
    parser.add_argument("--keep", type=Path, help="build the KBs here and keep them (default: a temp dir, removed)")
    parser.add_argument(
        "--kb-compact", action="store_true", help="browser: the 10k KB as campaigns leave it, then after kb compact"
    )
    parser.add_argument(
        "--skip-live", action="store_true", help="browser: no live campaign (the last live figure is kept)"
    )
    args = parser.parse_args()
    root = args.keep or Path(tempfile.mkdtemp(prefix="app_render-"))
    if not args.apptest:
        try:
            browser_main(args, root)
        finally:
            if args.keep is None:
                shutil.rmtree(root, ignore_errors=True)
        return
    figures: dict[str, Any] = {
        "trials": args.trials,
        "goal_s": GOAL_S,
        "streamlit": version("streamlit"),
        "load_average_before": [round(x, 2) for x in os.getloadavg()],
        "layouts": {},
    }
    try:
        for layout, compact in (("per_trial_parts", False), ("compacted_per_cycle", True)):
            kb_root = root / layout / "kb"
            start = time.perf_counter()
            parts = build(kb_root, args.trials, compact)
            print(f"{layout}: built in {time.perf_counter() - start:.1f} s, parts {parts}", flush=True)
            pages = time_pages(kb_root)
            worst = max(p["first_s"] for p in pages.values())
            figures["layouts"][layout] = {
                "parts": parts,
                "pages": pages,
                "worst_first_s": worst,
                "ratio_to_goal": round(worst / GOAL_S, 2),
            }
    finally:
        if args.keep is None:
            shutil.rmtree(root, ignore_errors=True)
    figures["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    lines = [
        f"# first render of each app page, KB of {args.trials:,} trials ({CAMPAIGNS} campaigns x {CYCLES} cycles, "
        f"~{EPOCHS} epochs per completed trial); goal <= {GOAL_S} s",
        "",
        f"load average (1, 5, 15 min) before {figures['load_average_before']}, after {figures['load_average_after']} "
        "(2 cores: other work on the machine slows every figure)",
        "",
    ]
    for layout, data in figures["layouts"].items():
        lines += [
            f"## {layout} (parts: {data['parts']})",
            "",
            "| page | first render s | ratio to goal | live refresh s |",
            "| --- | --- | --- | --- |",
        ]
        lines += [
            f"| {page} | {p['first_s']:.2f} | {p['first_s'] / GOAL_S:.2f} | {p['refresh_s']:.2f} |"
            for page, p in data["pages"].items()
        ]
        lines += [
            "",
            f"worst first render: **{data['worst_first_s']:.2f} s** ({data['ratio_to_goal']:.2f} x the goal)",
            "",
        ]
    save("app_render", figures, lines)


if __name__ == "__main__":
    main()
