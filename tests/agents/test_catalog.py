"""The intervention catalog: validation, applying entries, and every entry's edit still trains."""

from __future__ import annotations

import functools
import math
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from ralph_ray import PROJECT_ROOT
from ralph_ray.agents.base import Diagnosis, Recommendation
from ralph_ray.agents.catalog import CATALOG_PATH, NotApplicable, apply, apply_files, load_catalog, model_file
from ralph_ray.agents.heuristic import HeuristicCoder
from ralph_ray.agents.transforms.data import SHIFT_HELPER
from ralph_ray.config import KnobSpace, SpaceKind
from ralph_ray.gate import Gate, write_smoke_data
from ralph_ray.knobs import read_knobs, rewrite_knobs
from ralph_ray.space import trained_value
from ralph_ray.tasks.base import write_public
from ralph_ray.tasks.digits import prepare

sys.path.insert(0, str(Path(__file__).parent))
from warm_trainer import train_all  # noqa: E402

DIGITS = (PROJECT_ROOT / "trainers" / "digits" / "train.py").read_text()
CIFAR10 = (PROJECT_ROOT / "trainers" / "cifar10" / "train.py").read_text()
REQUIRED = ("train_loss", "val_loss", "val_acc", "lr", "grad_norm", "epoch_seconds")
CATALOG = load_catalog()

# Stacks of structural interventions that must compose, in the order a lineage could apply them.
STACKS = {
    "bn_aug_ema_cosine": ["batchnorm", "augmentation", "ema_weights", "cosine_lr_schedule"],
    "all_with_batchnorm": [
        "batchnorm",
        "augmentation",
        "ema_weights",
        "cosine_lr_schedule",
        "deepen",
        "lr_warmup",
        "label_smoothing",
        "gradient_clipping",
        "adamw_optimizer",
    ],
    "reverse_order": ["gradient_clipping", "cosine_lr_schedule", "lr_warmup", "deepen", "batchnorm", "ema_weights"],
    "grokfast_stack": [
        "grokfast_filter",
        "augmentation",
        "ema_weights",
        "label_smoothing",
        "adamw_optimizer",
        "deepen",
    ],
    "forge_stack": [
        "edge_of_chaos_curriculum",
        "hard_example_replay",
        "self_model_head",
        "batchnorm",
        "one_cycle_schedule",
    ],
}


def stack(names: list[str], source: str = DIGITS) -> str:
    for name in names:
        source = apply(CATALOG.get(name), source)
    return source


# -----------------------------------------------------------------------------
# Loading and validation


def test_catalog_loads_with_valid_entries():
    assert CATALOG.path == CATALOG_PATH == PROJECT_ROOT / "agents" / "interventions.yaml"
    assert len(CATALOG) >= 14
    assert len(set(CATALOG.names())) == len(CATALOG)
    for entry in CATALOG:
        assert entry.answers and all(isinstance(d, Diagnosis) for d in entry.answers)
        assert entry.description
    expected = {
        "lower_lr",
        "raise_lr",
        "cosine_lr_schedule",
        "lr_warmup",
        "adamw_optimizer",
        "weight_decay",
        "dropout",
        "label_smoothing",
        "batchnorm",
        "widen",
        "deepen",
        "augmentation",
        "longer_training",
        "ema_weights",
        "grokfast_filter",
        "gradient_clipping",
    }
    assert expected <= set(CATALOG.names())
    assert {d for entry in CATALOG for d in entry.answers} == set(Diagnosis)  # every diagnosis has an answer


def test_get_unknown_names_the_known_ones():
    with pytest.raises(KeyError, match="no intervention 'teleport'.*lower_lr"):
        CATALOG.get("teleport")


GOOD = """
  - name: ok
    description: fine
    answers: [plateau]
    knobs:
      LR: {mul: 0.5}
"""


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        (
            "  - name: bad\n    description: x\n    answers: [sleepy]\n    knobs: {LR: {mul: 2}}\n",
            r"intervention 'bad'.*'answers'.*'sleepy' is not a diagnosis",
        ),
        ("  - name: bad\n    answers: [plateau]\n    knobs: {LR: {mul: 2}}\n", r"intervention 'bad'.*'description'"),
        (
            "  - name: bad\n    description: x\n    answers: [plateau]\n    knobs: {LR: {mul: 2, add: 1}}\n",
            r"intervention 'bad'.*'knobs.LR'.*exactly one of set, mul, add",
        ),
        (
            "  - name: bad\n    description: x\n    answers: [plateau]\n    knobs: {LR: {mul: fast}}\n",
            r"'knobs.LR'.*expected a number",
        ),
        (
            "  - name: bad\n    description: x\n    answers: [plateau]\n    edits: [{find: '(', replace: x}]\n",
            r"intervention 'bad'.*'edits'.*bad regex",
        ),
        (
            "  - name: bad\n    description: x\n    answers: [plateau]\n    add_knobs: [{name: lr, value: 1, comment: "
            "c}]\n",
            r"'add_knobs'.*UPPER_CASE",
        ),
        (
            "  - name: bad\n    description: x\n    answers: [plateau]\n    add_knobs: [{name: LR2, value: 1}]\n",
            r"'add_knobs'.*one-line comment",
        ),
        (
            "  - name: bad\n    description: x\n    answers: [plateau]\n    colour: red\n    knobs: {LR: {mul: 2}}\n",
            r"intervention 'bad'.*'colour'.*unknown field",
        ),
        ("  - name: bad\n    description: x\n    answers: [plateau]\n", r"intervention 'bad'.*at least one of knobs"),
        ("  - name: Bad Name\n    description: x\n", r"entry 1: field 'name'"),
        (
            "  - name: ok\n    description: again\n    answers: [plateau]\n    knobs: {LR: {mul: 2}}\n",
            r"'ok' is defined twice",
        ),
    ],
)
def test_malformed_entries_raise_a_clear_error(tmp_path: Path, entry: str, message: str):
    path = tmp_path / "interventions.yaml"
    path.write_text("interventions:\n" + GOOD + entry)
    with pytest.raises(ValueError, match=message):
        load_catalog(path)


@pytest.mark.parametrize("text", ["- just a list\n", "interventions: 3\n", "interventions: [\n"])
def test_malformed_documents_raise_a_clear_error(tmp_path: Path, text: str):
    path = tmp_path / "interventions.yaml"
    path.write_text(text)
    with pytest.raises(ValueError, match=str(path)):
        load_catalog(path)


# -----------------------------------------------------------------------------
# Applying


def test_knob_edits_keep_types_and_clamp():
    assert read_knobs(apply(CATALOG.get("lower_lr"), DIGITS))["LR"] == 0.025
    epochs = read_knobs(apply(CATALOG.get("longer_training"), DIGITS))["EPOCHS"]
    assert epochs == 18 and isinstance(epochs, int)
    assert read_knobs(apply(CATALOG.get("weight_decay"), DIGITS))["WEIGHT_DECAY"] == 0.0005  # 0 x 2 starts at min
    assert read_knobs(apply(CATALOG.get("dropout"), rewrite_knobs(DIGITS, {"DROPOUT": 0.45})))["DROPOUT"] == 0.5
    with pytest.raises(NotApplicable, match="changes nothing"):
        apply(CATALOG.get("dropout"), rewrite_knobs(DIGITS, {"DROPOUT": 0.5}))


def test_a_clamp_never_reverses_the_move():
    # cifar10's LR (11.5) is above raise_lr's max (1.0): raising must not lower it.
    with pytest.raises(NotApplicable, match="changes nothing"):
        apply(CATALOG.get("raise_lr"), CIFAR10)


def held(relative: bool = True, **space: KnobSpace) -> dict:
    """What a child's trials train for each searched knob's value, as a campaign's agents get it."""
    return {name: functools.partial(trained_value, name, space=space, relative=relative) for name in space}


def test_a_knob_move_stays_in_the_space_its_trials_are_searched_in():
    """User trial: `widen` took WIDTH past its `choice`; the child's trials snapped it back to the space (relative
    search), so the child trained its parent's width and the KB recorded `widen` as having no effect."""
    width = KnobSpace(SpaceKind.choice, values=[8, 16, 32])
    lr = KnobSpace(SpaceKind.loguniform, low=0.003, high=0.3)
    space = held(WIDTH=width, LR=lr)
    assert read_knobs(apply(CATALOG.get("widen"), DIGITS, space))["WIDTH"] == 32  # 16 -> 32: inside
    at_top = rewrite_knobs(DIGITS, {"WIDTH": 32})
    with pytest.raises(
        NotApplicable, match=r"the move WIDTH 32 -> 64 leaves search.space, and its trials would train 32"
    ):
        apply(CATALOG.get("widen"), at_top, space)
    assert read_knobs(apply(CATALOG.get("widen"), at_top))["WIDTH"] == 64  # no space given: the catalog's clamp only
    # a range cuts the move at its bound (0.2 x 2 -> 0.3); a knob already past the space is never moved back into it
    assert read_knobs(apply(CATALOG.get("raise_lr"), rewrite_knobs(DIGITS, {"LR": 0.2}), space))["LR"] == 0.3
    with pytest.raises(
        NotApplicable, match=r"the move LR 0.5 -> 1.0 leaves search.space, and its trials would train 0.3"
    ):
        apply(CATALOG.get("raise_lr"), rewrite_knobs(DIGITS, {"LR": 0.5}), space)
    # sampled outright (search.relative=false): a child's first trial runs its own value, clipped to the space
    outright = held(relative=False, WIDTH=width, LR=lr)
    assert read_knobs(apply(CATALOG.get("lower_lr"), DIGITS, outright))["LR"] == 0.025
    with pytest.raises(NotApplicable, match="its trials would train 32"):
        apply(CATALOG.get("widen"), at_top, outright)
    # a transform's own knob setting is held too: AdamW's LR 0.003 under fashion's [0.005, 0.1] trains as 0.005
    adamw = apply(CATALOG.get("adamw_optimizer"), DIGITS, held(LR=KnobSpace(SpaceKind.loguniform, low=0.005, high=0.1)))
    assert read_knobs(adamw)["LR"] == 0.005 and read_knobs(apply(CATALOG.get("adamw_optimizer"), DIGITS))["LR"] == 0.003
    # a float knob written as a whole number stays a float where its range is fractional (DROPOUT = 0 over [0, 0.5])
    dropout = held(DROPOUT=KnobSpace(SpaceKind.uniform, low=0.0, high=0.5))
    moved = read_knobs(apply(CATALOG.get("dropout"), rewrite_knobs(DIGITS, {"DROPOUT": 0}), dropout))["DROPOUT"]
    assert 0 < moved <= 0.5


def test_missing_knob_and_anchor_and_skip_if_are_not_applicable():
    with pytest.raises(NotApplicable, match="no knob DROPOUT"):
        apply(CATALOG.get("dropout"), CIFAR10)
    with pytest.raises(NotApplicable, match="augmentation: the trainer already shifts its images"):
        apply(CATALOG.get("augmentation"), CIFAR10)
    once = apply(CATALOG.get("batchnorm"), DIGITS)
    with pytest.raises(NotApplicable, match="already has normalisation layers"):
        apply(CATALOG.get("batchnorm"), once)


def test_knob_only_entries_apply_to_cifar10_and_structural_ones_skip():
    applies = {}
    for entry in CATALOG:
        try:
            apply(entry, CIFAR10)
            applies[entry.name] = True
        except NotApplicable:
            applies[entry.name] = False
    assert applies["longer_training"] and applies["lower_lr"] and applies["weight_decay"]
    assert not applies["batchnorm"] and not applies["augmentation"] and not applies["label_smoothing"]


def test_knob_moves_find_the_trainers_own_spelling():
    functional = (PROJECT_ROOT / "tests" / "fixtures" / "trainers" / "functional_mlp" / "train.py").read_text()
    assert read_knobs(apply(CATALOG.get("lower_lr"), functional))["LEARNING_RATE"] == 0.05
    assert read_knobs(apply(CATALOG.get("widen"), functional))["HIDDEN"] == 256
    flat = (PROJECT_ROOT / "tests" / "fixtures" / "trainers" / "sequential_flat" / "train.py").read_text()
    assert read_knobs(apply(CATALOG.get("smaller_batch"), flat))["BATCH"] == 16


# A user's ViT (user trial): its capacity is EMBED_DIM and DEPTH, which no knob move reached.
TINY_VIT = """
import torch
from torch import nn

EMBED_DIM = 32  # the token width
DEPTH = 2  # transformer layers
NUM_HEADS = 4  # attention heads (EMBED_DIM must stay a multiple)
PATCH = 4  # pixels per patch side (8x8 digits: 4 patches)


def build() -> nn.Module:
    layer = nn.TransformerEncoderLayer(EMBED_DIM, NUM_HEADS, dim_feedforward=2 * EMBED_DIM, batch_first=True)
    return nn.ModuleDict(
        {
            "embed": nn.Linear(PATCH * PATCH, EMBED_DIM),
            "encoder": nn.TransformerEncoder(layer, DEPTH, enable_nested_tensor=False),
            "head": nn.Linear(EMBED_DIM, 10),
        }
    )


def forward(model: nn.ModuleDict, x: torch.Tensor) -> torch.Tensor:
    patches = x.reshape(-1, 2, PATCH, 2, PATCH).permute(0, 1, 3, 2, 4).reshape(-1, 4, PATCH * PATCH)
    return model["head"](model["encoder"](model["embed"](patches)).mean(1))
"""


def test_a_transformers_width_and_depth_are_knob_moves():
    widened = apply(CATALOG.get("widen"), TINY_VIT)
    deeper = apply(CATALOG.get("more_blocks"), widened)
    assert read_knobs(deeper) == {"EMBED_DIM": 64, "DEPTH": 3, "NUM_HEADS": 4, "PATCH": 4}
    with pytest.raises(NotApplicable, match="no literal hidden width"):
        apply(CATALOG.get("widen_layers"), TINY_VIT)  # the move reaches it: no second way to double it
    trainer: dict = {}
    exec(compile(deeper, "train.py", "exec"), trainer)  # the moved trainer still builds and predicts
    model = trainer["build"]()
    assert len(model["encoder"].layers) == 3 and model["embed"].out_features == 64
    assert trainer["forward"](model, torch.zeros(5, 8, 8)).shape == (5, 10)
    with pytest.raises(NotApplicable, match="has no knob DEPTH"):
        apply(CATALOG.get("more_blocks"), DIGITS)  # a CNN whose depth is its code, not a knob
    capped = rewrite_knobs(TINY_VIT, {"DEPTH": 12})
    assert read_knobs(apply(CATALOG.get("more_blocks"), rewrite_knobs(TINY_VIT, {"DEPTH": 11})))["DEPTH"] == 12
    with pytest.raises(NotApplicable):
        apply(CATALOG.get("more_blocks"), capped)  # at its cap: the move would change nothing


def test_added_knobs_join_the_knob_block():
    source = apply(CATALOG.get("grokfast_filter"), DIGITS)
    knobs = read_knobs(source)
    assert knobs["GROKFAST_ALPHA"] == 0.98 and knobs["GROKFAST_LAMB"] == 2.0
    names = list(knobs)
    assert names.index("GROKFAST_LAMB") == names.index("VAL_FRACTION") + 2  # right after the seed's last knob
    assert "GROKFAST_ALPHA = 0.98  # " in source  # one line with a trailing comment, as the engine rewrites


def test_add_knobs_stop_at_cifar10_blank_line():
    source = apply(CATALOG.get("longer_training"), CIFAR10)
    lines = source.splitlines()
    assert lines.index("EPOCHS = 18  # passes over the train split") < lines.index(
        "CIFAR_MEAN = (0.4914, 0.4822, 0.4465)"
    )


def test_transforms_compose_in_either_order():
    for source in (stack(["batchnorm", "deepen"]), stack(["deepen", "batchnorm"])):
        assert "self.fc = torch.nn.Sequential(torch.nn.Linear(2 * width * 4 * 4, HEAD_WIDTH), " in source
        assert source.count("torch.nn.BatchNorm2d(") == 2
    assert stack(["deepen"]).count("BatchNorm") == 0
    for both in (stack(["cosine_lr_schedule", "lr_warmup"]), stack(["lr_warmup", "cosine_lr_schedule"])):
        # one scheduler with both shapes (two LambdaLRs would each set the rate and undo the other)
        assert both.count(".step()  # once per epoch") == 1 and both.count("lr_factor(") == 1
        assert 'anneal="cosine"' in both and "warmup_epochs=WARMUP_EPOCHS" in both
    with pytest.raises(NotApplicable, match="already has a schedule"):
        stack(["cosine_lr_schedule", "one_cycle_schedule"])


def test_a_transform_entry_must_name_a_registered_transform(tmp_path: Path):
    path = tmp_path / "bad.yaml"
    path.write_text("interventions:\n  - {name: x, description: d, answers: [healthy], transform: no_such}\n")
    with pytest.raises(ValueError, match="'no_such' is not a transform"):
        load_catalog(path)


@pytest.mark.parametrize(
    ("transform", "field", "value", "shown"),
    [
        ("channels_last", "needs_gpu", "yes please", "'yes please'"),
        ("flip_augmentation", "mirrors_images", "1", "1"),
        ("shift_augmentation", "needs_images", "images", "'images'"),
    ],
)
def test_a_flag_must_be_true_or_false(tmp_path: Path, transform: str, field: str, value: str, shown: str):
    path = tmp_path / "bad.yaml"
    path.write_text(
        f"interventions:\n  - {{name: x, description: d, answers: [healthy], transform: {transform},\n"
        f"     {field}: {value}}}\n"
    )
    with pytest.raises(ValueError, match=f"{field}.*expected true or false, got {shown}"):
        load_catalog(path)


def test_adamw_rewrites_optimizer_and_knob_comments():
    source = apply(CATALOG.get("adamw_optimizer"), DIGITS)
    assert "torch.optim.AdamW(model.parameters(), lr=LR, betas=(MOMENTUM, 0.999), weight_decay=WEIGHT_DECAY)" in source
    assert "LR = 0.003  # AdamW learning rate" in source and "MOMENTUM = 0.9  # AdamW momentum" in source
    assert read_knobs(source)["WEIGHT_DECAY"] == 0.05


# -----------------------------------------------------------------------------
# Every entry, and stacks of them, still train (real processes forked warm: tests/agents/warm_trainer.py)


SPLITS = prepare(0, 0.2, 0.2)


@pytest.fixture(scope="module")
def digits_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    data = tmp_path_factory.mktemp("digits_data")
    write_public(SPLITS, data, "digits")
    return data


def _applies(name: str) -> bool:
    try:
        apply(CATALOG.get(name), DIGITS)
    except NotApplicable:
        return False
    return True


# (the seed has dropout and weight-decay knobs and a WIDTH knob: add_dropout, add_weight_decay, widen_layers skip)
ON_SEED = [name for name in CATALOG.names() if _applies(name)]


# The RL post-training entries move task=grpo's knobs: they apply to the GRPO seed (tests/tasks/test_posttrain.py).
RL_ENTRIES = {
    "larger_group",
    "hotter_sampling",
    "cooler_sampling",
    "stronger_kl",
    "weaker_kl",
    "larger_lora_rank",
    "partial_credit",
    "stronger_length_penalty",
    "more_rl_steps",
}
# The KTO entries move task=kto's knobs only (tests/tasks/test_posttrain.py).
KTO_ENTRIES = {"more_samples_per_prompt", "raise_desirable_weight", "add_true_answers", "more_kto_prompts"}


def test_all_but_four_entries_apply_to_the_seed():
    # more_blocks moves a DEPTH knob (a transformer's layers: test_a_transformers_width_and_depth_are_knob_moves)
    assert (
        set(CATALOG.names()) - set(ON_SEED)
        == {"add_dropout", "add_weight_decay", "widen_layers", "more_blocks"} | RL_ENTRIES | KTO_ENTRIES
    )


def variants() -> dict[str, str]:
    """Each entry alone on the digits seed, plus the stacks; every one set to 2 epochs."""
    sources = {name: apply(CATALOG.get(name), DIGITS) for name in ON_SEED}
    sources.update({f"stack:{name}": stack(names) for name, names in STACKS.items()})
    return {name: rewrite_knobs(source, {"EPOCHS": 2}) for name, source in sources.items()}


@pytest.fixture(scope="module")
def trained(digits_data: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    """Run every variant once, two at a time, each a fresh fork of a process that imported torch once."""
    return train_all(variants(), digits_data, tmp_path_factory.mktemp("variants"), workers=max(2, os.cpu_count() or 2))


@pytest.mark.parametrize("name", ON_SEED + [f"stack:{s}" for s in STACKS])
def test_variant_trains(trained: dict[str, dict], name: str):
    run = trained[name]
    assert run["returncode"] == 0, run["stderr"]
    assert [r["epoch"] for r in run["records"]] == [1, 2]
    for record in run["records"]:
        for key in REQUIRED:
            assert math.isfinite(record[key]), (key, record)
    predictions = np.load(run["predictions"])
    assert predictions["selection"].shape == SPLITS.selection_y.shape
    assert predictions["test"].shape == SPLITS.test_y.shape


# -----------------------------------------------------------------------------
# A src-layout trainer: train.py puts src/ on sys.path, then imports its model from src/mylab/model.py

MULTIFILE = PROJECT_ROOT / "tests" / "fixtures" / "multifile" / "block_cnn"
# How trainers put their src/ folder on sys.path before `from mylab.model import BlockCNN`.
SRC_IDIOMS = {
    "here": 'HERE = Path(__file__).resolve().parent\nsys.path.insert(0, str(HERE / "src"))\n',
    "path": 'sys.path.insert(0, str(Path(__file__).parent / "src"))\n',
    "os.path": 'sys.path.insert(0, os.path.join(os.path.dirname(__file__), "src"))\n',
}


def src_layout(folder: Path, idiom: str) -> dict[str, str]:
    """The multi-file fixture rewritten as a src-layout package in `folder`: its files, relative path -> source."""
    inserted = (
        f"import os\nimport sys\nfrom pathlib import Path\n\n{SRC_IDIOMS[idiom]}from mylab.model import BlockCNN\n"
    )
    train = (MULTIFILE / "train.py").read_text()
    assert "from models import BlockCNN\n" in train
    package = folder / "src" / "mylab"
    package.mkdir(parents=True)
    (folder / "train.py").write_text(train.replace("from models import BlockCNN\n", inserted))
    (package / "__init__.py").write_text("")
    (package / "model.py").write_text((MULTIFILE / "models.py").read_text())
    return {str(p.relative_to(folder)): p.read_text() for p in folder.rglob("*.py")}


@pytest.mark.parametrize("idiom", sorted(SRC_IDIOMS))
def test_a_layer_intervention_follows_the_model_into_a_src_layout(tmp_path: Path, idiom: str):
    """User trial ("ship my trainer as a package"): train.py put src/ on sys.path and imported its model from
    mylab.model; the layer interventions looked for mylab/model.py at the folder's root and did not apply. The
    module is looked for in the folders train.py puts on sys.path too: batchnorm edits src/mylab/model.py."""
    files = src_layout(tmp_path, idiom)
    assert model_file(files["train.py"], tmp_path) == ("src/mylab/model.py", "BlockCNN")
    assert model_file(files["train.py"], files.keys()) == ("src/mylab/model.py", "BlockCNN")
    changed = apply_files(CATALOG.get("batchnorm"), files)
    assert set(changed) == {"src/mylab/model.py"}
    assert "self.bn_conv = torch.nn.BatchNorm2d(cout)" in changed["src/mylab/model.py"]


def test_a_src_layout_model_missing_from_the_folder_says_where_it_was_looked_for(tmp_path: Path):
    files = src_layout(tmp_path, "here")
    del files["src/mylab/model.py"]
    with pytest.raises(
        NotApplicable, match=r"`mylab/model\.py`, not a file of the variant's folder: looked in src, \."
    ):
        apply_files(CATALOG.get("add_dropout"), files)


def test_the_heuristic_coder_edits_a_src_layout_model_and_it_trains(tmp_path: Path):
    """End to end: the coder reads src/mylab/model.py from the parent's folder, writes the edit there, and the child
    passes the gate's smoke run (a real subprocess, which finds the package through train.py's sys.path line)."""
    parent, child = tmp_path / "parent", tmp_path / "child"
    src_layout(parent, "path")
    shutil.copytree(parent, child)
    recommendation = Recommendation("add_dropout", Diagnosis.overfitting, "because", 1.0)
    HeuristicCoder()._edit(recommendation, child, None)
    assert (child / "train.py").read_text() == (parent / "train.py").read_text()
    edited = (child / "src" / "mylab" / "model.py").read_text()
    assert edited != (parent / "src" / "mylab" / "model.py").read_text() and "Dropout" in edited
    assert not (child / "mylab").exists()
    smoke = write_smoke_data(prepare(0, 0.2, 0.2), tmp_path / "smoke", "digits")
    Gate(smoke, (), timeout_s=120).check(child, parent)


def test_the_augmentation_entry_describes_the_padding_its_helper_uses():
    """User trial: the entry said "zero padding: the digits' background is 0" while the helper repeats the border
    (`mode="replicate"`; in normalised inputs 0 is mid-grey)."""
    description = CATALOG.get("augmentation").description
    assert 'mode="replicate"' in SHIFT_HELPER and "zero" not in description
    assert "border" in description and "repeat" in description


@pytest.mark.parametrize(
    ("added", "expected"),
    [
        ('sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "src"))', "src/mylab/model.py"),
        ('sys.path.insert(0, str(Path(__file__).parent.joinpath("src")))', "src/mylab/model.py"),
        ('sys.path.insert(0, "src")', "src/mylab/model.py"),  # (trials run in the variant's folder)
        ('sys.path.append(str(Path(__file__).parent / "src"))', "mylab/model.py"),  # after train.py's own folder
        ('sys.path.insert(0, "/opt/lab/src")', "mylab/model.py"),  # outside the folder: not the variant's
        ('sys.path.insert(0, str(Path(__file__).parent / "../src"))', "mylab/model.py"),
    ],
)
def test_the_model_file_is_the_one_python_imports(added: str, expected: str):
    """Where both mylab/model.py and src/mylab/model.py exist, the one Python finds first: a folder inserted at the
    front of sys.path comes before train.py's own, one appended after it."""
    source = f"import os\nimport sys\nfrom pathlib import Path\n{added}\n" + (MULTIFILE / "train.py").read_text()
    source = source.replace("from models import BlockCNN\n", "from mylab.model import BlockCNN\n")
    assert model_file(source, ["train.py", "mylab/model.py", "src/mylab/model.py"]) == (expected, "BlockCNN")
    assert model_file(source) == ("mylab/model.py", "BlockCNN")  # without the folder: the path at its root
