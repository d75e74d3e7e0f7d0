"""Joining a cluster (cluster=address) through the CLI: the config group, clear exit-2 errors for an
unreachable, refusing or misnamed cluster or a missing token (no traceback, no run recorded), and token auth
that agrees."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator

import pytest
from procs import free_port

from ralph_ray.config import ClusterMode, ConfigError, load_config

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
    with socket.socket() as held:  # nothing is contacted: the token check comes first
        held.bind(("127.0.0.1", 0))
        result = cli(
            tmp_path,
            "cluster=address",
            f"cluster.address=127.0.0.1:{held.getsockname()[1]}",
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
    with socket.socket() as held:  # bound, not listening: refused, and no other process can take the port meanwhile
        held.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{held.getsockname()[1]}"
        result = cli(tmp_path, "cluster=address", f"cluster.address={address}", "run_id=nowhere", RAY_AUTH_TOKEN=TOKEN)
    assert result.returncode == 2, result.stderr
    assert "cannot reach the Ray head at 127.0.0.1" in result.stderr and "ray start --head" in result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    assert not (tmp_path / "runs" / "nowhere").exists()
    assert time.monotonic() - start < 60


@pytest.fixture()
def token_head() -> Iterator[str]:
    """A head started with RAY_AUTH_MODE=token (its own temp dir and port), killed with its process group."""
    temp = tempfile.mkdtemp(prefix="rt", dir="/tmp")  # short: Ray's socket paths live under it
    port = free_port()
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": TOKEN, "RAY_USAGE_STATS_ENABLED": "0"}
    head = subprocess.Popen(
        [
            str(Path(sys.executable).parent / "ray"),
            "start",
            "--head",
            f"--port={port}",
            "--num-cpus=1",
            "--include-dashboard=false",
            f"--dashboard-agent-listen-port={free_port()}",
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
                assert head.poll() is None and time.monotonic() < deadline, "the token-mode head did not start"
                time.sleep(0.5)
        time.sleep(2)  # the GCS port opens before the head's raylet registers
        yield f"127.0.0.1:{port}"
    finally:
        os.killpg(head.pid, signal.SIGKILL)
        head.wait()
        subprocess.run(["rm", "-rf", temp], check=False)


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
    assert "refused this driver's authentication (RAY_AUTH_MODE=disabled here)" in refused.stderr
    wrong = cli(
        tmp_path,
        "cluster=address",
        f"cluster.address={token_head}",
        "cluster.connect_timeout_s=5",
        "run_id=wrong",
        RAY_AUTH_TOKEN="f" * 64,
    )
    assert wrong.returncode == 2, wrong.stderr[-2000:]
    assert "refused this driver's authentication (RAY_AUTH_MODE=token here)" in wrong.stderr
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
