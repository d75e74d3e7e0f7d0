"""The frozen side of a task: splits, the metric (with its direction), and the public files a trial may read.

This is the API a task folder's `prepare.py` uses (`Splits`, `stratified_split`, `DataError`); it runs on the
driver only. Scores are compared one way everywhere: `Metric.oriented` turns a metric value into a score where
higher is better (a sign, as Ray's ASHA does), so a `min` metric such as MSE is stored and ranked as -MSE.
"""

from __future__ import annotations

import difflib
import enum
import hashlib
import json
import numbers
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from ralph_ray.harness import PUBLIC_FILES


class DataError(RuntimeError):
    """A dataset is missing or corrupt; the message says how to fix it."""


# What preparing a task reads from the config. Protocols, not the config's classes: config imports the task
# registry to validate task names, so the tasks must not import config.
class TaskSettings(Protocol):
    """Which task and how to split it (`config.TaskConfig` is one)."""

    name: str
    split_seed: int
    selection_fraction: float
    test_fraction: float


class DataSource(Protocol):
    """Where a dataset that does not ship with the code lives, and how to fetch it (`config.DataConfig` is one)."""

    root: str | None
    download: bool
    url: str | None  # None: the task's own default
    md5: str | None


class Experiment(Protocol):
    """The parts of a config a task's preparation reads (`config.Config` is one)."""

    @property
    def task(self) -> TaskSettings: ...

    @property
    def data(self) -> DataSource: ...

    def task_folder(self) -> Path:
        """The task's folder (prepare.py, train.py, program.md, task.yaml)."""
        ...


class Direction(str, enum.Enum):
    """Whether a higher (max) or a lower (min) metric value is better."""

    max = "max"
    min = "min"


class MetricKind(str, enum.Enum):
    """What predictions a metric scores: class ids, real values, or anything the task's own `score` reads."""

    classification = "classification"
    regression = "regression"
    custom = "custom"


class ScoredBy(str, enum.Enum):
    """What the engine scores: the predictions a trainer saves, or its exported model run by the engine."""

    predictions = "predictions"
    model = "model"  # predictions can't be trusted (e.g. a language model): see ralph_ray.modeleval


@dataclass(frozen=True)
class Metric:
    """A task's frozen metric: its name, direction and kind, and the function that scores predictions."""

    name: str
    direction: Direction
    kind: MetricKind
    fn: Callable[[np.ndarray, np.ndarray], float] = field(repr=False, compare=False)
    scored_by: ScoredBy = ScoredBy.predictions

    @property
    def sign(self) -> float:
        """+1 for a max metric, -1 for a min metric: `sign * value` is a score where higher is better."""
        return 1.0 if self.direction is Direction.max else -1.0

    def oriented(self, value: float) -> float:
        """The engine's score of a metric value (higher is better); applied twice it gives the value back."""
        return self.sign * value

    def one_class(self, predictions: np.ndarray, targets: np.ndarray) -> str | None:
        """A warning when every prediction is one class while the targets hold several (None: nothing odd); the
        predictions must fit (`score` accepts them)."""
        if self.kind is not MetricKind.classification:
            return None
        predicted = np.unique(_fit(np.asarray(predictions), targets, self.kind).astype(np.int64))
        held = len(np.unique(targets))
        if len(predicted) != 1 or held < 2:
            return None
        cause = (
            "a model with a single output logit? argmax(1) over it is always 0: save `(logits > 0).long()`"
            if predicted[0] == 0 and held == 2  # a single logit is a binary model's
            else "a model that learnt one class?"
        )
        return f"every prediction is class {predicted[0]} while the labels hold {held} classes ({cause})"

    def score(self, predictions: np.ndarray, targets: np.ndarray) -> float:
        """The metric value of predictions against the engine-held targets (raises ValueError if they do not fit)."""
        predictions = _fit(np.asarray(predictions), targets, self.kind)
        value = float(self.fn(predictions, targets))
        if not np.isfinite(value):
            raise ValueError(f"{self.name} is {value}: the predictions hold NaN or inf")
        return value


def accuracy(predictions: np.ndarray, labels: np.ndarray) -> float:
    """Fraction of correct class predictions (higher is better)."""
    predictions = np.asarray(predictions).reshape(-1)
    if predictions.shape != labels.shape:
        raise ValueError(f"expected {labels.shape[0]} predictions, got {predictions.shape[0]}")
    return float((predictions == labels).mean())


def _macro_f1(predictions: np.ndarray, labels: np.ndarray) -> float:
    from sklearn.metrics import f1_score

    return float(f1_score(labels, predictions, average="macro"))


def _rows(predictions: np.ndarray, targets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Targets of more than two dimensions (images, sequences) as one row per example: sklearn reads at most two, and
    its uniform average over the columns is then the mean over every element (a user trial's reconstruction MSE
    failed every trial with "Found array with dim 4")."""
    if np.ndim(targets) <= 2:
        return predictions, targets
    return np.reshape(predictions, (len(predictions), -1)), np.reshape(targets, (len(targets), -1))


def _mse(predictions: np.ndarray, targets: np.ndarray) -> float:
    from sklearn.metrics import mean_squared_error

    predictions, targets = _rows(predictions, targets)
    return float(mean_squared_error(targets, predictions))


def _mae(predictions: np.ndarray, targets: np.ndarray) -> float:
    from sklearn.metrics import mean_absolute_error

    predictions, targets = _rows(predictions, targets)
    return float(mean_absolute_error(targets, predictions))


# The built-in metrics a task names in its METRIC; any other name needs the task's own `score` (kind custom).
BUILTIN: dict[str, tuple[MetricKind, Direction, Callable[[np.ndarray, np.ndarray], float]]] = {
    "accuracy": (MetricKind.classification, Direction.max, accuracy),
    "macro_f1": (MetricKind.classification, Direction.max, _macro_f1),
    "mse": (MetricKind.regression, Direction.min, _mse),
    "mae": (MetricKind.regression, Direction.min, _mae),
}
ACCURACY = Metric("accuracy", Direction.max, MetricKind.classification, accuracy)


class MetricError(ValueError):
    """A task's METRIC declaration the engine cannot use; the message says how to fix it."""


def declared_metric(declaration: Any, score: Callable[[np.ndarray, np.ndarray], float] | None) -> Metric:
    """The Metric a prepare.py declares: `METRIC = {"name": ..., "direction": "max" | "min"}` (+ optional `kind`).

    A built-in name (accuracy, macro_f1, mse, mae) must be declared with the built-in's direction, and is spelt in
    lower case (one spelling, so the knowledge base keeps one name for it); it is scored by the built-in function,
    or by the task's own frozen `score(predictions, targets) -> float` where prepare.py defines one (kind custom
    unless declared). Any other name needs that `score`.
    """
    example = 'METRIC = {"name": "mse", "direction": "min"}'
    if not isinstance(declaration, Mapping) or not isinstance(declaration.get("name"), str):
        raise MetricError(f"METRIC must be a dict with a name and a direction, e.g. {example}")
    name, direction = declaration["name"], declaration.get("direction")
    if direction not in ("max", "min"):
        raise MetricError(
            f"METRIC {name!r} has direction {direction!r}: say whether higher or lower is better, "
            f'METRIC = {{"name": {name!r}, "direction": "max"}} (or "min")'
        )
    if name != name.lower() and name.lower() in BUILTIN:
        raise MetricError(f'METRIC {name!r} is the built-in metric {name.lower()!r}: write "name": "{name.lower()}"')
    if name in BUILTIN:
        kind, implied, fn = BUILTIN[name]
        if Direction(direction) is not implied:
            better = "higher" if implied is Direction.max else "lower"
            raise MetricError(f'METRIC {name!r} is better when {better}: set "direction": "{implied.value}"')
        if score is None:
            return Metric(name, implied, kind, fn, _scored_by(declaration))
    if score is None:
        # a near spelling or an abbreviation ("acc") of a built-in is named first: the likeliest fix
        near = (
            difflib.get_close_matches(name.lower(), BUILTIN, n=1, cutoff=0.6)
            or [b for b in BUILTIN if name and b.startswith(name.lower())][:1]
        )
        hint = f"did you mean {near[0]!r}? " if near else ""
        raise MetricError(
            f"METRIC {name!r} is not built in ({', '.join(BUILTIN)}): {hint}define "
            "`def score(predictions, targets) -> float` in prepare.py, or name a built-in metric"
        )
    kind = declaration.get("kind", MetricKind.custom.value)
    if kind not in {k.value for k in MetricKind}:
        raise MetricError(f"METRIC kind {kind!r} is unknown: use one of {', '.join(k.value for k in MetricKind)}")
    return Metric(name, Direction(direction), MetricKind(kind), score, _scored_by(declaration))


# Metric names whose better direction is well known. A custom metric may be named anything, but one named like these
# and declared the other way is most likely a slip (a user trial ran a whole campaign minimising R^2), so preparing a
# task and starting a campaign warn. Matched on the name's words (`val_r2`, `macro-f1`, `top1_acc`, `test_loss`).
USUALLY_HIGHER = frozenset(
    {"r2", "auc", "roc_auc", "f1", "precision", "recall", "accuracy", "acc", "top1", "top5", "bleu", "iou", "dice"}
)
USUALLY_LOWER = frozenset(
    {"rmse", "mse", "mae", "mape", "loss", "nll", "perplexity", "ppl", "error", "bits_per_byte", "bpb", "wer", "cer"}
)


def unusual_direction(metric: Metric) -> str | None:
    """A warning when a metric's name is a well-known one declared with the other direction (None: nothing odd)."""
    name = metric.name.lower().replace("-", "_").replace(" ", "_")
    words = {name, *name.split("_")}
    higher, lower = sorted(words & USUALLY_HIGHER), sorted(words & USUALLY_LOWER)
    if higher and lower:  # "error" and "accuracy" in one name: no guess
        return None
    if metric.direction is Direction.min and higher:
        known, usual, sought = higher[0], Direction.max, "lowest"
    elif metric.direction is Direction.max and lower:
        known, usual, sought = lower[0], Direction.min, "highest"
    else:
        return None
    return (
        f'METRIC {metric.name!r} is declared "direction": "{metric.direction.value}", but {known} is usually better '
        f"when {'higher' if usual is Direction.max else 'lower'}: the campaign will look for the {sought} "
        f'{metric.name}. If that is meant, carry on; if not, set "direction": "{usual.value}" in prepare.py'
    )


def scored_by_builtin(metric: Metric) -> bool:
    """Whether the built-in function of the metric's name scores it (not prepare.py's own score())."""
    builtin = BUILTIN.get(metric.name)
    return builtin is not None and metric.fn is builtin[2]


def describe(metric: Metric) -> str:
    """A metric, its direction and who scores it (a built-in function or prepare.py's own score()), for the console."""
    builtin = BUILTIN.get(metric.name)
    if scored_by_builtin(metric):
        by = f"the built-in {metric.name}"
    elif builtin is not None:
        by = f"prepare.py's own score() (kind {metric.kind.value}), not the built-in {metric.name}"
    else:
        by = "prepare.py's score()"
    if metric.scored_by is ScoredBy.model:
        by += " on the outputs of the trainer's exported model"
    better = "higher" if metric.direction is Direction.max else "lower"
    return f"metric {metric.name} ({better} is better), scored by {by}"


def unscorable_targets(splits: Splits) -> str | None:
    """Why the task's metric cannot score the selection targets taken as predictions (a trainer that predicted them
    exactly), or None: a metric that cannot read the targets' shape fails here, when the task is prepared, not in
    every trial's scoring. The exported model's outputs (scored_by model) are no targets: not checked."""
    metric = splits.metric
    if metric.scored_by is ScoredBy.model:
        return None
    targets = splits.labels().selection
    try:
        metric.score(targets, targets)
    except Exception as err:  # noqa: BLE001 - a task's own score function may raise anything
        return (
            f"metric {metric.name} cannot score the selection targets ({targets.dtype}, shape {targets.shape}) "
            f"taken as predictions: {type(err).__name__}: {err}"
        )
    return None


def _scored_by(declaration: Mapping[str, Any]) -> ScoredBy:
    """`"scored_by": "model"`: the engine runs the trainer's exported model (harness.save_model) on the held-out
    inputs instead of trusting the predictions it saved."""
    by = declaration.get("scored_by", ScoredBy.predictions.value)
    if by not in {b.value for b in ScoredBy}:
        raise MetricError(f"METRIC scored_by {by!r} is unknown: use one of {', '.join(b.value for b in ScoredBy)}")
    return ScoredBy(by)


def _fit(predictions: np.ndarray, targets: np.ndarray, kind: MetricKind) -> np.ndarray:
    """Predictions shaped and typed for the metric's kind, or ValueError saying what the trainer got wrong."""
    if predictions.ndim == 0 or len(predictions) != len(targets):
        got = 0 if predictions.ndim == 0 else len(predictions)
        raise ValueError(f"expected {len(targets)} predictions, got {got}")
    if kind is MetricKind.custom:
        return predictions
    if predictions.ndim > 1 and predictions.shape[1:] == (1,) * (predictions.ndim - 1):
        predictions = predictions.reshape(-1)
    if kind is MetricKind.classification:
        if predictions.ndim != 1 or not (np.issubdtype(predictions.dtype, np.integer) or predictions.dtype == bool):
            raise ValueError(
                f"a classification metric scores one class id per input (integers, shape (N,)); got "
                f"{predictions.dtype} of shape {predictions.shape}: save `logits.argmax(1)` for one logit per "
                "class; for a single logit (BCEWithLogitsLoss) `(logits > 0).long()`, for probabilities of the "
                "positive class `(probs > 0.5).long()` (argmax(1) of a single logit is always 0)"
            )
        return predictions
    if predictions.shape != targets.shape and predictions.size == targets.size and targets.ndim > 1:
        predictions = predictions.reshape(targets.shape)  # flattened images (N, H*W) against (N, C, H, W) targets
    if predictions.shape != targets.shape or not np.issubdtype(predictions.dtype, np.number):
        raise ValueError(
            f"a regression metric scores numbers shaped like the targets {targets.shape}; got "
            f"{predictions.dtype} of shape {predictions.shape}"
        )
    return predictions.astype(np.float64)


@dataclass(frozen=True)
class Splits:
    """All three splits and the task's metric. Selection and test labels/targets never leave the engine."""

    train_x: np.ndarray
    train_y: np.ndarray
    selection_x: np.ndarray
    selection_y: np.ndarray
    test_x: np.ndarray
    test_y: np.ndarray
    num_classes: int = 0  # 0 for a task without classes (regression, language modelling)
    metric: Metric = ACCURACY
    # More public files a trial may read, by name (e.g. a base model to fine-tune); never labels or targets.
    files: Mapping[str, bytes] = field(default_factory=dict)

    def labels(self) -> Labels:
        """The engine-side labels or targets used for frozen scoring, with the metric that scores against them."""
        return Labels(
            selection=target_array(self.selection_y, self.metric),
            test=target_array(self.test_y, self.metric),
            metric=self.metric,
        )


@dataclass(frozen=True)
class Labels:
    """Selection and test labels (or targets), kept by the engine to score predictions, and the metric."""

    selection: np.ndarray
    test: np.ndarray
    metric: Metric = ACCURACY


def target_array(values: np.ndarray, metric: Metric) -> np.ndarray:
    """Labels as int64 class ids for a classification metric; other targets as they are."""
    if metric.kind is MetricKind.classification:
        return np.asarray(values).astype(np.int64)
    return np.asarray(values)


def stratified_split(y: np.ndarray, fractions: tuple[float, ...], seed: int) -> list[np.ndarray]:
    """Split indices per class so each part keeps the class balance; the rest goes to the first part."""
    rng = np.random.default_rng(seed)
    parts: list[list[np.ndarray]] = [[] for _ in range(len(fractions) + 1)]
    for cls in np.unique(y):
        idx = rng.permutation(np.flatnonzero(y == cls))
        start = 0
        for i, fraction in enumerate(fractions, start=1):
            count = int(round(fraction * len(idx)))
            parts[i].append(idx[start : start + count])
            start += count
        parts[0].append(idx[start:])
    return [np.sort(np.concatenate(p)) for p in parts]


def random_split(n: int, fractions: tuple[float, ...], seed: int) -> list[np.ndarray]:
    """Split range(n) at random (for targets without classes); the rest goes to the first part."""
    order = np.random.default_rng(seed).permutation(n)
    counts = [int(round(f * n)) for f in fractions]
    edges = np.cumsum([n - sum(counts), *counts])[:-1]
    return [np.sort(part) for part in np.split(order, edges)]


# Public arrays whose text takes at least this much memory as fixed-width strings are named when a task is prepared.
TEXT_NOTE_BYTES = 1 << 30


def text_limit_bytes() -> int | None:
    """The most memory text inputs may take as fixed-width strings: half of this machine's physical memory (None
    where the OS does not say). Checked before converting: under Linux's overcommit a larger conversion is not
    refused with MemoryError but allocated page by page, until the process thrashes or is OOM-killed."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2
    except (ValueError, OSError, AttributeError):  # no sysconf (Windows) or no such name
        return None


def public_array(values: Any, name: str, where: str = "prepare()", limit: int | None = None) -> np.ndarray:
    """An array as trials can memory-map it: text (an object array of `str` such as `df["text"].values`, pandas 3's
    string arrays, numpy 2's StringDType) becomes fixed-width unicode (`<U<longest>`) when it fits in `limit` bytes
    (default `text_limit_bytes()`); an object array of real numbers only (`df.values` over int and bool columns)
    becomes float64; any other object array raises DataError with the fix (np.load cannot memory-map Python objects:
    every trial failed on it, after `prepare` said OK)."""
    array = np.asarray(values)
    if array.dtype.kind == "T":  # StringDType: its missing values (na_object) then show as what they are
        array = array.astype(object)
    if not array.dtype.hasobject:
        return array
    flat = array.reshape(-1)
    odd = next(((i, v) for i, v in enumerate(flat) if not isinstance(v, str)), None)
    if odd is None and array.dtype == object:
        longest = max((len(v) for v in flat), default=0)
        need = array.size * longest * 4
        allowed = f"more than the {_size(limit)} allowed" if limit is not None else ""
        if limit is None and (limit := text_limit_bytes()) is not None:
            allowed = f"more than half this machine's physical memory ({_size(limit)})"
        if limit is not None and need > limit:
            raise _too_big(where, name, array.size, longest, need, allowed)
        try:
            return np.asarray(array, dtype=str)
        except MemoryError:
            raise _too_big(where, name, array.size, longest, need, "more than this machine could allocate") from None
    if array.dtype == object:
        # name what is neither text nor a number first (a dict among numbers); else the first non-text (a NaN)
        stray = next(((i, v) for i, v in enumerate(flat) if not isinstance(v, (str, numbers.Real, np.bool_))), None)
        if stray is None and not any(isinstance(v, str) for v in flat):
            return array.astype(np.float64)  # bool, int and float columns together (`df.values`)
        odd = stray or odd
    found = (
        f"element {odd[0]} is {type(odd[1]).__name__} ({odd[1]!r:.40}), not str{' or a number' * (odd is stray)}"
        if odd is not None
        else f"its dtype {array.dtype} holds Python objects"
    )
    raise DataError(
        f"{where}: {name} is an array of Python objects, which trials cannot memory-map: {found}\n"
        "  fix: return numbers (features, token ids) or text as strings, each input one str: missing texts filled "
        '(df["text"].fillna("").to_numpy(dtype=str)); a dict, list or None per input cannot be saved for trials: '
        "encode it as numeric arrays in prepare()"
    )


def _too_big(where: str, name: str, count: int, longest: int, need: int, over: str) -> DataError:
    """The error for text too large as fixed-width strings, with its size and the fix."""
    return DataError(
        f"{where}: {name} holds {count} texts of up to {longest} characters: as fixed-width strings (every text as "
        f"wide as the longest, 4 bytes a character) they need {_size(need)}, {over}"
        '\n  fix: truncate the texts in prepare() (df["text"].str.slice(0, 2000)), or tokenise them there '
        "and return the token ids"
    )


def text_memory_note(splits: Splits, limit: int = TEXT_NOTE_BYTES) -> str | None:
    """What the public text inputs cost as fixed-width strings, when that is at least `limit` bytes (None: less or
    no text)."""
    texts = {
        name: array
        for name in ("train_x", "selection_x", "test_x")
        if (array := np.asarray(getattr(splits, name))).dtype.kind == "U"
    }
    total = sum(array.nbytes for array in texts.values())
    if not texts or total < limit:
        return None
    sizes = ", ".join(
        f"{name} {len(array)} x {array.dtype.itemsize // 4} characters x 4 bytes" for name, array in texts.items()
    )
    return (
        f"text inputs take {_size(total)} as fixed-width numpy strings ({sizes}): every text is as wide as the "
        "longest. Truncate long texts in prepare() or return token ids to cut it"
    )


def _size(count: int) -> str:
    """A byte count for people (MB or GB)."""
    return f"{count / 1e9:.1f} GB" if count >= 1e9 else f"{count / 1e6:.1f} MB"


def write_public(splits: Splits, out_dir: Path, task: str) -> dict[str, str]:
    """Write what a trial may read (no selection/test labels) and return each file's sha256."""
    out_dir.mkdir(parents=True, exist_ok=True)
    arrays = {
        "train_x.npy": splits.train_x,
        "train_y.npy": target_array(splits.train_y, splits.metric),
        "selection_x.npy": splits.selection_x,
        "test_x.npy": splits.test_x,
    }
    # Splits made by hand (not through tasks.prepare_task) are held to the same rule here
    arrays = {name: public_array(array, name.removesuffix(".npy")) for name, array in arrays.items()}
    for name, array in arrays.items():
        _atomic_save(out_dir / name, np.ascontiguousarray(array))
    meta = {
        "task": task,
        "num_classes": splits.num_classes,
        "metric": {
            "name": splits.metric.name,
            "direction": splits.metric.direction.value,
            "kind": splits.metric.kind.value,
        },
        "shapes": {name: list(array.shape) for name, array in arrays.items()},
    }
    for name, content in splits.files.items():
        if name in PUBLIC_FILES or Path(name).name != name or name.startswith("."):
            raise DataError(f"public file name {name!r}: use a plain file name other than {', '.join(PUBLIC_FILES)}")
        _atomic_write(out_dir / name, content)
    if splits.files:
        meta["files"] = sorted(splits.files)
    (out_dir / "meta.json").write_text(json.dumps(meta, indent=2))
    return {name: sha256_file(out_dir / name) for name in (*PUBLIC_FILES, *sorted(splits.files))}


def sha256_file(path: Path) -> str:
    """Content hash of a file, read in chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _atomic_write(path: Path, content: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(content)
    os.replace(tmp, path)


def _atomic_save(path: Path, array: np.ndarray) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("wb") as handle:
        np.save(handle, array)
    os.replace(tmp, path)
