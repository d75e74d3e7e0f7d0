"""Parent selection: the top variants by selection score, with exploration so one lineage does not take over."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Candidate:
    """A variant that has a completed trial: its best score and the knobs of that trial."""

    variant_id: str
    selection_score: float
    best_knobs: dict[str, Any]
    branch: str  # the first-generation ancestor (the seed's child it descends from; the seed itself for the seed)


def branch_of(variant_id: str, parents: dict[str, str | None]) -> str:
    """The ancestor just below the root (or the root itself): variants of one branch share it."""
    chain = [variant_id]
    seen = {variant_id}
    while (parent := parents.get(chain[-1])) is not None and parent not in seen:
        chain.append(parent)
        seen.add(parent)
    return chain[-2] if len(chain) >= 2 else chain[-1]


def select_parents(
    ranked: list[Candidate], k: int, explore: float, one_per_lineage: bool, rng: random.Random
) -> list[Candidate]:
    """Pick up to k parents from `ranked` (best first).

    The best variant always leads. Each further slot goes, with probability `explore`, to a random
    variant outside the picks; otherwise to the next best, skipping variants of a branch that already
    has a parent when `one_per_lineage` (filled from the skipped ones if too few branches exist).
    """
    if not ranked or k <= 0:
        return []
    picks = [ranked[0]]
    rest = list(ranked[1:])
    while len(picks) < k and rest:
        if explore > 0 and rng.random() < explore:
            choice = rest[rng.randrange(len(rest))]
        else:
            taken = {p.branch for p in picks}
            fresh = [c for c in rest if c.branch not in taken] if one_per_lineage else rest
            choice = (fresh or rest)[0]
        picks.append(choice)
        rest.remove(choice)
    return picks
