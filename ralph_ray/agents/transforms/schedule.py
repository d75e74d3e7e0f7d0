"""Learning-rate schedules: cosine annealing, one-cycle, linear warmup (stepped once per epoch).

They step per epoch, after the batch loop: the number of steps per epoch is not knowable from every
trainer's text, the number of epochs is (`len(range(...))` of the epoch loop). Where the epoch loop is
`harness.epochs(EPOCHS)`, a time budget decides how many epochs run (41-53 of a 4-epoch seed in a 30-s GPU
trial), so there the schedule is one `LambdaLR` over `harness.lr_factor`, which follows the budget's progress;
a later schedule transform adds its shape to that call instead of a second scheduler that would fight it.
"""

from __future__ import annotations

import re
from typing import Callable

import libcst as cst

from ralph_ray.agents.transforms._registry import register
from ralph_ray.agents.transforms._tree import (
    Edits,
    NotApplicable,
    Trainer,
    analyse,
    call_name,
    code,
    free_name,
    kwarg,
    positional,
    with_kwarg,
)

_FACTOR = re.compile(r"(.+\.)?lr_factor$")
# torch.optim's optimizers without momentum or betas: OneCycleLR's default momentum cycling fails on them at its start
# ("optimizer must support momentum or beta1 with `cycle_momentum` option enabled").
_NO_MOMENTUM = {"LBFGS", "Adagrad", "Adadelta", "Rprop", "ASGD"}


def _epochs(trainer: Trainer) -> str:
    """An expression for the number of epochs: `len(range(...))` of the epoch loop, or the epochs knob it is given
    (`harness.epochs(EPOCHS)`: with no time budget that many run)."""
    loop = trainer.epoch_loop()
    if isinstance(loop.iter, cst.Call) and call_name(loop.iter) == "range":
        return f"len({code(loop.iter)})"
    args = positional(loop.iter) if isinstance(loop.iter, cst.Call) else []
    knobs = trainer.knobs()
    if args and isinstance(args[0].value, cst.Name) and args[0].value.value in knobs and "EPOCH" in args[0].value.value:
        return args[0].value.value
    raise NotApplicable(
        f"the epoch loop is neither over range(...) nor given an epochs knob (`for ... in {code(loop.iter)}`)"
    )


def _harness(trainer: Trainer) -> str | None:
    """The harness module's name when the epoch loop is `harness.epochs(...)` or `ralph_ray.harness.epochs(...)` (a
    time budget may set its length); None for any other loop (a user's `loader.epochs(...)` is not the harness)."""
    loop = trainer.epoch_loop()
    name = call_name(loop.iter) or ""
    if name.endswith(".epochs") and name.removesuffix(".epochs").split(".")[-1] == "harness":
        return name.removesuffix(".epochs")
    return None


Knob = tuple[str, object, str]


def _schedule(source: str, torch_: tuple[str, str, str], shape: str, value: str, knob: Knob | None = None) -> str:
    """Add a schedule: over `harness.epochs(...)` (or beside an lr_factor schedule) as `harness.lr_factor(...,
    shape=value)`, else as torch's scheduler `torch_` = (conflicts regex, variable name, constructor template)."""
    trainer = analyse(source)
    if trainer.sets_lr_by_hand():
        raise NotApplicable('the trainer sets group["lr"] itself every step; a second schedule would fight it')
    edits = Edits(trainer)
    if knob is not None:
        edits.knob(*knob)
    factors = trainer.calls(_FACTOR)
    try:
        harness, loop_missing = _harness(trainer), None
    except NotApplicable as error:  # a schedule already there is the truer reason (checked below first)
        harness, loop_missing = None, error
    if factors:
        edits.sub(factors[0], _merged(factors[0], shape, value))
    elif harness is not None:
        if trainer.has(r"lr_scheduler\."):
            raise NotApplicable(
                "the trainer already has a schedule (a torch scheduler the budget's progress can't reach)"
            )
        factor = f"{harness}.lr_factor(step, {{epochs}}, {shape}={value})"
        build = f"torch.optim.lr_scheduler.LambdaLR({{opt}}, lambda step: {factor})"
        _add(trainer, edits, "lr_schedule", build, "once per epoch, along the time budget")
    else:
        conflicts, name, build = torch_
        if trainer.has(conflicts):
            # name the scheduler class that is there (`OneCycleLR`), else what matched (`warmup`)
            classes = [m.group(1) for m in re.finditer(r"lr_scheduler\.(\w+)", trainer.source)]
            found = next((c for c in classes if re.search(conflicts, f"lr_scheduler.{c}")), None)
            shown = found or re.search(conflicts, trainer.source).group(0)  # type: ignore[union-attr]
            raise NotApplicable(f"the trainer already has a schedule ({shown})")
        if loop_missing is not None:
            raise loop_missing
        _add(trainer, edits, name, build, "once per epoch")
    return edits.apply()


def _merged(call: cst.Call, shape: str, value: str) -> Callable[[cst.Call], cst.Call]:
    """The edit adding `shape=value` to an lr_factor call, or NotApplicable where it has that shape already."""
    anneal = kwarg(call, "anneal")
    one_cycle = value == '"one_cycle"' or (anneal is not None and "one_cycle" in code(anneal.value))
    warmup = shape == "warmup_epochs" or kwarg(call, "warmup_epochs") is not None
    if kwarg(call, shape) is not None or (one_cycle and warmup):  # one-cycle ramps up on its own
        raise NotApplicable(f"the trainer already has a schedule ({code(call)})")
    return lambda updated: with_kwarg(updated, shape, value)


def _add(trainer: Trainer, edits: Edits, name: str, build: str, comment: str) -> None:
    """A scheduler built before the epoch loop (`build` formatted with {opt}, {epochs}), stepped after the batches."""
    var = free_name(trainer, name)
    build = build.format(opt=trainer.stepped_name(), epochs=_epochs(trainer))
    edits.insert_before(trainer.epoch_loop(), f"{var} = {build}")
    # after the epoch's batches: the batch loop, or the epoch loop's call of the function that runs it
    edits.insert_after(trainer.batch_site(), f"{var}.step()  # {comment}")


@register("cosine_lr_schedule", "schedule")
def cosine_lr_schedule(source: str) -> str:
    """Anneal the learning rate to zero along a cosine over the epochs (chainable: composes with warmup)."""
    # LinearLR (warmup) chains with it; any other scheduler sets the learning rate on its own terms
    torch_ = (
        r"lr_scheduler\.(?!LinearLR)",
        "cosine",
        "torch.optim.lr_scheduler.CosineAnnealingLR({opt}, T_max={epochs})",
    )
    return _schedule(source, torch_, "anneal", '"cosine"')


@register("one_cycle_schedule", "schedule")
def one_cycle_schedule(source: str) -> str:
    """One-cycle: ramp the learning rate up to its value over the first quarter of the epochs, then anneal it."""
    try:
        optimizer = (call_name(analyse(source).optimizer_call()) or "").rsplit(".", 1)[-1]
    except NotApplicable:
        optimizer = ""  # _schedule says why
    cycle = ", cycle_momentum=False" if optimizer in _NO_MOMENTUM else ""
    build = (
        "torch.optim.lr_scheduler.OneCycleLR({opt}, max_lr=[g['lr'] for g in {opt}.param_groups], "
        f"total_steps={{epochs}} + 1, pct_start=0.25{cycle})"
    )
    return _schedule(source, (r"lr_scheduler", "one_cycle", build), "anneal", '"one_cycle"')


@register("lr_warmup", "schedule")
def lr_warmup(source: str) -> str:
    """Ramp the learning rate linearly from 10% over the first WARMUP_EPOCHS."""
    build = "torch.optim.lr_scheduler.LinearLR({opt}, start_factor=0.1, total_iters=WARMUP_EPOCHS)"
    torch_ = (r"lr_scheduler\.(?!CosineAnnealingLR)|warmup", "warmup", build)
    knob = ("WARMUP_EPOCHS", 2, "epochs of linear learning-rate warmup from 10%")
    return _schedule(source, torch_, "warmup_epochs", "WARMUP_EPOCHS", knob)
