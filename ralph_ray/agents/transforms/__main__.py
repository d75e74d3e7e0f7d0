"""`python -m ralph_ray.agents.transforms NAME TRAIN_PY`: print the trainer with one code transform applied.

The offline agent's transforms by hand: e.g. `data_parallel` writes the harness's data-parallel helpers into a
trainer that lacks them (`... data_parallel trainers/mine/train.py > train_dp.py`, then read the diff). Exit 2 with
the reason when the transform does not apply (the idiom it needs is missing, or the trainer already has it).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ralph_ray.agents.transforms import TRANSFORMS, NotApplicable, apply_transform
from ralph_ray.exit_codes import ExitCode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ralph_ray.agents.transforms", description=__doc__.splitlines()[0])
    parser.add_argument("name", help=f"one of: {', '.join(sorted(TRANSFORMS))}")
    parser.add_argument("trainer", type=Path, help="the train.py to transform (left as it is: the result is printed)")
    args = parser.parse_args(argv)
    if args.name not in TRANSFORMS:
        print(f"no transform {args.name!r}; known: {', '.join(sorted(TRANSFORMS))}", file=sys.stderr)
        return ExitCode.safeguard_or_config
    try:
        source = args.trainer.read_text()
    except OSError as error:
        print(f"cannot read {args.trainer}: {error.strerror}", file=sys.stderr)
        return ExitCode.safeguard_or_config
    try:
        sys.stdout.write(apply_transform(args.name, source))
    except NotApplicable as reason:
        print(f"{args.name} does not apply to {args.trainer}: {reason}", file=sys.stderr)
        return ExitCode.safeguard_or_config
    return ExitCode.ok


if __name__ == "__main__":
    sys.exit(main())
