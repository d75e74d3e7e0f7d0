"""The files a task's prepare() reads, found by Python's audit hook: raw data the sandbox would show to every trial.

A trial's sandbox binds the system folders and the Python environment read-only. A task that keeps its raw data there
(a Debian dataset under /usr, a file inside the venv) must name it in `hidden_paths`, or every trial can read the
held-out labels: a user's Fashion-MNIST prepare.py read /usr/share/datasets/fashion-mnist without it, and a trainer
that opened the test labels scored 1.0 in 111 trials of 111, with no warning. What prepare() opens there is hidden
from the trials automatically, and the campaign says so.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path

# Opened by imports and the runtime, not data: hiding them would break the trials' own imports.
CODE_SUFFIXES = (".py", ".pyc", ".pyi", ".so", ".pyd", ".typed")
# System configuration every process reads (locales, time zones, certificates, the loader's cache): never labels.
RUNTIME_FOLDERS = ("/etc", "/usr/share/zoneinfo", "/usr/share/locale", "/usr/lib/locale", "/usr/share/ca-certificates")
# Python's own library and installed packages: their files (metadata, fonts, certificates) are what trials run on,
# and the one dataset shipped inside a package that a trainer could rebuild labels from is hidden by name
# (sandbox.ENV_DATASETS). A package's entry_points.txt read by importlib.metadata is not raw data.
LIBRARY_PART = re.compile(r"site-packages|dist-packages|python\d(\.\d+)?|.+\.(dist|egg)-info")

_recorders: list[set[str]] = []
_lock = threading.Lock()
_installed = False


def _hook(event: str, args: tuple[object, ...]) -> None:
    """Python's audit hook: an `open` of a path while a recorder listens."""
    if event != "open" or not _recorders or not args or not isinstance(args[0], (str, bytes, os.PathLike)):
        return
    _recorders[-1].add(os.fsdecode(args[0]))


@contextlib.contextmanager
def recording() -> Iterator[set[str]]:
    """The paths opened (by any thread) while inside; the hook stays installed (audit hooks cannot be removed) and
    costs one list check per open once nothing listens."""
    global _installed
    with _lock:
        if not _installed:
            sys.addaudithook(_hook)
            _installed = True
    seen: set[str] = set()
    _recorders.append(seen)
    try:
        yield seen
    finally:
        _recorders.remove(seen)


# More files than this in one folder are hidden as the folder (an image folder under /opt would otherwise put a bind
# per file on every trial's bwrap command line, past the kernel's argument limit).
FILES_PER_FOLDER = 4


def exposed(opened: Iterable[str], bound: Iterable[Path], hidden: Iterable[Path]) -> list[Path]:
    """What to hide of the data files among `opened` that lie in a folder trials see (`bound`) and that nothing hides
    yet: each file, or its folder where it holds more than FILES_PER_FOLDER of them (never a bound folder itself)."""
    bound = [p.resolve() for p in bound]
    # Only a hidden path inside a bound folder covers anything (the jail's rule): the project root holds the venv a
    # checkout installs into (`python -m venv .venv`, CI's), and hiding the root does not hide the bound venv.
    hidden = [h for h in (p.resolve() for p in hidden) if any(h.is_relative_to(b) for b in bound)]
    found = set()
    for name in opened:
        path = Path(name).resolve()
        if not path.is_file() or path.suffix in CODE_SUFFIXES or ".so." in path.name:
            continue
        if any(path.is_relative_to(folder) for folder in RUNTIME_FOLDERS):
            continue
        if any(LIBRARY_PART.fullmatch(part) for part in path.parts):
            continue
        if any(path.is_relative_to(folder) for folder in bound) and not any(path.is_relative_to(h) for h in hidden):
            found.add(path)
    by_folder: dict[Path, list[Path]] = {}
    for path in found:
        by_folder.setdefault(path.parent, []).append(path)
    collapsed: set[Path] = set()
    for folder, files in by_folder.items():
        many = len(files) > FILES_PER_FOLDER and folder not in bound and len(folder.parts) > 3
        collapsed.update([folder] if many else files)
    return sorted(collapsed)
