"""A worker node dies mid-trial (ray.cluster_utils, in a process of its own): the trial resumes from its last
checkpoint on another node, the campaign completes, and the KB has every trial and every epoch once."""

from __future__ import annotations

from pathlib import Path

import pytest
from cluster_scenarios import launch

from ralph_ray.kb import open_reader
from ralph_ray.ledger import STOPPED_WITH_CYCLE


@pytest.mark.parametrize("scenario", ["node_loss", "node_loss_async"], ids=["generations", "async"])
def test_a_trial_on_a_lost_node_resumes_from_its_checkpoint_elsewhere(tmp_path: Path, scenario: str):
    result = launch(scenario, tmp_path)
    killed = result["killed"]
    assert killed, "the killer never saw a trial on node a"
    outcome = result["outcome"]
    assert outcome["exit_code"] == 0
    completed = [r for r in outcome["records"] if r["status"] == "completed"]
    if scenario == "node_loss":
        assert sorted(r["status"] for r in outcome["records"]) == ["completed"] * 2
    else:  # async: the seed's 2 samples, and any knob sample a free slot started is cut by the stop
        assert len(completed) >= 2 and killed["trial_id"] in {r["trial_id"] for r in completed}
        assert all(r["reason"] == STOPPED_WITH_CYCLE for r in outcome["records"] if r["status"] != "completed")
    assert all(r["epochs"] == 5 for r in completed)

    runs = {a["folder"]: a for a in result["attempts"] if a["trial_id"] == killed["trial_id"]}
    assert set(runs) == {"a", "b"}
    assert runs["a"]["epochs"][: killed["epochs_before"]] == list(range(1, killed["epochs_before"] + 1))
    resumed = runs["b"]
    assert resumed["restored_checkpoint"] and resumed["node_id"] == result["node_ids"]["b"]
    # It went on after its last checkpoint (the one sent with its last report on node a), not from epoch 1.
    assert resumed["epochs"][0] > 1 and resumed["epochs"][0] >= killed["epochs_before"]
    assert resumed["epochs"] == list(range(resumed["epochs"][0], 6))

    con = open_reader(Path(outcome["kb"]))
    trials = con.execute("select trial_id, status from trials where run_id = 'faults'").fetchall()
    assert len(trials) == len(outcome["records"]) == len({t[0] for t in trials})
    epochs = con.execute(
        "select trial_id, epoch, metric, count(*) from epochs where run_id = 'faults' group by all"
    ).fetchall()
    assert all(count == 1 for *_, count in epochs), "an epoch recorded twice"
    for trial_id, status in trials:
        if status == "completed":
            assert sorted({e for t, e, _, _ in epochs if t == trial_id}) == list(range(1, 6)), f"{trial_id} lost epochs"
