"""cluster.yaml (AWS) and cluster-onprem.yaml (Ray's local provider) pass Ray's own cluster-config validator and
run every node with token auth: the user's token mounted on each node (mode 600), head and workers started
with RAY_AUTH_MODE=token, no `disabled` anywhere."""

from __future__ import annotations

import re

import pytest
import yaml
from ray.autoscaler._private.util import prepare_config, validate_config

from ralph_ray import PROJECT_ROOT
from ralph_ray.raycluster import RAY_ENV_DEFAULTS

FILES = ("cluster.yaml", "cluster-onprem.yaml")
TOKEN = "~/.ray/auth_token"
# What a node's raylet reads (RAY_AIR_NEW_OUTPUT is the driver's console and travels with the campaign).
NODE_ENV = {k: v for k, v in RAY_ENV_DEFAULTS.items() if k != "RAY_AIR_NEW_OUTPUT"}


def load(name: str) -> dict:
    config = prepare_config(yaml.safe_load((PROJECT_ROOT / name).read_text()))
    validate_config(config)
    return config


def test_aws_cluster_yaml_is_valid_with_gpu_workers():
    config = load("cluster.yaml")
    worker = config["available_node_types"]["gpu_worker"]
    assert worker["node_config"]["InstanceType"].startswith("g") and worker["resources"]["GPU"] >= 1
    assert worker["min_workers"] == 0 and config["head_node_type"] == "head"
    assert "~/ralph_ray" in config["file_mounts"]
    setup = " ".join(config["setup_commands"])
    assert "pip install -q torch" in setup and "pip install -q -e ." in setup


@pytest.mark.parametrize("name", FILES)
def test_every_node_gets_the_users_token_privately_and_runs_ray_with_token_auth(name: str):
    config = load(name)
    assert config["file_mounts"][TOKEN] == TOKEN  # the token of the machine running `ray up`, at Ray's default path
    setup = config["setup_commands"]
    chmod = next((i for i, c in enumerate(setup) if "chmod 600 ~/.ray/auth_token" in c), None)
    assert chmod is not None, "the mounted token must be made private (600) on every node"
    assert "chmod 700 ~/.ray" in setup[chmod]
    # ~/.bashrc: `ray attach` shells, `ray exec` and the campaign (cluster.auth_mode=token) agree with the nodes.
    assert any("export RAY_AUTH_MODE=token" in c and ">> ~/.bashrc" in c for c in setup)
    for kind in ("head_start_ray_commands", "worker_start_ray_commands"):
        starts = [c for c in config[kind] if "ray start" in c]
        assert starts and all("RAY_AUTH_MODE=token" in c.split("ray start")[0] for c in starts), kind
    assert "disabled" not in (PROJECT_ROOT / name).read_text()
    assert "get-auth-token --generate" in (PROJECT_ROOT / name).read_text()  # how to make the token before `ray up`


@pytest.mark.parametrize("kind", ["head_start_ray_commands", "worker_start_ray_commands"])
def test_onprem_cluster_yaml_is_valid_and_never_runs_a_bare_ray_stop(kind: str):
    config = load("cluster-onprem.yaml")
    assert config["provider"]["type"] == "local" and config["provider"]["worker_ips"]
    assert config["auth"]["ssh_user"] and config["auth"]["ssh_private_key"]
    commands = config[kind]
    assert commands and any("ray start" in c for c in commands)
    assert not [c for c in commands if re.search(r"\bray stop\b", c)], (
        "ray stop would stop every Ray of the user on the machine"
    )


@pytest.mark.parametrize("name", FILES)
def test_every_ray_start_runs_with_the_environment_a_local_ray_gets(name: str):
    """A cluster's raylets get what ensure_ray gives a local one (trials at niceness 0, Tune's reuse wait, ...)."""
    config = load(name)
    for kind in ("head_start_ray_commands", "worker_start_ray_commands"):
        for command in (c for c in config[kind] if "ray start" in c):
            before = command.split("ray start")[0]
            missing = [f"{k}={v}" for k, v in NODE_ENV.items() if f"{k}={v}" not in before]
            assert not missing, f"{name} {kind}: ray start without {missing}"
