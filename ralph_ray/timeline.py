"""A campaign's trials over time as a Chrome/Perfetto trace: `<run_dir>/timeline.json`.

Open it in https://ui.perfetto.dev or chrome://tracing. Each trial is a complete event ("ph": "X") from its start to
its end, on the slot (a row) it ran in; slots are recovered from the trials' spans (a trial takes the first slot
free at its start), so the rows show how busy the campaign kept its workers and where it waited. The format is
the Trace Event Format's JSON object form (`traceEvents`, microsecond timestamps).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ralph_ray import sql
from ralph_ray.kb import open_reader

TIMELINE_FILE = "timeline.json"
_US = 1_000_000


def trace(kb_root: Path, run_id: str) -> dict[str, Any]:
    """The campaign's trace: one event per trial, on the slot it ran in, with its outcome in `args`."""
    spans = open_reader(kb_root).execute(sql.TRIAL_SPANS, [run_id]).fetchall()
    free_at: list[float] = []  # per slot: when its last trial ended
    events: list[dict[str, Any]] = [{"ph": "M", "pid": 1, "name": "process_name", "args": {"name": f"run {run_id}"}}]
    origin = min((s[0] for s in spans), default=0.0)
    for started, ended, seconds, status, reason, selection, test, variant, cycle, trial_id in spans:
        slot = next((i for i, free in enumerate(free_at) if free <= started), len(free_at))
        if slot == len(free_at):
            free_at.append(ended)
            events.append({"ph": "M", "pid": 1, "tid": slot, "name": "thread_name", "args": {"name": f"slot {slot}"}})
        free_at[slot] = ended
        events.append(
            {
                "ph": "X",
                "pid": 1,
                "tid": slot,
                "name": f"{variant} {trial_id}",
                "cat": str(status),
                "ts": round((started - origin) * _US),
                "dur": max(1, round(seconds * _US)),
                "args": {
                    "trial_id": trial_id,
                    "variant_id": variant,
                    "cycle": cycle,
                    "status": status,
                    "reason": reason,
                    "selection_score": selection,
                    "test_score": test,
                },
            }
        )
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"run_id": run_id}}


def write(kb_root: Path, run_id: str, run_dir: Path) -> Path:
    """Write `<run_dir>/timeline.json` and return its path."""
    path = run_dir / TIMELINE_FILE
    path.write_text(json.dumps(trace(kb_root, run_id), default=str))
    return path
