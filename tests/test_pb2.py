"""scheduler=pb2: Ray Tune's PB2 (a Gaussian-process bandit picks the explored knobs) through the same recording
PBT path: one cycle whose segments record an exploit step, and the refusal of knobs PB2 cannot bound."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from ray import tune
from test_pbt import PBT

from ralph_ray import sandbox
from ralph_ray.campaign import run
from ralph_ray.config import ConfigError, load_config
from ralph_ray.kb import open_reader
from ralph_ray.pbt import RecordingPB2, SegmentLog, bounds, scheduler


def pb2_config(tmp: Path, *overrides: str):
    base = [f"paths.runs={tmp / 'runs'}", f"paths.kb={tmp / 'kb'}", *PBT, "scheduler=pb2", "scheduler.mutate=[LR]"]
    if sandbox.available() is not None:  # no bubblewrap here
        base.append("sandbox=none")
    return load_config(base + list(overrides))


@pytest.mark.slow
def test_a_pb2_cycle_records_segments_and_an_exploit_with_a_bounded_lr(ray_session, tmp_path: Path):
    cfg = pb2_config(tmp_path, "run_id=pb2", "safeguards.max_cycles=1")
    low, high = cfg.search.space["LR"].low, cfg.search.space["LR"].high
    outcome = run(cfg)
    assert outcome.exit_code == 0
    con = open_reader(tmp_path / "kb")
    rows = con.execute(
        "select trial_id, status, epochs from trials where run_id = 'pb2' "
        "and trial_id in (select trial_id from segments)"
    ).fetchall()
    assert len(rows) == 4 and all(status == "completed" and epochs == 4 for _, status, epochs in rows)
    segments = con.execute(
        "select trial_id, from_epoch, to_epoch, knobs, donor_trial_id from segments where run_id = 'pb2'"
    ).fetchall()
    for trial_id, _, epochs in rows:
        mine = [s for s in segments if s[0] == trial_id]
        assert sum(s[2] - s[1] + 1 for s in mine) == epochs  # the segments partition the trial's epochs
    exploits = [s for s in segments if s[4] is not None]
    assert exploits, "the population should exploit at least once (quantile_fraction=0.5, a boundary at epoch 2)"
    for *_, knobs, _ in exploits:  # the bandit's LR stays within the knob's search range
        assert low <= json.loads(knobs)["LR"] <= high


def test_pb2_bounds_the_real_valued_knobs_and_refuses_others(tmp_path: Path):
    space = {"variant": tune.choice(["a"]), "LR": tune.loguniform(0.01, 0.2)}
    assert bounds(space, ["LR"]) == {"LR": [0.01, 0.2]}
    assert isinstance(scheduler(SegmentLog(), space, 2, 0.25, 0.0, ["LR"], True, bandit=True), RecordingPB2)
    with pytest.raises(ConfigError, match="real-valued knobs only"):
        pb2_config(tmp_path, "scheduler.mutate=[LR,BATCH_SIZE]")
