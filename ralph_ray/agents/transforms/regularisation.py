"""Regularisation: dropout before the classifier, label smoothing, weight decay, AdamW."""

from __future__ import annotations

import re

import libcst as cst

from ralph_ray.agents.transforms._registry import register
from ralph_ray.agents.transforms._tree import (
    CROSS_ENTROPY_FN,
    Edits,
    NotApplicable,
    Trainer,
    analyse,
    assign_target,
    assign_value,
    attribute_calls,
    call_name,
    classifier,
    code,
    dotted,
    expression,
    free_name,
    insert_beside,
    kwarg,
    positional,
    refuse_lbfgs,
    statement,
    with_kwarg,
    wrap_first_arg,
)

# nn.CrossEntropyLoss's keyword settings that F.cross_entropy takes as they are
CE_SETTINGS = frozenset({"weight", "ignore_index", "reduction", "label_smoothing"})
ADAMW_LR = 0.003
ADAMW_WEIGHT_DECAY = 0.05
# optimizers whose learning rate is on AdamW's scale (per-parameter normalised steps)
ADAM_FAMILY = frozenset({"Adam", "NAdam", "RAdam", "Adamax"})


@register("add_dropout", "regularisation")
def add_dropout(source: str) -> str:
    """nn.Dropout(DROPOUT) on the classifier's input, in nn.Sequential, the list it is built from, or a module's
    forward."""
    trainer = analyse(source)
    if trainer.has(r"Dropout|\bdropout\("):
        raise NotApplicable("the model already has dropout (the `dropout` knob move tunes it)")
    head = classifier(trainer.model_layers())
    edits = Edits(trainer)
    knob = free_name(trainer, "DROPOUT")
    edits.knob(knob, 0.2, "dropout on the classifier's input")
    if not insert_beside(edits, head, f"torch.nn.Dropout({knob})", before=True):
        name = free_name(trainer, f"drop_{head.attribute}")
        edits.insert_after(trainer.statement_of(head.call), statement(f"self.{name} = torch.nn.Dropout({knob})"))
        calls = attribute_calls(trainer, head.attribute or "")
        if not calls:
            raise NotApplicable(f"the classifier `self.{head.attribute}` is never called as `self.{head.attribute}(x)`")
        for call in calls:
            wrap_first_arg(edits, call, f"self.{name}({{}})")
    return edits.apply()


@register("label_smoothing", "regularisation")
def label_smoothing(source: str) -> str:
    """Train against labels smoothed by LABEL_SMOOTHING (the training loss only; evaluation is untouched)."""
    trainer = analyse(source)
    call = trainer.loss_call()
    if kwarg(call, "label_smoothing") is not None or "LABEL_SMOOTHING" in trainer.knobs():
        raise NotApplicable("the training loss already smooths labels")
    ctor = trainer.criterion_built(call)
    smoothed = kwarg(ctor, "label_smoothing") if ctor is not None else None
    if smoothed is not None:
        raise NotApplicable(
            f"the training loss already smooths labels (label_smoothing={code(smoothed.value)} on its criterion)"
        )
    edits = Edits(trainer)
    edits.knob("LABEL_SMOOTHING", 0.1, "cross-entropy label smoothing of the training loss")
    if CROSS_ENTROPY_FN.match(call_name(call) or "") or isinstance(call.func, cst.Call):
        edits.sub(call, lambda old: with_kwarg(old, "label_smoothing", "LABEL_SMOOTHING"))
    else:
        # A criterion object shared with evaluation: the training line gets its own smoothed call (smoothing the
        # constructor would smooth the validation loss too), carrying the criterion's settings (weight=...) over.
        settings = trainer.criterion_settings(call, CE_SETTINGS)
        args = [code(a.value) for a in positional(call)[:2]] + [f"{k}={v}" for k, v in settings.items()]
        edits.sub(
            call,
            expression(f"torch.nn.functional.cross_entropy({', '.join(args)}, label_smoothing=LABEL_SMOOTHING)"),
        )
    return edits.apply()


@register("add_weight_decay", "regularisation")
def add_weight_decay(source: str) -> str:
    """Give an optimizer without weight decay `weight_decay=WEIGHT_DECAY` (5e-4), a knob from then on."""
    trainer = analyse(source)
    refuse_lbfgs(trainer, "it has no weight_decay")
    call = trainer.optimizer_call()
    current = kwarg(call, "weight_decay")
    if current is not None:
        value = code(current.value)
        if value in trainer.knobs():
            raise NotApplicable(f"weight decay is already the knob {value} (the `weight_decay` knob move tunes it)")
        if not re.fullmatch(r"0(\.0*)?", value):
            raise NotApplicable(f"the optimizer already has weight_decay={value}")
    if any(isinstance(a.value, (cst.List, cst.ListComp)) for a in positional(call)[:1]) and trainer.has(
        r"[\"']weight_decay[\"']"
    ):
        raise NotApplicable("the parameter groups set their own weight_decay")
    groups = _groups_built_by(trainer, call)
    if groups is not None:
        raise NotApplicable(
            f"the parameter groups of `{groups}` set their own weight_decay, which wins over the optimizer's"
        )
    edits = Edits(trainer)
    knob = free_name(trainer, "WEIGHT_DECAY")
    edits.knob(knob, 0.0005, "L2 weight decay of the optimizer")
    edits.sub(call, lambda old: with_kwarg(old, "weight_decay", knob))
    return edits.apply()


@register("adamw_optimizer", "regularisation")
def adamw_optimizer(source: str) -> str:
    """Switch any other torch.optim optimizer to AdamW (lr 3e-3, decoupled weight decay 0.05, momentum -> beta1,
    RMSprop's alpha -> beta2); a setting the trainer reads from a knob or a name (`cfg.lr`) keeps reading it."""
    trainer = analyse(source)
    call = trainer.optimizer_call()
    name = (call_name(call) or "").rsplit(".", 1)[-1]
    if name in ("Adam", "AdamW", "NAdam", "RAdam"):
        raise NotApplicable(f"the optimizer is already {name}")
    params = positional(call)
    if not params:
        raise NotApplicable("the optimizer gets its parameters by keyword")
    if isinstance(params[0].value, (cst.List, cst.Dict, cst.ListComp)):
        raise NotApplicable("the optimizer has parameter groups with their own settings (tuned by hand)")
    groups = _groups_built_by(trainer, call)
    if groups is not None:
        # AdamW's weight_decay=0.05 would be the default each group's own weight_decay overrides: never applied
        raise NotApplicable(f"the optimizer has parameter groups with their own weight_decay, from `{groups}`")
    knobs, edits = trainer.knobs(), Edits(trainer)
    args = [code(params[0].value)]
    # a learning rate traced to no knob is kept only from an Adam-family optimizer (on AdamW's scale): an SGD's
    # `lr=model.lr` of 0.1 kept as it is would be AdamW at 0.1
    args.append("lr=" + _setting(trainer, edits, call, "lr", ADAMW_LR, knobs, name in ADAM_FAMILY))
    # SGD's and RMSprop's momentum is AdamW's beta1, RMSprop's alpha (its squared-gradient average) its beta2: a knob
    # or a name the trainer tunes carries over (dropped, it would stay a knob that no longer reaches the optimizer)
    betas = [_tuned(kwarg(call, "momentum"), knobs), _tuned(kwarg(call, "alpha"), knobs) if name == "RMSprop" else None]
    if any(betas):
        args.append(f"betas=({betas[0] or '0.9'}, {betas[1] or '0.999'})")
    eps = kwarg(call, "eps")  # the same term in AdamW's denominator
    if eps is not None:
        args.append(f"eps={code(eps.value)}")
    decay = kwarg(call, "weight_decay")
    if decay is None:
        knob = free_name(trainer, "WEIGHT_DECAY")
        edits.knob(knob, ADAMW_WEIGHT_DECAY, "decoupled weight decay (AdamW)")
        args.append(f"weight_decay={knob}")
    else:
        # an untraced name is never kept: no other optimizer's weight_decay is AdamW's (SGD's and Adam's are an L2 term
        # in the gradient, ~5e-4; AdamW's is decoupled, ~0.05), so `weight_decay=wd` would be AdamW at 100x less decay
        args.append("weight_decay=" + _setting(trainer, edits, call, "weight_decay", ADAMW_WEIGHT_DECAY, knobs, False))
    edits.sub(call, expression(f"torch.optim.AdamW({', '.join(args)})"))
    result = edits.apply()
    # the knobs' comments name the optimizer they belong to
    return re.sub(rf"^([A-Z_]+ = [^#\n]*#.*)\b{re.escape(name)}\b", r"\1AdamW", result, flags=re.MULTILINE)


def _groups_built_by(trainer: Trainer, call: cst.Call) -> str | None:
    """The call that builds the optimizer's parameter groups with a weight decay of their own (`param_groups(model,
    WEIGHT_DECAY)`, timm's `param_groups_weight_decay(model, wd)`), or None. A group's own weight_decay wins over the
    optimizer's: a user trial's `add_weight_decay` and `adamw_optimizer` children set one that never applied."""
    params = positional(call)[:1]
    if not params or not isinstance(params[0].value, cst.Call):
        return None
    built = params[0].value
    name = (call_name(built) or "").rsplit(".", 1)[-1]
    if name in ("parameters", "named_parameters"):
        return None
    text = code(built)
    says = "decay" in text.lower() or any("weight_decay" in code(f) for f in trainer.defined(name))
    return text if says else None


def _tuned(arg: cst.Arg | None, knobs: dict) -> str | None:
    """An optimizer setting's source when the trainer tunes it (a knob, `cfg.momentum`, a variable), else None."""
    if arg is None:
        return None
    text = code(arg.value)
    return text if text in knobs or dotted(arg.value) is not None else None


def _setting(
    trainer: Trainer, edits: Edits, call: cst.Call, key: str, value: float, knobs: dict, untraced: bool
) -> str:
    """The AdamW argument for `key`: the same knob set to `value`; the trainer's own name (`cfg.lr`, `args.lr`, a
    variable), with the knob it is read from set to `value` where it can be traced to one, or kept as it is where
    `untraced` (its value suits AdamW); else the literal."""
    arg = kwarg(call, key)
    if arg is None:
        return repr(value)
    text = code(arg.value)
    if text in knobs:
        edits.set_knobs[text] = value
        return text
    if dotted(arg.value) is not None:
        # a literal here would cut the knob behind the name off the optimizer: every later move of it a no-op
        knob = _knob_behind(trainer, text, knobs)
        if knob is not None:
            edits.set_knobs[knob] = value
            return text
        if untraced:
            return text
        return repr(value)
    if not isinstance(arg.value, (cst.Integer, cst.Float)):
        raise NotApplicable(f"the optimizer's {key} is computed (`{text}`), not a knob or a number")
    return repr(value)


def _knob_behind(trainer: Trainer, name: str, knobs: dict) -> str | None:
    """The knob a dotted setting reads through a config object: the default of its class's field (`lr: float = LR`
    for `cfg.lr`, `cfg = Config()` or `cfg: Config`) or of its argparse option (`add_argument("--lr", default=LR)`
    for `args = parser.parse_args()`); None unless exactly one is found."""
    base, _, attribute = name.rpartition(".")
    makers = {call_name(v) or "" for v in _bound_values(trainer, base) if isinstance(v, cst.Call)}
    makers |= {
        code(p.annotation.annotation)
        for p in trainer.nodes
        if isinstance(p, cst.Param) and p.annotation and p.name.value == base
    }
    found = set()
    for node in trainer.nodes:
        if isinstance(node, cst.ClassDef) and node.name.value in makers:
            for line in node.body.body:
                value = assign_value(line) if assign_target(line) == attribute else None
                if value is not None and code(value) in knobs:
                    found.add(code(value))
        elif isinstance(node, cst.Call) and (call_name(node) or "").endswith(".add_argument"):
            if not any(m.endswith(("parse_args", "parse_known_args")) for m in makers):
                continue
            flags = [a.value.evaluated_value for a in positional(node) if isinstance(a.value, cst.SimpleString)]
            dest = kwarg(node, "dest")
            names = {str(f).lstrip("-").replace("-", "_") for f in flags}
            if dest is not None and isinstance(dest.value, cst.SimpleString):
                names = {str(dest.value.evaluated_value)}
            default = kwarg(node, "default")
            if attribute in names and default is not None and code(default.value) in knobs:
                found.add(code(default.value))
    return found.pop() if len(found) == 1 else None


def _bound_values(trainer: Trainer, name: str) -> list[cst.BaseExpression]:
    """The values of the trainer's `name = value` lines."""
    values = (assign_value(line) for line in trainer.lines if assign_target(line) == name)
    return [v for v in values if v is not None]
