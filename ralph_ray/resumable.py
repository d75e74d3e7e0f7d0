"""Can a trainer resume from a checkpoint? What scheduler=pbt asks of a trainer, read from its source (no Ray)."""

from __future__ import annotations

import ast

from ralph_ray.knobs import parse

# What a trainer calls to take part in PBT: it saves its state each epoch and restores a (donor's) state.
RESUME_CALLS = ("harness.save_checkpoint", "harness.load_checkpoint")


def missing_resume_calls(source: str) -> list[str]:
    """The harness calls of RESUME_CALLS that `source` never makes (empty: it can resume, so PBT may run it)."""
    try:
        tree = parse(source)
    except SyntaxError:
        return list(RESUME_CALLS)
    called = {
        f"{node.func.value.id}.{node.func.attr}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Name)
    }
    return [name for name in RESUME_CALLS if name not in called]


def refusal(entry: str, missing: list[str]) -> str:
    """Why a trainer cannot run under scheduler=pbt, and the fix."""
    return (
        f"{entry} cannot take part in population based training: it never calls {', '.join(missing)}; a PBT trial "
        "restarts from its own or a better trial's checkpoint, so the trainer must save its state each epoch "
        "(harness.save_checkpoint({...}) right before harness.report) and restore it at the start "
        "(state = harness.load_checkpoint(); continue from state['epoch'] + 1), as trainers/digits/train.py does; "
        "or use scheduler=asha"
    )
