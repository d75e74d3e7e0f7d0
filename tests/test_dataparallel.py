"""resources.workers_per_trial: a digits trial of 2 gloo workers through Ray Train's TorchTrainer inside Tune,
against the same trial on 1 worker."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from ralph_ray import sandbox
from ralph_ray.campaign import run
from ralph_ray.config import ConfigError, load_config
from ralph_ray.dataparallel import rank_dir
from ralph_ray.kb import open_reader


def one_trial(tmp: Path, workers: int):
    overrides = [
        f"paths.runs={tmp / 'runs'}",
        f"paths.kb={tmp / 'kb'}",
        f"run_id=dp{workers}",
        "agent=none",
        "safeguards.max_cycles=1",
        "safeguards.replicates=0",
        "safeguards.trial_timeout_s=900",  # a loaded 2-core machine starts a worker group slowly
        "search.num_samples=1",  # the seed's own knobs (enqueued first): both runs train the same trial
        "search.max_concurrent=1",
        "scheduler=fifo",
        "scheduler.max_t=4",
        "+search.space.EPOCHS={type: choice, values: [4]}",
        f"resources.workers_per_trial={workers}",
    ]
    if sandbox.available() is not None:  # no bubblewrap here
        overrides.append("sandbox=none")
    return run(load_config(overrides))


@pytest.mark.slow
def test_two_gloo_workers_agree_with_one_and_see_disjoint_shards(ray_session, tmp_path: Path):
    for workers in (1, 2):
        assert one_trial(tmp_path, workers).exit_code == 0
    con = open_reader(tmp_path / "kb")
    rows = con.execute(
        "select run_id, trial_id, status, epochs, val_metric, selection_score, test_score, work_dir from trials "
        "order by run_id"
    ).fetchall()
    (single, parallel) = rows
    assert single[2] == parallel[2] == "completed" and single[3] == parallel[3] == 4
    # The global batch and the data are the same, split over two ranks: the same model within noise.
    assert abs(single[5] - parallel[5]) < 0.05 and abs(single[6] - parallel[6]) < 0.05
    assert parallel[5] > 0.8

    work = Path(parallel[7])
    shards = [json.loads((rank_dir(work, rank) / "shard.json").read_text()) for rank in (0, 1)]
    assert [s["rank"] for s in shards] == [0, 1] and all(s["world_size"] == 2 for s in shards)
    first, second = (set(s["rows"]) for s in shards)
    assert first and not first & second and len(first) == len(second)  # disjoint, equal halves
    train_rows = len(np.load(tmp_path / "runs" / "dp2" / "data" / "train_x.npy", mmap_mode="r"))
    val_rows = int(train_rows * 0.15)
    assert len(first | second) >= train_rows - val_rows - 1  # together every train row (but an odd one out)
    assert (work / "predictions.npz").exists() and not (rank_dir(work, 1) / "predictions.npz").exists()
    assert not (Path(single[7]) / "shard.json").exists()  # one worker: no shard bookkeeping, the trial as before
    # Rank 1 ran train.py in its own work dir with the distributed environment, reporting in step with rank 0.
    lines = [json.loads(line) for line in (rank_dir(work, 1) / "metrics.jsonl").read_text().splitlines()]
    assert [line["epoch"] for line in lines][-1] == 4


def test_workers_need_barrier_cycles_and_a_known_placement(tmp_path: Path):
    base = [f"paths.runs={tmp_path / 'runs'}", f"paths.kb={tmp_path / 'kb'}", "resources.workers_per_trial=2"]
    with pytest.raises(ConfigError, match="population.mode=generations"):
        load_config([*base, "population.mode=async"])
    with pytest.raises(ConfigError, match="resources.placement"):
        load_config([*base, "resources.placement=ANYWHERE"])
