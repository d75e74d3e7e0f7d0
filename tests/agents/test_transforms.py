"""Code interventions as syntax-tree transforms, on differently written trainers (tests/fixtures/trainers) and the
seeds.

The applicability table is pinned: a transform that stops finding its idiom (or starts matching where it must not)
fails here with the reason. Every output parses and keeps the knobs module-level literals; a few transformed
trainers go through the real validation gate (a real subprocess smoke run on digits).
"""

from __future__ import annotations

import ast
import shutil
from pathlib import Path

import pytest

from ralph_ray import PROJECT_ROOT
from ralph_ray.agents.transforms import (
    TRANSFORMS,
    NotApplicable,
    applicability,
    apply_transform,
)
from ralph_ray.gate import Gate, write_smoke_data
from ralph_ray.knobs import read_knobs
from ralph_ray.tasks.digits import prepare

FIXTURES = PROJECT_ROOT / "tests" / "fixtures" / "trainers"
TRAINERS = {path.parent.name: path.parent for path in sorted(FIXTURES.glob("*/train.py"))}
TRAINERS |= {"digits": PROJECT_ROOT / "trainers" / "digits", "cifar10": PROJECT_ROOT / "trainers" / "cifar10"}
SOURCES = {name: (folder / "train.py").read_text() for name, folder in TRAINERS.items()}

ALL = set(TRANSFORMS)
# Which transforms apply to which trainer (and so, by omission, which do not).
APPLIES = {
    "sequential_flat": ALL,
    "module_loader": ALL - {"widen_layers", "adamw_optimizer"},
    "functional_mlp": {
        "shift_augmentation",
        "flip_augmentation",
        "edge_of_chaos_curriculum",
        "label_smoothing",
        "add_weight_decay",
        "adamw_optimizer",
        "cosine_lr_schedule",
        "one_cycle_schedule",
        "lr_warmup",
        "gradient_clipping",
        "mixed_precision",
    },
    "airbench_style": {
        "deepen",
        "flip_augmentation",
        "edge_of_chaos_curriculum",
        "hard_example_replay",
        "self_model_head",
        "add_dropout",
        "adamw_optimizer",
        "gradient_clipping",
        "ema_weights",
        "mixed_precision",
        "channels_last",
    },
    "digits": ALL - {"widen_layers", "add_dropout", "add_weight_decay"},
    "cifar10": {"deepen", "hard_example_replay", "self_model_head", "add_dropout"},
}


@pytest.mark.parametrize("trainer", sorted(TRAINERS))
def test_applicability_table(trainer: str):
    table = applicability(SOURCES[trainer])
    assert {name for name, why in table.items() if why is None} == APPLIES[trainer], table
    assert all(why for name, why in table.items() if name not in APPLIES[trainer])  # every refusal says why


def test_at_least_eight_code_interventions_apply_to_every_differently_written_trainer():
    for trainer in (*(p.parent.name for p in FIXTURES.glob("*/train.py")), "digits"):
        assert len(APPLIES[trainer]) >= 8, trainer


@pytest.mark.parametrize(
    ("trainer", "name", "reason"),
    [
        ("functional_mlp", "batchnorm", "functional model"),
        ("functional_mlp", "ema_weights", "no nn.Module model found"),
        ("cifar10", "cosine_lr_schedule", 'sets group\\["lr"\\] itself'),
        ("cifar10", "gradient_clipping", 'reduction="none"'),
        ("airbench_style", "one_cycle_schedule", "already has a schedule"),
        ("digits", "widen_layers", "the width is the knob WIDTH"),
        ("module_loader", "adamw_optimizer", "already Adam"),
    ],
)
def test_not_applicable_names_the_missing_idiom(trainer: str, name: str, reason: str):
    with pytest.raises(NotApplicable, match=reason):
        apply_transform(name, SOURCES[trainer])


CASES = [(trainer, name) for trainer in sorted(TRAINERS) for name in sorted(APPLIES[trainer])]


@pytest.mark.parametrize(("trainer", "name"), CASES)
def test_output_parses_and_keeps_knobs_module_level_literals(trainer: str, name: str):
    source = SOURCES[trainer]
    result = apply_transform(name, source)
    tree = ast.parse(result)
    before, after = read_knobs(source), read_knobs(result)
    assert set(before) <= set(after), "a knob disappeared"
    changed = {k for k in before if before[k] != after[k]}
    assert changed <= ({"LR", "LEARNING_RATE", "WEIGHT_DECAY"} if name == "adamw_optimizer" else set())
    for knob in set(after) - set(before):  # new knobs: one module-level `NAME = literal  # comment` line each
        line = next(
            node for node in tree.body if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == knob
        )
        assert "  # " in result.splitlines()[line.lineno - 1]
    assert result.count("\n\n\n\n") == 0, "helpers are placed with two blank lines, not more"


@pytest.mark.parametrize("name", sorted(APPLIES["sequential_flat"] - {"deepen", "widen_layers"}))
def test_a_second_application_is_refused(name: str):
    once = apply_transform(name, SOURCES["sequential_flat"])
    with pytest.raises(NotApplicable):
        apply_transform(name, once)


def test_batchnorm_follows_each_layer_in_a_sequential_and_in_a_module():
    flat = apply_transform("batchnorm", SOURCES["sequential_flat"])
    assert "nn.Conv2d(1, 16, 3, padding=1),\n    torch.nn.BatchNorm2d(16)," in flat
    assert "torch.nn.BatchNorm1d(16 * 4 * 4, affine=False),\n    nn.Linear(16 * 4 * 4, 10)," in flat
    module = apply_transform("batchnorm", SOURCES["module_loader"])
    assert "self.bn_hidden = torch.nn.BatchNorm1d(hidden)" in module
    assert "F.relu(self.bn_hidden(self.hidden(torch.flatten(h, 1))))" in module
    assert "bn_out" not in module  # the head's input is centred only where conv features feed it directly
    assert "self.bn_fc = torch.nn.BatchNorm1d(2 * width * 4 * 4, affine=False)" in apply_transform(
        "batchnorm", SOURCES["digits"]
    )


def test_label_smoothing_leaves_a_shared_criterion_for_evaluation():
    result = apply_transform("label_smoothing", SOURCES["sequential_flat"])
    assert "loss = torch.nn.functional.cross_entropy(out, Yt[i], label_smoothing=LABEL_SMOOTHING)" in result
    assert "vloss = crit(vout, Yv).item()" in result


def test_ema_evaluates_with_the_average_in_a_flat_script():
    result = apply_transform("ema_weights", SOURCES["sequential_flat"])
    assert "vout = ema(Xv)" in result and "ema.eval()" in result and "out = net(Xt[i])" in result
    assert "ema.update_parameters(net)" in result


def test_widen_doubles_literal_widths_and_the_sizes_after_them():
    result = apply_transform("widen_layers", SOURCES["sequential_flat"])
    assert "nn.Conv2d(1, 32, 3, padding=1)" in result and "nn.Linear(32 * 4 * 4, 10)" in result


def test_schedules_count_epochs_from_the_loop():
    result = apply_transform("cosine_lr_schedule", SOURCES["module_loader"])
    assert "CosineAnnealingLR(optimizer, T_max=len(range(1, EPOCHS + 1)))" in result
    assert "cosine.step()" in apply_transform("cosine_lr_schedule", SOURCES["digits"])


# -----------------------------------------------------------------------------
# Transformed trainers still train: the real gate (parse, required calls, a one-epoch smoke run on digits)

GATED = [
    ("sequential_flat", ["ema_weights", "hard_example_replay"]),
    ("module_loader", ["batchnorm", "cosine_lr_schedule", "add_dropout"]),
    ("functional_mlp", ["shift_augmentation", "gradient_clipping", "edge_of_chaos_curriculum"]),
    ("airbench_style", ["self_model_head", "deepen"]),
    ("digits", ["edge_of_chaos_curriculum", "self_model_head", "mixed_precision"]),
]


@pytest.fixture(scope="module")
def gate(tmp_path_factory: pytest.TempPathFactory) -> Gate:
    smoke = write_smoke_data(prepare(0, 0.2, 0.2), tmp_path_factory.mktemp("smoke"), "digits")
    return Gate(smoke, (), timeout_s=120)


@pytest.mark.parametrize(("trainer", "names"), GATED, ids=[t for t, _ in GATED])
def test_transformed_trainer_passes_the_gate(gate: Gate, tmp_path: Path, trainer: str, names: list[str]):
    parent, child = tmp_path / "parent", tmp_path / "child"
    shutil.copytree(TRAINERS[trainer], parent, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(parent, child)
    source = SOURCES[trainer]
    for name in names:
        source = apply_transform(name, source)
    (child / "train.py").write_text(source)
    gate.check(child, parent)
