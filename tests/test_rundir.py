"""The run dir's folders: a place a campaign can't write stops it at once, naming the key and the fix (exit 2)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from ralph_ray.__main__ import main
from ralph_ray.config import load_config, resume_config
from ralph_ray.decision import StopReason
from ralph_ray.exit_codes import ExitCode
from ralph_ray.rundir import CampaignError, ensure_writable, spent_on_resume
from ralph_ray.state import CampaignState, Phase, RunStatus


@pytest.mark.parametrize("key", ["paths.runs", "paths.kb"])
def test_an_unwritable_folder_exits_2_naming_the_key(key: str, tmp_path: Path) -> None:
    other = "paths.kb" if key == "paths.runs" else "paths.runs"
    done = subprocess.run(
        [sys.executable, "-m", "ralph_ray", f"{key}=/proc/ralph_ray_x", f"{other}={tmp_path / 'o'}", "sandbox=none"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert done.returncode == ExitCode.safeguard_or_config, done.stderr[-2000:]
    assert f"{key}=/proc/ralph_ray_x cannot be created" in done.stderr and "Traceback" not in done.stderr


def test_a_writable_folder_is_checked_and_left_unmade(tmp_path: Path) -> None:
    ensure_writable("paths.runs", tmp_path / "a" / "b")
    assert not (tmp_path / "a").exists()  # the probe leaves nothing behind (a later check may still stop the run)
    (tmp_path / "kept").mkdir()
    ensure_writable("paths.runs", tmp_path / "kept")
    assert (tmp_path / "kept").is_dir()
    (tmp_path / "file").write_text("")
    with pytest.raises(CampaignError, match="paths.kb"):
        ensure_writable("paths.kb", tmp_path / "file" / "kb")  # a file in the way


def _finished_run(runs: Path, stop: StopReason, cycle: int, elapsed_s: float, *overrides: str) -> Path:
    """A run dir as a campaign leaves it when a stop rule ends it: config.yaml, state.json, the last decision.json."""
    cfg = load_config([f"paths.runs={runs}", "safeguards.campaign_time_s=240", "safeguards.max_cycles=5", *overrides])
    run_dir = runs / "r1"
    (run_dir / f"cycle_{cycle:04d}").mkdir(parents=True)
    (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.structured(cfg)))
    cut = Phase.train if stop is StopReason.campaign_time else None  # the time budget cut the trials of its cycle
    state = CampaignState("r1", Phase.done, RunStatus.finished, cycle, stop_reason=stop.value, elapsed_s=elapsed_s)
    state.interrupted = cut
    state.save(run_dir)
    decision = {"cycle": cycle, "reason": stop.value, "elapsed_s": elapsed_s, "tokens_campaign": 0, "cost_campaign": 0}
    (run_dir / f"cycle_{cycle:04d}" / "decision.json").write_text(json.dumps(decision))
    return run_dir


def test_resuming_a_run_with_its_time_spent_names_the_override_before_ray_starts(tmp_path: Path, capsys) -> None:
    """A user trial: `resume=RUN_ID` of a run stopped on its time budget started Ray, then `decide stop
    (campaign_time)`, exit 2, without a word of safeguards.campaign_time_s."""
    runs = tmp_path / "runs"
    run_dir = _finished_run(runs, StopReason.campaign_time, 3, 248.0)
    assert main(["resume=r1", f"paths.runs={runs}"]) == ExitCode.safeguard_or_config
    said = capsys.readouterr().err
    assert "the campaign ran 248s, past safeguards.campaign_time_s=240" in said, said
    command = f"python -m ralph_ray resume=r1 paths.runs={runs} safeguards.campaign_time_s=488"
    assert command in said and not (tmp_path / "kb").exists()  # refused before the run or the KB was opened
    assert CampaignState.load(run_dir).status is RunStatus.finished  # and left as it was
    # the command it names goes on
    assert spent_on_resume(run_dir, resume_config(run_dir, command.split()[3:]).safeguards) == []


def test_a_resume_with_something_left_to_run_is_not_refused(tmp_path: Path) -> None:
    run_dir = _finished_run(tmp_path / "a", StopReason.max_cycles, 5, 100.0)
    guards = resume_config(run_dir).safeguards
    assert [s.override for s in spent_on_resume(run_dir, guards)] == ["safeguards.max_cycles=10"]
    state = CampaignState.load(run_dir)
    state.interrupted = Phase.train  # a manual stop at the last cycle: a resume runs the trials it cut short
    state.save(run_dir)
    assert spent_on_resume(run_dir, guards) == []
    state.status = RunStatus.crashed  # a crash: the resume finishes the cycle first
    state.interrupted = None
    state.save(run_dir)
    assert spent_on_resume(run_dir, guards) == []
    assert spent_on_resume(run_dir, resume_config(run_dir, ["safeguards.max_cycles=8"]).safeguards) == []


def test_each_variants_meta_json_says_its_verdict_once_judged(tmp_path: Path) -> None:
    """User trial: variants/*/meta.json kept `status: candidate` for kept and discarded children alike. The record
    phase saves the verdicts: each judged child's meta.json now says its own (the KB's) status and reason."""
    from ralph_ray.children import judge, knob_child, seed_child
    from ralph_ray.population import Candidate
    from ralph_ray.rundir import CycleFiles
    from ralph_ray.variants import VariantStatus

    trainer, run_dir = tmp_path / "task", tmp_path / "runs" / "r1"
    trainer.mkdir()
    (trainer / "train.py").write_text("LR = 0.1  # learning rate\n")
    seed = seed_child(trainer, run_dir / "variants")
    parent = Candidate(seed.variant_id, 0.80, {"LR": 0.1}, seed.variant_id)
    children = []
    for lr in (0.2, 0.3):
        baked = tmp_path / f"baked_{lr}"
        baked.mkdir()
        (baked / "train.py").write_text(f"LR = {lr}  # learning rate\n")
        children.append(knob_child(parent, baked, run_dir / "variants"))
    files = CycleFiles(run_dir, 2)
    files.save_children(children)  # as the write phase saves them
    meta = [json.loads((c.files_dir.parent / "meta.json").read_text()) for c in children]
    assert [m["status"] for m in meta] == ["candidate", "candidate"]

    better, worse = children
    judge(children, {better.variant_id: (0.90, 0.88), worse.variant_id: (0.70, 0.69)}, {}, 0.0)
    files.save_children(children)  # as the record phase saves the verdicts
    meta = [json.loads((c.files_dir.parent / "meta.json").read_text()) for c in children]
    assert [m["status"] for m in meta] == [VariantStatus.kept.value, VariantStatus.discarded.value]
    assert [m["reason"] for m in meta] == [better.reason, worse.reason] and "diff" not in meta[0]
    assert not (trainer / "meta.json").exists() and not (tmp_path / "meta.json").exists()  # the user's folder: no


def test_a_resume_while_the_runs_driver_is_alive_is_refused_before_anything_is_written(tmp_path: Path, capsys) -> None:
    """User trial: `resume=RUN` while RUN's driver still trained on the same host started a second driver on its run
    dir; the two overwrote state.json and both wrote a final decision. The recorded driver's process decides."""
    from ralph_ray import liveness
    from ralph_ray.rundir import refuse_live_driver

    runs, kb = tmp_path / "runs", tmp_path / "kb"
    run_dir = _finished_run(runs, StopReason.max_cycles, 1, 10.0)
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        state = CampaignState.load(run_dir)
        state.status, state.phase = RunStatus.running, Phase.train
        state.driver = {**liveness.this_driver(), "pid": process.pid, "started": liveness._start_ticks(process.pid)}
        state.save(run_dir)
        recorded = (run_dir / "state.json").read_bytes()
        assert main(["resume=r1", f"paths.runs={runs}", f"paths.kb={kb}"]) == ExitCode.safeguard_or_config
        said = " ".join(capsys.readouterr().err.split())
        assert f"run r1 is still running (its driver, PID {process.pid} on {state.driver['host']}, is alive" in said
        assert f"python -m ralph_ray stop r1 paths.runs={runs} paths.kb={kb}" in said, said
        assert (run_dir / "state.json").read_bytes() == recorded and not kb.exists()  # nothing written, no Ray
    finally:
        process.kill()
        process.wait()
    assert refuse_live_driver(run_dir, runs, kb) is None  # its driver is gone: the resume goes on
    state.driver = {**state.driver, "host": "elsewhere"}  # a driver this machine cannot check: said, not refused
    state.save(run_dir)
    note = refuse_live_driver(run_dir, runs, kb)
    assert note and "cannot check (PID" in note and "on elsewhere" in note and "resuming anyway" in note


def test_a_run_that_ended_is_resumed_though_its_driver_process_lives_on(tmp_path: Path, capsys) -> None:
    """Review: a run recorded finished or interrupted whose driver process lives on (a notebook that called
    campaign.run; the CLI still shutting Ray down after Ctrl-C) was refused as still running, and the advised `stop`
    answered "not running; nothing to stop". Only a run recorded running with a live driver is refused; an ended one
    is said to have a driver still exiting, and goes on."""
    from ralph_ray import liveness
    from ralph_ray.rundir import refuse_live_driver

    runs, kb = tmp_path / "runs", tmp_path / "kb"
    run_dir = _finished_run(runs, StopReason.campaign_time, 3, 248.0)  # spent: no campaign
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        state = CampaignState.load(run_dir)
        state.driver = {**liveness.this_driver(), "pid": process.pid, "started": liveness._start_ticks(process.pid)}
        state.save(run_dir)  # recorded finished, its driver alive and not done: its final writes (final training,
        with pytest.raises(CampaignError, match="is still running"):  # compaction, report) may still be going on
            refuse_live_driver(run_dir, runs, kb)
        state.driver["done"] = True  # campaign._driver_done: it writes the run no more
        for status in (RunStatus.interrupted, RunStatus.crashed, RunStatus.finished):
            state.status = status
            state.save(run_dir)
            note = refuse_live_driver(run_dir, runs, kb)
            assert note and f"recorded {status.value}" in note and f"PID {process.pid}" in note, note
            assert "still exiting" in note and "resuming" in note and "stop" not in note, note
        # the command line: the warning, then the resume's own checks (here: the spent time budget, exit 2)
        assert main(["resume=r1", f"paths.runs={runs}", f"paths.kb={kb}"]) == ExitCode.safeguard_or_config
        said = " ".join(capsys.readouterr().err.split())
        assert "warning: run r1 is recorded finished" in said and "is still running" not in said, said
        assert "safeguards.campaign_time_s=" in said, said
        state.status, state.driver["done"] = RunStatus.running, False  # running, its driver alive: refused
        state.save(run_dir)
        with pytest.raises(CampaignError, match=f"run r1 is still running .its driver, PID {process.pid}"):
            refuse_live_driver(run_dir, runs, kb)
    finally:
        process.kill()
        process.wait()


def _finished_async_run(runs: Path, closed: int, spends: dict[int, int], stop: StopReason) -> Path:
    """An async run dir as asyncrun leaves it: state.json's cycle counts closed generations, and each decision.json
    lies under generations/gen_<named>/, named by the deepest generation with a verdict (not the closed count)."""
    guards = ["safeguards.max_cycles=3", "safeguards.tokens_per_campaign=1000"]
    cfg = load_config([f"paths.runs={runs}", "population.mode=async", *guards])
    run_dir = runs / "r1"
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.structured(cfg)))
    state = CampaignState("r1", Phase.done, RunStatus.finished, closed, stop_reason=stop.value, elapsed_s=50.0)
    state.save(run_dir)
    for generation, tokens in spends.items():
        folder = run_dir / "generations" / f"gen_{generation:04d}"
        folder.mkdir(parents=True)
        last = generation == max(spends)
        decision = {"cycle": generation, "reason": stop.value if last else "continue", "elapsed_s": 50.0,
                    "tokens_campaign": tokens, "cost_campaign": 0.0}  # fmt: skip
        (folder / "decision.json").write_text(json.dumps(decision))
    return run_dir


def test_an_async_runs_spent_tokens_are_read_from_its_last_decision_not_the_closed_generation_count(
    tmp_path: Path,
) -> None:
    """Review: 1 parent x 2 children, max_cycles=3, stopped on tokens_per_campaign: state.cycle is 3 (closed
    generations) but the last decision.json is gen_0002's, so the spend read 0 and a plain resume was not refused.
    The other way round (fewer closed than named) an older continue's stale spend was read."""
    run_dir = _finished_async_run(tmp_path / "a", 3, {1: 400, 2: 1200}, StopReason.token_budget)
    guards = resume_config(run_dir).safeguards
    assert "safeguards.tokens_per_campaign" in [s.key for s in spent_on_resume(run_dir, guards)]
    run_dir = _finished_async_run(tmp_path / "b", 1, {1: 400, 2: 1200}, StopReason.token_budget)
    assert "safeguards.tokens_per_campaign" in [s.key for s in spent_on_resume(run_dir, guards)]
    assert spent_on_resume(run_dir, resume_config(run_dir, ["safeguards.tokens_per_campaign=5000"]).safeguards) == []
