"""`python -m ralph_ray.prepare [overrides]`: write a task's public data so a trainer runs by hand."""

from __future__ import annotations

import sys
import traceback
from pathlib import Path

from ralph_ray.exit_codes import ExitCode
from ralph_ray.harness import ENV_DATA_DIR


def main(argv: list[str] | None = None) -> int:
    """Prepare `<cwd>/data/prepared/<task>` (overrides as for `python -m ralph_ray`) and print the export line."""
    from ralph_ray.config import ConfigError, load_config
    from ralph_ray.tasks import DataError, prepare_splits
    from ralph_ray.tasks.base import (
        describe,
        scored_by_builtin,
        text_memory_note,
        unscorable_targets,
        unusual_direction,
        write_public,
    )

    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        cfg = load_config(argv)
        splits = prepare_splits(cfg)
    except (ConfigError, DataError) as err:
        if err.__cause__ is not None:  # the task's own prepare() raised: its traceback shows where, in its code
            traceback.print_exception(err.__cause__, file=sys.stderr)
        print(err, file=sys.stderr)
        return ExitCode.safeguard_or_config
    unscorable = unscorable_targets(splits)
    if unscorable is not None and scored_by_builtin(splits.metric):
        # a built-in metric scores predictions shaped like the targets: every trial would fail in scoring
        print(
            f"{unscorable}\n  fix: name a built-in metric that reads these targets, or define "
            "`def score(predictions, targets) -> float` in prepare.py",
            file=sys.stderr,
        )
        return ExitCode.safeguard_or_config
    if unscorable is not None:  # a task's own score() may read other predictions than the targets (probabilities)
        print(
            f"warning: {unscorable}. If score() reads predictions of another form than the targets, carry on; if "
            "not, every trial will fail in scoring: fix score() in prepare.py",
            file=sys.stderr,
        )
    out = Path("data/prepared") / cfg.task.name
    write_public(splits, out, cfg.task.name)
    print(
        f"wrote {out.resolve()} (train {len(splits.train_y)}, selection {len(splits.selection_y)}, test "
        f"{len(splits.test_y)} inputs)"
    )
    print(describe(splits.metric))
    if note := text_memory_note(splits):
        print(f"note: {note}")
    warning = unusual_direction(splits.metric)
    if warning:
        print(f"warning: {warning}", file=sys.stderr)
    print(f"export {ENV_DATA_DIR}={out.resolve()}")
    print(f"then: cd {cfg.trainer_dir()} && python train.py")
    return ExitCode.ok


if __name__ == "__main__":
    sys.exit(main())
