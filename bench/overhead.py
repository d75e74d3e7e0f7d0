"""Orchestration overhead: the same N digits trainer runs launched directly vs through a campaign.

Prints wall(campaign) / wall(direct) at the same concurrency, with and without Ray's start-up, with warm trial
starts (the default: trials forked from a server that has torch imported) and cold ones, and with reuse_actors on
and off, plus where the rest goes. The direct side starts a plain `python train.py` per run (no sandbox).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from _common import config, fixed_knobs, save

from ralph_ray import PROJECT_ROOT
from ralph_ray.campaign import run
from ralph_ray.knobs import rewrite_knobs
from ralph_ray.tasks.base import write_public
from ralph_ray.tasks.digits import prepare

N, CONCURRENCY = 8, 2
KNOBS = {"EPOCHS": 20, "WIDTH": 32, "BATCH_SIZE": 32}  # ~5 s per trial on one core here


def direct(root: Path) -> tuple[float, list[float]]:
    """N subprocess runs of train.py, CONCURRENCY at a time, no Ray."""
    data = root / "data"
    write_public(prepare(0, 0.2, 0.2), data, "digits")
    source = rewrite_knobs((PROJECT_ROOT / "trainers/digits/train.py").read_text(), KNOBS)

    def one(i: int) -> float:
        work = root / f"direct_{i}"
        work.mkdir()
        (work / "train.py").write_text(source)
        env = {
            **os.environ,
            "RALPH_DATA_DIR": str(data),
            "RALPH_METRICS_FILE": str(work / "m.jsonl"),
            "RALPH_PREDICTIONS_FILE": str(work / "p.npz"),
            "OMP_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1",
        }
        start = time.perf_counter()
        subprocess.run([sys.executable, "train.py"], cwd=work, env=env, check=True, capture_output=True)
        return time.perf_counter() - start

    start = time.perf_counter()
    with ThreadPoolExecutor(CONCURRENCY) as pool:
        walls = list(pool.map(one, range(N)))
    return time.perf_counter() - start, walls


def campaign(root: Path, name: str, *overrides: str) -> tuple[float, list[float]]:
    cfg = fixed_knobs(
        config(
            root,
            name,
            "scheduler=fifo",
            f"search.num_samples={N}",
            f"search.max_concurrent={CONCURRENCY}",
            f"scheduler.max_t={KNOBS['EPOCHS']}",
            "safeguards.replicates=0",  # the N trials only: replicates of the best would be trials direct() never runs
            *overrides,
        ),
        **KNOBS,
    )
    start = time.perf_counter()
    outcome = run(cfg)
    wall = time.perf_counter() - start
    assert len(outcome.records) == N, len(outcome.records)
    assert all(r.status.value == "completed" for r in outcome.records), [r.reason for r in outcome.records]
    return wall, [r.seconds for r in outcome.records]


def main() -> None:
    root = Path(tempfile.mkdtemp(prefix="bench-overhead-"))
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import torch, ralph_ray.harness"], check=True)
    import_s = time.perf_counter() - start

    cold, _ = campaign(root, "cold")  # includes ray.init
    d_wall, d_trials = direct(root / "d")
    warm, c_trials = campaign(root, "warm")
    cold_starts, cold_trials = campaign(root, "coldstarts", "trial.warm=false")
    # `--quick` leaves this one out (a loaded machine): its figure is then the cold-starts campaign's.
    no_reuse = cold_starts if "--quick" in sys.argv else campaign(root, "noreuse", "search.reuse_actors=false")[0]
    d_mean, c_mean = sum(d_trials) / N, sum(c_trials) / N
    figures = {
        "trials": N,
        "concurrency": CONCURRENCY,
        "knobs": KNOBS,
        "direct_wall_s": round(d_wall, 2),
        "direct_trial_mean_s": round(d_mean, 2),
        "campaign_cold_wall_s": round(cold, 2),
        "campaign_warm_wall_s": round(warm, 2),
        "campaign_no_reuse_wall_s": round(no_reuse, 2),
        "campaign_cold_starts_wall_s": round(cold_starts, 2),
        "ratio_cold_starts": round(cold_starts / d_wall, 3),
        "campaign_cold_starts_trial_mean_s": round(sum(cold_trials) / N, 2),
        "ratio_warm": round(warm / d_wall, 3),
        "ratio_cold": round(cold / d_wall, 3),
        "ratio_no_reuse": round(no_reuse / d_wall, 3),
        "campaign_trial_mean_s": round(c_mean, 2),
        "per_trial_overhead_s": round(c_mean - d_mean, 2),
        "python_torch_import_s": round(import_s, 2),
    }
    lines = [
        f"orchestration overhead, {N} digits trials of ~{d_mean:.1f} s, {CONCURRENCY} at a time:",
        f"  direct subprocesses        {d_wall:6.1f} s",
        f"  campaign, Ray already up   {warm:6.1f} s   ratio {warm / d_wall:.3f}   (reuse_actors=true, warm starts)",
        f"  campaign, incl. ray.init   {cold:6.1f} s   ratio {cold / d_wall:.3f}",
        f"  campaign, reuse_actors=false {no_reuse:4.1f} s   ratio {no_reuse / d_wall:.3f}",
        f"  campaign, trial.warm=false {cold_starts:6.1f} s   ratio {cold_starts / d_wall:.3f}   (every trial a new "
        "interpreter in the sandbox)",
        f"  per-trial wall in campaign {c_mean:.2f} s vs direct {d_mean:.2f} s -> {c_mean - d_mean:+.2f} s per trial",
        f"  (a bare `python -c 'import torch, ralph_ray.harness'` takes {import_s:.2f} s, paid by both sides)",
    ]
    save("overhead", figures, lines)


if __name__ == "__main__":
    main()
