"""What a transform needs to know about a trainer: its idioms located in the libcst tree, and a batch of edits.

`Trainer` finds, once per source, the places PyTorch trainers are written around however they are spelled:
the optimizer (`torch.optim.<Any>(...)` bound to some name), its `.step()` (by the name the step's own function
binds it to: `opt, sched = model.configure_optimizers()` in a Lightning-style `fit()`; or a GradScaler's
`scaler.step(opt)`), the `.backward()` of the loss (`scaler.scale(loss).backward()` too),
the batch loop (the loop around the step) and the epoch loop around it (or around a call of the function that
holds it), the model (whose `.parameters()` the optimizer gets), the loss call (`F.cross_entropy(...)`, a
`nn.CrossEntropyLoss()` criterion; any torch loss where only its reduction matters), the forward call, the layers
(`nn.Conv2d`/`nn.Linear` in `__init__`, inside `nn.Sequential(...)`, added to a list handed to
`nn.Sequential(*layers)`, or to an `nn.ModuleList` attribute whose elements the model calls) and the knobs.
Each lookup raises `NotApplicable` naming what it did not find. `Edits` collects replacements and statement
insertions keyed by the original nodes and applies them in one pass, keeping comments and layout.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import libcst as cst
import libcst.matchers as m

from ralph_ray.knobs import is_knob, parse, read_knobs


class NotApplicable(Exception):
    """An intervention cannot apply to this trainer; the message says which idiom is missing or already there."""


class Found(Exception):
    """Raised by `Edits.apply` in a dry run: the transform found every idiom it needs (nothing is rendered)."""


_DRY_RUN = contextvars.ContextVar("transforms_dry_run", default=False)
# The class that is the model where the source is the module train.py imports it from (`from models import Net`):
# its layers, and those of the classes it builds, are the model's (see `model_module`). None: the source is train.py.
_MODEL_CLASS: contextvars.ContextVar[str | None] = contextvars.ContextVar("transforms_model_class", default=None)
# The source of the module train.py imports its model's class from, while a transform edits train.py: what a rule
# about the model's contents reads besides train.py (`Trainer.model_has`; Grokfast refuses a BatchNorm model).
_MODEL_SOURCE: contextvars.ContextVar[str | None] = contextvars.ContextVar("transforms_model_source", default=None)


@contextlib.contextmanager
def _set(var: contextvars.ContextVar[Any], value: Any) -> Iterator[None]:
    """`var` is `value` within the block (the transforms' settings: one mechanism for all three)."""
    token = var.set(value)
    try:
        yield
    finally:
        var.reset(token)


def dry_run() -> contextlib.AbstractContextManager[None]:
    """Within this block transforms only check that they apply: rendering the edited tree is the slow part."""
    return _set(_DRY_RUN, True)


def model_module(name: str) -> contextlib.AbstractContextManager[None]:
    """Within this block transforms edit a module train.py imports its model from, whose class `name` is the model."""
    return _set(_MODEL_CLASS, name)


def model_source(source: str | None) -> contextlib.AbstractContextManager[None]:
    """Within this block `Trainer.model_has` also reads `source`, the module train.py imports its model from."""
    return _set(_MODEL_SOURCE, source)


def analyse(source: str) -> Trainer:
    """The analysed trainer for a source, shared by the transforms (they only read it; edits are kept apart)."""
    return _analysed(source, _MODEL_CLASS.get())


@functools.lru_cache(maxsize=16)
def _analysed(source: str, model: str | None) -> Trainer:
    return Trainer(source, model)


OPTIMIZER = re.compile(r"^(torch\.)?optim\.[A-Z]\w*$")
# (edge_of_chaos_loss is the curriculum's weighted cross-entropy: later transforms treat it as the loss)
CROSS_ENTROPY_FN = re.compile(r"^(((torch\.)?(nn\.)?functional\.|F\.)?cross_entropy|edge_of_chaos_loss)$")
CROSS_ENTROPY_CLS = re.compile(r"^((torch\.)?nn\.)?CrossEntropyLoss$")
# Any loss whose `reduction=` says how it reduces ("mean" unless given): torch.nn.functional's losses (`F.mse_loss`,
# `F.huber_loss`, `F.binary_cross_entropy_with_logits`...) and `nn.<Name>Loss` criteria (MSELoss, HuberLoss...)
LOSS_FN = re.compile(
    rf"{CROSS_ENTROPY_FN.pattern}|^((torch\.)?(nn\.)?functional\.|F\.)(\w+_loss|binary_cross_entropy\w*|kl_div)$"
)
LOSS_CLS = re.compile(r"^((torch\.)?nn\.)?[A-Z]\w*Loss$")
CONV = re.compile(r"^((torch\.)?nn\.)?Conv2d$")
LINEAR = re.compile(r"^((torch\.)?nn\.)?Linear$")
SEQUENTIAL = re.compile(r"^((torch\.)?nn\.)?Sequential$")
MODULE_LIST = re.compile(r"^((torch\.)?nn\.)?ModuleList$")
# Libraries a model's class may come from (`torchvision.models.resnet18`): their code is not the trainer's to edit
MODEL_LIBRARIES = ("torch", "torchvision", "timm")
# Methods that return the module they are called on, moved or cast (`Net(...).to(device)`)
MOVES = frozenset({"to", "cuda", "float", "double", "half", "bfloat16", "train"})
# Mixed precision's loss scaler, however imported (`torch.amp.GradScaler`, `torch.cuda.amp.GradScaler`, `GradScaler`)
GRAD_SCALER = re.compile(r"^((torch\.)?(cuda\.|cpu\.)?amp\.(grad_scaler\.)?)?GradScaler$")
NO_GRAD = re.compile(r"^torch\.(no_grad|inference_mode)$")
# A learning-rate schedule built on the optimizer: `torch.optim.lr_scheduler.OneCycleLR`, a class imported by name
# (`LambdaLR`, `ReduceLROnPlateau`), transformers' `get_linear_schedule_with_warmup` / `get_scheduler`
LR_SCHEDULER = re.compile(r"^(.*\.)?(lr_scheduler\.\w+|get_\w*schedul\w*|\w+LR|\w+LROnPlateau)$")
# Module-level helpers the transforms add (their layers and calls are not the trainer's own).
HELPERS = frozenset(
    {
        "SelfModel",
        "DreamReplay",
        "gradfilter_ema",
        "edge_of_chaos_loss",
        "edge_of_chaos_weight",
        "shift_images",
        "flip_images",
    }
)
# Call names that mean "evaluate or predict with this model" (its argument becomes the EMA model).
EVAL_CALL = re.compile(r"eval|predict|infer|accuracy|score|test", re.IGNORECASE)


def dotted(node: cst.CSTNode) -> str | None:
    """`torch.optim.SGD` for the expression torch.optim.SGD; None for anything that is not a dotted name."""
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        base = dotted(node.value)
        return None if base is None else f"{base}.{node.attr.value}"
    return None


def call_name(node: cst.CSTNode) -> str | None:
    """The dotted name a call calls, or None."""
    return dotted(node.func) if isinstance(node, cst.Call) else None


def code(node: cst.CSTNode) -> str:
    """The source text of one node."""
    return cst.Module([]).code_for_node(node)


def statement(text: str) -> cst.BaseStatement:
    """One statement parsed from text (indentation comes from where it is inserted)."""
    return cst.parse_statement(text if text.endswith("\n") else text + "\n")


def expression(text: str) -> cst.BaseExpression:
    """One expression parsed from text."""
    return cst.parse_expression(text)


def single_expr_call(stmt: cst.CSTNode) -> cst.Call | None:
    """The call of a statement line that is just `something(...)`."""
    if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 and isinstance(stmt.body[0], cst.Expr):
        value = stmt.body[0].value
        return value if isinstance(value, cst.Call) else None
    return None


def assign_target(stmt: cst.CSTNode) -> str | None:
    """The name a statement line `name = ...` binds (one plain target), else None."""
    if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1:
        small = stmt.body[0]
        if isinstance(small, cst.Assign) and len(small.targets) == 1:
            return dotted(small.targets[0].target)
        if isinstance(small, cst.AnnAssign) and small.value is not None:
            return dotted(small.target)
    return None


def assign_value(stmt: cst.CSTNode) -> cst.BaseExpression | None:
    """The value of a statement line `name = value`."""
    if (
        isinstance(stmt, cst.SimpleStatementLine)
        and len(stmt.body) == 1
        and isinstance(stmt.body[0], (cst.Assign, cst.AnnAssign))
    ):
        return stmt.body[0].value
    return None


def kwarg(call: cst.Call, name: str) -> cst.Arg | None:
    """The keyword argument `name=` of a call."""
    return next((a for a in call.args if a.keyword is not None and a.keyword.value == name), None)


def positional(call: cst.Call) -> list[cst.Arg]:
    """The positional arguments of a call."""
    return [a for a in call.args if a.keyword is None and not a.star]


def with_kwarg(call: cst.Call, name: str, value: str) -> cst.Call:
    """The call with `name=value` added (or replaced), formatted like the call's other arguments."""
    new = cst.Arg(
        keyword=cst.Name(name),
        value=expression(value),
        equal=cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace("")),
    )
    args = [a for a in call.args if not (a.keyword is not None and a.keyword.value == name)]
    if args:
        last = args[-1]
        if last.comma is cst.MaybeSentinel.DEFAULT or isinstance(last.comma, cst.MaybeSentinel):
            args[-1] = last.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
    return call.with_changes(args=[*args, new])


@dataclass
class Listed:
    """How a layer joins a list that is then handed to `nn.Sequential(*layers)`, or an `nn.ModuleList` attribute."""

    name: str  # the list (`layers`, `self.layers` for a ModuleList)
    adds: cst.BaseSmallStatement  # `layers.append(<layer>)`, `layers += [...]`, `.extend([...])`, `layers = [...]`
    display: cst.List | None  # the list display `[...]` the layer is an element of (None: `layers.append(<layer>)`)
    repeated: bool  # added in a loop that runs after the list is made: one line builds a layer per pass
    # an nn.ModuleList whose elements the model calls one by one (`for layer in self.layers: x = act(layer(x))`): a
    # module beside the layer goes in the same element, `nn.Sequential(layer, module)`, so the forward is unchanged
    # (a norm appended as an element of its own would get the activation the forward applies after each element)
    module_list: bool = False


@dataclass
class Layer:
    """One nn.Conv2d / nn.Linear construction: where it is built and how the model reaches it."""

    call: cst.Call
    kind: str  # conv | linear
    attribute: str | None  # `self.<attribute> = nn.Linear(...)` in a module's __init__, else None
    sequential: cst.Call | None  # the nn.Sequential(...) call it is an element of, else None
    listed: Listed | None = None  # how it joins a list handed to nn.Sequential(*list) or an nn.ModuleList, else None
    unfollowed: str | None = None  # why a layer of an nn.ModuleList is not placed: how the model uses the list

    @property
    def placed(self) -> bool:
        """Whether transforms can place a module beside it (where the model is assembled)."""
        return bool(self.attribute or self.sequential or self.listed)


@dataclass(frozen=True)
class Stepped:
    """The optimizer as a `.step()` line's function names it."""

    name: str  # the name stepped there (`opt`)
    owner: str | None = (
        None  # the object whose method built and returned it (`model` of `model.configure_optimizers()`)
    )
    # the line that binds it there from the builder's return (`opt, sched = model.configure_optimizers()`, or
    # `opt = make_optimizer(model)` of a module-level function: no owner)
    bound: cst.Assign | None = None
    # the loss scaler that steps it (`scaler` of `scaler.step(opt)`, the mixed-precision idiom); None: `opt.step()`
    scaler: str | None = None


class Trainer:
    """A trainer's source and the idioms found in it (each lookup raises NotApplicable when absent)."""

    def __init__(self, source: str, model: str | None = None) -> None:
        try:
            self.module = cst.parse_module(source)
        except cst.ParserSyntaxError as error:
            raise NotApplicable(f"the trainer does not parse: {error.message}") from error
        self.source = source
        self.model_class = model  # the model's class where the source is the module it is imported from
        self.parents: dict[int, cst.CSTNode] = {}
        self.nodes: list[cst.CSTNode] = []  # in source order (pre-order)
        self.spans: dict[int, tuple[int, int]] = {}  # node -> [first, last) positions of its subtree in `nodes`
        self.module.visit(_Indexer(self.parents, self.nodes, self.spans))
        # The lookups filter these two lists many times per transform: built once, without the helpers earlier
        # transforms added (DreamReplay's own `optimizer.step()` is not the training step).
        helpers = [
            self.spans[id(n)]
            for n in self.module.body
            if isinstance(n, (cst.ClassDef, cst.FunctionDef)) and n.name.value in HELPERS
        ]
        own = [n for n in self.nodes if not any(first <= self.spans[id(n)][0] < last for first, last in helpers)]
        self.call_nodes = [(n, call_name(n) or "") for n in own if isinstance(n, cst.Call)]
        self.lines = [n for n in own if isinstance(n, cst.SimpleStatementLine)]

    # -- generic tree queries --------------------------------------------------------

    def order(self, node: cst.CSTNode) -> int:
        """The node's position in source order."""
        return self.spans[id(node)][0]

    def within(self, container: cst.CSTNode) -> list[cst.CSTNode]:
        """The nodes of `container`'s subtree (itself first), in source order."""
        first, last = self.spans[id(container)]
        return self.nodes[first:last]

    def parent(self, node: cst.CSTNode) -> cst.CSTNode | None:
        """The node's parent in the tree."""
        return self.parents.get(id(node))

    def ancestors(self, node: cst.CSTNode) -> Iterator[cst.CSTNode]:
        """Parents up to the module, nearest first."""
        current = self.parent(node)
        while current is not None:
            yield current
            current = self.parent(current)

    def inside(self, node: cst.CSTNode, container: cst.CSTNode) -> bool:
        """Whether `node` lies within `container`."""
        first, last = self.spans[id(container)]
        return first <= self.spans[id(node)][0] < last

    def statement_of(self, node: cst.CSTNode) -> cst.BaseStatement:
        """The statement (a line or a compound statement) that holds `node`."""
        for current in (node, *self.ancestors(node)):
            if isinstance(current, (cst.SimpleStatementLine, cst.BaseCompoundStatement)):
                return current
        raise NotApplicable("internal: a node outside any statement")

    def top_statement(self, node: cst.CSTNode) -> cst.BaseStatement:
        """The module-level statement that holds `node` (where a helper function goes before)."""
        top = node
        for current in self.ancestors(node):
            if isinstance(current, cst.Module):
                return top  # type: ignore[return-value]
            top = current
        return top  # type: ignore[return-value]

    def calls(self, pattern: re.Pattern[str] | None = None, within: cst.CSTNode | None = None) -> list[cst.Call]:
        """Calls in source order whose dotted name matches `pattern`, optionally within one node."""
        found = [n for n, name in self.call_nodes if pattern is None or pattern.match(name)]
        return found if within is None else [n for n in found if self.inside(n, within)]

    def statements(self, within: cst.CSTNode) -> list[cst.SimpleStatementLine]:
        """Statement lines within a node, in source order."""
        return [n for n in self.lines if self.inside(n, within)]

    def has(self, pattern: str) -> bool:
        """Whether the source text matches a regex (for "already applied" checks)."""
        return re.search(pattern, self.source, re.MULTILINE) is not None

    def model_has(self, pattern: str) -> bool:
        """Whether the source, or the module its model is imported from (`model_source`), matches a regex."""
        imported = _MODEL_SOURCE.get()
        return self.has(pattern) or (imported is not None and re.search(pattern, imported, re.MULTILINE) is not None)

    def defined(self, name: str, top_level: bool = False) -> list[cst.FunctionDef]:
        """The functions and methods named `name` the trainer defines (only module-level functions if `top_level`)."""
        nodes = self.module.body if top_level else self.nodes
        return [n for n in nodes if isinstance(n, cst.FunctionDef) and n.name.value == name]

    # -- the optimisation step ------------------------------------------------------------

    def optimizer_call(self) -> cst.Call:
        """The `torch.optim.<Optimizer>(...)` construction."""
        calls = self.calls(OPTIMIZER)
        if not calls:
            raise NotApplicable("no `torch.optim.<Optimizer>(...)` construction found")
        return calls[0]

    def optimizer_name(self) -> str:
        """The name the optimizer is bound to (`optimizer`, `opt`, ...)."""
        stmt = self.statement_of(self.optimizer_call())
        name = assign_target(stmt)
        if name is None or assign_value(stmt) is not self.optimizer_call():
            raise NotApplicable("the optimizer is not bound to a name (`opt = torch.optim.X(...)`)")
        return name

    def optimizer_statement(self) -> cst.SimpleStatementLine:
        """The line that builds the optimizer."""
        self.optimizer_name()
        return self.statement_of(self.optimizer_call())  # type: ignore[return-value]

    def step_statements(self) -> list[cst.SimpleStatementLine]:
        """The `<optimizer>.step()` lines: each names the optimizer as its own function binds it (see `stepped_as`),
        not merely by the name it was built under (a `fit()` may step `opt`, or an `optimizer` of its own)."""
        name = self.optimizer_name()
        if not hasattr(self, "_steps"):
            steps = [s for s in self.lines if _stepped_name(s) is not None]
            found = [s for s in steps if self.stepped_as(s) is not None]
            self._steps = found or NotApplicable(self._no_step_reason(name, steps))
        if isinstance(self._steps, NotApplicable):
            raise NotApplicable(str(self._steps))
        return self._steps  # type: ignore[return-value]

    def stepped_as(self, line: cst.SimpleStatementLine) -> Stepped | None:
        """How a `<name>.step()` line reaches the optimizer built by `optimizer_call`, resolved in the line's own
        function: the builder's name in the builder's function or at module level, the same name handed in as a
        parameter (`train_one_epoch(model, loader, optimizer)`), `self.opt` in another method of the class, or a
        name bound there from a call of the method that builds and returns it (`opt, sched =
        model.configure_optimizers()`); a scaler's `scaler.step(opt)` (mixed precision's GradScaler) whose argument
        reaches it so; None for any other `.step()`."""
        name = _stepped_name(line)
        if name is None:
            return None
        found = self._stepped_by(line, name)
        scaled = _scaler_stepped(line)
        if found is None and scaled is not None:
            found = self._stepped_by(line, scaled)
            return None if found is None else dataclasses.replace(found, scaler=name)
        return found

    def _stepped_by(self, line: cst.SimpleStatementLine, name: str) -> Stepped | None:
        """How the name `name` stepped on `line` reaches the optimizer (see `stepped_as`)."""
        built, builder, function = self.optimizer_name(), self.optimizer_function(), enclosing_function(self, line)
        if name == built and (builder is None or (function is not None and self.inside(function, builder))):
            return Stepped(name, None)  # where it is built, a closure there, or a module-level optimizer
        if name == built and function is not None and name in [p.name.value for p in function.params.params]:
            return Stepped(name, None)
        root = name.split(".")[0]
        if (
            name == built
            and function is not None
            and builder is not None
            and "." in name
            and self._same_instance(function, builder, root)
        ):
            return Stepped(name, None)  # `self.opt` built in __init__, stepped in another method of the class
        if builder is None or not (self._is_method(builder) or isinstance(self.parent(builder), cst.Module)):
            return None
        for node in self.within(function if function is not None else self.module):
            if (
                not isinstance(node, cst.Assign)
                or len(node.targets) != 1
                or enclosing_function(self, node) is not function
                or not self._calls_builder(node.value, builder)
            ):
                continue
            value = cst.ensure_type(node.value, cst.Call)
            owner = dotted(value.func.value) if isinstance(value.func, cst.Attribute) else None
            if _returned_as(builder, built, node.targets[0].target) == name:
                return Stepped(name, owner, node)
        return None

    def _calls_builder(self, value: cst.BaseExpression, builder: cst.FunctionDef) -> bool:
        """Whether an assigned value calls the function that builds the optimizer: `<obj>.<method>(...)` of a method,
        `<function>(...)` of a module-level function (a factory `make_optimizer(model)`)."""
        if not isinstance(value, cst.Call):
            return False
        if self._is_method(builder):
            return (
                isinstance(value.func, cst.Attribute)
                and dotted(value.func.value) is not None
                and value.func.attr.value == builder.name.value
            )
        return isinstance(value.func, cst.Name) and value.func.value == builder.name.value

    def optimizer_function(self) -> cst.FunctionDef | None:
        """The function that builds the optimizer (None: module level)."""
        return enclosing_function(self, self.optimizer_call())

    def _binds(self, function: cst.FunctionDef, name: str) -> bool:
        """Whether a function binds `name` itself: a parameter, or a target of an assignment or a loop in its code."""
        if name in [p.name.value for p in (*function.params.params, *function.params.kwonly_params)]:
            return True
        for node in self.within(function):
            if enclosing_function(self, node) is not function:
                continue
            if isinstance(node, (cst.AssignTarget, cst.AnnAssign, cst.For, cst.AugAssign, cst.NamedExpr)):
                target: cst.CSTNode = node.target
            elif isinstance(node, cst.AsName):
                target = node.name
            else:
                continue
            if any(isinstance(n, cst.Name) and n.value == name for n in self.within(target)):
                return True
        return False

    def is_grad_scaler(self, function: cst.FunctionDef | None, name: str, depth: int = 2) -> bool:
        """Whether `name` in `function` (None: module level) is a GradScaler: bound there from
        `torch.amp.GradScaler(...)` (or `torch.cuda.amp.`), a module-level one, or a parameter that a call of the
        module-level function fills with one (`train_one_epoch(model, loader, opt, sched, scaler)`), calls `depth`
        deep."""
        for node in self.within(function if function is not None else self.module):
            if isinstance(node, (cst.Assign, cst.AnnAssign)) and enclosing_function(self, node) is function:
                value = _bound_value(node, name)
                if isinstance(value, cst.Call) and GRAD_SCALER.match(call_name(value) or ""):
                    return True
        if function is None:
            return False
        if not self._binds(function, name):
            return self.is_grad_scaler(None, name, 0)
        if depth == 0 or not isinstance(self.parent(function), cst.Module):
            return False
        for call in self.calls():
            if isinstance(call.func, cst.Name) and call.func.value == function.name.value:
                passed = _passed_as(function, call, name, False)
                if passed is not None and self.is_grad_scaler(enclosing_function(self, call), passed, depth - 1):
                    return True
        return False

    def state_site(self) -> cst.BaseStatement:
        """Where state that lives beside the optimizer is built (a weight average, a self-model head): after the
        optimizer's line, or, where an HF-style Trainer builds `self.optimizer` in `__init__` and its `train()` runs
        the epoch loop, before that loop (on the same instance: built in __init__, it was apart from the call that
        trains)."""
        builder, optimizer = self.optimizer_function(), self.optimizer_name()
        try:
            loop = self.epoch_loop()
        except NotApplicable:
            return self.optimizer_statement()
        trains = enclosing_function(self, loop)
        instance = first_parameter(builder) if builder is not None else None
        if (
            builder is not None
            and trains is not None
            and trains is not builder
            and instance is not None
            and optimizer.startswith(f"{instance}.")
            and self._same_instance(trains, builder, instance)
        ):
            return loop
        return self.optimizer_statement()

    def scheduler_before_state(self) -> cst.Call | None:
        """A learning-rate schedule built before `state_site()` where that is an HF-style Trainer's epoch loop (in the
        method that builds the optimizer, in train() before the loop, or in a method either calls there): it counted
        the optimizer's parameter groups then, and one added at the site breaks it (OneCycleLR's KeyError
        'initial_lr', LambdaLR's zip at its first step). None where the site is the optimizer's own line."""
        site = self.state_site()
        builder = self.optimizer_function()
        if site is self.optimizer_statement() or builder is None:
            return None
        trains = enclosing_function(self, site)
        assert trains is not None  # state_site() returns the loop only where train() holds it
        early = [c for c in self.calls(within=trains) if self.order(c) < self.order(site)]
        early += self.calls(within=builder)
        methods = [builder, trains]
        for function in self.defined_in_class(builder):
            if function not in methods and any(c in early for c in self.calls_of(function)):
                methods.append(function)
                early += self.calls(within=function)
        return next((c for c in early if LR_SCHEDULER.match(call_name(c) or "")), None)

    def defined_in_class(self, method: cst.FunctionDef) -> list[cst.FunctionDef]:
        """The methods defined in the body of the class that defines `method` (none where it is no method)."""
        block = self.parent(method)
        if not self._is_method(method) or not isinstance(block, cst.IndentedBlock):
            return []
        return [s for s in block.body if isinstance(s, cst.FunctionDef)]

    def _kept_as(self, builder: cst.FunctionDef | None, function: cst.FunctionDef, name: str) -> str | None:
        """`self.model` where the method `builder` keeps its `name` on the instance (`self.model = model`) and
        `function` is another method of the same class (an HF-style Trainer); else None."""
        instance = first_parameter(function)
        if builder is None or instance is None or not self._same_instance(function, builder, instance):
            return None
        for node in self.within(builder):
            if (
                isinstance(node, cst.Assign)
                and enclosing_function(self, node) is builder
                and len(node.targets) == 1
                and isinstance(node.value, cst.Name)
                and node.value.value == name
            ):
                target = dotted(node.targets[0].target)
                if target is not None and target.startswith(f"{instance}.") and target.count(".") == 1:
                    return target
        return None

    def _same_instance(self, a: cst.FunctionDef, b: cst.FunctionDef, root: str) -> bool:
        """Whether `root` is the instance parameter of two methods of one class."""
        return (
            self._is_method(a)
            and self._is_method(b)
            and self.parent(a) is self.parent(b)
            and first_parameter(a) == first_parameter(b) == root
        )

    def _is_method(self, function: cst.FunctionDef) -> bool:
        """Whether a function is a method defined in a class body (its first parameter is the instance)."""
        block = self.parent(function)
        return isinstance(block, cst.IndentedBlock) and isinstance(self.parent(block), cst.ClassDef)

    def _no_step_reason(self, name: str, steps: list[cst.SimpleStatementLine]) -> str:
        """Why no `.step()` line steps the optimizer, saying what was found instead."""
        builder = self.optimizer_function()
        if builder is not None and (self._is_method(builder) or isinstance(self.parent(builder), cst.Module)):
            for call in self.calls():
                function = enclosing_function(self, call)
                called = call_name(call) or ""
                if function is not None and (
                    called.endswith(f".{builder.name.value}")
                    if self._is_method(builder)
                    else called == builder.name.value
                ):
                    return (
                        f"the optimizer comes from `{code(call)}` in `{function.name.value}()`, and no `.step()` line "
                        f"there steps a name `{code(self.statement_of(call)).strip()}` binds to it"
                    )
        where = f" in `{builder.name.value}()`" if builder is not None else ""
        reason = f"no `{name}.step()` line found where the optimizer built{where} as `{name}` is in reach"
        if steps:
            function = enclosing_function(self, steps[0])
            shown = f"`{function.name.value}()`" if function is not None else "module level"
            reason += f" (`{_stepped_name(steps[0])}.step()` in {shown} steps something else)"
        return reason

    def step_statement(self) -> cst.SimpleStatementLine:
        """The training step's `<optimizer>.step()` line: the first inside a loop within a loop (batches within
        epochs), else the first. A warm-up's steps before training (one loop, as the CIFAR seed's) are not it."""
        steps = self.step_statements()
        for stmt in steps:
            if sum(isinstance(a, (cst.For, cst.While)) for a in self.ancestors(stmt)) >= 2:
                return stmt
        return steps[0]

    def backward_statement(self) -> cst.SimpleStatementLine:
        """The `<loss>.backward()` line of the training step."""
        batch = self.batch_loop()
        for stmt in self.statements(batch):
            call = single_expr_call(stmt)
            if call is not None and isinstance(call.func, cst.Attribute) and call.func.attr.value == "backward":
                return stmt
        raise NotApplicable("no `loss.backward()` line in the batch loop")

    def loss_name(self) -> str:
        """The name whose `.backward()` is called (`loss` of `loss.backward()`, or of a loss scaler's
        `scaler.scale(loss).backward()`)."""
        call = single_expr_call(self.backward_statement())
        assert call is not None and isinstance(call.func, cst.Attribute)
        scaled = call.func.value
        if isinstance(scaled, cst.Call) and call_name(scaled) is not None and call_name(scaled).endswith(".scale"):
            scaled = scaled.args[0].value if len(scaled.args) == 1 and scaled.args[0].keyword is None else scaled
        name = dotted(scaled)
        if name is None:
            raise NotApplicable("the backward call is not on a named loss (`loss.backward()`)")
        return name

    def batch_loop(self) -> cst.For:
        """The loop around the optimizer step."""
        step = self.step_statement()
        loop = next((a for a in self.ancestors(step) if isinstance(a, (cst.For, cst.While))), None)
        if not isinstance(loop, cst.For):
            raise NotApplicable("the optimizer step is not inside a `for` loop over batches")
        return loop

    def epoch_loop(self) -> cst.For:
        """The loop that runs the batch loop once per pass: around it, or around a call of the module-level function
        that holds it (`for epoch in range(E): train_one_epoch(...)` in main()), or of the method of the same class
        (`self.train_epoch()` in a Trainer's train()), one or two calls deep."""
        return self._epoch_and_site()[0]

    def batch_site(self) -> cst.CSTNode:
        """What stands for the batch loop in the epoch loop's body: the batch loop itself, or the statement of the
        epoch loop that calls the function running it (per-epoch work after the batches goes after this)."""
        return self._epoch_and_site()[1]

    def batch_in_call(self) -> cst.FunctionDef | None:
        """The module-level function (or method) the epoch loop calls to run the batch loop (None: the loops are
        nested)."""
        site = self._epoch_and_site()[1]
        return None if site is self.batch_loop() else enclosing_function(self, self.batch_loop())

    def passed_for(self, expr: cst.BaseExpression) -> cst.BaseExpression:
        """What the epoch loop's call hands `train_one_epoch(...)` for its parameter `expr` (the batch loop's
        `loader`: main()'s `train_loader`); `expr` itself where the loops are nested."""
        function = self.batch_in_call()
        if function is None:
            return expr
        name = dotted(expr)
        params = [p.name.value for p in function.params.params]
        if self._is_method(function):
            if name is not None and name.split(".")[0] == params[0]:
                return expr  # `self.train_loader`: the caller, a method of the same class, has the same `self`
            params = params[1:]
        call = next(iter(self.calls_of(function, within=self.batch_site())), None)
        if call is None or name not in params:
            raise NotApplicable(
                f"`{code(expr)}` of the batch loop in `{function.name.value}()` is not a parameter the epoch loop's "
                "call hands it"
            )
        given = kwarg(call, name) or next(iter(positional(call)[params.index(name) :][:1]), None)
        if given is None:
            raise NotApplicable(f"the epoch loop's call of `{function.name.value}()` does not pass `{name}`")
        return given.value

    def _epoch_and_site(self) -> tuple[cst.For, cst.CSTNode]:
        if not hasattr(self, "_epoch_site"):
            self._epoch_site = self._find_epoch()
        return self._epoch_site

    def _find_epoch(self) -> tuple[cst.For, cst.CSTNode]:
        batch = self.batch_loop()
        loop = next((a for a in self.ancestors(batch) if isinstance(a, (cst.For, cst.While))), None)
        if loop is not None:
            if not isinstance(loop, cst.For):
                raise NotApplicable("the loop around the batch loop is a `while` loop, not a `for` loop over epochs")
            return loop, batch
        # the batch loop runs in a module-level function or a method: follow its callers (a call within a loop) two
        # levels up
        frontier = [enclosing_function(self, batch)]
        for _ in range(2):
            callers = []
            for function in frontier:
                if function is None:
                    continue
                for call in self.calls_of(function):
                    around = next((a for a in self.ancestors(call) if isinstance(a, (cst.For, cst.While))), None)
                    if isinstance(around, cst.For) and not self.inside(around, function):
                        return around, self.statement_of(call)
                    callers.append(enclosing_function(self, call))
            frontier = callers
        raise NotApplicable(
            "no `for` loop over epochs around the batch loop, nor around a call of the function that runs it"
        )

    def calls_of(self, function: cst.FunctionDef, within: cst.CSTNode | None = None) -> list[cst.Call]:
        """The calls of a module-level function by its name, or of a method as `self.<method>(...)` from another method
        of its class (the instance parameter of both: an HF-style Trainer's train() calling self.train_epoch()).
        Empty for a nested function, a module-level function defined twice, or a method its class defines twice
        (the first is dead, overridden by the second: an edit there would never run)."""
        found: list[cst.Call] = []
        if isinstance(self.parent(function), cst.Module):
            if len(self.defined(function.name.value, top_level=True)) == 1:
                found = [
                    c
                    for c in self.calls(within=within)
                    if isinstance(c.func, cst.Name) and c.func.value == function.name.value
                ]
        elif (
            self._is_method(function)
            and first_parameter(function) is not None
            and [m.name.value for m in self.defined_in_class(function)].count(function.name.value) == 1
        ):
            for call in self.calls(within=within):
                caller = enclosing_function(self, call)
                instance = call.func.value if isinstance(call.func, cst.Attribute) else None
                if (
                    isinstance(instance, cst.Name)
                    and call.func.attr.value == function.name.value
                    and caller is not None
                    and self._same_instance(caller, function, instance.value)
                ):
                    found.append(call)
        return found

    # -- the model and the loss -----------------------------------------------------------

    def model_built(self) -> cst.SimpleStatementLine:
        """The last `<model> = ...` line before the optimizer is built (where the model takes its final form)."""
        refuse_built_apart(self, "where the model itself is built is not followed")
        model, optimizer = self.model_name(), self.optimizer_statement()
        built = [
            s
            for s in self.statements(self.module)
            if assign_target(s) == model and self.order(s) < self.order(optimizer)
        ]
        if not built:
            raise NotApplicable(f"no `{model} = ...` line before the optimizer")
        return built[-1]

    def _model_constructed(self) -> cst.BaseExpression:
        """The value the model is constructed from: the last `<model> = ...` before the optimizer that does not wrap
        the model itself (`model = harness.wrap(model)`, `torch.compile(model)`: the class is the one wrapped)."""
        model, last = self.model_name(), self.order(self.model_built())
        built = [s for s in self.statements(self.module) if assign_target(s) == model and self.order(s) <= last]
        for statement in reversed(built):
            value = assign_value(statement)
            wrapped = isinstance(value, cst.Call) and any(
                isinstance(arg.value, cst.Name) and arg.value.value == model for arg in value.args
            )
            if not wrapped:
                return value
        raise NotApplicable(f"no `{model} = ...` line that builds the model")

    def model_name(self) -> str:
        """The model whose `.parameters()` the optimizer gets (an nn.Module), as the training step's function names
        it: the builder's own name where the step is in reach of it, else the object whose method built the
        optimizer (`model` of `opt, sched = model.configure_optimizers()` for `self.parameters()` there)."""
        built = self.built_model()
        try:
            stepped = self.stepped_as(self.step_statement())
        except NotApplicable:
            return built
        if stepped is None:
            return built
        function, builder = enclosing_function(self, self.step_statement()), self.optimizer_function()
        if stepped.bound is None:
            root = built.split(".")[0]
            apart = builder is not None and (function is None or not self.inside(function, builder))
            if apart and function is not None and not self._binds(function, root):
                kept = self._kept_as(builder, function, root)
                if kept is not None:  # `self.model = model` in __init__, stepped in train_epoch() as `self.model`
                    return kept + built[len(root) :]
                raise NotApplicable(
                    f"the optimizer is built in `{_function_name(builder)}()` from `{built}.parameters()` and stepped "
                    f"in `{_function_name(function)}()`, which has no `{root}` of its own"
                )
            return built
        root, dot, rest = built.partition(".")
        assert builder is not None  # a bound step comes from a call of the builder
        passed = _passed_as(builder, cst.ensure_type(stepped.bound.value, cst.Call), root, self._is_method(builder))
        if passed is None:
            raise NotApplicable(
                f"the optimizer is built in `{_function_name(builder)}()` from `{built}.parameters()`, which "
                f"`{_function_name(function)}()` that steps it does not name"
            )
        return f"{passed}{dot}{rest}"

    def stepped_name(self) -> str:
        """The optimizer's name where the training step steps it (`opt` of `opt.step()`)."""
        stepped = self.stepped_as(self.step_statement())
        assert stepped is not None  # step_statement only returns lines that step it
        return stepped.name

    def stepped_apart(self) -> Stepped | None:
        """How the step's function got the optimizer from a method or function that builds and returns it (`opt,
        sched = model.configure_optimizers()`, `opt = make_optimizer(model)`); None where it is stepped in reach of the
        name it is built under."""
        stepped = self.stepped_as(self.step_statement())
        return stepped if stepped is not None and stepped.bound is not None else None

    def built_model(self) -> str:
        """The model whose `.parameters()` the optimizer gets, as the builder names it: read in the optimizer call,
        else in a helper that builds the parameter groups from the model it is handed (`param_groups(model, wd)`,
        timm's `param_groups_weight_decay(model, wd)`), else in the parameter groups built before it (`[p for n, p
        in model.named_parameters() if ...]`)."""
        optimizer = self.optimizer_call()
        scope = next((a for a in self.ancestors(optimizer) if isinstance(a, cst.FunctionDef)), self.module)
        inside = self.within(optimizer)
        earlier = [n for n in self.within(scope) if self.order(n) < self.order(optimizer)]
        helpers = [n for n in inside if isinstance(n, cst.Call) and n is not optimizer]
        for node in [*inside, *helpers, *earlier[::-1]]:
            if (
                isinstance(node, cst.Call)
                and isinstance(node.func, cst.Attribute)
                and node.func.attr.value in ("parameters", "named_parameters")
            ):
                name = dotted(node.func.value)
                if name is not None:
                    return name
            elif node in helpers and (handed := self._handed_model(cst.ensure_type(node, cst.Call), scope)):
                return handed
        raise NotApplicable("the optimizer is not built from `<model>.parameters()` (no nn.Module model found)")

    def _handed_model(self, call: cst.Call, scope: cst.CSTNode) -> str | None:
        """The model a helper building the optimizer's parameter groups is handed: the argument that fills the
        parameter whose `.parameters()` / `.named_parameters()` a module-level function of the trainer reads, or, for
        a helper from elsewhere, the one argument bound in `scope` to a module built from a class (`Net(...)`,
        `ResNetSmall(...).to(device)`)."""
        name = call_name(call)
        helper = next(iter(self.defined(name or "", top_level=True)), None)
        if helper is not None:
            for node in self.within(helper):
                if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute):
                    if node.func.attr.value not in ("parameters", "named_parameters"):
                        continue
                    root, dot, rest = (dotted(node.func.value) or "").partition(".")
                    passed = _passed_as(helper, call, root, False) if root else None
                    if passed is not None:
                        return f"{passed}{dot}{rest}"
            return None
        built = []
        for arg in call.args:
            argument = dotted(arg.value) if not arg.star else None
            for stmt in self.statements(scope) if argument is not None else []:
                value = assign_value(stmt) if assign_target(stmt) == argument else None
                while (
                    isinstance(value, cst.Call)
                    and isinstance(value.func, cst.Attribute)
                    and value.func.attr.value in MOVES
                ):
                    value = value.func.value  # `Net(...).to(device)`
                if isinstance(value, cst.Call) and (call_name(value) or "").rsplit(".", 1)[-1][:1].isupper():
                    built.append(argument)
                    break
        return built[0] if len(built) == 1 else None

    def forward_call(self) -> cst.Call:
        """The model's forward call in the batch loop (`model(x)`)."""
        name = self.model_name()
        for call in self.calls(within=self.batch_loop()):
            if call_name(call) == name and positional(call):
                return call
        raise NotApplicable(f"no `{name}(...)` forward call in the batch loop")

    def forward_input(self) -> cst.BaseExpression:
        """The batch the model is fed: `x` of `model(x)`; for a functional model, the last argument of the call
        that produces the loss's logits (`forward(params, x)`)."""
        try:
            return positional(self.forward_call())[0].value
        except NotApplicable:
            logits = positional(self.loss_call())[0].value
            if isinstance(logits, cst.Call) and positional(logits):
                return positional(logits)[-1].value
            raise

    def parameters_code(self) -> str:
        """The trainable parameters: `model.parameters()`, or the list a functional trainer hands the optimizer."""
        try:
            return f"{self.model_name()}.parameters()"
        except NotApplicable:
            args = positional(self.optimizer_call())
            if args and isinstance(args[0].value, cst.Name):
                return args[0].value.value
            raise

    def criteria(self, pattern: re.Pattern[str] = CROSS_ENTROPY_CLS) -> set[str]:
        """Names bound to a criterion (by default `nn.CrossEntropyLoss(...)`)."""
        names = set()
        for call in self.calls(pattern):
            target = assign_target(self.statement_of(call))
            if target is not None and assign_value(self.statement_of(call)) is call:
                names.add(target)
        return names

    def loss_call(self) -> cst.Call:
        """The cross-entropy call that computes the loss that is back-propagated."""
        name, backward = self.loss_name(), self.backward_statement()
        lines = [
            s for s in self.statements(self.batch_loop()) if assign_target(s) == name and _before(self, s, backward)
        ]
        if not lines:
            raise NotApplicable(f"no `{name} = ...` line before `{name}.backward()`")
        call = self._loss_call_in(lines[::-1], CROSS_ENTROPY_FN, CROSS_ENTROPY_CLS)
        if call is None:
            raise NotApplicable(
                self._loss_elsewhere(lines[-1], name)
                or f"the loss `{name}` is not a cross-entropy call (F.cross_entropy or nn.CrossEntropyLoss)"
            )
        return call

    def _loss_elsewhere(self, line: cst.SimpleStatementLine, name: str) -> str | None:
        """Where a loss computed by a call of the trainer's own function or method comes from (`loss =
        model.training_step(batch)`): the transforms edit the loss where the step is, they do not follow calls."""
        value = assign_value(line)
        called = call_name(value) if isinstance(value, cst.Call) else None
        if called is None:
            return None
        last = called.rsplit(".", 1)[-1]
        if not self.defined(last):
            return None
        kind = "method" if "." in called else "function"
        return f"the loss `{name}` comes from the {kind} `{called}`, which is not followed"

    def _loss_call_in(
        self, places: list[cst.CSTNode], function: re.Pattern[str], criterion: re.Pattern[str]
    ) -> cst.Call | None:
        """The first loss call (a `function`, a criterion object built by `criterion`, or `Criterion()(...)`) with
        logits and targets in `places`, searched in that order (the nearest line first: `loss = loss + aux` lines
        come after the one that computes it)."""
        criteria = self.criteria(criterion)
        for place in places:
            for call in self.calls(within=place):
                called = call_name(call) or ""
                direct = isinstance(call.func, cst.Call) and criterion.match(call_name(call.func) or "")
                if (function.match(called) or called in criteria or direct) and len(positional(call)) >= 2:
                    return call
        return None

    def loss_expressions(self) -> list[cst.CSTNode]:
        """Where the back-propagated loss is computed, nearest first: the `loss = ...` lines before `loss.backward()`
        in the batch loop, or the expression `.backward()` is called on (`criterion(out, y).backward()`)."""
        backward = self.backward_statement()
        call = single_expr_call(backward)
        assert call is not None and isinstance(call.func, cst.Attribute)
        name = dotted(call.func.value)
        if name is None:
            return [call.func.value]
        lines = [
            s for s in self.statements(self.batch_loop()) if assign_target(s) == name and _before(self, s, backward)
        ]
        return lines[::-1]

    def any_loss_call(self) -> cst.Call | None:
        """The torch loss call (cross-entropy, `F.mse_loss`, an `nn.HuberLoss()` criterion...) that computes the
        back-propagated loss; None for a loss written out (`((out - y) ** 2).mean()`)."""
        return self._loss_call_in(self.loss_expressions(), LOSS_FN, LOSS_CLS)

    def summed_loss_batch(self) -> str | None:
        """The targets a summed back-propagated loss adds up over (`y[idx]`), whose length scales a per-example limit;
        None for a mean loss or a written-out one that is not a plain sum. NotApplicable where the reduction is
        left to later lines, or a written-out sum does not say over how many examples."""
        call = self.any_loss_call()
        if call is None:
            nearest = next(iter(self.loss_expressions()), None)
            value = assign_value(nearest) if isinstance(nearest, cst.SimpleStatementLine) else nearest
            if isinstance(value, cst.Call) and _is_sum(value):
                raise NotApplicable(
                    f"the loss is summed by hand (`{code(value)}`): the batch size a per-example limit scales by "
                    "is not known"
                )
            summed = isinstance(value, cst.Call) and any(
                a.keyword is not None and a.keyword.value == "reduction" and code(a.value).strip("'\"") == "sum"
                for a in value.args
            )
            if summed:  # `F.mse_loss(input=..., target=..., reduction="sum")`: the call is not read by keyword
                raise NotApplicable(
                    f"the loss is summed (`{code(value)}`) in a call given by keyword: the batch size a per-example "
                    "limit scales by is not read"
                )
            return None
        if self.loss_reduction(call) != "sum":
            return None
        target = positional(call)[1]
        return code(target.value)

    def loss_reduction(self, call: cst.Call | None = None) -> str:
        """How the back-propagated loss (by default the cross-entropy `loss_call`) reduces the per-example losses:
        "mean" (the default), or "sum" (its gradient is the batch size times the mean's). `reduction="none"` counts
        as the `.mean()`/`.sum()` the trainer applies to the call itself (`F.cross_entropy(..., reduction="none")
        .sum()`)."""
        call = self.loss_call() if call is None else call
        reduction = self.loss_reduction_argument(call)
        if reduction in ("mean", "sum"):
            return reduction
        if reduction == "none":
            outer = self.parent(call)
            if isinstance(outer, cst.Attribute) and outer.attr.value in ("mean", "sum"):
                reducer = self.parent(outer)
                if isinstance(reducer, cst.Call) and reducer.func is outer and not reducer.args:
                    return outer.attr.value
            raise NotApplicable(
                'the loss uses reduction="none" without a `.mean()` or `.sum()` on the call itself (reduced elsewhere)'
            )
        raise NotApplicable(f"the loss uses reduction={reduction}, not a literal mean, sum or none")

    def criterion_built(self, call: cst.Call) -> cst.Call | None:
        """The construction of the criterion a loss call calls (`criterion = nn.CrossEntropyLoss(...)` for
        `criterion(out, y)`, the inner call of `nn.CrossEntropyLoss(...)(out, y)`); None for a function (F.*)."""
        if isinstance(call.func, cst.Call):
            return call.func
        criterion = call_name(call)
        return next(
            (
                c
                for c in self.calls(LOSS_CLS)
                if assign_target(self.statement_of(c)) == criterion and assign_value(self.statement_of(c)) is c
            ),
            None,
        )

    def criterion_settings(self, call: cst.Call, keep: frozenset[str]) -> dict[str, str]:
        """The keyword settings (name -> source) of the criterion a loss call calls, for a transform that replaces
        the call by a function and must carry them over; NotApplicable naming a setting it cannot carry: a
        positional one, one not in `keep`, or one that reads a name the call's function may not see."""
        ctor = self.criterion_built(call)
        if ctor is None:
            return {}
        settings = {}
        for arg in ctor.args:
            if arg.keyword is None or arg.keyword.value not in keep:
                raise NotApplicable(
                    f"the criterion `{code(ctor)}` has a setting (`{code(arg).rstrip(', ')}`) its "
                    "replacement would drop"
                )
            names = [n for n in self.within(arg.value) if isinstance(n, cst.Name)]
            if names and enclosing_function(self, ctor) is not enclosing_function(self, call):
                raise NotApplicable(
                    f"the criterion's `{code(arg).rstrip(', ')}` reads a name of the function that "
                    "builds it, out of the loss call's reach"
                )
            settings[arg.keyword.value] = code(arg.value)
        return settings

    def loss_reduction_argument(self, call: cst.Call | None = None) -> str:
        """The loss call's (by default `loss_call`'s) `reduction=` (or its criterion's), as a string ("mean" when
        not given); a non-literal value comes back as its source text."""
        call = self.loss_call() if call is None else call
        found = kwarg(call, "reduction")
        if found is None:
            ctor = self.criterion_built(call)
            found = kwarg(ctor, "reduction") if ctor is not None else None
        if found is None:
            return "mean"
        value = found.value
        if isinstance(value, cst.SimpleString) and isinstance(value.evaluated_value, str):
            return value.evaluated_value
        return code(value)

    def layers(self) -> list[Layer]:
        """nn.Conv2d / nn.Linear constructions, in source order."""
        found, listed = [], self._listed()
        for call in self.calls():
            name = call_name(call) or ""
            kind = "conv" if CONV.match(name) else "linear" if LINEAR.match(name) else None
            if kind is None or self._in_helper(call) or not self.in_model(call):
                continue
            parent = self.parent(self.parent(call) or call)  # call -> Arg/Element -> container
            sequential = parent if isinstance(parent, cst.Call) and SEQUENTIAL.match(call_name(parent) or "") else None
            stmt = self.statement_of(call)
            target = assign_target(stmt) if assign_value(stmt) is call else None
            attribute = target.removeprefix("self.") if target and target.startswith("self.") else None
            joined = listed.get(id(call))
            unfollowed = joined if isinstance(joined, str) else None
            joined = None if isinstance(joined, str) else joined
            found.append(Layer(call, kind, attribute, sequential, joined, unfollowed))
        return found

    def model_layers(self) -> list[Layer]:
        """The layers a transform can place a module beside (built in `__init__`, in `nn.Sequential(...)`, added to a
        list handed to `nn.Sequential(*list)`, or to an nn.ModuleList whose elements the model calls); NotApplicable
        says what the trainer has instead."""
        layers = self.layers()
        placed = [layer for layer in layers if layer.placed]
        if placed:
            return placed
        unfollowed = next((layer.unfollowed for layer in layers if layer.unfollowed), None)
        if unfollowed is not None:
            raise NotApplicable(unfollowed)
        for seq in self.calls(SEQUENTIAL):
            starred = next((a for a in seq.args if a.star == "*"), None)
            if starred is not None:
                name = code(starred.value)
                made = self._list_binding(seq, name, enclosing_function(self, seq), display=False)
                value = _bound_value(made, name) if made is not None else None
                if isinstance(starred.value, cst.ListComp) or isinstance(value, cst.ListComp):
                    shown = "[...]" if isinstance(starred.value, cst.ListComp) else name
                    raise NotApplicable(
                        f"`nn.Sequential(*{shown})` unpacks a list comprehension: one expression builds every layer, "
                        "the hidden ones and the output layer alike"
                    )
                raise NotApplicable(
                    f"`nn.Sequential(*{name})` unpacks a list that no nn.Conv2d / nn.Linear is added to one at a time "
                    f"in its function (`{name} = []`, then `{name}.append(nn.Linear(...))`, `{name} += [...]` or "
                    f"`{name}.extend([...])`)"
                )
        if layers:
            raise NotApplicable(
                f"the nn.Conv2d / nn.Linear layers (`{code(layers[0].call)}`) are built neither in `__init__` "
                "(`self.<name> = ...`), nor in `nn.Sequential(...)`, nor added to a list handed to "
                "`nn.Sequential(*list)`"
            )
        raise NotApplicable(
            self.imported_model() or "no nn.Conv2d / nn.Linear layers (a functional model of plain tensors?)"
        )

    def in_model(self, node: cst.CSTNode) -> bool:
        """Whether a node lies in the model: anywhere in train.py; in a module the model is imported from, in its
        class or a class or function of the module that the class uses (a ResNet's block)."""
        if self.model_class is None:
            return True
        if not hasattr(self, "_model_spans"):
            tops = {n.name.value: n for n in self.module.body if isinstance(n, (cst.ClassDef, cst.FunctionDef))}
            if not isinstance(tops.get(self.model_class), cst.ClassDef):
                raise NotApplicable(f"it defines no class `{self.model_class}`")
            used, queue = {self.model_class}, [tops[self.model_class]]
            while queue:
                for name in {n.value for n in self.within(queue.pop()) if isinstance(n, cst.Name)} - used:
                    if name in tops:
                        used.add(name)
                        queue.append(tops[name])
            self._model_spans = [self.spans[id(tops[name])] for name in used]
        return any(first <= self.order(node) < last for first, last in self._model_spans)

    def model_import(self) -> tuple[str, str] | None:
        """Where the model's class comes from when train.py imports it: (module, the class's name there), `("models",
        "ResNetSmall")` for `from models import ResNetSmall as Net`; None where train.py defines it, or it is not
        found."""
        try:
            value = self._model_constructed()
        except NotApplicable:
            return None
        while isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) and value.func.attr.value in MOVES:
            value = value.func.value  # `Net(...).to(device)`
        name = call_name(value) if isinstance(value, cst.Call) else None
        if name is None or any(isinstance(n, cst.ClassDef) and n.name.value == name for n in self.module.body):
            return None
        head, _, rest = name.partition(".")
        for node in self.nodes:
            if isinstance(node, cst.ImportFrom) and not isinstance(node.names, cst.ImportStar):
                source = "." * len(node.relative) + (dotted(node.module) or "") if node.module or node.relative else ""
                for alias in node.names:
                    if (dotted(alias.asname.name) if alias.asname else dotted(alias.name)) == head:
                        # `from pkg import models` then `models.Net(...)`: the module is pkg.models
                        imported = dotted(alias.name) or head
                        if not rest:
                            return source, imported
                        module, _, cls = f"{imported}.{rest}".rpartition(".")
                        return f"{source.rstrip('.')}.{module}" if source.strip(".") else f"{source}{module}", cls
            elif isinstance(node, cst.Import):
                for alias in node.names:
                    module = dotted(alias.name) or ""
                    bound = dotted(alias.asname.name) if alias.asname else module
                    if bound and name.startswith(f"{bound}."):
                        return module, name.removeprefix(f"{bound}.")
        return None

    def imported_model(self) -> str | None:
        """Why the model's layers are not in the source where its class is imported (`from models import Net`),
        else None."""
        found = self.model_import()
        if found is None or found[0].split(".")[0] == "torch":  # (`nn.Sequential(*layers)`: its layers are here)
            return None
        source, name = found
        if source.split(".")[0] in MODEL_LIBRARIES:
            return f"the model `{name}` comes from `{source}` (a library), whose layers the offline agent does not edit"
        # (the catalog's layer interventions edit the class where `source` is a module of the variant's folder)
        return f"the model `{name}` is defined in `{source}` (imported), not in train.py"

    def _listed(self) -> dict[int, Listed | str]:
        """Layers added to a list that `nn.Sequential(*list)` unpacks, by id of their call: `layers = []` (or a
        display of layers), then `layers.append(layer)`, `layers += [...]`, `layers.extend([...])` in the same
        function, before the Sequential is built; and layers of an nn.ModuleList attribute (see `_module_listed`),
        or why one is not followed."""
        if hasattr(self, "_listed_layers"):
            return self._listed_layers
        found: dict[int, Listed | str] = self._module_listed()
        for seq in self.calls(SEQUENTIAL):
            scope = enclosing_function(self, seq)
            for arg in seq.args:
                name = dotted(arg.value) if arg.star == "*" else None
                binding = self._list_binding(seq, name, scope) if name else None
                if name is None or binding is None:
                    continue
                for call in self.calls(within=scope or self.module):
                    if not (CONV.match(call_name(call) or "") or LINEAR.match(call_name(call) or "")):
                        continue
                    joins = self._joins(call, name)
                    if joins is None or enclosing_function(self, call) is not scope:
                        continue
                    adds, display = joins
                    if self.order(adds) < self.order(binding) or self.order(adds) > self.order(seq):
                        continue
                    loops = [a for a in self.ancestors(adds) if isinstance(a, (cst.For, cst.While))]
                    repeated = any(not self.inside(binding, loop) for loop in loops)
                    found[id(call)] = Listed(name, adds, display, repeated)
        self._listed_layers = found
        return found

    def _module_listed(self) -> dict[int, Listed | str]:
        """Layers of an nn.ModuleList attribute, by id of their call: `self.layers = nn.ModuleList()` then
        `self.layers.append(nn.Linear(...))` in the same method, or `nn.ModuleList([nn.Linear(...), ...])` /
        `nn.ModuleList([nn.Linear(...) for ...])`; placed where every other use of `self.layers` in its class calls
        the elements (`for layer in self.layers: ... layer(x)`, `enumerate(self.layers)`, `self.layers[i](x)`,
        `len(self.layers)`), else the reason it is not followed."""
        found: dict[int, Listed | str] = {}
        for made in self.calls(MODULE_LIST):
            binding = self.parent(made)
            if not isinstance(binding, (cst.Assign, cst.AnnAssign)) or binding.value is not made:
                continue
            name = (_assigned(binding) or [None])[0] if len(_assigned(binding)) == 1 else None
            scope = enclosing_function(self, made)
            owner = next((a for a in self.ancestors(made) if isinstance(a, cst.ClassDef)), None)
            if name is None or not name.startswith("self.") or scope is None or owner is None:
                continue
            joined: dict[int, tuple[cst.BaseSmallStatement, cst.List | None, bool]] = {}
            for call in self.calls(within=scope):
                if not (CONV.match(call_name(call) or "") or LINEAR.match(call_name(call) or "")):
                    continue
                joins = self._joins_module_list(call, name, made)
                if joins is None or enclosing_function(self, call) is not scope:
                    continue
                adds, display, comprehension = joins
                if adds is not binding and self.order(adds) < self.order(binding):
                    continue
                loops = [a for a in self.ancestors(adds) if isinstance(a, (cst.For, cst.While))]
                joined[id(call)] = (adds, display, comprehension or any(not self.inside(binding, lp) for lp in loops))
            if not joined:
                continue
            adds_all = [adds for adds, _, _ in joined.values()]
            how = "appended to" if any(adds is not binding for adds in adds_all) else "built into"
            unfollowed = self._module_list_use(owner, name, [binding, *adds_all])
            for key, (adds, display, repeated) in joined.items():
                found[key] = (
                    f"hidden layers are {how} the nn.ModuleList `{name}`, {unfollowed}"
                    if unfollowed
                    else Listed(name, adds, display, repeated, module_list=True)
                )
        return found

    def _joins_module_list(
        self, call: cst.Call, name: str, made: cst.Call
    ) -> tuple[cst.BaseSmallStatement, cst.List | None, bool] | None:
        """How a layer joins the nn.ModuleList `made` bound to `name`: its `.append(...)` statement, or the list
        display or comprehension handed to it; (statement, display, built by a comprehension)."""
        node = self.parent(call)
        if isinstance(node, cst.Arg) and not node.star and node.keyword is None:
            outer = self.parent(node)
            small = self.parent(outer) if outer is not None else None
            if isinstance(outer, cst.Call) and call_name(outer) == f"{name}.append" and isinstance(small, cst.Expr):
                return small, None, False
            return None
        comprehension = isinstance(node, cst.ListComp) and node.elt is call
        container = node if comprehension else self.parent(node) if isinstance(node, cst.Element) else None
        holder = self.parent(container) if isinstance(container, (cst.List, cst.ListComp)) else None
        if isinstance(holder, cst.Arg) and self.parent(holder) is made:
            binding = self.parent(made)
            if isinstance(binding, (cst.Assign, cst.AnnAssign)):
                return binding, container if isinstance(container, cst.List) else None, comprehension
        return None

    def _module_list_use(self, owner: cst.ClassDef, name: str, building: list[cst.CSTNode]) -> str | None:
        """None where the class uses the nn.ModuleList `name` (`self.layers`) only by calling its elements;
        else what it does with it instead (the words finish a refusal)."""
        # (`self.layers.parameters()`, a further `.append(nn.ReLU())`: no element is reached apart from the calls)
        uses = [
            n
            for n in self.within(owner)
            if isinstance(n, cst.Attribute)
            and dotted(n) == name
            and not any(self.inside(n, b) for b in building)
            and not (isinstance(self.parent(n), cst.Attribute) and self.parent(n).value is n)  # type: ignore[union-attr]
        ]
        if not uses:
            return "which the model never uses"
        for use in uses:
            if not self._calls_elements(use):
                method = enclosing_function(self, use)
                where = f"{method.name.value}()" if method is not None else f"class {owner.name.value}"
                return (
                    f"whose use in {where} is not followed (`{code(self.statement_of(use)).strip().splitlines()[0]}`)"
                )
        return None

    def _calls_elements(self, use: cst.CSTNode) -> bool:
        """Whether one use of an nn.ModuleList only calls its elements: `len(...)`, `self.layers[i](x)`, or a loop
        over it (`self.layers`, a slice of it, or `enumerate(...)` of either) whose variable is only ever called."""
        parent = self.parent(use)
        if isinstance(parent, cst.Arg) and call_name(self.parent(parent) or use) == "len":
            return True
        node = use
        if isinstance(parent, cst.Subscript) and parent.value is use:
            grand = self.parent(parent)
            if isinstance(grand, cst.Call) and grand.func is parent:
                return True
            node, parent = parent, grand
        target: cst.CSTNode | None = None
        if isinstance(parent, cst.For) and parent.iter is node:
            target = parent.target
        elif isinstance(parent, cst.Arg) and call_name(self.parent(parent) or use) == "enumerate":
            loop = self.parent(self.parent(parent) or use)
            if isinstance(loop, cst.For) and loop.iter is self.parent(parent) and isinstance(loop.target, cst.Tuple):
                if len(loop.target.elements) == 2:
                    target, parent = loop.target.elements[1].value, loop
        if not isinstance(target, cst.Name) or not isinstance(parent, cst.For):
            return False
        named = [n for n in self.within(parent.body) if isinstance(n, cst.Name) and n.value == target.value]
        return bool(named) and all(
            isinstance(self.parent(n), cst.Call) and self.parent(n).func is n  # type: ignore[union-attr]
            for n in named
        )

    def _list_binding(
        self, seq: cst.Call, name: str, scope: cst.FunctionDef | None, display: bool = True
    ) -> cst.Assign | cst.AnnAssign | None:
        """The last `name = [...]` (with `display=False`, `name = <anything>`) in the Sequential's function (or at
        module level) before it is built."""
        bindings = [
            n
            for n in self.within(scope or self.module)
            if isinstance(n, (cst.Assign, cst.AnnAssign))
            and (value := _bound_value(n, name)) is not None
            and (isinstance(value, cst.List) or not display)
            and self.order(n) < self.order(seq)
            and enclosing_function(self, n) is scope
        ]
        return bindings[-1] if bindings else None

    def _joins(self, call: cst.Call, name: str) -> tuple[cst.BaseSmallStatement, cst.List | None] | None:
        """The statement that adds the layer `call` to the list `name`, and the display it is an element of."""
        node = self.parent(call)
        if isinstance(node, cst.Arg) and not node.star and node.keyword is None:
            outer = self.parent(node)
            small = self.parent(outer) if outer is not None else None
            if isinstance(outer, cst.Call) and call_name(outer) == f"{name}.append" and isinstance(small, cst.Expr):
                return small, None
            return None
        display = self.parent(node) if isinstance(node, cst.Element) else None
        if not isinstance(display, cst.List):
            return None
        holder = self.parent(display)
        if isinstance(holder, cst.Arg):
            outer = self.parent(holder)
            small = self.parent(outer) if outer is not None else None
            if isinstance(outer, cst.Call) and call_name(outer) == f"{name}.extend" and isinstance(small, cst.Expr):
                return small, display
        if isinstance(holder, cst.AugAssign) and isinstance(holder.operator, cst.AddAssign):
            return (holder, display) if dotted(holder.target) == name else None
        if isinstance(holder, (cst.Assign, cst.AnnAssign)) and _assigned(holder) == [name]:
            return holder, display
        return None

    def _in_helper(self, node: cst.CSTNode) -> bool:
        """Whether a node lies in a helper a transform added (the self-model's head is no layer of the model)."""
        return any(
            isinstance(a, (cst.ClassDef, cst.FunctionDef)) and a.name.value in HELPERS for a in self.ancestors(node)
        )

    def sets_lr_by_hand(self) -> bool:
        """Whether the trainer assigns `group["lr"] = ...` itself (a second schedule would fight it)."""
        return self.has(r"""\[["']lr["']\]\s*=[^=]""")

    # -- knobs ------------------------------------------------------------------------

    def knobs(self) -> dict[str, Any]:
        """The trainer's knobs and values."""
        if not hasattr(self, "_knobs"):
            self._knobs = read_knobs(self.source)
        return dict(self._knobs)

    def knob_like(self, pattern: str) -> str | None:
        """The first knob whose name matches a regex."""
        return next((k for k in self.knobs() if re.fullmatch(pattern, k)), None)


def under_no_grad(trainer: Trainer, node: cst.CSTNode) -> bool:
    """Whether a node runs inside a `with torch.no_grad()` (or inference_mode) block."""
    for ancestor in trainer.ancestors(node):
        if isinstance(ancestor, cst.With) and any(NO_GRAD.match(call_name(i.item) or "") for i in ancestor.items):
            return True
    return False


def evaluator_functions(trainer: Trainer) -> set[str]:
    """Module-level functions that evaluate the model they are given, whatever their name (`logits_tta(model, x)`):
    they call their first parameter (a forward pass) and are decorated with @torch.no_grad()/@torch.inference_mode(),
    call `.eval()` on it, or are only ever called under `with torch.no_grad()` (a no-grad helper that only copies
    weights is no evaluation)."""
    found, guarded = set(), called_only_without_grad(trainer)
    for node in trainer.module.body:
        if not isinstance(node, cst.FunctionDef) or not node.params.params:
            continue
        first = node.params.params[0].name.value
        decorated = any(NO_GRAD.match(call_name(d.decorator) or dotted(d.decorator) or "") for d in node.decorators)
        evals = any(call_name(c) == f"{first}.eval" for c in trainer.calls(within=node))
        forwards = any(call_name(c) == first for c in trainer.calls(within=node))
        if forwards and (decorated or evals or node.name.value in guarded):
            found.add(node.name.value)
    return found


def called_only_without_grad(trainer: Trainer) -> set[str]:
    """Names whose every call sits under `with torch.no_grad()` outside the batch loop: an undecorated
    `evaluate(model, x)` its callers guard. A no-grad helper called in the batch loop makes training's targets
    (pseudo-labels, a teacher's outputs): not evaluation. One pass over the calls for every function."""
    try:
        batch: cst.CSTNode | None = trainer.batch_loop()
    except NotApplicable:
        batch = None
    guarded: dict[str, bool] = {}
    for call in trainer.calls():
        name = call_name(call)
        if name is not None:
            ok = under_no_grad(trainer, call) and (batch is None or not trainer.inside(call, batch))
            guarded[name] = guarded.get(name, True) and ok
    return {name for name, ok in guarded.items() if ok}


def refuse_closure_step(trainer: Trainer, why: str) -> None:
    """NotApplicable where the training step passes a closure (`opt.step(closure)`, as LBFGS needs): the closure
    computes the loss and gradients inside the step, re-evaluating them as the optimizer asks, so what a transform
    puts around the step line (a clip, a filter, a second step) misses them (`why` says what it would have done)."""
    step = trainer.step_statement()
    call = single_expr_call(step)
    stepped = trainer.stepped_as(step)
    if call is not None and call.args and (stepped is None or stepped.scaler is None):
        raise NotApplicable(f"the optimizer steps with a closure (`{code(call)}`, LBFGS-style): {why}")


def own_unscale(trainer: Trainer, why: str) -> cst.SimpleStatementLine | None:
    """The trainer's own `scaler.unscale_(opt)` line before a step through a loss scaler (`scaler.step(opt)`): after it
    the gradients are the true ones. None where it has none; NotApplicable where it unscales elsewhere than on a line
    of the step's own block before the step (under a condition: a second unscale_ would raise when it runs)."""
    step = trainer.step_statement()
    stepped = trainer.stepped_as(step)
    if stepped is None or stepped.scaler is None:
        return None
    calls = [c for c in trainer.calls(within=trainer.batch_loop()) if call_name(c) == f"{stepped.scaler}.unscale_"]
    if not calls:
        return None
    line = trainer.statement_of(calls[0])
    if len(calls) > 1 or trainer.parent(line) is not trainer.parent(step) or not _before(trainer, line, step):
        raise NotApplicable(
            f"the trainer unscales its GradScaler's gradients (`{code(calls[0])}`) elsewhere than on a line before "
            f"`{code(step).strip()}`: {why}"
        )
    return cst.ensure_type(line, cst.SimpleStatementLine)


def unscale_line(trainer: Trainer, why: str) -> str | None:
    """`scaler.unscale_(opt)`, to add before a line that reads the gradients where the optimizer steps through a
    GradScaler (`scaler.step(opt)`: the gradients are the loss-scaled ones until then; PyTorch's AMP recipe unscales
    before a clip); None where it steps itself, or the trainer unscales already (`own_unscale`). NotApplicable where
    the scaler is not traced to a `torch.amp.GradScaler(...)` (`why` says what the transform needs)."""
    step = trainer.step_statement()
    stepped = trainer.stepped_as(step)
    if stepped is None or stepped.scaler is None or own_unscale(trainer, why) is not None:
        return None
    if not trainer.is_grad_scaler(enclosing_function(trainer, step), stepped.scaler):
        raise NotApplicable(
            f"the optimizer steps through `{code(step).strip()}`, and `{stepped.scaler}` is not traced to a "
            f"`torch.amp.GradScaler(...)` whose `unscale_()` would give the true gradients: {why}"
        )
    return f"{stepped.scaler}.unscale_({stepped.name})"


def refuse_lbfgs(trainer: Trainer, why: str) -> None:
    """NotApplicable where the optimizer is `torch.optim.LBFGS` (one parameter group, no momentum, no weight decay)."""
    if (call_name(trainer.optimizer_call()) or "").rsplit(".", 1)[-1] == "LBFGS":
        raise NotApplicable(f"the optimizer is LBFGS: {why}")


def refuse_built_apart(trainer: Trainer, why: str) -> None:
    """NotApplicable where the optimizer is built in the model's own method (`configure_optimizers()`) or a factory
    function (`make_optimizer(model)`) and stepped in another function: what goes beside the optimizer's construction
    would sit where the trained model has another name (`why` says what the transform would have needed)."""
    apart = trainer.stepped_apart()
    if apart is not None:
        builder = trainer.optimizer_function()
        kind = "the model's method" if builder is not None and trainer._is_method(builder) else "the function"
        raise NotApplicable(
            f"the optimizer is built in {kind} `{_function_name(builder)}()` and "
            f"stepped in `{_function_name(enclosing_function(trainer, apart.bound))}()` as `{apart.name}` (from "
            f"`{code(apart.bound.value)}`): {why}"
        )


def enclosing_function(trainer: Trainer, node: cst.CSTNode) -> cst.FunctionDef | None:
    """The innermost function a node's code runs in (None: module level)."""
    return next((a for a in trainer.ancestors(node) if isinstance(a, cst.FunctionDef)), None)


def first_parameter(function: cst.FunctionDef) -> str | None:
    """The name of a function's first parameter (None: it takes none)."""
    return function.params.params[0].name.value if function.params.params else None


def _function_name(function: cst.FunctionDef | None) -> str:
    """A function's name (`<module>` for module level)."""
    return function.name.value if function is not None else "<module>"


def _stepped_name(line: cst.CSTNode) -> str | None:
    """`opt` of a statement line `opt.step()`, or `opt.step(closure)` (LBFGS: one positional argument), else None."""
    call = single_expr_call(line)
    if call is None or not isinstance(call.func, cst.Attribute) or call.func.attr.value != "step":
        return None
    if len(call.args) > 1 or any(a.keyword is not None or a.star for a in call.args):
        return None
    return dotted(call.func.value)


def _scaler_stepped(line: cst.CSTNode) -> str | None:
    """`opt` of a statement line `scaler.step(opt)` (one positional dotted name: what a loss scaler steps)."""
    call = single_expr_call(line)
    if _stepped_name(line) is None or call is None or len(call.args) != 1 or call.args[0].keyword is not None:
        return None
    return dotted(call.args[0].value)


def _passed_as(function: cst.FunctionDef, call: cst.Call, parameter: str, method: bool) -> str | None:
    """The dotted name a call of `function` passes as its `parameter`: the object of `obj.method(...)` for a method's
    first parameter, else the positional or keyword argument that binds it; None where it is no dotted name."""
    names = [p.name.value for p in function.params.params]
    if method:
        if names[:1] == [parameter]:
            return dotted(call.func.value) if isinstance(call.func, cst.Attribute) else None
        names = names[1:]
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == parameter:
            return dotted(arg.value)
    positional = [a for a in call.args if a.keyword is None and not a.star]
    if any(a.star for a in call.args) or parameter not in names or names.index(parameter) >= len(positional):
        return None
    return dotted(positional[names.index(parameter)].value)


def _returned_as(method: cst.FunctionDef, name: str, target: cst.BaseAssignTargetExpression) -> str | None:
    """The name `target` (of `target = obj.method()`) gives to what `method` binds as `name` and returns: `opt` for
    `return optimizer` and `opt = ...`, or for `return optimizer, scheduler` and `opt, sched = ...`."""
    for node in m.findall(method, m.Return()):
        value = cst.ensure_type(node, cst.Return).value
        if isinstance(value, cst.Name) and value.value == name and isinstance(target, cst.Name):
            return target.value
        if isinstance(value, (cst.Tuple, cst.List)) and isinstance(target, (cst.Tuple, cst.List)):
            returned = [dotted(e.value) for e in value.elements]
            bound = [dotted(e.value) for e in target.elements]
            if name in returned and len(returned) == len(bound):
                return bound[returned.index(name)]
    return None


def _before(trainer: Trainer, a: cst.CSTNode, b: cst.CSTNode) -> bool:
    return trainer.order(a) < trainer.order(b)


def _assigned(node: cst.Assign | cst.AnnAssign) -> list[str | None]:
    """The dotted names an assignment binds (`a = b = ...`: both)."""
    if isinstance(node, cst.AnnAssign):
        return [dotted(node.target)]
    return [dotted(t.target) for t in node.targets]


def _bound_value(node: cst.Assign | cst.AnnAssign, name: str) -> cst.BaseExpression | None:
    """The value an assignment binds to `name`: `name = v`, or v of `name, other = v, w`; None if it binds none."""
    if _assigned(node) == [name]:
        return node.value
    target = node.targets[0].target if isinstance(node, cst.Assign) and len(node.targets) == 1 else None
    if isinstance(target, cst.Tuple) and isinstance(node.value, cst.Tuple):
        names = [dotted(e.value) for e in target.elements]
        if name in names and len(names) == len(node.value.elements):
            return node.value.elements[names.index(name)].value
    return None


def _is_sum(call: cst.Call) -> bool:
    """Whether a call adds everything up: `x.sum()` or `torch.sum(x)`."""
    if isinstance(call.func, cst.Attribute) and call.func.attr.value == "sum" and not call.args:
        return True
    return call_name(call) == "torch.sum" and len(call.args) == 1


class _Indexer(cst.CSTVisitor):
    """Records every node in source order and each node's parent."""

    def __init__(
        self, parents: dict[int, cst.CSTNode], nodes: list[cst.CSTNode], spans: dict[int, tuple[int, int]]
    ) -> None:
        super().__init__()
        self.parents, self.nodes, self.spans = parents, nodes, spans
        self.stack: list[tuple[cst.CSTNode, int]] = []

    def on_visit(self, node: cst.CSTNode) -> bool:
        if self.stack:
            self.parents[id(node)] = self.stack[-1][0]
        self.stack.append((node, len(self.nodes)))
        self.nodes.append(node)
        return True

    def on_leave(self, original_node: cst.CSTNode) -> None:
        node, first = self.stack.pop()
        self.spans[id(node)] = (first, len(self.nodes))


# -----------------------------------------------------------------------------
# Edits


@dataclass
class Edits:
    """Replacements and insertions keyed by original nodes, applied in one pass; then new knobs and knob values."""

    trainer: Trainer
    replace: dict[int, Callable[[cst.CSTNode], cst.CSTNode]] = field(default_factory=dict)
    before: dict[int, list[cst.BaseStatement]] = field(default_factory=dict)
    after: dict[int, list[cst.BaseStatement]] = field(default_factory=dict)
    new_knobs: list[tuple[str, Any, str]] = field(default_factory=list)
    set_knobs: dict[str, Any] = field(default_factory=dict)
    # insertions into nn.Sequential(...) calls and list displays; statements beside one of a line's `a; b` statements
    sequential: dict[int, list[tuple[int, bool, str]]] = field(default_factory=dict)
    small: dict[int, tuple[list[cst.BaseSmallStatement], list[cst.BaseSmallStatement]]] = field(default_factory=dict)
    helpers: list[cst.BaseStatement] = field(default_factory=list)  # module-level helpers, placed by `apply`

    def sub(self, node: cst.CSTNode, new: cst.CSTNode | Callable[[Any], cst.CSTNode]) -> None:
        """Replace `node` (with a node, or a function of its already-edited version)."""
        previous = self.replace.get(id(node))
        fn = new if callable(new) else (lambda _old, _new=new: _new)
        self.replace[id(node)] = fn if previous is None else (lambda old, _p=previous, _f=fn: _f(_p(old)))

    def insert_before(self, anchor: cst.CSTNode, *lines: str | cst.BaseStatement) -> None:
        """Statements before `anchor` (a statement), in its block."""
        self.before.setdefault(id(anchor), []).extend(_stmts(lines))

    def insert_after(self, anchor: cst.CSTNode, *lines: str | cst.BaseStatement) -> None:
        """Statements after `anchor` (a statement), in its block."""
        self.after.setdefault(id(anchor), []).extend(_stmts(lines))

    def beside_optimizer(self, *lines: str | cst.BaseStatement) -> None:
        """Statements at the trainer's `state_site()`: after the optimizer's line, or before an HF-style Trainer's
        epoch loop."""
        site = self.trainer.state_site()
        if site is self.trainer.optimizer_statement():
            self.insert_after(site, *lines)
        else:
            self.insert_before(site, *lines)

    def insert_small(self, anchor: cst.BaseSmallStatement, text: str, before: bool = False) -> None:
        """A statement right before or after one statement of a line: a line of its own where the line holds only
        `anchor`, else joined by `;` next to it (`a.append(x); a.append(y); w = h` keeps its order)."""
        line = self.trainer.parent(anchor)
        if isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1:
            (self.insert_before if before else self.insert_after)(line, text)
            return
        new = (
            cst.ensure_type(statement(text), cst.SimpleStatementLine)
            .body[0]
            .with_changes(semicolon=cst.MaybeSentinel.DEFAULT)
        )
        pending = self.small.get(id(anchor))
        if pending is None:
            pending = self.small[id(anchor)] = ([], [])
            self.sub(anchor, lambda updated, _p=pending: cst.FlattenSentinel([*_p[0], updated, *_p[1]]))
        pending[0 if before else 1].append(new)

    def helper(self, text: str) -> None:
        """A module-level helper (function or class); `apply` places it (see `_place_helpers`)."""
        body = cst.parse_module(text.strip() + "\n").body
        self.helpers.extend([body[0].with_changes(leading_lines=[cst.EmptyLine()] * 2), *body[1:]])

    def thread(self, name: str, what: str, bound: cst.CSTNode) -> None:
        """Hand `name` (`what`, which the transform binds at `bound`, beside the epoch loop) to the function the epoch
        loop calls to run the batch loop (`train_one_epoch(...)`): a parameter `name=None` last in its signature,
        passed by keyword at the epoch loop's call. Nothing where the loops are nested. NotApplicable where the epoch
        loop calls it through another function (two calls deep), it already binds `name`, the trainer calls it
        elsewhere too (the lines added to its batch loop would find None there), or `bound` is in another function
        than the call."""
        trainer = self.trainer
        function = trainer.batch_in_call()
        if function is None:
            return
        called, site = function.name.value, trainer.batch_site()
        calls = trainer.calls_of(function)
        at_site = [c for c in calls if trainer.inside(c, site)]
        if not at_site:
            through = next(
                (n for c in trainer.calls(within=site) if trainer.defined(n := call_name(c) or "", top_level=True)),
                "another function",
            )
            raise NotApplicable(
                f"the batch loop runs in `{called}()`, which the epoch loop calls through `{through}()` (two calls "
                f"deep): {what} built beside the epoch loop would have to pass through both (a parameter is added "
                "only to the function the epoch loop calls itself)"
            )
        head = f"the batch loop runs in `{called}()`, called from the epoch loop"
        if trainer._binds(function, name):
            raise NotApplicable(f"{head}: `{called}()` already binds `{name}`, the parameter that would hand it {what}")
        others = [c for c in calls if not trainer.inside(c, site)]
        if others:
            raise NotApplicable(
                f"{head} and from `{code(trainer.statement_of(others[0])).strip()}` too: {what}, handed to it by a "
                "new parameter, would be None there, where the lines added to its batch loop need it"
            )
        scope = enclosing_function(trainer, bound)
        if scope is not None and any(enclosing_function(trainer, c) is not scope for c in at_site):
            raise NotApplicable(f"{head}: {what} would be built in `{scope.name.value}()`, apart from that call")
        self.sub(function.params, lambda params: _with_parameter(cst.ensure_type(params, cst.Parameters), name))
        for call in at_site:
            self.sub(call, lambda edited: with_kwarg(cst.ensure_type(edited, cst.Call), name, name))

    def _place_helpers(self) -> None:
        """Helpers go before the first top-level statement that holds the training or any edit: in a flat script an
        edit can run at module level before the epoch loop (SelfModel(net) after the optimizer: a NameError when
        the class came after it), in a main() every edit sits in the same top-level statement as the loop."""
        if not self.helpers:
            return
        by_id = {id(n): n for n in self.trainer.nodes}
        touched = [by_id[key] for edits in (self.replace, self.before, self.after, self.sequential) for key in edits]
        try:
            training: cst.CSTNode = self.trainer.epoch_loop()
        except NotApplicable:  # one pass of the batch loop (flip_tta, an augmentation need no epoch loop)
            training = self.trainer.batch_loop()
        tops = [self.trainer.top_statement(n) for n in [training, *touched]]
        anchor = min(tops, key=self.trainer.order)
        self.before[id(anchor)] = [*self.helpers, *self.before.get(id(anchor), [])]
        self.helpers = []

    def knob(self, name: str, value: Any, comment: str) -> None:
        """A new knob at the end of the trainer's knob block."""
        if name in self.trainer.knobs():
            raise NotApplicable(f"the trainer already has a knob {name}")
        self.new_knobs.append((name, value, comment))

    def apply(self) -> str:
        """The edited source (checked to parse, knobs still module-level literals); `Found` in a dry run."""
        if not (self.replace or self.before or self.after or self.helpers or self.new_knobs or self.set_knobs):
            raise NotApplicable("the edit changes nothing")
        # placing the helpers and finding the knob block can refuse: a dry run does both before it answers Found,
        # so check() fails exactly where apply() does (only the rendering is skipped)
        self._place_helpers()
        module_file = self.trainer.model_class is not None  # a models.py gets a block after its imports
        if self.new_knobs and not module_file and not any(_is_knob(s) for s in self.trainer.module.body):
            raise NotApplicable("the trainer has no knob block (UPPER_CASE constants) to add a knob to")
        if _DRY_RUN.get():
            raise Found
        module = self.trainer.module.visit(_Apply(self))
        if self.new_knobs:
            module = _add_knobs(module, self.new_knobs, module_file)
        result = module.code
        if self.set_knobs:
            from ralph_ray.knobs import rewrite_knobs

            result = rewrite_knobs(result, self.set_knobs)
        if result == self.trainer.source:
            raise NotApplicable("the edit changes nothing")
        try:
            parse(result)  # the engine's locked parse: children are written in a thread pool
        except SyntaxError as error:  # a transform bug, but the coder reports it as a reason, not a crash
            raise NotApplicable(f"the edit does not fit this trainer (line {error.lineno}: {error.msg})") from error
        return result


def _stmts(lines: tuple[str | cst.BaseStatement, ...]) -> list[cst.BaseStatement]:
    return [statement(line) if isinstance(line, str) else line for line in lines]


def _with_parameter(params: cst.Parameters, name: str) -> cst.Parameters:
    """A signature with `name=None` added last: a default, so that other callers keep working; keyword-only after
    `*args` or `*` (before them, a caller's extra positional arguments would fill it)."""
    equal = cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace(""))
    new = cst.Param(cst.Name(name), default=cst.Name("None"), equal=equal)
    if isinstance(params.star_arg, (cst.Param, cst.ParamStar)):
        return params.with_changes(kwonly_params=[*params.kwonly_params, new])
    return params.with_changes(params=[*params.params, new])


class _Apply(cst.CSTTransformer):
    def __init__(self, edits: Edits) -> None:
        super().__init__()
        self.edits = edits

    def on_leave(self, original_node: cst.CSTNode, updated_node: cst.CSTNode) -> Any:
        key = id(original_node)
        if key in self.edits.replace:
            updated_node = self.edits.replace[key](updated_node)
        before, after = self.edits.before.get(key, []), self.edits.after.get(key, [])
        if before or after:
            helper = bool(before) and isinstance(before[0], (cst.FunctionDef, cst.ClassDef))
            if before and not helper and isinstance(updated_node, (cst.SimpleStatementLine, cst.BaseCompoundStatement)):
                # comments above the anchor stay above the first inserted line
                first = before[0].with_changes(leading_lines=[*updated_node.leading_lines, *before[0].leading_lines])
                updated_node = updated_node.with_changes(leading_lines=[])
                before = [first, *before[1:]]
            # (a helper goes above the anchor's banner comment, at the end of the section before it)
            return cst.FlattenSentinel([*before, updated_node, *after])
        return updated_node


def _is_knob(stmt: cst.CSTNode) -> bool:
    """A knob line by the engine's one rule (`ralph_ray.knobs.is_knob`), so the transforms and the knob search
    agree on what the knob block is."""
    if not isinstance(stmt, cst.SimpleStatementLine):
        return False
    tree = parse(code(stmt.with_changes(leading_lines=[])))
    return len(tree.body) == 1 and is_knob(tree.body[0])


def _add_knobs(module: cst.Module, knobs: list[tuple[str, Any, str]], module_file: bool = False) -> cst.Module:
    """Insert knob lines after the last knob of the first run of knobs (a blank line or code ends the run); in a
    module without knobs that train.py imports its model from (`module_file`), as a block after its imports."""
    body = list(module.body)
    first = next((i for i, s in enumerate(body) if _is_knob(s)), None)
    lines = [statement(f"{name} = {value!r}  # {comment}") for name, value, comment in knobs]
    if first is None and module_file:
        at = next((i for i, s in enumerate(body) if not _is_import(s)), len(body))
        lines[0] = lines[0].with_changes(leading_lines=[cst.EmptyLine()])
        return module.with_changes(body=[*body[:at], *lines, *body[at:]])
    if first is None:
        raise NotApplicable("the trainer has no knob block (UPPER_CASE constants) to add a knob to")
    end = first
    for i in range(first + 1, len(body)):
        blank = any(line.comment is None for line in body[i].leading_lines)
        if not _is_knob(body[i]) or blank:
            break
        end = i
    return module.with_changes(body=[*body[: end + 1], *lines, *body[end + 1 :]])


def _is_import(stmt: cst.CSTNode) -> bool:
    """A line of imports (or the module's docstring, which comes before them)."""
    if not isinstance(stmt, cst.SimpleStatementLine):
        return False
    return all(
        isinstance(s, (cst.Import, cst.ImportFrom))
        or (isinstance(s, cst.Expr) and isinstance(s.value, (cst.SimpleString, cst.ConcatenatedString)))
        for s in stmt.body
    )


# -----------------------------------------------------------------------------
# Layers


def layer_size(call: cst.Call, index: int, keyword: str) -> cst.BaseExpression | None:
    """A layer's size argument: positional `index`, or `keyword=` (in_features/out_channels ...)."""
    args = positional(call)
    if len(args) > index:
        return args[index].value
    arg = kwarg(call, keyword)
    return arg.value if arg is not None else None


def size_code(layer: Layer, which: str) -> str:
    """The source of a layer's input (`which="in"`) or output size expression."""
    index = 0 if which == "in" else 1
    keyword = {
        ("conv", "in"): "in_channels",
        ("conv", "out"): "out_channels",
        ("linear", "in"): "in_features",
        ("linear", "out"): "out_features",
    }[(layer.kind, which)]
    value = layer_size(layer.call, index, keyword)
    if value is None:
        raise NotApplicable(f"cannot read the {which} size of `{code(layer.call)}`")
    return code(value)


def classifier(layers: list[Layer]) -> Layer:
    """The final nn.Linear (the classifier head)."""
    linears = [layer for layer in layers if layer.kind == "linear"]
    if not linears:
        raise NotApplicable("the model has no nn.Linear classifier")
    head = linears[-1]
    if head.listed is not None and head.listed.repeated:
        raise NotApplicable(
            f"the last nn.Linear (`{code(head.call)}`) is added to `{head.listed.name}` in a loop: the same line "
            "builds hidden layers and the output layer"
        )
    return head


def insert_beside(edits: Edits, layer: Layer, text: str, before: bool = False) -> bool:
    """Put the module `text` right after (or before) a layer where the model is assembled: an element of its
    nn.Sequential(...) or of the list display it joins, `layers.append(text)` next to its `layers.append(...)`, or
    `nn.Sequential(layer, text)` in place of an nn.ModuleList's layer.
    False for a layer bound to an attribute: the caller wires it into the forward pass."""
    if layer.sequential is not None:
        _insert_element(edits, layer.sequential, layer.call, text, before)
    elif layer.listed is not None and layer.listed.module_list:
        pair = "{text}, {old}" if before else "{old}, {text}"
        edits.sub(
            layer.call,
            lambda old: expression(f"torch.nn.Sequential({pair.format(text=text, old=code(old))})"),
        )
    elif layer.listed is not None and layer.listed.display is not None:
        _insert_element(edits, layer.listed.display, layer.call, text, before)
    elif layer.listed is not None:
        edits.insert_small(layer.listed.adds, f"{layer.listed.name}.append({text})", before)
    else:
        return False
    return True


def _insert_element(
    edits: Edits, container: cst.Call | cst.List, element: cst.Call, text: str, before: bool = False
) -> None:
    """Insert the expression `text` as an element of an nn.Sequential(...) call or a list display, next to `element`."""
    items = container.args if isinstance(container, cst.Call) else container.elements
    index = next(i for i, a in enumerate(items) if a.value is element)
    pending = edits.sequential.setdefault(id(container), [])
    if not pending:  # one replacement per container applies all its insertions, from the last position back
        edits.sub(container, lambda updated: _insert_elements(updated, pending))
    pending.append((index, before, text))


def _insert_elements(container: cst.Call | cst.List, inserts: list[tuple[int, bool, str]]) -> cst.Call | cst.List:
    call = isinstance(container, cst.Call)
    items: list[Any] = list(container.args if call else container.elements)
    for index, before, text in sorted(inserts, key=lambda item: (item[0], not item[1]), reverse=True):
        anchor = items[index]
        # the new element's comma carries the line break and indent to the next element: copy a neighbour's
        neighbour = items[index - 1] if before and index > 0 else anchor
        comma = (
            neighbour.comma
            if isinstance(neighbour.comma, cst.Comma)
            else cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
        )
        new = (cst.Arg if call else cst.Element)(value=expression(text), comma=comma)
        if not before and not isinstance(anchor.comma, cst.Comma):
            items[index] = anchor.with_changes(comma=comma)
            new = new.with_changes(comma=cst.MaybeSentinel.DEFAULT)
        items.insert(index if before else index + 1, new)
    return container.with_changes(**{"args" if call else "elements": items})


def attribute_calls(trainer: Trainer, attribute: str) -> list[cst.Call]:
    """Calls `self.<attribute>(x)` (a layer used in forward)."""
    return [c for c in trainer.calls() if call_name(c) == f"self.{attribute}" and positional(c)]


def wrap_first_arg(edits: Edits, call: cst.Call, template: str) -> None:
    """Replace a call's first positional argument X by `template` with `{}` standing for X."""
    arg = positional(call)[0]
    edits.sub(arg.value, lambda old: expression(template.format(code(old))))


def free_name(trainer: Trainer, name: str) -> str:
    """`name`, or `name_2`... if the source already uses it."""
    candidate, n = name, 1
    while re.search(rf"\b{candidate}\b", trainer.source):
        n += 1
        candidate = f"{name}_{n}"
    return candidate
