"""Does a trainer forked ahead start with CUDA up? (device diagnostic; prints, writes nothing)

Runs trainers through the runner's warm path (sandbox none, as on the device): the first starts the server, the
next ones are handed its spare (`trial.prestart`) or forked on request. Each reports, at its first line, how long
ago its process was forked, whether CUDA was already initialised, and what its first CUDA tensor then cost.
    python bench/device/prestart_check.py
"""

import tempfile
import time
from pathlib import Path

from ralph_ray import warmstart
from ralph_ray.runner import Limits, Status, Trainer, run
from ralph_ray.sandbox import Policy, SandboxMode
from ralph_ray.tasks.base import write_public
from ralph_ray.tasks.digits import prepare
from ralph_ray.workdir import write_variant

SOURCE = """import os, time
ticks = os.sysconf("SC_CLK_TCK")
born = int(open("/proc/self/stat").read().rsplit(")", 1)[1].split()[19]) / ticks
age = float(open("/proc/uptime").read().split()[0]) - born
import torch
up = torch.cuda.is_initialized()
t0 = time.perf_counter()
x = torch.zeros(256, 256, device="cuda")
(x @ x).sum().item()
first = time.perf_counter() - t0
from ralph_ray import harness
harness.report(epoch=1, val_acc=0.1, age=age, cuda_up=float(up), first_cuda_s=first)
"""

root = Path(tempfile.mkdtemp(prefix="prestart-"))
public = root / "public"
write_public(prepare(0, 0.2, 0.2), public, "digits")
print("trainer, prestart, forked s before its first line, CUDA up at its first line, first CUDA op s, wall s")
for index, prestart in enumerate([True, True, True, False, True, False]):
    time.sleep(2.0)  # the trial before would be training now: the spare starts CUDA meanwhile
    work = root / "trials" / f"t{index}"
    write_variant({"train.py": SOURCE.encode()}, work)
    start = time.perf_counter()
    outcome = run(Trainer(work, public), Limits(60, sandbox=Policy(SandboxMode.none), warm=True, prestart=prestart))
    wall = time.perf_counter() - start
    if outcome.status is not Status.finished:
        print(index, prestart, "failed:", outcome.reason)
        continue
    last = outcome.last
    print(index, prestart, round(last["age"], 3), bool(last["cuda_up"]), round(last["first_cuda_s"], 3), round(wall, 3))
print("cold reason:", warmstart.reason())
warmstart.close_all()
