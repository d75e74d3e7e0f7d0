"""Scoring an exported model, for a task whose returned predictions can't be trusted (a language model).

Such a task's METRIC says `"scored_by": "model"`. Its trainer exports the model with `harness.save_model` (a
`torch.export` program: no trainer code is needed to load it). When the trainer has finished, the trial runs the
engine's frozen evaluator (`ralph_ray/model_evaluator.py`) on that model, in a process of its own, sandboxed like
the trial and on the trial's node (a big model never travels); its outputs on the selection and test inputs become
the trial's predictions, which the driver scores with the task's frozen metric. The trainer's own predictions and
reported losses are never scored, and it has exited before its model is evaluated.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

from ralph_ray import harness
from ralph_ray.runner import Limits, Status, Trainer, TrialFailed, run

EVALUATOR = Path(__file__).with_name("model_evaluator.py")
EVAL_DIR = "model_eval"  # under the trial's work dir: the evaluator's own folder
ENTRY = "evaluate.py"


def evaluate(work: Path, data_dir: Path, limits: Limits, seed: int = 0) -> Path:
    """Run the frozen evaluator on the trainer's exported model; returns its predictions file (raises TrialFailed)."""
    model = work / harness.MODEL_FILE
    if not model.is_file():
        raise TrialFailed(
            f"this task is scored by its model, and train.py saved none: call harness.save_model(model, "
            f"example_inputs) at the end (it writes {harness.MODEL_FILE}; see the task's program.md)"
        )
    folder = work / EVAL_DIR
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir()
    shutil.copy2(model, folder / harness.MODEL_FILE)
    shutil.copy2(EVALUATOR, folder / ENTRY)
    outcome = run(Trainer(folder, data_dir, ENTRY, seed), dataclasses.replace(limits, budget_s=None))
    if outcome.status is not Status.finished or outcome.predictions is None:
        reason = (outcome.reason or "it saved no outputs").replace("train.py", ENTRY)
        raise TrialFailed(f"the engine's evaluation of {harness.MODEL_FILE} failed: {reason}")
    return outcome.predictions
