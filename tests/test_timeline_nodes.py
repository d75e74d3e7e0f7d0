"""timeline.json's lanes: one process per node, one thread per worker slot on it; a KB written by the real writer."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

from ralph_ray import timeline
from ralph_ray.kb import KnowledgeBase

RUN = "lanes"
T0 = datetime(2026, 11, 23, 12, 0, tzinfo=timezone.utc)
# (trial, node, start s, end s): node a runs two at a time, then one; node b one; one trial's node was not recorded.
SPANS = [
    ("a1", "10.0.0.1", 0, 10),
    ("a2", "10.0.0.1", 1, 5),
    ("a3", "10.0.0.1", 6, 12),  # takes the slot a2 freed
    ("b1", "10.0.0.2", 2, 9),
    ("x1", None, 3, 4),
]


def write_kb(root: Path) -> KnowledgeBase:
    kb = KnowledgeBase(root / "kb")
    kb.init()
    rows = [
        {
            "run_id": RUN,
            "cycle": 1,
            "trial_id": trial,
            "variant_id": "v",
            "status": "completed",
            "knobs": "{}",
            "seconds": float(end - start),
            "written_at": T0 + timedelta(seconds=end),
            "node": node,
        }
        for trial, node, start, end in SPANS
    ]
    kb.append("trials", rows, RUN)
    return kb


def test_two_nodes_trials_land_in_two_process_lanes_with_their_slots(tmp_path: Path) -> None:
    kb = write_kb(tmp_path)
    path = timeline.write(kb.root, RUN, tmp_path)
    events = json.loads(path.read_text())["traceEvents"]
    lanes = {e["args"]["name"]: e["pid"] for e in events if e["name"] == "process_name"}
    assert set(lanes) == {"node 10.0.0.1", "node 10.0.0.2", timeline.UNKNOWN_NODE} and len(set(lanes.values())) == 3
    spans = {e["args"]["trial_id"]: e for e in events if e["ph"] == "X"}
    a, b = lanes["node 10.0.0.1"], lanes["node 10.0.0.2"]
    assert [spans[t]["pid"] for t in ("a1", "a2", "a3", "b1")] == [a, a, a, b]
    assert spans["x1"]["pid"] == lanes[timeline.UNKNOWN_NODE]
    assert (spans["a1"]["tid"], spans["a2"]["tid"], spans["a3"]["tid"]) == (0, 1, 1)  # a3 reuses the freed slot
    assert spans["b1"]["tid"] == 0  # slots count per node
    threads = {(e["pid"], e["tid"]) for e in events if e["name"] == "thread_name"}
    assert threads == {(e["pid"], e["tid"]) for e in spans.values()}
    assert spans["a1"]["ts"] == 0 and spans["b1"]["ts"] == 2_000_000 and spans["a3"]["dur"] == 6_000_000
    for lane in threads:  # a slot runs one trial at a time
        row = sorted((e["ts"], e["ts"] + e["dur"]) for e in spans.values() if (e["pid"], e["tid"]) == lane)
        assert all(end <= start for (_, end), (start, _) in zip(row, row[1:]))
