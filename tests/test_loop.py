"""The loop end to end on real parts: cycles of heuristic children, the serial and knob-only modes, manual
stop, SIGKILL mid-cycle then resume, and the report and status commands."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from tune_fakes import TuneTrial

from ralph_ray.__main__ import main
from ralph_ray.campaign import Outcome, run
from ralph_ray.config import load_config, resume_config
from ralph_ray.kb import open_reader

TINY = [
    "population.mode=generations",  # the barrier loop, cycle by cycle (the default auto runs async: test_async.py)
    "search.num_samples=3",
    "safeguards.replicates=0",  # one trial decides (replicates: tests/test_noise.py)
    "search.max_concurrent=2",
    "scheduler.max_t=3",
    "scheduler.grace_period=1",
    "safeguards.trial_timeout_s=120",
    "+search.space.EPOCHS={type: choice, values: [3]}",
    "population.trials_per_child=1",
]


def tiny(tmp: Path, *overrides: str):
    return load_config([f"paths.runs={tmp / 'runs'}", f"paths.kb={tmp / 'kb'}", *TINY, *overrides])


@pytest.fixture(scope="module")
def two_cycles(ray_session, tmp_path_factory: pytest.TempPathFactory) -> Outcome:
    tmp = tmp_path_factory.mktemp("loop")
    return run(
        tiny(tmp, "run_id=loop", "safeguards.max_cycles=2", "population.parents=1", "population.children_per_parent=2")
    )


def test_two_cycles_grow_children_from_the_seed(two_cycles: Outcome):
    assert two_cycles.exit_code == 0 and two_cycles.stop_reason == "max_cycles"
    con = open_reader(two_cycles.kb_root)
    variants = con.execute(
        "select variant_id, parent_id, status, interventions, diff from variants where run_id = 'loop'"
    ).fetchall()
    seed = [v for v in variants if v[2] == "seed"]
    children = [v for v in variants if v[2] != "seed"]
    assert len(seed) == 1 and seed[0][1] is None
    assert len(children) == 2
    for _variant_id, parent_id, status, interventions, diff in children:
        assert parent_id == seed[0][0]
        assert status in ("kept", "discarded", "rejected", "crashed")
        assert json.loads(interventions) and "+++ b/train.py" in diff
    # Cycle 2 ran every passing child in one Tune run: one trial per child (trials_per_child=1).
    trials = con.execute("select cycle, variant_id, status from trials where run_id = 'loop'").fetchall()
    assert sum(t[0] == 1 for t in trials) == 3
    passing = [c[0] for c in children if c[2] != "rejected"]
    assert sorted(t[1] for t in trials if t[0] == 2) == sorted(passing)
    lineage = con.execute("select variant_id, depth from lineage where run_id = 'loop'").fetchall()
    assert {d for _, d in lineage} == {0, 1}
    effects = con.execute(
        "select intervention, diagnosis, parent_score, child_score, delta, outcome from interventions where run_id = "
        "'loop'"
    ).fetchall()
    assert len(effects) >= 2
    for name, diagnosis, parent, child, delta, _outcome in effects:
        assert name and diagnosis
        if child is not None:
            assert delta == pytest.approx(child - parent)
    assert con.execute("select count(*) from intervention_effects").fetchone()[0] >= 1
    decisions = con.execute(
        "select cycle, decision, reason from decisions where run_id = 'loop' order by cycle"
    ).fetchall()
    assert decisions == [(1, "continue", "none"), (2, "stop", "max_cycles")]
    usage = con.execute("select role, calls, tokens_in from agent_usage where run_id = 'loop'").fetchall()
    assert {u[0] for u in usage} == {"analyst", "coder"} and all(u[1] >= 1 and u[2] == 0 for u in usage)


def test_cycle_artifacts_and_report(two_cycles: Outcome):
    cycle2 = two_cycles.run_dir / "cycle_0002"
    for name in ("parents.json", "analysis.md", "recommendations.json", "children.json", "decision.json"):
        assert (cycle2 / name).exists(), name
    recs = json.loads((cycle2 / "recommendations.json").read_text())
    assert all(entry["recommendations"] and entry["diagnoses"] for entry in recs.values())
    decision = json.loads((cycle2 / "decision.json").read_text())
    assert decision["reason"] == "max_cycles" and decision["exit_code"] == 0
    report = (two_cycles.run_dir / "report" / "final_report.md").read_text()
    assert "max_cycles" in report and "## Leaderboard" in report and "## Interventions" in report
    png = (two_cycles.run_dir / "report" / "progress.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000
    state = json.loads((two_cycles.run_dir / "state.json").read_text())
    assert state["phase"] == "done" and state["status"] == "finished" and len(state["best_by_cycle"]) == 2
    for variant in json.loads((cycle2 / "children.json").read_text()):
        assert (Path(variant["files_dir"]).parent / "diff.patch").exists()


def test_status_and_report_commands(two_cycles: Outcome, capsys: pytest.CaptureFixture[str]):
    runs, kb = str(two_cycles.run_dir.parent), str(two_cycles.kb_root)
    assert main(["status", "--runs", runs, "--kb", kb]) == 0
    out = capsys.readouterr().out
    assert "run loop" in out and "max_cycles" in out and "leaderboard" in out
    budgets = next(line for line in out.splitlines() if "budgets:" in line)
    # two cycles of two; no time, token or cost budget was set: said so, never "None"
    assert "cycles 2/2," in budgets and "s/no limit," in budgets and "None" not in budgets
    # The table's rank column is the view's rank. TINY runs no replicates (safeguards.replicates=0), so rank 1 has
    # none and no replicated pick line is printed (a replicated pick and its interval: tests/test_noise.py).
    pick, rank, n = (
        open_reader(two_cycles.kb_root)
        .execute("select variant_id, rank, replicates from leaderboard where run_id = 'loop' order by rank")
        .fetchall()[0]
    )
    cells = [[c.strip() for c in line.split("│")[1:3]] for line in out.splitlines() if pick in line and "│" in line]
    assert rank == 1 and ["1", pick] in cells
    assert n == 0 and "by replicate mean" not in out
    assert "higher is better" in out
    (two_cycles.run_dir / "report" / "final_report.md").unlink()
    assert main(["report", "loop", "--runs", runs, "--kb", kb]) == 0
    assert (two_cycles.run_dir / "report" / "final_report.md").exists()
    # piped into a file or a pager (no terminal, no COLUMNS): the table is not squeezed to 80 columns ("0.99…")
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    piped = subprocess.run(
        [sys.executable, "-m", "ralph_ray", "status", "--runs", runs, "--kb", kb],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert piped.returncode == 0 and "…" not in piped.stdout and pick in piped.stdout
    assert main(["stop", "--runs", runs]) == 2  # stop needs a run id
    assert main(["status", "nope", "--runs", runs]) == 2


def test_status_of_a_run_with_no_finished_cycle_says_so(two_cycles: Outcome, tmp_path, capsys):
    """User trial: an async run's `status` printed `best per cycle: []` beside a best selection score."""
    runs = tmp_path / "runs"
    shutil.copytree(two_cycles.run_dir, runs / "loop")
    assert main(["status", "--runs", str(runs), "--kb", str(two_cycles.kb_root)]) == 0
    assert "best per cycle: [" in capsys.readouterr().out
    state_file = runs / "loop" / "state.json"
    state = json.loads(state_file.read_text())
    state_file.write_text(json.dumps({**state, "best_by_cycle": []}))
    assert main(["status", "--runs", str(runs), "--kb", str(two_cycles.kb_root)]) == 0
    out = capsys.readouterr().out
    assert "no cycle finished yet" in out and "best per cycle" not in out


def test_status_shows_a_min_metric_as_its_own_values(two_cycles: Outcome, tmp_path, capsys, monkeypatch):
    """Scores are stored oriented (a min metric's negated); `status` shows a min task's values as they are."""
    monkeypatch.setenv("COLUMNS", "240")  # rich's table: no cell cut short
    runs = tmp_path / "runs"
    shutil.copytree(two_cycles.run_dir, runs / "loop")
    stored = runs / "loop" / "config.yaml"
    stored.write_text(stored.read_text().replace("direction: max", "direction: min"))
    assert main(["status", "--runs", str(runs), "--kb", str(two_cycles.kb_root)]) == 0
    out = capsys.readouterr().out
    assert "lower is better" in out
    best, score = (
        open_reader(two_cycles.kb_root)
        .execute("select variant_id, selection_score from leaderboard where run_id = 'loop' order by rank")
        .fetchall()[0]
    )
    row = next(line for line in out.splitlines() if best in line and "│" in line)
    assert f"{-score:.4f}" in row.split("│")[6]


@pytest.mark.slow
def test_serial_ralph_loop_stops_on_plateau_with_exit_3(ray_session, tmp_path: Path):
    # 1 parent x 1 child is the classic serial loop; a min_delta no child can reach makes the plateau rule fire.
    outcome = run(
        tiny(
            tmp_path,
            "run_id=serial",
            "population.parents=1",
            "population.children_per_parent=1",
            "safeguards.plateau_cycles=1",
            "safeguards.min_delta=0.5",
            "safeguards.max_cycles=4",
        )
    )
    assert outcome.exit_code == 3 and outcome.stop_reason == "plateau"
    con = open_reader(outcome.kb_root)
    assert con.execute("select count(*) from variants where run_id = 'serial' and status <> 'seed'").fetchone()[0] == 1
    assert con.execute("select max(cycle) from decisions where run_id = 'serial'").fetchone()[0] == 2


@pytest.mark.slow
def test_knob_search_only_and_target(ray_session, tmp_path: Path):
    outcome = run(
        tiny(
            tmp_path,
            "run_id=knobs",
            "agent=none",
            "population.parents=1",
            "safeguards.max_cycles=3",
            "target.selection_score=0.05",
        )
    )
    assert outcome.exit_code == 0 and outcome.stop_reason == "target_met"
    con = open_reader(outcome.kb_root)
    assert con.execute("select count(*) from cycles where run_id = 'knobs'").fetchone()[0] == 1


@pytest.mark.slow
def test_manual_stop_ends_the_cycle_cleanly_and_resume_goes_on(ray_session, tmp_path: Path):
    cfg = tiny(
        tmp_path,
        "run_id=stopme",
        "population.parents=1",
        "population.children_per_parent=1",
        "safeguards.max_cycles=3",
        "search.num_samples=6",
    )
    run_dir = tmp_path / "runs" / "stopme"

    def stop_when_training() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not list((run_dir / "cycle_0001" / "trials").glob("*/metrics.jsonl")):
            time.sleep(0.1)
        assert main(["stop", "stopme", "--runs", str(tmp_path / "runs")]) == 0

    stopper = threading.Thread(target=stop_when_training)
    stopper.start()
    outcome = run(cfg)
    stopper.join()
    assert outcome.exit_code == 0 and outcome.stop_reason == "manual_stop"
    con = open_reader(outcome.kb_root)
    assert con.execute("select count(*) from decisions where run_id = 'stopme'").fetchone()[0] == 1
    assert con.execute("select status from runs where run_id = 'stopme'").fetchone()[0] == "finished"
    stopped_trials = con.execute("select count(*) from trials where run_id = 'stopme'").fetchone()[0]
    assert 1 <= stopped_trials <= 6

    resumed = run(resume_config(run_dir, ["safeguards.max_cycles=2"]))
    assert resumed.exit_code == 0 and resumed.stop_reason == "max_cycles"
    con = open_reader(outcome.kb_root)
    assert con.execute("select max(cycle) from decisions where run_id = 'stopme'").fetchone()[0] == 2
    assert not (run_dir / "STOP").exists()


def _kb_shape(kb: Path, run_id: str) -> dict[str, object]:
    con = open_reader(kb)
    trials = con.execute(
        "select cycle, count(*), count(distinct trial_id) from trials where run_id = ? group by cycle order by cycle",
        [run_id],
    ).fetchall()
    return {
        "trials_per_cycle": [(c, n) for c, n, _ in trials],
        "unique": all(n == u for _, n, u in trials),
        "decisions": con.execute(
            "select cycle, reason from decisions where run_id = ? order by cycle", [run_id]
        ).fetchall(),
        "cycles": con.execute("select count(*) from cycles where run_id = ?", [run_id]).fetchone()[0],
        "variants": con.execute("select count(*) from variants where run_id = ?", [run_id]).fetchone()[0],
    }


@pytest.mark.slow
def test_sigkill_mid_cycle_then_resume_loses_and_duplicates_nothing(two_cycles: Outcome, tmp_path: Path):
    # The clean reference: two_cycles, the module's campaign of the same configuration (TINY, 2 cycles, 1 parent,
    # 2 children), run in-process without a kill.
    args = [
        f"paths.runs={tmp_path / 'runs'}",
        f"paths.kb={tmp_path / 'kb'}",
        *TINY,
        "safeguards.max_cycles=2",
        "population.parents=1",
        "population.children_per_parent=2",
        "resources.ray_num_cpus=2",
    ]
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "ralph_ray", "run_id=killed", *args],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    trials = tmp_path / "kb" / "parquet" / "trials"
    deadline = time.monotonic() + 180
    # Kill once cycle 2's Tune run has recorded a trial: mid-cycle, with work both done and in flight.
    while time.monotonic() < deadline and not list(trials.glob("killed-c2-*.parquet")):
        assert proc.poll() is None, "the campaign ended before it could be killed"
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    state = json.loads((tmp_path / "runs" / "killed" / "state.json").read_text())
    assert state["status"] == "running" and state["cycle"] == 2  # SIGKILL leaves no chance to write anything

    result = subprocess.run(
        [sys.executable, "-m", "ralph_ray", "resume=killed", *args[:2]],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "resume" in result.stdout

    killed, clean = _kb_shape(tmp_path / "kb", "killed"), _kb_shape(two_cycles.kb_root, two_cycles.run_id)
    assert killed["unique"] and clean["unique"]
    assert [n for _, n in killed["trials_per_cycle"]][0] == 3
    assert killed["decisions"] == clean["decisions"] == [(1, "none"), (2, "max_cycles")]
    assert killed["cycles"] == clean["cycles"] == 2
    planned_cycle2 = json.loads((tmp_path / "runs" / "killed" / "cycle_0002" / "children.json").read_text())
    passing = [c for c in planned_cycle2 if c["status"] != "rejected"]
    assert killed["trials_per_cycle"][1] == (2, len(passing))


def test_a_resumed_cycle_starts_asha_with_the_rung_results_of_that_cycles_earlier_trials(
    two_cycles: Outcome, tmp_path: Path
):
    """The barrier loop's resume ran a cycle's remaining trials in a new Tune run whose ASHA rungs were empty: they
    were judged against each other only. The scheduler a resumed cycle builds holds that cycle's earlier trials'
    epoch-1 results (not another cycle's), so a trial below them all stops at epoch 1."""
    from ralph_ray.search import resumed_scheduler, scheduler

    cfg = tiny(tmp_path, "run_id=loop")
    con = open_reader(two_cycles.kb_root)
    for cycle in (1, 2):
        earlier = dict(
            con.execute(
                "select e.trial_id, e.value from epochs e join trials t using (run_id, trial_id) "
                "where e.run_id = 'loop' and t.cycle = ? and e.epoch = 1 and e.metric = ?",
                [cycle, cfg.search.metric],
            ).fetchall()
        )
        assert len(earlier) >= 2
        stops: dict[str, str] = {}
        resumed = resumed_scheduler(cfg, con, "loop", stops, cycle)
        assert resumed.recorded()[1.0] == pytest.approx(earlier)  # this cycle's trials only
        fresh = scheduler(cfg, {})
        for sched in (resumed, fresh):
            sched.set_search_properties(cfg.search.metric, cfg.search.mode)  # as Tune does when the run starts
            sched.on_trial_add(None, TuneTrial("new"))
        result = {"epoch": 1, cfg.search.metric: min(earlier.values()) - 0.5}
        assert fresh.on_trial_result(None, TuneTrial("new"), result) == "CONTINUE"  # an empty rung: nothing to cut
        assert resumed.on_trial_result(None, TuneTrial("new"), result) == "STOP"
        assert f"of the {len(earlier)} trial(s) recorded there" in stops["new"]
