"""Scoring an exported model (task=lm): the engine runs the trainer's model on the held-out contexts in a sandboxed
process of its own, so a trainer that copies the held-out answers into its predictions, or reports a perfect loss,
gets the score its model really earns."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from ralph_ray import PROJECT_ROOT, harness, modeleval
from ralph_ray.campaign import run
from ralph_ray.config import load_config, sandbox_policy
from ralph_ray.gate import Gate, write_smoke_data
from ralph_ray.kb import open_reader
from ralph_ray.runner import Limits, Status, Trainer, TrialFailed
from ralph_ray.runner import run as run_trainer
from ralph_ray.scoring import score_predictions
from ralph_ray.tasks import prepare_splits
from ralph_ray.tasks.base import ScoredBy, write_public
from ralph_ray.workdir import prepare_workdir

# Looks every held-out context up in the corpus it can read (the stdlib, as prepare.py's caveat says), saves logits
# that put all their mass on the true next byte, and reports a perfect loss; the model it exports knows nothing.
CHEAT = """
import sysconfig
from pathlib import Path

import numpy as np
import torch

from ralph_ray import harness

EPOCHS = 1  # epochs
LR = 0.003  # the lm task's searched knobs, unused
HIDDEN = 128  # unused
WINDOW = 8  # unused
print(LR, HIDDEN, WINDOW)  # read once: a searched knob no code reads exits 2 (seedcheck)


class Uniform(torch.nn.Module):
    def forward(self, x):
        return torch.zeros(x.shape[0], 256) + 0.0 * x[:, :1].float()


def answers(contexts):
    root = Path(sysconfig.get_paths()["stdlib"])
    text = b"".join(p.read_bytes() for p in sorted(root.glob("*.py")))[:1_200_000]
    logits = np.full((len(contexts), 256), -50.0)
    for row, context in enumerate(contexts):
        at = text.find(bytes(context.astype(np.uint8)))
        logits[row, text[at + len(context)] if at >= 0 else 0] = 50.0
    return logits


data = harness.load_data()
for epoch in harness.epochs(EPOCHS):
    harness.report(epoch=epoch, train_loss=0.0, val_loss=0.0)
harness.save_predictions(selection=answers(data.selection_x), test=answers(data.test_x))
harness.save_model(Uniform(), torch.tensor(np.asarray(data.train_x[:4]).astype(np.int64)))
"""


@pytest.fixture(scope="module")
def lm(tmp_path_factory: pytest.TempPathFactory):
    cfg = load_config(["task=lm"])
    splits = prepare_splits(cfg)
    data = tmp_path_factory.mktemp("lm-data")
    write_public(splits, data, "lm")
    return cfg, splits.labels(), data


def _cheat(tmp_path: Path, cfg, data: Path):
    folder = tmp_path / "variant"
    folder.mkdir()
    (folder / "train.py").write_text(CHEAT)
    work = tmp_path / "work"
    prepare_workdir(folder, work, {})
    limits = Limits(600, sandbox=sandbox_policy(cfg))
    return work, limits, run_trainer(Trainer(work, data), limits)


def test_the_lm_task_is_scored_by_its_model(lm):
    cfg, labels, _ = lm
    assert cfg.task.scored_by == ScoredBy.model.value and labels.metric.scored_by is ScoredBy.model


def test_the_seeds_exported_model_scores_what_its_own_logits_score(lm, tmp_path: Path):
    cfg, labels, data = lm
    work = tmp_path / "work"
    prepare_workdir(PROJECT_ROOT / "trainers" / "lm", work, {"EPOCHS": 1, "STEPS_PER_EPOCH": 5})
    limits = Limits(600, sandbox=sandbox_policy(cfg))
    outcome = run_trainer(Trainer(work, data), limits)
    assert outcome.status is Status.finished, outcome.reason
    own = score_predictions(outcome.predictions, labels)
    scored = score_predictions(modeleval.evaluate(work, data, limits), labels)
    assert scored.selection == pytest.approx(own.selection, abs=1e-4) and 3.0 < -scored.selection < 8.5
    assert scored.test == pytest.approx(own.test, abs=1e-4)


def test_the_seed_passes_the_gates_smoke_run(lm, tmp_path: Path):
    # The smoke sliver (160 train rows, ~10 kB of text) is shorter than the seed's per-epoch validation stretch; a
    # seed that assumed the full text failed every child's smoke run, so no child of task=lm could ever train.
    cfg = lm[0]
    smoke = write_smoke_data(prepare_splits(cfg), tmp_path / "smoke", "lm")
    seed = PROJECT_ROOT / "trainers" / "lm"
    gate = Gate(smoke, tuple(cfg.search.space), timeout_s=300, sandbox=sandbox_policy(cfg), scores_model=True)
    gate.check(seed, seed)


def test_a_cheating_trainer_earns_what_its_model_earns(lm, tmp_path: Path):
    cfg, labels, data = lm
    work, limits, outcome = _cheat(tmp_path, cfg, data)
    assert outcome.status is Status.finished, outcome.reason
    assert outcome.last is not None and outcome.last["val_loss"] == 0.0  # the perfect loss it reported
    copied = score_predictions(outcome.predictions, labels)
    assert -copied.selection < 0.5  # its own predictions would look near perfect (bits per byte, stored as -value)
    scored = score_predictions(modeleval.evaluate(work, data, limits), labels)
    assert -scored.selection == pytest.approx(8.0) and -scored.test == pytest.approx(8.0)  # what a uniform model earns

    (work / harness.MODEL_FILE).unlink()
    with pytest.raises(TrialFailed, match="harness.save_model"):
        modeleval.evaluate(work, data, limits)


@pytest.mark.slow
def test_a_campaign_on_a_model_scored_task_records_the_models_score(ray_session, tmp_path: Path):
    folder = tmp_path / "cheat_lm"
    shutil.copytree(PROJECT_ROOT / "trainers" / "lm", folder, ignore=shutil.ignore_patterns("__pycache__"))
    (folder / "train.py").write_text(CHEAT)
    outcome = run(
        load_config(
            [
                f"task={folder}",
                f"paths.runs={tmp_path / 'runs'}",
                f"paths.kb={tmp_path / 'kb'}",
                "run_id=cheat",
                "population.mode=generations",  # one barrier cycle (the default auto runs async)
                "agent=none",
                "safeguards.max_cycles=1",
                "search.num_samples=1",
                "safeguards.replicates=0",  # one trial decides (replicates: tests/test_noise.py)
                "search.max_concurrent=1",
            ]
        )
    )
    query = "select selection_score, test_score from trials where run_id = 'cheat' and status = 'completed'"
    scores = open_reader(outcome.kb_root).execute(query).fetchall()
    assert scores and all(-s == pytest.approx(8.0) and -t == pytest.approx(8.0) for s, t in scores)


def test_the_gate_requires_save_model_where_the_task_scores_the_model():
    from ralph_ray.gate import MODEL_CALLS, GateError, check_required_calls

    source = (PROJECT_ROOT / "trainers" / "lm" / "train.py").read_text()
    check_required_calls(source, "train.py", MODEL_CALLS)
    dropped = "\n".join(line for line in source.splitlines() if "harness.save_model(" not in line)
    check_required_calls(dropped, "train.py")  # a task scored by its predictions does not ask for it
    with pytest.raises(GateError, match=r"harness\.save_model"):
        check_required_calls(dropped, "train.py", MODEL_CALLS)
