"""Knob reading and rewriting keep the file valid and its comments."""

from __future__ import annotations

import pytest

from ralph_ray.knobs import KnobError, read_knobs, rewrite_knobs

SOURCE = '''"""doc"""
import math

LR = 0.05  # learning rate
EPOCHS = 10  # passes
NAME = "cnn"  # a string knob
WIDTHS = (64, 256)  # a tuple knob
DERIVED = LR * 2  # not a literal: not a knob
lower = 3


def f():
    LR = 1  # a local, not a knob
    return LR
'''


def test_read_knobs_only_module_level_literals():
    assert read_knobs(SOURCE) == {"LR": 0.05, "EPOCHS": 10, "NAME": "cnn", "WIDTHS": (64, 256)}


def test_rewrite_keeps_comments_and_layout():
    out = rewrite_knobs(SOURCE, {"LR": 0.125, "EPOCHS": 3, "NAME": "mlp", "WIDTHS": (8, 16)})
    assert "LR = 0.125  # learning rate\n" in out
    assert "EPOCHS = 3  # passes\n" in out
    assert "NAME = 'mlp'  # a string knob\n" in out
    assert "WIDTHS = (8, 16)  # a tuple knob\n" in out
    assert "    LR = 1  # a local, not a knob" in out
    assert read_knobs(out)["LR"] == 0.125


def test_rewrite_numpy_scalars_as_plain_numbers():
    np = pytest.importorskip("numpy")
    out = rewrite_knobs(SOURCE, {"LR": np.float64(0.5), "EPOCHS": np.int64(7)})
    assert read_knobs(out)["LR"] == 0.5 and read_knobs(out)["EPOCHS"] == 7


def test_unknown_knob_is_an_error_naming_the_knobs():
    with pytest.raises(KnobError, match="no module-level knob named BOGUS.*LR"):
        rewrite_knobs(SOURCE, {"BOGUS": 1})


def test_digits_trainer_has_the_searched_knobs():
    from ralph_ray.config import load_config

    cfg = load_config([])
    knobs = read_knobs((cfg.trainer_dir() / "train.py").read_text())
    assert set(cfg.search.space) <= set(knobs)
