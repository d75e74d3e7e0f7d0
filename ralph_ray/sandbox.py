"""The one sandbox for every run of agent-written code: trials, the gate's smoke runs, CLI agents.

Built on bubblewrap (Debian's `bubblewrap`, `bwrap`) and the kernel's cgroups. A sandboxed process sees a
read-only system (/usr, /etc) and Python environment, its own writable folders (a trial: its work dir), a private
/tmp, what it may read (a trial: the public data) and, of the engine, only `ralph_ray/harness.py` (a copy on its
PYTHONPATH). The project tree, the engine package, runs/, kb/, home, data.root and the datasets that ship inside
the Python environment are not there; without `sandbox.network` it has no network (a fresh network namespace).
Its memory and process count are capped by a cgroup where one can be made (else by rlimits), its file size by
an rlimit. `sandbox=none` opts out of the isolation (the limits stay), and the run's config and report say so.
"""

from __future__ import annotations

import enum
import functools
import hashlib
import importlib.util
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ralph_ray import PROJECT_ROOT, harness

BWRAP = "bwrap"
# A jail's cgroup: ralph-<PID namespace>-<pid of the engine process that made it>-<count>. The namespace lets
# `reap_orphans` judge an owner's pid only where it means that process (two containers may share a cgroup).
_JAIL_GROUP = re.compile(r"ralph-(\d+)-(\d+)-\d+")
INSTALL_FIX = (
    "install bubblewrap (`apt-get install bubblewrap` on Debian/Ubuntu, `dnf install bubblewrap` on Fedora) "
    "and "
    "allow user namespaces (`sysctl -w user.max_user_namespaces=15000`, and on Ubuntu 24.04+ "
    "`sysctl -w kernel.apparmor_restrict_unprivileged_userns=0`), or opt out with sandbox=none"
)
LIB_INSIDE = Path("/run/ralph_ray/lib")  # the harness copy's folder inside the sandbox (its PYTHONPATH)
ZYGOTE_STAGE = "/run/ralph_ray/stage"  # an empty folder in a fork server's jail (zygote.STAGE)
SYSTEM_DIRS = ("/usr", "/etc", "/opt")  # read-only; /bin, /lib... follow as the host has them (symlinks or binds)
LINKED_DIRS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# Datasets that ship inside the Python environment: a trainer could rebuild the labels from them.
ENV_DATASETS = (("sklearn", "datasets/data"), ("sklearn", "datasets/descr"))  # the data, and its notes
MIB = 1024 * 1024


class SandboxMode(str, enum.Enum):
    """How agent-written code runs: inside bubblewrap, or (the explicit opt-out) as a plain subprocess."""

    bwrap = "bwrap"
    none = "none"


class Breach(str, enum.Enum):
    """Why the sandbox ended a run: the first word of the failure's reason in the terminal and the KB."""

    memory = "memory"
    processes = "processes"
    output = "output"
    timeout = "timeout"
    network = "network"
    forbidden_path = "forbidden path"


class SandboxError(RuntimeError):
    """The sandbox cannot start on this machine; the message names the fix."""


@dataclass(frozen=True)
class Policy:
    """What a sandboxed run may use: isolation mode and resource limits (the `sandbox` config group)."""

    mode: SandboxMode = SandboxMode.bwrap
    memory_mb: int = 8192  # per run; 2 trials at a time on a 24 GiB machine leave room for Ray and the agents
    processes: int = 512  # processes and threads together (a cgroup's pids.max counts threads)
    file_size_mb: int = 4096  # the largest file a run may write (checkpoints, predictions)
    network: bool = False  # trials: no network unless the task needs it
    hidden: tuple[str, ...] = ()  # paths unreachable even where a bound folder holds them (data.root, runs, kb)


@dataclass(frozen=True)
class View:
    """What one sandboxed process sees besides the system and the Python environment."""

    writable: tuple[Path, ...]  # bound read-write at their own paths (a trial's work dir)
    readable: tuple[Path, ...] = ()  # bound read-only at their own paths (the public data)
    harness: bool = True  # put the harness copy on PYTHONPATH (trainers); CLI agents do without
    network: bool = False
    extra_readable: tuple[Path, ...] = field(default_factory=tuple)  # e.g. a CLI agent's program folder
    home: Path | None = None  # HOME inside (a CLI agent with its config folders bound); None: the private /tmp


def check(policy: Policy) -> None:
    """Raise SandboxError with the fix where the policy's sandbox cannot start here (before Ray starts)."""
    if policy.mode is SandboxMode.bwrap:
        problem = _bwrap_problem()
        if problem:
            raise SandboxError(f"the sandbox for agent-written code cannot start: {problem}\n  fix: {INSTALL_FIX}")


def announce(policy: Policy, say: Callable[[str], None]) -> None:
    """Check the sandbox can start (SandboxError with the fix if not) and say how agent-written code will run."""
    check(policy)
    if policy.mode is SandboxMode.none:
        say(
            "sandbox: none (the explicit opt-out): agent-written code runs as a plain subprocess that can read runs/, "
            "kb/ and the engine; limits still apply"
        )
    else:
        say(
            f"sandbox: bwrap, network {'on' if policy.network else 'off'}, memory {policy.memory_mb} MiB, "
            f"{policy.processes} processes, files up to {policy.file_size_mb} MiB"
        )


def available() -> str | None:
    """None where bubblewrap works here, else why not."""
    return _bwrap_problem()


@functools.cache
def _bwrap_problem() -> str | None:
    path = shutil.which(BWRAP)
    if path is None:
        return "`bwrap` is not on PATH"
    probe = [
        path,
        "--ro-bind",
        "/",
        "/",
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--unshare-all",
        "--die-with-parent",
        "true",
    ]
    try:
        done = subprocess.run(probe, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"`bwrap` does not run: {err}"
    if done.returncode != 0:
        return f"`bwrap` cannot make namespaces here: {done.stderr.strip()[-300:] or done.returncode}"
    return None


# Present where NVIDIA's driver is loaded. There RLIMIT_AS can't stand in for a missing memory cgroup: CUDA reserves
# far more address space than any trial's memory limit, cuInit fails, and torch quietly trains on the CPU.
NVIDIA_CONTROL = Path("/dev/nvidiactl")


class Jail:
    """One sandboxed process: its bwrap command line, environment, cgroups (or rlimits), and what it breached.

    Use: `jail = Jail(policy, view)`, `Popen(jail.command(argv), env=jail.env(env), preexec_fn=jail.enter)`,
    then `jail.breach()` after it ended and always `jail.close()` (which kills whatever is left in its cgroups).
    """

    _count = 0
    _lock = threading.Lock()

    def __init__(self, policy: Policy, view: View, cuda: bool = True) -> None:
        """`cuda`: the run may start CUDA (trainers); a CLI agent never does, so it keeps RLIMIT_AS everywhere."""
        self.policy, self.view = policy, view
        reap_orphans()
        with Jail._lock:
            Jail._count += 1
            name = f"ralph-{_pid_namespace()}-{os.getpid()}-{Jail._count}"
        self.memory_cgroup = _make_cgroup(
            "memory",
            name,
            {"memory.limit_in_bytes": policy.memory_mb * MIB},
            {"memory.max": policy.memory_mb * MIB, "memory.swap.max": 0},
        )
        self.pids_cgroup = _make_cgroup("pids", name, {"pids.max": policy.processes}, {"pids.max": policy.processes})
        groups = [group for group in (self.memory_cgroup, self.pids_cgroup) if group is not None]
        self._fds = [os.open(group / "cgroup.procs", os.O_WRONLY) for group in groups]
        self.lib = _harness_lib() if view.harness else None
        # No memory cgroup on a CUDA node: the runner watches the process group's memory (Pss) instead of RLIMIT_AS.
        watch = cuda and self.memory_cgroup is None and NVIDIA_CONTROL.exists()
        self.rss_watch_mb = policy.memory_mb if watch else None
        self.rss_breached = False  # set by the runner when it killed the run at rss_watch_mb

    @property
    def limits_note(self) -> str:
        """How the limits are enforced here, for people reading a log."""
        memory = "cgroup" if self.memory_cgroup else "rlimit" if self.rss_watch_mb is None else "the runner's RSS watch"
        processes = "cgroup" if self.pids_cgroup else "rlimit (not enforced for root)"
        return f"memory {self.policy.memory_mb} MiB by {memory}, processes {self.policy.processes} by {processes}"

    def command(self, argv: list[str], cwd: Path, zygote: bool = False) -> list[str]:
        """`argv` wrapped in bwrap (or unchanged with sandbox=none).

        Every capability is dropped (bwrap run by root keeps them otherwise, and a trainer could unmount what hides
        the raw dataset or write the host's /proc/sys). The fork server of warm starts (`zygote`) keeps them inside
        its own namespaces to build each trainer's view, then its trainers drop them (`zygote.py`).
        """
        if self.policy.mode is SandboxMode.none:
            return argv
        args = [shutil.which(BWRAP) or BWRAP, "--die-with-parent", "--unshare-all"]
        if not zygote:
            args += ["--cap-drop", "ALL"]
        elif os.getuid() != 0:  # an unprivileged user's bwrap gives its own user namespace's capabilities on request
            args += ["--unshare-user", "--cap-add", "ALL"]
        if self.view.network or self.policy.network:
            args.append("--share-net")
        for folder in SYSTEM_DIRS:
            if Path(folder).is_dir():
                args += ["--ro-bind", folder, folder]
        for folder in LINKED_DIRS:
            if Path(folder).is_symlink():
                args += ["--symlink", os.readlink(folder), folder]
            elif Path(folder).is_dir():
                args += ["--ro-bind", folder, folder]
        bound = [Path(p) for p in SYSTEM_DIRS] + python_dirs() + [p.resolve() for p in self.view.extra_readable]
        # The private /tmp before the Python environment: a venv under /tmp (a CI checkout there) stays visible.
        args += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/dev/shm", "--tmpfs", "/tmp"]
        for folder in python_dirs():
            args += ["--ro-bind", str(folder), str(folder)]
        for device in sorted(Path("/dev").glob("nvidia*")):  # GPU trials keep their devices
            args += ["--dev-bind", str(device), str(device)]
        if any(Path("/dev").glob("nvidia*")) and Path("/sys").is_dir():
            args += ["--ro-bind", "/sys", "/sys"]  # CUDA reads the PCI topology
        # bwrap mounts in order, so a cover must come after the bind of every folder that holds it (or that bind
        # shows it again) and before the binds of the view's folders inside it (or it hides them too): the view's
        # binds and the covers go parents first (a path's depth), a cover before a bind of the same path.
        mounts: list[tuple[Path, int, list[str]]] = []
        for folder in (*self.view.readable, *self.view.extra_readable):
            if folder.exists():  # a missing data dir is the harness's to explain
                mounts.append((folder.resolve(), 1, ["--ro-bind", str(folder.resolve()), str(folder.resolve())]))
        for folder in self.view.writable:
            mounts.append((folder.resolve(), 1, ["--bind", str(folder.resolve()), str(folder.resolve())]))
        views = [path for path, _, _ in mounts]
        for hidden in self.hidden_paths():
            if hidden.exists() and any(hidden.is_relative_to(b) for b in (*bound, *views)):
                cover = ["--tmpfs", str(hidden)] if hidden.is_dir() else ["--ro-bind", "/dev/null", str(hidden)]
                mounts.append((hidden, 0, cover))
        for _, _, mount in sorted(mounts, key=lambda m: (len(m[0].parts), m[1])):
            args += mount
        if self.lib is not None:
            args += ["--ro-bind", str(self.lib), str(LIB_INSIDE)]
        if zygote:
            args += ["--dir", ZYGOTE_STAGE]
        # The root itself (a tmpfs holding the mount points) read-only: a write outside the binds fails loudly.
        return args + ["--remount-ro", "/", "--chdir", str(cwd.resolve()), "--"] + argv

    def env(self, env: dict[str, str]) -> dict[str, str]:
        """The environment inside: the harness copy first on PYTHONPATH, home and temp in the private /tmp."""
        env = dict(env)
        if self.policy.mode is SandboxMode.none:
            return env
        env.pop("PYTHONPATH", None)  # the engine's own paths (a Ray worker's) would point at nothing or the project
        if self.lib is not None:
            env["PYTHONPATH"] = str(LIB_INSIDE)
        env.update(HOME=str(self.view.home or "/tmp"), TMPDIR="/tmp", PYTHONNOUSERSITE="1")
        return env

    def hidden_paths(self) -> list[Path]:
        """What must stay unreachable even where a bound folder holds it."""
        return hidden_paths(self.policy)

    def enter(self) -> None:
        """In the child before exec: join the cgroups, else set rlimits; always cap file size and core dumps."""
        pid = str(os.getpid()).encode()
        for fd in self._fds:
            os.write(fd, pid)
        for name, value in self.rlimits().items():
            resource.setrlimit(getattr(resource, name), (value, value))

    def rlimits(self) -> dict[str, int]:
        """The rlimits a run gets (by `resource` name): memory and processes where no cgroup holds them, file size
        and core dumps always."""
        limits = {}
        if self.memory_cgroup is None and self.rss_watch_mb is None:
            limits["RLIMIT_AS"] = self.policy.memory_mb * MIB
        if self.pids_cgroup is None:
            limits["RLIMIT_NPROC"] = self.policy.processes
        return limits | {"RLIMIT_FSIZE": self.policy.file_size_mb * MIB, "RLIMIT_CORE": 0}

    def group_files(self) -> list[int]:
        """Open `cgroup.procs` descriptors of the run's cgroups (a warm trainer joins them by writing "0")."""
        return list(self._fds)

    def breach(self) -> Breach | None:
        """What the cgroups saw: the kernel's OOM killer at the memory limit, or a fork refused at the pids limit
        (or the runner's RSS watch at the memory limit, where no memory cgroup holds it)."""
        if self.rss_breached:
            return Breach.memory
        if self.memory_cgroup is not None:
            group = self.memory_cgroup
            counters = _counters(group / "memory.oom_control") | _counters(group / "memory.events")  # v1 | v2
            if counters.get("oom_kill", 0) > 0:
                return Breach.memory
        if self.pids_cgroup is not None and _counters(self.pids_cgroup / "pids.events").get("max", 0) > 0:
            return Breach.processes
        return None

    def close(self) -> None:
        """Kill every process still in the cgroups and remove them."""
        for fd in self._fds:
            os.close(fd)
        self._fds = []
        for group in (self.memory_cgroup, self.pids_cgroup):
            if group is not None:
                _empty(group)


def reap_orphans() -> int:
    """Empty and remove the cgroups of jails whose engine process died without closing them; how many.

    A Ray worker killed with SIGKILL (a lost data-parallel worker, the OOM killer) takes its trainer with it
    (PDEATHSIG), but not the trainer's own children: without bubblewrap's PID namespace (sandbox=none) they
    would outlive the trial. They are still in the jail's cgroups, named after the dead owner's pid, so the next
    jail made on the node (a restarted group's, the next trial's) kills them.
    """
    reaped = 0
    for controller in ("memory", "pids"):
        parent = _cgroup_parent(controller)
        if parent is None:
            continue
        for group in parent[0].glob("ralph-*-*-*"):
            owner = _JAIL_GROUP.fullmatch(group.name)
            if owner is not None and int(owner[1]) == _pid_namespace() and not _alive(int(owner[2])):
                _empty(group)
                reaped += 1
    return reaped


@functools.cache
def _pid_namespace() -> int:
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _empty(group: Path) -> None:
    """SIGKILL every process in a cgroup (for up to 5 s) and remove it."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        pids = _pids(group)
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.02)
    try:
        group.rmdir()
    except OSError:
        pass  # a process is still being reaped (or another engine process removed it); an empty group is harmless


def classify(returncode: int, stderr_tail: str, jail: Jail | None, work: Path) -> Breach | None:
    """The breach behind a failed run: the cgroups' counters first, then what the process said as it died."""
    if jail is not None and (breach := jail.breach()) is not None:
        return breach
    text = stderr_tail
    if returncode in (-signal.SIGXFSZ, 128 + signal.SIGXFSZ) or "File size limit exceeded" in text:
        return Breach.output
    if re.search(r"MemoryError|Unable to allocate|Cannot allocate memory|std::bad_alloc|out of memory", text):
        return Breach.memory
    if re.search(r"BlockingIOError: \[Errno 11\]|Resource temporarily unavailable|can't start new thread", text):
        return Breach.processes
    if re.search(
        r"ConnectionRefusedError|Network is unreachable|gaierror|Name or service not known|"
        r"Temporary failure in name resolution|\[Errno 101\]|\[Errno 99\]",
        text,
    ):
        return Breach.network
    if re.search(r"Read-only file system|PermissionError|No module named '?ralph_ray\.", text):
        return Breach.forbidden_path
    # open()'s words, and numpy's (np.loadtxt, np.load: "FileNotFoundError: /x/y.csv not found.")
    missing = re.findall(r"No such file or directory: '(/[^']*)'|FileNotFoundError: (/\S+) not found", text)
    for path in (Path(a or b) for a, b in missing):
        # Missing inside, there outside: a path the sandbox hides (the KB, the project, the raw dataset).
        if not path.is_relative_to(work.resolve()) and (path.exists() or path.parent.exists()):
            return Breach.forbidden_path
    return None


def interpreter() -> str:
    """This Python as a path the jail can reach: normalised, since `bench/../.venv/bin/python` (a driver started from
    a subfolder) passes through a folder the jail does not bind; symlinks kept (a venv's python is a link, and the
    folder it is called through is what makes it the venv's)."""
    return os.path.abspath(sys.executable)


def hidden_paths(policy: Policy) -> list[Path]:
    """What a run of `policy` must not reach even where a bound folder holds it: the project, the engine, home, the
    datasets that ship in the Python environment, and the policy's own (data.root, runs, kb, the task's raw data)."""
    paths = [PROJECT_ROOT, Path(__file__).resolve().parent, Path.home()] + [Path(p) for p in policy.hidden]
    for package, relative in ENV_DATASETS:
        spec = importlib.util.find_spec(package)
        if spec is not None and spec.origin:
            paths.append(Path(spec.origin).parent / relative)
    return [p.expanduser().resolve() for p in paths]


def bound_folders() -> list[Path]:
    """The folders every run sees read-only: the system's and the Python environment's."""
    return [Path(p) for p in SYSTEM_DIRS] + python_dirs()


@functools.cache
def site_paths() -> tuple[str, ...]:
    """sys.path as a trainer's interpreter builds it: this environment's site folders and what their .pth files add
    (a package installed from a source folder). Not this process's sys.path: `python -m` puts the launch folder
    first (and a Ray worker carries the driver's), PYTHONPATH adds more, and a trainer's interpreter sees none of them
    (the jail sets its PYTHONPATH), so binding them only showed it their files: a user's raw data beside the task
    folder, their whole home when started from there."""
    try:
        done = subprocess.run(
            [sys.executable, "-I", "-c", "import json, sys; print(json.dumps(sys.path))"],
            capture_output=True,
            text=True,
            timeout=120,
            cwd="/",
        )
        return tuple(json.loads(done.stdout)) if done.returncode == 0 else ()
    except (OSError, subprocess.TimeoutExpired, ValueError):  # nothing but the interpreter's prefixes then
        return ()


def python_dirs() -> list[Path]:
    """The Python environment to bind read-only: the interpreter's prefixes and the import paths its site adds outside
    them (`site_paths`)."""
    prefixes = {Path(p).resolve() for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix)}
    prefixes.add(Path(os.path.realpath(sys.executable)).parent.parent)
    hidden = {PROJECT_ROOT.resolve(), Path(__file__).resolve().parent}
    # Never a whole temp root: a script run from /tmp puts /tmp on sys.path, and binding it would show the trainer
    # every file there and cover its private /tmp read-only (the fork server's `import torch._dynamo` then failed:
    # dill's import asks tempfile for a writable folder).
    never = {Path("/"), Path("/tmp"), Path(tempfile.gettempdir()).resolve()}
    for entry in filter(os.path.isabs, site_paths()):  # not an editable install's path hook
        path = Path(entry).resolve()
        if path.is_dir() and not any(path == p or path.is_relative_to(p) for p in prefixes | hidden):
            if not any(h.is_relative_to(path) for h in hidden) and path not in never:
                prefixes.add(path)
    system = [Path(p) for p in SYSTEM_DIRS]
    folders = sorted(p for p in prefixes if not any(p == s or p.is_relative_to(s) for s in system))
    # Keep only the outermost: a bind inside another would be redundant.
    return [p for p in folders if not any(p != q and p.is_relative_to(q) for q in folders)]


@functools.cache
def _harness_lib() -> Path:
    """A folder holding only `ralph_ray/harness.py` (no package __init__): the engine a trainer can import."""
    source = Path(harness.__file__).resolve()
    digest = hashlib.sha256(source.read_bytes()).hexdigest()[:16]
    cache = Path(os.environ.get("RALPH_CACHE_DIR") or Path(tempfile.gettempdir()) / "ralph_ray_data")
    root = cache / f"harness-{digest}"
    target = root / "ralph_ray" / "harness.py"
    if not target.exists():
        tmp = root.with_name(f".{root.name}.{os.getpid()}.tmp")
        (tmp / "ralph_ray").mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, tmp / "ralph_ray" / "harness.py")
        try:
            os.replace(tmp, root)
        except OSError:  # another process made it first
            shutil.rmtree(tmp, ignore_errors=True)
    return root


def _cgroup_parent(controller: str) -> tuple[Path, bool] | None:
    """Where this process makes its jails' cgroups of `controller` (its own cgroup), and whether it is cgroup v1."""
    for line in _read("/proc/self/cgroup").splitlines():
        _, controllers, path = line.split(":", 2)
        if controller in controllers.split(","):
            return Path(f"/sys/fs/cgroup/{controller}") / path.lstrip("/"), True
    lines = _read("/proc/self/cgroup").splitlines()
    own = next((line.split(":", 2)[2] for line in lines if line.startswith("0::")), None)
    parent = Path("/sys/fs/cgroup") / (own or "/").lstrip("/")
    if own is None or controller not in _read(parent / "cgroup.subtree_control").split():
        return None
    return parent, False


def _make_cgroup(controller: str, name: str, v1: dict[str, int], v2: dict[str, int]) -> Path | None:
    """A child cgroup of this process's own, with its limits written; None where none can be made."""
    found = _cgroup_parent(controller)
    if found is None:
        return None
    group, limits = found[0] / name, (v1 if found[1] else v2)
    try:
        group.mkdir()
        for key, value in limits.items():
            if (group / key).exists():
                (group / key).write_text(str(value))
        return group
    except OSError:
        try:
            group.rmdir()
        except OSError:
            pass
        return None


def _read(path: str | Path) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def _counters(path: Path) -> dict[str, int]:
    counters = {}
    for line in _read(path).splitlines():
        key, _, value = line.partition(" ")
        if value.strip().isdigit():
            counters[key] = int(value)
    return counters


def _pids(group: Path) -> list[int]:
    return [int(p) for p in _read(group / "cgroup.procs").split() if p.isdigit()]


def keep_niceness_in_session() -> None:
    """In a child just made a session leader: give its scheduler autogroup the niceness it inherited.

    Linux puts each new session in its own autogroup, and niceness only weighs tasks inside one group: a gate smoke
    run (runner) or a CLI agent (agents/cli) started by the breeder at niceness 10 (population.breeder_nice) still
    took half a core from each trial beside it on Fashion-MNIST (ps: ~47% each at ni 10). The group's own nice is
    what counts across groups. A no-op at niceness 0 (every trial) and where the kernel has no autogroups."""
    nice = os.getpriority(os.PRIO_PROCESS, 0)
    if nice > 0:
        try:
            with open("/proc/self/autogroup", "w") as handle:
                handle.write(str(nice))
        except OSError:
            pass
