"""The validation gate: a child joins a Tune run only if it parses, leaves frozen files alone, keeps the
harness calls and the searched knobs, and survives a smoke run on a sliver of the data."""

from __future__ import annotations

import ast
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ralph_ray.knobs import parse, read_knobs
from ralph_ray.resumable import missing_calls, missing_resume_calls, parallel_problem, refusal
from ralph_ray.runner import Limits, Status, Trainer, run
from ralph_ray.sandbox import Breach, Policy
from ralph_ray.seedcheck import MODEL_CALLS, REQUIRED_CALLS  # the seed is held to them at startup
from ralph_ray.tasks.base import Splits, write_public
from ralph_ray.variants import MUTABLE, is_mutable, variant_files
from ralph_ray.workdir import prepare_workdir

SMOKE_ROWS = {"train": 160, "selection": 40, "test": 40}
SMOKE_KNOBS = {"EPOCHS": 1}  # knobs set for the smoke run when the trainer has them
# A training batch knob's largest value in a smoke run (halved until it fits, so 64 -> 32, 96 -> 24: a multiple of
# what it was a multiple of, for trainers that assert BATCH_SIZE % ACCUM == 0): three batches or more of the sliver's
# train rows less a validation share. A user trial's `larger_batch` child (BATCH_SIZE 256, `drop_last=True`) got no
# batch of 144 rows, and OneCycleLR's "Expected positive integer steps_per_epoch, but got 0" rejected it twice.
SMOKE_BATCH = SMOKE_ROWS["train"] // 4
BATCH_KNOB = re.compile(r"^(TRAIN_)?BATCH(_SIZE)?$|^BS$")  # not EVAL_BATCH, TOKENS_PER_BATCH
SMOKE_OUTPUT_BYTES = 10 * 1024 * 1024  # stdout and stderr of a smoke run
SMOKE_WORK = "smoke_work"  # beside the smoke data: the folder of warm smoke runs' work dirs
PACKAGE = "ralph_ray"
ABSOLUTE_PATH = re.compile(r"^(~|/[\w.-])[\w./~-]*$")  # "/etc/passwd", "~/data": not "/", not "a/b", not "x / y"
PARENT_DIR = re.compile(r"(^|[/\\])\.\.([/\\]|$)")  # "../kb", "a/../../b"
IMPORT_CALLS = frozenset({"import_module", "__import__", "find_spec", "load_module"})  # a module named by a string
# The gate's refusals of a child that reaches outside its work dir (the engine, the KB, held-out labels): by the
# source (check_reach), or in its smoke run (the sandbox's breach). `reached_outside` tells them from plain bugs.
ENGINE_REFUSAL = (
    "imports {}: of the engine a trainer may import only ralph_ray.harness (its data, reports and predictions)"
)
PATH_REFUSAL = (
    "names the path {!r}: a trainer reads and writes only in its work dir (relative paths) and reads its data "
    "through harness.load_data()"
)
SMOKE_FAILED = "smoke run failed: "
REACH_BREACHES = (Breach.forbidden_path, Breach.network)


class GateError(ValueError):
    """Why a child was refused; the message goes back to the coder and into the knowledge base."""


@dataclass(frozen=True)
class Gate:
    """Checks a child folder against its parent; `smoke_data` is a sliver of the public data."""

    smoke_data: Path
    searched_knobs: tuple[str, ...]
    timeout_s: float
    entry: str = "train.py"
    sandbox: Policy = Policy()  # the smoke run runs in the same sandbox as the trials
    output_bytes: int = SMOKE_OUTPUT_BYTES
    scores_model: bool = False  # the task scores the exported model (ralph_ray.modeleval): save_model is required
    resumes: bool = False  # scheduler=pbt: the child must save and restore checkpoints (ralph_ray.pbt)
    workers: int = 1  # resources.workers_per_trial: N > 1 and the child must join the trial's group
    # trial.warm: fork each smoke run from a warm server of this process (torch imported once, same sandbox). The
    # breeder runs nicer than the trials, so on busy cores a cold smoke run's `import torch` took ~50 s (6 s alone).
    warm: bool = False
    prestart: bool = True  # trial.prestart: the warm server may keep a smoke run's trainer forked ahead

    def check(self, child: Path, parent: Path) -> None:
        """Raise GateError naming the first problem; return quietly when the child may run."""
        check_frozen_files(child, parent)
        sources = check_parses(child)
        check_reach(sources, _sources(parent))
        check_required_calls(sources.get(self.entry, ""), self.entry, MODEL_CALLS if self.scores_model else ())
        if self.resumes and (missing := missing_resume_calls(sources.get(self.entry, ""))):
            raise GateError(refusal(self.entry, missing))
        if problem := parallel_problem(sources.get(self.entry, ""), self.entry, self.workers):
            raise GateError(problem)
        check_knobs(sources[self.entry], self.searched_knobs)
        self.smoke(child)

    def smoke(self, child: Path, knobs: dict[str, Any] | None = None) -> None:
        """Run the child for one epoch on the sliver (with `knobs` written in: a trial's) and check it reports and
        predicts every input."""
        # Warm: the work dirs share one folder of their own (the server's view, each smoke run seeing only its dir).
        root = None
        if self.warm:
            root = self.smoke_data.parent / SMOKE_WORK
            root.mkdir(exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix="ralph-smoke-", dir=root))
        try:
            present = read_knobs((child / self.entry).read_text())
            written = {k: v for k, v in {**(knobs or {}), **SMOKE_KNOBS}.items() if k in present}
            for name, value in {**present, **written}.items():
                if BATCH_KNOB.search(name) and isinstance(value, int) and not isinstance(value, bool):
                    while value > SMOKE_BATCH:
                        value //= 2
                    written[name] = value
            prepare_workdir(child, work, written, entry=self.entry)
            limits = Limits(
                self.timeout_s, self.output_bytes, sandbox=self.sandbox, warm=self.warm, prestart=self.prestart
            )
            outcome = run(Trainer(work, self.smoke_data, self.entry), limits)
            if outcome.status is not Status.finished:
                raise GateError(f"{SMOKE_FAILED}{outcome.reason}")
            check_smoke_predictions(work / "predictions.npz", self.smoke_data)
        finally:
            shutil.rmtree(work, ignore_errors=True)


def reached_outside(refusal: str) -> bool:
    """Whether a gate refusal ("attempt N: why", or the why alone) caught the child reaching outside its work dir:
    an engine import, a path outside it, or its smoke run breaching the sandbox's paths or network."""
    why = refusal.split(": ", 1)[1] if refusal.startswith("attempt ") else refusal
    if any(why.startswith(f"{SMOKE_FAILED}{breach.value}: ") for breach in REACH_BREACHES):
        return True
    return any(mark in why for mark in (ENGINE_REFUSAL.split("{}")[1], PATH_REFUSAL.split("{!r}")[1]))


def write_smoke_data(splits: Splits, out_dir: Path, task: str) -> Path:
    """A few rows of each public split, for smoke runs (deterministic: the first rows)."""
    sliver = Splits(
        train_x=splits.train_x[: SMOKE_ROWS["train"]],
        train_y=splits.train_y[: SMOKE_ROWS["train"]],
        selection_x=splits.selection_x[: SMOKE_ROWS["selection"]],
        selection_y=splits.selection_y[: SMOKE_ROWS["selection"]],
        test_x=splits.test_x[: SMOKE_ROWS["test"]],
        test_y=splits.test_y[: SMOKE_ROWS["test"]],
        num_classes=splits.num_classes,
        files=splits.files,  # further public files (a base model) whole: a trainer can't use a sliver of one
    )
    write_public(sliver, out_dir, task)
    return out_dir


def check_frozen_files(child: Path, parent: Path) -> None:
    """Only mutable files may change; none may vanish or appear outside the mutable patterns."""
    mine = {str(p.relative_to(child)): p for p in variant_files(child)}
    theirs = {str(p.relative_to(parent)): p for p in variant_files(parent)}
    for name in sorted(set(mine) | set(theirs)):
        if is_mutable(name):
            continue
        if name not in mine:
            raise GateError(f"removed frozen file {name}: only {', '.join(MUTABLE)} files may change")
        if name not in theirs or mine[name].read_bytes() != theirs[name].read_bytes():
            raise GateError(f"edited frozen file {name}: only {', '.join(MUTABLE)} files may change")
    for path in child.rglob("*"):
        if path.is_symlink():
            raise GateError(f"{path.relative_to(child)} is a symlink: a variant holds plain files only")


def check_parses(child: Path) -> dict[str, str]:
    """Every Python file parses; returns their sources."""
    sources = {}
    for path in variant_files(child):
        if path.suffix != ".py":
            continue
        name = str(path.relative_to(child))
        source = path.read_text(errors="replace")
        try:
            parse(source, filename=name)
        except SyntaxError as err:
            raise GateError(f"{name} does not parse: {err.msg} at line {err.lineno}") from None
        sources[name] = source
    return sources


def check_reach(sources: dict[str, str], parent: dict[str, str] | None = None) -> None:
    """A fast first line beside the sandbox: no engine module but the harness, no path outside the work dir, in what
    the child adds to its `parent`'s files. What the parent had already (the user's seed saving to /tmp, say) is no
    agent's doing: refused, it failed every child of that parent and the KB blamed each child's intervention (a user
    trial's four children), while the sandbox still holds each trial to its work dir either way."""
    for name, source in sources.items():
        tree = parse(source, filename=name)
        known = {what for _, what in _reaches_in((parent or {}).get(name))}
        for node, what in _reaches(tree):
            if what not in known:
                raise GateError(f"{name} line {node.lineno}: {what}")


def _sources(folder: Path) -> dict[str, str]:
    """A variant's Python files by relative name (the parent's, trusted to parse: it was gated or is the seed)."""
    return {
        str(path.relative_to(folder)): path.read_text(errors="replace")
        for path in variant_files(folder)
        if path.suffix == ".py"
    }


def _reaches_in(source: str | None) -> list[tuple[ast.AST, str]]:
    """`_reaches` of a source that may be missing or not parse (nothing then)."""
    if source is None:
        return []
    try:
        return _reaches(parse(source))
    except SyntaxError:
        return []


def _reaches(tree: ast.AST) -> list[tuple[ast.AST, str]]:
    """Engine imports other than ralph_ray.harness, and string literals naming absolute paths or '..'."""
    found: list[tuple[ast.AST, str]] = []
    engine, path = ENGINE_REFUSAL, PATH_REFUSAL
    skip = {
        id(node.body[0].value)
        for node in ast.walk(tree)  # docstrings
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node, engine.format(a.name)) for a in node.names if _is_engine(a.name)]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            if node.module == PACKAGE:
                found += [(node, engine.format(f"{PACKAGE}.{a.name}")) for a in node.names if a.name != "harness"]
            elif _is_engine(node.module):
                found.append((node, engine.format(node.module)))
        elif isinstance(node, ast.JoinedStr):
            skip.update(id(part) for part in node.values[1:])  # only an f-string's start can make it absolute
        elif isinstance(node, ast.Call) and _callee(node.func) in IMPORT_CALLS and node.args:
            name = node.args[0]  # `importlib.import_module("ralph_ray.tasks")`: an import the statements miss
            if isinstance(name, ast.Constant) and isinstance(name.value, str) and _is_engine(name.value):
                found.append((node, engine.format(name.value)))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            # Only a path: a string naming the package is no import (a user trial's `[..., "ralph_ray"]` path parts
            # read as "imports ralph_ray"); the sandbox holds a child to its work dir whatever it names.
            if ABSOLUTE_PATH.match(node.value) or PARENT_DIR.search(node.value):
                found.append((node, path.format(node.value)))
    return sorted(found, key=lambda item: getattr(item[0], "lineno", 0))


def _callee(func: ast.expr) -> str:
    """A call's function name as written last: `import_module` of `importlib.import_module`, `__import__`."""
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def _is_engine(module: str) -> bool:
    return (module == PACKAGE or module.startswith(f"{PACKAGE}.")) and module != f"{PACKAGE}.harness"


def check_required_calls(source: str, entry: str, extra: tuple[str, ...] = ()) -> None:
    """The harness calls the engine relies on are still there."""
    if not source:
        raise GateError(f"{entry} is missing")
    missing = missing_calls(source, (*REQUIRED_CALLS, *extra))
    if missing:
        raise GateError(f"{entry} no longer calls {', '.join(missing)}: the engine needs them (see program.md)")


def check_knobs(source: str, searched: tuple[str, ...]) -> None:
    """The knobs Optuna samples must stay module-level literals."""
    missing = [name for name in searched if name not in read_knobs(source)]
    if missing:
        raise GateError(f"knob(s) {', '.join(missing)} are searched but no longer module-level UPPER_CASE literals")


def check_smoke_predictions(path: Path, smoke_data: Path) -> None:
    """The smoke run predicted one class per selection and test input."""
    if not path.exists():
        raise GateError("smoke run finished without harness.save_predictions(selection=..., test=...)")
    with np.load(path) as saved:
        sizes = (len(saved["selection"]), len(saved["test"]))
    expected = tuple(len(np.load(smoke_data / f"{split}_x.npy", mmap_mode="r")) for split in ("selection", "test"))
    if sizes != expected:
        raise GateError(f"smoke run predicted {sizes} (selection, test) rows, expected {expected}")
