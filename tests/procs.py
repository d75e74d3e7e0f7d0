"""Process, port and browser helpers the tests share (not in conftest: tests/app/conftest.py shadows
`from conftest import`)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

# Debian's Chromium, driven by Playwright (never `playwright install`): quiet, offline, no GPU.
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def free_port() -> int:
    """A loopback port free at the time of asking."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def pid_alive(pid: int) -> bool:
    """True while a process exists (and is not a zombie)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().split(")")[-1].split()[0] == "Z")


GCS_PROBE = """
import sys
from ray._raylet import GcsClient
try:
    nodes = GcsClient(address=sys.argv[1]).get_all_node_info(timeout=10)
except Exception as err:
    print(f"refused: {type(err).__name__}: {err}")
else:
    print(f"answered: {len(nodes)} nodes")
"""


def gcs_probe(address: str, **env: str) -> subprocess.Popen[str]:
    """Ask a Ray GCS for its nodes from a fresh process, as a stranger would: RAY_AUTH_* only from `env`.

    Prints `answered: N nodes` or `refused: <error>`; `.communicate()` it. Loopback addresses only."""
    assert address.startswith("127.0.0.1:"), "tests never connect to a non-loopback address"
    base = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    return subprocess.Popen(
        [sys.executable, "-c", GCS_PROBE, address],
        env={**base, "RAY_USAGE_STATS_ENABLED": "0", **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
