"""A worker node dies mid-trial (ray.cluster_utils, in a process of its own): the trial resumes from its last
checkpoint on another node, the campaign completes, and the KB has every trial and every epoch once."""

from __future__ import annotations

from pathlib import Path

from cluster_scenarios import launch

from ralph_ray.kb import open_reader


def test_a_trial_on_a_lost_node_resumes_from_its_checkpoint_elsewhere(tmp_path: Path):
    result = launch("node_loss", tmp_path)
    killed = result["killed"]
    assert killed, "the killer never saw a trial on node a"
    outcome = result["outcome"]
    assert outcome["exit_code"] == 0
    assert sorted(r["status"] for r in outcome["records"]) == ["completed"] * 2
    assert all(r["epochs"] == 5 for r in outcome["records"])

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
    assert len(trials) == 2 == len({t[0] for t in trials})
    epochs = con.execute(
        "select trial_id, epoch, metric, count(*) from epochs where run_id = 'faults' group by all"
    ).fetchall()
    assert all(count == 1 for *_, count in epochs), "an epoch recorded twice"
    for trial_id, _ in trials:
        assert sorted({e for t, e, _, _ in epochs if t == trial_id}) == list(range(1, 6)), f"{trial_id} lost epochs"
