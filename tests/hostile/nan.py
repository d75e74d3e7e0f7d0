"""Diverges: the runner fails it at the first non-finite metric."""

import time

from ralph_ray import harness

harness.report(epoch=1, val_loss=float("nan"))
time.sleep(60)
