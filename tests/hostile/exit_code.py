"""Gives up with a non-zero exit status."""

import sys

from ralph_ray import harness

harness.report(epoch=1, val_acc=0.1)
sys.exit("giving up: 3 epochs without progress")
