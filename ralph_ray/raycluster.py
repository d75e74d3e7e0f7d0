"""Starting or joining Ray with the settings every process must agree on.

`cluster=local` (the default) starts Ray inside this process. `cluster=address` joins a running cluster
(`ray up cluster.yaml`, or `ray start` by hand); the campaign then runs on one of its nodes, usually the head,
and its trials anywhere: code and public data travel inside the trial spec through the object store,
predictions come back in the last result, checkpoints go through Tune's storage (`paths.storage`).

Auth: Ray's ports listen on every interface (a local Ray's too), and whoever joins a Ray can run code on every
node, so every process runs with RAY_AUTH_MODE=token (`cluster.auth_mode`, default token; it overrides the
environment's). Local mode uses Ray's generated token, ~/.ray/auth_token, created here (mode 600) if missing;
joining a cluster needs that cluster's token on this machine (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or
~/.ray/auth_token), checked before anything starts, and a cluster that answers without a token is refused (it is
open to anyone, and its workers could not call back to a token-mode driver). `cluster.auth_mode=disabled` is the
explicit opt-out.

Joining resolves the address first (`auto`: $RAY_ADDRESS or the last `ray start`'s address file, as Ray does) and
checks the port answers, so a dead head exits 2 at once instead of Ray retrying it for minutes; once joined, a
watch thread turns a lost head into a recorded crash before Ray's core worker ends the process unseen.
"""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from ralph_ray import localray, sigterm
from ralph_ray.config import ClusterConfig, ClusterMode, Config

# Usage stats would try the network. The old console reporter honours `verbose=0`; the new one prints its own
# tables over ours. Processes that only call set_ray_env() (benchmarks, test helpers) get token auth too.
RAY_ENV_DEFAULTS = {
    "RAY_AUTH_MODE": "token",
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_AIR_NEW_OUTPUT": "0",
    # Tune reuses a trial's actor for the next trial after waiting this long for the stopped trial's thread (its
    # trainer killed, its last report handled); Tune's 2 s is short on a loaded node, and a reuse that times out
    # fails the next trial before it starts ("Trainable runner reuse requires reset_config()"): measured with the
    # LLM agent at load 9-14, a slot then sat idle for the rest of a 600-s campaign. Read by the trial actors, which
    # inherit a local Ray's environment (a cluster's nodes need it in theirs: cluster.yaml's ray start commands).
    "TUNE_FUNCTION_THREAD_TIMEOUT_S": "30",
    # Ray starts its workers at niceness 15, so a trial (a worker's child) lost the CPU to the driver's background
    # breeder (agents, gate smoke runs) at niceness 0: on Fashion-MNIST on 2 cores an async child's epoch took 2x its
    # barrier-loop time (bench/breeding.py). Trials at 0 and the breeder at population.breeder_nice put it the right
    # way round. Read by the raylet a local Ray starts (and cluster.yaml's `ray start` commands).
    "RAY_worker_niceness": "0",
}
DEFAULT_PORT = 6379
DEFAULT_TOKEN_PATH = Path.home() / ".ray" / "auth_token"  # where Ray itself looks (and `ray get-auth-token` writes)
# Ray's own knob for how long a joining process retries the head (about one try per second).
_CONNECT_WINDOW_ENV = "RAY_gcs_server_port_wait_time_s"
# How long a driver waits for a lost GCS before Ray's core worker ends the process (std::_Exit(1), no Python code runs).
_GCS_RECONNECT_ENV, _GCS_RECONNECT_DEFAULT_S = "RAY_gcs_rpc_server_reconnect_timeout_s", 60.0
NO_CLUSTER = "Could not find any running Ray instance"  # Ray's words when `auto` finds nothing


class ClusterError(RuntimeError):
    """Ray cannot be started or joined as configured; the message names the fix (the CLI exits 2)."""


class RayStartError(RuntimeError):
    """A local Ray did not start (its node timed out on a loaded machine, a raylet died): said in one line; the run
    is recorded crashed (exit 4) and `resume` names the command that retries (`resume`, set by the campaign)."""

    resume: str | None = None


def start_failed(err: BaseException) -> RayStartError:
    """Ray's start-up failure (its traceback is 20 lines of Ray's internals) as one line in words."""
    try:
        load = f"; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
    except OSError:
        load = ""
    return RayStartError(
        f"Ray did not start on this machine ({_first_line(_chain_text(err))}{load}): a loaded machine slows its "
        "start past Ray's own limits; retry when fewer processes compete for the CPUs"
    )


def set_ray_env(auth_mode: str | None = None) -> None:
    """Set the auth mode and usage stats explicitly: `auth_mode` if given, else a user's own values, else ours."""
    before = os.environ.get("RAY_AUTH_MODE")
    for key, value in RAY_ENV_DEFAULTS.items():
        os.environ.setdefault(key, value)
    if auth_mode is not None:
        os.environ["RAY_AUTH_MODE"] = auth_mode
    raylet = sys.modules.get("ray._raylet")
    if raylet is not None and os.environ["RAY_AUTH_MODE"] != before:
        raylet.Config.initialize(
            ""
        )  # Ray read the mode when it was imported: refresh it, as Ray does when it turns tokens on


def ensure_ray(num_cpus: int | None = None, cluster: ClusterConfig | None = None) -> None:
    """Start a local Ray, or join the configured cluster, unless this process is already connected (tests share one)."""
    with sigterm.kept():  # ray.init's own SIGTERM handler would end the driver as crashed (sys.exit(15))
        _start_ray(num_cpus, cluster)


def _start_ray(num_cpus: int | None, cluster: ClusterConfig | None) -> None:
    """ensure_ray's work: a local Ray (a kept one reused, or a fresh one), or the configured cluster joined."""
    cluster = cluster or ClusterConfig()
    import ray

    if ray.is_initialized():
        return  # the mode this process's Ray runs with stays: switching it now would cut this driver off
    set_ray_env(cluster.auth_mode)
    if cluster.auth_mode == "disabled":
        print(
            "warning: Ray runs without authentication (cluster.auth_mode=disabled): anyone who reaches its ports can "
            "run code as you",
            file=sys.stderr,
        )
    if cluster.mode is ClusterMode.local:
        if cluster.auth_mode == "token":
            ensure_local_token()
            # A Ray this user keeps for ralph_ray (cluster.keep_ray) saves ray.init's seconds; it has token auth,
            # so one started without (auth_mode=disabled) never joins it, nor it them.
            if localray.reuse(_say):
                return
            if cluster.keep_ray:
                try:
                    kept = localray.start(num_cpus)
                except Exception as err:  # noqa: BLE001 - any failure of Ray's start is said in words (exit 4)
                    raise start_failed(err) from err
                _say(f"ray: started a local Ray that outlives this campaign (cluster.keep_ray) at {kept.address}")
                return
        # address="local": always a fresh instance; without it ray.init() joins any cluster `ray start` left on
        # this machine (its /tmp/ray/ray_current_cluster), which is cluster=address's job, never local's.
        try:
            ray.init(
                address="local",
                num_cpus=num_cpus,
                include_dashboard=False,
                log_to_driver=False,
                configure_logging=True,
                logging_level="ERROR",
            )
        except Exception as err:  # noqa: BLE001 - Ray raises a bare Exception when its node times out at start
            raise start_failed(err) from err
        return
    join(cluster)


def _say(line: str) -> None:
    print(line, file=sys.stderr)


def ensure_local_token() -> None:
    """A token for a local Ray: the user's own (env or ~/.ray/auth_token), else a new one from Ray's generator.

    Ray would write one itself, readable by everyone (mode 644); created here with O_EXCL it is this user's
    only (600), and two campaigns starting at once cannot each write a different one. A looser existing
    file is tightened.
    """
    if os.environ.get("RAY_AUTH_TOKEN") or os.environ.get("RAY_AUTH_TOKEN_PATH"):
        return
    from ray._private.authentication.authentication_token_generator import generate_new_authentication_token

    DEFAULT_TOKEN_PATH.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        fd = os.open(DEFAULT_TOKEN_PATH, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        private_token_file(DEFAULT_TOKEN_PATH)
        return
    with os.fdopen(fd, "w") as out:
        out.write(generate_new_authentication_token())


def private_token_file(path: Path) -> None:
    """Make a token file readable by its owner only (a token others can read lets them run code on the cluster)."""
    try:
        info = path.stat()
        if stat.S_IMODE(info.st_mode) & 0o077 and info.st_uid == os.getuid():
            path.chmod(0o600)
    except OSError:
        return  # gone or not ours: Ray reports a missing token itself


def join(cluster: ClusterConfig) -> None:
    """Connect this driver to a running cluster; any failure becomes a ClusterError naming the fix."""
    import ray

    address = cluster.address or os.environ.get("RAY_ADDRESS")
    if not address:
        raise ClusterError(
            "cluster=address needs an address: cluster.address=auto on a node of the cluster, "
            "cluster.address=<head>:6379, or export RAY_ADDRESS=<head>:6379"
        )
    client = os.environ.get("RAY_ADDRESS", "") if address == "auto" else address  # auto reads $RAY_ADDRESS first
    if client.startswith("ray://"):
        raise ClusterError(
            f"{client}: Ray Client (ray://) runs Tune's driver on the head, out of reach of the knowledge base "
            "writer; run the campaign on a cluster node (`ray attach cluster.yaml`) with cluster.address=auto"
        )
    mode = os.environ["RAY_AUTH_MODE"]
    if mode == "token" and not token_available():
        raise ClusterError(missing_token(os.environ.get("RAY_AUTH_TOKEN_PATH")))
    target, source = resolve(address)
    probe(target, cluster.connect_timeout_s, source)
    if mode == "token":
        refuse_open(target, cluster.connect_timeout_s)
    try:
        with _connect_window(cluster.connect_timeout_s):
            ray.init(address=target, log_to_driver=False, configure_logging=True, logging_level="ERROR")
    except (ConnectionError, RuntimeError, ValueError, TimeoutError) as err:
        raise ClusterError(explain(target, mode, err)) from None


def missing_token(path: str | None) -> str:
    """Why token mode cannot join from here: the RAY_AUTH_TOKEN_PATH given is missing or empty, or no token at all."""
    fix = (
        "copy the cluster's token here (the ~/.ray/auth_token of the machine that ran `ray up`, or "
        "`ray get-auth-token` on the head)"
    )
    if path:
        return (
            f"cluster.auth_mode=token but RAY_AUTH_TOKEN_PATH={path} does not exist or is empty: {fix} into that "
            "file (mode 600), or point RAY_AUTH_TOKEN_PATH at the file that holds it"
        )
    return (
        f"cluster.auth_mode=token but this machine has no Ray token: {fix} into ~/.ray/auth_token with mode 600, "
        "or point RAY_AUTH_TOKEN_PATH at it; for a cluster started without auth, opt out explicitly with "
        "cluster.auth_mode=disabled"
    )


def resolve(address: str) -> tuple[str, str]:
    """The head's host:port and where it came from (for the messages). `auto`: $RAY_ADDRESS, else the address file
    the last `ray start` on this machine wrote, else Ray's search of this machine's processes for a GCS (any user's).

    The file comes before the search: Ray's own `auto` takes the one GCS process it finds over the file, which
    on a shared machine is someone else's cluster while the file names this user's own (stale or not)."""
    from ray._private import services
    from ray._private.utils import get_ray_address_file, read_ray_address

    if address != "auto":
        split_address(address)  # a malformed address is named as the user wrote it
        return address, "cluster.address"
    if os.environ.get("RAY_ADDRESS"):
        return os.environ["RAY_ADDRESS"], "$RAY_ADDRESS (cluster.address=auto)"
    if recorded := read_ray_address(None):
        return recorded, f"{get_ray_address_file(None)}, the last `ray start` on this machine (cluster.address=auto)"
    try:
        target = services.get_ray_address_from_environment(address, None)
    except ConnectionError as err:
        raise ClusterError(explain(address, os.environ["RAY_AUTH_MODE"], err)) from None
    if target is None:
        raise ClusterError(explain(address, os.environ["RAY_AUTH_MODE"], ConnectionError(NO_CLUSTER)))
    return target, "a Ray process found on this machine (cluster.address=auto)"


def probe(address: str, timeout_s: float, source: str = "cluster.address") -> None:
    """Fail fast on an address nothing listens at (ray.init would retry it for minutes)."""
    host, port = split_address(address)
    try:
        with socket.create_connection((host, port), timeout=min(timeout_s, 5.0)):
            pass
    except OSError as err:
        found = "" if source == "cluster.address" else f", from {source}"
        raise ClusterError(
            f"cannot reach the Ray head at {host}:{port}{found} ({err.strerror or err}): check cluster.address, that "
            f"`ray start --head --port={port}` runs there and the port is open to this machine "
            "(on a `ray up` cluster, run the campaign on the head: `ray attach cluster.yaml`; a head started by "
            "hand: cluster.address=<head>:<port>)"
        ) from None


# Asks a GCS for its nodes with no token (a fresh process: this one's auth mode is set for the join). The same
# probe as tests/procs.GCS_PROBE (the tests ask as a stranger would): a change to one belongs in both.
_OPEN_PROBE = """
import sys
from ray._raylet import GcsClient
try:
    GcsClient(address=sys.argv[1]).get_all_node_info(timeout=float(sys.argv[2]))
except Exception as err:
    print("refused", type(err).__name__, err)
else:
    print("answered")
"""


def refuse_open(address: str, timeout_s: float) -> None:
    """Refuse a cluster that answers clients without a token: its workers cannot call back to a token-mode driver
    (every trial would fail), and the trial specs (code, data) would go to a cluster anyone can join."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH_TOKEN")}
    env["RAY_AUTH_MODE"] = "disabled"
    wait_s = max(timeout_s, 10.0) + 30  # Ray's import takes seconds on a loaded node
    try:
        done = subprocess.run(
            [sys.executable, "-c", _OPEN_PROBE, address, str(max(1.0, min(timeout_s, 10.0)))],
            env=env,
            capture_output=True,
            text=True,
            timeout=wait_s,
        )
    except subprocess.TimeoutExpired:
        done, why = None, f"no reply in {wait_s:g} s"
    else:
        last = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
        why = "" if done.stdout.startswith(("answered", "refused")) else f"the probe failed: {last}"
    if why:  # no answer either way: ray.init's own checks follow, but the user should know this one was skipped
        _say(
            f"warning: could not check that the Ray cluster at {address} refuses clients without a token ({why}); "
            "joining anyway"
        )
        return
    if done is not None and done.stdout.startswith("answered"):
        raise ClusterError(
            f"the Ray cluster at {address} accepts clients without a token (it was started without "
            "RAY_AUTH_MODE=token), so anyone who reaches its ports can run code on it, and its workers cannot "
            "report to this token-mode driver (every trial would fail): restart its head and workers with "
            "RAY_AUTH_MODE=token (README: a cluster you start yourself), or accept the open cluster knowingly "
            "with cluster.auth_mode=disabled"
        )


def split_address(address: str) -> tuple[str, int]:
    """host:port (the port defaults to Ray's 6379); raises ClusterError on a malformed address."""
    host, _, port = address.rpartition(":") if ":" in address else (address, "", str(DEFAULT_PORT))
    if not host or not port.isdigit():
        raise ClusterError(f"cluster.address={address!r} is not host:port (e.g. 10.0.0.5:6379) or auto")
    return host, int(port)


def explain(address: str, mode: str, err: BaseException) -> str:
    """A one-paragraph reason for a failed join, from Ray's exception chain (no traceback)."""
    text = _chain_text(err)
    if "InvalidAuthToken" in text or "AuthenticationError" in text or "Unauthenticated" in text:
        if mode != "token":
            return (
                f"the Ray cluster at {address} requires its token (it runs with RAY_AUTH_MODE=token) and this driver "
                "has cluster.auth_mode=disabled: drop cluster.auth_mode=disabled and give this machine the "
                "cluster's token (~/.ray/auth_token, or RAY_AUTH_TOKEN_PATH)"
            )
        return (
            f"the Ray cluster at {address} refused this driver's token ({token_source()}; RAY_AUTH_MODE=token here): "
            "this machine needs the cluster's own token (`ray get-auth-token` on the head) in that file, or "
            "RAY_AUTH_TOKEN_PATH pointing at the file that holds it"
        )
    if "version mismatch" in text.lower():
        return (
            f"the Ray cluster at {address} runs another Ray or Python version: "
            f"install the same versions here ({_first_line(text)})"
        )
    if NO_CLUSTER in text:
        return (
            "no running Ray cluster found on this machine (cluster.address=auto): start one (`ray up cluster.yaml`, "
            "`ray start --head`), run the campaign on a node of it, or give its address (cluster.address=<head>:6379)"
        )
    if "multiple" in text.lower() and "instances" in text.lower():
        return (
            "several Ray clusters run on this machine: "
            f"pick one with cluster.address=<head>:<port> ({_first_line(text)})"
        )
    return (
        f"cannot join the Ray cluster at {address}: {_first_line(text)}. Check that this machine is a node of that "
        "cluster "
        f"(run the campaign on the head: `ray attach cluster.yaml`) and that RAY_AUTH_MODE ({mode} here) matches the "
        "cluster's"
    )


def watch_head(cluster: ClusterConfig, on_lost: Callable[[str], None]) -> threading.Event:
    """On a joined cluster, call `on_lost(reason)` once when the head's GCS port has refused connections for
    Ray's reconnect window less 10 s; set the returned event to stop watching. Local Ray: nothing to watch.

    Why: when the head dies, Ray's core worker ends this driver with std::_Exit(1) after
    RAY_gcs_rpc_server_reconnect_timeout_s (60 s), which no Python handler sees: the run would stay `running`
    with no word. The watch acts first (that window less 10 s, at least 2 s), so the run can be recorded crashed.
    """
    stop = threading.Event()
    import ray

    if cluster.mode is not ClusterMode.address or not ray.is_initialized():
        return stop
    host, port = split_address(ray.get_runtime_context().gcs_address)
    # Ray's own window, not cluster.connect_timeout_s: a head back within it (a restart, GCS fault tolerance with a
    # raised window) keeps the driver, so the watch must not end what Ray would keep.
    ray_window = float(os.environ.get(_GCS_RECONNECT_ENV, _GCS_RECONNECT_DEFAULT_S))
    lost_after = max(2.0, ray_window - 10.0)

    def watch() -> None:
        down_since: float | None = None
        while not stop.wait(1.0):
            try:
                with socket.create_connection((host, port), timeout=2.0):
                    down_since = None
                    continue
            except OSError as err:
                down_since = down_since or time.monotonic()
                if time.monotonic() - down_since >= lost_after:
                    on_lost(
                        f"lost the Ray head: its GCS at {host}:{port} has not answered for "
                        f"{lost_after:g} s ({err.strerror or err})"
                    )
                    return

    threading.Thread(target=watch, name="ralph-head-watch", daemon=True).start()
    return stop


def driver_node_id() -> str:
    """This driver's Ray node (trials on it keep their work dirs in the run dir)."""
    import ray

    return ray.get_runtime_context().get_node_id()


def checkpoint_interval(cfg: Config) -> float | None:
    """How often trials checkpoint (seconds, 0: every epoch); None where no retry could use a checkpoint.

    A checkpoint serves a trial retried after its node was lost (safeguards.max_failures > 0), on a cluster
    (cluster=address; on one machine a lost node is the whole campaign) whose nodes all reach Tune's storage
    (paths.storage; without it the storage is the run dir on the driver's node and a retried trial starts over).
    Elsewhere trainers skip saving, so checkpoints cost a single machine nothing.
    """
    if cfg.safeguards.max_failures == 0 or cfg.cluster.mode is ClusterMode.local or cfg.paths.storage is None:
        return None
    return cfg.safeguards.checkpoint_every_s


def token_source() -> str:
    """Where this process's token comes from, in Ray's order, for messages (never the token itself)."""
    if os.environ.get("RAY_AUTH_TOKEN"):
        return "the RAY_AUTH_TOKEN variable"
    if os.environ.get("RAY_AUTH_TOKEN_PATH"):
        return f"the file RAY_AUTH_TOKEN_PATH={os.environ['RAY_AUTH_TOKEN_PATH']}"
    return f"the file {DEFAULT_TOKEN_PATH}"


def token_available() -> bool:
    """True where this process would present a token (Ray's order: RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH, the file)."""
    if os.environ.get("RAY_AUTH_TOKEN"):
        return True
    path = Path(os.environ.get("RAY_AUTH_TOKEN_PATH") or DEFAULT_TOKEN_PATH).expanduser()
    try:
        if not path.read_text().strip():
            return False
    except OSError:
        return False
    private_token_file(path)
    return True


@contextmanager
def _connect_window(seconds: float) -> Iterator[None]:
    """Bound how long ray.init retries a head that answers but refuses (auth) or stalls."""
    before = os.environ.get(_CONNECT_WINDOW_ENV)
    os.environ[_CONNECT_WINDOW_ENV] = str(max(1, int(seconds)))
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(_CONNECT_WINDOW_ENV, None)
        else:
            os.environ[_CONNECT_WINDOW_ENV] = before


def _chain_text(err: BaseException) -> str:
    parts, seen = [], set()
    cause: BaseException | None = err
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        parts.append(f"{type(cause).__name__}: {cause}")
        cause = cause.__cause__ or cause.__context__
    return "\n".join(parts)


def _first_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[0][:300] if lines else "unknown error"
