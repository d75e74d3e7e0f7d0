"""Whether a campaign recorded as running still runs: the one staleness rule of the app and `ralph-ray status`.

A driver killed with SIGKILL (or whose machine was lost) cannot record that it stopped, so its state stays
`running`. It is told apart by its silence: a running campaign writes a row (and an events line) at every phase
change and trial end, so one that has written nothing for longer than a trial (or a breeding phase, which writes
only when it ends) may take has no driver left.
Where the driver recorded itself (state.json's `driver`: host, boot, PID namespace, PID and start time) and the
reader shares its host, boot and PID namespace, its process table decides at once instead: a dead driver is
stale however recently it wrote (a full disk, an OOM kill), a live one is not however long it has been quiet.
"""

from __future__ import annotations

import json
import math
import os
import re
import shlex
import socket
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

BOOT_ID = Path("/proc/sys/kernel/random/boot_id")

STALE_ENV = "RALPH_APP_STALE_S"
DEFAULT_STALE_S = 300.0


def stale_s() -> float:
    """The least silence that makes a running campaign stale: env RALPH_APP_STALE_S, else 300 s."""
    return float(os.environ.get(STALE_ENV) or DEFAULT_STALE_S)


def stale_after_s(config: Mapping[str, Any]) -> float:
    """How long a running campaign of `config` (its stored config, as a dict) may be silent: `stale_s()`, or longer
    where one trial (or the final training of the pick, or a breeding phase: `breeding_s`) may run longer, since
    its row lands only when it ends."""
    trial, guards = config.get("trial") or {}, config.get("safeguards") or {}
    longest = max(
        float(guards.get("trial_timeout_s") or 0),
        float(trial.get("budget_s") or 0) + float(trial.get("grace_s") or 0),
        # the final training of the pick (safeguards.final_share) writes only when it ends
        float(guards.get("final_share") or 0) * float(guards.get("campaign_time_s") or 0)
        + float(trial.get("grace_s") or 0),
        breeding_s(config),
    )
    return max(stale_s(), longest + 60.0)


def agent_call_s(agent: Mapping[str, Any], backend: str | None) -> float:
    """The longest one agent call of `backend` may take (0: no LLM): an LLM answer (each HTTP request with its
    retries, for each malformed answer sent back), or a CLI call."""
    answers = int(agent.get("answer_retries") or 0) + 1  # llm.py only: a bad answer goes back with the error
    http = float(agent.get("timeout_s") or 0) * (int(agent.get("http_retries") or 0) + 1) * answers
    if backend == "hybrid":
        backend = str(agent.get("hybrid_llm") or "openai")
    return {"openai": http, "cli": float(agent.get("cli_timeout_s") or 0)}.get(str(backend), 0.0)


def breeding_s(config: Mapping[str, Any]) -> float:
    """The longest the analyse or write phase may run: neither saves state or writes a row before it ends (user
    review: a live write phase of CLI coder calls and gate smoke runs was reported stopped unexpectedly)."""
    agent, guards, pop = config.get("agent") or {}, config.get("safeguards") or {}, config.get("population") or {}
    backend = agent.get("backend")
    parents = int(pop.get("parents") or 2)  # null: resolved at load; 2 x 3 is the larger shape it picks
    children = parents * int(pop.get("children_per_parent") or 3)
    analyst = agent_call_s(agent, agent.get("analyst") or backend)
    analyse = parents * analyst  # the analyst diagnoses the parents one at a time
    # Each child: its coder call(s) and a gate smoke run, again for each gate failure sent back; `concurrency` at once.
    child = (int(agent.get("max_retries") or 0) + 1) * (
        agent_call_s(agent, backend) + float(guards.get("smoke_timeout_s") or 0)
    )
    return max(analyse, math.ceil(children / max(1, int(agent.get("concurrency") or 1))) * child)


def _read(path: Path) -> str | None:
    """A small /proc file's text, None where it cannot be read (not Linux, the process gone)."""
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _start_ticks(pid: int) -> str | None:
    """When process `pid` started, in clock ticks since boot (/proc/PID/stat field 22): a PID reused by a later
    process reads differently."""
    stat = _read(Path(f"/proc/{pid}/stat"))
    # The command name (field 2) may hold spaces and parentheses: count the fields after its last ')'.
    return stat.rsplit(")", 1)[1].split()[19] if stat else None


def _pid_namespace() -> str | None:
    """This process's PID namespace (PIDs are only comparable inside one: another container sees other ones)."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None


def this_driver() -> dict[str, Any]:
    """What identifies the running driver process: state.json's `driver` (written when a campaign starts or
    resumes)."""
    return {
        "host": socket.gethostname(),
        "boot": _read(BOOT_ID),
        "pid_ns": _pid_namespace(),
        "pid": os.getpid(),
        "started": _start_ticks(os.getpid()),
    }


def driver_alive(driver: Mapping[str, Any] | None) -> bool | None:
    """Whether the recorded driver still runs: None where this process cannot tell (no driver recorded, another
    host, boot or PID namespace, no /proc): then silence is the only sign."""
    if not driver or not driver.get("pid"):
        return None
    here = this_driver()
    if any(driver.get(key) != here[key] or here[key] is None for key in ("host", "boot", "pid_ns")):
        return None
    started = _start_ticks(int(driver["pid"]))
    return started is not None and started == driver.get("started")


def is_stale(
    status: str, quiet_s: float | None, config: Mapping[str, Any], driver: Mapping[str, Any] | None = None
) -> bool:
    """Recorded as running, but its driver is gone: its recorded process is dead (`driver_alive`), or, where that
    cannot be told, it has been silent for `quiet_s` seconds, past `stale_after_s`."""
    if status != "running":
        return False
    alive = driver_alive(driver)
    if alive is not None:
        return not alive
    return quiet_s is not None and quiet_s > stale_after_s(config)


def why_stale(quiet_s: float | None, config: Mapping[str, Any], driver: Mapping[str, Any] | None) -> str:
    """Why a run recorded as running is stale (`is_stale`): its driver's process is gone, or a guess from its
    silence."""
    if driver_alive(driver) is False:
        return (
            f"its record says running, but its driver (PID {driver['pid']} on {driver['host']}) is no longer "
            "running: it was killed, ran out of memory or of disk, or its machine restarted"
        )
    return (
        "its record says running, but its run dir (state.json, events.jsonl) has not changed for "
        f"{quiet_s or 0:,.0f}s, longer than any phase of it should take ({stale_after_s(config):,.0f}s: a trial, an "
        f"agent call with its retries and a smoke run; env {STALE_ENV}), so its driver was probably killed or its "
        "machine lost (check that no driver of it still runs before resuming)"
    )


def recorded_driver(run_dir: Path | str) -> dict[str, Any] | None:
    """The driver a run's state.json records (None: none recorded, or no state.json readable here)."""
    if not run_dir:
        return None
    try:
        return json.loads((Path(run_dir) / "state.json").read_text()).get("driver")
    except (OSError, ValueError, AttributeError):
        return None


def quiet_s(run_dir: Path, now: float | None = None) -> float | None:
    """Seconds since the run dir's state.json or events.jsonl last changed (None: neither is there)."""
    times = []
    for name in ("state.json", "events.jsonl"):
        try:
            times.append((run_dir / name).stat().st_mtime)
        except OSError:
            continue
    return (time.time() if now is None else now) - max(times) if times else None


def resume_command(run_id: str, *overrides: str) -> str:
    """The command that continues a campaign whose driver is gone (`overrides`: where it and its KB live)."""
    return " ".join(["python -m ralph_ray", f"resume={run_id}", *overrides])


# PathsConfig's defaults (not imported: the app reads this module without the engine's config)
DEFAULT_PATHS = {"runs": "runs", "kb": "kb"}


def _paths(runs: str | Path, kb: str | Path) -> list[tuple[str, str]]:
    """The keys and values that find a run and its KB from any folder: paths.runs and paths.kb, absolute, where they
    are not the defaults (./runs, ./kb), which a command run beside them finds alone."""
    return [
        (f"paths.{name}", str(Path(value).expanduser().resolve()))
        for name, value in (("runs", runs), ("kb", kb))
        if Path(value) != Path(DEFAULT_PATHS[name])
    ]


def locating(runs: str | Path, kb: str | Path) -> list[str]:
    """_paths as a command's words for the commands that read them unparsed (`stop`, `report`: commands._options),
    quoted for the shell only."""
    return [shlex.quote(f"{key}={value}") for key, value in _paths(runs, kb)]


# What Hydra reads unquoted as the same string: an absolute path of these (a comma is a sweep, `(`, `#`, `=`, `~`,
# a space or a non-ASCII letter a grammar error)
_HYDRA_PLAIN = re.compile(r"/[A-Za-z0-9_/.\-+@%:]*", re.ASCII)


def _for_hydra(value: str) -> str:
    """`value` as Hydra reads it back exactly: as it is where plain, else single-quoted, a quote and the backslashes
    before one (or at the end) escaped, as Hydra's quoted strings unescape them."""
    if _HYDRA_PLAIN.fullmatch(value):
        return value
    escaped = re.sub(r"(\\*)'", lambda m: m.group(1) * 2 + "\\'", value)
    escaped = re.sub(r"(\\+)$", lambda m: m.group(1) * 2, escaped)
    return f"'{escaped}'"


def _shell_word(word: str) -> str:
    """`word` for a shell: as it is where safe; in double quotes where that keeps it (`"paths.runs='/my runs'"` reads
    better than shlex's `'"'"'`); else shlex's quoting."""
    if shlex.quote(word) == word or re.search(r'["$`\\!]', word):
        return shlex.quote(word)
    return f'"{word}"'


def resume_for(run_id: str, runs: str | Path, kb: str | Path) -> str:
    """The one resume command every message prints (interrupts, stops, crashes, status): with the run's paths,
    quoted for Hydra (which reads them) inside the shell's quoting."""
    return resume_command(run_id, *(_shell_word(f"{key}={_for_hydra(value)}") for key, value in _paths(runs, kb)))


def stop_for(run_id: str, runs: str | Path, kb: str | Path) -> str:
    """The command that asks the run's driver to stop (`stop` reads paths.runs= and paths.kb= as --runs and --kb,
    unparsed: the paths are quoted for the shell only)."""
    return " ".join(["python -m ralph_ray stop", run_id, *locating(runs, kb)])
