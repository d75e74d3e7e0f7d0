"""Code interventions as syntax-tree transforms (libcst): they find idioms, not lines.

Each transform takes a trainer's source and returns it edited, or raises `NotApplicable` with the reason
(the idiom it needs is missing, or the trainer already has what it adds). One module per family of idioms:
norm layers, regularisation, schedule, step, data, capacity, data parallelism, and the Forge techniques.
"""

from __future__ import annotations

from ralph_ray.agents.transforms import (  # noqa: F401 (registers)
    capacity,
    data,
    forge,
    norm,
    parallel,
    regularisation,
    schedule,
    step,
)
from ralph_ray.agents.transforms._registry import TRANSFORMS, Transform
from ralph_ray.agents.transforms._tree import (
    MODEL_LIBRARIES,
    Found,
    NotApplicable,
    analyse,
    dry_run,
    model_module,
    model_source,
)

__all__ = [
    "MODEL_LIBRARIES",
    "TRANSFORMS",
    "NotApplicable",
    "Transform",
    "analyse",
    "applicability",
    "apply_transform",
    "check_transform",
    "model_module",
    "model_source",
]


def apply_transform(name: str, source: str) -> str:
    """`source` with the transform `name` applied; NotApplicable (with the reason) when it cannot apply."""
    try:
        transform = TRANSFORMS[name]
    except KeyError:
        raise KeyError(f"no transform {name!r} (known: {', '.join(sorted(TRANSFORMS))})") from None
    return transform.fn(source)


def check_transform(name: str, source: str) -> None:
    """Return when the transform `name` applies to `source` (found, not rendered: fast); NotApplicable otherwise."""
    try:
        transform = TRANSFORMS[name]
    except KeyError:
        raise KeyError(f"no transform {name!r} (known: {', '.join(sorted(TRANSFORMS))})") from None
    with dry_run():
        try:
            transform.fn(source)
        except Found:
            return


def applicability(source: str) -> dict[str, str | None]:
    """For every transform: None when it applies to `source`, else the reason it does not."""
    result: dict[str, str | None] = {}
    for name in TRANSFORMS:
        try:
            check_transform(name, source)
            result[name] = None
        except NotApplicable as reason:
            result[name] = str(reason)
    return result
