"""The barrier loop (population.mode=generations): each cycle runs its phases in order, saving state after each.

    cycle 1:   the seed trainer, knob search only (the baseline every child is measured against)
    cycle n>1: select (history, population) -> analyse, write + gate (children) -> train (search.run_cycle)
               -> record (decision.child_verdict, records) -> decide (history, decision)

Every phase reads its inputs from the run dir (rundir) or the KB (history) and leaves its outputs there before
`state.json` moves on, so a campaign killed at any point resumes at the phase it was in (`resume=<run_id>`).
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
from rich.console import Console
from rich.markup import escape

from ralph_ray import history, records, replicates
from ralph_ray.agents import make_agents
from ralph_ray.agents.base import ParentView
from ralph_ray.children import (
    INTERRUPTED_USAGE,
    Breeder,
    CampaignBudget,
    Child,
    analyse_parents,
    grow,
    judge,
    seed_child,
)
from ralph_ray.config import Config, sandbox_policy
from ralph_ray.control import stop_requested
from ralph_ray.decision import (
    CUT_BY_STOP_REASON,
    NO_SCORE_REASON,
    StopReason,
    budgets_line,
    decide,
    gate_fail_streak,
)
from ralph_ray.exit_codes import ExitCode
from ralph_ray.gate import Gate
from ralph_ray.kb import RESUME_WOULD, KnowledgeBase, own_damaged
from ralph_ray.ledger import SCORING_FAILED, STOPPED_WITH_CYCLE, TrialRecord
from ralph_ray.peakmemory import GpuUse
from ralph_ray.population import Candidate, select_parents
from ralph_ray.raycluster import ensure_ray
from ralph_ray.rundir import CampaignError, CycleFiles, write_data
from ralph_ray.runner import error_tail
from ralph_ray.sandbox import MIB
from ralph_ray.search import run_cycle
from ralph_ray.state import CampaignState, Phase, RunStatus
from ralph_ray.statuses import TrialStatus
from ralph_ray.tasks.base import ScoredBy, Splits
from ralph_ray.variants import RejectedBy, VariantStatus, files_dir


@dataclass(frozen=True)
class Outcome:
    """How a campaign ended."""

    run_id: str
    run_dir: Path
    kb_root: Path
    exit_code: ExitCode
    stop_reason: str
    best_variant_id: str | None
    best_selection_score: float | None
    records: list[TrialRecord]


class Campaign:
    """Runs the phases of each cycle in order, saving state after each."""

    def __init__(
        self,
        cfg: Config,
        console: Console,
        run_dir: Path,
        kb: KnowledgeBase,
        state: CampaignState,
        splits: Splits,
        run_row: dict[str, Any],
    ) -> None:
        self.cfg, self.console, self.run_dir, self.kb, self.state = cfg, console, run_dir, kb, state
        self.run_row, self.run_id, self.labels = run_row, state.run_id, splits.labels()
        self._check_kb()  # before Ray starts and any trial or data file of this start is written
        self.trials: list[TrialRecord] = []
        self.gpu_use = GpuUse(cfg.resources.gpu)  # a trial given a GPU that never started CUDA is said once
        self.seed_said = False  # replicates that are copies of one run (replicates.seed_ignored) are said once
        self._views: dict[tuple[int, str], ParentView] = {}
        self.mark = time.monotonic()
        self.analyst, self.coder = make_agents(cfg, self.run_id)
        self.data, smoke_data = write_data(splits, run_dir, cfg.task.name)
        self.gate = Gate(
            smoke_data,
            tuple(cfg.search.space),
            cfg.safeguards.smoke_timeout_s,
            sandbox=sandbox_policy(cfg),
            output_bytes=cfg.sandbox.output_mb * MIB,
            scores_model=cfg.task.scored_by == ScoredBy.model.value,
            resumes=cfg.scheduler.name.population_based,
            workers=cfg.resources.workers_per_trial,
            warm=cfg.trial.warm,
            prestart=cfg.trial.prestart,
        )
        ensure_ray(cfg.resources.ray_num_cpus, cfg.cluster)

    def _check_kb(self) -> None:
        """Another run's damaged KB part is left out with a warning (user trial: it stopped every new campaign, exit
        4); one of this run's refuses (exit 2): a resume would go on without its rows. Checked before Ray starts and
        before any trial of this start runs, but after campaign.run has recorded the run as running (state.json, its
        runs row): so the refusal is recorded as a crash. `python -m ralph_ray resume=` refuses it earlier, before
        the run's state is touched (__main__.resume_alone); an in-process `campaign.run` resume ends here."""
        if refusal := own_damaged(self.kb, self.run_id, RESUME_WOULD):
            raise CampaignError(refusal)
        for path, why in self.kb.damaged.items():  # none is this run's (own_damaged): other runs' parts
            self.console.print(f"[yellow]warning:[/] {escape(self.kb.damaged_note(path, why))}", highlight=False)

    def loop(self) -> Outcome:
        """Run phases until the decision engine stops the campaign."""
        steps = {
            Phase.select: self.select,
            Phase.analyse: self.analyse,
            Phase.write: self.write,
            Phase.train: self.train,
            Phase.record: self.record,
            Phase.decide: self.decide,
        }
        while self.state.phase is not Phase.done:
            phase = self.state.phase
            if phase in (Phase.select, Phase.analyse, Phase.write) and stop_requested(self.run_dir):
                self.state.interrupted = phase
                self._advance(Phase.record)  # a manual stop ends the cycle cleanly: record what exists, decide
                continue
            steps[phase]()
        state = self.state
        return Outcome(
            self.run_id,
            self.run_dir,
            self.kb.root,
            ExitCode(state.exit_code or ExitCode.ok),
            state.stop_reason or "",
            state.best_variant_id,
            state.best_selection_score,
            self.trials,
        )

    @property
    def files(self) -> CycleFiles:
        """This cycle's folder and the files its phases leave there."""
        return CycleFiles(self.run_dir, self.state.cycle)

    def charge_time(self) -> None:
        """Add the campaign time since the last charge to state.elapsed_s (each state save; an interrupt's too)."""
        now = time.monotonic()
        self.state.elapsed_s += now - self.mark
        self.mark = now

    def _advance(self, phase: Phase) -> None:
        self.charge_time()
        self.state.phase = phase
        self.state.save(self.run_dir)
        # The runs row carries the live cycle and phase (the app's status page reads it); one part per run, replaced.
        self.kb.put("runs", [records.run_status(self.run_row, RunStatus.running, self.state)], self.run_id)

    def _phase(self, name: str, detail: str = "") -> None:
        self.console.print(f"[bold magenta]cycle {self.state.cycle}[/] [bold]{name}[/] {detail}")

    def _seed(self) -> Child:
        """The seed variant: the task folder's trainer files (`task.trainer_files`), snapshotted; the log names what
        was left out."""
        return seed_child(self.cfg.trainer_dir(), self.run_dir / "variants", self.cfg.task.trainer_files, self._log)

    def _log(self, line: str) -> None:
        self.console.print(line, highlight=False)

    def select(self) -> None:
        """Cycle 1: the seed. Later: the top variants so far, with exploration."""
        if self.state.cycle == 1:
            seed = self._seed()
            self.files.save_children([seed])
            self._put_variants([seed], "write")
            self._phase("select", f"seed variant {seed.variant_id} ({self.cfg.trainer_dir()})")
            self._advance(Phase.train)
            return
        pop, rng = self.cfg.population, random.Random(self.cfg.agent.seed * 1000 + self.state.cycle)
        rows = history.ranked_with_ranks(self.kb.reader(), self.run_id)  # the leaderboard's order: rank 1 is the pick
        picks = select_parents([c for c, _ in rows], pop.parents, pop.explore, pop.one_per_lineage, rng)
        self.files.save_parents(picks)
        # Its leaderboard rank, as `status` and the app show it, says why a parent is there (rank 1: the pick; a later
        # one: exploration or another lineage); the score is its best trial, which is not what ranks a replicated one.
        rank = {c.variant_id: r for c, r in rows}
        names = ", ".join(
            f"{p.variant_id} (rank {rank[p.variant_id] or '-'}, "
            f"best trial {self.cfg.metric_sign() * p.selection_score:.4f})"
            for p in picks
        )
        self._phase("select", names or "no parent: nothing has completed")
        self._advance(Phase.analyse)

    def analyse(self) -> None:
        """Each parent, as its best trial ran it, diagnosed by the analyst."""
        parents = self.files.parents()
        self._phase("analyse", f"{len(parents)} parent(s), agent {self.cfg.agent.backend.value}")
        effects = history.effects(self.kb.reader(), self.cfg.task.name, self.cfg.task.metric, self.cfg.task.direction)
        notes, recs, spent = analyse_parents(
            self.analyst,
            parents,
            self._view,
            effects,
            self.cfg.population.children_per_parent,
            self._log,
            self.cfg.metric_sign(),
        )
        self.files.save_analysis(notes, recs)
        self._put(
            "agent_usage",
            records.usage_rows(self.run_id, self.state.cycle, "analyst", spent, self.cfg.agent),
            "analyst",
        )
        self._advance(Phase.write)

    def write(self) -> None:
        """Children of every parent (written by the coder, checked by the gate), or knob children for agent=none."""
        pop, agent, files = self.cfg.population, self.cfg.agent, self.files
        self._phase(
            "write children", f"{pop.children_per_parent} per parent -> validate (gate, {agent.max_retries} retries)"
        )
        breeder = Breeder(
            self.coder,
            self.gate,
            self.run_dir / "variants",
            files.path,
            pop.children_per_parent,
            agent.max_retries,
            agent.concurrency,
            history.known_variants(self.kb.reader(), self.run_id),
            self.cfg.safeguards.tokens_per_cycle,
            self._log,
            self._campaign_budget(self.kb.reader(), self.state.cycle),
        )
        try:
            children, wasted = grow(breeder, files.parents(), self._view, files.recommendations(), files.baked)
        except BaseException:
            # A key revoked, Ctrl-C: the children written so far are written again on resume, but their calls were
            # paid for; what the attempts spent is recorded (its own part: a resume's write records its own)
            spent = breeder.spent_so_far()
            if spent.calls:
                rows = records.usage_rows(
                    self.run_id, self.state.cycle, "coder", [(INTERRUPTED_USAGE, spent)], self.cfg.agent
                )
                self._put("agent_usage", rows, "coder", INTERRUPTED_USAGE, str(time.time_ns()))
            raise
        files.save_children(children)
        self._put_variants(children, "write")
        spent = [(c.variant_id, c.usage) for c in children if c.usage.calls] + wasted
        self._put(
            "agent_usage", records.usage_rows(self.run_id, self.state.cycle, "coder", spent, self.cfg.agent), "coder"
        )
        self._advance(Phase.train)

    def train(self) -> None:
        """One Tune run: every passing child x knob samples; each trial's rows reach the KB as it ends."""
        runnable = [c for c in self.files.children() if c.status in (VariantStatus.candidate, VariantStatus.seed)]
        done = history.trials_done(self.kb.reader(), self.run_id, self.state.cycle, STOPPED_WITH_CYCLE)
        limit, elapsed = self.cfg.safeguards.search_time_s, self.state.elapsed_s + (time.monotonic() - self.mark)
        deadline = None if limit is None else time.time() + max(1.0, limit - elapsed)
        if run_cycle(
            self.cfg,
            self.run_id,
            self.state.cycle,
            self.files.path,
            self.run_dir,
            runnable,
            done,
            self.coder is not None,
            self.data,
            self.labels,
            self._sink,
            self.console,
            deadline,
            lambda detail: self._phase("train", detail),
            self._segments,
        ) or self._replicate(runnable, deadline):
            self.state.interrupted = Phase.train  # a resume runs the trials this stop cut short
        self._advance(Phase.record)

    def _replicate(self, runnable: list[Child], deadline: float | None) -> bool:
        """The best knobs of the seed and of each child with a chance against its parent, run again with fresh
        seeds (safeguards.replicates); True when a stop cut them short."""
        count = self.cfg.safeguards.replicates
        if not count or stop_requested(self.run_dir):
            return False
        con = self.kb.reader()
        best = {v: s for v, (s, _) in history.variant_scores(con, self.run_id).items()}
        reps = replicates.recorded(con, self.run_id)
        wanted = replicates.needing(runnable, best, reps, count)
        configs = replicates.points(wanted, replicates.best_knobs(con, self.run_id), reps, count, self.cfg.search.seed)
        if not configs:
            return False
        replicates.say(configs, lambda line: self._phase("replicate", line))
        files = {v: files_dir(self.run_dir / "variants", v) for v in wanted}
        return replicates.run(
            self.cfg,
            self.run_id,
            self.state.cycle,
            self.files.path,
            files,
            configs,
            self.data,
            self.labels,
            self._sink,
            self.console,
            self.run_dir,
            deadline,
        )

    def _segments(self, rows: list[dict[str, Any]]) -> None:
        """scheduler=pbt: a trial's segments, written before its row (compacted with the cycle's trials)."""
        if rows:
            self.kb.append("segments", rows, records.trial_part(self.run_id, self.state.cycle, rows[0]["trial_id"]))

    def _sink(self, trial: TrialRecord, epoch_rows: list[dict[str, Any]]) -> None:
        tag = records.trial_part(self.run_id, trial.cycle, trial.trial_id)
        self.kb.append("epochs", epoch_rows, tag)
        self.kb.append("trials", [trial.row()], tag)  # after its epochs: a visible trial always has its curve
        self.trials.append(trial)
        self._note_gpu_use(trial)

    def _say_first_failure(self) -> None:
        """No trial completed: the first failed trial's reason and the end of its trainer's traceback, so a seed
        that cannot run (an import error, a crash at epoch 3) says why where the campaign ends."""
        failed = next((t for t in self.trials if t.status is TrialStatus.failed), None)
        if failed is None:
            return
        work = Path(failed.work_dir)
        lines = [f"  first failure: trial {failed.trial_id} of {failed.variant_id}: {failed.reason}"]
        if (failed.reason or "").startswith(SCORING_FAILED):  # the trainer's log holds nothing of it
            lines.append(
                "  the task's metric could not score what the trainer saved: check its predictions' shape against "
                f"the targets', or the metric (`python -m ralph_ray.prepare task={self.cfg.task_folder()}` checks it)"
            )
        else:
            lines += [f"    {line}" for line in error_tail(work)]  # the driver's node keeps most trials' work dirs
            lines.append(f"  its whole log: {work / 'stderr.log'}")
        self.console.print("\n".join(lines), style="red", markup=False, highlight=False)  # a traceback has [brackets]

    def _note_unvaried(self, reps: dict[str, replicates.Replicated] | None) -> None:
        """Say once when a variant's replicates all scored the same whatever their seed (replicates.seed_ignored)."""
        if reps and not self.seed_said and (warning := replicates.seed_ignored(reps)):
            self.seed_said = True
            self.console.print(warning, style="yellow", markup=False, highlight=False)

    def _campaign_budget(self, con: duckdb.DuckDBPyConnection, generation: int) -> CampaignBudget | None:
        """The campaign's agent budgets as spent so far, checked before each agent call (checked only between
        batches, an async cost budget of 0.01 ended at 0.059: a parent's analysis and children were in flight)."""
        guards, agent = self.cfg.safeguards, self.cfg.agent
        if guards.tokens_per_campaign is None and guards.cost_per_campaign is None:
            return None
        spent = history.spend(con, self.run_id, generation)
        return CampaignBudget(
            guards.tokens_per_campaign,
            guards.cost_per_campaign,
            spent.tokens_campaign,
            spent.cost_campaign,
            agent.price_in_per_m,
            agent.price_out_per_m,
        )

    def _note_gpu_use(self, trial: TrialRecord) -> None:
        """Say once when a finished trial that was given a GPU never started CUDA (its trainer ran on the CPU)."""
        if warning := self.gpu_use.check(trial.trial_id, trial.status is TrialStatus.completed, trial.peak_gpu_mb):
            self._log(warning)

    def record(self) -> None:
        """Judge each child against its parent; write variant statuses, intervention effects, the cycle row."""
        files, cycle, state, con = self.files, self.state.cycle, self.state, self.kb.reader()
        children = files.children()
        scores, counts = history.variant_scores(con, self.run_id), history.trial_counts(con, self.run_id, cycle)
        guards = self.cfg.safeguards
        reps = replicates.recorded(con, self.run_id) if guards.replicates else None
        self._note_unvaried(reps)
        comparisons = (
            replicates.comparisons(children, scores, reps, guards.confidence, replicates.split_examples(self.labels))
            if reps is not None
            else None
        )
        judge(children, scores, counts, guards.min_delta, comparisons)
        for child in children:  # the variants row says what it was judged against (the interventions rows measure it)
            if comparisons and child.variant_id in comparisons:
                score = scores[child.variant_id][0]
                child.parent_score = records.measured(score, child.parent_score, comparisons[child.variant_id])[1]
        prefix, merged = records.trial_parts(self.run_id, cycle), records.part(self.run_id, cycle, "compacted")
        for table in ("epochs", "trials", "segments"):  # one part per cycle instead of one per trial
            self.kb.compact(table, prefix, merged)
        files.save_children(children)
        self._put_variants(children, "record", scores)
        self._put(
            "interventions",
            records.effect_rows(self.run_id, self.cfg.task.name, cycle, children, scores, comparisons),
        )
        best = max(((v, s) for v, (s, _) in scores.items()), key=lambda item: item[1], default=None)
        # Rejections the gate (or the offline coder's CannotApply) made count; a coder's outage or a spent token
        # budget never showed the gate a draft (their children have ids of their own since REJECTED.md).
        asked = [
            c
            for c in children
            if c.status is not VariantStatus.seed
            and c.variant_id != c.parent_id
            and c.rejected_by not in (RejectedBy.coder, RejectedBy.budget)
        ]
        state.note_cycle(
            best,
            history.best_trial(con, self.run_id),
            gate_fail_streak(state.gate_fail_streak, [c.status for c in asked], self.coder is not None),
        )
        # This cycle's verdicts are written above: a child discarded now is left out of the floor as earlier ones are.
        if reps is not None:
            floor = replicates.campaign_floor(reps, guards.confidence, history.discarded(self.kb.reader(), self.run_id))
            state.floor_by_cycle = state.floor_by_cycle[: cycle - 1] + [floor]
        self._put(
            "cycles",
            [
                records.cycle_row(
                    self.run_id,
                    cycle,
                    sum(n for n, *_ in counts.values()),
                    state.best_selection_score,
                    asked,
                    files.path,
                    files.analysis(),
                )
            ],
        )
        kept = [f"{c.variant_id} (+{' + '.join(c.interventions)})" for c in children if c.status is VariantStatus.kept]
        shown = self.cfg.metric_sign() * (state.best_selection_score or 0.0)  # the metric's value (stored oriented)
        best_text = f"{shown:.4f} ({state.best_variant_id})" if best else "-"
        # The best single trial may be a discarded child's luck: the pick (rank 1, as `status` names it) is said
        # beside it, so "kept: none" never reads as contradicted by the id before it (review).
        pick = history.pick(self.kb.reader(), self.run_id) or "-"
        self._phase("record", f"best single trial {best_text}; pick {pick}; kept: {', '.join(kept) or 'none'}")
        for child in children:  # a child discarded unjudged says why, and how to have such children judged
            if child.reason in (NO_SCORE_REASON, CUT_BY_STOP_REASON):
                self._log(
                    f"  child {child.variant_id} (+{' + '.join(child.interventions)}): discarded ({child.reason})"
                )
        state.phase = Phase.decide
        state.save(self.run_dir)

    def decide(self) -> None:
        """Continue or stop; the decision and its rationale go to decision.json and the KB."""
        state, guards = self.state, self.cfg.safeguards
        facts = history.cycle_facts(
            self.kb.reader(),
            state,
            self.cfg.target_score(),
            state.elapsed_s + (time.monotonic() - self.mark),
            stop_requested(self.run_dir),
            bool(guards.replicates),
            self.cfg.metric_sign(),
        )
        decision = decide(facts, guards)
        data = records.decision_json(decision, facts, state.best_variant_id)
        self.files.save_decision(data)
        self._put("decisions", [records.decision_row(self.run_id, decision, facts, state.best_variant_id)])
        colour = "green" if decision.exit_code == ExitCode.ok else "yellow"  # a planned end, or a safeguard fired
        self._phase("decide", f"[{colour}]{data['decision']}[/] ({decision.reason.value}): {decision.rationale}")
        self.console.print(f"  {budgets_line(decision, facts, guards)}")
        if decision.reason is StopReason.no_trial_completed:
            self._say_first_failure()
        self._advance(state.conclude(decision.stop, decision.reason.value, decision.exit_code))

    def _view(self, parent: Candidate) -> ParentView:
        """A parent as the agents see it, built once per cycle (analyse and write share it; a resume rebuilds it)."""
        key = (self.state.cycle, parent.variant_id)
        if key not in self._views:
            self._views[key] = history.parent_view(
                self.kb.reader(),
                self.run_id,
                parent,
                self.run_dir / "variants",
                self.files.baked(parent.variant_id),
                self.cfg.trainer_dir(),
            )
        return self._views[key]

    def _put(self, table: str, rows: list[dict[str, Any]], *suffix: str) -> None:
        """Write this cycle's part of `table` (named by records.part: a resume replaces it)."""
        self.kb.put(table, rows, records.part(self.run_id, self.state.cycle, *suffix))

    def _put_variants(self, children: list[Child], phase: str, scores: dict[str, Any] | None = None) -> None:
        rows = records.variant_rows(self.run_id, self.state.cycle, children, self.cfg.agent, scores)
        self._put("variants", rows, phase)
