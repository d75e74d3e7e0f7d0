"""One real-browser check: `streamlit run` serves the leaderboard, headless Chromium renders its rows.

Needs Debian's Chromium (`apt-get install -y chromium`) and `playwright` from PyPI; Playwright's own browser
download (`playwright install`) is never used. Saves docs/leaderboard.png (the README's picture).
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from app_support import ENTRY, Tiny, tiny_fixture  # noqa: F401 (the `tiny` fixture)

from ralph_ray import PROJECT_ROOT, sql
from ralph_ray.kb import open_reader

CHROMIUM = Path("/usr/bin/chromium")
SCREENSHOT = PROJECT_ROOT / "docs" / "leaderboard.png"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian's Chromium is not installed: apt-get install -y chromium")
def test_the_leaderboard_renders_in_a_real_browser(tiny: Tiny, tmp_path: Path):
    from playwright.sync_api import sync_playwright

    port = free_port()
    log = (tmp_path / "streamlit.log").open("w")
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
            str(tiny.kb_root),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    best = open_reader(tiny.kb_root).execute(sql.APP_LEADERBOARD, [tiny.run_id]).fetchall()[0][1]
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            deadline = time.monotonic() + 30
            while True:  # the server takes a moment to listen
                try:
                    page.goto(f"http://127.0.0.1:{port}/")
                    break
                except Exception:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)
            table = page.locator('[data-testid="stDataFrame"]')
            table.wait_for(timeout=30_000)
            # The grid draws its cells on a canvas; its (visually hidden) accessible table carries their texts.
            table.locator('td[role="gridcell"]', has_text=best).first.wait_for(state="attached", timeout=30_000)
            assert table.locator("canvas").first.is_visible()
            assert page.get_by_text("Leaderboard", exact=True).first.is_visible()
            page.wait_for_timeout(500)  # let the chart settle for the picture
            SCREENSHOT.parent.mkdir(exist_ok=True)
            page.screenshot(path=str(SCREENSHOT), full_page=True)
            browser.close()
    finally:
        server.terminate()
        server.wait(timeout=10)
        log.close()
    assert SCREENSHOT.stat().st_size > 10_000
