"""Run many trainer sources from forks of one process that imported torch once (multiprocessing's fork server):
each variant still gets a fresh process, its own work dir and environment, but not a cold `import torch` (~4 s
on 2 cores, the bulk of a 2-epoch digits trainer). Test helper only: the engine's own warm path is ralph_ray.zygote.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import runpy
import sys
import traceback
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from ralph_ray.warmstart import PRELOAD  # what the engine's fork servers import before forking a trainer


def train_all(jobs: dict[str, str], data: Path, root: Path, workers: int = 2) -> dict[str, dict]:
    """Run each named source as `train.py` in root/<name> (one thread each); per name its returncode, stderr tail,
    epoch records and predictions path."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(list(PRELOAD))
    with ProcessPoolExecutor(max_workers=workers, mp_context=context, max_tasks_per_child=1) as pool:
        futures = {
            name: pool.submit(_train, source, str(data), str(root / name.replace(":", "_")))
            for name, source in jobs.items()
        }
        return {name: _result(Path(root / name.replace(":", "_")), future.result()) for name, future in futures.items()}


def _result(work: Path, returncode: int) -> dict:
    metrics = work / "metrics.jsonl"
    records = [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.exists() else []
    stderr = (work / "stderr.txt").read_text(errors="replace") if (work / "stderr.txt").exists() else ""
    return {
        "returncode": returncode,
        "stderr": stderr[-3000:],
        "records": records,
        "predictions": work / "predictions.npz",
    }


def _train(source: str, data: str, work_dir: str) -> int:
    """In the fresh fork: the trainer's environment, its work dir, its stderr in a file, then `train.py` as __main__."""
    work = Path(work_dir)
    work.mkdir(parents=True)
    (work / "train.py").write_text(source)
    os.environ.update(
        {
            "RALPH_DATA_DIR": data,
            "RALPH_METRICS_FILE": str(work / "metrics.jsonl"),
            "RALPH_PREDICTIONS_FILE": str(work / "predictions.npz"),
            "OMP_NUM_THREADS": "1",
            "RALPH_DEVICE": "cpu",
        }
    )
    os.chdir(work)
    err = os.open(work / "stderr.txt", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(err, 2)
    sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115 - the process's own stderr, for its whole life
    import torch

    torch.set_num_threads(1)  # imported before OMP_NUM_THREADS was set: one thread each, as the cold path had
    sys.argv = ["train.py"]
    try:
        runpy.run_path("train.py", run_name="__main__")
    except SystemExit as stop:
        return stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    except BaseException:  # noqa: BLE001 - any failure of the trainer is its result, with the traceback in stderr
        traceback.print_exc()
        return 1
    finally:
        sys.stderr.flush()
    return 0
