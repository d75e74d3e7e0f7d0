"""The seed trainer's code, read before Ray starts: the harness calls every trial needs, and a read of each searched
knob. Either fault let a campaign start: a user's trainer that called no harness function ran five failing trials
and exited 4 after 53 s, and one whose argparse kept `default=1e-3` beside a searched `LR = 1e-3` recorded LR values
no trial trained with."""

from __future__ import annotations

import ast
from pathlib import Path

from ralph_ray.knobs import parse
from ralph_ray.resumable import calls_missing

REQUIRED_CALLS = ("harness.load_data", "harness.report", "harness.save_predictions")
MODEL_CALLS = ("harness.save_model",)  # also required where the task scores the exported model
# Calls that read a module's names without naming them (nanoGPT's `globals().items()` config dump): a knob may be
# read through one, so a module that makes one is taken at its word.
NAMESPACE_READERS = {"globals", "vars", "locals"}
ADAPT = "README, Add your own task, step 3"


def _trees(paths: list[Path]) -> dict[Path, ast.Module] | None:
    """Each file parsed; None when one does not read or parse (the task check and the gate explain that)."""
    try:
        return {path: parse(path.read_text(), str(path)) for path in paths}
    except (OSError, SyntaxError, ValueError):
        return None


def harness_problem(paths: list[Path], entry: Path, scores_model: bool) -> tuple[str, str] | None:
    """(problem, fix) where no file of the seed (`paths`) makes a call the engine needs (REQUIRED_CALLS, which the
    gate holds children to, and MODEL_CALLS where the task scores the model); None otherwise."""
    trees = _trees(paths)
    if not trees:
        return None
    calls = (*REQUIRED_CALLS, *(MODEL_CALLS if scores_model else ()))
    absent = [set(calls_missing(tree, calls)) for tree in trees.values()]
    missing = [c for c in calls if all(c in each for each in absent)]
    if not missing:
        return None
    how = {
        "harness.load_data": "take the data from `data = harness.load_data()`",
        "harness.report": "call `harness.report(epoch=..., val_acc=...)` once per epoch (epochs count from 1)",
        "harness.save_predictions": "call `harness.save_predictions(selection=..., test=...)` at the end",
        "harness.save_model": "call `harness.save_model(model)` at the end",
    }
    return (
        f"{entry} never calls {', '.join(missing)} (`from ralph_ray import harness`): every trial would fail after "
        "Ray starts, since the engine reads a trial's scores from harness.report and scores what "
        "harness.save_predictions writes",
        f"adapt train.py first ({ADAPT}): " + "; ".join(how[c] for c in missing) + ", or start from a template: "
        "`python -m ralph_ray init my_task --template classification`",
    )


def _reads(tree: ast.Module) -> set[str] | None:
    """The names a module reads: loaded names, attributes, imported names and string literals (`getattr(cfg, "LR")`);
    None where it reads its namespace whole (globals(), vars(), locals())."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            if node.id in NAMESPACE_READERS:
                return None
            found.add(node.id)
        elif isinstance(node, ast.Attribute):
            found.add(node.attr)
        elif isinstance(node, ast.ImportFrom):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            found.add(node.value)
    return found


def unread_knobs(paths: list[Path], searched: list[str]) -> list[str]:
    """The searched knobs that no file of the seed ever reads (assigned, then never used: the trial trains with
    whatever it uses instead, and the KB records the sampled value as if it had trained with it)."""
    trees = _trees(paths)
    if not trees:
        return []
    read: set[str] = set()
    for tree in trees.values():
        names = _reads(tree)
        if names is None:
            return []
        read |= names
    return [name for name in searched if name not in read]


def unread_problem(paths: list[Path], searched: list[str], entry: Path) -> tuple[str, str] | None:
    """(problem, fix) where a searched knob is never read (`unread_knobs`); None otherwise."""
    unread = unread_knobs(paths, searched)
    if not unread:
        return None
    return (
        f"names {', '.join(unread)}, which {entry} sets but never reads: the trials would train with whatever the "
        "code uses instead (an argparse default=1e-3 beside LR = 1e-3), and the KB would record sampled values no "
        "trial trained with",
        f"read each where it is used ({ADAPT}: e.g. `parser.add_argument('--lr', type=float, default={unread[0]})`, "
        f"`lr: float = {unread[0]}`), or drop it from the space: "
        + " ".join(f"~search.space.{name}" for name in unread),
    )
