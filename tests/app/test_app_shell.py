"""What every page shares (app/shell.py): the background imports that keep a later page's first visit fast."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from app_support import ENTRY, kb_with_run


def test_the_first_page_starts_loading_the_other_pages_imports_once_per_server(tmp_path: Path):
    # A fresh interpreter, as a server starts: the Leaderboard page renders, then one daemon thread imports what
    # only the Knobs page (Optuna's importance) and the intervals (scipy's t) need; a second render starts no other.
    kb_root = kb_with_run(tmp_path, "finished", stop_reason="max_cycles")
    script = textwrap.dedent(f"""
        import json, sys, threading
        from streamlit.testing.v1 import AppTest
        later = ("optuna.importance", "scipy.stats")
        before = [name in sys.modules for name in later]
        at = AppTest.from_file({str(ENTRY)!r}, default_timeout=60)
        at.session_state["kb_root"] = {str(kb_root)!r}
        at.run()
        assert not at.exception, at.exception
        at.run()
        warmers = [t for t in threading.enumerate() if t.name == "ralph-app-warm-imports"]
        for thread in warmers:
            thread.join(120)
        print(json.dumps({{"before": before, "after": [n in sys.modules for n in later], "threads": len(warmers),
                           "alive": any(t.is_alive() for t in warmers)}}))
    """)
    out = subprocess.run([sys.executable, "-c", script], check=False, capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-2000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["before"] == [False, False]  # nothing had loaded them: the test can see the warm-up's work
    assert seen["threads"] == 1 and not seen["alive"]
    assert seen["after"] == [True, True]
