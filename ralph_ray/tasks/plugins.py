"""Tasks installed as packages: the entry-point group `ralph_ray.tasks` names a package whose folder is a task folder.

A distribution declares `[project.entry-points."ralph_ray.tasks"] mytask = "mypkg.mytask"`; `task=mytask` then runs
the folder of `mypkg.mytask` (prepare.py, train.py, program.md, task.yaml). The folder is found without running any
of the package's code (its top-level package through the import system's finders, the rest as folders): its
prepare.py loads only through `tasks.folder`, as any task folder's does.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path

from ralph_ray.tasks.folder import PARTS, TaskError

GROUP = "ralph_ray.tasks"


@dataclass(frozen=True)
class Plugin:
    """One entry point of the group: the task's name, the package it names, and the distribution that declares it."""

    name: str
    package: str
    attr: str | None  # `mypkg.mytask:obj`: an object, not a folder (refused by `folder`)
    distribution: str  # "mydist 0.1", for messages
    project: str  # "mydist": what `pip uninstall` takes

    def __str__(self) -> str:
        return f"plug-in {self.package} (entry point {self.name!r} of {self.distribution})"

    def folder(self) -> Path:
        """The package's folder, found without importing it; raises TaskError with the fix when there is none."""
        fix = (
            f'in the pyproject.toml of {self.distribution}, point [project.entry-points."{GROUP}"] {self.name} at a '
            f"package whose folder holds {', '.join(PARTS)}, then reinstall it (or uninstall it)"
        )
        if self.attr is not None:
            raise TaskError(f"{self} names an object ({self.package}:{self.attr}), not a task folder", fix)
        folder = _package_folder(self.package)
        if folder is None:
            raise TaskError(
                f"{self} names {self.package}, which is no package folder on sys.path "
                "(not installed, or a module: a task is a folder)",
                fix,
            )
        return folder


def installed() -> list[Plugin]:
    """Every task entry point of the installed distributions, in discovery order (read afresh: sys.path may change)."""
    return [_plugin(point) for point in entry_points(group=GROUP)]


def _plugin(point: EntryPoint) -> Plugin:
    dist = point.dist
    project = "NAME" if dist is None else dist.metadata["Name"]
    where = "an unknown distribution" if dist is None else f"{project} {dist.version}"
    return Plugin(point.name, point.module, point.attr, where, project)


def _package_folder(dotted: str) -> Path | None:
    """The folder of a (dotted) package, found without running any of its code (None: no such package folder).

    The top-level name goes through the import system's finders (a plain or an editable install), which find it
    without importing it; below it, a subpackage is a folder inside its parent's (`importlib.util.find_spec("a.b")`
    would import `a`, running its __init__.py).
    """
    top, *rest = dotted.split(".")
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):  # e.g. a name that is not an identifier
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    folders = [Path(location) for location in spec.submodule_search_locations]
    for part in rest:
        folders = [folder / part for folder in folders if (folder / part).is_dir()]
    return folders[0].resolve() if folders else None
