"""The noise margin at ASHA's rungs (ralph_ray/asha.py), on real digits curves: val_acc as the seed trainer reports it
(float32 accuracies over its 161 validation images), recorded from runs of bench/asha.py's configs (seed 1)."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import numpy as np
import pytest
from ray.tune.schedulers import ASHAScheduler, FIFOScheduler

from ralph_ray import PROJECT_ROOT
from ralph_ray.asha import NoiseAwareASHA, binomial_margin, epochs_past_max_t, examples_behind, most_epochs
from ralph_ray.config import ConfigError, load_config
from ralph_ray.search import scheduler
from ralph_ray.trials import hold_from

# val_acc of epochs 1-4 and the frozen selection score after 12 epochs (digits, training seed 1)
FAST = [0.7204968929290771, 0.95652174949646, 0.9503105878829956, 0.9192546606063843]  # LR 0.065, batch 32, width 8
# LR 0.106, batch 128, width 16: behind at epoch 4, yet tied best after 12 epochs (selection 0.9610, as FAST)
SLOW_STARTER = [0.7142857313156128, 0.5279502868652344, 0.8944099545478821, 0.8944099545478821]
LAGGARD = [0.2484472095966339, 0.42236024141311646, 0.7018633484840393, 0.8012422323226929]  # LR 0.004: 0.883


class Trial:
    """What Tune's scheduler reads of a trial."""

    def __init__(self, trial_id: str) -> None:
        self.trial_id = trial_id


def feed(sched: NoiseAwareASHA | ASHAScheduler, trial_id: str, curve: list[float]) -> str:
    """Report a curve epoch by epoch; the scheduler's last decision (STOP ends the feed)."""
    trial = Trial(trial_id)
    sched.on_trial_add(None, trial)  # type: ignore[arg-type]
    action = "CONTINUE"
    for epoch, value in enumerate(curve, start=1):
        action = sched.on_trial_result(None, trial, {"epoch": epoch, "val_acc": value})  # type: ignore[arg-type]
        if action == "STOP":
            break
    return action


def digits_asha(margin: float | None) -> NoiseAwareASHA:
    """digits' rungs (grace 4, reduction 3, 12 epochs) as search.scheduler builds them."""
    sched = NoiseAwareASHA(
        margin=margin, z=2.0, last=12, time_attr="epoch", max_t=13, grace_period=4, reduction_factor=3
    )
    sched.set_search_properties("val_acc", "max")
    return sched


def test_the_split_size_is_read_off_the_reported_accuracies():
    assert examples_behind(FAST) == 161  # float32 accuracies: 116, 154, 153, 148 of 161
    assert examples_behind(FAST + SLOW_STARTER + LAGGARD) == 161
    assert examples_behind(FAST[:2]) is None  # two values: too few to tell
    assert examples_behind([0.5, 0.25, 0.75]) == 4
    assert examples_behind([2.31, 1.87, 1.52]) is None  # a loss is no proportion
    assert examples_behind([0.3172, 0.2718281828, 0.1415926535]) is None  # no split of <= 10,000 examples fits


def test_a_size_read_off_few_values_grows_when_a_value_rules_it_out_and_the_console_says_so(capsys):
    """A user trial: accuracies over 68 examples whose first numerators were all even read as 34, and the console
    said 34 while later values had made it 68."""
    sched = digits_asha(None)
    for count in (50, 56, 60):  # k/68 with k even: also multiples of 1/34
        sched.observe(count / 68)
    assert sched.examples == 34
    sched.observe(61 / 68)
    assert sched.examples == 68
    said = capsys.readouterr().err.splitlines()
    assert len(said) == 2 and "over 34 examples:" in said[0]
    assert "over 68 examples (not 34: 0.897059 is no multiple of 1/34)" in said[1]
    assert sched.margin_at(0.9) == pytest.approx(binomial_margin(0.9, 68, 2.0))
    sched.observe(59 / 68)  # a size already known is not said again
    assert not capsys.readouterr().err


def test_the_margin_is_two_standard_errors_of_an_accuracy():
    assert binomial_margin(0.95, 161, 2.0) == pytest.approx(2 * math.sqrt(0.95 * 0.05 / 161))  # 0.034
    assert binomial_margin(0.9192546606063843, 161, 2.0) == pytest.approx(0.0429, abs=1e-4)
    assert binomial_margin(1.0, 161, 2.0) > 0  # held 1/n from the edge: a perfect score is no certainty
    assert binomial_margin(0.9, 5000, 2.0) < 0.01  # a large split: a small margin


def test_a_trial_within_the_noise_of_the_cutoff_goes_on():
    """Epoch 4: FAST 148/161 sets the cutoff; SLOW_STARTER's 144/161 is 0.025 behind (less than the 0.043 margin)
    and goes on, as it should (it ties FAST after 12 epochs); plain ASHA stops it. LAGGARD, 0.11 behind, stops."""
    noisy = digits_asha(None)
    assert feed(noisy, "fast", FAST) == "CONTINUE"
    assert feed(noisy, "slow", SLOW_STARTER) == "CONTINUE"
    assert noisy.examples == 161
    assert feed(noisy, "laggard", LAGGARD) == "STOP"

    plain = digits_asha(0.0)
    assert feed(plain, "fast", FAST) == "CONTINUE"
    assert feed(plain, "slow", SLOW_STARTER) == "STOP"

    tune_asha = ASHAScheduler(time_attr="epoch", max_t=13, grace_period=4, reduction_factor=3)
    tune_asha.set_search_properties("val_acc", "max")
    assert feed(tune_asha, "fast", FAST) == "CONTINUE"
    assert feed(tune_asha, "slow", SLOW_STARTER) == "STOP"  # margin 0 is Tune's own rule


def test_a_metric_that_is_no_accuracy_gets_no_margin():
    sched = NoiseAwareASHA(margin=None, z=2.0, last=4, time_attr="epoch", max_t=5, grace_period=1, reduction_factor=2)
    sched.set_search_properties("val_loss", "min")

    def losses(trial_id: str, values: list[float]) -> str:
        trial = Trial(trial_id)
        sched.on_trial_add(None, trial)  # type: ignore[arg-type]
        action = "CONTINUE"
        for epoch, value in enumerate(values, start=1):
            action = sched.on_trial_result(None, trial, {"epoch": epoch, "val_loss": value})  # type: ignore[arg-type]
        return action

    assert losses("a", [2.31, 1.87, 1.52]) == "CONTINUE"
    assert losses("b", [2.3101]) == "STOP"  # 0.0001 worse than a at the first rung: plain ASHA stops it
    assert sched.examples is None and sched.margin_at(-2.31) == 0.0


def test_a_rung_at_the_last_epoch_is_dropped():
    assert [m for m, _ in ASHAScheduler(max_t=13, grace_period=4, reduction_factor=3)._brackets[0]._rungs] == [12, 4]
    assert digits_asha(None).rungs() == [4.0]
    assert NoiseAwareASHA(margin=0, z=2, last=12, max_t=13, grace_period=2, reduction_factor=2).rungs() == [2, 4, 8]


def test_the_config_builds_it():
    digits = scheduler(load_config([]))
    assert isinstance(digits, NoiseAwareASHA)
    assert digits.rungs() == [4.0] and digits.fixed_margin is None and digits.z == 2.0  # trainers/digits/task.yaml
    plain = scheduler(load_config(["scheduler.margin=0", "scheduler.grace_period=2", "scheduler.reduction_factor=2"]))
    assert isinstance(plain, NoiseAwareASHA) and plain.fixed_margin == 0.0 and plain.rungs() == [2.0, 4.0, 8.0]
    assert scheduler(load_config(["scheduler.margin=0.05"])).margin_at(0.9) == 0.05
    assert isinstance(scheduler(load_config(["scheduler=fifo"])), FIFOScheduler)
    budget = scheduler(load_config(["trial.budget_s=60"]))
    assert isinstance(budget, NoiseAwareASHA) and budget.rungs()[0] == pytest.approx(60 * 4 / 12)


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("scheduler.margin=abc", "scheduler.margin"),
        ("scheduler.margin=-1", "scheduler.margin"),
        ("scheduler.margin_z=-1", "scheduler.margin_z"),
    ],
)
def test_a_bad_margin_is_refused(override, key):
    with pytest.raises(ConfigError) as err:
        load_config([override])
    assert err.value.key == key


def test_a_stop_says_why_in_the_stops_the_ledger_reads():
    """User trials: ASHA's stops had a NULL reason in the KB (a forecaster's stop says why). The scheduler the config
    builds writes the rung, the cutoff and the margin into the ledger's stop_reasons; trials it let go on have none."""
    stops: dict[str, str] = {}
    sched = scheduler(load_config(["scheduler.grace_period=4", "scheduler.reduction_factor=3"]), stops)
    assert isinstance(sched, NoiseAwareASHA)
    sched.set_search_properties("val_acc", "max")
    assert feed(sched, "fast", FAST) == "CONTINUE"
    assert feed(sched, "slow", SLOW_STARTER) == "CONTINUE"
    assert feed(sched, "laggard", LAGGARD) == "STOP"
    assert set(stops) == {"laggard"}
    cutoff = float(np.percentile([FAST[3], SLOW_STARTER[3]], 100 * (1 - 1 / 3)))  # the trials before it
    margin = binomial_margin(cutoff, 161, 2.0)
    assert stops["laggard"] == (
        f"ASHA: val_acc {LAGGARD[3]:.4g} at epoch 4 is below the cutoff {cutoff - margin:.4g} of the rung at epoch 4 "
        f"(the top 1/3 of the 2 trial(s) recorded there less a margin of {margin:.4g} (scheduler.margin))"
    )


def test_a_stop_of_a_loss_says_above():
    stops: dict[str, str] = {}
    sched = NoiseAwareASHA(margin=0.0, z=2, stops=stops, time_attr="epoch", max_t=5, grace_period=1, reduction_factor=2)
    sched.set_search_properties("val_loss", "min")
    for trial_id, loss in (("a", 1.5), ("b", 2.5)):
        sched.on_trial_add(None, Trial(trial_id))  # type: ignore[arg-type]
        sched.on_trial_result(None, Trial(trial_id), {"epoch": 1, "val_loss": loss})  # type: ignore[arg-type]
    assert stops == {
        "b": "ASHA: val_loss 2.5 at epoch 1 is above the cutoff 1.5 of the rung at epoch 1 (the top 1/2 of the 1 "
        "trial(s) recorded there)"
    }


def test_a_resumed_run_judges_its_first_trial_against_the_replayed_earlier_trials(capsys):
    """User trial (kill -9, then resume): the resume's new Tune run started ASHA with empty rungs, so its first trial
    was cut against one trial's result. The earlier trials' reports replayed, a laggard stops at the rung, against
    both, with the margin the split size gave; an empty history lets it through."""
    stops: dict[str, str] = {}
    config = load_config(["scheduler.grace_period=4", "scheduler.reduction_factor=3"])
    fresh, resumed = scheduler(config, {}), scheduler(config, stops)
    assert isinstance(fresh, NoiseAwareASHA) and isinstance(resumed, NoiseAwareASHA)
    history = [("fast", list(enumerate(FAST, start=1))), ("slow", list(enumerate(SLOW_STARTER, start=1)))]
    assert resumed.replay(history, "val_acc", "max") == 2  # before Tune sets the metric and mode, as a resume builds it
    for sched in (fresh, resumed):
        sched.set_search_properties("val_acc", "max")
    assert resumed.recorded() == {4.0: {"fast": FAST[3], "slow": SLOW_STARTER[3]}}
    assert stops == {}  # recorded, nothing stopped
    assert resumed.examples == 161  # the margin's split size, as the earlier run had read it
    assert "ASHA: val_acc reads as an accuracy over 161 examples" in capsys.readouterr().err  # named before Tune does
    assert feed(fresh, "laggard", LAGGARD) == "CONTINUE"
    assert feed(resumed, "laggard", LAGGARD) == "STOP"
    assert "the top 1/3 of the 2 trial(s) recorded there" in stops["laggard"]


def test_a_replayed_loss_is_oriented_as_tune_orients_it():
    sched = NoiseAwareASHA(margin=0.0, z=2, time_attr="epoch", max_t=5, grace_period=1, reduction_factor=2)
    sched.replay([("a", [(1, 1.5)])], "val_loss", "min")
    sched.set_search_properties("val_loss", "min")
    for trial_id, loss, action in (("worse", 2.5, "STOP"), ("better", 1.0, "CONTINUE")):
        sched.on_trial_add(None, Trial(trial_id))  # type: ignore[arg-type]
        assert sched.on_trial_result(None, Trial(trial_id), {"epoch": 1, "val_loss": loss}) == action  # type: ignore[arg-type]


def test_epochs_past_max_t_are_warned_of_with_the_fix():
    """User trial: max_t=3 over EPOCHS=6 trained 6 epochs, and an EPOCHS range up to 12 under max_t=6 trained 9, with
    no rung past max_t (it does not cap training as Ray Tune's does): the start says so and names the max_t to set."""
    assert epochs_past_max_t(load_config([])) is None  # digits: EPOCHS=12, max_t 12
    short = epochs_past_max_t(load_config(["scheduler.max_t=6", "scheduler.grace_period=2"]))
    assert short is not None and "below the 12 epochs a trial can train (EPOCHS)" in short
    assert short.endswith("set scheduler.max_t=12 (or lower EPOCHS)")
    ranged = ["scheduler.max_t=12", "+search.space.EPOCHS={type: int, low: 4, high: 16}"]
    assert "set scheduler.max_t=16 " in str(epochs_past_max_t(load_config(ranged)))
    assert epochs_past_max_t(load_config([*ranged[:1], "+search.space.EPOCHS={type: choice, values: [4, 8]}"])) is None
    assert epochs_past_max_t(load_config(["scheduler.max_t=6", "scheduler=fifo", "scheduler.grace_period=2"])) is None
    assert (
        epochs_past_max_t(load_config(["scheduler.max_t=6", "scheduler.grace_period=2", "trial.budget_s=30"])) is None
    )


def test_the_epochs_knob_is_found_under_its_aliases_alike_for_the_warning_and_the_hold(tmp_path: Path) -> None:
    """most_epochs (the max_t warning) and hold_from (the trial's held epoch) read EPOCHS through one lookup:
    NUM_EPOCHS is the epochs knob for both, a searched alias wins over a later literal one, a bool is no count."""
    trainer = tmp_path / "trainer"
    shutil.copytree(PROJECT_ROOT / "trainers" / "digits", trainer)
    train = trainer / "train.py"
    train.write_text(
        train.read_text()
        .replace("EPOCHS = 12", "NUM_EPOCHS = 5\nMAX_EPOCHS = 9")
        .replace("harness.epochs(EPOCHS)", "harness.epochs(NUM_EPOCHS)")
    )
    cfg = load_config([f"task.trainer={trainer}", "scheduler.max_t=12", "scheduler.grace_period=2"])
    assert most_epochs(cfg) == ("NUM_EPOCHS", 5) and hold_from(12, train) == 5
    train.write_text(train.read_text().replace("NUM_EPOCHS = 5", "NUM_EPOCHS = True"))
    assert most_epochs(cfg) == ("MAX_EPOCHS", 9) and hold_from(12, train) == 9


def test_the_replayed_history_leaves_out_a_replicate_that_did_not_complete(tmp_path: Path):
    """Tune records a replicate in ASHA's rungs only at on_trial_complete, which a failed one never reaches: a resume
    replays a completed replicate's last result, every epoch of an ordinary trial, and nothing of a failed replicate."""
    from ralph_ray.asha import rung_history
    from ralph_ray.kb import KnowledgeBase

    kb = KnowledgeBase(tmp_path / "kb")
    kb.init()
    trials = [("plain", False, "completed"), ("rep_ok", True, "completed"), ("rep_failed", True, "failed")]
    kb.append(
        "trials",
        [
            {"run_id": "r", "cycle": 1, "trial_id": t, "variant_id": "v", "status": status, "knobs": "{}",
             "epochs": 2, "selection_score": 0.9, "test_score": 0.9, "seconds": 1.0, "replicate": replicate}
            for t, replicate, status in trials
        ],
        "t",
    )  # fmt: skip
    kb.append(
        "epochs",
        [
            {"run_id": "r", "trial_id": t, "epoch": e, "metric": "val_acc", "value": 0.5 + e / 10}
            for t, _, _ in trials
            for e in (1, 2)
        ],
        "e",
    )
    replayed = dict(rung_history(kb.reader(), "r", "val_acc", "epoch"))
    assert replayed == {"plain": [(1.0, 0.6), (2.0, 0.7)], "rep_ok": [(2.0, 0.7)]}
