"""Writes a file outside its work dir ({TARGET}: the run dir, the KB, the project or the installed packages)."""

from ralph_ray import harness

harness.report(epoch=1, val_acc=0.1)
with open("{TARGET}", "w") as handle:
    handle.write("planted by a trainer")
