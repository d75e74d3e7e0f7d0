"""The sandbox against a corpus of hostile trainers (tests/hostile/): each breach contained, named, and no process left.

Every trainer runs through the real runner inside bubblewrap with small limits (512 MiB, 64 processes, 1 MiB of
output, a few seconds) on the real digits public data. The tests skip only where bubblewrap cannot run here.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from ralph_ray import PROJECT_ROOT
from ralph_ray import sandbox as sb
from ralph_ray.runner import Limits, Status, Trainer, run
from ralph_ray.sandbox import Breach, Jail, Policy, SandboxError, SandboxMode, View
from ralph_ray.tasks.base import write_public
from ralph_ray.tasks.digits import prepare
from ralph_ray.workdir import write_variant

HOSTILE = Path(__file__).parent / "hostile"
missing = sb.available()
needs_bwrap = pytest.mark.skipif(missing is not None, reason=f"bubblewrap cannot run here: {missing}")
POLICY = Policy(SandboxMode.bwrap, memory_mb=512, processes=64, file_size_mb=64)


@pytest.fixture(scope="module")
def public(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("public")
    write_public(prepare(0, 0.2, 0.2), folder, "digits")
    return folder


def hostile_run(
    tmp_path: Path,
    public: Path,
    name: str,
    policy: Policy = POLICY,
    timeout_s: float = 60,
    warm: bool = False,
    **fill: object,
):
    """Run tests/hostile/<name>.py as a trial's train.py (cold, or forked by a warm server); (outcome, work dir)."""
    source = (HOSTILE / f"{name}.py").read_text()
    for key, value in fill.items():
        source = source.replace("{" + key.upper() + "}", str(value))
    work = tmp_path / "trials" / name
    write_variant({"train.py": source.encode()}, work)
    outcome = run(Trainer(work, public), Limits(timeout_s, output_bytes=1 << 20, sandbox=policy, warm=warm))
    assert not survivors(work), f"processes of {name} outlived its run: {survivors(work)}"
    return outcome, work


def survivors(work: Path) -> list[int]:
    """Processes (anywhere on the machine) whose environment names this work dir, or that work in it.

    A warm trainer's /proc environ is its fork server's (it sets its own in place), so its folder tells."""
    marker = f"={work}/".encode()
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cwd = os.readlink(proc / "cwd")
            if marker in (proc / "environ").read_bytes() or Path(cwd) == work or Path(cwd).is_relative_to(work):
                found.append(int(proc.name))
        except OSError:
            continue
    return found


def assert_breach(outcome, breach: Breach) -> None:
    assert outcome.status is Status.failed, outcome
    assert outcome.breach is breach, outcome.reason
    assert (outcome.reason or "").startswith(f"{breach.value}: "), outcome.reason


@needs_bwrap
def test_endless_loop_times_out(tmp_path: Path, public: Path):
    outcome, _ = hostile_run(tmp_path, public, "endless_loop", timeout_s=5)
    assert_breach(outcome, Breach.timeout)


@needs_bwrap
def test_memory_bomb_is_stopped_at_the_limit(tmp_path: Path, public: Path):
    outcome, work = hostile_run(tmp_path, public, "memory_bomb")
    assert_breach(outcome, Breach.memory)
    assert "unhindered" not in (work / "stdout.log").read_text()


@needs_bwrap
def test_memory_bomb_without_a_cgroup_meets_the_rlimit(tmp_path: Path, public: Path, monkeypatch: pytest.MonkeyPatch):
    # Where no cgroup can be made (cgroup v2 without delegation, a container), RLIMIT_AS holds memory instead.
    monkeypatch.setattr(sb, "_make_cgroup", lambda *args: None)
    outcome, work = hostile_run(tmp_path, public, "memory_bomb", policy=Policy(SandboxMode.bwrap, memory_mb=1024))
    assert_breach(outcome, Breach.memory)
    assert "unhindered" not in (work / "stdout.log").read_text()


@needs_bwrap
@pytest.mark.parametrize("warm", [False, True], ids=["cold", "warm"])
def test_memory_bomb_on_a_cuda_node_without_a_cgroup_meets_the_runners_rss_watch(
    tmp_path: Path, public: Path, monkeypatch: pytest.MonkeyPatch, warm: bool
):
    # On a CUDA node RLIMIT_AS can't hold memory: cuInit reserves more address space than any trial's limit, and
    # torch would quietly train on the CPU. There the runner watches the trainer's resident memory instead.
    monkeypatch.setattr(sb, "_make_cgroup", lambda *args: None)
    control = tmp_path / "nvidiactl"  # what NVIDIA's driver creates on a GPU node
    control.touch()
    monkeypatch.setattr(sb, "NVIDIA_CONTROL", control)
    policy = Policy(SandboxMode.bwrap, memory_mb=1024)
    jail = Jail(policy, View(writable=(tmp_path,)))
    assert "RLIMIT_AS" not in jail.rlimits() and jail.rss_watch_mb == 1024
    assert "memory 1024 MiB by the runner's RSS watch" in jail.limits_note
    jail.close()
    agent = Jail(policy, View(writable=(tmp_path,)), cuda=False)  # a CLI agent: nothing watches it, the rlimit holds
    assert agent.rss_watch_mb is None and agent.rlimits()["RLIMIT_AS"] == 1024 * sb.MIB
    agent.close()
    outcome, work = hostile_run(tmp_path, public, "memory_bomb", policy=policy, warm=warm)
    assert_breach(outcome, Breach.memory)
    assert "watched by the runner" in (outcome.reason or "")
    assert "unhindered" not in (work / "stdout.log").read_text()


def test_without_a_cuda_node_or_with_a_cgroup_memory_is_not_watched(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(sb, "NVIDIA_CONTROL", tmp_path / "absent")
    monkeypatch.setattr(sb, "_make_cgroup", lambda *args: None)
    jail = Jail(Policy(SandboxMode.none, memory_mb=512), View(writable=(tmp_path,)))
    assert jail.rss_watch_mb is None and jail.rlimits()["RLIMIT_AS"] == 512 * sb.MIB
    jail.close()


@needs_bwrap
def test_fork_bomb_is_refused_at_the_process_limit(tmp_path: Path, public: Path):
    outcome, work = hostile_run(tmp_path, public, "fork_bomb")
    assert_breach(outcome, Breach.processes)
    assert "unhindered" not in (work / "stdout.log").read_text()


@needs_bwrap
def test_output_flood_is_capped_with_a_marker(tmp_path: Path, public: Path):
    outcome, work = hostile_run(tmp_path, public, "output_flood")
    assert_breach(outcome, Breach.output)
    log = (work / "stdout.log").read_bytes()
    assert len(log) < (1 << 20) + 1024 and log.rstrip().endswith(b"was dropped]")


@needs_bwrap
def test_labels_through_the_engine_are_unreachable(tmp_path: Path, public: Path):
    outcome, work = hostile_run(tmp_path, public, "labels_engine")
    assert_breach(outcome, Breach.forbidden_path)
    assert "No module named 'ralph_ray.tasks'" in outcome.reason
    assert not (work / "predictions.npz").exists()


@needs_bwrap
def test_the_raw_dataset_is_unreachable(tmp_path: Path, public: Path):
    outcome, work = hostile_run(tmp_path, public, "labels_raw")
    assert_breach(outcome, Breach.forbidden_path)
    assert "digits" in outcome.reason and not (work / "predictions.npz").exists()


FASHION_RAW = Path("/usr/share/datasets/fashion-mnist")  # Debian's dataset-fashion-mnist: under /usr, bound for all


@needs_bwrap
@pytest.mark.skipif(
    not (FASHION_RAW / "t10k-labels-idx1-ubyte.gz").is_file(),
    reason=f"Debian's dataset-fashion-mnist is not installed ({FASHION_RAW} is missing): apt-get install it",
)
@pytest.mark.parametrize("warm", [False, True], ids=["cold", "warm"])
def test_a_tasks_raw_data_in_a_system_folder_is_hidden_from_its_trials(tmp_path: Path, public: Path, warm: bool):
    from dataclasses import replace

    from ralph_ray.config import load_config, sandbox_policy

    # The fashion task's policy, as a campaign builds it: its prepare.py names the raw folder (`hidden_paths`).
    policy = replace(sandbox_policy(load_config(["task=fashion"])), memory_mb=512, processes=64, file_size_mb=64)
    assert str(FASHION_RAW) in policy.hidden
    outcome, work = hostile_run(tmp_path, public, "labels_raw_system", policy=policy, warm=warm, target=FASHION_RAW)
    assert_breach(outcome, Breach.forbidden_path)
    assert "t10k-labels" in outcome.reason and not (work / "predictions.npz").exists()
    if warm:
        return
    # The hole it closes: without the task's declaration, /usr's binding shows the files to every run.
    open_policy = replace(policy, hidden=tuple(h for h in policy.hidden if h != str(FASHION_RAW)))
    outcome, work = hostile_run(tmp_path / "open", public, "labels_raw_system", policy=open_policy, target=FASHION_RAW)
    assert "STOLE 10000 test labels" in (work / "stdout.log").read_text()


@needs_bwrap
def test_the_folder_a_campaign_is_started_from_is_not_shown_to_its_trials(
    tmp_path: Path, public: Path, monkeypatch: pytest.MonkeyPatch
):
    """User trial: raw data beside the task folder (`proj/raw/sales.csv`, every target), the campaign started from
    `proj/`: `python -m` put `proj/` on sys.path, the sandbox bound every sys.path folder, and the seed read each
    held-out target (selection R^2 1.0000). Started from a home folder, the whole home was shown."""
    launch = tmp_path / "proj"
    (launch / "raw").mkdir(parents=True)
    raw = launch / "raw" / "sales.csv"
    raw.write_text("1.0,2.0\n3.0,4.0\n")
    monkeypatch.chdir(launch)
    monkeypatch.syspath_prepend(str(launch))  # as `python -m ralph_ray` started from there has it
    assert not any(launch == p or launch.is_relative_to(p) for p in sb.python_dirs())
    outcome, work = hostile_run(tmp_path, public, "labels_launch_dir", target=raw)
    assert_breach(outcome, Breach.forbidden_path)
    assert "sales.csv" in outcome.reason and "STOLE" not in (work / "stdout.log").read_text()


@needs_bwrap
def test_raw_data_prepare_reads_in_the_python_environment_is_hidden_from_trials(
    tmp_path: Path, public: Path, capsys: pytest.CaptureFixture[str]
):
    """User trial: a prepare.py that read its raw files under /usr without `hidden_paths` let a trainer open the test
    labels: 1.0 in 111 trials of 111, no warning. What prepare() reads where trials see it is now hidden from them.
    (Here the Python environment, the one bound folder a test may write to.)"""
    from dataclasses import replace

    from ralph_ray.campaign import hide_what_prepare_read
    from ralph_ray.config import load_config, sandbox_policy
    from ralph_ray.tasks import prepare_splits, reads

    raw = Path(sys.prefix) / "share" / f"ralph-test-raw-{os.getpid()}"
    raw.mkdir(parents=True)
    try:
        labels = raw / "labels.csv"
        labels.write_text("3.0,1.0\n4.0,1.0\n")
        task = shutil.copytree(PROJECT_ROOT / "trainers" / "digits", tmp_path / "mine")
        source = (task / "prepare.py").read_text()
        reading = source.replace(
            "    return split(", f"    open({str(labels)!r}).read()  # its raw labels\n    return split("
        )
        assert reading != source
        (task / "prepare.py").write_text(reading)
        cfg = load_config([f"task={task}"])
        with reads.recording() as opened:
            prepare_splits(cfg)
        said: list[str] = []
        kept = load_config([f"task={task}", "sandbox.hide_prepare_reads=false"])
        hide_what_prepare_read(kept, opened, said.append)  # switched off: named, not hidden
        assert kept.sandbox.prepare_reads == [] and "warning" in said[0] and str(labels) in said[0]
        hide_what_prepare_read(cfg, opened, said.append)
        assert cfg.sandbox.prepare_reads == [str(labels)] and str(labels) in said[1]
        policy = replace(sandbox_policy(cfg), memory_mb=512, processes=64, file_size_mb=64)
        assert str(labels) in policy.hidden
        outcome, work = hostile_run(tmp_path, public, "labels_launch_dir", policy=policy, target=labels)
        assert_breach(outcome, Breach.forbidden_path)
        assert "STOLE" not in (work / "stdout.log").read_text()
        # the hole it closes: without it, the environment's bind shows the file to every run
        open_policy = replace(policy, hidden=tuple(h for h in policy.hidden if h != str(labels)))
        outcome, work = hostile_run(tmp_path / "open", public, "labels_launch_dir", policy=open_policy, target=labels)
        assert "STOLE 2 labelled rows" in (work / "stdout.log").read_text()
    finally:
        shutil.rmtree(raw, ignore_errors=True)


@needs_bwrap
def test_the_knowledge_base_is_unreachable(tmp_path: Path, public: Path):
    kb = tmp_path / "kb"
    kb.mkdir()
    (kb / "leaderboard.parquet").write_text("every variant's test score")
    outcome, work = hostile_run(tmp_path, public, "labels_kb", target=kb)
    assert_breach(outcome, Breach.forbidden_path)
    assert "leaderboard" not in (work / "stdout.log").read_text()


def sklearn_data() -> Path | None:
    """The raw datasets inside the Python environment, which the sandbox hides under a tmpfs."""
    jail = Jail(POLICY, View(writable=()))
    try:
        hidden = jail.hidden_paths()
    finally:
        jail.close()
    data = next((h for h in hidden if h.name == "data" and "sklearn" in h.parts), None)
    return data if data is not None and any(data.is_relative_to(p) for p in sb.python_dirs()) else None


@needs_bwrap
def test_what_hides_the_raw_dataset_cannot_be_unmounted(tmp_path: Path, public: Path):
    # bwrap run by root keeps its capabilities unless told: a trainer could then unmount the cover.
    target = sklearn_data()
    if target is None:
        pytest.skip("scikit-learn's datasets are not inside a bound Python folder here")
    outcome, work = hostile_run(tmp_path, public, "unhide", target=target)
    assert_breach(outcome, Breach.forbidden_path)
    assert "unhidden" not in (work / "stdout.log").read_text()


def site_packages() -> Path:
    return Path(next(p for p in sys.path if p.endswith("site-packages")))


@needs_bwrap
@pytest.mark.parametrize("where", ["run dir", "kb", "project", "site-packages"])
def test_writing_outside_the_work_dir_is_refused(tmp_path: Path, public: Path, where: str):
    folder = {
        "run dir": tmp_path / "runs" / "r1",
        "kb": tmp_path / "kb",
        "project": PROJECT_ROOT,
        "site-packages": site_packages(),
    }[where]
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / f"planted-{tmp_path.name}.txt"
    outcome, _ = hostile_run(tmp_path, public, "write_outside", target=target)
    assert_breach(outcome, Breach.forbidden_path)
    assert not target.exists()


@needs_bwrap
def test_no_network_not_even_loopback(tmp_path: Path, public: Path):
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        server.settimeout(0.5)
        outcome, _ = hostile_run(tmp_path, public, "network", port=server.getsockname()[1])
        assert_breach(outcome, Breach.network)
        with pytest.raises(socket.timeout):
            server.accept()  # nobody came


@needs_bwrap
def test_nan_and_exit_codes_fail_without_a_breach(tmp_path: Path, public: Path):
    outcome, _ = hostile_run(tmp_path, public, "nan")
    assert outcome.status is Status.failed and outcome.breach is None and "non-finite val_loss" in outcome.reason
    outcome, _ = hostile_run(tmp_path, public, "exit_code")
    assert outcome.status is Status.failed and outcome.breach is None
    assert "exited with code 1: giving up" in outcome.reason


@needs_bwrap
def test_a_trial_sees_its_work_dir_the_data_and_the_harness_only(tmp_path: Path, public: Path):
    probe = f"""
import json, os, sys
import ralph_ray
from ralph_ray import harness
seen = {{"engine": list(ralph_ray.__path__), "data": sorted(os.listdir(harness.data_dir())), "tmp": os.listdir("/tmp"),
        "project": os.path.exists({str(PROJECT_ROOT / "ralph_ray")!r}),
        "home": os.path.exists({str(Path.home() / ".ray")!r})}}
json.dump(seen, open("seen.json", "w"))
harness.report(epoch=1, val_acc=0.1)
"""
    work = tmp_path / "probe"
    write_variant({"train.py": probe.encode()}, work)
    outcome = run(Trainer(work, public), Limits(60, sandbox=POLICY))
    assert outcome.status is Status.finished, outcome.reason
    seen = json.loads((work / "seen.json").read_text())
    assert seen["engine"] == [str(sb.LIB_INSIDE / "ralph_ray")]
    # /tmp is private: empty but for the mount points of the work dir and the data when they live under /tmp.
    expected_tmp = {
        p.resolve().relative_to("/tmp").parts[0] for p in (work, public) if p.resolve().is_relative_to("/tmp")
    }
    assert seen["data"] == sorted(p.name for p in public.iterdir()) and set(seen["tmp"]) == expected_tmp
    assert not seen["project"] and not seen["home"]


@pytest.fixture
def no_bwrap_on_path(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A machine without bubblewrap: nothing on PATH; the cached probe forgotten before and after."""
    monkeypatch.setenv("PATH", "/nonexistent")
    sb._bwrap_problem.cache_clear()
    yield
    monkeypatch.undo()
    sb._bwrap_problem.cache_clear()  # the next test probes the real PATH again


def test_a_missing_bwrap_names_the_fix(no_bwrap_on_path: None):
    with pytest.raises(SandboxError, match="apt-get install bubblewrap.*sandbox=none"):
        sb.check(Policy(SandboxMode.bwrap))
    sb.check(Policy(SandboxMode.none))  # the explicit opt-out needs nothing


def test_jail_command_hides_the_project_and_the_raw_dataset(tmp_path: Path):
    # A raw dataset (data.root) and a labels file inside a folder the jail binds (here one its view reads)
    env = (tmp_path / "env").resolve()
    data_root, labels = env / "data_root", env / "labels.csv"
    data_root.mkdir(parents=True)
    labels.write_text("the held-out labels")
    work = (tmp_path / "work").resolve()
    work.mkdir()
    jail = Jail(Policy(hidden=(str(data_root), str(labels))), View(writable=(work,), extra_readable=(env,)))
    try:
        line = " ".join(jail.command(["python", "train.py"], work))
    finally:
        jail.close()
    assert f"--bind {work} {work}" in line and "--unshare-all" in line and "--share-net" not in line
    assert f" {PROJECT_ROOT} " not in line.replace(f"{PROJECT_ROOT}/.venv", "")  # only the venv, if it lives there
    # Each hidden path is covered after the bind that holds it (a later bind of its folder would uncover it)
    bind = line.index(f"--ro-bind {env} {env}")
    assert line.index(f"--tmpfs {data_root}") > bind and line.index(f"--ro-bind /dev/null {labels}") > bind
    target = sklearn_data()  # digits needs scikit-learn, whose raw datasets sit in the bound Python environment
    assert target is not None and target.is_dir(), "scikit-learn's datasets are not inside a bound Python folder"
    assert f"--tmpfs {target}" in line


STEAL = """
    try:  # a child told to raise the score: the frozen labels, rebuilt through the engine
        from ralph_ray.tasks.digits import prepare as _prepare

        _held = _prepare(0, 0.2, 0.2)
        harness.save_predictions(selection=_held.selection_y, test=_held.test_y)
        print("STOLE THE LABELS", flush=True)
        return
    except ImportError as err:
        print(f"no labels to steal: {err}", flush=True)
"""


@needs_bwrap
@pytest.mark.slow
def test_a_campaign_scores_a_label_thief_by_what_its_model_earns(ray_session, tiny_config, tmp_path: Path):
    from ralph_ray.campaign import run as run_campaign
    from ralph_ray.kb import open_reader

    thief = tmp_path / "thief"
    shutil.copytree(PROJECT_ROOT / "trainers" / "digits", thief, ignore=shutil.ignore_patterns("__pycache__"))
    source = (thief / "train.py").read_text()
    anchor = "    harness.save_predictions(selection=predict(model, selection), test=predict(model, test))\n"
    assert anchor in source
    (thief / "train.py").write_text(source.replace(anchor, textwrap.indent(textwrap.dedent(STEAL), "    ") + anchor))
    cfg = tiny_config(
        "agent=none",
        "safeguards.max_cycles=1",
        "search.num_samples=2",
        "scheduler=fifo",  # both trials to the end: ASHA may stop the worse of two, and both must be scored
        f"task.trainer={thief}",
        "run_id=thief",
    )
    outcome = run_campaign(cfg)
    rows = (
        open_reader(tmp_path / "kb")
        .execute("select status, selection_score, test_score from trials where run_id = 'thief'")
        .fetchall()
    )
    assert len(rows) == 2 and all(status == "completed" for status, _, _ in rows), rows
    assert all(score is not None and score < 0.999 for _, score, test in rows for score in (score, test)), rows
    logs = [p.read_text() for p in (outcome.run_dir / "cycle_0001" / "trials").glob("*/stdout.log")]
    assert logs and all("no labels to steal: No module named 'ralph_ray.tasks'" in log for log in logs)
    assert not any("STOLE" in log for log in logs)


AGENT = """
import pathlib, socket, sys
pathlib.Path("train.py").write_text(pathlib.Path("train.py").read_text().replace("DROPOUT = 0.0", "DROPOUT = 0.25"))
print("kb visible:", pathlib.Path(sys.argv[1]).exists())
socket.create_connection(("127.0.0.1", int(sys.argv[2])), timeout=5).sendall(b"hello API")
"""


@needs_bwrap
def test_a_cli_agent_edits_its_work_dir_with_the_network_but_not_the_kb(tmp_path: Path):
    from ralph_ray.agents.cli import CliCoder
    from ralph_ray.config import AgentBackend, AgentConfig

    (tmp_path / "tool").mkdir()
    (tmp_path / "tool" / "agent.py").write_text(AGENT)
    kb = tmp_path / "kb"
    kb.mkdir()
    work, scratch = tmp_path / "child", tmp_path / "scratch"
    work.mkdir(), scratch.mkdir()
    (work / "train.py").write_text("DROPOUT = 0.0  # dropout\n")
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        server.settimeout(30)
        port = server.getsockname()[1]
        cfg = AgentConfig(
            backend=AgentBackend.cli, cli_command=f"{sys.executable} {tmp_path / 'tool' / 'agent.py'} {kb} {port}"
        )
        coder = CliCoder(cfg, Policy(hidden=(str(kb),)))
        output = coder._run(coder_argv := cfg.cli_command.split(), work, scratch, None)
        connection, _ = server.accept()  # the agent reached "its API" on loopback
        assert connection.recv(64) == b"hello API"
        connection.close()
    assert coder_argv and "kb visible: False" in output
    assert "DROPOUT = 0.25" in (work / "train.py").read_text()


def test_a_node_without_bwrap_fails_the_trial_with_the_fix(tmp_path: Path, public: Path, no_bwrap_on_path: None):
    # The driver checks its own machine; a worker node without bubblewrap fails its trials (final, not retried).
    # Such a node: no `bwrap` on its PATH, so bwrap itself is not found (nothing else on the cold path needs PATH)
    work = tmp_path / "work"
    write_variant({"train.py": b"print('never runs')\n"}, work)
    outcome = run(Trainer(work, public), Limits(30, sandbox=Policy(SandboxMode.bwrap)))
    assert outcome.status is Status.failed and "apt-get install bubblewrap" in (outcome.reason or "")


def test_a_python_environment_under_tmp_is_bound_after_the_private_tmp():
    # A CI checkout under /tmp keeps its venv there: binding it before `--tmpfs /tmp` would hide the interpreter.
    jail = Jail(POLICY, View(writable=()))
    try:
        args = jail.command(["python", "train.py"], Path.cwd())
    finally:
        jail.close()
    private_tmp = next(i for i in range(len(args) - 1) if args[i : i + 2] == ["--tmpfs", "/tmp"])
    for folder in sb.python_dirs():
        bind = next(i for i in range(len(args) - 2) if args[i : i + 3] == ["--ro-bind", str(folder), str(folder)])
        assert bind > private_tmp, f"{folder} is bound before the private /tmp covers it"


PEEK = """
import os, sys
shared, runs, work = sys.argv[1:4]
print("secret:", sorted(os.listdir(os.path.join(shared, "secret"))))
print("tool:", open(os.path.join(shared, "tool.txt")).read())
print("runs:", sorted(os.listdir(runs)))
print("other run:", os.path.exists(os.path.join(runs, "r", "other.txt")))
open(os.path.join(work, "out.txt"), "w").write("written")
"""


@needs_bwrap
def test_hidden_paths_nested_in_the_views_folders_stay_hidden_and_the_work_dir_inside_one_stays_bound(tmp_path: Path):
    # A folder the view binds (a CLI agent's program folder: here it holds the project, so runs/) holds a hidden
    # path (secret/) and a hidden folder (runs/) that holds the work dir. bwrap mounts in order: a cover before the
    # bind of the folder that holds it is shown again by that bind; a cover after the work dir's bind hides it.
    shared = (tmp_path / "shared").resolve()
    runs = shared / "runs"
    (shared / "secret").mkdir(parents=True)
    (shared / "secret" / "labels.csv").write_text("the held-out labels")
    (shared / "tool.txt").write_text("the agent's program")
    work = runs / "r" / "work"
    work.mkdir(parents=True)
    (runs / "r" / "other.txt").write_text("another run's file")
    (runs / "q").mkdir()
    jail = Jail(
        Policy(hidden=(str(shared / "secret"), str(runs))),
        View(writable=(work,), extra_readable=(shared,), harness=False),
    )
    try:
        argv = jail.command([sys.executable, "-c", PEEK, str(shared), str(runs), str(work)], work)
        ran = subprocess.run(argv, env=jail.env(dict(os.environ)), capture_output=True, text=True, timeout=60)
    finally:
        jail.close()
    assert ran.returncode == 0, ran.stderr
    assert "secret: []" in ran.stdout  # covered, though the folder that holds it is bound
    assert "tool: the agent's program" in ran.stdout
    assert "runs: ['r']" in ran.stdout and "other run: False" in ran.stdout  # only the way to the work dir
    assert (work / "out.txt").read_text() == "written"  # the work dir inside the hidden runs/ is still bound
