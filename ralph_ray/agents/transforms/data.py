"""Input augmentation on image batches: random shifts and flips of the batch the model is fed; flips at test time.

Each keeps a class label and moves the inputs alone: refused where the targets are images too (an autoencoder).
"""

from __future__ import annotations

import re

import libcst as cst

from ralph_ray.agents.transforms._evaluation import model_uses
from ralph_ray.agents.transforms._registry import register
from ralph_ray.agents.transforms._tree import (
    HELPERS,
    Edits,
    NotApplicable,
    Trainer,
    analyse,
    assign_target,
    call_name,
    code,
    enclosing_function,
    evaluator_functions,
    expression,
    first_parameter,
    positional,
    size_code,
    under_no_grad,
)

# Each helper takes images (N, C, H, W), channels last (N, H, W, C) with C <= 4 < H, W (as task.images reads them: a
# model that permutes), single-channel images without a channel axis (N, H, W) (a model that unsqueezes or reads rows as
# steps), or flattened square images (N, H*W), as MLP trainers feed them.
SHIFT_HELPER = '''
def shift_images(x: torch.Tensor) -> torch.Tensor:
    """Translate an AUGMENT_PROB share of the images by up to SHIFT pixels (the edge pixels repeated), batched."""
    shape = x.shape
    if x.dim() == 2:
        side = int(round(x.shape[1] ** 0.5))
        if side * side != x.shape[1]:
            raise ValueError(f"shift_images: {tuple(x.shape)} is neither (N, C, H, W) nor flattened square images")
        x = x.reshape(len(x), 1, side, side)
    elif x.dim() == 3:
        x = x.unsqueeze(1)
    if x.dim() != 4:
        raise ValueError(f"shift_images: expected images (N, C, H, W) or (N, H, W), got shape {tuple(x.shape)}")
    last = x.shape[3] <= 4 < min(x.shape[1], x.shape[2])  # (N, H, W, C): the channels last, moved first and back
    if last:
        x = x.permute(0, 3, 1, 2)
    height, width = x.shape[-2:]
    # The border repeated, not zeros: in normalised inputs 0 is mid-grey, a strip no held-out image has (user trial)
    padded = torch.nn.functional.pad(x, (SHIFT,) * 4, mode="replicate")
    offsets = torch.randint(0, 2 * SHIFT + 1, (2, len(x)), device=x.device)
    out = torch.empty_like(x)
    for dy in range(2 * SHIFT + 1):
        for dx in range(2 * SHIFT + 1):
            mask = (offsets[0] == dy) & (offsets[1] == dx)
            out[mask] = padded[mask, :, dy : dy + height, dx : dx + width]
    shifted = torch.rand(len(x), device=x.device) < AUGMENT_PROB
    out = torch.where(shifted.view(-1, 1, 1, 1), out, x)
    return (out.permute(0, 2, 3, 1) if last else out).reshape(shape)
'''

FLIP_HELPER = '''
def flip_images(x: torch.Tensor) -> torch.Tensor:
    """Mirror a FLIP_PROB share of the images left to right, batched."""
    shape = x.shape
    if x.dim() == 2:
        side = int(round(x.shape[1] ** 0.5))
        if side * side != x.shape[1]:
            raise ValueError(f"flip_images: {tuple(x.shape)} is neither (N, C, H, W) nor flattened square images")
        x = x.reshape(len(x), 1, side, side)
    elif x.dim() == 3:
        x = x.unsqueeze(1)
    if x.dim() != 4:
        raise ValueError(f"flip_images: expected images (N, C, H, W) or (N, H, W), got shape {tuple(x.shape)}")
    last = x.shape[3] <= 4 < min(x.shape[1], x.shape[2])  # (N, H, W, C): the channels last, moved first and back
    if last:
        x = x.permute(0, 3, 1, 2)
    flipped = torch.rand(len(x), device=x.device) < FLIP_PROB
    out = torch.where(flipped.view(-1, 1, 1, 1), x.flip(3), x)
    return (out.permute(0, 2, 3, 1) if last else out).reshape(shape)
'''


# Modules only a model whose outputs are images ends with: a decoder that upsamples, unflattens or reshuffles pixels
IMAGE_OUTPUT = re.compile(
    r"^((torch\.)?nn\.)?(ConvTranspose[123]d|Upsample|UpsamplingNearest2d|UpsamplingBilinear2d|PixelShuffle|Unflatten)$"
)
RESHAPES = frozenset({"view", "reshape"})
RESHAPED_LIKE = frozenset({"view_as", "reshape_as", "unflatten"})
# The calls that reshape or move a batch without changing what it holds (`x.view(-1, 784)` is still the batch `x`)
SAME_BATCH = frozenset({"view", "reshape", "flatten", "view_as", "reshape_as", "to", "float", "contiguous", "cuda"})


def _batch_root(expr: cst.BaseExpression) -> str:
    """The batch an expression reshapes or moves (`x` of `x.view(len(x), -1).to(device)`), as source."""
    while isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute) and expr.func.attr.value in SAME_BATCH:
        expr = expr.func.value
    return code(expr)


def _returned(trainer: Trainer, function: cst.FunctionDef, value: cst.BaseExpression) -> cst.BaseExpression:
    """What a returned name was last bound to in the function (`x = x.view(-1, 1, 28, 28)` before `return x`)."""
    if not isinstance(value, cst.Name):
        return value
    bound = value
    for node in trainer.within(function):
        if isinstance(node, cst.Assign) and any(code(t.target) == value.value for t in node.targets):
            bound = node.value
    return bound


def _image_shaped(call: cst.BaseExpression) -> bool:
    """Whether a returned expression reshapes to images: `.view(-1, 1, 28, 28)` (three sizes or more: (N, H, W) or
    (N, C, H, W)), `.view(x.shape)`, `.view_as(x)`, `.unflatten(1, (1, 28, 28))`."""
    if not isinstance(call, cst.Call) or not isinstance(call.func, cst.Attribute):
        return False
    method, args = call.func.attr.value, call.args
    if method in RESHAPED_LIKE:
        return True
    if method not in RESHAPES:
        return False
    if len(args) >= 3 or any(a.star for a in args):
        return True
    return len(args) == 1 and bool(re.search(r"\.shape\b|\.size\(\)", code(args[0].value)))


def image_targets(trainer: Trainer) -> str | None:
    """Why the model's outputs are images too (a reconstruction, a denoiser, an image-to-image map), or None: read
    from the code, not the loss's name (an autoencoder trains with an MSE or a binary cross-entropy alike). Shifting
    or mirroring its inputs alone would no longer line them up with the targets (user trial: an autoencoder's
    flip_tta averaged each reconstruction with the mirror image's, 6.5% worse)."""
    try:
        batch, loss = trainer.forward_input(), trainer.any_loss_call()
    except NotApplicable:
        batch, loss = None, None
    if batch is not None and loss is not None:
        for arg in positional(loss)[1:]:
            if _batch_root(arg.value) == _batch_root(batch):
                return f"the loss `{code(loss)}` compares the model's output with its input batch (a reconstruction)"
    for call in trainer.calls(IMAGE_OUTPUT):
        if trainer.in_model(call):
            return f"the model builds `{code(call)}`: its outputs are images"
    for node in trainer.nodes:
        if not (isinstance(node, cst.FunctionDef) and node.name.value == "forward" and trainer.in_model(node)):
            continue
        if not any(isinstance(a, cst.ClassDef) and a.name.value in HELPERS for a in trainer.ancestors(node)):
            for ret in trainer.within(node):
                if isinstance(ret, cst.Return) and ret.value is not None:
                    value = _returned(trainer, node, ret.value)
                    if _image_shaped(value):
                        return f"the model's forward returns `{code(value)}`: its outputs are images"
    linears = [layer for layer in trainer.layers() if layer.kind == "linear"]
    if len(linears) >= 2:
        try:
            width_in, width_out = size_code(linears[0], "in"), size_code(linears[-1], "out")
        except NotApplicable:
            width_in, width_out = "", None
        if width_in == width_out:
            return (
                f"the model's last layer `{code(linears[-1].call)}` is as wide as its first "
                f"`{code(linears[0].call)}`: its outputs are its inputs' size (a reconstruction)"
            )
    return None


def _images_only(trainer: Trainer) -> None:
    """Shifts and flips move pixels and keep a class label: refuse a trainer whose inputs are token ids (found on the
    lm seed, where the helpers' shape check failed only at the gate's smoke run), whose targets are images too, or
    that regresses values (the diabetes seed: features, whose shape check failed the same way)."""
    if trainer.has(r"nn\.Embedding\("):
        raise NotApplicable("the model embeds tokens (nn.Embedding): its batches are token ids, not images")
    why = image_targets(trainer)
    if why is not None:
        raise NotApplicable(
            f"the targets are images too ({why}): moving or mirroring the inputs alone would misalign them"
        )
    regression = r"\b(mse_loss|MSELoss|l1_loss|L1Loss|smooth_l1_loss|SmoothL1Loss|huber_loss|HuberLoss)\b"
    # Beside a cross-entropy a Huber/MSE is an auxiliary loss (self_model_head's own), not a regression task.
    if trainer.has(regression) and not trainer.has(r"cross_entropy|CrossEntropyLoss|nll_loss|NLLLoss"):
        raise NotApplicable(
            "a regression loss on outputs that are not images: its targets are values, not class labels a shift or "
            "a mirror image keeps"
        )


@register("shift_augmentation", "data")
def shift_augmentation(source: str) -> str:
    """Shift a random AUGMENT_PROB share of each training batch by up to SHIFT pixels (fresh draws every batch)."""
    trainer = analyse(source)
    _images_only(trainer)
    if trainer.has(r"def (augment|shift_images)\(|RandomCrop|RandomAffine|TRANSLATE\b|\bSHIFT\b"):
        raise NotApplicable("the trainer already shifts its images")
    batch, edits = trainer.forward_input(), Edits(trainer)
    edits.knob("SHIFT", 1, "max random translation in pixels (training augmentation)")
    edits.knob("AUGMENT_PROB", 0.5, "share of training images shifted")
    edits.helper(SHIFT_HELPER)
    edits.sub(batch, lambda old: expression(f"shift_images({code(old)})"))
    return edits.apply()


@register("flip_augmentation", "data")
def flip_augmentation(source: str) -> str:
    """Mirror a random FLIP_PROB share of each training batch (natural images; digits and letters change meaning)."""
    trainer = analyse(source)
    _images_only(trainer)
    if trainer.has(r"def flip_images\(|\.flip\(3\)|RandomHorizontalFlip|hflip"):
        raise NotApplicable("the trainer already flips its images")
    batch, edits = trainer.forward_input(), Edits(trainer)
    edits.knob("FLIP_PROB", 0.5, "share of training images mirrored left to right")
    edits.helper(FLIP_HELPER)
    edits.sub(batch, lambda old: expression(f"flip_images({code(old)})"))
    return edits.apply()


# (x.flip(-1), not .flip(3): flip_augmentation's "already flips" check must not see test-time flips as training's)
TTA_HELPER = '''
def flip_averaged(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The model's outputs averaged over the images and their mirror images (test-time augmentation)."""
    if x.dim() == 2:
        side = int(round(x.shape[1] ** 0.5))
        if side * side != x.shape[1]:
            raise ValueError(f"flip_averaged: {tuple(x.shape)} is neither (N, C, H, W) nor flattened square images")
        mirrored = x.reshape(len(x), 1, side, side).flip(-1).flatten(1)
    elif x.dim() == 4 and x.shape[3] <= 4 < min(x.shape[1], x.shape[2]):  # (N, H, W, C): the width is the third axis
        mirrored = x.flip(2)
    elif x.dim() in (3, 4):  # (N, H, W) or (N, C, H, W): the last axis is the width either way
        mirrored = x.flip(-1)
    else:
        raise ValueError(f"flip_averaged: expected images (N, C, H, W) or (N, H, W), got shape {tuple(x.shape)}")
    return (model(x) + model(mirrored)) / 2
'''


@register("flip_tta", "data")
def flip_tta(source: str) -> str:
    """Evaluate and predict on each image and its mirror image, the outputs averaged (test-time augmentation)."""
    trainer = analyse(source)
    _images_only(trainer)
    if trainer.has(r"def flip_averaged\(|(\b|_)tta\b|TTA"):  # logits_tta(...), TTA_LEVEL
        raise NotApplicable("the trainer already averages over mirrored inputs at test time")
    # every use of the model once training begins placed, as ema_weights places them: the flips go into each
    # evaluation and prediction, or the transform refuses (flipped validation beside unflipped predictions)
    uses = model_uses(trainer, weights=False)
    model, edits = uses.model, Edits(trainer)
    batch = trainer.batch_loop()
    evaluators = evaluator_functions(trainer)
    if uses.exports:
        raise NotApplicable(f"the trainer exports `{model}` (harness.save_model): the engine would score it unflipped")
    for arg in uses.handed:
        name = call_name(trainer.parent(arg)) or ""
        if name != "flip_averaged" and name not in evaluators:
            raise NotApplicable(
                f"`{name}` is handed the model but not known to evaluate it (under @torch.no_grad(), calling .eval() "
                f"or only called under torch.no_grad()): its forward pass would go unflipped"
            )
    for call in uses.forwards:
        if len(call.args) != 1 or call.args[0].keyword or call.args[0].star:
            raise NotApplicable(f"`{code(call)}` takes more than the images: it cannot be flipped")
    forwards = {id(call) for call in uses.forwards}
    # the weight average ema_weights evaluates with in the model's place
    averaged = {assign_target(line) for line in trainer.lines if "AveragedModel(" in code(line)}
    found = 0
    for node in trainer.calls():
        name = call_name(node) or ""
        if trainer.inside(node, batch):
            continue  # training's forward pass
        scope = enclosing_function(trainer, node)
        # a function that evaluates the model it is given; where it also trains (its loop is the batch loop), only
        # its forward passes under torch.no_grad() evaluate
        in_evaluator = (
            scope is not None
            and scope.name.value in evaluators
            and name == first_parameter(scope)
            and (not trainer.inside(batch, scope) or under_no_grad(trainer, node))
        )
        evaluation = id(node) in forwards or (name in averaged and under_no_grad(trainer, node))
        if (in_evaluator or evaluation) and len(node.args) == 1 and not node.args[0].keyword:
            edits.sub(node, lambda old, _f=name: expression(f"flip_averaged({_f}, {code(old.args[0].value)})"))
            found += 1
    if not found:
        raise NotApplicable(
            f"no evaluation forward pass found ({model}(x) under torch.no_grad() outside the batch loop, or a "
            "function under @torch.no_grad(), calling .eval() or only called under torch.no_grad() that runs the "
            "model it is given)"
        )
    edits.helper(TTA_HELPER)
    return edits.apply()
