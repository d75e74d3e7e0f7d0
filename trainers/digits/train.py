"""Seed trainer for digits: a small, plain CNN on scikit-learn's 8x8 digits.

An honest baseline on purpose (no batch norm, no augmentation, a short fixed schedule) so a campaign
can visibly improve it. One epoch takes well under a second on one CPU core. Under a time budget
(trial.budget_s) it trains until the deadline instead of for EPOCHS (its learning rate is constant).
Run by hand: `python -m ralph_ray.prepare` then `RALPH_DATA_DIR=... python train.py`.
"""

import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from ralph_ray import harness

# -----------------------------------------------------------------------------
# Knobs (the engine rewrites these constants in each trial's copy)
LR = 0.05  # SGD learning rate
MOMENTUM = 0.9  # SGD momentum
WEIGHT_DECAY = 0.0  # L2 penalty
BATCH_SIZE = 64  # examples per step
EPOCHS = 12  # passes over the train split (ignored under a time budget)
WIDTH = 16  # channels of the first conv layer
DROPOUT = 0.0  # dropout before the classifier
VAL_FRACTION = 0.15  # share of train carved out for per-epoch validation

# -----------------------------------------------------------------------------
# Model


class Net(nn.Module):
    """Two 3x3 conv layers, one pooling step, a linear classifier."""

    def __init__(self, width: int, num_classes: int, dropout: float) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, width, 3, padding=1)
        self.conv2 = nn.Conv2d(width, 2 * width, 3, padding=1)
        self.drop = nn.Dropout(dropout)
        self.fc = nn.Linear(2 * width * 4 * 4, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc(self.drop(x.flatten(1)))


# -----------------------------------------------------------------------------
# Helpers


def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    """Loss and accuracy on a labelled split."""
    model.eval()
    with torch.no_grad():
        logits = model(x)
        return F.cross_entropy(logits, y).item(), (logits.argmax(1) == y).float().mean().item()


def predict(model: nn.Module, x: torch.Tensor) -> np.ndarray:
    """Class predictions for unlabelled inputs."""
    model.eval()
    with torch.no_grad():
        return model(x).argmax(1).cpu().numpy()


def grad_norm(model: nn.Module) -> float:
    """Global L2 norm of the current gradients."""
    norms = [p.grad.detach().norm() for p in model.parameters() if p.grad is not None]
    return torch.stack(norms).norm().item() if norms else 0.0


def resume(model: nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """Restore a retried trial's last checkpoint; returns the first epoch still to run (1 on a fresh start)."""
    state = harness.load_checkpoint()
    if state is None:
        return 1
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    for group in optimizer.param_groups:  # this run's knobs, not the saved ones (PBT may have perturbed them)
        group.update(lr=LR, momentum=MOMENTUM, weight_decay=WEIGHT_DECAY)
    torch.set_rng_state(state["rng"])  # the same batches as a run that was never interrupted
    return state["epoch"] + 1


# -----------------------------------------------------------------------------
# Training


def main() -> None:
    harness.init_distributed()  # a data-parallel trial's process group (a single trial: nothing)
    seed = harness.seed()
    torch.manual_seed(seed)
    data = harness.load_data()
    x_all = torch.tensor(np.asarray(data.train_x), dtype=torch.float32)
    y_all = torch.tensor(np.asarray(data.train_y), dtype=torch.long)
    perm = torch.randperm(len(x_all), generator=torch.Generator().manual_seed(seed))
    n_val = int(len(x_all) * VAL_FRACTION)
    x_val, y_val = x_all[perm[:n_val]], y_all[perm[:n_val]]
    x_train, y_train = x_all[perm[n_val:]], y_all[perm[n_val:]]
    mine = torch.from_numpy(harness.shard(len(x_train)))  # this worker's share (all of it in a single trial)
    x_train, y_train = x_train[mine], y_train[mine]
    batch = max(1, BATCH_SIZE // harness.world_size())  # BATCH_SIZE stays the global batch

    model = Net(WIDTH, data.num_classes, DROPOUT)
    model = harness.wrap(model)  # DistributedDataParallel across workers; the net itself in a single trial
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM, weight_decay=WEIGHT_DECAY)
    first_epoch = resume(model, optimizer)

    for epoch in harness.epochs(EPOCHS):
        if epoch < first_epoch:
            continue  # trained before this trial was retried on another node
        start = time.perf_counter()
        model.train()
        order = torch.randperm(len(x_train))
        total_loss, norm_sum, steps = 0.0, 0.0, 0
        for i in range(0, len(order), batch):
            idx = order[i : i + batch]
            loss = F.cross_entropy(model(x_train[idx]), y_train[idx])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            norm_sum += grad_norm(model)
            optimizer.step()
            total_loss += loss.item()
            steps += 1
        val_loss, val_acc = evaluate(model, x_val, y_val)
        harness.save_checkpoint(
            {
                "epoch": epoch,
                "model": model.state_dict(),
                "optimizer": optimizer.state_dict(),
                "rng": torch.get_rng_state(),
            }
        )
        harness.report(
            epoch=epoch,
            train_loss=harness.mean_across(total_loss / steps),
            val_loss=val_loss,
            val_acc=val_acc,
            lr=optimizer.param_groups[0]["lr"],
            grad_norm=norm_sum / steps,
            epoch_seconds=time.perf_counter() - start,
        )

    selection = torch.tensor(np.asarray(data.selection_x), dtype=torch.float32)
    test = torch.tensor(np.asarray(data.test_x), dtype=torch.float32)
    harness.save_predictions(selection=predict(model, selection), test=predict(model, test))


if __name__ == "__main__":
    main()
