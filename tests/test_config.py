"""Config composition, overrides, and every bad-config case (exit code 2 before Ray starts)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from ralph_ray import PROJECT_ROOT
from ralph_ray.agents.transforms import TRANSFORMS
from ralph_ray.config import (
    FINAL_ADDITIONS,
    ConfigError,
    SamplerKind,
    SchedulerKind,
    SpaceKind,
    budget_unread,
    final_unread,
    knob_overridden,
    load_config,
    resume_config,
    schedule_unsized,
)
from ralph_ray.space import seed_off_space


def test_default_is_digits():
    cfg = load_config([])
    assert cfg.experiment == "digits"
    assert cfg.task.name == "digits"
    assert cfg.trainer_dir().name == "digits"
    assert cfg.scheduler.name is SchedulerKind.asha
    assert cfg.search.space["LR"].type is SpaceKind.loguniform


def test_experiment_digits_equals_default():
    assert load_config(["+experiment=digits"]) == load_config([])


def test_cifar10_experiment_switches_groups():
    cfg = load_config(["+experiment=cifar10", "data.root=/data/cifar"])
    assert cfg.experiment == "cifar10"
    assert cfg.task.name == "cifar10"
    assert cfg.resources.gpu == 1
    assert cfg.data.root == "/data/cifar"
    assert "WEIGHT_DECAY" in cfg.search.space


def test_overrides_apply():
    cfg = load_config(["scheduler.grace_period=3", "search.num_samples=16", "scheduler=fifo"])
    assert cfg.scheduler.grace_period == 3
    assert cfg.search.num_samples == 16
    assert cfg.scheduler.name is SchedulerKind.fifo
    assert load_config([]).search.sampler is SamplerKind.tpe
    assert load_config(["search.sampler=random"]).search.sampler is SamplerKind.random


def test_a_schema_key_the_conf_yaml_lacks_can_be_overridden_and_wins_over_task_yaml():
    """task.mirror_invariant is set by digits' task.yaml, not by conf/task/digits.yaml: Hydra alone refused it."""
    assert load_config([]).task.mirror_invariant is False  # digits' task.yaml
    assert load_config(["task.mirror_invariant=true"]).task.mirror_invariant is True
    assert load_config(["task=fashion", "task.mirror_invariant=false"]).task.mirror_invariant is False
    assert load_config(["task.subsample=100"]).task.subsample == 100
    with pytest.raises(ConfigError, match="task.mirror_invariants"):  # a typo is still refused, by name
        load_config(["task.mirror_invariants=true"])


def test_a_knob_space_only_task_yaml_declares_can_be_overridden(tmp_path: Path):
    """User trial: `search.space.PATIENCE.high=20` got Hydra's "Could not override" (PATIENCE is in the task's
    task.yaml, which is merged after Hydra composes conf/); `search.space.LR.high` worked only because conf/ has LR."""
    folder = tmp_path / "mine"
    shutil.copytree(PROJECT_ROOT / "trainers" / "digits", folder)
    task_yaml = folder / "task.yaml"
    task_yaml.write_text(
        task_yaml.read_text().replace("  space:\n", "  space:\n    EPOCHS: {type: int, low: 4, high: 8}\n", 1)
    )
    assert load_config([f"task={folder}"]).search.space["EPOCHS"].high == 8
    cfg = load_config([f"task={folder}", "search.space.EPOCHS.high=12", "search.space.WIDTH.values=[8,16]"])
    assert (cfg.search.space["EPOCHS"].low, cfg.search.space["EPOCHS"].high) == (4, 12)
    assert cfg.search.space["WIDTH"].values == [8, 16]
    with pytest.raises(ConfigError, match="EPOCH"):  # a misspelt knob: a knob the trainer lacks, named
        load_config([f"task={folder}", "search.space.EPOCH.high=12"])


def test_a_misspelt_knob_in_task_yaml_names_its_likely_spelling(tmp_path: Path):
    """User trial: `WIDHT` in task.yaml's space exited 2 naming the trainer's knobs, with no "did you mean"."""
    folder = shutil.copytree(PROJECT_ROOT / "trainers" / "digits", tmp_path / "mine")
    task_yaml = folder / "task.yaml"
    task_yaml.write_text(task_yaml.read_text().replace("    WIDTH:", "    WIDHT:", 1))
    with pytest.raises(ConfigError) as info:
        load_config([f"task={folder}"])
    message = str(info.value)
    assert "names WIDHT, which" in message and "fix: did you mean WIDTH for WIDHT? define each" in message
    assert "~search.space.WIDHT" in message


def test_a_removed_space_replaces_the_task_yamls_space():
    """`~search.space` then `+search.space={...}` leaves only the new knobs, though task.yaml brings its own."""
    assert set(load_config([]).search.space) == {"LR", "BATCH_SIZE", "WIDTH"}  # digits' task.yaml
    cfg = load_config(["~search.space", "+search.space={MOMENTUM: {type: choice, values: [0.8]}}"])
    assert set(cfg.search.space) == {"MOMENTUM"}
    assert set(load_config(["+search.space.EPOCHS={type: choice, values: [4]}"]).search.space) == {
        "LR",
        "BATCH_SIZE",
        "WIDTH",
        "EPOCHS",
    }  # an added knob still joins the task's


@pytest.mark.parametrize(
    ("overrides", "shape"),
    [
        ([], (2, 3)),  # no budget: the population
        (["safeguards.campaign_time_s=300"], (1, 1)),  # a short budget: the serial loop
        (["safeguards.campaign_time_s=301"], (2, 3)),
        (["safeguards.campaign_time_s=120", "population.serial_up_to_s=0"], (2, 3)),  # 0: never serial by budget
        (["safeguards.campaign_time_s=120", "population.parents=3"], (3, 1)),  # a number is used as given
        (["safeguards.campaign_time_s=900", "population.serial_up_to_s=1000"], (1, 1)),
        (["+experiment=fashion", "safeguards.campaign_time_s=120"], (2, 2)),  # the experiment names its shape
    ],
)
def test_the_shape_left_null_is_chosen_by_the_campaign_budget(overrides: list[str], shape: tuple[int, int]):
    from ralph_ray.campaign import _shape_note

    cfg = load_config(overrides)
    assert (cfg.population.parents, cfg.population.children_per_parent) == shape
    # The run's first line says when the budget made it serial, and how to ask for the population instead.
    assert ("the serial loop, as a" in _shape_note(cfg)) is (shape == (1, 1))
    # ...and not where the user asked for 1 x 1 (user trial: "as a 150-s budget calls for" after an explicit 1 x 1)
    given = load_config([*overrides, "population.parents=1", "population.children_per_parent=1"])
    assert _shape_note(given) == ""


def test_a_stored_config_keeps_the_shape_it_ran_with(tmp_path: Path):
    """The shape is resolved at load, so config.yaml records it and a resume with a longer budget keeps it."""
    from omegaconf import OmegaConf

    from ralph_ray.config import resume_config

    cfg = load_config(["safeguards.campaign_time_s=120"])
    (tmp_path / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.structured(cfg)))
    resumed = resume_config(tmp_path, ["safeguards.campaign_time_s=3600"])
    assert (resumed.population.parents, resumed.population.children_per_parent) == (1, 1)


def test_a_run_saved_before_final_additions_resumes_with_its_three_settings_as_the_list(tmp_path: Path):
    from omegaconf import OmegaConf

    from ralph_ray.config import resume_config

    stored = OmegaConf.to_container(OmegaConf.structured(load_config(["safeguards.campaign_time_s=600"])))
    guards = stored["safeguards"]
    del guards["final_additions"]
    guards |= {"final_share": 0.2, "final_schedule": "cosine", "final_augment": True, "final_deepen": True}
    (tmp_path / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create(stored)))
    assert resume_config(tmp_path).safeguards.final_additions == ["cosine", "shift", "flip", "deepen"]
    assert resume_config(tmp_path, ["safeguards.final_additions=[]"]).safeguards.final_additions == []  # cleared
    # on the command line the old settings name the new one, added with + or not, on a resume too
    for old in ("safeguards.final_deepen=true", "+safeguards.final_deepen=true"):
        with pytest.raises(ConfigError, match=r"set safeguards.final_additions=\[deepen\]"):
            load_config([old, "+experiment=fashion"])
    with pytest.raises(ConfigError, match=r"safeguards.final_additions=\[shift,flip\]"):
        resume_config(tmp_path, ["safeguards.final_augment=false"])


@pytest.mark.parametrize(
    ("overrides", "key", "fix_words"),
    [
        (["bogus.key=1"], "bogus", "conf/"),
        (["search.nums_samples=3"], "search.nums_samples", "did you mean `search.num_samples`?"),
        (["safeguards.campain_time_s=60"], "safeguards.campain_time_s", "did you mean `safeguards.campaign_time_s`?"),
        (["scheduler.grace=3"], "scheduler.grace", "did you mean `scheduler.grace_period`?"),
        (["scheduler.grace_period=abc"], "scheduler.grace_period", "set scheduler.grace_period to a value of type int"),
        (["search.num_samples=-3"], "search.num_samples", "above 0"),
        (["safeguards.trial_timeout_s=-1"], "safeguards.trial_timeout_s", "above 0"),
        (["scheduler.grace_period=20"], "scheduler.grace_period", "max_t"),
        (["scheduler.name=bogus"], "scheduler.name", "set scheduler.name to one of asha, fifo, pbt, pb2"),
        (["search.sampler=grid"], "search.sampler", "set search.sampler to one of tpe, random"),
        # user trial: `low: 4.5` ran, truncated to 4; an int range over `LR = 0.05` trained LR 1 to 3
        (["search.space.WIDTH={type: int, low: 4.5, high: 32}"], "search.space.WIDTH.low", "search.space.WIDTH.low=5"),
        (["search.space.WIDTH={type: int, low: 4, high: 32.5}"], "search.space.WIDTH.high", ".WIDTH.high=32"),
        (["search.space.LR={type: int, low: 1, high: 3}"], "search.space.LR", "search.space.LR.type=loguniform"),
        (["+experiment=cifar10"], "data.root", "data.root=/path/to/cifar"),
        (["+experiment=nope"], "experiment", "conf/"),
        (["+experiment=fashon"], "experiment", "did you mean +experiment=fashion?"),  # user trial: no nearest named
        (["experiment=fashion"], "experiment", "write +experiment=..."),  # user trial: "did you mean `run_id`?"
        (["+search.space.LRR.low=0.001"], "search.space", "did you mean LR for LRR?"),  # not "needs low and high"
        (["task.name=mnist"], "task.name", "digits"),
        (["+search.space.lr={type: uniform, low: 0, high: 1}"], "search.space.lr", "UPPER_CASE"),
        (["search.space.LR.low=1", "search.space.LR.high=0.1"], "search.space.LR.low", "range"),
        # a knob the seed's train.py lacks: every trial would fail `cannot set knobs`; the fix names the deletion
        (["+search.space.BOGUS={type: choice, values: [1]}"], "search.space", "~search.space.BOGUS"),
        (["~search.space", "+search.space={SLEEP: {type: choice, values: [1.0]}}"], "SLEEP", "UPPER_CASE constant"),
        (["resources.gpu=-1"], "resources.gpu", "resources.gpu"),
        (["agent.exploration=-1"], "agent.exploration", "agent.exploration=0.01"),
        (["population.breeder_nice=20"], "population.breeder_nice", "population.breeder_nice=10"),
        (["population.serial_up_to_s=-1"], "population.serial_up_to_s", "population.serial_up_to_s=300"),
        (["agent=cli"], "agent.cli_command", "agent.cli_command="),
        (["agent=cli", "agent.cli_template=nope"], "agent.cli_template", "claude"),
    ],
)
def test_bad_config_names_key_and_fix(overrides, key, fix_words):
    with pytest.raises(ConfigError) as info:
        load_config(overrides)
    message = str(info.value)
    assert key in message
    assert "fix:" in message and fix_words in message


def test_a_misspelt_key_in_a_tasks_yaml_names_the_file_and_the_nearest_key(tmp_path: Path):
    folder = shutil.copytree(PROJECT_ROOT / "trainers" / "digits", tmp_path / "mine")
    (folder / "task.yaml").write_text((folder / "task.yaml").read_text().replace("scheduler:", "schedular:"))
    with pytest.raises(ConfigError) as info:
        load_config([f"task={folder}"])
    assert f"(set in {folder / 'task.yaml'})" in str(info.value) and "did you mean `scheduler`?" in str(info.value)
    with pytest.raises(ConfigError) as info:  # a key the task.yaml does not set: no file named
        load_config(["task=digits", "+schedular.max_t=3"])
    assert "set in" not in str(info.value)


def test_a_bad_value_names_where_it_was_set_and_the_values_the_key_takes(tmp_path: Path):
    """User trial: `search.space.LR.type=logunifrom` on the command line was reported "set in .../task.yaml" (which has
    `loguniform`), and `search.sampler=cmaes` was told "did you mean `search.sampler`?", the key it had written."""
    with pytest.raises(ConfigError) as info:
        load_config(["search.space.LR.type=logunifrom"])
    message = str(info.value)
    assert "(set on the command line: search.space.LR.type=logunifrom)" in message and "task.yaml" not in message
    assert "did you mean search.space.LR.type=loguniform? set search.space.LR.type to one of uniform," in message
    with pytest.raises(ConfigError) as info:
        load_config(["search.seed=abc"])
    assert "(set on the command line: search.seed=abc)" in str(info.value) and "`search.seed`?" not in str(info.value)
    # the same bad value in task.yaml names task.yaml
    folder = shutil.copytree(PROJECT_ROOT / "trainers" / "digits", tmp_path / "mine")
    (folder / "task.yaml").write_text((folder / "task.yaml").read_text().replace("loguniform", "logunifrom", 1))
    with pytest.raises(ConfigError) as info:
        load_config([f"task={folder}"])
    assert f"(set in {folder / 'task.yaml'})" in str(info.value) and "type=loguniform?" in str(info.value)


def test_a_seed_value_the_space_does_not_hold_is_warned_of(tmp_path: Path):
    """User trial: `HIDDEN_SIZES = (128, 64)` searched over list choices silently trained the first choice: a tuple is
    its list choice, and a value the space lacks is named with the value trained instead."""
    from taskdirs import digits_task

    assert seed_off_space(load_config([])) is None
    warning = seed_off_space(load_config(["search.space.WIDTH.values=[32,64]"]))
    assert (
        warning is not None and "WIDTH = 16 is not in the choices [32, 64]: the seed's own trial trains 32" in warning
    )
    seed = (PROJECT_ROOT / "trainers" / "digits" / "train.py").read_text()
    assert "WIDTH = 16  #" in seed
    folder = digits_task(tmp_path / "mine", seed.replace("WIDTH = 16  #", "SIZES = (16, 8)  #\nWIDTH = SIZES[0]  #"))
    tuples = [
        f"task.trainer={folder}",
        "~search.space.WIDTH",
        "+search.space.SIZES={type: choice, values: [[8, 4], [16, 8]]}",
    ]
    assert seed_off_space(load_config(tuples)) is None
    warning = seed_off_space(load_config([*tuples, "search.space.SIZES.values=[[8,4],[32,16]]"]))
    assert warning is not None and "SIZES = (16, 8) is not in the choices" in warning


def test_a_search_metric_the_trainer_does_not_report_is_refused_with_the_names_it_does(tmp_path: Path):
    """User trial: `search.metric=val_accuracy` started Ray, then the first result stopped the campaign (exit 4) with
    Tune's traceback and the trainer's source in base64; the seed reports `val_acc`."""
    with pytest.raises(ConfigError) as info:
        load_config(["search.metric=val_accuracy"])
    message = str(info.value)
    assert "'val_accuracy' is not reported by" in message and "val_acc, val_loss" in message
    assert "fix: set search.metric=val_acc " in message
    assert load_config(["search.metric=val_loss", "search.mode=min"]).search.metric == "val_loss"
    # a trainer whose names are known at run time only (`report(**metrics)`) is not second-guessed
    folder = shutil.copytree(PROJECT_ROOT / "trainers" / "digits", tmp_path / "mine")
    source = (folder / "train.py").read_text()
    dynamic = source.replace("harness.report(", "harness.report(**{'extra': 1.0}, ", 1)
    assert dynamic != source
    (folder / "train.py").write_text(dynamic)
    assert load_config([f"task={folder}", "search.metric=val_accuracy"]).search.metric == "val_accuracy"


def test_a_search_mode_against_what_the_metric_name_says_is_refused():
    """User trial: `search.mode=min` with the template's own `val_acc` started a campaign ranking its worst configs
    first (only the task metric's exact name, `accuracy` or `val_accuracy`, was checked)."""
    with pytest.raises(ConfigError, match=r"search.metric=val_acc reads as an accuracy, better when higher") as info:
        load_config(["search.mode=min"])
    assert "fix: set search.mode=max" in str(info.value)
    with pytest.raises(ConfigError, match=r"val_loss reads as a loss or an error, better when lower"):
        load_config(["search.metric=val_loss"])  # digits' task.yaml says mode: max
    assert load_config(["search.metric=val_loss", "search.mode=min"]).search.mode == "min"
    assert load_config(["task=lm"]).search.mode == "min"  # its val_loss (bits per byte), lower is better
    # a negated name reads the other way (review: `val_neg_loss` with mode=max was refused)
    from ralph_ray.config import _direction_by_name

    names = ("val_neg_loss", "neg_mean_squared_error", "minus_acc", "epoch", "val_acc")
    assert [_direction_by_name(n) for n in names] == ["max", "max", "min", None, "max"]


def test_cli_bad_config_exits_2_before_ray(tmp_path: Path):
    env = {**os.environ, "RAY_ADDRESS": ""}
    result = subprocess.run(
        [sys.executable, "-m", "ralph_ray", "search.num_samples=-1"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert result.returncode == 2
    assert "search.num_samples" in result.stderr and "fix:" in result.stderr
    assert not (tmp_path / "runs").exists()  # nothing started, nothing written
    assert "Started a local Ray instance" not in result.stdout + result.stderr


def test_cli_cfg_prints_composed_config(tmp_path: Path):
    result = subprocess.run(
        [sys.executable, "-m", "ralph_ray", "--cfg", "search.num_samples=5"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0
    assert "num_samples: 5" in result.stdout


def test_the_task_registry_is_the_list_of_tasks():
    # config validates task.name against ralph_ray.tasks.TASKS, the registry prepare_splits dispatches through.
    from ralph_ray.tasks import TASKS

    for name, task in TASKS.items():
        cfg = load_config([f"task.name={name}"] + (["data.root=/nowhere"] if task.data_root else []))
        assert cfg.task.name == name
    with pytest.raises(ConfigError, match=", ".join(TASKS)):
        load_config(["task.name=mnist"])


def test_an_unknown_group_option_names_the_group_and_its_options() -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(["agent=gpt"])
    assert "at `agent`" in str(caught.value) and "agent=cli, heuristic, hybrid, none, openai" in str(caught.value)


def test_final_share_must_be_a_share_of_a_time_budget():
    with pytest.raises(ConfigError, match="safeguards.campaign_time_s=1800"):
        load_config(["safeguards.final_share=0.2"])
    for bad in ("1.0", "-0.1"):
        with pytest.raises(ConfigError, match=r"must be in \[0, 1\)"):
            load_config(["safeguards.campaign_time_s=600", f"safeguards.final_share={bad}"])
    for plain_only in ("scheduler=pbt", "resources.workers_per_trial=2"):
        with pytest.raises(ConfigError, match="the final training runs one plain trial"):
            load_config(["safeguards.campaign_time_s=600", "safeguards.final_share=0.2", plain_only])
    cfg = load_config(["safeguards.campaign_time_s=600", "safeguards.final_share=0.25"])
    assert cfg.safeguards.search_time_s == 450.0
    assert cfg.safeguards.final_additions == []  # the default trains the pick's code as searched
    with pytest.raises(ConfigError, match=r"safeguards.final_additions=\[cosine,shift,flip\]") as caught:
        load_config(["safeguards.final_additions=[cosine,linear]"])
    assert "names 'linear': each must be one of cosine, one_cycle, shift, flip, deepen, flip_tta" in str(caught.value)
    for clash in ("[cosine,one_cycle]", "[shift,shift]"):
        with pytest.raises(ConfigError, match="each at most once, and one schedule at most"):
            load_config([f"safeguards.final_additions={clash}"])
    # measured on Fashion (README, Figures): shifts and flips +0.007 test on one seed, the layer +0.008 on two picks,
    # flips at test time +0.0036 on a third
    fashion = load_config(["+experiment=fashion"]).safeguards.final_additions
    assert fashion == ["cosine", "shift", "flip", "deepen", "flip_tta"]
    assert set(FINAL_ADDITIONS.values()) <= set(TRANSFORMS)  # every name is one of the offline agent's transforms
    assert cfg.safeguards.final_candidates == 1  # the default: the pick alone
    assert load_config(["+experiment=fashion"]).safeguards.final_candidates == 1  # measured: no gain from 2 there
    for bad in ("0", "3"):  # side by side, one slot's share each: at most search.max_concurrent (2 by default)
        with pytest.raises(ConfigError, match="safeguards.final_candidates=2") as caught:
            load_config([f"safeguards.final_candidates={bad}"])
        assert f"got {bad}" in str(caught.value)
    with pytest.raises(ConfigError, match="safeguards.final_candidates=1"):
        load_config(["safeguards.final_candidates=2", "search.max_concurrent=1"])
    assert load_config(["safeguards.campaign_time_s=600"]).safeguards.search_time_s == 600.0


def test_a_resume_takes_a_config_groups_choice_as_a_first_run_does(tmp_path: Path):
    """`resume=ID sandbox=none` stopped with "Merge error: str is not a subclass of SandboxConfig": the choice was
    set as the section's value instead of the group's file."""
    run_dir = tmp_path / "r"
    run_dir.mkdir()
    stored = load_config(["safeguards.max_cycles=3"])
    (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.structured(stored)))
    resumed = resume_config(run_dir, ["resume=r", "sandbox=none", "agent=none", "safeguards.max_cycles=5"])
    assert (resumed.sandbox.mode.value, resumed.agent.backend.value) == ("none", "none")
    assert resumed.safeguards.max_cycles == 5 and resumed.resume == "r"
    with pytest.raises(ConfigError, match="no option 'nope' in conf/sandbox/") as info:
        resume_config(run_dir, ["sandbox=nope"])
    assert "bwrap, none" in str(info.value)
    with pytest.raises(ConfigError, match="keeps its task"):
        resume_config(run_dir, ["task=diabetes"])


def test_a_resume_refuses_to_change_the_task_or_the_metric(tmp_path: Path):
    """User trial: `resume=R2 task.split_seed=1` started without a word, rewrote the run's frozen splits and scored
    its later cycles on another split than the first; task.subsample, search.metric and task.trainer went through too.
    """
    run_dir = tmp_path / "r"
    run_dir.mkdir()
    stored = load_config(["safeguards.max_cycles=3"])
    (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.structured(stored)))
    asked = ["task.split_seed=1", "task.subsample=500", "search.metric=val_loss", "task.trainer=trainers/fashion"]
    with pytest.raises(ConfigError, match="keeps its task and metric") as info:
        resume_config(run_dir, ["resume=r", "safeguards.max_cycles=5", *asked])
    said = str(info.value)
    assert "task.split_seed (stored 0, asked 1)" in said and "task.subsample (stored 0, asked 500)" in said
    assert "search.metric (stored 'val_acc', asked 'val_loss')" in said
    assert "task.trainer (stored 'trainers/digits', asked 'trainers/fashion')" in said
    assert "start a new campaign" in said and "resume without it" in said
    for one in ("search.mode=min", "task.selection_fraction=0.3"):
        with pytest.raises(ConfigError, match=one.split("=")[0].replace(".", r"\.")):
            resume_config(run_dir, [one])
    # the stored values again, budgets, the population's shape, an agent and a knob's bounds: all still go on
    same = ["task.split_seed=0", "search.metric=val_acc", "task.selection_fraction=0.2", "population.parents=1"]
    resumed = resume_config(run_dir, [*same, "safeguards.max_cycles=6", "agent=none", "search.space.LR.high=0.5"])
    assert (resumed.safeguards.max_cycles, resumed.population.parents, resumed.task.split_seed) == (6, 1, 0)
    assert resumed.search.space["LR"].high == 0.5


def test_a_resume_takes_the_same_task_folder_written_another_way(tmp_path: Path, monkeypatch):
    """Review: task.trainer is stored resolved, so `resume=R task.trainer=./mytask` (or mytask/, or a symlink to
    it) was refused as a change of task though it names the same folder. A different folder is still refused."""
    mytask = tmp_path / "mytask"
    shutil.copytree(PROJECT_ROOT / "trainers" / "digits", mytask)
    (tmp_path / "link").symlink_to(mytask)
    run_dir = tmp_path / "r"
    run_dir.mkdir()
    stored = load_config([f"task={mytask}"])
    assert stored.task.trainer == str(mytask.resolve())
    (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.structured(stored)))
    monkeypatch.chdir(tmp_path)
    for same in ("./mytask", "mytask/", "link", f"{mytask}/"):
        resumed = resume_config(run_dir, ["resume=r", f"task.trainer={same}"])
        assert resumed.task.trainer == str(mytask.resolve()) and resumed.trainer_dir() == mytask.resolve(), same
    with pytest.raises(ConfigError, match="task.trainer"):
        resume_config(run_dir, ["resume=r", "task.trainer=trainers/digits"])
    # task= naming the same folder is the run's own too; another task's is refused
    assert resume_config(run_dir, ["task=./mytask"]).trainer_dir() == mytask.resolve()
    with pytest.raises(ConfigError, match=f"task=digits is the task in {PROJECT_ROOT / 'trainers' / 'digits'}"):
        resume_config(run_dir, ["task=digits"])


def test_knob_search_without_a_knob_to_search_is_refused():
    """User trial: `space: {}` in task.yaml with agent=none ran 111 trials in 60 s, each the seed's same run."""
    with pytest.raises(ConfigError, match="is empty and agent=none") as info:
        load_config(["agent=none", "~search.space"])
    assert "fix: name the knobs to search in the task's task.yaml" in str(info.value)
    assert load_config(["~search.space"]).search.space == {}  # an agent still has the code to change


def test_a_time_budget_over_a_trainer_that_reads_none_is_warned_of(tmp_path: Path):
    """User trial: `trial.budget_s=5` over a `for epoch in range(EPOCHS)` trainer ran every epoch, and nothing said the
    budget was not read; the shipped seed loops over harness.epochs and gets no warning."""
    from taskdirs import digits_task

    seed = (PROJECT_ROOT / "trainers" / "digits" / "train.py").read_text()
    assert "harness.epochs(" in seed
    assert budget_unread(load_config(["trial.budget_s=5"])) is None
    assert budget_unread(load_config([])) is None  # no budget, nothing to read
    fixed = digits_task(tmp_path / "fixed", seed.replace("harness.epochs(EPOCHS)", "range(1, EPOCHS + 1)"))
    assert "epochs(" not in (fixed / "train.py").read_text()
    warning = budget_unread(load_config([f"task.trainer={fixed}", "trial.budget_s=5"]))
    assert warning is not None and "reads no budget" in warning and "harness.epochs(EPOCHS)" in warning


def test_a_negative_target_for_a_min_metric_that_is_never_negative_exits_2_naming_the_fix(tmp_path: Path):
    """User trial: after seeing an MSE shown as -0.0477 everywhere, `target.selection_score=-0.03` was accepted, and
    the engine's target became +0.03, which no MSE's oriented score (-value <= 0) can reach."""
    assert load_config(["task=diabetes", "target.selection_score=3000"]).target_score() == -3000  # its own units
    for task in ("task=diabetes", "task=lm"):  # built-in mse; lm's own bits_per_byte
        with pytest.raises(ConfigError, match=r"never negative.*\n  fix: set target.selection_score=0.03 "):
            load_config([task, "target.selection_score=-0.03"])
    folder = shutil.copytree(PROJECT_ROOT / "trainers" / "diabetes", tmp_path / "mine")
    prepare = folder / "prepare.py"
    source = (
        prepare.read_text()
        + "\n\ndef score(predictions, targets):\n    return float(((predictions - targets) ** 2).mean())\n"
    )
    # a user's own metric: by the words of its name (review: log_mse, mse_delta, nll_loss may well be negative)
    named = (("recon_mse", True), ("margin", False), ("log_mse", False), ("mse_delta", False), ("nll_loss", False))
    for name, refused in named:
        prepare.write_text(source.replace('"name": "mse"', f'"name": "{name}"'))
        if refused:
            with pytest.raises(ConfigError, match="recon_mse is never negative"):
                load_config([f"task={folder}", "target.selection_score=-0.03"])
        else:  # a metric that may be negative: taken as given
            assert load_config([f"task={folder}", "target.selection_score=-0.03"]).target_score() == 0.03
    result = _cli(tmp_path, "task=diabetes", "target.selection_score=-0.03")
    assert result.returncode == 2 and "set target.selection_score=0.03" in result.stderr


def _cli(cwd: Path, *overrides: str) -> subprocess.CompletedProcess:
    """`python -m ralph_ray OVERRIDES` run from `cwd` as a user would (no Ray address inherited)."""
    env = {**os.environ, "RAY_ADDRESS": ""}
    command = [sys.executable, "-m", "ralph_ray", *overrides]
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, env=env, timeout=120)


def test_a_final_training_over_a_trainer_that_reads_no_budget_is_warned_of(tmp_path: Path):
    """User trial: safeguards.final_share over a `range(EPOCHS)` trainer trained the final exactly as long as the
    search's trials, and nothing said so."""
    from taskdirs import digits_task

    final = ["safeguards.campaign_time_s=600", "safeguards.final_share=0.25"]
    assert final_unread(load_config(final)) is None  # the shipped seed loops over harness.epochs
    assert final_unread(load_config([])) is None  # no final training
    seed = (PROJECT_ROOT / "trainers" / "digits" / "train.py").read_text()
    fixed = digits_task(tmp_path / "fixed", seed.replace("harness.epochs(EPOCHS)", "range(1, EPOCHS + 1)"))
    assert final_unread(load_config([f"task.trainer={fixed}"])) is None
    warning = final_unread(load_config([f"task.trainer={fixed}", *final]))
    assert warning is not None and "final_share=0.25" in warning and "runs its own EPOCHS" in warning


def test_a_schedule_sized_from_epochs_under_a_time_budget_is_warned_of(tmp_path: Path):
    """User trial (ut_dataclass): a LambdaLR warmup-then-linear-decay over `EPOCHS * steps` trained 10 of its final's
    19 epochs at lr 0 under safeguards.final_share, and its 4-s trial.budget_s trials never annealed: no warning, as
    the trainer read a budget (harness.epochs). One over harness.lr_factor follows the budget and is not warned of."""
    from taskdirs import digits_task

    seed = (PROJECT_ROOT / "trainers" / "digits" / "train.py").read_text()
    built = "    first_epoch = resume(model, optimizer)\n"
    assert built in seed and "step()" in seed
    own = digits_task(
        tmp_path / "own",
        seed.replace(
            built,
            built + "    total = EPOCHS * 10\n    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: "
            "min((s + 1) / (0.1 * total), max(0.0, (total - s) / (0.9 * total))))\n",
        ),
    )
    timed = digits_task(
        tmp_path / "timed",
        seed.replace(
            built,
            built
            + "    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda e: harness.lr_factor(e, EPOCHS, "
            '"cosine"))\n',
        ),
    )
    budget, final = ["trial.budget_s=4"], ["safeguards.campaign_time_s=600", "safeguards.final_share=0.4"]
    for overrides in (budget, final):
        warning = schedule_unsized(load_config([f"task.trainer={own}", *overrides]))
        assert warning is not None and "LambdaLR (train.py:" in warning and "harness.lr_factor(epoch" in warning
        assert overrides[-1] in warning
        assert schedule_unsized(load_config([f"task.trainer={timed}", *overrides])) is None
        assert schedule_unsized(load_config(overrides)) is None  # the shipped seed builds no scheduler
    assert schedule_unsized(load_config([f"task.trainer={own}"])) is None  # no budget: EPOCHS is what runs
    # a trainer that reads no budget runs its EPOCHS (budget_unread says so): its schedule fits them
    plain = digits_task(
        tmp_path / "plain", (own / "train.py").read_text().replace("harness.epochs(EPOCHS)", "range(1, EPOCHS + 1)")
    )
    assert schedule_unsized(load_config([f"task.trainer={plain}", *budget])) is None
    # what is sized by a count, and what is not: a warmup LinearLR rises, then holds; MultiStepLR keeps its last lr
    for name, scheduler, sized in (
        ("warmup", "LinearLR(optimizer, start_factor=0.1, total_iters=5)", False),
        ("held", "LinearLR(optimizer, 0.1, 1.0, 5)", False),
        ("decay", "LinearLR(optimizer, start_factor=1.0, end_factor=0.0, total_iters=EPOCHS)", True),
        ("steps", "MultiStepLR(optimizer, milestones=[EPOCHS // 2])", False),
        ("onecycle", "OneCycleLR(optimizer, max_lr=LR, total_steps=EPOCHS * 10)", True),
    ):
        made = digits_task(
            tmp_path / name, seed.replace(built, built + f"    schedule = torch.optim.lr_scheduler.{scheduler}\n")
        )
        warning = schedule_unsized(load_config([f"task.trainer={made}", *budget]))
        assert (warning is not None) is sized, (name, warning)
        assert warning is None or "sized by a step or epoch count" in warning and "lr 0 for the rest" not in warning
    # transformers' usual entry point, by name: a cosine over num_training_steps is sized, a constant one is not
    for name, kind, sized in (("hfcosine", '"cosine"', True), ("hfconstant", 'name="constant_with_warmup"', False)):
        made = digits_task(
            tmp_path / name,
            seed.replace(
                built,
                built + f"    schedule = transformers.get_scheduler({kind}, optimizer=optimizer, num_warmup_steps=10, "
                "num_training_steps=EPOCHS * 10)\n",
            ),
        )
        warning = schedule_unsized(load_config([f"task.trainer={made}", *budget]))
        assert (warning is not None) is sized and (warning is None or "get_scheduler (train.py:" in warning), warning


def test_a_knob_field_set_again_to_a_literal_is_warned_of(tmp_path: Path):
    """User trial (ut_dataclass): `lr: float = LR`, then `dataclasses.replace(TrainConfig(), **{"lr": 1e-3})` passed
    the unread-knob check (LR is read), and every trial would train lr=1e-3 while the KB recorded sampled LRs."""
    from taskdirs import digits_task

    seed = (PROJECT_ROOT / "trainers" / "digits" / "train.py").read_text()
    config = (
        "import dataclasses\nfrom dataclasses import replace\n\n\n@dataclasses.dataclass\nclass TrainConfig:\n"
        "    lr: float = LR\n    seed: int = 0\n\n\ndef resume("
    )
    assert seed.count("def resume(") == 1 and seed.count("SGD(model.parameters(), lr=LR") == 1

    def trainer(name: str, built: str) -> str | None:
        source = seed.replace("def resume(", config).replace(
            "SGD(model.parameters(), lr=LR", "SGD(model.parameters(), lr=cfg.lr"
        )
        source = source.replace("def main() -> None:\n", f"def main() -> None:\n    cfg = {built}\n")
        return knob_overridden(load_config([f"task.trainer={digits_task(tmp_path / name, source)}"]))

    for name, built in (
        ("dict", 'dataclasses.replace(TrainConfig(), seed=harness.seed(), **{"lr": 1e-3})'),
        ("keyword", "TrainConfig(lr=0.001)"),
        ("imported", "replace(TrainConfig(), lr=1e-3)"),
    ):
        warning = trainer(name, built)
        assert warning is not None and "LR (lr=0.001 at train.py:" in warning, (name, warning)
        assert "fix: leave the field to its knob default" in warning
    for name, built in (
        ("knob", "TrainConfig(lr=LR)"),
        ("seed", "dataclasses.replace(TrainConfig(), seed=1)"),  # a field that reads no knob
        ("other", "TrainConfig()._replace(lr=1e-3) if False else TrainConfig()"),  # not dataclasses.replace
    ):
        assert trainer(name, built) is None, name
    assert knob_overridden(load_config([])) is None  # the shipped seed


# A user's own argparse trainer as it came (user trial ut_argparse): its own data, no harness call at all.
OWN_TRAINER = """\
import argparse
import torch
from sklearn.datasets import load_digits

LR = 1e-3


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--lr", type=float, default={lr})
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    x, y = load_digits(return_X_y=True)
    model = torch.nn.Linear(64, 10)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    {report}


if __name__ == "__main__":
    main()
"""


def test_a_seed_that_never_calls_the_harness_exits_2_before_ray_starts(tmp_path: Path):
    """User trial: a trainer calling no harness function started Ray, ran five failing trials and exited 4 after 53 s
    (the gate's check of the harness calls ran for children only), and one without save_predictions trained in full
    before failing."""
    from taskdirs import digits_task

    bare = digits_task(tmp_path / "bare", OWN_TRAINER.format(lr="LR", report="print(model)"))
    space = ["~search.space.BATCH_SIZE", "~search.space.WIDTH"]  # LR is its one knob
    with pytest.raises(ConfigError, match="config error at `task.trainer`") as info:
        load_config([f"task.trainer={bare}", *space])
    said = str(info.value)
    assert "never calls harness.load_data, harness.report, harness.save_predictions" in said
    assert "fix: adapt train.py first (README, Add your own task, step 3)" in said
    # Before the knobs' check: a seed without knobs or harness is told to adapt train.py, not to drop its knobs
    with pytest.raises(ConfigError, match="never calls harness.load_data"):
        load_config([f"task.trainer={bare}"])
    half = OWN_TRAINER.format(lr="LR", report="harness.report(epoch=1, val_acc=0.5)").replace(
        "x, y = load_digits(return_X_y=True)", "data = harness.load_data()"
    )
    half = "from ralph_ray import harness\n" + half
    partial = digits_task(tmp_path / "partial", half)
    with pytest.raises(ConfigError, match=r"never calls harness.save_predictions \(") as info:
        load_config([f"task.trainer={partial}", *space])
    assert "call `harness.save_predictions(selection=..., test=...)` at the end" in str(info.value)
    # The calls may live in another file of the seed (a models.py or loop.py it imports)
    (partial / "finish.py").write_text(
        "from ralph_ray import harness\n\ndef finish(s, t):\n    harness.save_predictions(selection=s, test=t)\n"
    )
    assert load_config([f"task.trainer={partial}", *space]).search.space.keys() == {"LR"}
    # However the harness is imported (a reviewer: these seeds ran, and were refused as never calling it)
    (partial / "finish.py").unlink()
    for imports, call in (
        ("from ralph_ray.harness import save_predictions as save", "save"),
        ("import ralph_ray.harness as h", "h.save_predictions"),
        ("import ralph_ray.harness", "ralph_ray.harness.save_predictions"),
    ):
        aliased = half.replace("import torch", f"import torch\n{imports}", 1) + f"\n{call}(selection=None, test=None)\n"
        (partial / "train.py").write_text(aliased)
        assert load_config([f"task.trainer={partial}", *space]).search.space.keys() == {"LR"}, imports
    result = _cli(tmp_path, f"task={bare}", *space)
    assert result.returncode == 2 and "never calls harness.load_data" in result.stderr
    assert not (tmp_path / "runs").exists()  # refused before a run folder, or Ray, was started


def test_a_searched_knob_the_trainer_never_reads_exits_2_naming_it(tmp_path: Path):
    """User trial: `LR = 1e-3` added beside argparse's unchanged `default=1e-3` was searched with no warning, and the KB
    recorded LR=0.0064 for a trial that trained at 1e-3."""
    from taskdirs import digits_task

    seed = (PROJECT_ROOT / "trainers" / "digits" / "train.py").read_text()
    assert seed.count("lr=LR") == 2
    forgot = digits_task(tmp_path / "forgot", seed.replace("lr=LR", "lr=0.05"))
    with pytest.raises(ConfigError, match="config error at `search.space`") as info:
        load_config([f"task.trainer={forgot}"])
    said = str(info.value)
    assert f"names LR, which {forgot / 'train.py'} sets but never reads" in said
    assert "default=LR" in said and "~search.space.LR" in said and "WIDTH" not in said.split("fix:")[0]
    assert load_config([f"task.trainer={forgot}", "~search.space.LR"]).search.space.keys() == {"BATCH_SIZE", "WIDTH"}
    # Read from another file of the seed (`from train import LR`, `cfg.LR`): read
    (forgot / "opt.py").write_text("import train\n\ndef lr():\n    return train.LR\n")
    assert "LR" in load_config([f"task.trainer={forgot}"]).search.space
    (forgot / "opt.py").unlink()
    # A trainer that reads its namespace whole (nanoGPT's config dump) is taken at its word
    digits_task(forgot, seed.replace("lr=LR", "lr=globals()['LR']"))
    assert "LR" in load_config([f"task.trainer={forgot}"]).search.space
    # The argparse trainer wired as the README says: default=LR
    wired = OWN_TRAINER.format(lr="LR", report="harness.report(epoch=1, val_acc=0.5)")
    wired = "from ralph_ray import harness\n" + wired.replace(
        "x, y = load_digits(return_X_y=True)",
        "data = harness.load_data()\n    harness.save_predictions(selection=[], test=[])",
    )
    mine = digits_task(tmp_path / "argparse", wired)
    only_lr = ["~search.space.BATCH_SIZE", "~search.space.WIDTH"]
    assert load_config([f"task.trainer={mine}", *only_lr]).search.space.keys() == {"LR"}
    digits_task(mine, wired.replace("default=LR", "default=1e-3"))
    with pytest.raises(ConfigError, match="names LR, which .* sets but never reads"):
        load_config([f"task.trainer={mine}", *only_lr])


def test_the_kb_defaults_to_ralph_kb_as_the_cli_and_the_app_read_it(monkeypatch: pytest.MonkeyPatch):
    """Review: `status`/`report` and the app read $RALPH_KB, but a campaign wrote ./kb, so the CLI read another KB
    and printed a resume into it."""
    monkeypatch.delenv("RALPH_KB", raising=False)
    assert load_config([]).paths.kb == "kb"
    monkeypatch.setenv("RALPH_KB", "/data/team-kb")
    assert load_config([]).paths.kb == "/data/team-kb"
    assert load_config(["paths.kb=mine"]).paths.kb == "mine"  # an explicit override wins


def test_overrides_apply_in_order_over_a_task_folders_yaml():
    """A deletion after an addition (`+search.space.EPOCHS=... ~search.space.EPOCHS`, a test's shared list then its
    own change) was undone: with a task folder the overrides were applied again, deletions first."""
    folder = "task.trainer=trainers/digits"
    added = "+search.space.EPOCHS={type: choice, values: [2]}"
    assert "EPOCHS" in load_config([folder, added]).search.space
    assert sorted(load_config([folder, added, "~search.space.EPOCHS"]).search.space) == ["BATCH_SIZE", "LR", "WIDTH"]
    replaced = load_config([folder, "~search.space", "+search.space={LR: {type: choice, values: [0.1]}}"])
    assert sorted(replaced.search.space) == ["LR"]  # the task's space replaced, as in Hydra


SHIPPED_TASKS = [
    ["task=digits"],
    ["+experiment=cifar10", "data.root=/nonexistent/cifar10"],  # the config only: nothing is read
    ["+experiment=fashion"],
    ["task=diabetes"],
    ["task=lm"],
    ["task=grpo"],
    ["task=kto"],
]


@pytest.mark.parametrize("task", SHIPPED_TASKS, ids=lambda t: t[0])
@pytest.mark.parametrize(
    "budget",
    [[], ["trial.budget_s=10"], ["safeguards.campaign_time_s=600", "safeguards.final_share=0.2"]],
    ids=["epochs", "trial_budget", "final_share"],
)
def test_the_shipped_tasks_start_without_a_warning(task: list[str], budget: list[str]):
    """A start-up warning on a shipped seed teaches users to skip warnings (review: the CIFAR seed's WEIGHT_DECAY
    0.0153 sat outside its space [0.002, 0.01], so every cifar10 campaign warned that its own trial trains another)."""
    cfg = load_config([*task, *budget])
    checks = (seed_off_space, budget_unread, final_unread, schedule_unsized, knob_overridden)
    assert [check(cfg) for check in checks] == [None] * len(checks)


# A trainer that reads its own config file beside train.py (user trials ut_yaml): CFG is that file's keys.
YAML_READER = (
    "import yaml\nfrom pathlib import Path\n\n"
    'CFG = yaml.safe_load((Path(__file__).parent / "config.yaml").read_text())\n'
)


SHIPS_CONFIG = "task.trainer_files=[**/*.py,**/*.md,config.yaml]"  # the trials get config.yaml too


def _digits_seed() -> str:
    """The shipped digits seed's source, with the lines these tests edit checked to be there once."""
    seed = (PROJECT_ROOT / "trainers" / "digits" / "train.py").read_text()
    assert seed.count("\nfrom ralph_ray import harness\n") == 1 and seed.count("model = Net(WIDTH,") == 1
    assert seed.count("WIDTH = 16  #") == 1
    return seed


def test_a_knob_read_only_as_the_fallback_of_a_config_files_key_is_warned_of(tmp_path: Path):
    """User trial: `HIDDEN = 64`, then `hidden = CFG.get("hidden", HIDDEN)` with config.yaml setting hidden: the search
    set HIDDEN, every trial trained config.yaml's value, and nothing said so."""
    from taskdirs import digits_task

    harness_import = "\nfrom ralph_ray import harness\n"
    source = (
        _digits_seed()
        .replace(harness_import, harness_import + YAML_READER)
        .replace("model = Net(WIDTH,", 'width = CFG.get("width", WIDTH)\n    model = Net(width,')
    )
    folder = digits_task(tmp_path / "mine", source)
    (folder / "config.yaml").write_text("epochs: 3\nwidth: 32\n")
    line = source.splitlines().index('    width = CFG.get("width", WIDTH)') + 1
    # left out of task.trainer_files (the default), config.yaml never reaches a trial: that is what is said
    warning = knob_overridden(load_config([f"task={folder}"]))
    assert warning is not None and "train.py reads config.yaml, which is not among task.trainer_files" in warning
    assert "only as the fallback" not in warning
    warning = knob_overridden(load_config([f"task={folder}", SHIPS_CONFIG]))
    assert warning is not None, "WIDTH is searched, but config.yaml's width is what trains"
    assert f"WIDTH (train.py:{line}: `CFG.get('width', WIDTH)`, and config.yaml sets width: 32)" in warning
    assert "fix: use the constant directly (`width = WIDTH`), or remove `width` from config.yaml" in warning
    # config.yaml without the key: the fallback, the knob, is what trains
    (folder / "config.yaml").write_text("epochs: 3\n")
    assert knob_overridden(load_config([f"task={folder}", SHIPS_CONFIG])) is None
    # the same through getattr and a nested key of the file
    (folder / "config.yaml").write_text("model:\n  width: 32\n")
    digits_task(folder, source.replace('CFG.get("width", WIDTH)', 'getattr(CFG, "width", WIDTH)'))
    warning = knob_overridden(load_config([f"task={folder}", SHIPS_CONFIG]))
    assert warning is not None and "config.yaml sets model.width: 32" in warning
    # the knob itself assigned again from the file, at module level
    again = _digits_seed().replace(harness_import, harness_import + YAML_READER)
    again = again.replace("WIDTH = 16  #", 'WIDTH = 16\nWIDTH = CFG.get("width", WIDTH)  #')
    digits_task(folder, again)
    warning = knob_overridden(load_config([f"task={folder}", SHIPS_CONFIG]))
    assert warning is not None and "drop `WIDTH = CFG.get('width', WIDTH)`: the constant is the value" in warning


def test_a_searched_knob_whose_value_is_not_a_literal_is_named_so_with_the_fix(tmp_path: Path):
    """User trial: `HIDDEN = CFG["hidden"]` with HIDDEN searched was told "train.py does not define HIDDEN": it does,
    but the search can set only a literal."""
    from taskdirs import digits_task

    harness_import = "\nfrom ralph_ray import harness\n"
    seed = _digits_seed().replace(harness_import, harness_import + YAML_READER)
    folder = digits_task(tmp_path / "mine", seed.replace("WIDTH = 16  #", 'WIDTH = CFG["width"]  #'))
    (folder / "config.yaml").write_text("width: 24\n")
    line = (
        folder.joinpath("train.py")
        .read_text()
        .splitlines()
        .index('WIDTH = CFG["width"]  # channels of the first conv layer')
        + 1
    )
    with pytest.raises(ConfigError, match="config error at `search.space.WIDTH`") as info:
        load_config([f"task={folder}"])
    said = str(info.value)
    assert "does not define" not in said
    assert f"train.py:{line} sets WIDTH = CFG['width'], which is not a literal" in said
    assert "its value comes from config.yaml (width: 24)" in said
    assert "fix: move it into train.py as a literal: write `WIDTH = 24` in train.py; the search sets it" in said
    assert "remove `width` from config.yaml" in said
    assert "config.yaml is not among task.trainer_files, so where train.py still reads it every trial" in said
    assert 'task: {trainer_files: ["**/*.py", "**/*.md", "config.yaml"]}' in said
    with pytest.raises(ConfigError) as info:  # shipped: nothing to add
        load_config([f"task={folder}", SHIPS_CONFIG])
    assert "its value comes from config.yaml" in str(info.value) and "not among" not in str(info.value)
    # computed in train.py: an example from the space
    digits_task(folder, seed.replace("WIDTH = 16  #", 'WIDTH = int("16")  #'))
    with pytest.raises(ConfigError, match=r"sets WIDTH = int\('16'\), which is not a literal") as info:
        load_config([f"task={folder}"])
    assert "fix: write `WIDTH = 8` in train.py; the search sets it" in str(info.value)
    # still exit 2, before Ray starts
    result = _cli(tmp_path, f"task={folder}")
    assert result.returncode == 2 and "which is not a literal" in result.stderr
    assert not (tmp_path / "runs").exists()


def test_a_knob_given_on_the_command_line_is_told_where_knobs_are_set(tmp_path: Path):
    """User trial: `python -m ralph_ray ... COMPILE=true` got Hydra's "Could not override 'COMPILE'" and "did you
    mean `experiment` or `run_id`?"."""
    with pytest.raises(ConfigError, match="config error at `COMPILE`") as info:
        load_config(["task=digits", "COMPILE=true"])
    said = str(info.value)
    assert "COMPILE is a knob, an UPPER_CASE constant of train.py, not a config key" in said
    assert "set it in train.py (`COMPILE = True`)" in said
    assert "python -m ralph_ray task=digits 'search.space.COMPILE={type: choice, values: [true]}'" in said
    with pytest.raises(ConfigError, match="set it in train.py \\(`LR = 0.1`\\)") as info:
        load_config(["+LR=0.1", "search.num_samples=2"])
    assert "python -m ralph_ray search.num_samples=2 'search.space.LR={type: choice, values: [0.1]}'" in str(info.value)
    # the command it names runs: every trial trains LR 0.1
    space = load_config(["search.num_samples=2", "search.space.LR={type: choice, values: [0.1]}"]).search.space
    assert space["LR"].type is SpaceKind.choice and space["LR"].values == [0.1]
    # a resume says the same
    (tmp_path / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.structured(load_config([]))))
    with pytest.raises(ConfigError, match="COMPILE is a knob"):
        resume_config(tmp_path, ["COMPILE=true"])


def test_a_space_written_without_spaces_after_its_colons_is_read_as_hydra_reads_it(tmp_path: Path):
    """User trial: `+search.space.X={type:choice,values:[a,b]}` (no space after the colons, which Hydra reads as a
    dict) was read again as YAML, where `type:choice` is one key: "Key 'type:choice' not in 'KnobSpace'"."""
    for override in ("+search.space.WIDTH={type:choice,values:[8,16]}", "search.space.WIDTH={type:choice,values:[8]}"):
        space = load_config([override]).search.space["WIDTH"]
        assert space.type is SpaceKind.choice and space.values == [8, 16][: len(space.values)], override
    (tmp_path / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.structured(load_config([]))))
    resumed = resume_config(tmp_path, ["search.space.LR={type:loguniform,low:0.01,high:0.1}"]).search.space["LR"]
    assert (resumed.low, resumed.high) == (0.01, 0.1)
    # unquoted, the shell splits it at its spaces: say to quote it, with the override whole
    with pytest.raises(ConfigError, match="config error at `search.space.WIDTH`") as info:
        load_config(["+search.space.WIDTH={type:", "choice,", "values:", "[8,", "16]}", "search.num_samples=2"])
    said = str(info.value)
    assert "hydra.cc" not in said.split("fix:")[0]
    assert (
        "fix: quote it whole, with a space after each colon: '+search.space.WIDTH={type: choice, values: [8, 16]}'"
        in said
    )
    # a value Hydra's grammar cannot read at all is named by its override, not by a hydra.cc link
    with pytest.raises(ConfigError, match="config error at `search.space.WIDTH`: Hydra cannot read") as info:
        load_config(["+search.space.WIDTH={type:choice values:[8,16]}"])
    assert "a space after each colon and comma ('+search.space.X={type: choice, values: [a, b]}')" in str(info.value)


def test_a_task_folder_under_home_or_with_odd_characters_is_no_hydra_grammar_error(tmp_path: Path, monkeypatch):
    """Review: the override-syntax check ran Hydra's grammar over `task=~/mytask` (zsh leaves the `~`), which
    `_task_path` expands and Hydra never sees: "token recognition error at '~'" instead of the folder's own message."""
    monkeypatch.setenv("HOME", str(tmp_path))
    for value in ("~/no_such_task", "~/odd (copy) #2"):
        with pytest.raises(ConfigError) as info:
            load_config([f"task={value}"])
        said = str(info.value)
        assert "Hydra cannot read" not in said and str(tmp_path) in said, said


def test_a_resume_keeps_the_search_spaces_knobs_and_takes_its_own_task_and_search_again(tmp_path: Path, capsys):
    """User trial: on a resume `~search.space.WIDTH` failed with "Key '~search' not in 'Config' ... did you mean
    `search`?", `+search.space.MOMENTUM={...}` was taken without a word (the README keeps the run's search space), and
    `search=digits`, the run's own search space, was refused as a change of it."""
    from ralph_ray.__main__ import main

    run_dir = tmp_path / "r"
    run_dir.mkdir()
    stored = load_config(["safeguards.max_cycles=3"])
    (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.structured(stored)))
    for asked in (
        ["~search.space.WIDTH"],
        ["+search.space.MOMENTUM={type: uniform, low: 0.5, high: 0.99}"],
        ["search.space.MOMENTUM.low=0.5"],
        ["~search.space"],
    ):
        with pytest.raises(ConfigError, match="a resume keeps the search space's knobs") as info:
            resume_config(run_dir, ["resume=r", "safeguards.max_cycles=5", *asked])
        said = str(info.value)
        assert "(LR, BATCH_SIZE, WIDTH)" in said and "did you mean" not in said, asked
        assert "it may change a knob's bounds: search.space.LR.high=" in said
        assert "to add or remove a knob start a new campaign" in said
    removed = str(pytest.raises(ConfigError, resume_config, run_dir, ["~search.space.WIDTH"]).value)
    assert "removes WIDTH" in removed
    added = str(pytest.raises(ConfigError, resume_config, run_dir, ["+search.space.MOMENTUM={type: uniform}"]).value)
    assert "adds MOMENTUM" in added
    # the command line says the same, exit 2
    assert main(["resume=r", f"paths.runs={tmp_path}", "~search.space.WIDTH"]) == 2
    assert "a resume keeps the search space's knobs" in capsys.readouterr().err
    # a knob defined again with other bounds keeps the knobs: open to a resume
    again = resume_config(run_dir, ["~search.space.WIDTH", "+search.space.WIDTH={type: choice, values: [8, 16]}"])
    assert again.search.space["WIDTH"].values == [8, 16] and list(again.search.space) == ["LR", "BATCH_SIZE", "WIDTH"]
    # the run's own task and search space, named again, change nothing (README: the stored value is fine)
    plain = resume_config(run_dir, ["resume=r"])
    assert resume_config(run_dir, ["resume=r", "search=digits", "task=digits"]) == plain
    narrowed = resume_config(run_dir, ["search=digits", "search.space.LR.high=0.1"])
    assert (
        narrowed.search.space["LR"].high == 0.1
        and narrowed.search == resume_config(run_dir, ["search.space.LR.high=0.1"]).search
    )
    # another search group is refused, naming the run's own (search.group), even where the task's task.yaml would
    # give it the run's knobs and ranking (it was taken: a resume's search= changes nothing, so it can only mislead)
    with pytest.raises(ConfigError, match="this run's search group is digits"):
        resume_config(run_dir, ["search=cifar10", f"task={PROJECT_ROOT / 'trainers' / 'digits'}"])
    # another one is still refused, naming what differs
    with pytest.raises(ConfigError, match="keeps its task and search space"):
        resume_config(run_dir, ["task=diabetes"])
    wider = tmp_path / "wider"
    wider.mkdir()
    epochs = load_config(["+search.space.EPOCHS={type: choice, values: [2]}"])
    (wider / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.structured(epochs)))
    # search=digits ranks as the run does: its own, the run's EPOCHS kept (the knobs are the final config's)
    assert list(resume_config(wider, ["search=digits"]).search.space) == ["LR", "BATCH_SIZE", "WIDTH", "EPOCHS"]
    # its own group with another ranking: the ranking is what a resume keeps (FROZEN_ON_RESUME)
    with pytest.raises(ConfigError, match="keeps its task and metric") as info:
        resume_config(wider, ["search=digits", "search.metric=val_loss", "search.mode=min"])
    said = str(info.value)
    assert "search.metric (stored 'val_acc', asked 'val_loss')" in said and "resume without it" in said


def _yaml_fallback_task(folder: Path) -> tuple[Path, int]:
    """A digits task whose train.py reads config.yaml and WIDTH only as the fallback of its `width`; (folder, line)."""
    from taskdirs import digits_task

    harness_import = "\nfrom ralph_ray import harness\n"
    source = (
        _digits_seed()
        .replace(harness_import, harness_import + YAML_READER)
        .replace("model = Net(WIDTH,", 'width = CFG.get("width", WIDTH)\n    model = Net(width,')
    )
    digits_task(folder, source)
    (folder / "config.yaml").write_text("epochs: 3\nwidth: 32\n")
    return folder, source.splitlines().index('    width = CFG.get("width", WIDTH)') + 1


def test_a_config_file_that_task_trainer_files_leave_out_is_named_with_the_line_that_ships_it(tmp_path: Path):
    """Review: the fallback-knob warning read config.yaml from the task folder, but trials get only
    task.trainer_files (`**/*.py`, `**/*.md` by default): config.yaml never reached them, every trial's train.py
    would fail to open it, and "every trial trains the file's value" was false. Only shipped config files count
    for that warning; one that is left out is named with the task.trainer_files line that ships it."""
    from ralph_ray.config import _seed_code
    from ralph_ray.seedcheck import fallback_knobs, unshipped_config

    folder, line = _yaml_fallback_task(tmp_path / "mine")
    cfg = load_config([f"task={folder}"])
    code, space, patterns = _seed_code(cfg), list(cfg.search.space), cfg.task.trainer_files
    assert fallback_knobs(code, space, folder, patterns) == [], "config.yaml never reaches a trial"
    warning = unshipped_config(code, folder, patterns)
    assert warning is not None
    assert "train.py reads config.yaml, which is not among task.trainer_files ['**/*.py', '**/*.md']" in warning
    assert "every trial would fail to find it" in warning
    assert 'task: {trainer_files: ["**/*.py", "**/*.md", "config.yaml"]}' in warning
    assert "'task.trainer_files=[**/*.py,**/*.md,config.yaml]'" in warning
    # the line it gives ships the file: no warning of it, and the fallback warning is true again
    shipped = load_config([f"task={folder}", "task.trainer_files=[**/*.py,**/*.md,config.yaml]"])
    patterns = shipped.task.trainer_files
    assert unshipped_config(_seed_code(shipped), folder, patterns) is None
    found = fallback_knobs(_seed_code(shipped), space, folder, patterns)
    assert [text for text, _ in found] == [
        f"WIDTH (train.py:{line}: `CFG.get('width', WIDTH)`, and config.yaml sets width: 32)"
    ]
    # a config file one folder down is named by its path
    (folder / "configs").mkdir()
    (folder / "config.yaml").rename(folder / "configs" / "config.yaml")
    train = folder / "train.py"
    train.write_text(train.read_text().replace('/ "config.yaml"', '/ "configs" / "config.yaml"'))
    warning = unshipped_config(_seed_code(shipped), folder, patterns)
    assert warning is not None and "train.py reads configs/config.yaml, which is not among" in warning
    assert '"config.yaml", "configs/config.yaml"]}' in warning
    # a task without a config file its code names: nothing to say
    (folder / "configs" / "config.yaml").unlink()
    assert unshipped_config(_seed_code(shipped), folder, patterns) is None


def test_a_resume_given_its_first_runs_arguments_again_is_taken(tmp_path: Path):
    """Review: a resume's `search=X` was compared by composing the search group and task.yaml only, while the first
    run also applied the command line's `+`/`~search.space` and `search.*` overrides: a first run `search=digits
    ~search.space.WIDTH` refused its own resume given the same arguments. `search=` now decides only what a resume
    freezes besides the knobs (metric and mode, composed as the first run composed them); the knobs are the final
    config's to check."""
    from ralph_ray.__main__ import main

    firsts = (
        ["search=digits", "~search.space.WIDTH"],
        ["search=digits", "+search.space.EPOCHS={type: choice, values: [2]}"],
        ["search=digits", "search.metric=val_loss", "search.mode=min"],
    )
    for at, first in enumerate(firsts):
        run_dir = tmp_path / f"r{at}"
        run_dir.mkdir()
        stored = load_config(first)
        (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.structured(stored)))
        resumed = resume_config(run_dir, [f"resume=r{at}", *first])
        assert resumed.search == stored.search, first
        assert main([f"resume=r{at}", f"paths.runs={tmp_path}", *first, "--cfg"]) == 0, first
    # search=digits alone is r2's own group (its ranking was the command line's): taken; another group is refused,
    # naming the run's; the knobs a resume keeps are the final config's to check
    assert resume_config(tmp_path / "r2", ["search=digits"]).search == resume_config(tmp_path / "r2").search
    with pytest.raises(ConfigError, match="keeps its search space and ranking") as info:
        resume_config(tmp_path / "r2", ["search=cifar10"])
    said = str(info.value)
    assert "search=cifar10, and this run's search group is digits (ranked by val_loss (min))" in said, said
    with pytest.raises(ConfigError, match="this resume adds WIDTH"):
        resume_config(tmp_path / "r0", ["search=digits", "+search.space.WIDTH={type: choice, values: [8]}"])


def test_a_resumes_search_is_compared_with_the_runs_own_search_group(tmp_path: Path, capsys):
    """User trial: a run started with `search.metric=val_loss search.mode=min` (the default search group, digits)
    refused `resume=ID search=digits`, its own group, as "search=digits is ranked by val_acc (max)"; and
    `search=digits search.metric=val_loss` (no search.mode) read as "ranked by val_loss (max)". The first run records
    its search group (search.group); a resume's `search=` naming it, however spelled, is taken, another is refused
    naming the run's group and the fix."""
    from ralph_ray.__main__ import main

    def first(name: str, overrides: list[str]) -> Path:
        run_dir = tmp_path / name
        run_dir.mkdir()
        (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.structured(load_config(overrides))))
        return run_dir

    loss = first("loss", ["search.metric=val_loss", "search.mode=min"])
    assert load_config([]).search.group == "digits" and load_config(["search=cifar10"]).search.group == "cifar10"
    plain = resume_config(loss, ["resume=loss"])
    assert (plain.search.metric, plain.search.mode, plain.search.group) == ("val_loss", "min", "digits")
    for asked in (["search=digits"], ["+search=digits"], ["search=digits", "search.metric=val_loss"]):
        assert resume_config(loss, ["resume=loss", *asked]) == plain, asked
        assert main(["resume=loss", f"paths.runs={tmp_path}", *asked, "--cfg"]) == 0, asked
    capsys.readouterr()
    for asked in ("search=cifar10", "+search=cifar10"):
        with pytest.raises(ConfigError) as info:
            resume_config(loss, ["resume=loss", asked])
        said = str(info.value)
        assert "search=cifar10, and this run's search group is digits (ranked by val_loss (min))" in said, said
        assert "fix: drop search= on a resume (the run's own is kept)" in said, said
    assert main(["resume=loss", f"paths.runs={tmp_path}", "search=cifar10", "--cfg"]) == 2
    assert "this run's search group is digits" in capsys.readouterr().err
    # an experiment's search group is the run's own
    cifar = first("cifar", ["+experiment=cifar10", f"data.root={tmp_path / 'data'}"])
    assert resume_config(cifar, ["search=cifar10"]).search.group == "cifar10"
    with pytest.raises(ConfigError, match="this run's search group is cifar10"):
        resume_config(cifar, ["search=digits"])
    # a run recorded before search.group was: compared by metric and mode, the stored ranking named
    stored = (loss / "config.yaml").read_text()
    assert "  group: digits\n" in stored
    (loss / "config.yaml").write_text(stored.replace("  group: digits\n", ""))
    assert resume_config(loss, ["search=digits", "search.metric=val_loss", "search.mode=min"]).search.group is None
    with pytest.raises(ConfigError) as info:
        resume_config(loss, ["search=digits"])
    said = str(info.value)
    assert "search=digits is ranked by val_acc (max), and this run is ranked by val_loss (min)" in said, said
    assert "fix: drop search= on a resume (the run's own is kept)" in said, said


def test_the_search_group_is_frozen_on_a_resume_and_never_set_by_override(tmp_path: Path, capsys):
    """Review: a resume's `search.group=cifar10` was merged without a word and rewrote the group recorded in
    config.yaml, so later resumes compared `search=` with it; on a first run the override was dropped in silence. A
    resume may not change it (FROZEN_ON_RESUME); a first run that sets it exits 2 naming `search=<group>`."""
    from ralph_ray.__main__ import main

    run_dir = tmp_path / "r"
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.structured(load_config([]))))
    for asked in ("search.group=cifar10", "~search.group"):
        with pytest.raises(ConfigError, match="keeps its task and metric") as info:
            resume_config(run_dir, ["resume=r", asked])
        assert "search.group (stored 'digits', asked " in str(info.value), str(info.value)
    assert resume_config(run_dir, ["resume=r", "search.group=digits"]).search.group == "digits"  # its own: fine
    # a run recorded before search.group: None stays None
    (run_dir / "config.yaml").write_text((run_dir / "config.yaml").read_text().replace("  group: digits\n", ""))
    assert resume_config(run_dir, ["resume=r"]).search.group is None
    for asked in ("search.group=cifar10", "+search.group=cifar10", "++search.group=cifar10"):
        with pytest.raises(ConfigError, match="search.group is recorded, not set") as info:
            load_config([asked])
        assert "choose the search group with search=<group> (search=cifar10)" in str(info.value), str(info.value)
    assert main(["search.group=cifar10", f"paths.runs={tmp_path}", "--cfg"]) == 2
    assert "search=<group>" in capsys.readouterr().err
