"""A trial's work dir: the variant's files written fresh, the sampled knobs rewritten into its copy of the code."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from ralph_ray.knobs import KnobError, rewrite_knobs
from ralph_ray.runner import TrialFailed
from ralph_ray.variants import variant_files


def write_variant(files: dict[str, bytes], work: Path) -> None:
    """Write a variant's files into a clean trial work dir."""
    if work.exists():
        shutil.rmtree(work)  # a retried trial starts from a clean copy
    for relative, content in files.items():
        target = work / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content)
    work.mkdir(parents=True, exist_ok=True)


def set_knobs(work: Path, knobs: dict[str, Any], entry: str = "train.py") -> None:
    """Write the sampled knobs into the trial's copy of the code (so its exact code is kept) and knobs.json."""
    source = (work / entry).read_text()
    try:
        (work / entry).write_text(rewrite_knobs(source, knobs))
    except (KnobError, SyntaxError) as err:
        raise TrialFailed(f"cannot set knobs {sorted(knobs)}: {err}") from None
    (work / "knobs.json").write_text(json.dumps(knobs, indent=2, sort_keys=True, default=str))


def prepare_workdir(trainer_dir: Path, work: Path, knobs: dict[str, Any], entry: str = "train.py") -> None:
    """Copy a trainer folder into a work dir and write the knobs into its code (hand runs, the gate)."""
    write_variant(read_files(trainer_dir), work)
    set_knobs(work, knobs, entry=entry)


def read_files(folder: Path) -> dict[str, bytes]:
    """A folder's files (relative path -> bytes), skipping caches and run outputs."""
    return {str(path.relative_to(folder)): path.read_bytes() for path in variant_files(folder)}
