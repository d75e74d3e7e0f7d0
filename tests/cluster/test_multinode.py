"""Campaigns on a multi-node cluster (ray.cluster_utils, in a process of its own): trials spread over nodes,
GPU trials only on the GPU node, and no trial reads or works through a path of the driver's node."""

from __future__ import annotations

from pathlib import Path

import pytest
from cluster_scenarios import launch

from ralph_ray.harness import PUBLIC_FILES
from ralph_ray.kb import open_reader


@pytest.fixture(scope="module")
def multinode(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("multinode")
    return out, launch("multinode", out)


def run_of(attempt: dict) -> str:
    return Path(attempt["work_dir"]).parts[-4]  # <node>/work/<run_id>/cycle_0001/trials/<trial_id>


def test_cpu_trials_spread_over_nodes_and_data_comes_from_each_nodes_cache(multinode):
    out, result = multinode
    assert result["cpu"]["exit_code"] == 0
    attempts = [a for a in result["attempts"] if run_of(a) == "cpu"]
    assert sorted(a["trial_id"] for a in attempts) == sorted(r["trial_id"] for r in result["cpu"]["records"])
    assert {a["folder"] for a in attempts} == {"a", "gpu"}, "trials should land on both worker nodes"
    for attempt in attempts:
        folder = out / attempt["folder"]
        assert attempt["node_id"] == result["node_ids"][attempt["folder"]]
        # Data from the node's own cache (shipped in the trial spec), work in the node's own folder.
        assert Path(attempt["data_dir"]).parent == folder / "cache"
        assert sorted(p.name for p in Path(attempt["data_dir"]).iterdir()) == sorted(PUBLIC_FILES)
        assert Path(attempt["work_dir"]).is_relative_to(folder / "work")
        assert not list(Path(attempt["work_dir"]).rglob("*.npy")), "a work dir holds no data"
        if attempt["folder"] == "gpu":
            assert attempt["cuda_visible_devices"] == "" and attempt["gpu_ids"] == [], (
                "a CPU trial must not see the node's GPU"
            )
    # Nothing ran in the driver's run dir, and every trial reached the driver's KB once, scored there.
    assert not (Path(result["cpu"]["run_dir"]) / "cycle_0001" / "trials").exists()
    rows = (
        open_reader(Path(result["cpu"]["kb"]))
        .execute("select trial_id, status, selection_score from trials where run_id = 'cpu'")
        .fetchall()
    )
    assert len(rows) == 2 == len({r[0] for r in rows})
    assert all(status == "completed" and 0.0 <= score <= 1.0 for _, status, score in rows)  # scored by the driver


def test_gpu_trials_run_only_on_the_gpu_node_and_see_their_gpu(multinode):
    out, result = multinode
    assert result["gpu"]["exit_code"] == 0
    attempts = [a for a in result["attempts"] if run_of(a) == "gpu"]
    assert len(attempts) == 2
    for attempt in attempts:
        assert attempt["folder"] == "gpu" and attempt["node_id"] == result["node_ids"]["gpu"]
        assert attempt["gpu_ids"] == ["0"] and attempt["cuda_visible_devices"] == "0"
    assert {r["status"] for r in result["gpu"]["records"]} == {"completed"}
    # The node's GPU is a logical one and digits' trainer never asks for CUDA: the campaign says so, once.
    assert result["never_started_cuda"] == {"cpu": 0, "gpu": 1}
