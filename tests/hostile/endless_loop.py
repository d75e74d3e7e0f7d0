"""Reports once, then spins forever: the wall-clock limit ends it."""

from ralph_ray import harness

harness.report(epoch=1, val_acc=0.1)
while True:
    pass
