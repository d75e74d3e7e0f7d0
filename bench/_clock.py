"""Shared by the clock benchmarks: one campaign's slot utilisation, best score and time to a target, from the KB."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from ralph_ray import sql
from ralph_ray.campaign import Outcome
from ralph_ray.kb import open_reader
from ralph_ray.ledger import STOPPED_WITH_CYCLE

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "agents"))


@dataclass(frozen=True)
class Figures:
    """What one campaign measured."""

    mode: str
    wall_s: float  # the campaign's wall time (run start to finish, Ray's start and the report included)
    trial_s: float  # the trials' seconds, summed
    utilisation: float  # trial_s / (slots x wall_s)
    busy_in_span: float  # trial_s / (slots x (last trial end - first trial start)): without Ray's start and the report
    trials: int
    best_selection: float | None
    best_test: float | None  # the test score of the trial with the best selection score
    seconds_to_target: float | None  # from the run's start to the first trial at or above the target


def measure(outcome: Outcome, mode: str, slots: int, target: float | None = None) -> Figures:
    """Read one campaign's figures back from its KB."""
    con = open_reader(outcome.kb_root)
    started, finished = con.execute(sql.RUN_SPAN, [outcome.run_id]).fetchone()
    wall = float(finished) - float(started)
    spans = con.execute(sql.TRIAL_SPANS, [outcome.run_id]).fetchall()
    trial_s = sum(row[2] for row in spans)
    scored = [row for row in spans if row[5] is not None]
    best = max(scored, key=lambda row: row[5], default=None)
    reached = min((row[1] for row in scored if target is not None and row[5] >= target), default=None)
    counted = [row for row in spans if row[4] != STOPPED_WITH_CYCLE]
    span = max(row[1] for row in spans) - min(row[0] for row in spans)
    return Figures(
        mode,
        round(wall, 1),
        round(trial_s, 1),
        round(trial_s / (slots * wall), 3),
        round(trial_s / (slots * span), 3),
        len(counted),
        best[5] if best else None,
        best[6] if best else None,
        round(reached - started, 1) if reached is not None else None,
    )
