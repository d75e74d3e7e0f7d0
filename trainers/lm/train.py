"""Seed trainer: a small byte-level language model (an MLP over the last few bytes, as in Bengio et al. 2003).
The engine's agents edit this file; the knobs are searched.

The seed of task=lm: small on purpose, so a campaign on CPU takes minutes. Keep the harness calls: load_data(), report()
once per epoch, save_model() at the end (the engine runs the exported model on the held-out contexts and scores
its next-byte logits), and save_predictions() with the logits it gives (checked by the gate's smoke run, not scored).
Run by hand: `python -m ralph_ray.prepare task=lm`, then the `export RALPH_DATA_DIR=...` line it prints, then
`python train.py`.
"""

import math
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from ralph_ray import harness

# -----------------------------------------------------------------------------
# Knobs (the engine rewrites these constants in each trial's copy)
LR = 0.003  # Adam learning rate
BATCH_SIZE = 128  # windows per step
WINDOW = 8  # bytes the model looks back (at most the task's context, 64)
STEPS_PER_EPOCH = 100  # optimizer steps per epoch
EPOCHS = 4  # epochs (ignored under a time budget)
EMBED = 16  # byte embedding size
HIDDEN = 128  # hidden units
VAL_BYTES = 20_000  # bytes at the end of the train text kept for per-epoch validation

# -----------------------------------------------------------------------------
# Model


class Net(nn.Module):
    """Embeddings of the last WINDOW bytes, one hidden layer, logits over the 256 next-byte values."""

    def __init__(self, window: int, embed: int, hidden: int) -> None:
        super().__init__()
        self.window = window
        self.embed = nn.Embedding(256, embed)
        self.hidden = nn.Linear(window * embed, hidden)
        self.head = nn.Linear(hidden, 256)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.hidden(self.embed(x[:, -self.window :]).flatten(1))))


# -----------------------------------------------------------------------------
# Training


def batch(stream: torch.Tensor, size: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Random windows of the text and the byte after each."""
    starts = torch.randint(0, len(stream) - WINDOW - 1, (size,), generator=generator)
    rows = stream[starts[:, None] + torch.arange(WINDOW + 1)]
    return rows[:, :-1], rows[:, -1]


def main() -> None:
    seed = harness.seed()
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    data = harness.load_data()
    # Train rows are contexts and their next byte: side by side, row after row, they are the text itself.
    text = np.concatenate([np.asarray(data.train_x), np.asarray(data.train_y)[:, None]], axis=1).reshape(-1)
    stream = torch.tensor(text.astype(np.int64))
    val_bytes = min(VAL_BYTES, len(stream) // 5)  # a short text (the gate's smoke sliver) keeps 4/5 to train on
    train, val = stream[:-val_bytes], stream[-val_bytes:]

    model = Net(WINDOW, EMBED, HIDDEN)
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    for epoch in harness.epochs(EPOCHS):
        start = time.perf_counter()
        model.train()
        total = 0.0
        for _ in range(STEPS_PER_EPOCH):
            x, y = batch(train, BATCH_SIZE, generator)
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            total += loss.item()
        model.eval()
        with torch.no_grad():
            x, y = batch(val, 4096, torch.Generator().manual_seed(0))
            val_loss = F.cross_entropy(model(x), y).item()
        harness.report(
            epoch=epoch,
            train_loss=total / STEPS_PER_EPOCH / math.log(2),
            val_loss=val_loss / math.log(2),
            lr=optimizer.param_groups[0]["lr"],
            epoch_seconds=time.perf_counter() - start,
        )  # bits per byte

    model.eval()
    with torch.no_grad():
        predict = lambda x: model(torch.tensor(np.asarray(x).astype(np.int64))).numpy()  # noqa: E731
        harness.save_predictions(selection=predict(data.selection_x), test=predict(data.test_x))
    harness.save_model(model, torch.tensor(np.asarray(data.train_x[:8]).astype(np.int64)))  # what the engine scores


if __name__ == "__main__":
    main()
