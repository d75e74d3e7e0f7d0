"""Applying an LLM's unified diff to a child's work dir, with `git apply` (atomic: all hunks or none).

A diff that does not apply, or that reaches outside the work dir (`../x`), is a `PatchFailed` (the coder sends the
error back to the model); a diff that touches a frozen file is refused outright with an `AgentError`. Two answer
shapes small local models often give are mended before git sees them: headers with the repository's folders
(`a/trainers/digits/train.py`) lose the folders where the rest names a mutable file, and a whole file in a
```python block becomes a diff against that file (`answer_diff`).
"""

from __future__ import annotations

import difflib
import os
import re
import shutil
import subprocess
from pathlib import Path, PurePosixPath

from ralph_ray.agents.base import AgentConfigError, AgentError
from ralph_ray.knobs import parse
from ralph_ray.variants import MUTABLE, is_mutable, mutable_names

GIT_TIMEOUT_S = 30.0
_FENCE = re.compile(r"```[ \t]*(?:diff|patch|udiff)[^\n]*\n(.*?)(?:\n```|\Z)", re.DOTALL)
_CODE_FENCE = re.compile(r"```[ \t]*(python|py|python3)?([^\n]*)\n(.*?)\n```", re.DOTALL)
# A whole-file answer must be mostly the file (difflib's line ratio): a snippet of one function would wipe the rest.
WHOLE_FILE_RATIO = 0.5
_HEADER_LINE = re.compile(r"^(--- |\+\+\+ |diff --git )(.*)$", re.MULTILINE)
_HEADER_PATHS = re.compile(
    r"^(?:---|\+\+\+) (\S+)|^diff --git (\S+) (\S+)|^(?:rename|copy) (?:from|to) (.+)$", re.MULTILINE
)


class PatchFailed(Exception):
    """The diff is malformed or does not apply to the files; the message is git's, for the model to fix."""


class NoDiff(PatchFailed):
    """The answer holds no unified diff at all (prose, or a ```python block `answer_diff` may take as a file)."""


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
            raise NoDiff(
                "no unified diff found: reply with one ```diff block holding --- a/<file> / +++ b/<file> headers and "
                "@@ hunks"
            )
        text = stripped[start:]
    return text.rstrip("\n") + "\n"


def answer_diff(answer: str, workdir: Path) -> tuple[str, str | None]:
    """The change in a model's answer as a diff, and the file it named when it came as the whole file in a
    ```python block (None for a diff): the engine diffs that file against the work dir's copy."""
    try:
        return extract_diff(answer), None
    except NoDiff as no_diff:
        blocks = [(info, body) for lang, info, body in _CODE_FENCE.findall(answer) if lang or not info.strip()]
        if len(blocks) != 1:
            raise
        info, body = blocks[0]
        name = whole_file_target(workdir, body, answer.split("```", 1)[0] + info)
        if name is None:
            raise PatchFailed(
                f"{no_diff} (the ```python block is not clearly the whole of {' or '.join(mutable_names(workdir))}: "
                "a whole file is taken only where it parses and keeps most of the file's lines)"
            ) from None
        return file_diff(workdir, name, body.rstrip("\n") + "\n"), name


def whole_file_target(workdir: Path, source: str, before: str) -> str | None:
    """The mutable file a ```python block rewrites: the only one, the one the text before it names, or the one it
    most resembles; None where the block does not parse or is not mostly that file (a snippet, say)."""
    try:
        parse(source)
    except SyntaxError:
        return None
    names = [n for n in mutable_names(workdir) if n.endswith(".py")]
    named = [n for n in names if re.search(rf"(?<![\w/.]){re.escape(n)}\b", before)]
    if len(names) == 1:
        candidates = names
    elif len(named) == 1:
        candidates = named
    else:
        candidates = names
    ratios = {n: _ratio((workdir / n).read_text(errors="replace"), source) for n in candidates}
    best = max(ratios, key=lambda n: ratios[n], default=None)
    return best if best is not None and ratios[best] >= WHOLE_FILE_RATIO else None


def file_diff(workdir: Path, name: str, new: str) -> str:
    """A unified diff (a/ b/ headers) that turns the work dir's `name` into `new`."""
    old = (workdir / name).read_text(errors="replace")
    lines = list(difflib.unified_diff(old.splitlines(True), new.splitlines(True), f"a/{name}", f"b/{name}"))
    # A last line without its newline needs git's marker, or the next header would join it.
    return "".join(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in lines)


def _ratio(old: str, new: str) -> float:
    return difflib.SequenceMatcher(None, old.splitlines(), new.splitlines(), autojunk=False).ratio()


def rebase_paths(workdir: Path, diff: str) -> str:
    """Headers that name a mutable file under folders it is not in (`a/trainers/digits/train.py`, the repository's
    path) renamed to the file; a path with `..` or an absolute one is left for check_paths to refuse."""
    strip = _strip_level(diff)
    mutable = set(mutable_names(workdir))

    def fix(path: str) -> str:
        if path == "/dev/null":
            return path
        name = _strip(path, strip)
        parts = PurePosixPath(name).parts
        if not parts or name in mutable or ".." in parts or PurePosixPath(name).is_absolute():
            return path
        if (workdir / parts[0]).exists():
            return path  # a real folder of the variant (a new `models/net.py`) is meant as written
        tails = ["/".join(parts[i:]) for i in range(1, len(parts))]
        found = next((t for t in tails if t in mutable), None)
        return path if found is None else path[: len(path) - len(name)] + found

    def line(match: re.Match[str]) -> str:
        head, rest = match.groups()
        if head == "diff --git ":
            return head + " ".join(fix(p) for p in rest.split(" "))
        path, tab, tail = rest.partition("\t")  # `--- a/x\t2024-01-01` (a timestamp) keeps its tail
        return head + fix(path.strip()) + tab + tail

    return _HEADER_LINE.sub(line, diff)


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
    """Refuse a diff that reaches outside the work dir (PatchFailed: the model may fix its paths) or touches a frozen
    file (AgentError)."""
    root = workdir.resolve()
    for name in paths:
        target = (root / name).resolve()
        if PurePosixPath(name).is_absolute() or ".." in PurePosixPath(name).parts or not target.is_relative_to(root):
            raise PatchFailed(
                f"the diff touches {name!r}, outside the trainer folder: name the files as they are listed "
                "(--- a/train.py / +++ b/train.py), with no folders before them"
            )
        if not is_mutable(PurePosixPath(name)):
            raise AgentError(f"diff refused: it edits frozen file {name!r}; only {', '.join(MUTABLE)} files may change")


def apply_diff(workdir: Path, diff: str) -> list[str]:
    """Apply `diff` in `workdir` with git (refusing frozen or outside paths first); return the paths it changed."""
    diff = rebase_paths(workdir, diff)
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
        raise PatchFailed(one_line(done.stderr) or f"git apply exited with {done.returncode}")
    return done.stdout


def one_line(stderr: str) -> str:
    """git's stderr as one line, its errors before its warnings: the reason lands in the log and the KB's one-line
    fields (user trial: a recount warning, a blank line, then the error, over two lines)."""
    lines = list(dict.fromkeys(line.strip() for line in stderr.splitlines() if line.strip()))
    return "; ".join(sorted(lines, key=lambda line: not line.startswith(("error:", "fatal:"))))


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
