"""Run in a child forked from a server with only third-party packages loaded: import one module of the package.

This file imports nothing of ralph_ray, so the child starts with none of the package's modules loaded.
"""

from __future__ import annotations

import importlib
import sys
import traceback

PACKAGE = "ralph_ray"


def check(name: str) -> str:
    """ "" if `import name` works in this process; else why (the traceback's last lines)."""
    loaded = sorted(m for m in sys.modules if m == PACKAGE or m.startswith(PACKAGE + "."))
    if loaded:  # the check would prove nothing: the package was loaded before the module under test
        return f"the child already had {', '.join(loaded)} loaded"
    try:
        importlib.import_module(name)
    except BaseException:  # noqa: BLE001 (any failure of the import is the finding, SystemExit included)
        return traceback.format_exc()[-2000:]
    return ""
