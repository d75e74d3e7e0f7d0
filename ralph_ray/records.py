"""Row makers for the knowledge base's tables (runs, variants, agent_usage, interventions, cycles, decisions),
and the names of the parts they are written as.

Plain functions of what a phase knows, so a cycle, a single child or a single trial can be recorded alike.
They build rows only: the orchestrator writes them (`KnowledgeBase.put`/`append`), `history` reads them back.
Trial and epoch rows are made by the ledger (`TrialRecord.row`).
"""

from __future__ import annotations

import enum
import json
from dataclasses import asdict
from datetime import datetime
from pathlib import Path
from typing import Any

from ralph_ray.agents.base import Usage
from ralph_ray.children import Child
from ralph_ray.config import AgentConfig, Config
from ralph_ray.decision import CycleFacts, Decision
from ralph_ray.kb import now
from ralph_ray.noise import Comparison
from ralph_ray.state import CampaignState, Phase, RunStatus
from ralph_ray.variants import RejectedBy, VariantStatus

Row = dict[str, Any]


def part(run_id: str, cycle: int, *suffix: str) -> str:
    """The name of a cycle's part of a table (`put` replaces a part of the same name: idempotent on resume)."""
    return "-".join([f"{run_id}-c{cycle:04d}", *suffix])


def trial_part(run_id: str, cycle: int, trial_id: str) -> str:
    """The tag of one trial's parts (epochs, trials); `compact` later folds a cycle's into one part."""
    return f"{trial_parts(run_id, cycle)}{trial_id}"


def trial_parts(run_id: str, cycle: int) -> str:
    """The prefix every trial part of a cycle starts with."""
    return f"{run_id}-c{cycle}-"


def run_row(cfg: Config, run_id: str, run_dir: Path, started_at: datetime | None) -> Row:
    """What a runs row always carries: the experiment, its config and when the run first started."""
    return {
        "run_id": run_id,
        "experiment": cfg.experiment,
        "task": cfg.task.name,
        "run_dir": str(run_dir),
        "config": json.dumps(asdict(cfg), default=str),
        "started_at": started_at or now(),
    }


def run_status(base: Row, status: RunStatus, state: CampaignState, stop_reason: str | None = None) -> Row:
    """The runs row as the run stands (one part per run, replaced): live cycle and phase, and how it ended."""
    ended = {} if status is RunStatus.running else {"stop_reason": stop_reason, "finished_at": now()}
    return {**base, "status": status.value, **ended, "cycle": state.cycle, "phase": state.phase.value}


def variant_rows(
    run_id: str,
    cycle: int,
    children: list[Child],
    agent: AgentConfig,
    scores: dict[str, tuple[float, float | None]] | None = None,
) -> list[Row]:
    """Variant rows (the newest row per variant wins in the view); a child identical to its parent is no new variant."""
    return [
        {
            "run_id": run_id,
            "variant_id": c.variant_id,
            "parent_id": c.parent_id or None,
            "cycle": cycle,
            "files_dir": str(c.files_dir),
            "diff": c.diff,
            "status": c.status.value,
            "interventions": json.dumps(c.interventions),
            "diagnosis": c.diagnosis,
            "rationale": c.rationale,
            "reason": c.reason,
            "rejected_by": c.rejected_by.value if c.rejected_by else None,
            "parent_score": compared_parent_score(c, (scores or {}).get(c.variant_id, (None, None))[0]),
            "selection_score": (scores or {}).get(c.variant_id, (None, None))[0],
            "backend": agent.backend.value,
            # what the gate caught on the way (an engine import, a path outside the work dir): findable with SQL
            "refusals": json.dumps(c.refusals) if c.refusals else None,
        }
        for c in children
        if c.variant_id != c.parent_id
    ]


def compared_parent_score(child: Child, score: float | None) -> float | None:
    """The parent's score as a child's rows record it: the one its verdict compared its own with (`measured`, set on
    the child when judged), and before its verdict the parent's score it was bred from; None for a child that
    compared none (refused, crashed, no trial completed), whose breed-time score sat beside its judged siblings'
    replicate means as if it were their parent's other score (user trial)."""
    unscored = child.status is VariantStatus.discarded and score is None
    if child.status in (VariantStatus.rejected, VariantStatus.crashed) or unscored:
        return None
    return child.parent_score


def usage_rows(run_id: str, cycle: int, role: str, spent: list[tuple[str, Usage]], agent: AgentConfig) -> list[Row]:
    """A row per (variant, usage) pair of one agent role."""
    return [usage_row(run_id, cycle, role, variant_id, usage, agent) for variant_id, usage in spent]


def usage_row(run_id: str, cycle: int, role: str, variant_id: str, usage: Usage, agent: AgentConfig) -> Row:
    """One agent call's (or a batch's) tokens, seconds and cost at the configured prices."""
    cost = (usage.tokens_in * agent.price_in_per_m + usage.tokens_out * agent.price_out_per_m) / 1e6
    return {
        "run_id": run_id,
        "cycle": cycle,
        "role": role,
        "backend": agent.backend.value,
        "variant_id": variant_id,
        "calls": usage.calls,
        "tokens_in": usage.tokens_in,
        "tokens_out": usage.tokens_out,
        "seconds": usage.seconds,
        "cost": cost,
        "estimated": usage.estimated,
    }


class EffectBasis(str, enum.Enum):
    """What an interventions row's delta compares (the reference its child's verdict used)."""

    replicates = "replicates"  # the child's replicate mean against its parent's (both measured on fresh seeds)
    best_trial = "best_trial"  # the child's best trial against its parent's best trial (over as many trials)
    # the child's best trial against its parent's replicate mean: a child not worth replicating (noise.py)
    best_trial_vs_replicates = "best_trial_vs_replicates"


def measured(
    score: float | None, parent_score: float | None, comparison: Comparison | None
) -> tuple[float | None, float | None, EffectBasis]:
    """The child's and parent's scores its verdict compared, and their basis: `score`, `parent_score` are the best
    trials (the parent's over as many trials as the child had); `comparison` the replicates' evidence, if any.

    User trial: a row recorded the parent's best trial 0.9554 while the verdict said "did not beat its parent's
    replicate mean 0.9485", and best-trial deltas were averaged with replicate-mean ones with nothing to tell them
    apart."""
    if comparison is None:
        return score, parent_score, EffectBasis.best_trial
    parent_mean = comparison.parent.mean
    if not comparison.note and comparison.child.mean is not None and parent_mean is not None:
        return comparison.child.mean, parent_mean, EffectBasis.replicates
    if parent_mean is not None:  # not worth replicating (or its replicates gave no sample): its best trial
        return score, parent_mean, EffectBasis.best_trial_vs_replicates
    reference = comparison.parent_best if comparison.parent_best is not None else parent_score
    return score, reference, EffectBasis.best_trial


def intervention_rows(
    run_id: str, task: str, cycle: int, child: Child, score: float | None, comparison: Comparison | None = None
) -> list[Row]:
    """One row per intervention of a judged child, with its measured delta over the parent (none for the seed).

    The delta is over what the verdict compared (`measured`): with `comparison` (replicates on) between replicate
    means where child and parent both have them, else the child's best trial against `child.parent_score`.
    """
    if child.status is VariantStatus.seed or child.variant_id == child.parent_id:
        return []
    if child.rejected_by in (RejectedBy.coder, RejectedBy.budget):
        return []  # the gate never saw a draft (a coder's outage, a spent token budget): nothing of the intervention
    score, parent_score, basis = measured(score, child.parent_score, comparison)
    delta = None if score is None or parent_score is None else score - parent_score
    return [
        {
            "run_id": run_id,
            "task": task,
            "cycle": cycle,
            "variant_id": child.variant_id,
            "parent_id": child.parent_id,
            "intervention": name,
            "diagnosis": child.diagnosis,
            "parent_score": parent_score if score is not None else None,  # nothing compared: none
            "child_score": score,
            "delta": delta,
            "outcome": child.status.value,
            "basis": basis.value if delta is not None else None,  # no delta (rejected, unscored): nothing compared
        }
        for name in child.interventions
    ]


def effect_rows(
    run_id: str,
    task: str,
    cycle: int,
    children: list[Child],
    scores: dict[str, tuple[float, float | None]],
    comparisons: dict[str, Comparison] | None = None,
) -> list[Row]:
    """The intervention rows of every judged child of a cycle (`scores`: variant -> (selection, test);
    `comparisons`: the replicates' evidence each was judged on, see intervention_rows)."""
    return [
        row
        for c in children
        for row in intervention_rows(
            run_id, task, cycle, c, scores.get(c.variant_id, (None, None))[0], (comparisons or {}).get(c.variant_id)
        )
    ]


def cycle_row(
    run_id: str, cycle: int, trials: int, best: float | None, asked: list[Child], cycle_dir: Path, analysis: str
) -> Row:
    """A recorded cycle: its trials, the best so far, its children, its folder and its analysis text."""
    return {
        "run_id": run_id,
        "cycle": cycle,
        "finished_at": now(),
        "trials": trials,
        "best_selection_score": best,
        "phase": Phase.decide.value,
        "parents": json.dumps(sorted({c.parent_id for c in asked})),
        "children": len(asked),
        "rejected": sum(c.status is VariantStatus.rejected for c in asked),
        "cycle_dir": str(cycle_dir.resolve()),
        "analysis": analysis,
    }


def decision_json(decision: Decision, facts: CycleFacts, best_variant_id: str | None) -> Row:
    """The decision as decision.json holds it: the rule, its rationale and the budgets it read."""
    return {
        **decision.as_json(),
        "elapsed_s": round(facts.elapsed_s, 1),
        "tokens_campaign": facts.tokens_campaign,
        "cost_campaign": facts.cost_campaign,
        "best_variant_id": best_variant_id,
    }


def decision_row(run_id: str, decision: Decision, facts: CycleFacts, best_variant_id: str | None) -> Row:
    """The decisions row of a cycle."""
    return {
        "run_id": run_id,
        "cycle": decision.cycle,
        "decision": decision.as_json()["decision"],
        "reason": decision.reason.value,
        "exit_code": decision.exit_code,
        "rationale": decision.rationale,
        "best_selection_score": decision.best_selection_score,
        "best_variant_id": best_variant_id,
        "elapsed_s": facts.elapsed_s,
        "tokens": facts.tokens_campaign,
        "cost": facts.cost_campaign,
    }
