"""SIGTERM ends a campaign as Ctrl-C does: `timeout`, systemd, `docker stop` and Kubernetes all send it.

The CLI installs `on_sigterm` in its main thread; it raises `Terminated`, a KeyboardInterrupt, so the one path that
handles Ctrl-C (campaign.run records the run interrupted, the CLI prints the resume command, Ray shuts down at exit)
handles it too, with exit code 143. `ray.init` installs a SIGTERM handler of its own in the driver, a bare
`sys.exit(15)` (ray._private.worker; Ray's processes go only with its atexit shutdown), which left the run recorded
`crashed`: `kept` holds Ray's install back and puts the one before it back, and turns Ray's exit from a SIGTERM during
`ray.init` into ours.
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
_checked = threading.Event()  # `check` raised for this arrival (once: a Terminated that got through ends the run)


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived: handled as Ctrl-C, exit 143 (128 + SIGTERM)."""


def on_sigterm(signum: int, frame: FrameType | None) -> None:
    """The driver's SIGTERM handler: raise Terminated where the main thread is."""
    _arrived.set()
    raise Terminated


def arrived(interrupt: BaseException) -> bool:
    """Whether this KeyboardInterrupt is SIGTERM's (since `install`), not Ctrl-C's."""
    return isinstance(interrupt, Terminated) or _arrived.is_set()


def check() -> None:
    """Raise Terminated once where a SIGTERM came but its Terminated never got through: the handler ran inside a
    finalizer (a `__del__`, a weakref callback), which Python ends with "Exception ignored" and the campaign trained on
    to its end. The run's stoppers call this on Tune's every step, in the driver's main thread."""
    if _arrived.is_set() and not _checked.is_set() and threading.current_thread() is threading.main_thread():
        _checked.set()
        raise Terminated


def install() -> Any:
    """Handle SIGTERM as Ctrl-C in this process (from its main thread; elsewhere signal.signal cannot); returns the
    handler it replaced, for `restore`."""
    _arrived.clear()
    _checked.clear()
    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGTERM, on_sigterm)


def restore(before: Any) -> None:
    """Put back the SIGTERM handler `install` replaced (a process that calls the CLI's main, a test, keeps its own);
    the arrival, handled by now, ends with it (a later campaign in this process would stop at its first step)."""
    _arrived.clear()
    _checked.clear()
    if before is not None and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, before)


@contextmanager
def kept() -> Iterator[None]:
    """Keep this process's SIGTERM handler across `ray.init` where it is ours (the CLI's), and end a SIGTERM that
    comes during Ray's start (10-60 s on a loaded machine) as one during training: Terminated, exit 143.

    Ray's driver handler, installed first thing in ray.init, raises SystemExit(15): the run was recorded `crashed`,
    exit 15 (user trial), or, where it landed in a finalizer (logging's lock release), Python printed "Exception
    ignored" and the campaign ran on. So Ray's install is held back while ours is in place, and a SIGTERM whose
    Terminated a finalizer swallowed is raised again once ray.init returns (our handler sets `_arrived` first)."""
    before = signal.getsignal(signal.SIGTERM)
    ours = before is on_sigterm and threading.current_thread() is threading.main_thread()
    already = _arrived.is_set()
    try:
        with _ray_handler_held(ours):
            yield
    except SystemExit as err:
        if not ours or err.code != signal.SIGTERM:
            raise
        _arrived.set()
        raise Terminated from None
    finally:
        if ours:
            signal.signal(signal.SIGTERM, on_sigterm)
    if ours and _arrived.is_set() and not already:
        raise Terminated


@contextmanager
def _ray_handler_held(hold: bool) -> Iterator[None]:
    """While `hold`, Ray's `set_sigterm_handler` (which ray.init calls) leaves this process's handler in place."""
    utils = _ray_utils() if hold else None
    install = getattr(utils, "set_sigterm_handler", None)
    if utils is None or install is None:
        yield
        return
    utils.set_sigterm_handler = lambda handler: None
    try:
        yield
    finally:
        utils.set_sigterm_handler = install


def _ray_utils() -> Any:
    """ray._private.utils where Ray is installed (None elsewhere: a process without Ray has no handler to hold)."""
    try:
        from ray._private import utils
    except ImportError:
        return None
    return utils
