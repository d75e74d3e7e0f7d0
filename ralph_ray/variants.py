"""Variants: immutable, content-hashed snapshots of a trainer's mutable files."""

from __future__ import annotations

import difflib
import enum
import fnmatch
import hashlib
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePath

# Files that are not part of a variant's code.
IGNORED = ("__pycache__", "*.pyc", "metrics.jsonl", "predictions.npz", "*.log")
# A task folder's frozen parts (tasks.folder.FROZEN_PARTS), at its top level: they stay on the driver, never in a
# variant.
TASK_FILES = ("prepare.py", "task.yaml")
# The files an agent may change (by file name); anything else in a trainer folder is frozen.
MUTABLE = ("*.py",)
# What of a task folder the seed variant holds, by default (task.trainer_files): its code and its notes. Nothing
# else goes to the trials: a task folder often keeps raw data (held-out labels included) or prepared splits beside
# its trainer, and a variant's files are what every trial's work dir, and its agent, can read. Globs as `Path.glob`
# reads them: `*` stays in one folder (`*.csv`: the top level's), `**/` spans folders.
TRAINER_FILES = ("**/*.py", "**/*.md")


class VariantStatus(str, enum.Enum):
    """Where a variant stands: the seed, waiting for its trials, or judged against its parent."""

    seed = "seed"
    candidate = "candidate"  # passed the gate, trials pending
    kept = "kept"  # beat its parent by more than min_delta
    discarded = "discarded"  # trained, but did not beat its parent
    rejected = "rejected"  # refused by the validation gate (or the coder gave up)
    crashed = "crashed"  # every trial failed


class RejectedBy(str, enum.Enum):
    """What rejected a child: only the gate's verdict says anything of the code (the analyst skips what the gate
    refused for that parent); the coder failing or the token budget running out before a draft says nothing."""

    gate = "gate"  # the gate refused a draft (the coder may then have given up on its feedback)
    code = (
        "code"  # a deterministic coder found the change does not apply to this code (CannotApply): the same each time
    )
    coder = "coder"  # the coder failed, timed out or crashed before the gate saw a draft
    budget = "budget"  # the cycle's token budget was spent before a draft


@dataclass(frozen=True)
class Variant:
    """A snapshot: id = content hash of its files; `files_dir` holds the code exactly as trials run it."""

    variant_id: str
    parent_id: str | None
    files_dir: Path


@dataclass(frozen=True)
class SeedSnapshot:
    """The seed variant, and the task folder's files it does not hold (relative paths: said once, at the start)."""

    variant: Variant
    left_out: list[str]


def content_hash(folder: Path, instead: dict[str, bytes] | None = None) -> str:
    """A short sha256 over every file's relative path and bytes, in sorted order (`instead`: bytes by relative path)."""
    digest = hashlib.sha256()
    for path in sorted(_files(folder)):
        name = str(path.relative_to(folder))
        digest.update(name.encode())
        digest.update(b"\0")
        digest.update(instead[name] if instead and name in instead else path.read_bytes())
        digest.update(b"\0")
    return digest.hexdigest()[:12]


def files_dir(variants_root: Path, variant_id: str) -> Path:
    """Where a variant's files live: `variants_root/<id>/files` (a run dir's `variants/`)."""
    return variants_root / variant_id / "files"


def final_code_dir(run_dir: Path, variant_id: str) -> Path:
    """Where the final training's copy of a variant's files lives, with `safeguards.final_additions` added to it."""
    return run_dir / "final" / "code" / variant_id


def snapshot(source: Path, variants_root: Path, parent_id: str | None = None) -> Variant:
    """Copy a trainer folder into `variants_root/<id>/files` (once; the same content is the same variant)."""
    variant_id = content_hash(source)
    files = files_dir(variants_root, variant_id)
    if not files.exists():
        tmp = files.with_name("files.tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(source, tmp, ignore=_ignore_at(source))
        tmp.rename(files)
    return Variant(variant_id=variant_id, parent_id=parent_id, files_dir=files)


def seed_snapshot(task_folder: Path, variants_root: Path, patterns: Sequence[str] = TRAINER_FILES) -> SeedSnapshot:
    """The seed variant: the files of `task_folder` that `patterns` glob (relative to it; hidden ones never)."""
    matched = globbed(task_folder, patterns)
    shipped, left_out = [], []
    for path in _files(task_folder):
        relative = path.relative_to(task_folder)
        hidden = any(part.startswith(".") for part in relative.parts)
        (shipped if path in matched and not hidden else left_out).append(relative)
    staging = variants_root / ".seed.tmp"  # a staged copy: the variant's id is the hash of what it holds
    shutil.rmtree(staging, ignore_errors=True)
    try:
        staging.mkdir(parents=True)
        for relative in shipped:
            (staging / relative).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(task_folder / relative, staging / relative)
        return SeedSnapshot(snapshot(staging, variants_root), sorted(str(p) for p in left_out))
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def globbed(task_folder: Path, patterns: Sequence[str]) -> set[Path]:
    """The paths of `task_folder` that `patterns` glob (task.trainer_files: what the seed variant may hold)."""
    return {path for pattern in patterns for path in task_folder.glob(pattern)}


def globs_file(patterns: Sequence[str], name: str) -> bool:
    """Whether one of `patterns` globs the top-level file `name` (`*.py`, `**/*.py`, `train.py`)."""
    return any(
        fnmatch.fnmatch(name, pattern.removeprefix("**/"))
        for pattern in patterns
        if "/" not in pattern.removeprefix("**/")
    )


def variant_files(folder: Path) -> list[Path]:
    """The files that make up a variant (caches and run outputs skipped)."""
    return _files(folder)


def is_mutable(name: str | PurePath) -> bool:
    """True for a file an agent may change (`name` relative to the variant folder); every other file is frozen."""
    return any(fnmatch.fnmatch(PurePath(name).name, pattern) for pattern in MUTABLE)


def mutable_names(folder: Path) -> list[str]:
    """The files of a variant folder an agent may change (relative paths, sorted)."""
    return sorted(str(p.relative_to(folder)) for p in _files(folder) if is_mutable(p.name))


def _files(folder: Path) -> list[Path]:
    skip = shutil.ignore_patterns(*IGNORED)
    found = []
    for path in folder.rglob("*"):
        relative = path.relative_to(folder)
        if (
            path.is_file()
            and str(relative) not in TASK_FILES
            and not any(skip(str(path.parent), [part]) for part in relative.parts)
        ):
            found.append(path)
    return found


def _ignore_at(root: Path):  # noqa: ANN202 - shutil's ignore callable
    """copytree's ignore: caches and run outputs anywhere, the task's frozen files at the top level."""
    skip = shutil.ignore_patterns(*IGNORED)

    def ignore(folder: str, names: list[str]) -> set[str]:
        top = {n for n in names if n in TASK_FILES} if Path(folder) == root else set()
        return set(skip(folder, names)) | top

    return ignore


def unified_diff(old_dir: Path, new_dir: Path) -> str:
    """A unified diff of every file that differs between two variant folders (paths a/ and b/)."""
    old = {str(p.relative_to(old_dir)): p for p in _files(old_dir)}
    new = {str(p.relative_to(new_dir)): p for p in _files(new_dir)}
    chunks = []
    for name in sorted(set(old) | set(new)):
        before = old[name].read_text(errors="replace").splitlines(keepends=True) if name in old else []
        after = new[name].read_text(errors="replace").splitlines(keepends=True) if name in new else []
        if before != after:
            chunks.extend(difflib.unified_diff(before, after, f"a/{name}", f"b/{name}"))
    return "".join(line if line.endswith("\n") else line + "\n" for line in chunks)
