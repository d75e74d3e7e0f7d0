"""CIFAR-10 loading and download against small files in the real on-disk format, served on loopback."""

from __future__ import annotations

import hashlib
import io
import pickle
import socket
import tarfile
import threading
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest

from ralph_ray.config import DataConfig
from ralph_ray.tasks import TASKS
from ralph_ray.tasks.base import DataError
from ralph_ray.tasks.folder import prepare_module

_cifar10 = prepare_module(TASKS["cifar10"].folder)
FOLDER, TEST_BATCH, TRAIN_BATCHES, prepare = (
    _cifar10.FOLDER,
    _cifar10.TEST_BATCH,
    _cifar10.TRAIN_BATCHES,
    _cifar10.split,
)

PER_BATCH = 20


def write_batches(root: Path) -> Path:
    """Five train batches and a test batch, pickled exactly like the real ones (bytes keys, CHW rows)."""
    folder = root / FOLDER
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for i, name in enumerate((*TRAIN_BATCHES, TEST_BATCH)):
        labels = [(i + j) % 10 for j in range(PER_BATCH)]
        batch = {
            b"batch_label": name.encode(),
            b"labels": labels,
            b"data": rng.integers(0, 256, size=(PER_BATCH, 3072), dtype=np.uint8),
            b"filenames": [f"{j}.png".encode() for j in range(PER_BATCH)],
        }
        (folder / name).write_bytes(pickle.dumps(batch, protocol=2))
    (folder / "batches.meta").write_bytes(pickle.dumps({b"label_names": [b"c%d" % k for k in range(10)]}))
    return folder


def archive_of(folder: Path) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        tar.add(folder, arcname=FOLDER)
    return buffer.getvalue()


@pytest.fixture()
def server(tmp_path: Path):
    """A real HTTP server on 127.0.0.1 serving a tar.gz of tiny real-format batches."""
    source = tmp_path / "source"
    write_batches(source)
    served = tmp_path / "served"
    served.mkdir()
    payload = archive_of(source / FOLDER)
    (served / "cifar-10-python.tar.gz").write_bytes(payload)
    handler = partial(SimpleHTTPRequestHandler, directory=str(served))
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/cifar-10-python.tar.gz", hashlib.md5(payload).hexdigest()
    httpd.shutdown()


def test_prepare_reads_real_format(tmp_path: Path):
    folder = write_batches(tmp_path)
    splits = prepare(DataConfig(root=str(tmp_path), download=False), split_seed=0, selection_fraction=0.2)
    assert splits.train_x.shape == (80, 32, 32, 3) and splits.train_x.dtype == np.uint8
    assert splits.selection_x.shape == (20, 32, 32, 3)
    assert splits.test_x.shape == (PER_BATCH, 32, 32, 3)
    assert sorted(np.bincount(splits.selection_y, minlength=10)) == [2] * 10  # stratified
    # channel-major rows become HWC images: pixel (0, 0) of image 0 is bytes 0, 1024, 2048 of its row
    raw = pickle.loads((folder / TEST_BATCH).read_bytes(), encoding="bytes")[b"data"][0]
    assert list(splits.test_x[0, 0, 0]) == [raw[0], raw[1024], raw[2048]]
    again = prepare(DataConfig(root=str(folder), download=False), split_seed=0, selection_fraction=0.2)
    assert np.array_equal(again.selection_y, splits.selection_y)  # root may be the batches folder itself


def test_download_verifies_and_extracts(tmp_path: Path, server):
    url, md5 = server
    root = tmp_path / "data"
    splits = prepare(DataConfig(root=str(root), url=url, md5=md5), split_seed=0, selection_fraction=0.1)
    assert (root / FOLDER / "data_batch_1").exists()
    assert len(splits.train_y) + len(splits.selection_y) == 5 * PER_BATCH
    assert not list(root.glob(".download-*"))  # the temp archive is gone


def test_checksum_mismatch_extracts_nothing(tmp_path: Path, server):
    url, _ = server
    root = tmp_path / "data"
    with pytest.raises(DataError, match="md5 .* expected 0{32}"):
        prepare(DataConfig(root=str(root), url=url, md5="0" * 32), split_seed=0, selection_fraction=0.1)
    assert not (root / FOLDER).exists()
    assert not list(root.glob(".download-*"))


def test_offline_error_says_where_to_put_files(tmp_path: Path):
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}/cifar-10-python.tar.gz"
    with pytest.raises(DataError) as info:
        prepare(DataConfig(root=str(tmp_path), url=url), split_seed=0, selection_fraction=0.1)
    assert "download" in str(info.value) and f"{tmp_path / FOLDER}/data_batch_1" in str(info.value)


def test_no_download_and_missing(tmp_path: Path):
    with pytest.raises(DataError, match="data.download=true"):
        prepare(DataConfig(root=str(tmp_path), download=False), split_seed=0, selection_fraction=0.1)


def test_truncated_batch_names_the_file(tmp_path: Path):
    folder = write_batches(tmp_path)
    (folder / "data_batch_3").write_bytes((folder / "data_batch_3").read_bytes()[:100])
    with pytest.raises(DataError, match="data_batch_3"):
        prepare(DataConfig(root=str(tmp_path), download=False), split_seed=0, selection_fraction=0.1)
