"""Learning-rate schedules: cosine annealing, one-cycle, linear warmup (stepped once per epoch).

They step per epoch, after the batch loop: the number of steps per epoch is not knowable from every
trainer's text, the number of epochs is (`len(range(...))` of the epoch loop).
"""

from __future__ import annotations

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
    positional,
)


def _epochs(trainer: Trainer) -> str:
    """An expression for the number of epochs: `len(range(...))` of the epoch loop, or the epochs knob it is given
    (`harness.epochs(EPOCHS)`: under a time budget fewer may run, and the schedule ends where they stop)."""
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


def _guard(trainer: Trainer, conflicts: str) -> None:
    if trainer.sets_lr_by_hand():
        raise NotApplicable('the trainer sets group["lr"] itself every step; a second schedule would fight it')
    if trainer.has(conflicts):
        raise NotApplicable(f"the trainer already has a schedule (/{conflicts}/)")


def _schedule(source: str, conflicts: str, name: str, build: str, knob: tuple[str, object, str] | None = None) -> str:
    trainer = analyse(source)
    _guard(trainer, conflicts)
    optimizer, epochs = trainer.optimizer_name(), _epochs(trainer)
    edits = Edits(trainer)
    if knob is not None:
        edits.knob(*knob)
    var = free_name(trainer, name)
    edits.insert_before(trainer.epoch_loop(), f"{var} = {build.format(opt=optimizer, epochs=epochs)}")
    edits.insert_after(trainer.batch_loop(), f"{var}.step()  # once per epoch")
    return edits.apply()


@register("cosine_lr_schedule", "schedule")
def cosine_lr_schedule(source: str) -> str:
    """Anneal the learning rate to zero along a cosine over the epochs (chainable: composes with warmup)."""
    # LinearLR (warmup) chains with it; any other scheduler sets the learning rate on its own terms
    return _schedule(
        source,
        r"lr_scheduler\.(?!LinearLR)",
        "cosine",
        "torch.optim.lr_scheduler.CosineAnnealingLR({opt}, T_max={epochs})",
    )


@register("one_cycle_schedule", "schedule")
def one_cycle_schedule(source: str) -> str:
    """One-cycle: ramp the learning rate up to its value over the first quarter of the epochs, then anneal it."""
    return _schedule(
        source,
        r"lr_scheduler",
        "one_cycle",
        "torch.optim.lr_scheduler.OneCycleLR({opt}, max_lr=[g['lr'] for g in {opt}.param_groups], "
        "total_steps={epochs} + 1, pct_start=0.25)",
    )


@register("lr_warmup", "schedule")
def lr_warmup(source: str) -> str:
    """Ramp the learning rate linearly from 10% over the first WARMUP_EPOCHS."""
    return _schedule(
        source,
        r"lr_scheduler\.(?!CosineAnnealingLR)|warmup",
        "warmup",
        "torch.optim.lr_scheduler.LinearLR({opt}, start_factor=0.1, total_iters=WARMUP_EPOCHS)",
        ("WARMUP_EPOCHS", 2, "epochs of linear learning-rate warmup from 10%"),
    )
