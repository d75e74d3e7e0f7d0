"""Allocates (and touches) up to 2 GiB in 64 MiB steps: far above the test's 512 MiB limit, far below the machine's."""

import numpy as np

from ralph_ray import harness

harness.report(epoch=1, val_acc=0.1)
hoard = []
for _ in range(32):
    hoard.append(np.ones(8 * 1024 * 1024))  # 64 MiB, written so the pages are real
print("allocated 2 GiB unhindered")
