"""The live terminal view of a cycle: its trial lines and best column show the metric's own values."""

from __future__ import annotations

from rich.console import Console

from ralph_ray.ledger import TrialRecord
from ralph_ray.progress import LiveProgress
from ralph_ray.statuses import TrialStatus


def test_a_min_metrics_trial_line_shows_its_own_values():
    """User trial: an MSE run's console printed `selection=-0.0477 test=-0.0518` (the KB's oriented scores)."""
    console = Console(record=True, width=300)
    progress = LiveProgress(console, "cycle 1", 2, sign=-1.0)
    done = TrialRecord("r", 1, "t1", "v", TrialStatus.completed, None, "{}", 0, 3, None, -0.0477, -0.0518, 1.0, "")
    progress.record(done)
    progress.record(TrialRecord("r", 1, "t2", "v", TrialStatus.failed, "boom", "{}", 1, 1, None, None, None, 1.0, ""))
    said = console.export_text()
    assert "selection=0.0477 test=0.0518" in said and "-0.0" not in said
    assert progress.best == -0.0477  # kept oriented: the running best still compares higher-is-better
    panel = Console(record=True, width=200)
    panel.print(progress._render())  # the live panel's best selection column
    assert "0.0477" in panel.export_text() and "-0.0477" not in panel.export_text()


def test_a_trial_line_names_the_metric():
    """User trial: trial lines said `selection=0.8327 test=...` (generations) and `completed 0.8327` (async), never
    which metric; the status header, the report and the plot's axis named macro_f1."""
    from ralph_ray.progress import scores_text

    console = Console(record=True, width=300)
    progress = LiveProgress(console, "cycle 1", 1, metric="macro_f1")
    progress.record(
        TrialRecord("r", 1, "t1", "v", TrialStatus.completed, None, "{}", 0, 3, None, 0.8327, 0.8234, 1.0, "")
    )
    assert "selection macro_f1=0.8327 test=0.8234" in console.export_text()
    # the async campaign's trial line (asyncrun) reads the same text; a trial without a score has none
    assert scores_text(-0.0477, None, -1.0, "mse") == "selection mse=0.0477 test=-"
    assert scores_text(None, None, 1.0, "macro_f1") == ""
