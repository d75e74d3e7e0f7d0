"""The population as a Tune searcher: every free slot gets the next (variant, knobs), so one Tune run is a campaign.

`Pool` is the population as it stands: its members (variants with their generation, code, trials and best
score), one Optuna study per member (ask/tell, TPE) and the queue of gated children. Three threads share it:
Tune's (`suggest`), the ledger's sink (a finished trial is told to its study) and the breeder's (new children).
`PopulationSearcher` is the thin Tune side. A slot goes to the first queued child that still has trials to
start (its own knobs first, then TPE samples; a knob-search child's are its parent's best trial's, so it starts
with samples); with no child waiting, to a knob sample of a promising variant
chosen as parents are (`population.select_parents`), so no slot waits for the agents.
"""

from __future__ import annotations

import base64
import json
import random
import threading
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
from ray.tune.search import Searcher
from ray.tune.search.optuna import OptunaSearch

from ralph_ray.config import KnobSpace, SamplerKind
from ralph_ray.faults import kill_point
from ralph_ray.knobs import resolve_knobs
from ralph_ray.ledger import TrialRecord
from ralph_ray.population import Candidate, branch_of, select_parents
from ralph_ray.search import optuna_sampler, param_space
from ralph_ray.space import clip_to_space, relative_knobs
from ralph_ray.statuses import TrialStatus

# A resumed study's sampler seed, and the pool's generator's (`Pool.reseed`), move by this per recorded trial: far
# apart from the next studies' (seed + place)
RESUME_SEED_STRIDE = 1_000_003
CODE_KEY = "_code"  # a trial's config carries its variant's files: children are bred after the Tune run started


def encode_code(files: dict[str, bytes]) -> str:
    """A variant's files as one JSON string (base64 per file) for a trial's config."""
    return json.dumps({name: base64.b64encode(data).decode() for name, data in sorted(files.items())})


def decode_code(text: str) -> dict[str, bytes]:
    """Inverse of encode_code."""
    return {name: base64.b64decode(data) for name, data in json.loads(text).items()}


@dataclass
class Member:
    """One variant of the population and how its trials stand."""

    variant_id: str
    parent_id: str | None
    generation: int  # the seed is 1; a child is its parent's + 1 (written to the KB's cycle columns)
    code: str  # encode_code of its files
    own_knobs: dict[str, Any]
    relative: bool  # knobs sampled as factors on its own values (children), or over the configured ranges (seed)
    wanted: int  # trials it is queued for (the first runs its own knobs); more may come as knob samples
    parent_score: float | None = None
    # False for a knob-search child (children.reruns_parent): its own knobs would repeat its parent's best trial.
    runs_own_first: bool = True
    started: int = 0
    finished: int = 0
    failed: int = 0
    best: float | None = None
    best_knobs: dict[str, Any] = field(default_factory=dict)
    best_trial_id: str | None = None  # the completed trial that scored `best` (state.json's best_trial_id)
    best_order: int = 0  # when `best` was reached, in recorded trials: ties rank the first written, as sql.BEST_TRIAL
    # Each search trial's score in recorded order (None: not completed): a child is judged against its parent's
    # best over as many trials as it had itself (`best_of`), not over the parent's many knob samples since.
    scores: list[float | None] = field(default_factory=list)
    # Replicates: the seeds of those recorded (their scores are replicates.Tally's, per knobs) and how many are asked
    # for but not recorded yet.
    replica_seeds: list[int] = field(default_factory=list)
    replicas_pending: int = 0
    # Queued trials started and not finished yet (Tune trial ids). A knob sample of this member started in a free
    # slot may finish first (a queued trial lost its node and waits to resume): it must not stand in for it.
    queued_open: set[str] = field(default_factory=set)
    # Its verdict found it no better than its parent: it ranks below every other member, as the leaderboard ranks
    # it (sql._leaderboard), so no parent pick rests on a discarded child's luckier best trial. Unlike the
    # leaderboard, the pool ranks the rest by their best search trial, not by a replicate mean (the replicates'
    # scores are the campaign's replicates.Tally, not the pool's): async parents can differ from the pick.
    discarded: bool = False

    def note_replicate(self, seed: int) -> None:
        """A replicate trial of this member was recorded."""
        self.replica_seeds.append(seed)

    def note_trial(
        self, trial_id: str, status: TrialStatus, score: float | None, knobs: str | None, order: int
    ) -> None:
        """A search trial of this member was recorded, `order`-th of the run's: a completed one that beats `best`
        becomes it (a tie keeps the earlier: the first written, as sql.BEST_TRIAL)."""
        completed = status is TrialStatus.completed and score is not None
        self.scores.append(float(score) if completed and score is not None else None)
        if completed and score is not None and (self.best is None or score > self.best):
            self.best, self.best_knobs = float(score), json.loads(knobs or "{}")
            self.best_trial_id, self.best_order = trial_id, order

    def best_of(self, trials: int) -> float | None:
        """The best score of its first `trials` search trials (the best so far where it has fewer): a max over more
        samples is higher by chance alone, so equal counts compare a child with its parent."""
        first = [s for s in self.scores[: max(1, trials)] if s is not None]
        return max(first) if first else self.best

    @property
    def waiting(self) -> bool:
        """Queued trials not started yet."""
        return self.started < self.wanted

    @property
    def judged(self) -> bool:
        """Every queued trial has finished: the child can be judged against its parent."""
        return self.finished >= self.wanted and not self.queued_open


@dataclass(frozen=True)
class PoolSettings:
    """What the pool samples from and how it picks promising variants."""

    space: dict[str, KnobSpace]
    relative_span: float
    parents: int
    explore: float
    one_per_lineage: bool
    seed: int
    sampler: SamplerKind = SamplerKind.tpe  # search.sampler


class Pool:
    """The population as it stands, shared by Tune's thread, the ledger's sink and the breeder (one lock)."""

    def __init__(self, settings: PoolSettings) -> None:
        self.settings = settings
        self.members: dict[str, Member] = {}
        self.queue: deque[str] = deque()
        self.replicas: deque[dict[str, Any]] = deque()  # replicate trial configs: they go before anything else
        self.studies: dict[str, optuna.Study] = {}
        self.study_order: dict[str, int] = {}  # variant -> its study's place in creation order (its sampler's seed)
        self.pending: dict[str, tuple[str, int]] = {}  # Tune trial id -> (variant, Optuna trial number)
        self.children_of: dict[str, int] = {}  # parent id -> children bred from it (spreads the breeding)
        self.closed = False  # no trial starts any more (the decision engine stopped the campaign)
        self.changed = threading.Condition()
        self.rng = random.Random(settings.seed)  # which promising variant a free slot samples (`_promising`)
        self.recorded = 0  # trials finished so far (the ledger writes each to the KB just before telling the pool)
        optuna.logging.set_verbosity(optuna.logging.WARNING)

    # -- members ---------------------------------------------------------------------------------

    def add(self, member: Member, queued: bool = True) -> None:
        """A new member (the seed, a gated child, or one rebuilt from the KB on resume)."""
        with self.changed:
            self.members[member.variant_id] = member
            if member.parent_id:
                self.children_of[member.parent_id] = self.children_of.get(member.parent_id, 0) + 1
            if queued and member.waiting:
                self.queue.append(member.variant_id)
            self.changed.notify_all()

    def request_replicates(self, configs: list[dict[str, Any]]) -> None:
        """Queue replicate trials (replicates.points); each free slot takes the next before any other trial."""
        with self.changed:
            for config in configs:
                self.members[str(config["variant"])].replicas_pending += 1
                self.replicas.append(config)
            self.changed.notify_all()

    def queued(self) -> int:
        """Gated children (or the seed) with trials still to start."""
        with self.changed:
            return sum(1 for v in self.queue if self.members[v].waiting)

    def ranked(self, below_generation: int | None = None) -> list[Candidate]:
        """Members with a completed trial, best first, discarded ones last (optionally only those younger than a
        generation)."""
        with self.changed:
            parents = {m.variant_id: m.parent_id for m in self.members.values()}
            scored = [
                m
                for m in self.members.values()
                if m.best is not None and (below_generation is None or m.generation < below_generation)
            ]
            scored.sort(key=lambda m: (m.discarded, *_by_best_trial(m)))
            return [
                Candidate(m.variant_id, float(m.best or 0.0), dict(m.best_knobs), branch_of(m.variant_id, parents))
                for m in scored
            ]

    def best(self) -> Member | None:
        """The member with the best single search trial so far, discarded or not (state.json's best, as
        sql.BEST_TRIAL); parents come from `ranked`."""
        with self.changed:
            scored = [m for m in self.members.values() if m.best is not None]
            return min(scored, key=_by_best_trial, default=None)

    def warm_start(
        self, variant_id: str, trial_id: str, knobs: str | None, score: float | None, status: TrialStatus, order: int
    ) -> None:
        """A trial recorded before this process started (resume), `order`-th of the run's in the KB: its member's best
        as `finish` keeps it, and its study as Optuna's `add_trial`."""
        member = self.members[variant_id]
        member.note_trial(trial_id, status, score, knobs, order)
        self.recorded = max(self.recorded, order)  # the trials this process records come after it
        study = self._study(member)
        # Seeded as a fresh study, its sampler would draw its sequence over: the points the dead driver already
        # trained (user trial: three of the seed's knob sets re-run with the same scores). Seeded by its recorded
        # trials too, it goes on with new draws, as deterministically as a fresh start.
        study.sampler = self._sampler(variant_id, len(member.scores))
        params = self._params_of(member, json.loads(knobs or "{}"))
        if params is None:
            return
        state = {
            TrialStatus.completed: optuna.trial.TrialState.COMPLETE,
            TrialStatus.stopped_early: optuna.trial.TrialState.PRUNED,
        }.get(status, optuna.trial.TrialState.FAIL)
        value = score if state is optuna.trial.TrialState.COMPLETE and score is not None else None
        if value is None and state is optuna.trial.TrialState.COMPLETE:
            state = optuna.trial.TrialState.FAIL
        trial = optuna.trial.create_trial(
            params=params, distributions=self._distributions(member), value=value, state=state
        )
        study.add_trial(trial)

    def reseed(self, started: int) -> None:
        """Seed the generator once a resume has rebuilt the pool: from the run's seed, the trials recorded and
        `started` (the trials the run had started, recorded or not). Seeded afresh, the picks would repeat those the
        dead driver drew; by the recorded count alone, those of a resume that died before recording a trial."""
        with self.changed:
            self.rng = random.Random(self.settings.seed + RESUME_SEED_STRIDE * self.recorded + started)

    # -- Tune's side -----------------------------------------------------------------------------

    def suggest(self, trial_id: str) -> dict[str, Any] | str | None:
        """The next trial's config, Searcher.FINISHED once closed, or None (nothing to run now: ask again later)."""
        with self.changed:
            if self.closed:
                return Searcher.FINISHED
            if self.replicas:
                config = self.replicas.popleft()
                member = self.members[str(config["variant"])]
                self.pending[trial_id] = (member.variant_id, -1)  # no study: a replicate samples nothing
                return {**config, CODE_KEY: member.code}
            while self.queue and not self.members[self.queue[0]].waiting:
                self.queue.popleft()
            # A gated child goes before the seed's remaining knob samples: the seed's search only sets a baseline.
            waiting = [self.members[v] for v in self.queue if self.members[v].waiting]
            member = next((m for m in waiting if m.generation > 1), waiting[0] if waiting else None)
            if member is None:
                kill_point("queue_empty")
                member = self._promising()
            if member is None:
                return None
            return self._sample(member, trial_id)

    def finish(self, record: TrialRecord) -> Member | None:
        """A trial ended (the ledger scored it): tell its study, update its member; returns the member."""
        with self.changed:
            member = self.members.get(record.variant_id)
            entry = self.pending.pop(record.trial_id, None)
            if member is None:
                return None
            if record.replicate:
                member.replicas_pending = max(0, member.replicas_pending - 1)
                member.note_replicate(record.seed)
                self.changed.notify_all()
                return member
            member.finished += 1
            self.recorded += 1
            member.queued_open.discard(record.trial_id)
            member.failed += record.status is TrialStatus.failed
            score = record.selection_score
            member.note_trial(record.trial_id, record.status, score, record.knobs, self.recorded)
            if entry is not None:
                study = self._study(member)
                if record.status is TrialStatus.completed and score is not None:
                    study.tell(entry[1], score)
                elif record.status is TrialStatus.stopped_early:
                    study.tell(entry[1], state=optuna.trial.TrialState.PRUNED)
                else:
                    study.tell(entry[1], state=optuna.trial.TrialState.FAIL)
            self.changed.notify_all()
            return member

    def close(self) -> None:
        """No more trials start (running ones end as Tune ends them)."""
        with self.changed:
            self.closed = True
            self.changed.notify_all()

    # -- sampling --------------------------------------------------------------------------------

    def _promising(self) -> Member | None:
        """A variant worth another knob sample: one of the would-be parents; before any score, the seed while its
        queued trials are out (none after: a seed whose every trial failed would be sampled for ever)."""
        ranked = self.ranked()
        if not ranked:
            # Once the seed's queued trials are all in without a score, the trials in flight finish and the decision
            # engine stops the run (no_trial_completed), as the barrier loop's first cycle does. At most as many knob
            # samples again as it queued until then: trials that fail in a tenth of a second end faster than Tune's
            # callbacks tell the pool, and each freed slot would ask again meanwhile.
            roots = [
                m for m in self.members.values() if m.generation == 1 and not m.judged and m.started < 2 * m.wanted
            ]
            return roots[0] if roots else None
        s = self.settings
        picks = select_parents(ranked, s.parents, s.explore, s.one_per_lineage, self.rng)
        return self.members[self.rng.choice(picks).variant_id]

    def _sample(self, member: Member, trial_id: str) -> dict[str, Any]:
        study = self._study(member)
        if member.started == 0 and not study.trials and member.runs_own_first:  # as its coder wrote it first
            study.enqueue_trial(clip_to_space(member.own_knobs, self.settings.space, member.relative))
        trial = study.ask(self._distributions(member))
        moved = relative_knobs(self.settings.space, self.settings.relative_span) if member.relative else {}
        knobs = resolve_knobs(trial.params, member.own_knobs, moved)
        if member.waiting:
            member.queued_open.add(trial_id)
        member.started += 1
        self.pending[trial_id] = (member.variant_id, trial.number)
        return {"variant": member.variant_id, **knobs, CODE_KEY: member.code}

    def _study(self, member: Member) -> optuna.Study:
        if member.variant_id not in self.studies:
            self.study_order[member.variant_id] = len(self.studies)
            sampler = self._sampler(member.variant_id, 0)
            self.studies[member.variant_id] = optuna.create_study(direction="maximize", sampler=sampler)
        return self.studies[member.variant_id]

    def _sampler(self, variant_id: str, recorded: int) -> Any:
        """A study's sampler, seeded by the run's seed, the study's place and the trials it had before this process."""
        seed = self.settings.seed + self.study_order[variant_id] + RESUME_SEED_STRIDE * recorded
        return optuna_sampler(self.settings.sampler, seed % 2**32)  # numpy's seeds are 32-bit

    def _distributions(self, member: Member) -> dict[str, optuna.distributions.BaseDistribution]:
        # The same domains as the barrier mode's OptunaSearch (absolute for the seed, factors for children).
        space = param_space(self.settings.space, member.relative, self.settings.relative_span)
        return OptunaSearch.convert_search_space(space)

    def _params_of(self, member: Member, knobs: dict[str, Any]) -> dict[str, Any] | None:
        """A recorded trial's knob values as its study's params (factors for a relative member); None if outside."""
        moved = relative_knobs(self.settings.space, self.settings.relative_span) if member.relative else {}
        params: dict[str, Any] = {}
        distributions = self._distributions(member)
        for name, dist in distributions.items():
            value = knobs.get(name)
            base = member.own_knobs.get(name)
            if name in moved and _numeric(value) and _numeric(base):
                bounds = moved[name]
                # The integer flag resolve_knobs scales with: without it a small int base's factor (outright over a
                # whole-number range) gives back another value than the one recorded
                value = bounds.factor_of(base, value, integer=bounds.whole_for(base))  # type: ignore[arg-type]
            if value is None:
                return None
            if isinstance(dist, optuna.distributions.CategoricalDistribution):
                value = min(
                    dist.choices,
                    key=lambda c: (
                        abs(float(c) - float(value)) if _numeric(c) and _numeric(value) else (0 if c == value else 1)
                    ),
                )
            elif isinstance(dist, (optuna.distributions.FloatDistribution, optuna.distributions.IntDistribution)):
                value = min(max(value, dist.low), dist.high)
                value = int(round(value)) if isinstance(dist, optuna.distributions.IntDistribution) else float(value)
            params[name] = value
        return params


def _by_best_trial(member: Member) -> tuple[float, int, str]:
    """Best search trial first; a tie to the first written (sql.BEST_TRIAL's order), then the variant id."""
    return -(member.best or 0.0), member.best_order, member.variant_id


def _numeric(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


class PopulationSearcher(Searcher):
    """Tune's view of the pool: `suggest` answers each free slot; finished trials reach the pool via the ledger."""

    def __init__(self, pool: Pool, metric: str, mode: str) -> None:
        super().__init__(metric=metric, mode=mode)
        self.pool = pool

    def set_search_properties(self, metric: str | None, mode: str | None, config: dict[str, Any], **spec: Any) -> bool:
        return True  # the pool holds the search space

    def suggest(self, trial_id: str) -> dict[str, Any] | str | None:
        return self.pool.suggest(trial_id)

    def on_trial_complete(self, trial_id: str, result: dict[str, Any] | None = None, error: bool = False) -> None:
        # The ledger's sink tells the study (it holds the frozen score); here only the breeder is woken.
        with self.pool.changed:
            self.pool.changed.notify_all()

    # The KB is the truth: a resumed campaign rebuilds the pool from it, so Tune's copies of the searcher (its
    # pickled run config, its searcher checkpoint) carry nothing; the live pool stays in this driver.
    def __getstate__(self) -> dict[str, Any]:
        return {}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    def save(self, checkpoint_path: str) -> None:
        Path(checkpoint_path).write_text('{"state": "in the knowledge base"}')

    def restore(self, checkpoint_path: str) -> None:
        return None


def member_code(files_dir: Path) -> str:
    """A variant folder's files, encoded for trial configs."""
    from ralph_ray.trials import read_files

    return encode_code(read_files(files_dir))


def run_member_trial(config: dict[str, Any], spec: Any) -> None:
    """Tune trainable of the asynchronous mode: the trial's variant code comes with its config, not the spec."""
    from dataclasses import replace

    from ralph_ray.trials import run_trial

    config = dict(config)
    files = decode_code(config.pop(CODE_KEY))
    code = replace(spec.code, variants={str(config["variant"]): files}, own_knobs={}, relative={})
    run_trial(config, replace(spec, code=code))
