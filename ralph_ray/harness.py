"""The trainer-side helper: the only engine module a trainer imports (data, report, predictions, exported model,
device, checkpoint, time budget).

It stays free of Ray and of the engine's heavy imports so a trial's subprocess starts fast and a
trainer also runs by hand (`python train.py`) against data prepared with `python -m ralph_ray.prepare`.
"""

from __future__ import annotations

import atexit
import itertools
import json
import math
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, Sized, cast

import numpy as np

# The trial driver sets these; defaults make a hand run write next to the trainer.
ENV_DATA_DIR = "RALPH_DATA_DIR"
ENV_METRICS_FILE = "RALPH_METRICS_FILE"
ENV_PREDICTIONS_FILE = "RALPH_PREDICTIONS_FILE"
ENV_SEED = "RALPH_SEED"
ENV_DEVICE = "RALPH_DEVICE"
ENV_CHECKPOINT_DIR = "RALPH_CHECKPOINT_DIR"
ENV_CHECKPOINT_EVERY_S = "RALPH_CHECKPOINT_EVERY_S"
ENV_BUDGET_S = "RALPH_BUDGET_S"  # the trial's time budget in seconds (unset: none, train for EPOCHS)
ENV_USAGE_FILE = "RALPH_USAGE_FILE"  # where this process's peak memory goes at each report and at exit
# "1": this trainer is a worker of a data-parallel group (set by ralph_ray.dataparallel beside the torch.distributed
# variables; by hand under torchrun). Keyed on our own name, so an engine started under torchrun or SLURM, whose
# environment its single trials inherit, never makes them join a group.
ENV_GROUP = "RALPH_GROUP"
PEAK_RSS_KEY = "peak_rss_mb"  # usage file keys (MiB): ru_maxrss, and torch.cuda.max_memory_allocated where used
PEAK_GPU_KEY = "peak_gpu_mb"
MODEL_FILE = "model.pt2"  # save_model's export, in the work dir: what a task scored by its model is scored on
CHECKPOINT_FILE = "checkpoint.pt"
TRAIN_SECONDS = "train_seconds"  # the key every report carries: ASHA's time attribute under a time budget
_last_save = -math.inf  # monotonic time of this process's last checkpoint
_unreported_save = False  # a checkpoint was saved since the last report (the next report names it by its epoch)
# The budget's clock starts when training starts: the first step of `epochs()` (or, for a trainer that does not
# loop over it, the import of this module). Start-up (Python, torch's lazy imports, data, model) is not training
# time; the engine's grace margin covers it, and its own limit counts from the process start.
_CLOCK_START = time.monotonic()
_clock_started = False
_epoch_s = 0.0  # the longest epoch so far (as `epochs()` measured it): what the next one is expected to take

PUBLIC_FILES = ("train_x.npy", "train_y.npy", "selection_x.npy", "test_x.npy", "meta.json")


@dataclass(frozen=True)
class Dataset:
    """What a trial may see: labelled train data, and selection/test inputs without labels."""

    train_x: np.ndarray
    train_y: np.ndarray
    selection_x: np.ndarray
    test_x: np.ndarray
    num_classes: int


def data_dir() -> Path:
    """The prepared public data dir, from the environment."""
    value = os.environ.get(ENV_DATA_DIR)
    if not value:
        sys.exit(
            f"{ENV_DATA_DIR} is not set. Prepare the data first, e.g.\n"
            "  python -m ralph_ray.prepare              # digits\n"
            "  python -m ralph_ray.prepare +experiment=cifar10 data.root=/path/to/cifar\n"
            f"then export the {ENV_DATA_DIR}=... line it prints."
        )
    return Path(value)


def load_data() -> Dataset:
    """Load the public splits (memory-mapped, so large datasets open instantly)."""
    root = data_dir()
    missing = [name for name in PUBLIC_FILES if not (root / name).exists()]
    if missing:
        sys.exit(f"{root} lacks {', '.join(missing)}: run `python -m ralph_ray.prepare` for this task again.")
    meta = json.loads((root / "meta.json").read_text())
    return Dataset(
        train_x=_load(root / "train_x.npy"),
        train_y=_load(root / "train_y.npy"),
        selection_x=_load(root / "selection_x.npy"),
        test_x=_load(root / "test_x.npy"),
        num_classes=int(meta["num_classes"]),
    )


# numpy's refusal to memory-map an array of Python objects (numpy.lib.format.open_memmap).
OBJECT_MMAP_REFUSAL = "Python objects in dtype"


def _load(path: Path) -> np.ndarray:
    """One public array, memory-mapped copy-on-write: writable arrays (torch.as_tensor warned "The given NumPy array is
    not writable" in every trial of a user's trainer) whose writes stay in this process's memory."""
    try:
        return np.load(path, mmap_mode="c")
    except ValueError as err:
        # an object array, saved before prepare turned text into fixed-width strings; anything else (a truncated or
        # corrupt file: "mmap length is greater than file size") is no object array, and says so itself
        if OBJECT_MMAP_REFUSAL not in str(err):
            raise
        sys.exit(
            f"{path} cannot be memory-mapped ({err}): run `python -m ralph_ray.prepare` for this task again; it "
            "saves text as fixed-width strings and refuses other Python objects"
        )


def public_file(name: str) -> Path:
    """A further public file of the task (e.g. `base_policy.zip`, a model to fine-tune), read-only, by name."""
    path = data_dir() / name
    if not path.is_file():
        sys.exit(f"{path.parent} has no public file {name!r}: this task's prepare.py does not provide it.")
    return path


def seed() -> int:
    """The trial's seed (0 when run by hand)."""
    return int(os.environ.get(ENV_SEED, "0"))


def device() -> str:
    """The device this trial was given: RALPH_DEVICE if set, else cuda when visible, else cpu."""
    if os.environ.get(ENV_DEVICE):
        return os.environ[ENV_DEVICE]
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


# -----------------------------------------------------------------------------
# Time budget (trial.budget_s): every trial trains for the same seconds, so a kept change is better code,
# not more compute. Without a budget these fall back to the trainer's fixed EPOCHS.


def budget_s() -> float | None:
    """This trial's training-time budget in seconds, or None (no budget: train for the fixed EPOCHS)."""
    value = os.environ.get(ENV_BUDGET_S)
    return float(value) if value else None


def train_seconds() -> float:
    """Seconds of training so far (since `epochs()` began, or since the harness was imported)."""
    return time.monotonic() - _CLOCK_START


def time_left() -> float:
    """Seconds left before the deadline (may be negative past it); math.inf without a budget."""
    budget = budget_s()
    return math.inf if budget is None else budget - train_seconds()


def progress(step: int, total_steps: int) -> float:
    """How far through its schedule training is, in [0, 1]: by time under a budget, else step / total_steps.

    A schedule written against it (learning rate, averaging, augmentation strength) fits whatever length
    training gets: `lr = peak * schedule(harness.progress(step, total_steps))`.
    """
    budget = budget_s()
    done = train_seconds() / budget if budget is not None else step / max(1, total_steps)
    if budget is not None and in_group():  # the ranks' clocks differ a little: one schedule for the whole group
        done = mean_across(done)
    return min(1.0, max(0.0, done))


# torch's OneCycleLR defaults: it starts at max_lr / 25 and ends at that / 1e4
_ONE_CYCLE_START, _ONE_CYCLE_END, _ONE_CYCLE_PEAK_AT = 1 / 25, 1 / 25 / 1e4, 0.25


def lr_factor(step: int, epochs: int, anneal: str | None = None, warmup_epochs: int = 0) -> float:
    """The learning rate's multiplier after `step` epochs, for a `LambdaLR` stepped once per epoch.

    A linear warmup from 10% over `warmup_epochs` (torch's `LinearLR(start_factor=0.1)`), times an anneal along
    `progress(step, epochs)`: "cosine" (`CosineAnnealingLR` to zero) or "one_cycle" (`OneCycleLR`'s shape, up over
    the first quarter, then down). Under a time budget the progress is by time, so the schedule ends where training
    does however many epochs run (torch's schedulers need the count up front: OneCycleLR raises past it, and
    CosineAnnealingLR climbs back up).
    """
    factor = min(1.0, 0.1 + 0.9 * step / warmup_epochs) if warmup_epochs > 0 else 1.0
    if anneal is None:
        return factor
    done = progress(step, epochs)
    if anneal == "cosine":
        return factor * 0.5 * (1 + math.cos(math.pi * done))
    if anneal != "one_cycle":
        raise ValueError(f'lr_factor: anneal must be "cosine", "one_cycle" or None, not {anneal!r}')
    if done < _ONE_CYCLE_PEAK_AT:
        low, high, part = _ONE_CYCLE_START, 1.0, done / _ONE_CYCLE_PEAK_AT
    else:
        low, high, part = 1.0, _ONE_CYCLE_END, (done - _ONE_CYCLE_PEAK_AT) / (1 - _ONE_CYCLE_PEAK_AT)
    return factor * (high + (low - high) * 0.5 * (1 + math.cos(math.pi * part)))


def epochs(limit: int) -> Iterator[int]:
    """Epoch numbers 1, 2, ...: up to `limit` without a budget; with one, as many as end before the deadline.

    It times the epochs itself (the time between two steps of the loop) and starts another only while the
    time left exceeds the longest epoch so far, so a trainer that loops over it stops on time.
    """
    global _epoch_s, _CLOCK_START, _clock_started
    if not _clock_started:
        _CLOCK_START, _clock_started = time.monotonic(), True
    epoch = 0
    while True:
        if budget_s() is None:
            if epoch >= limit:
                return
        elif epoch > 0 and any_across(time_left() < _epoch_s):  # a group stops together (no rank left waiting)
            return
        began = time.monotonic()
        epoch += 1
        yield epoch
        _epoch_s = max(_epoch_s, time.monotonic() - began)


def report(**metrics: float) -> None:
    """Report one epoch's metrics (must include `epoch`) as a JSON line the trial driver tails.

    Each report also carries `train_seconds` (unless given): the training time so far, which ASHA's rungs
    count under a time budget and which the knowledge base shows as each score's cost.
    """
    if "epoch" not in metrics:
        raise ValueError("report() needs epoch=<int>: ASHA's time attribute is the epoch")
    metrics.setdefault(TRAIN_SECONDS, round(train_seconds(), 3))
    record = {key: _plain(value) for key, value in metrics.items()}
    _keep_for_epoch(int(record["epoch"]))  # before the line: once the driver reads it, the file is there
    line = json.dumps(record, allow_nan=True)
    path = Path(os.environ.get(ENV_METRICS_FILE, "metrics.jsonl"))
    # One write of a whole line, then flush: the driver never reads half a record.
    with path.open("a") as handle:
        handle.write(line + "\n")
        handle.flush()
    if is_main():  # every rank writes its line (the engine keeps the ranks in step); one prints
        print(" ".join(f"{k}={_fmt(v)}" for k, v in record.items()), flush=True)
    _write_usage()


@atexit.register
def _write_usage() -> None:
    """Write this process's peak memory (MiB) where the engine reads it; a hand run (no RALPH_USAGE_FILE) skips it."""
    value = os.environ.get(ENV_USAGE_FILE)
    if not value:
        return
    import resource

    # ru_maxrss is in KiB on Linux; the children's covers data-loader workers this process has reaped.
    kib = max(resource.getrusage(who).ru_maxrss for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    usage = {PEAK_RSS_KEY: kib / 1024}
    torch = sys.modules.get("torch")  # only a trainer that imported torch and started CUDA has a GPU peak
    if torch is not None and torch.cuda.is_initialized():
        cuda = torch.cuda
        usage[PEAK_GPU_KEY] = sum(cuda.max_memory_allocated(d) for d in range(cuda.device_count())) / 2**20
    path = Path(value)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_text(json.dumps(usage))
        os.replace(tmp, path)
    except OSError:
        pass  # the work dir is gone (the trial was cleaned up): the engine's own samples stand


def save_predictions(selection: np.ndarray, test: np.ndarray) -> None:
    """Write predictions for the selection and test inputs (class ids, or values for a regression task); the engine
    scores them with the task's frozen metric. Data-parallel: rank 0's count, the other ranks' are skipped."""
    if not is_main():
        return
    selection, test = _predictions(selection), _predictions(test)
    path = Path(os.environ.get(ENV_PREDICTIONS_FILE, "predictions.npz"))
    tmp = path.with_suffix(".tmp.npz")
    np.savez(tmp, selection=selection, test=test)
    os.replace(tmp, path)


def save_model(model: object, example: object) -> None:
    """Export the trained model (`torch.export`: loads without the trainer's code) for a task the engine scores by
    running the model on the held-out inputs (its METRIC says `"scored_by": "model"`); `example` is a small batch of
    inputs as the model takes them (e.g. `torch.tensor(data.train_x[:8])`). The batch size stays free where it can."""
    import torch

    module = cast(torch.nn.Module, model)
    was_training = module.training
    module.eval()
    inputs = example if isinstance(example, torch.Tensor) else torch.as_tensor(np.asarray(example))
    try:
        program = torch.export.export(module, (inputs,), dynamic_shapes=({0: torch.export.Dim.AUTO},))
    finally:
        module.train(was_training)
    path = Path(MODEL_FILE)
    tmp = path.with_name(f"{path.stem}.tmp.pt2")
    torch.export.save(program, tmp)
    os.replace(tmp, path)


def _predictions(values: np.ndarray) -> np.ndarray:
    """Class ids as int64 (N,), real values as float64 (one per input, or one row per input)."""
    array = np.asarray(values)
    if np.issubdtype(array.dtype, np.integer) or array.dtype == bool:
        return array.astype(np.int64).reshape(-1)
    array = array.astype(np.float64)
    return array.reshape(-1) if array.ndim > 1 and array.shape[1:] == (1,) * (array.ndim - 1) else array


def save_checkpoint(state: dict) -> None:
    """Save what training needs to continue (torch.save, atomically); call it each epoch right before report().

    The trial driver forwards it to Tune's storage with that epoch's report; a trial retried on another node
    (its node was lost) gets it back through `load_checkpoint()`. It saves only where the engine asks for
    checkpoints (RALPH_CHECKPOINT_DIR: a cluster with shared storage), at most every RALPH_CHECKPOINT_EVERY_S
    seconds; otherwise (one machine, a hand run, the gate's smoke run) it returns at once.
    """
    global _last_save, _unreported_save
    folder = _checkpoint_dir()
    if not is_main():  # data-parallel ranks hold the same weights: rank 0's checkpoint serves them all
        return
    if folder is None or time.monotonic() - _last_save < float(os.environ.get(ENV_CHECKPOINT_EVERY_S) or 0):
        return
    import torch

    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".{CHECKPOINT_FILE}.tmp"
    torch.save(state, tmp)
    os.replace(tmp, folder / CHECKPOINT_FILE)  # the driver never uploads half a file
    _last_save, _unreported_save = time.monotonic(), True


def epoch_checkpoint(epoch: int | str) -> str:
    """The name under which the checkpoint saved for `epoch` waits in the checkpoint dir for the driver."""
    return f"epoch-{epoch}.{CHECKPOINT_FILE}"


def _keep_for_epoch(epoch: int) -> None:
    """Link the checkpoint just saved under its epoch's name: the driver may read this report only after the
    trainer has saved newer ones, and must send Tune this epoch's weights with it, not the latest file's."""
    global _unreported_save
    folder = _checkpoint_dir()
    if folder is None or not _unreported_save:
        return
    _unreported_save = False
    kept = folder / epoch_checkpoint(epoch)
    kept.unlink(missing_ok=True)
    try:
        os.link(folder / CHECKPOINT_FILE, kept)
    except OSError:  # a filesystem without hard links
        shutil.copy2(folder / CHECKPOINT_FILE, kept)


def load_checkpoint() -> dict | None:
    """The state of the last `save_checkpoint` of this trial (on CPU), or None on a fresh start."""
    folder = _checkpoint_dir()
    if folder is None or not (folder / CHECKPOINT_FILE).exists():
        return None
    import torch

    # Written by this trial's own code into this campaign's storage: full unpickling is fine, and lets a
    # trainer keep numpy or Python RNG states next to its tensors.
    return torch.load(folder / CHECKPOINT_FILE, map_location="cpu", weights_only=False)


# Telemetry probes: a plateau is val_acc not beating its earlier best by PLATEAU_DELTA over PLATEAU_EPOCHS epochs
# (the heuristic analyst's own window and threshold, so the flag and its diagnosis agree).
PROBE_METRICS = ("gen_gap", "weight_norm", "update_norm", "update_ratio", "eff_rank", "plateau")
PLATEAU_EPOCHS = 3
PLATEAU_DELTA = 0.002
_probe_state: dict[int, dict] = {}  # per model (by id): the previous weights, the val_acc history


def probes(model: object, train_loss: float, val_loss: float, val_acc: float | None = None) -> dict[str, float]:
    """Telemetry for one epoch, to spread into the report: `harness.report(epoch=..., **harness.probes(model, ...))`.

    gen_gap: val_loss - train_loss. weight_norm: L2 norm of all parameters. update_norm: L2 norm of their change
    since the last call (update_ratio: relative to weight_norm; a collapse means training has stopped moving).
    eff_rank: effective rank (exp of the entropy of the normalised singular values) of the largest weight matrix;
    it falls as a layer collapses onto few directions. plateau: 1.0 when val_acc has stalled (see PLATEAU_EPOCHS).
    `model` is an nn.Module or a list of parameter tensors (a functional trainer's weights). Costs one copy of the
    weights and one SVD per epoch.
    """
    import torch

    tensors = model.parameters() if hasattr(model, "parameters") else model  # type: ignore[union-attr]
    params = [p.detach() for p in tensors]  # type: ignore[union-attr]
    flat = torch.cat([p.reshape(-1).float() for p in params]) if params else torch.zeros(1)
    state = _probe_state.setdefault(id(model), {"previous": None, "acc": []})
    weight_norm = float(flat.norm())
    previous = state["previous"]
    update = float((flat - previous).norm()) if previous is not None and previous.shape == flat.shape else math.nan
    state["previous"] = flat.clone()
    out = {
        "gen_gap": float(val_loss) - float(train_loss),
        "weight_norm": weight_norm,
        "update_norm": update,
        "update_ratio": update / weight_norm if weight_norm > 0 else math.nan,
        "eff_rank": _effective_rank(params),
    }
    if val_acc is not None:
        history = state["acc"]
        history.append(float(val_acc))
        recent, earlier = history[-PLATEAU_EPOCHS:], history[:-PLATEAU_EPOCHS]
        stalled = bool(earlier) and max(recent) < max(earlier) + PLATEAU_DELTA
        out["plateau"] = 1.0 if stalled else 0.0
    return {k: v for k, v in out.items() if not (isinstance(v, float) and math.isnan(v))}


def _effective_rank(params: list) -> float:
    """exp(entropy of the normalised singular values) of the largest 2-D (or conv, flattened) weight."""
    import torch

    matrices = [p.reshape(p.shape[0], -1).float() for p in params if p.dim() >= 2]
    if not matrices:
        return math.nan
    largest = max(matrices, key=lambda m: m.numel())
    if not bool(torch.isfinite(largest).all()):
        return math.nan  # a diverged model: its report (loss nan) says so; the probe must not crash the trial
    singular = torch.linalg.svdvals(largest)
    share = singular / singular.sum().clamp_min(1e-12)
    return float(torch.exp(-(share * share.clamp_min(1e-12).log()).sum()))


def _checkpoint_dir() -> Path | None:
    value = os.environ.get(ENV_CHECKPOINT_DIR)
    return Path(value) if value else None


def _plain(value: object) -> float | int | str:
    """Turn tensors and numpy scalars into JSON-able Python numbers."""
    if hasattr(value, "item"):
        value = value.item()  # type: ignore[union-attr]
    if isinstance(value, (bool, int, float, str)):
        return value
    raise TypeError(f"report() takes numbers, got {type(value).__name__}")


def _fmt(value: float | int | str) -> str:
    if isinstance(value, float) and math.isfinite(value):
        return f"{value:.4g}"
    return str(value)


# -----------------------------------------------------------------------------
# Data parallel (resources.workers_per_trial=N): the engine starts N copies of train.py with the torch.distributed
# environment set (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT). In a single trial (or a hand run) every
# helper below is a no-op, so a trainer written with them runs unchanged. A group of one (resources.ray_train with
# N = 1) is still a group: the helpers start its NCCL/gloo group and wrap the model, the data-parallel path whole.

SHARD_FILE = "shard.json"  # in the work dir: which train rows this rank saw (for people and tests)


def rank() -> int:
    """This worker's rank among the trial's workers (0 in a single trial, whatever RANK it inherited)."""
    return int(os.environ.get("RANK", "0")) if in_group() else 0


def world_size() -> int:
    """How many workers train this trial together (1 in a single trial, whatever WORLD_SIZE it inherited)."""
    return int(os.environ.get("WORLD_SIZE", "1")) if in_group() else 1


def is_main() -> bool:
    """True on rank 0: the worker that reports for the trial, checkpoints and writes predictions."""
    return rank() == 0


def in_group() -> bool:
    """Whether this trainer is a worker of a data-parallel group (even of one: resources.ray_train at N = 1)."""
    return os.environ.get(ENV_GROUP) == "1"


def init_distributed() -> None:
    """Join the trial's process group (NCCL on GPU, gloo on CPU); each rank takes its own GPU. Single trial: nothing."""
    if not in_group():
        return
    import torch
    import torch.distributed as dist

    if dist.is_initialized():
        return
    cuda = device().startswith("cuda")
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank(), world_size=world_size())


def shard(rows: int) -> np.ndarray:
    """This rank's rows of a split of `rows` rows: every world_size-th from its rank, disjoint, all of equal size
    (the last rows % world_size rows are left out, so every rank takes as many steps and DDP stays in step)."""
    indices = np.arange(rank(), rows - rows % world_size(), world_size())
    if world_size() > 1:
        Path(SHARD_FILE).write_text(json.dumps({"rank": rank(), "world_size": world_size(), "rows": indices.tolist()}))
    return indices


def stride(batches: Sized) -> Iterable:
    """This rank's batches of an epoch: every world_size-th from its rank, as many on every rank (the last
    len % world_size are left out, so every rank takes as many steps and DDP's all-reduces pair up); all of them
    in a single trial. `batches`: anything with a length (a range of offsets, a list, a DataLoader)."""
    if not in_group():
        return batches  # type: ignore[return-value]
    try:
        count = len(batches) // world_size()
    except TypeError:
        raise TypeError(
            "harness.stride needs batches with a length (a range, a list, a DataLoader), got "
            f"{type(batches).__name__}: every rank must take as many steps"
        ) from None
    return itertools.islice(batches, rank(), count * world_size(), world_size())  # type: ignore[call-overload]


def shard_loader(loader: object) -> object:
    """A DataLoader that gives this rank its own share of the dataset (torch's DistributedSampler: disjoint, as
    many batches on every rank, a new order each epoch when the loader shuffled), loading only that share, where
    `harness.stride` would load every batch and skip most; the loader itself in a single trial.

    Its other settings (batch size, workers, collate, pinning, drop_last) are kept. A loader with a custom sampler or
    an iterable dataset is refused: its order is its own, so nothing here can split it evenly.
    """
    if not in_group():
        return loader
    from torch.utils.data import DataLoader, IterableDataset, RandomSampler, SequentialSampler

    sampler = getattr(loader, "sampler", None)
    if not isinstance(loader, DataLoader) or isinstance(loader.dataset, IterableDataset):
        raise TypeError(f"harness.shard_loader needs a map-style DataLoader, got {type(loader).__name__}")
    drawn = isinstance(sampler, RandomSampler) and (sampler.replacement or sampler._num_samples is not None)
    if type(sampler) not in (RandomSampler, SequentialSampler) or loader.batch_size is None or drawn:
        raise TypeError(
            "harness.shard_loader splits a DataLoader built with batch_size and shuffle only, not one with a sampler "
            "of its own: use harness.stride over its batches"
        )
    return DataLoader(
        loader.dataset,
        batch_size=loader.batch_size,
        sampler=_epoch_sampler(loader.dataset, isinstance(sampler, RandomSampler), loader.generator),
        generator=loader.generator,
        num_workers=loader.num_workers,
        collate_fn=loader.collate_fn,
        pin_memory=loader.pin_memory,
        drop_last=loader.drop_last,
        timeout=loader.timeout,
        worker_init_fn=loader.worker_init_fn,
        multiprocessing_context=loader.multiprocessing_context,
        prefetch_factor=loader.prefetch_factor,
        persistent_workers=loader.persistent_workers,
    )


def _epoch_sampler(dataset: object, shuffle: bool, generator: object) -> object:
    """torch's DistributedSampler that draws a new order each epoch from the loader's random stream (its generator,
    else the global one), as the RandomSampler it replaces does: trainers written for one process never call
    `set_epoch`, and may build their loader anew each epoch. Rank 0's draw is every rank's: ranks that load different
    rows may have drawn different amounts of randomness (augmentations, collate), and shares of different orders
    would overlap."""
    import torch
    import torch.distributed as dist
    from torch.utils.data.distributed import DistributedSampler

    class EpochSampler(DistributedSampler):
        def __iter__(self):  # type: ignore[no-untyped-def]
            if self.shuffle:
                drawn = [int(torch.empty((), dtype=torch.int64).random_(generator=generator).item())]
                if dist.is_initialized():  # every rank starts each epoch's iteration: the broadcasts pair up
                    dist.broadcast_object_list(drawn, src=0)
                self.seed = drawn[0]
            return super().__iter__()

    # drop_last: every rank gets len // world_size rows, so as many batches (and all-reduces) on each.
    return EpochSampler(dataset, num_replicas=world_size(), rank=rank(), shuffle=shuffle, drop_last=True)


def wrap(model: object) -> object:
    """The model wrapped for data-parallel training (DistributedDataParallel); the model itself in a single trial.

    Its state_dict's keys gain a `module.` prefix: a checkpoint resumes with the same number of workers.
    """
    if not in_group():
        return model
    from torch.nn.parallel import DistributedDataParallel

    cuda = device().startswith("cuda")
    return DistributedDataParallel(model, device_ids=[int(os.environ.get("LOCAL_RANK", "0"))] if cuda else None)  # type: ignore[arg-type]


def mean_across(value: float) -> float:
    """The mean of `value` over the trial's ranks (a local train loss becomes the trial's); itself alone."""
    if not in_group():
        return float(value)
    return _all_reduce(float(value), "SUM") / world_size()


def any_across(flag: bool) -> bool:
    """True when `flag` is true on any rank: a decision every rank takes together (stop now, under a time budget),
    so no rank waits in a collective the others left. Itself in a single trial."""
    if not in_group():
        return bool(flag)
    return _all_reduce(float(flag), "MAX") > 0


def _all_reduce(value: float, op: str) -> float:
    """`value` reduced over the trial's ranks with torch.distributed's ReduceOp `op` (on the group's device)."""
    import torch
    import torch.distributed as dist

    tensor = torch.tensor([value], device=device() if device().startswith("cuda") else "cpu")
    dist.all_reduce(tensor, op=getattr(dist.ReduceOp, op))
    return float(tensor.item())
