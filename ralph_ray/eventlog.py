"""`<run_dir>/events.jsonl`'s name and its one-line writer, without Ray (`ralph_ray.events` adds the KB's events and
Tune's trial starts): the breeder writes its gate refusals from modules that must stay Ray-free."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

EVENTS_FILE = "events.jsonl"


def stamp() -> str:
    """An event's `ts`: UTC, ISO 8601, to the millisecond."""
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def write_event(run_dir: Path, event: str, **fields: Any) -> None:
    """Append one event line to `<run_dir>/events.jsonl` (the run id is the run dir's name, as rundir.locate makes
    it); one write of one line, so threads' lines never interleave."""
    line = json.dumps({"ts": stamp(), "event": event, "run_id": run_dir.name, **fields}, default=str)
    with (run_dir / EVENTS_FILE).open("a") as out:
        out.write(line + "\n")
