"""Parent selection: the best leads, branches spread, exploration picks outside the top."""

from __future__ import annotations

import random

from ralph_ray.population import Candidate, branch_of, select_parents


def cand(variant: str, score: float, branch: str) -> Candidate:
    return Candidate(variant, score, {}, branch)


def test_branch_is_the_first_generation_ancestor():
    parents = {"seed": None, "a": "seed", "a1": "a", "a11": "a1", "b": "seed"}
    assert branch_of("a11", parents) == "a"
    assert branch_of("a", parents) == "a"
    assert branch_of("b", parents) == "b"
    assert branch_of("seed", parents) == "seed"


def test_branch_survives_a_cycle_in_bad_data():
    assert branch_of("x", {"x": "y", "y": "x"}) in {"x", "y"}


def test_top_k_prefers_one_parent_per_branch():
    ranked = [cand("a2", 0.99, "a"), cand("a1", 0.98, "a"), cand("b1", 0.97, "b"), cand("c1", 0.90, "c")]
    picks = select_parents(ranked, 2, explore=0.0, one_per_lineage=True, rng=random.Random(0))
    assert [p.variant_id for p in picks] == ["a2", "b1"]
    plain = select_parents(ranked, 2, explore=0.0, one_per_lineage=False, rng=random.Random(0))
    assert [p.variant_id for p in plain] == ["a2", "a1"]


def test_one_branch_only_still_fills_the_slots():
    ranked = [cand("a2", 0.99, "a"), cand("a1", 0.98, "a")]
    assert [p.variant_id for p in select_parents(ranked, 3, 0.0, True, random.Random(0))] == ["a2", "a1"]


def test_exploration_reaches_beyond_the_top_and_is_seeded():
    ranked = [cand(f"v{i}", 1.0 - i / 100, f"b{i}") for i in range(20)]
    runs = [[p.variant_id for p in select_parents(ranked, 3, 1.0, True, random.Random(seed))] for seed in range(5)]
    assert all(r[0] == "v0" for r in runs)  # the best always leads
    assert any(set(r[1:]) - {"v1", "v2"} for r in runs)  # exploration picked outside the next best
    assert runs == [
        [p.variant_id for p in select_parents(ranked, 3, 1.0, True, random.Random(seed))] for seed in range(5)
    ]


def test_serial_loop_picks_only_the_best():
    ranked = [cand("a", 0.9, "a"), cand("b", 0.8, "b")]
    assert [p.variant_id for p in select_parents(ranked, 1, 0.5, True, random.Random(0))] == ["a"]
    assert select_parents([], 2, 0.0, True, random.Random(0)) == []
