"""Frozen: the fashion task's splits and metric. Zalando's Fashion-MNIST (70,000 grey 28x28 images of clothes, 10
classes) read from the original idx files, gzipped: Debian's `dataset-fashion-mnist` installs them in DEFAULT_ROOT;
`data.root=` points at the same four files elsewhere (a cluster's shared storage, the official download).

Splits comparable with the dataset's published table: test = the official 10,000 t10k images (scored once, for
the report); selection = 10,000 images held out of the official 60,000 (stratified, fixed seed: task.split_seed);
train = the other 50,000. `task.subsample=N` (tests, quick looks) keeps a stratified N of the 60,000 and splits them
the same 5:1 way, with as many test images as selection images. Runs on the driver only.
"""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path
from typing import Protocol

import numpy as np

from ralph_ray.tasks.base import DataError, DataSource, Splits, TaskSettings, stratified_split

METRIC = {"name": "accuracy", "direction": "max"}  # selection accuracy, higher is better
DEFAULT_ROOT = Path("/usr/share/datasets/fashion-mnist")  # where Debian's dataset-fashion-mnist puts the files
TRAIN_FILES = ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz")
TEST_FILES = ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz")
IMAGES_MAGIC = 2051  # idx: unsigned bytes (0x08), 3 dimensions
LABELS_MAGIC = 2049  # idx: unsigned bytes (0x08), 1 dimension
OFFICIAL_TRAIN = 60_000
SELECTION = 10_000  # held out of the official 60,000, as in the published table's protocol
NUM_CLASSES = 10
INSTALL_FIX = (
    "apt-get install dataset-fashion-mnist (Debian/Ubuntu), or pass data.root=/path/to/folder holding "
    f"{', '.join(TRAIN_FILES + TEST_FILES)} (the official download: "
    "https://github.com/zalandoresearch/fashion-mnist)"
)


class FashionSettings(TaskSettings, Protocol):
    """The task settings this task reads: the common ones and `subsample` (0: all the data)."""

    subsample: int


def prepare(settings: FashionSettings, data: DataSource) -> Splits:
    """The task's splits from the config (task.split_seed, task.subsample; the split sizes are fixed)."""
    return split(root(data), settings.split_seed, settings.subsample)


def root(data: DataSource) -> Path:
    """The folder holding the four files: data.root, or Debian's DEFAULT_ROOT when data.root is unset."""
    return DEFAULT_ROOT if not data.root else Path(str(data.root)).expanduser()


def hidden_paths(data: DataSource) -> list[Path]:
    """The raw files' folder, hidden from every run: Debian's lies under /usr, which the sandbox binds for all to read,
    and its label files hold the selection and test labels."""
    return [root(data)]


def split(folder: Path, split_seed: int, subsample: int = 0) -> Splits:
    """Train / selection (stratified out of the official train set) / the official test set, uint8 (N, 1, 28, 28)."""
    missing = [name for name in TRAIN_FILES + TEST_FILES if not (folder / name).is_file()]
    if missing:
        raise DataError(f"Fashion-MNIST not found: {folder} lacks {', '.join(missing)}\n  fix: {INSTALL_FIX}")
    if subsample < 0 or subsample > OFFICIAL_TRAIN or 0 < subsample < 6 * NUM_CLASSES:
        raise DataError(
            f"task.subsample={subsample} is out of range\n"
            f"  fix: set task.subsample=0 (all the data) or a count in [{6 * NUM_CLASSES}, {OFFICIAL_TRAIN}]"
        )
    x, y = load_pair(folder, *TRAIN_FILES)
    test_x, test_y = load_pair(folder, *TEST_FILES)
    if subsample:
        _, keep = stratified_split(y, (subsample / len(y),), split_seed)
        x, y = x[keep], y[keep]
        _, keep_test = stratified_split(test_y, (subsample / 6 / len(test_y),), split_seed)
        test_x, test_y = test_x[keep_test], test_y[keep_test]
    train, selection = stratified_split(y, (SELECTION / OFFICIAL_TRAIN,), split_seed)
    return Splits(
        train_x=x[train],
        train_y=y[train],
        selection_x=x[selection],
        selection_y=y[selection],
        test_x=test_x,
        test_y=test_y,
        num_classes=NUM_CLASSES,
    )


def load_pair(folder: Path, images_name: str, labels_name: str) -> tuple[np.ndarray, np.ndarray]:
    """An images file and its labels file: uint8 images (N, 1, rows, cols) and int64 labels (N,)."""
    images = read_idx(folder / images_name, IMAGES_MAGIC)
    labels = read_idx(folder / labels_name, LABELS_MAGIC).astype(np.int64)
    if len(images) != len(labels):
        raise DataError(
            f"{folder / images_name} holds {len(images)} images but {folder / labels_name} {len(labels)} labels\n"
            f"  fix: the files come from different releases; {INSTALL_FIX}"
        )
    if labels.size and labels.max() >= NUM_CLASSES:
        raise DataError(f"{folder / labels_name}: label {labels.max()} is not a Fashion-MNIST class (0-9)")
    return images[:, None, :, :], labels


def read_idx(path: Path, magic: int) -> np.ndarray:
    """One gzipped idx file (big-endian header: magic, then one uint32 per dimension; then uint8 data)."""
    try:
        with gzip.open(path, "rb") as handle:
            raw = handle.read()
    except (OSError, EOFError, zlib.error) as err:  # BadGzipFile is an OSError; a cut-off file ends in EOFError
        raise DataError(
            f"{path} is not a whole gzip file ({type(err).__name__}: {err})\n"
            f"  fix: the file is truncated or corrupt: reinstall it ({INSTALL_FIX})"
        ) from None
    dims = magic & 0xFF
    header = 4 * (1 + dims)
    found = int.from_bytes(raw[:4], "big") if len(raw) >= 4 else None
    if found != magic:
        raise DataError(
            f"{path}: magic number {found} where an idx file of this kind has {magic}: not a Fashion-MNIST "
            f"{'images' if magic == IMAGES_MAGIC else 'labels'} file\n  fix: {INSTALL_FIX}"
        )
    shape = tuple(int.from_bytes(raw[4 * i : 4 * i + 4], "big") for i in range(1, dims + 1))
    expected = header + int(np.prod(shape))
    if len(raw) != expected:
        raise DataError(
            f"{path}: the header says {shape} ({expected} bytes) but the file holds {len(raw)} bytes\n"
            f"  fix: the file is truncated or corrupt: reinstall it ({INSTALL_FIX})"
        )
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(shape)
