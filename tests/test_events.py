"""events: the trial_start lines a driver writes, and the count a resume reads back from them."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from ralph_ray.eventlog import EVENTS_FILE, write_event
from ralph_ray.events import TrialStarts, trials_started


def test_trials_started_counts_the_start_lines_a_driver_wrote_and_not_a_torn_one(tmp_path: Path):
    """A resume reseeds the parent picks from this count: other events and a line torn by kill -9 are not starts."""
    assert trials_started(tmp_path) == 0  # no events file yet
    starts = TrialStarts(tmp_path, "r1", None)
    for n in range(3):
        starts.on_trial_start(0, [], SimpleNamespace(trial_id=f"t{n}", config={"variant": "v1"}))
    write_event(tmp_path, "decision", cycle=1)
    with (tmp_path / EVENTS_FILE).open("a") as out:
        out.write('{"ts": "2026-12-02", "event": "trial_st')  # the driver died mid-line
    assert trials_started(tmp_path) == 3
