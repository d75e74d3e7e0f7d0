"""Frozen: the lm task's splits and metric (python -m ralph_ray task=lm). The engine runs it on the driver only;
trials never see this file, and never see the bytes they are scored on.

How scoring stays honest: the selection/test inputs are contexts of CONTEXT bytes cut from held-out text with a
gap of one byte between them; the model predicts a distribution over the next byte (the gap), which appears in
no input, and the engine scores it in bits per byte (lower is better) with `score` below. The engine, not the
trainer, runs the model on those contexts: the trainer exports it with harness.save_model, and the engine's frozen
evaluator (ralph_ray/model_evaluator.py) computes the logits in a sandboxed process of its own.

The corpus is the Python standard library's own source: the top-level modules of the running Python's stdlib, in
sorted order, the first 1.2 MB (always on the machine, offline; its exact bytes, and so the figures, depend on the
Python version). Caveat: that text is also readable by a trial (the sandbox shows the Python installation), so a
trainer written to search it could look up held-out contexts; use a corpus under data.root (hidden) for a contest.
"""

from __future__ import annotations

import sysconfig
from pathlib import Path

import numpy as np

from ralph_ray.tasks.base import DataSource, Splits, TaskSettings

# Scored by the model: the engine runs the trainer's exported model (harness.save_model) on the held-out contexts
# in a process of its own (ralph_ray.modeleval); the predictions a trainer saves itself count for nothing.
METRIC = {"name": "bits_per_byte", "direction": "min", "kind": "custom", "scored_by": "model"}
CONTEXT = 64  # bytes of context per selection/test input
CORPUS_BYTES = 1_200_000  # how much text to use
HELD_OUT = 512  # selection and test inputs each


def corpus() -> bytes:
    """The text to model, as bytes."""
    root = Path(sysconfig.get_paths()["stdlib"])
    text = bytearray()
    for path in sorted(root.glob("*.py")):  # the top-level modules, in a fixed order
        text += path.read_bytes()
        if len(text) >= CORPUS_BYTES:
            break
    return bytes(text[:CORPUS_BYTES])


def contexts(text: np.ndarray, count: int) -> tuple[np.ndarray, np.ndarray]:
    """`count` contexts of CONTEXT bytes, one byte apart, and the byte after each (in no context)."""
    rows = min(count, len(text) // (CONTEXT + 1))
    cut = text[: rows * (CONTEXT + 1)].reshape(rows, CONTEXT + 1)
    return np.ascontiguousarray(cut[:, :CONTEXT]), cut[:, CONTEXT].astype(np.int64)


def prepare(settings: TaskSettings, data: DataSource) -> Splits:
    """Train: the first part of the text as contexts + next bytes (concatenated row by row they are the text
    itself); selection and test: contexts from two held-out stretches at the end."""
    text = np.frombuffer(corpus(), dtype=np.uint8)
    held = HELD_OUT * (CONTEXT + 1)
    train_x, train_y = contexts(text[: len(text) - 2 * held], len(text))
    selection_x, selection_y = contexts(text[len(text) - 2 * held : len(text) - held], HELD_OUT)
    test_x, test_y = contexts(text[len(text) - held :], HELD_OUT)
    return Splits(
        train_x=train_x,
        train_y=train_y,
        selection_x=selection_x,
        selection_y=selection_y,
        test_x=test_x,
        test_y=test_y,
        num_classes=256,
    )


def score(predictions: np.ndarray, targets: np.ndarray) -> float:
    """Bits per byte: the mean negative log2-probability the predicted next-byte logits (N, 256) give the true byte."""
    logits = np.asarray(predictions, dtype=np.float64)
    if logits.ndim != 2 or logits.shape[1] != 256:
        raise ValueError(f"expected next-byte logits of shape (N, 256), got {logits.shape}")
    top = logits.max(axis=1, keepdims=True)
    log_norm = top[:, 0] + np.log(np.exp(logits - top).sum(axis=1))
    return float(np.mean(log_norm - logits[np.arange(len(targets)), targets]) / np.log(2.0))
