"""The digits task: deterministic, stratified, disjoint splits; public files carry no held-out labels."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ralph_ray.harness import PUBLIC_FILES
from ralph_ray.tasks.base import write_public
from ralph_ray.tasks.digits import prepare


def test_splits_are_deterministic_and_sized():
    a, b = prepare(0, 0.2, 0.2), prepare(0, 0.2, 0.2)
    assert np.array_equal(a.selection_x, b.selection_x) and np.array_equal(a.test_y, b.test_y)
    assert len(a.train_y) + len(a.selection_y) + len(a.test_y) == 1797
    assert abs(len(a.selection_y) - 0.2 * 1797) < 10
    assert a.train_x.shape[1:] == (1, 8, 8) and a.train_x.dtype == np.float32
    assert 0.0 <= a.train_x.min() and a.train_x.max() <= 1.0
    assert not np.array_equal(prepare(1, 0.2, 0.2).selection_y, a.selection_y)


def test_splits_are_disjoint_and_stratified():
    s = prepare(0, 0.2, 0.2)
    rows = lambda x: {row.tobytes() for row in x.reshape(len(x), -1)}  # noqa: E731
    # digits has a few duplicate images; overlap beyond those would mean leaked indices
    assert len(rows(s.selection_x) & rows(s.test_x)) <= 2
    counts = np.bincount(s.selection_y, minlength=10)
    assert counts.min() >= 33 and counts.max() <= 38


def test_public_files_hold_no_held_out_labels(tmp_path: Path):
    s = prepare(0, 0.2, 0.2)
    hashes = write_public(s, tmp_path, "digits")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(PUBLIC_FILES)
    assert set(hashes) == set(PUBLIC_FILES)
    assert np.array_equal(np.load(tmp_path / "train_y.npy"), s.train_y)
    assert np.load(tmp_path / "selection_x.npy").shape == s.selection_x.shape
