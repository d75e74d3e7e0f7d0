"""Frozen: task=kto's data, its base policy and its metric (python -m ralph_ray task=kto). The engine runs it on the
driver only; trials never see this file, the held-out problems or their answers.

The same task as task=grpo, owned by `ralph_ray.tasks.tinypolicy` (one implementation of both): two-digit addition
("37+48=" -> "85"), 9,600 train problems given to the trial, 200 selection and 200 test problems kept by the engine,
and the tiny pre-trained Llama shipped as the public file base_policy.zip. Only the trainer differs (KTO, not GRPO).

How scoring stays honest: the trainer's predictions are its policy's weights (one vector, the base
architecture's parameter order); `score` loads them into the frozen architecture and generates greedily from
the held-out prompts, here, and counts exact answers. A trainer that writes anything else gets no score.
"""

from __future__ import annotations

import numpy as np

from ralph_ray.tasks import tinypolicy
from ralph_ray.tasks.base import DataSource, Splits, TaskSettings

METRIC = dict(tinypolicy.METRIC)  # the same metric as every post-training task
SPEC = tinypolicy.PolicySpec()  # the same base as task=grpo (the same cache entry)


def prepare(settings: TaskSettings, data: DataSource) -> Splits:
    """Train prompts and answers as text, the held-out pairs as the engine's targets, the base policy as a file."""
    return tinypolicy.task_splits(SPEC)


def score(predictions: np.ndarray, targets: np.ndarray) -> float:
    """Exact-match accuracy of the policy's greedy completions of the held-out prompts."""
    return tinypolicy.task_score(SPEC, predictions, targets)
