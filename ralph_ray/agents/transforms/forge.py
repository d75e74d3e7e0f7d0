"""The Forge seed's techniques: Grokfast, an edge-of-chaos curriculum, hard-example ("dream") replay, a self-model head.

Each is an intervention like any other, so the knowledge base measures its effect per diagnosis.
"""

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
    assign_value,
    call_name,
    code,
    dotted,
    expression,
    free_name,
    kwarg,
    own_unscale,
    positional,
    refuse_built_apart,
    refuse_closure_step,
    refuse_lbfgs,
    unscale_line,
)

# torch.nn.utils' gradient clipping, however imported (`clip_grad_norm_(...)`, `nn.utils.clip_grad_value_(...)`)
CLIP_GRAD = re.compile(r"^(\w+\.)*clip_grad_(norm|value)_$")
# mixed precision's context, however imported (`torch.autocast(...)`, `torch.cuda.amp.autocast()`, `autocast(...)`)
AUTOCAST = re.compile(r"^(\w+\.)*autocast$")

GROKFAST_HELPER = '''
def gradfilter_ema(model: torch.nn.Module, grads: dict | None) -> dict:
    """Grokfast-EMA (Lee et al. 2024): add GROKFAST_LAMB x (an EMA of the gradients) to them; returns the EMA, `grads`
    itself updated in place (a dict built beside the epoch loop and handed to each epoch's call stays the one EMA)."""
    grads = {} if grads is None else grads
    for n, p in model.named_parameters():
        if p.grad is None:
            continue
        if n not in grads:  # the first step: the EMA starts at the gradient
            grads[n] = p.grad.detach().clone()
        else:
            grads[n] = grads[n] * GROKFAST_ALPHA + p.grad.detach() * (1 - GROKFAST_ALPHA)
        p.grad.add_(grads[n], alpha=GROKFAST_LAMB)
    return grads
'''

EDGE_HELPER = '''
def edge_of_chaos_loss(logits: torch.Tensor, targets: torch.Tensor, label_smoothing: float = 0.0) -> torch.Tensor:
    """Cross-entropy weighted towards the examples at the edge of what the model can do (p(correct) near 1/2):
    easy examples (p near 1) and hopeless ones (p near 0) teach little; EDGE_MIX sets how far the weights lean."""
    losses = torch.nn.functional.cross_entropy(logits, targets, reduction="none", label_smoothing=label_smoothing)
    p = logits.detach().float().softmax(1).gather(1, targets.view(-1, 1)).squeeze(1)
    weight = (1 - EDGE_MIX) + EDGE_MIX * 4 * p * (1 - p)
    return (weight * losses).sum() / weight.sum()
'''

EDGE_WEIGHT_HELPER = '''
def edge_of_chaos_weight(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Per-example weights towards the edge of what the model can do (p(correct) near 1/2), for a trainer that
    reduces the per-example losses itself; scaled to mean 1 so its summed or averaged loss keeps its size."""
    p = logits.detach().float().softmax(1).gather(1, targets.view(-1, 1)).squeeze(1)
    weight = (1 - EDGE_MIX) + EDGE_MIX * 4 * p * (1 - p)
    return weight / weight.mean()
'''

REPLAY_HELPER = '''
class DreamReplay:
    """Hard-example replay: keep each batch's most-missed REPLAY_SHARE, train on them again before the next epoch."""

    def __init__(self) -> None:
        self.x: list[torch.Tensor] = []
        self.y: list[torch.Tensor] = []
        self.batch_size = 1

    def observe(self, logits: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> None:
        """Remember the examples of this batch the model missed most, by the losses of the step's own forward
        (no second forward pass: the step already paid for it)."""
        with torch.no_grad():
            losses = torch.nn.functional.cross_entropy(logits.detach().float(), y, reduction="none")
        hard = losses.topk(max(1, int(len(y) * REPLAY_SHARE))).indices
        self.x.append(x[hard].detach())
        self.y.append(y[hard].detach())
        self.batch_size = max(self.batch_size, len(y))

    def dream(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        loss=None,
        clip=None,
        autocast=None,
        scaler=None,
    ) -> None:
        """One pass over the remembered examples, shuffled, in batches of the training batch size, each step as the
        trainer's own: its loss (`loss(logits, targets)`, plain cross-entropy if None), its gradient clipping
        (`clip()` between backward and step), its mixed precision (the forward under `autocast()`, the step through
        its GradScaler `scaler`). It leaves no gradient behind, wherever the trainer zeroes its own."""
        import contextlib

        if not self.y:
            return
        x, y = torch.cat(self.x), torch.cat(self.y)
        self.x, self.y = [], []
        order = torch.randperm(len(y), device=y.device)
        for i in range(0, len(y), self.batch_size):
            idx = order[i : i + self.batch_size]
            optimizer.zero_grad(set_to_none=True)
            with autocast() if autocast is not None else contextlib.nullcontext():
                logits = model(x[idx])
                step_loss = torch.nn.functional.cross_entropy(logits, y[idx]) if loss is None else loss(logits, y[idx])
            if scaler is None:
                step_loss.backward()
                if clip is not None:
                    clip()
                optimizer.step()
            else:  # PyTorch's AMP recipe: a scaled backward, unscaled before the clip, stepped and updated through it
                scaler.scale(step_loss).backward()
                if clip is not None:
                    scaler.unscale_(optimizer)
                    clip()
                scaler.step(optimizer)
                scaler.update()
        # the last replay step's gradient, left in place, went into the trainer's next step where it zeroes before
        # this call and after its steps (user trial: the first step of every epoch after the first)
        optimizer.zero_grad(set_to_none=True)
'''

SELF_MODEL_HELPER = '''
class SelfModel(torch.nn.Module):
    """A self-model: a head on the classifier's input that predicts the model's own per-example loss.

    Used only in training (its loss shapes the features); predictions come from the model alone.
    """

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
        if not linears:
            raise ValueError("SelfModel: the model has no nn.Linear classifier to read features from")
        device = next(model.parameters()).device
        self.head = torch.nn.Linear(linears[-1].in_features, 1).to(device)
        self.features: torch.Tensor | None = None
        self.logits: torch.Tensor | None = None
        linears[-1].register_forward_pre_hook(self._keep_features)
        model.register_forward_hook(self._keep_logits)

    def _keep_features(self, module: torch.nn.Module, inputs: tuple) -> None:
        self.features = inputs[0]

    def _keep_logits(self, module: torch.nn.Module, inputs: tuple, output: torch.Tensor) -> None:
        self.logits = output

    def aux_loss(self, targets: torch.Tensor) -> torch.Tensor:
        """How far the head's guess of the last forward's per-example log-losses is from the real ones (Huber)."""
        assert self.features is not None and self.logits is not None, "call the model before aux_loss"
        own = torch.nn.functional.cross_entropy(self.logits.detach().float(), targets, reduction="none")
        # Unit-norm features keep the head's regression stable at the trainer's own learning rate (raw features of
        # norm ~10 made SGD at lr 0.2 diverge: NaN weights), and log1p + Huber bound what flows into the features.
        guess = self.head(torch.nn.functional.normalize(self.features.float(), dim=1)).squeeze(1)
        return torch.nn.functional.smooth_l1_loss(guess, torch.log1p(own))
'''


@register("grokfast_filter", "forge")
def grokfast_filter(source: str) -> str:
    """Grokfast-EMA: amplify the slow part of the gradients after every backward pass."""
    trainer = analyse(source)
    if trainer.has(r"gradfilter_ema|GROKFAST"):
        raise NotApplicable("the trainer already filters gradients (Grokfast)")
    if trainer.model_has(r"BatchNorm"):  # (in train.py, or in the models.py it imports the model from)
        # measured on digits: with BatchNorm the amplified slow gradient destabilised training (0.96-0.97 vs 0.99)
        raise NotApplicable("the model uses BatchNorm, with which Grokfast destabilised training on digits")
    edits, grads = Edits(trainer), free_name(trainer, "grokfast_grads")
    edits.thread(grads, "the running EMA of the gradients", trainer.epoch_loop())
    refuse_closure_step(trainer, "the gradients to filter are computed inside the closure, after any line before it")
    model = trainer.model_name()
    # Through a GradScaler (`scaler.step(opt)`) the filter reads the true gradients: after the trainer's own
    # `scaler.unscale_(opt)`, or one added after the backward pass. A step whose gradients overflowed is skipped by
    # the scaler; its inf/NaN is kept out of the EMA, where it would stay for every later step.
    why = "the EMA would average loss-scaled gradients, whose scale changes"
    own, unscale = own_unscale(trainer, why), unscale_line(trainer, why)
    scaled = trainer.stepped_as(trainer.step_statement())
    lines = [f"{grads} = gradfilter_ema({model}, {grads})"]
    if scaled is not None and scaled.scaler is not None:
        finite = f"all(p.grad is None or p.grad.isfinite().all() for p in {model}.parameters())"
        lines = [f"if {finite}:  # a step the GradScaler skips (overflow) stays out of the EMA\n    {lines[0]}"]
    edits.knob("GROKFAST_ALPHA", 0.98, "Grokfast EMA decay of the slow gradient")
    edits.knob("GROKFAST_LAMB", 2.0, "Grokfast amplification of the slow gradient")
    edits.helper(GROKFAST_HELPER)
    edits.insert_before(trainer.epoch_loop(), f"{grads} = {{}}  # Grokfast: the running EMA of the gradients")
    per_step = _once_per_step(trainer)
    if per_step is None or own is not None:
        edits.insert_after(own or trainer.backward_statement(), *([unscale] if unscale else []), *lines)
        return edits.apply()
    # Gradients accumulated over micro-batches: filtered after every backward, the second micro-batch's gradient
    # already held the first's amplified EMA, which the EMA then took in again (x1.02 per micro-batch, 166x the
    # designed update after 2,000 steps; user trial). So once per step, on the summed gradient, before the step's clip.
    edits.insert_before(per_step, *([unscale] if unscale else []), *lines)
    return edits.apply()


def _once_per_step(trainer: Trainer) -> cst.CSTNode | None:
    """Where work done once per optimizer step goes when the trainer accumulates gradients over micro-batches: before
    the first statement of the step's run that clips (`if GRAD_CLIP: clip_grad_norm_(...)` too), else before the step.
    The step's run is its block where it runs under a condition the backward pass does not (`if (i + 1) % ACCUM ==
    0:`), or what follows a guard that skips it (`if (i + 1) % ACCUM: continue`). None: each backward pass steps."""
    step, backward = trainer.step_statement(), trainer.backward_statement()
    block = trainer.parent(step)
    if not isinstance(block, cst.IndentedBlock):
        return None
    lines = list(block.body)
    index = next(i for i, line in enumerate(lines) if line is step or trainer.inside(step, line))
    if trainer.parent(backward) is block:
        after = next(i for i, line in enumerate(lines) if line is backward) + 1
        guards = [
            i
            for i in range(after, index)
            if isinstance(lines[i], cst.If) and any(isinstance(n, cst.Continue) for n in trainer.within(lines[i]))
        ]
        if not guards:
            return None
        start = guards[-1] + 1
    else:
        start = 0
    clips = [
        line
        for line in lines[start:index]
        if any(CLIP_GRAD.match(call_name(c) or "") for c in trainer.calls(within=line))
    ]
    return clips[0] if clips else step


@register("edge_of_chaos_curriculum", "forge")
def edge_of_chaos_curriculum(source: str) -> str:
    """Weight each example's loss by how near the edge of the model's ability it is (p(correct) near 1/2)."""
    trainer = analyse(source)
    if trainer.has(r"edge_of_chaos_(loss|weight)"):
        raise NotApplicable("the trainer already weights examples by difficulty")
    call = trainer.loss_call()
    reduction = trainer.loss_reduction_argument()
    logits, targets = (code(a.value) for a in positional(call)[:2])
    if reduction == "none":  # per-example losses: weight them, the trainer's own .mean()/.sum() follows
        trainer.loss_reduction()
        edits = Edits(trainer)
        edits.knob("EDGE_MIX", 0.5, "how far the curriculum leans the loss towards examples at p(correct) ~ 1/2")
        edits.helper(EDGE_WEIGHT_HELPER)
        edits.sub(call, lambda old: expression(f"(edge_of_chaos_weight({logits}, {targets}) * {code(old)})"))
        return edits.apply()
    if reduction != "mean":
        raise NotApplicable(
            f'the loss uses reduction={reduction}: the curriculum weights per-example losses (reduction="none") '
            "or replaces a mean"
        )
    smoothing = kwarg(call, "label_smoothing")
    value = code(smoothing.value) if smoothing is not None and CROSS_ENTROPY_FN.match(call_name(call) or "") else None
    # a criterion's smoothing is carried into the helper; a setting the helper has no parameter for (weight=,
    # ignore_index=) is refused rather than dropped (reduction is "mean" here, the helper's own)
    value = trainer.criterion_settings(call, frozenset({"label_smoothing", "reduction"})).get("label_smoothing", value)
    extra = f", label_smoothing={value}" if value is not None else ""
    edits = Edits(trainer)
    edits.knob("EDGE_MIX", 0.5, "how far the curriculum leans the loss towards examples at p(correct) ~ 1/2")
    edits.helper(EDGE_HELPER)
    edits.sub(call, expression(f"edge_of_chaos_loss({logits}, {targets}{extra})"))
    return edits.apply()


@register("hard_example_replay", "forge")
def hard_example_replay(source: str) -> str:
    """Replay ("dream") the most-missed examples of an epoch once more between epochs, before the next one's batches.

    Not after the epoch's own batches: there the last epoch's replay would be the last update before the model is
    evaluated, a step on the hardest examples alone. On the lm seed that cost 0.88 bits per byte on 4 of 4 seeds
    (hard bytes are the unpredictable ones: the model's distribution leaned towards them); before the next epoch's
    batches it costs 0.02, and digits' gain is the same, +0.005 (`bench/intervention_effect.py`)."""
    trainer = analyse(source)
    if trainer.has(r"DreamReplay"):
        raise NotApplicable("the trainer already replays hard examples")
    edits, replay = Edits(trainer), free_name(trainer, "dream_replay")
    edits.thread(replay, "the replay buffer", trainer.epoch_loop())
    refuse_closure_step(trainer, "a replay step is a plain `step()`, which this optimizer cannot take")
    # both as the epoch loop's function names them (`opt` of `opt, sched = model.configure_optimizers()` in fit())
    model, optimizer = trainer.model_name(), trainer.stepped_name()
    loss_args = positional(trainer.loss_call())
    targets = code(loss_args[1].value)
    # The step's own batch and logits, named where the step computes them (`model((dream_inputs := shift(x)))`,
    # `(dream_logits := model(...))`) unless they have a name: observing them costs no second forward pass (it used
    # to: about a third more compute per step), and the examples kept are the ones ranked (a random augmentation
    # evaluated again would draw other images).
    inputs = _named(edits, positional(trainer.forward_call())[0].value, free_name(trainer, "dream_inputs"))
    logits = _named(edits, loss_args[0].value, free_name(trainer, "dream_logits"))
    edits.knob("REPLAY_SHARE", 0.1, "share of each batch (its most-missed examples) replayed before the next epoch")
    edits.helper(REPLAY_HELPER)
    edits.insert_before(trainer.epoch_loop(), f"{replay} = DreamReplay()")
    # after the backward pass, not the step: where gradients accumulate the step runs under `if (i + 1) % ACCUM == 0:`
    # and saw 1 batch of every ACCUM (user trial)
    edits.insert_after(trainer.backward_statement(), f"{replay}.observe({logits}, {inputs}, {targets})")
    step = _replay_step(trainer, trainer.loss_call())
    edits.insert_before(
        trainer.batch_loop(), f"{replay}.dream({model}, {optimizer}{step})  # last epoch's hardest, first"
    )
    return edits.apply()


def _replay_step(trainer: Trainer, call: cst.Call) -> str:
    """The replay's `loss=`, `clip=`, `autocast=` and `scaler=` arguments: the trainer's own loss expression on the
    replayed logits and targets, its own gradient clipping calls under their own conditions, the autocast its forward
    runs under and the GradScaler its step goes through, so that a replay step is one of the trainer's steps (a
    criterion's label smoothing, a summed loss's scale, the clip, mixed precision). NotApplicable where any reads a
    name the batch loop binds: the replay runs before the loop's batches, where that name is the previous epoch's
    last value or unbound."""
    batch = trainer.batch_loop()
    bound = _bound_in(trainer, batch)
    logits, targets = free_name(trainer, "replay_logits"), free_name(trainer, "replay_targets")
    first, second = positional(call)[:2]
    # The whole expression of the loss line, not only its call: `F.cross_entropy(out, y, reduction="sum") / BATCH`
    # replayed as the bare call would step at BATCH times the training step's scale. (Later `loss = loss ...` lines
    # before the backward are not followed.)
    value = assign_value(trainer.statement_of(call))
    whole = _unaccumulated(trainer, value) if value is not None and trainer.inside(call, value) else call
    _reachable(trainer, "loss", whole, [whole], bound, skip=(first.value, second.value))
    replaced = call.with_changes(
        args=[
            first.with_changes(value=cst.Name(logits)),
            second.with_changes(value=cst.Name(targets)),
            *(a for a in call.args if a is not first and a is not second),
        ]
    )
    loss = code(whole.deep_replace(call, replaced) if whole is not call else replaced)
    if whole is call and trainer.loss_reduction_argument(call) == "none":  # reduced on a later line: a mean
        loss += ".mean()"
    step = f", loss=lambda {logits}, {targets}: {loss}"
    clips = []
    for clip in trainer.calls(CLIP_GRAD, within=batch):
        _reachable(trainer, "gradient clipping", clip, [clip], bound)
        clips.append(code(clip) + _condition(trainer, clip, batch, bound))
    if clips:
        calls = clips[0] if len(clips) == 1 else f"({', '.join(f'({c})' for c in clips)})"
        step += f", clip=lambda: {calls}"
    return step + _mixed_precision(trainer, call, bound)


def _unaccumulated(trainer: Trainer, value: cst.BaseExpression) -> cst.BaseExpression:
    """The loss expression a replay step takes: the trainer's own, less the divisor of a loss divided for gradient
    accumulation (`criterion(out, y) / ACCUM`, the step under `if (i + 1) % ACCUM == 0:`). A replay step is one whole
    optimizer step on one batch, so it takes the undivided loss: the divided one stepped at 1/ACCUM of the training
    step's scale (user trial), and accumulating ACCUM replay batches a step would leave a partial step over at the end
    of the replay. The divisor is the one the step's condition counts micro-batches by (`% ACCUM`); NotApplicable where
    the divisor mixes that count with other factors (`/ (BATCH * ACCUM)`), which cannot be split."""
    if (
        not isinstance(value, cst.BinaryOperation)
        or not isinstance(value.operator, cst.Divide)
        or _once_per_step(trainer) is None
    ):
        return value
    counts = _micro_batch_counts(trainer)
    if code(value.right) in counts:
        return value.left
    mixed = _operands(trainer, value.right) & counts
    if mixed:
        raise NotApplicable(
            f"the loss is divided by `{code(value.right)}`, which mixes the micro-batch count `{min(mixed)}` the step "
            "is taken by with other factors: a replay step (one whole step) cannot drop the accumulation's part alone "
            f"(divide by the count on its own, `/ ... / {min(mixed)}`)"
        )
    return value


# A counter compared with the micro-batch count: where the step runs (`==`, `>=`) or where a guard skips it (`<`, `!=`)
COUNTED = (cst.Equal, cst.GreaterThanEqual, cst.LessThan, cst.NotEqual)
MIRRORED = {cst.GreaterThanEqual: cst.LessThanEqual, cst.LessThan: cst.GreaterThan}  # `ACCUM <= n` is `n >= ACCUM`


def _micro_batch_counts(trainer: Trainer) -> set[str]:
    """The counts the step's conditions take micro-batches by: `N` of `(i + 1) % N == 0`, `step % N == N - 1` or
    `... % N == 0 or (i + 1) == len(loader)`, and of a counter's `if n == N:` (or `if n < N: continue`) where the
    batch loop counts `n += 1` and resets `n = 0`. Before, only a `%` was read: a counter's `/ N` stayed in the
    replay's loss, each replay step at 1/N of the trainer's."""
    counters = _counters(trainer)
    counts: set[str] = set()
    for test in _step_conditions(trainer):
        for node in trainer.within(test):
            if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Modulo):
                counts.add(code(node.right))
            elif isinstance(node, cst.Comparison) and len(node.comparisons) == 1:
                left, target = node.left, node.comparisons[0]
                operator, right = type(target.operator), target.comparator
                if isinstance(left, cst.Name) and left.value in counters and operator in COUNTED:
                    counts.add(code(right))
                elif isinstance(right, cst.Name) and right.value in counters:
                    if any(operator is MIRRORED.get(kind, kind) for kind in COUNTED):
                        counts.add(code(left))
    return counts


def _counters(trainer: Trainer) -> set[str]:
    """The names the batch loop counts micro-batches with: `n += 1` and `n = 0` both in it."""
    batch = trainer.batch_loop()
    counted = {
        node.target.value
        for node in trainer.within(batch)
        if isinstance(node, cst.AugAssign)
        and isinstance(node.operator, cst.AddAssign)
        and isinstance(node.target, cst.Name)
        and code(node.value) == "1"
    }
    reset = {
        target.target.value
        for node in trainer.within(batch)
        if isinstance(node, cst.Assign) and code(node.value) == "0"
        for target in node.targets
        if isinstance(target.target, cst.Name)
    }
    return counted & reset


def _step_conditions(trainer: Trainer) -> list[cst.BaseExpression]:
    """The tests under which the optimizer step runs and the backward pass does not: its `if (i + 1) % ACCUM == 0:`
    in the batch loop, or a guard before it in its block that skips it (`if (i + 1) % ACCUM: continue`)."""
    step, backward, batch = trainer.step_statement(), trainer.backward_statement(), trainer.batch_loop()
    tests = []
    for outer in trainer.ancestors(step):
        if outer is batch:
            break
        if isinstance(outer, cst.If) and not trainer.inside(backward, outer):
            tests.append(outer.test)
    block = trainer.parent(step)
    if isinstance(block, cst.IndentedBlock):
        lines = list(block.body)
        index = next(i for i, line in enumerate(lines) if line is step)
        start = next((i + 1 for i, line in enumerate(lines[:index]) if trainer.inside(backward, line)), 0)
        tests += [
            line.test
            for line in lines[start:index]
            if isinstance(line, cst.If) and any(isinstance(n, cst.Continue) for n in trainer.within(line))
        ]
    return tests


def _operands(trainer: Trainer, node: cst.BaseExpression) -> set[str]:
    """The names, dotted names and numbers an expression reads (`ACCUM`, `cfg.accum`, `4`), each whole."""
    found = set()
    for part in trainer.within(node):
        if isinstance(trainer.parent(part), cst.Attribute):  # a piece of a dotted name, not the whole
            continue
        if isinstance(part, cst.Integer) or (isinstance(part, (cst.Name, cst.Attribute)) and dotted(part) is not None):
            found.add(code(part))
    return found


def _mixed_precision(trainer: Trainer, call: cst.Call, bound: set[str]) -> str:
    """The replay's `autocast=` (the trainer's own `torch.autocast(...)` call where its forward or loss runs under it
    in the batch loop, the context rebuilt for each replay step) and `scaler=` (the GradScaler its step goes through,
    `scaler.step(opt)`): a replay forward in full precision beside a float16 one, stepped without the loss scale, was
    no step of the trainer's (user trial). NotApplicable where either reads a name the batch loop binds."""
    extra = ""
    batch = trainer.batch_loop()
    for node in (call, trainer.forward_call()):
        contexts = [
            item.item
            for outer in trainer.ancestors(node)
            if isinstance(outer, cst.With) and trainer.inside(outer, batch)
            for item in outer.items
            if isinstance(item.item, cst.Call) and AUTOCAST.match(call_name(item.item) or "")
        ]
        if contexts:
            _reachable(trainer, "autocast", contexts[0], [contexts[0]], bound)
            extra = f", autocast=lambda: {code(contexts[0])}"
            break
    stepped = trainer.stepped_as(trainer.step_statement())
    if stepped is not None and stepped.scaler is not None:
        if stepped.scaler.split(".")[0] in bound:
            raise NotApplicable(
                f"the trainer's GradScaler `{stepped.scaler}` is bound in its batch loop: the replay, before the "
                "loop's batches, cannot take the trainer's own step"
            )
        extra += f", scaler={stepped.scaler}"
    return extra


def _condition(trainer: Trainer, clip: cst.Call, loop: cst.For, bound: set[str]) -> str:
    """` if CONDITION else None` for a clip under `if`s in the batch loop (`if GRAD_CLIP > 0: clip_grad_norm_(...)`),
    "" for one that always runs: a replay step clips when the trainer's step would (an unconditional clip at
    GRAD_CLIP = 0 zeroes every gradient). NotApplicable where a condition reads a name the batch loop binds."""
    tests, step = [], trainer.step_statement()
    for outer in trainer.ancestors(clip):
        if outer is loop:
            break
        branch = outer.body if isinstance(outer, cst.If) and trainer.inside(clip, outer.body) else None
        if branch is not None and trainer.inside(step, branch):
            continue  # the step's own condition (`if (i + 1) % ACCUM == 0:`): a replay step is a step
        if isinstance(outer, cst.If) and not trainer.inside(clip, outer.test):
            _reachable(trainer, "gradient clipping's condition", outer.test, [outer.test], bound)
            test = code(outer.test)
            tests.append(f"({test})" if trainer.inside(clip, outer.body) else f"not ({test})")
    return f" if {' and '.join(reversed(tests))} else None" if tests else ""


def _bound_in(trainer: Trainer, loop: cst.For) -> set[str]:
    """The plain names a loop binds (its target, assignments, walrus targets) anywhere in its body."""
    targets: list[cst.CSTNode] = []
    for node in trainer.within(loop):
        if isinstance(node, (cst.For, cst.NamedExpr, cst.AnnAssign, cst.AugAssign)):
            targets.append(node.target)
        elif isinstance(node, cst.AssignTarget):
            targets.append(node.target)
    names: set[str] = set()
    while targets:
        target = targets.pop()
        if isinstance(target, cst.Name):
            names.add(target.value)
        elif isinstance(target, (cst.Tuple, cst.List)):
            targets.extend(e.value for e in target.elements)
        elif isinstance(target, cst.StarredElement):
            targets.append(target.value)
    return names


def _reachable(
    trainer: Trainer,
    what: str,
    node: cst.CSTNode,
    parts: list[cst.CSTNode],
    bound: set[str],
    skip: tuple[cst.CSTNode, ...] = (),
) -> None:
    """NotApplicable if `parts`, outside `skip` (the loss call's logits and targets, replaced), read a name in
    `bound` (attribute names and keywords are not reads)."""
    for part in parts:
        for name in trainer.within(part):
            if not isinstance(name, cst.Name) or name.value not in bound:
                continue
            if any(name is s or trainer.inside(name, s) for s in skip):
                continue
            parent = trainer.parent(name)
            if (isinstance(parent, cst.Attribute) and parent.attr is name) or (
                isinstance(parent, cst.Arg) and parent.keyword is name
            ):
                continue
            raise NotApplicable(
                f"the trainer's {what} `{code(node)}` reads `{name.value}`, which its batch loop binds: the replay, "
                "before the loop's batches, cannot take the trainer's own step"
            )


def replay_calls(trainer: Trainer) -> list[cst.Call]:
    """The trainer's `<replay>.dream(...)` calls, `<replay>` bound to `DreamReplay()` (hard_example_replay's)."""
    replays = {
        target.target.value
        for node in trainer.nodes
        if isinstance(node, cst.Assign) and isinstance(node.value, cst.Call) and call_name(node.value) == "DreamReplay"
        for target in node.targets
        if isinstance(target.target, cst.Name)
    }
    return [c for c in trainer.calls() if any(call_name(c) == f"{replay}.dream" for replay in replays)]


def own_autocast(trainer: Trainer) -> list[cst.Call]:
    """The trainer's autocast calls: the replay helper's `autocast()` (its parameter, the trainer's context passed
    in) is not one (it made mixed_precision refuse a replaying trainer as "already uses autocast")."""
    helpers = [n for n in trainer.nodes if isinstance(n, cst.ClassDef) and n.name.value == "DreamReplay"]
    return [c for c in trainer.calls(AUTOCAST) if not any(trainer.inside(c, helper) for helper in helpers)]


def _named(edits: Edits, node: cst.BaseExpression, name: str) -> str:
    """A name for the value of `node` where the step computes it: its own if it is one, else `(name := node)`."""
    if isinstance(node, cst.Name):
        return node.value
    edits.sub(
        node, lambda edited: cst.NamedExpr(cst.Name(name), edited, lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
    )
    return name


@register("self_model_head", "forge")
def self_model_head(source: str) -> str:
    """An auxiliary head that predicts the model's own per-example loss, trained with the model (training only)."""
    trainer = analyse(source)
    if trainer.has(r"SelfModel"):
        raise NotApplicable("the trainer already has a self-model head")
    edits, head = Edits(trainer), free_name(trainer, "self_model")
    edits.thread(head, "the self-model head", trainer.state_site())
    refuse_lbfgs(trainer, "it takes one parameter group, and the head's parameters would be a second")
    scheduler = trainer.scheduler_before_state()
    if scheduler is not None:
        # the schedule counted the optimizer's groups when built: a group added later crashes its step (OneCycleLR's
        # KeyError 'initial_lr', LambdaLR's zip), and the head cannot be built in __init__ beside the optimizer
        raise NotApplicable(
            f"the learning-rate schedule `{call_name(scheduler)}(...)` is built before the epoch loop, where the "
            "head's parameter group would be added: the schedule would not cover it and fails at its first step"
        )
    classifier_layers = [layer for layer in trainer.layers() if layer.kind == "linear"]
    if not classifier_layers:
        raise NotApplicable(trainer.imported_model() or "the model has no nn.Linear classifier to read features from")
    model, optimizer, loss = trainer.model_name(), trainer.optimizer_name(), trainer.loss_name()
    refuse_built_apart(trainer, "the self-model head would be built in the method, apart from the training step")
    targets = code(positional(trainer.loss_call())[1].value)
    loss_line = trainer.statement_of(trainer.loss_call())
    edits.knob("SELF_MODEL_WEIGHT", 0.1, "weight of the self-model's loss-prediction loss")
    edits.helper(SELF_MODEL_HELPER)
    edits.beside_optimizer(
        f"{head} = SelfModel({model})",
        f'{optimizer}.add_param_group({{"params": {head}.head.parameters()}})',
    )
    # A loss divided for accumulation (`criterion(out, y) / ACCUM`, the step once per ACCUM backward passes) gets its
    # auxiliary term divided alike: added whole, it weighed ACCUM times SELF_MODEL_WEIGHT (user trial)
    # (only there: `F.cross_entropy(..., reduction="sum") / len(y)` is a mean, and its term is the mean's already)
    value = assign_value(loss_line)
    divided = (
        f" / {code(value.right)}"
        if isinstance(value, cst.BinaryOperation)
        and isinstance(value.operator, cst.Divide)
        and _once_per_step(trainer) is not None
        else ""
    )
    edits.insert_after(loss_line, f"{loss} = {loss} + SELF_MODEL_WEIGHT * {head}.aux_loss({targets}){divided}")
    return edits.apply()
