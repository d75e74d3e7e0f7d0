"""Frozen: task=grpo's data, its base policy and its metric (python -m ralph_ray task=grpo). The engine runs it on the
driver only; trials never see this file, the held-out problems or their answers.

The task: two-digit addition ("37+48=" -> "85"). `prepare` splits the 10,000 problems into train (prompts and
answers, given to the trial), selection and test (200 each, kept by the engine; the trial gets a placeholder
input, so it can't even train on the held-out prompts; the split is fixed by the base policy's spec, not by
task.split_seed, since the base is pre-trained on the train part), and builds the base policy the trainer post-trains: a
tiny Llama pre-trained briefly here (`ralph_ray.tasks.tinypolicy`, cached), shipped as the public file
base_policy.zip.

How scoring stays honest: the trainer's predictions are its policy's weights (one vector, the base
architecture's parameter order); `score` loads them into the frozen architecture and generates greedily from
the held-out prompts, here, and counts exact answers. A trainer that writes anything else gets no score.
"""

from __future__ import annotations

import numpy as np

from ralph_ray.tasks import tinypolicy
from ralph_ray.tasks.base import DataSource, Splits, TaskSettings

METRIC = {"name": "exact_match", "direction": "max", "kind": "custom"}
SPEC = tinypolicy.PolicySpec()  # the base policy's architecture and pre-training


def prepare(settings: TaskSettings, data: DataSource) -> Splits:
    """Train prompts and answers as text, the held-out pairs as the engine's targets, the base policy as a file."""
    train, selection, test = tinypolicy.split_problems(SPEC)
    base = tinypolicy.base_policy(SPEC)
    placeholder = np.zeros((1, 1), dtype=np.int64)  # one "input": the policy is scored as a whole
    return Splits(
        train_x=np.array([p for p, _ in train]),
        train_y=np.array([a for _, a in train]),
        selection_x=placeholder,
        selection_y=np.array([selection]),  # (1, held-out problems, 2): prompt, answer
        test_x=placeholder,
        test_y=np.array([test]),
        files={tinypolicy.POLICY_ZIP: tinypolicy.zip_folder(base)},
    )


def score(predictions: np.ndarray, targets: np.ndarray) -> float:
    """Exact-match accuracy of the policy's greedy completions of the held-out prompts."""
    vector = np.asarray(predictions, dtype=np.float64)
    if vector.ndim != 2 or vector.shape[0] != 1:
        raise ValueError(f"expected the policy's weights as one row (1, N), got shape {vector.shape}")
    model, tok = tinypolicy.with_vector(tinypolicy.base_policy(SPEC), vector[0])
    return tinypolicy.exact_match(model, tok, np.asarray(targets)[0])
