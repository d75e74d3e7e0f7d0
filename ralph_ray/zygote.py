"""The fork server (zygote) that starts warm trials: runs inside the sandbox, imports torch once, forks each trial.

Standard library only and no engine import: `warmstart` runs this file's source with `python -c` inside a
bubblewrap jail that sees what every trial of one worker may see (the system, the Python environment, the harness
copy, the public data and the folder that holds the trials' work dirs), with the heavy modules imported
(`RALPH_ZYGOTE_PRELOAD`) and nothing of the trainer's own state.

Per request (a JSON message with the trial's stdout/stderr pipes, a status socket and its cgroup files as
passed descriptors) it forks a keeper, which makes fresh mount, PID, IPC, UTS and network namespaces and forks
the trainer. The trainer is PID 1 of its own PID namespace (it sees no other trial's processes, and when it ends
the kernel ends everything it started), joins its cgroups, mounts its own /proc and /tmp, hides the folder of
the work dirs but its own, binds its work dir (writable) and the data (read-only) back, sets its rlimits,
drops every capability for good (no_new_privs, empty bounding set), then runs `train.py` as `__main__`. The
keeper waits for it and sends its exit status; the trainer's first message (with the kernel's credentials)
tells the engine its PID.

One spare keeper and trainer are forked ahead, like the last request's: without isolation the spare trainer starts
CUDA and its libraries' handles (on a GPU node, 0.6-0.7 s a trial) while the trial before it trains, then waits;
isolated, it starts no thread before its privilege drop (capabilities are per thread). The next
request of the same kind (sandbox, network, the CUDA environment) is handed to it and it goes on as above; a
request of another kind, or one that says `prestart: false`, gets a fork made for it. The spare has run nothing
of any variant, so each trainer is still a fresh process.
"""

from __future__ import annotations

import atexit
import ctypes
import importlib
import json
import os
import resource
import select
import signal
import socket
import sys
import threading
import traceback

ENV_FD = "RALPH_ZYGOTE_FD"
ENV_PRELOAD = "RALPH_ZYGOTE_PRELOAD"  # comma-separated modules imported once, before any fork
STAGE = "/run/ralph_ray/stage"  # an empty folder the jail makes: the trainer's binds wait here while /tmp is replaced
MAX_MESSAGE = 1 << 20
MAX_FDS = 16

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWPID, CLONE_NEWNET = 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 1, 2, 4, 8, 32
MS_BIND, MS_REC, MS_PRIVATE = 4096, 16384, 1 << 18
MNT_DETACH = 2
PR_SET_PDEATHSIG, PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS, PR_CAP_AMBIENT = 1, 24, 38, 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
CAP_VERSION_3 = 0x20080522
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1
# bwrap covers these parts of /proc read-only; the trainer's own /proc gets the same cover.
PROC_COVERED = ("sys", "sysrq-trigger", "irq", "bus")

_libc = ctypes.CDLL(None, use_errno=True)


class SetupError(RuntimeError):
    """The trainer's isolation could not be made: the trial fails (or the engine falls back to a cold start)."""


def main() -> None:
    """Serve requests on the inherited socket until the engine closes it."""
    control = socket.socket(fileno=int(os.environ.pop(ENV_FD)))
    for name in filter(None, os.environ.pop(ENV_PRELOAD, "").split(",")):
        try:
            importlib.import_module(name)
        except ImportError:
            pass  # a trainer that needs it fails the same way as on a cold start
    control.sendall(b"ready")
    spare: tuple[dict, socket.socket] | None = None  # the kind of request it was made for, and its keeper's socket
    while True:
        readable, _, _ = select.select([control], [], [], 0.5)
        _reap()
        if not readable:
            continue
        try:
            data, fds, _, _ = socket.recv_fds(control, MAX_MESSAGE, MAX_FDS)
        except OSError:
            return
        if not data:
            return  # the engine went away: end, and every keeper and trainer with us (their parent-death signal)
        request = json.loads(data)
        kind, handed = _kind(request), False
        if spare is not None and spare[0] != kind:
            spare[1].close()  # closing a spare's socket unhanded ends it
            spare = None
        if spare is not None and request.get("prestart", True):
            try:
                socket.send_fds(spare[1], [data], fds)
                handed = True
            except OSError:
                pass  # the spare is gone (its trainer died): fork one for this request as without a spare
            spare[1].close()
            spare = None
        if not handed and os.fork() == 0:
            control.close()
            if spare is not None:
                spare[1].close()  # a trainer holding it could hand the spare a request of its own making
            _keeper(request, fds)  # never returns
        for fd in fds:
            os.close(fd)
        if spare is None and request.get("prestart", True):
            spare = kind, _fork_spare(kind, control)


def _reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


# The request's environment variables CUDA reads when it starts: a spare started CUDA under these values.
CUDA_ENV_PREFIXES = ("CUDA_", "PYTORCH_", "CUBLAS", "CUDNN", "NVIDIA_", "TORCH_", "RALPH_DEVICE")


def _kind(request: dict) -> dict:
    """What a spare must share with a request to serve it: the namespaces, and the environment CUDA started in."""
    cuda = {name: value for name, value in request["env"].items() if name.startswith(CUDA_ENV_PREFIXES)}
    return {"isolate": request["isolate"], "network": request["network"], "cuda": cuda}


def _fork_spare(kind: dict, control: socket.socket) -> socket.socket:
    """Fork a keeper and trainer ahead of their request; the socket the request is handed over on."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    if os.fork() == 0:
        control.close()
        ours.close()
        try:
            _spare_keeper(kind, theirs)
        finally:
            os._exit(0)
    theirs.close()
    return ours


def _spare_keeper(kind: dict, channel: socket.socket) -> None:
    """A keeper forked ahead: its trainer starts CUDA now; a request handed over goes to it, then as `_keeper`."""
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    _unshare(kind)
    inner, outer = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    pid = os.fork()
    if pid == 0:
        channel.close()
        outer.close()
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if not kind["isolate"]:
            # Sandboxed, CUDA waits for the request: the threads it starts would keep the capabilities that the
            # trainer gives up only for itself, after the request's mounts (see the check in `_trainer`).
            _start_cuda(kind["cuda"])
        data, fds, _, _ = socket.recv_fds(inner, MAX_MESSAGE, MAX_FDS)
        if not data:
            os._exit(0)  # not used: the zygote dropped this spare
        inner.close()
        stdout, stderr, status_fd, *groups = fds
        _trainer(json.loads(data), stdout, stderr, socket.socket(fileno=status_fd), groups)
    inner.close()
    while not select.select([channel], [], [], 0.5)[0]:
        if os.waitpid(pid, os.WNOHANG)[0]:
            return  # the trainer died waiting: the zygote's hand-over fails, and it forks this request a new one
    data, fds, _, _ = socket.recv_fds(channel, MAX_MESSAGE, MAX_FDS)
    if not data:
        return  # dropped: closing `outer` on exit ends the waiting trainer
    stdout, stderr, status_fd, *groups = fds
    status = socket.socket(fileno=status_fd)
    try:
        socket.send_fds(outer, [data], fds)
    except OSError as err:  # the spare trainer died before its request (the engine starts this trial cold)
        _report(status, err)
        os._exit(0)
    _wait_and_report(pid, status, [stdout, stderr, *groups])


def _start_cuda(cuda_env: dict[str, str]) -> None:
    """In a spare trainer: start CUDA, cuBLAS, cuDNN and autograd's device thread as the request's environment says.

    Nothing of a variant has run yet; its tensors are freed, the cache emptied and the peak count reset (cuBLAS
    keeps its small workspace). Where there is no GPU this does nothing.
    """
    torch = sys.modules.get("torch")
    if torch is None or cuda_env.get("RALPH_DEVICE", "cuda").split(":")[0] != "cuda":
        return
    for name in [name for name in os.environ if name.startswith(CUDA_ENV_PREFIXES)]:
        del os.environ[name]
    os.environ.update(cuda_env)
    try:
        if not torch.cuda.is_available():
            return
        weight = torch.zeros(8, 8, 3, 3, device="cuda", requires_grad=True)
        for dtype, layout in ((torch.float32, torch.contiguous_format), (torch.bfloat16, torch.channels_last)):
            square = torch.zeros(64, 64, device="cuda", dtype=dtype)
            square @ square  # noqa: B018 - the library's handle is what is wanted
            image = torch.zeros(2, 8, 16, 16, device="cuda", dtype=dtype).to(memory_format=layout)
            kernel = weight.to(dtype).to(memory_format=layout)
            torch.nn.functional.conv2d(image, kernel, padding=1).float().sum().backward()
        torch.cuda.synchronize()
        del weight, square, image, kernel
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    except Exception:  # noqa: BLE001, S110 - the trainer meets the same problem itself, as on any start
        pass


def _unshare(request: dict) -> None:
    """The trainer's namespaces, made in its keeper: the trainer forked next is PID 1 of its own."""
    if request["isolate"]:
        flags = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS
        if not request["network"]:
            flags |= CLONE_NEWNET
        _check(_libc.unshare(flags), "unshare")


def _keeper(request: dict, fds: list[int]) -> None:
    """In the forked keeper: make the trainer's namespaces, fork it, wait for it and send how it ended."""
    stdout, stderr, status_fd, *groups = fds
    status = socket.socket(fileno=status_fd)
    try:
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        _unshare(request)
        pid = os.fork()
    except BaseException as err:  # noqa: BLE001 - the engine must hear why
        _report(status, err)
        os._exit(0)
    if pid == 0:
        _trainer(request, stdout, stderr, status, groups)  # no handler above it: it ends as `python train.py` would
    _wait_and_report(pid, status, [stdout, stderr, *groups])


def _wait_and_report(pid: int, status: socket.socket, fds: list[int]) -> None:
    """In a keeper: wait for its trainer and send how it ended; then the keeper ends."""
    try:
        for fd in fds:
            os.close(fd)
        _, wait_status = os.waitpid(pid, 0)
        status.sendall(json.dumps({"exit": os.waitstatus_to_exitcode(wait_status)}).encode())
    except BaseException as err:  # noqa: BLE001
        _report(status, err)
    finally:
        os._exit(0)


def _report(status: socket.socket, err: BaseException) -> None:
    try:
        status.sendall(json.dumps({"error": f"{type(err).__name__}: {err}"}).encode())
    except OSError:
        pass  # the engine is gone


def _trainer(request: dict, stdout: int, stderr: int, status: socket.socket, groups: list[int]) -> None:
    """In the trainer (PID 1 of its namespace when isolated): join, isolate, confine, then run train.py."""
    try:
        for fd in groups:  # "0" is the writer itself, read in its own PID namespace
            os.write(fd, b"0")
            os.close(fd)
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        os.setsid()  # its own process group: the engine kills it with one killpg
        _renice(int(request.get("nice", 0)))
        if request["isolate"]:
            _isolate(request)
        for name, value in request["rlimits"].items():
            resource.setrlimit(getattr(resource, name), (value, value))
        if request["isolate"]:
            _drop_capabilities()
            # Capabilities and no_new_privs are per thread: a thread started before the drop would keep them.
            threads = os.listdir("/proc/self/task")
            if len(threads) != 1:
                raise SetupError(f"{len(threads)} threads at the privilege drop, where only the trainer's may run")
        devnull = os.open(os.devnull, os.O_RDONLY)
        for source, target in ((devnull, 0), (stdout, 1), (stderr, 2)):
            os.dup2(source, target)
            os.close(source)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        status.sendall(b"started")  # the kernel adds this process's credentials: the engine learns its PID
        status.close()
    except BaseException as err:  # noqa: BLE001 - reported through the status socket, then exit
        _report(status, err)
        os._exit(71)
    code = _run(request["entry"], request["cwd"], int(request["threads"]))
    # The interpreter's own teardown would touch every object the zygote imported, copying each shared page
    # (seconds with torch loaded): finish as multiprocessing's forked children do, after what a program can see.
    threading._shutdown()  # type: ignore[attr-defined]  # non-daemon threads first, as at a normal exit
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def _renice(nice: int) -> None:
    """Take the niceness of the engine thread that asked for this trainer (a gate smoke run from the breeder runs
    nicer than the trials), and give it to the new session's scheduler autogroup, where Linux weighs one session
    against another (as `sandbox.keep_niceness_in_session` does on the cold path). Best effort: never lower."""
    try:
        if nice > os.getpriority(os.PRIO_PROCESS, 0):
            os.setpriority(os.PRIO_PROCESS, 0, min(19, nice))
            # Linux keeps niceness per thread: a spare's CUDA threads (sandbox none) were started before this. (In
            # a PID namespace the IDs /proc shows here are not this namespace's: nothing to do there, alone.)
            for thread in os.listdir("/proc/self/task"):
                try:
                    os.setpriority(os.PRIO_PROCESS, int(thread), min(19, nice))
                except OSError:
                    pass
        current = os.getpriority(os.PRIO_PROCESS, 0)
        if current > 0:
            with open("/proc/self/autogroup", "w") as handle:
                handle.write(str(current))
    except OSError:
        pass


def _run(entry: str, cwd: str, threads: int) -> int:
    """Run train.py as `python train.py` would, in this already-warm interpreter; its exit code."""
    import runpy

    sys.argv = [entry]
    sys.path[0] = cwd  # `python train.py` puts the script's folder first; `python -c` put ''
    if "numpy" in sys.modules:  # a fresh process draws fresh entropy; a fork would share the zygote's stream
        sys.modules["numpy"].random.seed()
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(max(1, threads))
    try:
        runpy.run_path(entry, run_name="__main__")
    except SystemExit as done:
        if done.code is None or isinstance(done.code, int):
            return done.code or 0
        print(done.code, file=sys.stderr)
        return 1
    except BaseException:  # noqa: BLE001 - as the interpreter would: the traceback on stderr, exit 1
        traceback.print_exc()
        return 1
    return 0


def _isolate(request: dict) -> None:
    """The trainer's own view: its /proc and /tmp, the work dirs' folders hidden, its work dir and the data back."""
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    keep = [(path, writable) for path, writable in request["keep"]]
    _mount("tmpfs", STAGE, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0700,size=64k")
    for index, (path, _) in enumerate(keep):
        os.mkdir(f"{STAGE}/{index}")
        _mount(path, f"{STAGE}/{index}", None, MS_BIND | MS_REC)
    _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    for name in PROC_COVERED:
        path = f"/proc/{name}"
        if os.path.exists(path):
            _mount(path, path, None, MS_BIND | MS_REC)
            _remount_readonly(path)
    _mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777")
    hidden = [root for root in request["hide"] if os.path.isdir(root)]  # one under /tmp is gone already
    for root in hidden:
        _mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755")
    for index, (path, writable) in enumerate(keep):
        os.makedirs(path, exist_ok=True)
        _mount(f"{STAGE}/{index}", path, None, MS_BIND | MS_REC)
        if not writable:
            _remount_readonly(path)
    for root in hidden:  # a write beside the work dir fails loudly, as outside it on a cold start
        _mount(None, root, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, "mode=0755")
    _check(_libc.umount2(STAGE.encode(), MNT_DETACH), f"umount {STAGE}")
    if not request["network"]:
        _loopback_up()


def _remount_readonly(path: str) -> None:
    """Make a bind read-only, keeping the flags the kernel insists on (nosuid, nodev, noexec as they were)."""
    flags = os.statvfs(path).f_flag & (MS_NOSUID | MS_NODEV | MS_NOEXEC)
    _mount(None, path, None, MS_REMOUNT | MS_BIND | MS_RDONLY | flags)


def _loopback_up() -> None:
    """Bring up `lo` in the fresh network namespace (bubblewrap does the same): loopback only, no way out."""
    import fcntl
    import struct

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        request = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(probe, SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(probe, SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | IFF_UP))


def _drop_capabilities() -> None:
    """Give up every capability for good: nothing the trainer runs can undo the mounts or gain privileges."""
    _prctl(PR_SET_NO_NEW_PRIVS, 1)
    with open("/proc/sys/kernel/cap_last_cap") as handle:
        last = int(handle.read())
    for cap in range(last + 1):
        _prctl(PR_CAPBSET_DROP, cap)
    _prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL)
    header = (ctypes.c_uint32 * 2)(CAP_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)()  # effective, permitted, inheritable x 2: all empty
    _check(_libc.capset(header, data), "capset")


def _mount(source: str | None, target: str, fstype: str | None, flags: int, options: str | None = None) -> None:
    encode = lambda text: None if text is None else text.encode()  # noqa: E731
    result = _libc.mount(encode(source), encode(target), encode(fstype), ctypes.c_ulong(flags), encode(options))
    _check(result, f"mount {source} on {target}")


def _prctl(option: int, value: int) -> None:
    _check(_libc.prctl(option, ctypes.c_ulong(value), 0, 0, 0), f"prctl {option}")


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise SetupError(f"{what}: {os.strerror(errno)}")


if __name__ == "__main__":
    main()
