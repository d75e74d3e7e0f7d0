"""The front of score against cost: what a score cost (trial seconds), and the points no cheaper point beats.

Pure functions, no engine imports: the report and the app (which may read only the KB otherwise) both call them,
so a variant or trial is on the front in one place by one rule.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

T = TypeVar("T")

COST_HELP = (
    "what the score cost: the trial's training seconds where its trainer reported them (train_seconds; "
    "under trial.budget_s every trial has the same budget), else its wall seconds"
)


def cost_seconds(train_seconds: Any, wall_seconds: Any) -> float | None:
    """A trial's cost: its last reported training seconds where it reported any, else its wall seconds (or None)."""
    if _known(train_seconds) and train_seconds > 0:
        return float(train_seconds)
    return float(wall_seconds) if _known(wall_seconds) else None


def cost_front(
    items: Iterable[T], cost: Callable[[T], float], score: Callable[[T], float], direction: str = "max"
) -> list[T]:
    """The items no other item scores at least as well for no more cost (the Pareto front), cheapest first.

    `direction` is the score's: "max" (higher is better; the KB's oriented scores) or "min" (a raw loss). Of two
    items with the same cost and score, the first given stands for both. Items without a cost or score are left out.
    """
    if direction not in ("max", "min"):
        raise ValueError(f"direction must be 'max' or 'min', not {direction!r}")
    sign = -1.0 if direction == "min" else 1.0  # compared one way below: higher sign * score is better
    scored = [item for item in items if _known(cost(item)) and _known(score(item))]
    front: list[T] = []
    for item in sorted(scored, key=lambda i: (cost(i), -sign * score(i))):  # stable: ties keep the given order
        if not front or sign * score(item) > sign * score(front[-1]):
            front.append(item)
    return front


def _known(value: Any) -> bool:
    """A number that is there (not None, not NaN: pandas reads a missing number as NaN)."""
    return value is not None and not (isinstance(value, float) and math.isnan(value))
