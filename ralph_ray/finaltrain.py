"""The final training of the pick: after the search, the rank-1 variant's best knobs train once more, for the share
of the campaign's time kept for it (`safeguards.final_share`), on every slot's CPUs, as one marked trial.

The search gives every trial the same short budget (`trial.budget_s`), so a kept change is better training, not
more of it. A careful engineer then trains the winner for longer: this is that step. Its trial is an ordinary trial
(the same trainable, sandbox, frozen scoring) with a longer budget and the `final` mark in the `trials` table: it
never ranks a variant, never counts as a parent's sample, and the leaderboard shows its scores in `final_*` columns.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ralph_ray import records, replicates, sql
from ralph_ray.agents.transforms import NotApplicable, apply_transform
from ralph_ray.config import FINAL_SCHEDULES
from ralph_ray.decision import StopReason
from ralph_ray.ledger import STOPPED_WITH_CYCLE, TrialRecord
from ralph_ray.report import metric_values
from ralph_ray.trials import FINAL_KEY, FINAL_SCHEDULE_KEY

if TYPE_CHECKING:
    from ralph_ray.generations import Campaign, Outcome

MIN_BUDGET_S = 10.0  # below this a final training would not reach a second epoch anywhere: skipped
# Kept back from the share for what is not training: the trainer's start, its last evaluation, its predictions and
# their scoring (a quarter of a short share, so a test's 20-s share still trains).
MARGIN_S = 30.0


@dataclass(frozen=True)
class Plan:
    """What the final training runs: the pick, its knobs, its budget and its resources."""

    variant_id: str
    knobs: dict[str, Any]
    budget_s: float
    cpus: float
    gpus: float
    cycle: int  # the pick's own cycle (generation): its trials', this one's too
    files: Path  # the code it runs: the pick's own, or a copy with the schedule added
    schedule: str | None = None  # the schedule added to that copy (safeguards.final_schedule), None: as searched


def budget(share_s: float, left_s: float) -> float:
    """Training seconds for the final trial: the share (or what the campaign has left, if less), less the margin."""
    reserve = min(share_s, left_s)
    return reserve - min(MARGIN_S, reserve / 4)


def resources(cpu: float, gpu: float, slots: int, largest_node_cpus: float | None) -> tuple[float, float]:
    """The final trial runs alone: every slot's CPUs (capped at the largest node's), and the slots' GPU shares added
    (at most one GPU: a trial of more is a data-parallel one, which the final training does not run)."""
    cpus = cpu * max(1, slots)
    if largest_node_cpus:
        cpus = min(cpus, largest_node_cpus)
    return max(cpu, cpus), (min(1.0, gpu * max(1, slots)) if gpu else 0.0)


def why_not(share: float, stop_reason: str, recorded: int, pick: str | None, budget_s: float) -> str | None:
    """Why no final training runs (None: it runs)."""
    if not share:
        return "off"  # safeguards.final_share=0: nothing to say
    if stop_reason == StopReason.manual_stop.value:
        return "skipped: the campaign was stopped by hand (resume it to finish the search and the final training)"
    if recorded:
        return "already trained (recorded in the KB)"
    if pick is None:
        return "skipped: no variant has a completed search trial"
    if budget_s < MIN_BUDGET_S:
        return f"skipped: {budget_s:.0f} s of training left, under {MIN_BUDGET_S:g} s"
    return None


def with_schedule(files: Path, out: Path, schedule: str | None, entry: str = "train.py") -> tuple[Path, str | None]:
    """The folder the final trial runs and the schedule it added: a copy of the pick's `files` with `schedule` added
    to its entry (`out`), or `files` itself and None when there is none to add, with the reason said by the caller
    (`NotApplicable`: the pick has a schedule already, or its epoch loop has no idiom a schedule can follow)."""
    if schedule is None:
        return files, None
    # NotApplicable also where libcst can't parse the code (the transforms say so), or the edit would not compile
    source = apply_transform(FINAL_SCHEDULES[schedule], (files / entry).read_text())
    try:
        compile(source, entry, "exec")
    except SyntaxError as error:
        raise NotApplicable(f"the edited {entry} does not compile (line {error.lineno}: {error.msg})") from None
    if out.exists():
        shutil.rmtree(out)  # a resume's pick may differ from the one a stop cut short
    shutil.copytree(files, out)
    (out / entry).write_text(source)
    return out, schedule


def _largest_node_cpus() -> float | None:
    import ray

    cpus = [n.get("Resources", {}).get("CPU", 0.0) for n in ray.nodes() if n.get("Alive")]
    return max(cpus) if cpus else None


def run(campaign: Campaign, outcome: Outcome) -> TrialRecord | None:
    """Train the pick's best knobs for the final share; its record, or None when it did not run (said why)."""
    cfg, say = campaign.cfg, campaign.console.print
    guards = cfg.safeguards
    if not guards.final_share or guards.campaign_time_s is None:
        return None
    con = campaign.kb.reader()
    board = con.execute(sql.PICK_FOR_RUN, [campaign.run_id]).fetchone()
    pick, knobs, cycle = (board[0], json.loads(board[1] or "{}"), board[2]) if board else (None, {}, None)
    recorded = con.execute(sql.FINAL_TRIALS_DONE, [campaign.run_id, pick, STOPPED_WITH_CYCLE]).fetchone()[0]
    seconds = budget(guards.final_share * guards.campaign_time_s, guards.campaign_time_s - campaign.state.elapsed_s)
    problem = why_not(guards.final_share, outcome.stop_reason, recorded, pick, seconds)
    if problem is not None:
        say(f"[bold]final training[/]: {problem}")
        return None
    assert pick is not None
    cpus, gpus = resources(cfg.resources.cpu, cfg.resources.gpu, cfg.search.max_concurrent, _largest_node_cpus())
    files = campaign.run_dir / "variants" / pick / "files"
    try:
        files, schedule = with_schedule(files, campaign.run_dir / "final" / "code" / pick, guards.final_schedule)
    except NotApplicable as why:
        schedule = None
        say(f"[bold]final training[/]: no {guards.final_schedule} schedule added ({why}): the code trains as searched")
    plan = Plan(pick, knobs, seconds, cpus, gpus, max(1, int(cycle or 1)), files, schedule)
    added = f", with a {plan.schedule} schedule added along it" if plan.schedule else ""
    say(
        f"[bold]final training[/] of the pick {plan.variant_id} (rank 1), its best knobs {json.dumps(plan.knobs)}, "
        f"for {plan.budget_s:.0f} s{added} on {plan.cpus:g} CPU(s){f' and {plan.gpus:g} GPU' if plan.gpus else ''} "
        f"(safeguards.final_share={guards.final_share:g} of {guards.campaign_time_s:g} s)"
    )
    return _train(campaign, plan)


def _train(campaign: Campaign, plan: Plan) -> TrialRecord | None:
    """One trial of the plan, through the replicates' runner of fixed points; recorded as it ends."""
    cfg = campaign.cfg
    grace = cfg.trial.grace_s
    final_cfg = replace(
        cfg,
        trial=replace(cfg.trial, budget_s=plan.budget_s),
        resources=replace(cfg.resources, cpu=plan.cpus, gpu=plan.gpus),
        search=replace(cfg.search, max_concurrent=1),
        safeguards=replace(
            cfg.safeguards, trial_timeout_s=max(cfg.safeguards.trial_timeout_s, plan.budget_s + grace + 120)
        ),
    )
    cycle = plan.cycle
    ended: list[TrialRecord] = []
    marks: dict[str, Any] = {FINAL_KEY: True, **({FINAL_SCHEDULE_KEY: plan.schedule} if plan.schedule else {})}

    def sink(trial: TrialRecord, epoch_rows: list[dict[str, Any]]) -> None:
        tag = records.trial_part(campaign.run_id, cycle, trial.trial_id)
        campaign.kb.append("epochs", epoch_rows, tag)
        campaign.kb.append("trials", [trial.row()], tag)  # after its epochs: a visible trial always has its curve
        ended.append(trial)

    replicates.run(
        final_cfg,
        campaign.run_id,
        cycle,
        campaign.run_dir / "final",
        {plan.variant_id: plan.files},
        [{"variant": plan.variant_id, **plan.knobs, **marks}],
        campaign.data,
        campaign.labels,
        sink,
        campaign.console,
        campaign.run_dir,
        None,
        label="final training",
    )
    trial = ended[0] if ended else None
    sign, _ = metric_values({"direction": cfg.task.direction})  # the report's rule: stored score -> metric value
    campaign.console.print(f"[bold]final training[/]: {line(trial, sign)}")
    if trial is None or trial.reason == STOPPED_WITH_CYCLE:
        campaign.console.print(
            f"  the final training was cut short by a stop: `python -m ralph_ray resume={campaign.run_id}` "
            "trains it again"
        )
    return trial


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
