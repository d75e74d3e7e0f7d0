"""Warm trial starts: trainers forked by a fork server with torch imported, still inside the sandbox.

The hostile corpus (tests/hostile/) runs through the warm path with the same expectations as cold; then what only
a fork could get wrong: siblings out of sight, no capability left, no state shared between trainers, fresh
entropy, the trainer's exit code, and the cold fallback that says why once.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from pathlib import Path

import pytest
from test_sandbox import POLICY, assert_breach, hostile_run, needs_bwrap, site_packages, sklearn_data

from ralph_ray import PROJECT_ROOT, warmstart
from ralph_ray.runner import Limits, Status, Trainer, run
from ralph_ray.sandbox import Breach, Policy, SandboxMode
from ralph_ray.tasks.base import write_public
from ralph_ray.tasks.digits import prepare
from ralph_ray.workdir import write_variant

PLAIN = Policy(SandboxMode.none)


@pytest.fixture(scope="module")
def public(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("public")
    write_public(prepare(0, 0.2, 0.2), folder, "digits")
    return folder


@pytest.fixture(autouse=True, scope="module")
def servers():
    yield
    warmstart.close_all()


def warm_run(root: Path, public: Path, name: str, source: str, policy: Policy = POLICY, timeout_s: float = 60):
    work = root / "trials" / name
    write_variant({"train.py": source.encode()}, work)
    outcome = run(Trainer(work, public), Limits(timeout_s, sandbox=policy, warm=True))
    return outcome, work


@needs_bwrap
@pytest.mark.parametrize(
    ("name", "breach", "fill"),
    [
        ("endless_loop", Breach.timeout, {"timeout_s": 5}),
        ("memory_bomb", Breach.memory, {}),
        ("fork_bomb", Breach.processes, {}),
        ("output_flood", Breach.output, {}),
        ("labels_engine", Breach.forbidden_path, {}),
        ("labels_raw", Breach.forbidden_path, {}),
    ],
)
def test_the_hostile_corpus_is_contained_on_the_warm_path(tmp_path: Path, public: Path, name, breach, fill):
    outcome, work = hostile_run(tmp_path, public, name, warm=True, **fill)
    assert_breach(outcome, breach)
    assert "unhidden" not in (work / "stdout.log").read_text() and not (work / "predictions.npz").exists()
    assert warmstart.reason() is None, warmstart.reason()


@needs_bwrap
def test_the_kb_the_raw_dataset_cover_and_the_network_stay_out_of_reach_warm(tmp_path: Path, public: Path):
    kb = tmp_path / "kb"
    kb.mkdir()
    (kb / "leaderboard.parquet").write_text("every variant's test score")
    outcome, work = hostile_run(tmp_path, public, "labels_kb", warm=True, target=kb)
    assert_breach(outcome, Breach.forbidden_path)
    assert "leaderboard" not in (work / "stdout.log").read_text()
    target = sklearn_data()  # digits needs scikit-learn, whose raw datasets sit in the bound Python environment
    assert target is not None, "scikit-learn's datasets are not inside a bound Python folder"
    outcome, work = hostile_run(tmp_path, public, "unhide", warm=True, target=target)
    assert_breach(outcome, Breach.forbidden_path)
    assert "unhidden" not in (work / "stdout.log").read_text()
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        server.settimeout(0.5)
        outcome, _ = hostile_run(tmp_path, public, "network", warm=True, port=server.getsockname()[1])
        assert_breach(outcome, Breach.network)
        with pytest.raises(socket.timeout):
            server.accept()


@needs_bwrap
@pytest.mark.parametrize("where", ["run dir", "project", "site-packages", "sibling"])
def test_writing_outside_the_work_dir_is_refused_warm(tmp_path: Path, public: Path, where: str):
    folder = {
        "run dir": tmp_path / "runs" / "r1",
        "project": PROJECT_ROOT,
        "site-packages": site_packages(),
        "sibling": tmp_path / "trials" / "another_trial",
    }[where]
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / f"planted-{tmp_path.name}.txt"
    outcome, _ = hostile_run(tmp_path, public, "write_outside", warm=True, target=target)
    assert_breach(outcome, Breach.forbidden_path)
    assert not target.exists()


@needs_bwrap
def test_nan_and_exit_codes_fail_without_a_breach_warm(tmp_path: Path, public: Path):
    outcome, _ = hostile_run(tmp_path, public, "nan", warm=True)
    assert outcome.status is Status.failed and outcome.breach is None and "non-finite val_loss" in outcome.reason
    outcome, _ = hostile_run(tmp_path, public, "exit_code", warm=True)
    assert outcome.status is Status.failed and outcome.breach is None
    assert "exited with code 1: giving up" in outcome.reason


PROBE = r"""
import ctypes, json, os, sys
import numpy as np
import torch
from ralph_ray import harness
status = dict(line.rstrip("\n").split(":\t", 1) for line in open("/proc/self/status") if ":\t" in line)
seen = {
    "pid": os.getpid(),
    "procs": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
    "siblings": sorted(os.listdir(os.path.dirname(os.getcwd()))),
    "tmp": os.listdir("/tmp"),
    "caps": status["CapEff"], "bounding": status["CapBnd"], "no_new_privs": status["NoNewPrivs"],
    "umount": ctypes.CDLL(None).umount2(b"/tmp", 2),
    "mark": getattr(torch, "_ralph_mark", None),
    "draw": float(np.random.random()),
    "argv": sys.argv, "path0": sys.path[0], "name": __name__,
    "threads": torch.get_num_threads(),
    "secret": os.environ.get("RALPH_TEST_SECRET_TOKEN"),
}
torch._ralph_mark = os.getcwd()  # what a fork that shared state would hand the next trainer
json.dump(seen, open("seen.json", "w"))
harness.report(epoch=1, val_acc=0.1)
"""


@needs_bwrap
def test_each_warm_trainer_is_alone_fresh_and_without_privileges(
    tmp_path: Path, public: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("RALPH_TEST_SECRET_TOKEN", "hunter2")
    seen = []
    for name in ("first", "second"):
        outcome, work = warm_run(tmp_path, public, name, PROBE)
        assert outcome.status is Status.finished, outcome.reason
        seen.append(json.loads((work / "seen.json").read_text()))
    for probe in seen:
        assert probe["pid"] == 1 and probe["procs"] == [1]  # its own PID namespace: no other trial in sight
        assert probe["caps"] == probe["bounding"] == "0000000000000000" and probe["no_new_privs"] == "1"
        assert probe["umount"] != 0 and probe["mark"] is None and probe["secret"] is None
        assert probe["argv"] == ["train.py"] and probe["name"] == "__main__" and probe["threads"] == 1
    assert seen[0]["siblings"] == ["first"] and seen[1]["siblings"] == ["second"]
    assert seen[0]["path0"] == str(tmp_path / "trials" / "first")
    assert seen[0]["draw"] != seen[1]["draw"]  # numpy's global stream is reseeded per trainer


@needs_bwrap
def test_a_warm_start_is_faster_than_a_cold_one(tmp_path: Path, public: Path):
    source = "import time\nT0 = time.time()\nimport torch\nfrom ralph_ray import harness\n"
    source += "harness.report(epoch=1, val_acc=0.1, t0=T0, t1=time.time())\n"
    ready: dict[str, list[float]] = {"cold": [], "warm": []}
    warm_run(tmp_path, public, "server", source)  # starts the server (the first warm trial pays for it)
    for index in range(2):
        for kind in ("cold", "warm"):
            work = tmp_path / "trials" / f"{kind}{index}"
            write_variant({"train.py": source.encode()}, work)
            start = time.time()
            outcome = run(Trainer(work, public), Limits(120, sandbox=POLICY, warm=kind == "warm"))
            assert outcome.status is Status.finished, outcome.reason
            ready[kind].append(outcome.last["t1"] - start)
    assert min(ready["warm"]) < min(ready["cold"]), ready


def test_without_the_sandbox_a_warm_trainer_still_gets_its_own_folder_group_and_exit_code(tmp_path: Path, public: Path):
    source = "import os, sys\nfrom ralph_ray import harness\n"
    source += "open('ids.txt', 'w').write(f'{os.getpid()} {os.getpgid(0)} {os.getcwd()}')\n"
    source += "harness.report(epoch=1, val_acc=0.1)\nsys.exit(3)\n"
    outcome, work = warm_run(tmp_path, public, "plain", source, policy=PLAIN)
    assert outcome.status is Status.failed and "exited with code 3" in (outcome.reason or ""), outcome.reason
    pid, group, cwd = (work / "ids.txt").read_text().split()
    assert pid == group and cwd == str(work)


@pytest.mark.parametrize("policy", [PLAIN, pytest.param(POLICY, marks=needs_bwrap)], ids=["none", "bwrap"])
def test_a_warm_trainer_runs_at_the_niceness_of_the_thread_that_asked(tmp_path: Path, public: Path, policy: Policy):
    """The breeder's smoke runs run nicer than the trials, also when forked by a server started at another niceness:
    the trainer, and its session's scheduler autogroup (where Linux weighs sessions), take the asking thread's."""
    source = "import os\nfrom ralph_ray import harness\n"
    source += "group = open('/proc/self/autogroup').read() if os.path.exists('/proc/self/autogroup') else ''\n"
    source += "open('nice.txt', 'w').write(f'{os.nice(0)}|{group}')\nharness.report(epoch=1, val_acc=0.1)\n"
    warm_run(tmp_path, public, "server", source, policy=policy)  # the server starts at this thread's niceness
    base = os.nice(0)
    seen: dict[str, tuple[int, str]] = {}

    def nicer() -> None:  # a thread of its own: Linux keeps niceness per thread, as the breeder does
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), min(19, base + 5))
        outcome, work = warm_run(tmp_path, public, "nicer", source, policy=policy)
        assert outcome.status is Status.finished, outcome.reason
        nice, group = (work / "nice.txt").read_text().split("|")
        seen["nicer"] = (int(nice), group)

    thread = threading.Thread(target=nicer)
    thread.start()
    thread.join()
    assert os.nice(0) == base  # this thread kept its own
    nice, group = seen["nicer"]
    assert nice == min(19, base + 5)
    if group:  # a kernel with autogroups: "/autogroup-N nice K"
        assert group.split()[-1] == str(nice), group


def test_a_server_that_cannot_start_falls_back_to_cold_and_says_why_once(
    tmp_path: Path, public: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
):
    monkeypatch.setattr(warmstart, "READY_TIMEOUT_S", 5.0)  # only a time cut
    # Deliberate fault injection: nothing a user controls makes a healthy server die before it is ready, so the
    # handshake's variable is misspelt on the driver's side (the server reads the real name) and it dies at once
    monkeypatch.setattr(warmstart.zygote, "ENV_FD", "RALPH_ZYGOTE_FD_MISSPELT")
    source = "from ralph_ray import harness\nharness.report(epoch=1, val_acc=0.1)\n"
    for name in ("a", "b"):
        outcome, _ = warm_run(tmp_path, public, name, source, policy=PLAIN)
        assert outcome.status is Status.finished, outcome.reason
    said = capsys.readouterr().err
    assert said.count("trials start cold: ") == 1 and "fork server did not start" in said
    warmstart.close_all()


@needs_bwrap
def test_a_driver_run_from_the_temp_dir_still_forks_warm_trainers_with_a_private_tmp(
    tmp_path: Path, public: Path, monkeypatch: pytest.MonkeyPatch
):
    """A script run from /tmp puts /tmp on sys.path. Bound read-only into the sandbox it showed the trainer every
    file there and covered its private /tmp, so the fork server's `import torch._dynamo` failed (dill's import
    asks tempfile for a writable folder) and every trial started cold."""
    import shutil
    import tempfile

    monkeypatch.syspath_prepend(tempfile.gettempdir())
    elsewhere = Path(tempfile.mkdtemp())  # in the host's temp root, outside every folder the jail binds
    neighbour = elsewhere / "someone_elses.txt"
    neighbour.write_text("private")
    source = (
        "import os, tempfile\n"
        "with tempfile.NamedTemporaryFile() as handle:\n"  # the private /tmp is writable
        "    handle.write(b'x')\n"
        f"assert not os.path.exists({str(neighbour)!r}), 'the host /tmp is visible'\n"
        "from ralph_ray import harness\n"
        "harness.report(epoch=1, val_acc=0.5)\n"
    )
    try:
        outcome, _ = warm_run(tmp_path, public, "from_tmp", source)
    finally:
        shutil.rmtree(elsewhere)
    assert warmstart.reason() is None, warmstart.reason()
    assert outcome.status is Status.finished, outcome.reason


@needs_bwrap
@pytest.mark.parametrize("warm", [False, True], ids=["cold", "warm"])
def test_a_driver_started_through_a_relative_path_still_starts_trainers_in_the_sandbox(
    tmp_path: Path, public: Path, monkeypatch: pytest.MonkeyPatch, warm: bool
):
    """`cd bench && ../.venv/bin/python ...` gives sys.executable `.../bench/../.venv/bin/python`: inside the jail
    `bench/` is not bound, so bwrap could not exec it and every smoke run failed (`bwrap: execvp ...: No such file
    or directory`): each child of that campaign was rejected by the gate."""
    import sys

    hidden = PROJECT_ROOT / "bench"  # a folder of the host the jail does not show
    climb = "../" * len(hidden.parts[1:])  # from there back to /, then down to this Python
    monkeypatch.setattr(sys, "executable", f"{hidden}/{climb}{sys.executable.lstrip('/')}")
    assert ".." in sys.executable and os.path.exists(sys.executable)  # a working path on the host
    warmstart.close_all()
    source = "from ralph_ray import harness\nharness.report(epoch=1, val_acc=0.5)\n"
    work = tmp_path / "trials" / f"relative_{warm}"
    write_variant({"train.py": source.encode()}, work)
    outcome = run(Trainer(work, public), Limits(60, sandbox=POLICY, warm=warm))
    assert outcome.status is Status.finished, outcome.reason
    assert warmstart.reason() is None, warmstart.reason()
    warmstart.close_all()


AGE = """import os
ticks = os.sysconf("SC_CLK_TCK")
born = int(open("/proc/self/stat").read().rsplit(")", 1)[1].split()[19]) / ticks
age = float(open("/proc/uptime").read().split()[0]) - born  # how long before its first line this process was forked
from ralph_ray import harness
harness.report(epoch=1, val_acc=0.1, age=age)
"""


@pytest.mark.parametrize("policy", [PLAIN, pytest.param(POLICY, marks=needs_bwrap)], ids=["none", "bwrap"])
def test_the_next_trainer_of_the_same_kind_was_forked_ahead_and_no_other(tmp_path: Path, public: Path, policy: Policy):
    """The server forks a spare after each request (on a GPU it starts CUDA meanwhile): the next request of the same
    kind runs in it; `trial.prestart=false`, a trainer that sets a CUDA variable itself, or another CUDA environment
    get a trainer forked on request. (That a spare-served trainer is as alone, fresh and unprivileged as any is
    `test_each_warm_trainer_is_alone_fresh_and_without_privileges`: its second trainer is one.)"""
    warmstart.close_all()
    wait_s = 3.0

    def age(name: str, source: str = AGE, prestart: bool = True, env: dict[str, str] | None = None) -> float:
        time.sleep(wait_s)  # the spare, if any, was forked at least this long ago
        work = tmp_path / "trials" / name
        write_variant({"train.py": source.encode()}, work)
        limits = Limits(60, sandbox=policy, warm=True, prestart=prestart)
        outcome = run(Trainer(work, public, env=env or {}), limits)
        assert outcome.status is Status.finished, outcome.reason
        return outcome.last["age"]

    age("server")  # starts the server; its spare is forked after this request
    assert age("ahead") > wait_s - 0.5
    assert age("asked_not_to", prestart=False) < wait_s - 1
    sets_its_own = 'import os\nos.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"\n' + AGE
    assert age("sets_cuda_env", sets_its_own) < wait_s - 1
    assert age("ahead_again") > wait_s - 0.5  # the spare waited through both
    as_keyword = 'import os\nos.environ.update(CUBLAS_WORKSPACE_CONFIG=":4096:8")\n' + AGE
    assert age("sets_cuda_env_by_keyword", as_keyword) < wait_s - 1
    assert age("other_gpus", env={"CUDA_VISIBLE_DEVICES": "7"}) < wait_s - 1
    assert warmstart.reason() is None, warmstart.reason()
    warmstart.close_all()


def test_a_trainer_sets_cuda_env_where_it_names_a_cuda_variable_not_a_knob_of_that_spelling(tmp_path: Path):
    """Review: the keyword form matched any `CUDNN_...=`, so a knob `CUDNN_BENCHMARK = True` cost every trial its
    trainer forked ahead."""
    cases = {
        'os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"\n': True,
        "os.environ.setdefault('CUDA_VISIBLE_DEVICES', '0')\n": True,
        'os.environ.update(CUBLAS_WORKSPACE_CONFIG=":4096:8")\n': True,
        'os.environ.update(\n    TORCH_HOME="/x",\n    CUDNN_LOGINFO_DBG="1",\n)\n': True,
        'os.environ.update(\n    # for determinism\n    CUBLAS_WORKSPACE_CONFIG=":4096:8",\n)\n': True,
        "CUDNN_BENCHMARK = True  # autotune convolutions\nTORCH_COMPILE = False\n": False,
        "SEED, TORCH_COMPILE = 0, False\n": False,
        "torch.backends.cudnn.benchmark = CUDNN_BENCHMARK\nif TORCH_COMPILE == True:\n    pass\n": False,
    }
    for number, (source, sets) in enumerate(cases.items()):
        work = tmp_path / str(number)
        (work / "pkg").mkdir(parents=True)
        (work / "train.py").write_text("import os\n")
        (work / "pkg" / "setup.py").write_text(source)  # in any .py of the trainer's folder
        assert warmstart.sets_cuda_env(work) is sets, source


SOCKETS = """import os
from ralph_ray import harness
links = []
for fd in os.listdir("/proc/self/fd"):
    try:
        links.append(os.readlink(f"/proc/self/fd/{fd}"))
    except FileNotFoundError:
        pass  # the listing's own descriptor, closed by now
harness.report(epoch=1, val_acc=0.1, sockets=sum(link.startswith("socket:") for link in links))
"""


@pytest.mark.parametrize("policy", [PLAIN, pytest.param(POLICY, marks=needs_bwrap)], ids=["none", "bwrap"])
def test_a_trainer_forked_beside_a_spare_holds_no_socket_of_the_server(tmp_path: Path, public: Path, policy: Policy):
    """Review: a trainer forked on request while the spare waited kept the spare's socket, so it could hand the spare
    a request of its own making (no mounts, no cgroups, its own entry); and a spare dropped then lived on."""
    warmstart.close_all()
    for name, prestart in (("server", True), ("beside_the_spare", False), ("from_the_spare", True)):
        work = tmp_path / "trials" / name
        write_variant({"train.py": SOCKETS.encode()}, work)
        outcome = run(Trainer(work, public), Limits(60, sandbox=policy, warm=True, prestart=prestart))
        assert outcome.status is Status.finished, outcome.reason
        assert outcome.last["sockets"] == 0, name
    warmstart.close_all()


def test_a_spare_that_died_waiting_leaves_the_next_trial_warm(tmp_path: Path, public: Path):
    """Review: a spare trainer that died before its request failed that request's start, which turned warm starts
    off for the worker; now its keeper goes too, and the server forks the request a trainer of its own."""
    import psutil

    warmstart.close_all()
    outcome, _ = warm_run(tmp_path, public, "server", AGE, policy=PLAIN)
    assert outcome.status is Status.finished, outcome.reason
    [server] = [s for s in warmstart._servers.values()]
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # the spare: a keeper, and its trainer waiting below it
        try:  # a trainer of the finished run may exit between listing and reading it (CI failed on that once)
            leaves = [p for p in psutil.Process(server.proc.pid).children(recursive=True) if not p.children()]
            if len(leaves) == 1 and leaves[0].parent().pid != server.proc.pid:
                break
        except psutil.NoSuchProcess:
            pass
        time.sleep(0.1)
    [spare] = leaves
    spare.kill()
    spare.wait(10)
    time.sleep(1.5)  # its keeper notices within 0.5 s
    outcome, _ = warm_run(tmp_path, public, "after", AGE, policy=PLAIN)
    assert outcome.status is Status.finished, outcome.reason
    assert outcome.last["age"] < 1.0  # forked for this request
    assert warmstart.reason() is None, warmstart.reason()
    warmstart.close_all()
