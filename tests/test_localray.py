"""A kept local Ray (cluster.keep_ray): started by one driver, joined by the next, never when it does not check out.

Each driver is a real subprocess (the test session's own Ray stays untouched); the marker lives in tmp_path.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ralph_ray import localray

DRIVER = """
import json, sys, time
from ralph_ray.config import ClusterConfig
from ralph_ray.raycluster import ensure_ray
import ray
start = time.monotonic()
ensure_ray(1, ClusterConfig(keep_ray=sys.argv[1] == "keep"))
print(json.dumps({"node": ray.get_runtime_context().get_node_id(), "seconds": time.monotonic() - start,
                  "result": ray.get(ray.remote(lambda: 41 + 1).remote())}))
"""


def driver(marker: Path, keep: bool = False) -> tuple[dict, str]:
    env = {**os.environ, localray.ENV_MARKER: str(marker)}
    done = subprocess.run(
        [sys.executable, "-c", DRIVER, "keep" if keep else "plain"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


def _hold(port: int) -> socket.socket | None:
    """A loopback socket bound to `port` (None where something holds it already: then that does)."""
    sock = socket.socket()
    try:
        sock.bind(("127.0.0.1", port))
    except OSError:
        sock.close()
        return None
    sock.listen()
    return sock


@pytest.mark.slow
def test_a_kept_ray_is_joined_by_the_next_campaign_and_only_while_it_checks_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    marker = tmp_path / "local_ray.json"
    monkeypatch.setenv(localray.ENV_MARKER, str(marker))
    kept = None
    # The ports `ray start --head` binds by default besides the GCS's, held as another Ray on the machine would: the
    # kept head used to die at once on them (in a CI run, another test worker's Ray held the Ray Client's 10001).
    held = [_hold(port) for port in (10001, 52365)]
    try:
        first, said = driver(marker, keep=True)
        assert "started a local Ray that outlives this campaign" in said and first["result"] == 42
        kept = localray.read_marker()
        assert kept is not None and kept.node_id == first["node"] and oct(marker.stat().st_mode & 0o777) == "0o600"

        second, said = driver(marker)  # the next campaign, no flag: joins the kept Ray
        assert "reusing the kept local Ray" in said and second["node"] == kept.node_id and second["result"] == 42

        marker.chmod(0o644)  # a marker others could have written is never trusted
        third, _ = driver(marker)
        assert third["node"] != kept.node_id
        marker.chmod(0o600)

        # Another Ray on the recorded port (here: the kept one under another head id) is left at once.
        marker.write_text(json.dumps({**json.loads(marker.read_text()), "node_id": "f" * 56}))
        fourth, said = driver(marker)
        assert "is not the one recorded" in said and fourth["node"] != kept.node_id and not marker.exists()
    finally:
        for sock in held:
            if sock is not None:
                sock.close()
        if kept is not None:  # stop the kept Ray through its (restored) marker
            marker.write_text(json.dumps(localray.asdict(kept)))
            marker.chmod(0o600)
            assert localray.stop()
    assert localray.read_marker() is None
    host, _, port = kept.address.rpartition(":")
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:  # the kept Ray is gone: nothing answers at its address
        try:
            socket.create_connection((host, int(port)), timeout=1).close()
        except OSError:
            break
        time.sleep(0.5)
    else:
        pytest.fail(f"the kept Ray still answers at {kept.address} after stop()")
