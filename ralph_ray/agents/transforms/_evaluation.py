"""Where a trainer uses its model once training begins: what a transform that changes evaluation (`ema_weights`,
`flip_tta`) must rewrite, all of it, or refuse.

Every reference to the trained model (libcst's scopes: the binding the epoch loop's function trains, read there from
the epoch loop on, or from any closure or lambda of that function) outside the batch loop is placed: an evaluation or
prediction (a forward pass under torch.no_grad(), an evaluation function it is handed to, its export), a `.eval()`,
a best state saved and restored after training, or a use that leaves predictions alone (`.train()`, its parameters,
a checkpoint, the harness's probes, a call that also gets the optimizer). Any other use raises NotApplicable naming
it: a transform that evaluates with something else could not tell it had rewritten every prediction.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

import libcst as cst
import libcst.matchers as m
from libcst.metadata import MetadataWrapper, Scope, ScopeProvider

from ralph_ray.agents.transforms._tree import (
    EVAL_CALL,
    NO_GRAD,
    NotApplicable,
    Trainer,
    call_name,
    called_only_without_grad,
    code,
    dotted,
    evaluator_functions,
    first_parameter,
    single_expr_call,
    under_no_grad,
)

# Methods of the model that leave its predictions alone (training mode, reading the weights for norms and probes).
HARMLESS_METHODS = frozenset({"train", "parameters", "named_parameters"})
# The harness reads the weights (probes) or saves what training needs to resume (a checkpoint); a print: no prediction.
HARMLESS_CALLS = frozenset({"harness.probes", "harness.save_checkpoint", "print"})


@dataclass
class ModelUses:
    """The places a trainer evaluates or predicts with its model, and the best state it keeps, once training
    begins (`model_uses` found them all)."""

    model: str
    forwards: list[cst.Call] = field(default_factory=list)  # model(x) under torch.no_grad()
    handed: list[cst.Arg] = field(default_factory=list)  # evaluate(model, ...), logits_tta(model, x)
    exports: list[cst.Arg] = field(default_factory=list)  # harness.save_model(model, ...): what the engine scores
    evals: list[cst.SimpleStatementLine] = field(default_factory=list)  # `model.eval()` lines
    saves: list[cst.Call] = field(default_factory=list)  # model.state_dict() of a best state restored after training
    restores: list[cst.Call] = field(default_factory=list)  # model.load_state_dict(best) after the epoch loop

    def evaluated(self) -> bool:
        """Whether the trainer evaluates or predicts with the model at all."""
        return bool(self.forwards or self.handed or self.exports)


def evaluates(name: str, evaluators: set[str]) -> bool:
    """Whether a call by this name evaluates the model it is handed: evaluate(model, ...), predict(...), a
    function of the trainer that runs the model it is given under no_grad (`logits_tta`), flip_tta's helper."""
    return bool(EVAL_CALL.search(name.rsplit(".", 1)[-1])) or name in evaluators or name == "flip_averaged"


def model_uses(trainer: Trainer, weights: bool = True) -> ModelUses:
    """Every use of the trained model from the epoch loop on, outside the batch loop, placed; NotApplicable naming
    the first use that is none of evaluation, prediction, a best state or harmless. `weights`: whether the transform
    predicts with other weights (ema_weights: a state saved and restored must be a best state it can move along;
    flip_tta runs the model's own weights, so where they come from is no concern of it)."""
    model, batch = trainer.model_name(), trainer.batch_loop()
    try:
        epoch: cst.For = trainer.epoch_loop()
    except NotApplicable:
        if weights:
            raise
        # flip_tta is test-time only: where no loop runs the batch loop per epoch, training begins at the batch loop
        epoch = batch
    home = next((a for a in trainer.ancestors(epoch) if isinstance(a, cst.FunctionDef)), trainer.module)
    uses, evaluators = ModelUses(model), evaluator_functions(trainer)
    for ref in _references(trainer, model, epoch, home):
        if trainer.inside(ref, batch):
            continue  # training's own forward pass and step
        closure = _closure(trainer, ref, home)
        if closure is None and trainer.order(ref) < trainer.order(epoch):
            continue  # building, resuming, warming up: before training begins
        _place(trainer, ref, uses, evaluators, epoch, batch)
        if closure is not None:
            _not_called_in_training(trainer, closure, batch)
    if weights:
        _pair_best_state(trainer, uses, epoch)
    return uses


@functools.lru_cache(maxsize=32)
def _scopes(part: cst.Module | cst.FunctionDef) -> Mapping[cst.CSTNode, Scope | None]:
    """Each node's scope in one part of a trainer's tree (which binding a name reads, through closures), on the tree's
    own nodes. A function alone is analysed as a module of its own: libcst's scopes cost ~0.2 s for a whole seed."""
    module = part if isinstance(part, cst.Module) else cst.Module(body=[part])
    return MetadataWrapper(module, unsafe_skip_copy=True).resolve(ScopeProvider)


def _references(
    trainer: Trainer, model: str, epoch: cst.For, home: cst.Module | cst.FunctionDef
) -> Iterator[cst.CSTNode]:
    """The expressions that read the model the epoch loop trains (`net`, or `self.net` for a dotted model), in its
    function and in every closure that does not bind the name itself."""
    root, depth = model.split(".")[0], model.count(".")
    assignments = _scopes(home)[epoch][root]  # type: ignore[index]
    if not assignments:  # a module-level model that main() trains: its readers are anywhere in the module
        assignments = _scopes(trainer.module)[epoch][root]  # type: ignore[index]
    for assignment in assignments:
        node = getattr(assignment, "node", None)
        if isinstance(node, cst.Param) and isinstance(home, cst.FunctionDef):
            _no_caller_keeps(trainer, home, root)
        if isinstance(node, cst.CSTNode) and id(node) in trainer.spans and trainer.order(node) > trainer.order(epoch):
            raise NotApplicable(f"the trainer binds `{root}` again once training begins: `{_line(trainer, node)}`")
        for access in assignment.references:
            ref: cst.CSTNode | None = access.node
            for _ in range(depth):  # `self` -> `self.net`
                ref = trainer.parent(ref) if ref is not None else None
            if ref is not None and dotted(ref) == model:
                yield ref


def _no_caller_keeps(trainer: Trainer, home: cst.FunctionDef, root: str) -> None:
    """The model comes into `home` as its parameter `root`: refuse unless every call of `home` in the trainer hands
    it a model it never reads again (`run(nn.Sequential(...), x, y)`). Else the caller may evaluate, predict or keep
    the weights out of sight (review: an average restored into fit()'s local was lost on return, and main() predicted
    with the raw model)."""
    refuse = f"the model comes into `{home.name.value}()` as its parameter `{root}`: its caller's uses of it "
    refuse += "cannot be placed"
    if trainer._is_method(home) and root == first_parameter(home):  # an HF-style Trainer's `self.model`
        refuse = (
            f"the model is kept on the instance `{root}` that method `{home.name.value}()` trains: its uses in the "
            "class's other methods and by the instance's callers (evaluate(), predict() on the trainer) are not "
            "followed"
        )
    names = [p.name.value for p in home.params.params]
    calls = m.findall(trainer.module, m.Call(func=m.Name(home.name.value)))
    if root not in names or root == "self" or not calls:
        raise NotApplicable(refuse)  # a method (`self.net`), a keyword-only model, or a caller elsewhere
    for call in calls:
        given = [a for a in call.args if a.keyword is None][names.index(root) : names.index(root) + 1] or [
            a for a in call.args if a.keyword is not None and a.keyword.value == root
        ]
        if not given or isinstance(given[0].value, (cst.Attribute, cst.Subscript)):
            raise NotApplicable(refuse)
        if isinstance(given[0].value, cst.Name):
            bindings = _scopes(trainer.module)[call][given[0].value.value]  # type: ignore[index]
            later = [
                access.node
                for binding in bindings
                for access in binding.references
                if id(access.node) in trainer.spans and trainer.order(access.node) > trainer.order(call)
            ]
            if later:
                raise NotApplicable(f"{refuse} (`{_line(trainer, later[0])}`)")


def _closure(trainer: Trainer, ref: cst.CSTNode, home: cst.CSTNode) -> cst.FunctionDef | cst.Lambda | None:
    """The outermost function or lambda that holds `ref` other than `home` (None: `ref` is in `home`'s own code)."""
    found = None
    for ancestor in trainer.ancestors(ref):
        if ancestor is home:
            return found
        if isinstance(ancestor, (cst.FunctionDef, cst.Lambda)):
            found = ancestor
    return found  # a module-level function that reads a global model the loop in main() trains


def _place(
    trainer: Trainer, ref: cst.CSTNode, uses: ModelUses, evaluators: set[str], epoch: cst.For, batch: cst.For
) -> None:
    """File one reference to the model under its use, or refuse naming it."""
    parent, model = trainer.parent(ref), uses.model
    if isinstance(parent, cst.Attribute) and parent.value is ref:
        call = trainer.parent(parent)
        method = parent.attr.value if isinstance(call, cst.Call) and call.func is parent else None
        if method in HARMLESS_METHODS:
            return
        if method == "eval" and isinstance(call, cst.Call) and single_expr_call(trainer.statement_of(call)) is call:
            uses.evals.append(trainer.statement_of(call))  # type: ignore[arg-type]
            return
        if method == "state_dict" and isinstance(call, cst.Call):
            # a checkpoint resumes training; a loop over its tensors edits the raw weights in place (the CIFAR
            # seed's final lookahead copy), which predictions with another model do not read
            if not (_in_call(trainer, call, HARMLESS_CALLS) or _iterated(trainer, call)):
                uses.saves.append(call)
            return
        if method == "load_state_dict" and isinstance(call, cst.Call):
            uses.restores.append(call)
            return
        if _configures_training(trainer, ref, epoch, batch):
            return
    elif isinstance(parent, cst.Call) and parent.func is ref:
        if under_no_grad(trainer, parent) or _in_function_without_grad(trainer, parent):
            uses.forwards.append(parent)
            return
        raise NotApplicable(
            f"`{model}(...)` runs outside the batch loop without torch.no_grad() (neither clearly training nor "
            f"evaluation): `{_line(trainer, parent)}`"
        )
    elif isinstance(parent, cst.Arg) and parent.value is ref:
        call = trainer.parent(parent)
        name = call_name(call) or ""
        if name == "harness.save_model":
            uses.exports.append(parent)
            return
        if _trains(trainer, call):
            # the model a training call (`run_epoch(model, loader, opt)`) gets is the one it trains, never swapped;
            # one that also evaluates it (`.eval()`, then a forward) would keep those evaluations on the raw weights
            if evaluates(name, evaluators):
                raise NotApplicable(
                    f"`{name}()` trains `{model}` and also evaluates it: its evaluations would stay on the raw "
                    f"weights: `{_line(trainer, ref)}`"
                )
            return
        if evaluates(name, evaluators):
            uses.handed.append(parent)
            return
        if name in HARMLESS_CALLS or _reads_weights_only(trainer, name, call, parent):
            return
    raise NotApplicable(
        f"a use of `{model}` once training begins that is neither evaluation, a prediction, nor a best state saved "
        f"and restored after training: `{_line(trainer, ref)}`"
    )


def _pair_best_state(trainer: Trainer, uses: ModelUses, epoch: cst.For) -> None:
    """Each `model.load_state_dict(best)` after the epoch loop must load a name a `model.state_dict()` line binds (the
    best state early stopping kept), and each such save must be restored: the pair then moves to the evaluated model."""
    restored: set[str] = set()
    for call in uses.restores:
        args = call.args
        if trainer.inside(call, epoch) or len(args) != 1 or not isinstance(args[0].value, cst.Name):
            raise NotApplicable(
                f"`{uses.model}` loads weights during training or from elsewhere than a best state kept in training: "
                f"`{_line(trainer, call)}`"
            )
        restored.add(args[0].value.value)
    saved: set[str] = set()
    for call in uses.saves:
        bound = _bound(trainer.statement_of(call))
        if not bound & restored:
            raise NotApplicable(
                f"the weights of `{uses.model}` are kept but not restored after training (an export, or a state "
                f"for something else): `{_line(trainer, call)}`"
            )
        saved |= bound
    if restored - saved:
        raise NotApplicable(
            f"`{uses.model}` is restored from {', '.join(sorted(restored - saved))}, which no "
            f"`{uses.model}.state_dict()` line binds"
        )


def _not_called_in_training(trainer: Trainer, closure: cst.FunctionDef | cst.Lambda, batch: cst.For) -> None:
    """A closure that runs the model and is called in the batch loop makes training's targets, not predictions."""
    if isinstance(closure, cst.FunctionDef):
        name: str | None = closure.name.value
    else:
        statement = trainer.statement_of(closure)
        value = statement.body[0] if isinstance(statement, cst.SimpleStatementLine) else None
        name = dotted(value.targets[0].target) if isinstance(value, cst.Assign) and value.value is closure else None
    if name is not None and any(call_name(c) == name for c in trainer.calls(within=batch)):
        raise NotApplicable(f"`{name}` runs the model and is called in the batch loop (training, not evaluation)")


def _in_function_without_grad(trainer: Trainer, node: cst.CSTNode) -> bool:
    """Whether a node runs in a function under @torch.no_grad() or one only ever called inside `with
    torch.no_grad()` outside the batch loop (a `predict()` closure its caller guards)."""
    guarded = called_only_without_grad(trainer)
    for function in (a for a in trainer.ancestors(node) if isinstance(a, cst.FunctionDef)):
        if function.name.value in guarded or any(
            NO_GRAD.match(call_name(d.decorator) or dotted(d.decorator) or "") for d in function.decorators
        ):
            return True
    return False


def _in_call(trainer: Trainer, node: cst.CSTNode, names: frozenset[str]) -> bool:
    """Whether a node lies in the arguments of a call by one of these names (before its statement ends)."""
    for ancestor in trainer.ancestors(node):
        if isinstance(ancestor, cst.BaseStatement):
            return False
        if isinstance(ancestor, cst.Call) and call_name(ancestor) in names:
            return True
    return False


def _iterated(trainer: Trainer, node: cst.CSTNode) -> bool:
    """Whether a node lies in what a `for` statement iterates over."""
    return any(isinstance(a, cst.For) and trainer.inside(node, a.iter) for a in trainer.ancestors(node))


def _configures_training(trainer: Trainer, ref: cst.CSTNode, epoch: cst.For, batch: cst.For) -> bool:
    """An attribute of the model set in the epoch loop before its batches (`model.whiten.bias.requires_grad = ...`)."""
    target = any(isinstance(a, cst.AssignTarget) for a in trainer.ancestors(ref))
    return target and trainer.inside(ref, epoch) and trainer.order(ref) < trainer.order(batch)


def _trains(trainer: Trainer, call: cst.Call) -> bool:
    """A call that is also handed the optimizer trains the model (hard_example_replay's `dream(model, optimizer)`), as
    does the call of the function that runs the batch loop (`train_one_epoch(model, loader)`, its optimizer global)."""
    optimizer = trainer.stepped_name()
    if any(dotted(arg.value) == optimizer for arg in call.args):
        return True
    try:
        function = trainer.batch_in_call()
    except NotApplicable:
        return False
    return function is not None and any(c is call for c in trainer.calls_of(function))


def _reads_weights_only(trainer: Trainer, name: str, call: cst.Call, arg: cst.Arg) -> bool:
    """Whether a function of the trainer only reads the parameters of the model it is handed (`grad_norm(model)`)."""
    function = next(iter(trainer.defined(name, top_level=True)), None)
    if function is None or arg.star:
        return False
    params = function.params.params
    if arg.keyword is not None:
        param = next((p for p in params if p.name.value == arg.keyword.value), None)
    else:
        index = [a for a in call.args if a.keyword is None].index(arg)
        param = params[index] if index < len(params) else None
    if param is None:
        return False
    for assignment in _scopes(function)[param][param.name.value]:  # type: ignore[index]
        for access in assignment.references:
            parent = trainer.parent(access.node)
            method = trainer.parent(parent) if isinstance(parent, cst.Attribute) else None
            reads = isinstance(parent, cst.Attribute) and parent.attr.value in ("parameters", "named_parameters")
            if not (reads and isinstance(method, cst.Call) and method.func is parent):
                return False
    return True


def _bound(statement: cst.CSTNode) -> set[str]:
    """The plain names an assignment line binds (`best_loss, best_state, bad = ...` binds all three)."""
    if not isinstance(statement, cst.SimpleStatementLine):
        return set()
    names = set()
    for small in statement.body:
        targets = [t.target for t in small.targets] if isinstance(small, cst.Assign) else []
        if isinstance(small, cst.AnnAssign):
            targets = [small.target]
        for target in targets:
            elements = [e.value for e in target.elements] if isinstance(target, (cst.Tuple, cst.List)) else [target]
            names |= {e.value for e in elements if isinstance(e, cst.Name)}
    return names


def _line(trainer: Trainer, node: cst.CSTNode) -> str:
    """The first line of the statement that holds a node, for a refusal's message."""
    statement = trainer.statement_of(node)
    text = code(statement.with_changes(leading_lines=[])).strip().splitlines()[0]
    return text if len(text) <= 100 else text[:97] + "..."
