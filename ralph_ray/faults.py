"""Test hooks for crash-resume tests: the driver kills itself at a named point (`RALPH_KILL_AT=<point>[:<n>]`), or
is Ctrl-C'd there (`RALPH_INTERRUPT_AT=<point>`).

Points of the asynchronous campaign: child_written (a child's rows are in the KB, it is not queued yet),
queue_empty (a slot got a knob sample because no child waited), trial_running (a trial reported an epoch),
after_completion (a trial's rows were just written), decision (the decision engine is about to record).
The hook SIGKILLs the driver's whole process group at the n-th pass (default the first): no cleanup runs,
as with `kill -9`.
"""

from __future__ import annotations

import os
import signal

ENV_KILL_AT = "RALPH_KILL_AT"
ENV_INTERRUPT_AT = "RALPH_INTERRUPT_AT"
_passes: dict[str, int] = {}


def kill_point(name: str) -> None:
    """Die here (SIGKILL of the process group, no cleanup) if RALPH_KILL_AT names this point."""
    wanted = os.environ.get(ENV_KILL_AT)
    if not wanted:
        return
    point, _, nth = wanted.partition(":")
    if point != name:
        return
    _passes[name] = _passes.get(name, 0) + 1
    if _passes[name] >= int(nth or 1):
        os.killpg(os.getpgid(0), signal.SIGKILL)


def interrupt_point(name: str) -> None:
    """Raise KeyboardInterrupt here, as Ctrl-C's default handler does, if RALPH_INTERRUPT_AT names this point.

    Points: report (the run is recorded finished; its report, timeline and tracking are next). Raised, not signalled:
    a test suite started as a background job has SIGINT ignored, and a signal to itself would never arrive.
    """
    if os.environ.get(ENV_INTERRUPT_AT) == name:
        raise KeyboardInterrupt
