"""The seed trainer's code, read before Ray starts: the harness calls every trial needs, and a read of each searched
knob. Either fault let a campaign start: a user's trainer that called no harness function ran five failing trials
and exited 4 after 53 s, and one whose argparse kept `default=1e-3` beside a searched `LR = 1e-3` recorded LR values
no trial trained with."""

from __future__ import annotations

import ast
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from ralph_ray.knobs import is_literal, literal_eval, parse
from ralph_ray.resumable import calls_missing
from ralph_ray.variants import globbed

REQUIRED_CALLS = ("harness.load_data", "harness.report", "harness.save_predictions")
MODEL_CALLS = ("harness.save_model",)  # also required where the task scores the exported model
# Calls that read a module's names without naming them (nanoGPT's `globals().items()` config dump): a knob may be
# read through one, so a module that makes one is taken at its word.
NAMESPACE_READERS = {"globals", "vars", "locals"}
ADAPT = "README, Add your own task, step 3"


def _trees(paths: list[Path]) -> dict[Path, ast.Module] | None:
    """Each file parsed; None when one does not read or parse (the task check and the gate explain that)."""
    try:
        return {path: parse(path.read_text(), str(path)) for path in paths}
    except (OSError, SyntaxError, ValueError):
        return None


def harness_problem(paths: list[Path], entry: Path, scores_model: bool) -> tuple[str, str] | None:
    """(problem, fix) where no file of the seed (`paths`) makes a call the engine needs (REQUIRED_CALLS, which the
    gate holds children to, and MODEL_CALLS where the task scores the model); None otherwise."""
    trees = _trees(paths)
    if not trees:
        return None
    calls = (*REQUIRED_CALLS, *(MODEL_CALLS if scores_model else ()))
    absent = [set(calls_missing(tree, calls)) for tree in trees.values()]
    missing = [c for c in calls if all(c in each for each in absent)]
    if not missing:
        return None
    how = {
        "harness.load_data": "take the data from `data = harness.load_data()`",
        "harness.report": "call `harness.report(epoch=..., val_acc=...)` once per epoch (epochs count from 1)",
        "harness.save_predictions": "call `harness.save_predictions(selection=..., test=...)` at the end",
        "harness.save_model": "call `harness.save_model(model)` at the end",
    }
    return (
        f"{entry} never calls {', '.join(missing)} (`from ralph_ray import harness`): every trial would fail after "
        "Ray starts, since the engine reads a trial's scores from harness.report and scores what "
        "harness.save_predictions writes",
        f"adapt train.py first ({ADAPT}): " + "; ".join(how[c] for c in missing) + ", or start from a template: "
        "`python -m ralph_ray init my_task --template classification`",
    )


def _reads(tree: ast.Module) -> set[str] | None:
    """The names a module reads: loaded names, attributes, imported names and string literals (`getattr(cfg, "LR")`);
    None where it reads its namespace whole (globals(), vars(), locals())."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            if node.id in NAMESPACE_READERS:
                return None
            found.add(node.id)
        elif isinstance(node, ast.Attribute):
            found.add(node.attr)
        elif isinstance(node, ast.ImportFrom):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            found.add(node.value)
    return found


def unread_knobs(paths: list[Path], searched: list[str]) -> list[str]:
    """The searched knobs that no file of the seed ever reads (assigned, then never used: the trial trains with
    whatever it uses instead, and the KB records the sampled value as if it had trained with it)."""
    trees = _trees(paths)
    if not trees:
        return []
    read: set[str] = set()
    for tree in trees.values():
        names = _reads(tree)
        if names is None:
            return []
        read |= names
    return [name for name in searched if name not in read]


def unread_problem(paths: list[Path], searched: list[str], entry: Path) -> tuple[str, str] | None:
    """(problem, fix) where a searched knob is never read (`unread_knobs`); None otherwise."""
    unread = unread_knobs(paths, searched)
    if not unread:
        return None
    return (
        f"names {', '.join(unread)}, which {entry} sets but never reads: the trials would train with whatever the "
        "code uses instead (an argparse default=1e-3 beside LR = 1e-3), and the KB would record sampled values no "
        "trial trained with",
        f"read each where it is used ({ADAPT}: e.g. `parser.add_argument('--lr', type=float, default={unread[0]})`, "
        f"`lr: float = {unread[0]}`), or drop it from the space: "
        + " ".join(f"~search.space.{name}" for name in unread),
    )


# LR schedulers sized by a step or epoch count (a step count, T_max, total_steps, a LambdaLR's own lambda over
# `EPOCHS * steps`): under a time budget harness.epochs runs as many epochs as fit, not EPOCHS, so where more fit such
# a schedule ends early (it sits at its last lr, cycles back up, or, OneCycleLR, raises past total_steps) and where
# fewer fit it never anneals (a user's LambdaLR warmup-then-linear-decay final trained 10 of its 19 epochs at lr 0).
# torch.optim.lr_scheduler's, and transformers' schedules (get_scheduler and the warmup schedules built on LambdaLR).
# Not MultiStepLR (steps down at milestones and keeps its last lr), nor LinearLR as a warmup (`_sized`).
SIZED_SCHEDULERS = frozenset(
    {
        "LambdaLR",
        "CosineAnnealingLR",
        "OneCycleLR",
        "LinearLR",
        "PolynomialLR",
        "SequentialLR",
        "get_scheduler",
        "get_linear_schedule_with_warmup",
        "get_cosine_schedule_with_warmup",
        "get_cosine_with_hard_restarts_schedule_with_warmup",
        "get_polynomial_decay_schedule_with_warmup",
    }
)
# transformers.get_scheduler names whose schedule takes no training length (a warmup, then constant or 1/sqrt(step)).
UNSIZED_HF_SCHEDULES = frozenset({"constant", "constant_with_warmup", "inverse_sqrt", "reduce_lr_on_plateau"})
# What sizes a schedule by the training actually given (time under a budget, steps without).
TIMED_SCHEDULES = frozenset({"progress", "lr_factor"})


def _called(node: ast.AST) -> str | None:
    """The name a call calls (`LambdaLR(...)`, `torch.optim.lr_scheduler.LambdaLR(...)`); None for anything else."""
    if not isinstance(node, ast.Call):
        return None
    func = node.func
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None


def _argument(call: ast.Call, keyword: str, position: int) -> ast.expr | None:
    """A call's argument by keyword or else by position (None where it is not given)."""
    given = next((k.value for k in call.keywords if k.arg == keyword), None)
    if given is None and len(call.args) > position and not isinstance(call.args[position], ast.Starred):
        return call.args[position]
    return given


def _sized(call: ast.Call, name: str) -> bool:
    """Whether a scheduler call in SIZED_SCHEDULERS builds a schedule that anneals over its given length: not a
    LinearLR warmup (end_factor absent or a literal >= 1: it rises, then holds the optimizer's lr), nor a
    transformers.get_scheduler without a training length (a user's own `get_scheduler(optimizer)`) or of a
    schedule that takes none (UNSIZED_HF_SCHEDULES)."""
    if name == "LinearLR":
        end = _argument(call, "end_factor", 2)
        if end is None:
            return False
        try:
            return not float(literal_eval(end)) >= 1
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            return True  # a computed end_factor: it may anneal
    if name == "get_scheduler":
        if _argument(call, "num_training_steps", 3) is None:
            return False
        kind = _argument(call, "name", 0)
        return not (isinstance(kind, ast.Constant) and kind.value in UNSIZED_HF_SCHEDULES)
    return True


def sized_schedule(paths: list[Path]) -> str | None:
    """Where the seed (`paths`) first builds an LR scheduler sized by a step or epoch count (`LambdaLR (train.py:109)`),
    when none of its files calls harness.progress or harness.lr_factor; None otherwise."""
    trees = _trees(paths)
    if not trees:
        return None
    built: list[tuple[str, int, str]] = []
    for path, tree in trees.items():
        for node in ast.walk(tree):
            name = _called(node)
            if name in TIMED_SCHEDULES:
                return None
            if name in SIZED_SCHEDULERS and isinstance(node, ast.Call) and _sized(node, name):
                built.append((path.name, node.lineno, name))
    if not built:
        return None
    file, line, name = min(built)
    return f"{name} ({file}:{line})"


def _is_dataclass(node: ast.ClassDef) -> bool:
    """Whether a class is decorated @dataclass (`@dataclass`, `@dataclasses.dataclass`, either called)."""
    for decorator in node.decorator_list:
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        name = target.id if isinstance(target, ast.Name) else target.attr if isinstance(target, ast.Attribute) else ""
        if name == "dataclass":
            return True
    return False


def _knob_fields(tree: ast.Module, searched: set[str]) -> dict[str, dict[str, str]]:
    """Per dataclass, its fields whose default reads a searched knob (`lr: float = LR`): {class: {field: knob}}."""
    found: dict[str, dict[str, str]] = {}
    for node in ast.walk(tree):
        if not (isinstance(node, ast.ClassDef) and _is_dataclass(node)):
            continue
        for item in node.body:
            if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name) and item.value is not None:
                knobs = [n.id for n in ast.walk(item.value) if isinstance(n, ast.Name) and n.id in searched]
                if knobs:
                    found.setdefault(node.name, {})[item.target.id] = knobs[0]
    return found


def _replaces(tree: ast.Module) -> set[str]:
    """The names that call dataclasses.replace here: `dataclasses.replace`, and `replace` where imported from it."""
    names = {"dataclasses.replace"}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "dataclasses":
            names |= {alias.asname or alias.name for alias in node.names if alias.name == "replace"}
    return names


def overridden_knobs(paths: list[Path], searched: list[str]) -> list[str]:
    """Each place the seed sets a dataclass field whose default reads a searched knob to a literal, in a constructor
    or dataclasses.replace call (`replace(TrainConfig(), lr=1e-3)`, `TrainConfig(**{"lr": 1e-3})`): every trial would
    train that literal while the KB records the sampled values. As `LR (lr=0.001 at train.py:40)`."""
    trees = _trees(paths)
    if not trees:
        return []
    fields: dict[str, dict[str, str]] = {}
    for tree in trees.values():
        fields.update(_knob_fields(tree, set(searched)))
    if not fields:
        return []
    any_field = {name: knob for each in fields.values() for name, knob in each.items()}
    found: list[tuple[str, int, str]] = []
    for path, tree in trees.items():
        replacers = _replaces(tree)
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            called = ast.unparse(node.func)
            # a replace() may act on any of the dataclasses; a constructor sets its own fields only
            known = any_field if called in replacers else fields.get(called.rsplit(".", 1)[-1])
            if not known:
                continue
            pairs: list[tuple[str, ast.expr]] = []
            for keyword in node.keywords:
                if keyword.arg is not None:
                    pairs.append((keyword.arg, keyword.value))
                elif isinstance(keyword.value, ast.Dict):  # **{"lr": 1e-3}
                    pairs += [
                        (key.value, value)
                        for key, value in zip(keyword.value.keys, keyword.value.values)
                        if isinstance(key, ast.Constant) and isinstance(key.value, str)
                    ]
            for name, value in pairs:
                if name in known and is_literal(value):
                    found.append((path.name, node.lineno, f"{known[name]} ({name}={ast.unparse(value)} at "))
    return [f"{text}{file}:{line})" for file, line, text in sorted(found)]


# A task's own config files, beside train.py or one folder down (configs/): the kinds a trainer reads its settings from.
CONFIG_SUFFIXES = (".yaml", ".yml", ".json")
# Reads that fall back to a default when the key is absent: `cfg.get("hidden", HIDDEN)`, `cfg.setdefault(...)`,
# `getattr(args, "hidden", HIDDEN)`; the key's position and the default's.
FALLBACK_METHODS = {"get": (0, 1), "setdefault": (0, 1), "pop": (0, 1)}
FALLBACK_FUNCTIONS = {"getattr": (1, 2)}


def _strings(trees: dict[Path, ast.Module]) -> set[str]:
    """The last path part of every short string literal of the seed (`"configs/config.yaml"` -> `config.yaml`)."""
    found: set[str] = set()
    for tree in trees.values():
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and len(node.value) < 300:
                found.add(node.value.replace("\\", "/").rstrip("/").rsplit("/", 1)[-1])
    return found


def config_files(folder: Path, paths: list[Path]) -> list[Path]:
    """The task folder's config files that the seed's code names (`"config.yaml"`, `Path(__file__).parent /
    "config.yaml"`, Hydra's `config_name="config"`), at its top level or one folder down; never task.yaml, the
    engine's own."""
    trees = _trees(paths)
    if not trees:
        return []
    named = _strings(trees)
    found = []
    for path in sorted([*folder.glob("*"), *folder.glob("*/*")]):
        hidden = any(part.startswith(".") for part in path.relative_to(folder).parts)
        if path.suffix in CONFIG_SUFFIXES and path.name != "task.yaml" and not hidden and path.is_file():
            if path.name in named or path.stem in named:
                found.append(path)
    return found


def shipped_split(folder: Path, files: list[Path], patterns: Sequence[str] | None) -> tuple[list[Path], list[Path]]:
    """(shipped, left out): which of the task's config `files` the seed variant holds, by task.trainer_files
    (`patterns`; None takes every file as shipped). Trials get only those: a file left out is not there to read."""
    if patterns is None:
        return list(files), []
    matched = {path.relative_to(folder) for path in globbed(folder, patterns)}
    shipped = [path for path in files if path.relative_to(folder) in matched]
    return shipped, [path for path in files if path not in shipped]


def ship_fix(folder: Path, file: Path, patterns: Sequence[str]) -> str:
    """The task.trainer_files line that ships `file` as well: task.yaml's, and the command line's override."""
    wanted = [*patterns, file.relative_to(folder).as_posix()]
    return (
        f"add it to task.trainer_files, in task.yaml: `task: {{trainer_files: {json.dumps(wanted)}}}` (or on the "
        f"command line: 'task.trainer_files=[{','.join(wanted)}]')"
    )


def unshipped_config(paths: list[Path], folder: Path, patterns: Sequence[str]) -> str | None:
    """A warning where the seed's code names a config file of the task (`config_files`) that task.trainer_files
    (`patterns`) leave out of the seed variant: train.py opens it in the task folder, but no trial has it, so every
    trial would fail (FileNotFoundError); None otherwise."""
    trees = _trees(paths)
    _, left_out = shipped_split(folder, config_files(folder, paths), patterns)
    if not trees or not left_out:
        return None
    said = []
    for file in left_out:
        readers = [path.name for path, tree in trees.items() if {file.name, file.stem} & _strings({path: tree})]
        name = file.relative_to(folder).as_posix()
        said.append(
            f"{readers[0] if readers else 'train.py'} reads {name}, which is not among task.trainer_files "
            f"{list(patterns)}: the trials get only those files, so every trial would fail to find it; fix: "
            + ship_fix(folder, file, patterns)
        )
    return f"{folder}'s code: " + "; ".join(said)


def _config_leaves(path: Path) -> dict[str, Any]:
    """A config file's keys by dotted name, sections as well as values (`model.width`); {} where it does not read."""
    try:
        text = path.read_text()
        if path.suffix == ".json":
            data = json.loads(text)
        else:
            data = yaml.safe_load(text)
    except (OSError, ValueError, yaml.YAMLError):
        return {}
    found: dict[str, Any] = {}

    def walk(node: Any, prefix: str) -> None:
        for key, value in node.items() if isinstance(node, dict) else ():
            dotted = f"{prefix}{key}"
            found[dotted] = value
            walk(value, f"{dotted}.")

    walk(data, "")
    return found


def config_value(files: list[Path], key: str) -> tuple[Path, str, Any] | None:
    """Where one of `files` sets `key`, at any depth: (file, dotted key, value); None where none does."""
    for path in files:
        for dotted, value in _config_leaves(path).items():
            if dotted.rsplit(".", 1)[-1] == key:
                return path, dotted, value
    return None


def shown(value: Any) -> str:
    """A config file's value as the file writes it (`32`, `true`, `"adam"`)."""
    return json.dumps(value, default=str)


def _fallback(call: ast.Call) -> tuple[str, ast.expr] | None:
    """(key, default) of a read that falls back to a default (FALLBACK_METHODS, FALLBACK_FUNCTIONS); None else."""
    func = call.func
    if isinstance(func, ast.Attribute) and func.attr in FALLBACK_METHODS:
        key_at, default_at = FALLBACK_METHODS[func.attr]
    elif isinstance(func, ast.Name) and func.id in FALLBACK_FUNCTIONS:
        key_at, default_at = FALLBACK_FUNCTIONS[func.id]
    else:
        return None
    if len(call.args) <= key_at:
        return None
    key = call.args[key_at]
    if not (isinstance(key, ast.Constant) and isinstance(key.value, str)):
        return None
    default = call.args[default_at] if len(call.args) > default_at else None
    default = default or next((k.value for k in call.keywords if k.arg in ("default", "default_value")), None)
    return (key.value, default) if default is not None else None


def _assigned_to(tree: ast.Module) -> dict[int, str]:
    """The name each directly assigned value goes to (`width = <call>`), by the value's id."""
    return {
        id(node.value): node.targets[0].id
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
    }


def fallback_knobs(
    paths: list[Path], searched: list[str], folder: Path, patterns: Sequence[str] | None = None
) -> list[tuple[str, str]]:
    """Each read of a searched knob as the fallback of a key that a config file of the task sets (`hidden =
    CFG.get("hidden", HIDDEN)` beside config.yaml's `hidden: 32`): every trial trains the file's value while the KB
    records the sampled ones. As (found, fix): ("HIDDEN (train.py:31: `CFG.get('hidden', HIDDEN)`, and config.yaml
    sets hidden: 32)", "use the constant directly (`hidden = HIDDEN`), or remove `hidden` from config.yaml").
    Only the files task.trainer_files (`patterns`) ship count: no trial reads one left out (`unshipped_config`)."""
    trees = _trees(paths)
    files, _ = shipped_split(folder, config_files(folder, paths), patterns)
    if not trees or not files:
        return []
    found: list[tuple[str, int, str, str]] = []
    for path, tree in trees.items():
        targets = _assigned_to(tree)
        for node in ast.walk(tree):
            read = _fallback(node) if isinstance(node, ast.Call) else None
            if read is None:
                continue
            key, default = read
            knobs = [n.id for n in ast.walk(default) if isinstance(n, ast.Name) and n.id in searched]
            where = config_value(files, key) if knobs else None
            if where is None:
                continue
            file, dotted, value = where
            name, written = file.relative_to(folder), ast.unparse(node)
            local = targets.get(id(node))
            direct = f"`{local} = {knobs[0]}`" if local else f"`{knobs[0]}` in place of `{written}`"
            if local == knobs[0]:  # `HIDDEN = CFG.get("hidden", HIDDEN)`: the knob itself assigned again
                direct = f"drop `{local} = {written}`: the constant is the value"
            found.append(
                (
                    path.name,
                    node.lineno,
                    f"{knobs[0]} ({path.name}:{node.lineno}: `{written}`, and {name} sets {dotted}: {shown(value)})",
                    f"use the constant directly ({direct}), or remove `{dotted}` from {name}",
                )
            )
    return [(text, fix) for _, _, text, fix in sorted(found)]
