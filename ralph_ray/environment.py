"""The environment a campaign ran in: Python, the stack's package versions, the project's git commit, the hardware.

Recorded once per start (and again on resume) as `<run_dir>/env.json` and as the runs row's `environment` column,
so a score can always be traced to the versions and the machine that produced it. Cheap: no torch or CUDA import
(GPU names come from `nvidia-smi` where it exists), nothing here can fail a campaign.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import socket
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

from ralph_ray import PROJECT_ROOT

ENV_FILE = "env.json"
# The packages whose versions decide a result (and the trackers, which decide what a user sees of it).
STACK = (
    "ralph_ray",
    "ray",
    "torch",
    "optuna",
    "numpy",
    "scikit-learn",
    "pandas",
    "pyarrow",
    "duckdb",
    "hydra-core",
    "omegaconf",
    "libcst",
    "openai",
    "mlflow-skinny",
    "mlflow",
    "tensorboardX",
    "tensorboard",
)


def capture(project: Path = PROJECT_ROOT) -> dict[str, Any]:
    """What this process runs on: interpreter, packages, git state of the project, CPU, memory, GPUs, Ray nodes."""
    return {
        "python": sys.version.split()[0],
        "executable": sys.executable,
        "platform": platform.platform(),
        "hostname": socket.gethostname(),
        "packages": packages(),
        "git": git_state(project),
        "cpus": os.cpu_count(),
        "memory_gb": _memory_gb(),
        "gpus": gpus(),
        "ray_nodes": ray_nodes(),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
    }


def record(run_dir: Path) -> str:
    """Capture the environment, write `<run_dir>/env.json`, and return it as JSON text (the runs row's column)."""
    text = json.dumps(capture(), indent=2, sort_keys=True)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / ENV_FILE).write_text(text + "\n")
    return text


def summary(text: str | None) -> str:
    """One line for the report: interpreter, torch, Ray, host, GPUs and the project's commit (from the JSON record)."""
    if not text:
        return "not recorded"
    env = json.loads(text)
    pkgs, git = env.get("packages", {}), env.get("git") or {}
    gpus = ", ".join(f"{g['name']} ({g['memory_mib']} MiB)" for g in env.get("gpus", [])) or "no GPU"
    commit = (
        f"{git['commit'][:12]}{' (dirty)' if git.get('dirty') else ''}" if git.get("commit") else "not a git checkout"
    )
    return (
        f"Python {env.get('python')}, torch {pkgs.get('torch', '-')}, ray {pkgs.get('ray', '-')} on "
        f"{env.get('hostname')} ({env.get('cpus')} CPUs, {gpus}); ralph_ray at {commit} (env.json)"
    )


def packages(names: tuple[str, ...] = STACK) -> dict[str, str]:
    """Installed versions of the stack's packages (absent ones left out)."""
    found = {}
    for name in names:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return found


def git_state(project: Path) -> dict[str, Any] | None:
    """The project's commit and whether its tracked files differ from it; None outside a git checkout."""
    if shutil.which("git") is None or not (project / ".git").exists():
        return None
    commit = _run(["git", "-C", str(project), "rev-parse", "HEAD"])
    if commit is None:
        return None
    changed = _run(["git", "-C", str(project), "status", "--porcelain", "--untracked-files=no"])
    return {"commit": commit, "dirty": bool(changed), "changed_files": len(changed.splitlines()) if changed else 0}


def gpus() -> list[dict[str, Any]]:
    """Each visible NVIDIA GPU's name, memory and driver, as nvidia-smi reports them; empty without one."""
    if shutil.which("nvidia-smi") is None:
        return []
    out = _run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader,nounits"])
    rows = [line.split(", ") for line in (out or "").splitlines() if line.strip()]
    return [
        {"name": name, "memory_mib": int(float(mem)), "driver": driver}
        for name, mem, driver in rows
        if mem.replace(".", "").isdigit()
    ]


def ray_nodes() -> list[dict[str, Any]]:
    """The live nodes of the Ray this process is connected to (none before Ray starts)."""
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return []
    return [
        {
            "host": n.get("NodeManagerHostname"),
            "address": n.get("NodeManagerAddress"),
            "cpus": n.get("Resources", {}).get("CPU"),
            "gpus": n.get("Resources", {}).get("GPU", 0),
        }
        for n in ray.nodes()
        if n.get("Alive")
    ]


def _memory_gb() -> float | None:
    try:
        return round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError, AttributeError):  # not every platform names these
        return None


def _run(cmd: list[str]) -> str | None:
    """A command's stripped stdout, or None when it fails (the record then says unknown, the campaign goes on)."""
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip()
