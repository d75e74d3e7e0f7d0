"""cluster.yaml (AWS) and cluster-onprem.yaml (Ray's local provider) pass Ray's own cluster-config validator."""

from __future__ import annotations

import re

import pytest
import yaml
from ray.autoscaler._private.util import prepare_config, validate_config

from ralph_ray import PROJECT_ROOT


def load(name: str) -> dict:
    config = prepare_config(yaml.safe_load((PROJECT_ROOT / name).read_text()))
    validate_config(config)
    return config


def test_aws_cluster_yaml_is_valid_with_gpu_workers_and_one_auth_mode():
    config = load("cluster.yaml")
    worker = config["available_node_types"]["gpu_worker"]
    assert worker["node_config"]["InstanceType"].startswith("g") and worker["resources"]["GPU"] >= 1
    assert worker["min_workers"] == 0 and config["head_node_type"] == "head"
    assert "~/ralph_ray" in config["file_mounts"]
    setup = " ".join(config["setup_commands"])
    assert "pip install -q torch" in setup and "pip install -q -e ." in setup
    for commands in (config["head_start_ray_commands"], config["worker_start_ray_commands"]):
        assert any("RAY_AUTH_MODE=disabled" in c and "ray start" in c for c in commands)
    assert "RAY_AUTH_MODE=disabled" in setup  # written to ~/.bashrc: `ray attach` shells and the driver agree too


@pytest.mark.parametrize("kind", ["head_start_ray_commands", "worker_start_ray_commands"])
def test_onprem_cluster_yaml_is_valid_and_never_runs_a_bare_ray_stop(kind: str):
    config = load("cluster-onprem.yaml")
    assert config["provider"]["type"] == "local" and config["provider"]["worker_ips"]
    assert config["auth"]["ssh_user"] and config["auth"]["ssh_private_key"]
    commands = config[kind]
    assert commands and any("ray start" in c for c in commands)
    assert not [c for c in commands if re.search(r"\bray stop\b", c)], "ray stop would stop every Ray of the user on the machine"
    assert "RAY_AUTH_MODE=disabled" in " ".join(config["setup_commands"])
