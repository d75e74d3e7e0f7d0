"""Seed trainer for Fashion-MNIST: a plain two-conv CNN, as plain as the 2-conv rows of the dataset's table.

An honest baseline on purpose (no normalisation layers, no augmentation, a constant learning rate, a few epochs)
so a campaign visibly improves it; the published table's 2-conv nets score 0.876-0.916 test accuracy, its best
small CNNs 0.939. An epoch over the 45,000 training images (50,000 minus VAL_FRACTION) costs about 20 s of CPU
time on one core of the 2-core development machine (0.865 selection accuracy after one epoch). The images stay on
the trial's device as one uint8 tensor and batches are cut from it by index (no DataLoader), so on a GPU nothing
waits on Python, and an augmentation an agent adds runs there in whole batches.
Under a time budget (trial.budget_s) it trains until the deadline instead of for EPOCHS (its learning rate is
constant), stopping mid-epoch when the budget runs out, so a trial on a busy machine still scores.
As N data-parallel workers (resources.workers_per_trial=N) the harness helpers join the group, give each worker
its shard of train and wrap the model in DDP; alone they do nothing.
Run by hand: `python -m ralph_ray.prepare task=fashion` then `RALPH_DATA_DIR=... python train.py`.
"""

import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from ralph_ray import harness

# -----------------------------------------------------------------------------
# Knobs (the engine rewrites these constants in each trial's copy)
LR = 0.03  # SGD learning rate
MOMENTUM = 0.9  # SGD momentum
WEIGHT_DECAY = 0.0  # L2 penalty
BATCH_SIZE = 128  # examples per step
EPOCHS = 4  # passes over the train split (ignored under a time budget)
WIDTH = 16  # channels of the first conv layer (the second has twice as many)
DROPOUT = 0.0  # dropout before the classifier
VAL_FRACTION = 0.1  # share of train carved out for per-epoch validation
STOP_MARGIN = 0.1  # under a time budget: share of it left for the last evaluation and the predictions

# -----------------------------------------------------------------------------
# Model


class Net(nn.Module):
    """Two 3x3 conv layers, each followed by 2x2 max pooling, and a linear classifier."""

    def __init__(self, width: int, num_classes: int, dropout: float) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, width, 3, padding=1)
        self.conv2 = nn.Conv2d(width, 2 * width, 3, padding=1)
        self.drop = nn.Dropout(dropout)
        self.fc = nn.Linear(2 * width * 7 * 7, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc(self.drop(x.flatten(1)))


# -----------------------------------------------------------------------------
# Helpers


def to_device(images: np.ndarray, device: str) -> torch.Tensor:
    """uint8 images (N, 1, 28, 28) onto the device, kept as bytes (a quarter of float32's memory)."""
    return torch.tensor(np.asarray(images), device=device)  # a copy: the public data is memory-mapped read-only


def as_input(images: torch.Tensor) -> torch.Tensor:
    """A batch of uint8 images as the model's float input in [0, 1]."""
    return images.float().div_(255.0)


def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    """Loss and accuracy on a labelled split (in chunks, to bound memory)."""
    model.eval()
    loss, correct = 0.0, 0
    with torch.no_grad():
        for i in range(0, len(x), 1000):
            logits = model(as_input(x[i : i + 1000]))
            loss += F.cross_entropy(logits, y[i : i + 1000], reduction="sum").item()
            correct += (logits.argmax(1) == y[i : i + 1000]).sum().item()
    return loss / len(x), correct / len(x)


def predict(model: nn.Module, x: torch.Tensor) -> np.ndarray:
    """Class predictions for unlabelled inputs."""
    model.eval()
    with torch.no_grad():
        return torch.cat([model(as_input(x[i : i + 1000])).argmax(1) for i in range(0, len(x), 1000)]).cpu().numpy()


def grad_norm(model: nn.Module) -> float:
    """Global L2 norm of the current gradients."""
    norms = [p.grad.detach().norm() for p in model.parameters() if p.grad is not None]
    return torch.stack(norms).norm().item() if norms else 0.0


def out_of_time() -> bool:
    """Under a time budget: whether to stop now, mid-epoch, keeping STOP_MARGIN of it to evaluate and predict."""
    budget = harness.budget_s()
    return budget is not None and harness.time_left() < STOP_MARGIN * budget


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
    device = harness.device()
    data = harness.load_data()
    x_all = to_device(data.train_x, device)
    y_all = torch.tensor(np.asarray(data.train_y), dtype=torch.long, device=device)
    perm = torch.randperm(len(x_all), generator=torch.Generator().manual_seed(seed)).to(device)
    n_val = int(len(x_all) * VAL_FRACTION)
    x_val, y_val = x_all[perm[:n_val]], y_all[perm[:n_val]]
    x_train, y_train = x_all[perm[n_val:]], y_all[perm[n_val:]]
    mine = torch.from_numpy(harness.shard(len(x_train))).to(device)  # this worker's share (all of it, alone)
    x_train, y_train = x_train[mine], y_train[mine]
    batch = max(1, BATCH_SIZE // harness.world_size())  # BATCH_SIZE stays the global batch

    model = Net(WIDTH, data.num_classes, DROPOUT).to(device)
    model = harness.wrap(model)  # DistributedDataParallel across workers; the net itself in a single trial
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM, weight_decay=WEIGHT_DECAY)
    first_epoch = resume(model, optimizer)

    timed = harness.budget_s() is not None  # the same on every worker: they all ask (or none does) each step
    for epoch in harness.epochs(EPOCHS):
        if epoch < first_epoch:
            continue  # trained before this trial was retried on another node
        start = time.perf_counter()
        model.train()
        order = torch.randperm(len(x_train)).to(device)
        total_loss, norm_sum, steps = 0.0, 0.0, 0
        for i in range(0, len(order), batch):
            if steps and timed and harness.any_across(out_of_time()):  # every worker stops at the same step
                break  # a slow (busy) machine: a partial epoch scores, an epoch past the budget does not
            idx = order[i : i + batch]
            loss = F.cross_entropy(model(as_input(x_train[idx])), y_train[idx])
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
        if harness.any_across(out_of_time()):
            break

    selection = to_device(data.selection_x, device)
    test = to_device(data.test_x, device)
    harness.save_predictions(selection=predict(model, selection), test=predict(model, test))


if __name__ == "__main__":
    main()
