"""Old import path of the digits task (its code is trainers/digits/prepare.py), kept for callers written before
task folders: `prepare(split_seed, selection_fraction, test_fraction)` as it was.
"""

from __future__ import annotations

from ralph_ray.tasks import TASKS
from ralph_ray.tasks.folder import prepare_module

prepare = prepare_module(TASKS["digits"].folder).split
