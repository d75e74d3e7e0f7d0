"""Variants: immutable, content-hashed snapshots of a trainer's mutable files."""

from __future__ import annotations

import hashlib
import shutil
from dataclasses import dataclass
from pathlib import Path

# Files that are not part of a variant's code.
IGNORED = ("__pycache__", "*.pyc", "metrics.jsonl", "predictions.npz", "*.log")


@dataclass(frozen=True)
class Variant:
    """A snapshot: id = content hash of its files; `files_dir` holds the code exactly as trials run it."""

    variant_id: str
    parent_id: str | None
    files_dir: Path


def content_hash(folder: Path) -> str:
    """A short sha256 over every file's relative path and bytes, in sorted order."""
    digest = hashlib.sha256()
    for path in sorted(_files(folder)):
        digest.update(str(path.relative_to(folder)).encode())
        digest.update(b"\0")
        digest.update(path.read_bytes())
        digest.update(b"\0")
    return digest.hexdigest()[:12]


def snapshot(source: Path, variants_root: Path, parent_id: str | None = None) -> Variant:
    """Copy a trainer folder into `variants_root/<id>/files` (once; the same content is the same variant)."""
    variant_id = content_hash(source)
    files_dir = variants_root / variant_id / "files"
    if not files_dir.exists():
        tmp = files_dir.with_name("files.tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(source, tmp, ignore=shutil.ignore_patterns(*IGNORED))
        tmp.rename(files_dir)
    return Variant(variant_id=variant_id, parent_id=parent_id, files_dir=files_dir)


def _files(folder: Path) -> list[Path]:
    skip = shutil.ignore_patterns(*IGNORED)
    found = []
    for path in folder.rglob("*"):
        if path.is_file() and not any(skip(str(path.parent), [part]) for part in path.relative_to(folder).parts):
            found.append(path)
    return found
