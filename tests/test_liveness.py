"""The staleness rule of the app and `ralph-ray status` (ralph_ray.liveness): the recorded driver's process where
it can be read, else silence past every phase's length."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from omegaconf import OmegaConf

# what an LLM or CLI backend needs to load (nothing is called)
AGENT_KEYS = [
    "agent.model=m",
    "agent.base_url=http://localhost:1/v1",
    "agent.api_key_env=null",
    "agent.cli_command='true {prompt_file}'",
]


def _stored(overrides: list[str]) -> dict:
    """A run's config.yaml as `status` reads it back: the composed config, stored and loaded as a dict."""
    from ralph_ray.config import load_config

    cfg = load_config([*overrides, *AGENT_KEYS])
    raw = OmegaConf.to_container(OmegaConf.create(OmegaConf.to_yaml(OmegaConf.structured(cfg))))
    assert isinstance(raw, dict)
    return raw


@pytest.mark.parametrize("agent", ["agent=cli", "agent=openai", "agent=hybrid"])
def test_a_live_write_phase_is_never_taken_for_a_dead_driver(agent: str, monkeypatch):
    """Review: the write phase of a generations run saves nothing until every child is bred (coder calls, gate smoke
    runs), but the silence limit was the longest trial + 60 s (660 s), so `status` called a live run stopped
    unexpectedly and printed a resume that starts a second driver on the same run dir."""
    from ralph_ray import liveness

    monkeypatch.delenv(liveness.STALE_ENV, raising=False)
    config = _stored([agent, "population.mode=generations"])
    agent_cfg, guards = config["agent"], config["safeguards"]
    backend = agent_cfg["hybrid_llm"] if agent_cfg["backend"] == "hybrid" else agent_cfg["backend"]
    call = {
        "cli": agent_cfg["cli_timeout_s"],
        "openai": agent_cfg["timeout_s"] * (agent_cfg["http_retries"] + 1) * (agent_cfg["answer_retries"] + 1),
    }.get(backend, 0.0)
    # one child, bred with every gate retry: a coder call and a smoke run each time
    child = (agent_cfg["max_retries"] + 1) * (call + guards["smoke_timeout_s"])
    assert liveness.stale_after_s(config) >= child + 60 > 660
    assert not liveness.is_stale("running", child, config)


def test_the_silence_limit_counts_the_agent_calls_of_the_configured_backend(monkeypatch):
    from ralph_ray import liveness

    monkeypatch.delenv(liveness.STALE_ENV, raising=False)
    agent = {"timeout_s": 200, "http_retries": 1, "answer_retries": 0, "cli_timeout_s": 900, "max_retries": 0}
    shape = {"population": {"parents": 1, "children_per_parent": 1}}
    assert liveness.stale_after_s({**shape, "agent": {**agent, "backend": "openai"}}) == 400 + 60
    assert liveness.stale_after_s({**shape, "agent": {**agent, "backend": "cli"}}) == 900 + 60
    assert liveness.stale_after_s({**shape, "agent": {**agent, "backend": "heuristic"}}) == 300  # no LLM: the floor
    # 4 children, 2 bred at once, 1 gate retry each: 2 rounds of 2 x (coder call + smoke run)
    wide = {"population": {"parents": 2, "children_per_parent": 2}, "safeguards": {"smoke_timeout_s": 50}}
    cli = {**agent, "backend": "cli", "max_retries": 1, "concurrency": 2}
    assert liveness.stale_after_s({**wide, "agent": cli}) == 2 * 2 * (900 + 50) + 60


def test_status_of_a_quiet_run_in_its_write_phase_says_running(tmp_path: Path, capsys, monkeypatch):
    """The CLI applies the same rule: 20 minutes without a row in a CLI coder's write phase is no dead driver."""
    from ralph_ray import liveness
    from ralph_ray.__main__ import main
    from ralph_ray.state import CampaignState, Phase, RunStatus

    monkeypatch.delenv(liveness.STALE_ENV, raising=False)
    run_dir = tmp_path / "runs" / "r1"
    run_dir.mkdir(parents=True)
    CampaignState("r1", phase=Phase.write, status=RunStatus.running, cycle=2).save(run_dir)
    (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(_stored(["agent=cli", "population.mode=generations"])))
    then = time.time() - 1200
    os.utime(run_dir / "state.json", (then, then))
    assert main(["status", "r1", "--runs", str(tmp_path / "runs"), "--kb", str(tmp_path / "kb")]) == 0
    shown = " ".join(capsys.readouterr().out.split())
    assert "r1: running, cycle 2, phase write" in shown and "resume=" not in shown


def _sleeper() -> subprocess.Popen:
    """A real process to stand for a campaign's driver."""
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])


def _recorded(process: subprocess.Popen) -> dict:
    """The `driver` a campaign run by `process` records (liveness.this_driver, with its PID and start)."""
    from ralph_ray import liveness

    return {**liveness.this_driver(), "pid": process.pid, "started": liveness._start_ticks(process.pid)}


def test_a_recorded_driver_decides_at_once_where_its_process_table_can_be_read():
    """User trial: a driver killed by a full disk or the OOM killer read as running for up to `stale_after_s` (hours
    with an LLM backend), and a live one quiet for longer than that read as dead. Its recorded process decides."""
    from ralph_ray import liveness

    process = _sleeper()
    try:
        driver = _recorded(process)
        assert driver["started"] is not None and liveness.driver_alive(driver) is True
        assert not liveness.is_stale("running", 10**6, {}, driver)  # quiet for days, but its driver runs
        # the same PID started at another time: a later process that reused it
        assert liveness.driver_alive({**driver, "started": str(int(driver["started"]) + 1)}) is False
        # on another host, boot or PID namespace this process cannot tell: silence decides
        for key in ("host", "boot", "pid_ns"):
            elsewhere = {**driver, key: "elsewhere"}
            assert liveness.driver_alive(elsewhere) is None
            assert liveness.is_stale("running", 10**6, {}, elsewhere)
            assert not liveness.is_stale("running", 10, {}, elsewhere)
    finally:
        process.kill()
        process.wait()
    assert liveness.driver_alive(driver) is False
    assert liveness.is_stale("running", 1, {}, driver)  # it wrote a second ago, but it is gone
    assert not liveness.is_stale("finished", 1, {}, driver)
    assert f"its driver (PID {process.pid} on {driver['host']}) is no longer running" in liveness.why_stale(
        1, {}, driver
    )
    assert liveness.driver_alive(None) is None and liveness.driver_alive({}) is None


def test_a_campaign_records_its_driver_when_it_starts_and_when_it_resumes(tmp_path: Path):
    from ralph_ray import liveness
    from ralph_ray.state import CampaignState, open_state

    open_state(tmp_path, "r1", resuming=False)
    recorded = liveness.recorded_driver(tmp_path)
    assert recorded == liveness.this_driver() and liveness.driver_alive(recorded) is True
    state = CampaignState.load(tmp_path)
    state.driver = {**recorded, "pid": 1, "started": "0"}  # an earlier driver's record
    state.save(tmp_path)
    open_state(tmp_path, "r1", resuming=True)
    assert liveness.recorded_driver(tmp_path)["pid"] == os.getpid()
    assert liveness.recorded_driver(tmp_path / "missing") is None and liveness.recorded_driver("") is None
