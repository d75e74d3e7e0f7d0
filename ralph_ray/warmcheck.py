"""Whether trials can start warm here: fork one probe trainer through a fork server and say how trials will start.

Apart from `warmstart` because it drives the runner (which itself uses `warmstart`): no import cycle.
"""

from __future__ import annotations

import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

from ralph_ray import runner, warmstart
from ralph_ray.sandbox import Jail, Policy, View


def probe(policy: Policy) -> str | None:
    """Start a server without preloads and fork one trainer through it: None where warm starts work, else why."""
    problem = warmstart.unavailable(policy)
    if problem:
        return problem
    with tempfile.TemporaryDirectory(prefix="ralph-warm-probe-") as folder:
        work, data = Path(folder) / "trials" / "probe", Path(folder) / "data"
        work.mkdir(parents=True)
        data.mkdir()
        (work / "train.py").write_text("print('warm')\n")
        key = warmstart.Key(policy, 1, work.parent, data, preload=())
        try:
            found = warmstart.Server(key)
        except warmstart.WarmStartError as err:
            return str(err)
        try:
            jail = Jail(policy, View(writable=(work,), readable=(data,)))
            try:
                proc = found.spawn(runner.warm_request(runner.Trainer(work, data), jail, {}, 1, key), [])
                code = proc.wait(timeout=30)
                proc.stdout.close()
                proc.stderr.close()
            except (warmstart.WarmStartError, subprocess.TimeoutExpired) as err:
                return str(err)
            finally:
                jail.close()
            return None if code == 0 else f"a forked trainer exited with code {code}"
        finally:
            found.close()


def announce(policy: Policy, wanted: bool, say: Callable[[str], None]) -> bool:
    """Say how trials will start (checked by forking a probe trainer); True where they start warm."""
    if not wanted:
        say("trial starts: cold (trial.warm=false): each trial starts a new interpreter")
        return False
    problem = probe(policy)
    if problem is not None:
        say(f"trial starts: cold, as warm starts cannot work here: {problem}")
        return False
    modules = ", ".join(warmstart.PRELOAD)
    say(f"trial starts: warm: a fork server per worker imports {modules} once and forks each trial")
    return True
