"""Knob reading and rewriting keep the file valid and its comments."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ralph_ray.knobs import KnobError, read_knobs, rewrite_knobs, with_knobs

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


def test_with_knobs_writes_in_those_the_source_has_and_leaves_a_value_it_cannot_take():
    source = "LR = 0.1  # step\nEPOCHS = 3\n"
    assert with_knobs(source, {"LR": 0.5, "BATCH_SIZE": 64}) == "LR = 0.5  # step\nEPOCHS = 3\n"
    assert with_knobs(source, {"EPOCHS": object()}) == source  # no literal for it: the code's own value stays


def test_unknown_knob_is_an_error_naming_the_knobs():
    with pytest.raises(KnobError, match="no module-level knob named BOGUS.*LR"):
        rewrite_knobs(SOURCE, {"BOGUS": 1})


def test_digits_trainer_has_the_searched_knobs():
    from ralph_ray.config import load_config

    cfg = load_config([])
    knobs = read_knobs((cfg.trainer_dir() / "train.py").read_text())
    assert set(cfg.search.space) <= set(knobs)


def test_relative_knobs_scale_each_variants_own_values():
    from ralph_ray.knobs import Bounds, resolve_knobs

    own = {"LR": 0.02, "WIDTH": 16, "BATCH_SIZE": 64, "OPT": "sgd"}
    config = {"variant": "v1", "LR": 0.5, "WIDTH": 2.0, "BATCH_SIZE": 0.01, "OPT": "adam"}
    relative = {"LR": Bounds(1e-4, 1.0), "WIDTH": Bounds(1, 512), "BATCH_SIZE": Bounds(1, 512, integer=True)}
    knobs = resolve_knobs(config, own, relative)
    # ints stay ints; 64 x 0.01 falls below the range and is reflected back in by ratio (1 / 0.64), not clipped to 1
    assert knobs == {"LR": 0.01, "WIDTH": 32, "BATCH_SIZE": 2, "OPT": "adam"}
    assert resolve_knobs(config, own, {}) == {k: v for k, v in config.items() if k != "variant"}


def test_relative_factors_stay_inside_the_declared_space():
    # The factors compound over generations: trials ran HIDDEN 8 and 4 of choice [16, 32, 64], GAMMA 1.55 of
    # uniform [0.3, 0.9] (a StepLR that raises the LR) and LR past 0.02 of loguniform [5e-4, 2e-2].
    from ralph_ray.config import KnobSpace, SpaceKind
    from ralph_ray.knobs import resolve_knobs
    from ralph_ray.search import param_space, relative_knobs

    space = {
        "HIDDEN": KnobSpace(SpaceKind.choice, values=[16, 32, 64]),
        "GAMMA": KnobSpace(SpaceKind.uniform, 0.3, 0.9),
        "LR": KnobSpace(SpaceKind.loguniform, 5e-4, 2e-2),
        "EPOCHS": KnobSpace(SpaceKind.int, 2, 10),
        "DROPOUT": KnobSpace(SpaceKind.uniform, 0.0, 0.5),
    }
    relative = relative_knobs(space)
    low = {"variant": "v", "HIDDEN": min(param_space(space, relative=True)["HIDDEN"].categories), "GAMMA": 0.5}
    high = {"variant": "v", "GAMMA": 2.0, "LR": 2.0, "EPOCHS": 2.0, "DROPOUT": 2.0}
    # A range's value past a bound is reflected back inside by ratio (0.3 x 0.5 -> 0.3 / 0.5 x 0.3), a choice snaps
    assert resolve_knobs(low, {"HIDDEN": 16, "GAMMA": 0.3}, relative) == {"HIDDEN": 16, "GAMMA": 0.6}
    edge = {"GAMMA": 0.9, "LR": 0.0177, "EPOCHS": 8, "DROPOUT": 0.4}
    inside = resolve_knobs(high, edge, relative)
    assert inside == pytest.approx({"GAMMA": 0.45, "LR": 0.02 / 1.77, "EPOCHS": 6, "DROPOUT": 0.3125})
    assert isinstance(inside["EPOCHS"], int)
    # A choice snaps to the nearest declared value by ratio; an int stays an int where its range is whole numbers,
    # a fractional knob written as an int (GAMMA = 1, outside its range: searched over the range) takes fractions.
    assert resolve_knobs({"HIDDEN": 1.45, "EPOCHS": 0.55}, {"HIDDEN": 16, "EPOCHS": 7}, relative) == {
        "HIDDEN": 32,
        "EPOCHS": 4,
    }
    assert [resolve_knobs({"GAMMA": f}, {"GAMMA": 1}, relative)["GAMMA"] for f in (0.5, 2.0)] == [0.3, 0.9]
    assert 0.3 < resolve_knobs({"GAMMA": 0.7}, {"GAMMA": 1}, relative)["GAMMA"] < 0.9


def test_relative_search_space_and_first_points():
    from ralph_ray.config import KnobSpace, SpaceKind
    from ralph_ray.search import clip_to_space, param_space, relative_knobs

    space = {
        "LR": KnobSpace(SpaceKind.loguniform, 0.001, 0.1),
        "WIDTH": KnobSpace(SpaceKind.choice, values=[8, 16, 32]),
        "OPT": KnobSpace(SpaceKind.choice, values=["sgd", "adam"]),
    }
    assert set(relative_knobs(space)) == {"LR", "WIDTH"}
    domains = param_space(space, relative=True, span=2.0)
    assert (domains["LR"].lower, domains["LR"].upper) == (0.5, 2.0)
    assert domains["WIDTH"].categories == [0.5, 1.0, 2.0] and domains["OPT"].categories == ["sgd", "adam"]
    own = {"LR": 0.0001, "WIDTH": 64, "OPT": "adam"}
    assert clip_to_space(own, space, relative=True) == {"LR": 1.0, "WIDTH": 1.0, "OPT": "adam"}
    assert clip_to_space(own, space) == {"LR": 0.001, "WIDTH": 32, "OPT": "adam"}  # absolute: moved into range


def test_parsing_from_many_threads_at_once():
    # CPython 3.11's AST constructor breaks when threads parse concurrently; children are gated in a pool.
    from concurrent.futures import ThreadPoolExecutor

    source = "LR = 0.1  # lr\n" + "\n".join(
        f"def f{i}(x):\n    return [[x for _ in range(3)] for _ in range({i})]" for i in range(300)
    )
    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(lambda _: read_knobs(source), range(64)))
    assert all(r == {"LR": 0.1} for r in results)


def test_one_rule_says_what_a_knob_is():
    # knobs.is_knob_name is the rule the config's search space and the intervention catalog apply too.
    from ralph_ray.agents.catalog import _parse_knob_edits
    from ralph_ray.config import ConfigError, load_config
    from ralph_ray.knobs import is_knob_name

    assert [n for n in ("LR", "WIDTH_2", "lr", "Lr", "LR-X", "2LR") if is_knob_name(n)] == ["LR", "WIDTH_2"]
    assert all(is_knob_name(name) for name in read_knobs(SOURCE))
    with pytest.raises(ConfigError, match="UPPER_CASE"):
        load_config(["+search.space.Lr={type: uniform, low: 0.01, high: 0.1}"])

    def fail(field: str, message: str) -> ValueError:
        return ValueError(f"{field}: {message}")

    with pytest.raises(ValueError, match="UPPER_CASE"):
        _parse_knob_edits({"Lr": {"mul": 2}}, fail)
    assert _parse_knob_edits({"WIDTH_2": {"mul": 2}}, fail)[0].knob == "WIDTH_2"


def test_the_transforms_read_the_knob_block_by_the_same_rule():
    # agents/transforms/_tree decides where a new knob goes by knobs.is_knob, not a rule of its own.
    import libcst as cst

    from ralph_ray.agents.transforms._tree import _is_knob

    source = SOURCE + "ANNOTATED: int = 3  # annotated: not a knob for read_knobs\nA, B = 1, 2\nX.Y = 1\n"
    lines = [s for s in cst.parse_module(source).body if isinstance(s, cst.SimpleStatementLine)]
    found = [cst.Module([]).code_for_node(s).split("=")[0].strip() for s in lines if _is_knob(s)]
    assert found == list(read_knobs(source)) == ["LR", "EPOCHS", "NAME", "WIDTHS"]


def test_a_list_value_is_written_in_the_container_the_trainer_wrote():
    """User trial: `HIDDEN_SIZES = (128, 64)` read by a dataclass field became `HIDDEN_SIZES = [64, 32]`, and Python
    refused the list as the field's default ("mutable default ... is not allowed"): every trial failed, exit 4."""
    source = (
        "from dataclasses import dataclass\n\n"
        "HIDDEN_SIZES = (128, 64)  # widths\nLAYERS = [3, 3]\n\n\n"
        "@dataclass\nclass TrainConfig:\n    hidden_sizes: tuple = HIDDEN_SIZES\n"
    )
    out = rewrite_knobs(source, {"HIDDEN_SIZES": [64, 32], "LAYERS": (2, 2)})
    assert "HIDDEN_SIZES = (64, 32)  # widths\n" in out and "LAYERS = [2, 2]\n" in out
    namespace: dict = {}
    exec(compile(out, "train.py", "exec"), namespace)  # the trainer's own dataclass takes it
    assert namespace["TrainConfig"]().hidden_sizes == (64, 32)


def test_an_upper_case_name_a_search_cannot_set_is_told_apart_from_an_absent_one():
    """User trial: `HIDDEN = CFG["hidden"]` was reported as not defined; near_knobs finds what is_knob refuses."""
    from ralph_ray.knobs import near_knobs, parse

    source = (
        'LR = 0.1\nHIDDEN = CFG["hidden"]\nDEPTH: int = 3\nlr = 0.2\nWIDTH = 2 * 8\n\ndef f():\n    EPOCHS = int("3")\n'
    )
    found = near_knobs(parse(source))
    assert {name: node.lineno for name, node in found.items()} == {"HIDDEN": 2, "DEPTH": 3, "WIDTH": 5}
    assert "LR" not in found and "LR" in read_knobs(source)


def test_every_parse_in_the_package_goes_through_the_lock():
    # pyproject bans ast.parse and ast.literal_eval outside knobs.py (ruff TID251): one unserialised parse in a
    # thread beside a serialised one is enough for CPython 3.11's SystemError (the CI failure of test_async).
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--select", "TID251", "--no-cache", "ralph_ray", "app"],
        cwd=root,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr
