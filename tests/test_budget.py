"""The equal time budget on the trainer side: the harness's clock, and the seeds training until their deadline."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ralph_ray import PROJECT_ROOT, harness
from ralph_ray.agents.transforms import apply_transform
from ralph_ray.config import TrialConfig
from ralph_ray.knobs import rewrite_knobs
from ralph_ray.runner import Trainer
from ralph_ray.tasks.base import write_public
from ralph_ray.tasks.digits import prepare
from ralph_ray.workdir import prepare_workdir


def test_no_budget_keeps_the_fixed_epochs(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv(harness.ENV_BUDGET_S, raising=False)
    assert harness.budget_s() is None and harness.time_left() == math.inf
    assert list(harness.epochs(3)) == [1, 2, 3]
    assert harness.progress(25, 100) == 0.25


def test_budget_ends_epochs_before_the_deadline(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv(harness.ENV_BUDGET_S, str(harness.train_seconds() + 0.6))
    seen = []
    for epoch in harness.epochs(1):  # the limit counts for nothing under a budget
        seen.append(epoch)
        time.sleep(0.1)
    assert len(seen) >= 4 and harness.time_left() > -0.15  # the last epoch ended before (or right at) the deadline
    assert 0.7 < harness.progress(1, 1000) <= 1.0  # by time, not by step


def _torch_lrs(scheduler: str, epochs: int) -> list[float]:
    """The learning rate (of 1.0) each epoch under one of torch's schedulers, stepped once per epoch."""
    import torch

    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    build = {
        "cosine": lambda: torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=epochs),
        "one_cycle": lambda: torch.optim.lr_scheduler.OneCycleLR(
            # torch's phases end at steps pct * total - 1 and total - 1: the peak at a quarter of the epochs
            optimizer,
            max_lr=1.0,
            total_steps=epochs + 1,
            pct_start=(epochs / 4 + 1) / (epochs + 1),
        ),
        "warmup": lambda: torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=0.1, total_iters=2),
    }[scheduler]()
    lrs = []
    for _ in range(epochs):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        build.step()
    return lrs


def test_lr_factor_follows_torchs_schedulers_without_a_budget(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv(harness.ENV_BUDGET_S, raising=False)
    for anneal in ("cosine", "one_cycle"):
        ours = [harness.lr_factor(step, 8, anneal=anneal) for step in range(8)]
        assert ours == pytest.approx(_torch_lrs(anneal, 8), rel=1e-6), anneal
    assert [harness.lr_factor(step, 8, warmup_epochs=2) for step in range(8)] == pytest.approx(_torch_lrs("warmup", 8))
    both = [harness.lr_factor(step, 8, anneal="cosine", warmup_epochs=2) for step in range(8)]
    assert both == pytest.approx([w * c for w, c in zip(_torch_lrs("warmup", 8), _torch_lrs("cosine", 8))])
    with pytest.raises(ValueError, match="anneal must be"):
        harness.lr_factor(1, 8, anneal="linear")


def test_lr_factor_follows_the_budget_past_the_epochs_knob(monkeypatch: pytest.MonkeyPatch):
    """Under a budget the epochs knob doesn't bound the steps (torch's OneCycleLR raises there): time does."""
    monkeypatch.setenv(harness.ENV_BUDGET_S, str(harness.train_seconds() / 0.75))  # three quarters gone
    for step in (1, 4, 40):  # the step no longer matters, the clock does
        assert harness.lr_factor(step, 4, anneal="cosine") == pytest.approx(
            0.5 * (1 + math.cos(0.75 * math.pi)), abs=0.02
        )
    assert harness.lr_factor(40, 4, anneal="one_cycle") == pytest.approx(0.25, abs=0.02)  # 2/3 of its way down
    monkeypatch.setenv(harness.ENV_BUDGET_S, "1e-9")  # past the deadline: the anneal's end
    assert harness.lr_factor(40, 4, anneal="cosine") == pytest.approx(0.0, abs=1e-12)


@pytest.mark.parametrize("schedules", [(), ("one_cycle_schedule",), ("cosine_lr_schedule", "lr_warmup")])
def test_digits_seed_trains_until_its_three_second_budget(tmp_path: Path, schedules: tuple[str, ...]):
    """Also with the agent's schedules: under a budget more epochs run than EPOCHS says (a one-cycle child built on
    EPOCHS crashed at epoch EPOCHS + 2 in every Fashion-MNIST campaign; found on a GPU, 2026-11-27)."""
    splits = prepare(0, 0.2, 0.2)
    write_public(splits, tmp_path / "data", "digits")
    work = tmp_path / "work"
    work.mkdir()
    source = (PROJECT_ROOT / "trainers" / "digits" / "train.py").read_text()
    for name in schedules:
        source = apply_transform(name, source)
    (work / "train.py").write_text(rewrite_knobs(source, {"EPOCHS": 1, "WIDTH": 4, "BATCH_SIZE": 256}))  # quick epochs
    env = {
        **os.environ,
        harness.ENV_DATA_DIR: str(tmp_path / "data"),
        harness.ENV_METRICS_FILE: str(work / "m.jsonl"),
        harness.ENV_PREDICTIONS_FILE: str(work / "p.npz"),
        "OMP_NUM_THREADS": "1",
        harness.ENV_BUDGET_S: "3",
    }
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "train.py"], cwd=work, env=env, capture_output=True, text=True, timeout=120
    )
    wall = time.monotonic() - started
    assert result.returncode == 0, result.stderr[-2000:]
    records = [json.loads(line) for line in (work / "m.jsonl").read_text().splitlines()]
    assert len(records) > 1  # EPOCHS=1 is ignored: it trains until the deadline
    assert all(harness.TRAIN_SECONDS in r for r in records)
    assert records[-1][harness.TRAIN_SECONDS] <= 3.0
    assert wall > records[-1][harness.TRAIN_SECONDS]  # (start-up is not budget: it is the runner's to bound)
    assert (work / "p.npz").exists()


# -- the runner's side: a trainer that keeps to its budget, and one that ignores it ------------------------------


def _trainer(tmp_path: Path, body: str) -> Trainer:

    folder = tmp_path / "variant"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "train.py").write_text("import time\nimport numpy as np\nfrom ralph_ray import harness\n" + body)
    work = tmp_path / "trials" / "t1"
    prepare_workdir(folder, work, {})
    return Trainer(work, tmp_path / "data", env={harness.ENV_BUDGET_S: "3"})


def test_runner_lets_a_trainer_on_budget_finish(tmp_path: Path):
    from ralph_ray.runner import Limits, Status, run
    from ralph_ray.sandbox import Policy, SandboxMode

    job = _trainer(
        tmp_path,
        """
for epoch in harness.epochs(1):
    time.sleep(0.4)
    harness.report(epoch=epoch, val_acc=0.5)
harness.save_predictions(selection=np.array([1]), test=np.array([2]))
""",
    )
    outcome = run(job, Limits(timeout_s=60, sandbox=Policy(SandboxMode.none), budget_s=3, grace_s=TrialConfig.grace_s))
    assert outcome.status is Status.finished and outcome.predictions is not None  # within budget + grace: not stopped
    assert outcome.last is not None and outcome.last["epoch"] >= 5 and outcome.last[harness.TRAIN_SECONDS] <= 3


def test_runner_stops_a_trainer_that_ignores_its_budget(tmp_path: Path):
    from ralph_ray.runner import BUDGET_REASON, Limits, Status, run
    from ralph_ray.sandbox import Policy, SandboxMode

    job = _trainer(
        tmp_path,
        """
for epoch in range(1, 1000):  # ignores harness.time_left()
    time.sleep(0.3)
    harness.report(epoch=epoch, val_acc=epoch / 1000)
""",
    )
    seen: list[dict] = []
    outcome = run(job, Limits(timeout_s=60, sandbox=Policy(SandboxMode.none), budget_s=1, grace_s=1), seen.append)
    assert outcome.last[harness.TRAIN_SECONDS] < 1 + 1 + 0.5  # stopped at budget + grace of training (+ a poll)
    assert outcome.status is Status.stopped and outcome.reason.startswith(BUDGET_REASON)
    assert outcome.last is not None and outcome.last == seen[-1] and outcome.last["epoch"] >= 3  # its epochs stand


def test_config_names_the_fix_for_a_bad_mode_or_budget():
    from ralph_ray.config import ConfigError, PopulationMode, load_config

    cfg = load_config(["population.mode=async", "trial.budget_s=30"])
    assert cfg.population.run_mode is PopulationMode.asynchronous and cfg.trial.budget_s == 30
    default = load_config([])  # auto: async, unless the run needs barrier cycles
    assert default.population.run_mode is PopulationMode.asynchronous and default.trial.budget_s is None
    assert load_config(["scheduler=pbt"]).population.run_mode is PopulationMode.generations
    assert load_config(["resources.workers_per_trial=2"]).population.run_mode is PopulationMode.generations
    assert load_config(["population.mode=generations"]).population.run_mode is PopulationMode.generations
    with pytest.raises(ConfigError, match="population.mode=async"):
        load_config(["population.mode=barrier"])
    with pytest.raises(ConfigError, match="trial.budget_s"):
        load_config(["trial.budget_s=-1"])
