"""Seed trainer: a small MLP classifier. The engine's agents edit this file; the knobs below are searched.

YOUR MODEL GOES HERE: replace `Net` (and the loop, if you like). Keep the harness calls: load_data(), report()
once per epoch, save_predictions() at the end. Run by hand: `python -m ralph_ray.prepare task=./<this folder>`,
then the `export RALPH_DATA_DIR=...` line it prints, then `python train.py`.
"""

import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from ralph_ray import harness

# -----------------------------------------------------------------------------
# Knobs (the engine rewrites these constants in each trial's copy)
LR = 0.01  # Adam learning rate
WEIGHT_DECAY = 0.0  # L2 penalty
BATCH_SIZE = 32  # examples per step
EPOCHS = 8  # passes over the train split (ignored under a time budget)
WIDTH = 32  # hidden units
VAL_FRACTION = 0.15  # share of train carved out for per-epoch validation

# -----------------------------------------------------------------------------
# Model


class Net(nn.Module):
    """One hidden ReLU layer and a linear classifier (inputs are flattened)."""

    def __init__(self, features: int, width: int, num_classes: int) -> None:
        super().__init__()
        self.hidden = nn.Linear(features, width)
        self.out = nn.Linear(width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(F.relu(self.hidden(x.flatten(1))))


# -----------------------------------------------------------------------------
# Training


def main() -> None:
    seed = harness.seed()
    torch.manual_seed(seed)
    data = harness.load_data()
    x_all = torch.tensor(np.asarray(data.train_x), dtype=torch.float32)
    y_all = torch.tensor(np.asarray(data.train_y), dtype=torch.long)
    perm = torch.randperm(len(x_all), generator=torch.Generator().manual_seed(seed))
    n_val = max(1, int(len(x_all) * VAL_FRACTION))
    x_val, y_val = x_all[perm[:n_val]], y_all[perm[:n_val]]
    x_train, y_train = x_all[perm[n_val:]], y_all[perm[n_val:]]

    model = Net(x_all[0].numel(), WIDTH, data.num_classes)
    optimizer = torch.optim.Adam(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)

    for epoch in harness.epochs(EPOCHS):
        start = time.perf_counter()
        model.train()
        order = torch.randperm(len(x_train))
        total_loss, steps = 0.0, 0
        for i in range(0, len(order), BATCH_SIZE):
            idx = order[i : i + BATCH_SIZE]
            loss = F.cross_entropy(model(x_train[idx]), y_train[idx])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            total_loss += loss.item()
            steps += 1
        model.eval()
        with torch.no_grad():
            logits = model(x_val)
            val_loss, val_acc = F.cross_entropy(logits, y_val).item(), (logits.argmax(1) == y_val).float().mean().item()
        harness.report(
            epoch=epoch,
            train_loss=total_loss / steps,
            val_loss=val_loss,
            val_acc=val_acc,
            lr=optimizer.param_groups[0]["lr"],
            epoch_seconds=time.perf_counter() - start,
        )

    model.eval()
    with torch.no_grad():
        predict = lambda x: model(torch.tensor(np.asarray(x), dtype=torch.float32)).argmax(1).numpy()  # noqa: E731
        harness.save_predictions(selection=predict(data.selection_x), test=predict(data.test_x))


if __name__ == "__main__":
    main()
