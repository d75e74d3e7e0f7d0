"""`python -m ralph_ray init` writes a task folder that runs as it is: each template into a folder outside the
repository, then a 2-cycle campaign on it with task=<that folder>; nothing under ralph_ray/ changes."""

from __future__ import annotations

import ast
import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ralph_ray import PROJECT_ROOT, sandbox
from ralph_ray.__main__ import main
from ralph_ray.kb import open_reader
from ralph_ray.scaffold import TEMPLATES, TEMPLATES_DIR
from ralph_ray.tasks import SHIPPED
from ralph_ray.tasks.folder import PARTS


def _engine_state() -> tuple[str, list[Path]]:
    """A digest of the templates and the task loader (what init and task= read), and any run output in the package.

    (Other files of the package are not hashed: other work may edit them while this test runs.)
    """
    digest = hashlib.sha256()
    for root in (PROJECT_ROOT / "ralph_ray" / "templates", PROJECT_ROOT / "ralph_ray" / "tasks"):
        for path in sorted(p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
            digest.update(str(path.relative_to(root)).encode() + path.read_bytes())
    outputs = sorted(
        p
        for pattern in ("*.npy", "*.npz", "*.jsonl", "*.parquet", "*.duckdb", "state.json")
        for p in (PROJECT_ROOT / "ralph_ray").rglob(pattern)
    )
    return digest.hexdigest(), outputs


def test_init_writes_every_part_and_refuses_to_overwrite(tmp_path: Path):
    done = subprocess.run(
        [sys.executable, "-m", "ralph_ray", "init", "my_task", "--template", "regression"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in (tmp_path / "my_task").iterdir()) == sorted(PARTS)
    assert "python -m ralph_ray task=./my_task" in done.stdout
    assert "task=./my_task" in (tmp_path / "my_task" / "task.yaml").read_text()
    again = subprocess.run(
        [sys.executable, "-m", "ralph_ray", "init", "my_task"], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert again.returncode == 2 and "not empty" in again.stderr
    wrong = subprocess.run(
        [sys.executable, "-m", "ralph_ray", "init", "other", "--template", "vision"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert wrong.returncode == 2 and "classification" in wrong.stderr


def test_the_lm_template_is_the_shipped_lm_task(tmp_path: Path):
    # One source: `init --template lm` copies trainers/lm/ (it once kept a copy that missed the model scoring).
    assert main(["init", str(tmp_path / "my_lm"), "--template", "lm"]) == 0
    shown = str(tmp_path / "my_lm")
    for name in PARTS:
        shipped = (SHIPPED / "lm" / name).read_text()
        assert (tmp_path / "my_lm" / name).read_text() == shipped.replace("task=lm", f"task={shown}")
    assert "harness.save_model(" in (tmp_path / "my_lm" / "train.py").read_text()  # scored by its exported model
    assert not (PROJECT_ROOT / "ralph_ray" / "templates" / "lm").exists()


def _harness_calls(path: Path) -> set[str]:
    return {
        node.attr
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "harness"
    }


def _metric(path: Path) -> dict:
    assign = next(
        node
        for node in ast.parse(path.read_text()).body
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "METRIC" for t in node.targets)
    )
    return ast.literal_eval(assign.value)


@pytest.mark.parametrize("template, task", [("classification", "digits"), ("regression", "diabetes")])
def test_a_starter_keeps_the_contract_of_its_shipped_seed(template: str, task: str):
    # The starters differ from the shipped seeds on purpose (a `load()` with stand-in data for the user's own, a model
    # for flat inputs); what must not drift is the contract: the harness calls, the metric, what ASHA compares.
    starter, seed = TEMPLATES_DIR / template, SHIPPED / task
    calls = _harness_calls(starter / "train.py")
    assert {"load_data", "report", "save_predictions"} <= calls <= _harness_calls(seed / "train.py")
    assert _metric(starter / "prepare.py") == _metric(seed / "prepare.py")
    ours, theirs = (yaml.safe_load((folder / "task.yaml").read_text())["search"] for folder in (starter, seed))
    assert (ours["metric"], ours["mode"]) == (theirs["metric"], theirs["mode"])


@pytest.mark.slow
@pytest.mark.parametrize("template", TEMPLATES)
def test_an_init_task_runs_a_two_cycle_campaign(
    ray_session, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, template: str
):
    engine_before = _engine_state()
    monkeypatch.chdir(tmp_path)
    assert main(["init", "my_task", "--template", template]) == 0
    folder = tmp_path / "my_task"
    assert not folder.resolve().is_relative_to(PROJECT_ROOT)
    train = folder / "train.py"  # keep it tiny: two epochs
    train.write_text(train.read_text().replace("EPOCHS = 8 ", "EPOCHS = 2 ").replace("EPOCHS = 4 ", "EPOCHS = 2 "))
    run_id = f"init-{template}"
    overrides = [
        f"task={folder}",
        f"run_id={run_id}",
        "population.mode=generations",  # the barrier loop's cycle folders and records (the default auto runs async)
        "safeguards.max_cycles=2",
        "safeguards.plateau_cycles=3",
        "search.num_samples=2",
        "safeguards.replicates=0",  # one trial decides (replicates: tests/test_noise.py)
        "search.max_concurrent=2",
        "scheduler.max_t=2",
        "scheduler.grace_period=1",
        "population.parents=1",
        "population.children_per_parent=1",
        "safeguards.trial_timeout_s=300",
    ]
    if sandbox.available() is not None:
        overrides.append("sandbox=none")
    code = main(overrides)
    assert code == 0
    con = open_reader(tmp_path / "kb")
    config = json.loads(con.execute("select config from runs where run_id = ?", [run_id]).fetchone()[0])
    assert config["task"]["trainer"] == str(folder) and config["task"]["name"] == "my_task"
    trials = con.execute(
        "select variant_id, selection_score from trials where run_id = ? and status = 'completed'", [run_id]
    ).fetchall()
    assert trials, "no trial completed"
    board = con.execute(
        "select variant_id, selection_score from leaderboard where run_id = ? order by rank", [run_id]
    ).fetchall()
    assert board[0][1] == max(score for _, score in trials)  # the leaderboard's best is the best oriented score
    if template != "classification":  # MSE and bits per byte: lower is better, stored as -value
        assert all(score < 0 for _, score in trials)
        assert config["task"]["direction"] == "min"
    assert _engine_state() == engine_before and not engine_before[1]
    assert sorted(p.name for p in folder.iterdir() if p.name != "__pycache__") == sorted(PARTS)  # the seed untouched
