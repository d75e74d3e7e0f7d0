"""Capacity: wider layers where widths are literals, one more hidden layer before the classifier."""

from __future__ import annotations

import re

import libcst as cst

from ralph_ray.agents.transforms._registry import register
from ralph_ray.agents.transforms._tree import (
    CONV,
    LINEAR,
    SEQUENTIAL,
    Edits,
    NotApplicable,
    Trainer,
    analyse,
    call_name,
    classifier,
    code,
    expression,
    layer_size,
    size_code,
)
from ralph_ray.knobs import KNOB_ALIASES

NORM_CALL = r"^((torch\.)?nn\.)?(BatchNorm[12]d|LayerNorm)$"
WIDTH_KNOB = r"(WIDTH|HIDDEN|CHANNELS|DIM|N_HIDDEN|HIDDEN_SIZE)\w*"
# deepen's layer width, a knob of the trainer it edits: a name apart from WIDTH_KNOB's, so `widen_layers` and the
# `widen` move keep widening the trainer's own layers after it, and a trainer's own HIDDEN_* knob is never taken over
HEAD_KNOB = "HEAD_WIDTH"
HEAD_UNITS = 256  # its value
# The model's own nonlinearity, as a module or a function, by its torch.nn module: deepen's hidden layer uses the one
# the model uses most (a user trial's SiLU network got a ReLU layer before its classifier).
ACTIVATIONS = {
    "relu": "ReLU",
    "silu": "SiLU",
    "gelu": "GELU",
    "tanh": "Tanh",
    "leaky_relu": "LeakyReLU",
    "elu": "ELU",
    "selu": "SELU",
    "mish": "Mish",
    "hardswish": "Hardswish",
    "softplus": "Softplus",
}
ACTIVATION_CALL = re.compile(
    rf"^(?:(?:(?:torch\.)?nn\.)?(?P<module>{'|'.join(ACTIVATIONS.values())})"
    rf"|(?:(?:torch\.)?nn\.functional|F|torch)\.(?P<function>{'|'.join(ACTIVATIONS)})_?)$"
)


@register("widen_layers", "capacity")
def widen_layers(source: str) -> str:
    """Double the literal hidden widths (out sizes of non-final conv/linear layers) and the sizes that follow them;
    where the widths are knobs the `widen` knob move does not reach (WIDTH1, WIDTH2, ..., or a list of widths
    `HIDDEN = [128, 64]`), double those knobs."""
    trainer = analyse(source)
    knob = trainer.knob_like(WIDTH_KNOB)
    if knob is not None:
        return _widen_knobs(trainer)
    layers = trainer.layers()
    if len(layers) < 2:
        # (a model imported from another file has its layers there: say so, not that it has too few)
        raise NotApplicable(trainer.imported_model() or "fewer than two conv/linear layers: no hidden width to widen")
    head = classifier(layers)
    sized = [
        c
        for c in trainer.calls()
        if (
            CONV.match(call_name(c) or "")
            or LINEAR.match(call_name(c) or "")
            or re.match(NORM_CALL, call_name(c) or "")
        )
        and trainer.in_model(c)  # (in a models.py, the model's classes only)
    ]
    edits, previous, changed, looped = Edits(trainer), None, 0, None
    for call in sized:
        is_layer = not re.match(NORM_CALL, call_name(call) or "")
        first = layer_size(call, 0, "in_features")
        if previous is not None and first is not None:
            changed += _double_leading(edits, first, previous)
        if not is_layer:
            continue
        out = layer_size(call, 1, "out_features")
        if call is head.call or not isinstance(out, cst.Integer):
            previous = None
            continue
        if _in_loop(trainer, call):
            # a loop builds it once per pass: the next pass's input is its own output, carried by a name the loop
            # sets (`width = 64`) that is not followed; doubling only the output would break the shapes
            looped, previous = (call if looped is None else looped), None
            continue
        previous = out.evaluated_value
        edits.sub(out, cst.Integer(str(2 * previous)))
        changed += 1
    if not changed and looped is not None:
        raise NotApplicable(
            f"the literal hidden width is in a layer a loop builds (`{code(looped)}`): the width the loop carries to "
            "the next layer is not followed"
        )
    if not changed:
        raise NotApplicable("no literal hidden width in the conv/linear layers (sizes come from variables)")
    return edits.apply()


def _in_loop(trainer: Trainer, call: cst.Call) -> bool:
    """Whether a layer is built in a loop or a comprehension of its own function."""
    for node in trainer.ancestors(call):
        if isinstance(node, (cst.FunctionDef, cst.ClassDef)):
            return False
        if isinstance(node, (cst.For, cst.While, cst.ListComp, cst.GeneratorExp)):
            return True
    return False


def _widen_knobs(trainer: Trainer) -> str:
    """Double every width knob (an integer, or each integer of a list or tuple of widths), unless the `widen` knob
    move (WIDTH or its aliases) already reaches one: it multiplies a number, so a list of widths is left to this."""
    knobs = trainer.knobs()
    reached = next((k for k in ("WIDTH", *KNOB_ALIASES["WIDTH"]) if k in knobs), None)
    if reached is not None and _is_int(knobs[reached]):
        raise NotApplicable(f"the width is the knob {reached} (the `widen` knob move doubles it)")
    widths = {k: doubled for k, v in knobs.items() if re.fullmatch(WIDTH_KNOB, k) and (doubled := _doubled(v))}
    if not widths:
        raise NotApplicable(
            f"the width knobs ({', '.join(k for k in knobs if re.fullmatch(WIDTH_KNOB, k))}) are neither integers "
            "nor lists of integers"
        )
    edits = Edits(trainer)
    edits.set_knobs.update(widths)
    return edits.apply()


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _doubled(value: object) -> int | list[int] | tuple[int, ...] | None:
    """A width knob's value doubled (`[128, 64]` -> `[256, 128]`); None for anything but widths."""
    if _is_int(value):
        return 2 * value  # type: ignore[operator]
    if isinstance(value, (list, tuple)) and value and all(_is_int(v) for v in value):
        return type(value)(2 * v for v in value)
    return None


def _double_leading(edits: Edits, node: cst.BaseExpression, old: int) -> int:
    """Double the literal `old` at the left of `old`, `old * 4 * 4`: the input size following a widened layer."""
    while isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Multiply):
        node = node.left
    if isinstance(node, cst.Integer) and node.evaluated_value == old:
        edits.sub(node, cst.Integer(str(2 * old)))
        return 1
    return 0


@register("deepen", "capacity")
def deepen(source: str) -> str:
    """One more hidden layer (Linear and the model's own activation, ReLU if it names none; HEAD_WIDTH units: a new
    knob) before the classifier."""
    trainer = analyse(source)
    trainer.model_layers()  # (says what the model is built from, where no layer is in reach)
    head = classifier(trainer.layers())
    if not head.placed:
        raise NotApplicable(
            f"the classifier `{code(head.call)}` is built neither in `__init__`, nor in `nn.Sequential(...)`, nor "
            "added to a list handed to `nn.Sequential(*list)`"
        )
    width = size_code(head, "in")
    activation = _activation(trainer)
    edits = Edits(trainer)
    if width != HEAD_KNOB:  # a second deepen stacks another layer of the first one's width, its knob already there
        # A knob, not the classifier's input width: that grows with the conv width squared (3,136 x 3,136 at WIDTH
        # 32 on Fashion, about 2.5 times the convolutions' work per image), and a final got a third fewer epochs.
        edits.knob(HEAD_KNOB, HEAD_UNITS, "units of the hidden layer before the classifier")
    edits.sub(
        head.call,
        lambda old: expression(
            f"torch.nn.Sequential(torch.nn.Linear({width}, {HEAD_KNOB}), torch.nn.{activation}(), "
            f"{code(_with_input(old, HEAD_KNOB))})"
        ),
    )
    return edits.apply()


def _activation(trainer: Trainer) -> str:
    """The torch.nn activation the model's code uses most (`nn.SiLU()`, `F.gelu(x)`, `torch.tanh(x)`; the last used of
    a tie), ReLU where it uses none: calls in its classes and `nn.Sequential(...)`, else anywhere in the model's code
    (a functional model), never a loss's or an evaluation's `torch.tanh` beside a module model (review)."""
    calls = [c for c in trainer.calls(ACTIVATION_CALL) if trainer.in_model(c)]
    sequentials = {id(c) for c in trainer.calls(SEQUENTIAL)}
    built = [c for c in calls if any(isinstance(a, cst.ClassDef) or id(a) in sequentials for a in trainer.ancestors(c))]
    used = []
    for call in built or calls:
        found = ACTIVATION_CALL.match(call_name(call) or "")
        assert found is not None  # calls() matched it
        used.append(found["module"] or ACTIVATIONS[found["function"]])
    return max(reversed(used), key=used.count) if used else "ReLU"


def _with_input(call: cst.Call, size: str) -> cst.Call:
    """An nn.Linear call with its input size (first positional argument or `in_features=`) set to `size`."""
    args = list(call.args)
    for i, arg in enumerate(args):
        if (arg.keyword is None and i == 0) or (arg.keyword is not None and arg.keyword.value == "in_features"):
            args[i] = arg.with_changes(value=expression(size))
            return call.with_changes(args=args)
    raise NotApplicable(f"cannot read the in size of `{code(call)}`")
