"""The training step: gradient clipping, an EMA of the weights for evaluation, mixed precision, channels-last."""

from __future__ import annotations

import libcst as cst

from ralph_ray.agents.transforms._evaluation import model_uses
from ralph_ray.agents.transforms._registry import register
from ralph_ray.agents.transforms._tree import (
    Edits,
    NotApplicable,
    analyse,
    assign_target,
    expression,
    free_name,
    refuse_built_apart,
    refuse_closure_step,
    statement,
    unscale_line,
)
from ralph_ray.agents.transforms.forge import own_autocast, replay_calls


@register("gradient_clipping", "step")
def gradient_clipping(source: str) -> str:
    """Clip the global gradient norm to GRAD_CLIP before each optimizer step, whatever the loss (cross-entropy,
    MSE, Huber, written out)."""
    trainer = analyse(source)
    if trainer.has(r"clip_grad"):
        raise NotApplicable("the trainer already clips gradients")
    trainer.backward_statement()  # the clip goes between the backward pass and the step
    refuse_closure_step(trainer, "a clip before the step would clip the last evaluation's gradients, not the step's")
    limit = "GRAD_CLIP"
    summed = trainer.summed_loss_batch()
    if summed is not None:
        # a summed loss's gradient is the batch size times the mean's: scale the limit with the batch so GRAD_CLIP
        # bounds the per-example-mean gradient norm, as it does for a mean loss (a fixed limit would throttle it)
        limit = f"GRAD_CLIP * len({summed})"
    # through a GradScaler (`scaler.step(opt)`) the gradients are loss-scaled until `scaler.unscale_(opt)`: the clip
    # follows it, as in PyTorch's AMP recipe (else it would clip gradients thousands of times their size)
    unscale = unscale_line(trainer, "the clip would clip the loss-scaled gradients")
    params, edits = trainer.parameters_code(), Edits(trainer)
    edits.knob("GRAD_CLIP", 2.0, "max global gradient norm per step (of the per-example mean loss)")
    clip = f"torch.nn.utils.clip_grad_norm_({params}, {limit})"
    edits.insert_before(trainer.step_statement(), *([unscale] if unscale else []), clip)
    return edits.apply()


@register("ema_weights", "step")
def ema_weights(source: str) -> str:
    """Keep an EMA of the weights (and BatchNorm buffers) and evaluate and predict with it."""
    trainer = analyse(source)
    if trainer.has(r"AveragedModel|\bema\b"):
        raise NotApplicable("the trainer already averages its weights")
    edits, ema = Edits(trainer), free_name(trainer, "ema")
    edits.thread(ema, "the weight average (updated every step)", trainer.state_site())
    # every evaluation and prediction, closures included, and the best state early stopping keeps: all move to the
    # average, or the transform refuses (half of them on the raw model was a silently wrong trainer)
    uses = model_uses(trainer)
    refuse_built_apart(trainer, "the weight average would be built in the method, apart from the training step")
    model = uses.model
    if not uses.evaluated():
        raise NotApplicable(
            f"no evaluation of `{model}` found (evaluate({model}, ...), {model}(x) under torch.no_grad(), or a "
            f"function under @torch.no_grad(), calling .eval() or only called under torch.no_grad() that runs the "
            f"model it is given)"
        )
    for call in uses.forwards:
        edits.sub(call.func, cst.Name(ema))
    for arg in uses.handed:
        edits.sub(arg.value, cst.Name(ema))
    for arg in uses.exports:  # the export the engine scores is the average's network
        edits.sub(arg.value, expression(f"{ema}.module"))
    for call in (*uses.saves, *uses.restores):  # the best state is the average's: chosen by its validation loss
        edits.sub(cst.ensure_type(call.func, cst.Attribute).value, expression(f"{ema}.module"))
    # the model keeps its own mode switches; the average follows them, once after each: a model bound twice before
    # training (`model = model.to(device)`) has each use found once per binding (a user saw `ema.eval()` twice)
    for line in {id(line): line for line in uses.evals}.values():
        edits.insert_after(line, f"{ema}.eval()")
    edits.knob("EMA_DECAY", 0.97, "decay of the weight average used for evaluation and predictions")
    # built in eval mode: it is never trained, so dropout stays off and BatchNorm uses its averaged statistics
    # wherever it runs, even in an evaluation function that never calls .eval()
    edits.beside_optimizer(
        f"{ema} = torch.optim.swa_utils.AveragedModel({model}, multi_avg_fn=torch.optim.swa_utils.get_ema_multi_avg_fn"
        f"(EMA_DECAY), use_buffers=True).eval()",
    )
    edits.insert_after(trainer.step_statement(), f"{ema}.update_parameters({model})")
    return edits.apply()


# mixed_precision's context: bfloat16 needs no GradScaler; off on CPU, where a trial without a GPU runs as before
AUTOCAST_BF16 = 'torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=torch.cuda.is_available())'


@register("mixed_precision", "step")
def mixed_precision(source: str) -> str:
    """Run the forward pass and loss under bfloat16 autocast on a GPU (a no-op on CPU)."""
    trainer = analyse(source)
    if own_autocast(trainer):
        raise NotApplicable("the trainer already uses autocast")
    refuse_closure_step(trainer, "the forward pass to put under autocast runs inside the closure")
    loss, backward = trainer.loss_name(), trainer.backward_statement()
    forward = trainer.forward_input()
    body = trainer.parent(backward)
    if not isinstance(body, cst.IndentedBlock):
        raise NotApplicable("the backward call is not in an indented block")
    lines = list(body.body)
    end = lines.index(backward)
    loss_line = max((i for i in range(end) if assign_target(lines[i]) == loss), default=None)
    start = next((i for i in range(end) if trainer.inside(forward, lines[i])), None)
    if loss_line is None or start is None or start > loss_line:
        raise NotApplicable(
            f"the forward call and `{loss} = ...` are not lines of the block holding `{loss}.backward()`"
        )
    wrap = cst.ensure_type(statement(f"with {AUTOCAST_BF16}:\n    pass\n"), cst.With)
    inner = [s.with_changes(leading_lines=[]) if i == 0 else s for i, s in enumerate(lines[start : loss_line + 1])]
    block = wrap.with_changes(body=wrap.body.with_changes(body=inner), leading_lines=lines[start].leading_lines)
    edits = Edits(trainer)
    edits.sub(lines[start], block)
    for stmt in lines[start + 1 : loss_line + 1]:
        edits.sub(stmt, lambda _old: cst.RemovalSentinel.REMOVE)
    # hard-example replay's steps are the trainer's own (applied before this, its call had no autocast to take):
    # its forward left in float32 beside the trainer's bfloat16 ones was no step of the trainer's (user trial)
    context = cst.Arg(expression(f"lambda: {AUTOCAST_BF16}"), keyword=cst.Name("autocast"))
    for call in replay_calls(trainer):
        edits.sub(call, lambda old: old.with_changes(args=[*old.args, context]))
    return edits.apply()


@register("channels_last", "step")
def channels_last(source: str) -> str:
    """Store a conv net's weights channels-last (faster convolutions on GPUs with tensor cores)."""
    trainer = analyse(source)
    if trainer.has(r"channels_last"):
        raise NotApplicable("the trainer already uses channels_last")
    if not any(layer.kind == "conv" for layer in trainer.layers()):
        raise NotApplicable(trainer.imported_model() or "the model has no nn.Conv2d layers")
    model, built = trainer.model_name(), trainer.model_built()
    edits = Edits(trainer)
    edits.insert_after(built, f"{model} = {model}.to(memory_format=torch.channels_last)")
    return edits.apply()
