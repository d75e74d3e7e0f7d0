"""Data parallelism: make a single-process trainer a worker of `resources.workers_per_trial=N` (the harness helpers).

The transform joins the trial's process group where the training code starts (before anything reaches a device:
the group's first act is to give each rank its own GPU), wraps the model in DistributedDataParallel right after it
is built (every rank then starts from rank 0's weights), and hands each rank every N-th batch of an epoch
(`harness.stride`, as many on every rank), so N workers share an epoch's steps. The ranks draw from the same random
stream (the same seed), so the same batch order on every rank and their strides partition it; a DataLoader instead
gets torch's DistributedSampler (`harness.shard_loader`), so each rank loads only its own share. Each step takes
BATCH_SIZE on every rank: the global batch is N times the knob. In a single trial every helper is a no-op, so the
child trains as its parent did. Code whose collective steps could differ between ranks is refused: a loop over a
generator (no length to split evenly), more than one optimizer step per batch, replayed hard examples, a weight
average or a self-model head (they keep copies or steps of their own outside DDP).
"""

from __future__ import annotations

import libcst as cst

from ralph_ray.agents.transforms._registry import register
from ralph_ray.agents.transforms._tree import (
    Edits,
    NotApplicable,
    Trainer,
    analyse,
    assign_target,
    assign_value,
    call_name,
    code,
    dotted,
    expression,
)
from ralph_ray.resumable import unsynchronised

# What DistributedDataParallel answers itself (or forwards as nn.Module does); any other attribute of the model
# (its layers, a custom method) lives on `model.module` once wrapped, so a trainer that reads one is refused.
MODULE_API = frozenset(
    {
        "parameters",
        "named_parameters",
        "buffers",
        "named_buffers",
        "modules",
        "named_modules",
        "children",
        "train",
        "eval",
        "training",
        "state_dict",
        "load_state_dict",
        "to",
        "cuda",
        "cpu",
        "zero_grad",
        "apply",
        "requires_grad_",
        "forward",
    }
)


# DataLoaders harness.shard_loader rebuilds with a DistributedSampler, unless a keyword gives them an order of their
# own (then harness.stride shares their batches).
PLAIN_LOADERS = frozenset({"DataLoader", "torch.utils.data.DataLoader", "data.DataLoader", "utils.data.DataLoader"})
OWN_ORDER = frozenset({"sampler", "batch_sampler"})


@register("data_parallel", "parallel")
def data_parallel(source: str) -> str:
    """Add the harness's data-parallel helpers: a process group, DDP, per-rank batches, an epoch's steps shared."""
    trainer = analyse(source)
    if trainer.has(r"harness\.init_distributed\(|init_process_group|DistributedDataParallel"):
        raise NotApplicable("the trainer is already data-parallel")
    if not trainer.has(r"^from ralph_ray import harness|^import ralph_ray\.harness as harness"):
        raise NotApplicable("the trainer does not import the harness (`from ralph_ray import harness`)")
    if trainer.has(r"harness\.(time_left|budget_s)\("):
        raise NotApplicable(
            "the trainer stops on its own clock (harness.time_left): ranks could leave an epoch at different steps "
            "and wait forever in an all-reduce; take that decision with harness.any_across(...) first"
        )
    if trainer.has(r"harness\.save_model\("):
        raise NotApplicable("the trainer exports its model (harness.save_model): export the unwrapped module")
    if unsynchronised(source) or trainer.has(r"\bema\b"):
        raise NotApplicable(
            "the trainer keeps a weight average, replays hard examples or trains a self-model head: their copies "
            "and extra steps are not synchronised across ranks"
        )
    batch = trainer.batch_loop()
    if sum(trainer.inside(s, batch) for s in trainer.step_statements()) > 1:
        raise NotApplicable("more than one optimizer step per batch: ranks could take different numbers of steps")
    model, built = trainer.model_name(), trainer.model_built()
    wrapped_at = trainer.order(built)
    foreign = sorted(
        {
            node.attr.value
            for node in trainer.nodes
            if isinstance(node, cst.Attribute)
            and dotted(node.value) == model
            and trainer.order(node) > wrapped_at
            and node.attr.value not in MODULE_API
        }
    )
    if foreign:
        raise NotApplicable(
            f"the trainer reads `{model}.{foreign[0]}` after building the model: wrapped in DistributedDataParallel "
            f"it lives on `{model}.module`"
        )
    scope = next((a for a in trainer.ancestors(built) if isinstance(a, cst.FunctionDef)), trainer.module)
    loop = trainer.batch_loop()
    # the batch loop runs where the model is built, or in a function that code's epoch loop calls (its `loader`
    # is then the DataLoader the call hands it)
    if not trainer.inside(loop if trainer.batch_in_call() is None else trainer.epoch_loop(), scope):
        raise NotApplicable("the model is built outside the code that trains it (no one place to join the group)")
    loader = _loader_built(trainer, trainer.passed_for(loop.iter), scope)
    edits = Edits(trainer)
    edits.insert_before(
        _start(trainer, scope), "harness.init_distributed()  # a data-parallel trial's process group (alone: nothing)"
    )
    edits.insert_after(
        built,
        f"{model} = harness.wrap({model})  # DistributedDataParallel: every rank starts from rank 0's weights",
    )
    if loader is None:  # offsets: each rank takes every N-th
        edits.sub(loop.iter, lambda old: expression(f"harness.stride({code(old)})"))
    else:  # a plain DataLoader: each rank loads only its own share (a DistributedSampler)
        edits.sub(loader, lambda old: expression(f"harness.shard_loader({code(old)})"))
    return edits.apply()


def _loader_built(trainer: Trainer, batches: cst.BaseExpression, scope: cst.CSTNode) -> cst.Call | None:
    """The plain `DataLoader(dataset, batch_size, shuffle)` call the batch loop iterates, to shard by its sampler;
    None where `harness.stride` at the loop shares the epoch instead: `range(...)` offsets, or a DataLoader with a
    sampler of its own, of another class, or bound more than once (stride covers every binding). Anything else is
    refused: a generator of batches has no length, so no rank could be given as many steps as the others."""
    if isinstance(batches, cst.Call) and call_name(batches) == "range":
        return None
    name = dotted(batches)
    built = [
        value
        for stmt in (trainer.statements(scope) if name is not None else [])
        if assign_target(stmt) == name
        and isinstance(value := assign_value(stmt), cst.Call)
        and (call_name(value) or "").endswith("DataLoader")
    ]
    if not built:
        raise NotApplicable(
            f"the batch loop runs over `{code(batches)}`, not a range of offsets or a DataLoader: its batches have no "
            "length to split evenly between ranks"
        )
    call = built[0]
    plain = (
        len(built) == 1
        and call_name(call) in PLAIN_LOADERS
        and sum(arg.keyword is None for arg in call.args) <= 3  # dataset, batch_size, shuffle; the 4th is a sampler
        and not any(arg.keyword is not None and arg.keyword.value in OWN_ORDER for arg in call.args)
        and not any(arg.star for arg in call.args)
    )
    return call if plain else None


def _start(trainer: Trainer, scope: cst.CSTNode) -> cst.CSTNode:
    """Where the training code starts: a function's first statement after its docstring; at module level, the
    first statement that uses the harness (after the imports and the knobs)."""
    if isinstance(scope, cst.FunctionDef):
        body = list(scope.body.body)
        docstring = (
            isinstance(body[0], cst.SimpleStatementLine)
            and isinstance(body[0].body[0], cst.Expr)
            and isinstance(body[0].body[0].value, (cst.SimpleString, cst.ConcatenatedString))
        )
        return body[1] if docstring and len(body) > 1 else body[0]
    for stmt in trainer.module.body:
        if "harness." in code(stmt):
            return stmt
    raise NotApplicable("the script never calls the harness")
