"""Steering a running campaign from outside it: a STOP file in its run dir, which it checks between steps.

`python -m ralph_ray stop`, the app's Stop button and the campaign's own checks all go through here, so they
agree on the file. No engine imports: the app, which may not import the orchestrator, uses it.
"""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

STOP_FILE = "STOP"


def request_stop(run_dir: str | Path, why: str = "requested") -> Path:
    """Ask the campaign of `run_dir` to stop cleanly at its next check; returns the STOP file written."""
    path = Path(run_dir) / STOP_FILE
    path.write_text(f"{datetime.now(timezone.utc).isoformat()} {why}\n")
    return path


def stop_requested(run_dir: str | Path) -> bool:
    """True once a STOP file exists in the run dir."""
    return (Path(run_dir) / STOP_FILE).exists()
