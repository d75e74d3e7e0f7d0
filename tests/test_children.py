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
