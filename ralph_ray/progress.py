"""The live terminal view of a cycle: trials running / done / stopped early / failed, best score, time."""

from __future__ import annotations

import time
from typing import Any

from ray.tune import Callback
from ray.tune.experiment import Trial
from rich.console import Console
from rich.live import Live
from rich.table import Table

from ralph_ray.ledger import TrialRecord
from ralph_ray.statuses import TrialStatus


class LiveProgress(Callback):
    """A Tune callback drawing a rich panel; finished trials are also printed as log lines."""

    def __init__(self, console: Console, title: str, total: int, sign: float = 1.0, metric: str | None = None) -> None:
        self.console, self.title, self.total = console, title, total
        self.sign = sign  # -1 for a min metric: scores are stored as -value, and shown as the metric's values
        self.metric = metric  # the task's metric (task.metric), named on each trial line
        self.running: set[str] = set()
        self.counts = {status: 0 for status in TrialStatus}
        self.best: float | None = None
        self.start = time.monotonic()
        self.live = Live(self._render(), console=console, refresh_per_second=4, transient=True)

    def __getstate__(self) -> dict[str, Any]:
        # Tune pickles its run config to make experiments restorable; a terminal view is not restorable.
        return {}

    def setup(self, **info: Any) -> None:
        self.live.start()

    def on_trial_start(self, iteration: int, trials: list[Trial], trial: Trial, **info: Any) -> None:
        self.running.add(trial.trial_id)
        self.live.update(self._render())

    def on_trial_result(
        self, iteration: int, trials: list[Trial], trial: Trial, result: dict[str, Any], **info: Any
    ) -> None:
        self.live.update(self._render())

    def record(self, record: TrialRecord) -> None:
        """Count a finished trial (called by the ledger's sink) and log it."""
        self.running.discard(record.trial_id)
        self.counts[record.status] += 1
        if record.selection_score is not None and (self.best is None or record.selection_score > self.best):
            self.best = record.selection_score
        score = scores_text(record.selection_score, record.test_score, self.sign, self.metric)
        reason = f" ({record.reason})" if record.reason else ""
        self.console.print(
            f"  trial {record.trial_id} {record.status.value:<13} epochs={record.epochs:<3} {score}{reason}  "
            f"knobs={record.knobs}",
            soft_wrap=True,
        )
        self.live.update(self._render())

    def on_experiment_end(self, trials: list[Trial], **info: Any) -> None:
        self.live.stop()

    def _render(self) -> Table:
        table = Table(title=self.title, show_header=True, header_style="bold")
        for column in ("running", "completed", "stopped early", "failed", "total", "best selection", "elapsed"):
            table.add_column(column, justify="right")
        best = _shown(self.best, self.sign)
        table.add_row(
            str(len(self.running)),
            str(self.counts[TrialStatus.completed]),
            str(self.counts[TrialStatus.stopped_early]),
            str(self.counts[TrialStatus.failed]),
            str(self.total),
            best,
            f"{time.monotonic() - self.start:.0f}s",
        )
        return table


def scores_text(selection: float | None, test: float | None, sign: float, metric: str | None) -> str:
    """A finished trial's scores on its console line, the metric named (`selection macro_f1=0.8327 test=0.8234`;
    user trial: `selection=0.8327` said not which score it was), or '' where it has none."""
    if selection is None:
        return ""
    return f"selection{' ' + metric if metric else ''}={_shown(selection, sign)} test={_shown(test, sign)}"


def _shown(score: float | None, sign: float) -> str:
    """An oriented score as the metric's value at 4 decimals (`sign` -1: a min metric's), or `-`."""
    return "-" if score is None else f"{sign * score:.4f}"
