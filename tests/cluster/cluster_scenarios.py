"""Campaigns on a multi-node Ray of their own, each run in a fresh process by the tests in this folder.

Why a process per scenario: the test session shares one local Ray (tests/conftest.py: `ray_session`), and a
driver joins one Ray at a time; a `ray.cluster_utils.Cluster` needs a driver of its own, and a clean exit
tears its nodes down. `python tests/cluster/cluster_scenarios.py NAME OUT` starts the cluster, runs the
campaign through `cluster=address` as a user would, and leaves what the tests check in OUT: result.json,
the run dirs and the KB, and each node's own folders (OUT/<node>/cache, OUT/<node>/work).

Every node gets its own RALPH_CACHE_DIR and RALPH_WORK_DIR, as separate machines would have: a trial that
read data through the driver's run dir, or worked in it, would show up in the wrong folder. The head has
no CPUs, so every trial runs on a worker node while the driver stays on the head.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

from ralph_ray.raycluster import ensure_local_token, set_ray_env

set_ray_env("token")  # the cluster's nodes and the campaign's driver (cluster.auth_mode=token) share ~/.ray/auth_token
ensure_local_token()

from ray.cluster_utils import Cluster  # noqa: E402
from rich.console import Console  # noqa: E402

from ralph_ray.campaign import Outcome, run  # noqa: E402
from ralph_ray.config import load_config  # noqa: E402

DIGITS_TASK = Path(__file__).resolve().parents[2] / "trainers" / "digits"

TINY = [
    "agent=none",
    "population.mode=generations",  # one barrier cycle: the placement tests count its trials' attempts
    "safeguards.max_cycles=1",
    "search.max_concurrent=2",
    "safeguards.replicates=0",  # one trial decides (replicates: tests/test_noise.py)
    "scheduler=fifo",
    "scheduler.max_t=1",
    "scheduler.grace_period=1",
    "safeguards.trial_timeout_s=120",
    "+search.space.EPOCHS={type: choice, values: [1]}",
]

# A trainer slow enough to be caught mid-trial: it checkpoints each epoch and resumes from its checkpoint.
SLOW_TRAINER = """
import time
import numpy as np
from ralph_ray import harness

EPOCHS = 5  # epochs
SLEEP = 1.0  # seconds per epoch

data = harness.load_data()
state = harness.load_checkpoint() or {"epoch": 0}
for epoch in range(state["epoch"] + 1, EPOCHS + 1):
    time.sleep(SLEEP)
    harness.save_checkpoint({"epoch": epoch})
    harness.report(epoch=epoch, val_acc=0.5 + epoch / 100, train_loss=1.0 / epoch)
harness.save_predictions(selection=np.zeros(len(data.selection_x), int), test=np.zeros(len(data.test_x), int))
"""


def start_cluster(out: Path, workers: dict[str, dict[str, Any]]) -> tuple[Cluster, dict[str, Any]]:
    """A head without CPUs (the driver's node) and named worker nodes, each with its own cache and work folder."""
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    nodes = {}
    for name, resources in workers.items():
        env = {"RALPH_CACHE_DIR": str(out / name / "cache"), "RALPH_WORK_DIR": str(out / name / "work")}
        nodes[name] = cluster.add_node(env_vars=env, **resources)
    cluster.wait_for_nodes()
    return cluster, nodes


def stop(cluster: Cluster) -> None:
    """Disconnect the driver, then take every node down."""
    import ray

    ray.shutdown()
    cluster.shutdown()


def attempts(out: Path, names: list[str]) -> list[dict[str, Any]]:
    """Every trial attempt's node.json (written by the trial driver), with the node folder it was found in."""
    found = []
    for name in names:
        for path in sorted((out / name / "work").rglob("node.json")):
            info = json.loads(path.read_text())
            metrics = path.parent / "metrics.jsonl"
            epochs = (
                [json.loads(line)["epoch"] for line in metrics.read_text().splitlines()] if metrics.exists() else []
            )
            found.append({**info, "folder": name, "trial_id": path.parent.name, "epochs": epochs})
    return found


def summary(outcome: Outcome) -> dict[str, Any]:
    return {
        "run_id": outcome.run_id,
        "run_dir": str(outcome.run_dir),
        "kb": str(outcome.kb_root),
        "exit_code": int(outcome.exit_code),
        "records": [
            {"trial_id": r.trial_id, "status": r.status.value, "reason": r.reason, "epochs": r.epochs}
            for r in outcome.records
        ],
    }


def multinode(out: Path) -> dict[str, Any]:
    """Digits campaigns on nodes a and gpu (1 CPU each, gpu with one logical GPU): two CPU trials at once land on
    both nodes; GPU trials (resources.gpu=1) only on gpu."""
    cluster, nodes = start_cluster(out, {"a": {"num_cpus": 1}, "gpu": {"num_cpus": 1, "num_gpus": 1}})
    join = [
        "cluster=address",
        f"cluster.address={cluster.address}",
        f"paths.runs={out / 'runs'}",
        f"paths.kb={out / 'kb'}",
    ]
    logs = {name: Console(file=io.StringIO(), record=True, width=240) for name in ("cpu", "gpu")}
    cpu = run(load_config([*join, *TINY, "run_id=cpu", "search.num_samples=2"]), logs["cpu"])
    gpu = run(load_config([*join, *TINY, "run_id=gpu", "search.num_samples=2", "resources.gpu=1"]), logs["gpu"])
    found = attempts(out, list(nodes))
    stop(cluster)
    return {
        "node_ids": {name: node.node_id for name, node in nodes.items()},
        "cpu": summary(cpu),
        "gpu": summary(gpu),
        "attempts": found,
        # The campaign's word on trials given a GPU that never started CUDA (a logical GPU here: none can).
        "never_started_cuda": {name: log.export_text().count("never started CUDA") for name, log in logs.items()},
    }


def node_loss(out: Path, mode: str = "generations") -> dict[str, Any]:
    """Remove node a while its trial runs (after its second epoch); the trial resumes on node b from its checkpoint.
    `mode`: one barrier cycle (generations), or the default asynchronous run."""
    trainer = out / "slow"
    trainer.mkdir(parents=True)
    for part in ("prepare.py", "program.md", "task.yaml"):  # a task folder: digits' frozen parts, a slow trainer
        shutil.copy(DIGITS_TASK / part, trainer / part)
    (trainer / "train.py").write_text(textwrap.dedent(SLOW_TRAINER))
    cluster, nodes = start_cluster(out, {"a": {"num_cpus": 1}, "b": {"num_cpus": 1}})
    killed: dict[str, Any] = {}

    def killer() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            for metrics in (out / "a" / "work").rglob("metrics.jsonl"):
                if len(metrics.read_text().splitlines()) >= 2:
                    killed.update(
                        trial_id=metrics.parent.name,
                        epochs_before=len(metrics.read_text().splitlines()),
                        at=time.time(),
                    )
                    cluster.remove_node(nodes["a"], allow_graceful=False)
                    return
            time.sleep(0.1)

    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    cfg = load_config(
        [
            "cluster=address",
            f"cluster.address={cluster.address}",
            f"paths.runs={out / 'runs'}",
            f"paths.kb={out / 'kb'}",
            f"paths.storage=file://{out / 'storage'}",
            "agent=none",
            f"population.mode={mode}",
            "safeguards.max_cycles=1",
            "run_id=faults",
            f"task.trainer={trainer}",
            "search.num_samples=2",
            "search.max_concurrent=2",
            "scheduler=fifo",
            "scheduler.max_t=5",
            "safeguards.max_failures=2",
            "safeguards.replicates=0",  # the node-loss counts are of search trials alone
            "safeguards.trial_timeout_s=120",
            "~search.space",
            "+search.space={SLEEP: {type: choice, values: [1.0]}}",
        ]
    )
    started = time.time()
    outcome = run(cfg)
    thread.join(timeout=1)
    found = attempts(out, list(nodes))
    stop(cluster)
    return {
        "killed": killed,
        "seconds": time.time() - started,
        "node_ids": {n: node.node_id for n, node in nodes.items()},
        "outcome": summary(outcome),
        "attempts": found,
    }


SCENARIOS = {
    "multinode": multinode,
    "node_loss": node_loss,
    "node_loss_async": lambda out: node_loss(out, "async"),
}


def launch(name: str, out: Path, timeout_s: float = 240) -> dict[str, Any]:
    """Run a scenario in a fresh process (own process group, killed whole on timeout); its result.json.

    The cluster gets a Ray temp dir of its own (RAY_TMPDIR, short: socket paths live under it), so its
    session files and its address file (ray_current_cluster) never meet another Ray on this machine.
    """
    tmp = tempfile.mkdtemp(prefix="rs", dir="/tmp")
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_USAGE_STATS_ENABLED": "0", "RAY_TMPDIR": tmp}
    proc = subprocess.Popen(
        [sys.executable, __file__, name, str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        env=env,
    )
    try:
        output, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        raise AssertionError(f"scenario {name} ran past {timeout_s}s:\n{output[-4000:]}") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    assert proc.returncode == 0, f"scenario {name} failed:\n{output[-6000:]}"
    return json.loads((out / "result.json").read_text())


if __name__ == "__main__":
    name, out = sys.argv[1], Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    result = SCENARIOS[name](out)
    (out / "result.json").write_text(json.dumps(result, indent=2, default=str))
