"""The ledger records every trial Tune ended, also those that ended without a completion or error callback."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from ray.train._internal.storage import StorageContext
from ray.tune.error import _AbortTrialExecution
from ray.tune.experiment import Trial
from ray.tune.search import ConcurrencyLimiter, Searcher

from ralph_ray.ledger import SCORING_FAILED, STOPPED_WITH_CYCLE, TrialLedger, TrialRecord
from ralph_ray.scoring import PREDICTIONS_KEY, encode_predictions
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


class OneVariant(Searcher):
    """A searcher that always has another sample (as the population's does)."""

    def suggest(self, trial_id: str) -> dict[str, Any]:
        return {"variant": "v1"}

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        pass


def test_a_trial_tune_failed_without_telling_the_searcher_frees_its_slot_at_the_next_step(ray_session, tmp_path: Path):
    recorded: list[TrialRecord] = []
    # The async run's slots: Tune's own limiter, which counts a trial live until its searcher hears it completed.
    slots = ConcurrencyLimiter(OneVariant(metric="val_acc", mode="max"), max_concurrent=2)
    assert slots.suggest("running1") and slots.suggest("reset001")
    assert slots.suggest("waiting1") is None  # both slots live
    ledger = TrialLedger(
        "r",
        1,
        prepare(0, 0.2, 0.2).labels(),
        str(tmp_path / "trials"),
        0,
        "val_acc",
        lambda record, rows: recorded.append(record),
        on_silent_error=lambda trial_id: slots.on_trial_complete(trial_id, error=True),
    )
    running, failed = tune_trial(tmp_path, "running1"), tune_trial(tmp_path, "reset001")
    ledger.on_trial_start(0, [running], running)
    ledger.on_step_end(0, [running, failed])
    assert recorded == []  # nothing has ended yet
    # Tune's controller after a failed actor reset: the trial errors, and neither callbacks nor searcher hear of it.
    failed.handle_error(_AbortTrialExecution(RESET_FAILED))
    failed.set_status(Trial.ERROR)
    ledger.on_step_end(1, [running, failed])
    assert [(r.trial_id, r.status) for r in recorded] == [("reset001", TrialStatus.failed)]
    assert "reset_config" in str(recorded[0].reason)
    assert slots.suggest("waiting2") == {"variant": "v1"}  # its slot is free again
    ledger.on_step_end(2, [running, failed])
    ledger.on_experiment_end([running, failed])
    assert [r.trial_id for r in recorded] == ["reset001", "running1"]  # nothing recorded twice


def test_a_completed_trial_that_predicts_one_class_is_recorded_with_a_warning(ray_session, tmp_path: Path):
    """Scored as usual, but its reason (shown on its console line) says why its score is the share of one class."""
    recorded: list[TrialRecord] = []
    splits = prepare(0, 0.2, 0.2)
    ledger = TrialLedger(
        "r", 1, splits.labels(), str(tmp_path / "trials"), 0, "val_acc", lambda r, _: recorded.append(r)
    )
    predictions = tmp_path / "predictions.npz"
    np.savez(
        predictions, selection=np.zeros(len(splits.selection_y), np.int64), test=np.zeros(len(splits.test_y), np.int64)
    )
    trial = tune_trial(tmp_path, "argmax01")
    trial.update_last_result({PREDICTIONS_KEY: encode_predictions(predictions)})
    ledger.on_trial_start(0, [trial], trial)
    ledger.on_trial_complete(0, [trial], trial)
    (record,) = recorded
    assert record.status is TrialStatus.completed and record.selection_score == pytest.approx(0.1, abs=0.01)
    assert record.reason is not None and record.reason.startswith(
        "every prediction is class 0 while the labels hold 10"
    )


def test_a_trial_whose_predictions_cannot_be_scored_says_it_failed_in_scoring_on_the_driver(
    ray_session, tmp_path: Path
):
    """User trial: the reason read "predictions: Found array with dim 4" and the console sent the user to the trial's
    stderr.log, empty since the trainer ran fine. The reason says the trainer finished and the driver's scoring
    failed."""
    recorded: list[TrialRecord] = []
    splits = prepare(0, 0.2, 0.2)
    ledger = TrialLedger(
        "r", 1, splits.labels(), str(tmp_path / "trials"), 0, "val_acc", lambda r, _: recorded.append(r)
    )
    predictions = tmp_path / "predictions.npz"
    rng = np.random.default_rng(0)  # one logit per class saved, not the class ids accuracy scores
    np.savez(predictions, selection=rng.normal(size=(len(splits.selection_y), 10)), test=rng.normal(size=(5, 10)))
    trial = tune_trial(tmp_path, "logits01")
    trial.update_last_result({PREDICTIONS_KEY: encode_predictions(predictions)})
    ledger.on_trial_start(0, [trial], trial)
    ledger.on_trial_complete(0, [trial], trial)
    (record,) = recorded
    assert record.status is TrialStatus.failed and record.selection_score is None
    assert record.reason is not None and record.reason.startswith(f"{SCORING_FAILED}: predictions: ")
    assert "save `logits.argmax(1)`" in record.reason


def test_a_trial_asha_stopped_is_recorded_with_the_schedulers_reason(ray_session, tmp_path: Path):
    """User trials: the KB's reason was NULL for ASHA's stops; it is the one the scheduler wrote into stop_reasons."""
    from ralph_ray.asha import NoiseAwareASHA

    recorded: list[TrialRecord] = []
    ledger = TrialLedger(
        "r", 1, prepare(0, 0.2, 0.2).labels(), str(tmp_path / "trials"), 0, "val_acc", lambda r, _: recorded.append(r)
    )
    sched = NoiseAwareASHA(
        margin=0.0, z=2, stops=ledger.stop_reasons, time_attr="epoch", max_t=5, grace_period=1, reduction_factor=2
    )
    sched.set_search_properties("val_acc", "max")
    ahead, behind = tune_trial(tmp_path, "ahead001"), tune_trial(tmp_path, "behind01")
    for trial, value in ((ahead, 0.9), (behind, 0.3)):
        ledger.on_trial_start(0, [trial], trial)
        sched.on_trial_add(None, trial)  # type: ignore[arg-type]
        result = {"epoch": 1, "val_acc": value}
        decision = sched.on_trial_result(None, trial, result)  # type: ignore[arg-type]
        ledger.on_trial_result(0, [trial], trial, result)
        trial.update_last_result(result)
    assert decision == "STOP"
    ledger.on_trial_complete(0, [behind], behind)
    (record,) = recorded
    assert record.status is TrialStatus.stopped_early and record.epochs == 1
    assert record.reason is not None and record.reason.startswith(
        "ASHA: val_acc 0.3 at epoch 1 is below the cutoff 0.9 of the rung at epoch 1"
    )
