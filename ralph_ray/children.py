"""Growing a cycle's children: the seed, analyse each parent, ask the coder for edits (or make knob children),
pass each through the gate, and once trained give each its verdict (the rule is decision.child_verdict).

A gate failure goes back to the coder with the error for a bounded number of retries; then the child is
recorded as rejected with its reason. Nothing a bad child does stops the campaign: every agent or gate
error becomes a rejected child, never an exception out of this module.
"""

from __future__ import annotations

import json
import shutil
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from ralph_ray.agents.base import (
    AgentConfigError,
    AgentError,
    Analysis,
    Analyst,
    CannotApply,
    Coder,
    Diagnosis,
    InterventionEffect,
    ParentView,
    Recommendation,
    Usage,
)
from ralph_ray.decision import child_verdict
from ralph_ray.eventlog import write_event
from ralph_ray.gate import Gate, GateError
from ralph_ray.knobs import read_knobs, with_knobs
from ralph_ray.noise import Comparison
from ralph_ray.population import Candidate
from ralph_ray.variants import (
    TRAINER_FILES,
    RejectedBy,
    VariantStatus,
    files_dir,
    seed_snapshot,
    snapshot,
    unified_diff,
)


@dataclass
class Child:
    """One child of this cycle, accepted or rejected."""

    variant_id: str
    parent_id: str
    files_dir: Path
    interventions: list[str]
    diagnosis: str
    rationale: str
    status: VariantStatus
    reason: str | None
    diff: str
    own_knobs: dict[str, Any]
    parent_score: float | None
    attempts: int = 1
    usage: Usage = field(default_factory=Usage)
    rejected_by: RejectedBy | None = None  # what rejected it (status rejected), else None
    refusals: list[str] = field(default_factory=list)  # every gate refusal of its attempts ("attempt N: why")

    def as_json(self) -> dict[str, Any]:
        """For children.json (resume reads it back)."""
        return {
            **self.__dict__,
            "files_dir": str(self.files_dir),
            "status": self.status.value,
            "usage": self.usage.__dict__,
            "rejected_by": self.rejected_by.value if self.rejected_by else None,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Child:
        """Inverse of as_json."""
        return cls(
            **{
                **data,
                "files_dir": Path(data["files_dir"]),
                "status": VariantStatus(data["status"]),
                "usage": Usage(**data["usage"]),
                # children.json written before the field: the KB's legacy rule (heuristic.refusals) reads the reason
                "rejected_by": RejectedBy(data["rejected_by"]) if data.get("rejected_by") else None,
            }
        )


class CampaignBudget:
    """The campaign's agent budgets (safeguards.tokens_per_campaign, cost_per_campaign) while children are written:
    what was spent before plus every call made since (analysis, each attempt and its retries, from any thread).
    A coder call is made only while it is not spent, so the overshoot is the calls already in flight."""

    def __init__(
        self,
        tokens: int | None,
        cost: float | None,
        spent_tokens: int,
        spent_cost: float,
        price_in_per_m: float,
        price_out_per_m: float,
    ) -> None:
        self.tokens, self.cost = tokens, cost
        self.spent_tokens, self.spent_cost = spent_tokens, spent_cost
        self.prices = (price_in_per_m, price_out_per_m)
        self._usages: list[Usage] = []  # live: an agent adds each call to its Usage as it returns
        self._lock = threading.Lock()

    def track(self, usage: Usage) -> Usage:
        """Count `usage` (and whatever is added to it later) against the budgets; returns it."""
        with self._lock:
            self._usages.append(usage)
        return usage

    def spent(self) -> str | None:
        """Why no further agent call may be made (a budget the decision engine stops the campaign on), else None."""
        with self._lock:
            tokens_in = sum(u.tokens_in for u in self._usages)
            tokens_out = sum(u.tokens_out for u in self._usages)
        tokens = self.spent_tokens + tokens_in + tokens_out
        cost = self.spent_cost + (tokens_in * self.prices[0] + tokens_out * self.prices[1]) / 1e6
        if self.tokens is not None and tokens > self.tokens:
            return f"safeguards.tokens_per_campaign={self.tokens} spent ({tokens} tokens)"
        if self.cost is not None and cost > self.cost:
            return f"safeguards.cost_per_campaign={self.cost:g} spent (agents cost {cost:.4f})"
        return None


@dataclass(frozen=True)
class Breeder:
    """Everything the children step needs, decided by the orchestrator."""

    coder: Coder | None
    gate: Gate
    variants_root: Path
    cycle_dir: Path
    children_per_parent: int
    max_retries: int
    concurrency: int
    known_variants: frozenset[str]  # ids already in this run: a child identical to one of them is no child
    token_budget_left: int | None  # None: unlimited
    log: Callable[[str], None]
    campaign_budget: CampaignBudget | None = None  # None: no campaign budget, or checked only between batches
    # Every coder attempt's usage, from its start: a failure mid-way (a key revoked, Ctrl-C) records what the attempts
    # spent (`spent_so_far`), which the children it never returns would have carried.
    attempts: list[Usage] = field(default_factory=list)

    def spent_so_far(self) -> Usage:
        """What every coder attempt started so far has spent."""
        total = Usage()
        for usage in list(self.attempts):
            total.add(usage)
        return total


def bake(parent_files: Path, knobs: dict[str, Any], out: Path, entry: str = "train.py") -> Path:
    """The parent as its best trial ran it: its files with that trial's knobs written in."""
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(parent_files, out)
    (out / entry).write_text(with_knobs((out / entry).read_text(), knobs))
    return out


def seed_child(
    trainer_dir: Path,
    variants_root: Path,
    patterns: Sequence[str] = TRAINER_FILES,
    log: Callable[[str], None] | None = None,
) -> Child:
    """Cycle 1's only child: the seed trainer as given (the task folder's `patterns`), the root of every lineage."""
    made = seed_snapshot(trainer_dir, variants_root, patterns)
    seed = made.variant
    if made.left_out and log:
        shown = ", ".join(made.left_out[:5]) + (f" and {len(made.left_out) - 5} more" if len(made.left_out) > 5 else "")
        log(
            f"  not shipped to trials (task.trainer_files: {', '.join(patterns)}): {shown}; a file the trainer needs "
            "goes in task.yaml's task.trainer_files (never labelled held-out data)"
        )
    (seed.files_dir.parent / "diff.patch").write_text("")
    knobs = read_knobs((seed.files_dir / "train.py").read_text())
    return Child(
        seed.variant_id,
        "",
        seed.files_dir,
        [],
        Diagnosis.healthy.value,
        "the seed trainer",
        VariantStatus.seed,
        None,
        "",
        knobs,
        None,
    )


def analysis_note(parent: Candidate, analysis: Analysis, sign: float = 1.0) -> str:
    """One parent's section of the cycle's analysis.md, its score as the metric's value (`sign` -1: a min metric's,
    stored as -value)."""
    diagnoses = ", ".join(d.value for d in analysis.diagnoses) or "-"
    return (
        f"## parent {parent.variant_id} (selection {sign * parent.selection_score:.4f})\n\n"
        f"diagnoses: {diagnoses}\n\n{analysis.summary}\n"
    )


def analysis_json(analysis: Analysis) -> dict[str, Any]:
    """One parent's entry of recommendations.json (the write phase, resumed or not, reads it back)."""
    return {
        "diagnoses": [d.value for d in analysis.diagnoses],
        "summary": analysis.summary,
        "recommendations": [{**asdict(r), "diagnosis": r.diagnosis.value} for r in analysis.recommendations],
    }


def analysis_from_json(variant_id: str, entry: dict[str, Any] | None) -> Analysis:
    """Inverse of analysis_json; no entry (no analyst ran) is an empty analysis."""
    entry = entry or {"diagnoses": [], "summary": "", "recommendations": []}
    return Analysis(
        variant_id,
        [Diagnosis(d) for d in entry["diagnoses"]],
        entry["summary"],
        [Recommendation(**{**r, "diagnosis": Diagnosis(r["diagnosis"])}) for r in entry["recommendations"]],
    )


def analyse_parents(
    analyst: Analyst | None,
    parents: list[Candidate],
    view: Callable[[Candidate], ParentView],
    effects: list[InterventionEffect],
    shown: int,
    log: Callable[[str], None],
    sign: float = 1.0,
) -> tuple[list[str], dict[str, Any], list[tuple[str, Usage]]]:
    """Every parent diagnosed: its analysis.md section, its recommendations.json entry, and what each call cost.

    Each parent's view is built even without an analyst (agent=none): it bakes the knob children's code.
    `shown`: how many of a parent's top recommendations the log names (the children it will get); `sign` -1: a min
    metric's scores, shown as its values.
    """
    notes: list[str] = []
    recs: dict[str, Any] = {}
    spent: list[tuple[str, Usage]] = []
    for parent in parents:
        parent_view = view(parent)
        if analyst is None:
            continue
        analysis, usage = analyse(analyst, parent_view, effects, log)
        spent.append((parent.variant_id, usage))
        notes.append(analysis_note(parent, analysis, sign))
        recs[parent.variant_id] = analysis_json(analysis)
        top = ", ".join(r.intervention for r in analysis.recommendations[:shown])
        diagnoses = ", ".join(recs[parent.variant_id]["diagnoses"]) or "-"
        log(f"  {parent.variant_id}: {diagnoses} -> {top or 'no recommendation'}")
    return notes, recs, spent


def grow(
    breeder: Breeder,
    parents: list[Candidate],
    view: Callable[[Candidate], ParentView],
    recs: dict[str, Any],
    baked: Callable[[str], Path],
) -> tuple[list[Child], list[tuple[str, Usage]]]:
    """Every parent's children: bred from its recommendations, or (no coder) its knob child from `baked(parent id)`.

    Also returns what the attempts that produced no child cost, per parent (budgets count them).
    """
    children: list[Child] = []
    wasted: list[tuple[str, Usage]] = []
    for parent in parents:
        if breeder.coder is None:
            children.append(knob_child(parent, baked(parent.variant_id), breeder.variants_root))
            breeder.log(
                f"  child {children[-1].variant_id} of {parent.variant_id}: knob search "
                f"(best knobs {parent.best_knobs})"
            )
            continue
        analysis = analysis_from_json(parent.variant_id, recs.get(parent.variant_id))
        grown, spent = breed(breeder, parent, view(parent), analysis)
        children.extend(grown)
        if spent.calls:  # attempts that only reproduced a known variant still cost tokens
            wasted.append((f"{parent.variant_id}:duplicates", spent))
    passed = sum(c.status is VariantStatus.candidate for c in children)
    breeder.log(f"  validate: {passed} of {len(children)} children passed the gate")
    return children, wasted


def judge(
    children: list[Child],
    scores: dict[str, tuple[float, float | None]],
    trials: dict[str, tuple[int, int, int]],
    min_delta: float,
    comparisons: dict[str, Comparison] | None = None,
) -> None:
    """Give each candidate its verdict (decision.child_verdict) from its best score and its (run, failed, cut by the
    campaign's stop) trials; where `comparisons` has one (replicates on), from its replicates against its parent's."""
    for child in children:
        if child.status is VariantStatus.candidate:
            score = scores.get(child.variant_id, (None, None))[0]
            ran, failed, cut = trials.get(child.variant_id, (0, 0, 0))
            child.status, child.reason = child_verdict(
                ran,
                failed,
                score,
                child.parent_score,
                min_delta,
                child.reason,
                (comparisons or {}).get(child.variant_id),
                cut,
            )


def analyse(
    analyst: Analyst, view: ParentView, effects: list[InterventionEffect], log: Callable[[str], None]
) -> tuple[Analysis, Usage]:
    """The analyst's reading of one parent; an analyst failure becomes an empty analysis with the reason."""
    usage = Usage()
    try:
        return analyst.analyse(view, effects, usage), usage
    except AgentError as err:
        log(f"  analyst failed on {view.variant_id}: {err}")
        return Analysis(view.variant_id, [], f"analyst failed: {err}", []), usage


def breed(breeder: Breeder, parent: Candidate, view: ParentView, analysis: Analysis) -> tuple[list[Child], Usage]:
    """Children of one parent: the top recommendations, each written, gated and retried.

    Also returns what the attempts that produced no child (duplicates of known variants) cost, so budgets count them.
    """
    recommendations = list(analysis.recommendations)
    children: list[Child] = []
    seen = set(breeder.known_variants)
    lock = threading.Lock()
    wasted = Usage()

    stop = threading.Event()  # set by the first attempt that raises: the queued ones then never start

    def attempt(index: int, rec: Recommendation) -> Child | None:
        if stop.is_set():
            return None
        usage = breeder.campaign_budget.track(Usage()) if breeder.campaign_budget else Usage()
        breeder.attempts.append(usage)
        try:
            child = _one_child(breeder, parent, view, rec, index, seen, lock, usage)
        except BaseException:
            stop.set()  # a pool worker takes the next queued attempt before the caller can cancel it
            raise
        if child is None:
            with lock:
                wasted.add(usage)
        elif child.rejected_by is RejectedBy.budget and breeder.campaign_budget and breeder.campaign_budget.spent():
            stop.set()  # the campaign's budget is spent: the queued attempts never call the coder
        return child

    # First pass: the top choices concurrently; then top up from the rest when some were duplicates.
    first, rest = recommendations[: breeder.children_per_parent], recommendations[breeder.children_per_parent :]
    pool = ThreadPoolExecutor(max_workers=breeder.concurrency)
    try:
        children = [c for c in pool.map(lambda pair: attempt(*pair), enumerate(first)) if c is not None]
    except BaseException:
        # Ctrl-C (or a crash): the attempts not yet started never start (each is a coder call and a smoke run, an
        # LLM's up to its timeout); the one in flight ends on its own, and exit waits for it.
        stop.set()
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown()
    index = len(first)
    while len(children) < breeder.children_per_parent and rest:
        child = attempt(index, rest.pop(0))
        index += 1
        if child is not None:
            children.append(child)
    return children, wasted


# The agent_usage label (after the parent's id in the async run) of what coder attempts a failure cut short spent.
INTERRUPTED_USAGE = "interrupted"

# A child rejected before the gate saw a draft: the parent's code and this note (its diff says why).
REJECTION_NOTE = "REJECTED.md"


def _one_child(
    breeder: Breeder,
    parent: Candidate,
    view: ParentView,
    rec: Recommendation,
    index: int,
    seen: set[str],
    lock: threading.Lock,
    usage: Usage,
) -> Child | None:
    """Write, gate, retry. None when the result duplicates a known variant (the slot goes to the next idea)."""
    assert breeder.coder is not None
    workdir = breeder.cycle_dir / "drafts" / f"{parent.variant_id}-{index:02d}"
    refused = workdir.with_name(f"{workdir.name}-refused")  # the last draft the gate refused
    if refused.exists():
        shutil.rmtree(refused)
    feedback: str | None = None
    reason: str | None = None
    rejected_by: RejectedBy | None = None
    rationale = rec.rationale
    interventions = [rec.intervention]
    refusals: list[str] = []
    for attempt in range(1, breeder.max_retries + 2):
        if breeder.token_budget_left is not None and usage.tokens > breeder.token_budget_left:
            reason, rejected_by = f"token budget for this cycle spent after {usage.tokens} tokens", RejectedBy.budget
            break
        if breeder.campaign_budget is not None and (spent := breeder.campaign_budget.spent()):
            reason, rejected_by = f"{spent} before coder call {attempt}", RejectedBy.budget
            break
        if workdir.exists():
            shutil.rmtree(workdir)
        shutil.copytree(view.files_dir, workdir)
        try:
            draft = breeder.coder.write(view, rec, workdir, feedback, usage)
        except CannotApply as err:
            reason, rejected_by = f"coder: {err}", RejectedBy.gate if feedback is not None else RejectedBy.code
            break
        except AgentError as err:
            # After a refusal the coder gave up on the gate's feedback (the heuristic one always does): the gate's.
            reason, rejected_by = f"coder: {err}", RejectedBy.gate if feedback is not None else RejectedBy.coder
            break
        except AgentConfigError:
            raise  # a key revoked, a model gone: the campaign's failure (exit 2), which every next call would meet
        except Exception as err:  # noqa: BLE001 - a coder backend's own bug rejects this child, never the campaign
            reason, rejected_by = f"coder crashed: {type(err).__name__}: {err}", RejectedBy.coder
            break
        interventions, rationale = draft.interventions or interventions, draft.rationale or rationale
        try:
            breeder.gate.check(workdir, view.files_dir)
        except GateError as err:
            feedback = reason = str(err)
            rejected_by = RejectedBy.gate
            breeder.log(f"    gate refused {parent.variant_id} + {rec.intervention} (attempt {attempt}): {err}")
            # Each refusal is recorded, not only the last: a child that tried an engine import and then passed kept
            # no trace of it but the console (user trial). The variants dir's folder is the run dir (rundir).
            refusals.append(f"attempt {attempt}: {err}")
            write_event(
                breeder.variants_root.parent,
                "gate_refused",
                parent_id=parent.variant_id,
                interventions=interventions,
                attempt=attempt,
                reason=str(err),
            )
            if refused.exists():
                shutil.rmtree(refused)
            workdir.rename(refused)
            continue
        variant = snapshot(workdir, breeder.variants_root, parent_id=parent.variant_id)
        with lock:
            if variant.variant_id in seen:
                return None
            seen.add(variant.variant_id)
        return _child(
            breeder,
            parent,
            view,
            rec,
            variant.variant_id,
            variant.files_dir,
            interventions,
            rationale,
            VariantStatus.candidate,
            None,
            attempt,
            usage,
            refusals=refusals,
        )
    # Rejected: keep the last draft the gate refused (else the last attempt's files) so the diff shows what went wrong.
    # A retry starts from the parent's copy, so a coder that then gave up (the heuristic one always does) left the
    # parent's code: such a child was the parent's variant, never recorded, and its refusal was proposed again.
    files = refused if refused.exists() else workdir
    if files is workdir:
        # No draft the gate saw: the coder wrote nothing or gave up (the offline one: its edit met no idiom it knows).
        # The parent's code alone would be the parent's variant, never recorded, so the refusal was never
        # remembered and the same pick asked for it again and again (user trial: 5 times in a row, then 4 picks
        # in a row gave no child). Its note makes it a variant of its own, the reason in its diff.
        if not workdir.exists():
            shutil.copytree(view.files_dir, workdir)
        (workdir / REJECTION_NOTE).write_text(f"# Rejected: {' + '.join(interventions)}\n\n{reason}\n")
    variant = snapshot(files, breeder.variants_root, parent_id=parent.variant_id)
    return _child(
        breeder,
        parent,
        view,
        rec,
        variant.variant_id,
        variant.files_dir,
        interventions,
        rationale,
        VariantStatus.rejected,
        reason,
        breeder.max_retries + 1,
        usage,
        rejected_by,
        refusals,
    )


def _child(
    breeder: Breeder,
    parent: Candidate,
    view: ParentView,
    rec: Recommendation,
    variant_id: str,
    files_dir: Path,
    interventions: list[str],
    rationale: str,
    status: VariantStatus,
    reason: str | None,
    attempts: int,
    usage: Usage,
    rejected_by: RejectedBy | None = None,
    refusals: list[str] | None = None,
) -> Child:
    diff = unified_diff(view.files_dir, files_dir)
    (files_dir.parent / "diff.patch").write_text(diff)
    own = read_knobs((files_dir / "train.py").read_text()) if status is VariantStatus.candidate else {}
    child = Child(
        variant_id,
        parent.variant_id,
        files_dir,
        interventions,
        rec.diagnosis.value if isinstance(rec.diagnosis, Diagnosis) else str(rec.diagnosis),
        rationale,
        status,
        reason,
        diff,
        own,
        parent.selection_score,
        attempts,
        usage,
        rejected_by,
        list(refusals or []),
    )
    write_meta(child)
    verdict = "ok" if status is VariantStatus.candidate else f"REJECTED ({reason})"
    # One line per child; the full rationale is in the variant's meta.json, the KB (variants.rationale) and the app.
    breeder.log(
        f"  child {variant_id} of {parent.variant_id}: {' + '.join(interventions)} [{child.diagnosis}] -> {verdict}"
        f"; why: {one_line(rationale)}"
    )
    return child


def write_meta(child: Child) -> None:
    """The child's variants/<id>/meta.json as it stands (its status and reason once judged), without its diff."""
    (child.files_dir.parent / "meta.json").write_text(
        json.dumps({k: v for k, v in child.as_json().items() if k != "diff"}, indent=2, default=str)
    )


KNOB_SEARCH = "knob_search"  # the intervention of agent=none's child: its parent's code, its best knobs written in


def reruns_parent(child: Child) -> bool:
    """Whether the child's own knobs would rerun its parent's best trial: a knob-search child is its parent's code
    with those knobs written in, and search trials share one seed, so that trial would repeat the parent's score
    exactly (a user trial: half of each child's trials, and two identical models tied at rank 1).

    Such a child starts with knob samples instead. Not the same knobs under a new seed: that trial would measure seed
    noise (the replicates' job), and a child judged by its best trial would beat its parent on it by chance alone."""
    return child.interventions == [KNOB_SEARCH]


def one_line(text: str, width: int = 100) -> str:
    """The first sentence of `text` on one line, cut to `width` characters."""
    head, stop, _ = " ".join(text.split()).partition(". ")
    first = head + "." if stop else head  # the sentence keeps its full stop
    return first if len(first) <= width else first[: width - 3].rstrip() + "..."


def knob_child(parent: Candidate, baked: Path, variants_root: Path) -> Child:
    """agent=none: the child is the parent with its best knobs written in (knob search hill-climbs)."""
    variant = snapshot(baked, variants_root, parent_id=parent.variant_id)
    own = read_knobs((variant.files_dir / "train.py").read_text())
    diff = unified_diff(files_dir(variants_root, parent.variant_id), variant.files_dir)
    (variant.files_dir.parent / "diff.patch").write_text(diff)
    return Child(
        variant.variant_id,
        parent.variant_id,
        variant.files_dir,
        [KNOB_SEARCH],
        Diagnosis.healthy.value,
        "knob search only (agent=none): the parent with its best trial's knobs",
        VariantStatus.candidate,
        None,
        diff,
        own,
        parent.selection_score,
        1,
        Usage(),
    )
