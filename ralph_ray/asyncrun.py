"""The asynchronous campaign (population.mode=async): one Tune run per campaign, every slot kept busy.

The searcher is the population (`popsearch.Pool`): each free slot gets a gated child from the queue, or a knob
sample of a promising variant. A background thread (`breeder.BackgroundBreeder`) analyses, writes and gates
children meanwhile, from parents chosen as the population stands. Every finished trial is recorded in the KB at
once, told to its variant's Optuna study, and followed by a check of the decision engine (target, budgets,
manual stop, plateau, max_cycles), which ends the run at once when it says stop.

Generations: a child's generation is its parent's + 1 (the seed is 1) and is written to the KB's `cycle`
columns, so the KB, the report and the app show generations as they show cycles. The decision engine counts
*closed generations*: the seed's knob search closes generation 1, and each further `parents x
children_per_parent` children judged close one more, so `safeguards.max_cycles` bounds the children bred
(no child beyond generation max_cycles, and (max_cycles - 1) x parents x children_per_parent in all) and the
plateau rule counts closed generations without a gain. Its decisions are recorded under generations of variants,
one row each, the generation's last decision (`decision.generation_decided`): the count need not match them.

Resume: the KB is the truth. A resumed campaign rebuilds the pool from it (members, their studies through
Optuna's `add_trial`, the queue = gated children with trials still to run) and starts a new Tune run; trials
that were running when the driver died run again, and a child being written then is bred again.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from ray import tune
from ray.tune.search import ConcurrencyLimiter

from ralph_ray import forecast, history, records, replicates, sigterm, sql
from ralph_ray.breeder import BackgroundBreeder, BreedingPlan
from ralph_ray.children import (
    INTERRUPTED_USAGE,
    Breeder,
    Child,
    analyse,
    analysis_note,
    breed,
    knob_child,
    reruns_parent,
    write_meta,
)
from ralph_ray.control import stop_requested
from ralph_ray.decision import (
    CycleFacts,
    Decision,
    StopReason,
    budgets_line,
    child_verdict,
    decide,
    generation_decided,
    unjudged_note,
)
from ralph_ray.events import TrialStarts, trials_started
from ralph_ray.exit_codes import ExitCode
from ralph_ray.faults import kill_point
from ralph_ray.generations import Campaign, Outcome
from ralph_ray.knobs import read_knobs
from ralph_ray.ledger import STOPPED_WITH_CYCLE, TrialLedger, TrialRecord
from ralph_ray.popsearch import Member, Pool, PoolSettings, PopulationSearcher, member_code, run_member_trial
from ralph_ray.population import Candidate
from ralph_ray.progress import scores_text
from ralph_ray.search import resumed_scheduler, storage_path, trial_spec
from ralph_ray.state import Phase, RunStatus
from ralph_ray.statuses import TrialStatus
from ralph_ray.variants import RejectedBy, VariantStatus


class AsyncCampaign(Campaign):
    """One Tune run whose searcher is the population; children are bred in the background."""

    def loop(self) -> Outcome:
        """Run the campaign until the decision engine stops it; returns how it ended."""
        cfg = self.cfg
        pop = cfg.population
        self.per_generation = pop.parents * pop.children_per_parent
        self.kb_lock = threading.Lock()  # the sink (Tune's thread) and the breeder both write parts
        self.children: dict[str, Child] = {}  # every bred child in breed order, rejected ones too
        self.judged: set[str] = set()
        self.awaiting: set[str] = set()  # children whose verdict waits for replicates (theirs or their parent's)
        self.tally = replicates.Tally()  # every replicate by (variant, knobs): only a variant's best knobs' count
        self.forecaster = forecast.make(cfg)  # scheduler.forecast: stops trials whose forecast cannot win
        self.decision: Decision | None = None
        self.decided = 0  # the last generation with a decisions row (generation_decided; a resume reads the KB's)
        self.stop_now = False
        self._usage_parts = 0  # agent_usage parts written by this process (the spend cache's key)
        self._spent: tuple[tuple[int, int], history.Spend] | None = None
        self.pool = Pool(
            PoolSettings(
                cfg.search.space,
                cfg.search.relative_span,
                pop.parents,
                pop.explore,
                pop.one_per_lineage,
                cfg.search.seed,
                cfg.search.sampler,
            )
        )
        bred = self._rebuild()
        self.state.phase = Phase.train
        self._save_state()
        plan = BreedingPlan(
            ahead=max(1, cfg.search.max_concurrent),
            children_budget=(cfg.safeguards.max_cycles - 1) * self.per_generation,
            max_generation=cfg.safeguards.max_cycles,
            parents=pop.parents,
            explore=pop.explore,
            one_per_lineage=pop.one_per_lineage,
            seed=cfg.agent.seed * 1000 + len(self.children),
            nice=pop.breeder_nice,
        )
        self.breeder = BackgroundBreeder(self.pool, plan, bred, self._grow, self._log)
        self.breeder.start()
        wait_s = 600.0
        try:
            self._check()  # a resumed campaign may already be done (e.g. raised limits not reached)
            if not self.stop_now:
                self._tune()
        except KeyboardInterrupt:
            wait_s = 5.0  # Ctrl-C: no long wait for the parent in hand (an agent's call); a resume breeds it again
            raise
        finally:
            self.breeder.stop()
            self.pool.close()
            self.breeder.join(timeout=wait_s)
        if self.breeder.error is not None:
            raise self.breeder.error
        if self.decision is None or not self.decision.stop:
            self._check(final=True)
        self._close_generations()
        state = self.state
        code = ExitCode(state.exit_code if state.exit_code is not None else ExitCode.ok)
        return Outcome(
            self.run_id,
            self.run_dir,
            self.kb.root,
            code,
            state.stop_reason or "",
            state.best_variant_id,
            state.best_selection_score,
            self.trials,
        )

    # -- the Tune run ----------------------------------------------------------------------------

    def _tune(self) -> None:
        cfg = self.cfg
        root = self.run_dir / "async"
        tune_dir = root / "tune"
        session = len(list(tune_dir.glob("session_*"))) + 1 if tune_dir.exists() else 1
        spec = trial_spec(cfg, [], root / "trials", self.data, relative=False)  # code comes with each trial's config
        # The slots: Tune's own ConcurrencyLimiter, made here so the ledger can free the slot of a trial Tune failed
        # without telling the searcher (a failed actor reset once left one of two slots idle for 547 of 600 s).
        searcher = PopulationSearcher(self.pool, cfg.search.metric, cfg.search.mode)
        slots = ConcurrencyLimiter(searcher, max_concurrent=cfg.search.max_concurrent)
        ledger = TrialLedger(
            self.run_id,
            0,
            self.labels,
            spec.trials_root,
            spec.seed,
            cfg.search.metric,
            self._sink,
            on_silent_error=lambda trial_id: slots.on_trial_complete(trial_id, error=True),
        )
        trainable = tune.with_resources(
            tune.with_parameters(run_member_trial, spec=spec), {"cpu": cfg.resources.cpu, "gpu": cfg.resources.gpu}
        )
        tuner = tune.Tuner(
            trainable,
            tune_config=tune.TuneConfig(
                metric=cfg.search.metric,
                mode=cfg.search.mode,
                search_alg=slots,
                # replicates run to the end; a resume's rungs start with the run's earlier trials
                scheduler=replicates.SpareReplicates(
                    resumed_scheduler(cfg, self.kb.reader(), self.run_id, ledger.stop_reasons)
                ),
                num_samples=-1,
                reuse_actors=cfg.search.reuse_actors,
                trial_dirname_creator=lambda trial: trial.trial_id,
            ),
            run_config=tune.RunConfig(
                name=f"session_{session:02d}",
                storage_path=storage_path(cfg, tune_dir),
                callbacks=[ledger, _KillDuringTrial(), TrialStarts(self.run_dir, self.run_id, None)],
                stop=forecast.combined(_StopNow(self), self.forecaster),
                verbose=0,
                failure_config=tune.FailureConfig(max_failures=cfg.safeguards.max_failures),
                checkpoint_config=tune.CheckpointConfig(num_to_keep=1),
            ),
        )
        self.console.print(
            f"[bold magenta]async[/] one Tune run, {cfg.search.max_concurrent} slots; children bred in "
            f"the background (agent {cfg.agent.backend.value})"
        )
        tuner.fit()

    def _sink(self, trial: TrialRecord, epoch_rows: list[dict[str, Any]]) -> None:
        """A trial ended: record it at once, tell the pool, judge its child when done, ask the decision engine."""
        member = self.pool.members.get(trial.variant_id)
        trial.cycle = member.generation if member else 1
        forecast.note(trial, self.forecaster)
        tag = records.trial_part(self.run_id, trial.cycle, trial.trial_id)
        with self.kb_lock:
            self.kb.append("epochs", epoch_rows, tag)
            self.kb.append("trials", [trial.row()], tag)  # after its epochs: a visible trial always has its curve
        self.trials.append(trial)
        kill_point("after_completion")
        self._note_gpu_use(trial)
        # the metric's own values (a min metric's is stored as -value), the metric named
        score = (
            scores_text(trial.selection_score, trial.test_score, self.cfg.metric_sign(), self.cfg.task.metric) or "-"
        )
        self._log(
            f"  trial {trial.trial_id} gen {trial.cycle} {trial.variant_id}: {trial.status.value} {score} "
            f"({trial.seconds:.1f}s){' ' + trial.reason if trial.reason else ''}"
        )
        if trial.reason == STOPPED_WITH_CYCLE:
            return  # cut short by the end of the run: a resume runs it again
        member = self.pool.finish(trial)
        if trial.replicate:
            done = trial.status is TrialStatus.completed
            score, test = (trial.selection_score, trial.test_score) if done else (None, None)
            self.tally.note(trial.variant_id, trial.knobs, trial.seed, score, test)
            self._replicates_in()
        elif member is not None and member.judged and member.variant_id in self.children and not self._judged(member):
            self._judge(member)
        elif member is not None and member.judged and self._follows_best(member):
            self._replicate([member.variant_id])
        self._check()

    # -- breeding (the breeder's thread) ---------------------------------------------------------

    def _put_interrupted(self, generation: int, parent: Candidate, breeder: Breeder) -> None:
        """What a parent's coder attempts spent before a failure (a key revoked) cut its breeding short: its children
        are bred again on resume, but those calls were paid for."""
        spent = breeder.spent_so_far()
        if not spent.calls:
            return
        label = f"{parent.variant_id}:{INTERRUPTED_USAGE}"
        with self.kb_lock:
            self.kb.put(
                "agent_usage",
                records.usage_rows(self.run_id, generation, "coder", [(label, spent)], self.cfg.agent),
                records.part(
                    self.run_id, generation, "usage", parent.variant_id, INTERRUPTED_USAGE, str(time.time_ns())
                ),
            )
            self._usage_parts += 1

    def _grow(self, parent: Candidate, generation: int) -> list[Child]:
        """Children of one parent (analysed, written, gated), recorded in the KB before they are queued."""
        cfg = self.cfg
        folder = self.run_dir / "generations" / f"gen_{generation:04d}"
        folder.mkdir(parents=True, exist_ok=True)
        con = self.kb.reader()
        baked = folder / "parents" / f"{parent.variant_id}-{time.time_ns()}"
        variants_root = self.run_dir / "variants"
        usage: list[tuple[str, Any]] = []
        if self.coder is None:
            view = history.parent_view(con, self.run_id, parent, variants_root, baked, cfg.trainer_dir())
            children = [knob_child(parent, view.files_dir, variants_root)]
        else:
            view = history.parent_view(con, self.run_id, parent, variants_root, baked, cfg.trainer_dir())
            budget = self._campaign_budget(con, generation)
            over = budget.spent() if budget else None  # spent: no call; the decision engine stops the campaign
            if self.analyst is not None and over is None:
                effects = history.effects(con, cfg.task.name, cfg.task.metric, cfg.task.direction)
                analysis, spent = analyse(self.analyst, view, effects, self._log)
                spent = budget.track(spent) if budget else spent
                with self.kb_lock:  # at once: its children's writing and gating take minutes, the budget line reads
                    self.kb.put(  # the KB (user trial: `tokens 0` at generation 1 after the agents had answered)
                        "agent_usage",
                        records.usage_rows(self.run_id, generation, "analyst", [(parent.variant_id, spent)], cfg.agent),
                        records.part(self.run_id, generation, "analysis", parent.variant_id, str(time.time_ns())),
                    )
                    self._usage_parts += 1
            else:
                from ralph_ray.agents.base import Analysis

                analysis = Analysis(parent.variant_id, [], f"not analysed: {over}" if over else "", [])
            with (folder / "analysis.md").open("a") as notes:
                notes.write(analysis_note(parent, analysis, cfg.metric_sign()) + "\n")
            known = history.known_variants(con, self.run_id) | frozenset(self.children)
            breeder = Breeder(
                self.coder,
                self.gate,
                variants_root,
                folder,
                cfg.population.children_per_parent,
                cfg.agent.max_retries,
                cfg.agent.concurrency,
                known,
                cfg.safeguards.tokens_per_cycle,
                self._log,
                budget,
            )
            try:
                children, wasted = breed(breeder, parent, view, analysis)
            except BaseException:
                self._put_interrupted(generation, parent, breeder)
                raise
            usage += [(c.variant_id, c.usage) for c in children if c.usage.calls]
            if wasted.calls:
                usage.append((f"{parent.variant_id}:duplicates", wasted))
        children = [c for c in children if c.variant_id not in self.children and c.variant_id != c.parent_id]
        with self.kb_lock:
            rows = records.variant_rows(self.run_id, generation, children, cfg.agent)
            self.kb.put(
                "variants", rows, records.part(self.run_id, generation, "bred", parent.variant_id, str(time.time_ns()))
            )
            # A child the gate rejected is judged here, without a trial: its interventions count as rejected tries
            # (intervention_effects.rejected), as the barrier loop records them.
            refused = [
                row
                for child in children
                if child.status is VariantStatus.rejected
                for row in records.intervention_rows(self.run_id, cfg.task.name, generation, child, None)
            ]
            if refused:
                self.kb.put(
                    "interventions",
                    refused,
                    records.part(self.run_id, generation, "refused", parent.variant_id, str(time.time_ns())),
                )
            self.kb.put(
                "agent_usage",
                records.usage_rows(self.run_id, generation, "coder", usage, cfg.agent),  # the analysis's went above
                records.part(self.run_id, generation, "usage", parent.variant_id, str(time.time_ns())),
            )
            self._usage_parts += 1
        kill_point("child_written")
        for child in children:
            self.children[child.variant_id] = child
            if child.status is VariantStatus.candidate:
                self.pool.add(self._member(child, generation))
            else:
                self.judged.add(child.variant_id)  # rejected at the gate: judged without a trial
        return children

    def _member(self, child: Child, generation: int, started: int = 0) -> Member:
        seed = child.status is VariantStatus.seed
        wanted = self.cfg.search.num_samples if seed else self.cfg.population.trials_per_child
        return Member(
            child.variant_id,
            child.parent_id or None,
            generation,
            member_code(child.files_dir),
            dict(child.own_knobs),
            relative=self.cfg.search.relative and not seed,
            wanted=wanted,
            parent_score=child.parent_score,
            started=started,
            runs_own_first=not reruns_parent(child),
        )

    # -- verdicts, decisions ---------------------------------------------------------------------

    def _follows_best(self, member: Member) -> bool:
        """Whether its replicates follow its best knobs: the seed's (every later verdict needs its sample) and a kept
        child's once replicated. A later knob sample that becomes its best is run again, so its leaderboard mean, the
        campaign's floor and the next verdict against it measure the knobs it is shown and bred with (a discarded
        child's best moving costs no replicates: nothing is judged against it)."""
        child = self.children.get(member.variant_id)
        return member.generation == 1 or bool(
            member.replica_seeds and child is not None and child.status is VariantStatus.kept
        )

    def _judged(self, member: Member) -> bool:
        """Its verdict is given (a later knob sample of a kept child is a parent's sample, not a reason to judge)."""
        child = self.children[member.variant_id]
        return child.variant_id in self.judged or child.status is not VariantStatus.candidate

    def _replicated(self) -> dict[str, replicates.Replicated]:
        """Each variant's replicates of its best knobs as they stand (replicates.Tally.at)."""
        with self.pool.changed:  # the breeder's thread adds members meanwhile
            best = {v: dict(m.best_knobs) for v, m in self.pool.members.items() if m.best is not None}
        return self.tally.at(best)

    def _judge(self, member: Member) -> None:
        """A child's trials are all in: kept, discarded or crashed against its parent, with its interventions.

        With replicates, a child is judged against its parent's replicates of the parent's best knobs as they stand
        when it is judged: replicated again first where the parent's best moved since its replicates ran (`short`
        counts replicates per knobs). Not against the knobs it was bred from: the leaderboard, the pick and the
        campaign's floor measure a variant at its best knobs, and a keep there is one over the parent as it is
        shown; a parent that improved by its own knob search since has that gain in the reference, so a knob
        change is never counted as the intervention's win (user trial: a child bred from the seed's new best knobs
        was kept against the mean of the seed's old ones).
        """
        if self._judged(member):
            return
        child = self.children[member.variant_id]
        comparison, guards = None, self.cfg.safeguards
        reps = self._replicated() if guards.replicates else None
        self._note_unvaried(reps)
        # The parent's best over as many search trials as the child had: the parent keeps training knob samples
        # after a child is bred from its first trial. The score it had then (child.parent_score) made a child that
        # lost to it a win in intervention_effects (user trial: +0.0185 recorded for a child 0.009 below its
        # parent's best, judged discarded); its best over all its samples since would favour it by chance alone.
        parent = self.pool.members.get(child.parent_id)
        parent_best = parent.best_of(len(member.scores)) if parent else None
        parent_best = parent_best if parent_best is not None else child.parent_score
        if reps is not None and member.best is not None:
            hopeful = replicates.worth(member.best, reps.get(child.parent_id), parent_best)
            if hopeful and self._replicate([child.parent_id, child.variant_id]):
                self.awaiting.add(child.variant_id)
                return  # judged when its replicates (and its parent's) are in
            comparison = replicates.evidence(
                child, member.best, reps, parent_best, guards.confidence, replicates.split_examples(self.labels)
            )
        child.status, child.reason = child_verdict(
            member.finished, member.failed, member.best, parent_best, guards.min_delta, child.reason, comparison
        )
        with self.pool.changed:
            member.discarded = child.status is VariantStatus.discarded
        # What it was judged against (the parent's replicate mean where the verdict read one): the variants and
        # interventions rows say so
        child.parent_score = records.measured(member.best, parent_best, comparison)[1]
        self.awaiting.discard(child.variant_id)
        self.judged.add(child.variant_id)
        write_meta(child)  # its meta.json says the verdict, not `candidate`
        scores = {child.variant_id: (member.best, None)} if member.best is not None else {}
        with self.kb_lock:
            self.kb.put(
                "variants",
                records.variant_rows(self.run_id, member.generation, [child], self.cfg.agent, scores),
                records.part(self.run_id, member.generation, "judged", child.variant_id),
            )
            self.kb.put(
                "interventions",
                records.intervention_rows(
                    self.run_id, self.cfg.task.name, member.generation, child, member.best, comparison
                ),
                records.part(self.run_id, member.generation, "effects", child.variant_id),
            )
        self._log(
            f"  child {child.variant_id} (gen {member.generation}, +{' + '.join(child.interventions)}): "
            f"{child.status.value}{unjudged_note(child.reason, member.best)}"
        )

    def _replicate(self, variants: list[str]) -> bool:
        """Queue the replicates these variants still lack (safeguards.replicates); True while any of theirs are
        outstanding."""
        count, members = self.cfg.safeguards.replicates, self.pool.members
        present = [v for v in variants if v in members]
        if not count or not present:
            return False
        reps = self._replicated()  # of each variant's best knobs: a parent whose best moved is short again
        wanted = [v for v in present if members[v].best is not None and replicates.short(reps.get(v), count)]
        wanted = [v for v in wanted if not members[v].replicas_pending]
        configs = replicates.points(
            wanted, {v: members[v].best_knobs for v in wanted}, reps, count, self.cfg.search.seed
        )
        if configs:
            replicates.say(configs, lambda line: self._log(f"  {line}"))
            self.pool.request_replicates(configs)
        return any(members[v].replicas_pending for v in present)

    def _replicates_in(self) -> None:
        """A replicate was recorded: judge every child whose replicates (and its parent's) are all in now."""
        for variant in sorted(self.awaiting):
            member = self.pool.members[variant]
            parent = self.pool.members.get(member.parent_id or "")
            if not member.replicas_pending and not (parent and parent.replicas_pending):
                self._judge(member)

    def _settled(self, member: Member) -> bool:
        """Its trials are all in, and its replicates too when it has a score to replicate."""
        count = self.cfg.safeguards.replicates
        if not member.judged or member.replicas_pending:
            return False
        return not count or member.best is None or len(member.replica_seeds) >= count

    def _closed(self) -> int:
        """Generations closed so far: the seed's knob search, then one per `parents x children_per_parent` judged."""
        seeds = [m for m in self.pool.members.values() if m.generation == 1]
        if not seeds or any(not self._settled(m) for m in seeds):
            return 0
        limit = self.cfg.safeguards.max_cycles
        # Out of ideas (agent=none's knob-search child repeats its parent at once) with the clock given: the slots go
        # on with knob samples of promising variants until the time budget stops the run, as the barrier loop's
        # knob-search cycles do. Without a time budget the run ends once every child is judged.
        go_on = self.breeder.out_of_ideas and self.cfg.safeguards.search_time_s is not None and not self._time_spent()
        if self.breeder.done and len(self.judged) >= len(self.children) and not go_on:
            return limit  # every child the campaign may breed has been judged
        return min(limit, 1 + len(self.judged) // self.per_generation)

    def _check(self, final: bool = False) -> None:
        """Ask the decision engine; on stop, end the run at once (the searcher closes, running trials stop)."""
        if self.stop_now:
            return
        state, cfg = self.state, self.cfg
        closed = self._closed()
        best = self.pool.best()
        state.best_variant_id, state.best_selection_score = (best.variant_id, best.best) if best else (None, None)
        state.best_trial_id = best.best_trial_id if best else None
        advanced = closed > len(state.best_by_cycle)
        guards = cfg.safeguards
        with self.pool.changed:  # a child its verdict discarded raises no floor: the pick ranks it last
            discarded = {v for v, m in self.pool.members.items() if m.discarded}
        floor = (
            replicates.campaign_floor(self._replicated(), guards.confidence, discarded) if guards.replicates else None
        )
        while len(state.best_by_cycle) < closed:
            state.best_by_cycle.append(state.best_selection_score)
        while guards.replicates and len(state.floor_by_cycle) < closed:
            state.floor_by_cycle.append(floor)
        manual = stop_requested(self.run_dir)
        if closed == 0 and not (final or manual or self._time_spent()):
            return  # the seed's knob search is still running: nothing to judge the campaign by yet
        # The closed generations' bests, the last one replaced by the best now (a gain counts at once, a partial
        # generation never counts as one without a gain).
        bests = state.best_by_cycle[:-1] + [state.best_selection_score]
        # Usage is tagged with the generation bred, so "this cycle's" tokens are the generation a stop would name (the
        # deepest with a verdict), not the closed count's (1 x 2 children: three closed, all generation 2)
        deepest = self._deepest()
        spent = self._spend(max(deepest, self.decided))
        state.gate_fail_streak = self._gate_streak()
        facts = CycleFacts(
            max(1, closed),
            bests,
            cfg.target_score(),
            spent.tokens_cycle,
            spent.tokens_campaign,
            spent.cost_campaign,
            state.gate_fail_streak,
            self._elapsed(),
            manual,
            state.floor_by_cycle[:-1] + [floor] if guards.replicates else None,
            sign=cfg.metric_sign(),
        )
        decision = decide(facts, cfg.safeguards)
        # "No trial completed" only once none can: the seed's search still open, or a trial still running (a
        # resumed run re-runs the trials the dead driver had running, beyond the seed's queued ones).
        if decision.reason is StopReason.no_trial_completed and not final and (closed == 0 or self.pool.pending):
            return
        kill_point("decision")
        # The row names a generation of the run's variants, one row each (facts.cycle counts closed generations)
        named = generation_decided(deepest, self.decided, decision.stop or final)
        if named is not None:
            if named != max(deepest, self.decided):  # a continue names the generation before: its row, its tokens
                facts = replace(facts, tokens_cycle=self._spend(named).tokens_cycle)
            self._record_decision(replace(decision, cycle=named), facts)
            self.decided = named
        if advanced and not final:
            self._write_cycles()  # a run in progress, or killed later, has its closed generations' rows
        if decision.reason is StopReason.no_trial_completed:
            self._say_first_failure()
        state.cycle = max(1, closed)
        if decision.stop:
            state.stop_reason, state.exit_code = decision.reason.value, decision.exit_code
            state.status = RunStatus.finished
            state.phase = Phase.done
            self.stop_now = True
            self.pool.close()
            self.breeder.stop()
        self._save_state()

    def _deepest(self) -> int:
        """The deepest generation with a verdict: a judged child's (a rejected one has no trials, no cycles row), else
        the seed's."""
        with self.pool.changed:  # the breeder's thread adds members meanwhile
            return max([1, *(m.generation for v, m in self.pool.members.items() if v in self.judged)])

    def _record_decision(self, decision: Decision, facts: CycleFacts) -> None:
        self.decision = decision
        data = records.decision_json(decision, facts, self.state.best_variant_id)
        folder = self.run_dir / "generations" / f"gen_{decision.cycle:04d}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "decision.json").write_text(json.dumps(data, indent=2))
        with self.kb_lock:
            self.kb.put(
                "decisions",
                [records.decision_row(self.run_id, decision, facts, self.state.best_variant_id)],
                records.part(self.run_id, decision.cycle),
            )
        self.console.print(
            f"[bold magenta]generation {decision.cycle}[/] [bold]decide[/] {data['decision']} "
            f"({decision.reason.value}): {decision.rationale}"
        )
        self.console.print(f"  {budgets_line(decision, facts, self.cfg.safeguards)}")

    def _spend(self, generation: int) -> history.Spend:
        """The agents' spend, read from the KB only when the breeder has written usage since (a KB read costs ~0.2 s
        on Tune's thread, between one trial's end and the next one's start)."""
        key = (self._usage_parts, generation)
        if self._spent is None or self._spent[0] != key:
            self._spent = (key, history.spend(self.kb.reader(), self.run_id, generation))
        return self._spent[1]

    def _gate_streak(self) -> int:
        """Generations' worth of children in a row, most recent last, that the gate rejected every one of."""
        if self.coder is None:
            return 0
        trailing = 0
        for child in reversed(list(self.children.values())):
            if child.rejected_by in (RejectedBy.coder, RejectedBy.budget):
                continue  # the gate never saw a draft (an LLM's outage, a spent token budget): no gate failure
            if child.status is not VariantStatus.rejected:
                break
            trailing += 1
        return trailing // self.per_generation

    def _close_generations(self) -> None:
        """The cycles rows, final, and one KB part per table and generation."""
        counts = self._write_cycles()
        with self.kb_lock:
            for generation in counts:  # one part per generation instead of one per trial: readers pay per file
                self.kb.compact(
                    "epochs",
                    records.trial_parts(self.run_id, generation),
                    records.part(self.run_id, generation, "compacted"),
                )
                self.kb.compact(
                    "trials",
                    records.trial_parts(self.run_id, generation),
                    records.part(self.run_id, generation, "compacted"),
                )

    def _write_cycles(self) -> dict[int, int]:
        """A cycles row per generation so far (trials, best so far, children, rejected), the part replaced each time:
        written as each generation closes and at the end (a killed run had none: only the end wrote them). Returns
        the trials per generation."""
        counts = {int(g): int(n) for g, n in self.kb.reader().execute(sql.TRIALS_PER_CYCLE, [self.run_id]).fetchall()}
        with self.pool.changed:  # the breeder's thread adds members and children meanwhile
            everyone = list(self.pool.members.values())
            bred = list(self.children.values())
        best: float | None = None
        rows = []
        for generation in sorted(set(counts) | {m.generation for m in everyone}):
            members = [m for m in everyone if m.generation <= generation and m.best is not None]
            best = max((m.best for m in members if m.best is not None), default=best)
            asked = [c for c in bred if self._generation_of(c) == generation]
            folder = self.run_dir / "generations" / f"gen_{generation:04d}"
            folder.mkdir(parents=True, exist_ok=True)
            analysis = (folder / "analysis.md").read_text() if (folder / "analysis.md").exists() else ""
            rows.append(
                records.cycle_row(self.run_id, generation, counts.get(generation, 0), best, asked, folder, analysis)
            )
        with self.kb_lock:
            self.kb.put("cycles", rows, records.part(self.run_id, 0, "generations"))
        return counts

    def _generation_of(self, child: Child) -> int:
        member = self.pool.members.get(child.variant_id)
        if member is not None:
            return member.generation
        parent = self.pool.members.get(child.parent_id)
        return parent.generation + 1 if parent else 2

    # -- state and resume ------------------------------------------------------------------------

    def _elapsed(self) -> float:
        return self.state.elapsed_s + (time.monotonic() - self.mark)

    def _time_spent(self) -> bool:
        limit = self.cfg.safeguards.search_time_s
        return limit is not None and self._elapsed() >= limit

    def _save_state(self) -> None:
        self.charge_time()
        self.state.save(self.run_dir)
        with self.kb_lock:
            self.kb.put("runs", [records.run_status(self.run_row, RunStatus.running, self.state)], self.run_id)

    def _rebuild(self) -> int:
        """The pool as the KB records it (the seed on a fresh start); returns how many children were bred."""
        con = self.kb.reader()
        rows = con.execute(sql.ASYNC_VARIANTS, [self.run_id]).fetchall()
        if not rows:
            seed = self._seed()
            self.kb.put(
                "variants",
                records.variant_rows(self.run_id, 1, [seed], self.cfg.agent),
                records.part(self.run_id, 1, "seed"),
            )
            self.pool.add(self._member(seed, 1))
            self._log(f"  seed variant {seed.variant_id} ({self.cfg.trainer_dir()})")
            return 0
        trials = con.execute(sql.ASYNC_TRIALS, [self.run_id, STOPPED_WITH_CYCLE]).fetchall()
        self.decided = int(con.execute(sql.CYCLES_DECIDED, [self.run_id]).fetchone()[0] or 0)
        forecast.rebuild(self.forecaster, con, self.run_id)  # the first trials after a resume are forecast too
        order = {t[0]: n for n, t in enumerate(trials, 1)}  # written order: ties rank the first written, as the KB
        for (
            variant_id,
            parent_id,
            generation,
            status,
            files_dir,
            diff,
            interventions,
            diagnosis,
            rationale,
            reason,
            parent_score,
        ) in rows:
            files = Path(files_dir)
            status = VariantStatus(status)
            own = read_knobs((files / "train.py").read_text()) if (files / "train.py").exists() else {}
            child = Child(
                variant_id,
                parent_id or "",
                files,
                json.loads(interventions or "[]"),
                diagnosis or "",
                rationale or "",
                status,
                reason,
                diff or "",
                own,
                parent_score,
            )
            if status is not VariantStatus.seed:
                self.children[variant_id] = child
            if status is VariantStatus.rejected:
                self.judged.add(variant_id)
                continue
            mine = [t[:5] for t in trials if t[1] == variant_id and not t[5]]
            member = self._member(child, int(generation), started=len(mine))
            member.discarded = status is VariantStatus.discarded
            for _, _, trial_status, knobs, score, _, seed, test in (t for t in trials if t[1] == variant_id and t[5]):
                done = trial_status == TrialStatus.completed.value
                member.note_replicate(int(seed))
                self.tally.note(variant_id, knobs, int(seed), score if done else None, test if done else None)
            member.finished = len(mine)
            member.failed = sum(t[2] == TrialStatus.failed.value for t in mine)
            self.pool.add(member)
            for trial_id, _, trial_status, knobs, score in mine:
                self.pool.warm_start(variant_id, trial_id, knobs, score, TrialStatus(trial_status), order[trial_id])
            if status not in (VariantStatus.candidate, VariantStatus.seed):
                self.judged.add(variant_id)
            elif member.judged and status is VariantStatus.candidate:
                self._judge(member)  # its last trial was recorded, its verdict not yet
            elif member.judged and status is VariantStatus.seed:
                self._replicate([variant_id])  # replicates a stop cut short run again
            if member.judged and status is VariantStatus.kept and self._follows_best(member):
                self._replicate([variant_id])  # a kept child whose best moved before the stop (see _sink)
        self.pool.reseed(
            trials_started(self.run_dir)
        )  # the picks go on from the dead drivers' instead of repeating them
        queued = self.pool.queued()
        self._log(
            f"  rebuilt from the KB: {len(self.pool.members)} variants, {len(trials)} trials, "
            f"{len(self.children)} children ({queued} waiting for a slot)"
        )
        return len(self.children)


class _StopNow(tune.Stopper):
    """Ends the whole run when the decision engine said stop, a STOP file appeared or the campaign's time ran out."""

    def __init__(self, campaign: AsyncCampaign) -> None:
        self.campaign = campaign

    def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
        return False

    def stop_all(self) -> bool:
        sigterm.check()  # a SIGTERM a finalizer swallowed ends the run as one that got through
        c = self.campaign
        # A failed breeder (a key revoked, a model gone: AgentConfigError) ends the run as a stop request does; the
        # driver then raises its error. Left running, the seed's knob samples filled the slots until a budget.
        return c.stop_now or c.breeder.error is not None or stop_requested(c.run_dir) or c._time_spent()

    def __getstate__(self) -> dict[str, Any]:
        return {}  # Tune pickles its run config; the campaign lives only in this driver


class _KillDuringTrial(tune.Callback):
    """The test hook's `trial_running` point: a trial has reported an epoch and is still running."""

    def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict[str, Any], **info: Any) -> None:
        kill_point("trial_running")
