"""The ledger records every trial Tune ended, also those that ended without a completion or error callback."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ray.train._internal.storage import StorageContext
from ray.tune.error import _AbortTrialExecution
from ray.tune.experiment import Trial

from ralph_ray.ledger import STOPPED_WITH_CYCLE, TrialLedger, TrialRecord
from ralph_ray.statuses import TrialStatus
from ralph_ray.tasks.digits import prepare

RESET_FAILED = "Trainable runner reuse requires reset_config() to be implemented and return True."


def tune_trial(tmp_path: Path, trial_id: str) -> Trial:
    storage = StorageContext(storage_path=str(tmp_path), experiment_dir_name="exp", trial_dir_name=trial_id)
    trial = Trial("ralph", config={"variant": "v1", "LR": 0.1}, storage=storage, stub=True, trial_id=trial_id)
    trial.init_local_path()  # where Tune writes a trial's error file, as the controller does before it starts one
    return trial


def test_a_trial_tune_failed_before_it_started_is_recorded_failed_with_tunes_reason(ray_session, tmp_path: Path):
    recorded: list[TrialRecord] = []

    def sink(record: TrialRecord, rows: list[dict[str, Any]]) -> None:
        recorded.append(record)

    ledger = TrialLedger("r", 1, prepare(0, 0.2, 0.2).labels(), str(tmp_path / "trials"), 0, "val_acc", sink)
    running, never_started = tune_trial(tmp_path, "running1"), tune_trial(tmp_path, "reset001")
    ledger.on_trial_start(0, [running], running)
    # Tune's reuse of an actor whose reset timed out: the trial errors without on_trial_start or on_trial_error.
    never_started.handle_error(_AbortTrialExecution(RESET_FAILED))
    never_started.set_status(Trial.ERROR)
    ledger.on_experiment_end([running, never_started])
    by_id = {r.trial_id: r for r in recorded}
    assert set(by_id) == {"running1", "reset001"}
    assert by_id["reset001"].status is TrialStatus.failed and "reset_config" in str(by_id["reset001"].reason)
    assert by_id["running1"].status is TrialStatus.stopped_early and by_id["running1"].reason == STOPPED_WITH_CYCLE
    ledger.on_experiment_end([running, never_started])  # a second end records nothing twice
    assert len(recorded) == 2
