"""The command line: a missing dataset exits 2 with the fix and records nothing; `prepare` writes public data;
`status` tells a run whose driver is gone; `stop` refuses a run that is not running."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from ralph_ray.harness import PUBLIC_FILES


def test_missing_cifar10_exits_2_and_records_nothing(tmp_path: Path):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "ralph_ray",
            "+experiment=cifar10",
            f"data.root={tmp_path / 'cifar'}",
            "data.download=false",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert "cifar-10-batches-py" in result.stderr and "data_batch_1" in result.stderr
    assert not (tmp_path / "runs").exists() and not (tmp_path / "kb").exists()


def test_prepare_writes_public_data_and_export_line(tmp_path: Path):
    result = subprocess.run(
        [sys.executable, "-m", "ralph_ray.prepare"], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    out = tmp_path / "data" / "prepared" / "digits"
    assert sorted(p.name for p in out.iterdir()) == sorted(PUBLIC_FILES)
    assert f"export RALPH_DATA_DIR={out}" in result.stdout


def test_config_dir_adds_the_users_own_experiments(tmp_path: Path, capsys):
    from ralph_ray.__main__ import main

    (tmp_path / "conf" / "experiment").mkdir(parents=True)
    (tmp_path / "conf" / "experiment" / "mine.yaml").write_text(
        "# @package _global_\n# python -m ralph_ray --config-dir ./conf +experiment=mine\n"
        "safeguards:\n  max_cycles: 7\nsearch:\n  num_samples: 3  # digits' task.yaml says 8: the experiment wins\n"
    )
    conf = str(tmp_path / "conf")
    for flags in (["--config-dir", conf], ["-cd", conf], [f"--config-dir={conf}"]):
        assert main([*flags, "+experiment=mine", "--cfg"]) == 0
        shown = capsys.readouterr().out
        assert "max_cycles: 7" in shown and "num_samples: 3" in shown
    assert main(["-cd", conf, "+experiment=mine", "search.num_samples=5", "--cfg"]) == 0
    assert "num_samples: 5" in capsys.readouterr().out  # the command line wins over the experiment
    assert main(["--config-dir", str(tmp_path / "nope"), "+experiment=mine"]) == 2
    assert "no such folder" in capsys.readouterr().err
    assert main(["+experiment=mine", "--cfg"]) == 2  # without the folder Hydra does not know it
    # a resume with the same flags finds the experiment too (review: the folder was dropped from what finds the run)
    from omegaconf import OmegaConf

    from ralph_ray.config import load_config

    run_dir = tmp_path / "runs" / "r"
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.structured(load_config([]))))
    resume = [f"paths.runs={tmp_path / 'runs'}", "resume=r", "-cd", conf, "+experiment=mine", "--cfg"]
    assert main(resume) == 0, capsys.readouterr().err


def _recorded_run(runs: Path, status: str, quiet_s: float, **state: object) -> Path:
    """A run dir as a campaign leaves it: state.json and events.jsonl, last changed `quiet_s` seconds ago."""
    from ralph_ray.state import CampaignState, Phase, RunStatus

    run_dir = runs / "r1"
    run_dir.mkdir(parents=True)
    CampaignState("r1", phase=Phase.train, status=RunStatus(status), cycle=3, **state).save(run_dir)  # type: ignore[arg-type]
    (run_dir / "events.jsonl").write_text('{"event": "trial_start"}\n')
    then = time.time() - quiet_s
    for name in ("state.json", "events.jsonl"):
        os.utime(run_dir / name, (then, then))
    return run_dir


def test_status_of_a_run_whose_driver_was_killed_says_it_stopped_unexpectedly(tmp_path: Path, capsys, monkeypatch):
    """User trial: after `kill -9` of the driver, `status` said `running, cycle 3, phase train` for ever; the app
    already showed such a run as stopped unexpectedly. Both now apply one rule (ralph_ray.liveness)."""
    from ralph_ray import liveness
    from ralph_ray.__main__ import main

    monkeypatch.delenv(liveness.STALE_ENV, raising=False)

    runs, kb = tmp_path / "runs", tmp_path / "kb"
    run_dir = _recorded_run(runs, "running", quiet_s=3600)
    assert main(["status", "r1", "--runs", str(runs), "--kb", str(kb)]) == 0
    shown = " ".join(capsys.readouterr().out.split())
    assert "r1: stopped unexpectedly?, cycle 3, phase train" in shown
    assert "longer than any phase of it should take (300s: a trial, an agent call" in shown  # a guess, said as one
    assert f"python -m ralph_ray resume=r1 paths.runs={runs} paths.kb={kb}" in shown

    now = time.time()
    os.utime(run_dir / "events.jsonl", (now, now))  # a trial just started: it runs
    assert main(["status", "r1", "--runs", str(runs), "--kb", str(kb)]) == 0
    shown = " ".join(capsys.readouterr().out.split())
    assert "r1: running, cycle 3, phase train" in shown and "resume=" not in shown


def test_staleness_waits_for_as_long_as_one_trial_may_take(tmp_path: Path, capsys, monkeypatch):
    from ralph_ray import liveness
    from ralph_ray.__main__ import main

    monkeypatch.delenv(liveness.STALE_ENV, raising=False)  # the 300-s default below, whatever the shell sets
    config = {"safeguards": {"trial_timeout_s": 3600}}
    assert liveness.stale_after_s(config) == 3660 and not liveness.is_stale("running", 3000, config)
    assert liveness.is_stale("running", 301, {}) and not liveness.is_stale("finished", 10**6, {})
    monkeypatch.setenv(liveness.STALE_ENV, "120")
    assert liveness.is_stale("running", 121, {}) and not liveness.is_stale("running", 119, {})
    runs = tmp_path / "runs"
    _recorded_run(runs, "running", quiet_s=60)
    (runs / "r1" / "config.yaml").write_text("safeguards:\n  trial_timeout_s: 600\n")
    assert main(["status", "--runs", str(runs), "--kb", str(tmp_path / "kb")]) == 0
    assert "r1: running" in capsys.readouterr().out  # quiet for 60 s of a trial that may take 600


def test_stop_of_a_run_that_is_not_running_exits_2_and_leaves_no_stop_file(tmp_path: Path, capsys):
    """User trial: `stop` of a finished run said "the campaign ends its cycle cleanly", exited 0 and left a STOP file
    that a later resume cleared without a word."""
    from ralph_ray.__main__ import main

    runs = tmp_path / "runs"
    run_dir = _recorded_run(runs, "finished", quiet_s=10, stop_reason="plateau", exit_code=3)
    assert main(["stop", "r1", "--runs", str(runs)]) == 2
    shown = " ".join(capsys.readouterr().out.split())
    assert "run r1 is not running: finished, cycle 3" in shown and "stopped: plateau" in shown
    assert "ends its cycle cleanly" not in shown
    assert not (run_dir / "STOP").exists()

    state = run_dir / "state.json"
    state.write_text(state.read_text().replace('"finished"', '"running"'))
    assert main(["stop", "r1", "--runs", str(runs)]) == 0
    assert "stop requested" in capsys.readouterr().out and (run_dir / "STOP").exists()


def test_status_of_a_crashed_run_shows_its_exit_code_and_never_none(tmp_path: Path, capsys):
    """User trial: a run that crashed at its first chat call (exit 2) showed `stopped: <reason> (exit None)`. A crash
    is now recorded with its exit code (tests/agents/test_openai.py runs one); a run recorded before that shows
    its reason alone."""
    from ralph_ray.__main__ import main

    runs, kb = tmp_path / "runs", tmp_path / "kb"
    reason = "AgentConfigError: the LLM endpoint http://127.0.0.1:8000 answered 404 for model 'm'"
    run_dir = _recorded_run(runs, "crashed", quiet_s=10, stop_reason=reason, exit_code=2)
    assert main(["status", "r1", "--runs", str(runs), "--kb", str(kb)]) == 0
    assert f"r1: crashed, cycle 3, phase train, elapsed 0s, stopped: {reason} (exit 2)" in capsys.readouterr().out

    state = run_dir / "state.json"
    state.write_text(state.read_text().replace('"exit_code": 2', '"exit_code": null'))
    assert main(["status", "r1", "--runs", str(runs), "--kb", str(kb)]) == 0
    shown = capsys.readouterr().out
    assert f"stopped: {reason}\n" in shown and "exit None" not in shown


def test_status_and_stop_read_the_recorded_drivers_process(tmp_path: Path, capsys, monkeypatch):
    """User trial: a driver that died on a full disk left `running` in state.json, and `status` said running (it had
    written a second before) while `stop` wrote a STOP file nobody would read. Its recorded process decides."""
    import subprocess
    import sys

    from ralph_ray import liveness
    from ralph_ray.__main__ import main

    monkeypatch.delenv(liveness.STALE_ENV, raising=False)
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    driver = {**liveness.this_driver(), "pid": process.pid, "started": liveness._start_ticks(process.pid)}
    runs, kb = tmp_path / "runs", tmp_path / "kb"
    run_dir = _recorded_run(runs, "running", quiet_s=3600, driver=driver)  # quiet for an hour, but alive
    try:
        assert main(["status", "r1", "--runs", str(runs), "--kb", str(kb)]) == 0
        assert "r1: running, cycle 3" in " ".join(capsys.readouterr().out.split())
    finally:
        process.kill()
        process.wait()
    now = time.time()
    os.utime(run_dir / "state.json", (now, now))  # it wrote just now, then died
    assert main(["status", "r1", "--runs", str(runs), "--kb", str(kb)]) == 0
    shown = " ".join(capsys.readouterr().out.split())
    assert "r1: stopped unexpectedly?, cycle 3" in shown
    assert f"its driver (PID {process.pid} on {driver['host']}) is no longer running" in shown
    assert f"python -m ralph_ray resume=r1 paths.runs={runs} paths.kb={kb}" in shown
    assert main(["stop", "r1", "--runs", str(runs)]) == 2
    shown = " ".join(capsys.readouterr().out.split())
    assert "is no longer running" in shown and "nothing to stop" in shown and "resume=r1" in shown
    assert not (run_dir / "STOP").exists()


def test_a_full_disk_is_named_in_words_however_deep_in_the_chain(tmp_path: Path):
    """An MLOps user's campaign on a full disk ended in ~290 lines of chained tracebacks and no word of the cause.
    The errors here are the operating system's own: a write to /dev/full fails with ENOSPC."""
    from ralph_ray.__main__ import disk_full

    try:
        with open("/dev/full", "w") as full:
            full.write("x")
            full.flush()
    except OSError as error:
        enospc = error
    assert enospc.errno == 28
    try:
        try:
            raise enospc
        except OSError:
            raise RuntimeError("Error stopping trial: could not write its checkpoint")  # noqa: B904 - a context
    except RuntimeError as wrapped:
        assert disk_full(wrapped)  # reached through __context__
    assert disk_full(RuntimeError(f"worker failed: {enospc}"))  # a worker's error passed on as text
    try:
        (tmp_path / "missing" / "file").write_text("x")
    except OSError as other:
        assert not disk_full(other)  # another OS error is not a full disk


def test_status_and_report_find_a_run_where_the_kb_records_it_and_say_best_single_trial(tmp_path: Path, capsys):
    """User trial: one KB, two runs dirs; `status RUN_ID` and `report RUN_ID` said "no campaign ... under runs_b"
    though the KB's runs row records the run's dir. And `status`'s "best" was the best single trial (the seed's lucky
    0.99) beside a pick of another variant: now labelled as what it is, and the pick's interval clipped at 1."""
    from pickkb import KID_LOW, pick_kb

    from ralph_ray.__main__ import main

    kb, run_dir = pick_kb(tmp_path, tmp_path / "runs_b" / "r1")
    other = tmp_path / "runs_a"
    other.mkdir()
    assert main(["status", "r1", "--runs", str(other), "--kb", str(kb)]) == 0
    shown = " ".join(capsys.readouterr().out.split())
    assert f"run r1 is not under {other.resolve()}: using {run_dir}, as the knowledge base records" in shown
    assert "best single trial, selection accuracy (higher is better): 0.9900 (seed)" in shown
    assert f"pick (rank 1, by replicate mean): kid, 0.9700 ± 0.3812 (n=2, 95% CI clipped to [{KID_LOW}, 1.0000])" in (
        shown
    )
    assert main(["report", "r1", "--runs", str(other), "--kb", str(kb)]) == 0
    report = (run_dir / "report" / "final_report.md").read_text()
    assert (
        f"- best variant: kid, selection 0.9700, test 0.9700; over its replicates (fresh seeds, 95% t interval): "
        f"0.9700 ± 0.3812 (n=2, 95% CI clipped to [{KID_LOW}, 1.0000])" in report
    )
    assert main(["status", "nope", "--runs", str(other), "--kb", str(kb)]) == 2  # in neither: the error as before
    assert f"no campaign nope under {other.resolve()}" in capsys.readouterr().out


def test_kb_sql_reads_ralph_kb_and_has_its_own_help(tmp_path: Path, capsys, monkeypatch):
    """User trial: `kb sql` ignored RALPH_KB, which the app honours; `kb sql --help` printed the campaign's usage."""
    from pickkb import pick_kb

    from ralph_ray.__main__ import main

    kb, _ = pick_kb(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    monkeypatch.setenv("RALPH_KB", str(kb))
    assert main(["kb", "sql", "select count(*) as n from trials", "--csv"]) == 0
    assert capsys.readouterr().out.split() == ["n", "6"]
    assert main(["kb", "sql", "--help"]) == 0
    shown = capsys.readouterr().out
    assert shown.startswith('usage: ralph-ray kb sql "QUERY" [--csv] [--kb DIR]') and "$RALPH_KB" in shown
    assert "Runs a campaign" not in shown


def test_status_of_a_live_run_counts_its_time_since_the_last_save_and_names_the_metric(
    tmp_path: Path, capsys, monkeypatch
):
    """User trial: an async run's `status` said "elapsed 13s" at about 60 s (state.json is saved at phase changes,
    and the train phase lasts minutes); its leaderboard's `selection` / `test` columns named no metric."""
    import json
    import re
    from datetime import timedelta

    from pickkb import pick_kb

    from ralph_ray import liveness
    from ralph_ray.__main__ import main
    from ralph_ray.kb import now

    monkeypatch.setenv("COLUMNS", "250")
    kb, run_dir = pick_kb(tmp_path)
    state = json.loads((run_dir / "state.json").read_text())
    saved = now() - timedelta(seconds=47)
    state.update(
        status="running", phase="train", elapsed_s=13.0, updated_at=saved.isoformat(), driver=liveness.this_driver()
    )
    (run_dir / "state.json").write_text(json.dumps(state))  # this test's process is the live driver
    assert main(["status", "r1", "--runs", str(run_dir.parent), "--kb", str(kb)]) == 0
    shown = " ".join(capsys.readouterr().out.split())
    found = re.search(
        r"r1: running, cycle 2, phase train, elapsed (\d+)s \(13s when state.json was saved \+ (\d+)s", shown
    )
    assert found and 47 <= int(found[2]) <= 60 and int(found[1]) == 13 + int(found[2]), shown
    assert re.search(rf"time {found[1]}s/no limit", shown), shown
    assert "selection accuracy" in shown and "test accuracy" in shown

    state["driver"] = {**state["driver"], "pid": 2**22 + 7, "started": 1}  # its driver is gone: no clock runs on
    (run_dir / "state.json").write_text(json.dumps(state))
    assert main(["status", "r1", "--runs", str(run_dir.parent), "--kb", str(kb)]) == 0
    shown = " ".join(capsys.readouterr().out.split())
    assert "stopped unexpectedly?, cycle 2, phase train, elapsed 13s its record" in shown and " since" not in shown


def test_sigterm_while_ray_starts_ends_as_one_while_training(tmp_path: Path):
    """User trial: a SIGTERM that landed during `ray.init` (10-60 s on a loaded machine) met Ray's own handler: exit
    15, the run recorded `crashed` with "SystemExit: 15", no exit code, no resume command. It now ends as a SIGTERM
    while training does: exit 143, recorded interrupted, and the resume command with the run's paths."""
    import json
    import signal
    import tempfile

    from ralph_ray import sandbox

    ray_tmp = Path(tempfile.mkdtemp(prefix="rr", dir="/tmp"))  # short: Ray's socket paths live under it
    runs, kb = tmp_path / "runs", tmp_path / "kb"
    args = ["run_id=early", f"paths.runs={runs}", f"paths.kb={kb}", "search.num_samples=2", "safeguards.replicates=0"]
    env = {**os.environ, "RAY_TMPDIR": str(ray_tmp), "RALPH_LOCAL_RAY_MARKER": str(tmp_path / "no_kept_ray.json")}
    log = tmp_path / "driver.log"  # a file, not a pipe: a Ray process that inherited it would hold a pipe open
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "ralph_ray", *args, *(["sandbox=none"] if sandbox.available() else [])],
            cwd=tmp_path,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 240
        while not list((ray_tmp / "ray").glob("session_2*")):  # ray.init has begun: its handler is in place
            assert proc.poll() is None and time.monotonic() < deadline, "Ray never started"
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
    finally:
        proc.kill()
    said = log.read_text()
    assert proc.returncode == 143, said[-3000:]
    assert f"python -m ralph_ray resume=early paths.runs={runs} paths.kb={kb}" in " ".join(said.split()), said[-3000:]
    state = json.loads((runs / "early" / "state.json").read_text())
    assert (state["status"], state["stop_reason"], state["exit_code"]) == ("interrupted", "SIGTERM", 143)
    left = [p for p in Path("/proc").glob("[0-9]*") if str(ray_tmp) in _cmdline(p)]
    assert not left, f"Ray processes left behind: {[_cmdline(p) for p in left]}"


def test_the_ray_function_that_sigterm_holds_back_is_where_ray_has_it():
    """sigterm.kept holds Ray's SIGTERM handler back by replacing ray._private.utils.set_sigterm_handler, a private
    function ray.init calls: a Ray upgrade that moves or renames it would let Ray's handler in again without a word
    (exit 15, the run recorded crashed). This fails loudly instead."""
    import inspect
    import signal

    from ray._private import utils, worker

    from ralph_ray.sigterm import _ray_utils, install, kept, on_sigterm, restore

    assert _ray_utils() is utils and callable(getattr(utils, "set_sigterm_handler", None))
    assert "ray._private.utils.set_sigterm_handler(" in inspect.getsource(worker.init)
    before = install()
    try:
        with kept():
            utils.set_sigterm_handler(lambda signum, frame: None)  # what ray.init does first thing
            assert signal.getsignal(signal.SIGTERM) is on_sigterm
    finally:
        restore(before)


def _cmdline(proc_dir: Path) -> str:
    """A process's command line ('' once it is gone)."""
    try:
        return (proc_dir / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def test_ray_failing_to_start_is_one_line_with_the_resume_and_exit_4(tmp_path: Path):
    """User trial: Ray timing out at start on a loaded machine ended in a 20-line traceback, exit 4, no resume
    command and `exit None` in `status`. Here Ray really fails to start (its socket paths under a RAY_TMPDIR too long
    for AF_UNIX); Ray's own timeout, a bare Exception, reads the same."""
    import json

    from ralph_ray import sandbox
    from ralph_ray.raycluster import RayStartError, start_failed

    timed_out = start_failed(Exception("The current node timed out during startup. This could happen because ..."))
    assert isinstance(timed_out, RayStartError) and "\n" not in str(timed_out)
    assert str(timed_out).startswith("Ray did not start on this machine (Exception: The current node timed out")
    assert "load average" in str(timed_out)

    ray_tmp = tmp_path / ("x" * 110)  # no socket path fits under it
    ray_tmp.mkdir()
    runs, kb = tmp_path / "runs", tmp_path / "kb"
    args = ["run_id=nostart", f"paths.runs={runs}", f"paths.kb={kb}", "search.num_samples=2"]
    done = subprocess.run(
        [sys.executable, "-m", "ralph_ray", *args, *(["sandbox=none"] if sandbox.available() else [])],
        cwd=tmp_path,
        env={**os.environ, "RAY_TMPDIR": str(ray_tmp), "RALPH_LOCAL_RAY_MARKER": str(tmp_path / "none.json")},
        capture_output=True,
        text=True,
        timeout=300,
    )
    said = " ".join(done.stderr.split())
    assert done.returncode == 4, done.stderr[-3000:]
    assert "error: Ray did not start on this machine (OSError: " in said and "Traceback" not in done.stderr
    assert (
        f"recorded as crashed; retry with `python -m ralph_ray resume=nostart paths.runs={runs} paths.kb={kb}`" in said
    )
    state = json.loads((runs / "nostart" / "state.json").read_text())
    assert (state["status"], state["exit_code"]) == ("crashed", 4)
    assert state["stop_reason"].startswith("RayStartError: Ray did not start")


def test_every_printed_resume_and_stop_command_carries_the_runs_paths(tmp_path: Path, capsys, monkeypatch):
    """User trial: `stop`'s line said `resume with python -m ralph_ray resume=stop2` for a run started with
    paths.runs=/work/ut_crash/runs paths.kb=/work/ut_crash/kb: from another folder it failed. One function
    (liveness.resume_for) builds them all from the run's paths: absolute, where not the defaults."""
    from ralph_ray import liveness
    from ralph_ray.__main__ import main

    monkeypatch.chdir(tmp_path)
    assert liveness.resume_for("r", "runs", "./kb") == "python -m ralph_ray resume=r"  # the defaults, beside them
    spaced = f"python -m ralph_ray resume=r \"paths.runs='{tmp_path}/my runs'\""  # Hydra's quotes in the shell's
    assert liveness.resume_for("r", "my runs", "kb") == spaced
    assert liveness.stop_for("r", "/a/runs", "/b/kb") == "python -m ralph_ray stop r paths.runs=/a/runs paths.kb=/b/kb"
    runs, shared_kb = tmp_path / "runs", tmp_path / "shared" / "kb"
    run_dir = _recorded_run(runs, "running", quiet_s=0, driver=liveness.this_driver())  # this process: alive
    (run_dir / "config.yaml").write_text(f"paths:\n  runs: {runs}\n  kb: {shared_kb}\n")
    assert main(["stop", "r1", "--runs", "runs"]) == 0  # from the folder it was started in, as the user did
    shown = " ".join(capsys.readouterr().out.split())
    assert f"resume with `python -m ralph_ray resume=r1 paths.runs={runs} paths.kb={shared_kb}`" in shown, shown


def test_a_printed_resume_command_finds_a_run_whose_folder_hydra_would_misread(tmp_path: Path, capsys):
    """Review: the printed `resume=... paths.runs=...` was quoted for the shell only, but Hydra reads it, and refuses a
    path holding `(`, `#`, `=` or `~`, and turns a comma into a sweep. The path is quoted for Hydra inside the shell's
    quoting; `stop`'s command, read unparsed (`--runs` and `--kb` alike), keeps it raw."""
    import shlex

    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf

    from ralph_ray import liveness
    from ralph_ray.__main__ import main
    from ralph_ray.config import load_config

    where = tmp_path / "my runs, (copy) #2=~x"
    runs, kb = where / "runs", where / "kb"
    (runs / "r1").mkdir(parents=True)
    (runs / "r1" / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.structured(load_config([]))))
    words = shlex.split(liveness.resume_for("r1", runs, kb))
    assert words[:4] == ["python", "-m", "ralph_ray", "resume=r1"], words
    parser = OverridesParser.create()
    assert [parser.parse_override(word).value() for word in words[4:]] == [str(runs), str(kb)], words
    assert main([*words[3:], "--cfg"]) == 0, capsys.readouterr().err  # as the CLI reads it: it finds the run
    shown = OmegaConf.create(capsys.readouterr().out)
    assert (shown.resume, shown.paths.runs, shown.paths.kb) == ("r1", str(runs), str(kb))
    assert shlex.split(liveness.stop_for("r1", runs, kb))[5:] == [f"paths.runs={runs}", f"paths.kb={kb}"]
    # a quote, a trailing backslash, a non-ASCII letter: read back exactly too; a plain path stays unquoted
    for odd in ("/a/it's", "/a/b\\", "/a/é", "/a/x\\'y"):
        word = shlex.split(liveness.resume_for("r1", odd, "kb"))[4]
        assert parser.parse_override(word).value() == odd, word
    assert liveness.resume_for("r1", "/a/runs", "kb") == "python -m ralph_ray resume=r1 paths.runs=/a/runs"


def test_a_damaged_part_is_one_warning_line_on_the_command_line(tmp_path: Path):
    """User trial: `status` over a KB with another run's truncated part printed Python's raw warning,
    `.../commands.py:207: DamagedPartWarning: skipped ...` and the source line `con = open_reader(kb)`. The CLI
    prints the project's warnings as one line `warning: <message>`; others (a library's) stay as Python shows them."""
    import warnings

    from pickkb import pick_kb

    from ralph_ray.kb import KnowledgeBase, open_reader

    kb_root, run_dir = pick_kb(tmp_path)
    kb = KnowledgeBase(kb_root)
    kb.append("trials", [{"run_id": "other", "trial_id": "o1", "variant_id": "seed"}], "other-c1-o1")
    bad = next((kb.parquet / "trials").glob("other-*.parquet"))
    with bad.open("r+b") as part:
        part.truncate(100)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        open_reader(kb_root).close()
    said = [str(w.message) for w in caught]
    assert len(said) == 1 and str(bad) in said[0]
    done = subprocess.run(
        [sys.executable, "-m", "ralph_ray", "status", "r1", "--runs", str(run_dir.parent), "--kb", str(kb_root)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "run r1: finished" in done.stdout
    assert done.stderr.splitlines() == [f"warning: {said[0]}"], done.stderr
    # a library's warning keeps Python's own shape (file:line: Category: message), under the same hook
    shown = subprocess.run(
        [
            sys.executable,
            "-c",
            "import warnings, sys; from ralph_ray.__main__ import plain_warnings\n"
            "with plain_warnings():\n"
            "    warnings.warn('old api', DeprecationWarning)\n"
            "    from ralph_ray.kb import DamagedPartWarning; warnings.warn('a part', DamagedPartWarning)",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = shown.stderr.splitlines()
    assert lines[0].endswith(": DeprecationWarning: old api") and lines[0].startswith("<string>:"), shown.stderr
    assert lines[-1] == "warning: a part", shown.stderr
