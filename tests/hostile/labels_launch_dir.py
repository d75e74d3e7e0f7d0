"""Reads every label from the raw data kept in the folder the campaign was started from (`python -m` puts it first on
the driver's sys.path, and the sandbox used to bind every sys.path folder into each trial)."""

import numpy as np

from ralph_ray import harness

data = harness.load_data()
rows = np.loadtxt("{TARGET}", delimiter=",")
print(f"STOLE {len(rows)} labelled rows", flush=True)
harness.report(epoch=1, val_acc=1.0)
harness.save_predictions(selection=np.zeros(len(data.selection_x), np.int64), test=np.zeros(len(data.test_x), np.int64))
