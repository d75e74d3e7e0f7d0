"""A trainer's peak memory: the CPU peak RSS of its processes and, where it used CUDA, its GPU peak.

Two sources, kept as the larger: the runner samples the kernel's high-water mark (`VmHWM` in /proc/<pid>/status)
of every process in the trainer's process group while it polls, which also covers a trainer killed mid-run (ASHA,
a timeout); and the harness writes `usage.json` at every report and at exit (its own `ru_maxrss` and
`torch.cuda.max_memory_allocated`), which covers what it allocated after the last sample. A warm-started trainer
is forked from a server that already imported torch, so its high-water mark counts those (shared) pages too.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

from ralph_ray.harness import PEAK_GPU_KEY, PEAK_RSS_KEY

USAGE_FILE = "usage.json"  # in the work dir: written by the harness (RALPH_USAGE_FILE)
# The keys of the harness's usage file are also those a trial's reports carry to the ledger, and the trials
# table's columns.
RSS_KEY, GPU_KEY = PEAK_RSS_KEY, PEAK_GPU_KEY
SAMPLE_EVERY_S = 0.5  # one sample scans /proc (a few ms on a busy node); the high-water mark needs no more
MIB_PER_KIB = 1 / 1024


class PeakMemory:
    """The largest RSS and GPU memory seen for one trainer, in MiB (None until seen)."""

    def __init__(self) -> None:
        self.rss_mb: float | None = None
        self.gpu_mb: float | None = None
        # With track_current (the runner's memory watch): the group's memory at the last sample, as the sum of its
        # processes' proportional set sizes (Pss), so pages they share (a warm fork, data-loader workers) count once.
        self.track_current = False
        self.current_mb = 0.0
        self._next_sample = 0.0

    def sample(self, group: int, force: bool = False) -> None:
        """Read the high-water mark of every process in process group `group` (at most every SAMPLE_EVERY_S)."""
        now = time.monotonic()
        if not force and now < self._next_sample:
            return
        self._next_sample = now + SAMPLE_EVERY_S
        current = 0.0
        for pid in _group_members(group):
            hwm = _vm_hwm_kib(pid)
            if hwm is not None:
                self._see_rss(hwm * MIB_PER_KIB)
            if self.track_current:
                current += (_pss_kib(pid) or 0) * MIB_PER_KIB
        self.current_mb = current

    def read_usage(self, path: Path) -> None:
        """Take what the harness wrote (`usage.json`); a missing or garbled file adds nothing."""
        try:
            usage = json.loads(path.read_text())
        except (OSError, ValueError):
            return
        if not isinstance(usage, dict):
            return
        rss, gpu = _mib(usage.get(RSS_KEY)), _mib(usage.get(GPU_KEY))
        if rss is not None:
            self._see_rss(rss)
        if gpu is not None:
            self.gpu_mb = gpu if self.gpu_mb is None else max(self.gpu_mb, gpu)

    def fields(self) -> dict[str, float]:
        """The peaks seen so far as report keys (rounded to 0.1 MiB); none for what was not seen."""
        found = {RSS_KEY: self.rss_mb, GPU_KEY: self.gpu_mb}
        return {key: round(value, 1) for key, value in found.items() if value is not None}

    def _see_rss(self, mib: float) -> None:
        self.rss_mb = mib if self.rss_mb is None else max(self.rss_mb, mib)


class GpuUse:
    """Says once per campaign when a trial that was given a GPU finished without starting CUDA: its trainer fell back
    to the CPU without a word (torch.cuda.is_available() False inside the trial), and every figure is a CPU one."""

    def __init__(self, gpus_per_trial: float) -> None:
        self.gpus_per_trial, self.said = gpus_per_trial, False

    def check(self, trial_id: str, finished: bool, gpu_mb: float | None) -> str | None:
        """The warning, the first time a finished trial given a GPU has no GPU peak; else None."""
        if self.said or self.gpus_per_trial <= 0 or not finished or gpu_mb is not None:
            return None
        self.said = True
        return (
            f"  [yellow]warning:[/] trial {trial_id} was given {self.gpus_per_trial:g} GPU but never started CUDA "
            "(no GPU peak in its usage.json): its trainer ran on the CPU. Check `harness.device()` and "
            "`torch.cuda.is_available()` in the trial's environment (its stderr.log, node.json)"
        )


def _group_members(group: int) -> list[int]:
    """The processes whose process group is `group` (the trainer, its sandbox's init, its workers)."""
    try:
        names = os.listdir("/proc")
    except OSError:  # no procfs (not Linux): the harness's own figure is all there is
        return []
    members = []
    for name in names:
        if not name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{name}/stat").read_text()
        except OSError:
            continue  # gone since the listing
        fields = stat[stat.rfind(")") + 2 :].split()  # after the command name, which may hold spaces
        if len(fields) > 2 and fields[2] == str(group):
            members.append(int(name))
    return members


def _vm_hwm_kib(pid: int) -> int | None:
    return _status_field(Path(f"/proc/{pid}/status"), "VmHWM:")  # none: a zombie or a kernel thread


def _pss_kib(pid: int) -> int | None:
    """A process's proportional set size in KiB (its private pages, plus its share of pages it shares)."""
    return _status_field(Path(f"/proc/{pid}/smaps_rollup"), "Pss:")


def _status_field(path: Path, key: str) -> int | None:
    try:
        text = path.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith(key):
            return int(line.split()[1])
    return None


def _mib(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) and value >= 0 else None
