"""Task folders: the parts a task needs, and its frozen `prepare.py` loaded on the driver (never in a trial).

A task folder holds `prepare.py` (frozen: `prepare(settings, data) -> Splits` and `METRIC`, optionally `score`,
`DATA_ROOT` and `hidden_paths(data)`: where the task reads labelled raw data outside `data.root`, which every sandboxed
run must not see), `train.py` (the mutable seed trainer), `program.md` (what an agent may change) and `task.yaml` (the
search space and defaults). Trials get a copy of the trainer files only (`task.trainer_files`: code and notes, not
data kept beside them): the frozen parts never reach a work dir.
"""

from __future__ import annotations

import hashlib
import importlib.util
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from ralph_ray.tasks.base import DataSource, Metric, MetricError, Splits, TaskSettings, declared_metric

# Every part of a task folder, and what it is for (the error for a missing part names it).
PARTS = {
    "prepare.py": "the frozen data preparation: `def prepare(settings, data) -> Splits` and `METRIC = {...}`",
    "train.py": "the seed trainer (UPPER_CASE knobs, harness calls)",
    "program.md": "what an agent may change",
    "task.yaml": "the search space and defaults for this task",
}
# The frozen parts, which stay on the driver: never in a variant, a work dir or an agent's view.
FROZEN_PARTS = ("prepare.py", "task.yaml")


class TaskError(ValueError):
    """A task folder the engine cannot use; `problem` and `fix` say what is wrong and what to do."""

    def __init__(self, problem: str, fix: str) -> None:
        super().__init__(f"{problem}\n  fix: {fix}")
        self.problem, self.fix = problem, fix


@dataclass(frozen=True)
class TaskFolder:
    """A loaded task: where it lives, its metric, and its frozen preparation."""

    name: str
    path: Path
    metric: Metric
    data_root: str | None  # what `data.root` must hold (None: the task needs no data root)
    prepare: Callable[[TaskSettings, DataSource], Splits]
    prepare_sha256: str
    # prepare.py's `hidden_paths(data)`: the raw data it reads outside data.root (a system folder, a package's)
    declared_hidden: Callable[[DataSource], Any] | None = None

    def hidden_paths(self, data: DataSource) -> list[Path]:
        """Where this task's labelled raw data lives besides data.root (which is hidden anyway): hidden from runs."""
        if self.declared_hidden is None:
            return []
        where = self.path / "prepare.py"
        fix = "return a list of folders or files (str or Path) from `def hidden_paths(data)` in prepare.py"
        try:
            found = self.declared_hidden(data)
        except Exception as err:  # the task's own code: say whose and why
            raise TaskError(f"{where}: hidden_paths(data) raised {type(err).__name__}: {err}", fix) from None
        if found is None:
            return []
        if isinstance(found, (str, Path)) or not isinstance(found, Iterable):
            raise TaskError(f"{where}: hidden_paths(data) returned {found!r}", fix)
        paths = list(found)  # once: a generator would be spent by the check below
        if not all(isinstance(p, (str, Path)) for p in paths):
            raise TaskError(f"{where}: hidden_paths(data) returned {paths!r}", fix)
        return [Path(p).expanduser().resolve() for p in paths]


def check_parts(path: Path) -> None:
    """Raise TaskError naming each part a task folder lacks."""
    if not path.is_dir():
        raise TaskError(
            f"task folder {path} does not exist",
            f"point task= at a folder holding {', '.join(PARTS)}, or create one: "
            f"python -m ralph_ray init {path.name} --template classification",
        )
    missing = [name for name in PARTS if not (path / name).is_file()]
    if missing:
        listing = "; ".join(f"{name} ({PARTS[name]})" for name in missing)
        raise TaskError(
            f"task folder {path} lacks {listing}",
            f"add {' and '.join(missing)} (`python -m ralph_ray init NAME --template ...` writes a complete folder)",
        )


def load_task(path: Path) -> TaskFolder:
    """Check a task folder and import its prepare.py (once per content); raises TaskError with the fix."""
    path = path.expanduser().resolve()
    check_parts(path)
    source = (path / "prepare.py").read_bytes()
    return _load(str(path), hashlib.sha256(source).hexdigest())


def prepare_module(path: Path) -> ModuleType:
    """A task folder's prepare.py as a module (for its own helpers, e.g. tests of a shipped task's loader)."""
    path = path.expanduser().resolve()
    digest = hashlib.sha256((path / "prepare.py").read_bytes()).hexdigest()
    return _module(str(path), digest)


_LOADED: dict[tuple[str, str], TaskFolder] = {}
_MODULES: dict[tuple[str, str], ModuleType] = {}


def _module(folder: str, digest: str) -> ModuleType:
    key = (folder, digest)
    if key not in _MODULES:
        _MODULES[key] = _import(Path(folder) / "prepare.py", f"ralph_task_{Path(folder).name}_{digest[:12]}")
    return _MODULES[key]


def _load(folder: str, digest: str) -> TaskFolder:
    key = (folder, digest)
    if key not in _LOADED:
        path = Path(folder)
        module = _module(folder, digest)
        prepare = getattr(module, "prepare", None)
        if not callable(prepare):
            raise TaskError(
                f"{path / 'prepare.py'} defines no prepare function",
                "add `def prepare(settings, data) -> Splits` returning the train / selection / test splits",
            )
        score = getattr(module, "score", None)
        try:
            metric = declared_metric(getattr(module, "METRIC", None), score if callable(score) else None)
        except MetricError as err:
            raise TaskError(f"{path / 'prepare.py'}: {err}", "declare the metric in prepare.py as shown") from None
        data_root: Any = getattr(module, "DATA_ROOT", None)
        root = None if data_root is None else str(data_root)
        hidden = getattr(module, "hidden_paths", None)
        if hidden is not None and not callable(hidden):
            raise TaskError(
                f"{path / 'prepare.py'}: hidden_paths is not a function",
                "define `def hidden_paths(data) -> list[Path]` (the raw data outside data.root), or remove it",
            )
        _LOADED[key] = TaskFolder(path.name, path, metric, root, prepare, digest, hidden)
    return _LOADED[key]


def _import(file: Path, name: str) -> ModuleType:
    """Import a task's prepare.py under a private name (so two tasks never share a module)."""
    spec = importlib.util.spec_from_file_location(name, file)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pickling inside prepare.py look the module up by name
    try:
        spec.loader.exec_module(module)
    except Exception as err:  # noqa: BLE001 - any failure of the user's module becomes one clear error
        sys.modules.pop(name, None)
        raise TaskError(
            f"{file} failed to import ({type(err).__name__}: {err})",
            f"run `python {file}` to see the full error and fix it",
        ) from None
    return module
