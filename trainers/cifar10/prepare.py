"""Frozen: the cifar10 task's splits and metric. CIFAR-10 from the standard python-pickle batches under data.root,
downloaded and md5-checked when absent. Runs on the driver only.
"""

from __future__ import annotations

import hashlib
import pickle
import shutil
import tarfile
import tempfile
from pathlib import Path

import numpy as np

from ralph_ray.tasks.base import DataError, DataSource, Splits, TaskSettings, stratified_split

METRIC = {"name": "accuracy", "direction": "max"}  # selection accuracy, higher is better
DATA_ROOT = "the folder holding or to hold cifar-10-batches-py"  # what data.root must point at
FOLDER = "cifar-10-batches-py"
# Where it is fetched from when data.url / data.md5 are not set (the config leaves them to the task).
URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
MD5 = "c58f30108f718f92721af3b95e74349a"
TRAIN_BATCHES = tuple(f"data_batch_{i}" for i in range(1, 6))
TEST_BATCH = "test_batch"


def prepare(settings: TaskSettings, data: DataSource) -> Splits:
    """The task's splits from the config (task.split_seed, task.selection_fraction; the test split is fixed)."""
    return split(data, settings.split_seed, settings.selection_fraction)


def split(data: DataSource, split_seed: int, selection_fraction: float) -> Splits:
    """Train minus a stratified selection part / selection / the official test batch, as uint8 NHWC."""
    folder = locate(data)
    train_x, train_y = _load_batches(folder, TRAIN_BATCHES)
    test_x, test_y = _load_batches(folder, (TEST_BATCH,))
    train, selection = stratified_split(train_y, (selection_fraction,), split_seed)
    return Splits(
        train_x=train_x[train],
        train_y=train_y[train],
        selection_x=train_x[selection],
        selection_y=train_y[selection],
        test_x=test_x,
        test_y=test_y,
        num_classes=10,
    )


def locate(data: DataSource) -> Path:
    """The batches folder: under data.root, or data.root itself; downloaded first if allowed."""
    root = Path(str(data.root)).expanduser()
    for folder in (root / FOLDER, root):
        if all((folder / name).exists() for name in (*TRAIN_BATCHES, TEST_BATCH)):
            return folder
    where = f"{root / FOLDER}/{{data_batch_1..5, test_batch}}"
    if not data.download:
        raise DataError(
            f"CIFAR-10 not found: put the python batches at {where} (from {data.url or URL}), or set data.download=true"
        )
    download(data.url or URL, data.md5 or MD5, root)
    return root / FOLDER


def download(url: str, md5: str, root: Path) -> None:
    """Fetch the archive to a temp file, verify its md5, then extract it safely into root."""
    import requests
    from requests.adapters import HTTPAdapter
    from rich.progress import BarColumn, DownloadColumn, Progress, TransferSpeedColumn
    from urllib3.util.retry import Retry

    root.mkdir(parents=True, exist_ok=True)
    session = requests.Session()
    session.mount(
        "http://",
        HTTPAdapter(max_retries=Retry(total=3, backoff_factor=0.5, status_forcelist=(429, 500, 502, 503, 504))),
    )
    session.mount(
        "https://",
        HTTPAdapter(max_retries=Retry(total=3, backoff_factor=0.5, status_forcelist=(429, 500, 502, 503, 504))),
    )
    digest = hashlib.md5()
    with tempfile.TemporaryDirectory(dir=root, prefix=".download-") as tmp:
        archive = Path(tmp) / "cifar-10-python.tar.gz"
        try:
            with session.get(url, stream=True, timeout=(10, 60)) as response:
                response.raise_for_status()
                total = int(response.headers.get("content-length") or 0) or None
                with (
                    archive.open("wb") as out,
                    Progress(
                        "[progress.description]{task.description}",
                        BarColumn(),
                        DownloadColumn(),
                        TransferSpeedColumn(),
                        transient=True,
                    ) as bar,
                ):
                    task = bar.add_task(f"downloading {url}", total=total)
                    for chunk in response.iter_content(chunk_size=1 << 20):
                        out.write(chunk)
                        digest.update(chunk)
                        bar.advance(task, len(chunk))
        except requests.RequestException as err:
            raise DataError(
                f"CIFAR-10 download from {url} failed ({type(err).__name__}: {err}).\n"
                f"  Offline? Fetch {url} elsewhere and extract it so that {root / FOLDER}/data_batch_1 ... test_batch "
                "exist, "
                "or point data.root at a folder that holds them."
            ) from None
        if digest.hexdigest() != md5:
            raise DataError(
                f"CIFAR-10 archive from {url} has md5 {digest.hexdigest()}, expected {md5}: the download is corrupt or "
                "the URL "
                "serves another file. Nothing was extracted; check data.url / data.md5 and try again."
            )
        staging = Path(tmp) / "extract"
        try:
            with tarfile.open(archive, "r:gz") as tar:
                tar.extractall(staging, filter="data")  # refuses absolute paths and links out of the folder
        except (tarfile.TarError, OSError) as err:
            raise DataError(f"cannot extract {url}: {err}") from None
        if not (staging / FOLDER).is_dir():
            raise DataError(f"the archive from {url} holds no {FOLDER}/ folder")
        shutil.rmtree(root / FOLDER, ignore_errors=True)
        (staging / FOLDER).rename(root / FOLDER)  # appears whole or not at all


def _load_batches(folder: Path, names: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
    xs, ys = [], []
    for name in names:
        try:
            with (folder / name).open("rb") as handle:
                batch = pickle.load(handle, encoding="bytes")
            x = np.asarray(batch[b"data"], dtype=np.uint8).reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
            y = np.asarray(batch[b"labels"], dtype=np.int64)
        except (OSError, EOFError, pickle.UnpicklingError, KeyError, ValueError, TypeError) as err:
            raise DataError(
                f"{folder / name} is not a CIFAR-10 python batch ({type(err).__name__}: {err}): delete it and fetch it "
                "again"
            ) from None
        if len(x) != len(y):
            raise DataError(f"{folder / name}: {len(x)} images but {len(y)} labels")
        xs.append(x)
        ys.append(y)
    return np.ascontiguousarray(np.concatenate(xs)), np.concatenate(ys)
