"""Tasks are folders (see `ralph_ray.tasks.folder`); this is the registry of the ones a bare name can pick.

`TASKS` maps each shipped task's name to its folder under `trainers/` (any folder there with a prepare.py);
installed packages add theirs through the entry-point group `ralph_ray.tasks` (`ralph_ray.tasks.plugins`), in the
same namespace (`find_task`, `task_names`). `task=<name>` picks one, `task=./path` any folder anywhere. The engine
holds no task-specific code: a task's splits and metric come from its own frozen prepare.py, loaded on the driver
only. This package imports no config (config imports it), so the registry adds no import cycle.
"""

from __future__ import annotations

import dataclasses
import shlex
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ralph_ray import PROJECT_ROOT
from ralph_ray.tasks.base import DataError, Experiment, Labels, Metric, MetricKind, Splits, public_array
from ralph_ray.tasks.folder import TaskError, TaskFolder, load_task
from ralph_ray.tasks.images import image_inputs, read_images
from ralph_ray.tasks.plugins import GROUP, installed

__all__ = [
    "TASKS",
    "DataError",
    "Labels",
    "Metric",
    "Splits",
    "TaskError",
    "TaskRef",
    "find_task",
    "image_inputs",
    "prepare_splits",
    "prepare_task",
    "read_images",
    "task_names",
]

SHIPPED = PROJECT_ROOT / "trainers"


@dataclass(frozen=True)
class TaskRef:
    """A task a bare name picks (shipped, or an installed plug-in): its name and folder (prepare.py loads on use)."""

    name: str
    folder: Path

    def load(self) -> TaskFolder:
        """The loaded task (its metric, its frozen preparation)."""
        return load_task(self.folder)

    @property
    def data_root(self) -> str | None:
        """What `data.root` must hold (None: the task needs no data root)."""
        return self.load().data_root


TASKS: dict[str, TaskRef] = {
    p.parent.name: TaskRef(p.parent.name, p.parent) for p in sorted(SHIPPED.glob("*/prepare.py"))
}


def find_task(name: str) -> TaskRef | None:
    """The task a bare name picks: a shipped one or an installed plug-in (None: neither).

    Shipped tasks and plug-ins share one namespace: a name that two of them claim is refused (TaskError naming
    each), never settled silently; so is a plug-in whose entry point names no package folder.
    """
    plugins = [plugin for plugin in installed() if plugin.name == name]
    shipped = TASKS.get(name)
    claims = ([f"the shipped task {shipped.folder}"] if shipped is not None else []) + [str(p) for p in plugins]
    if len(claims) > 1:
        raise TaskError(
            f"{len(claims)} tasks are named {name!r}: {'; '.join(claims)}",
            f'rename the plug-in\'s entry point under [project.entry-points."{GROUP}"] in its pyproject.toml and '
            f"reinstall it, or uninstall it (pip uninstall {' '.join(sorted({p.project for p in plugins}))}); "
            "task=./path/to/folder runs a folder of your own (a copy, not a shipped one) whatever its name",
        )
    if shipped is not None:
        return shipped
    return TaskRef(name, plugins[0].folder()) if plugins else None


def task_names() -> list[str]:
    """Every name a bare `task=<name>` can pick: the shipped tasks, then the installed plug-ins (sorted)."""
    return list(TASKS) + sorted({plugin.name for plugin in installed()} - set(TASKS))


def prepare_task(folder: TaskFolder, cfg: Experiment) -> Splits:
    """Run a task's frozen prepare and check what it returned; raises DataError with the fix when it fails."""
    where = folder.path / "prepare.py"
    try:
        splits = folder.prepare(cfg.task, cfg.data)
    except DataError:
        raise
    except Exception as err:  # noqa: BLE001 - the user's prepare: one clear error, not a traceback from deep inside
        # The cause stays attached: `python -m ralph_ray.prepare` prints its traceback (the campaign prints the line).
        raise DataError(
            f"{where}: prepare() failed ({type(err).__name__}: {err})\n"
            f"  fix: fix the data or prepare(); `{reproduce(folder, cfg)}` runs prepare() alone and prints its "
            "traceback"
        ) from err
    if not isinstance(splits, Splits):
        raise DataError(
            f"{where}: prepare() returned {type(splits).__name__}, not ralph_ray.tasks.base.Splits\n"
            "  fix: return Splits(train_x, train_y, selection_x, selection_y, test_x, test_y, num_classes)"
        )
    for split in ("train", "selection", "test"):
        x, y = getattr(splits, f"{split}_x"), getattr(splits, f"{split}_y")
        if len(x) != len(y) or len(x) == 0:
            raise DataError(
                f"{where}: the {split} split has {len(x)} inputs and {len(y)} labels/targets\n"
                "  fix: return as many labels/targets as inputs, at least one of each"
            )
    if folder.metric.kind.value == "classification" and (
        splits.num_classes < 2 or not np.issubdtype(np.asarray(splits.selection_y).dtype, np.integer)
    ):
        raise DataError(
            f"{where}: metric {folder.metric.name} scores classes, but num_classes={splits.num_classes} "
            f"and the labels are {np.asarray(splits.selection_y).dtype}\n"
            "  fix: return integer class labels and num_classes >= 2, "
            "or declare a regression/custom METRIC"
        )
    # What trials read must memory-map (harness.load_data): text becomes fixed-width strings, other objects stop here,
    # before Ray starts, for `ralph_ray.prepare` and the campaign alike.
    # (Class labels are public as int64 ids, target_array: not converted here.)
    labels = () if folder.metric.kind is MetricKind.classification else ("train_y",)
    names = ("train_x", "selection_x", "test_x", *labels)
    public = {name: public_array(getattr(splits, name), name, str(where)) for name in names}
    return dataclasses.replace(splits, metric=folder.metric, **public)


def reproduce(folder: TaskFolder, cfg: Experiment) -> str:
    """The command that runs a task's prepare() alone, with the split and data settings the failing run had (the
    task's own values: a task.yaml may set them, so each is given)."""
    data, args = cfg.data, [f"task={folder.path}"]
    task = cfg.task
    args += [f"task.{key}={getattr(task, key)}" for key in ("split_seed", "selection_fraction", "test_fraction")]
    if getattr(task, "subsample", 0):  # a task that reads it (fashion): another sample is another failure
        args.append(f"task.subsample={task.subsample}")
    if data.root:
        args.append(f"data.root={data.root}")
    if not data.download:
        args.append("data.download=false")
    if data.url:
        args.append(f"data.url={data.url}")
    return shlex.join(["python", "-m", "ralph_ray.prepare", *args])


def prepare_splits(cfg: Experiment) -> Splits:
    """The task's deterministic splits, with its metric (raises DataError with the fix when data is missing)."""
    try:
        folder = load_task(cfg.task_folder())
    except TaskError as err:
        raise DataError(str(err)) from None  # config validation names the fix first; this is the late path
    return prepare_task(folder, cfg)
