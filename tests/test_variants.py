"""Variants: content hashes, immutable snapshots, unified diffs."""

from __future__ import annotations

from pathlib import Path

import pytest

from ralph_ray.variants import content_hash, is_mutable, mutable_names, snapshot, unified_diff


def make(folder: Path, text: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "train.py").write_text(text)
    (folder / "program.md").write_text("rules\n")
    return folder


def test_hash_depends_on_content_not_location_and_ignores_outputs(tmp_path: Path):
    a = make(tmp_path / "a", "LR = 0.1\n")
    b = make(tmp_path / "b", "LR = 0.1\n")
    assert content_hash(a) == content_hash(b)
    (b / "metrics.jsonl").write_text("{}\n")
    (b / "__pycache__").mkdir()
    (b / "__pycache__" / "x.pyc").write_bytes(b"0")
    assert content_hash(a) == content_hash(b)
    (b / "train.py").write_text("LR = 0.2\n")
    assert content_hash(a) != content_hash(b)


def test_snapshot_is_written_once_and_keeps_the_parent(tmp_path: Path):
    source = make(tmp_path / "src", "LR = 0.1\n")
    first = snapshot(source, tmp_path / "variants", parent_id="p0")
    (source / "train.py").write_text("LR = 0.1\n")  # same content
    again = snapshot(source, tmp_path / "variants", parent_id="p0")
    assert first == again and first.parent_id == "p0"
    assert (first.files_dir / "train.py").read_text() == "LR = 0.1\n"
    assert not (first.files_dir.parent / "files.tmp").exists()


def test_unified_diff_names_files_and_lines(tmp_path: Path):
    old = make(tmp_path / "old", "LR = 0.1\nEPOCHS = 3\n")
    new = make(tmp_path / "new", "LR = 0.05\nEPOCHS = 3\n")
    (new / "extra.py").write_text("X = 1\n")
    diff = unified_diff(old, new)
    assert "--- a/train.py" in diff and "+++ b/train.py" in diff
    assert "-LR = 0.1" in diff and "+LR = 0.05" in diff
    assert "+++ b/extra.py" in diff and "program.md" not in diff
    assert unified_diff(old, old) == ""


def test_one_rule_says_which_files_an_agent_may_change(tmp_path: Path):
    # variants.is_mutable is the rule the gate and the LLM coder's patch check apply too.
    from ralph_ray.agents.base import AgentError
    from ralph_ray.agents.patching import check_paths
    from ralph_ray.gate import GateError, check_frozen_files

    parent = make(tmp_path / "parent", "LR = 0.1\n")
    (parent / "model.py").write_text("W = 1\n")
    assert mutable_names(parent) == ["model.py", "train.py"]
    assert is_mutable("sub/net.py") and not is_mutable("program.md")
    child = make(tmp_path / "child", "LR = 0.2\n")
    (child / "model.py").write_text("W = 2\n")
    check_frozen_files(child, parent)
    check_paths(child, ["train.py", "model.py"])
    (child / "program.md").write_text("new rules\n")
    with pytest.raises(GateError, match="frozen file program.md"):
        check_frozen_files(child, parent)
    with pytest.raises(AgentError, match="frozen file 'program.md'"):
        check_paths(child, ["program.md"])
