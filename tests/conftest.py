"""Shared fixtures: one Ray instance per test session, prepared digits data, tiny configs."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same loads() from the toml package Streamlit depends on
    import toml as tomllib  # type: ignore[no-redef]

import pytest

from ralph_ray import sandbox
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
            "safeguards.replicates=0",  # one trial decides (replicates: tests/test_noise.py)
            "search.max_concurrent=2",
            "scheduler.max_t=4",
            "scheduler.grace_period=1",
            "safeguards.trial_timeout_s=120",
            "+search.space.EPOCHS={type: choice, values: [4]}",
            # The barrier loop, step by step (the default `auto` runs async): the loop's tests read its cycle
            # folders and per-cycle records; tests/test_async.py and the CLI's default-run test run async.
            "population.mode=generations",
        ]
        if (
            sandbox.available() is not None
        ):  # no bubblewrap here: the loop's tests still run; tests/test_sandbox.py skips
            base.append("sandbox=none")
        return load_config(base + list(overrides))

    return make


@pytest.fixture()
def chdir_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Run a test from an empty working directory."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


APP_CONFIG = Path(__file__).resolve().parents[1] / "app" / ".streamlit" / "config.toml"


@pytest.fixture()
def streamlit_options() -> Iterator[Callable[..., None]]:
    """Pages run in-process (AppTest) read no config file: set the options `streamlit run` reads from
    app/.streamlit/config.toml (localhost only, ...); the fixture's value sets more (`"server.address", "0.0.0.0"`).
    Everything is put back afterwards."""
    from streamlit import config

    before: dict[str, Any] = {}

    def set_option(key: str, value: Any) -> None:
        before.setdefault(key, config.get_option(key))
        config.set_option(key, value)

    for section, values in tomllib.loads(APP_CONFIG.read_text()).items():
        for name, value in values.items():
            set_option(f"{section}.{name}", value)
    yield set_option
    for key, value in before.items():
        config.set_option(key, value)
