"""The public data a trial reads, shipped as bytes and cached once per node; frozen inputs checked by hash."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from ralph_ray.runner import TrialFailed
from ralph_ray.tasks.base import sha256_file

ENV_CACHE_DIR = "RALPH_CACHE_DIR"  # a node's folder for the cached public data (default: its temp dir)


@dataclass(frozen=True)
class PublicData:
    """The public split files (bytes) and their hashes: shipped through the object store to any node."""

    files: dict[str, bytes]
    hashes: dict[str, str]

    @property
    def key(self) -> str:
        """One name for this exact content (the node-local cache folder)."""
        return hashlib.sha256(json.dumps(self.hashes, sort_keys=True).encode()).hexdigest()[:16]


def materialise_data(data: PublicData) -> Path:
    """Write the public files once per node into a local cache (atomically) and return the folder."""
    root = Path(os.environ.get(ENV_CACHE_DIR, Path(tempfile.gettempdir()) / "ralph_ray_data")) / data.key
    if all((root / name).exists() for name in data.files):
        return root
    tmp = root.with_name(f".{root.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.mkdir(parents=True, exist_ok=True)
    for name, content in data.files.items():
        (tmp / name).write_bytes(content)
    try:
        os.replace(tmp, root)
    except OSError:  # another trial on this node got there first, or a cleaner of /tmp removed files from the cache
        _put_back(tmp, root, data.files)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # gone already when the whole folder was moved into place
    return root


def _put_back(tmp: Path, root: Path, names: Iterable[str]) -> None:
    """Move into `root` each file it lacks, one at a time (atomically: trials may be reading the rest)."""
    try:
        for name in names:
            if not (root / name).exists():
                os.replace(tmp / name, root / name)
    except OSError:
        pass  # not ours to mend (another user's cache, a file in its place): check_frozen names what is missing


def check_frozen(frozen: dict[str, str]) -> None:
    """Refuse to run if any frozen file (data, harness) differs from its hash at campaign start."""
    for path, expected in frozen.items():
        if not Path(path).exists():
            raise TrialFailed(f"frozen file {path} is missing")
        if sha256_file(Path(path)) != expected:
            raise TrialFailed(f"frozen file {path} changed since the campaign started")
