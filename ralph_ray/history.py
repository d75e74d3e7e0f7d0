"""A campaign's history as the knowledge base records it: what the orchestrator reads back between phases.

Plain functions over a KB reader connection (`KnowledgeBase.reader()`) and a run id, so they serve a cycle, a
single completed trial or a single child alike. Read-only: rows are made in `records` and written by the
orchestrator; every query lives in `sql`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import duckdb

from ralph_ray import sql
from ralph_ray.agents.base import ChildSeen, EpochPoint, InterventionEffect, ParentView, TrialSummary
from ralph_ray.children import bake
from ralph_ray.decision import CycleFacts
from ralph_ray.population import Candidate, branch_of
from ralph_ray.state import CampaignState
from ralph_ray.statuses import STOPPED_WITH_CYCLE
from ralph_ray.variants import VariantStatus, files_dir


@dataclass(frozen=True)
class Spend:
    """What the agents spent: tokens in one cycle, tokens and cost over the campaign."""

    tokens_cycle: int
    tokens_campaign: int
    cost_campaign: float


def started_at(con: duckdb.DuckDBPyConnection, run_id: str) -> datetime | None:
    """When the run was first started (a resume keeps it), or None for a new run."""
    row = con.execute(sql.RUN_STARTED_AT, [run_id]).fetchone()
    return row[0] if row else None


def variant_scores(con: duckdb.DuckDBPyConnection, run_id: str) -> dict[str, tuple[float, float | None]]:
    """Each variant with a completed trial: (best selection score, that trial's test score)."""
    return {v: (score, test) for v, score, _, test, _ in con.execute(sql.VARIANT_SCORES, [run_id]).fetchall()}


def ranked(con: duckdb.DuckDBPyConnection, run_id: str) -> list[Candidate]:
    """The parent candidates, best first: variants with a completed trial, their best knobs and branch."""
    return [candidate for candidate, _ in ranked_with_ranks(con, run_id)]


def ranked_with_ranks(con: duckdb.DuckDBPyConnection, run_id: str) -> list[tuple[Candidate, int | None]]:
    """The parent candidates, best first, each with its leaderboard rank (what `status` and the app show)."""
    parents = {row[0]: row[1] for row in con.execute(sql.VARIANT_PARENTS, [run_id]).fetchall()}
    return [
        (Candidate(v, float(score), json.loads(knobs or "{}"), branch_of(v, parents)), rank)
        for v, score, knobs, _, rank in con.execute(sql.VARIANT_SCORES, [run_id]).fetchall()
    ]


def discarded(con: duckdb.DuckDBPyConnection, run_id: str) -> frozenset[str]:
    """The variants of this run a verdict discarded, as each stands now (the campaign's floor leaves them out)."""
    cursor = con.execute(sql.VARIANTS_FOR_RUN, [run_id])
    columns = [d[0] for d in cursor.description]
    at_id, at_status = columns.index("variant_id"), columns.index("status")
    return frozenset(row[at_id] for row in cursor.fetchall() if row[at_status] == VariantStatus.discarded.value)


def pick(con: duckdb.DuckDBPyConnection, run_id: str) -> str | None:
    """The campaign's pick (sql.PICK: the leaderboard's rank 1), or None before any completed trial."""
    row = con.execute(sql.PICK, [run_id]).fetchone()
    return row[0] if row else None


def known_variants(con: duckdb.DuckDBPyConnection, run_id: str) -> frozenset[str]:
    """Every variant id recorded in this run (a child identical to one of them is no new child)."""
    return frozenset(row[0] for row in con.execute(sql.VARIANT_PARENTS, [run_id]).fetchall())


def lineage(variants: dict[str, tuple[str | None, list[str]]], variant_id: str) -> list[str]:
    """The interventions from the seed down to `variant_id`, oldest first (`variants`: id -> (parent, own))."""
    chain: list[str] = []
    node = variant_id
    for _ in range(len(variants)):  # bounded: a malformed KB with a loop cannot hang the walk
        parent_id, done = variants.get(node, (None, []))
        chain = list(done) + chain
        if not parent_id:
            break
        node = parent_id
    return chain


def parent_view(
    con: duckdb.DuckDBPyConnection, run_id: str, parent: Candidate, variants_root: Path, baked: Path, trainer_dir: Path
) -> ParentView:
    """What the agents may know of a parent: its code with its best knobs baked in (written to `baked`), its trials
    and curves, the interventions of its lineage, its children so far in this run, and the task's program.md."""
    files = bake(files_dir(variants_root, parent.variant_id), parent.best_knobs, baked)
    program = trainer_dir / "program.md"
    others: dict[tuple[str, int], dict[str, float]] = {}
    for trial_id, epoch, metric, value in con.execute(
        sql.VARIANT_OTHER_METRICS, [run_id, parent.variant_id]
    ).fetchall():
        others.setdefault((trial_id, epoch), {})[metric] = value
    curves: dict[str, list[EpochPoint]] = {}
    for trial_id, epoch, *point in con.execute(sql.VARIANT_CURVES, [run_id, parent.variant_id]).fetchall():
        curves.setdefault(trial_id, []).append(EpochPoint(epoch, *point, others=others.get((trial_id, epoch), {})))
    trials = [
        TrialSummary(trial_id, status, reason, json.loads(knobs or "{}"), score, curves.get(trial_id, []))
        for trial_id, status, reason, knobs, score in con.execute(
            sql.VARIANT_TRIALS, [run_id, parent.variant_id]
        ).fetchall()
    ]
    variants = {v: (p, json.loads(i or "[]")) for v, p, i in con.execute(sql.VARIANT_PARENTS, [run_id]).fetchall()}
    own = variants.get(parent.variant_id, (None, []))[1]
    children = [
        ChildSeen(v, json.loads(i or "[]"), status, reason, rejected_by)
        for v, i, status, reason, rejected_by in con.execute(
            sql.VARIANT_CHILDREN, [run_id, parent.variant_id]
        ).fetchall()
    ]
    return ParentView(
        parent.variant_id,
        files,
        parent.selection_score,
        trials,
        own,
        lineage(variants, parent.variant_id),
        program.read_text() if program.exists() else "",
        children,
    )


def effects(
    con: duckdb.DuckDBPyConnection, task: str, metric: str | None, direction: str | None
) -> list[InterventionEffect]:
    """Measured effects of interventions on this task and metric (name and direction), across every campaign in
    the KB."""
    rows = con.execute(sql.EFFECTS_FOR_TASK, [task, metric, direction]).fetchall()
    return [InterventionEffect(i, d, int(n), m, w, int(u)) for i, d, n, m, w, u in rows]


def trials_done(con: duckdb.DuckDBPyConnection, run_id: str, cycle: int, rerun_reason: str) -> list[str]:
    """The variant of each trial of a cycle that counts as done; trials ended with `rerun_reason` run again."""
    return [row[0] for row in con.execute(sql.CYCLE_TRIALS_DONE, [run_id, cycle, rerun_reason]).fetchall()]


def trial_counts(con: duckdb.DuckDBPyConnection, run_id: str, cycle: int) -> dict[str, tuple[int, int, int]]:
    """Per variant of a cycle: (trials recorded, trials failed, trials the campaign's stop cut short)."""
    rows = con.execute(sql.CYCLE_TRIAL_COUNTS, [STOPPED_WITH_CYCLE, run_id, cycle]).fetchall()
    return {v: (int(n), int(failed), int(cut)) for v, n, failed, cut in rows}


def spend(con: duckdb.DuckDBPyConnection, run_id: str, cycle: int) -> Spend:
    """The agents' tokens this cycle and tokens and cost over the campaign."""
    tokens_cycle, _ = con.execute(sql.USAGE_FOR_CYCLE, [run_id, cycle]).fetchone()
    _, tokens, cost, _ = con.execute(sql.USAGE_FOR_RUN, [run_id]).fetchone()
    return Spend(int(tokens_cycle), int(tokens), float(cost))


def cycle_facts(
    con: duckdb.DuckDBPyConnection,
    state: CampaignState,
    target: float | None,
    elapsed_s: float,
    manual_stop: bool,
    replicated: bool = False,
    sign: float = 1.0,
) -> CycleFacts:
    """What the decision engine reads after a cycle: the state's bests (and confident floors, with `replicated`)
    and gate streak, and the agents' spend (`sign` -1: a min metric's, shown as its values in the rationale)."""
    spent = spend(con, state.run_id, state.cycle)
    return CycleFacts(
        state.cycle,
        list(state.best_by_cycle),
        target,
        spent.tokens_cycle,
        spent.tokens_campaign,
        spent.cost_campaign,
        state.gate_fail_streak,
        elapsed_s,
        manual_stop,
        list(state.floor_by_cycle) if replicated else None,
        sign,
    )


def best_trial(con: duckdb.DuckDBPyConnection, run_id: str) -> str | None:
    """The completed trial with the best selection score so far."""
    row = con.execute(sql.BEST_TRIAL, [run_id]).fetchone()
    return row[0] if row else None
