"""The score-against-cost front (ralph_ray.front): what a score cost, and the points no cheaper point beats."""

from __future__ import annotations

import pytest

from ralph_ray.front import cost_front, cost_seconds


def front_ids(points: list[tuple[str, float, float]], direction: str = "max") -> list[str]:
    """The ids on the front of (id, cost, score) points."""
    return [p[0] for p in cost_front(points, cost=lambda p: p[1], score=lambda p: p[2], direction=direction)]


def test_the_front_keeps_only_points_no_cheaper_point_beats_cheapest_first():
    points = [
        ("slow-best", 90.0, 0.99),
        ("cheap", 10.0, 0.95),
        ("dominated", 50.0, 0.94),  # costs more than `cheap` and scores less
        ("mid", 30.0, 0.97),
        ("tie-dearer", 30.0, 0.96),  # same cost as `mid`, lower score
        ("same-score-dearer", 40.0, 0.97),  # scores as `mid` for more: a gain of nothing bought with compute
    ]
    assert front_ids(points) == ["cheap", "mid", "slow-best"]
    assert front_ids([]) == []


def test_a_min_metric_front_reads_lower_as_better():
    losses = [("slow-low", 90.0, 0.10), ("cheap-high", 10.0, 0.50), ("dominated", 50.0, 0.60), ("mid", 30.0, 0.30)]
    assert front_ids(losses, "min") == ["cheap-high", "mid", "slow-low"]
    # The same numbers read as a max metric: a different front (the 0.60 becomes the best, the 0.10 the worst).
    assert front_ids(losses, "max") == ["cheap-high", "dominated"]


def test_exact_ties_are_one_point_and_unknowns_are_left_out():
    points = [("first", 10.0, 0.9), ("twin", 10.0, 0.9), ("no-cost", None, 1.0), ("no-score", 1.0, float("nan"))]
    assert front_ids(points) == ["first"]
    assert front_ids(list(reversed(points))) == ["twin"]


def test_a_direction_other_than_max_or_min_is_refused_with_the_choices():
    with pytest.raises(ValueError, match="'max' or 'min'"):
        front_ids([("a", 1.0, 1.0)], "maximize")


@pytest.mark.parametrize(
    ("train", "wall", "cost"),
    [(12.0, 40.0, 12.0), (None, 40.0, 40.0), (0.0, 40.0, 40.0), (float("nan"), 7.5, 7.5), (None, None, None)],
)
def test_the_cost_is_training_seconds_where_reported_else_wall_seconds(train, wall, cost):
    assert cost_seconds(train, wall) == cost
