"""The export bundle's scores: the replicates' mean with its 95% Student-t interval (the leaderboard's), in
scores.json and the model card; a KB written by the real writer, no campaign."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from scipy import stats

from ralph_ray.export import export
from ralph_ray.kb import KnowledgeBase, open_reader

RUN = "scored"
REPLICATES = [(0.88, 0.86), (0.90, 0.90), (0.92, 0.91)]  # (selection, test) of three fresh seeds


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
