"""The final training of the pick: after the search, the rank-1 variant's best knobs train once more, for the share
of the campaign's time kept for it (`safeguards.final_share`), on every slot's CPUs, as one marked trial; or, with
`safeguards.final_candidates` N > 1, the pick and the next N-1 best (variant, knobs) that train other code side by
side, the slots split between them, and the long run's best selection score names the winner (the test split stays
the report's).

The search gives every trial the same short budget (`trial.budget_s`), so a kept change is better training, not
more of it. A careful engineer then trains the winner for longer: this is that step. Its trial is an ordinary trial
(the same trainable, sandbox, frozen scoring) with a longer budget and the `final` mark in the `trials` table: it
never ranks a variant, never counts as a parent's sample, and the leaderboard shows its scores in `final_*` columns.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ralph_ray import records, replicates, sql
from ralph_ray.agents.catalog import load_catalog
from ralph_ray.agents.transforms import NotApplicable, apply_transform
from ralph_ray.config import FINAL_ADDITIONS
from ralph_ray.decision import StopReason
from ralph_ray.finals import final_winner, worse_than_search
from ralph_ray.gate import GateError
from ralph_ray.knobs import with_knobs
from ralph_ray.ledger import STOPPED_WITH_CYCLE, TrialRecord, last_line
from ralph_ray.report import fetch_rows, metric_values
from ralph_ray.trials import FINAL_ADDED_KEY, FINAL_BUDGET_KEY, FINAL_KEY
from ralph_ray.variants import content_hash, files_dir, final_code_dir

if TYPE_CHECKING:
    from ralph_ray.generations import Campaign, Outcome

MIN_BUDGET_S = 10.0  # below this a final training would not reach a second epoch anywhere: skipped
# Kept back from the share for what is not training: the trainer's start, its last evaluation, its predictions and
# their scoring (a quarter of a short share, so a test's 20-s share still trains).
MARGIN_S = 30.0


def budget(share_s: float, left_s: float) -> float:
    """Training seconds for the final trial: the share (or what the campaign has left, if less), less the margin."""
    reserve = min(share_s, left_s)
    return reserve - min(MARGIN_S, reserve / 4)


def resources(
    cpu: float, gpu: float, slots: int, largest_node_cpus: float | None, candidates: int = 1
) -> tuple[float, float]:
    """Each final trial's share: the slots' CPUs split between the `candidates` side by side (capped at the largest
    node's), and their GPU shares likewise (at most one GPU: a trial of more is a data-parallel one, which the final
    training does not run); never less than a search trial had."""
    share = max(1, slots) / max(1, candidates)
    cpus = cpu * share
    if largest_node_cpus:
        cpus = min(cpus, largest_node_cpus)
    return max(cpu, cpus), (min(1.0, max(gpu, gpu * share)) if gpu else 0.0)


def why_not(share: float, stop_reason: str, trained: int, candidates: int, budget_s: float) -> str | None:
    """Why no final training runs (None: it runs): `candidates` found, `trained` of them recorded already."""
    if not share:
        return "off"  # safeguards.final_share=0: nothing to say
    if stop_reason == StopReason.manual_stop.value:
        return "skipped: the campaign was stopped by hand (resume it to finish the search and the final training)"
    if candidates and trained >= candidates:
        return "already trained (recorded in the KB)"
    if not candidates:
        return "skipped: no variant has a completed search trial"
    if budget_s < MIN_BUDGET_S:
        return f"skipped: {budget_s:.0f} s of training left, under {MIN_BUDGET_S:g} s"
    return None


@dataclass(frozen=True)
class Added:
    """What the final training added to a candidate's code, and why not each addition it skipped."""

    files: Path  # the folder the final trial runs: a copy with the additions, or the candidate's own files
    added: tuple[str, ...] = ()  # names of FINAL_ADDITIONS, in the order applied: ("cosine", "shift")
    skipped: tuple[str, ...] = ()  # one line each: "no cosine added (the trainer already has a schedule ...)"

    @property
    def label(self) -> str | None:
        """The additions as the trials table's `final_added` records them: "cosine + shift", None for none."""
        return " + ".join(self.added) or None


@dataclass(frozen=True)
class Plan:
    """What one final trial runs: a candidate (the pick, or one of the next best), its knobs and its code (the budget
    and each trial's share of the slots are the same for every candidate: `_train`'s arguments)."""

    variant_id: str
    knobs: dict[str, Any]
    code: Added  # the candidate's own files, or a copy with safeguards.final_additions added


def with_additions(files: Path, out: Path, names: Sequence[str], entry: str = "train.py") -> Added:
    """The folder the final trial runs: a copy of the candidate's `files` at `out` with the transforms of `names`
    (keys of FINAL_ADDITIONS) applied to its entry in order, each where it applies; or `files` itself when none does.
    A transform that can't find its idiom (`NotApplicable`: the code has a schedule or shifts its images already, its
    epoch loop or classifier has no idiom) is skipped with its reason."""
    source = (files / entry).read_text()
    skipped: list[str] = []

    def add(name: str) -> bool:
        nonlocal source
        try:  # NotApplicable also where libcst can't parse the code (the transforms say so)
            edited = apply_transform(FINAL_ADDITIONS[name], source)
            compile(edited, entry, "exec")
        except NotApplicable as why:
            skipped.append(f"no {name} added ({why})")
            return False
        except SyntaxError as error:
            skipped.append(f"no {name} added (the edited {entry} does not compile: line {error.lineno}: {error.msg})")
            return False
        source = edited
        return True

    added = tuple(name for name in names if add(name))
    if not added:
        return Added(files, skipped=tuple(skipped))
    if out.exists():
        shutil.rmtree(out)  # a resume's pick may differ from the one a stop cut short
    shutil.copytree(files, out)
    (out / entry).write_text(source)
    return Added(out, added, tuple(skipped))


def smoked_additions(
    files: Path, out: Path, names: Sequence[str], smoke: Callable[[Path], None], entry: str = "train.py"
) -> Added:
    """`with_additions`, then the gate's smoke run of the copy; each addition that breaks it is left out, with why."""
    # An addition can compile and still break the pick at run time (flip_averaged on inputs that are not images), and
    # the final is the campaign's last minutes: a failure there would leave the pick untrained. One smoke run (about
    # a second, forked warm) where all is well; one per addition more where something breaks.
    first = with_additions(files, out, names, entry)
    if not first.added:
        return first
    try:
        smoke(first.files)
        return first
    except GateError:
        pass
    try:
        smoke(files)  # a seed or a knob sample never met the gate: where the pick itself fails, no addition is to blame
    except GateError as own:
        untested = f"additions not smoke-tested: the pick's own code fails the smoke run too ({last_line(str(own))})"
        return replace(first, skipped=(*first.skipped, untested))
    kept: list[str] = []
    broke: list[str] = []
    for name in first.added:
        trying = with_additions(files, out, [*kept, name], entry)
        if name not in trying.added:  # it applied only after an addition now left out
            broke.extend(why for why in trying.skipped if why.startswith(f"no {name} added"))
            continue
        try:
            smoke(trying.files)
        except GateError as why:
            broke.append(f"no {name} added (a smoke run of the code with it failed: {last_line(str(why))})")
            continue
        kept.append(name)
    if not kept and out.exists():
        shutil.rmtree(out)  # the last try's copy: the final trains the pick's own files
    again = with_additions(files, out, kept, entry) if kept else Added(files)
    return Added(again.files, again.added, (*first.skipped, *broke, *again.skipped))


def _largest_node_cpus() -> float | None:
    import ray

    cpus = [n.get("Resources", {}).get("CPU", 0.0) for n in ray.nodes() if n.get("Alive")]
    return max(cpus) if cpus else None


def trained_code(files: Path, knobs: dict[str, Any], entry: str = "train.py") -> str:
    """The content hash of what a trial with `knobs` runs: the variant's files with those knobs written in."""
    return content_hash(files, {entry: with_knobs((files / entry).read_text(), knobs).encode()})


Pair = tuple[str, dict[str, Any], Any]  # a candidate (variant, knobs, its variant's cycle), best first


def distinct(found: Sequence[Pair], code: Callable[[str, dict[str, Any]], str], n: int) -> list[Pair]:
    """The first `n` candidates that train different code: a knob child (the parent with its best knobs written in)
    run with those knobs trains exactly what its parent's best trial did, and would take a candidate's slot."""
    seen: set[str] = set()
    kept: list[Pair] = []
    for variant, knobs, cycle in found:
        if len(kept) == n:
            break
        digest = code(variant, knobs)
        if digest not in seen:
            seen.add(digest)
            kept.append((variant, knobs, cycle))
    return kept


def run(campaign: Campaign, outcome: Outcome) -> list[TrialRecord]:
    """Train the candidates' best knobs for the final share; their records (none when it did not run: said why)."""
    cfg, say = campaign.cfg, campaign.console.print
    guards = cfg.safeguards
    if not guards.final_share or guards.campaign_time_s is None:
        return []
    con = campaign.kb.reader()
    searched = [
        (variant, json.loads(knobs or "{}"), cycle)
        for variant, knobs, cycle in con.execute(sql.FINAL_CANDIDATES, [campaign.run_id]).fetchall()
    ]
    variants = campaign.run_dir / "variants"
    found = distinct(searched, lambda v, knobs: trained_code(files_dir(variants, v), knobs), guards.final_candidates)
    recorded = con.execute(sql.FINAL_TRIALS_DONE, [campaign.run_id, STOPPED_WITH_CYCLE]).fetchall()
    done = [(v, json.loads(k or "{}")) for v, k in recorded]
    todo = [(v, knobs, cycle) for v, knobs, cycle in found if (v, knobs) not in done]
    seconds = budget(guards.final_share * guards.campaign_time_s, guards.campaign_time_s - campaign.state.elapsed_s)
    problem = why_not(guards.final_share, outcome.stop_reason, len(found) - len(todo), len(found), seconds)
    if problem is not None:
        say(f"[bold]final training[/]: {problem}")
        return []
    slots = cfg.search.max_concurrent
    cpus, gpus = resources(cfg.resources.cpu, cfg.resources.gpu, slots, _largest_node_cpus(), len(todo))
    plans, code = [], {}
    started = time.monotonic()
    for variant, knobs, _ in todo:
        # a knob search's candidates share their variant's code, smoked with the knobs of the first to train it
        if variant not in code:
            code[variant] = _code(campaign, variant, knobs)
        plans.append(Plan(variant, knobs, code[variant]))
    # the additions' smoke runs came out of the share (seconds where all is well; more where one broke the pick)
    seconds = max(seconds - (time.monotonic() - started), MIN_BUDGET_S)
    device = f"{cpus:g} CPU(s){f' and {gpus:g} GPU' if gpus else ''}"
    share = f"(safeguards.final_share={guards.final_share:g} of {guards.campaign_time_s:g} s)"
    order = [(v, knobs) for v, knobs, _ in found]
    for plan in plans:
        added = f", with {plan.code.label} added to its code" if plan.code.added else ""
        nth = order.index((plan.variant_id, plan.knobs))  # its place among the candidates, a resume's too
        who = "the pick" if nth == 0 else f"candidate {nth + 1}"
        say(
            f"[bold]final training[/] of {who} {plan.variant_id}, its knobs {json.dumps(plan.knobs)}, for "
            f"{seconds:.0f} s{added} on {device} {share}"
        )
    if len(plans) > 1:
        say(f"  {len(plans)} candidates side by side (safeguards.final_candidates): the best selection score wins")
    return _train(campaign, plans, max(1, int(found[0][2] or 1)), seconds, (cpus, gpus))


def unsuited_additions(names: list[str], images: bool | None, mirror_invariant: bool) -> dict[str, str]:
    """The final additions the task rules out, with why: by the catalog entry that carries each addition's transform,
    under the offline agent's own rule (`Intervention.unsuited_to`: shifts and flips only on images, flips only where
    mirroring keeps a label)."""
    entries = {i.transform: i for i in load_catalog() if i.transform}
    refused = {}
    for name in names:
        entry = entries.get(FINAL_ADDITIONS[name])
        why = entry.unsuited_to(images, mirror_invariant) if entry else None
        if why:
            refused[name] = f"no {name} added: {why}"
    return refused


def _code(campaign: Campaign, variant: str, knobs: dict[str, Any]) -> Added:
    """The folder a candidate's final trial runs and what was added to it (the console says why anything was not);
    the smoke runs write in the candidate's `knobs`, as its trial will (a knob sample's batch size, say)."""
    guards, task = campaign.cfg.safeguards, campaign.cfg.task
    names = guards.final_additions
    refused = unsuited_additions(names, task.images, task.mirror_invariant)
    kept = [n for n in names if n not in refused]
    files = files_dir(campaign.run_dir / "variants", variant)
    added = smoked_additions(
        files, final_code_dir(campaign.run_dir, variant), kept, lambda folder: campaign.gate.smoke(folder, knobs)
    )
    added = replace(added, skipped=(*refused.values(), *added.skipped))
    for why in added.skipped:
        campaign.console.print(f"[bold]final training[/] of {variant}: {why}")
    return added


def _train(
    campaign: Campaign, plans: list[Plan], cycle: int, budget_s: float, share: tuple[float, float]
) -> list[TrialRecord]:
    """The plans' trials side by side, through the replicates' runner of fixed points; recorded as each ends, in
    `cycle` (the pick's own: its generation's)."""
    cfg, (cpus, gpus) = campaign.cfg, share
    grace = cfg.trial.grace_s
    final_cfg = replace(
        cfg,
        trial=replace(cfg.trial, budget_s=budget_s),
        resources=replace(cfg.resources, cpu=cpus, gpu=gpus),
        search=replace(cfg.search, max_concurrent=len(plans)),
        safeguards=replace(cfg.safeguards, trial_timeout_s=max(cfg.safeguards.trial_timeout_s, budget_s + grace + 120)),
    )
    ended: list[TrialRecord] = []

    def sink(trial: TrialRecord, epoch_rows: list[dict[str, Any]]) -> None:
        tag = records.trial_part(campaign.run_id, cycle, trial.trial_id)
        campaign.kb.append("epochs", epoch_rows, tag)
        campaign.kb.append("trials", [trial.row()], tag)  # after its epochs: a visible trial always has its curve
        ended.append(trial)

    def marks(plan: Plan) -> dict[str, Any]:
        added = {FINAL_ADDED_KEY: plan.code.label} if plan.code.added else {}
        return {FINAL_KEY: True, FINAL_BUDGET_KEY: budget_s, **added}

    replicates.run(
        final_cfg,
        campaign.run_id,
        cycle,
        campaign.run_dir / "final",
        {plan.variant_id: plan.code.files for plan in plans},
        [{"variant": plan.variant_id, **plan.knobs, **marks(plan)} for plan in plans],
        campaign.data,
        campaign.labels,
        sink,
        campaign.console,
        campaign.run_dir,
        None,
        label="final training",
    )
    sign, _ = metric_values({"direction": cfg.task.direction})  # the report's rule: stored score -> metric value
    say = campaign.console.print
    for trial in ended:
        say(f"[bold]final training[/] of {trial.variant_id}: {line(trial, sign)}")
    if len(ended) < len(plans) or any(t.reason == STOPPED_WITH_CYCLE for t in ended):
        say(
            f"  the final training was cut short by a stop: `python -m ralph_ray resume={campaign.run_id}` "
            "trains it again"
        )
    # Over every final trial of the run (a resume's earlier ones too); one a stop cut short never wins (not completed)
    reader = campaign.kb.reader()
    finals = fetch_rows(reader, sql.FINAL_TRIAL, [campaign.run_id])
    best = final_winner(finals)
    if best is not None:
        which = f"the long run's winner by selection is {best['variant_id']}" if len(finals) > 1 else "done"
        say(
            f"[bold]final training[/]: {which} (export it with its additions and knobs: "
            f"`python -m ralph_ray export {campaign.run_id}`)"
        )
        searched = fetch_rows(reader, sql.LEADERBOARD_ROW, [campaign.run_id, best["variant_id"]])
        if warning := worse_than_search(best, searched[0] if searched else None, lambda score: sign * score):
            say(f"[yellow]warning:[/] {warning.replace('RUN_ID', campaign.run_id)}", highlight=False)
    return ended


def line(trial: TrialRecord | None, sign: float = 1.0) -> str:
    """The final trial's outcome in one line, its scores as the metric's values (`sign` -1: a min metric's)."""
    if trial is None:
        return "no result (the run was stopped)"
    if trial.selection_score is None:
        return f"{trial.status.value}, unscored{': ' + trial.reason if trial.reason else ''}"
    test = f"{sign * trial.test_score:.4f}" if trial.test_score is not None else "-"
    return (
        f"{trial.status.value} after {trial.epochs} epoch(s) in {trial.seconds:.0f} s: selection "
        f"{sign * trial.selection_score:.4f}, test {test}"
    )
