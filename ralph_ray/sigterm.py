"""SIGTERM ends a campaign as Ctrl-C does: `timeout`, systemd, `docker stop` and Kubernetes all send it.

The CLI installs `on_sigterm` in its main thread; it raises `Terminated`, a KeyboardInterrupt, so the one path that
handles Ctrl-C (campaign.run records the run interrupted, the CLI prints the resume command, Ray shuts down at exit)
handles it too, with exit code 143. `ray.init` installs a SIGTERM handler of its own in the driver (`sys.exit(1)`
after killing its processes, leaving the run recorded `crashed`): `kept` puts the one before it back.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

# Set by the handler: code that catches a KeyboardInterrupt and raises one of its own (Tune's loop could) loses the
# Terminated type, not the fact that SIGTERM came.
_arrived = threading.Event()


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived: handled as Ctrl-C, exit 143 (128 + SIGTERM)."""


def on_sigterm(signum: int, frame: FrameType | None) -> None:
    """The driver's SIGTERM handler: raise Terminated where the main thread is."""
    _arrived.set()
    raise Terminated


def arrived(interrupt: BaseException) -> bool:
    """Whether this KeyboardInterrupt is SIGTERM's (since `install`), not Ctrl-C's."""
    return isinstance(interrupt, Terminated) or _arrived.is_set()


def install() -> Any:
    """Handle SIGTERM as Ctrl-C in this process (from its main thread; elsewhere signal.signal cannot); returns the
    handler it replaced, for `restore`."""
    _arrived.clear()
    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGTERM, on_sigterm)


def restore(before: Any) -> None:
    """Put back the SIGTERM handler `install` replaced (a process that calls the CLI's main, a test, keeps its own)."""
    if before is not None and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, before)


@contextmanager
def kept() -> Iterator[None]:
    """Keep this process's SIGTERM handler across `ray.init`, which replaces it, where it is ours (the CLI's)."""
    before = signal.getsignal(signal.SIGTERM)
    try:
        yield
    finally:
        if before is on_sigterm and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, on_sigterm)
