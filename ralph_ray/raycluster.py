"""Starting or joining Ray with the settings every process must agree on."""

from __future__ import annotations

import os

# Ray 2.60 writes ~/.ray/auth_token on first init and then demands tokens from every later process
# unless all agree on the mode; a local campaign needs none. Usage stats would try the network.
# The old console reporter honours `verbose=0`; the new one prints its own tables over ours.
RAY_ENV_DEFAULTS = {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0", "RAY_AIR_NEW_OUTPUT": "0"}


def set_ray_env() -> None:
    """Set the auth mode and usage stats explicitly (a user's own values win)."""
    for key, value in RAY_ENV_DEFAULTS.items():
        os.environ.setdefault(key, value)


def ensure_ray(num_cpus: int | None = None) -> None:
    """Start a local Ray instance unless one is already up in this process (tests share one)."""
    set_ray_env()
    import ray

    if ray.is_initialized():
        return
    ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False, configure_logging=True, logging_level="ERROR")
