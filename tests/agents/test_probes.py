"""Telemetry probes: `harness.probes` on real models, a fixture trainer reporting them, the diagnoses reading them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from ralph_ray import PROJECT_ROOT, harness
from ralph_ray.agents.base import Diagnosis, EpochPoint, TrialSummary
from ralph_ray.agents.heuristic import diagnose
from ralph_ray.knobs import rewrite_knobs
from ralph_ray.tasks.base import write_public
from ralph_ray.tasks.digits import prepare


def test_probes_track_updates_rank_and_plateau():
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    first = harness.probes(model, train_loss=0.5, val_loss=0.8, val_acc=0.9)
    assert "update_norm" not in first and abs(first["gen_gap"] - 0.3) < 1e-9
    assert 1 < first["eff_rank"] <= 8 and first["weight_norm"] > 0 and first["plateau"] == 0.0
    with torch.no_grad():
        model[0].weight.add_(0.1)
    moved = harness.probes(model, 0.5, 0.8, 0.9)
    assert abs(moved["update_norm"] - 0.1 * (8 * 16) ** 0.5) < 1e-4 and moved["update_ratio"] > 0
    for _ in range(harness.PLATEAU_EPOCHS):
        still = harness.probes(model, 0.5, 0.8, 0.9)
    assert still["update_norm"] == 0.0 and still["plateau"] == 1.0


def test_probes_take_a_functional_trainers_tensors():
    weights = [torch.randn(64, 32, requires_grad=True), torch.zeros(32, requires_grad=True)]
    out = harness.probes(weights, 1.0, 1.5)
    assert set(out) == {"gen_gap", "weight_norm", "eff_rank"}  # no val_acc: no plateau flag


def test_a_diverged_model_still_gets_its_probes():
    """NaN weights (a trainer that diverged) leave the rank out instead of crashing the trial in the SVD."""
    model = torch.nn.Linear(16, 8)
    with torch.no_grad():
        model.weight[0, 0] = float("nan")
    out = harness.probes(model, train_loss=float("nan"), val_loss=float("nan"), val_acc=0.1)
    assert "eff_rank" not in out and out["plateau"] == 0.0


def test_a_fixture_trainer_reports_the_probes(tmp_path: Path):
    write_public(prepare(0, 0.2, 0.2), tmp_path / "data", "digits")
    source = (PROJECT_ROOT / "tests" / "fixtures" / "trainers" / "module_loader" / "train.py").read_text()
    (tmp_path / "train.py").write_text(rewrite_knobs(source, {"EPOCHS": 2}))
    env = {
        **os.environ,
        "RALPH_DATA_DIR": str(tmp_path / "data"),
        "RALPH_METRICS_FILE": str(tmp_path / "m.jsonl"),
        "RALPH_PREDICTIONS_FILE": str(tmp_path / "p.npz"),
        "OMP_NUM_THREADS": "1",
        "RALPH_DEVICE": "cpu",
    }
    result = subprocess.run(
        [sys.executable, "train.py"], check=False, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-2000:]
    records = [json.loads(line) for line in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert {"gen_gap", "weight_norm", "eff_rank", "plateau"} <= set(records[0])
    assert records[1]["update_norm"] > 0


def _trial(points: list[EpochPoint]) -> TrialSummary:
    return TrialSummary("t1", "completed", None, {}, 0.9, points)


def test_a_widening_gap_reads_as_overfitting():
    # val_loss itself still falls (the loss-based checks stay quiet); the gap probe sees the split open up
    train, val = (lambda e: 0.4 - 0.03 * e), (lambda e: 0.45 - 0.005 * e)
    points = [
        EpochPoint(e, train_loss=train(e), val_loss=val(e), val_acc=0.8 + 0.02 * e, gen_gap=val(e) - train(e))
        for e in range(1, 9)
    ]
    findings = diagnose([_trial(points)], {})
    overfit = next(f for f in findings if f.diagnosis is Diagnosis.overfitting)
    assert overfit.evidence.startswith("gap widening: gen_gap")


def test_collapsed_updates_with_the_plateau_flag_read_as_a_plateau():
    points = [
        EpochPoint(
            e,
            train_loss=0.3,
            val_loss=0.35,
            val_acc=0.95,
            gen_gap=0.05,
            update_ratio=0.2 if e < 5 else 0.001,
            plateau=1.0 if e > 6 else 0.0,
        )
        for e in range(1, 9)
    ]
    findings = diagnose([_trial(points)], {})
    plateau = next(f for f in findings if f.diagnosis is Diagnosis.plateau)
    assert plateau.evidence.startswith("update norm collapsed: update_ratio 0.001")
    unflagged = [
        EpochPoint(p.epoch, p.train_loss, p.val_loss, p.val_acc, update_ratio=p.update_ratio, plateau=0.0)
        for p in points
    ]
    assert all(not f.evidence.startswith("update norm") for f in diagnose([_trial(unflagged)], {}))
