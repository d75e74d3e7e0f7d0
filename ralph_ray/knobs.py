"""Read and rewrite a trainer's knobs: module-level UPPER_CASE constants with literal values."""

from __future__ import annotations

import ast
import math
import threading
from collections.abc import Container, Mapping
from dataclasses import dataclass
from typing import Any, TypeGuard, cast

# Names a trainer may give a catalog knob (the knob moves and the transforms look a knob up under these too).
KNOB_ALIASES = {
    "LR": ("LEARNING_RATE", "BASE_LR"),
    "EPOCHS": ("NUM_EPOCHS", "N_EPOCHS", "MAX_EPOCHS"),
    "BATCH_SIZE": ("BATCH", "BS"),
    # a transformer's width: its embedding size (doubling keeps it a multiple of any head count)
    "WIDTH": ("HIDDEN", "HIDDEN_SIZE", "CHANNELS", "EMBED_DIM", "D_MODEL", "HIDDEN_DIM"),
    "DEPTH": ("N_LAYERS", "NUM_LAYERS", "N_BLOCKS", "NUM_BLOCKS"),
    "WEIGHT_DECAY": ("WD",),
}


def epochs_knob(knobs: Mapping[str, Any], searched: Container[str] = ()) -> str | None:
    """The trainer's epochs knob: the first of EPOCHS and its aliases that is `searched` or a whole-number literal."""
    for name in ("EPOCHS", *KNOB_ALIASES["EPOCHS"]):
        value = knobs.get(name)
        if name in searched or (isinstance(value, int) and not isinstance(value, bool)):
            return name
    return None


# CPython 3.11's AST constructor is not thread-safe ("AST constructor recursion depth mismatch" when two
# threads parse at once), and children are written and gated in a thread pool: every parse goes through here.
_PARSE_LOCK = threading.Lock()


def parse(source: str, filename: str = "<unknown>") -> ast.Module:
    """ast.parse, serialised across threads."""
    with _PARSE_LOCK:
        return ast.parse(source, filename=filename)  # noqa: TID251 (the one place that parses)


def literal_eval(value: str | ast.AST) -> Any:
    """ast.literal_eval, whose parse of a string goes through the same lock."""
    if isinstance(value, str):
        with _PARSE_LOCK:
            value = ast.parse(value.lstrip(" \t"), mode="eval")  # noqa: TID251 (as literal_eval parses it)
    return ast.literal_eval(value)  # noqa: TID251 (a tree: no parse)


class KnobError(ValueError):
    """A knob that is absent, not a literal, or given a value of the wrong kind."""


def read_knobs(source: str) -> dict[str, Any]:
    """The trainer's knobs and their literal values, in file order."""
    return {name: literal_eval(node.value) for name, node in _knob_nodes(source).items()}


def rewrite_knobs(source: str, overrides: dict[str, Any]) -> str:
    """Replace the values of the named knobs in place, keeping comments and layout."""
    nodes = _knob_nodes(source)
    unknown = sorted(set(overrides) - set(nodes))
    if unknown:
        raise KnobError(f"no module-level knob named {', '.join(unknown)} (knobs: {', '.join(nodes) or 'none'})")
    lines = source.splitlines(keepends=True)
    # Edit from the bottom up so earlier offsets stay valid.
    for name in sorted(overrides, key=lambda n: nodes[n].value.lineno, reverse=True):
        value = nodes[name].value
        if value.lineno != value.end_lineno:
            raise KnobError(f"knob {name} spans several lines; keep knob values on one line")
        text = _literal(name, _as_written(value, overrides[name]))
        line = lines[value.lineno - 1]
        start, end = _char_offset(line, value.col_offset), _char_offset(line, value.end_col_offset)  # type: ignore[arg-type]
        lines[value.lineno - 1] = line[:start] + text + line[end:]
    result = "".join(lines)
    parse(result)  # the rewrite must keep the file valid
    return result


def with_knobs(source: str, knobs: dict[str, Any]) -> str:
    """The source as a trial with `knobs` runs it: those it has written in (a value it cannot take: left as it is)."""
    present = read_knobs(source)
    try:
        return rewrite_knobs(source, {k: v for k, v in knobs.items() if k in present})
    except KnobError:
        return source


def is_knob_name(name: str) -> bool:
    """A knob's name: an UPPER_CASE identifier (`LR`, `EPOCHS`, `WIDTH_2`)."""
    return name.isidentifier() and name.isupper()


def is_knob(node: ast.stmt) -> TypeGuard[ast.Assign]:
    """The one rule for what a knob is: a module-level `NAME = <literal>` whose name is UPPER_CASE."""
    if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)):
        return False
    return is_knob_name(node.targets[0].id) and is_literal(node.value)


def knob_nodes(tree: ast.Module) -> dict[str, ast.Assign]:
    """The knob statements of a parsed module by name, in file order."""
    return {cast(ast.Name, node.targets[0]).id: node for node in tree.body if is_knob(node)}


def near_knobs(tree: ast.Module) -> dict[str, ast.Assign | ast.AnnAssign]:
    """Module-level assignments to an UPPER_CASE name that `is_knob` refuses, by name (the first): a computed value
    (`HIDDEN = CFG["hidden"]`) or an annotated one (`LR: float = 1e-3`); what a search cannot set, though the name is
    defined."""
    found: dict[str, ast.Assign | ast.AnnAssign] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target: ast.expr = node.targets[0]
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            target = node.target
        else:
            continue
        if isinstance(target, ast.Name) and is_knob_name(target.id) and not is_knob(node):
            found.setdefault(target.id, node)
    return found


def _knob_nodes(source: str) -> dict[str, ast.Assign]:
    return knob_nodes(parse(source))


def is_literal(node: ast.expr) -> bool:
    """Whether an expression is a literal value (`1e-3`, `-0.5`, `(64, 32)`), which a search can write over."""
    try:
        literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False
    return True


def _as_written(node: ast.expr, value: Any) -> Any:
    """A list or tuple value in the container the trainer wrote (`HIDDEN = (128, 64)` stays a tuple): a list where the
    trainer has a tuple breaks a dataclass field that defaults to it ("mutable default ... is not allowed")."""
    if isinstance(value, (list, tuple)):
        if isinstance(node, ast.Tuple):
            return tuple(value)
        if isinstance(node, ast.List):
            return list(value)
    return value


def _literal(name: str, value: Any) -> str:
    """A Python literal for a sampled value; numpy scalars become plain numbers."""
    if hasattr(value, "item"):
        value = value.item()
    if not isinstance(value, (bool, int, float, str, tuple, list)) and value is not None:
        raise KnobError(f"knob {name}: cannot write a {type(value).__name__} as a literal")
    text = repr(value)
    literal_eval(text)
    return text


def _char_offset(line: str, byte_offset: int) -> int:
    """ast column offsets count UTF-8 bytes; convert to a str index."""
    return len(line.encode("utf-8")[:byte_offset].decode("utf-8"))


@dataclass(frozen=True)
class Bounds:
    """The space a relatively searched knob was declared in (search.space): [low, high], or its numeric choices."""

    low: float
    high: float
    integer: bool = False  # an int range: whole numbers only
    choices: tuple[float, ...] = ()
    log: bool = False  # a loguniform range
    span: float = 2.0  # the factors' range, [1/span, span] (search.relative_span)

    def whole_for(self, base: float) -> bool:
        """Whether an int knob stays an int here: its range is whole numbers (EPOCHS = 10 over [5, 20]); GAMMA = 1
        over [0.3, 0.9] takes the fractions it is searched over. Scaling and reading back a factor use the same."""
        return isinstance(base, int) and float(self.low).is_integer() and float(self.high).is_integer()

    def bound(self, value: float, integer: bool = False) -> Any:
        """`value` in the declared space: clipped to [low, high] (rounded where `integer`), or its nearest choice."""
        if self.choices:
            if value <= 0:  # below every choice (they are positive: search.relative_knobs)
                return min(self.choices)
            # Nearest by ratio (log distance), as the factors are ratios and numeric choices mostly geometric
            # (16/32/64, 1e-4/1e-3/1e-2): 23 lies nearer 32 than 16 by ratio; by difference it would snap to 16.
            return min(self.choices, key=lambda choice: abs(math.log(value / choice)))
        clipped = min(max(float(value), self.low), self.high)
        low, high = math.ceil(self.low), math.floor(self.high)
        if (integer or self.integer) and low <= high:
            return min(max(int(round(clipped)), low), high)
        return clipped

    def scaled(self, base: float, factor: float, integer: bool = False) -> Any:
        """The value a trial trains for `factor` on a variant's own value `base`.

        A base that factors cannot move (0: DROPOUT = 0.0 trained 0.0 for ever; one outside the space: every factor
        clipped to the same bound) is searched over the whole space instead, the factor read as a place in it
        (`outright`); factor 1, the variant as its coder wrote it, still trains `base` (held in the space).
        """
        value = float(base) * factor
        if factor == 1.0:
            return self.bound(value, integer)
        if not self.moves(base, integer):
            return self.outright(factor, integer)
        # A factor past a range's bound is reflected back inside (by ratio, as the factors are ratios): clipped, half
        # the samples of a variant at a bound trained that bound, its own value again (choices snap, as documented).
        if self.choices:
            pass
        elif value > self.high and value * self.high > 0:
            value = self.high * self.high / value
        elif value < self.low and value * self.low > 0:
            value = self.low * self.low / value
        return self.bound(value, integer)

    def moves(self, base: float, integer: bool = False) -> bool:
        """Whether factors on `base` reach other values of the space: not for 0, nor for a base outside the space."""
        if self.choices:
            return base in self.choices
        if base == 0 or not self.low <= base <= self.high:
            return False
        return any(self.bound(base * f, integer) != self.bound(base, integer) for f in (self.span, 1 / self.span))

    def outright(self, factor: float, integer: bool = False) -> Any:
        """A factor of [1/span, span] as the value at the same place of the whole space (on a log scale for a
        loguniform range, in order for choices): a search over the declared space for a base factors cannot move."""
        if self.choices:  # the factors are the ratios of the choices to the middle one (search.param_space)
            ordered = sorted(self.choices)
            return self.bound(factor * ordered[len(ordered) // 2])
        share = min(max((math.log(max(factor, 1e-300)) / math.log(self.span) + 1) / 2, 0.0), 1.0)
        whole = integer or self.integer
        low, high = (self.low - 0.5, self.high + 0.5) if whole else (self.low, self.high)  # each int equally often
        if self.log:
            return self.bound(math.exp(math.log(self.low) + share * math.log(self.high / self.low)), integer)
        return self.bound(low + share * (high - low), integer)

    def factor_of(self, base: float, value: float, integer: bool = False) -> float:
        """The factor that gives `value` for `base` (`scaled`'s inverse where it has one): a recorded trial as its
        study's parameter when a resumed campaign rebuilds the study."""
        if self.moves(base, integer) or value == base:
            return float(value) / float(base) if base else 1.0
        if self.choices:
            ordered = sorted(self.choices)
            return float(value) / ordered[len(ordered) // 2]
        if self.log:
            share = math.log(value / self.low) / math.log(self.high / self.low)
        else:
            share = (value - self.low) / (self.high - self.low)
        return float(self.span ** (2 * min(max(share, 0.0), 1.0) - 1))


def resolve_knobs(config: dict[str, Any], own: dict[str, Any], relative: Mapping[str, Bounds]) -> dict[str, Any]:
    """The knob values a trial runs: sampled values as they are, and for `relative` knobs the sample is a factor
    on the variant's own value, so an agent's knob change is searched around, not undone.

    The factors compound over generations (a child's own value is its parent's sampled one), so each value is
    kept in the space its knob was declared in (`relative[name]`); a value factors cannot move (0, or outside that
    space) is searched over the whole space (`Bounds.scaled`).
    """
    knobs: dict[str, Any] = {}
    for name, value in config.items():
        if not is_knob_name(name):
            continue
        base = own.get(name)
        bounds = relative.get(name)
        if bounds is not None and isinstance(base, (int, float)) and not isinstance(base, bool):
            knobs[name] = bounds.scaled(base, float(value), integer=bounds.whole_for(base))
        else:
            knobs[name] = value
    return knobs


def reported_metrics(source: str) -> set[str] | None:
    """The metric names a trainer passes to `report(...)` (harness.report, however imported) as keywords (none where
    it calls report nowhere); None where one call passes `**metrics` (the names are only known at run time)."""
    names: set[str] = set()
    for node in ast.walk(parse(source)):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
            if name != "report":
                continue
            if any(keyword.arg is None for keyword in node.keywords):
                return None
            names.update(keyword.arg for keyword in node.keywords if keyword.arg)
    return names
