"""The final training of the pick (safeguards.final_share): its budget and resources, when it is skipped,
and a real campaign that trains its rank-1 variant once more as a marked trial."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from ralph_ray import PROJECT_ROOT, finaltrain, sql, warmstart
from ralph_ray.__main__ import main
from ralph_ray.campaign import run
from ralph_ray.config import resume_config
from ralph_ray.export import export
from ralph_ray.gate import Gate, GateError, write_smoke_data
from ralph_ray.kb import KnowledgeBase, open_reader
from ralph_ray.tasks.digits import prepare
from ralph_ray.variants import files_dir

sys.path.insert(0, str(Path(__file__).parent))
from test_async import rows, tiny  # noqa: E402


def test_the_budget_is_the_share_less_a_margin_and_never_more_than_the_campaign_has_left():
    assert finaltrain.budget(360.0, 400.0) == 360.0 - finaltrain.MARGIN_S
    assert finaltrain.budget(360.0, 200.0) == 200.0 - finaltrain.MARGIN_S  # the search ran over: what is left
    assert finaltrain.budget(20.0, 100.0) == 15.0  # a short share keeps three quarters for training


def test_the_final_trial_takes_every_slot_capped_at_the_largest_node():
    assert finaltrain.resources(1.0, 0.0, 2, 2.0) == (2.0, 0.0)
    assert finaltrain.resources(1.0, 0.0, 8, 4.0) == (4.0, 0.0)  # it must fit on one node
    assert finaltrain.resources(2.0, 0.0, 1, 1.0) == (2.0, 0.0)  # never less than a search trial had
    assert finaltrain.resources(1.0, 0.25, 4, 16.0) == (4.0, 1.0)  # trials shared a GPU: the whole GPU
    assert finaltrain.resources(1.0, 1.0, 4, 16.0) == (4.0, 1.0)  # one GPU per trial (more needs data parallel)


def test_candidates_side_by_side_split_the_slots():
    assert finaltrain.resources(1.0, 0.0, 2, 2.0, candidates=2) == (1.0, 0.0)  # one core each on 2 cores
    assert finaltrain.resources(1.0, 0.25, 4, 16.0, candidates=2) == (2.0, 0.5)  # half the GPU each
    assert finaltrain.resources(1.0, 0.25, 4, 16.0, candidates=4) == (1.0, 0.25)  # a slot's share each
    assert finaltrain.resources(2.0, 1.0, 2, 16.0, candidates=2) == (2.0, 1.0)  # never less than a search trial


def test_the_candidates_are_the_pick_then_the_next_best_variant_and_knobs(tmp_path: Path):
    kb = KnowledgeBase(tmp_path / "kb")
    kb.init()

    def trial(trial_id: str, variant: str, lr: float, score: float | None, **more: object) -> dict:
        knobs = json.dumps({"LR": lr})
        return {"run_id": "r", "cycle": 1, "trial_id": trial_id, "variant_id": variant, "knobs": knobs, **more} | {
            "status": more.get("status", "completed"),
            "selection_score": score,
            "seconds": 1.0,
            "epochs": 2,
        }

    kb.append(
        "trials",
        [
            trial("t1", "v1", 0.1, 0.95),
            trial("t2", "v1", 0.2, 0.93),  # the pick's other knobs: a candidate of its own (a knob search's case)
            trial("t3", "v1", 0.1, 0.94),  # the same pair again: one candidate, by its best trial
            trial("t4", "v2", 0.1, 0.94),
            trial("t5", "v3", 0.1, 0.99, final=True),  # a final trial never makes a candidate
            trial("t6", "v4", 0.1, None, status="failed"),
        ],
        "r-t",
    )
    con = open_reader(tmp_path / "kb")

    found = con.execute(sql.FINAL_CANDIDATES, ["r"]).fetchall()
    # the pick first (what PICK_FOR_RUN gave before candidates), then each other pair once, no more than were scored
    assert [(variant, json.loads(knobs)["LR"]) for variant, knobs, _ in found] == [
        ("v1", 0.1),
        ("v2", 0.1),
        ("v1", 0.2),
    ]
    assert con.execute(sql.FINAL_CANDIDATES, ["other"]).fetchall() == []


def test_a_knob_child_run_with_its_parents_knobs_is_no_second_candidate(tmp_path: Path):
    # The parent, and its knob child: the same code with the parent's best knobs (LR 0.1) written in as defaults.
    trainer = "LR = {lr}  # the step size\nEPOCHS = 2\nprint(LR, EPOCHS)\n"
    folders = {}
    for variant, lr in (("parent", 0.5), ("child", 0.1)):
        folders[variant] = tmp_path / variant
        folders[variant].mkdir()
        (folders[variant] / "train.py").write_text(trainer.format(lr=lr))
        (folders[variant] / "data.txt").write_text("shared")

    def code(variant: str, knobs: dict) -> str:
        return finaltrain.trained_code(folders[variant], knobs)

    found = [
        ("parent", {"LR": 0.1, "EPOCHS": 2}, 1),
        ("child", {"LR": 0.1, "EPOCHS": 2}, 2),  # what the parent's best trial trained, again
        ("child", {"LR": 0.2, "EPOCHS": 2}, 2),
        ("parent", {"LR": 0.3, "EPOCHS": 2}, 1),
    ]
    assert finaltrain.distinct(found, code, 2) == [found[0], found[2]]
    assert finaltrain.distinct(found, code, 9) == [found[0], found[2], found[3]]
    assert finaltrain.distinct(found, code, 1) == [found[0]]
    # other files count: a child whose data differs is other code under the same knobs
    (folders["child"] / "data.txt").write_text("its own")
    assert finaltrain.distinct(found, code, 2) == found[:2]


@pytest.mark.parametrize(
    ("share", "reason", "recorded", "pick", "budget", "said"),
    [
        (0.0, "campaign_time", 0, 1, 100.0, "off"),
        (0.2, "manual_stop", 0, 1, 100.0, "stopped by hand"),
        (0.2, "campaign_time", 1, 1, 100.0, "already trained"),
        (0.2, "campaign_time", 2, 2, 100.0, "already trained"),
        (0.2, "no_trial_completed", 0, 0, 100.0, "no variant has a completed search trial"),
        (0.2, "campaign_time", 0, 1, 5.0, "5 s of training left"),
    ],
)
def test_why_the_final_training_is_skipped(share, reason, recorded, pick, budget, said):
    problem = finaltrain.why_not(share, reason, recorded, pick, budget)
    assert problem is not None and said in problem
    assert finaltrain.why_not(0.2, "campaign_time", 0, 1, 100.0) is None
    assert finaltrain.why_not(0.2, "campaign_time", 1, 2, 100.0) is None  # a resume trains the one a stop cut short


def test_the_schedule_is_added_to_a_copy_of_the_picks_code_where_it_has_none(tmp_path: Path):
    files = tmp_path / "pick"
    files.mkdir()
    seed = (PROJECT_ROOT / "trainers" / "fashion" / "train.py").read_text()
    (files / "train.py").write_text(seed)
    (files / "notes.txt").write_text("kept")
    added = finaltrain.with_additions(files, tmp_path / "final", ["cosine"])
    assert (added.files, added.added, added.label, added.skipped) == (tmp_path / "final", ("cosine",), "cosine", ())
    edited = (added.files / "train.py").read_text()
    assert 'harness.lr_factor(step, EPOCHS, anneal="cosine")' in edited and ".step()" in edited
    assert (added.files / "notes.txt").read_text() == "kept"
    assert (files / "train.py").read_text() == seed  # the pick's own code is never touched
    compile(edited, "train.py", "exec")
    # A pick with that schedule already: not added twice, and the reason is given (the code trains as searched).
    (files / "train.py").write_text(edited)
    again = finaltrain.with_additions(files, tmp_path / "again", ["cosine"])
    assert again.files == files and again.added == () and again.label is None
    assert again.skipped[0].startswith("no cosine added (") and "already has a schedule" in again.skipped[0]
    assert not (tmp_path / "again").exists()
    assert finaltrain.with_additions(files, tmp_path / "none", []) == finaltrain.Added(files)
    assert not (tmp_path / "none").exists()
    # Code libcst can't parse is skipped with the reason (the final trains it as searched), never a crash.
    (files / "train.py").write_text("print('ran')\nmatch = (\n")
    broken = finaltrain.with_additions(files, tmp_path / "broken", ["cosine"])
    assert broken.files == files and "does not parse" in broken.skipped[0]


def test_augmentation_is_added_beside_the_schedule_where_the_pick_has_none(tmp_path: Path):
    files = tmp_path / "pick"
    files.mkdir()
    (files / "train.py").write_text((PROJECT_ROOT / "trainers" / "fashion" / "train.py").read_text())
    added = finaltrain.with_additions(files, tmp_path / "final", ["cosine", "shift", "flip"])
    assert (added.label, added.skipped) == ("cosine + shift + flip", ())
    edited = (added.files / "train.py").read_text()
    assert "shift_images(" in edited and "flip_images(" in edited and "lr_factor(" in edited
    compile(edited, "train.py", "exec")
    # A pick that shifts its images already gets the flip alone, and says why not the shift.
    (files / "train.py").write_text(finaltrain.apply_transform("shift_augmentation", (files / "train.py").read_text()))
    partly = finaltrain.with_additions(files, tmp_path / "partly", ["shift", "flip"])
    assert partly.added == ("flip",)
    assert partly.skipped[0].startswith("no shift added (") and "already shifts" in partly.skipped[0]
    assert (partly.files / "train.py").read_text().count("def shift_images(") == 1


def test_a_hidden_layer_is_added_before_the_classifier_where_the_pick_builds_one(tmp_path: Path):
    files = tmp_path / "pick"
    files.mkdir()
    seed = (PROJECT_ROOT / "trainers" / "fashion" / "train.py").read_text()
    (files / "train.py").write_text(seed)
    added = finaltrain.with_additions(files, tmp_path / "final", ["deepen"])
    assert (added.files, added.added, added.skipped) == (tmp_path / "final", ("deepen",), ())
    edited = (added.files / "train.py").read_text()
    assert edited.count("torch.nn.ReLU()") == seed.count("torch.nn.ReLU()") + 1 and "torch.nn.Sequential(" in edited
    assert (files / "train.py").read_text() == seed
    # The edited trainer builds and runs its model: one more Linear before the classifier, logits as wide as before.
    import torch

    built = {}
    exec(compile(edited, "train.py", "exec"), built)  # __name__ is not "__main__": defines, does not train
    model = built["Net"](8, 10, 0.0)
    assert sum(isinstance(m, torch.nn.Linear) for m in model.modules()) == 2
    assert model(torch.zeros(2, 1, 28, 28)).shape == (2, 10)
    # A trainer whose classifier is a bare function of weights (no nn.Linear): skipped with the reason, trained as is.
    functional = (Path(__file__).parent / "fixtures" / "trainers" / "functional_mlp" / "train.py").read_text()
    (files / "train.py").write_text(functional)
    kept = finaltrain.with_additions(files, tmp_path / "kept", ["deepen"])
    assert kept.files == files and not kept.added and not (tmp_path / "kept").exists()
    assert kept.skipped == ("no deepen added (no nn.Conv2d / nn.Linear layers (a functional model of plain tensors?))",)


def test_flips_at_test_time_are_added_where_the_pick_evaluates_its_model(tmp_path: Path):
    files = tmp_path / "pick"
    files.mkdir()
    seed = (PROJECT_ROOT / "trainers" / "fashion" / "train.py").read_text()
    (files / "train.py").write_text(seed)
    added = finaltrain.with_additions(files, tmp_path / "final", ["cosine", "deepen", "flip_tta"])
    assert (added.label, added.skipped) == ("cosine + deepen + flip_tta", ())
    edited = (added.files / "train.py").read_text()
    # evaluate() and predict() average each image's outputs with its mirror's; training's forward pass is left alone
    assert edited.count("flip_averaged(model, as_input(") == 2 and "def flip_averaged(" in edited
    assert (files / "train.py").read_text() == seed
    # The edited trainer's evaluation runs: the outputs of an image and its mirror, averaged.
    import torch

    built = {}
    exec(compile(edited, "train.py", "exec"), built)
    model = built["Net"](8, 10, 0.0).eval()
    x = torch.randn(3, 1, 28, 28)
    with torch.no_grad():
        assert torch.allclose(built["flip_averaged"](model, x), (model(x) + model(x.flip(-1))) / 2, atol=1e-6)
    # A pick that averages over mirrors already is left as it is, with the reason.
    (files / "train.py").write_text(edited)
    kept = finaltrain.with_additions(files, tmp_path / "kept", ["flip_tta"])
    assert kept.files == files and not kept.added and not (tmp_path / "kept").exists()
    assert kept.skipped == ("no flip_tta added (the trainer already averages over mirrored inputs at test time)",)


def test_an_addition_that_breaks_the_picks_smoke_run_is_left_out_with_the_reason(tmp_path: Path):
    # A pick whose inputs are (N, 1, 1, 8, 8) one-frame clips (its model flattens the frame axis away): flip_tta
    # applies and compiles, then flip_averaged refuses 5-D inputs at run time. The cosine schedule runs.
    fixture = (Path(__file__).parent / "fixtures" / "trainers" / "sequential_flat" / "train.py").read_text()
    source = fixture.replace("dtype=torch.float32)", "dtype=torch.float32).unsqueeze(1)").replace(
        "    nn.Conv2d(1, 16, 3, padding=1),", "    nn.Flatten(1, 2),\n    nn.Conv2d(1, 16, 3, padding=1),"
    )
    assert source.count(".unsqueeze(1)") == 3 and "nn.Flatten(1, 2)" in source
    files = tmp_path / "pick"
    files.mkdir()
    (files / "train.py").write_text(source)
    # Smoke runs forked from a warm server (trial.warm), as a campaign's gate makes them: a dozen here
    gate = Gate(write_smoke_data(prepare(0, 0.2, 0.2), tmp_path / "smoke", "digits"), (), timeout_s=120, warm=True)
    try:
        _smoke_the_additions(gate, files, source, fixture, tmp_path)
    finally:
        warmstart.close_all()


def _smoke_the_additions(gate: Gate, files: Path, source: str, fixture: str, tmp_path: Path) -> None:
    """The test above, with its warm server up."""
    gate.smoke(files)  # the pick as searched runs
    unsmoked = finaltrain.with_additions(files, tmp_path / "unsmoked", ["flip_tta", "cosine"])
    assert unsmoked.added == ("flip_tta", "cosine")  # both apply and compile...
    with pytest.raises(GateError, match="flip_averaged"):
        gate.smoke(unsmoked.files)  # ...and together they do not run
    added = finaltrain.smoked_additions(files, tmp_path / "final", ["flip_tta", "cosine"], gate.smoke)
    assert (added.files, added.added) == (tmp_path / "final", ("cosine",))
    assert len(added.skipped) == 1 and added.skipped[0].startswith(
        "no flip_tta added (a smoke run of the code with it failed: "
    )
    assert "flip_averaged" in added.skipped[0] and "\n" not in added.skipped[0]
    edited = (added.files / "train.py").read_text()
    cosine_only = finaltrain.with_additions(files, tmp_path / "cosine", ["cosine"]).files / "train.py"
    assert "flip_averaged" not in edited and edited == cosine_only.read_text()
    gate.smoke(added.files)  # what the final runs, runs
    assert (files / "train.py").read_text() == source  # the pick's own code is never touched
    # Where nothing breaks, one smoke run of everything added and the additions as with_additions made them.
    smoked: list[Path] = []
    fine = finaltrain.smoked_additions(files, tmp_path / "fine", ["cosine"], smoked.append)
    assert (fine.added, smoked) == (("cosine",), [tmp_path / "fine"])
    # Where every addition breaks the run, the final trains the pick's own files.
    only = finaltrain.smoked_additions(files, tmp_path / "only", ["flip_tta"], gate.smoke)
    assert (only.files, only.added) == (files, ()) and "flip_averaged" in only.skipped[0]
    assert not (tmp_path / "only").exists()
    # A pick that fails the sliver's smoke run itself (it needs the full data: a seed or a knob sample never met the
    # gate): no addition is to blame, so all are kept, and the reason says they went untested.
    needy = tmp_path / "needy"
    needy.mkdir()
    (needy / "train.py").write_text(
        fixture.replace(
            "data = harness.load_data()\n",
            "data = harness.load_data()\nassert len(data.train_x) > 1000, 'needs the full data'\n",
        )
    )
    untested = finaltrain.smoked_additions(needy, tmp_path / "needy_final", ["cosine"], gate.smoke)
    assert untested.added == ("cosine",) and untested.files == tmp_path / "needy_final"
    assert untested.skipped[-1].startswith("additions not smoke-tested: the pick's own code fails the smoke run too (")
    assert "needs the full data" in untested.skipped[-1]


def test_a_campaign_trains_its_pick_once_more_for_the_share_kept_for_it(
    ray_session, tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    # Two candidates side by side: a knob search's pick and the next best (variant, knobs) it searched.
    outcome = run(
        tiny(
            tmp_path,
            "run_id=fin",
            "agent=none",
            "trial.budget_s=2",
            "trial.grace_s=20",
            "safeguards.max_cycles=1000",
            "safeguards.plateau_cycles=1000",
            "safeguards.campaign_time_s=60",
            "safeguards.final_share=0.5",
            # digits: mirroring changes a digit, so no flips, in training or at test (said why)
            "safeguards.final_additions=[cosine,shift,flip,deepen,flip_tta]",
            "safeguards.final_candidates=2",
        )
    )
    assert outcome.stop_reason == "campaign_time"
    said = capsys.readouterr().out
    assert "with cosine + shift + deepen added to its code" in said
    assert "2 candidates side by side" in said
    for flips in ("flip", "flip_tta"):
        assert f"no {flips} added: the task says mirroring changes an input's label" in said
    con = open_reader(outcome.kb_root)
    # ties (one selection image is 1/360 here) go to the first written, as every winner rule takes the first maximum
    finals = rows(
        con, "select * from trials where run_id = 'fin' and final order by selection_score desc, written_at", []
    )
    assert len(finals) == 2 and all(f["status"] == "completed" and not f["replicate"] for f in finals)
    assert finals[0]["knobs"] != finals[1]["knobs"]
    board = rows(con, "select * from leaderboard where run_id = 'fin' order by rank, variant_id", [])
    pick = board[0]
    # The pick's best knobs and the next best (variant, knobs) of the search: the seed's next knob set, or a
    # knob-search child's where one ties the seed's score (one image apart is common here).
    searched_best: dict[tuple[str, str], float] = {}
    for r in rows(
        con,
        """select variant_id, knobs, selection_score from trials where run_id = 'fin' and status = 'completed'
           and not final and not coalesce(replicate, false) and selection_score is not null""",
        [],
    ):
        key = (r["variant_id"], r["knobs"])
        searched_best[key] = max(searched_best.get(key, r["selection_score"]), r["selection_score"])
    candidates = {(f["variant_id"], f["knobs"]) for f in finals}
    picks = sorted(c for c in candidates if c[0] == pick["variant_id"] and searched_best[c] == pick["selection_score"])
    assert picks, (candidates, pick)  # the pick's best knobs are trained (two tied knob sets: either is the pick's)
    (next_pair,) = candidates - {picks[0]}
    pick_pair = picks[0]
    # ...and the best other pair that trains other code: a knob child run with its parent's best knobs does not
    variants = outcome.run_dir / "variants"

    def trained(pair: tuple[str, str]) -> str:
        return finaltrain.trained_code(files_dir(variants, pair[0]), json.loads(pair[1]))

    others = [score for pair, score in searched_best.items() if trained(pair) != trained(pick_pair)]
    assert searched_best[next_pair] == max(others)
    assert trained(next_pair) != trained(pick_pair)

    def searched_knobs(variant_id: str) -> list[dict]:
        return rows(
            con,
            """select knobs, selection_score from trials where run_id = 'fin' and variant_id = ?
               and status = 'completed' and not final order by selection_score desc""",
            [variant_id],
        )

    best = [
        json.loads(r["knobs"])
        for r in searched_knobs(pick["variant_id"])
        if r["selection_score"] == pick["selection_score"]
    ]
    assert any(json.loads(f["knobs"]) in best for f in finals)  # the pick's best knobs, as searched...
    assert all(
        json.loads(f["knobs"]) in [json.loads(r["knobs"]) for r in searched_knobs(f["variant_id"])] for f in finals
    )
    winner = finals[0]  # the best selection score of the long runs
    assert f"the long run's winner by selection is {winner['variant_id']}" in said
    by_variant = {row["variant_id"]: row for row in board}
    assert by_variant[winner["variant_id"]]["final_test_score"] == winner["test_score"]
    assert pick["final_selection_score"] is not None
    assert pick["best_trial_id"] not in {f["trial_id"] for f in finals}  # it never ranks: the best is a search trial
    # It ran the pick's code with a cosine schedule, shifts of its images (digits: no flips, mirroring changes a digit)
    # and a hidden layer before its classifier added; the variant's own code is as searched.
    assert all(f["final_added"] == "cosine + shift + deepen" for f in finals)
    ran = (Path(winner["work_dir"]) / "train.py").read_text()
    assert "lr_factor(" in ran and "shift_images(" in ran and "flip_images(" not in ran and "flip_averaged(" not in ran
    assert "torch.nn.Sequential(torch.nn.Linear(" in ran
    assert "lr_factor(" not in (outcome.run_dir / "variants" / pick["variant_id"] / "files" / "train.py").read_text()
    assert all(
        r["final_added"] is None for r in rows(con, "select * from trials where run_id = 'fin'", []) if not r["final"]
    )
    assert all(row["final_test_score"] is None for row in board if row["variant_id"] not in {v for v, _ in candidates})
    trained = dict(
        con.execute(
            "select trial_id, max(value) from epochs where run_id = 'fin' and metric = 'train_seconds' group by all"
        ).fetchall()
    )
    # budget(30 s, what is left) trains ~22 s each; the search trials had 2 s (+ one epoch past it at most)
    final_ids = {f["trial_id"] for f in finals}
    assert all(trained[t] > 10 for t in final_ids)
    assert max(s for t, s in trained.items() if t not in final_ids) < 10
    # Left out of every search figure: the replicate spread of shared knobs, the progress timeline, the cycle counts,
    # the report's cost front (they trained longer than any sample).
    for final in finals:
        same = con.execute(
            """select count(*) from trials where run_id = 'fin' and variant_id = ? and knobs = ?
               and status = 'completed' and not final""",
            [final["variant_id"], final["knobs"]],
        ).fetchone()[0]
        spreads = {(v, k): n for v, k, n, _, _ in con.execute(sql.APP_REPLICATES, ["fin"]).fetchall()}
        assert spreads.get((final["variant_id"], final["knobs"]), 1) == same
    assert not final_ids & {r[0] for r in con.execute(sql.TRIAL_TIMELINE, ["fin"]).fetchall()}
    per_cycle = sum(n for _, n in con.execute(sql.TRIALS_PER_CYCLE, ["fin"]).fetchall())
    assert per_cycle == con.execute("select count(*) from trials where run_id = 'fin' and not final").fetchone()[0]
    decision = con.execute("select rationale from decisions where run_id = 'fin' order by cycle desc").fetchone()[0]
    assert "search time 30s" in decision
    report = (outcome.run_dir / "report" / "final_report.md").read_text()
    assert "## Final training of the pick" in report and all(t in report for t in final_ids)
    assert "(its code with cosine + shift + deepen added)" in report
    assert f"The long run's winner by selection: **{winner['variant_id']}** (trial {winner['trial_id']})" in report
    front = report.split("## Score against cost")[1].split("\n## ")[0]
    assert not any(t in front for t in final_ids)

    assert main(["status", "fin", "--runs", str(tmp_path / "runs"), "--kb", str(tmp_path / "kb")]) == 0
    shown = capsys.readouterr().out
    assert f"final training of 2 candidates, won by {winner['variant_id']}: selection" in shown
    assert f"test {winner['test_score']:.4f}" in shown

    # `export` ships the winner as its long run trained it (the schedule, its knobs and budget); --search the pick's
    # best search trial, as searched.
    assert "export it with its additions and knobs: `python -m ralph_ray export fin`" in said
    shipped = export(outcome.kb_root, "fin", out=tmp_path / "final_bundle")
    scores = json.loads((shipped / "scores.json").read_text())
    assert scores["trial_id"] == winner["trial_id"] and scores["budget_s"] == winner["final_budget_s"] > 10
    assert "lr_factor(" in (shipped / "trainer" / "train.py").read_text()
    assert "torch.nn.Sequential(torch.nn.Linear(" in (shipped / "trainer" / "train.py").read_text()
    assert scores["final_training"]["added"] == ["cosine", "shift", "deepen"]
    searched_bundle = export(outcome.kb_root, "fin", out=tmp_path / "search_bundle", search=True)
    searched = json.loads((searched_bundle / "scores.json").read_text())
    # the pick's best search trial: the leaderboard's, which breaks ties on selection (1/360 here) the same way on
    # every read
    assert searched["trial_id"] == pick["best_trial_id"] and searched["trial_id"] not in final_ids
    assert searched["selection_score"] == pick["selection_score"]
    assert "lr_factor(" not in (searched_bundle / "trainer" / "train.py").read_text()

    # A resume (raised limits not reached) finds both final trainings recorded and runs neither again.
    again = run(resume_config(outcome.run_dir))
    assert again.stop_reason == "campaign_time"
    assert open_reader(outcome.kb_root).execute("select count(*) from trials where final").fetchone()[0] == 2


@pytest.mark.parametrize(
    ("images", "mirror_invariant", "refused"),
    [
        (True, True, {}),
        (None, True, {}),  # unknown: nothing ruled out on that alone
        (True, False, {"flip": "mirroring", "flip_tta": "mirroring"}),  # digits
        (False, True, {"shift": "not images", "flip": "not images", "flip_tta": "not images"}),  # a table's columns
        (False, False, {"shift": "not images", "flip": "not images", "flip_tta": "not images"}),
    ],
)
def test_the_task_rules_out_shifts_and_flips_off_images_and_flips_where_mirroring_changes_a_label(
    images: bool | None, mirror_invariant: bool, refused: dict[str, str]
):
    names = ["cosine", "shift", "flip", "deepen", "flip_tta"]
    ruled_out = finaltrain.unsuited_additions(names, images, mirror_invariant)
    assert {name: ("not images" if "not images" in why else "mirroring") for name, why in ruled_out.items()} == refused
    assert all(why.startswith(f"no {name} added: the task") for name, why in ruled_out.items())
