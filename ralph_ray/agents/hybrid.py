"""agent=hybrid: the offline heuristic writes children until the campaign stalls, then the LLM takes over, and
hands back when its children keep failing.

Which side writes a cycle is replayed from the knowledge base each time (the campaign's best after every
cycle, and how every child ended), never kept in memory: a resumed campaign makes the same choice, and the
analyse and write phases of one cycle always agree.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb

from ralph_ray import sql
from ralph_ray.agents.base import Analysis, Analyst, Coder, Draft, InterventionEffect, ParentView, Recommendation, Usage
from ralph_ray.decision import improved
from ralph_ray.kb import open_reader
from ralph_ray.variants import VariantStatus

FAILED = (VariantStatus.rejected.value, VariantStatus.crashed.value)


class Side(str, enum.Enum):
    """Who writes a cycle's children."""

    heuristic = "heuristic"
    llm = "llm"


@dataclass(frozen=True)
class Turn:
    """The side for the next cycle, and why (shown in the cycle's analysis)."""

    side: Side
    why: str


def replay(
    best_by_cycle: list[float | None],
    outcomes: dict[int, list[str]],
    stall_cycles: int,
    fail_children: int,
    min_delta: float,
) -> Turn:
    """Walk the finished cycles in order and return whose turn the next one is.

    The heuristic hands over after `stall_cycles` cycles in which the best did not rise by `min_delta`; the
    LLM hands back after `fail_children` of its children in a row were rejected or crashed (an LLM cycle
    that produced no child counts as one failure), and the stall count then starts afresh.
    """
    side, since, streak, reference = Side.heuristic, 0, 0, None
    why = "the heuristic writes children until the campaign stalls"
    for cycle, best in enumerate(best_by_cycle, start=1):
        rose = improved(best, reference, min_delta)
        if rose:
            reference = best
        since = 0 if rose else since + 1
        if side is Side.llm:
            statuses = outcomes.get(cycle, [])
            if not statuses:
                streak += 1
            elif all(status in FAILED for status in statuses):
                streak += len(statuses)
            else:
                streak = 0
            if streak >= fail_children:
                side, since, streak = Side.heuristic, 0, 0
                why = f"back to the heuristic: {fail_children} LLM children in a row failed (agent.llm_fail_children)"
        elif since >= stall_cycles:
            side, streak = Side.llm, 0
            why = (
                f"the LLM takes over: no improvement by {min_delta:g} for {since} cycle(s) "
                f"(agent.stall_cycles={stall_cycles})"
            )
    return Turn(side, why)


class HybridPolicy:
    """Reads this run's history from the knowledge base (read-only) and replays whose turn it is."""

    def __init__(
        self, kb_root: Path, run_id: str | None, stall_cycles: int, fail_children: int, min_delta: float
    ) -> None:
        self.kb_root, self.run_id = kb_root, run_id
        self.stall_cycles, self.fail_children, self.min_delta = stall_cycles, fail_children, min_delta

    def turn(self) -> Turn:
        """The side for the cycle being written now."""
        if self.run_id is None:
            return Turn(Side.heuristic, "no run id given: the heuristic writes children")
        try:
            con = open_reader(self.kb_root)
        except FileNotFoundError:
            return Turn(Side.heuristic, "no knowledge base yet: the heuristic writes children")
        try:
            best = [row["best_selection_score"] for row in _rows(con.execute(sql.DECISIONS_FOR_RUN, [self.run_id]))]
            outcomes: dict[int, list[str]] = {}
            for row in _rows(con.execute(sql.VARIANTS_FOR_RUN, [self.run_id])):
                if row["status"] != VariantStatus.seed.value:
                    outcomes.setdefault(int(row["cycle"]), []).append(row["status"])
        finally:
            con.close()
        return replay(best, outcomes, self.stall_cycles, self.fail_children, self.min_delta)


def _rows(cursor: duckdb.DuckDBPyConnection) -> list[dict[str, Any]]:
    names = [d[0] for d in cursor.description]
    return [dict(zip(names, row)) for row in cursor.fetchall()]


class HybridAnalyst:
    """The heuristic's analysis, or the LLM side's when it is the LLM's turn."""

    def __init__(self, policy: HybridPolicy, heuristic: Analyst, llm: Analyst) -> None:
        self.policy, self.heuristic, self.llm = policy, heuristic, llm

    def analyse(self, parent: ParentView, effects: list[InterventionEffect], usage: Usage) -> Analysis:
        """Delegate to the side whose turn it is; the summary says which and why."""
        turn = self.policy.turn()
        analysis = (self.llm if turn.side is Side.llm else self.heuristic).analyse(parent, effects, usage)
        return Analysis(
            analysis.variant_id,
            analysis.diagnoses,
            f"[hybrid: {turn.side.value}; {turn.why}]\n\n{analysis.summary}",
            analysis.recommendations,
        )


class HybridCoder:
    """The heuristic coder, or the LLM side's when it is the LLM's turn (the same turn the analyst saw)."""

    def __init__(self, policy: HybridPolicy, heuristic: Coder, llm: Coder) -> None:
        self.policy, self.heuristic, self.llm = policy, heuristic, llm

    def write(
        self, parent: ParentView, recommendation: Recommendation, workdir: Path, feedback: str | None, usage: Usage
    ) -> Draft:
        """Delegate to the side whose turn it is."""
        coder = self.llm if self.policy.turn().side is Side.llm else self.heuristic
        return coder.write(parent, recommendation, workdir, feedback, usage)
