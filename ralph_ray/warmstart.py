"""Warm trial starts: a fork server per worker (see `zygote`) that has torch imported and forks each trainer.

A cold start pays for a new interpreter and `import torch` (about a second on a CPU node, 4-6 s on a GPU node)
before train.py's first line; a warm start forks a sandboxed interpreter that has done it already. One server
serves the trials of one worker process that share a sandbox policy, a thread count, the folder of their work
dirs and the public data; it lives in the sandbox with that view and gives each trainer its own (`zygote`).
Ray-free, like the runner that uses it. Where a server cannot start or fork, the runner starts trials cold and
`reason()` says why (once per process on stderr, once per campaign in the terminal).
"""

from __future__ import annotations

import ast
import functools
import json
import os
import re
import select
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from ralph_ray import zygote
from ralph_ray.knobs import parse
from ralph_ray.sandbox import Jail, Policy, SandboxMode, View, interpreter

# What every trainer imports and costs the most to import. torch._dynamo: torch.optim imports it on the first
# optimizer a trainer builds (2-3 s on 2 cores: most of a warm digits smoke run, 2.65 s of it); no thread started.
PRELOAD = ("numpy", "torch", "torch._dynamo")
READY_TIMEOUT_S = 120.0  # a GPU node's first `import torch` can take a while
START_TIMEOUT_S = 30.0
MAX_SERVERS = 1  # per process (each holds torch in memory): a new cycle's folder replaces the server
_UCRED = struct.Struct("iII")  # struct ucred: pid, uid, gid


# A variable CUDA reads when it starts, named in a string (`os.environ["PYTORCH_CUDA_ALLOC_CONF"] = ...`) or as a
# call's keyword (`os.environ.update(CUBLAS_WORKSPACE_CONFIG=":4096:8")`), read off the syntax tree: not a knob of the
# same spelling (`CUDNN_BENCHMARK = True`, `SEED, TORCH_COMPILE = 0, False`), and a comment between a call's keywords
# is no obstacle (both were, to the regular expression before).
_PREFIXES = tuple(prefix for prefix in zygote.CUDA_ENV_PREFIXES if prefix != "RALPH_DEVICE")
_CUDA_NAME = re.compile(rf"(?:{'|'.join(_PREFIXES)})\w*")


def sets_cuda_env(work: Path) -> bool:
    """Whether the trainer's code names a variable CUDA reads at its start (the server's spare started CUDA already)."""
    return any(_names_cuda_env(path.read_text(errors="replace")) for path in work.rglob("*.py") if path.is_file())


@functools.lru_cache(maxsize=256)  # every trial of a variant reads the same files: each is parsed once per process
def _names_cuda_env(source: str) -> bool:
    try:
        tree = parse(source)
    except SyntaxError:
        return True  # unreadable: fork it on request, as one that does (it will fail on its own anyway)
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and _CUDA_NAME.fullmatch(node.value):
            return True
        if isinstance(node, ast.Call) and any(k.arg and _CUDA_NAME.fullmatch(k.arg) for k in node.keywords):
            return True
    return False


class WarmStartError(RuntimeError):
    """A warm start could not be made; the message says why (the runner starts the trial cold instead)."""


@dataclass(frozen=True)
class Key:
    """What the trials one server forks share."""

    policy: Policy
    threads: int
    root: Path  # the folder of the work dirs: in the server's view, hidden from each trainer but for its own
    data_dir: Path
    preload: tuple[str, ...] = PRELOAD


class WarmProcess:
    """A forked trainer, as the runner drives a Popen: pid (its process group), poll, wait, stdout and stderr."""

    def __init__(self, pid: int, status: socket.socket, stdout: IO[bytes], stderr: IO[bytes]) -> None:
        self.pid, self.status, self.stdout, self.stderr = pid, status, stdout, stderr
        self.returncode: int | None = None

    def poll(self) -> int | None:
        """The exit code once the trainer has ended, else None."""
        if self.returncode is None and select.select([self.status], [], [], 0)[0]:
            self._read()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Block until the trainer has ended (its keeper reports it)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if select.select([self.status], [], [], left)[0]:
                self._read()
            elif deadline is not None:
                raise subprocess.TimeoutExpired(["train.py"], timeout or 0)
        return self.returncode

    def _read(self) -> None:
        message = self.status.recv(4096)
        if not message:  # the keeper is gone without a word (its server was killed): so is the trainer
            self.returncode = -signal.SIGKILL
        else:
            reply = json.loads(message)
            self.returncode = int(reply["exit"]) if "exit" in reply else 70
        self.status.close()


class Server:
    """One fork server: a sandboxed interpreter with the heavy imports done, forking trainers on request."""

    def __init__(self, key: Key) -> None:
        self.key = key
        self._lock = threading.Lock()
        self._control, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        jail = Jail(key.policy, View(writable=(key.root,), readable=(key.data_dir,)))
        threads = str(max(1, key.threads))
        env = {
            **_public_env(),
            "OMP_NUM_THREADS": threads,
            "MKL_NUM_THREADS": threads,
            "PYTHONUNBUFFERED": "1",
            zygote.ENV_FD: str(theirs.fileno()),
            zygote.ENV_PRELOAD: ",".join(key.preload),
        }
        self._log = tempfile.TemporaryFile()
        argv = jail.command([interpreter(), "-c", Path(zygote.__file__).read_text()], Path("/"), zygote=True)
        started: list[subprocess.Popen[bytes] | BaseException] = []
        # bwrap's --die-with-parent follows the thread that starts it: a keeper thread that lives as long as this
        # process starts the server (a Ray trial runs in a thread of its own, which ends with the trial).
        self._stop = threading.Event()
        keeper = threading.Thread(
            target=self._keep, args=(argv, jail.env(env), theirs, started), daemon=True, name="ralph-zygote"
        )
        try:
            keeper.start()
            while not started:
                time.sleep(0.001)
        finally:
            theirs.close()
            jail.close()  # the server itself runs outside the trials' cgroups; each trainer joins its own
        if isinstance(started[0], BaseException):
            raise WarmStartError(f"cannot start the fork server: {started[0]}")
        self.proc = started[0]
        self._expect_ready()

    def _keep(self, argv: list[str], env: dict[str, str], theirs: socket.socket, started: list) -> None:
        try:
            proc = subprocess.Popen(
                argv,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=self._log,
                stderr=self._log,
                pass_fds=[theirs.fileno()],
                start_new_session=True,
            )
        except OSError as err:
            started.append(err)
            return
        started.append(proc)
        self._stop.wait()
        proc.wait()

    def _expect_ready(self) -> None:
        ready = select.select([self._control], [], [], READY_TIMEOUT_S)[0]
        if not ready or self._control.recv(16) != b"ready":
            self.close()
            raise WarmStartError(f"the fork server did not start: {self._log_tail()}")

    def spawn(self, request: dict, groups: list[int]) -> WarmProcess:
        """Fork one trainer; returns once it runs train.py (its PID known), else raises WarmStartError."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        ours.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)  # the kernel tells us the trainer's PID
        (out_read, out_write), (err_read, err_write) = os.pipe(), os.pipe()
        stdout, stderr = os.fdopen(out_read, "rb"), os.fdopen(err_read, "rb")
        try:
            with self._lock:
                fds = [out_write, err_write, theirs.fileno(), *groups]
                socket.send_fds(self._control, [json.dumps(request).encode()], fds)
        except OSError as err:
            for handle in (ours, stdout, stderr):
                handle.close()
            raise WarmStartError(f"the fork server is gone ({err}): {self._log_tail()}") from None
        finally:
            theirs.close()
            os.close(out_write)
            os.close(err_write)
        if not select.select([ours], [], [], START_TIMEOUT_S)[0]:
            for handle in (ours, stdout, stderr):
                handle.close()
            raise WarmStartError(f"no trainer started within {START_TIMEOUT_S:g} s")
        message, ancillary, _, _ = ours.recvmsg(4096, socket.CMSG_SPACE(_UCRED.size))
        pid = next(
            (
                _UCRED.unpack(data[: _UCRED.size])[0]
                for level, kind, data in ancillary
                if kind == socket.SCM_CREDENTIALS
            ),
            None,
        )
        if message != b"started" or pid is None:
            for handle in (ours, stdout, stderr):
                handle.close()
            reply = json.loads(message) if message.startswith(b"{") else {}
            raise WarmStartError(f"the fork server could not start the trainer: {reply.get('error', message[:200])}")
        return WarmProcess(pid, ours, stdout, stderr)

    def alive(self) -> bool:
        """True while the server runs."""
        return self.proc.poll() is None

    def close(self) -> None:
        """End the server (closing its socket ends it; its trainers die with it)."""
        self._control.close()
        self._stop.set()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)

    def _log_tail(self) -> str:
        self._log.seek(0)
        lines = [line for line in self._log.read()[-4000:].decode(errors="replace").splitlines() if line.strip()]
        return lines[-1] if lines else f"exit code {self.proc.poll()}"


_servers: dict[Key, Server] = {}
_failed: dict[Key, str] = {}
_servers_lock = threading.Lock()
_said: list[str] = []


def server(key: Key) -> Server | None:
    """The running server for `key`, started on first use; None where warm starts do not work (see `reason`)."""
    with _servers_lock:
        if key in _failed:
            return None
        found = _servers.get(key)
        if found is not None and found.alive():
            return found
        if found is not None:
            del _servers[key]
        while len(_servers) >= MAX_SERVERS:
            _servers.pop(next(iter(_servers))).close()
        problem = unavailable(key.policy)
        if problem is None:
            try:
                _servers[key] = Server(key)
                return _servers[key]
            except WarmStartError as err:
                problem = str(err)
        disable(key, problem)
        return None


def disable(key: Key, why: str) -> None:
    """Start trials of `key` cold from now on; say why once per process."""
    _failed[key] = why
    if why not in _said:
        _said.append(why)
        print(f"ralph_ray: trials start cold: {why}", file=sys.stderr)


def unavailable(policy: Policy) -> str | None:
    """Why warm starts cannot work here at all (None where they can)."""
    if not hasattr(os, "fork") or not sys.platform.startswith("linux"):
        return f"fork servers need Linux (this is {sys.platform})"
    if policy.mode is SandboxMode.bwrap and os.getuid() != 0 and not Path("/proc/self/ns/user").exists():
        return "user namespaces are off on this machine"
    return None


def reason() -> str | None:
    """The first reason trials of this process started cold, if any."""
    return _said[0] if _said else None


def close_all() -> None:
    """End every server of this process (tests; a worker's servers otherwise end with it)."""
    with _servers_lock:
        while _servers:
            _servers.popitem()[1].close()
        _failed.clear()
        _said.clear()


def _public_env() -> dict[str, str]:
    from ralph_ray.secretenv import public_env

    return public_env()
