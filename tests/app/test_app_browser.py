"""Real-browser checks: `streamlit run` serves the app; headless Chromium renders its rows and clicks the lineage.

Needs Debian's Chromium (`apt-get install -y chromium`) and `playwright` from PyPI; Playwright's own browser
download (`playwright install`) is never used. RALPH_SCREENSHOT=1 saves the picture as docs/leaderboard.png (the
README's); otherwise it goes to the test's tmp dir, so a test run leaves the checkout clean.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from app_support import ENTRY, Tiny, tiny_fixture  # noqa: F401 (the `tiny` fixture)
from playwright.sync_api import Error as PlaywrightError
from playwright.sync_api import Page, sync_playwright
from procs import CHROMIUM, CHROMIUM_ARGS, free_port

from ralph_ray import PROJECT_ROOT, sql
from ralph_ray.kb import open_reader

README_PICTURE = PROJECT_ROOT / "docs" / "leaderboard.png"


@contextmanager
def served(kb_root: Path, log_path: Path) -> Iterator[str]:
    """`streamlit run` of the app over `kb_root` on a free loopback port; yields its base URL."""
    port = free_port()
    with log_path.open("w") as log:
        server = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "streamlit",
                "run",
                str(ENTRY),
                "--server.headless",
                "true",
                "--server.port",
                str(port),
                "--server.address",
                "127.0.0.1",
                "--browser.gatherUsageStats",
                "false",
                "--",
                "--kb",
                str(kb_root),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            yield f"http://127.0.0.1:{port}"
        finally:
            server.terminate()
            server.wait(timeout=10)


def open_when_up(page: Page, url: str, wait_s: float = 30) -> None:
    """Go to `url`, retrying while the server starts listening."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            page.goto(url)
            return
        except PlaywrightError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


@pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian's Chromium is not installed: apt-get install -y chromium")
def test_the_leaderboard_renders_in_a_real_browser(tiny: Tiny, tmp_path: Path):
    best = open_reader(tiny.kb_root).execute(sql.APP_LEADERBOARD, [tiny.run_id]).fetchall()[0][1]
    picture = README_PICTURE if os.environ.get("RALPH_SCREENSHOT") == "1" else tmp_path / "leaderboard.png"
    with served(tiny.kb_root, tmp_path / "streamlit.log") as url, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        open_when_up(page, f"{url}/")
        table = page.locator('[data-testid="stDataFrame"]')
        table.wait_for(timeout=30_000)
        # The grid draws its cells on a canvas; its (visually hidden) accessible table carries their texts.
        table.locator('td[role="gridcell"]', has_text=best).first.wait_for(state="attached", timeout=30_000)
        assert table.locator("canvas").first.is_visible()
        assert page.get_by_text("Leaderboard", exact=True).first.is_visible()
        page.wait_for_timeout(500)  # let the chart settle for the picture
        picture.parent.mkdir(exist_ok=True)
        page.screenshot(path=str(picture), full_page=True)
        browser.close()
    assert picture.stat().st_size > 10_000


@pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian's Chromium is not installed: apt-get install -y chromium")
def test_clicking_a_lineage_node_opens_that_variant(tiny: Tiny, tmp_path: Path):
    reader = open_reader(tiny.kb_root)
    best = reader.execute(sql.APP_LEADERBOARD, [tiny.run_id]).fetchall()[0][1]
    cursor = reader.execute(sql.APP_LINEAGE, [tiny.run_id])
    lineage = [dict(zip([d[0] for d in cursor.description], row)) for row in cursor.fetchall()]
    best_parent = next(v["parent_id"] for v in lineage if v["variant_id"] == best)
    # Neither the best (the story the page opens on) nor its parent (named in that story): only a click shows it.
    target = next(v["variant_id"] for v in lineage if v["variant_id"] not in (best, best_parent))
    with served(tiny.kb_root, tmp_path / "streamlit.log") as url, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        open_when_up(page, f"{url}/lineage?run_id={tiny.run_id}")
        story = page.locator('[data-testid="stTable"]')
        story.get_by_text(best, exact=True).wait_for(timeout=30_000)
        assert story.get_by_text(target, exact=True).count() == 0
        node = page.locator(f'[aria-label="variant {target}"]')  # an SVG mark (the chart is drawn as SVG)
        node.wait_for(timeout=30_000)
        # No two nodes drawn over each other (user trial: two siblings of one generation were, 25 px apart)
        boxes = [page.locator(f'[aria-label="variant {v["variant_id"]}"]').bounding_box() for v in lineage]
        centres = [(b["x"] + b["width"] / 2, b["y"] + b["height"] / 2) for b in boxes if b]
        assert len(centres) == len(lineage) >= 3
        assert min(abs(a[0] - b[0]) + abs(a[1] - b[1]) for i, a in enumerate(centres) for b in centres[:i]) > 60
        node.click()
        story.get_by_text(target, exact=True).wait_for(timeout=30_000)  # the clicked variant's story
        assert story.locator("tbody tr").first.inner_text().split() == ["variant", target]
        browser.close()
