"""`<run_dir>/events.jsonl`: a campaign's events, one JSON object a line, for other tools to follow (`tail -f`).

Every step of a campaign leaves its outcome in the KB, so the events are taken where the rows are written: a
KnowledgeBase that also appends a line per phase change (the runs row), gate verdict and judgement (variants),
trial end (trials), recorded cycle and decision. Both campaign modes (barrier and async) write through it. A trial's
start reaches no table, so `TrialStarts`, a Tune callback beside the ledger, writes its line; nor does a gate
refusal of one attempt that the coder then mends (only the child's last verdict is a variants row), so the breeder
writes a `gate_refused` line per refusal (`ralph_ray.eventlog.write_event`).
Each line has `ts` (UTC, ISO 8601), `event` and `run_id`; the rest are the row's fields that matter to a follower.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ray.tune import Callback

from ralph_ray.eventlog import EVENTS_FILE
from ralph_ray.kb import KnowledgeBase

# table -> (event name, the row's fields a follower reads)
_FIELDS: dict[str, tuple[str, tuple[str, ...]]] = {
    "runs": ("phase", ("status", "cycle", "phase", "stop_reason")),
    "variants": (
        "variant",
        ("variant_id", "parent_id", "cycle", "status", "reason", "interventions", "selection_score"),
    ),
    "trials": (
        "trial_end",
        ("trial_id", "variant_id", "cycle", "status", "reason", "epochs", "selection_score", "test_score", "seconds"),
    ),
    "cycles": ("cycle", ("cycle", "trials", "best_selection_score", "children", "rejected")),
    "decisions": (
        "decision",
        ("cycle", "decision", "reason", "exit_code", "rationale", "best_selection_score", "best_variant_id"),
    ),
}


class EventedKB(KnowledgeBase):
    """A KnowledgeBase that also appends each written row's event to `<run_dir>/events.jsonl`."""

    def __init__(self, root: Path, run_dir: Path) -> None:
        super().__init__(root)
        self.events_path = run_dir / EVENTS_FILE
        self._lock = threading.Lock()  # the async campaign writes from Tune's callbacks and its own loop
        self._seen: dict[tuple[str, str], tuple[Any, ...]] = {}  # a re-written row emits only when it changed

    def put(self, table: str, rows: Sequence[dict[str, Any]], name: str) -> Path | None:
        """Write the part, then its events."""
        path = super().put(table, rows, name)
        self._emit(table, rows)
        return path

    def append(self, table: str, rows: Sequence[dict[str, Any]], tag: str) -> Path | None:
        """Append the part, then its events."""
        path = super().append(table, rows, tag)
        self._emit(table, rows)
        return path

    def _emit(self, table: str, rows: Sequence[dict[str, Any]]) -> None:
        if table not in _FIELDS:
            return
        event, fields = _FIELDS[table]
        lines = []
        for row in rows:
            data = {f: row.get(f) for f in fields if f in row}
            key = (table, str(row.get("variant_id") or row.get("trial_id") or row.get("cycle") or row.get("run_id")))
            if self._seen.get(key) == tuple(data.values()):
                continue
            self._seen[key] = tuple(data.values())
            stamp = datetime.now(timezone.utc).isoformat(timespec="milliseconds")
            lines.append(json.dumps({"ts": stamp, "event": event, "run_id": row.get("run_id"), **data}, default=str))
        if lines:
            with self._lock, self.events_path.open("a") as out:
                out.write("\n".join(lines) + "\n")


TRIAL_START = "trial_start"  # the event TrialStarts writes as each trial starts


def trials_started(run_dir: Path) -> int:
    """The trials a run's drivers started so far, recorded or not: events.jsonl's trial_start lines (a line torn by a
    killed driver is not one)."""
    path = run_dir / EVENTS_FILE
    if not path.exists():
        return 0
    count = 0
    with path.open() as events:
        for line in events:
            try:
                count += json.loads(line).get("event") == TRIAL_START
            except (json.JSONDecodeError, AttributeError):
                continue
    return count


class TrialStarts(Callback):
    """A Tune callback: a `trial_start` line (trial, variant, cycle in the barrier mode) as each trial starts."""

    def __init__(self, run_dir: Path, run_id: str, cycle: int | None) -> None:
        self.path, self.run_id, self.cycle = run_dir / EVENTS_FILE, run_id, cycle

    def __getstate__(self) -> dict[str, Any]:
        return {}  # Tune pickles its run config; the events file is this driver's

    def on_trial_start(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        stamp = datetime.now(timezone.utc).isoformat(timespec="milliseconds")
        event = {"ts": stamp, "event": TRIAL_START, "run_id": self.run_id, "trial_id": trial.trial_id}
        event["variant_id"] = trial.config.get("variant")
        if self.cycle is not None:
            event["cycle"] = self.cycle
        with self.path.open("a") as out:
            out.write(json.dumps(event, default=str) + "\n")
