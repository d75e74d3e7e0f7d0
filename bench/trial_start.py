"""Trial start cost, warm vs cold, side by side in one run: from the runner's request to train.py's first line.

Each trial is the runner's (`ralph_ray.runner.run`, the same call Tune's trainable makes) on a digits-shaped
trainer that stamps the time on its first line, after its imports (torch, numpy, the harness) and after its first
optimizer (which imports torch._dynamo: warmstart.PRELOAD has it since 2026-11-27), inside
the sandbox (bwrap) with one thread. Cold and warm trials alternate so machine load hits both alike; the warm
server's own start (the first warm trial of a worker pays it) is reported apart. Prints the medians and the ratio.
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import save

from ralph_ray import sandbox, warmstart
from ralph_ray.runner import Limits, Status, Trainer, run
from ralph_ray.sandbox import Policy, SandboxMode
from ralph_ray.tasks.base import write_public
from ralph_ray.tasks.digits import prepare
from ralph_ray.workdir import write_variant

ROUNDS = 8
TRAINER = """import time
FIRST_LINE = time.time()
import numpy as np
import torch
from ralph_ray import harness
data = harness.load_data()
imported = time.time()
torch.optim.SGD(torch.nn.Linear(64, 10).parameters(), lr=0.1)  # the first optimizer imports torch._dynamo
optimizer = time.time()
if torch.cuda.is_available():  # on a GPU node: CUDA's start is part of every trial's start (not warm: see zygote)
    torch.zeros(1, device="cuda").add_(1).cpu()
harness.report(
    epoch=1, val_acc=0.1, first_line=FIRST_LINE, imported=imported, optimizer=optimizer, cuda_ready=time.time()
)
"""


def one(root: Path, data: Path, name: str, policy: Policy, warm: bool) -> tuple[float, ...]:
    """(request -> first line, -> imports done, -> exit seen, -> CUDA ready (= optimizer where no GPU), -> the first
    optimizer built) in seconds."""
    work = root / "trials" / name
    write_variant({"train.py": TRAINER.encode()}, work)
    start = time.time()
    outcome = run(Trainer(work, data), Limits(300, sandbox=policy, warm=warm))
    done = time.time()
    if outcome.status is not Status.finished or outcome.last is None:
        sys.exit(f"{name}: {outcome.reason}")
    last = outcome.last
    return (
        last["first_line"] - start,
        last["imported"] - start,
        done - start,
        last["cuda_ready"] - start,
        last["optimizer"] - start,
    )


def main() -> None:
    policy = Policy(SandboxMode.bwrap if sandbox.available() is None else SandboxMode.none)
    # The GPU's name from nvidia-smi, not torch: this process must not start CUDA before the trials do.
    gpu = (
        subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout.split("\n")[0]
        if shutil.which("nvidia-smi")
        else ""
    )
    root = Path(tempfile.mkdtemp(prefix="bench-trial-start-"))
    data = root / "data"
    write_public(prepare(0, 0.2, 0.2), data, "digits")
    start = time.time()
    server_first = one(root, data, "server", policy, warm=True)
    server_s = time.time() - start
    if warmstart.reason():
        sys.exit(f"warm starts did not work: {warmstart.reason()}")
    cold: list[tuple[float, ...]] = []
    warm: list[tuple[float, ...]] = []
    for index in range(ROUNDS):
        cold.append(one(root, data, f"cold{index}", policy, warm=False))
        warm.append(one(root, data, f"warm{index}", policy, warm=True))
    warmstart.close_all()
    median = lambda runs, i: statistics.median(r[i] for r in runs)  # noqa: E731
    figures = {
        "rounds": ROUNDS,
        "sandbox": policy.mode.value,
        "threads": 1,
        "cold_first_line_s": round(median(cold, 0), 3),
        "warm_first_line_s": round(median(warm, 0), 3),
        "cold_imports_done_s": round(median(cold, 1), 3),
        "warm_imports_done_s": round(median(warm, 1), 3),
        "cold_optimizer_built_s": round(median(cold, 4), 3),
        "warm_optimizer_built_s": round(median(warm, 4), 3),
        "cold_trial_wall_s": round(median(cold, 2), 3),
        "warm_trial_wall_s": round(median(warm, 2), 3),
        "ratio_first_line": round(median(warm, 0) / median(cold, 0), 3),
        "ratio_imports_done": round(median(warm, 1) / median(cold, 1), 3),
        "first_warm_trial_with_server_start_s": round(server_s, 2),
        "first_warm_trial_imports_done_s": round(server_first[1], 2),
    }
    if gpu:
        figures |= {
            "gpu": gpu,
            "cold_cuda_ready_s": round(median(cold, 3), 3),
            "warm_cuda_ready_s": round(median(warm, 3), 3),
            "ratio_cuda_ready": round(median(warm, 3) / median(cold, 3), 3),
        }
    lines = [
        f"trial start, {ROUNDS} cold and {ROUNDS} warm trials alternating (sandbox {policy.mode.value}, 1 thread), "
        "medians:",
        f"  request -> train.py's first line      cold {median(cold, 0):6.3f} s   warm {median(warm, 0):6.3f} s   "
        f"ratio {median(warm, 0) / median(cold, 0):.3f}",
        f"  request -> imports done (torch, data)  cold {median(cold, 1):6.3f} s   warm {median(warm, 1):6.3f} s   "
        f"ratio {median(warm, 1) / median(cold, 1):.3f}",
        f"  request -> first optimizer built       cold {median(cold, 4):6.3f} s   warm {median(warm, 4):6.3f} s   "
        f"ratio {median(warm, 4) / median(cold, 4):.3f}",
        f"  request -> exit seen (whole trial)     cold {median(cold, 2):6.3f} s   warm {median(warm, 2):6.3f} s",
        f"  the first warm trial of a worker also starts its server: {server_s:.2f} s",
    ]
    if gpu:
        lines.insert(
            -1,
            f"  request -> CUDA ready (first kernel)   cold {median(cold, 3):6.3f} s   warm {median(warm, 3):6.3f} s   "
            f"ratio {median(warm, 3) / median(cold, 3):.3f}   ({gpu})",
        )
    save("trial_start_gpu" if gpu else "trial_start", figures, lines)  # a GPU run beside the CPU figure, not over it


if __name__ == "__main__":
    main()
