"""Tasks as folders: task=<name> and task=./path load the same way, with their metric; a folder that lacks a part,
a metric without a direction or a failing prepare stop with exit 2 and the fix; frozen parts never reach a trial."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ralph_ray import PROJECT_ROOT
from ralph_ray.config import ConfigError, load_config, sandbox_policy
from ralph_ray.tasks import TASKS, DataError, prepare_splits
from ralph_ray.variants import seed_snapshot


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def test_shipped_tasks_are_folders_with_their_metric():
    assert {"digits", "cifar10", "diabetes"} <= set(TASKS)
    assert all(ref.folder.parent == PROJECT_ROOT / "trainers" for ref in TASKS.values())
    assert not (PROJECT_ROOT / "ralph_ray" / "tasks" / "cifar10.py").exists()  # no task code in the engine
    digits, diabetes = load_config(["task=digits"]), load_config(["task=diabetes"])
    assert (digits.task.metric, digits.task.direction) == ("accuracy", "max")
    assert (diabetes.task.metric, diabetes.task.direction) == ("mse", "min")
    assert (diabetes.search.metric, diabetes.search.mode) == ("val_loss", "min")  # from trainers/diabetes/task.yaml


def test_a_path_loads_the_same_task_as_its_name():
    by_name, by_path = load_config([]), load_config(["task=./trainers/digits"])
    assert by_path.task.name == "digits" and Path(by_path.task.trainer) == PROJECT_ROOT / "trainers" / "digits"
    assert by_path.search == by_name.search and by_path.task.metric == by_name.task.metric
    # the command line still wins over the task's task.yaml
    assert load_config(["task=./trainers/digits", "search.num_samples=3"]).search.num_samples == 3
    splits = prepare_splits(by_path)
    assert splits.metric.name == "accuracy" and len(splits.selection_y) == len(prepare_splits(by_name).selection_y)


def test_diabetes_splits_hold_real_valued_targets():
    splits = prepare_splits(load_config(["task=diabetes"]))
    assert splits.train_x.shape[1] == 10 and splits.num_classes == 0
    assert (
        splits.selection_y.dtype == np.float64
        and len(splits.train_y) + len(splits.selection_y) + len(splits.test_y) == 442
    )
    assert splits.labels().selection.dtype == np.float64  # not truncated to class ids


def _copy_task(tmp_path: Path, name: str = "my_task") -> Path:
    folder = tmp_path / name
    shutil.copytree(PROJECT_ROOT / "trainers" / "diabetes", folder, ignore=shutil.ignore_patterns("__pycache__"))
    return folder


def test_a_folder_missing_a_part_exits_2_naming_it(tmp_path: Path):
    folder = _copy_task(tmp_path)
    (folder / "program.md").unlink()
    with pytest.raises(ConfigError, match="lacks program.md"):
        load_config([f"task={folder}"])
    done = _cli("ralph_ray", f"task={folder}", "--cfg", cwd=tmp_path)
    assert done.returncode == 2 and "lacks program.md" in done.stderr and "fix:" in done.stderr
    done = _cli("ralph_ray", "task=./nowhere", cwd=tmp_path)
    assert done.returncode == 2 and "does not exist" in done.stderr and "init" in done.stderr


def test_a_metric_without_a_direction_exits_2(tmp_path: Path):
    folder = _copy_task(tmp_path)
    prepare = folder / "prepare.py"
    prepare.write_text(
        prepare.read_text().replace('METRIC = {"name": "mse", "direction": "min"}', 'METRIC = {"name": "mse"}')
    )
    done = _cli("ralph_ray", f"task={folder}", "--cfg", cwd=tmp_path)
    assert done.returncode == 2 and "direction" in done.stderr and '"min"' in done.stderr


def test_a_prepare_that_fails_exits_2_with_its_error(tmp_path: Path):
    folder = _copy_task(tmp_path)
    prepare = folder / "prepare.py"
    prepare.write_text(prepare.read_text().replace("bunch = load_diabetes()", "bunch = load_diabetes(); 1 / 0"))
    done = _cli("ralph_ray.prepare", f"task={folder}", cwd=tmp_path)
    assert done.returncode == 2 and "prepare() failed (ZeroDivisionError" in done.stderr and "fix:" in done.stderr
    prepare.write_text("import not_a_module_anywhere\n")
    done = _cli("ralph_ray", f"task={folder}", "--cfg", cwd=tmp_path)
    assert done.returncode == 2 and "failed to import (ModuleNotFoundError" in done.stderr


def test_a_prepare_missing_its_data_names_a_command_that_shows_where_it_failed(tmp_path: Path):
    folder = _copy_task(tmp_path)
    prepare = folder / "prepare.py"
    missing = tmp_path / "gone" / "sales.csv"
    prepare.write_text(prepare.read_text().replace("bunch = load_diabetes()", f"open({str(missing)!r})"))
    with pytest.raises(DataError, match="FileNotFoundError") as caught:
        prepare_splits(load_config([f"task={folder}", "task.split_seed=3", "task.test_fraction=0.25"]))
    # the run's split settings travel with the hint (review: a task.subsample or split_seed run was not reproduced)
    assert "task.split_seed=3" in str(caught.value) and "task.test_fraction=0.25" in str(caught.value)
    # The hint was `python -c "import runpy; runpy.run_path(...)"`, which defines prepare() and never calls it.
    hint = re.search(r"`(python -m ralph_ray\.prepare [^`]+)`", str(caught.value))
    assert hint is not None, str(caught.value)
    done = _cli(*shlex.split(hint.group(1))[2:], cwd=tmp_path)
    assert done.returncode == 2 and "Traceback" in done.stderr and "FileNotFoundError" in done.stderr
    assert f'File "{prepare}", line' in done.stderr and str(missing) in done.stderr  # where, in the task's own code


def test_a_builtin_metric_keeps_its_direction_beside_a_score_and_an_unusual_one_is_warned_of(tmp_path: Path):
    folder = _copy_task(tmp_path)
    prepare = folder / "prepare.py"
    source = (
        prepare.read_text()
        + "\n\ndef score(predictions, targets):\n    return float(((predictions - targets) ** 2).mean())\n"
    )
    declared = '{"name": "mse", "direction": "min"}'
    prepare.write_text(source.replace(declared, '{"name": "mse", "direction": "max"}'))
    done = _cli("ralph_ray.prepare", f"task={folder}", cwd=tmp_path)  # exited 0, a custom metric named mse
    assert done.returncode == 2 and 'METRIC \'mse\' is better when lower: set "direction": "min"' in done.stderr
    prepare.write_text(source)
    done = _cli("ralph_ray.prepare", f"task={folder}", cwd=tmp_path)
    assert done.returncode == 0 and "scored by prepare.py's own score() (kind custom)" in done.stdout
    assert "warning" not in done.stderr
    prepare.write_text(source.replace(declared, '{"name": "r2", "direction": "min"}'))  # a custom metric may: warned
    done = _cli("ralph_ray.prepare", f"task={folder}", cwd=tmp_path)
    assert done.returncode == 0 and "warning: METRIC 'r2'" in done.stderr and '"direction": "max"' in done.stderr


DENOISING = """
import numpy as np

from ralph_ray.tasks.base import DataSource, Splits, TaskSettings, random_split

METRIC = {"name": "mse", "direction": "min"}


def prepare(settings: TaskSettings, data: DataSource) -> Splits:
    from sklearn.datasets import load_digits

    clean = (load_digits().images[:300, None] / 16.0).astype(np.float32)
    noisy = np.clip(clean + 0.3 * np.random.default_rng(0).standard_normal(clean.shape), 0, 1).astype(np.float32)
    clean = TARGETS
    train, selection, test = random_split(len(clean), (0.2, 0.2), settings.split_seed)
    return Splits(noisy[train], clean[train], noisy[selection], clean[selection], noisy[test], clean[test])
"""


def test_prepare_scores_the_targets_against_themselves_with_the_tasks_metric(tmp_path: Path):
    """User trial: the built-in mse could not read a denoiser's image targets, prepare said nothing and every trial
    then failed in scoring. Prepare scores the selection targets as predictions: image targets pass (per pixel); a
    built-in metric that cannot read the targets exits 2 with the fix; a task's own score() that cannot is warned of
    (it may read predictions of another form)."""
    folder = _copy_task(tmp_path)
    prepare = folder / "prepare.py"
    prepare.write_text(DENOISING.replace("TARGETS", "clean"))
    done = _cli("ralph_ray.prepare", f"task={folder}", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "scored by the built-in mse" in done.stdout and "warning" not in done.stderr
    prepare.write_text(DENOISING.replace("TARGETS", "np.where(clean > 0.5, 'ink', 'paper')"))
    again = tmp_path / "again"
    again.mkdir()
    done = _cli("ralph_ray.prepare", f"task={folder}", cwd=again)
    assert done.returncode == 2 and not (again / "data").exists()  # nothing written
    assert "metric mse cannot score the selection targets (<U5, shape (60, 1, 8, 8))" in done.stderr, done.stderr
    assert "fix: name a built-in metric that reads these targets, or define `def score(" in done.stderr
    custom = "\n\ndef score(predictions, targets):\n    return float((predictions.argmax(1) == targets).mean())\n"
    prepare.write_text(DENOISING.replace("TARGETS", "clean[:, 0, 0, 0]").replace('"mse"', '"acc"') + custom)
    prepare.write_text(prepare.read_text().replace('"direction": "min"', '"direction": "max"'))
    done = _cli("ralph_ray.prepare", f"task={folder}", cwd=tmp_path)
    assert done.returncode == 0 and "warning: metric acc cannot score the selection targets" in done.stderr
    assert "AxisError" in done.stderr and "fix score() in prepare.py" in done.stderr


def test_frozen_parts_never_reach_a_variant_and_the_folder_is_hidden_from_trials(tmp_path: Path):
    folder = _copy_task(tmp_path)
    seed = seed_snapshot(folder, tmp_path / "variants").variant
    assert sorted(p.name for p in seed.files_dir.iterdir()) == ["program.md", "train.py"]
    cfg = load_config([f"task={folder}"])
    assert str(folder.resolve()) in sandbox_policy(cfg).hidden


def test_data_kept_in_the_task_folder_never_reaches_a_variant_unless_listed(tmp_path: Path):
    """A user's raw data (held-out labels included) or prepared splits beside the trainer stay out of the seed."""
    folder = _copy_task(tmp_path)
    (folder / "raw").mkdir()
    (folder / "raw" / "all.csv").write_text("x,label\n0.1,1\n")
    (folder / "data" / "prepared").mkdir(parents=True)
    np.save(folder / "data" / "prepared" / "test_y.npy", np.arange(3))
    (folder / ".secret").write_text("token")
    (folder / "model_parts.py").write_text("WIDTH = 3\n")  # a helper module the trainer imports
    (folder / "nets").mkdir()
    (folder / "nets" / "blocks.py").write_text("DEPTH = 2\n")  # and one in a package of its own
    (folder / "layers.json").write_text("[3]")
    made = seed_snapshot(folder, tmp_path / "variants")
    shipped = sorted(
        str(p.relative_to(made.variant.files_dir)) for p in made.variant.files_dir.rglob("*") if p.is_file()
    )
    assert shipped == ["model_parts.py", "nets/blocks.py", "program.md", "train.py"]
    assert made.left_out == [".secret", "data/prepared/test_y.npy", "layers.json", "raw/all.csv"]
    # a file the trainer reads is listed in task.trainer_files (Path.glob's globs: `*` stays in the top level, so
    # `*.csv` for a helper table there does not ship raw/all.csv); the labels still stay out
    (folder / "classes.csv").write_text("id,name\n0,benign\n")
    patterns = ["**/*.py", "**/*.md", "layers.json", "*.csv"]
    listed = seed_snapshot(folder, tmp_path / "variants2", patterns).variant.files_dir
    assert (listed / "layers.json").read_text() == "[3]" and (listed / "classes.csv").exists()
    assert not (listed / "raw").exists() and not (listed / "data").exists()
    (folder / "classes.csv").unlink()
    assert seed_snapshot(folder, tmp_path / "variants3").variant.variant_id == made.variant.variant_id  # same id


def test_runs_or_kb_inside_the_task_folder_and_trainer_files_without_train_py_exit_2(tmp_path: Path):
    folder = _copy_task(tmp_path)
    with pytest.raises(ConfigError, match="inside the task folder"):
        load_config([f"task={folder}", f"paths.kb={folder / 'kb'}"])
    # the user who runs from inside the task folder (the prepare step's hint puts them there): runs/ would be copied
    # into the seed, itself included, and trials could not see their own work dirs
    done = _cli("ralph_ray", "task=./", "--cfg", cwd=folder)
    assert done.returncode == 2 and "paths.runs" in done.stderr and f"cd {folder.parent}" in done.stderr
    with pytest.raises(ConfigError, match="leaves out the trainer itself"):
        load_config([f"task={folder}", "task.trainer_files=['*.md']"])
    assert load_config([f"task={folder}", f"paths.runs={tmp_path / 'runs'}"]).paths.runs == str(tmp_path / "runs")


def test_raw_data_a_task_declares_outside_data_root_is_hidden_and_a_bad_declaration_exits_2(tmp_path: Path):
    folder = _copy_task(tmp_path)
    raw = tmp_path / "raw_elsewhere"
    prepare = folder / "prepare.py"
    source = prepare.read_text()
    # a generator is as good as a list
    prepare.write_text(source + f"\n\ndef hidden_paths(data):\n    yield from [{str(raw)!r}, data.root or '{raw}/b']\n")
    hidden = sandbox_policy(load_config([f"task={folder}"])).hidden
    assert str(raw) in hidden and str(raw / "b") in hidden and str(folder.resolve()) in hidden
    assert (
        str(tmp_path / "mine")
        in sandbox_policy(load_config([f"task={folder}", f"data.root={tmp_path / 'mine'}"])).hidden
    )
    for body, said in (
        ("hidden_paths = '/usr/share/x'", "hidden_paths is not a function"),
        ("def hidden_paths(data):\n    return '/usr/share/x'", "returned '/usr/share/x'"),
        ("def hidden_paths(data):\n    return [1 / 0]", "hidden_paths(data) raised ZeroDivisionError"),
        ("def hidden_paths(data):\n    return 5", "returned 5"),
    ):
        prepare.write_text(source + "\n\n" + body + "\n")
        done = _cli("ralph_ray", f"task={folder}", "--cfg", cwd=tmp_path)
        assert done.returncode == 2 and said in done.stderr and "fix:" in done.stderr, done.stderr


def test_the_lm_task_scores_a_next_byte_that_no_input_holds():
    cfg = load_config(["task=lm"])
    assert (cfg.task.metric, cfg.task.direction, cfg.search.mode) == ("bits_per_byte", "min", "min")
    splits = prepare_splits(cfg)
    labels = splits.labels()
    width = splits.selection_x.shape[1]
    # rows are held-out text cut as [context | next byte]: the scored byte sits between two contexts, in neither
    text = np.concatenate([splits.selection_x, labels.selection[:, None]], axis=1).reshape(-1)
    assert np.array_equal(text[width :: width + 1], labels.selection)
    uniform = splits.metric.score(np.zeros((len(labels.selection), 256)), labels.selection)
    assert uniform == pytest.approx(8.0)  # a model that knows nothing: 8 bits per byte
    copy_last = np.full((len(labels.selection), 256), -30.0)
    copy_last[np.arange(len(copy_last)), splits.selection_x[:, -1]] = 30.0  # "the next byte repeats the last one"
    assert splits.metric.score(copy_last, labels.selection) > 8.0  # copying from the input earns what it is worth
    with pytest.raises(ValueError, match=r"\(N, 256\)"):
        splits.metric.score(np.zeros(len(labels.selection)), labels.selection)
