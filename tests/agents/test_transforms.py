"""Code interventions as syntax-tree transforms, on differently written trainers (tests/fixtures/trainers) and the
seeds.

The applicability table is pinned: a transform that stops finding its idiom (or starts matching where it must not)
fails here with the reason. Every output parses and keeps the knobs module-level literals; a few transformed
trainers go through the real validation gate (a real subprocess smoke run on digits).
"""

from __future__ import annotations

import ast
import builtins
import json
import os
import re
import runpy
import shutil
import socket
import subprocess
import symtable
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.optim.swa_utils import AveragedModel

from ralph_ray import PROJECT_ROOT
from ralph_ray.agents.catalog import apply as catalog_apply
from ralph_ray.agents.catalog import load_catalog
from ralph_ray.agents.transforms import (
    TRANSFORMS,
    NotApplicable,
    applicability,
    apply_transform,
    check_transform,
)
from ralph_ray.agents.transforms._tree import Edits, analyse, code
from ralph_ray.gate import SMOKE_KNOBS, Gate, write_smoke_data
from ralph_ray.knobs import read_knobs, rewrite_knobs
from ralph_ray.tasks.base import Splits, declared_metric, random_split, write_public
from ralph_ray.tasks.digits import prepare

FIXTURES = PROJECT_ROOT / "tests" / "fixtures" / "trainers"
TRAINERS = {path.parent.name: path.parent for path in sorted(FIXTURES.glob("*/train.py"))}
TRAINERS |= {name: PROJECT_ROOT / "trainers" / name for name in ("digits", "cifar10", "fashion", "lm", "diabetes")}
# a user's regression trainer (kept apart from tests/fixtures/trainers, which the benches run on digits)
TRAINERS["store_sales"] = PROJECT_ROOT / "tests" / "fixtures" / "regression" / "store_sales"
# a user's Fashion-MNIST CNN (28x28 images: kept apart for the same reason): train_one_epoch(...) called from main()'s
# epoch loop, a criterion with label_smoothing=0.05, a OneCycleLR stepped per batch
TRAINERS["fmnist_cnn"] = PROJECT_ROOT / "tests" / "fixtures" / "images28" / "fmnist_cnn"
# a user's Lightning-style trainer in plain PyTorch: the model's configure_optimizers() builds the optimizer, a
# generic Trainer.fit(model, ...) steps it and takes the loss from model.training_step(batch)
TRAINERS["lit_classifier"] = PROJECT_ROOT / "tests" / "fixtures" / "lightning" / "lit_classifier"
# an HF-style trainer (user trial ut_dataclass): a @dataclass config, a Trainer class whose train() runs the epoch
# loop and calls self.train_epoch() and self.evaluate()
TRAINERS["hf_trainer"] = PROJECT_ROOT / "tests" / "fixtures" / "hf_style" / "dataclass_trainer"
SOURCES = {name: (folder / "train.py").read_text() for name, folder in TRAINERS.items()}

ALL = set(TRANSFORMS)
# Which transforms apply to which trainer (and so, by omission, which do not).
APPLIES = {
    "sequential_flat": ALL,
    "module_loader": ALL - {"widen_layers", "adamw_optimizer"},
    # layers a loop adds to a list for nn.Sequential(*layers); HIDDEN = [128, 64] (widen_layers doubles each)
    "list_mlp": ALL - {"adamw_optimizer", "channels_last"},
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
        "flip_tta",
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
    # already data-parallel (the harness helpers)
    "digits": ALL - {"widen_layers", "add_dropout", "add_weight_decay", "data_parallel"},
    "fashion": ALL - {"widen_layers", "add_dropout", "add_weight_decay", "data_parallel"},
    # tokens in (nn.Embedding): no image augmentation; it exports its model (no DDP wrapper around it)
    "lm": ALL
    - {
        "widen_layers",
        "adamw_optimizer",
        "channels_last",
        "shift_augmentation",
        "flip_augmentation",
        "flip_tta",
        "data_parallel",
    },
    # regression (F.mse_loss): neither image augmentation nor the cross-entropy transforms
    "diabetes": {
        "add_dropout",
        "batchnorm",
        "cosine_lr_schedule",
        "deepen",
        "ema_weights",
        "gradient_clipping",
        "grokfast_filter",
        "lr_warmup",
        "mixed_precision",
        "one_cycle_schedule",
        "data_parallel",
    },
    # regression (an nn.HuberLoss criterion), a ReduceLROnPlateau schedule, a loop-built MLP with a list width knob
    "store_sales": {
        "add_dropout",
        "add_weight_decay",
        "batchnorm",
        "data_parallel",
        "deepen",
        "ema_weights",
        "gradient_clipping",
        "grokfast_filter",
        "mixed_precision",
        "widen_layers",
    },
    # the batch loop in train_one_epoch(...), which main()'s epoch loop calls: what must live across the batch loop
    # and the epoch loop (a weight average, a replay buffer, a self-model head, a gradient EMA) is handed to it by a
    # parameter the transform adds
    "epoch_function": ALL - {"adamw_optimizer", "widen_layers"},
    "fmnist_cnn": {
        "add_dropout",
        "channels_last",
        "data_parallel",
        "deepen",
        "edge_of_chaos_curriculum",
        "ema_weights",
        "flip_augmentation",
        "flip_tta",
        "hard_example_replay",
        "mixed_precision",
        "self_model_head",
        "shift_augmentation",
    },
    # a user's MLP on features: no conv layers; its width is a knob
    "early_stopping": ALL - {"widen_layers", "channels_last"},
    # the loss comes from model.training_step(batch), the optimizer from model.configure_optimizers()
    "lit_classifier": {
        "add_dropout",
        "add_weight_decay",
        "batchnorm",
        "deepen",
        "gradient_clipping",
        "grokfast_filter",
    },
    # the batch loop in Trainer.train_epoch(), which train()'s epoch loop calls as self.train_epoch()
    "hf_trainer": {
        "add_dropout",
        "batchnorm",
        "deepen",
        "edge_of_chaos_curriculum",
        "flip_augmentation",
        "gradient_clipping",
        "grokfast_filter",
        "hard_example_replay",
        "label_smoothing",
        "mixed_precision",
        "self_model_head",
        "shift_augmentation",
    },
    "cifar10": {
        "deepen",
        "hard_example_replay",
        "self_model_head",
        "add_dropout",
        "gradient_clipping",
        "edge_of_chaos_curriculum",
        "ema_weights",
        "widen_layers",
    },
}


@pytest.mark.parametrize("trainer", sorted(TRAINERS))
def test_applicability_table(trainer: str):
    table = applicability(SOURCES[trainer])
    assert {name for name, why in table.items() if why is None} == APPLIES[trainer], table
    assert all(why for name, why in table.items() if name not in APPLIES[trainer])  # every refusal says why


def test_at_least_eight_code_interventions_apply_to_every_differently_written_trainer():
    for trainer in (*(p.parent.name for p in FIXTURES.glob("*/train.py")), "digits", "cifar10"):
        assert len(APPLIES[trainer]) >= 8, trainer


@pytest.mark.parametrize(
    ("trainer", "name", "reason"),
    [
        ("functional_mlp", "batchnorm", "functional model"),
        ("functional_mlp", "ema_weights", "no nn.Module model found"),
        ("cifar10", "cosine_lr_schedule", 'sets group\\["lr"\\] itself'),
        ("cifar10", "grokfast_filter", "BatchNorm"),
        ("cifar10", "mixed_precision", "already uses autocast"),
        ("cifar10", "adamw_optimizer", "parameter groups"),
        ("airbench_style", "one_cycle_schedule", "already has a schedule"),
        ("digits", "widen_layers", "the width is the knob WIDTH"),
        ("module_loader", "adamw_optimizer", "already Adam"),
        ("lm", "shift_augmentation", "token ids, not images"),
        ("lm", "flip_augmentation", "token ids, not images"),
        ("lm", "flip_tta", "token ids, not images"),
        ("cifar10", "flip_tta", "already averages over mirrored inputs"),
        ("functional_mlp", "flip_tta", "no nn.Module model found"),
        ("diabetes", "shift_augmentation", "regression loss"),
        ("digits", "data_parallel", "already data-parallel"),
        ("cifar10", "data_parallel", "model.init_whiten.*model.module"),
        ("lm", "data_parallel", "exports its model"),
        ("airbench_style", "data_parallel", "no length to split evenly"),
    ],
)
def test_not_applicable_names_the_missing_idiom(trainer: str, name: str, reason: str):
    with pytest.raises(NotApplicable, match=reason):
        apply_transform(name, SOURCES[trainer])


@pytest.mark.parametrize("name", ["shift_augmentation", "flip_augmentation"])
def test_self_models_auxiliary_loss_is_no_regression_loss(name: str):
    child = apply_transform("self_model_head", SOURCES["fashion"])
    assert "smooth_l1_loss" in child
    apply_transform(name, child)  # an image classifier still, not refused as regression


# A 2-layer autoencoder on digits' 8x8 images, written four ways an image-to-image model shows itself: the loss
# compares the output with the input batch, the forward reshapes to images, the output layer is as wide as the input
# layer, the decoder upsamples. Each is trained with an MSE or a binary cross-entropy (user trial: with the BCE every
# image intervention applied, and flip_tta averaged each reconstruction with the mirror image's, 6.5% worse).
AUTOENCODER = """
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from ralph_ray import harness

LR = 0.01  # Adam
EPOCHS = 3
HIDDEN = 16  # bottleneck


MODEL


def main():
    torch.manual_seed(harness.seed())
    data = harness.load_data()
    x = torch.as_tensor(np.asarray(data.train_x), dtype=torch.float32) / 16.0
    y = torch.as_tensor(np.asarray(data.train_y), dtype=torch.float32) / 16.0
    model = BUILD
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    for epoch in range(EPOCHS):
        model.train()
        for i in range(0, len(x), 32):
            xb, yb = x[i : i + 32], y[i : i + 32]
            loss = LOSS
            opt.zero_grad()
            loss.backward()
            opt.step()
        model.eval()
        with torch.no_grad():
            val_loss = F.mse_loss(model(x), y).item()
        harness.report(epoch=epoch, train_loss=loss.item(), val_loss=val_loss)
    with torch.no_grad():
        sel = model(torch.as_tensor(np.asarray(data.selection_x), dtype=torch.float32) / 16.0)
        tst = model(torch.as_tensor(np.asarray(data.test_x), dtype=torch.float32) / 16.0)
    harness.save_predictions(selection=sel.numpy(), test=tst.numpy())
"""
FLAT = "nn.Sequential(nn.Flatten(), nn.Linear(64, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, 64), nn.Sigmoid())"
RESHAPING = """class AE(nn.Module):
    def __init__(self):
        super().__init__()
        self.encode = nn.Sequential(nn.Flatten(), nn.Linear(64, HIDDEN), nn.ReLU())
        self.decode = nn.Linear(HIDDEN, 8 * 8)

    def forward(self, x):
        out = torch.sigmoid(self.decode(self.encode(x)))
        out = out.view(-1, 1, 8, 8)
        return out"""
UPSAMPLING = """class AE(nn.Module):
    def __init__(self):
        super().__init__()
        self.down = nn.Conv2d(1, HIDDEN, 3, stride=2, padding=1)
        self.up = nn.ConvTranspose2d(HIDDEN, 1, 4, stride=2, padding=1)

    def forward(self, x):
        return torch.sigmoid(self.up(torch.relu(self.down(x))))"""
AUTOENCODERS = {
    # (model class, how it is built, the loss's target) -> the idiom named in the refusal
    "reconstructs": ("", FLAT, "xb", "compares the model's output with its input batch"),
    "reshapes": (RESHAPING, "AE()", "yb", r"forward returns `out.view\(-1, 1, 8, 8\)`"),
    "as_wide": ("", FLAT, "yb.flatten(1)", "as wide as its first"),
    "upsamples": (UPSAMPLING, "AE()", "yb", r"builds `nn.ConvTranspose2d"),
}


def autoencoder(kind: str, loss: str) -> str:
    """The autoencoder source of one kind, trained with `F.<loss>`."""
    model, build, target, _ = AUTOENCODERS[kind]
    text = AUTOENCODER.replace("MODEL", model).replace("BUILD", build)
    return text.replace("LOSS", f"F.{loss}(model(xb), {target})")


@pytest.mark.parametrize("loss", ["mse_loss", "binary_cross_entropy"])
@pytest.mark.parametrize("kind", sorted(AUTOENCODERS))
@pytest.mark.parametrize("name", ["shift_augmentation", "flip_augmentation", "flip_tta"])
def test_image_interventions_refuse_a_model_whose_targets_are_images(name: str, kind: str, loss: str):
    with pytest.raises(NotApplicable, match=f"the targets are images too .*{AUTOENCODERS[kind][3]}"):
        apply_transform(name, autoencoder(kind, loss))


def test_a_classifier_trained_with_a_binary_cross_entropy_still_gets_the_image_interventions():
    """The refusal reads the model's idioms, not the loss's name: a BCE on one-hot labels is still a classifier."""
    source = SOURCES["sequential_flat"]
    bce = source.replace("crit = nn.CrossEntropyLoss()", "crit = nn.BCEWithLogitsLoss()").replace(
        "loss = crit(out, Yt[i])", "loss = crit(out, nn.functional.one_hot(Yt[i], 10).float())"
    )
    assert bce.count("BCEWithLogitsLoss") == 1 and "one_hot" in bce
    for name in ("shift_augmentation", "flip_augmentation", "flip_tta"):
        assert applicability(bce)[name] is None, name


def test_a_self_model_child_still_learns_at_its_parents_learning_rate(tmp_path: Path):
    """The airbench-style fixture (Nesterov SGD at LR 0.2) with the self-model head, trained in full on digits: the
    head's regression on raw features diverged at that LR (selection 0.41-0.76 over 3 seeds, NaN on a 4th; 0.98 for
    the parent); on unit-norm features with a log-loss Huber target it trains like its parent."""
    splits = prepare(0, 0.2, 0.2)
    write_public(splits, tmp_path / "data", "digits")
    (tmp_path / "train.py").write_text(apply_transform("self_model_head", SOURCES["airbench_style"]))
    env = os.environ | {"RALPH_DATA_DIR": str(tmp_path / "data"), "RALPH_DEVICE": "cpu", "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [sys.executable, "train.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert result.returncode == 0, result.stderr[-2000:]
    selection = np.load(tmp_path / "predictions.npz")["selection"]
    assert (selection == splits.selection_y).mean() >= 0.9


CASES = [(trainer, name) for trainer in sorted(TRAINERS) for name in sorted(APPLIES[trainer])]


@pytest.mark.parametrize(("trainer", "name"), CASES)
def test_output_parses_and_keeps_knobs_module_level_literals(trainer: str, name: str):
    source = SOURCES[trainer]
    result = apply_transform(name, source)
    tree = ast.parse(result)
    before, after = read_knobs(source), read_knobs(result)
    assert set(before) <= set(after), "a knob disappeared"
    changed = {k for k in before if before[k] != after[k]}
    moved = {
        "adamw_optimizer": {"LR", "LEARNING_RATE", "WEIGHT_DECAY"},
        "widen_layers": {"WIDTH1", "WIDTH2", "WIDTH3", "HIDDEN"},
    }
    assert changed <= moved.get(name, set())
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


def test_deepen_adds_a_hidden_layer_as_wide_as_its_knob_and_a_second_one_reuses_it():
    once = apply_transform("deepen", SOURCES["fashion"])
    assert "HEAD_WIDTH = 256  # units of the hidden layer before the classifier" in once
    assert (
        "torch.nn.Sequential(torch.nn.Linear(2 * width * 7 * 7, HEAD_WIDTH), torch.nn.ReLU(), "
        "nn.Linear(HEAD_WIDTH, num_classes))" in once
    )
    built: dict = {}
    exec(compile(once.replace("HEAD_WIDTH = 256", "HEAD_WIDTH = 48"), "train.py", "exec"), built)
    linears = [m for m in built["Net"](8, 10, 0.0).modules() if isinstance(m, torch.nn.Linear)]
    assert [(m.in_features, m.out_features) for m in linears] == [(2 * 8 * 7 * 7, 48), (48, 10)]  # not 784 x 784
    twice = apply_transform("deepen", once)
    assert twice.count("HEAD_WIDTH = ") == 1 and "torch.nn.Linear(HEAD_WIDTH, HEAD_WIDTH)" in twice
    # A keyword input size is replaced too.
    keyword = apply_transform(
        "deepen",
        SOURCES["sequential_flat"].replace(
            "nn.Linear(16 * 4 * 4, 10)", "nn.Linear(in_features=16 * 4 * 4, out_features=10)"
        ),
    )
    assert "nn.Linear(in_features=HEAD_WIDTH, out_features=10)" in keyword
    # The knob's name is apart from the width knobs': widen_layers still widens the trainer's own layers after it
    widened = apply_transform("widen_layers", apply_transform("deepen", SOURCES["sequential_flat"]))
    assert "nn.Conv2d(1, 32, 3, padding=1)" in widened and "HEAD_WIDTH = 256  #" in widened
    # A trainer's own HEAD_WIDTH that is not a previous deepen's is never taken over
    own = SOURCES["sequential_flat"].replace(
        "BATCH = 32  # batch size", "BATCH = 32  # batch size\nHEAD_WIDTH = 7  # mine"
    )
    with pytest.raises(NotApplicable, match="already has a knob HEAD_WIDTH"):
        apply_transform("deepen", own)


@pytest.mark.parametrize(
    ("trainer", "swap", "activation"),
    [
        ("sequential_flat", ("nn.ReLU()", "nn.SiLU()"), "SiLU"),  # a module in nn.Sequential
        ("module_loader", ("F.relu(", "F.gelu("), "GELU"),  # a function in forward
        ("lm", ("torch.tanh(", "torch.tanh("), "Tanh"),  # torch's own function
        ("sequential_flat", ("nn.ReLU()", "nn.Identity()"), "ReLU"),  # none named: ReLU
        ("module_loader", ("F.relu(", "nn.functional.silu("), "SiLU"),  # `from torch import nn` (review)
    ],
)
def test_deepen_uses_the_models_own_activation(trainer: str, swap: tuple[str, str], activation: str):
    """User trial: deepen put a ReLU layer before the classifier of a SiLU network."""
    source = SOURCES[trainer].replace(*swap)
    assert swap[0] not in source or swap[0] == swap[1]
    deepened = apply_transform("deepen", source)
    assert "torch.nn.Linear(" in deepened and f"HEAD_WIDTH), torch.nn.{activation}(), " in deepened
    assert activation == "ReLU" or "torch.nn.ReLU()" not in deepened


def test_deepen_reads_the_activation_of_the_model_not_of_the_loss():
    """Review: a GELU model whose loss line used `torch.tanh` twice got a Tanh layer: only the model's classes and
    Sequentials count where it has them."""
    source = SOURCES["module_loader"].replace("F.relu(", "F.gelu(")
    extra = " + 0 * torch.tanh(loss)" * (source.count("F.gelu(") + 1)  # more than the model's own calls
    tanh = source.replace("loss.backward()", f"(loss{extra}).backward()", 1)
    assert tanh.count("torch.tanh(") > tanh.count("F.gelu(") > 0
    assert "HEAD_WIDTH), torch.nn.GELU(), " in apply_transform("deepen", tanh)


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


# -----------------------------------------------------------------------------
# A user's trainer (tests/fixtures/trainers/early_stopping): early stopping that restores the best state_dict and a
# predict() closure. ema_weights used to swap only `model.eval()` and evaluate(): the closure predicted with the raw
# model, left in train mode (dropout on), from the raw weights of the epoch the EMA's validation loss chose.


def spy_on_a_run(monkeypatch: pytest.MonkeyPatch, folder: Path, data: Path) -> dict:
    """Run `folder/train.py` in this process on `data`, a spy on every module call and state_dict load: the last two
    forward passes of the trainer's own model (the selection's and the test's predictions) and which loads went into
    a weight average's network."""
    averaged: list[AveragedModel] = []
    passes: list[dict] = []
    loads: list[bool] = []
    depth = [0]
    call, load, init = torch.nn.Module.__call__, torch.nn.Module.load_state_dict, AveragedModel.__init__

    def spy_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        averaged.append(self)

    def spy_call(self, *args, **kwargs):
        depth[0] += 1
        try:
            out = call(self, *args, **kwargs)
        finally:
            depth[0] -= 1
        if depth[0] == 0 and out.dim() == 2:  # the trainer's own forward passes, not its layers' or the loss's
            modes = [m.training for m in self.modules()]
            passes[:] = [*passes[-1:], {"averaged": isinstance(self, AveragedModel), "training": modes, "out": out}]
        return out

    def spy_load(self, *args, **kwargs):
        loads.append(any(self is a.module for a in averaged))
        return load(self, *args, **kwargs)

    monkeypatch.setattr(AveragedModel, "__init__", spy_init)
    monkeypatch.setattr(torch.nn.Module, "__call__", spy_call)
    monkeypatch.setattr(torch.nn.Module, "load_state_dict", spy_load)
    for key, value in {"RALPH_DATA_DIR": str(data), "RALPH_DEVICE": "cpu", "RALPH_SEED": "0"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.chdir(folder)
    runpy.run_path(str(folder / "train.py"), run_name="__main__")
    return {"passes": passes, "loads": loads, "saved": np.load(folder / "predictions.npz")}


def test_ema_rewrites_the_closure_and_the_best_state_of_a_users_trainer():
    result = apply_transform("ema_weights", SOURCES["early_stopping"])
    lines = lines_of(result)
    assert "return ema(t).argmax(dim=1).numpy()" in lines  # the nested predict() closure
    assert "val_loss, val_acc = evaluate(ema, val_loader, criterion)" in lines
    # the best state is the average's (its validation loss chose it), restored into the average
    assert "best_loss, best_state, bad_epochs = val_loss, copy.deepcopy(ema.module.state_dict()), 0" in lines
    assert lines[lines.index("ema.module.load_state_dict(best_state)") + 1 :][:2] == ["model.eval()", "ema.eval()"]
    assert "model.state_dict()" not in result and "model.load_state_dict(" not in result
    # only training runs the raw model (evaluate() runs the one it is handed: the average)
    assert "loss = criterion(model(xb), yb)" in lines and "out = model(xb)" in lines and result.count("model(") == 2
    assert "use_buffers=True).eval()" in result  # the average is never trained: eval mode wherever it runs
    # the lm seed scores the model it exports: the average's network, not the raw one
    assert "harness.save_model(ema.module, " in apply_transform("ema_weights", SOURCES["lm"])


@pytest.mark.parametrize("names", [["add_dropout", "ema_weights"], ["ema_weights", "add_dropout"]])
def test_a_users_trainer_with_dropout_and_ema_predicts_with_the_average_in_eval_mode(
    gate: Gate, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, names: list[str]
):
    """Run for real on the smoke data (a fraction of a second): the two forward passes that made the saved predictions
    are the average's, with every module in it (the dropout too) in eval mode, and early stopping's best state was
    restored into the average's network."""
    source = SOURCES["early_stopping"]
    for name in names:
        source = apply_transform(name, source)
    assert "torch.nn.Dropout(DROPOUT)" in source
    (tmp_path / "train.py").write_text(rewrite_knobs(source, {"EPOCHS": 4, "PATIENCE": 2, "DROPOUT": 0.5}))
    spy = spy_on_a_run(monkeypatch, tmp_path, gate.smoke_data)
    selection, test = spy["passes"]
    assert (selection["out"].argmax(1).numpy() == spy["saved"]["selection"]).all()  # these passes made them
    assert (test["out"].argmax(1).numpy() == spy["saved"]["test"]).all()
    for forward in (selection, test):
        assert forward["averaged"] and not any(forward["training"]), forward["training"]
    assert spy["loads"] == [True]  # the best state went into the average


@pytest.mark.parametrize(
    ("change", "reason", "refused_by"),
    [
        # a prediction without torch.no_grad(): evaluation or training cannot be told apart
        (
            (
                "        with torch.no_grad():\n            return model(t)",
                "        if True:\n            return model(t)",
            ),
            "without torch.no_grad",
            {"ema_weights", "flip_tta"},
        ),
        # predictions from a copy of the model: a use neither evaluation nor a best state
        (
            ("    model.eval()\n\n", "    final = copy.deepcopy(model)\n    model.eval()\n\n"),
            "final = copy.deepcopy",
            {"ema_weights", "flip_tta"},
        ),
        # a closure that runs the model, called in the batch loop: training's targets
        (
            (
                "            loss = criterion(model(xb), yb)",
                "            loss = criterion(model(xb), yb) + predict(xb).sum()",
            ),
            "`predict` runs the model and is called in the batch loop",
            {"ema_weights", "flip_tta"},
        ),
        # the best state kept in a file: the average cannot take it over (flips use the model's own weights)
        (
            ("model.load_state_dict(best_state)", 'model.load_state_dict(torch.load("best.pt"))'),
            "loads weights during training or from elsewhere",
            {"ema_weights"},
        ),
        # restored during training (a restart from the best): training's weights, not the predictions'
        (
            ("                break\n", "                model.load_state_dict(best_state)\n                break\n"),
            "loads weights during training",
            {"ema_weights"},
        ),
    ],
    ids=["no_grad_missing", "copied", "closure_in_training", "from_a_file", "restored_in_training"],
)
def test_a_trainer_whose_every_prediction_cannot_be_placed_is_refused(
    change: tuple[str, str], reason: str, refused_by: set[str]
):
    source = SOURCES["early_stopping"].replace(*change)
    assert source != SOURCES["early_stopping"]
    for name in sorted(refused_by):
        with pytest.raises(NotApplicable, match=re.escape(reason)):
            apply_transform(name, source)
    if "flip_tta" not in refused_by:  # the closure's forward pass is flipped as the validation's is
        assert "return flip_averaged(model, t).argmax(dim=1).numpy()" in lines_of(apply_transform("flip_tta", source))


def test_a_loop_in_a_function_the_model_is_handed_to_is_refused():
    """Review: with the epoch loop and the best state's restore in `fit(model, ...)` and the predict() closure left in
    main(), ema_weights restored the average into fit()'s local (lost on return) and main() predicted with the raw
    model; flip_tta flipped the validation but not the predictions. The caller's uses are out of sight: refused."""
    source = SOURCES["early_stopping"]
    start = source.index('    best_loss, best_state, bad_epochs = float("inf"), None, 0\n')
    end = source.index("    model.load_state_dict(best_state)\n") + len("    model.load_state_dict(best_state)\n")
    loop = source[start:end].replace("len(train_ds)", "n_train")
    fit = f"def fit(model, optimizer, criterion, train_loader, val_loader, n_train):\n{loop}\n\n"
    moved = source[:start] + "    fit(model, optimizer, criterion, train_loader, val_loader, len(train_ds))\n"
    moved = (moved + source[end:]).replace("def main():", fit + "def main():")
    assert "def predict(a)" in moved.split("def main():")[1]  # the predictions stay with the caller
    for name in ("ema_weights", "flip_tta"):
        with pytest.raises(NotApplicable, match=re.escape("the model comes into `fit()` as its parameter `model`")):
            apply_transform(name, moved)


PREDICT_CLOSURE = """    def predict(a):
        t = torch.from_numpy((np.asarray(a, dtype=np.float32).reshape(len(a), -1) - mean) / std)
        with torch.no_grad():
            return model(t).argmax(dim=1).numpy()
"""


@pytest.mark.parametrize(
    "change",
    [
        # the closure under @torch.no_grad()
        (
            PREDICT_CLOSURE,
            "    @torch.no_grad()\n" + PREDICT_CLOSURE.replace("        with torch.no_grad():\n    ", ""),
        ),
        # its every caller under torch.no_grad()
        (
            PREDICT_CLOSURE + "\n    harness.save_predictions(",
            PREDICT_CLOSURE.replace("        with torch.no_grad():\n    ", "")
            + "\n    with torch.no_grad():\n        harness.save_predictions(",
        ),
    ],
    ids=["decorated", "guarded_by_its_caller"],
)
def test_a_predict_closure_without_a_no_grad_block_of_its_own_is_still_found(change: tuple[str, str]):
    source = SOURCES["early_stopping"].replace(*change)
    assert source != SOURCES["early_stopping"] and "            return model(t)" not in source
    assert "return ema(t).argmax(dim=1).numpy()" in lines_of(apply_transform("ema_weights", source))
    assert "return flip_averaged(model, t).argmax(dim=1).numpy()" in lines_of(apply_transform("flip_tta", source))


TRAINS_IN_A_FUNCTION = """
import torch
import torch.nn.functional as F
from torch import nn

LR = 0.1  # learning rate
EPOCHS = 2  # epochs


def run(model, x, y):
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    for epoch in range(EPOCHS):
        model.train()
        for i in range(0, len(x), 32):
            loss = F.cross_entropy(model(x[i : i + 32]), y[i : i + 32])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        model.eval()
        with torch.no_grad():
            accuracy = (model(x).argmax(1) == y).float().mean()
    return accuracy


run(nn.Sequential(nn.Flatten(), nn.Linear(64, 10)), torch.randn(64, 1, 8, 8), torch.randint(0, 10, (64,)))
"""


def test_flip_tta_averages_each_image_with_its_mirror_where_the_model_is_evaluated(tmp_path: Path):
    result = apply_transform("flip_tta", SOURCES["fashion"])
    lines = lines_of(result)
    assert "logits = flip_averaged(model, as_input(x[i : i + 1000]))" in lines  # evaluate()
    assert "flip_averaged(model, as_input(x[i : i + 1000])).argmax(1)" in result  # predict()
    assert result.count("flip_averaged(model, ") == 2  # training's forward pass is left alone
    # a flat script: the forward under torch.no_grad() outside the batch loop, the EMA's too where it evaluates
    assert "vout = flip_averaged(net, Xv)" in lines_of(apply_transform("flip_tta", SOURCES["sequential_flat"]))
    averaged = apply_transform("flip_tta", apply_transform("ema_weights", SOURCES["sequential_flat"]))
    assert "vout = flip_averaged(ema, Xv)" in lines_of(averaged)
    # ...in either order: the EMA then evaluates through the flips
    flipped_first = apply_transform("ema_weights", apply_transform("flip_tta", SOURCES["sequential_flat"]))
    assert "vout = flip_averaged(ema, Xv)" in lines_of(flipped_first) and "flip_averaged(net, " not in flipped_first
    # a function that trains the model it is given and then evaluates it: only the evaluation, under no_grad
    trains = apply_transform("flip_tta", TRAINS_IN_A_FUNCTION)
    assert "loss = F.cross_entropy(model(x[i : i + 32]), y[i : i + 32])" in lines_of(trains)
    assert "accuracy = (flip_averaged(model, x).argmax(1) == y).float().mean()" in lines_of(trains)
    # the helper itself, run: (N, C, H, W) images and flattened square ones, mirrored left to right
    (tmp_path / "tta_trainer.py").write_text(result)
    sys.path.insert(0, str(tmp_path))
    try:
        flip_averaged = __import__("tta_trainer").flip_averaged
    finally:
        sys.path.remove(str(tmp_path))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 3))
    x = torch.randn(2, 1, 4, 4)
    expected = (model(x) + model(x[..., torch.arange(3, -1, -1)])) / 2
    assert torch.allclose(flip_averaged(model, x), expected)
    assert torch.allclose(flip_averaged(model, x.flatten(1)), expected)  # an MLP's flattened images
    symmetric = (x + x.flip(-1)) / 2
    assert torch.allclose(flip_averaged(model, symmetric), model(symmetric), atol=1e-6)
    with pytest.raises(ValueError, match="neither"):
        flip_averaged(model, torch.randn(2, 15))


EVALUATES_UNDECORATED = """
import torch
import torch.nn.functional as F

LR = 0.1  # learning rate
EPOCHS = 2  # epochs


def evaluate(model, x, y):
    return (model(x).argmax(1) == y).float().mean().item()


def main(model, x, y):
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    for epoch in range(EPOCHS):
        for i in range(0, len(x), 32):
            loss = F.cross_entropy(model(x[i : i + 32]), y[i : i + 32])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        with torch.no_grad():
            accuracy = evaluate(model, x, y)
    return accuracy


main(torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 10)), torch.randn(8, 1, 8, 8), torch.arange(8))
"""


def test_an_undecorated_evaluate_its_callers_guard_with_no_grad_is_evaluation():
    # evaluate() has no decorator and calls no .eval(), but its every call sits under torch.no_grad(): its forward pass
    # is evaluation, flipped; training's, in the batch loop, is left alone.
    flipped = lines_of(apply_transform("flip_tta", EVALUATES_UNDECORATED))
    assert "return (flip_averaged(model, x).argmax(1) == y).float().mean().item()" in flipped
    assert "loss = F.cross_entropy(model(x[i : i + 32]), y[i : i + 32])" in flipped
    assert "accuracy = evaluate(ema, x, y)" in lines_of(apply_transform("ema_weights", EVALUATES_UNDECORATED))
    # Called once with gradients on too (a check during training): not known to be evaluation, so nothing is flipped.
    unguarded = EVALUATES_UNDECORATED.replace("    return accuracy", "    evaluate(model, x, y)\n    return accuracy")
    assert unguarded != EVALUATES_UNDECORATED
    with pytest.raises(NotApplicable, match="only called under torch.no_grad"):
        apply_transform("flip_tta", unguarded)
    # A no-grad helper called in the batch loop makes training's targets (a teacher's outputs): never flipped.
    teacher = EVALUATES_UNDECORATED.replace(
        "            loss = F.cross_entropy(model(x[i : i + 32]), y[i : i + 32])",
        "            with torch.no_grad():\n                soft = evaluate(model, x[i : i + 32], y[i : i + 32])\n"
        "            loss = F.cross_entropy(model(x[i : i + 32]), y[i : i + 32]) * soft",
    )
    assert teacher != EVALUATES_UNDECORATED
    with pytest.raises(NotApplicable):
        apply_transform("flip_tta", teacher)


@pytest.mark.parametrize(
    ("trainer", "before", "forward", "observed"),
    [
        # the logits already have a name: observed as they are; the batch is named where the model reads it
        ("sequential_flat", [], "out = net((dream_inputs := Xt[i]))", "dream_replay.observe(out, dream_inputs, Yt[i])"),
        # computed inside the loss call: named there, once
        (
            "digits",
            [],
            "loss = F.cross_entropy((dream_logits := model((dream_inputs := x_train[idx]))), y_train[idx])",
            "dream_replay.observe(dream_logits, dream_inputs, y_train[idx])",
        ),
        # a random augmentation in the forward's argument: the images kept are the ones ranked, not a second draw
        (
            "digits",
            ["shift_augmentation"],
            "(dream_logits := model((dream_inputs := shift_images(x_train[idx]))))",
            "dream_replay.observe(dream_logits, dream_inputs, y_train[idx])",
        ),
    ],
    ids=["named", "in_loss_call", "augmented"],
)
def test_replay_observes_the_steps_own_batch_and_logits_without_a_second_forward(
    trainer: str, before: list[str], forward: str, observed: str
):
    """Replay used to run the model again on each batch to find its hardest examples (a third more compute per
    step, fewer epochs under a time budget); now it reads the losses of the forward the step already ran, and keeps
    the very inputs that forward saw (an augmentation evaluated again would have drawn other images)."""
    parent = SOURCES[trainer]
    for name in before:
        parent = apply_transform(name, parent)
    result = apply_transform("hard_example_replay", parent)
    assert forward in result and observed in result
    helper = ast.get_source_segment(
        result, next(n for n in ast.parse(result).body if getattr(n, "name", "") == "DreamReplay")
    )
    observe = helper[helper.index("def observe") : helper.index("def dream")]
    assert "model(" not in observe  # no forward pass of its own
    outside = result.replace(helper, "")
    for called in (analyse(parent).model_name(), "shift_images"):  # the trainer's own calls, no more
        assert outside.count(f"{called}(") == parent.count(f"{called}(")


@pytest.mark.parametrize("trainer", ["digits", "sequential_flat", "module_loader", "lm"])
def test_replay_dreams_before_an_epochs_batches_never_as_the_last_update(trainer: str):
    """After the epoch's batches, the last epoch's replay was the last update before evaluation: a step on the
    hardest examples alone cost the lm seed 0.88 bits per byte (4 of 4 seeds, `bench/intervention_effect.py`)."""
    tree = analyse(apply_transform("hard_example_replay", SOURCES[trainer]))
    epoch, batches = code(tree.epoch_loop()), code(tree.batch_loop())
    assert epoch.count(".dream(") == 1 and ".dream(" not in batches
    assert epoch.index(".dream(") < epoch.index(batches.splitlines()[0])  # in the epoch, before its batches


# A user's trainer (an LSTM trainer in a user trial, cut down): the knobs feed a dataclass config the loop reads
# (`lr=cfg.lr`), its criterion smooths labels, and every step clips its gradients.
CONFIG_TRAINER = """
from dataclasses import dataclass

import torch
import torch.nn as nn

LR = 1e-2  # RMSprop learning rate
EPOCHS = 3  # epochs
BATCH_SIZE = 32  # examples per step
CLIP = 1.0  # grad-norm clip


@dataclass
class Config:
    lr: float = LR
    epochs: int = EPOCHS
    batch_size: int = BATCH_SIZE
    clip: float = CLIP


cfg = Config()


def main() -> None:
    torch.manual_seed(0)
    x = torch.randn(256, 8)
    y = (x[:, 0] > 0).long()
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    criterion = nn.CrossEntropyLoss(label_smoothing=0.1)
    opt = torch.optim.RMSprop(model.parameters(), lr=cfg.lr)
    for epoch in range(cfg.epochs):
        model.train()
        for start in range(0, len(x), cfg.batch_size):
            xb, yb = x[start : start + cfg.batch_size], y[start : start + cfg.batch_size]
            opt.zero_grad()
            loss = criterion(model(xb), yb)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip)
            opt.step()


if __name__ == "__main__":
    main()
"""


@pytest.mark.parametrize(
    ("optimizer", "expected", "lr"),
    [
        # the config's field reads the LR knob: kept, and the knob set to AdamW's learning rate
        ("RMSprop(model.parameters(), lr=cfg.lr)", "AdamW(model.parameters(), lr=cfg.lr, weight_decay=", 0.003),
        # an Adam-family optimizer's name traced to no knob: kept as it is (its value is on AdamW's scale)
        ("Adamax(model.parameters(), lr=lr)", "AdamW(model.parameters(), lr=lr, weight_decay=", 0.01),
        # an SGD's name traced to no knob (`self.lr = 0.1` on the model): AdamW's own learning rate, not SGD's 0.1
        (
            "SGD(model.parameters(), lr=model.lr, momentum=cfg.momentum)",
            "AdamW(model.parameters(), lr=0.003, betas=(cfg.momentum, 0.999), weight_decay=",
            0.01,
        ),
    ],
    ids=["config_field", "untraced_adam_family", "untraced_sgd"],
)
def test_adamw_keeps_the_trainers_own_learning_rate_expression(optimizer: str, expected: str, lr: float):
    """`lr=cfg.lr` used to become `lr=0.003`: the LR knob, still searched and still passing the gate, no longer
    reached the optimizer, and every later LR move of that lineage did nothing."""
    source = CONFIG_TRAINER.replace("RMSprop(model.parameters(), lr=cfg.lr)", optimizer)
    result = apply_transform("adamw_optimizer", source)
    assert f"torch.optim.{expected}" in result
    assert read_knobs(result)["LR"] == lr


def test_weight_decay_edits_refuse_parameter_groups_built_by_a_function():
    """User trial: `SGD(param_groups(model, WEIGHT_DECAY), ...)`, each group with its own weight_decay, got
    `weight_decay=WEIGHT_DECAY_2` from add_weight_decay and `AdamW(..., weight_decay=WEIGHT_DECAY_2)` from
    adamw_optimizer: both passed the gate, and neither decay applied (a group's own weight_decay wins)."""
    helper = (
        "def param_groups(model, weight_decay):\n"
        "    decay = [p for p in model.parameters() if p.ndim > 1]\n"
        "    rest = [p for p in model.parameters() if p.ndim <= 1]\n"
        '    return [{"params": decay, "weight_decay": weight_decay}, {"params": rest, "weight_decay": 0.0}]\n\n\n'
    )
    source = TRAINS_IN_A_FUNCTION.replace("def run(model, x, y):", helper + "def run(model, x, y):").replace(
        "torch.optim.SGD(model.parameters(), lr=LR)", "torch.optim.SGD(param_groups(model, 5e-4), lr=LR)"
    )
    assert "SGD(param_groups(model, 5e-4), lr=LR)" in source
    weights, bias = torch.nn.Parameter(torch.ones(2, 2)), torch.nn.Parameter(torch.ones(2))
    built = [{"params": [weights], "weight_decay": 5e-4}, {"params": [bias], "weight_decay": 0.0}]
    groups = torch.optim.AdamW(built, lr=0.1, weight_decay=0.05).param_groups
    assert [g["weight_decay"] for g in groups] == [5e-4, 0.0]  # the optimizer's own value never reaches a group
    with pytest.raises(NotApplicable, match=r"the parameter groups of `param_groups\(model, 5e-4\)` set their own"):
        apply_transform("add_weight_decay", source)
    with pytest.raises(NotApplicable, match=r"parameter groups with their own weight_decay, from `param_groups"):
        apply_transform("adamw_optimizer", source)
    # a helper that only selects parameters, with no decay of its own, is no obstacle
    plain = source.replace(', "weight_decay": weight_decay}', "}").replace(', "weight_decay": 0.0}', "}")
    assert "weight_decay" not in plain.split("def run")[0].split("return")[1]
    plain = plain.replace("param_groups(model, 5e-4)", "param_groups(model)").replace(
        "def param_groups(model, weight_decay):", "def param_groups(model):"
    )
    assert "weight_decay=WEIGHT_DECAY" in apply_transform("add_weight_decay", plain)


def test_adamw_never_keeps_an_untraced_weight_decay():
    """Review: an untraced `weight_decay=wd` was kept, so SGD's L2 term of 5e-4 became AdamW's decoupled decay, 100x
    weaker than AdamW's 0.05; a traced one keeps its name, with the knob behind it set to AdamW's."""
    untraced = CONFIG_TRAINER.replace(
        "RMSprop(model.parameters(), lr=cfg.lr)", "SGD(model.parameters(), lr=cfg.lr, weight_decay=wd)"
    ).replace("    opt = torch.optim", "    wd = 5e-4\n    opt = torch.optim")
    assert "torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.05)" in (
        apply_transform("adamw_optimizer", untraced)
    )
    traced = untraced.replace("weight_decay=wd", "weight_decay=WEIGHT_DECAY").replace(
        "EPOCHS = ", "WEIGHT_DECAY = 5e-4  # L2\nEPOCHS = ", 1
    )
    result = apply_transform("adamw_optimizer", traced)
    assert "weight_decay=WEIGHT_DECAY)" in result and read_knobs(result)["WEIGHT_DECAY"] == 0.05


def count_calls(monkeypatch: pytest.MonkeyPatch, **targets: tuple[object, str]) -> dict[str, int]:
    """Count the calls of each `(owner, attribute)` under its key while a transformed trainer runs (the real runs)."""
    counts = dict.fromkeys(targets, 0)

    def counted(key: str, function):  # noqa: ANN001, ANN202 - wraps any callable
        def wrapper(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
            counts[key] += 1
            return function(*args, **kwargs)

        return wrapper

    for key, (owner, name) in targets.items():
        monkeypatch.setattr(owner, name, counted(key, getattr(owner, name)))
    return counts


def test_replay_steps_clip_and_take_the_trainers_loss(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The replay's extra steps used to skip the trainer's gradient clipping and use plain cross-entropy (its
    criterion's label smoothing dropped): every step now clips, and every loss is the trainer's criterion."""
    result = apply_transform("hard_example_replay", CONFIG_TRAINER)
    (tmp_path / "train.py").write_text(result)
    counts = count_calls(
        monkeypatch,
        steps=(torch.optim.RMSprop, "step"),
        clips=(torch.nn.utils, "clip_grad_norm_"),
        criterion=(torch.nn.CrossEntropyLoss, "forward"),
    )
    runpy.run_path(str(tmp_path / "train.py"), run_name="__main__")
    assert counts["steps"] > 3 * 8  # 3 epochs of 8 batches, and replay steps
    assert counts["clips"] == counts["steps"] and counts["criterion"] == counts["steps"]


def test_replay_steps_take_the_trainers_whole_loss_expression():
    """A summed loss divided by the batch size (`F.cross_entropy(out, y, reduction="sum") / cfg.batch_size`) was
    replayed as its bare call: every replay step at batch-size times the training step's scale."""
    source = CONFIG_TRAINER.replace(
        "loss = criterion(model(xb), yb)",
        'loss = torch.nn.functional.cross_entropy(model(xb), yb, reduction="sum") / cfg.batch_size',
    )
    result = apply_transform("hard_example_replay", source)
    dream = next(
        n for n in ast.walk(ast.parse(result)) if isinstance(n, ast.Call) and ast.unparse(n.func).endswith(".dream")
    )
    loss = eval(
        ast.unparse(next(k.value for k in dream.keywords if k.arg == "loss")), {"torch": torch, "cfg": ReplayConfig(32)}
    )
    logits, targets = torch.randn(32, 2), torch.randint(0, 2, (32,))
    assert torch.allclose(loss(logits, targets), torch.nn.functional.cross_entropy(logits, targets))  # the step's own
    # a loss that reads a name the batch loop binds, outside the call's logits and targets: refused
    with pytest.raises(NotApplicable, match=r"loss .* reads `xb`, which its batch loop binds"):
        apply_transform("hard_example_replay", source.replace("/ cfg.batch_size", "/ len(xb)"))


class ReplayConfig:
    """CONFIG_TRAINER's config, as its loss expression reads it."""

    def __init__(self, batch_size: int) -> None:
        self.batch_size = batch_size


def test_replay_steps_clip_only_when_the_trainers_step_does(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """`if cfg.clip > 0: clip_grad_norm_(...)` was replayed as an unconditional clip: at a clip of 0 every replay
    step zeroed its gradients (and still stepped momentum and weight decay)."""
    source = CONFIG_TRAINER.replace("CLIP = 1.0", "CLIP = 0.0").replace(
        "            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip)",
        "            if cfg.clip > 0:\n                torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip)",
    )
    result = apply_transform("hard_example_replay", source)
    (tmp_path / "train.py").write_text(result)
    counts = count_calls(monkeypatch, steps=(torch.optim.RMSprop, "step"), clips=(torch.nn.utils, "clip_grad_norm_"))
    runpy.run_path(str(tmp_path / "train.py"), run_name="__main__")
    assert counts["steps"] > 3 * 8 and counts["clips"] == 0  # replay steps taken, none clipped
    # a condition that reads the batch loop's names cannot be carried before the batches: refused
    with pytest.raises(NotApplicable, match=r"condition .* reads `start`, which its batch loop binds"):
        apply_transform("hard_example_replay", source.replace("if cfg.clip > 0:", "if start > 0:"))


def test_replay_refuses_a_clip_that_reads_the_batch():
    source = CONFIG_TRAINER.replace("cfg.clip)", "cfg.clip * len(yb))")
    with pytest.raises(NotApplicable, match="gradient clipping .* reads `yb`, which its batch loop binds"):
        apply_transform("hard_example_replay", source)


def test_widen_doubles_literal_widths_and_the_sizes_after_them():
    result = apply_transform("widen_layers", SOURCES["sequential_flat"])
    assert "nn.Conv2d(1, 32, 3, padding=1)" in result and "nn.Linear(32 * 4 * 4, 10)" in result


def test_schedules_count_epochs_from_the_loop():
    result = apply_transform("cosine_lr_schedule", SOURCES["module_loader"])
    assert "CosineAnnealingLR(optimizer, T_max=len(range(1, EPOCHS + 1)))" in result
    # under `harness.epochs(EPOCHS)` a time budget sets the count: one LambdaLR over the budget's progress
    harnessed = apply_transform("lr_warmup", apply_transform("cosine_lr_schedule", SOURCES["digits"]))
    assert 'harness.lr_factor(step, EPOCHS, anneal="cosine", warmup_epochs=WARMUP_EPOCHS)' in harnessed
    assert harnessed.count("lr_schedule.step()") == 1 and "CosineAnnealingLR" not in harnessed
    # another object's `.epochs(...)` is not the harness: torch's scheduler over the knob
    other = apply_transform("cosine_lr_schedule", SOURCES["digits"].replace("harness.epochs(", "plan.epochs("))
    assert "CosineAnnealingLR(optimizer, T_max=EPOCHS)" in other and "lr_factor" not in other


# -----------------------------------------------------------------------------
# The tuned cifar10 seed (airbench-style): a summed per-example loss, evaluation by a TTA function, width knobs


def lines_of(source: str) -> list[str]:
    return [line.strip() for line in source.splitlines()]


def test_cifar10_clip_sits_between_backward_and_step_scaled_to_the_summed_loss():
    lines = lines_of(apply_transform("gradient_clipping", SOURCES["cifar10"]))
    clip = lines.index("torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP * len(y_train[idx]))")
    assert lines[clip - 1] == "loss.backward()" and lines[clip + 1] == "optimizer.step()"
    # a mean loss keeps the plain limit
    assert "clip_grad_norm_(net.parameters(), GRAD_CLIP)" in apply_transform(
        "gradient_clipping", SOURCES["sequential_flat"]
    )


def test_cifar10_curriculum_weights_the_per_example_losses_inside_the_trainers_sum():
    result = apply_transform("edge_of_chaos_curriculum", SOURCES["cifar10"])
    loss = ast.parse(result)
    assigned = [
        node.value
        for node in ast.walk(loss)
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "loss"
    ]
    (value,) = [v for v in assigned if "edge_of_chaos_weight" in ast.unparse(v)]
    # (weight * cross_entropy(..., reduction="none")).sum(): the weights multiply the per-example losses, then sum
    assert isinstance(value, ast.Call) and value.func.attr == "sum"  # type: ignore[union-attr]
    product = value.func.value  # type: ignore[union-attr]
    assert isinstance(product, ast.BinOp) and isinstance(product.op, ast.Mult)
    assert ast.unparse(product.left) == "edge_of_chaos_weight(logits.float(), y_train[idx])"
    assert "reduction='none'" in ast.unparse(product.right) and "label_smoothing=LABEL_SMOOTHING" in ast.unparse(
        product.right
    )
    assert "return weight / weight.mean()" in result  # mean-1 weights: the summed loss keeps its size
    with pytest.raises(NotApplicable, match="already weights"):
        apply_transform("edge_of_chaos_curriculum", result)


def test_a_per_example_loss_reduced_elsewhere_is_refused():
    source = SOURCES["sequential_flat"].replace(
        "crit = nn.CrossEntropyLoss()", 'crit = nn.CrossEntropyLoss(reduction="none")'
    )
    source = source.replace("loss = crit(out, Yt[i])", "loss = crit(out, Yt[i])\n        loss = loss.mean()")
    for name in ("gradient_clipping", "edge_of_chaos_curriculum"):
        with pytest.raises(NotApplicable, match="reduction"):
            apply_transform(name, source)


def test_cifar10_ema_evaluates_and_predicts_through_its_tta_function():
    result = apply_transform("ema_weights", SOURCES["cifar10"])
    lines = lines_of(result)
    assert "val_logits = logits_tta(ema, x_val, autocast)" in lines
    assert result.count("logits_tta(ema, to_tensor(") == 2 and "logits_tta(model, " not in result
    step = len(lines) - 1 - lines[::-1].index("optimizer.step()")  # the training step's (the warm-up's comes first)
    assert lines[step + 1] == "ema.update_parameters(model)"
    assert lines.count("ema.update_parameters(model)") == 1  # not after the warm-up's throwaway steps
    assert "logits = model(x_epoch[idx])" in lines  # training still runs the model itself
    assert "model.eval()" in lines  # inside logits_tta: the function is left alone, its argument changes


def test_cifar10_widen_doubles_its_width_knobs_only():
    before, after = read_knobs(SOURCES["cifar10"]), read_knobs(apply_transform("widen_layers", SOURCES["cifar10"]))
    assert {k: after[k] for k in ("WIDTH1", "WIDTH2", "WIDTH3")} == {"WIDTH1": 128, "WIDTH2": 512, "WIDTH3": 512}
    assert {k: v for k, v in after.items() if not k.startswith("WIDTH")} == {
        k: v for k, v in before.items() if not k.startswith("WIDTH")
    }


def cifar_shaped(rows: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, size=(rows, 32, 32, 3), dtype=np.uint8), rng.integers(0, 10, size=rows)


def test_cifar10_with_the_widened_transforms_still_trains(tmp_path: Path):
    """The four transforms stacked on the cifar10 seed pass the real gate: one epoch (one step of 157 examples:
    the gate's 160-row sliver less the validation share) on CIFAR-shaped random data, predictions for every input."""
    (train_x, train_y), (sel_x, sel_y), (test_x, test_y) = (cifar_shaped(n, s) for s, n in enumerate((160, 40, 40)))
    splits = Splits(train_x, train_y, sel_x, sel_y, test_x, test_y, num_classes=10)
    gate = Gate(write_smoke_data(splits, tmp_path / "smoke", "cifar10"), (), timeout_s=300)
    parent, child = tmp_path / "parent", tmp_path / "child"
    shutil.copytree(TRAINERS["cifar10"], parent, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(parent, child)
    # narrow widths: the run proves the transformed code runs, not the net's size (widen_layers still doubles them)
    source = rewrite_knobs(SOURCES["cifar10"], {"WIDTH1": 8, "WIDTH2": 16, "WIDTH3": 16})
    for name in ("gradient_clipping", "edge_of_chaos_curriculum", "ema_weights", "widen_layers"):
        source = apply_transform(name, source)
    assert read_knobs(source)["WIDTH3"] == 32
    (child / "train.py").write_text(source)
    gate.check(child, parent)


# -----------------------------------------------------------------------------
# Layers a loop adds to a list handed to nn.Sequential(*layers), list width knobs, and regression losses (a user's
# trial: tests/fixtures/regression/store_sales, a Huber regressor whose MLP `build_mlp` appends in a loop)

# The diabetes seed's Net rebuilt the way the trial's report put it: one `a; b; c` line in a loop in __init__.
LISTED_NET = """class Net(nn.Module):
    \"\"\"Hidden ReLU layers a loop appends, one output.\"\"\"

    def __init__(self, features: int, width: int) -> None:
        super().__init__()
        layers = []
        for h in (width, width // 2):
            layers.append(nn.Linear(features, h)); layers.append(nn.ReLU()); features = h
        layers.append(nn.Linear(features, 1))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x).squeeze(-1)
"""
LISTED_DIABETES = re.sub(r"class Net\(nn\.Module\):.*?\.squeeze\(-1\)\n", LISTED_NET, SOURCES["diabetes"], flags=re.S)
BUILD_MLP = SOURCES["store_sales"][
    SOURCES["store_sales"].index("def build_mlp") : SOURCES["store_sales"].index("def predict")
]


def kinds(model: torch.nn.Module) -> list[str]:
    """The module types of a Sequential, in order (a nested Sequential as its own list)."""
    return [kinds(m) if isinstance(m, torch.nn.Sequential) else type(m).__name__ for m in model]  # type: ignore[misc]


def built(source: str, name: str, *args: object) -> torch.nn.Module:
    """Call the model builder `name` of a (transformed) trainer's source."""
    scope: dict = {}
    exec(compile(source, "train.py", "exec"), scope)
    return scope[name](*args)


def test_a_loop_built_mlp_gets_batchnorm_on_its_hidden_layers_and_dropout_and_depth_before_its_output():
    """Norms follow each hidden nn.Linear the loop appends, never the output layer; dropout and the extra layer go
    before the output layer appended after the loop (the user's trainer was refused all three: "functional model?")."""
    source = SOURCES["store_sales"]
    hidden = ["Linear", "BatchNorm1d", "ReLU"]
    assert kinds(built(apply_transform("batchnorm", source), "build_mlp", 11, [8, 4])) == [*hidden, *hidden, "Linear"]
    dropped = kinds(built(apply_transform("add_dropout", source), "build_mlp", 11, [8, 4]))
    assert dropped == ["Linear", "ReLU", "Linear", "ReLU", "Dropout", "Linear"]
    deeper = built(apply_transform("deepen", source), "build_mlp", 11, [8, 4])
    assert kinds(deeper)[-1] == ["Linear", "ReLU", "Linear"]
    assert (deeper[-1][0].in_features, deeper[-1][0].out_features, deeper[-1][2].out_features) == (4, 256, 1)
    # `a.append(x); a.append(y); w = h` on one line in a module's __init__: the norm joins the line in its place
    listed = apply_transform("batchnorm", LISTED_DIABETES)
    assert (
        "layers.append(nn.Linear(features, h)); layers.append(torch.nn.BatchNorm1d(h)); layers.append(nn.ReLU()); "
        "features = h" in listed
    )
    assert kinds(built(listed, "Net", 10, 8).net) == [*hidden, *hidden, "Linear"]
    # `layers += [nn.Linear(...), nn.ReLU()]`: an element of the list display
    assert "layers += [nn.Linear(prev, h), torch.nn.BatchNorm1d(h), nn.ReLU()]" in apply_transform(
        "batchnorm", SOURCES["list_mlp"]
    )


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (
            "    sizes = [n_in, *hidden, 1]\n"
            "    return nn.Sequential(*[nn.Linear(a, b) for a, b in zip(sizes, sizes[1:])])\n",
            r"unpacks a list comprehension",
        ),
        (
            "    layers, prev = [], n_in\n    for h in [*hidden, 1]:\n        layers.append(nn.Linear(prev, h))\n"
            "        prev = h\n    return nn.Sequential(*layers)\n",
            r"added to `layers` in a loop: the same line builds hidden layers and the output layer",
        ),
        (
            "    layers = [nn.Linear(n_in, hidden[0])]\n    return nn.ModuleList(layers)\n",
            r"built neither in `__init__` .* nor added to a list handed to `nn.Sequential\(\*list\)`",
        ),
    ],
    ids=["comprehension", "output_in_the_loop", "not_a_sequential"],
)
def test_a_list_built_model_the_transforms_cannot_place_a_layer_in_is_refused_for_what_it_is(body: str, reason: str):
    header = BUILD_MLP.splitlines(keepends=True)[0]
    source = SOURCES["store_sales"].replace(BUILD_MLP, header + body + "\n\n")
    for name in ("batchnorm", "add_dropout", "deepen"):
        with pytest.raises(NotApplicable, match=reason):
            apply_transform(name, source)


def test_widen_layers_doubles_each_width_of_a_list_knob_the_widen_move_cannot_multiply():
    with pytest.raises(NotApplicable, match=r"knob HIDDEN \(the catalog's WIDTH\) is \[128, 64\], not a number to mul"):
        catalog_apply(load_catalog().get("widen"), SOURCES["store_sales"])
    widened = read_knobs(apply_transform("widen_layers", SOURCES["store_sales"]))
    assert widened["HIDDEN"] == [256, 128]
    assert read_knobs(apply_transform("widen_layers", SOURCES["store_sales"].replace("[128, 64]", "(128, 64)")))[
        "HIDDEN"
    ] == (256, 128)
    # an integer knob the move reaches is still left to the move
    with pytest.raises(NotApplicable, match="the width is the knob WIDTH"):
        apply_transform("widen_layers", SOURCES["diabetes"])


MSE_LINE = "loss = F.mse_loss(model(x_train[idx]), (y_train[idx] - mean) / std)"


@pytest.mark.parametrize(
    ("loss", "limit"),
    [
        (MSE_LINE, "GRAD_CLIP"),
        (MSE_LINE.replace(" / std)", ' / std, reduction="sum")'), "GRAD_CLIP * len((y_train[idx] - mean) / std)"),
        ("loss = nn.HuberLoss(reduction='sum')(model(x_train[idx]), y_train[idx])", "GRAD_CLIP * len(y_train[idx])"),
        ("loss = F.huber_loss(model(x_train[idx]), y_train[idx], reduction='none').mean()", "GRAD_CLIP"),
        ("loss = ((model(x_train[idx]) - y_train[idx]) ** 2).mean()", "GRAD_CLIP"),
    ],
    ids=["mse", "summed_mse", "summed_huber_criterion", "huber_none_mean", "written_out_mean"],
)
def test_gradient_clipping_clips_any_loss_scaled_only_where_it_is_summed(loss: str, limit: str):
    source = SOURCES["diabetes"].replace(MSE_LINE, loss)
    lines = lines_of(apply_transform("gradient_clipping", source))
    clip = lines.index(f"torch.nn.utils.clip_grad_norm_(model.parameters(), {limit})")
    assert lines[clip + 1] == "optimizer.step()" and "loss.backward()" in lines[clip - 3 : clip]
    assert "torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP)" in apply_transform(
        "gradient_clipping", SOURCES["store_sales"]
    )


def test_gradient_clipping_refuses_a_written_out_sum_it_cannot_scale():
    source = SOURCES["diabetes"].replace(MSE_LINE, "loss = ((model(x_train[idx]) - y_train[idx]) ** 2).sum()")
    with pytest.raises(NotApplicable, match="summed by hand"):
        apply_transform("gradient_clipping", source)
    # review: a summed loss given by keyword was clipped by a bare GRAD_CLIP, the positional one by GRAD_CLIP * len(y)
    by_keyword = 'loss = F.mse_loss(input=model(x_train[idx]), target=y_train[idx], reduction="sum")'
    with pytest.raises(NotApplicable, match="in a call given by keyword"):
        apply_transform("gradient_clipping", SOURCES["diabetes"].replace(MSE_LINE, by_keyword))


@pytest.fixture(scope="module")
def diabetes_data(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, np.ndarray]:
    """scikit-learn's diabetes data as the harness serves it (60/20/20), and the selection targets."""
    from sklearn.datasets import load_diabetes

    bunch = load_diabetes()
    x, y = bunch.data.astype(np.float32), bunch.target.astype(np.float64)
    train, selection, test = random_split(len(y), (0.2, 0.2), 0)
    metric = declared_metric({"name": "mse", "direction": "min"}, None)
    splits = Splits(x[train], y[train], x[selection], y[selection], x[test], y[test], metric=metric)
    folder = tmp_path_factory.mktemp("diabetes")
    write_public(splits, folder, "diabetes")
    return folder, y[selection]


@pytest.mark.parametrize(
    ("trainer", "names"),
    [
        ("store_sales", ["batchnorm", "add_dropout", "deepen", "widen_layers", "gradient_clipping"]),
        ("listed_diabetes", ["batchnorm", "add_dropout", "deepen", "gradient_clipping"]),
    ],
    ids=["store_sales", "listed_diabetes"],
)
def test_regressors_with_the_layer_transforms_still_learn(
    tmp_path: Path, diabetes_data: tuple[Path, np.ndarray], trainer: str, names: list[str]
):
    """Trained in full on the diabetes data (the user's trainer with its categorical column set to the diabetes
    data's two-valued one), the transformed regressors predict the selection split far better than its mean."""
    data, targets = diabetes_data
    source = LISTED_DIABETES if trainer == "listed_diabetes" else SOURCES[trainer]
    for name in names:
        source = apply_transform(name, source)
    if trainer == "store_sales":
        source = rewrite_knobs(source, {"CAT_COLS": [1], "EPOCHS": 40})
    (tmp_path / "train.py").write_text(source)
    env = os.environ | {"RALPH_DATA_DIR": str(data), "RALPH_DEVICE": "cpu", "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [sys.executable, "train.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert result.returncode == 0, result.stderr[-2000:]
    selection = np.load(tmp_path / "predictions.npz")["selection"]
    assert np.mean((selection - targets) ** 2) < 0.7 * np.var(targets)


# -----------------------------------------------------------------------------
# Transformed trainers still train: the real gate (parse, required calls, a one-epoch smoke run on digits)

GATED = [
    ("sequential_flat", ["ema_weights", "hard_example_replay"]),
    ("digits", ["shift_augmentation", "hard_example_replay"]),  # the batch and logits named inside the loss call
    # a flat script: the head is built at module level before the epoch loop, so its class must come first
    ("sequential_flat", ["self_model_head"]),
    ("module_loader", ["batchnorm", "cosine_lr_schedule", "add_dropout", "data_parallel"]),
    ("functional_mlp", ["shift_augmentation", "gradient_clipping", "edge_of_chaos_curriculum"]),
    ("list_mlp", ["batchnorm", "add_dropout", "deepen", "widen_layers", "gradient_clipping"]),
    ("airbench_style", ["self_model_head", "deepen", "flip_tta"]),  # the head's extra output: training only
    ("digits", ["edge_of_chaos_curriculum", "self_model_head", "mixed_precision"]),
    # train_one_epoch(...) called from main()'s epoch loop: each state built beside the loop handed in by a parameter
    ("epoch_function", ["ema_weights", "grokfast_filter", "hard_example_replay", "self_model_head"]),
    # an HF-style Trainer: train()'s epoch loop calls self.train_epoch(); every transform that applies, stacked
    ("hf_trainer", ["grokfast_filter", "hard_example_replay", "gradient_clipping", "label_smoothing"]),
    ("hf_trainer", ["batchnorm", "add_dropout", "deepen", "edge_of_chaos_curriculum"]),
    ("hf_trainer", ["shift_augmentation", "flip_augmentation", "mixed_precision", "self_model_head"]),
]


@pytest.fixture(scope="module")
def gate(tmp_path_factory: pytest.TempPathFactory) -> Gate:
    smoke = write_smoke_data(prepare(0, 0.2, 0.2), tmp_path_factory.mktemp("smoke"), "digits")
    return Gate(smoke, (), timeout_s=120)


@pytest.mark.parametrize(("trainer", "names"), GATED, ids=[f"{t}-{'+'.join(n)}" for t, n in GATED])
def test_transformed_trainer_passes_the_gate(gate: Gate, tmp_path: Path, trainer: str, names: list[str]):
    parent, child = tmp_path / "parent", tmp_path / "child"
    shutil.copytree(TRAINERS[trainer], parent, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(parent, child)
    source = SOURCES[trainer]
    for name in names:
        source = apply_transform(name, source)
    (child / "train.py").write_text(source)
    gate.check(child, parent)


@pytest.mark.parametrize(
    ("trainer", "sharded"),
    [
        ("sequential_flat", "harness.stride(range("),  # index batches: every N-th offset
        ("module_loader", "harness.shard_loader(DataLoader(train_set"),  # a DataLoader: a DistributedSampler
    ],
)
def test_data_parallel_shares_an_epoch_by_offsets_or_by_the_loaders_sampler(trainer: str, sharded: str):
    source = apply_transform("data_parallel", SOURCES[trainer])
    assert sharded in source  # and only there: one way of sharing per trainer
    assert source.count("harness.shard_loader(") + source.count("harness.stride(") == 1
    if trainer == "module_loader":  # the validation loader stays whole: every rank evaluates all of it
        assert "val_loader = DataLoader(val_set" in source


@pytest.mark.parametrize(
    "change",
    [
        # a sampler of its own: its order is its own, so the loop's batches are strided instead
        ("shuffle=True)", "sampler=torch.utils.data.RandomSampler(train_set, replacement=True))"),
        # built twice (again inside the epoch loop): stride at the loop covers both bindings
        (
            "        model.train()\n",
            "        model.train()\n        train_loader = DataLoader(train_set, batch_size=BATCH_SIZE)\n",
        ),
    ],
    ids=["own_sampler", "rebuilt"],
)
def test_data_parallel_strides_a_loader_it_cannot_rebuild(change: tuple[str, str]):
    source = SOURCES["module_loader"].replace(*change)
    assert source != SOURCES["module_loader"]
    result = apply_transform("data_parallel", source)
    assert "harness.stride(train_loader)" in result and "harness.shard_loader(" not in result


@pytest.mark.parametrize("trainer", ["sequential_flat", "module_loader"])
def test_a_data_parallel_child_trains_as_two_gloo_ranks_in_step(gate: Gate, tmp_path: Path, trainer: str):
    """The transform's output run as a real group of two (the torch.distributed variables the engine sets): both
    ranks finish (as many steps each: no rank waits in an all-reduce), report every epoch, and only rank 0
    predicts. Index batches (a range of offsets) and DataLoader batches."""
    source = apply_transform("data_parallel", SOURCES[trainer])
    source = rewrite_knobs(source, {k: v for k, v in SMOKE_KNOBS.items() if k in read_knobs(source)})
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    ranks = []
    for rank in (0, 1):
        work = tmp_path / f"rank{rank}"
        shutil.copytree(TRAINERS[trainer], work, ignore=shutil.ignore_patterns("__pycache__"))
        (work / "train.py").write_text(source)
        group = {"RALPH_GROUP": "1", "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2"}
        env = {**os.environ, **group, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        env |= {"RALPH_DATA_DIR": str(gate.smoke_data), "RALPH_DEVICE": "cpu", "OMP_NUM_THREADS": "1"}
        ranks.append(
            subprocess.Popen(
                [sys.executable, "train.py"],
                cwd=work,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    try:
        for process in ranks:
            _, stderr = process.communicate(timeout=300)
            assert process.returncode == 0, stderr[-2000:]
    finally:
        for process in ranks:  # a rank left waiting for its peer must not outlive the test
            process.kill()
    epochs = [
        [json.loads(line)["epoch"] for line in (tmp_path / f"rank{r}" / "metrics.jsonl").read_text().splitlines()]
        for r in (0, 1)
    ]
    assert epochs[0] and epochs[0] == epochs[1]
    assert (tmp_path / "rank0" / "predictions.npz").exists() and not (tmp_path / "rank1" / "predictions.npz").exists()


# -----------------------------------------------------------------------------
# A user's layout (tests/fixtures/images28/fmnist_cnn, tests/fixtures/trainers/epoch_function): the batch loop in
# `train_one_epoch(...)`, called from main()'s `for epoch in range(...)`. Twelve transforms used to refuse it with
# "no `for` loop over epochs around the batch loop".

# sequential_flat without an epoch loop: one pass of the batch loop
SINGLE_LOOP = SOURCES["sequential_flat"].replace("for ep in range(EPOCHS):", "if True:").replace("ep + 1", "1")
# epoch_function whose settings are no knob block (not literals): a transform that adds a knob cannot apply
NO_KNOBS = re.sub(r"^([A-Z_]+) = ([\d.]+)", r"\1 = float(\2)", SOURCES["epoch_function"], flags=re.MULTILINE)


def test_the_epoch_loop_is_found_around_a_call_of_the_batch_loops_function():
    trainer = analyse(SOURCES["epoch_function"])
    assert code(trainer.epoch_loop().iter) == "range(EPOCHS)"
    assert trainer.batch_in_call().name.value == "train_one_epoch"
    # a per-epoch schedule is built before main()'s epoch loop and stepped after the call, both in main()
    cosine = apply_transform("cosine_lr_schedule", SOURCES["epoch_function"])
    assert (
        "\n    cosine = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=len(range(EPOCHS)))\n"
        "    for epoch in range(EPOCHS):\n"
        "        train_loss = train_one_epoch(model, train_loader, criterion, optimizer)\n"
        "        cosine.step()  # once per epoch\n" in cosine
    )
    # data_parallel shards the DataLoader main() hands train_one_epoch(...)
    parallel = apply_transform("data_parallel", SOURCES["fmnist_cnn"])
    assert "train_loader = harness.shard_loader(DataLoader(train_ds, " in parallel
    assert "model = harness.wrap(model)" in parallel
    assert "harness.save_predictions(selection=flip_averaged" not in parallel
    tta = apply_transform("flip_tta", SOURCES["fmnist_cnn"])
    assert "out = flip_averaged(model, x)" in tta and "loss = criterion(model(x), y)" in tta


def test_the_epoch_loop_is_found_around_a_call_of_a_method_of_the_same_class():
    """User trial ut_dataclass: ema_weights, grokfast_filter, hard_example_replay and self_model_head were refused with
    "no `for` loop over epochs ... nor around a call of the function that runs it" though train() calls
    self.train_epoch() once per epoch."""
    trainer = analyse(SOURCES["hf_trainer"])
    assert code(trainer.epoch_loop().iter) == "harness.epochs(self.cfg.epochs)"
    assert trainer.batch_in_call().name.value == "train_epoch"
    assert trainer.model_name() == "self.model"  # kept as `self.model = model` in __init__
    # the state the epoch loop keeps is handed to the method by a keyword parameter, passed at `self.train_epoch()`
    grokfast = lines_of(apply_transform("grokfast_filter", SOURCES["hf_trainer"]))
    assert "def train_epoch(self, grokfast_grads=None) -> float:" in grokfast
    assert "train_loss = self.train_epoch(grokfast_grads=grokfast_grads)" in grokfast
    # a bare call of a module-level function of the same name is no call of the method
    shadowed = SOURCES["hf_trainer"].replace("self.train_epoch()", "train_epoch()")
    shadowed = shadowed.replace("\ndef main()", "\ndef train_epoch() -> float:\n    return 0.0\n\n\ndef main()")
    assert len(analyse(shadowed).defined("train_epoch", top_level=True)) == 1
    with pytest.raises(NotApplicable, match="no `for` loop over epochs"):
        apply_transform("grokfast_filter", shadowed)


def test_a_method_its_class_defines_twice_has_no_calls():
    """Review: calls_of() matched both of two same-named methods, so an edit could land in the first, dead one (the
    second overrides it)."""
    twice = SOURCES["hf_trainer"].replace(
        "    @torch.no_grad()\n    def evaluate(",
        "    def train_epoch(self) -> float:\n        return 0.0\n\n    @torch.no_grad()\n    def evaluate(",
    )
    trainer = analyse(twice)
    methods = trainer.defined("train_epoch")
    assert len(methods) == 2
    assert [trainer.calls_of(m) for m in methods] == [[], []]
    once = analyse(SOURCES["hf_trainer"])
    assert len(once.calls_of(once.defined("train_epoch")[0])) == 1  # defined once, it is called once (in train())
    with pytest.raises(NotApplicable, match="no `for` loop over epochs"):
        apply_transform("grokfast_filter", twice)


# the HF-style Trainer's schedule, built before train()'s epoch loop: in __init__ beside the optimizer, in train()
# itself, or in a method train() calls there (transformers' create_scheduler())
_SCHEDULED = {
    "__init__": (
        "weight_decay=cfg.weight_decay)\n",
        "weight_decay=cfg.weight_decay)\n        self.scheduler = torch.optim.lr_scheduler.OneCycleLR(self.optimizer, "
        "max_lr=cfg.lr, total_steps=cfg.epochs * len(self.train_loader))\n",
    ),
    "train": (
        "        metrics: dict[str, float] = {}\n",
        "        metrics: dict[str, float] = {}\n        self.scheduler = LambdaLR(self.optimizer, lambda step: 1.0)\n",
    ),
    "called": (
        "        metrics: dict[str, float] = {}\n",
        "        metrics: dict[str, float] = {}\n        self.create_scheduler()\n",
    ),
}


@pytest.mark.parametrize("where", sorted(_SCHEDULED))
def test_self_model_head_is_refused_where_a_schedule_is_built_before_the_epoch_loop(where: str):
    """Review: on an HF-style Trainer the head's `add_param_group(...)` goes before train()'s epoch loop, after a
    schedule built in __init__ (or early in train()): OneCycleLR raised KeyError 'initial_lr', LambdaLR a ValueError at
    its first step, in every trial. Refused, saying so; a trainer without one still gets the head."""
    old, new = _SCHEDULED[where]
    source = SOURCES["hf_trainer"].replace(old, new, 1)
    if where == "called":
        source = source.replace(
            "    def train(self)",
            "    def create_scheduler(self) -> None:\n"
            "        self.scheduler = get_linear_schedule_with_warmup(self.optimizer, 0, 100)\n\n"
            "    def train(self)",
        )
    assert source != SOURCES["hf_trainer"]
    with pytest.raises(NotApplicable, match=r"learning-rate schedule `[\w.]+\(\.\.\.\)` is built before the epoch"):
        apply_transform("self_model_head", source)
    assert "add_param_group" in apply_transform("self_model_head", SOURCES["hf_trainer"])


def test_self_model_head_runs_beside_a_schedule_built_after_the_optimizer_line():
    """The refusal is only for a schedule built before a group added at the epoch loop: in a script the group is added
    right after the optimizer's line, before its scheduler, and trains."""
    out = apply_transform("self_model_head", SOURCES["fmnist_cnn"])
    assert -1 < out.index("optimizer.add_param_group(") < out.index("scheduler = torch.optim.lr_scheduler.OneCycleLR(")


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        # evaluate() and predict() are other methods reading self.model: not followed, and said so
        ("ema_weights", r"the model is kept on the instance `self` that method `train\(\)` trains"),
        # main() builds the model and hands it to Trainer(...): no one place wraps it for the group
        ("data_parallel", "the model is built outside the code that trains it"),
        ("flip_tta", r"the model is kept on the instance `self` that method `train\(\)` trains"),
    ],
)
def test_a_trainer_class_is_refused_only_for_a_true_reason(name: str, reason: str):
    with pytest.raises(NotApplicable, match=reason):
        apply_transform(name, SOURCES["hf_trainer"])


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("grokfast_filter", "the model uses BatchNorm"),
        ("cosine_lr_schedule", r"already has a schedule \(OneCycleLR\)"),
        ("one_cycle_schedule", r"already has a schedule \(OneCycleLR\)"),
        ("lr_warmup", r"already has a schedule \(OneCycleLR\)"),
        ("label_smoothing", r"already smooths labels \(label_smoothing=0.05 on its criterion\)"),
    ],
)
def test_a_called_batch_loop_is_refused_only_for_a_true_reason(name: str, reason: str):
    with pytest.raises(NotApplicable, match=reason):
        apply_transform(name, SOURCES["fmnist_cnn"])


# The state four transforms build beside the epoch loop (a weight average, a gradient EMA, a replay buffer, a
# self-model head) is handed to train_one_epoch(...) by a keyword parameter added last to its signature (None by
# default) and passed by keyword at the epoch loop's call. They used to refuse this layout ("no parameter is added").
THREADED = {
    "ema_weights": "ema",
    "grokfast_filter": "grokfast_grads",
    "hard_example_replay": "dream_replay",
    "self_model_head": "self_model",
}
SIGNATURES = {
    "hf_trainer": "def train_epoch(self{}) -> float:",
    "epoch_function": "def train_one_epoch(model, loader, criterion, optimizer{}):",
    "fmnist_cnn": "def train_one_epoch(model, loader, criterion, optimizer, scheduler, device, clip=1.0{}):",
}
CALLS = {
    "hf_trainer": "train_loss = self.train_epoch({})",  # the head built in train(), not beside __init__'s optimizer
    "epoch_function": "train_loss = train_one_epoch(model, train_loader, criterion, optimizer{})",
    "fmnist_cnn": "train_loss = train_one_epoch(model, train_loader, criterion, optimizer, scheduler, device{})",
}
# (fmnist_cnn has BatchNorm: Grokfast is refused there for that)
# (hf_trainer's evaluate() and predict() are methods reading self.model: EMA is refused there for that)
UNTHREADED = {("fmnist_cnn", "grokfast_filter"), ("hf_trainer", "ema_weights")}
THREADED_CASES = [(t, n) for t in SIGNATURES for n in THREADED if (t, n) not in UNTHREADED]


@pytest.fixture(scope="module")
def images28(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The digits smoke sliver with each 8x8 image zero-padded to 28x28 (the shape fmnist_cnn's model takes)."""
    splits = prepare(0, 0.2, 0.2)
    pad = ((0, 0), (0, 0), (10, 10), (10, 10))
    padded = Splits(
        train_x=np.pad(splits.train_x, pad),
        train_y=splits.train_y,
        selection_x=np.pad(splits.selection_x, pad),
        selection_y=splits.selection_y,
        test_x=np.pad(splits.test_x, pad),
        test_y=splits.test_y,
        num_classes=splits.num_classes,
    )
    return write_smoke_data(padded, tmp_path_factory.mktemp("images28"), "digits")


def run_spied(monkeypatch: pytest.MonkeyPatch, folder: Path, data: Path, spy: Callable[[dict], None]) -> None:
    """Run `folder/train.py`'s main() in this process on `data`, after `spy` has wrapped names in its module scope."""
    for key, value in {"RALPH_DATA_DIR": str(data), "RALPH_DEVICE": "cpu", "RALPH_SEED": "0"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.chdir(folder)
    monkeypatch.setattr(sys, "argv", ["train.py"])  # fmnist_cnn's argparse: its knobs' defaults
    scope = runpy.run_path(str(folder / "train.py"), run_name="train")["main"].__globals__
    spy(scope)
    scope["main"]()


@pytest.mark.parametrize(("trainer", "name"), THREADED_CASES)
def test_state_built_beside_the_epoch_loop_is_handed_to_the_batch_loops_function(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gate: Gate, images28: Path, trainer: str, name: str
):
    """Applied, parsed, and run for two epochs on tiny real data: the value built in main() is the one the batch
    loop uses in every epoch (EMA: the average moved from the initial weights; Grokfast: one gradient EMA dict
    across the epochs; replay: each later epoch dreams the previous epoch's buffer; self-model: its head trained)."""
    value = THREADED[name]
    result = apply_transform(name, SOURCES[trainer])
    ast.parse(result)
    lines = lines_of(result)
    assert SIGNATURES[trainer].format(f", {value}=None") in lines
    assert CALLS[trainer].format(f", {value}={value}").replace("(, ", "(") in lines
    (tmp_path / "train.py").write_text(rewrite_knobs(result, {"EPOCHS": 2}))
    seen: dict[str, list] = {"ema": [], "grads": [], "buffered": [], "heads": []}

    def spy(scope: dict) -> None:
        if name == "ema_weights":
            init = AveragedModel.__init__

            def spy_init(self, model, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
                init(self, model, *args, **kwargs)
                seen["ema"].append((self, [p.detach().clone() for p in self.module.parameters()]))

            monkeypatch.setattr(AveragedModel, "__init__", spy_init)
        elif name == "grokfast_filter":
            gradfilter = scope["gradfilter_ema"]

            def spy_filter(model, grads):  # noqa: ANN001, ANN202
                seen["grads"].append(grads)
                return gradfilter(model, grads)

            scope["gradfilter_ema"] = spy_filter
        elif name == "hard_example_replay":
            dream = scope["DreamReplay"].dream

            def spy_dream(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
                seen["buffered"].append(len(self.y))
                return dream(self, *args, **kwargs)

            monkeypatch.setattr(scope["DreamReplay"], "dream", spy_dream)
        else:
            head_init = scope["SelfModel"].__init__

            def spy_head(self, model):  # noqa: ANN001, ANN202
                head_init(self, model)
                seen["heads"].append((self, self.head.weight.detach().clone()))

            monkeypatch.setattr(scope["SelfModel"], "__init__", spy_head)

    run_spied(monkeypatch, tmp_path, images28 if trainer == "fmnist_cnn" else gate.smoke_data, spy)
    assert (tmp_path / "predictions.npz").exists()
    if name == "ema_weights":
        ((ema, initial),) = seen["ema"]
        assert ema.n_averaged.item() > 2  # updated at every step of both epochs
        assert any(not torch.equal(p, q) for p, q in zip(ema.module.parameters(), initial, strict=True))
    elif name == "grokfast_filter":
        first = seen["grads"][0]
        assert len(seen["grads"]) > 2 and all(g is first for g in seen["grads"])  # main()'s one dict, every epoch
        assert first and all(isinstance(ema, torch.Tensor) for ema in first.values())  # filled in place
    elif name == "hard_example_replay":
        assert len(seen["buffered"]) == 2 and seen["buffered"][0] == 0 and seen["buffered"][1] > 0
    else:
        ((head, initial),) = seen["heads"]
        assert not torch.equal(head.head.weight, initial)


TWO_DEEP = (
    SOURCES["epoch_function"]
    .replace(
        "\n\n@torch.no_grad()\ndef evaluate(",
        "\n\ndef run_epoch(model, loader, criterion, optimizer):\n"
        "    return train_one_epoch(model, loader, criterion, optimizer)\n\n\n@torch.no_grad()\ndef evaluate(",
        1,
    )
    .replace("train_loss = train_one_epoch(model, train_loader", "train_loss = run_epoch(model, train_loader")
)
# a warm-up pass before the epoch loop: a second caller, which would hand the function nothing
WARM_UP = SOURCES["epoch_function"].replace(
    "    for epoch in range(EPOCHS):\n",
    "    train_one_epoch(model, train_loader, criterion, optimizer)\n    for epoch in range(EPOCHS):\n",
)


@pytest.mark.parametrize("name", sorted(THREADED))
@pytest.mark.parametrize(
    ("source", "reason"),
    [
        (TWO_DEEP, r"runs in `train_one_epoch\(\)`, which the epoch loop calls through `run_epoch\(\)` \(two calls"),
        (
            WARM_UP,
            r"called from the epoch loop and from `train_one_epoch\(model, train_loader, criterion, optimizer\)`",
        ),
    ],
    ids=["two_deep", "second_caller"],
)
def test_state_that_a_parameter_would_not_carry_to_the_batch_loop_is_refused(name: str, source: str, reason: str):
    assert source != SOURCES["epoch_function"]
    assert analyse(source).batch_in_call().name.value == "train_one_epoch"
    with pytest.raises(NotApplicable, match=reason):
        apply_transform(name, source)


def test_a_parameter_is_threaded_keyword_only_after_a_star_and_never_over_a_name_of_the_function():
    source = SOURCES["epoch_function"].replace(
        "def train_one_epoch(model, loader, criterion, optimizer):",
        "def train_one_epoch(model, loader, criterion, optimizer, *, log_every=10):",
    )
    assert "def train_one_epoch(model, loader, criterion, optimizer, *, log_every=10, ema=None):" in apply_transform(
        "ema_weights", source
    )
    trainer = analyse(SOURCES["epoch_function"])
    with pytest.raises(NotApplicable, match=r"`train_one_epoch\(\)` already binds `total`"):
        Edits(trainer).thread("total", "the weight average", trainer.optimizer_statement())


def test_flip_tta_needs_no_epoch_loop():
    assert "vout = flip_averaged(net, Xv)" in apply_transform("flip_tta", SINGLE_LOOP)


@pytest.mark.parametrize("trainer", [*sorted(TRAINERS), "single_loop", "no_knobs"])
def test_check_passes_exactly_where_apply_succeeds(trainer: str):
    """The analyst's dry run (check) and the coder's apply decide alike (a dry run once answered before placing the
    helpers, which needed the epoch loop, and before finding the knob block: check said `augmentation` applies, the
    coder's apply refused)."""
    source = {"single_loop": SINGLE_LOOP, "no_knobs": NO_KNOBS}.get(trainer) or SOURCES[trainer]
    checked = applicability(source)
    for name in sorted(TRANSFORMS):
        try:
            apply_transform(name, source)
            applied = None
        except NotApplicable as reason:
            applied = str(reason)
        assert (checked[name] is None) == (applied is None), (name, checked[name], applied)


def test_label_smoothing_carries_the_criterions_settings_or_refuses():
    source = SOURCES["epoch_function"]
    weighted = source.replace("nn.CrossEntropyLoss()", "nn.CrossEntropyLoss(ignore_index=-1)")
    assert (
        "loss = torch.nn.functional.cross_entropy(model(x), y, ignore_index=-1, label_smoothing=LABEL_SMOOTHING)"
        in (apply_transform("label_smoothing", weighted))
    )
    # a name of main() would not reach train_one_epoch(): refused, not dropped
    named = source.replace("nn.CrossEntropyLoss()", "nn.CrossEntropyLoss(weight=y.bincount().float())")
    with pytest.raises(NotApplicable, match="reads a name of the function that builds it"):
        apply_transform("label_smoothing", named)
    positional_weight = source.replace("nn.CrossEntropyLoss()", "nn.CrossEntropyLoss(None)")
    with pytest.raises(NotApplicable, match="replacement would drop"):
        apply_transform("label_smoothing", positional_weight)


def test_edge_of_chaos_keeps_the_criterions_label_smoothing_and_refuses_other_settings():
    result = apply_transform("edge_of_chaos_curriculum", SOURCES["fmnist_cnn"])
    assert "loss = edge_of_chaos_loss(model(x), y, label_smoothing=0.05)" in result
    weighted = SOURCES["epoch_function"].replace("nn.CrossEntropyLoss()", "nn.CrossEntropyLoss(ignore_index=-1)")
    with pytest.raises(NotApplicable, match=r"`ignore_index=-1`\) its replacement would drop"):
        apply_transform("edge_of_chaos_curriculum", weighted)


def _helpers(**knobs: float) -> dict:
    """The image helpers the data transforms insert, run as the trainer would run them."""
    from ralph_ray.agents.transforms.data import FLIP_HELPER, SHIFT_HELPER, TTA_HELPER

    scope: dict = {"torch": torch, **knobs}
    for helper in (SHIFT_HELPER, FLIP_HELPER, TTA_HELPER):
        exec(compile(helper, "train.py", "exec"), scope)
    return scope


@pytest.mark.parametrize("size", [(8, 8), (6, 8)], ids=["square", "wide"])
def test_image_helpers_take_single_channel_images_without_a_channel_axis(size: tuple[int, int]):
    """task.images reads (N, H, W) inputs as images (an LSTM over digits' rows fed (N, 8, 8)), so the helpers of the
    interventions it offers take them too: four children of such a campaign were rejected at the gate by
    "flip_averaged: expected images (N, C, H, W), got shape (24, 8, 8)" and the same from shift_images."""
    helpers = _helpers(SHIFT=1, AUGMENT_PROB=1.0, FLIP_PROB=1.0)
    x = torch.arange(24 * size[0] * size[1], dtype=torch.float32).reshape(24, *size) + 1
    # shifts: the same draws as the image with its channel axis, each a translation by up to one pixel, edges repeated
    torch.manual_seed(0)
    shifted = helpers["shift_images"](x)
    torch.manual_seed(0)
    assert shifted.shape == x.shape and torch.equal(shifted, helpers["shift_images"](x.unsqueeze(1)).squeeze(1))
    padded = torch.nn.functional.pad(x.unsqueeze(1), (1, 1, 1, 1), mode="replicate").squeeze(1)
    moves = [padded[:, dy : dy + size[0], dx : dx + size[1]] for dy in range(3) for dx in range(3)]
    assert all(any(torch.equal(shifted[i], move[i]) for move in moves) for i in range(len(x)))
    assert not torch.equal(shifted, x)  # 24 draws of 9 offsets: some move
    # flips: mirrored left to right, in training and at test time
    assert torch.equal(helpers["flip_images"](x), x.flip(-1))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(size[0] * size[1], 3))
    averaged = helpers["flip_averaged"](model, x)
    assert averaged.shape == (24, 3) and torch.allclose(averaged, (model(x) + model(x.flip(-1))) / 2)
    # (N, C, H, W) and flattened square images as before; other shapes still refused
    assert torch.equal(helpers["flip_images"](x.unsqueeze(1)), x.unsqueeze(1).flip(-1))
    if size[0] == size[1]:
        assert torch.equal(helpers["flip_images"](x.flatten(1)), x.flip(-1).flatten(1))
    with pytest.raises(ValueError, match="expected images"):
        helpers["shift_images"](torch.zeros(2, 1, 1, 8, 8))


def test_shifts_of_normalised_images_add_no_pixel_they_never_had():
    """A user trial's inputs were normalised (background -0.81): zero padding gave each shifted training image a
    strip of 0.0, mid-grey, that no selection or test image has. The border's own pixels fill it instead."""
    helpers = _helpers(SHIFT=2, AUGMENT_PROB=1.0, FLIP_PROB=1.0)
    images = torch.full((64, 1, 8, 8), -0.81)
    images[:, :, 3:5, 3:5] = 2.0  # a bright blob in the middle
    torch.manual_seed(0)
    shifted = helpers["shift_images"](images)
    assert not torch.equal(shifted, images)
    assert torch.equal(shifted.unique(), images.unique())  # -0.81 and 2.0: no 0.0


def test_image_helpers_take_channels_last_images_as_images():
    """task.images reads (N, H, W, C) inputs as images, but the helpers took any 4-D batch as (N, C, H, W): a flip
    reversed the colour channels and a shift moved columns and channels (review)."""
    helpers = _helpers(SHIFT=1, AUGMENT_PROB=1.0, FLIP_PROB=1.0)
    nchw = torch.arange(6 * 3 * 8 * 8, dtype=torch.float32).reshape(6, 3, 8, 8) + 1
    nhwc = nchw.permute(0, 2, 3, 1).contiguous()
    assert torch.equal(helpers["flip_images"](nhwc), nchw.flip(-1).permute(0, 2, 3, 1))
    torch.manual_seed(0)
    shifted = helpers["shift_images"](nhwc)
    torch.manual_seed(0)
    assert torch.equal(shifted, helpers["shift_images"](nchw).permute(0, 2, 3, 1))  # the same draws, the same moves
    assert not torch.equal(shifted, nhwc)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(8 * 8 * 3, 2))
    mirrored = nchw.flip(-1).permute(0, 2, 3, 1)
    assert torch.allclose(helpers["flip_averaged"](model, nhwc), (model(nhwc) + model(mirrored)) / 2)
    # a batch of 8-channel 3x3 feature maps stays (N, C, H, W): only few channels on the last axis mean channels last
    maps = torch.arange(2 * 8 * 3 * 3, dtype=torch.float32).reshape(2, 8, 3, 3)
    assert torch.equal(helpers["flip_images"](maps), maps.flip(-1))


LSTM_TRAINER = """
import torch
from torch import nn

LR = 0.01  # learning rate
EPOCHS = 2  # epochs


class RowLSTM(nn.Module):
    def __init__(self, hidden: int, classes: int) -> None:
        super().__init__()
        self.lstm = nn.LSTM(8, hidden, batch_first=True)
        self.fc = nn.Linear(hidden, classes)

    def forward(self, x):
        out, _ = self.lstm(x)
        return self.fc(out[:, -1])


x, y = torch.randn(32, 8, 8), torch.arange(32) % 10
model = RowLSTM(16, 10)
optimizer = torch.optim.SGD(model.parameters(), lr=LR)
for epoch in range(EPOCHS):
    for i in range(0, len(x), 8):
        loss = nn.functional.cross_entropy(model(x[i : i + 8]), y[i : i + 8])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
"""


def test_batchnorm_on_an_lstm_says_what_it_found_not_that_the_edit_changes_nothing():
    """A user's row LSTM got batchnorm refused with "the edit changes nothing": right to refuse (no BatchNorm on a
    (B, T, F) output here), but the reason must say why."""
    with pytest.raises(NotApplicable) as refused:
        apply_transform("batchnorm", LSTM_TRAINER)
    assert str(refused.value) == (
        "no convolution or hidden nn.Linear layer to follow with a norm, only the classifier "
        "`nn.Linear(hidden, classes)` (nn.LSTM is not handled)"
    )
    # a hidden nn.Linear after the LSTM is normed as before
    hidden = LSTM_TRAINER.replace(
        "        self.fc = nn.Linear(hidden, classes)",
        "        self.mid = nn.Linear(hidden, hidden)\n        self.fc = nn.Linear(hidden, classes)",
    ).replace("self.fc(out[:, -1])", "self.fc(self.mid(out[:, -1]))")
    assert "self.fc(self.mid(" in hidden
    assert "self.fc(self.bn_mid(self.mid(out[:, -1])))" in apply_transform("batchnorm", hidden)


# -----------------------------------------------------------------------------
# A user's Lightning-style trainer in plain PyTorch (tests/fixtures/lightning/lit_classifier): `configure_optimizers()`
# builds the optimizer from `self.parameters()` and `Trainer.fit(self, model, ...)` steps it. grokfast_filter and
# gradient_clipping wrote fit()'s `self` (the Trainer) as the model ('Trainer' object has no attribute
# 'named_parameters'): names were matched across functions. They are resolved where they are used now.

LIT = SOURCES["lit_classifier"]
# the same trainer stepping `opt, sched` in fit() (the optimizer keeps its name in configure_optimizers())
LIT_OPT = (
    LIT.replace("optimizer, scheduler = model.configure_optimizers()", "opt, sched = model.configure_optimizers()")
    .replace("                optimizer.", "                opt.")
    .replace("            scheduler.step()", "            sched.step()")
    .replace('lr=optimizer.param_groups[0]["lr"]', 'lr=opt.param_groups[0]["lr"]')
)


def unbound_names(source: str) -> set[str]:
    """Names a function reads that neither it, an enclosing function, the module nor the builtins bind."""
    top = symtable.symtable(source, "train.py", "exec")
    known = {s.get_name() for s in top.get_symbols() if s.is_assigned() or s.is_imported()} | set(dir(builtins))
    missing: set[str] = set()
    tables = list(top.get_children())
    while tables:
        table = tables.pop()
        tables.extend(table.get_children())
        if table.get_type() == "function":
            missing |= {
                f"{table.get_name()}: {s.get_name()}"
                for s in table.get_symbols()
                if s.is_global() and s.is_referenced() and s.get_name() not in known
            }
    return missing


@pytest.mark.parametrize("source", [LIT, LIT_OPT], ids=["optimizer", "opt"])
def test_a_lightning_style_trainer_is_edited_with_the_names_of_the_function_edited(
    source: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    stepped = "opt" if source is LIT_OPT else "optimizer"
    assert "opt.step()" in LIT_OPT and "optimizer.step()" not in LIT_OPT
    grokfast = apply_transform("grokfast_filter", source)
    assert "                grokfast_grads = gradfilter_ema(model, grokfast_grads)\n" in grokfast
    clipped = apply_transform("gradient_clipping", source)
    clip = "                torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP)\n"
    assert f"{clip}                {stepped}.step()" in clipped
    # every transform that applies gives a trainer whose fit() trains the model (one epoch on a few random digits)
    monkeypatch.setenv("RALPH_METRICS_FILE", str(tmp_path / "metrics.jsonl"))
    images = torch.utils.data.TensorDataset(torch.randn(16, 1, 8, 8), torch.randint(0, 10, (16,)))
    loader = torch.utils.data.DataLoader(images, batch_size=8)
    applied = [name for name, why in applicability(source).items() if why is None]
    assert {"grokfast_filter", "gradient_clipping"} <= set(applied)
    for name in applied:
        result = apply_transform(name, source)
        assert not unbound_names(result), (name, unbound_names(result))
        built: dict = {"__name__": "lit"}
        exec(compile(result, "train.py", "exec"), built)
        model = built["LitClassifier"](10, 4, 0.003)
        before = [p.detach().clone() for p in model.parameters()]
        built["Trainer"](max_epochs=1).fit(model, loader, loader)
        assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True)), name


@pytest.mark.parametrize(
    ("source", "name", "reason"),
    [
        (LIT, "label_smoothing", r"the loss `loss` comes from the method `model.training_step`, which is not followed"),
        (LIT_OPT, "mixed_precision", r"comes from the method `model.training_step`, which is not followed"),
        (LIT, "ema_weights", r"the model comes into `fit\(\)` as its parameter `model`"),
        (LIT_OPT, "flip_tta", r"the model comes into `fit\(\)` as its parameter `model`"),
        (
            LIT_OPT,
            "self_model_head",
            r"built in the model's method `configure_optimizers\(\)` and stepped in `fit\(\)` as `opt` \(from "
            r"`model.configure_optimizers\(\)`\): the self-model head would be built in the method",
        ),
        (LIT_OPT, "data_parallel", r"stepped in `fit\(\)` as `opt`.*where the model itself is built is not followed"),
        # an optimizer taken out of what the method returns by a subscript is not followed: refused, saying so
        (
            LIT_OPT.replace("opt, sched = model.configure_optimizers()", "opt = model.configure_optimizers()[0]"),
            "grokfast_filter",
            r"the optimizer comes from `model.configure_optimizers\(\)` in `fit\(\)`, and no `.step\(\)` line there "
            r"steps a name `opt = model.configure_optimizers\(\)\[0\]` binds to it",
        ),
    ],
)
def test_a_lightning_style_trainer_is_refused_naming_what_was_found(source: str, name: str, reason: str):
    with pytest.raises(NotApplicable, match=reason):
        apply_transform(name, source)


def test_the_model_is_named_as_the_function_stepping_the_optimizer_binds_it():
    """The optimizer built in main() from `model.parameters()` and stepped in `train_one_epoch(net, ...)`: the clip
    went in as `model.parameters()`, a name train_one_epoch() does not bind (main()'s, by name only)."""
    source = SOURCES["epoch_function"]
    head = "def train_one_epoch(model, loader, criterion, optimizer):\n    model.train()"
    assert head in source and "loss = criterion(model(x), y)" in source
    renamed = source.replace(head, "def train_one_epoch(net, loader, criterion, optimizer):\n    net.train()").replace(
        "loss = criterion(model(x), y)", "loss = criterion(net(x), y)"
    )
    assert "torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP)" in apply_transform(
        "gradient_clipping", source
    )
    with pytest.raises(
        NotApplicable,
        match=r"built in `main\(\)` from `model.parameters\(\)` and stepped in `train_one_epoch\(\)`, which has no "
        "`model` of its own",
    ):
        apply_transform("gradient_clipping", renamed)
    # one instance's `self.opt` built in __init__ and stepped in another method of its class is the same optimizer
    runner = (
        "import torch\nimport torch.nn.functional as F\n\nEPOCHS = 2  # passes\n\n\nclass Runner:\n"
        "    def __init__(self, model):\n        self.model = model\n"
        "        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1)\n\n"
        "    def train(self, loader):\n        for epoch in range(EPOCHS):\n            for x, y in loader:\n"
        "                loss = F.cross_entropy(self.model(x), y)\n                loss.backward()\n"
        "                self.opt.step()\n"
    )
    clipped = apply_transform("gradient_clipping", runner)
    assert "clip_grad_norm_(self.model.parameters(), GRAD_CLIP)\n                self.opt.step()" in clipped


# An optimizer a module-level factory builds and returns (`optimizer = make_optimizer(model)`) is the one main()
# steps: resolving `.step()` per function refused it ("steps something else") though the transforms applied before.
FACTORY_TRAINER = """
import torch
import torch.nn.functional as F
from torch import nn

LR = 0.1  # learning rate
EPOCHS = 2  # epochs
BATCH = 16  # examples per step


def make_optimizer(model):
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    return optimizer


def main():
    torch.manual_seed(0)
    x, y = torch.randn(64, 1, 8, 8), torch.randint(0, 10, (64,))
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
    before = [p.detach().clone() for p in model.parameters()]
    optimizer = make_optimizer(model)
    for epoch in range(EPOCHS):
        model.train()
        for i in range(0, len(x), BATCH):
            loss = F.cross_entropy(model(x[i : i + BATCH]), y[i : i + BATCH])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    return before, model
"""
# the factory names the model `net` and main() the optimizer `opt`: the edits take main()'s names
FACTORY_RENAMED = (
    FACTORY_TRAINER.replace("def make_optimizer(model):", "def make_optimizer(net):")
    .replace("SGD(model.parameters()", "SGD(net.parameters()")
    .replace("    optimizer = make_optimizer(model)", "    opt = make_optimizer(model)")
    .replace("            optimizer.", "            opt.")
)


@pytest.mark.parametrize("source", [FACTORY_TRAINER, FACTORY_RENAMED], ids=["same_names", "renamed"])
def test_an_optimizer_from_a_factory_function_is_edited_with_the_callers_names(source: str):
    stepped = "opt" if source is FACTORY_RENAMED else "optimizer"
    assert f"            {stepped}.step()" in source
    clipped = apply_transform("gradient_clipping", source)
    assert f"clip_grad_norm_(model.parameters(), GRAD_CLIP)\n            {stepped}.step()" in clipped
    assert "label_smoothing=LABEL_SMOOTHING)" in apply_transform("label_smoothing", source)
    replay = apply_transform("hard_example_replay", source)
    assert f"dream_replay.dream(model, {stepped}, " in replay
    for name in ("gradient_clipping", "label_smoothing", "hard_example_replay"):
        result = apply_transform(name, source)
        assert not unbound_names(result), (name, unbound_names(result))
        built: dict = {"__name__": "factory"}
        exec(compile(result, "train.py", "exec"), built)
        before, model = built["main"]()
        assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True)), name
    # what goes beside the optimizer's construction would land in the factory, where main()'s names are not
    with pytest.raises(NotApplicable, match=r"built in the function `make_optimizer\(\)` and stepped in `main\(\)`"):
        apply_transform("self_model_head", source)


def test_an_lbfgs_step_with_a_closure_is_still_the_training_step():
    """`opt.step(closure)` (LBFGS) steps the optimizer like `opt.step()`: it was matched before steps were resolved
    per function, and is again."""
    source = TRAINS_IN_A_FUNCTION
    closure = (
        "            def closure():\n                optimizer.zero_grad()\n"
        "                loss = F.cross_entropy(model(x[i : i + 32]), y[i : i + 32])\n"
        "                loss.backward()\n                return loss\n\n"
        "            optimizer.step(closure)\n"
    )
    step = (
        "            loss = F.cross_entropy(model(x[i : i + 32]), y[i : i + 32])\n            optimizer.zero_grad()\n"
        "            loss.backward()\n            optimizer.step()\n"
    )
    assert step in source
    lbfgs = source.replace(step, closure).replace("torch.optim.SGD(", "torch.optim.LBFGS(")
    assert code(analyse(lbfgs).step_statement()).strip() == "optimizer.step(closure)"
    averaged = apply_transform("ema_weights", lbfgs)  # after the step: the closure's evaluations are done
    assert "optimizer.step(closure)\n            ema.update_parameters(model)" in averaged
    exec(compile(averaged, "train.py", "exec"), {"__name__": "lbfgs"})
    # Around the step line a transform misses the closure's gradients, or needs what LBFGS lacks: each of these
    # crashed the trainer or changed nothing before (a replay's plain `step()`, Grokfast's EMA bound in the closure,
    # a second parameter group, weight_decay=, a clip of the last evaluation's gradients).
    refused = {
        "gradient_clipping": "a clip before the step would clip the last evaluation's gradients",
        "grokfast_filter": "the gradients to filter are computed inside the closure",
        "hard_example_replay": "a replay step is a plain `step()`",
        "mixed_precision": "the forward pass to put under autocast runs inside the closure",
        "self_model_head": "the optimizer is LBFGS: it takes one parameter group",
        "add_weight_decay": "the optimizer is LBFGS: it has no weight_decay",
    }
    for name, reason in refused.items():
        with pytest.raises(NotApplicable, match=re.escape(reason)):
            apply_transform(name, lbfgs)
    # one-cycle cycles momentum by default, which LBFGS has not: it cycles the LR alone there, and runs
    one_cycle = apply_transform("one_cycle_schedule", lbfgs)
    assert "pct_start=0.25, cycle_momentum=False)" in one_cycle
    exec(compile(one_cycle, "train.py", "exec"), {"__name__": "lbfgs"})
    assert "cycle_momentum" not in apply_transform("one_cycle_schedule", TRAINS_IN_A_FUNCTION)  # SGD has momentum


# The user's tabular MLP (a trial): hidden layers a loop appends to an nn.ModuleList, called one by one in forward
MODULE_LIST_NET = """class Net(nn.Module):
    \"\"\"Hidden SiLU layers a loop appends to an nn.ModuleList, one output.\"\"\"

    def __init__(self, n_in: int, hidden: int, depth: int = 2) -> None:
        super().__init__()
        self.layers = nn.ModuleList()
        width = n_in
        for _ in range(depth):
            self.layers.append(nn.Linear(width, hidden))
            width = hidden
        self.act = nn.SiLU()
        self.head = nn.Linear(width, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = self.act(layer(x))
        return self.head(x).squeeze(-1)
"""
MODULE_LIST_FORWARD = "        for layer in self.layers:\n            x = self.act(layer(x))\n"
MODULE_LIST_APPEND = (
    "        self.layers = nn.ModuleList()\n        width = n_in\n"
    "        for _ in range(depth):\n            self.layers.append(nn.Linear(width, hidden))\n"
    "            width = hidden\n"
)


def module_list_trainer(append: str = MODULE_LIST_APPEND, forward: str = MODULE_LIST_FORWARD) -> str:
    """The diabetes seed with the user's ModuleList MLP, its loop or forward loop replaced."""
    net = MODULE_LIST_NET.replace(MODULE_LIST_APPEND, append).replace(MODULE_LIST_FORWARD, forward)
    return re.sub(r"class Net\(nn\.Module\):.*?\.squeeze\(-1\)\n", lambda _: net, SOURCES["diabetes"], flags=re.S)


def trained(source: str, depth: int = 3) -> tuple[torch.nn.Module, dict[type, int]]:
    """The (transformed) trainer's Net after two SGD steps on random rows, and how often each norm and dropout type
    ran forward in one training batch."""
    torch.manual_seed(0)
    model = built(source, "Net", 10, 8, depth)
    ran: dict[type, int] = {}
    for module in model.modules():
        if isinstance(module, (torch.nn.BatchNorm1d, torch.nn.Dropout)):
            module.register_forward_hook(lambda m, _i, _o: ran.__setitem__(type(m), ran.get(type(m), 0) + 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(16, 10), torch.randn(16)
    for _ in range(2):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return model, {kind: count // 2 for kind, count in ran.items()}


@pytest.mark.parametrize(
    ("append", "forward"),
    [
        (MODULE_LIST_APPEND, MODULE_LIST_FORWARD),
        (
            "        self.layers = nn.ModuleList(\n"
            "            [nn.Linear(n_in if i == 0 else hidden, hidden) for i in range(depth)]\n"
            "        )\n        width = hidden\n",
            "        for i, layer in enumerate(self.layers):\n            x = self.act(layer(x))\n",
        ),
        (
            MODULE_LIST_APPEND,
            "        for i in range(len(self.layers)):\n            x = self.act(self.layers[i](x))\n",
        ),
    ],
    ids=["append_loop", "comprehension_enumerate", "indexed"],
)
def test_an_mlp_in_an_nn_module_list_gets_a_batchnorm_after_each_hidden_layer_and_dropout_before_its_head(
    append: str, forward: str
):
    """The user's MLP was refused batchnorm as "only the classifier nn.Linear(width, 1)": its DEPTH hidden layers
    are appended to a ModuleList the forward calls one by one. Each hidden Linear now runs with its norm (the
    element becomes nn.Sequential(Linear, BatchNorm1d): the forward's activation still follows each element)."""
    source = module_list_trainer(append, forward)
    normed = apply_transform("batchnorm", source)
    model, ran = trained(normed)
    assert [kinds(layer) for layer in model.layers] == [["Linear", "BatchNorm1d"]] * 3
    assert ran == {torch.nn.BatchNorm1d: 3}  # every hidden layer's norm runs in a forward pass, the head has none
    assert "self.head = nn.Linear(width, 1)" in normed
    # dropout goes on the classifier's input (after the last hidden activation), as for every other model
    dropped, ran = trained(apply_transform("add_dropout", source))
    assert ran == {torch.nn.Dropout: 1}
    x = torch.randn(64, 10)
    assert not torch.equal(dropped(x), dropped(x))
    dropped.eval()
    assert torch.equal(dropped(x), dropped(x))
    deeper, _ = trained(apply_transform("deepen", source))
    assert kinds(deeper.head) == ["Linear", "SiLU", "Linear"]  # the network's own activation (it was ReLU)


@pytest.mark.parametrize(
    ("append", "forward", "reason"),
    [
        (
            MODULE_LIST_APPEND,
            "        for layer in self.layers:\n            x = self.act(F.linear(x, layer.weight, layer.bias))\n",
            r"hidden layers are appended to the nn.ModuleList `self.layers`, whose use in forward\(\) is not followed "
            r"\(`for layer in self.layers:`\)",
        ),
        (
            "        self.layers = nn.ModuleList()\n        width = n_in\n"
            "        for h in [hidden] * depth + [1]:\n            self.layers.append(nn.Linear(width, h))\n"
            "            width = h\n",
            "        for layer in self.layers[:-1]:\n            x = self.act(layer(x))\n"
            "        return self.layers[-1](x).squeeze(-1)\n",
            r"the last nn.Linear \(`nn.Linear\(width, h\)`\) is added to `self.layers` in a loop: the same line builds "
            r"hidden layers and the output layer",
        ),
    ],
    ids=["weights_read", "output_in_the_loop"],
)
def test_an_nn_module_list_the_forward_uses_otherwise_is_refused_for_what_it_is(append: str, forward: str, reason: str):
    source = module_list_trainer(append, forward)
    if "self.layers[-1]" in forward:  # no separate head: the list's last element is the output layer
        source = source.replace("        self.head = nn.Linear(width, 1)\n", "").replace(
            "        return self.head(x).squeeze(-1)\n", ""
        )
    with pytest.raises(NotApplicable, match=reason):
        apply_transform("batchnorm", source)


def test_widen_layers_leaves_a_literal_width_a_loop_carries_to_the_next_layer():
    """`append(nn.Linear(width, 64)); width = 64` in a loop: doubling the 64 in the call alone gave the next pass
    a 64-wide input for a 128-wide output (a shape error at the first batch); it is refused for what it is."""
    append = MODULE_LIST_APPEND.replace("nn.Linear(width, hidden)", "nn.Linear(width, 64)").replace(
        "width = hidden", "width = 64"
    )
    source = module_list_trainer(append).replace("WIDTH", "NHID")  # no width knob: the literal is all there is
    trained(source)  # the trainer's own model runs
    with pytest.raises(NotApplicable, match=r"the literal hidden width is in a layer a loop builds \(`nn.Linear\("):
        apply_transform("widen_layers", source)


# A user's Fashion-MNIST trainer (a trial) in the usual mixed-precision idiom: a GradScaler handed to
# train_one_epoch(), which steps the optimizer through it, and an optimizer given the model through a helper that
# splits its parameters into decayed and undecayed groups. The scaler is enabled on CPU here, so its loss scale is real.
AMP_TRAINER = """
import torch
import torch.nn.functional as F
from torch import nn

EPOCHS = 2  # epochs
MAX_LR = 0.05  # peak learning rate
WEIGHT_DECAY = 5e-4  # weight decay of the weights
WIDTH = 8  # channels
device = "cpu"


class ResNetSmall(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.stem = nn.Conv2d(1, width, 3, padding=1)
        self.block = nn.Sequential(nn.Conv2d(width, width, 3, padding=1), nn.ReLU())
        self.head = nn.Linear(width, 10)

    def forward(self, x):
        x = F.relu(self.stem(x))
        x = x + self.block(x)
        return self.head(x.mean((2, 3)))


def param_groups(model, weight_decay):
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (no_decay if p.ndim <= 1 or name.endswith(".bias") else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


@torch.no_grad()
def evaluate(model, loader):
    model.eval()
    correct = total = 0
    for x, y in loader:
        correct += (model(x.to(device)).argmax(1) == y.to(device)).sum().item()
        total += len(y)
    return correct / total


def train_one_epoch(model, loader, opt, sched, scaler):
    model.train()
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device_type=device, enabled=(device == "cuda")):
            loss = F.cross_entropy(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        sched.step()


def main():
    torch.manual_seed(0)
    x, y = torch.randn(64, 1, 8, 8), torch.randint(0, 10, (64,))
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=16, shuffle=True)
    model = ResNetSmall(WIDTH).to(device)
    opt = torch.optim.SGD(param_groups(model, WEIGHT_DECAY), lr=MAX_LR, momentum=0.9, nesterov=True)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=MAX_LR, total_steps=EPOCHS * len(loader))
    scaler = torch.amp.GradScaler(device, enabled=True)
    accuracies = []
    for epoch in range(EPOCHS):
        train_one_epoch(model, loader, opt, sched, scaler)
        accuracies.append(evaluate(model, loader))
    return accuracies
"""
AMP_CALL = "        train_one_epoch(model, loader, opt, sched, scaler)\n"
# the same step written in main()'s epoch loop (the transforms that build state beside the epoch loop apply there)
AMP_FLAT = AMP_TRAINER.replace(
    AMP_CALL,
    "        model.train()\n        for x, y in loader:\n            opt.zero_grad(set_to_none=True)\n"
    '            with torch.autocast(device_type=device, enabled=(device == "cuda")):\n'
    "                loss = F.cross_entropy(model(x), y)\n            scaler.scale(loss).backward()\n"
    "            scaler.step(opt)\n            scaler.update()\n            sched.step()\n",
)
# what needs the step, the backward line or the model: refused before, with the false reasons below
AMP_APPLIES = {
    "gradient_clipping",
    "flip_augmentation",
    "shift_augmentation",
    "flip_tta",
    "channels_last",
    "label_smoothing",
    "edge_of_chaos_curriculum",
}
AMP_FLAT_APPLIES = AMP_APPLIES | {"ema_weights", "grokfast_filter", "hard_example_replay", "self_model_head"}


def run_main(source: str) -> list[float]:
    """Run a transformed trainer's main() (its GradScaler enabled: a second unscale_() or a bad step raises)."""
    built: dict = {"__name__": "amp"}
    exec(compile(source, "train.py", "exec"), built)
    return built["main"]()


@pytest.mark.parametrize("source", [AMP_TRAINER, AMP_FLAT], ids=["train_one_epoch", "flat"])
def test_a_grad_scaler_step_is_the_training_step_and_every_transform_that_applies_runs(source: str):
    """`scaler.step(opt)` steps `opt`: 13 transforms refused the user's trainer, saying it "steps something else",
    and 5 more that the model built for `param_groups(model, ...)` was "no nn.Module model found"."""
    assert (AMP_CALL in source) == (source is AMP_TRAINER)
    trainer = analyse(source)
    assert code(trainer.step_statement()).strip() == "scaler.step(opt)"
    assert trainer.stepped_name() == "opt" and trainer.loss_name() == "loss" and trainer.model_name() == "model"
    reasons = applicability(source)
    for name, reason in reasons.items():
        assert reason is None or not re.search(r"steps something else|no nn.Module model|closure", reason), name
    # (in train_one_epoch(...) too: what the four build beside the epoch loop is handed to it by a parameter)
    assert AMP_FLAT_APPLIES <= {name for name, reason in reasons.items() if reason is None}, reasons
    for name, reason in reasons.items():
        if reason is None:
            run_main(apply_transform(name, source))


@pytest.mark.parametrize("source", [AMP_TRAINER, AMP_FLAT], ids=["train_one_epoch", "flat"])
def test_a_clip_through_a_grad_scaler_follows_unscale_and_clips_the_true_gradients(
    source: str, monkeypatch: pytest.MonkeyPatch
):
    """PyTorch's AMP recipe: `scaler.unscale_(opt)` before the clip, which then sees the real gradient norm (the
    loss-scaled one is 65536 times it); Grokfast filters after it; stacked, they add one unscale_() (a second
    raises)."""
    indent = "            " if source is AMP_FLAT else "        "
    clipped = apply_transform("gradient_clipping", source)
    assert (
        f"{indent}scaler.scale(loss).backward()\n{indent}scaler.unscale_(opt)\n"
        f"{indent}torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP)\n{indent}scaler.step(opt)\n"
    ) in clipped
    norms: list[float] = []
    clip = torch.nn.utils.clip_grad_norm_

    def recorded(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202 - wraps the real clip
        norms.append(float(clip(*args, **kwargs)))
        return norms[-1]

    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", recorded)
    run_main(clipped)
    assert len(norms) == 8 and max(norms) < 100, norms  # 2 epochs x 4 batches of true gradients
    if source is AMP_FLAT:
        for stacked in (
            apply_transform("grokfast_filter", clipped),
            apply_transform("gradient_clipping", apply_transform("grokfast_filter", source)),
        ):
            assert stacked.count("scaler.unscale_(opt)") == 1
            lines = [line.strip() for line in stacked.splitlines()]
            unscale = lines.index("scaler.unscale_(opt)")
            assert unscale < lines.index("grokfast_grads = gradfilter_ema(model, grokfast_grads)")
            assert unscale < lines.index("torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP)")
            run_main(stacked)


def test_a_scaler_the_transforms_cannot_unscale_is_refused_naming_it():
    """A `.step(opt)` through something not traced to a GradScaler has no known `unscale_()`; a trainer that
    unscales under a condition would unscale twice when it does: both are refused for what they are."""
    made = AMP_FLAT.replace("torch.amp.GradScaler(device, enabled=True)", "make_scaler()")
    with pytest.raises(NotApplicable, match=r"`scaler` is not traced to a `torch\.amp\.GradScaler\(\.\.\.\)`"):
        apply_transform("gradient_clipping", made)
    with pytest.raises(NotApplicable, match=r"`scaler` is not traced to a `torch\.amp\.GradScaler"):
        apply_transform("grokfast_filter", made)
    assert "ema_weights" in {n for n, r in applicability(made).items() if r is None}  # needs no unscale
    conditional = AMP_FLAT.replace(
        "            scaler.step(opt)\n",
        "            if epoch > 0:\n                scaler.unscale_(opt)\n            scaler.step(opt)\n",
    )
    with pytest.raises(NotApplicable, match=r"unscales its GradScaler's gradients \(`scaler\.unscale_\(opt\)`\) else"):
        apply_transform("grokfast_filter", conditional)


def test_an_optimizer_given_the_model_through_a_parameter_group_helper_trains_that_model():
    """`torch.optim.SGD(param_groups(model, wd))`: the trainer's own helper maps its parameter to the argument, an
    imported one (timm's) is handed the one argument built from a module class."""
    assert analyse(AMP_TRAINER).built_model() == "model"
    renamed = AMP_TRAINER.replace("def param_groups(model, weight_decay):", "def param_groups(net, weight_decay):")
    renamed = renamed.replace("in model.named_parameters():", "in net.named_parameters():")
    assert analyse(renamed).built_model() == "model"
    timm = AMP_TRAINER.replace("param_groups(model, WEIGHT_DECAY)", "param_groups_weight_decay(model, WEIGHT_DECAY)")
    timm = "from timm.optim import param_groups_weight_decay\n" + timm
    assert analyse(timm).built_model() == "model"
    assert "clip_grad_norm_(model.parameters(), GRAD_CLIP)" in apply_transform("gradient_clipping", timm)
    # a helper handed no model built from a class: still no model found
    nothing = timm.replace("param_groups_weight_decay(model, WEIGHT_DECAY)", "param_groups_weight_decay(WEIGHT_DECAY)")
    with pytest.raises(NotApplicable, match="no nn.Module model found"):
        analyse(nothing).built_model()


def test_a_model_whose_class_is_imported_is_refused_as_defined_elsewhere():
    imported = re.sub(r"class ResNetSmall.*?\n\n\n", "", AMP_TRAINER, flags=re.S)
    imported = imported.replace("from torch import nn\n", "from torch import nn\n\nfrom models import ResNetSmall\n")
    assert "class ResNetSmall" not in imported
    reason = "the model `ResNetSmall` is defined in `models` (imported), not in train.py"
    for name in ("batchnorm", "add_dropout", "deepen", "channels_last"):
        with pytest.raises(NotApplicable, match=re.escape(reason)):
            apply_transform(name, imported)


@pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler.step\\(\\)` before:UserWarning")  # the skipped step
def test_grokfast_through_a_grad_scaler_keeps_an_overflowing_step_out_of_its_ema(monkeypatch: pytest.MonkeyPatch):
    """The scaler skips a step whose gradients overflowed (fp16 does at its first loss scales); the EMA of the
    gradients must skip it too, or its inf/NaN is added to every later step's gradients (all finite again)."""
    overflow = AMP_FLAT.replace(
        "                loss = F.cross_entropy(model(x), y)\n",
        '                loss = F.cross_entropy(model(x), y) * (float("inf") if ovf and ovf.pop() else 1.0)\n',
    ).replace("    accuracies = []\n", "    accuracies, ovf = [], [True]  # the first step's gradients overflow\n")
    assert "ovf.pop()" in overflow
    filtered = apply_transform("grokfast_filter", overflow)
    finite: list[bool] = []
    step = torch.optim.SGD.step

    def stepped(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202 - wraps the real step
        result = step(self, *args, **kwargs)
        finite.append(all(bool(p.isfinite().all()) for group in self.param_groups for p in group["params"]))
        return result

    monkeypatch.setattr(torch.optim.SGD, "step", stepped)
    run_main(filtered)
    assert finite == [True] * 7  # 8 batches, the overflowing one skipped


ACCUMULATING = """
import torch
from torch import nn
from sklearn.datasets import load_digits

LR = 0.05  # learning rate
EPOCHS = 2  # passes
ACCUM = 2  # micro-batches per step

x = torch.tensor(load_digits().data[:256], dtype=torch.float32) / 16
y = torch.tensor(load_digits().target[:256])
model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
opt = torch.optim.SGD(model.parameters(), lr=LR)
steps = 0
for epoch in range(EPOCHS):
    for i in range(0, len(x), 32):
        loss = nn.functional.cross_entropy(model(x[i : i + 32]), y[i : i + 32]) / ACCUM
        loss.backward()
        if (i // 32 + 1) % ACCUM == 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad()
            steps += 1
"""


def test_grokfast_filters_accumulated_gradients_once_per_step_before_the_clip():
    """A user trial (gradients accumulated over 2 micro-batches): the filter ran after every backward pass, so the
    second micro-batch's gradient already held the first's amplified EMA, which the EMA took in again (166x the
    designed update after 2,000 steps). It runs once per optimizer step now, on the summed gradient, before the clip."""
    out = apply_transform("grokfast_filter", ACCUMULATING)
    step_block = out[out.index("if (i // 32 + 1) % ACCUM == 0:") :]
    assert out.count("= gradfilter_ema(model, grokfast_grads)") == 1
    assert step_block.index("gradfilter_ema(model") < step_block.index("clip_grad_norm_") < step_block.index("opt.step")
    # the transformed trainer, run on digits with its filter counted: once per step
    counted = out.replace("def gradfilter_ema(", "def _gradfilter_ema(").replace(
        "\nsteps = 0", "\nsteps = 0\ndef gradfilter_ema(m, g):\n    CALLS.append(1)\n    return _gradfilter_ema(m, g)"
    )
    ran: dict = {"CALLS": []}
    exec(compile(counted, "train.py", "exec"), ran)
    assert len(ran["CALLS"]) == ran["steps"] == 8  # 2 epochs x 8 micro-batches / 2


CONTINUE_GUARD = ACCUMULATING.replace(
    """        if (i // 32 + 1) % ACCUM == 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad()
            steps += 1
""",
    """        if (i // 32 + 1) % ACCUM != 0:
            continue
        if GRAD_CLIP > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP)
        opt.step()
        opt.zero_grad()
        steps += 1
""",
).replace("ACCUM = 2  # micro-batches per step", "ACCUM = 2  # micro-batches per step\nGRAD_CLIP = 1.0  # clip")


def test_grokfast_filters_once_per_step_after_a_guard_that_skips_the_step_and_before_a_conditional_clip():
    """Review: `if (i + 1) % ACCUM != 0: continue` keeps the step in the backward's block (the filter went after every
    backward again), and a clip under `if GRAD_CLIP > 0:` was not seen (the filter went after it, amplifying clipped
    gradients)."""
    assert CONTINUE_GUARD != ACCUMULATING
    out = apply_transform("grokfast_filter", CONTINUE_GUARD)
    after_guard = out[out.index("            continue\n") :]
    assert (
        after_guard.index("gradfilter_ema(model")
        < after_guard.index("if GRAD_CLIP > 0:")
        < after_guard.index("opt.step()")
    )
    counted = out.replace("def gradfilter_ema(", "def _gradfilter_ema(").replace(
        "\nsteps = 0", "\nsteps = 0\ndef gradfilter_ema(m, g):\n    CALLS.append(1)\n    return _gradfilter_ema(m, g)"
    )
    ran: dict = {"CALLS": []}
    exec(compile(counted, "train.py", "exec"), ran)
    assert len(ran["CALLS"]) == ran["steps"] == 8


def test_the_self_model_term_of_a_loss_divided_for_accumulation_is_divided_alike():
    """A user trial: `loss = criterion(out, y) / ACCUM` then `loss = loss + SELF_MODEL_WEIGHT * aux` weighed the
    auxiliary loss ACCUM times what SELF_MODEL_WEIGHT says."""
    out = apply_transform("self_model_head", ACCUMULATING)
    assert "loss = loss + SELF_MODEL_WEIGHT * self_model.aux_loss(y[i : i + 32]) / ACCUM\n" in out
    ran: dict = {}
    exec(compile(out, "train.py", "exec"), ran)
    assert ran["steps"] == 8
    plain = apply_transform("self_model_head", ACCUMULATING.replace(") / ACCUM\n", ")\n"))
    assert "SELF_MODEL_WEIGHT * self_model.aux_loss(y[i : i + 32])\n" in plain
    # a summed loss divided into a mean, stepped every batch: its term is a mean already, not divided (review)
    mean = ACCUMULATING.replace(") / ACCUM\n", ', reduction="sum") / 32\n').replace(
        "        if (i // 32 + 1) % ACCUM == 0:\n", "        if True:\n"
    )
    stepped = apply_transform(
        "self_model_head", mean.replace("        if True:\n", "").replace("\n            ", "\n        ")
    )
    assert "SELF_MODEL_WEIGHT * self_model.aux_loss(y[i : i + 32])\n" in stepped


TRAINS_AND_EVALUATES = """import torch
from torch import nn
import torch.nn.functional as F

LR = 0.05  # learning rate
EPOCHS = 2  # passes


def run_epoch(model, loader, val, optimizer, *, log=False):
    model.train()
    for x, y in loader:
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
    model.eval()
    with torch.no_grad():
        return (model(val[0]).argmax(1) == val[1]).float().mean().item()


def main():
    x, y = torch.randn(64, 8), torch.randint(0, 3, (64,))
    loader = [(x[i : i + 16], y[i : i + 16]) for i in range(0, 64, 16)]
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    for epoch in range(EPOCHS):
        acc = run_epoch(model, loader, (x, y), optimizer)
    with torch.no_grad():
        print(model(x).argmax(1))


main()
"""


def test_ema_never_swaps_the_model_a_training_call_gets_and_refuses_one_that_also_evaluates_it():
    """Review: `acc = run_epoch(model, loader, val, optimizer)` that trains, then `.eval()`s and scores the model, was
    read as an evaluation: its model argument became `ema`, whose own copy of the weights took the forward passes, so
    `optimizer.step()` found no gradient on the real model and the child trained nothing (it passed the gate)."""
    with pytest.raises(NotApplicable, match=r"`run_epoch\(\)` trains `model` and also evaluates it"):
        apply_transform("ema_weights", TRAINS_AND_EVALUATES)
    trains_only = TRAINS_AND_EVALUATES.replace(
        "    model.eval()\n    with torch.no_grad():\n"
        "        return (model(val[0]).argmax(1) == val[1]).float().mean().item()",
        "    return 0.0",
    )
    assert trains_only != TRAINS_AND_EVALUATES
    out = apply_transform("ema_weights", trains_only)
    assert "acc = run_epoch(model, loader, (x, y), optimizer, ema=ema)" in out  # the trained model stays the model
    assert "print(ema(x).argmax(1))" in out
    ran: dict = {"__name__": "train"}
    exec(compile(out, "train.py", "exec"), ran)


def test_widen_layers_on_a_trainer_that_imports_its_model_says_so():
    """User trial: on a train.py importing its model from another file, widen_layers said "fewer than two conv/linear
    layers: no hidden width to widen" (it counted train.py's layers alone); the model is elsewhere, and it says so."""
    source = (PROJECT_ROOT / "tests" / "fixtures" / "multifile" / "block_cnn" / "train.py").read_text()
    for run in (apply_transform, check_transform):
        with pytest.raises(NotApplicable) as refused:
            run("widen_layers", source)
        assert "the model `BlockCNN` is defined in `models` (imported), not in train.py" in str(refused.value)
        assert "fewer than two" not in str(refused.value)
