"""A trial of N data-parallel workers: Ray Train's `TorchTrainer` inside the cycle's Tune trial.

`resources.workers_per_trial=N > 1` (or `resources.ray_train=true`, a group even at N = 1) makes each Tune trial a
small driver (the Train–Tune integration of Ray Train V2, the default in Ray 2.60): it starts a `TorchTrainer` whose
`ScalingConfig` asks for N workers of `resources.cpu` CPUs and `resources.gpu` GPUs each, placed by
`resources.placement` (PACK: one node when they fit). Each worker runs the variant's train.py exactly as a single
trial does (`trials._run_trial`: its own work dir, the sandbox, the limits), with the torch.distributed environment
set: RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR and a fresh MASTER_PORT that rank 0 picks and
shares through the gloo group TorchTrainer starts among the workers themselves. The trainer's harness helpers
(`harness.init_distributed`, `shard`, `wrap`, `mean_across`, `any_across`) do the rest; only rank 0 writes
checkpoints and predictions.

Every worker forwards every epoch to `ray.train.report` (a barrier, so the ranks stay in step); Ray Train keeps
rank 0's metrics and `TuneReportCallback` hands them to Tune, so Optuna, ASHA, PBT and the ledger see the trial
as any other. A lost worker fails the whole group; Ray Train restarts it from the last checkpoint
(safeguards.max_failures times), and the Train run's storage lets a Tune-level retry resume too.
"""

from __future__ import annotations

import re
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ralph_ray.harness import ENV_GROUP
from ralph_ray.runner import TrialFailed
from ralph_ray.trials import FAILED_KEY, TrialSpec, _run_trial, work_dir

ENV_RANK, ENV_LOCAL_RANK, ENV_WORLD_SIZE = "RANK", "LOCAL_RANK", "WORLD_SIZE"
ENV_LOCAL_WORLD_SIZE, ENV_MASTER_ADDR, ENV_MASTER_PORT = "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"
# What the Tune trial itself (the group's driver) holds: no CPU (Tune needs some resource, so 1 MiB of memory);
# a trial's N workers fit on N CPUs.
DRIVER_RESOURCES = {"memory": 1024 * 1024}


@dataclass(frozen=True)
class Workers:
    """How one trial's workers are shaped: how many, what each holds, how they are placed."""

    count: int
    cpu: float = 1.0
    gpu: float = 0.0
    placement: str = "PACK"  # Ray placement-group strategy: PACK, SPREAD, STRICT_PACK, STRICT_SPREAD
    max_failures: int = 0  # restarts of the whole group (from its last checkpoint) after a lost worker
    storage: str = ""  # where Ray Train keeps the group's checkpoints (under the cycle's Tune storage)


def rank_dir(work: Path, rank: int) -> Path:
    """A worker's work dir: the trial's own for rank 0 (the ledger reads it), a sibling for the others."""
    return work if rank == 0 else work.with_name(f"{work.name}.rank{rank}")


def run_parallel_trial(config: dict[str, Any], spec: TrialSpec, workers: Workers) -> None:
    """Tune function trainable: one trial as a TorchTrainer of `workers.count` workers, each running train.py."""
    import ray.train
    from ray import tune
    from ray.train.torch import TorchConfig, TorchTrainer
    from ray.tune.integration.ray_train import TuneReportCallback

    trial_id = tune.get_context().get_trial_id() or "manual"
    trainer = TorchTrainer(
        _worker,
        train_loop_config={"config": config, "spec": spec, "trial_id": trial_id},
        # The group TorchTrainer starts is the workers' own (a rendezvous for the trainers' group, see _meet).
        torch_config=TorchConfig(backend="gloo"),
        scaling_config=ray.train.ScalingConfig(
            num_workers=workers.count,
            use_gpu=workers.gpu > 0,
            resources_per_worker={"CPU": workers.cpu, "GPU": workers.gpu},
            placement_strategy=workers.placement,
        ),
        run_config=ray.train.RunConfig(
            name=trial_id,
            storage_path=workers.storage or None,
            callbacks=[TuneReportCallback()],
            failure_config=ray.train.FailureConfig(max_failures=workers.max_failures),
            checkpoint_config=ray.train.CheckpointConfig(num_to_keep=2),
        ),
    )
    try:
        trainer.fit()
    except ray.train.TrainingFailedError as err:  # a trainer's failure, or lost workers past max_failures
        worst = float("-inf") if spec.schedule.mode == "max" else float("inf")
        tune.report({spec.schedule.metric: worst, FAILED_KEY: _reason(err)})


def _worker(payload: dict[str, Any]) -> None:
    """On each Ray Train worker: the torch.distributed environment, then train.py as a single trial runs it."""
    import ray.train

    context = ray.train.get_context()
    rank, world = context.get_world_rank(), context.get_world_size()
    spec: TrialSpec = payload["spec"]
    address, port = _meet(rank)
    env = {
        ENV_RANK: str(rank),
        ENV_LOCAL_RANK: str(context.get_local_rank()),
        ENV_WORLD_SIZE: str(world),
        ENV_LOCAL_WORLD_SIZE: str(context.get_local_world_size()),
        ENV_MASTER_ADDR: address,
        ENV_MASTER_PORT: str(port),
        ENV_GROUP: "1",  # the harness helpers act (a group of one too: resources.ray_train)
    }
    work = rank_dir(work_dir(spec, payload["trial_id"]), rank)
    _run_trial(
        payload["config"],
        spec,
        work,
        report=_report,
        checkpoint=ray.train.get_checkpoint(),
        extra_env=env,
        predicts=rank == 0,
    )


def _report(metrics: dict[str, Any], checkpoint: Any = None) -> None:
    """Every rank reports every epoch (Ray Train's report is a barrier); only rank 0 has a checkpoint to send."""
    import ray.train

    if checkpoint is not None:  # the forwarder's snapshot, as Tune's class: Ray Train takes its own
        checkpoint = ray.train.Checkpoint.from_directory(checkpoint.path)
    ray.train.report(metrics, checkpoint=checkpoint)


def _meet(rank: int) -> tuple[str, int]:
    """Rank 0's address and a free port on it, shared with every rank over the workers' own gloo group."""
    import torch.distributed as dist

    found: list[Any] = [None]
    if rank == 0:
        with socket.socket() as probe:  # a port free now; the trainers' group binds it a moment later
            probe.bind(("", 0))
            found = [(_node_ip(), probe.getsockname()[1])]
    dist.broadcast_object_list(found, src=0)
    address, port = found[0]
    return str(address), int(port)


def _node_ip() -> str:
    import ray

    return ray.util.get_node_ip_address()


def _reason(err: BaseException) -> str:
    """The trainer's own reason when a worker's train.py failed, else the first line of Ray's error."""
    cause: BaseException | None = err
    seen = set()
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, TrialFailed):
            return str(cause)
        cause = cause.__cause__ or cause.__context__
    text = str(err).strip()
    said = re.findall(r"TrialFailed: (.+)", text)  # the worker's error arrives as its traceback's text
    if said:
        return said[-1].strip()[:500]
    return (text.splitlines() or ["the trial's worker group failed"])[0][:500]
