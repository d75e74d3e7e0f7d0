"""What a scheduler or a trial shape asks of a trainer, read from its source (no Ray): resuming from a checkpoint
(scheduler=pbt) and joining a data-parallel group (resources.workers_per_trial > 1)."""

from __future__ import annotations

import ast
import re

from ralph_ray.knobs import parse

# What a trainer calls to take part in PBT: it saves its state each epoch and restores a (donor's) state.
RESUME_CALLS = ("harness.save_checkpoint", "harness.load_checkpoint")


# What a trainer calls to be one worker of N rather than N copies of one trial (the other helpers follow it).
PARALLEL_CALLS = ("harness.init_distributed",)
# Helpers the offline agent's transforms add that keep state or steps of their own beside the model (a weight
# average, replayed hard examples, a self-model head): not synchronised across a data-parallel group's ranks.
UNSYNCHRONISED = re.compile(r"\b(AveragedModel|DreamReplay|SelfModel)\b")


def missing_resume_calls(source: str) -> list[str]:
    """The harness calls of RESUME_CALLS that `source` never makes (empty: it can resume, so PBT may run it)."""
    return missing_calls(source, RESUME_CALLS)


def missing_parallel_calls(source: str) -> list[str]:
    """The harness calls of PARALLEL_CALLS that `source` never makes (empty: its N workers share the work)."""
    return missing_calls(source, PARALLEL_CALLS)


def missing_calls(source: str, calls: tuple[str, ...]) -> list[str]:
    """The `module.function` calls of `calls` that `source` never makes (all of them when it does not parse)."""
    try:
        tree = parse(source)
    except SyntaxError:
        return list(calls)
    return calls_missing(tree, calls)


def calls_missing(tree: ast.Module, calls: tuple[str, ...]) -> list[str]:
    """The `module.function` calls of `calls` that a parsed module never makes."""
    modules = {name.split(".")[0] for name in calls}
    # Local names bound to those modules or their functions, however imported (a reviewer: a seed that wrote
    # `from ralph_ray.harness import report` or `import ralph_ray.harness as h` ran, but was refused as never calling
    # harness.report): `h` -> "harness", `report` -> "harness.report", `ralph_ray.harness` -> "harness".
    bound: dict[str, str] = {module: module for module in modules}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[-1] in modules:
                    bound[alias.asname or alias.name] = alias.name.split(".")[-1]
        elif isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                if alias.name in modules:
                    bound[alias.asname or alias.name] = alias.name
                elif node.module.split(".")[-1] in modules:
                    bound[alias.asname or alias.name] = f"{node.module.split('.')[-1]}.{alias.name}"
    called = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        if isinstance(node.func, ast.Name) and "." in bound.get(node.func.id, ""):
            called.add(bound[node.func.id])
        elif isinstance(node.func, ast.Attribute) and (owner := bound.get(ast.unparse(node.func.value))):
            called.add(f"{owner}.{node.func.attr}")
    return [name for name in calls if name not in called]


def refusal(entry: str, missing: list[str]) -> str:
    """Why a trainer cannot run under scheduler=pbt, and the fix."""
    return (
        f"{entry} cannot take part in population based training: it never calls {', '.join(missing)}; a PBT trial "
        "restarts from its own or a better trial's checkpoint, so the trainer must save its state each epoch "
        "(harness.save_checkpoint({...}) right before harness.report) and restore it at the start "
        "(state = harness.load_checkpoint(); continue from state['epoch'] + 1), as trainers/digits/train.py does; "
        "or use scheduler=asha"
    )


def parallel_refusal(entry: str, workers: int) -> str:
    """Why a trainer cannot be one worker of a data-parallel trial, and the fix."""
    return (
        f"{entry} never calls harness.init_distributed: each of the {workers} workers of a trial would train the "
        "whole model alone (N copies of one trial, rank 0's reported); add the harness helpers (init_distributed, "
        "wrap, stride or shard; README: Trials bigger than one GPU), or let the data_parallel transform write "
        f"them where it finds their idioms: python -m ralph_ray.agents.transforms data_parallel {entry}"
    )


def parallel_problem(source: str, entry: str, workers: int) -> str | None:
    """Why `source` cannot be one of a data-parallel trial's `workers` workers (None: it can, or workers is 1)."""
    if workers < 2:
        return None
    if missing_parallel_calls(source):
        return parallel_refusal(entry, workers)
    helper = unsynchronised(source)
    if helper:
        return (
            f"{entry} uses {helper}: its copies or extra steps are not synchronised across the trial's {workers} "
            "workers (a rank could wait forever in an all-reduce); run it with resources.workers_per_trial=1"
        )
    return None


def unsynchronised(source: str) -> str | None:
    """The first helper of UNSYNCHRONISED that `source` uses (None: none), which a data-parallel group cannot run."""
    found = UNSYNCHRONISED.search(source)
    return found.group(1) if found else None
