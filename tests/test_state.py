"""A run's state file across a resume: what a resume clears and what it keeps."""

from __future__ import annotations

from pathlib import Path

import pytest

from ralph_ray.state import CampaignState, RunStatus, open_state


@pytest.mark.parametrize("ended", [RunStatus.interrupted, RunStatus.crashed])
def test_a_resume_clears_the_error_and_exit_code_of_a_run_a_signal_or_a_crash_ended(tmp_path: Path, ended: RunStatus):
    open_state(tmp_path, "r1", resuming=False)
    state = CampaignState.load(tmp_path)
    state.status, state.stop_reason, state.exit_code = ended, "AgentConfigError: 404 from the endpoint", 2
    state.save(tmp_path)
    resumed = open_state(tmp_path, "r1", resuming=True)
    again = CampaignState.load(tmp_path)
    assert resumed.status is RunStatus.running and again.status is RunStatus.running
    assert again.stop_reason is None and again.exit_code is None  # `status` shows no stale error while it runs


def test_a_resume_of_a_finished_run_keeps_its_decision_for_the_loop_to_redecide(tmp_path: Path):
    open_state(tmp_path, "r1", resuming=False)
    state = CampaignState.load(tmp_path)
    state.status, state.stop_reason, state.exit_code = RunStatus.finished, "target met", 0
    state.save(tmp_path)
    again = open_state(tmp_path, "r1", resuming=True)
    assert again.status is RunStatus.running and again.stop_reason == "target met"
