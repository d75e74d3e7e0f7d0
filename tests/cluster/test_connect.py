"""Joining a cluster (cluster=address) through the CLI: the config group, clear exit-2 errors for an
unreachable, refusing or misnamed cluster or a missing token (no traceback, no run recorded), and token auth
that agrees."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Iterator

import pytest
from procs import free_port

from ralph_ray import PROJECT_ROOT
from ralph_ray.config import ClusterMode, ConfigError, load_config
from ralph_ray.kb import open_reader
from ralph_ray.raycluster import refuse_open

TOKEN = "0123456789abcdef" * 4


def cli(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_AUTH", "RAY_ADDRESS"))}
    return subprocess.run(
        [sys.executable, "-m", "ralph_ray", f"paths.runs={tmp_path / 'runs'}", f"paths.kb={tmp_path / 'kb'}", *args],
        env={**base, "RAY_USAGE_STATS_ENABLED": "0", **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


@contextmanager
def refused_address() -> Iterator[str]:
    """A loopback address bound, not listening: connections are refused, and no other process can take the port
    meanwhile (a stale or dead head)."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        yield f"127.0.0.1:{held.getsockname()[1]}"


def test_cluster_group_selects_local_or_address():
    assert load_config([]).cluster.mode is ClusterMode.local
    joined = load_config(["cluster=address"])
    assert joined.cluster.mode is ClusterMode.address and joined.cluster.address == "auto"
    assert load_config(["cluster=address", "cluster.address=10.0.0.5:6379"]).cluster.address == "10.0.0.5:6379"
    with pytest.raises(ConfigError, match="cluster=address cluster.address=10.0.0.5:6379"):
        load_config(["cluster.address=10.0.0.5:6379"])  # an address without the group would silently start a local Ray
    with pytest.raises(ConfigError, match="Ray Client"):
        load_config(["cluster=address", "cluster.address=ray://head:10001"])
    with pytest.raises(ConfigError, match="cluster.auth_mode"):
        load_config(["cluster=address", "cluster.auth_mode=tokens"])
    assert load_config(["cluster=address"]).cluster.auth_mode == "token" == load_config([]).cluster.auth_mode
    assert load_config(["cluster.auth_mode=disabled"]).cluster.auth_mode == "disabled"


def test_a_machine_without_the_clusters_token_exits_2_before_anything_starts(tmp_path: Path):
    start = time.monotonic()
    home = tmp_path / "home"  # a machine with no ~/.ray/auth_token, and no token in the environment
    home.mkdir()
    with refused_address() as address:  # nothing is contacted: the token check comes first
        result = cli(
            tmp_path,
            "cluster=address",
            f"cluster.address={address}",
            "run_id=tokenless",
            HOME=str(home),
            RAY_AUTH_MODE="disabled",
        )
    assert result.returncode == 2, result.stderr
    assert "cluster.auth_mode=token but this machine has no Ray token" in result.stderr
    assert "~/.ray/auth_token with mode 600" in result.stderr and "cluster.auth_mode=disabled" in result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    assert not (tmp_path / "runs" / "tokenless").exists() and not (home / ".ray").exists()
    assert time.monotonic() - start < 60


def test_unreachable_cluster_exits_2_naming_the_fix_before_a_run_exists(tmp_path: Path):
    start = time.monotonic()
    with refused_address() as address:
        result = cli(tmp_path, "cluster=address", f"cluster.address={address}", "run_id=nowhere", RAY_AUTH_TOKEN=TOKEN)
    assert result.returncode == 2, result.stderr
    assert "cannot reach the Ray head at 127.0.0.1" in result.stderr and "ray start --head" in result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    assert not (tmp_path / "runs" / "nowhere").exists()
    assert time.monotonic() - start < 60


def test_a_missing_token_path_is_named(tmp_path: Path):
    missing = tmp_path / "nope"
    with refused_address() as address:  # nothing is contacted: the token check comes first
        result = cli(
            tmp_path,
            "cluster=address",
            f"cluster.address={address}",
            "run_id=nopath",
            RAY_AUTH_TOKEN_PATH=str(missing),
        )
    assert result.returncode == 2, result.stderr
    assert f"RAY_AUTH_TOKEN_PATH={missing} does not exist or is empty" in result.stderr
    assert not (tmp_path / "runs" / "nopath").exists()


@pytest.mark.parametrize("found_by", ["RAY_ADDRESS", "address_file"])
def test_auto_pointing_at_a_dead_head_exits_2_within_the_timeout(tmp_path: Path, found_by: str):
    start = time.monotonic()
    with refused_address() as stale:
        if found_by == "RAY_ADDRESS":
            env = {"RAY_ADDRESS": stale}
        else:  # what a `ray start` long gone left in <temp dir>/ray/ray_current_cluster
            (tmp_path / "ray").mkdir()
            (tmp_path / "ray" / "ray_current_cluster").write_text(stale)
            env = {"RAY_TMPDIR": str(tmp_path)}
        result = cli(tmp_path, "cluster=address", "run_id=stale", RAY_AUTH_TOKEN=TOKEN, **env)
    assert result.returncode == 2, result.stderr[-2000:]
    assert f"cannot reach the Ray head at {stale.split(':')[0]}" in result.stderr
    assert "$RAY_ADDRESS" in result.stderr if found_by == "RAY_ADDRESS" else "ray_current_cluster" in result.stderr
    assert "cluster.address=<head>:<port>" in result.stderr
    assert not (tmp_path / "runs" / "stale").exists()
    assert time.monotonic() - start < 60


@contextmanager
def head(auth_mode: str) -> Iterator[tuple[str, int]]:
    """A head started with RAY_AUTH_MODE=`auth_mode` (its own temp dir and ports), killed with its process group."""
    temp = tempfile.mkdtemp(prefix="rt", dir="/tmp")  # short: Ray's socket paths live under it
    port = free_port()
    env = {**os.environ, "RAY_AUTH_MODE": auth_mode, "RAY_AUTH_TOKEN": TOKEN, "RAY_USAGE_STATS_ENABLED": "0"}
    head = subprocess.Popen(
        [
            str(Path(sys.executable).parent / "ray"),
            "start",
            "--head",
            f"--port={port}",
            "--num-cpus=1",
            "--include-dashboard=false",
            f"--dashboard-agent-listen-port={free_port()}",
            f"--ray-client-server-port={free_port()}",
            f"--temp-dir={temp}",
            "--block",
        ],
        env=env,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert head.poll() is None and time.monotonic() < deadline, f"the {auth_mode} head did not start"
                time.sleep(0.5)
        time.sleep(2)  # the GCS port opens before the head's raylet registers
        yield f"127.0.0.1:{port}", head.pid
    finally:
        with suppress(ProcessLookupError):  # a test may have killed it already
            os.killpg(head.pid, signal.SIGKILL)
        head.wait()
        subprocess.run(["rm", "-rf", temp], check=False)


@pytest.fixture()
def token_head() -> Iterator[str]:
    """A head started with RAY_AUTH_MODE=token, as README's "a cluster you start yourself" does."""
    with head("token") as (address, _):
        yield address


@pytest.fixture()
def open_head() -> Iterator[str]:
    """A head started without auth, as a plain `ray start --head` is."""
    with head("disabled") as (address, _):
        yield address


def test_auth_mode_mismatch_exits_2_and_matching_token_mode_joins(token_head: str, tmp_path: Path):
    # The explicit opt-out against a token cluster, then a token that is not the cluster's: both refused.
    refused = cli(
        tmp_path,
        "cluster=address",
        f"cluster.address={token_head}",
        "cluster.connect_timeout_s=5",
        "run_id=refused",
        "cluster.auth_mode=disabled",
    )
    assert refused.returncode == 2, refused.stderr[-2000:]
    assert "requires its token (it runs with RAY_AUTH_MODE=token)" in refused.stderr
    assert (
        "drop cluster.auth_mode=disabled" in refused.stderr and "needs cluster.auth_mode=disabled" not in refused.stderr
    )
    wrong_file = tmp_path / "wrong_token"
    wrong_file.write_text("f" * 64)
    wrong = cli(
        tmp_path,
        "cluster=address",
        f"cluster.address={token_head}",
        "cluster.connect_timeout_s=5",
        "run_id=wrong",
        RAY_AUTH_TOKEN_PATH=str(wrong_file),
    )
    assert wrong.returncode == 2, wrong.stderr[-2000:]
    assert f"refused this driver's token (the file RAY_AUTH_TOKEN_PATH={wrong_file};" in wrong.stderr
    assert "the cluster's own token" in wrong.stderr
    for result in (refused, wrong):
        assert "Traceback" not in result.stderr + result.stdout
    assert not (tmp_path / "runs" / "refused").exists() and not (tmp_path / "runs" / "wrong").exists()

    # The cluster's token here: the driver joins with the default cluster.auth_mode=token, whatever the shell exports.
    joined = subprocess.run(
        [
            sys.executable,
            "-c",
            f"""
import ray
from ralph_ray.config import load_config
from ralph_ray.raycluster import ensure_ray
cfg = load_config(["cluster=address", "cluster.address={token_head}"])
ensure_ray(cluster=cfg.cluster)
print(len([n for n in ray.nodes() if n["Alive"]]), ray.cluster_resources().get("CPU"))
""",
        ],
        env={**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_AUTH_TOKEN": TOKEN},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert joined.returncode == 0, joined.stderr[-2000:]
    assert joined.stdout.split() == ["1", "1.0"]


def test_token_mode_refuses_a_cluster_without_auth_and_disabled_joins_it_knowingly(open_head: str, tmp_path: Path):
    refused = cli(
        tmp_path,
        "cluster=address",
        f"cluster.address={open_head}",
        "cluster.connect_timeout_s=5",
        "run_id=foreign",
        RAY_AUTH_TOKEN=TOKEN,
    )
    assert refused.returncode == 2, refused.stderr[-2000:]
    assert f"the Ray cluster at {open_head} accepts clients without a token" in refused.stderr
    assert "RAY_AUTH_MODE=token" in refused.stderr and "cluster.auth_mode=disabled" in refused.stderr
    assert "Traceback" not in refused.stderr + refused.stdout
    assert not (tmp_path / "runs" / "foreign").exists() and not (tmp_path / "kb").exists()
    joined = subprocess.run(
        [
            sys.executable,
            "-c",
            f"""
import ray
from ralph_ray.config import load_config
from ralph_ray.raycluster import ensure_ray
cfg = load_config(["cluster=address", "cluster.address={open_head}", "cluster.auth_mode=disabled"])
ensure_ray(cluster=cfg.cluster)
print(len([n for n in ray.nodes() if n["Alive"]]))
""",
        ],
        env={k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert joined.returncode == 0, joined.stderr[-2000:]
    assert joined.stdout.split() == ["1"] and "Ray runs without authentication" in joined.stderr


def test_an_open_cluster_check_that_cannot_answer_says_so(tmp_path: Path, monkeypatch, capsys) -> None:
    """The no-token probe crashing (here a `ray` that cannot import in its fresh process) joined in silence."""
    broken = tmp_path / "ray"
    broken.mkdir()
    (broken / "__init__.py").write_text("raise ImportError('a broken Ray install')\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    refuse_open(f"127.0.0.1:{free_port()}", 1.0)  # no ClusterError: ray.init's own checks follow
    line = capsys.readouterr().err
    assert "could not check that the Ray cluster at 127.0.0.1:" in line and "refuses clients without a token" in line
    assert "the probe failed: ImportError: a broken Ray install" in line and line.count("\n") == 1, line


# A trainer slow enough to be running when the head goes.
SLOW_TRAINER = """
import time
import numpy as np
from ralph_ray import harness

SLEEP = 1.0  # seconds per epoch

data = harness.load_data()
for epoch in range(1, 61):
    time.sleep(SLEEP)
    harness.report(epoch=epoch, val_acc=0.5, train_loss=1.0 / epoch)
harness.save_predictions(selection=np.zeros(len(data.selection_x), int), test=np.zeros(len(data.test_x), int))
"""


def test_a_lost_head_is_recorded_as_a_crash_with_the_resume_command(tmp_path: Path):
    trainer = tmp_path / "slow"
    trainer.mkdir()
    for part in ("prepare.py", "program.md", "task.yaml"):
        shutil.copy(PROJECT_ROOT / "trainers" / "digits" / part, trainer / part)
    (trainer / "train.py").write_text(textwrap.dedent(SLOW_TRAINER))
    log = tmp_path / "driver.log"
    with head("token") as (address, pgid):
        base = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_AUTH", "RAY_ADDRESS"))}
        with log.open("w") as out:
            driver = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "ralph_ray",
                    f"paths.runs={tmp_path / 'runs'}",
                    f"paths.kb={tmp_path / 'kb'}",
                    "run_id=headless",
                    "cluster=address",
                    f"cluster.address={address}",
                    "cluster.connect_timeout_s=5",
                    f"task.trainer={trainer}",
                    "agent=none",
                    "population.mode=generations",
                    "safeguards.max_cycles=1",
                    "search.num_samples=1",
                    "search.max_concurrent=1",
                    "safeguards.replicates=0",
                    "scheduler=fifo",
                    "~search.space",
                    "+search.space={SLEEP: {type: choice, values: [1.0]}}",
                ],
                # Ray's reconnect window, small for the test: the watch waits it less 10 s (here 10 s), not
                # cluster.connect_timeout_s (5 s: a head back within Ray's window would have been given up on).
                env={
                    **base,
                    "RAY_AUTH_TOKEN": TOKEN,
                    "RAY_USAGE_STATS_ENABLED": "0",
                    "RAY_gcs_rpc_server_reconnect_timeout_s": "20",
                },
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            run_dir = tmp_path / "runs" / "headless"
            deadline = time.monotonic() + 180
            while not list(run_dir.rglob("metrics.jsonl")):  # a trial runs
                assert driver.poll() is None, log.read_text()[-3000:]
                assert time.monotonic() < deadline, log.read_text()[-3000:]
                time.sleep(0.5)
            os.killpg(pgid, signal.SIGKILL)  # the head and everything it started
            lost = time.monotonic()
            code = driver.wait(timeout=120)
        finally:
            with suppress(ProcessLookupError):
                os.killpg(driver.pid, signal.SIGKILL)
    text = log.read_text()
    assert code == 4, text[-3000:]
    assert time.monotonic() - lost < 20  # before Ray's own exit at its window (code 1, nothing recorded)
    assert "has not answered for 10 s" in text, text[-3000:]  # Ray's window less 10 s, not connect_timeout_s
    assert "lost the Ray head" in text and "python -m ralph_ray resume=headless" in text, text[-3000:]
    assert '"status": "crashed"' in (run_dir / "state.json").read_text()
    row = open_reader(tmp_path / "kb").execute("select status, stop_reason from runs where run_id = 'headless'")
    status, reason = row.fetchone()
    assert status == "crashed" and reason.startswith("lost the Ray head"), (status, reason)
