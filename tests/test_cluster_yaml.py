"""cluster.yaml passes Ray's own cluster-config validator."""

from __future__ import annotations

import yaml
from ray.autoscaler._private.util import prepare_config, validate_config

from ralph_ray import PROJECT_ROOT


def test_cluster_yaml_is_valid():
    config = prepare_config(yaml.safe_load((PROJECT_ROOT / "cluster.yaml").read_text()))
    validate_config(config)
    assert config["available_node_types"]["gpu_worker"]["node_config"]["InstanceType"]
