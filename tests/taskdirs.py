"""A task folder for a test's own trainer: digits' frozen parts (prepare.py, task.yaml, program.md) beside it."""

from __future__ import annotations

import shutil
from pathlib import Path

DIGITS_TASK = Path(__file__).resolve().parents[1] / "trainers" / "digits"


def digits_task(folder: Path, train_source: str, program: str | None = None) -> Path:
    """Write `train.py` into `folder` with digits' prepare.py and task.yaml, so `task.trainer=folder` loads."""
    folder.mkdir(parents=True, exist_ok=True)
    for part in ("prepare.py", "task.yaml", "program.md"):
        shutil.copy(DIGITS_TASK / part, folder / part)
    (folder / "train.py").write_text(train_source)
    if program is not None:
        (folder / "program.md").write_text(program)
    return folder
