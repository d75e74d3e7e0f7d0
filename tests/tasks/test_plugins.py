"""Tasks as installed plug-ins: a distribution's `ralph_ray.tasks` entry point names a package whose folder is a task
folder, and `task=<its name>` runs it. Real discovery: each test writes a tiny distribution (a package folder and its
`.dist-info`) into tmp_path and puts tmp_path on sys.path (or PYTHONPATH for a subprocess), as `pip install` would.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from taskdirs import DIGITS_TASK, digits_task

from ralph_ray import PROJECT_ROOT
from ralph_ray.__main__ import main
from ralph_ray.config import ConfigError, load_config
from ralph_ray.kb import open_reader
from ralph_ray.tasks import find_task, prepare_splits, task_names
from ralph_ray.tasks.folder import PARTS

# The package's own code must never run to find its task folder (its prepare.py loads only through tasks.folder).
TRAP = "raise RuntimeError('ralph_ray imported the plug-in package to find its task folder')\n"


def _install(site: Path, entry_points: dict[str, str], dist: str = "mydist") -> Path:
    """Write `mypkg/mytask/` (a digits task folder) and a `<dist>-0.1.dist-info` declaring `entry_points`."""
    package = site / "mypkg"
    package.mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").write_text(TRAP)
    folder = digits_task(package / "mytask", (DIGITS_TASK / "train.py").read_text())
    info = site / f"{dist}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    lines = "".join(f"{name} = {value}\n" for name, value in entry_points.items())
    (info / "entry_points.txt").write_text(f"[ralph_ray.tasks]\n{lines}")
    return folder


def test_an_installed_plugin_runs_by_its_entry_point_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    folder = _install(tmp_path, {"myplug": "mypkg.mytask"})
    assert "myplug" not in task_names()
    monkeypatch.syspath_prepend(str(tmp_path))
    assert task_names()[-1] == "myplug" and "digits" in task_names()
    cfg = load_config(["task=myplug"])
    assert cfg.task.name == "myplug" and Path(cfg.task.trainer) == folder.resolve()
    assert (cfg.task.metric, cfg.search.num_samples) == ("accuracy", 8)  # its prepare.py and task.yaml, as a folder's
    assert "mypkg" not in sys.modules  # found without running the package's __init__.py (it raises)
    assert prepare_splits(cfg).metric.name == "accuracy"
    assert find_task("myplug").folder == folder.resolve()
    # a name nothing claims lists the plug-ins beside the shipped tasks
    with pytest.raises(ConfigError, match=r"task=cifar10, .*or an installed plug-in: myplug"):
        load_config(["task=mnist"])


def test_a_plugin_that_claims_a_taken_name_is_refused_naming_both(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    _install(tmp_path, {"digits": "mypkg.mytask", "twin": "mypkg.mytask"})
    (tmp_path / "other").mkdir()
    _install(tmp_path / "other", {"twin": "mypkg.mytask"}, dist="otherdist")
    monkeypatch.syspath_prepend(str(tmp_path / "other"))
    monkeypatch.syspath_prepend(str(tmp_path))
    for overrides in ([], ["task=digits"]):  # the default task too
        with pytest.raises(ConfigError) as caught:
            load_config(overrides)
        message = str(caught.value)
        assert "2 tasks are named 'digits'" in message and str(PROJECT_ROOT / "trainers" / "digits") in message
        assert "plug-in mypkg.mytask (entry point 'digits' of mydist 0.1)" in message and "rename" in message
        assert "pip uninstall mydist)" in message
    with pytest.raises(ConfigError, match="2 tasks are named 'twin'.*mydist 0.1.*otherdist 0.1"):
        load_config(["task=twin"])
    assert load_config(["task=diabetes"]).task.name == "diabetes"  # only the name in dispute is refused
    done = subprocess.run(
        [sys.executable, "-m", "ralph_ray", "task=digits", "--cfg"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and "2 tasks are named 'digits'" in done.stderr and "fix:" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_plugin_that_is_no_task_folder_gets_the_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    _install(
        tmp_path,
        {"gone": "mypkg.nothing", "partial": "mypkg.partial", "module": "json.decoder", "obj": "mypkg.mytask:main"},
    )
    partial = digits_task(tmp_path / "mypkg" / "partial", "EPOCHS = 1\n")
    (partial / "program.md").unlink()
    monkeypatch.syspath_prepend(str(tmp_path))
    fix = r'fix: in the pyproject.toml of mydist 0.1, point \[project.entry-points."ralph_ray.tasks"\]'
    for name, problem in (
        ("gone", "names mypkg.nothing, which is no package folder"),
        ("module", "names json.decoder, which is no package folder"),
        ("obj", r"names an object \(mypkg.mytask:main\)"),
    ):
        with pytest.raises(ConfigError, match=rf"plug-in .*'{name}' of mydist 0.1\) {problem}(.|\n)*{fix} {name} at"):
            load_config([f"task={name}"])
    with pytest.raises(ConfigError, match="lacks program.md"):  # the task folder's own check, as for task=./path
        load_config(["task=partial"])
    assert "mypkg" not in sys.modules


def test_init_starts_a_task_folder_from_an_installed_plugin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
):
    folder = _install(tmp_path / "site", {"myplug": "mypkg.mytask", "gone": "mypkg.nothing"})
    (folder / "program.md").write_text("Run it: python -m ralph_ray task=myplug\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    assert main(["init", str(tmp_path / "mine"), "--template", "myplug"]) == 0
    assert sorted(p.name for p in (tmp_path / "mine").iterdir()) == sorted(PARTS)
    assert (tmp_path / "mine" / "train.py").read_bytes() == (folder / "train.py").read_bytes()
    assert (tmp_path / "mine" / "program.md").read_text() == f"Run it: python -m ralph_ray task={tmp_path / 'mine'}\n"
    assert "a copy of the installed task myplug" in capsys.readouterr().out  # not "put your data in"
    assert main(["init", str(tmp_path / "bad"), "--template", "gone"]) == 2
    assert "no package folder" in capsys.readouterr().err and not (tmp_path / "bad").exists()
    assert main(["init", str(tmp_path / "x"), "--template", "digits"]) == 2  # a shipped task is no template


@pytest.mark.slow
def test_a_plugin_task_runs_a_campaign(tmp_path: Path):
    folder = _install(tmp_path / "site", {"myplug": "mypkg.mytask"})
    run_id = "plugged"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "ralph_ray",
            "task=myplug",
            f"run_id={run_id}",
            f"paths.runs={tmp_path / 'runs'}",
            f"paths.kb={tmp_path / 'kb'}",
            "safeguards.max_cycles=1",
            "population.mode=generations",  # one barrier cycle: exactly the 2 samples (async starts knob samples too)
            "agent=none",
            "search.num_samples=2",
            "safeguards.replicates=0",
            "search.max_concurrent=2",
            "scheduler=fifo",
            "scheduler.max_t=1",
            "scheduler.grace_period=1",
            "safeguards.trial_timeout_s=120",
            "+search.space.EPOCHS={type: choice, values: [1]}",
        ],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(tmp_path / "site"), "RAY_USAGE_STATS_ENABLED": "0"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    con = open_reader(tmp_path / "kb")
    config = json.loads(con.execute("select config from runs where run_id = ?", [run_id]).fetchone()[0])
    assert config["task"]["name"] == "myplug" and config["task"]["trainer"] == str(folder.resolve())
    scores = con.execute(
        "select selection_score from trials where run_id = ? and status = 'completed'", [run_id]
    ).fetchall()
    assert len(scores) == 2 and all(0.0 < score <= 1.0 for (score,) in scores)
