"""What every page shares (app/shell.py): the background imports that keep a later page's first visit fast."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from app_support import ENTRY, kb_with_run


def test_the_first_page_starts_loading_the_other_pages_imports_once_per_server(tmp_path: Path):
    # A fresh interpreter, as a server starts: the Leaderboard page renders (twice), and what only the Knobs page
    # (Optuna's importance) and the intervals (scipy's t) need gets imported by the warm-up thread, which nothing
    # else in the script imports. The thread is cached once per process: asked again, it is the same one.
    kb_root = kb_with_run(tmp_path, "finished", stop_reason="max_cycles")
    script = textwrap.dedent(f"""
        import json, sys, time
        from streamlit.testing.v1 import AppTest
        later = ("optuna.importance", "scipy.stats")
        before = [name in sys.modules for name in later]
        at = AppTest.from_file({str(ENTRY)!r}, default_timeout=60)
        at.session_state["kb_root"] = {str(kb_root)!r}
        at.run()
        assert not at.exception, at.exception
        at.run()
        deadline = time.monotonic() + 120
        while not all(n in sys.modules for n in later) and time.monotonic() < deadline:
            time.sleep(0.05)
        after = [n in sys.modules for n in later]
        import shell  # the app's own module, as the page loaded it (leaderboard.py put app/ on sys.path)
        thread = shell.warm_imports()
        thread.join(120)
        print(json.dumps({{"before": before, "after": after, "name": thread.name, "alive": thread.is_alive(),
                           "same": thread is shell.warm_imports()}}))
    """)
    out = subprocess.run([sys.executable, "-c", script], check=False, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["before"] == [False, False]  # nothing had loaded them: the test can see the warm-up's work
    assert seen["after"] == [True, True]
    assert seen["name"] == "ralph-app-warm-imports" and not seen["alive"] and seen["same"]
