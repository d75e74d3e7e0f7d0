"""The validation gate's smoke run, cold (a new interpreter imports torch) vs warm (forked from a server that has),
alone and beside busy cores the way the async breeder meets it: the gate at niceness +10, one CPU-bound process
per core at the trials' priority.

    python bench/gate_smoke.py [RUNS]      # RUNS smoke runs of the digits seed per setting (default 4)

Prints and records (bench/results/gate_smoke.md) the median seconds per smoke run and cold/warm as a ratio.
The warm server's own start (one `import torch`, once per campaign) is timed apart.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import save

from ralph_ray import PROJECT_ROOT, warmstart
from ralph_ray.gate import Gate, write_smoke_data
from ralph_ray.sandbox import Policy, SandboxMode, available
from ralph_ray.tasks.digits import prepare

RUNS = int(sys.argv[1]) if len(sys.argv) > 1 else 4
SEED = PROJECT_ROOT / "trainers" / "digits"
BREEDER_NICE = 10  # population.breeder_nice's default
BURN = "while True: pass"


def timed(gate: Gate, runs: int) -> list[float]:
    """Seconds of each of `runs` smoke runs of the seed."""
    seconds = []
    for _ in range(runs):
        start = time.monotonic()
        gate.smoke(SEED)
        seconds.append(time.monotonic() - start)
    return seconds


def main() -> None:
    root = Path(tempfile.mkdtemp(prefix="bench-smoke-"))
    smoke = write_smoke_data(prepare(0, 0.2, 0.2), root / "data_smoke", "digits")
    policy = Policy() if available() is None else Policy(mode=SandboxMode.none)  # no bubblewrap here: unsandboxed
    cold = Gate(smoke, ("LR",), timeout_s=600, sandbox=policy)
    warm = Gate(smoke, ("LR",), timeout_s=600, sandbox=policy, warm=True)
    start = time.monotonic()
    timed(warm, 1)  # starts the server: its import torch is paid once per campaign
    server_s = time.monotonic() - start
    results: dict[str, dict[str, float]] = {}
    for busy in (False, True):
        burners = []
        if busy:
            burners = [subprocess.Popen([sys.executable, "-c", BURN]) for _ in range(os.cpu_count() or 2)]
            # This thread as the breeder (what it starts inherits it); the warm server, started idle above, keeps
            # its niceness, so its forks are reniced by the runner as each trainer's group is (keep_niceness).
            os.setpriority(os.PRIO_PROCESS, 0, BREEDER_NICE)
        try:
            key = "busy cores, gate at +10" if busy else "idle machine"
            results[key] = {
                "cold_s": statistics.median(timed(cold, RUNS)),
                "warm_s": statistics.median(timed(warm, RUNS)),
            }
        finally:
            for burner in burners:
                burner.kill()
                burner.wait()
    warmstart.close_all()
    shutil.rmtree(root, ignore_errors=True)
    lines = [
        f"The gate's smoke run of the digits seed (1 epoch on its sliver), median of {RUNS}; sandbox {policy.mode}:",
        "| setting | cold start (s) | warm start (s) | cold / warm |",
        "| --- | --- | --- | --- |",
    ]
    for key, r in results.items():
        lines.append(f"| {key} | {r['cold_s']:.2f} | {r['warm_s']:.2f} | **{r['cold_s'] / r['warm_s']:.1f}x** |")
    lines.append(f"\nThe warm server's start (once per campaign, idle, with its first smoke run): {server_s:.2f} s")
    save("gate_smoke", {"runs": RUNS, "server_start_s": server_s, "results": results}, lines)


if __name__ == "__main__":
    main()
