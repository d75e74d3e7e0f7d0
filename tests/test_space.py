"""The search space's rules: a variant's own values as a point of the space, and what a relative search trains."""

from __future__ import annotations

import random

from ralph_ray.config import KnobSpace, SpaceKind
from ralph_ray.knobs import resolve_knobs
from ralph_ray.search import param_space
from ralph_ray.space import clip_to_space, relative_knobs

SPACE = {
    "DROPOUT": KnobSpace(SpaceKind.uniform, 0.0, 0.5),
    "LR": KnobSpace(SpaceKind.loguniform, 0.005, 0.05),
    "CHANNELS": KnobSpace(SpaceKind.int, 8, 24),
    "HIDDEN": KnobSpace(SpaceKind.choice, values=[16, 32, 64]),
}


def _factors(n: int, span: float) -> list[dict[str, float]]:
    """`n` draws of the relative search's factors from Tune's own domains (search.param_space)."""
    domains = param_space(SPACE, relative=True, span=span)
    rng = random.Random(0)
    return [
        {name: domain.sample(random_state=rng.randint(0, 2**31)) for name, domain in domains.items()} for _ in range(n)
    ]


def test_a_tuple_seed_value_matches_its_list_choice():
    """User trial: `HIDDEN_SIZES = (128, 64)` searched over `[[64, 32], [128, 64]]` trained the first choice."""
    space = {"HIDDEN_SIZES": KnobSpace(SpaceKind.choice, values=[[64, 32], [128, 64], [256, 128]])}
    assert clip_to_space({"HIDDEN_SIZES": (128, 64)}, space) == {"HIDDEN_SIZES": [128, 64]}
    assert clip_to_space({"HIDDEN_SIZES": (32, 16)}, space) == {"HIDDEN_SIZES": [64, 32]}  # not a choice: the first


def test_a_knob_at_zero_or_outside_its_range_is_searched_over_the_range():
    """User trial: DROPOUT = 0.0 over uniform [0, 0.5] trained 0.0 in every trial from cycle 2 on (0 times any factor
    is 0); LR below its range trained its low bound in every trial."""
    own = {"DROPOUT": 0.0, "LR": 0.001, "CHANNELS": 16, "HIDDEN": 32}
    relative = relative_knobs(SPACE, span=2.0)
    first = resolve_knobs({"DROPOUT": 1.0, "LR": 1.0, "CHANNELS": 1.0, "HIDDEN": 1.0}, own, relative)
    assert first == {"DROPOUT": 0.0, "LR": 0.005, "CHANNELS": 16, "HIDDEN": 32}  # as its coder wrote it, held in space
    trained = [resolve_knobs(factors, own, relative) for factors in _factors(60, 2.0)]
    dropout = [t["DROPOUT"] for t in trained]
    lr = [t["LR"] for t in trained]
    assert all(0.0 <= d <= 0.5 for d in dropout) and min(dropout) < 0.1 and max(dropout) > 0.4
    assert all(0.005 <= v <= 0.05 for v in lr) and min(lr) < 0.007 and max(lr) > 0.03
    assert len({round(v, 9) for v in lr}) == len(lr)  # not one bound over and over


def test_a_knob_at_a_bound_does_not_pile_its_samples_on_it():
    """User trial: CHANNELS at the top of its int range trained that top in half of its trials (factors above 1 all
    clipped to it): a factor past a bound is reflected back inside."""
    own = {"DROPOUT": 0.5, "LR": 0.05, "CHANNELS": 24, "HIDDEN": 64}
    relative = relative_knobs(SPACE, span=2.0)
    trained = [resolve_knobs(factors, own, relative) for factors in _factors(200, 2.0)]
    for name, top in (("DROPOUT", 0.5), ("LR", 0.05), ("CHANNELS", 24)):
        values = [t[name] for t in trained]
        assert all(SPACE[name].low <= v <= top for v in values)
        assert sum(v == top for v in values) < 0.1 * len(values), name
        assert min(values) < 0.6 * top  # still down to about half: the span searched around it


def test_a_recorded_value_reads_back_as_the_factor_that_trains_it():
    """A resumed async campaign rebuilds each study from the KB: a value searched over the range is read back as the
    factor that trains it, not as value / 0."""
    relative = relative_knobs(SPACE, span=3.0)
    for name, base in (("DROPOUT", 0.0), ("LR", 0.001), ("LR", 0.01), ("CHANNELS", 24)):
        bounds = relative[name]
        for factors in _factors(20, 3.0):
            value = resolve_knobs({name: factors[name]}, {name: base}, relative)[name]
            again = resolve_knobs({name: bounds.factor_of(base, value)}, {name: base}, relative)[name]
            assert abs(again - value) <= 1e-9 * max(1.0, abs(value)) or name == "CHANNELS" and abs(again - value) <= 1
