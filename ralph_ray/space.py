"""The search space's pure rules, shared by the search (Tune, Optuna) and the agents: which knobs a relative search
samples as factors on a variant's own values, and the value a trial trains for a variant's own value."""

from __future__ import annotations

from typing import Any

from ralph_ray.config import Config, KnobSpace, SpaceKind
from ralph_ray.knobs import Bounds, KnobError, read_knobs, resolve_knobs


def relative_knobs(space: dict[str, KnobSpace], span: float = 2.0) -> dict[str, Bounds]:
    """Knobs that can be searched relative to a variant's value (numeric ranges and all-numeric choices), with the
    space each was declared in: a trial's value stays inside it (knobs.resolve_knobs). `span`: search.relative_span."""
    return {
        name: _bounds(knob, span)
        for name, knob in space.items()
        if knob.type is not SpaceKind.choice
        or all(isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 for v in knob.values or [])
    }


def _bounds(knob: KnobSpace, span: float) -> Bounds:
    if knob.type is SpaceKind.choice:
        values = tuple(knob.values or [])
        return Bounds(min(values), max(values), choices=values, span=span)
    low, high = float(knob.low), float(knob.high)  # type: ignore[arg-type]
    return Bounds(low, high, integer=knob.type is SpaceKind.int, log=knob.type is SpaceKind.loguniform, span=span)


def plain(value: Any) -> Any:
    """A knob value with its tuples as lists (JSON's view): a trainer's `(128, 64)` is the choice `[128, 64]`."""
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


def clip_to_space(knobs: dict[str, Any], space: dict[str, KnobSpace], relative: bool = False) -> dict[str, Any]:
    """A variant's own knob values as a point of the search space (Optuna refuses points outside it).

    In a relative search a variant's own values are the factor 1 (the middle choice for choices).
    """
    point: dict[str, Any] = {}
    movable = relative_knobs(space) if relative else frozenset()
    for name, knob in space.items():
        value = knobs.get(name)
        if name in movable:
            point[name] = 1.0
            continue
        if knob.type is SpaceKind.choice:
            values = list(knob.values or [])
            same = [v for v in values if plain(v) == plain(value)]
            if same:
                point[name] = same[0]
            elif isinstance(value, (int, float)) and all(isinstance(v, (int, float)) for v in values):
                point[name] = min(values, key=lambda v: abs(v - value))
            else:
                point[name] = values[0]
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            low, high = float(knob.low), float(knob.high)  # type: ignore[arg-type]
            clipped = min(max(float(value), low), high)
            point[name] = int(round(clipped)) if knob.type is SpaceKind.int else clipped
        else:
            point[name] = knob.low if knob.type is not SpaceKind.int else int(knob.low)  # type: ignore[arg-type]
    return point


def trained_value(name: str, value: Any, space: dict[str, KnobSpace], relative: bool) -> Any:
    """What a child's first trial trains for its own `value` of the searched knob `name` (the trials after it search
    around that): held in the declared space as `clip_to_space` (sampled outright) or `resolve_knobs` (relatively)
    hold it. The offline agent's knob moves read it, so a move is never recorded as one its trials did not train."""
    moved = relative_knobs(space) if relative else {}
    if name in moved:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return value
        return resolve_knobs({name: 1.0}, {name: value}, moved)[name]
    return clip_to_space({name: value}, {name: space[name]})[name]


def seed_off_space(cfg: Config) -> str | None:
    """A warning naming the seed's knob values the search space does not hold, and what the seed's own trial trains
    for each instead (a user's `HIDDEN_SIZES = (128, 64)` trained the first choice `[64, 32]` without a word); None
    where every value is in the space."""
    entry = cfg.seed_entry()
    try:
        knobs = read_knobs(entry.read_text())
    except (OSError, SyntaxError, ValueError, KnobError):
        return None
    swapped = []
    for name, space in cfg.search.space.items():
        if name not in knobs:
            continue
        trained = clip_to_space({name: knobs[name]}, {name: space})[name]
        if plain(trained) != plain(knobs[name]):
            held = (
                f"the choices {space.values}" if space.type is SpaceKind.choice else f"[{space.low:g}, {space.high:g}]"
            )
            swapped.append(f"{name} = {knobs[name]!r} is not in {held}: the seed's own trial trains {trained!r}")
    if not swapped:
        return None
    return f"{entry}'s " + "; ".join(swapped) + " (add the value to search.space, or widen its range, to train it)"
