"""Import each named module of the package in its own process, forked from this one once it has loaded the heavy
third-party packages and nothing of the package; print {module: "" or why it failed} as JSON.

    python tests/import_alone.py ralph_ray.config ralph_ray.kb ...

A fresh interpreter per module paid torch's and Tune's import (~5 s of CPU) a hundred times: 79 s of CI's run.
Run as its own interpreter (not a multiprocessing fork server, which a test session shares and preloads its own way).
"""

from __future__ import annotations

import importlib
import json
import os
import select
import sys
import time
import traceback

PACKAGE = "ralph_ray"
# The third-party packages the package's modules import, top-level, plus Tune and what Tune's PB2 pulls in
# (sklearn.base, scipy.stats: 2 s a module): a module's own imports of them then run from sys.modules. Never the
# package itself. (A module reaching one of these submodules through its parent without importing it would pass here
# and fail alone; tests/test_imports.py's static checks do not look for that.)
PRELOAD = [
    *("numpy", "torch", "ray", "ray.tune", "sklearn.base", "scipy.stats", "pandas", "pyarrow", "duckdb", "optuna"),
    *("libcst", "omegaconf", "hydra", "rich", "yaml", "httpx"),
]
TIMEOUT_S = 120.0
OK = "ok"  # what a child that imported its module sends (silence: it died first)


def check(name: str) -> str:
    """ "" if `import name` works in this process; else why (the traceback's last lines)."""
    loaded = sorted(m for m in sys.modules if m == PACKAGE or m.startswith(PACKAGE + "."))
    if loaded:  # the check would prove nothing: the package was loaded before the module under test
        return f"the process already had {', '.join(loaded)} loaded"
    try:
        importlib.import_module(name)
    except BaseException:  # noqa: BLE001 (any failure of the import is the finding, SystemExit included)
        return traceback.format_exc()[-2000:]
    return ""


def _child(name: str, write: int) -> None:
    """In the forked child: check one module, send the answer, leave without running any exit handler."""
    try:
        os.write(write, (check(name) or OK).encode()[-4000:])  # under a pipe's buffer: never blocks
    finally:
        os._exit(0)


def run(names: list[str], workers: int) -> dict[str, str]:
    """Every name checked in its own forked child, `workers` at a time."""
    for module in PRELOAD:
        importlib.import_module(module)
    found: dict[str, str] = {}
    waiting = list(names)
    running: dict[int, tuple[str, int, float]] = {}  # pid -> (name, read end, start)
    while waiting or running:
        while waiting and len(running) < workers:
            name = waiting.pop(0)
            read, write = os.pipe()
            pid = os.fork()
            if pid == 0:
                os.close(read)
                _child(name, write)
            os.close(write)
            running[pid] = (name, read, time.monotonic())
        select.select([read for _, read, _ in running.values()], [], [], 0.1)
        for pid, (name, read, start) in list(running.items()):
            done, status = os.waitpid(pid, os.WNOHANG)
            if not done and time.monotonic() - start < TIMEOUT_S:
                continue
            if not done:
                os.kill(pid, 9)
                os.waitpid(pid, 0)
            said = os.read(read, 8192).decode(errors="replace")
            os.close(read)
            del running[pid]
            if not done:
                found[name] = f"timed out after {TIMEOUT_S:.0f} s"
            else:
                found[name] = "" if said == OK else said or f"the child died (wait status {status})"
    return found


if __name__ == "__main__":
    sys.path[0] = os.getcwd()  # as `python -c "import ..."` from there: not this folder (tests/ names no package)
    print(json.dumps(run(sys.argv[1:], os.cpu_count() or 1)))
