"""The agent contract: what an analyst reads and returns, what a coder reads and returns.

Agents read history and write variants; they never start trials or open the knowledge base for writing.
The engine hands them plain dataclasses (no config objects, no KB connections).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from ralph_ray.statuses import TrialStatus


class Diagnosis(str, enum.Enum):
    """What the analyst reads in a parent's curves."""

    underfitting = "underfitting"
    overfitting = "overfitting"
    divergence = "divergence"
    plateau = "plateau"
    too_slow = "too_slow"
    undertrained = "undertrained"  # still improving when training stopped
    healthy = "healthy"


class AgentError(RuntimeError):
    """An agent could not produce its output (bad answer, unreachable endpoint); the message says why."""


class CannotApply(AgentError):
    """A deterministic coder found that the change does not apply to this code (the offline agent's catalog edit met
    no idiom it knows): it would find the same every time, so the rejection is about the code, as a gate's is."""


class AgentConfigWarning(UserWarning):
    """Something about the agent backend that may or may not work (an agent.model the server does not list: Azure
    deployments, LiteLLM wildcards and llama.cpp answer to names they do not list); the campaign prints it once."""


class AgentConfigError(RuntimeError):
    """The agent backend cannot work at all (wrong API key, unreachable endpoint, missing CLI): not one child's
    failure but the campaign's, so it is no AgentError; the entry point exits with code 2 and the message's fix."""


@dataclass(frozen=True)
class EpochPoint:
    """One epoch of one trial, as the trainer reported it (missing metrics are None)."""

    epoch: int
    train_loss: float | None = None
    val_loss: float | None = None
    val_acc: float | None = None
    lr: float | None = None
    grad_norm: float | None = None
    epoch_seconds: float | None = None
    # telemetry probes (`harness.probes`), where the trainer reports them
    gen_gap: float | None = None  # val_loss - train_loss
    weight_norm: float | None = None
    update_norm: float | None = None  # how far the weights moved this epoch
    update_ratio: float | None = None  # update_norm / weight_norm
    eff_rank: float | None = None  # effective rank of the largest weight matrix
    plateau: float | None = None  # 1.0 when val_acc has stalled
    # RL post-training telemetry (task=grpo), where the trainer reports it
    reward_mean: float | None = None  # mean reward of the sampled completions
    reward_std: float | None = None  # spread of the rewards within a group (0: no learning signal)
    kl: float | None = None  # KL divergence from the reference (base) policy
    entropy: float | None = None  # of the policy's next-token distribution on its completions
    completion_length: float | None = None  # mean tokens per completion
    zero_spread_frac: float | None = None  # share of prompts whose completions all earned the same reward
    # every other metric the trainer reported this epoch by name (a search.metric such as val_f1): the analyst
    # reads the campaign's metric from here where it is none of the fields above
    others: dict[str, float] = field(default_factory=dict, hash=False)


@dataclass(frozen=True)
class TrialSummary:
    """One finished trial of a parent: its knobs, how it ended, its curve."""

    trial_id: str
    status: TrialStatus  # a KB row's plain string is turned into the enum
    reason: str | None
    knobs: dict[str, Any]
    selection_score: float | None
    curve: list[EpochPoint]

    def __post_init__(self) -> None:
        object.__setattr__(self, "status", TrialStatus(self.status))


@dataclass(frozen=True)
class InterventionEffect:
    """What the knowledge base measured for an intervention under a diagnosis (all campaigns of the task)."""

    intervention: str
    diagnosis: str
    count: int  # children with a measured delta
    mean_delta: float | None
    win_rate: float | None
    unscored: int = 0  # children that trained but never got a score (stopped at an ASHA rung, or crashed)


@dataclass(frozen=True)
class ChildSeen:
    """A child already bred from a parent in this run: its interventions, where it stands, and a rejection's reason."""

    variant_id: str
    interventions: list[str]
    status: str  # a VariantStatus value: candidate (trials pending), kept, discarded, rejected, crashed
    reason: str | None = None
    rejected_by: str | None = None  # a rejected child's RejectedBy value; None in a KB from before that column


@dataclass(frozen=True)
class ParentView:
    """Everything an analyst may know about one parent (never selection/test labels)."""

    variant_id: str
    files_dir: Path
    selection_score: float | None
    trials: list[TrialSummary]
    interventions: list[str]  # what produced this variant (empty for the seed)
    lineage: list[str]  # interventions along the path from the seed, oldest first
    program: str  # the task's program.md
    # This run's children of the parent so far: an analyst skips what the gate refused for it and breeds again what it
    # already bred only when nothing else is left (a 1x1 async campaign bred batchnorm twice from one parent).
    children: list[ChildSeen] = field(default_factory=list)


@dataclass(frozen=True)
class Recommendation:
    """One ranked suggestion: an intervention from the catalog (or free text for LLM agents) and why."""

    intervention: str
    diagnosis: Diagnosis
    rationale: str
    priority: float = 0.0
    details: str = ""  # free-form instructions for LLM/CLI coders


@dataclass(frozen=True)
class Analysis:
    """The analyst's reading of one parent: diagnoses, a markdown note, ranked recommendations."""

    variant_id: str
    diagnoses: list[Diagnosis]
    summary: str
    recommendations: list[Recommendation]


@dataclass
class Usage:
    """What one agent call cost: counted from the API, or estimated (CLIs) and marked so."""

    calls: int = 0
    tokens_in: int = 0
    tokens_out: int = 0
    seconds: float = 0.0
    estimated: bool = False

    def add(self, other: Usage) -> None:
        """Accumulate another call's usage."""
        self.calls += other.calls
        self.tokens_in += other.tokens_in
        self.tokens_out += other.tokens_out
        self.seconds += other.seconds
        self.estimated = self.estimated or other.estimated

    @property
    def tokens(self) -> int:
        """Tokens in and out."""
        return self.tokens_in + self.tokens_out


@dataclass
class Draft:
    """A coder's result: the edited files in `files_dir` (a copy of the parent) and what it did."""

    files_dir: Path
    interventions: list[str]
    rationale: str
    usage: Usage = field(default_factory=Usage)


class Analyst(Protocol):
    """Reads a parent's results and the KB's intervention effects; returns a ranked analysis."""

    def analyse(self, parent: ParentView, effects: list[InterventionEffect], usage: Usage) -> Analysis:
        """Diagnose `parent` and rank recommendations; add what the call cost to `usage`."""
        ...


class Coder(Protocol):
    """Applies one recommendation to a copy of the parent's files."""

    def write(
        self, parent: ParentView, recommendation: Recommendation, workdir: Path, feedback: str | None, usage: Usage
    ) -> Draft:
        """Edit the files in `workdir` (already a copy of the parent); `feedback` is the gate's last error."""
        ...
