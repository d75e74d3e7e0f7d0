"""The transform registry: intervention name -> a function from trainer source to edited source."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

Fn = Callable[[str], str]


@dataclass(frozen=True)
class Transform:
    """One code intervention as a syntax-tree transform."""

    name: str
    family: str  # the module it lives in: norm, regularisation, schedule, step, data, capacity, forge
    fn: Fn


TRANSFORMS: dict[str, Transform] = {}


def register(name: str, family: str) -> Callable[[Fn], Fn]:
    """Register `fn` as the transform called `name`."""

    def decorate(fn: Fn) -> Fn:
        if name in TRANSFORMS:
            raise ValueError(f"transform {name!r} is registered twice")
        TRANSFORMS[name] = Transform(name, family, fn)
        return fn

    return decorate
