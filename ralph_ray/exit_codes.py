"""Process exit codes of a campaign (the README lists them)."""

from __future__ import annotations

import enum


class ExitCode(enum.IntEnum):
    """0 target met or clean stop, 2 safeguard or invalid config/data, 3 plateau, 4 unrecoverable error, 130 Ctrl-C,
    143 SIGTERM (handled as Ctrl-C)."""

    ok = 0
    safeguard_or_config = 2
    plateau = 3
    error = 4
    interrupted = 130  # 128 + SIGINT, as a shell reports a Ctrl-C
    terminated = 143  # 128 + SIGTERM (timeout, systemd, docker stop, Kubernetes): the same clean stop as Ctrl-C
