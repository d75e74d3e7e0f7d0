"""scheduler=pbt: Ray Tune's population based training over a cycle's trials, its segments in the KB, and the
refusal of trainers that cannot resume."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from ray import tune
from ray.train._internal.storage import StorageContext
from ray.tune.execution.tune_controller import TuneController
from ray.tune.experiment import Trial
from ray.tune.schedulers import TrialScheduler

from ralph_ray import sandbox
from ralph_ray.campaign import run
from ralph_ray.config import ConfigError, load_config
from ralph_ray.kb import open_reader
from ralph_ray.pbt import SegmentLog, drop_stale_decision, mutations
from ralph_ray.resumable import missing_resume_calls

PBT = [
    "scheduler=pbt",
    "scheduler.max_t=4",
    "scheduler.perturbation_interval=2",
    "scheduler.quantile_fraction=0.5",
    "scheduler.mutate=[LR,BATCH_SIZE]",
    "search.num_samples=4",
    "search.max_concurrent=4",  # the population trains together (synchronous PBT pauses all at each boundary)
    "resources.cpu=0.5",
    "safeguards.trial_timeout_s=120",
    "+search.space.EPOCHS={type: choice, values: [4]}",
    "population.parents=1",
    "population.children_per_parent=2",
    "population.trials_per_child=2",
    "safeguards.replicates=0",
]


def pbt_config(tmp: Path, *overrides: str):
    base = [f"paths.runs={tmp / 'runs'}", f"paths.kb={tmp / 'kb'}", *PBT]
    if sandbox.available() is not None:  # no bubblewrap here
        base.append("sandbox=none")
    return load_config(base + list(overrides))


@pytest.mark.slow
def test_a_two_cycle_pbt_campaign_records_segments_and_exploits(ray_session, tmp_path: Path):
    outcome = run(pbt_config(tmp_path, "run_id=pbt", "safeguards.max_cycles=2"))
    assert outcome.exit_code == 0 and outcome.stop_reason == "max_cycles"
    con = open_reader(tmp_path / "kb")
    trials = con.execute(
        "select trial_id, cycle, status, epochs, variant_id, knobs, selection_score from trials where run_id = 'pbt' "
        "and trial_id in (select trial_id from segments)"
    ).fetchall()
    assert len(trials) == 8 and {t[1] for t in trials} == {1, 2}  # 4 seed trials, 2 children x 2
    # PBT stops no trial (a child that trains longer, longer_training, runs past 4 epochs)
    assert all(t[2] == "completed" and t[3] >= 4 and t[6] is not None for t in trials)
    for trial_id, _, _, epochs, variant, knobs, _ in trials:
        segments = con.execute(
            "select segment, from_epoch, to_epoch, variant_id, knobs, donor_trial_id, donor_epoch from segments "
            "where run_id = 'pbt' and trial_id = ? order by segment",
            [trial_id],
        ).fetchall()
        # The segments partition the trial's epochs 1..N (synchronous PBT: every clone starts where it stopped).
        assert segments[0][1] == 1 and segments[-1][2] == epochs
        assert all(later[1] == earlier[2] + 1 for earlier, later in zip(segments, segments[1:]))
        assert sum(s[2] - s[1] + 1 for s in segments) == epochs
        curve = con.execute(
            "select count(distinct epoch) from epochs where run_id = 'pbt' and trial_id = ?", [trial_id]
        ).fetchone()
        assert curve == (epochs,)
        assert segments[-1][3] == variant and json.loads(segments[-1][4]) == json.loads(knobs)  # the trial's row
        for _, from_epoch, _, _, _, donor, donor_epoch in segments[1:]:
            assert donor is None or donor_epoch == from_epoch - 1
    exploits = con.execute(
        "select cycle, trial_id, donor_trial_id, variant_id from segments where run_id = 'pbt' "
        "and donor_trial_id is not null"
    ).fetchall()
    assert {cycle for cycle, *_ in exploits} == {1, 2}, "each cycle's population should exploit at least once"
    ids = {t[0]: t[1] for t in trials}
    assert all(ids[donor] == cycle and donor != trial for cycle, trial, donor, _ in exploits)  # within its cycle
    # Storage keeps every checkpoint a PBT trial saved (search.PBT_CHECKPOINTS): a clone restores its donor's
    # boundary checkpoint after the donor may have saved newer ones; with only the newest kept, each trial here
    # would hold one (it saves at each boundary it pauses at, epochs 2 and 4, and at its end).
    for trial_id, cycle, *_ in trials:
        kept = list(
            (tmp_path / "runs" / "pbt").glob(f"cycle_{cycle:04d}/tune/cycle_{cycle:04d}/{trial_id}/checkpoint_*")
        )
        assert len(kept) >= 2, f"trial {trial_id} kept {len(kept)} checkpoint(s)"


def test_trainers_that_cannot_resume_are_refused(tmp_path: Path):
    task = tmp_path / "task"
    task.mkdir()
    source = (Path(__file__).resolve().parents[1] / "trainers" / "digits" / "train.py").read_text()
    assert missing_resume_calls(source) == []
    lacking = source.replace("harness.load_checkpoint()", "None")
    assert missing_resume_calls(lacking) == ["harness.load_checkpoint"]
    with pytest.raises(ConfigError, match="scheduler.mutate"):
        pbt_config(tmp_path, "scheduler.mutate=[DEPTH]")
    with pytest.raises(ConfigError, match="population.mode=generations"):
        pbt_config(tmp_path, "population.mode=async")


def test_choices_mutate_to_neighbours_and_the_variant_never_mutates():
    space = {
        "variant": tune.choice(["a", "b"]),
        "BATCH_SIZE": tune.choice([128, 32, 64]),
        "LR": tune.loguniform(0.01, 1),
    }
    found = mutations(space, None)
    assert found["BATCH_SIZE"] == [32, 64, 128] and "variant" not in found and found["LR"] is space["LR"]
    assert list(mutations(space, ["LR"])) == ["LR"]


def test_segments_follow_exploits_pauses_and_retries():
    log = SegmentLog()
    a, b = {"variant": "v1", "LR": 0.1}, {"variant": "v2", "LR": 0.12}
    for epoch in (1, 2):
        log.observe("t1", epoch, a)
    log.observe("t1", 3, a)  # reported just before a pause: the restart from epoch 2's checkpoint replaces it
    log.exploited("t1", "t2", 2)
    for epoch in (3, 4):
        log.observe("t1", epoch, b)
    rows = log.rows("r", 1, "t1", lambda config: {"LR": config["LR"]})
    assert [(r["from_epoch"], r["to_epoch"], r["variant_id"], r["donor_trial_id"]) for r in rows] == [
        (1, 2, "v1", None),
        (3, 4, "v2", "t2"),
    ]
    assert json.loads(rows[1]["knobs"]) == {"LR": 0.12} and log.exploits == 1

    # The result that triggers a synchronous perturbation reaches the ledger after the scheduler cloned into its
    # trial: that report still closes the old segment.
    log.observe("t3", 1, a)
    log.exploited("t3", "t2", 2, before=2)
    log.observe("t3", 2, b)
    log.observe("t3", 3, b)
    rows = log.rows("r", 1, "t3", lambda config: {"LR": config["LR"]})
    assert [(r["from_epoch"], r["to_epoch"], r["variant_id"], r["donor_trial_id"]) for r in rows] == [
        (1, 2, "v1", None),
        (3, 3, "v2", "t2"),
    ]


def test_an_exploited_trial_forgets_the_stop_that_tune_cached_for_its_lost_save(ray_session, tmp_path: Path):
    # Ray Tune 2.60 (ray-project/ray#57906): an exploit of a trial whose pause is saving caches a STOP and drops the
    # save; the stale STOP then ended the restarted trial at its next checkpoint (3 of 12 two-cycle campaigns).
    storage = StorageContext(storage_path=str(tmp_path), experiment_dir_name="pbt")
    controller = TuneController(storage=storage)
    paused, running = (Trial("__fake", config={"LR": 0.1}, stub=True, storage=storage) for _ in range(2))
    for trial in (paused, running):
        controller.add_trial(trial)
        controller._cached_trial_decisions[trial.trial_id] = TrialScheduler.STOP  # what the bug leaves behind
    controller._set_trial_status(paused, Trial.PAUSED)
    controller._set_trial_status(running, Trial.RUNNING)
    wrapped = controller._wrapped()  # what a scheduler is handed
    drop_stale_decision(wrapped, paused)
    drop_stale_decision(wrapped, running)
    # The exploited (paused) trial restarts clean; a running trial's pending decision is Tune's to keep.
    assert controller._cached_trial_decisions == {running.trial_id: TrialScheduler.STOP}
