"""A local Ray kept between campaigns: started once (`cluster.keep_ray=true`), reused by the next local campaigns.

`ray.init` costs seconds per campaign (4-6 s on 2 cores, ~13 s on a 16-core GPU node). A campaign with
`cluster.keep_ray=true` starts a head (`ray start --head --block`, token auth like every ralph_ray Ray) in a
session of its own that outlives the campaign, and records it in this user's marker file (mode 600): address,
head node id, the process group, Ray's version. A later local campaign joins it only when every check holds:
the marker is this user's and private, Ray's version matches, the port answers, the join passes Ray's token
check, and the head node the marker names is alive in it. Anything else (a stale marker, another cluster on
the recorded port, another user's Ray) means a fresh in-process Ray as before; a foreign cluster is never joined
on purpose, and one that happens to answer on the port is left at once. `stop()` ends the kept Ray.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ENV_MARKER = "RALPH_LOCAL_RAY_MARKER"  # tests and several users of one home point it elsewhere
DEFAULT_MARKER = Path.home() / ".cache" / "ralph_ray" / "local_ray.json"
START_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Marker:
    """A kept local Ray, as the campaign that started it recorded it."""

    address: str  # 127.0.0.1:<gcs port>
    node_id: str  # its head node: a cluster without this node alive is someone else's
    pgid: int  # `ray start --block` and the processes it started
    ray_version: str
    num_cpus: int | None
    log: str


def marker_path() -> Path:
    """Where this user's marker lives."""
    return Path(os.environ.get(ENV_MARKER) or DEFAULT_MARKER)


def read_marker() -> Marker | None:
    """The marker if it is this user's, private, and well formed; else None."""
    path = marker_path()
    try:
        info = path.stat()
        if info.st_uid != os.getuid() or stat.S_IMODE(info.st_mode) & 0o077:
            return None  # not written by ralph_ray for this user: never trusted
        return Marker(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return None


def reuse(say=None) -> bool:
    """Join this user's kept Ray when every check holds; True if joined (else this process is left unconnected)."""
    import ray

    marker = read_marker()
    if marker is None:
        return False
    problem = _precheck(marker, ray.__version__)
    if problem is None:
        try:
            ray.init(address=marker.address, log_to_driver=False, configure_logging=True, logging_level="ERROR")
        except (ConnectionError, RuntimeError, ValueError, TimeoutError) as err:
            problem = f"it refused this driver ({str(err).splitlines()[0][:200]})"
    if problem is None and not any(n["NodeID"] == marker.node_id and n["Alive"] for n in ray.nodes()):
        ray.shutdown()
        problem = f"the Ray at {marker.address} is not the one recorded (its head node is not there)"
    if problem is not None:
        if say is not None:
            say(f"ray: not reusing the kept local Ray: {problem}; starting a fresh one")
        marker_path().unlink(missing_ok=True)
        return False
    if say is not None:
        say(
            f"ray: reusing the kept local Ray at {marker.address} (cluster.keep_ray; stop it: "
            "python -m ralph_ray.localray stop)"
        )
    return True


def _precheck(marker: Marker, version: str) -> str | None:
    if marker.ray_version != version:
        return f"it runs Ray {marker.ray_version}, this environment {version}"
    host, _, port = marker.address.rpartition(":")
    if host not in ("127.0.0.1", "localhost"):
        return f"its address {marker.address} is not this machine's loopback"
    try:
        with socket.create_connection((host, int(port)), timeout=2):
            return None
    except OSError:
        return "nothing answers at its address (it was stopped)"


def start(num_cpus: int | None) -> Marker:
    """Start a head that outlives this process and record it; ClusterError-free: raises RuntimeError with the log."""
    import ray

    path = marker_path()
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    port = _free_port()
    log = path.with_suffix(".log")
    argv = [
        str(Path(sys.executable).with_name("ray")),
        "start",
        "--head",
        "--block",
        f"--port={port}",
        "--node-ip-address=127.0.0.1",
        "--include-dashboard=false",
        "--disable-usage-stats",
        # `ray start --head` binds fixed ports besides the GCS's (the Ray Client server's 10001, the dashboard
        # agent's 52365); one another Ray on this machine holds ends the kept head at once (`--block` stops the rest
        # when one of its processes exits): a CI run of two test workers met it. Free ones, as the GCS's.
        f"--ray-client-server-port={_free_port()}",
        f"--dashboard-agent-listen-port={_free_port()}",
    ]
    if num_cpus is not None:
        argv.append(f"--num-cpus={num_cpus}")
    with log.open("wb") as out:
        proc = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
        )
    address = f"127.0.0.1:{port}"
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"`ray start --head` exited with code {proc.returncode}; see {log}")
        try:
            ray.init(address=address, log_to_driver=False, configure_logging=True, logging_level="ERROR")
            break
        except (ConnectionError, RuntimeError):
            time.sleep(0.5)
    else:
        os.killpg(proc.pid, signal.SIGKILL)
        raise RuntimeError(f"the kept local Ray did not come up within {START_TIMEOUT_S:g} s; see {log}")
    head = ray.get_runtime_context().get_node_id()
    marker = Marker(address, head, proc.pid, ray.__version__, num_cpus, str(log))
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        json.dump(asdict(marker), handle)
    os.replace(tmp, path)
    return marker


def stop() -> bool:
    """End the kept local Ray (its process group) and remove the marker; False if there was none."""
    marker = read_marker()
    marker_path().unlink(missing_ok=True)
    if marker is None:
        return False
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(marker.pgid, sig)
        except ProcessLookupError:
            return True
        time.sleep(1.0)
    return True


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


if __name__ == "__main__":
    if sys.argv[1:] == ["stop"]:
        print("stopped the kept local Ray" if stop() else "no kept local Ray")
    else:
        sys.exit("usage: python -m ralph_ray.localray stop")
