"""A campaign's trials over time as a Chrome/Perfetto trace: `<run_dir>/timeline.json`.

Open it in https://ui.perfetto.dev or chrome://tracing. Each trial is a complete event ("ph": "X") from its start to
its end, in the lane of the node it ran on (a process, "pid") and the worker slot it took there (a thread, "tid");
slots are recovered per node from the trials' spans (a trial takes the node's first slot free at its start), so the
lanes show how busy the campaign kept each node's workers and where it waited. Trials from a KB that did not record
their node share one lane, "node not recorded". The format is the Trace Event Format's JSON object form
(`traceEvents`, microsecond timestamps).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ralph_ray import sql
from ralph_ray.kb import open_reader

TIMELINE_FILE = "timeline.json"
UNKNOWN_NODE = "node not recorded"
_US = 1_000_000


def trace(kb_root: Path, run_id: str) -> dict[str, Any]:
    """The campaign's trace: one event per trial, on its node's lane and slot, with its outcome in `args`."""
    spans = open_reader(kb_root).execute(sql.TRIAL_SPANS, [run_id]).fetchall()
    nodes: dict[str, int] = {}  # node -> its pid, in the order nodes first ran a trial
    free_at: dict[str, list[float]] = {}  # per node, per slot: when its last trial ended
    events: list[dict[str, Any]] = []
    origin = min((s[0] for s in spans), default=0.0)
    for started, ended, seconds, status, reason, selection, test, variant, cycle, trial_id, node in spans:
        name = str(node) if node else UNKNOWN_NODE
        if name not in nodes:
            nodes[name] = pid = len(nodes) + 1
            free_at[name] = []
            label = name if name == UNKNOWN_NODE else f"node {name}"
            events.append({"ph": "M", "pid": pid, "name": "process_name", "args": {"name": label}})
            events.append({"ph": "M", "pid": pid, "name": "process_sort_index", "args": {"sort_index": pid}})
        pid, slots = nodes[name], free_at[name]
        slot = next((i for i, free in enumerate(slots) if free <= started), len(slots))
        if slot == len(slots):
            slots.append(ended)
            events.append({"ph": "M", "pid": pid, "tid": slot, "name": "thread_name", "args": {"name": f"slot {slot}"}})
        slots[slot] = ended
        events.append(
            {
                "ph": "X",
                "pid": pid,
                "tid": slot,
                "name": f"{variant} {trial_id}",
                "cat": str(status),
                "ts": round((started - origin) * _US),
                "dur": max(1, round(seconds * _US)),
                "args": {
                    "trial_id": trial_id,
                    "variant_id": variant,
                    "cycle": cycle,
                    "node": node,
                    "status": status,
                    "reason": reason,
                    "selection_score": selection,
                    "test_score": test,
                },
            }
        )
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"run_id": run_id, "nodes": list(nodes)}}


def write(kb_root: Path, run_id: str, run_dir: Path) -> Path:
    """Write `<run_dir>/timeline.json` and return its path."""
    path = run_dir / TIMELINE_FILE
    path.write_text(json.dumps(trace(kb_root, run_id), default=str))
    return path
