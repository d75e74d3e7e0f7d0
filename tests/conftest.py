"""Shared fixtures: one Ray instance per test session, prepared digits data, tiny configs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ralph_ray.config import Config, load_config
from ralph_ray.raycluster import ensure_ray, set_ray_env

# Token auth, as a campaign runs by default (whatever the caller's shell exports): the shared Ray below and every
# subprocess the tests start inherit it.
set_ray_env("token")


@pytest.fixture(scope="session")
def ray_session():
    """One local Ray for the whole session (ray.init costs seconds)."""
    import ray

    ensure_ray(num_cpus=2)
    yield
    ray.shutdown()


@pytest.fixture()
def tiny_config(tmp_path: Path):
    """A factory for a fast digits config rooted in tmp_path."""

    def make(*overrides: str) -> Config:
        base = [
            f"paths.runs={tmp_path / 'runs'}",
            f"paths.kb={tmp_path / 'kb'}",
            "search.num_samples=4",
            "search.max_concurrent=2",
            "scheduler.max_t=4",
            "scheduler.grace_period=1",
            "safeguards.trial_timeout_s=120",
            "+search.space.EPOCHS={type: choice, values: [4]}",
        ]
        return load_config(base + list(overrides))

    return make


@pytest.fixture()
def chdir_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Run a test from an empty working directory."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


def pid_alive(pid: int) -> bool:
    """True while a process exists (and is not a zombie)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().split(")")[-1].split()[0] == "Z")
