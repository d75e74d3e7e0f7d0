"""resources.workers_per_trial: a digits trial of 2 gloo workers through Ray Train's TorchTrainer inside Tune,
against the same trial on 1 worker."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ralph_ray import sandbox
from ralph_ray.campaign import run
from ralph_ray.config import ConfigError, PopulationMode, load_config
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


def test_a_group_of_one_goes_through_ray_train_in_barrier_cycles(tmp_path: Path):
    base = [f"paths.runs={tmp_path / 'runs'}", f"paths.kb={tmp_path / 'kb'}", "resources.ray_train=true"]
    cfg = load_config(base)
    assert cfg.resources.data_parallel and cfg.resources.workers_per_trial == 1
    assert cfg.population.run_mode is PopulationMode.generations  # auto picks barrier cycles for it
    with pytest.raises(ConfigError, match="resources.ray_train"):
        load_config([*base, "population.mode=async"])
    assert not load_config(base[:2]).resources.data_parallel


GROUP_PROBE = """
import torch, torch.distributed as dist
from ralph_ray import harness
harness.init_distributed()
model = harness.wrap(torch.nn.Linear(2, 2))
print(dist.is_initialized(), type(model).__name__, harness.any_across(True), harness.any_across(False),
      harness.mean_across(3.0), harness.rank(), harness.world_size(), harness.is_main(), len(harness.shard(10)))
"""


def probe_group(**env: str) -> str:
    """What the harness helpers do in a fresh process with `env` (the torch.distributed variables of a group)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    environ = {k: v for k, v in os.environ.items() if k not in ("RALPH_GROUP", "WORLD_SIZE", "RANK")}
    environ.update(RANK="0", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RALPH_DEVICE="cpu")
    environ.update(env)
    done = subprocess.run([sys.executable, "-c", GROUP_PROBE], env=environ, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.split()


def test_a_group_of_one_starts_its_process_group_and_wraps_the_model():
    got = probe_group(RALPH_GROUP="1", WORLD_SIZE="1")
    assert got == ["True", "DistributedDataParallel", "True", "False", "3.0", "0", "1", "True", "10"]


def test_torch_distributed_variables_alone_do_not_make_a_single_trial_join_a_group():
    """An engine started under torchrun or SLURM passes WORLD_SIZE=2 to its single trials: they must not wait for
    a rank that never comes (only the engine's own RALPH_GROUP=1 makes a group)."""
    # Rank 1 of 2 as torchrun would say: still the whole trial (all rows, predictions written), no group.
    got = probe_group(WORLD_SIZE="2", RANK="1")
    assert got == ["False", "Linear", "True", "False", "3.0", "0", "1", "True", "10"]


def test_a_seed_that_would_run_as_n_copies_is_refused_naming_the_transform(tmp_path: Path):
    base = [f"paths.runs={tmp_path / 'runs'}", f"paths.kb={tmp_path / 'kb'}"]
    with pytest.raises(ConfigError, match=r"never calls harness.init_distributed.*transforms data_parallel"):
        load_config([*base, "task=lm", "resources.workers_per_trial=2"])  # the lm seed has no helpers
    assert load_config([*base, "task=fashion", "resources.workers_per_trial=2"]).resources.workers_per_trial == 2


def test_stride_gives_each_rank_as_many_disjoint_batches(monkeypatch: pytest.MonkeyPatch):
    from ralph_ray import harness

    assert harness.stride(range(10)) == range(10)  # a single trial: every batch
    monkeypatch.setenv("RALPH_GROUP", "1")
    monkeypatch.setenv("WORLD_SIZE", "3")
    taken = []
    for rank in range(3):
        monkeypatch.setenv("RANK", str(rank))
        taken.append(list(harness.stride(range(0, 100, 10))))
    assert taken == [[0, 30, 60], [10, 40, 70], [20, 50, 80]]  # the tenth batch left out: 3 steps on every rank
    with pytest.raises(TypeError, match="batches with a length"):
        harness.stride(iter(range(10)))  # type: ignore[arg-type]


def test_shard_loader_gives_each_rank_its_own_rows_reshuffled_each_epoch(monkeypatch: pytest.MonkeyPatch):
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from ralph_ray import harness

    data = TensorDataset(torch.arange(21))
    plain = DataLoader(data, batch_size=4, shuffle=True)
    assert harness.shard_loader(plain) is plain  # a single trial: the loader itself
    monkeypatch.setenv("RALPH_GROUP", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")

    def rank_epochs(rank: int, rebuild: bool) -> list[list[int]]:
        """Three epochs of one rank; every rank starts from the same seed, as the ranks of a trial do."""
        monkeypatch.setenv("RANK", str(rank))
        torch.manual_seed(7)
        loader = harness.shard_loader(DataLoader(data, batch_size=4, shuffle=True))
        epochs = []
        for _ in range(3):
            if rebuild:  # a trainer that builds its loader inside the epoch loop
                loader = harness.shard_loader(DataLoader(data, batch_size=4, shuffle=True))
            epochs.append([int(v) for (batch,) in loader for v in batch])
        return epochs

    for rebuild in (False, True):
        first, second = rank_epochs(0, rebuild), rank_epochs(1, rebuild)
        for mine, theirs in zip(first, second):
            assert len(mine) == len(theirs) == 10  # 21 // 2 rows each: as many batches (3) on both ranks
            assert not set(mine) & set(theirs)  # disjoint: each row trained once per epoch
        assert len({tuple(epoch) for epoch in first}) == 3  # a new order every epoch, without set_epoch
    ordered = harness.shard_loader(DataLoader(data, batch_size=4))  # no shuffle: in order (rank 1's share)
    assert [int(v) for (batch,) in ordered for v in batch] == list(range(1, 21, 2))
    seeded = harness.shard_loader(
        DataLoader(data, batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(3))
    )
    again = harness.shard_loader(
        DataLoader(data, batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(3))
    )
    torch.manual_seed(1)
    mine = [int(v) for (batch,) in seeded for v in batch]
    torch.manual_seed(2)  # the global stream differs: a loader with its own generator draws from that
    assert [int(v) for (batch,) in again for v in batch] == mine
    for own in (
        torch.utils.data.WeightedRandomSampler([1.0] * 21, 21),
        torch.utils.data.RandomSampler(data, replacement=True),  # draws with replacement: not a permutation to split
    ):
        with pytest.raises(TypeError, match="sampler of its own"):
            harness.shard_loader(DataLoader(data, batch_size=4, sampler=own))
