"""The orchestrator: a thin sequencer of a campaign's cycles. Each step's logic lives in its own module.

    cycle 1:   the seed trainer, knob search only (the baseline every child is measured against)
    cycle n>1: select parents (population) -> analyse (agents) -> write children + gate (children)
               -> train (search: one Tune run of children x knob samples; trials; ledger -> KB)
               -> record (variant outcomes, intervention effects) -> decide (decision)

Every phase reads its inputs from the run dir or the KB and leaves its outputs there before `state.json`
moves on, so a campaign killed at any point resumes at the phase it was in (`resume=<run_id>`).
"""

from __future__ import annotations

import json
import random
import secrets
import time
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf
from ray import tune
from rich.console import Console

from ralph_ray import harness, sql
from ralph_ray.agents import make_agents
from ralph_ray.agents.base import Analysis, Diagnosis, EpochPoint, InterventionEffect, ParentView, Recommendation, TrialSummary, Usage
from ralph_ray.children import Breeder, Child, analyse, bake, breed, knob_child
from ralph_ray.config import Config
from ralph_ray.decision import CycleFacts, Decision, StopReason, decide
from ralph_ray.exit_codes import ExitCode
from ralph_ray.gate import Gate, write_smoke_data
from ralph_ray.kb import KnowledgeBase, now
from ralph_ray.knobs import read_knobs
from ralph_ray.ledger import STOPPED_WITH_CYCLE, TrialLedger, TrialRecord, TrialStatus
from ralph_ray.population import Candidate, branch_of, select_parents
from ralph_ray.progress import LiveProgress
from ralph_ray.raycluster import checkpoint_interval, driver_node_id, ensure_ray
from ralph_ray.search import SearchPlan, clip_to_space, relative_knobs
from ralph_ray.state import CampaignState, Phase, RunStatus, stop_requested
from ralph_ray.tasks import prepare_splits
from ralph_ray.tasks.base import Splits, sha256_file, write_public
from ralph_ray.trials import PublicData, TrialSpec, read_files
from ralph_ray.variants import VariantStatus, snapshot

OUTPUT_LIMIT_BYTES = 50 * 1024 * 1024


class CampaignError(RuntimeError):
    """A campaign that cannot start or resume (e.g. its run dir is taken); the message names the fix."""


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


def new_run_id() -> str:
    """A sortable, unique run id: UTC timestamp plus a random suffix."""
    return f"{datetime.now(timezone.utc):%Y%m%d-%H%M%S}-{secrets.token_hex(2)}"


def run(cfg: Config, console: Console | None = None) -> Outcome:
    """Run (or, with cfg.resume, continue) a campaign until a stop rule fires."""
    console = console or Console(soft_wrap=True)
    resuming = cfg.resume is not None
    run_id = cfg.resume or cfg.run_id or new_run_id()
    run_dir = Path(cfg.paths.runs).resolve() / run_id
    kb_root = Path(cfg.paths.kb).resolve()
    if resuming and not (run_dir / "state.json").exists():
        raise CampaignError(f"cannot resume {run_id}: no {run_dir / 'state.json'} (check the run id and paths.runs)")
    if not resuming and (run_dir / "state.json").exists():
        raise CampaignError(f"run {run_id} already exists at {run_dir}: resume it with resume={run_id}, or pick another run_id")
    # Data first: a missing or corrupt dataset stops here, before a run is recorded or Ray starts.
    console.print(f"[bold]prepare[/] task {cfg.task.name}: frozen splits")
    splits = prepare_splits(cfg)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.structured(cfg)))
    if resuming:
        state = CampaignState.load(run_dir)
        (run_dir / "STOP").unlink(missing_ok=True)  # a resume is the user's wish to go on
        if state.phase is Phase.done:
            # Re-enter the phase a stop cut short, or re-decide under the (possibly raised) limits.
            state.phase, state.interrupted = state.interrupted or Phase.decide, None
        state.status = RunStatus.running
        console.print(f"[bold]resume[/] run [cyan]{run_id}[/] at cycle {state.cycle}, phase {state.phase.value}")
    else:
        state = CampaignState(run_id=run_id)
    state.save(run_dir)
    console.print(f"[bold]ralph_ray[/] run [cyan]{run_id}[/] ({cfg.experiment}, agent {cfg.agent.backend.value})\n"
                  f"  run dir: {run_dir}\n  knowledge base: {kb_root}")

    kb = KnowledgeBase(kb_root)
    kb.init()
    first = kb.reader().execute(sql.RUN_STARTED_AT, [run_id]).fetchone() if resuming else None
    run_row = {"run_id": run_id, "experiment": cfg.experiment, "task": cfg.task.name, "run_dir": str(run_dir),
               "config": json.dumps(asdict(cfg), default=str), "started_at": first[0] if first else now()}
    kb.put("runs", [{**run_row, "status": "running", "cycle": state.cycle, "phase": state.phase.value}], run_id)
    try:
        outcome = Campaign(cfg, console, run_dir, kb, state, splits, run_row).loop()
    except BaseException as err:
        state.status, state.stop_reason = RunStatus.crashed, f"{type(err).__name__}: {err}"
        state.save(run_dir)
        kb.put("runs", [{**run_row, "status": "crashed", "stop_reason": state.stop_reason, "finished_at": now(),
                         "cycle": state.cycle, "phase": state.phase.value}], run_id)
        raise
    kb.put("runs", [{**run_row, "status": "finished", "stop_reason": outcome.stop_reason, "finished_at": now(),
                     "cycle": state.cycle, "phase": state.phase.value}], run_id)
    from ralph_ray.report import write_report

    report = write_report(kb_root, run_id, run_dir)
    console.print(f"  report: {report}")
    return outcome


class Campaign:
    """Runs the phases of each cycle in order, saving state after each."""

    def __init__(self, cfg: Config, console: Console, run_dir: Path, kb: KnowledgeBase, state: CampaignState, splits: Splits,
                 run_row: dict[str, Any]) -> None:
        self.cfg, self.console, self.run_dir, self.kb, self.state, self.splits = cfg, console, run_dir, kb, state, splits
        self.run_row = run_row
        self.run_id = state.run_id
        self.records: list[TrialRecord] = []
        self._views: dict[tuple[int, str], ParentView] = {}
        self.mark = time.monotonic()
        self.analyst, self.coder = make_agents(cfg, self.run_id)
        data_dir = run_dir / "data"
        hashes = write_public(splits, data_dir, cfg.task.name)
        self.data = PublicData({name: (data_dir / name).read_bytes() for name in hashes}, hashes)
        self.gate = Gate(write_smoke_data(splits, run_dir / "data_smoke", cfg.task.name), tuple(cfg.search.space),
                         cfg.safeguards.smoke_timeout_s)
        self.rng = random.Random(cfg.agent.seed)
        ensure_ray(cfg.resources.ray_num_cpus, cfg.cluster)

    # -- the loop -------------------------------------------------------------------------------

    def loop(self) -> Outcome:
        """Run phases until the decision engine stops the campaign."""
        steps = {Phase.select: self.select, Phase.analyse: self.analyse, Phase.write: self.write,
                 Phase.train: self.train, Phase.record: self.record, Phase.decide: self.decide}
        while self.state.phase is not Phase.done:
            phase = self.state.phase
            if phase in (Phase.select, Phase.analyse, Phase.write) and stop_requested(self.run_dir):
                self.state.interrupted = phase
                self._advance(Phase.record)  # a manual stop ends the cycle cleanly: record what exists, decide
                continue
            steps[phase]()
        code = ExitCode(self.state.exit_code if self.state.exit_code is not None else ExitCode.ok)
        return Outcome(self.run_id, self.run_dir, self.kb.root, code, self.state.stop_reason or "", self.state.best_variant_id,
                       self.state.best_selection_score, self.records)

    @property
    def cycle_dir(self) -> Path:
        """This cycle's folder."""
        path = self.run_dir / f"cycle_{self.state.cycle:04d}"
        path.mkdir(parents=True, exist_ok=True)
        return path

    def _advance(self, phase: Phase) -> None:
        now_ = time.monotonic()
        self.state.elapsed_s += now_ - self.mark
        self.mark = now_
        self.state.phase = phase
        self.state.save(self.run_dir)
        # The runs row carries the live cycle and phase (the app's status page reads it); one part per run, replaced.
        self.kb.put("runs", [{**self.run_row, "status": "running", "cycle": self.state.cycle, "phase": phase.value}], self.run_id)

    def _phase(self, name: str, detail: str = "") -> None:
        self.console.print(f"[bold magenta]cycle {self.state.cycle}[/] [bold]{name}[/] {detail}")

    # -- select ---------------------------------------------------------------------------------

    def select(self) -> None:
        """Cycle 1: the seed. Later: the top variants so far, with exploration."""
        if self.state.cycle == 1:
            seed = snapshot(self.cfg.trainer_dir(), self.run_dir / "variants")
            (seed.files_dir.parent / "diff.patch").write_text("")
            child = Child(seed.variant_id, "", seed.files_dir, [], Diagnosis.healthy.value, "the seed trainer", VariantStatus.seed,
                          None, "", read_knobs((seed.files_dir / "train.py").read_text()), None)
            self._save_children([child])
            self._write_variant_rows([child], "write")
            self._phase("select", f"seed variant {seed.variant_id} ({self.cfg.trainer_dir()})")
            self._advance(Phase.train)
            return
        con = self.kb.reader()
        parents_of = {row[0]: row[1] for row in con.execute(sql.VARIANT_PARENTS, [self.run_id]).fetchall()}
        ranked = [Candidate(v, float(score), json.loads(knobs or "{}"), branch_of(v, parents_of))
                  for v, score, knobs, _ in con.execute(sql.VARIANT_SCORES, [self.run_id]).fetchall()]
        picks = select_parents(ranked, self.cfg.population.parents, self.cfg.population.explore,
                               self.cfg.population.one_per_lineage, random.Random(self.cfg.agent.seed * 1000 + self.state.cycle))
        (self.cycle_dir / "parents.json").write_text(json.dumps([asdict(p) for p in picks], indent=2, default=str))
        self._phase("select", ", ".join(f"{p.variant_id} ({p.selection_score:.4f})" for p in picks) or "no parent: nothing has completed")
        self._advance(Phase.analyse)

    def _parents(self) -> list[Candidate]:
        return [Candidate(**p) for p in json.loads((self.cycle_dir / "parents.json").read_text())]

    # -- analyse --------------------------------------------------------------------------------

    def analyse(self) -> None:
        """Each parent, as its best trial ran it, diagnosed by the analyst."""
        parents = self._parents()
        self._phase("analyse", f"{len(parents)} parent(s), agent {self.cfg.agent.backend.value}")
        notes, recs, usage_rows = [], {}, []
        effects = self._effects()
        for parent in parents:
            view = self._view(parent)
            if self.analyst is None:
                continue
            analysis, usage = analyse(self.analyst, view, effects, self._log)
            usage_rows.append(self._usage_row("analyst", parent.variant_id, usage))
            notes.append(f"## parent {parent.variant_id} (selection {parent.selection_score:.4f})\n\n"
                         f"diagnoses: {', '.join(d.value for d in analysis.diagnoses) or '-'}\n\n{analysis.summary}\n")
            recs[parent.variant_id] = {"diagnoses": [d.value for d in analysis.diagnoses], "summary": analysis.summary,
                                       "recommendations": [{**asdict(r), "diagnosis": r.diagnosis.value} for r in analysis.recommendations]}
            top = ", ".join(r.intervention for r in analysis.recommendations[: self.cfg.population.children_per_parent])
            self.console.print(f"  {parent.variant_id}: {', '.join(d.value for d in analysis.diagnoses) or '-'} -> {top or 'no recommendation'}")
        (self.cycle_dir / "analysis.md").write_text(f"# cycle {self.state.cycle}: analysis\n\n" + "\n".join(notes))
        (self.cycle_dir / "recommendations.json").write_text(json.dumps(recs, indent=2))
        self.kb.put("agent_usage", usage_rows, f"{self.run_id}-c{self.state.cycle:04d}-analyst")
        self._advance(Phase.write)

    def _effects(self) -> list[InterventionEffect]:
        rows = self.kb.reader().execute(sql.EFFECTS_FOR_TASK, [self.cfg.task.name]).fetchall()
        return [InterventionEffect(i, d, int(n), m, w) for i, d, n, m, w in rows]

    def _view(self, parent: Candidate) -> ParentView:
        """What the agents may know of a parent: its code (best knobs baked in), trials, curves, lineage.

        Built once per parent and cycle (analyse and write both read it); a resumed process builds it again.
        """
        key = (self.state.cycle, parent.variant_id)
        if key not in self._views:
            self._views[key] = self._build_view(parent)
        return self._views[key]

    def _build_view(self, parent: Candidate) -> ParentView:
        baked = bake(self.run_dir / "variants" / parent.variant_id / "files", parent.best_knobs,
                     self.cycle_dir / "parents" / parent.variant_id)
        con = self.kb.reader()
        curves: dict[str, list[EpochPoint]] = {}
        for trial_id, *point in con.execute(sql.VARIANT_CURVES, [self.run_id, parent.variant_id]).fetchall():
            curves.setdefault(trial_id, []).append(EpochPoint(*point))
        trials = [TrialSummary(trial_id, status, reason, json.loads(knobs or "{}"), score, curves.get(trial_id, []))
                  for trial_id, status, reason, knobs, score in con.execute(sql.VARIANT_TRIALS, [self.run_id, parent.variant_id]).fetchall()]
        variants = {v: (p, json.loads(i or "[]")) for v, p, i in con.execute(sql.VARIANT_PARENTS, [self.run_id]).fetchall()}
        lineage, node = [], parent.variant_id
        for _ in range(len(variants)):
            parent_id, done = variants.get(node, (None, []))
            lineage = list(done) + lineage
            if not parent_id:
                break
            node = parent_id
        program = self.cfg.trainer_dir() / "program.md"
        return ParentView(parent.variant_id, baked, parent.selection_score, trials, variants.get(parent.variant_id, (None, []))[1],
                          lineage, program.read_text() if program.exists() else "")

    # -- write + validate -----------------------------------------------------------------------

    def _breeder(self) -> Breeder:
        known = frozenset(row[0] for row in self.kb.reader().execute(sql.VARIANT_PARENTS, [self.run_id]).fetchall())
        budget = self.cfg.safeguards.tokens_per_cycle
        return Breeder(self.coder, self.gate, self.run_dir / "variants", self.cycle_dir,
                       self.cfg.population.children_per_parent, self.cfg.agent.max_retries, self.cfg.agent.concurrency,
                       known, budget, self._log)

    def _log(self, line: str) -> None:
        self.console.print(line, highlight=False)

    def write(self) -> None:
        """Children of every parent (written by the coder, checked by the gate), or knob children for agent=none."""
        parents = self._parents()
        self._phase("write children", f"{self.cfg.population.children_per_parent} per parent -> validate (gate, {self.cfg.agent.max_retries} retries)")
        children: list[Child] = []
        wasted: list[dict[str, Any]] = []
        recs = json.loads((self.cycle_dir / "recommendations.json").read_text() or "{}")
        breeder = self._breeder()
        for parent in parents:
            baked = self.cycle_dir / "parents" / parent.variant_id
            if self.coder is None:
                child = knob_child(parent, baked, self.run_dir / "variants")
                children.append(child)
                self.console.print(f"  child {child.variant_id} of {parent.variant_id}: knob search (best knobs {parent.best_knobs})")
                continue
            entry = recs.get(parent.variant_id, {"diagnoses": [], "summary": "", "recommendations": []})
            analysis = Analysis(parent.variant_id, [Diagnosis(d) for d in entry["diagnoses"]], entry["summary"],
                                [Recommendation(**{**r, "diagnosis": Diagnosis(r["diagnosis"])}) for r in entry["recommendations"]])
            grown, spent = breed(breeder, parent, self._view(parent), analysis)
            children.extend(grown)
            if spent.calls:  # attempts that only reproduced a known variant still cost tokens
                wasted.append(self._usage_row("coder", f"{parent.variant_id}:duplicates", spent))
        self._save_children(children)
        self._write_variant_rows(children, "write")
        self.kb.put("agent_usage", [self._usage_row("coder", c.variant_id, c.usage) for c in children if c.usage.calls] + wasted,
                    f"{self.run_id}-c{self.state.cycle:04d}-coder")
        passed = sum(c.status is VariantStatus.candidate for c in children)
        self.console.print(f"  validate: {passed} of {len(children)} children passed the gate")
        self._advance(Phase.train)

    def _save_children(self, children: list[Child]) -> None:
        (self.cycle_dir / "children.json").write_text(json.dumps([c.as_json() for c in children], indent=2, default=str))

    def _children(self) -> list[Child]:
        path = self.cycle_dir / "children.json"
        return [Child.from_json(c) for c in json.loads(path.read_text())] if path.exists() else []

    # -- train ----------------------------------------------------------------------------------

    def train(self) -> None:
        """One Tune run: every passing child x knob samples; each trial's rows reach the KB as it ends."""
        from ralph_ray.search import run_search

        runnable = [c for c in self._children() if c.status in (VariantStatus.candidate, VariantStatus.seed)]
        cycle = self.state.cycle
        per_child = self.cfg.population.trials_per_child * (self.cfg.population.children_per_parent if self.coder is None else 1)
        planned = self.cfg.search.num_samples if cycle == 1 else len(runnable) * per_child
        done = self.kb.reader().execute(sql.CYCLE_TRIALS_DONE, [self.run_id, cycle, STOPPED_WITH_CYCLE]).fetchall()
        tried = {row[0] for row in done}
        remaining = planned - len(done)  # resume: finished trials stay, only the rest run
        if not runnable or remaining <= 0 or stop_requested(self.run_dir):
            self._phase("train", "nothing to run" if not runnable else f"{len(done)} of {planned} trials already recorded")
            self._advance(Phase.record)
            return
        relative = self.cfg.search.relative and cycle > 1  # the seed's cycle searches the configured ranges
        points = [{"variant": c.variant_id, **clip_to_space(c.own_knobs, self.cfg.search.space, relative)} for c in runnable if c.variant_id not in tried]
        plan = SearchPlan([c.variant_id for c in runnable], points[:remaining], remaining, self.cfg.search.seed + 7919 * cycle + len(done), relative)
        moved = relative_knobs(self.cfg.search.space) if relative else frozenset()
        own = {c.variant_id: c.own_knobs for c in runnable}
        spec = TrialSpec(
            variants={c.variant_id: read_files(c.files_dir) for c in runnable}, trials_root=str(self.cycle_dir / "trials"),
            data=self.data, harness_sha256=sha256_file(Path(harness.__file__)), timeout_s=self.cfg.safeguards.trial_timeout_s,
            output_limit_bytes=OUTPUT_LIMIT_BYTES, threads=max(1, int(self.cfg.resources.cpu)), seed=self.cfg.search.seed,
            hold_from_epoch=self.cfg.scheduler.max_t, relative=moved, own_knobs=own, metric=self.cfg.search.metric, mode=self.cfg.search.mode,
            checkpoint_every_s=checkpoint_interval(self.cfg), driver_node_id=driver_node_id(),
        )
        self._phase("train", f"{remaining} trials over {len(runnable)} variant(s), {self.cfg.search.max_concurrent} at a time, "
                             f"scheduler {self.cfg.scheduler.name.value}" + (f" (resumed: {len(done)} already recorded)" if done else ""))
        progress = LiveProgress(self.console, f"cycle {cycle}", remaining)

        def sink(record: TrialRecord, epoch_rows: list[dict[str, Any]]) -> None:
            tag = f"{self.run_id}-c{cycle}-{record.trial_id}"
            self.kb.append("epochs", epoch_rows, tag)
            self.kb.append("trials", [record.row()], tag)  # after its epochs: a visible trial always has its curve
            self.records.append(record)
            progress.record(record)

        ledger = TrialLedger(self.run_id, cycle, self.splits.labels(), spec.trials_root, spec.seed, self.cfg.search.metric, sink, moved, own)
        deadline = None
        if self.cfg.safeguards.campaign_time_s is not None:
            deadline = time.time() + max(1.0, self.cfg.safeguards.campaign_time_s - self.state.elapsed_s - (time.monotonic() - self.mark))
        stopper = StopRequest(str(self.run_dir), deadline)
        run_search(self.cfg, spec, plan, self.cycle_dir / "tune", f"cycle_{cycle:04d}", [ledger, progress], stopper)
        if stopper.stop_all():
            self.state.interrupted = Phase.train  # a resume runs the trials this stop cut short
        self._advance(Phase.record)

    # -- record ---------------------------------------------------------------------------------

    def record(self) -> None:
        """Judge each child against its parent; write variant statuses, intervention effects, the cycle row."""
        children = self._children()
        con = self.kb.reader()
        scores = {v: (s, t) for v, s, _, t in con.execute(sql.VARIANT_SCORES, [self.run_id]).fetchall()}
        cycle_trials = con.execute(sql.CYCLE_TRIALS, [self.run_id, self.state.cycle]).fetchall()
        rows = []
        for child in children:
            child_score = scores.get(child.variant_id, (None, None))[0]
            if child.status in (VariantStatus.candidate,):
                ran = [s for v, s in cycle_trials if v == child.variant_id]
                if ran and all(s == TrialStatus.failed.value for s in ran):
                    child.status, child.reason = VariantStatus.crashed, "every trial failed"
                elif child_score is not None and (child.parent_score is None or child_score > child.parent_score + self.cfg.safeguards.min_delta):
                    child.status = VariantStatus.kept
                else:
                    child.status = VariantStatus.discarded
                    child.reason = child.reason or ("not trained (stopped)" if not ran else None)
            if child.status is VariantStatus.seed or child.variant_id == child.parent_id:
                continue
            for name in child.interventions:
                delta = None if child_score is None or child.parent_score is None else child_score - child.parent_score
                rows.append({"run_id": self.run_id, "task": self.cfg.task.name, "cycle": self.state.cycle, "variant_id": child.variant_id,
                             "parent_id": child.parent_id, "intervention": name, "diagnosis": child.diagnosis,
                             "parent_score": child.parent_score, "child_score": child_score, "delta": delta, "outcome": child.status.value})
        for table in ("epochs", "trials"):  # one part per cycle instead of one per trial: readers pay per file
            self.kb.compact(table, f"{self.run_id}-c{self.state.cycle}-", f"{self.run_id}-c{self.state.cycle:04d}-compacted")
        self._save_children(children)
        self._write_variant_rows(children, "record", scores)
        self.kb.put("interventions", rows, f"{self.run_id}-c{self.state.cycle:04d}")
        best = max(scores.items(), key=lambda item: item[1][0], default=None)
        self.state.best_variant_id, self.state.best_selection_score = (best[0], best[1][0]) if best else (None, None)
        row = con.execute(sql.BEST_TRIAL, [self.run_id]).fetchone()
        self.state.best_trial_id = row[0] if row else None
        asked = [c for c in children if c.status is not VariantStatus.seed and c.variant_id != c.parent_id]
        if self.coder is not None and asked and not any(c.status is not VariantStatus.rejected for c in asked):
            self.state.gate_fail_streak += 1
        elif asked:
            self.state.gate_fail_streak = 0
        self.state.best_by_cycle = self.state.best_by_cycle[: self.state.cycle - 1] + [self.state.best_selection_score]
        self.kb.put("cycles", [{"run_id": self.run_id, "cycle": self.state.cycle, "finished_at": now(), "trials": len(cycle_trials),
                                "best_selection_score": self.state.best_selection_score, "phase": Phase.decide.value,
                                "parents": json.dumps(sorted({c.parent_id for c in asked})), "children": len(asked),
                                "rejected": sum(c.status is VariantStatus.rejected for c in asked)}],
                    f"{self.run_id}-c{self.state.cycle:04d}")
        kept = [f"{c.variant_id} (+{' + '.join(c.interventions)})" for c in children if c.status is VariantStatus.kept]
        best_text = f"{self.state.best_selection_score:.4f} ({self.state.best_variant_id})" if best else "-"
        self._phase("record", f"best so far {best_text}; kept: {', '.join(kept) or 'none'}")
        self.state.phase = Phase.decide
        self.state.save(self.run_dir)

    # -- decide ---------------------------------------------------------------------------------

    def decide(self) -> None:
        """Continue or stop; the decision and its rationale go to decision.json and the KB."""
        con = self.kb.reader()
        tokens_cycle, _ = con.execute(sql.USAGE_FOR_CYCLE, [self.run_id, self.state.cycle]).fetchone()
        _, tokens, cost, _ = con.execute(sql.USAGE_FOR_RUN, [self.run_id]).fetchone()
        elapsed = self.state.elapsed_s + (time.monotonic() - self.mark)
        facts = CycleFacts(self.state.cycle, list(self.state.best_by_cycle), self.cfg.target.selection_score, int(tokens_cycle),
                           int(tokens), float(cost), self.state.gate_fail_streak, elapsed, stop_requested(self.run_dir))
        decision = decide(facts, self.cfg.safeguards)
        self._record_decision(decision, facts)
        if decision.stop:
            self.state.stop_reason, self.state.exit_code = decision.reason.value, decision.exit_code
            self.state.status = RunStatus.finished
            self._advance(Phase.done)
        else:
            self.state.cycle += 1
            self._advance(Phase.select)

    def _record_decision(self, decision: Decision, facts: CycleFacts) -> None:
        data = {**decision.as_json(), "elapsed_s": round(facts.elapsed_s, 1), "tokens_campaign": facts.tokens_campaign,
                "cost_campaign": facts.cost_campaign, "best_variant_id": self.state.best_variant_id}
        (self.cycle_dir / "decision.json").write_text(json.dumps(data, indent=2))
        self.kb.put("decisions", [{"run_id": self.run_id, "cycle": decision.cycle, "decision": data["decision"], "reason": decision.reason.value,
                                   "exit_code": decision.exit_code, "rationale": decision.rationale, "best_selection_score": decision.best_selection_score,
                                   "best_variant_id": self.state.best_variant_id, "elapsed_s": facts.elapsed_s, "tokens": facts.tokens_campaign,
                                   "cost": facts.cost_campaign}], f"{self.run_id}-c{decision.cycle:04d}")
        guards = self.cfg.safeguards
        budget = lambda used, limit: f"{used}/{limit}" if limit is not None else f"{used}"  # noqa: E731
        colour = "green" if not decision.stop or decision.reason in (StopReason.target_met, StopReason.max_cycles, StopReason.manual_stop) else "yellow"
        self._phase("decide", f"[{colour}]{data['decision']}[/] ({decision.reason.value}): {decision.rationale}")
        self.console.print(f"  budgets: cycle {decision.cycle}/{guards.max_cycles}, time {budget(round(facts.elapsed_s), guards.campaign_time_s)}s, "
                           f"tokens {budget(facts.tokens_campaign, guards.tokens_per_campaign)}, plateau rule {guards.plateau_cycles} cycles")

    # -- rows -----------------------------------------------------------------------------------

    def _write_variant_rows(self, children: list[Child], phase: str, scores: dict[str, tuple[Any, Any]] | None = None) -> None:
        """Variant rows (the newest row per variant wins in the view); a child identical to its parent is no new variant."""
        rows = [{"run_id": self.run_id, "variant_id": c.variant_id, "parent_id": c.parent_id or None, "cycle": self.state.cycle,
                 "files_dir": str(c.files_dir), "diff": c.diff, "status": c.status.value, "interventions": json.dumps(c.interventions),
                 "diagnosis": c.diagnosis, "rationale": c.rationale, "reason": c.reason, "parent_score": c.parent_score,
                 "selection_score": (scores or {}).get(c.variant_id, (None, None))[0], "backend": self.cfg.agent.backend.value}
                for c in children if c.variant_id != c.parent_id]
        self.kb.put("variants", rows, f"{self.run_id}-c{self.state.cycle:04d}-{phase}")

    def _usage_row(self, role: str, variant_id: str, usage: Usage) -> dict[str, Any]:
        cost = (usage.tokens_in * self.cfg.agent.price_in_per_m + usage.tokens_out * self.cfg.agent.price_out_per_m) / 1e6
        return {"run_id": self.run_id, "cycle": self.state.cycle, "role": role, "backend": self.cfg.agent.backend.value,
                "variant_id": variant_id, "calls": usage.calls, "tokens_in": usage.tokens_in, "tokens_out": usage.tokens_out,
                "seconds": usage.seconds, "cost": cost, "estimated": usage.estimated}


class StopRequest(tune.Stopper):
    """Ends every trial of the cycle when a STOP file appears or the campaign's time runs out."""

    def __init__(self, run_dir: str, deadline: float | None) -> None:
        self.run_dir, self.deadline = run_dir, deadline

    def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
        return False

    def stop_all(self) -> bool:
        return stop_requested(Path(self.run_dir)) or (self.deadline is not None and time.time() > self.deadline)

