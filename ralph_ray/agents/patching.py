"""Applying an LLM's unified diff to a child's work dir, with `git apply` (atomic: all hunks or none).

A diff that does not apply is a `PatchFailed` (the coder sends the error back to the model); a diff that
touches a frozen file or a path outside the work dir is refused outright with an `AgentError`.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path, PurePosixPath

from ralph_ray.agents.base import AgentConfigError, AgentError
from ralph_ray.variants import MUTABLE, is_mutable

GIT_TIMEOUT_S = 30.0
_FENCE = re.compile(r"```[ \t]*(?:diff|patch|udiff)[^\n]*\n(.*?)(?:\n```|\Z)", re.DOTALL)
_HEADER_PATHS = re.compile(
    r"^(?:---|\+\+\+) (\S+)|^diff --git (\S+) (\S+)|^(?:rename|copy) (?:from|to) (.+)$", re.MULTILINE
)


class PatchFailed(Exception):
    """The diff is malformed or does not apply to the files; the message is git's, for the model to fix."""


def require_git() -> None:
    """Diffs are applied with `git apply`; without git the LLM coder cannot work."""
    if shutil.which("git") is None:
        raise AgentConfigError("the LLM coder applies diffs with `git apply`, and git is not on PATH: install git")


def extract_diff(answer: str) -> str:
    """The unified diff in a model's answer: a ```diff block, or the bare answer when it is a diff itself."""
    blocks = [b for b in _FENCE.findall(answer) if b.strip()]
    if len(blocks) > 1:
        raise PatchFailed(f"the answer holds {len(blocks)} diff blocks; put every hunk in ONE ```diff block")
    if blocks:
        text = blocks[0]
    else:
        stripped = answer.strip()
        start = min((i for i in (stripped.find("--- "), stripped.find("diff --git ")) if i >= 0), default=-1)
        if start < 0 or "\n+++ " not in stripped[start:] and "diff --git " not in stripped[start:]:
            raise PatchFailed(
                "no unified diff found: reply with one ```diff block holding --- a/<file> / +++ b/<file> headers and "
                "@@ hunks"
            )
        text = stripped[start:]
    return text.rstrip("\n") + "\n"


def touched_paths(diff: str) -> list[str]:
    """Every path a diff's headers name (sources of renames and deletions included), without the a/ b/ prefixes."""
    strip = _strip_level(diff)
    found = set()
    for match in _HEADER_PATHS.finditer(diff):
        for path in match.groups()[:3]:  # --- / +++ / diff --git paths carry the prefix
            if path and path != "/dev/null":
                found.add(_strip(path, strip))
        if match.group(4):  # rename/copy from/to lines do not
            found.add(match.group(4).strip())
    return sorted(found)


def check_paths(workdir: Path, paths: list[str]) -> None:
    """Refuse (AgentError) a diff that reaches outside the work dir or touches a frozen file."""
    root = workdir.resolve()
    for name in paths:
        target = (root / name).resolve()
        if PurePosixPath(name).is_absolute() or ".." in PurePosixPath(name).parts or not target.is_relative_to(root):
            raise AgentError(f"diff refused: it touches {name!r}, outside the trainer folder")
        if not is_mutable(PurePosixPath(name)):
            raise AgentError(f"diff refused: it edits frozen file {name!r}; only {', '.join(MUTABLE)} files may change")


def apply_diff(workdir: Path, diff: str) -> list[str]:
    """Apply `diff` in `workdir` with git (refusing frozen or outside paths first); return the paths it changed."""
    strip = _strip_level(diff)
    listed = _git(workdir, ["--numstat", "-z", f"-p{strip}"], diff)  # what git itself would touch, nothing written
    named = [p for p in listed.split("\0") if p]
    paths = sorted(set(touched_paths(diff)) | {entry.split("\t")[-1] for entry in named})
    if not paths:
        raise PatchFailed("the diff names no file: give --- a/<file> and +++ b/<file> headers")
    check_paths(workdir, paths)
    before = {p: _read(workdir / p) for p in paths}
    _git(workdir, [f"-p{strip}"], diff)
    changed = [p for p in paths if _read(workdir / p) != before[p]]
    if not changed:
        raise PatchFailed("the diff applied but changed nothing: it must add, remove or replace lines")
    return changed


def _git(workdir: Path, args: list[str], diff: str) -> str:
    """`git apply` in the work dir, never in an enclosing repository (GIT_CEILING_DIRECTORIES), no user config."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "GIT_CEILING_DIRECTORIES": str(workdir.resolve().parent),
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": os.devnull,
        "LC_ALL": "C",
        "HOME": str(workdir.resolve()),
    }
    command = ["git", "apply", "--recount", "--ignore-whitespace", "--whitespace=nowarn", *args, "-"]
    try:
        done = subprocess.run(
            command, input=diff, cwd=workdir, env=env, capture_output=True, text=True, timeout=GIT_TIMEOUT_S
        )
    except FileNotFoundError:
        raise AgentConfigError(
            "the LLM coder applies diffs with `git apply`, and git is not on PATH: install git"
        ) from None
    except subprocess.TimeoutExpired:
        raise PatchFailed(f"git apply took over {GIT_TIMEOUT_S:.0f}s on this diff") from None
    if done.returncode != 0:
        raise PatchFailed(done.stderr.strip() or f"git apply exited with {done.returncode}")
    return done.stdout


def _strip_level(diff: str) -> int:
    """1 for a/ b/ prefixed headers (the usual), 0 for bare paths (`--- train.py`), which models sometimes write."""
    targets = re.findall(r"^\+\+\+ (\S+)", diff, re.MULTILINE)
    if "diff --git " in diff or not targets:
        return 1
    return 1 if all(t == "/dev/null" or t.startswith("b/") for t in targets) else 0


def _strip(path: str, level: int) -> str:
    parts = path.split("/")
    return "/".join(parts[level:]) if len(parts) > level else path


def _read(path: Path) -> bytes | None:
    return path.read_bytes() if path.is_file() else None
