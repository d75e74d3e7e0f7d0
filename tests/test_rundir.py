"""The run dir's folders: a place a campaign can't write stops it at once, naming the key and the fix (exit 2)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ralph_ray.exit_codes import ExitCode
from ralph_ray.rundir import CampaignError, ensure_writable


@pytest.mark.parametrize("key", ["paths.runs", "paths.kb"])
def test_an_unwritable_folder_exits_2_naming_the_key(key: str, tmp_path: Path) -> None:
    other = "paths.kb" if key == "paths.runs" else "paths.runs"
    done = subprocess.run(
        [sys.executable, "-m", "ralph_ray", f"{key}=/proc/ralph_ray_x", f"{other}={tmp_path / 'o'}", "sandbox=none"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert done.returncode == ExitCode.safeguard_or_config, done.stderr[-2000:]
    assert f"{key}=/proc/ralph_ray_x cannot be created" in done.stderr and "Traceback" not in done.stderr


def test_a_writable_folder_is_checked_and_left_unmade(tmp_path: Path) -> None:
    ensure_writable("paths.runs", tmp_path / "a" / "b")
    assert not (tmp_path / "a").exists()  # the probe leaves nothing behind (a later check may still stop the run)
    (tmp_path / "kept").mkdir()
    ensure_writable("paths.runs", tmp_path / "kept")
    assert (tmp_path / "kept").is_dir()
    (tmp_path / "file").write_text("")
    with pytest.raises(CampaignError, match="paths.kb"):
        ensure_writable("paths.kb", tmp_path / "file" / "kb")  # a file in the way
