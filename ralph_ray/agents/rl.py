"""What the heuristic analyst reads in an RL post-training curve (task=grpo): the trainer's per-epoch telemetry.

GRPO learns only from the spread of rewards within a group of completions, so the readings are about that
signal: a spread that has collapsed (a tiny mean spread, or most prompts' completions all scoring alike; plateau:
larger groups, hotter sampling, partial credit), a KL from the base policy that keeps climbing (divergence: a
stronger KL term, a smaller learning rate), a policy that barely moves while its reward stays flat (underfitting: a
weaker KL term, a larger learning rate or LoRA rank), and completions that run to the length cap (plateau: a
stronger length penalty). Curves without this telemetry (every other task) give no finding.
"""

from __future__ import annotations

from typing import Any

from ralph_ray.agents.base import Diagnosis, EpochPoint

# The rewards within a group spread less than this (mean over the last epoch's steps): GRPO's advantages are ~0.
SPREAD_FLOOR = 0.02
# Or at least this share of the last epoch's prompts had completions that all earned the same reward. With few
# samples per prompt the mean spread stays far above SPREAD_FLOOR while most groups teach nothing: the KTO seed
# (4 samples) at temperature 0.1 read 0.054-0.15 mean spread with 0.69-0.875 of its prompts all-equal (58 epochs,
# 2026-11-26), at its default 1.0 0.38-0.66 (53 epochs).
ZERO_SPREAD_SHARE = 0.75
# KL from the base above this at the end and at its highest so far: the policy is drifting away.
KL_LIMIT = 0.5
# KL below this while the mean reward rose by less than REWARD_RISE over the curve: the policy is stuck.
KL_STUCK = 0.005
REWARD_RISE = 0.02
# Mean completion length at this share of MAX_NEW_TOKENS or more: completions run to the cap.
LENGTH_CAP_SHARE = 0.95


def findings(curve: list[EpochPoint], knobs: dict[str, Any]) -> list[tuple[Diagnosis, str]]:
    """The RL readings of one curve, as (diagnosis, evidence) pairs."""
    out = []
    for check in (_spread_collapse, _kl_runaway, _stuck, _length_cap):
        reading = check(curve, knobs)
        if reading is not None:
            out.append(reading)
    return out


def _series(curve: list[EpochPoint], metric: str) -> list[tuple[int, float]]:
    return [(p.epoch, getattr(p, metric)) for p in curve if getattr(p, metric) is not None]


def _spread_collapse(curve: list[EpochPoint], knobs: dict[str, Any]) -> tuple[Diagnosis, str] | None:
    spread, agreeing = _series(curve, "reward_std"), _series(curve, "zero_spread_frac")
    if spread and spread[-1][1] < SPREAD_FLOOR:
        epoch, value = spread[-1]
        return (
            Diagnosis.plateau,
            f"reward spread collapsed: reward_std {value:.3g} at epoch {epoch} (below {SPREAD_FLOOR:g}): the groups' "
            "completions earn the same reward, so GRPO's advantages are zero",
        )
    if agreeing and agreeing[-1][1] >= ZERO_SPREAD_SHARE:
        epoch, value = agreeing[-1]
        return (
            Diagnosis.plateau,
            f"reward spread collapsed: at epoch {epoch} {value:.0%} of the prompts' completions all earned the same "
            f"reward (zero_spread_frac, {ZERO_SPREAD_SHARE:.0%} or more; TEMPERATURE {knobs.get('TEMPERATURE')}): "
            "those prompts teach nothing",
        )
    return None


def _kl_runaway(curve: list[EpochPoint], knobs: dict[str, Any]) -> tuple[Diagnosis, str] | None:
    kl = _series(curve, "kl")
    if not kl:
        return None
    epoch, end = kl[-1]
    if end > KL_LIMIT and end >= max(v for _, v in kl):
        return (
            Diagnosis.divergence,
            f"KL from the base policy climbing: kl {end:.3g} at epoch {epoch} (limit {KL_LIMIT:g}, BETA "
            f"{knobs.get('BETA')})",
        )
    return None


def _stuck(curve: list[EpochPoint], knobs: dict[str, Any]) -> tuple[Diagnosis, str] | None:
    kl, reward = _series(curve, "kl"), _series(curve, "reward_mean")
    if len(reward) < 2 or not kl:
        return None
    rise = reward[-1][1] - reward[0][1]
    if kl[-1][1] < KL_STUCK and rise < REWARD_RISE:
        return (
            Diagnosis.underfitting,
            f"the policy barely moves: kl {kl[-1][1]:.3g} and the mean reward rose {rise:.3g} over "
            f"{len(reward)} epochs (LR {knobs.get('LR')}, BETA {knobs.get('BETA')}, "
            f"LORA_RANK {knobs.get('LORA_RANK')})",
        )
    return None


def _length_cap(curve: list[EpochPoint], knobs: dict[str, Any]) -> tuple[Diagnosis, str] | None:
    length, cap = _series(curve, "completion_length"), knobs.get("MAX_NEW_TOKENS")
    if not length or not isinstance(cap, (int, float)) or cap <= 0:
        return None
    epoch, value = length[-1]
    if value >= LENGTH_CAP_SHARE * cap:
        return (
            Diagnosis.plateau,
            f"completions run to the cap: mean length {value:.3g} of MAX_NEW_TOKENS {cap} at epoch {epoch}",
        )
    return None
