"""Frozen: task=grpo's data, its base policy and its metric (python -m ralph_ray task=grpo). The engine runs it on the
driver only; trials never see this file, the held-out problems or their answers.

The task: two-digit addition ("37+48=" -> "85"). `prepare` splits the 10,000 problems into train (prompts and
answers, given to the trial), selection and test (200 each, kept by the engine; the trial gets a placeholder
input, so it can't even train on the held-out prompts; the split is fixed by the base policy's spec, not by
task.split_seed, since the base is pre-trained on the train part), and builds the base policy the trainer post-trains: a
tiny Llama pre-trained briefly here (`ralph_ray.tasks.tinypolicy`, cached), shipped as the public file
base_policy.zip. task=kto shares all of it (the same spec, splits and score): only the trainer differs.

How scoring stays honest: the trainer's predictions are its policy's weights (one vector, the base
architecture's parameter order); `score` loads them into the frozen architecture and generates greedily from
the held-out prompts, here, and counts exact answers. A trainer that writes anything else gets no score.
"""

from __future__ import annotations

import numpy as np

from ralph_ray.tasks import tinypolicy
from ralph_ray.tasks.base import DataSource, Splits, TaskSettings

METRIC = dict(tinypolicy.METRIC)  # the same metric as every post-training task
SPEC = tinypolicy.PolicySpec()  # the base policy's architecture and pre-training


def prepare(settings: TaskSettings, data: DataSource) -> Splits:
    """Train prompts and answers as text, the held-out pairs as the engine's targets, the base policy as a file."""
    return tinypolicy.task_splits(SPEC)


def score(predictions: np.ndarray, targets: np.ndarray) -> float:
    """Exact-match accuracy of the policy's greedy completions of the held-out prompts."""
    return tinypolicy.task_score(SPEC, predictions, targets)
