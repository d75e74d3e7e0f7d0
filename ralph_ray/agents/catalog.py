"""The intervention catalog: named knob and code edits, loaded from `agents/interventions.yaml`.

The catalog is data, not code: each entry says which diagnoses it answers, how it moves knobs, which
knobs it adds, and which code transform (`ralph_ray.agents.transforms`, over the syntax tree) or regex
edits it makes to `train.py`. `apply` turns one entry into edited source, or raises `NotApplicable` with
the reason when the trainer lacks what the entry needs or already has it; `apply_files` does it over a variant's
files, where a layer transform reaches a model class train.py imports from a module of the folder (`models.py`, or
`src/mylab/model.py` where train.py puts `src` on sys.path).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import posixpath
import re
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import libcst as cst
import yaml

from ralph_ray import PROJECT_ROOT
from ralph_ray.agents.base import Diagnosis
from ralph_ray.agents.transforms import (
    MODEL_LIBRARIES,
    TRANSFORMS,
    NotApplicable,
    analyse,
    apply_transform,
    check_transform,
    model_module,
    model_source,
)
from ralph_ray.agents.transforms._tree import Trainer, assign_target, assign_value, call_name, positional
from ralph_ray.knobs import (
    KNOB_ALIASES,
    KnobError,
    is_knob_name,
    knob_nodes,
    literal_eval,
    parse,
    read_knobs,
    rewrite_knobs,
)

CATALOG_PATH = PROJECT_ROOT / "agents" / "interventions.yaml"
TRAINER = "train.py"
# The transforms that edit only the model's layers: where train.py imports its model's class from a module of the
# variant's folder (`from models import Net`, models.py beside it or in a folder train.py puts on sys.path), they
# edit the class there (`apply_files`).
MODEL_TRANSFORMS = frozenset({"batchnorm", "add_dropout", "deepen", "widen_layers"})

KNOB_OPS = ("set", "mul", "add")
_ENTRY_FIELDS = {
    "name",
    "description",
    "answers",
    "repeatable",
    "prior",
    "applies_if",
    "skip_if",
    "knobs",
    "add_knobs",
    "edits",
    "transform",
    "needs_gpu",
    "mirrors_images",
    "needs_images",
}
_ENTRY_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
Fail = Callable[[str, str], ValueError]  # builds the error for (field, message) of the entry being read
# The knobs the campaign's search samples (search.space), by the trainer's own name: for each, what a child's trials
# train for its own value of that knob (space.trained_value: held in the declared space).
Searched = Mapping[str, Callable[[Any], Any]]


@dataclass(frozen=True)
class KnobEdit:
    """Move one existing knob: `set` a value, `mul`tiply or `add` to it, then clamp to [min, max]."""

    knob: str
    op: str
    value: Any
    min: float | None = None
    max: float | None = None

    def new_value(self, current: Any, named: str | None = None) -> Any:
        """The knob's value after this edit (`named`: the trainer's own name for it); integers stay integers."""
        if self.op == "set":
            return self.value
        if isinstance(current, bool) or not isinstance(current, (int, float)):
            shown = self.knob if named in (None, self.knob) else f"{named} (the catalog's {self.knob})"
            raise NotApplicable(f"knob {shown} is {current!r}, not a number to {self.op}")
        target = current * self.value if self.op == "mul" else current + self.value
        low = self.min if self.min is not None else -math.inf
        high = self.max if self.max is not None else math.inf
        value = min(max(target, low), high)
        # A clamp limits the move, never reverses it: raise_lr must not lower an LR already above its max.
        rising = self.value > 1 if self.op == "mul" else self.value > 0
        value = max(value, current) if rising else min(value, current)
        if self._keeps_int(current):
            return round(value)
        return float(f"{value:.6g}")  # 0.1 * 3 should read 0.3 in the diff, not 0.30000000000000004

    def _keeps_int(self, current: Any) -> bool:
        """Counts (EPOCHS, WIDTH) stay integers; a float step or clamp makes the result a float."""
        clamps_int = all(bound is None or isinstance(bound, int) for bound in (self.min, self.max))
        step_int = self.op == "mul" or isinstance(self.value, int)
        return isinstance(current, int) and step_int and clamps_int


@dataclass(frozen=True)
class NewKnob:
    """A knob line to insert at the end of the trainer's knob block."""

    name: str
    value: Any
    comment: str

    def line(self) -> str:
        """The source line, in the trainer's knob style."""
        return f"{self.name} = {self.value!r}  # {self.comment}\n"


@dataclass(frozen=True)
class TextEdit:
    """A regex substitution on the source (re.MULTILINE, every match); `when`/`unless` gate it on other code."""

    find: str
    replace: str
    when: str | None = None  # run only if this regex matches (adapts to interventions applied before)
    unless: str | None = None  # skip if this regex matches (e.g. a helper another entry already added)


@dataclass(frozen=True)
class Intervention:
    """One catalog entry."""

    name: str
    description: str
    answers: tuple[Diagnosis, ...]
    repeatable: bool = False
    prior: float = 0.0  # expected score delta before the knowledge base has measured it
    applies_if: tuple[str, ...] = ()
    skip_if: tuple[str, ...] = ()
    knobs: tuple[KnobEdit, ...] = ()
    add_knobs: tuple[NewKnob, ...] = ()
    edits: tuple[TextEdit, ...] = ()
    transform: str | None = None  # a registered syntax-tree transform, applied after the knob and text edits
    needs_gpu: bool = False  # only changes anything on a GPU (autocast, channels-last): not proposed for CPU trials
    mirrors_images: bool = False  # trains on mirrored inputs: not proposed where task.mirror_invariant is false
    needs_images: bool = False  # shifts, mirrors or lays out images: not proposed where task.images is false

    @property
    def changes_code(self) -> bool:
        """Whether it edits the trainer beyond moving existing knobs (a transform, a text edit or a new knob)."""
        return bool(self.transform or self.edits or self.add_knobs)

    def unsuited_to(self, images: bool | None, mirror_invariant: bool) -> str | None:
        """Why the task rules this out whatever the code says (task.images, task.mirror_invariant), or None: the one
        rule the analysts, the LLM's catalog and the final training's additions all follow."""
        if self.needs_images and images is False:
            return "the task's inputs are not images (task.images)"
        if self.mirrors_images and not mirror_invariant:
            return "the task says mirroring changes an input's label (task.mirror_invariant)"
        return None


@dataclass(frozen=True)
class Catalog:
    """All interventions, in file order."""

    interventions: tuple[Intervention, ...]
    path: Path

    def __iter__(self) -> Iterator[Intervention]:
        """The entries, in file order."""
        return iter(self.interventions)

    def __len__(self) -> int:
        """How many entries."""
        return len(self.interventions)

    def names(self) -> list[str]:
        """Intervention names, in file order."""
        return [i.name for i in self.interventions]

    def get(self, name: str) -> Intervention:
        """The entry called `name`; KeyError naming the known ones otherwise."""
        for intervention in self.interventions:
            if intervention.name == name:
                return intervention
        raise KeyError(f"no intervention {name!r} in {self.path} (known: {', '.join(self.names())})")


# -----------------------------------------------------------------------------
# Loading and validation


def load_catalog(path: Path | str | None = None) -> Catalog:
    """Load and validate the catalog (default: `agents/interventions.yaml`)."""
    path = Path(path) if path is not None else CATALOG_PATH
    try:
        document = yaml.safe_load(path.read_text())
    except yaml.YAMLError as error:
        raise ValueError(f"{path}: not valid YAML: {error}") from error
    if not isinstance(document, dict) or not isinstance(document.get("interventions"), list):
        raise ValueError(f"{path}: expected a mapping with an `interventions:` list")
    entries = [_parse_entry(path, index, raw) for index, raw in enumerate(document["interventions"])]
    seen: set[str] = set()
    for entry in entries:
        if entry.name in seen:
            raise ValueError(f"{path}: intervention {entry.name!r} is defined twice")
        seen.add(entry.name)
    return Catalog(tuple(entries), path)


def _parse_entry(path: Path, index: int, raw: Any) -> Intervention:
    label = f"{path}: entry {index}"
    if not isinstance(raw, dict):
        raise ValueError(f"{label}: expected a mapping, got {type(raw).__name__}")
    name = raw.get("name")
    if not isinstance(name, str) or not _ENTRY_NAME.match(name):
        raise ValueError(f"{label}: field 'name' must be a snake_case string, got {name!r}")
    label = f"{path}: intervention {name!r}"

    def fail(field: str, message: str) -> ValueError:
        return ValueError(f"{label}: field {field!r}: {message}")

    unknown = sorted(set(raw) - _ENTRY_FIELDS)
    if unknown:
        raise fail(unknown[0], f"unknown field (allowed: {', '.join(sorted(_ENTRY_FIELDS))})")
    description = raw.get("description")
    if not isinstance(description, str) or not description.strip():
        raise fail("description", "a non-empty string is required")
    answers = _as_list(raw.get("answers"), "answers", fail)
    if not answers:
        raise fail("answers", "list at least one diagnosis")
    valid = [d.value for d in Diagnosis]
    for answer in answers:
        if answer not in valid:
            raise fail("answers", f"{answer!r} is not a diagnosis (one of {', '.join(valid)})")
    repeatable, needs_gpu, mirrors_images, needs_images = (_flag(raw, key, fail) for key in _FLAGS)
    prior = raw.get("prior", 0.0)
    if isinstance(prior, bool) or not isinstance(prior, (int, float)):
        raise fail("prior", f"expected a number, got {prior!r}")
    intervention = Intervention(
        name=name,
        description=description.strip(),
        answers=tuple(Diagnosis(a) for a in answers),
        repeatable=repeatable,
        prior=float(prior),
        applies_if=tuple(_regex(r, "applies_if", fail) for r in _as_list(raw.get("applies_if"), "applies_if", fail)),
        skip_if=tuple(_regex(r, "skip_if", fail) for r in _as_list(raw.get("skip_if"), "skip_if", fail)),
        knobs=_parse_knob_edits(raw.get("knobs"), fail),
        add_knobs=tuple(_parse_new_knob(k, fail) for k in _as_list(raw.get("add_knobs"), "add_knobs", fail)),
        edits=tuple(_parse_text_edit(e, fail) for e in _as_list(raw.get("edits"), "edits", fail)),
        transform=_parse_transform(raw.get("transform"), fail),
        needs_gpu=needs_gpu,
        mirrors_images=mirrors_images,
        needs_images=needs_images,
    )
    if not (intervention.knobs or intervention.changes_code):
        raise fail("knobs", "an intervention needs at least one of knobs, add_knobs, edits, transform")
    return intervention


# The entry's true/false fields, all false by default.
_FLAGS = ("repeatable", "needs_gpu", "mirrors_images", "needs_images")


def _flag(raw: dict, key: str, fail: Fail) -> bool:
    """A true/false field of an entry (false when absent)."""
    value = raw.get(key, False)
    if not isinstance(value, bool):
        raise fail(key, f"expected true or false, got {value!r}")
    return value


def _parse_transform(raw: Any, fail: Fail) -> str | None:
    if raw is None:
        return None
    if not isinstance(raw, str) or raw not in TRANSFORMS:
        raise fail("transform", f"{raw!r} is not a transform (known: {', '.join(sorted(TRANSFORMS))})")
    return raw


def _as_list(value: Any, field: str, fail: Fail) -> list[Any]:
    """A missing field is empty; a lone string is a one-item list."""
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list):
        raise fail(field, f"expected a list, got {type(value).__name__}")
    return value


def _regex(pattern: Any, field: str, fail: Fail) -> str:
    if not isinstance(pattern, str):
        raise fail(field, f"expected a regex string, got {pattern!r}")
    try:
        re.compile(pattern, re.MULTILINE)
    except re.error as error:
        raise fail(field, f"bad regex {pattern!r}: {error}") from error
    return pattern


def _number(value: Any, field: str, fail: Fail) -> float | None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
        raise fail(field, f"expected a number, got {value!r}")
    return value


def _parse_knob_edits(raw: Any, fail: Fail) -> tuple[KnobEdit, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, dict):
        raise fail("knobs", "expected a mapping KNOB: {set|mul|add: value, min: .., max: ..}")
    edits = []
    for knob, spec in raw.items():
        field = f"knobs.{knob}"
        if not isinstance(knob, str) or not is_knob_name(knob):
            raise fail(field, "knob names are UPPER_CASE")
        if not isinstance(spec, dict):
            raise fail(field, "expected a mapping like {mul: 0.5}")
        unknown = sorted(set(spec) - set(KNOB_OPS) - {"min", "max"})
        if unknown:
            raise fail(field, f"unknown key {unknown[0]!r} (allowed: set, mul, add, min, max)")
        ops = [op for op in KNOB_OPS if op in spec]
        if len(ops) != 1:
            raise fail(field, f"give exactly one of set, mul, add (got {', '.join(ops) or 'none'})")
        op = ops[0]
        if op != "set":
            _number(spec[op], field, fail)
        _literal_ok(spec[op], field, fail)
        edits.append(
            KnobEdit(knob, op, spec[op], _number(spec.get("min"), field, fail), _number(spec.get("max"), field, fail))
        )
    return tuple(edits)


def _literal_ok(value: Any, field: str, fail: Fail) -> None:
    """Knob values are written back as Python literals, so they must survive repr -> literal_eval."""
    try:
        literal_eval(repr(value))
    except (ValueError, SyntaxError) as error:
        raise fail(field, f"{value!r} cannot be written as a Python literal") from error


def _parse_new_knob(raw: Any, fail: Fail) -> NewKnob:
    if not isinstance(raw, dict) or set(raw) - {"name", "value", "comment"}:
        raise fail("add_knobs", f"each item is {{name, value, comment}}, got {raw!r}")
    name, comment = raw.get("name"), raw.get("comment")
    if not isinstance(name, str) or not is_knob_name(name):
        raise fail("add_knobs", f"knob name {name!r} must be UPPER_CASE")
    if "value" not in raw:
        raise fail("add_knobs", f"knob {name} needs a value")
    if not isinstance(comment, str) or not comment.strip() or "\n" in comment:
        raise fail("add_knobs", f"knob {name} needs a one-line comment (the trainer's knobs say what they do)")
    _literal_ok(raw["value"], "add_knobs", fail)
    return NewKnob(name, raw["value"], comment.strip())


def _parse_text_edit(raw: Any, fail: Fail) -> TextEdit:
    if not isinstance(raw, dict) or set(raw) - {"find", "replace", "when", "unless"}:
        raise fail("edits", f"each item is {{find, replace[, when, unless]}}, got {raw!r}")
    find, replace = raw.get("find"), raw.get("replace")
    if not isinstance(find, str) or not isinstance(replace, str):
        raise fail("edits", f"find and replace must both be strings, got find={find!r}")
    when, unless = raw.get("when"), raw.get("unless")
    return TextEdit(
        find=_regex(find, "edits", fail),
        replace=replace,
        when=_regex(when, "edits", fail) if when is not None else None,
        unless=_regex(unless, "edits", fail) if unless is not None else None,
    )


# -----------------------------------------------------------------------------
# Applying


def check(intervention: Intervention, source: str, searched: Searched | None = None) -> None:
    """Return when `intervention` applies to `source`, NotApplicable (with the reason) otherwise.

    The same decision as `apply`, faster: a transform only finds its idioms (rendering the edited tree is the slow
    part, and the analyst checks every entry against every parent).
    """
    if intervention.transform is None:
        apply(intervention, source, searched)
        return
    if intervention.knobs or intervention.add_knobs or intervention.edits:
        # without its searched space: an entry that also edits code applies whatever its knobs are held to (apply)
        source = apply(dataclasses.replace(intervention, transform=None), source)
    _regex_gates(intervention, source)
    try:
        check_transform(intervention.transform, source)
    except NotApplicable as reason:
        raise NotApplicable(f"{intervention.name}: {reason}") from None


def _regex_gates(intervention: Intervention, source: str) -> None:
    name = intervention.name
    for pattern in intervention.applies_if:
        if not re.search(pattern, source, re.MULTILINE):
            raise NotApplicable(f"{name}: the trainer lacks /{pattern}/")
    for pattern in intervention.skip_if:
        if re.search(pattern, source, re.MULTILINE):
            raise NotApplicable(f"{name}: already applied or conflicting (/{pattern}/ is present)")


def apply(intervention: Intervention, source: str, searched: Searched | None = None) -> str:
    """The source with `intervention` applied; NotApplicable (with the reason) when it cannot apply.

    A knob move stays inside the space `searched` declares for that knob, as its trials would (none given: no limit).
    """
    name = intervention.name
    _regex_gates(intervention, source)
    result = _apply_knob_edits(intervention, source, searched or {})
    result = _add_knobs(intervention, result)
    for edit in intervention.edits:
        result = _apply_text_edit(name, edit, result)
    if intervention.transform is not None:
        before = result
        try:
            result = apply_transform(intervention.transform, result)
        except NotApplicable as reason:
            raise NotApplicable(f"{name}: {reason}") from None
        result = _held_to_search(before, result, searched or {})
    if result == source:
        raise NotApplicable(f"{name}: changes nothing (knobs already at their limits)")
    try:
        parse(result)
    except SyntaxError as error:
        raise NotApplicable(
            f"{name}: the edits do not fit this trainer (invalid Python at line {error.lineno}: {error.msg})"
        ) from error
    return result


def model_file(source: str, folder: Path | Collection[str] | None = None) -> tuple[str, str] | None:
    """The file, relative to the variant's folder, of the module train.py (`source`) imports its model's class from,
    and the class's name there: `("pkg/models.py", "Net")` for `from pkg.models import Net`; None where train.py
    defines the model, or it comes from outside the folder (`torchvision`, `..models`). Given the `folder` (its
    path, or its files' relative paths) the module is looked for where Python finds it: in the folders train.py puts
    on sys.path (`sys.path.insert(0, str(HERE / "src"))`: `src/pkg/models.py`) and the folder itself; where it is
    in none, the path at the folder's root."""
    found = _model_module(source)
    if found is None:
        return None
    relative, name, roots = found
    if folder is not None:
        present = (lambda p: (folder / p).is_file()) if isinstance(folder, Path) else set(folder).__contains__
        path = next((p for root in roots if present(p := posixpath.normpath(posixpath.join(root, relative)))), None)
        if path is not None:
            return path, name
    return relative, name


@functools.lru_cache(maxsize=64)  # the analyst asks it for every catalog entry of every parent
def _model_module(source: str) -> tuple[str, str, tuple[str, ...]] | None:
    """The module's file relative to a folder Python searches, the class's name, and the variant's folders Python
    searches for it, in its order (`.` is train.py's own; see `model_file`)."""
    try:
        trainer = analyse(source)
        found = trainer.model_import()
    except NotApplicable:
        return None
    if found is None or found[0].startswith("..") or found[0].strip(".").split(".")[0] in ("", *MODEL_LIBRARIES):
        return None
    module, name = found
    return module.lstrip(".").replace(".", "/") + ".py", name, _search_folders(trainer)


SYS_PATH_CALL = re.compile(r"^sys\.path\.(insert|append)$")
# Calls that keep the place a path names (`str(HERE / "src")`, `Path(__file__)`), and methods that do too.
SAME_PLACE = frozenset(
    {"str", "os.fspath", "os.path.abspath", "os.path.realpath", "os.path.normpath", "Path", "pathlib.Path"}
)
RESOLVE = frozenset({"resolve", "absolute"})


def _search_folders(trainer: Trainer) -> tuple[str, ...]:
    """The variant's folders Python looks for train.py's imports in, in its order: those train.py inserts at the
    front of sys.path (the last inserted first), train.py's own (`.`), those it appends; only folders written as
    literal paths relative to train.py (`Path(__file__).parent / "src"`, `os.path.join(os.path.dirname(__file__),
    "src")`, a name bound to one) or to the work dir trials run in (`"src"`)."""
    bound: dict[str, cst.BaseExpression] = {}
    for line in trainer.lines:
        target, value = assign_target(line), assign_value(line)
        if target is not None and value is not None:
            bound.setdefault(target, value)  # (the first binding: where `HERE = Path(__file__).parent` is made)
    front: list[str] = []
    back: list[str] = []
    for call in trainer.calls(SYS_PATH_CALL):
        args = positional(call)
        folder = _folder(args[-1].value, bound) if args else None
        if folder is None or folder.startswith("..") or posixpath.isabs(folder):
            continue  # (outside the variant's folder, or not a literal path)
        at_front = (call_name(call) or "").endswith("insert") and _is_zero(args[0].value)
        if at_front:
            front.insert(0, folder)
        else:
            back.append(folder)
    ordered = [*front, ".", *back]
    return tuple(f for i, f in enumerate(ordered) if f not in ordered[:i])


def _is_zero(node: cst.BaseExpression) -> bool:
    """Whether an expression is the literal 0 (`sys.path.insert(0, ...)`: the front of the search)."""
    return isinstance(node, cst.Integer) and node.evaluated_value == 0


def _folder(node: cst.BaseExpression, bound: dict[str, cst.BaseExpression], depth: int = 0) -> str | None:
    """The folder an expression names, relative to train.py's (`Path(__file__).parent / "src"` -> `src`); None where
    it is not made of train.py's place and string literals."""
    if depth > 8:
        return None  # (names bound to each other)
    if isinstance(node, cst.Name):
        return _folder(bound[node.value], bound, depth + 1) if node.value in bound else None
    if isinstance(node, cst.SimpleString):
        value = node.evaluated_value
        return posixpath.normpath(value) if isinstance(value, str) else None
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Divide):
        return _joined(_folder(node.left, bound, depth + 1), [node.right])
    if isinstance(node, cst.Attribute) and node.attr.value == "parent":
        return _parent(node.value, bound, depth + 1)
    if not isinstance(node, cst.Call):
        return None
    name, args = call_name(node) or "", positional(node)
    if name == "os.path.dirname" and len(args) == 1:
        return _parent(args[0].value, bound, depth + 1)
    if name in SAME_PLACE and len(args) == 1:
        return _folder(args[0].value, bound, depth + 1)
    if name == "os.path.join" and args:
        return _joined(_folder(args[0].value, bound, depth + 1), [a.value for a in args[1:]])
    if isinstance(node.func, cst.Attribute) and node.func.attr.value == "joinpath":
        return _joined(_folder(node.func.value, bound, depth + 1), [a.value for a in args])
    if isinstance(node.func, cst.Attribute) and node.func.attr.value in RESOLVE and not node.args:
        return _folder(node.func.value, bound, depth + 1)
    return None


def _parent(node: cst.BaseExpression, bound: dict[str, cst.BaseExpression], depth: int) -> str | None:
    """The folder that holds what `node` names: train.py's own (`.`) for train.py's path."""
    if _is_file(node, bound, depth):
        return "."
    folder = _folder(node, bound, depth)
    return None if folder is None else posixpath.normpath(posixpath.join(folder, ".."))


def _joined(folder: str | None, parts: list[cst.BaseExpression]) -> str | None:
    """`folder` joined with string literals (None where one is not a literal)."""
    values = [v for p in parts if isinstance(p, cst.SimpleString) and isinstance(v := p.evaluated_value, str)]
    if folder is None or len(values) != len(parts):
        return None
    return posixpath.normpath(posixpath.join(folder, *values))


def _is_file(node: cst.BaseExpression, bound: dict[str, cst.BaseExpression], depth: int) -> bool:
    """Whether an expression is train.py's own path: `__file__`, `Path(__file__).resolve()`, a name bound to one."""
    if depth > 8:
        return False
    if isinstance(node, cst.Name):
        if node.value == "__file__":
            return True
        return node.value in bound and _is_file(bound[node.value], bound, depth + 1)
    if not isinstance(node, cst.Call):
        return False
    args = positional(node)
    if (call_name(node) or "") in SAME_PLACE and len(args) == 1:
        return _is_file(args[0].value, bound, depth + 1)
    if isinstance(node.func, cst.Attribute) and node.func.attr.value in RESOLVE and not node.args:
        return _is_file(node.func.value, bound, depth + 1)
    return False


def apply_files(
    intervention: Intervention, files: Mapping[str, str], searched: Searched | None = None
) -> dict[str, str]:
    """The variant's files that `intervention` changes, edited (`files`: relative path -> source, `train.py` among
    them); NotApplicable (with the reason) when it cannot apply. Everything edits train.py, but a layer transform
    (`MODEL_TRANSFORMS`) that train.py refuses edits the model's class in the module it is imported from, where that
    module's file is in `files`."""
    return _edit_files(intervention, files, searched, dry=False)


def check_files(intervention: Intervention, files: Mapping[str, str], searched: Searched | None = None) -> None:
    """Return when `intervention` applies to the variant's `files`, NotApplicable otherwise: `apply_files`'s
    decision, as fast as `check`."""
    _edit_files(intervention, files, searched, dry=True)


def _edit_files(
    intervention: Intervention, files: Mapping[str, str], searched: Searched | None, dry: bool
) -> dict[str, str]:
    source = files[TRAINER]
    found = model_file(source, files.keys())
    try:
        with model_source(files.get(found[0]) if found else None):  # rules about the model read its module too
            if dry:
                check(intervention, source, searched)
                return {}
            return {TRAINER: apply(intervention, source, searched)}
    except NotApplicable as refused:
        # (an entry that also moves knobs or edits text is about train.py's code, not only the model's layers)
        alone = not (intervention.knobs or intervention.add_knobs or intervention.edits)
        elsewhere = found if intervention.transform in MODEL_TRANSFORMS and alone else None
        if elsewhere is None:
            raise
        path, name = elsewhere
        if path not in files:
            looked = ", ".join(module[2] if (module := _model_module(source)) else (".",))
            raise NotApplicable(
                f"{refused} (the model's class `{name}` is imported from `{path}`, not a file of the variant's folder: "
                f"looked in {looked})"
            ) from None
        assert intervention.transform is not None  # one of MODEL_TRANSFORMS
        try:
            with model_module(name):
                if dry:
                    check_transform(intervention.transform, files[path])
                    return {}
                return {path: apply_transform(intervention.transform, files[path])}
        except NotApplicable as reason:
            raise NotApplicable(f"{intervention.name}: in {path}: {reason}") from None


# Other spellings of the catalog's knob names in users' trainers: a knob move uses the trainer's own (first found).


def _apply_knob_edits(intervention: Intervention, source: str, searched: Searched) -> str:
    if not intervention.knobs:
        return source
    current = read_knobs(source)
    named = {
        edit.knob: next((k for k in (edit.knob, *KNOB_ALIASES.get(edit.knob, ())) if k in current), None)
        for edit in intervention.knobs
    }
    missing = [knob for knob, found in named.items() if found is None]
    if missing:
        raise NotApplicable(f"{intervention.name}: the trainer has no knob {', '.join(missing)}")
    overrides: dict[str, Any] = {}
    held: list[str] = []  # why a move was cut to nothing by the searched space
    for edit in intervention.knobs:
        knob = named[edit.knob]
        assert knob is not None  # missing ones raised above
        before = current[knob]
        value = edit.new_value(before, knob)
        if knob in searched and value != before:
            value, why = _within_search(knob, before, value, searched[knob])
            if why:
                held.append(why)
        overrides[knob] = value
    if held and all(overrides[knob] == current[knob] for knob in overrides) and not intervention.changes_code:
        # Without this the child would differ from its parent on paper only: its trials train the value the space
        # allows, the parent's, and the KB would record the move as an intervention with no effect.
        raise NotApplicable(f"{intervention.name}: {'; '.join(held)}")
    try:
        return rewrite_knobs(source, overrides)
    except KnobError as error:
        raise NotApplicable(f"{intervention.name}: {error}") from error


def _within_search(knob: str, before: Any, value: Any, trained: Callable[[Any], Any]) -> tuple[Any, str | None]:
    """A knob move cut to what the child's trials would train (`trained`), and why it was cut (None: not cut)."""
    limited = trained(value)
    numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (before, value, limited))
    if numbers:
        # The space limits the move, never reverses it (a parent already past the space keeps its value).
        limited = max(limited, before) if value > before else min(limited, before)
        if isinstance(before, int) and float(limited).is_integer():
            limited = int(limited)
        elif isinstance(limited, float):
            limited = float(f"{limited:.6g}")
    if limited == value:
        return value, None
    return limited, (
        f"the move {knob} {before!r} -> {value!r} leaves search.space, and its trials would train {trained(value)!r}"
    )


def _held_to_search(before: str, source: str, searched: Searched) -> str:
    """The knobs a transform set, held to what the child's trials would train: `adamw_optimizer` sets LR = 0.003,
    which a search space of [0.005, 0.1] trains as 0.005 (review: the KB would record 0.003)."""
    if not searched:
        return source
    old, values = read_knobs(before), read_knobs(source)
    set_by_it = {name: value for name, value in values.items() if name in searched and old.get(name) != value}
    held = {name: searched[name](value) for name, value in set_by_it.items()}
    changed = {name: value for name, value in held.items() if value != values[name]}
    return rewrite_knobs(source, changed) if changed else source


def _add_knobs(intervention: Intervention, source: str) -> str:
    if not intervention.add_knobs:
        return source
    existing = read_knobs(source)
    clashes = [k.name for k in intervention.add_knobs if k.name in existing]
    if clashes:
        raise NotApplicable(f"{intervention.name}: the trainer already has knob {', '.join(clashes)}")
    end = _knob_block_end(source)
    if end is None:
        raise NotApplicable(
            f"{intervention.name}: the trainer has no knob block to add {intervention.add_knobs[0].name} to"
        )
    lines = source.splitlines(keepends=True)
    new = [k.line() for k in intervention.add_knobs]
    return "".join(lines[:end] + new + lines[end:])


def _knob_block_end(source: str) -> int | None:
    """Line number (1-based) of the last knob in the first run of knob lines (only comments between them)."""
    lines = source.splitlines()
    knobs = list(knob_nodes(parse(source)).values())
    if not knobs:
        return None
    end = knobs[0].end_lineno or knobs[0].lineno
    for node in knobs[1:]:
        between = lines[end : node.lineno - 1]
        if any(not line.strip().startswith("#") for line in between):
            break  # a blank line or code ends the block (e.g. cifar10's CIFAR_MEAN constants)
        end = node.end_lineno or node.lineno
    return end


def _apply_text_edit(name: str, edit: TextEdit, source: str) -> str:
    if edit.when is not None and not re.search(edit.when, source, re.MULTILINE):
        return source
    if edit.unless is not None and re.search(edit.unless, source, re.MULTILINE):
        return source
    result, count = re.subn(edit.find, edit.replace, source, flags=re.MULTILINE)
    if count == 0:
        raise NotApplicable(f"{name}: the trainer lacks the anchor /{edit.find}/")
    return result
