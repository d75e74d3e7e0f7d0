"""Norm layers: BatchNorm after every conv and hidden linear layer, wherever the layers are built (`__init__`,
`nn.Sequential(...)`, a list a loop appends them to, or an `nn.ModuleList` whose elements the forward calls)."""

from __future__ import annotations

import re

from ralph_ray.agents.transforms._registry import register
from ralph_ray.agents.transforms._tree import (
    Edits,
    NotApplicable,
    analyse,
    attribute_calls,
    call_name,
    classifier,
    code,
    expression,
    insert_beside,
    size_code,
    statement,
    wrap_first_arg,
)

# Layers a model may be built of that get no norm here: named in the refusal of a model with nothing else to norm.
UNHANDLED = re.compile(
    r"^((torch\.)?nn\.)?(LSTM|GRU|RNN|Conv1d|Conv3d|ConvTranspose[123]d|Embedding|MultiheadAttention|Transformer\w*)$"
)


@register("batchnorm", "norm")
def batchnorm(source: str) -> str:
    """BatchNorm2d after each nn.Conv2d, BatchNorm1d after each hidden nn.Linear, and (for conv nets) a
    parameter-free BatchNorm1d on the classifier's input: centred head inputs keep SGD on the head stable."""
    trainer = analyse(source)
    if trainer.has(r"BatchNorm|LayerNorm|GroupNorm"):
        raise NotApplicable("the model already has normalisation layers")
    layers = trainer.model_layers()
    # hidden layers of an nn.ModuleList the model uses otherwise than by calling them: a norm beside some layers only
    # would be another model than asked for, so the whole edit is refused for what was found
    unfollowed = next((layer.unfollowed for layer in trainer.layers() if layer.unfollowed), None)
    if unfollowed is not None:
        raise NotApplicable(unfollowed)
    head = classifier(layers)
    # the head's input gets centred only where conv features feed it directly (many positive unit-scale inputs)
    convs = layers.index(head) > 0 and layers[layers.index(head) - 1].kind == "conv"
    if len(layers) == 1:  # the classifier alone (an RNN's head): refused here for what was found
        unhandled = sorted({f"nn.{call_name(c).rsplit('.', 1)[-1]}" for c in trainer.calls(UNHANDLED)})
        shown = f" ({', '.join(unhandled)} {'is' if len(unhandled) == 1 else 'are'} not handled)" if unhandled else ""
        raise NotApplicable(
            f"no convolution or hidden nn.Linear layer to follow with a norm, only the classifier "
            f"`{code(head.call)}`{shown}"
        )
    edits = Edits(trainer)
    for layer in layers:
        if layer is head:
            if not convs:
                continue
            norm, before = f"torch.nn.BatchNorm1d({size_code(layer, 'in')}, affine=False)", True
        elif layer.kind == "conv":
            norm, before = f"torch.nn.BatchNorm2d({size_code(layer, 'out')})", False
        else:
            norm, before = f"torch.nn.BatchNorm1d({size_code(layer, 'out')})", False
        if insert_beside(edits, layer, norm, before=before):  # in the module list: no forward to rewire
            continue
        name = f"bn_{layer.attribute}"
        edits.insert_after(trainer.statement_of(layer.call), statement(f"self.{name} = {norm}"))
        calls = attribute_calls(trainer, layer.attribute or "")
        if not calls:
            raise NotApplicable(f"`self.{layer.attribute}` is built but never called as `self.{layer.attribute}(x)`")
        for call in calls:
            if before:
                wrap_first_arg(edits, call, f"self.{name}({{}})")
            else:
                edits.sub(call, lambda old, _n=name: expression(f"self.{_n}({code(old)})"))
    return edits.apply()
