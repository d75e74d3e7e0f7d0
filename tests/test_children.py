"""What the terminal shows of a child (one line, however long the agent's rationale), and what a rejected child
leaves for the next analysis of its parent."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pytest
from sklearn.datasets import load_breast_cancer

from ralph_ray import PROJECT_ROOT, history, records
from ralph_ray.agents.base import Analysis, Diagnosis, Draft, ParentView, Recommendation, Usage
from ralph_ray.agents.heuristic import HeuristicAnalyst, HeuristicCoder
from ralph_ray.agents.siblings import refusals
from ralph_ray.children import Breeder, Child, analysis_note, breed, one_line, seed_child
from ralph_ray.config import AgentConfig
from ralph_ray.gate import Gate, write_smoke_data
from ralph_ray.kb import KnowledgeBase
from ralph_ray.population import Candidate
from ralph_ray.tasks.base import Splits, stratified_split
from ralph_ray.variants import RejectedBy, VariantStatus

TEMPLATE = PROJECT_ROOT / "ralph_ray" / "templates" / "classification"


def test_a_rationale_becomes_its_first_sentence_on_one_line() -> None:
    text = (
        "batchnorm (healthy): Add BatchNorm2d after every conv.\n  Normalised activations keep gradients well "
        "scaled. Answers healthy."
    )
    assert one_line(text) == "batchnorm (healthy): Add BatchNorm2d after every conv."
    assert one_line("no full stop at all") == "no full stop at all"
    long = "word " * 60
    assert len(one_line(long)) == 100 and one_line(long).endswith("...") and "\n" not in one_line(long)


# -----------------------------------------------------------------------------
# A refusal is remembered: real gate, real agents, real KB


def breast_cancer_gate(tmp_path: Path) -> Gate:
    """The gate over a sliver of scikit-learn's breast_cancer (30 table columns, the user trial's task)."""
    x, y = load_breast_cancer(return_X_y=True)
    x, y = x.astype(np.float32), y.astype(np.int64)
    train, selection, test = stratified_split(y, (0.2, 0.2), 0)
    splits = Splits(x[train], y[train], x[selection], y[selection], x[test], y[test], num_classes=2)
    return Gate(write_smoke_data(splits, tmp_path / "smoke", "bc"), (), timeout_s=180)


class Seeded(NamedTuple):
    """A run whose seed is the classification template's MLP (flat features, like the breast_cancer trial's), in
    the KB, as a parent for the breeder."""

    run_id: str
    agent: AgentConfig
    variants_root: Path
    seed: Child
    kb: KnowledgeBase
    parent: Candidate
    view: Callable[[str], ParentView]


def seeded(tmp_path: Path, run_id: str) -> Seeded:
    agent, trainer, variants_root = AgentConfig(), tmp_path / "bc", tmp_path / "variants"
    trainer.mkdir()
    shutil.copy(TEMPLATE / "train.py", trainer / "train.py")
    seed = seed_child(trainer, variants_root)
    kb = KnowledgeBase(tmp_path / "kb")
    kb.init()
    kb.put("variants", records.variant_rows(run_id, 1, [seed], agent), records.part(run_id, 1, "seed"))
    parent = Candidate(seed.variant_id, 0.95, {}, seed.variant_id)

    def view(name: str) -> ParentView:
        return history.parent_view(kb.reader(), run_id, parent, variants_root, tmp_path / name, trainer)

    return Seeded(run_id, agent, variants_root, seed, kb, parent, view)


def test_an_intervention_the_gate_refused_for_a_parent_is_not_proposed_for_it_again(tmp_path: Path) -> None:
    """User trial: the gate refused `augmentation` on a 30-column MLP in all 8 analyses of a campaign (random shifts
    need images), which then bred nothing; now the refusal is in the KB with its parent, and the analyst skips it."""
    run_id, agent, variants_root, seed, kb, parent, view = seeded(tmp_path, "refusal")

    # images=True: the task says nothing stops shifts, so only the gate's smoke run can refuse them (as in the trial)
    analyst = HeuristicAnalyst(images=True)
    first = analyst.analyse(view("baked1"), [], Usage())
    shift = [r for r in first.recommendations if r.intervention == "augmentation"]
    assert shift, first.summary
    breeder = Breeder(
        HeuristicCoder(), breast_cancer_gate(tmp_path), variants_root, tmp_path / "gen2", 1, 1, 1,
        frozenset({seed.variant_id}), None, lambda line: None,
    )  # fmt: skip
    children, _ = breed(breeder, parent, view("baked2"), Analysis(seed.variant_id, [], "", shift))
    [refused] = children
    assert refused.status is VariantStatus.rejected and "shift_images" in (refused.reason or "")
    assert refused.rejected_by is RejectedBy.gate  # the coder gave up on the gate's feedback: the gate's verdict
    assert Child.from_json(json.loads(json.dumps(refused.as_json()))) == refused  # children.json keeps it on resume
    # its files are the draft the gate refused, not the parent's copy the coder's retry left: its own variant
    assert refused.variant_id != seed.variant_id and "shift_images" in refused.diff
    kb.put("variants", records.variant_rows(run_id, 2, children, agent), records.part(run_id, 2, "bred"))

    again = view("baked3")
    assert [(c.variant_id, c.interventions, c.status, c.rejected_by) for c in again.children] == [
        (refused.variant_id, ["augmentation"], "rejected", "gate")
    ]
    second = analyst.analyse(again, [], Usage())
    assert "augmentation" not in [r.intervention for r in second.recommendations]
    assert second.recommendations, "the other interventions are still proposed"
    line = f"- `augmentation`: refused for this parent (child {refused.variant_id}): smoke run failed"
    assert line in second.summary and "shift_images" in second.summary
    # the analysis lands in the cycle's row, and the not_applicable view shows the refusal with the gate's words
    note = analysis_note(parent, second)
    kb.put("cycles", [records.cycle_row(run_id, 2, 0, None, children, tmp_path, note)], records.part(run_id, 2, "c"))
    reasons = dict(
        kb.reader()
        .execute(
            "select intervention, reason from not_applicable where run_id = ? and parent_id = ?",
            [run_id, seed.variant_id],
        )
        .fetchall()
    )
    assert reasons["augmentation"].startswith(f"refused for this parent (child {refused.variant_id}): smoke run")


def test_an_edit_the_offline_coder_cannot_apply_is_recorded_and_not_asked_for_again(tmp_path: Path) -> None:
    """User trial: the analyst's dry run passed `augmentation` on a trainer whose batch loop sits in a helper, the
    coder's real edit could not place it; the rejected child was the parent's code, so it had the parent's id, was
    never recorded, and the next pick asked for it again: 5 times in a row, then 4 picks gave no child and the
    campaign stopped on gate failures. Now it is a variant of its own (`REJECTED.md` says why), rejected by `code`."""
    run_id, agent, variants_root, seed, kb, parent, view = seeded(tmp_path, "cannot")

    breeder = Breeder(
        HeuristicCoder(), breast_cancer_gate(tmp_path), variants_root, tmp_path / "gen2", 1, 1, 1,
        frozenset({seed.variant_id}), None, lambda line: None,
    )  # fmt: skip
    wanted = Recommendation("adamw_optimizer", Diagnosis.healthy, "as a dry run that passed would rank it")
    [child], _ = breed(breeder, parent, view("baked1"), Analysis(seed.variant_id, [], "", [wanted]))
    assert child.status is VariantStatus.rejected and child.rejected_by is RejectedBy.code
    assert child.variant_id != seed.variant_id and "cannot apply adamw_optimizer" in child.diff  # its note, its id
    assert (child.files_dir / "train.py").read_text() == (seed.files_dir / "train.py").read_text()
    kb.put("variants", records.variant_rows(run_id, 2, [child], agent), records.part(run_id, 2, "bred"))
    again = view("baked2")
    assert [(c.variant_id, c.rejected_by) for c in again.children] == [(child.variant_id, "code")]
    assert refusals(again)["adamw_optimizer"].startswith(f"refused for this parent (child {child.variant_id}): coder")


def test_ctrl_c_while_breeding_starts_no_further_attempt(tmp_path: Path) -> None:
    """Ctrl-C in the middle of a parent's children: the attempts not yet started never start (each is a coder call and
    a smoke run, an LLM's up to its timeout); before, leaving the pool waited for every queued one."""
    trainer = tmp_path / "bc"
    trainer.mkdir()
    shutil.copy(TEMPLATE / "train.py", trainer / "train.py")
    variants_root = tmp_path / "variants"
    seed = seed_child(trainer, variants_root)
    parent = Candidate(seed.variant_id, 0.95, {}, seed.variant_id)
    kb = KnowledgeBase(tmp_path / "kb")
    kb.init()
    view = history.parent_view(kb.reader(), "r", parent, variants_root, tmp_path / "baked", trainer)
    recommendations = HeuristicAnalyst().analyse(view, [], Usage()).recommendations[:3]
    assert len(recommendations) == 3
    calls: list[str] = []

    class Interrupted(HeuristicCoder):
        """A coder the user's Ctrl-C reaches during its first call."""

        def write(self, *args, **kwargs):  # noqa: ANN002, ANN003, ANN201 - the Coder's own signature
            calls.append(args[1].intervention)
            raise KeyboardInterrupt

    breeder = Breeder(
        Interrupted(), breast_cancer_gate(tmp_path), variants_root, tmp_path / "gen2", 3, 1, 1,
        frozenset({seed.variant_id}), None, lambda line: None,
    )  # fmt: skip
    with pytest.raises(KeyboardInterrupt):
        breed(breeder, parent, view, Analysis(seed.variant_id, [], "", recommendations))
    assert calls == [recommendations[0].intervention]  # one worker: the other two were queued, and never started


def test_every_gate_refusal_is_recorded_even_when_a_retry_passes(tmp_path: Path) -> None:
    """User trial: a hostile child's first draft imported the engine, the gate refused it, the retry passed and was
    kept, and the refusal showed only on the console. Now each refusal is an events.jsonl line and in the child."""
    run_id, agent, variants_root, seed, kb, parent, view = seeded(tmp_path, "hostile")
    drafts: list[str | None] = []

    class Hostile(HeuristicCoder):
        """A coder whose first draft reaches for the engine's task module, and whose second is harmless."""

        def write(self, parent, recommendation, workdir, feedback, usage):  # noqa: ANN001, ANN201 - the Coder's
            drafts.append(feedback)
            train = workdir / "train.py"
            line = "from ralph_ray.tasks import digits\n" if feedback is None else "# tuned\n"
            train.write_text(line + train.read_text())
            return Draft(workdir, [recommendation.intervention], "peek at the labels")

    breeder = Breeder(
        Hostile(), breast_cancer_gate(tmp_path), variants_root, tmp_path / "gen2", 1, 1, 1,
        frozenset({seed.variant_id}), None, lambda line: None,
    )  # fmt: skip
    rec = Recommendation("tta_ensemble", Diagnosis.healthy, "average views", 1.0)
    [child] = breed(breeder, parent, view("baked"), Analysis(seed.variant_id, [], "", [rec]))[0]

    assert child.status is VariantStatus.candidate and child.attempts == 2 and drafts[1] is not None
    [refusal] = child.refusals
    assert refusal.startswith("attempt 1: train.py line 1: imports ralph_ray.tasks")
    assert json.loads((child.files_dir.parent / "meta.json").read_text())["refusals"] == [refusal]
    assert Child.from_json(json.loads(json.dumps(child.as_json()))) == child  # children.json keeps them on resume
    events = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert [(e["event"], e["run_id"], e["parent_id"], e["attempt"], e["interventions"]) for e in events] == [
        ("gate_refused", tmp_path.name, seed.variant_id, 1, ["tta_ensemble"])
    ]
    assert events[0]["reason"] == refusal.removeprefix("attempt 1: ")


def test_analysis_md_shows_a_min_metrics_parent_score_as_its_own_value():
    """User trial: an MSE run's analysis.md read "## parent ... (selection -0.0477)" (the KB's oriented score)."""
    parent = Candidate("v1", -0.0477, {"LR": 0.01}, "v1")
    analysis = Analysis("v1", [Diagnosis.overfitting], "it overfits", [])
    assert analysis_note(parent, analysis, sign=-1.0).startswith("## parent v1 (selection 0.0477)\n")
    assert "(selection -0.0477)" in analysis_note(parent, analysis)  # a max metric's score is shown as stored


def test_every_child_of_a_cycle_gets_a_first_point_and_a_knob_search_childs_is_not_its_parents_best() -> None:
    # Review: knob-search children got no first point, so in the barrier loop a child's trials were Optuna's draws
    # of the variant: with 2 parents, 2 trials a child, a child got none about 1 time in 8.
    from ralph_ray.children import KNOB_SEARCH
    from ralph_ray.config import KnobSpace, SpaceKind
    from ralph_ray.search import first_points
    from ralph_ray.space import clip_to_space

    space = {"LR": KnobSpace(SpaceKind.loguniform, 0.001, 0.3), "WIDTH": KnobSpace(SpaceKind.choice, values=[8, 16])}
    own = {"LR": 0.05, "WIDTH": 16}

    def child(variant: str, interventions: list[str]) -> Child:
        return Child(variant, "v0", Path(variant), interventions, "", "", VariantStatus.candidate, None, "", own, 0.9)

    children = [child("a", [KNOB_SEARCH]), child("b", [KNOB_SEARCH]), child("c", ["raise_lr"]), child("d", ["x"])]
    for relative in (True, False):
        points = first_points(children, {"d"}, space, relative, 2.0, 7)
        assert [p["variant"] for p in points] == ["a", "b", "c"]  # "d" already tried (a resumed cycle)
        mine = clip_to_space(own, space, relative)
        assert points[2] == {"variant": "c", **mine}  # a coder's child runs its own knobs first
        assert all({k: v for k, v in p.items() if k != "variant"} != mine for p in points[:2]), points
        assert points == first_points(children, {"d"}, space, relative, 2.0, 7)  # drawn once, from the plan's seed


@pytest.mark.slow
@pytest.mark.parametrize(("mode", "parents"), [("generations", 1), ("async", 1), ("generations", 2)])
def test_a_knob_search_child_does_not_rerun_its_parents_best_trial(
    ray_session, tmp_path: Path, mode: str, parents: int
) -> None:
    """User trial (agent=none): each knob-search child's first trial ran its parent's best knobs with the same seed,
    so it scored exactly the parent's best (half of each child's trials), and the two identical models tied at rank 1.

    Review: with no first point of its own, a child of the barrier loop (2 parents, 2 trials a child) was left to
    Optuna's draw of the variant, and got no trial about 1 time in 8: each child still gets a (drawn) first point.
    """
    from ralph_ray.campaign import run
    from ralph_ray.config import load_config
    from ralph_ray.kb import open_reader

    cfg = load_config(
        [
            f"paths.runs={tmp_path / 'runs'}",
            f"paths.kb={tmp_path / 'kb'}",
            f"population.mode={mode}",
            "run_id=knobchild",
            "agent=none",
            "search.num_samples=2",
            "safeguards.replicates=0",
            "search.max_concurrent=2",
            "scheduler=fifo",  # every trial completes: each has a score to compare
            "safeguards.trial_timeout_s=180",
            "+search.space.EPOCHS={type: choice, values: [2]}",
            f"population.parents={parents}",
            "population.children_per_parent=1",
            "population.trials_per_child=2",
            "population.breeder_nice=0",
            f"safeguards.max_cycles={parents + 1}",  # the 2-parent cycle needs a child beside the seed
        ]
    )
    outcome = run(cfg)
    assert outcome.exit_code == 0, outcome.stop_reason
    con = open_reader(outcome.kb_root)
    per_child = con.execute(
        "select v.variant_id, count(t.trial_id) from variants v left join trials t on t.run_id = v.run_id and "
        "t.variant_id = v.variant_id and not coalesce(t.replicate, false) and not coalesce(t.final, false) "
        "where v.run_id = 'knobchild' and v.status != 'seed' group by v.variant_id"
    ).fetchall()
    assert len(per_child) >= parents and all(n >= 1 for _, n in per_child), per_child
    trials = con.execute(
        "select t.variant_id, v.status, t.knobs, t.selection_score from trials t join variants v using (run_id, "
        "variant_id) where t.run_id = 'knobchild' and not coalesce(t.replicate, false) and not coalesce(t.final, false)"
    ).fetchall()
    seed_knobs = [json.loads(knobs) for _, status, knobs, _ in trials if status == "seed"]
    child_knobs = [json.loads(knobs) for _, status, knobs, _ in trials if status != "seed"]
    assert seed_knobs and len(child_knobs) >= 2, trials
    assert [k for k in child_knobs if k in seed_knobs] == [], (seed_knobs, child_knobs)
    # Each child's trials against its own parent's (a 2-parent cycle breeds from a child too)
    repeats = con.execute(
        "select c.variant_id, c.knobs from trials c join variants v using (run_id, variant_id) join trials p on "
        "p.run_id = c.run_id and p.variant_id = v.parent_id and p.knobs = c.knobs where c.run_id = 'knobchild' "
        "and not coalesce(c.replicate, false) and not coalesce(c.final, false)"
    ).fetchall()
    assert repeats == [], repeats
