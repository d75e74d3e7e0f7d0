"""SIGTERM ends a campaign as Ctrl-C does, even where its Terminated was swallowed (the CLI's end-to-end: test_cli)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

# The handler runs inside a finalizer: Python prints "Exception ignored" and goes on, as a campaign trained on to its
# end. The run's stoppers (Tune calls stop_all on every step, in the driver's main thread) raise it again, once.
SWALLOWED = """
import os, signal, sys
from ralph_ray import sigterm
from ralph_ray.search import StopRequest

sigterm.install()


class Finalized:
    def __del__(self):
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(1000):  # the handler runs here, inside the finalizer
            pass


Finalized()
print("went on", flush=True)
stopper = StopRequest(sys.argv[1], None)
try:
    stopper.stop_all()
except sigterm.Terminated:
    print("terminated", flush=True)
print("again:", stopper.stop_all())
sigterm.install()
Finalized()  # swallowed again, then the CLI's main ends (restore): a later campaign in this process is not stopped
sigterm.restore(None)
print("after restore:", stopper.stop_all())
"""


def test_a_sigterm_a_finalizer_swallowed_ends_the_run_at_the_stoppers_next_step(tmp_path: Path):
    done = subprocess.run(
        [sys.executable, "-c", SWALLOWED, str(tmp_path)], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Exception ignored" in done.stderr and "Terminated" in done.stderr  # it was swallowed, as in the trial
    assert done.stdout.split("\n")[:4] == ["went on", "terminated", "again: False", "after restore: False"]
