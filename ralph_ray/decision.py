"""The decision rules: after each cycle, continue or stop (with the rule that fired and its rationale), and
whether a child is kept, discarded or crashed. `improved` is the one owner of "improved by min_delta".

Stop rules are checked in a fixed order (a manual stop wins over everything, a met target over any budget),
and every cycle's decision is written to decision.json and the knowledge base.
"""

from __future__ import annotations

import enum
import math
from dataclasses import asdict, dataclass

from ralph_ray.config import SafeguardsConfig
from ralph_ray.exit_codes import ExitCode
from ralph_ray.noise import Comparison
from ralph_ray.variants import VariantStatus


class StopReason(str, enum.Enum):
    """Why a campaign stops (or `none`: it continues)."""

    none = "none"
    manual_stop = "manual_stop"
    target_met = "target_met"
    token_budget = "token_budget"
    cost_budget = "cost_budget"
    gate_failures = "gate_failures"
    campaign_time = "campaign_time"
    plateau = "plateau"
    max_cycles = "max_cycles"
    no_trial_completed = "no_trial_completed"


EXIT_CODES = {
    StopReason.none: ExitCode.ok,
    StopReason.manual_stop: ExitCode.ok,
    StopReason.target_met: ExitCode.ok,
    StopReason.max_cycles: ExitCode.ok,  # the campaign ran its planned course
    StopReason.token_budget: ExitCode.safeguard_or_config,
    StopReason.cost_budget: ExitCode.safeguard_or_config,
    StopReason.gate_failures: ExitCode.safeguard_or_config,
    StopReason.campaign_time: ExitCode.safeguard_or_config,
    StopReason.plateau: ExitCode.plateau,
    StopReason.no_trial_completed: ExitCode.error,
}


@dataclass(frozen=True)
class CycleFacts:
    """What the decision engine reads after a cycle."""

    cycle: int
    best_by_cycle: list[float | None]  # the campaign's best selection score after each cycle so far
    target: float | None
    tokens_cycle: int
    tokens_campaign: int
    cost_campaign: float
    gate_fail_streak: int  # consecutive cycles in which children were asked for and none passed the gate
    elapsed_s: float
    manual_stop: bool
    # With replicates (safeguards.replicates): after each cycle, the highest lower confidence bound of any
    # replicated variant (noise.floor). The plateau rule and the target read it instead of the single best trial.
    floor_by_cycle: list[float | None] | None = None
    # +1 for a max metric, -1 for a min metric: the scores above are oriented (a min metric's are -value), and the
    # rationales show `sign * score`, the metric's own value (a user copied the -0.029 shown into a target).
    sign: float = 1.0


@dataclass(frozen=True)
class Decision:
    """Continue or stop, why, and the exit code if stopping."""

    cycle: int
    stop: bool
    reason: StopReason
    exit_code: int
    rationale: str
    best_selection_score: float | None

    def as_json(self) -> dict[str, object]:
        """For decision.json."""
        return {**asdict(self), "reason": self.reason.value, "decision": "stop" if self.stop else "continue"}


def improved(new: float | None, old: float | None, min_delta: float, *, beyond: bool = False) -> bool:
    """Whether `new` improves on `old` by min_delta; a missing `new` never does, anything beats a missing `old`.

    The campaign's best must rise strictly and by at least min_delta (the plateau rule, agent=hybrid's stall);
    a child must beat its parent by more than min_delta (`beyond`). The two differ only for a gain of exactly
    min_delta > 0, and each keeps the meaning it has always had.
    """
    if new is None:
        return False
    if old is None:
        return True
    return new > old + min_delta if beyond else (new > old and new >= old + min_delta)


# The scheduler (ASHA, the forecaster) stopped every trial: the child is discarded unjudged. A user's children with
# 1-2 trials each were all stopped at epoch 2 (grace_period 2), and the console said only `discarded`: the hint is here.
NO_SCORE_REASON = (
    "not judged: no trial completed, the scheduler stopped every trial before its last epoch (to judge such children, "
    "raise scheduler.grace_period or population.trials_per_child)"
)
# No trial completed, and none was stopped by the scheduler: the campaign's own stop (a stop request, its time budget)
# cut them. Nothing was judged, so intervention_effects leaves the child out of its tries (sql.py).
CUT_BY_STOP_REASON = (
    "not judged: the campaign's own stop (stop request or time budget) cut every trial before its last epoch"
)


def child_verdict(
    trials: int,
    failed: int,
    score: float | None,
    parent_score: float | None,
    min_delta: float,
    reason: str | None,
    comparison: Comparison | None = None,
    cut: int = 0,
) -> tuple[VariantStatus, str | None]:
    """A trained child's status and reason: crashed if every trial failed, kept if it beat its parent, else discarded.

    `trials`, `failed` and `cut` count the child's trials this cycle (`cut`: those the campaign's own stop ended,
    ledger.STOPPED_WITH_CYCLE); `reason` is the one it carries so far. With a
    `comparison` (replicates on) the child is kept only if its replicates beat its parent's at the stated
    confidence, and its reason is that evidence; without one, its best trial must beat the parent's by min_delta.
    """
    if trials and failed == trials:
        return VariantStatus.crashed, "every trial failed"
    if score is None and trials:
        if cut and failed + cut == trials:  # the scheduler stopped none: the campaign's stop left nothing to judge
            return VariantStatus.discarded, CUT_BY_STOP_REASON
        return VariantStatus.discarded, NO_SCORE_REASON  # nothing to judge: its trials were stopped before the end
    if comparison is not None:
        status = VariantStatus.kept if comparison.better else VariantStatus.discarded
        return status, comparison.text()
    if improved(score, parent_score, min_delta, beyond=True):
        return VariantStatus.kept, reason
    return VariantStatus.discarded, reason or ("not trained (stopped)" if not trials else None)


def generation_decided(deepest: int, decided: int, last: bool) -> int | None:
    """The generation an asynchronous campaign records a decision under, or None for none yet.

    `deepest`: the deepest generation with a verdict (the seed's 1 once its knob search closed); `decided`: the last
    generation with a decisions row (0 for none). The engine counts closed generations' worth of children, which an
    async campaign's generations of variants need not reach (1 x 2 children of the seed: all generation 2, three
    closed), and it may stop between two counts. So a generation's row is its last decision: a continue is recorded
    for the generation before once a deeper one has a verdict, never under a row already there; a stop (or the run's
    last decision) for the deepest, or for `decided` when that is deeper (a resumed older run's rows count closed
    generations): it may replace that generation's row, its last decision.
    """
    if last:
        return max(deepest, decided)
    return deepest - 1 if deepest - 1 > decided else None


def unjudged_note(reason: str | None, best: float | None) -> str:
    """What a console verdict line adds for a child no trial of which completed (`best` None): its reason (why it
    was not judged, with the fix); "" for a judged child."""
    return f" ({reason})" if best is None and reason else ""


def gate_fail_streak(streak: int, asked: list[VariantStatus], coder: bool) -> int:
    """Cycles in a row in which children were asked of a coder and the gate rejected every one of them."""
    if coder and asked and all(status is VariantStatus.rejected for status in asked):
        return streak + 1
    return 0 if asked else streak  # a cycle that asked for no child leaves the streak as it was


def plateau_length(best_by_cycle: list[float | None], min_delta: float) -> int:
    """Cycles since the best last rose (strictly, and by at least min_delta) over the best before it."""
    since, reference = 0, None
    for value in best_by_cycle:
        if improved(value, reference, min_delta):
            reference, since = value, 0
        else:
            since += 1
    return since


def decide(facts: CycleFacts, guards: SafeguardsConfig) -> Decision:
    """Apply the stop rules in order; the first that fires decides."""
    best = facts.best_by_cycle[-1] if facts.best_by_cycle else None
    floors = facts.floor_by_cycle
    # With replicates, the target and the plateau read the score reached with the stated confidence (the floor).
    reached = (floors[-1] if floors else None) if floors is not None else best
    stale = plateau_length(floors if floors is not None else facts.best_by_cycle, guards.min_delta)
    sign = facts.sign
    # The floor is a lower bound of oriented scores: for a min metric, an upper bound of its values.
    measure = (
        f"the {guards.confidence:.0%} {'upper' if sign < 0 else 'lower'} bound of the best replicated variant"
        if floors is not None
        else "best selection score"
    )
    num = lambda score: _num(score, sign)  # noqa: E731
    # The campaign's budgets: one rule each, shared with a resume's check (`spent_budgets`).
    spent = {
        b.reason: b
        for b in spent_budgets(facts.cycle, facts.elapsed_s, facts.tokens_campaign, facts.cost_campaign, guards)
    }
    rules: list[tuple[bool, StopReason, str]] = [
        (
            facts.manual_stop,
            StopReason.manual_stop,
            "a stop was requested (STOP file or `ralph-ray stop`); the cycle ended cleanly",
        ),
        (
            facts.target is not None and reached is not None and reached >= facts.target,
            StopReason.target_met,
            f"{measure} {num(reached)} {'is at or below' if sign < 0 else 'reached'} the target {num(facts.target)}",
        ),
        (
            best is None,
            StopReason.no_trial_completed,
            "no trial has completed: check the trial logs (stderr.log in each trial dir)",
        ),
        (
            guards.tokens_per_cycle is not None and facts.tokens_cycle > guards.tokens_per_cycle,
            StopReason.token_budget,
            f"agents used {facts.tokens_cycle} tokens this cycle, over "
            f"safeguards.tokens_per_cycle={guards.tokens_per_cycle}",
        ),
        _spent_rule(spent, StopReason.token_budget),
        _spent_rule(spent, StopReason.cost_budget),
        (
            facts.gate_fail_streak >= guards.gate_fail_cycles,
            StopReason.gate_failures,
            f"no child passed the validation gate for {facts.gate_fail_streak} cycles "
            f"(safeguards.gate_fail_cycles={guards.gate_fail_cycles})",
        ),
        (
            stale >= guards.plateau_cycles,
            StopReason.plateau,
            f"{measure} has not {'fallen' if sign < 0 else 'risen'} by min_delta={guards.min_delta} for {stale} cycles "
            f"(safeguards.plateau_cycles={guards.plateau_cycles})",
        ),
        _spent_rule(spent, StopReason.campaign_time),
        _spent_rule(spent, StopReason.max_cycles),
    ]
    for fired, reason, rationale in rules:
        if fired:
            return Decision(facts.cycle, True, reason, int(EXIT_CODES[reason]), rationale, best)
    return Decision(
        facts.cycle, False, StopReason.none, int(ExitCode.ok), _continue_text(facts, guards, reached, stale), best
    )


def _continue_text(facts: CycleFacts, guards: SafeguardsConfig, reached: float | None, stale: int) -> str:
    """Why the campaign goes on, naming the figures the rules read: with replicates the plateau count and the target
    read the floor (a lower bound), not the best single trial (user trial: "best 0.9805, 1 cycle(s) without
    improvement" while the best trial had just risen; a target that looked met by the best trial went unexplained)."""
    best, sign, left = facts.best_by_cycle[-1], facts.sign, guards.max_cycles - facts.cycle
    if facts.floor_by_cycle is None:
        parts = [f"continue: best {_num(best, sign)}", f"{stale} cycle(s) without improvement"]
        measure = "the best selection score"
    else:
        bound = "upper" if sign < 0 else "lower"
        measure = f"the best variant's {guards.confidence:.0%} {bound} bound"
        floor = (
            f"{measure} {_num(reached, sign)}" if reached is not None else f"no {bound} bound yet (nothing replicated)"
        )
        parts = [
            f"continue: {floor} (best single trial {_num(best, sign)})",
            f"{stale} cycle(s) without the {bound} bound {'falling' if sign < 0 else 'rising'} by min_delta",
        ]
    if facts.target is not None:
        target = f"target {_num(facts.target, sign)} not yet met"
        parts.append(f"{target}: {measure} is {_num(reached, sign)}" if reached is not None else target)
    return ", ".join([*parts, f"{left} cycle(s) left"])


# The stop rules of the campaign's budgets (`spent_budgets`): a resume re-decides them at once when the run stopped
# on one (nothing was cut short to run again).
BUDGET_REASONS = frozenset(
    {StopReason.token_budget, StopReason.cost_budget, StopReason.campaign_time, StopReason.max_cycles}
)


@dataclass(frozen=True)
class Spent:
    """A campaign budget a run has used up: the stop rule, what was used, and the override that gives as much again."""

    reason: StopReason
    used: str  # e.g. "the campaign ran 248s, past safeguards.campaign_time_s=240"
    override: str  # e.g. "safeguards.campaign_time_s=488"

    @property
    def key(self) -> str:
        """The setting the override raises."""
        return self.override.split("=", 1)[0]


def spent_budgets(cycle: int, elapsed_s: float, tokens: int, cost: float, guards: SafeguardsConfig) -> list[Spent]:
    """The campaign budgets of `guards` that a run at `cycle`, having used `elapsed_s`, `tokens` and `cost`, has
    spent: the stop rules that fire whatever its scores. `decide` stops on them; a resume under the same limits
    would stop again at once, so it is refused with the overrides."""
    spent = []
    if guards.tokens_per_campaign is not None and tokens > guards.tokens_per_campaign:
        spent.append(
            Spent(
                StopReason.token_budget,
                f"agents used {tokens} tokens in the campaign, over "
                f"safeguards.tokens_per_campaign={guards.tokens_per_campaign}",
                f"safeguards.tokens_per_campaign={tokens + guards.tokens_per_campaign}",
            )
        )
    if guards.cost_per_campaign is not None and cost > guards.cost_per_campaign:
        spent.append(
            Spent(
                StopReason.cost_budget,
                f"agents cost {cost:.4f}, over safeguards.cost_per_campaign={guards.cost_per_campaign}",
                f"safeguards.cost_per_campaign={cost + guards.cost_per_campaign:.4f}",
            )
        )
    if guards.search_time_s is not None and elapsed_s >= guards.search_time_s:
        # as much search time again: the new limit less the final share is elapsed + the old search time
        more = math.ceil(elapsed_s / (1.0 - guards.final_share) + guards.campaign_time_s)  # type: ignore[operator]
        spent.append(
            Spent(
                StopReason.campaign_time,
                f"the campaign ran {elapsed_s:.0f}s, past {_time_rule(guards)}",
                f"safeguards.campaign_time_s={more}",
            )
        )
    if cycle >= guards.max_cycles:
        spent.append(
            Spent(
                StopReason.max_cycles,
                f"cycle {cycle} of safeguards.max_cycles={guards.max_cycles}",
                f"safeguards.max_cycles={cycle + guards.max_cycles}",
            )
        )
    return spent


def _spent_rule(spent: dict[StopReason, Spent], reason: StopReason) -> tuple[bool, StopReason, str]:
    """`decide`'s rule for one campaign budget: fired when spent, with what was used as its rationale."""
    found = spent.get(reason)
    return found is not None, reason, found.used if found is not None else ""


def _time_rule(guards: SafeguardsConfig) -> str:
    """The time rule a campaign stops on: its whole budget, or the search's part of it before the final training."""
    if not guards.final_share:
        return f"safeguards.campaign_time_s={guards.campaign_time_s}"
    return (
        f"its search time {guards.search_time_s:.0f}s (safeguards.campaign_time_s={guards.campaign_time_s} less "
        f"final_share={guards.final_share:g} for the final training of the pick)"
    )


def _num(score: float | None, sign: float = 1.0) -> str:
    """A score in a rationale as the metric's value (`sign * score`) at 4 decimals, as every page shows it (the KB
    row keeps the full oriented value)."""
    return "-" if score is None else f"{sign * score:.4f}"


def budgets_line(decision: Decision, facts: CycleFacts, guards: SafeguardsConfig) -> str:
    """What a decision read against its limits, for the console: cycles (the count max_cycles reads: an async
    decision names a generation of variants instead), time, tokens, the plateau rule."""

    def budget(used: object, limit: object) -> str:
        return f"{used}/{limit}" if limit is not None else f"{used}"

    time = budget(round(facts.elapsed_s), guards.campaign_time_s)
    tokens = budget(facts.tokens_campaign, guards.tokens_per_campaign)
    return (
        f"budgets: cycle {facts.cycle}/{guards.max_cycles}, time {time}s, tokens {tokens}, "
        f"plateau rule {guards.plateau_cycles} cycles"
    )
