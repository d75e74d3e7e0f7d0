"""`python -m ralph_ray init NAME --template classification|regression|lm`: write a runnable task folder."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ralph_ray.exit_codes import ExitCode
from ralph_ray.tasks import SHIPPED, TASKS, find_task, task_names
from ralph_ray.tasks.folder import PARTS, TaskError, check_parts

# Starters written for a user's data (a `load()` with stand-in data, a model for flat inputs): their own files.
TEMPLATES_DIR = Path(__file__).resolve().parent / "templates"
# Templates that are a shipped task as it is: copied from trainers/<task>/ (one source, so the copy cannot drift
# from the task the engine tests and benchmarks), with `task=<task>` in its text pointed at the new folder.
SHIPPED_TEMPLATES = {"lm": "lm"}
TEMPLATES = tuple(
    sorted([p.name for p in TEMPLATES_DIR.iterdir() if (p / "prepare.py").is_file()] + list(SHIPPED_TEMPLATES))
)


class ScaffoldError(ValueError):
    """A folder `init` will not write; the message says what to do instead."""


def plugin_templates() -> list[str]:
    """The installed plug-in tasks (entry-point group `ralph_ray.tasks`): each is a template, init copies it."""
    return [name for name in task_names() if name not in TASKS and name not in TEMPLATES]


def init_task(folder: Path, template: str) -> Path:
    """Copy a template's parts into a new (or empty) folder; returns the folder."""
    if template not in TEMPLATES and template not in plugin_templates():
        raise ScaffoldError(f"unknown template {template!r}: use one of {', '.join((*TEMPLATES, *plugin_templates()))}")
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        raise ScaffoldError(f"{folder} exists and is not empty: pick a new name, or delete it first")
    task = SHIPPED_TEMPLATES.get(template, None if template in TEMPLATES else template)
    source, placeholder = (
        (_task_folder(task), f"task={task}") if task else (TEMPLATES_DIR / template, "./<this folder>")
    )
    missing = [name for name in PARTS if not (source / name).is_file()]
    if missing:
        raise ScaffoldError(
            f"the {template} template copies {source}, which lacks {', '.join(missing)}: run init from a checkout "
            "of the repository (the shipped task folders live in its trainers/)"
        )
    folder.mkdir(parents=True, exist_ok=True)
    for name in PARTS:
        text = (source / name).read_text()
        new = _shown(folder) if task is None else f"task={_shown(folder)}"
        (folder / name).write_text(text.replace(placeholder, new))
    return folder


def main(argv: list[str]) -> int:
    """Parse `init` arguments, write the folder, print what to run next; exit 2 with the fix on a problem."""
    parser = argparse.ArgumentParser(prog="python -m ralph_ray init", description=__doc__)
    parser.add_argument("name", help="the task folder to create (a name in the current directory, or a path)")
    parser.add_argument(
        "--template",
        choices=TEMPLATES + tuple(plugin_templates()),
        default="classification",
        help="what kind of task (or an installed plug-in task, to start from a copy of it)",
    )
    try:
        args = parser.parse_args(argv)
    except SystemExit as stop:  # argparse has printed the usage and the problem
        return ExitCode.ok if stop.code == 0 else ExitCode.safeguard_or_config
    folder = Path(args.name).expanduser()
    try:
        init_task(folder, args.template)
    except ScaffoldError as err:
        print(f"error: {err}", file=sys.stderr)
        return ExitCode.safeguard_or_config
    shown = _shown(folder)
    print(f"wrote {folder.resolve()}/ ({args.template} template):")
    for name, what in PARTS.items():
        print(f"  {name:<11} {what}")
    step_one = (
        f"  1. it is a copy of the installed task {args.template}: edit {shown}/prepare.py and {shown}/train.py as "
        "you like (the installed package stays as it is)\n"
        if args.template in plugin_templates()
        else f"  1. put your data in {shown}/prepare.py ({'corpus' if args.template == 'lm' else 'load'}) and your "
        f"model in {shown}/train.py (Net)\n"
    )
    print(
        "next:\n"
        + step_one
        + f"  2. check it by hand: python -m ralph_ray.prepare task={shown}   (then the lines it prints)\n"
        + f"  3. improve it:       python -m ralph_ray task={shown}"
    )
    return ExitCode.ok


def _task_folder(name: str) -> Path:
    """The folder of a shipped task or an installed plug-in, which a template copies."""
    if name in TASKS:
        return SHIPPED / name
    try:
        ref = find_task(name)
        if ref is None:  # plugin_templates() listed it, but its package went away since
            raise ScaffoldError(f"no installed task {name!r} any more: reinstall its package, or pick another template")
        check_parts(ref.folder)
    except TaskError as err:
        raise ScaffoldError(f"{err.problem}\n  fix: {err.fix}") from None
    return ref.folder


def _shown(folder: Path) -> str:
    """How to name the folder on a command line: a path with a separator (task=./name), so it reads as a folder."""
    text = str(folder)
    return text if folder.is_absolute() or text.startswith((".", "~")) else f"./{text}"


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
