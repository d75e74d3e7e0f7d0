"""`ray up cluster-onprem.yaml` for real, against an sshd on loopback: a campaign through `ray exec`, `ray down`.

The "remote machine" is this one, reached over ssh as a dedicated user made by the test. That user is the
safety net the on-prem file asks for: `ray down` runs `ray stop` on the head, and a non-root user's
`ray stop` cannot touch anyone else's Ray (the test session's, other tests'). The file's own start commands
never run `ray stop`. What the test changes in the file, and why: the head's address (127.0.0.1), the user
and key, a proxy command (sshd listens on a free port, not 22), a free GCS port instead of 6379, the machine's
venv instead of a `pip install` (no network here), and no dashboard and a free dashboard-agent port (another
Ray on this machine may hold the default ones). Auth runs as the file says: the file's token mount (its source
a token made for the test instead of this machine's own), its setup commands for the token, RAY_AUTH_MODE=token
in the start commands and ~/.bashrc; the test checks the mounted token is private and that Ray refuses
a client without it.

Needs root (a user, an sshd) and `openssh-server`, `rsync` and `procps` (installed with apt-get if missing;
CI: `apt-get install -y openssh-server rsync procps`). Skips only when those cannot be had.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator

import pytest
import yaml
from procs import free_port, gcs_probe

from ralph_ray import PROJECT_ROOT
from ralph_ray.kb import open_reader

SSHD = Path("/usr/sbin/sshd")
TOKEN_MOUNT = "~/.ray/auth_token"
VENV_BIN = Path(sys.executable).parent
RELAY = """
import socket, sys, threading
sock = socket.create_connection((sys.argv[1], int(sys.argv[2])))
def up():
    while True:
        data = sys.stdin.buffer.raw.read(65536)
        if not data:
            break
        sock.sendall(data)
    sock.shutdown(socket.SHUT_WR)
threading.Thread(target=up, daemon=True).start()
while True:
    data = sock.recv(65536)
    if not data:
        break
    sys.stdout.buffer.write(data)
    sys.stdout.buffer.flush()
"""


def ensure_packages() -> None:
    """openssh-server, rsync (file mounts) and procps (pgrep in the start commands, ps), from apt if missing;
    skip (with the reason) only when they cannot be installed."""
    if os.geteuid() != 0:
        pytest.skip("needs root: the test makes a user and runs an sshd")
    wanted = (
        ("openssh-server", SSHD.exists()),
        ("rsync", shutil.which("rsync") is not None),
        ("procps", shutil.which("pgrep") is not None),
    )
    missing = [pkg for pkg, present in wanted if not present]
    if not missing:
        return
    if not shutil.which("apt-get"):
        pytest.skip(f"{' and '.join(missing)} missing and no apt-get to install them")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "-q", "--no-install-recommends", *missing]
    result = subprocess.run(install, env=env, capture_output=True, text=True, timeout=600)
    if result.returncode != 0:  # stale package lists: refresh once
        subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True, text=True, timeout=600)
        result = subprocess.run(install, env=env, capture_output=True, text=True, timeout=600)
    if result.returncode != 0:
        pytest.skip(
            f"cannot install {' '.join(missing)} with apt-get: {(result.stderr.strip().splitlines() or ['?'])[-1]}"
        )


def wait_for_port(port: int, proc: subprocess.Popen, what: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            assert proc.poll() is None, f"{what} exited with {proc.returncode}"
            assert time.monotonic() < deadline, f"{what} did not listen on {port}"
            time.sleep(0.2)


def sh(*args: str, **kwargs) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(args), capture_output=True, text=True, check=True, timeout=60, **kwargs)


def grant_traverse(path: Path) -> list[tuple[Path, int]]:
    """Let other users reach `path` (o+x on each parent folder lacking it, e.g. a 0700 /root holding pyenv's
    Python); returns the modes to put back. Nothing is made readable, only traversable, and only for the test."""
    changed = []
    for parent in reversed(path.resolve().parents):
        mode = stat.S_IMODE(parent.stat().st_mode)
        if not mode & stat.S_IXOTH:
            parent.chmod(mode | stat.S_IXOTH)
            changed.append((parent, mode))
    return changed


def user_pids(uid: int) -> list[int]:
    out = subprocess.run(["ps", "-u", str(uid), "-o", "pid="], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


@pytest.fixture()
def loopback_machine() -> Iterator[dict]:
    """A dedicated user reachable over ssh at 127.0.0.1 on a free port; all of it removed afterwards."""
    ensure_packages()
    root = Path(tempfile.mkdtemp(prefix="rp", dir="/tmp"))  # short: Ray's socket paths live under the user's RAY_TMPDIR
    root.chmod(0o755)
    user, home = f"ralphup{os.getpid()}", root / "home"
    sshd, granted, uid = None, [], None
    try:
        granted = grant_traverse(Path(sys.executable))  # the user runs this machine's venv (ray, torch, ralph_ray)
        sh("useradd", "-M", "-d", str(home), "-s", "/bin/bash", user)
        uid = int(sh("id", "-u", user).stdout)
        sh("usermod", "-p", "*", user)  # no password, but not locked: key logins work
        home.mkdir()
        (home / "t").mkdir()
        (home / ".bashrc").write_text(  # what the on-prem file's setup writes, pointing at this machine's venv
            f"# ralph_ray cluster env\nexport PATH={VENV_BIN}:$PATH\n"
            f"export RAY_AUTH_MODE=token RAY_USAGE_STATS_ENABLED=0 RAY_TMPDIR={home / 't'}\n"
        )
        sh("chown", "-R", f"{user}:{user}", str(home))
        sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(root / "id"))
        sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(root / "host"))
        shutil.copy(root / "id.pub", root / "authorized_keys")
        port = free_port()
        (root / "sshd_config").write_text(
            f"Port {port}\nListenAddress 127.0.0.1\nHostKey {root / 'host'}\nPidFile {root / 'sshd.pid'}\n"
            f"AuthorizedKeysFile {root / 'authorized_keys'}\nAllowUsers {user}\nPasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\nPermitRootLogin no\nPrintMotd no\n"
        )
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege-separation directory
        sshd = subprocess.Popen(
            [str(SSHD), "-D", "-e", "-f", str(root / "sshd_config")],
            stdout=(root / "sshd.log").open("w"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        wait_for_port(port, sshd, "sshd")
        (root / "relay.py").write_text(RELAY)
        token = secrets.token_hex(32)  # the cluster's token, on "this machine" (the one running `ray up`)
        (root / "auth_token").write_text(token)
        (root / "auth_token").chmod(0o600)
        yield {"root": root, "user": user, "uid": uid, "home": home, "port": port, "token": token}
    finally:
        if sshd is not None:
            sshd.kill()
            sshd.wait()
        if uid is not None:
            for pid in user_pids(uid):  # anything our user still runs (all of it ours)
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    continue  # gone meanwhile
            subprocess.run(["userdel", user], capture_output=True)
        shutil.rmtree(root, ignore_errors=True)
        for folder, mode in granted:
            folder.chmod(mode)


def onprem_yaml(machine: dict, gcs_port: int) -> Path:
    """cluster-onprem.yaml pointed at the loopback machine (see the module docstring for each change)."""
    config = yaml.safe_load((PROJECT_ROOT / "cluster-onprem.yaml").read_text())
    root = machine["root"]
    config["cluster_name"] = f"ralph-onprem-test-{os.getpid()}"
    config["provider"] = {"type": "local", "head_ip": "127.0.0.1", "worker_ips": []}
    config["auth"] = {
        "ssh_user": machine["user"],
        "ssh_private_key": str(root / "id"),
        "ssh_proxy_command": f"{sys.executable} {root / 'relay.py'} 127.0.0.1 {machine['port']}",
    }
    config["min_workers"] = config["max_workers"] = 0
    assert config["file_mounts"][TOKEN_MOUNT] == TOKEN_MOUNT
    config["file_mounts"] = {"~/ralph_ray": str(PROJECT_ROOT), TOKEN_MOUNT: str(root / "auth_token")}
    token_setup = [c for c in config["setup_commands"] if "auth_token" in c]
    assert token_setup, "the file's setup makes the mounted token private"
    config["setup_commands"] = [*token_setup, "python -c 'import ray, torch, sklearn'"]
    extra = (  # free ports for what `ray start --head` binds at fixed ones (another test's Ray may hold those)
        f" --num-cpus=2 --include-dashboard=false --dashboard-agent-listen-port={free_port()}"
        f" --ray-client-server-port={free_port()}"
    )
    config["head_start_ray_commands"] = [
        c.replace("6379", str(gcs_port)) + extra for c in config["head_start_ray_commands"]
    ]
    path = root / "cluster.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.mark.slow
def test_ray_up_on_prem_runs_a_campaign_and_ray_down_stops_only_its_cluster(loopback_machine: dict):
    machine, gcs_port = loopback_machine, free_port()
    config = onprem_yaml(machine, gcs_port)
    ray_cli = str(VENV_BIN / "ray")
    # The launcher's own files (cluster state, config cache) go to the test's folder too.
    env = {
        **os.environ,
        "RAY_AUTH_MODE": "token",
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_TMPDIR": str(machine["root"]),
        "TMPDIR": str(machine["root"]),
    }

    def ray(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [ray_cli, *args], cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=timeout
        )
        assert result.returncode == 0, f"ray {' '.join(args)} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
        return result

    ray("up", str(config), "--yes", "--no-config-cache")
    try:
        assert (machine["home"] / "ralph_ray" / "pyproject.toml").exists()  # the project, rsynced over ssh
        assert not (machine["home"] / "ralph_ray" / ".venv").exists()  # ... without what .gitignore lists
        mounted = machine["home"] / ".ray" / "auth_token"
        assert mounted.read_text() == machine["token"]
        assert stat.S_IMODE(mounted.stat().st_mode) == 0o600 and stat.S_IMODE(mounted.parent.stat().st_mode) == 0o700
        assert mounted.stat().st_uid == machine["uid"]
        # The head demands the token: a client without it, or with another, is refused; with it, it is answered.
        gcs = f"127.0.0.1:{gcs_port}"
        probes = [
            gcs_probe(gcs, RAY_AUTH_MODE="disabled"),
            gcs_probe(gcs, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN="0" * 64),
            gcs_probe(gcs, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=machine["token"]),
        ]
        without, wrong, right = (p.communicate(timeout=60)[0] for p in probes)
        assert without.startswith("refused") and "InvalidAuthToken" in without, without
        assert wrong.startswith("refused") and "InvalidAuthToken" in wrong, wrong
        assert right.startswith("answered: 1 nodes"), right
        campaign = (
            f"cd ~/ralph_ray && python -m ralph_ray cluster=address cluster.address=127.0.0.1:{gcs_port} run_id=onprem "
            "agent=none safeguards.max_cycles=1 safeguards.replicates=0 search.num_samples=2 search.max_concurrent=2 "
            "scheduler=fifo population.mode=generations "  # one barrier cycle: exactly its 2 trials
            "scheduler.max_t=1 scheduler.grace_period=1 '+search.space.EPOCHS={type: choice, values: [1]}'"
        )
        ray("exec", str(config), campaign)
        # `ray up` again restarts nothing: the head's start command sees this cluster's Ray running (no `ray stop`).
        ray("up", str(config), "--yes", "--no-config-cache", "--restart-only")
        assert len([pid for pid in user_pids(machine["uid"]) if "gcs_server" in _cmdline(pid)]) == 1
    finally:
        ray("down", str(config), "--yes")

    con = open_reader(machine["home"] / "ralph_ray" / "kb")
    trials = con.execute("select trial_id, status, selection_score from trials where run_id = 'onprem'").fetchall()
    assert len(trials) == 2 and all(status == "completed" and score is not None for _, status, score in trials)
    assert con.execute("select count(*) from runs where run_id = 'onprem' and status = 'finished'").fetchone() == (1,)
    work = machine["home"] / "ralph_ray" / "runs" / "onprem" / "cycle_0001" / "trials"
    assert all(path.stat().st_uid == machine["uid"] for path in work.iterdir())  # trials ran as the cluster's user
    token = machine["token"].encode()
    written = [
        p for folder in ("runs", "kb") for p in (machine["home"] / "ralph_ray" / folder).rglob("*") if p.is_file()
    ]
    assert written and not [p for p in written if token in p.read_bytes()], (
        "the token leaked into a file the campaign wrote"
    )

    # ray down stopped this cluster's Ray (the user's processes) and nothing else: this process's peers live on.
    deadline = time.monotonic() + 30
    while any("ray" in _cmdline(pid) for pid in user_pids(machine["uid"])) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not [pid for pid in user_pids(machine["uid"]) if "ray" in _cmdline(pid)]


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""
