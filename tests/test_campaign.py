"""End-to-end campaigns on the shared Ray instance: the real digits trainer, and a scripted trainer that
exercises ASHA stops, NaN, timeout and the process-group kill inside real Tune trials."""

from __future__ import annotations

import json
import os
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
from procs import pid_alive
from taskdirs import digits_task

from ralph_ray.__main__ import main
from ralph_ray.harness import PUBLIC_FILES
from ralph_ray.kb import open_reader
from ralph_ray.tasks.digits import prepare


@pytest.mark.slow
def test_one_cycle_digits_campaign_through_the_cli(ray_session, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(tmp_path)  # default paths: ./runs and ./kb under the working directory
    code = main(
        [
            "run_id=digits-e2e",
            "population.mode=generations",  # one barrier cycle's folder and records (async: tests/test_async.py)
            "safeguards.max_cycles=1",
            "search.num_samples=6",
            "safeguards.replicates=0",  # six search trials alone (replicates: tests/test_noise.py)
            "search.max_concurrent=2",
            "scheduler.max_t=4",
            "scheduler.grace_period=1",
            "scheduler.reduction_factor=3",
            "+search.space.EPOCHS={type: choice, values: [4]}",
        ]
    )
    assert code == 0
    run_dir = tmp_path / "runs" / "digits-e2e"
    assert (run_dir / "config.yaml").exists()
    state = json.loads((run_dir / "state.json").read_text())
    assert state["phase"] == "done" and state["best_trial_id"]
    assert state["driver"]["done"] is True  # its last write done: a resume is no longer refused while it exits

    con = open_reader(tmp_path / "kb")
    trials = con.execute(
        "select trial_id, status, epochs, selection_score, test_score, knobs from trials where run_id = ?",
        ["digits-e2e"],
    ).fetchall()
    assert len(trials) == 6
    statuses = [t[1] for t in trials]
    assert "stopped_early" in statuses, "ASHA should stop at least one of six trials"
    assert "completed" in statuses
    for trial_id, status, epochs, selection, test, knobs in trials:
        if status == "completed":
            assert epochs == 4 and 0.5 < selection <= 1.0 and 0.5 < test <= 1.0
        else:
            assert selection is None and epochs < 4
        work = run_dir / "cycle_0001" / "trials" / trial_id
        code_as_run = (work / "train.py").read_text()
        for name, value in json.loads(knobs).items():
            assert f"{name} = {value!r}" in code_as_run  # the exact code of the trial is kept
        assert (work / "metrics.jsonl").exists() and (work / "stdout.log").exists()

    curves = con.execute(
        "select trial_id, epoch, train_loss, val_loss, val_acc, lr, grad_norm, epoch_seconds from curves where run_id "
        "= ?",
        ["digits-e2e"],
    ).fetchall()
    assert len(curves) == sum(t[2] for t in trials)
    assert all(value is not None for row in curves for value in row)
    top = con.execute(
        "select variant_id, selection_score, trials, completed, stopped_early from leaderboard where run_id = ?",
        ["digits-e2e"],
    ).fetchall()
    assert len(top) == 1 and top[0][2] == 6
    assert top[0][1] == max(t[3] for t in trials if t[3] is not None)
    run = con.execute("select status, stop_reason from runs where run_id = ?", ["digits-e2e"]).fetchone()
    assert run == ("finished", "max_cycles")

    # Labels never reach a trial: the data dir holds only public files, work dirs hold no data at all.
    assert sorted(os.listdir(run_dir / "data")) == sorted(PUBLIC_FILES)
    for work in (run_dir / "cycle_0001" / "trials").iterdir():
        assert not [p for p in work.rglob("*.npy")]


SCRIPTED = """
import os, subprocess, sys, time
import numpy as np
from ralph_ray import harness

LR = 0.5  # quality of this trial
EPOCHS = 6  # epochs
TICKETS = {tickets!r}  # shared folder that hands each trial its behaviour in start order

def ticket():
    for n in range(1000):
        try:
            os.close(os.open(os.path.join(TICKETS, str(n)), os.O_CREAT | os.O_EXCL))
            return n
        except FileExistsError:
            continue

# NaN and hang strike before the first report: ASHA decides only on reports, so it cannot stop them first.
behaviour = {{0: "nan", 1: "hang"}}.get(ticket(), "train")
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
open("child.pid", "w").write(str(child.pid))
data = harness.load_data()
for epoch in range(1, EPOCHS + 1):
    if behaviour == "nan" and epoch == 1:
        harness.report(epoch=epoch, val_acc=float("nan"))
    if behaviour == "hang" and epoch == 1:
        time.sleep(300)
    time.sleep(0.2)
    harness.report(epoch=epoch, val_acc=LR * epoch / EPOCHS, train_loss=1.0 - LR)
harness.save_predictions(selection=np.zeros(len(data.selection_x), int), test=np.zeros(len(data.test_x), int))
"""


@pytest.mark.slow
def test_scripted_trials_stop_fail_and_leave_no_process(ray_session, tiny_config, tmp_path: Path):
    from ralph_ray.campaign import run

    (tmp_path / "tickets").mkdir()
    trainer = digits_task(tmp_path / "scripted", textwrap.dedent(SCRIPTED.format(tickets=str(tmp_path / "tickets"))))
    cfg = tiny_config(
        f"task.trainer={trainer}",
        "run_id=scripted",
        "safeguards.max_cycles=1",
        "search.num_samples=8",
        "scheduler.max_t=6",
        "scheduler.reduction_factor=4",
        "safeguards.trial_timeout_s=15",
        "~search.space",
        "+search.space={LR: {type: uniform, low: 0.0, high: 1.0}}",
        "sandbox=none",  # the trials share a tickets folder outside their work dirs (sandboxed: tests/test_sandbox.py)
    )
    outcome = run(cfg)

    by_status: dict[str, list] = {}
    for record in outcome.records:
        by_status.setdefault(record.status.value, []).append(record)
    reasons = sorted(r.reason for r in by_status["failed"])
    assert len(reasons) == 2
    assert "non-finite val_acc" in reasons[0] and "timeout" in reasons[1]
    assert by_status.get("stopped_early"), "ASHA should stop a laggard"
    assert by_status.get("completed")

    # Frozen scoring: all-zero predictions score the share of class 0 in the engine-held labels.
    labels = prepare(0, 0.2, 0.2).labels()
    for record in by_status["completed"]:
        assert record.selection_score == pytest.approx(float(np.mean(labels.selection == 0)))
        assert record.test_score == pytest.approx(float(np.mean(labels.test == 0)))

    # Every grandchild died with its trial: ASHA stops, NaN, timeout and normal ends alike.
    pids = [int(p.read_text()) for p in (outcome.run_dir / "cycle_0001" / "trials").glob("*/child.pid")]
    assert len(pids) == 8
    deadline = time.monotonic() + 10
    while any(pid_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [pid for pid in pids if pid_alive(pid)]

    con = open_reader(outcome.kb_root)
    kb_failed = con.execute(
        "select reason from trials where run_id = ? and status = 'failed' order by reason", ["scripted"]
    ).fetchall()
    assert [row[0] for row in kb_failed] == reasons
    # ASHA's stops say why in the KB (their reason was NULL): the rung, the value and the cutoff
    kb_stopped = con.execute(
        "select reason from trials where run_id = ? and status = 'stopped_early'", ["scripted"]
    ).fetchall()
    assert kb_stopped and all(str(row[0]).startswith("ASHA: val_acc ") for row in kb_stopped)
    assert all(" is below the cutoff " in row[0] and " of the rung at epoch " in row[0] for row in kb_stopped)


@pytest.mark.slow
def test_epochs_past_the_last_rung_keep_their_curve(ray_session, tiny_config, tmp_path: Path):
    # A child may train past scheduler.max_t (longer_training): those reports wait for the predictions
    # (so ASHA cannot stop a finished trial) and still reach the curves, each epoch once.
    from ralph_ray.campaign import run

    cfg = tiny_config(
        "run_id=long",
        "safeguards.max_cycles=1",
        "search.num_samples=2",
        "scheduler=fifo",
        "scheduler.max_t=3",
        "scheduler.grace_period=1",
        "search.space.EPOCHS.values=[5]",
    )
    outcome = run(cfg)
    con = open_reader(outcome.kb_root)
    rows = con.execute(
        "select trial_id, list(epoch order by epoch) from curves where run_id = 'long' and status = 'completed' group "
        "by trial_id"
    ).fetchall()
    assert len(rows) == 2 and all(epochs == [1, 2, 3, 4, 5] for _, epochs in rows)


def test_a_seed_whose_predictions_cannot_be_scored_says_so_not_its_empty_log(ray_session, tiny_config, tmp_path: Path):
    """User trial: every trial of a denoiser failed in the driver's scoring, and the console pointed to the first
    trial's stderr.log, empty since the trainer ran fine. Here the digits trainer saves its logits, which accuracy
    cannot score: the first failure says the scoring failed on the driver and how to check the metric."""
    import io

    from rich.console import Console

    from ralph_ray import PROJECT_ROOT
    from ralph_ray.campaign import run

    digits = (PROJECT_ROOT / "trainers" / "digits" / "train.py").read_text()
    logits = digits.replace("return model(x).argmax(1).cpu().numpy()", "return model(x).cpu().numpy()")
    assert logits != digits
    task = digits_task(tmp_path / "logits", logits)
    said = io.StringIO()
    outcome = run(tiny_config("run_id=unscored", f"task.trainer={task}"), Console(file=said, width=400))
    assert outcome.exit_code == 4 and outcome.stop_reason == "no_trial_completed"
    console = said.getvalue()
    assert "first failure: trial" in console and "scoring failed on the driver (the trainer finished" in console
    assert "the task's metric could not score what the trainer saved" in console
    assert "its whole log" not in console  # the trainer's log holds nothing of a scoring failure


def test_a_stopped_run_that_has_ended_leaves_no_stop_file(ray_session, tiny_config, tmp_path: Path):
    """User trial: after `stop`, the run ended (manual_stop) but its STOP file stayed, though the README's layout
    says STOP is there while a stop is requested; a later resume removed it without a word."""
    from ralph_ray.campaign import run
    from ralph_ray.control import request_stop

    run_dir = tmp_path / "runs" / "stopped"
    run_dir.mkdir(parents=True)
    request_stop(run_dir, "test")  # asked before its first phase: the cycle ends at once
    outcome = run(tiny_config("run_id=stopped", "safeguards.max_cycles=3"))
    assert outcome.exit_code == 0 and outcome.stop_reason == "manual_stop"
    assert json.loads((run_dir / "state.json").read_text())["status"] == "finished"
    assert not (run_dir / "STOP").exists()


def test_a_refusals_stop_reason_is_one_line_with_its_fix():
    """User trial: an AgentConfigError's recorded stop reason ("cannot reach the LLM endpoint ...\\n  fix: ...")
    spanned two lines in state.json and `status`. It is recorded as one line, the fix joined with `; fix: `."""
    import socket

    from ralph_ray.agents.base import AgentConfigError
    from ralph_ray.agents.llm import ChatClient
    from ralph_ray.campaign import stop_reason
    from ralph_ray.config import AgentBackend, AgentConfig

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # nothing listens here once the socket closes
    cfg = AgentConfig(
        backend=AgentBackend.openai, base_url=f"http://127.0.0.1:{port}/v1", model="m", api_key_env=None, http_retries=0
    )
    with pytest.raises(AgentConfigError) as refused:
        ChatClient(cfg).preflight()
    assert "\n  fix: " in str(refused.value)  # the console shows it on two lines, as before
    reason = stop_reason(refused.value)
    assert "\n" not in reason
    assert reason.startswith(f"AgentConfigError: cannot reach the LLM endpoint http://127.0.0.1:{port}/v1 (")
    assert reason.endswith("); fix: check agent.base_url (it usually ends in /v1) and that the server is running")
    assert stop_reason(ValueError("plain")) == "ValueError: plain"


def test_the_start_up_warnings_come_from_one_place(tmp_path: Path):
    """The warnings a campaign prints before its run is recorded (budget unread, seed off the space, ...) are
    gathered by campaign.start_warnings, printed in one place."""
    from ralph_ray.campaign import start_warnings
    from ralph_ray.config import load_config

    seed = (Path(__file__).resolve().parents[1] / "trainers" / "digits" / "train.py").read_text()
    folder = digits_task(tmp_path / "mine", seed.replace("harness.epochs(EPOCHS)", "range(EPOCHS)"))
    plain = load_config([f"task={folder}"])
    assert start_warnings(plain) == []
    cfg = load_config([f"task={folder}", "trial.budget_s=5", "search.space.LR.low=0.1"])
    said = start_warnings(cfg)
    assert len(said) == 2, said
    assert said[0].startswith("trial.budget_s=5 is set, but ") and "reads no budget" in said[0]
    assert "LR" in said[1] and "0.05" in said[1], said[1]
