"""The export bundle's scores: the replicates' mean with its 95% Student-t interval (the leaderboard's), in
scores.json and the model card; after a final training, its winner as it trained (code, knobs, budget) unless
--search; a KB written by the real writer, no campaign."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from omegaconf import OmegaConf
from rich.console import Console
from scipy import stats

from ralph_ray import commands
from ralph_ray.config import load_config
from ralph_ray.exit_codes import ExitCode
from ralph_ray.export import ExportError, export, run_config
from ralph_ray.kb import KnowledgeBase, open_reader
from ralph_ray.variants import final_code_dir

RUN = "scored"
REPLICATES = [(0.88, 0.86), (0.90, 0.90), (0.92, 0.91)]  # (selection, test) of three fresh seeds


def _reproduce(bundle: Path, work: Path) -> subprocess.CompletedProcess:
    """Run an export bundle's reproduce.py as its README says."""
    command = [sys.executable, str(bundle / "reproduce.py"), "--work", str(work)]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


def trial(trial_id: str, variant: str, selection: float | None, test: float | None, seed: int, replicate: bool) -> dict:
    return {
        "run_id": RUN,
        "cycle": 1,
        "trial_id": trial_id,
        "variant_id": variant,
        "status": "completed" if selection is not None else "failed",
        "knobs": json.dumps({"LR": 0.05}),
        "seed": seed,
        "epochs": 2,
        "selection_score": selection,
        "test_score": test,
        "seconds": 1.0,
        "work_dir": "",
        "replicate": replicate,
    }


@pytest.fixture()
def kb(tmp_path: Path) -> KnowledgeBase:
    return write_kb(tmp_path)


def write_kb(tmp_path: Path) -> KnowledgeBase:
    """A finished campaign's record as the real writer leaves it: a seed, a child with three replicates and a
    failed one, their trainer folders and run dir under `tmp_path`."""
    kb = KnowledgeBase(tmp_path / "kb")
    kb.init()
    run_dir = tmp_path / "runs" / RUN
    run_dir.mkdir(parents=True)
    files = {}
    for name in ("seed", "child"):
        files[name] = tmp_path / "variants" / name
        files[name].mkdir(parents=True)
        (files[name] / "train.py").write_text(f"LR = 0.1  # learning rate\nprint({name!r})\n")
    kb.append("runs", [{"run_id": RUN, "experiment": "digits", "task": "digits", "run_dir": str(run_dir)}], RUN)
    variants = [
        {"run_id": RUN, "variant_id": "seed", "parent_id": None, "cycle": 1, "status": "kept", "interventions": "[]"},
        {"run_id": RUN, "variant_id": "child", "parent_id": "seed", "cycle": 2, "status": "kept"},
    ]
    kb.append("variants", [{**v, "files_dir": str(files[v["variant_id"]])} for v in variants], RUN)
    kb.append("variants", [{**variants[1], "interventions": '["batchnorm"]', "files_dir": str(files["child"])}], RUN)
    rows = [trial("s0", "seed", 0.80, 0.79, 0, False), trial("c0", "child", 0.93, 0.90, 0, False)]
    rows += [trial(f"r{i}", "child", s, t, i, True) for i, (s, t) in enumerate(REPLICATES, 1)]
    rows.append(trial("r4", "child", None, None, 4, True))  # a failed replicate: no score, not in the sample
    kb.append("trials", rows, RUN)
    return kb


def test_scores_carry_the_replicates_student_t_interval(kb: KnowledgeBase, tmp_path: Path) -> None:
    out = export(kb.root, RUN, out=tmp_path / "bundle")
    scores = json.loads((out / "scores.json").read_text())
    assert scores["variant_id"] == "child" and scores["selection_score"] == 0.93  # the best search trial
    rep = scores["replicates"]
    assert rep["n"] == 3 and rep["seeds"] == [1, 2, 3] and rep["confidence"] == 0.95
    for i, name in enumerate(("selection", "test")):
        values = [r[i] for r in REPLICATES]
        low, high = stats.t.interval(0.95, len(values) - 1, loc=stats.tmean(values), scale=stats.sem(values))
        assert rep[name]["mean"] == pytest.approx(sum(values) / 3)
        assert rep[name]["ci95"] == pytest.approx([low, high])  # Student t with n - 1 = 2 df, not 1.96
    board = (
        open_reader(kb.root)
        .execute("select ci_low, ci_high from leaderboard where run_id = ? and variant_id = 'child'", [RUN])
        .fetchone()
    )
    assert rep["selection"]["ci95"] == pytest.approx(list(board), abs=1e-4)  # the leaderboard's interval
    card = (out / "README.md").read_text()
    low, high = rep["selection"]["ci95"]
    assert f"mean 0.9000, 95% CI [{low:.4f}, {high:.4f}] (Student t, n=3)" in card
    assert f"95% CI [{rep['test']['ci95'][0]:.4f}, {rep['test']['ci95'][1]:.4f}]" in card
    assert "Path from the seed: **seed > batchnorm**" in card  # the lineage view's text, as SQL users read it
    assert "| 1 | `seed` | seed |" in card and "| `child` | batchnorm |" in card


def test_a_variant_without_replicates_says_why_it_has_no_interval(kb: KnowledgeBase, tmp_path: Path) -> None:
    out = export(kb.root, RUN, "seed", out=tmp_path / "bundle")
    scores = json.loads((out / "scores.json").read_text())
    assert scores["replicates"]["n"] == 0 and "selection" not in scores["replicates"]
    assert "no interval (0 replicate(s) at the best knobs: an interval needs 2)" in (out / "README.md").read_text()


def test_the_card_names_trial_budget_s_only_where_the_campaign_set_it(kb: KnowledgeBase, tmp_path: Path) -> None:
    """User trial: the card of a campaign without `trial.budget_s` said "(`trial.budget_s` of the campaign's
    config)"."""
    card = (export(kb.root, RUN, out=tmp_path / "none") / "README.md").read_text()
    assert "best search trial (no time budget: the trainer's own epochs)" in card and "budget_s" not in card
    run = {"run_id": RUN, "experiment": "digits", "task": "digits", "run_dir": str(tmp_path / "runs" / RUN)}
    kb.append("runs", [{**run, "config": json.dumps({"trial": {"budget_s": 4.0}})}], f"{RUN}-budget")
    card = (export(kb.root, RUN, out=tmp_path / "four") / "README.md").read_text()
    assert "best search trial (a 4-s budget, `trial.budget_s` of the campaign's config)" in card


def test_a_runs_row_without_a_config_reads_as_none_set() -> None:
    """pandas gives a missing config as NaN where the column came back numeric: `NaN or "{}"` is NaN, and
    json.loads("nan") raised."""
    frame = pd.DataFrame({"run_id": [RUN, RUN], "config": [float("nan"), json.dumps({"trial": {"budget_s": 4.0}})]})
    assert run_config(frame.iloc[0]) == {} and run_config(pd.Series({"run_id": RUN, "config": None})) == {}
    assert run_config(frame.iloc[1]) == {"trial": {"budget_s": 4.0}}


# A trainer that records the budget it was given and predicts class 0 everywhere: what reproduce.py hands a trainer.
BUDGET_TRAINER = """import os
from pathlib import Path

import numpy as np

from ralph_ray import harness

LR = 0.1  # learning rate
Path("budget.txt").write_text(os.environ.get(harness.ENV_BUDGET_S, "none"))
data = harness.load_data()
harness.save_predictions(np.zeros(len(data.selection_x), dtype=np.int64), np.zeros(len(data.test_x), dtype=np.int64))
"""


@pytest.fixture()
def finished(tmp_path: Path) -> KnowledgeBase:
    """The campaign above, then its final training (safeguards.final_candidates=2) as finaltrain leaves it: the child
    (rank 1) with a cosine schedule added in the final's code folder, and the seed (rank 2, code as searched), whose
    long run wins on selection; a third final failed. The run's config.yaml gives search trials 5 s."""
    kb = write_kb(tmp_path)
    run_dir = tmp_path / "runs" / RUN
    code = final_code_dir(run_dir, "child")
    code.mkdir(parents=True)
    (code / "train.py").write_text("LR = 0.1  # learning rate\nprint('child')\nSCHEDULE = 'cosine'  # the final's\n")
    (tmp_path / "variants" / "seed" / "train.py").write_text(BUDGET_TRAINER)
    final = {"final": True, "final_budget_s": 120.0}
    kb.append(
        "trials",
        [
            {
                **trial("f1", "child", 0.94, 0.92, 7, False),
                "knobs": '{"LR": 0.07}',
                "epochs": 30,
                "final_added": "cosine",
                **final,
            },
            {**trial("f2", "seed", 0.95, 0.915, 8, False), "knobs": '{"LR": 0.02}', "epochs": 31, **final},
            {**trial("f3", "child", None, None, 9, False), **final},  # failed: never the winner
        ],
        f"{RUN}-final",
    )
    (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.structured(load_config(["trial.budget_s=5"]))))
    return kb


def test_the_default_export_is_the_final_trainings_winner_as_it_trained(finished: KnowledgeBase, tmp_path: Path):
    out = export(finished.root, RUN, out=tmp_path / "bundle")
    scores = json.loads((out / "scores.json").read_text())
    assert (scores["variant_id"], scores["trial_id"], scores["selection_score"]) == ("seed", "f2", 0.95)
    assert scores["budget_s"] == 120.0 and scores["epochs"] == 31 and scores["seed"] == 8
    assert scores["final_training"]["search_best"] == {"trial_id": "s0", "selection_score": 0.80, "test_score": 0.79}
    assert scores["replicates"]["n"] == 0  # one long run: the search's replicates trained another budget
    assert "LR = 0.02" in (out / "trainer" / "train.py").read_text()  # the final's knobs, the seed's own code
    card = (out / "README.md").read_text()
    assert "Trained by the campaign's final training (`safeguards.final_share`): 31 epoch(s)" in card
    assert "of a 120-s budget" in card and "(`s0`): selection 0.8000, test 0.7900" in card
    assert "no interval (one long run, not replicated)" in card
    # reproduce.py gives the trainer the final's budget, not the search's 5 s of the run's config
    ran = _reproduce(out, tmp_path / "work")
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert (out / "trainer" / "budget.txt").read_text() == "120.0"
    assert json.loads(ran.stdout.strip().splitlines()[-1])["recorded_selection_score"] == 0.95


def test_a_named_variant_ships_its_own_final_with_the_schedule_added(finished: KnowledgeBase, tmp_path: Path):
    out = export(finished.root, RUN, "child", out=tmp_path / "bundle")
    scores = json.loads((out / "scores.json").read_text())
    assert (scores["trial_id"], scores["final_training"]["added"]) == ("f1", ["cosine"])
    train = (out / "trainer" / "train.py").read_text()
    assert "SCHEDULE = 'cosine'" in train and "LR = 0.07" in train  # the final's code folder, its knobs
    assert "its code with cosine added (`safeguards.final_additions`)" in (out / "README.md").read_text()


def test_search_exports_rank_1_as_searched_from_the_command_line(finished: KnowledgeBase, tmp_path: Path):
    out = tmp_path / "bundle"
    argv = ["export", RUN, "--search", "--kb", str(finished.root), "--out", str(out)]
    assert commands.main(argv, Console(quiet=True)) == ExitCode.ok
    scores = json.loads((out / "scores.json").read_text())
    assert (scores["variant_id"], scores["trial_id"], scores["replicates"]["n"]) == ("child", "c0", 3)
    assert "budget_s" not in scores and "SCHEDULE" not in (out / "trainer" / "train.py").read_text()
    assert "Trained as the search ran it" in (out / "README.md").read_text()


def test_a_final_whose_code_folder_is_gone_names_the_fix(finished: KnowledgeBase, tmp_path: Path) -> None:
    shutil.rmtree(final_code_dir(tmp_path / "runs" / RUN, "child"))
    with pytest.raises(ExportError, match="--search"):
        export(finished.root, RUN, "child", out=tmp_path / "bundle")


def test_an_accuracy_interval_past_1_is_clipped_and_says_so(tmp_path: Path) -> None:
    """User trial: scores.json and the model card said "95% CI [0.9149, 1.0211]" for an accuracy (n=2)."""
    from pickkb import KID_LOW, RUN, pick_kb

    kb_root, _ = pick_kb(tmp_path)
    out = export(kb_root, RUN, out=tmp_path / "bundle")
    selection = json.loads((out / "scores.json").read_text())["replicates"]["selection"]
    assert selection["ci95"] == pytest.approx([KID_LOW, 1.0], abs=1e-4) and selection["clipped"] is True
    card = (out / "README.md").read_text()
    assert f"95% CI [{KID_LOW:.4f}, 1.0000] (Student t, n=2, clipped to the metric's range)" in card
    # the leaderboard view clips the same interval, and says so
    row = open_reader(kb_root).execute("select ci_low, ci_high, ci_clipped from leaderboard where variant_id = 'kid'")
    low, high, clipped = row.fetchone()
    assert (round(low, 4), high, clipped) == (KID_LOW, 1.0, True)


# A regression trainer predicting 0 everywhere: diabetes' MSE is then the mean squared target, far above 0.
ZERO_TRAINER = """import numpy as np

from ralph_ray import harness

LR = 0.1  # learning rate
data = harness.load_data()
harness.save_predictions(np.zeros(len(data.selection_x)), np.zeros(len(data.test_x)))
"""


@pytest.fixture()
def mse_run(tmp_path: Path) -> KnowledgeBase:
    return write_mse_kb(tmp_path)


def write_mse_kb(tmp_path: Path) -> KnowledgeBase:
    """A min metric's campaign (diabetes' mse) as the real writer stores it, oriented (-value): the child searched to
    0.0287 with three replicates, then its final training (`deepen` added) scored worse, 0.0341."""
    config = load_config(["task=diabetes"])
    kb = KnowledgeBase(tmp_path / "kb")
    kb.init()
    run_dir = tmp_path / "runs" / RUN
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.structured(config)))
    files = {name: tmp_path / "variants" / name for name in ("seed", "child")}
    for folder in (*files.values(), final_code_dir(run_dir, "child")):
        folder.mkdir(parents=True)
        (folder / "train.py").write_text(ZERO_TRAINER)
    stored = json.dumps({"task": {"name": "diabetes", "metric": "mse", "direction": "min"}})
    run = {"run_id": RUN, "experiment": "diabetes", "task": "diabetes", "run_dir": str(run_dir), "config": stored}
    kb.append("runs", [run], RUN)
    variants = [
        ("seed", None, 1, "seed", "[]"),
        ("child", "seed", 2, "kept", '["batchnorm"]'),
    ]
    kb.append(
        "variants",
        [
            {
                "run_id": RUN,
                "variant_id": v,
                "parent_id": parent,
                "cycle": cycle,
                "status": status,
                "interventions": interventions,
                "files_dir": str(files[v]),
            }
            for v, parent, cycle, status, interventions in variants
        ],
        RUN,
    )
    rows = [trial("s0", "seed", -0.0477, -0.0518, 0, False), trial("c0", "child", -0.0287, -0.0301, 0, False)]
    rows += [trial(f"r{i}", "child", -s, -t, i, True) for i, (s, t) in enumerate([(0.030, 0.031), (0.029, 0.030)], 1)]
    kb.append("trials", rows, RUN)
    final = {"final": True, "final_budget_s": 60.0, "final_added": "deepen", "epochs": 4}
    kb.append("trials", [{**trial("f1", "child", -0.0341, -0.0355, 7, False), **final}], f"{RUN}-final")
    return kb


def test_a_min_metrics_bundle_shows_its_own_values_and_warns_of_a_worse_final(mse_run: KnowledgeBase, tmp_path):
    """User trial: an MSE's bundle read "Scores (frozen evaluation, higher is better) - selection: -0.0341", and its
    final training, worse than the search's 0.0287, shipped by default without a word."""
    shown = Console(record=True, width=400)
    out = tmp_path / "bundle"
    assert commands.main(["export", RUN, "--kb", str(mse_run.root), "--out", str(out)], shown) == ExitCode.ok
    said = shown.export_text()
    assert "warning: the final training of child scored worse on selection (0.0341) than its best search trial " in (
        said.replace("\n", " ")
    )
    assert f"`export {RUN} --search` ships the search's version" in said.replace("\n", " ")
    scores = json.loads((out / "scores.json").read_text())
    assert (scores["trial_id"], scores["selection_score"], scores["test_score"]) == ("f1", 0.0341, 0.0355)
    assert scores["metric"] == {"name": "mse", "direction": "min"} and "lower is better" in scores["scores_are"]
    assert scores["final_training"]["search_best"] == {
        "trial_id": "c0",
        "selection_score": 0.0287,
        "test_score": 0.0301,
    }
    assert "(0.0341) than its best search trial (0.0287)" in scores["final_training"]["warning"]
    card = (out / "README.md").read_text()
    assert "## Scores (frozen evaluation: mse, lower is better)" in card and "- selection: 0.0341 (trial `f1`)" in card
    assert "**Warning**: the final training of child scored worse" in card and "-0.0" not in card
    assert [s["selection_score"] for s in json.loads((out / "lineage.json").read_text())] == [0.0477, 0.0287]
    ran = _reproduce(out, tmp_path / "work")
    assert ran.returncode == 0, ran.stderr[-2000:]
    printed = json.loads(ran.stdout.strip().splitlines()[-1])
    assert printed["selection_score"] > 1000 and printed["recorded_selection_score"] == 0.0341  # MSEs, not -MSEs
    # User trial: its output named no metric (`selection_score`): now named, its JSON keys kept for scripts
    assert (
        printed["metric"] == "mse" and "selection mse " in ran.stderr and "(recorded 0.0341), test mse " in ran.stderr
    )

    searched = json.loads((export(mse_run.root, RUN, out=tmp_path / "s", search=True) / "scores.json").read_text())
    selection = searched["replicates"]["selection"]
    assert searched["selection_score"] == 0.0287 and selection["mean"] == pytest.approx(0.0295)
    low, high = selection["ci95"]
    assert 0 < low < 0.0295 < high  # the interval of the values, ascending


def test_status_warns_of_a_final_worse_than_the_search_it_would_export(mse_run: KnowledgeBase, tmp_path: Path):
    from ralph_ray.state import CampaignState, RunStatus

    run_dir = tmp_path / "runs" / RUN
    CampaignState(RUN, status=RunStatus.finished, best_selection_score=-0.0287, best_variant_id="child").save(run_dir)
    shown = Console(record=True, width=400)
    argv = ["status", RUN, "--runs", str(tmp_path / "runs"), "--kb", str(mse_run.root)]
    assert commands.main(argv, shown) == ExitCode.ok
    said = shown.export_text()
    assert "final training of the pick child: selection 0.0341, test 0.0355 (export's default)" in said
    assert "warning: the final training of child scored worse on selection (0.0341) than its best search trial " in (
        said
    )
    assert f"`export {RUN} --search` ships the search's version" in said
