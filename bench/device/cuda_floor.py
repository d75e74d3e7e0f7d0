"""What a fresh GPU process pays before and after its useful work, whatever the trainer (device diagnostic; prints).

A parent imports torch as the fork server does (`warmstart.PRELOAD`), then forks N children one after another; each
is what a warm trial is, a fresh process with no CUDA context, and times its first CUDA steps on the CIFAR seed's
shapes: the context, a 3.2-GB allocation (about the trial's peak), the first cuBLAS matmul (whitening's covariance;
with the first randn), the first cuDNN convolution forward in bf16 channels-last (with the input's and the
optimizer's creation), its backward (the weight gradient only), the first SGD step, then the same step again
(steady). The parent times the child's exit, from its last message to `waitpid` (the context's teardown).
    python bench/device/cuda_floor.py [children=5]
"""

import json
import os
import statistics
import sys
import time

import torch
import torch._dynamo  # noqa: F401 - the fork server preloads it
import torch.nn.functional as F

STEPS = (
    "context",
    "allocate 3.2 GB",
    "first cuBLAS matmul",
    "first conv forward",
    "first conv backward (weight gradient)",
    "first SGD step",
    "steady step",
)


def child(write_fd: int) -> None:
    """Time the steps in this fresh process; send them to the parent, then exit as a trainer does."""
    marks: list[float] = []
    began = time.perf_counter()

    def mark() -> None:
        torch.cuda.synchronize()
        marks.append(time.perf_counter() - began)

    torch.zeros(1, device="cuda")
    mark()
    block = torch.empty(int(3.2e9), dtype=torch.uint8, device="cuda")
    mark()
    patches = torch.randn(4_800_000, 12, device="cuda")
    _ = patches.T @ patches
    mark()
    x = torch.randn(1024, 64, 32, 32, device="cuda").to(memory_format=torch.channels_last)
    weight = torch.randn(64, 64, 3, 3, device="cuda", requires_grad=True)
    optimizer = torch.optim.SGD([weight], lr=0.01, momentum=0.85, nesterov=True)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out = F.conv2d(x, weight, padding=1)
    mark()
    out.float().square().mean().backward()
    mark()
    optimizer.step()
    mark()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out = F.conv2d(x, weight, padding=1)
    out.float().square().mean().backward()
    optimizer.step()
    mark()
    del block
    steps = [b - a for a, b in zip([0.0, *marks], marks)]
    os.write(write_fd, json.dumps(steps).encode())
    os._exit(0)


def main() -> None:
    children = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    rows, exits, forks = [], [], []
    for _ in range(children):
        read_fd, write_fd = os.pipe()
        asked = time.perf_counter()
        pid = os.fork()
        if pid == 0:
            os.close(read_fd)
            child(write_fd)
        os.close(write_fd)
        message = os.read(read_fd, 65536)
        told = time.perf_counter()
        os.waitpid(pid, 0)
        exits.append(time.perf_counter() - told)
        os.close(read_fd)
        rows.append(json.loads(message))
        forks.append(told - asked - sum(rows[-1]))
    print(
        f"{children} fresh children forked from a parent with torch imported ({torch.cuda.get_device_name()}, "
        f"torch {torch.__version__}); median s (each child's values):"
    )
    for i, name in enumerate(STEPS):
        values = [row[i] for row in rows]
        print(f"{name:24s} {statistics.median(values):7.3f}   {' '.join(f'{v:.3f}' for v in values)}")
    print(f"{'fork and the rest':24s} {statistics.median(forks):7.3f}   {' '.join(f'{v:.3f}' for v in forks)}")
    print(f"{'exit (teardown)':24s} {statistics.median(exits):7.3f}   {' '.join(f'{v:.3f}' for v in exits)}")
    first = [sum(row[:-1]) for row in rows]
    print(
        f"before the steady step: median {statistics.median(first):.3f} s; plus exit "
        f"{statistics.median(first) + statistics.median(exits):.3f} s a trial, whatever it trains"
    )


if __name__ == "__main__":
    main()
