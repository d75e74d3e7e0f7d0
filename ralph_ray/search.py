"""One Ray Tune run per cycle: OptunaSearch samples (variant, knobs), ASHA stops laggards. Thin adapters only.

All of a cycle's children run in the same Tune run, with the variant as one more categorical parameter, so
ASHA compares code variants against each other, not only knob settings. Each child's own knob values are
enqueued first (Optuna's warm start), so every child is tried, and exactly as its coder wrote it (agent=none's
knob-search child starts from a point drawn from the space: its own knobs are its parent's best trial's,
`children.reruns_parent`).

`run_cycle` is the one call the orchestrator makes: it builds the trial spec, the ledger (frozen scoring, KB
rows), the stopper (STOP file, campaign deadline) and the live progress view, and runs the Tune run.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any, Callable

import duckdb
import numpy as np
from ray import tune
from ray.tune.schedulers import FIFOScheduler, TrialScheduler
from ray.tune.search import BasicVariantGenerator
from ray.tune.search.optuna import OptunaSearch
from rich.console import Console

from ralph_ray import dataparallel, forecast, harness, pbt, sigterm
from ralph_ray.asha import NoiseAwareASHA, rung_history
from ralph_ray.children import Child, reruns_parent
from ralph_ray.config import Config, KnobSpace, SamplerKind, SchedulerKind, SpaceKind, sandbox_policy
from ralph_ray.control import stop_requested
from ralph_ray.events import TrialStarts
from ralph_ray.kb import KnowledgeBase
from ralph_ray.ledger import Sink, TrialLedger, TrialRecord
from ralph_ray.progress import LiveProgress
from ralph_ray.raycluster import checkpoint_interval, driver_node_id
from ralph_ray.runner import Limits
from ralph_ray.sandbox import MIB
from ralph_ray.space import clip_to_space, relative_knobs
from ralph_ray.tasks.base import Labels, ScoredBy, sha256_file
from ralph_ray.trials import Code, PublicData, Schedule, TrialSpec, read_files, run_trial


def optuna_sampler(kind: SamplerKind, seed: int) -> Any:
    """Optuna's sampler for `search.sampler`, seeded (the barrier loop's OptunaSearch and the pool's studies)."""
    import optuna  # Tune's OptunaSearch imports it too; kept out of this module's import for the CLI's start-up

    if kind is SamplerKind.random:
        return optuna.samplers.RandomSampler(seed=seed)
    return optuna.samplers.TPESampler(seed=seed)


def param_space(space: dict[str, KnobSpace], relative: bool = False, span: float = 2.0) -> dict[str, Any]:
    """Tune search-space domains for the configured knobs (OptunaSearch converts them).

    With `relative`, numeric knobs are factors on the variant's own value (see `knobs.resolve_knobs`).
    """
    domains: dict[str, Any] = {}
    for name, knob in space.items():
        if relative and name in relative_knobs(space):
            if knob.type is SpaceKind.choice:
                domains[name] = tune.choice(_choice_ratios(knob.values or []))
            else:
                domains[name] = tune.loguniform(1.0 / span, span)
        elif knob.type is SpaceKind.choice:
            domains[name] = tune.choice(list(knob.values or []))
        elif knob.type is SpaceKind.loguniform:
            domains[name] = tune.loguniform(knob.low, knob.high)
        elif knob.type is SpaceKind.int:
            domains[name] = tune.randint(int(knob.low), int(knob.high) + 1)  # inclusive high, as users write it  # type: ignore[arg-type]
        else:
            domains[name] = tune.uniform(knob.low, knob.high)
    return domains


def first_points(
    children: list[Child], tried: set[str], space: dict[str, KnobSpace], relative: bool, span: float, seed: int
) -> list[dict[str, Any]]:
    """One first point for each child not `tried` yet, so each is tried at least once whatever Optuna samples for
    the variant: its own knobs, or for a knob-search child (its own knobs are its parent's best trial's,
    `reruns_parent`) a point drawn once from the space."""
    return [
        {
            "variant": c.variant_id,
            **(
                drawn_point(space, c.own_knobs, relative, span, seed + index)
                if reruns_parent(c)
                else clip_to_space(c.own_knobs, space, relative)
            ),
        }
        for index, c in enumerate(children)
        if c.variant_id not in tried
    ]


def drawn_point(
    space: dict[str, KnobSpace], own: dict[str, Any], relative: bool, span: float, seed: int
) -> dict[str, Any]:
    """A point of the cycle's space drawn once (from `seed`) that is not `own`'s (in a relative search: not every
    factor 1), so a knob-search child's first trial is not its parent's best trial again; `own`'s where the space
    holds no other point."""
    domains = param_space(space, relative, span)
    mine = clip_to_space(own, space, relative)
    rng = np.random.default_rng(seed)
    for _ in range(32):  # a space of few points can draw `own`'s again: draw anew
        point = {name: _plain(domain.sample(random_state=rng)) for name, domain in domains.items()}
        if point != mine:
            return point
    return mine


def _plain(value: Any) -> Any:
    return value.item() if isinstance(value, np.generic) else value  # Optuna's points hold Python values


def _choice_ratios(values: list[Any]) -> list[float]:
    ordered = sorted(values)
    middle = ordered[len(ordered) // 2]
    return sorted({round(v / middle, 6) for v in ordered})


@dataclass(frozen=True)
class SearchPlan:
    """What one cycle's Tune run samples: which variants, the points to try first, how many trials."""

    variants: list[str]
    first_points: list[dict[str, Any]]  # each: {"variant": id, KNOB: value, ...}
    num_samples: int
    seed: int
    relative: bool = False  # knobs sampled as factors on each variant's own values


def scheduler(cfg: Config, stops: dict[str, str] | None = None) -> TrialScheduler:
    """ASHA over epochs (over training seconds under trial.budget_s), or FIFO (every trial to the end) for baselines.

    ASHA is Tune's ASHAScheduler with a noise margin at its rungs (`scheduler.margin`, ralph_ray.asha); it writes why
    it stopped a trial into `stops` (the ledger's stop_reasons). scheduler=pbt needs the cycle's search space:
    `run_search` builds it (ralph_ray.pbt).
    """
    if cfg.scheduler.name is SchedulerKind.fifo or cfg.scheduler.name.population_based:
        return FIFOScheduler()
    sched = cfg.scheduler
    margin = None if sched.margin == "auto" else float(sched.margin)
    budget = cfg.trial.budget_s
    if budget is not None:
        # The same rungs as a share of training: grace_period / max_t of the budget, then x reduction_factor. max_t
        # past any report (train_seconds stays below the budget) so a trainer that used its budget ends on its own,
        # and past budget + grace, so a trainer that ignores its deadline meets the runner's stop, which says why.
        return NoiseAwareASHA(
            margin=margin,
            z=sched.margin_z,
            stops=stops,
            time_attr=harness.TRAIN_SECONDS,
            max_t=2 * budget + cfg.trial.grace_s,
            grace_period=budget * sched.grace_period / sched.max_t,
            reduction_factor=sched.reduction_factor,
        )
    return NoiseAwareASHA(
        margin=margin,
        z=sched.margin_z,
        stops=stops,
        # ASHA stops any trial that reaches max_t, which would race the trial's final scoring report; one past the
        # last epoch lets a finished trainer end on its own. A rung at the last epoch (it could save none) is dropped.
        last=sched.max_t,
        time_attr="epoch",
        max_t=sched.max_t + 1,
        grace_period=sched.grace_period,
        reduction_factor=sched.reduction_factor,
    )


def _quiet_optuna() -> None:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)  # our progress view reports trials


def storage_path(cfg: Config, local: Path) -> str:
    """Where Tune keeps this cycle's results and checkpoints: `local` (in the run dir), or its mirror under
    paths.storage.

    paths.storage mirrors the runs layout (<storage>/<run_id>/<cycle>/...), so one bucket serves every campaign.
    """
    if cfg.paths.storage is None:
        return str(local.resolve())
    runs = Path(cfg.paths.runs).resolve()
    local = local.resolve()
    tail = local.relative_to(runs).as_posix() if local.is_relative_to(runs) else local.name
    root = cfg.paths.storage.rstrip("/")
    if "://" not in root:
        root = str(Path(root).resolve())
    return f"{root}/{tail}"


# Checkpoints kept per trial under scheduler=pbt: all (at most one per epoch, scheduler.max_t). A clone restores its
# donor's checkpoint of the boundary epoch after the donor may have reported several newer ones; with the last 4 kept,
# on an H100 (1-s Fashion epochs) the donor's boundary checkpoint was gone before its clone restored ("does not exist
# on storage anymore"), the clone failed on every retry and synchronous PBT held the other trials at the boundary.
PBT_CHECKPOINTS = None


def replay_earlier(
    sched: TrialScheduler, cfg: Config, con: duckdb.DuckDBPyConnection, run_id: str, cycle: int | None = None
) -> TrialScheduler:
    """`sched` with its ASHA rungs holding what the run's earlier trials reported (of `cycle` only, where given):
    a resumed Tune run judges its trials against them too, not against its own trials alone. Other schedulers as
    they are."""
    if isinstance(sched, NoiseAwareASHA):
        metric = cfg.search.metric
        sched.replay(rung_history(con, run_id, metric, sched.time_attr, cycle), metric, cfg.search.mode)
    return sched


def resumed_scheduler(
    cfg: Config, con: duckdb.DuckDBPyConnection, run_id: str, stops: dict[str, str], cycle: int | None = None
) -> TrialScheduler:
    """The campaign's scheduler (`scheduler`), its ASHA rungs holding the earlier trials' reports (`replay_earlier`):
    the asynchronous run's whole history, or one cycle's for the barrier loop."""
    return replay_earlier(scheduler(cfg, stops), cfg, con, run_id, cycle)


def run_search(
    cfg: Config,
    spec: TrialSpec,
    plan: SearchPlan,
    storage: Path,
    name: str,
    callbacks: list[tune.Callback],
    stopper: tune.Stopper | None = None,
    segments: pbt.SegmentLog | None = None,
    stops: dict[str, str] | None = None,
    earlier: Callable[[TrialScheduler], TrialScheduler] | None = None,
) -> tune.ResultGrid:
    """Run one cycle's trials and return Tune's results (outcomes also flow through `callbacks`).

    Under scheduler=pbt, `segments` hears of each exploit step; Tune's PBT takes no searcher, so the children's
    own knobs go first and the other trials sample the space at random (a population, not a sequential search).
    ASHA writes why it stopped a trial into `stops` (the ledger's stop_reasons); `earlier` replays a resumed
    cycle's recorded trials into it (`replay_earlier`).
    """
    trainable = tune.with_resources(
        tune.with_parameters(run_trial, spec=spec),
        {"cpu": cfg.resources.cpu, "gpu": cfg.resources.gpu},
    )
    parallel = cfg.resources.data_parallel
    if parallel:  # the trial is a driver of a Ray Train group: its workers hold the CPUs and GPUs
        workers = dataparallel.Workers(
            cfg.resources.workers_per_trial,
            cfg.resources.cpu,
            cfg.resources.gpu,
            cfg.resources.placement,
            cfg.safeguards.max_failures,
            f"{storage_path(cfg, storage)}/{name}_workers",
        )
        trainable = tune.with_resources(
            tune.with_parameters(dataparallel.run_parallel_trial, spec=spec, workers=workers),
            dataparallel.DRIVER_RESOURCES,
        )
    _quiet_optuna()
    space = {
        "variant": tune.choice(list(plan.variants)),
        **param_space(cfg.search.space, plan.relative, cfg.search.relative_span),
    }
    points = list(plan.first_points) or None
    searcher: Any = OptunaSearch(sampler=optuna_sampler(cfg.search.sampler, plan.seed), points_to_evaluate=points)
    chosen = scheduler(cfg, stops)
    if earlier is not None:
        chosen = earlier(chosen)
    if cfg.scheduler.name.population_based:
        searcher = BasicVariantGenerator(points_to_evaluate=points, random_state=plan.seed)
        sched = cfg.scheduler
        chosen = pbt.scheduler(
            segments or pbt.SegmentLog(),
            space,
            sched.perturbation_interval,
            sched.quantile_fraction,
            sched.resample_probability,
            sched.mutate,
            sched.synch,
            bandit=sched.name is SchedulerKind.pb2,
        )
    tuner = tune.Tuner(
        trainable,
        param_space=space,
        tune_config=tune.TuneConfig(
            metric=cfg.search.metric,
            mode=cfg.search.mode,
            search_alg=searcher,
            scheduler=chosen,
            num_samples=plan.num_samples,
            max_concurrent_trials=cfg.search.max_concurrent,
            time_budget_s=cfg.safeguards.cycle_time_s,
            # A data-parallel trial's driver must end with its trial (its worker group goes with it). Under PBT a
            # paused trial's cached actor would keep its trainer running in the work dir that the trial's next
            # attempt (in another actor) trains in: each attempt gets an actor of its own.
            reuse_actors=cfg.search.reuse_actors and not parallel and not cfg.scheduler.name.population_based,
            trial_dirname_creator=lambda trial: trial.trial_id,
        ),
        run_config=tune.RunConfig(
            name=name,
            storage_path=storage_path(cfg, storage),
            callbacks=callbacks,
            stop=stopper,
            verbose=0,
            # Retries are for lost nodes and actors (a trainer's own failure ends its trial as a result); a retry
            # resumes from the trial's last checkpoint, of which storage keeps only the newest.
            failure_config=tune.FailureConfig(max_failures=cfg.safeguards.max_failures),
            # PBT clones a donor's checkpoint after it may have saved newer ones: keep them (PBT_CHECKPOINTS).
            checkpoint_config=tune.CheckpointConfig(
                num_to_keep=PBT_CHECKPOINTS if cfg.scheduler.name.population_based else 1
            ),
        ),
    )
    with warnings.catch_warnings():  # Tune's advice to reuse actors under PBT: declined on purpose (above)
        warnings.filterwarnings("ignore", message="Consider boosting PBT performance", category=UserWarning)
        return tuner.fit()


class StopRequest(tune.Stopper):
    """Ends every trial of the run when a STOP file appears or the campaign's time runs out."""

    def __init__(self, run_dir: str, deadline: float | None) -> None:
        self.run_dir, self.deadline = run_dir, deadline

    def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
        return False

    def stop_all(self) -> bool:
        sigterm.check()  # a SIGTERM a finalizer swallowed ends the run as one that got through
        return stop_requested(Path(self.run_dir)) or (self.deadline is not None and time.time() > self.deadline)


def planned_trials(cfg: Config, cycle: int, children: int, coder: bool) -> int:
    """How many trials a cycle runs: the seed's knob search, or trials per child (agent=none: per knob child)."""
    if cycle == 1:
        return cfg.search.num_samples
    return children * cfg.population.trials_per_child * (1 if coder else cfg.population.children_per_parent)


def trial_spec(cfg: Config, children: list[Child], trials_root: Path, data: PublicData, relative: bool) -> TrialSpec:
    """Everything the trials of `children` need besides their config (code, data, limits), shipped once."""
    code = Code(
        {c.variant_id: read_files(c.files_dir) for c in children},
        sha256_file(Path(harness.__file__)),
        own_knobs={c.variant_id: c.own_knobs for c in children},
        relative=relative_knobs(cfg.search.space, cfg.search.relative_span) if relative else {},
    )
    budget = cfg.trial.budget_s  # the trainer's deadline (harness.time_left) and the runner's stop past it + grace
    parallel = cfg.resources.data_parallel
    return TrialSpec(
        code,
        data,
        Limits(
            cfg.safeguards.trial_timeout_s,
            cfg.sandbox.output_mb * MIB,
            max(1, int(cfg.resources.cpu)),
            # A data-parallel trial's workers meet over TCP (gloo, NCCL): their trainers keep the host's network.
            replace(sandbox_policy(cfg), network=True) if parallel else sandbox_policy(cfg),
            budget,
            cfg.trial.grace_s,
            warm=cfg.trial.warm,
            prestart=cfg.trial.prestart,
        ),
        # Under a budget ASHA counts seconds, not epochs: no epoch is held back for its last rung.
        str(trials_root),
        Schedule(
            cfg.search.metric,
            cfg.search.mode,
            cfg.scheduler.max_t if budget is None else None,
            # PBT restarts trials from checkpoints (their own after a pause, a donor's after an exploit), a
            # data-parallel group after a lost worker: every epoch
            0.0 if cfg.scheduler.name.population_based or parallel else checkpoint_interval(cfg),
        ),
        seed=cfg.search.seed,
        env={} if budget is None else {harness.ENV_BUDGET_S: str(budget)},
        driver_node_id=driver_node_id(),
        model_scored=cfg.task.scored_by == ScoredBy.model.value,
    )


def run_cycle(
    cfg: Config,
    run_id: str,
    cycle: int,
    cycle_dir: Path,
    run_dir: Path,
    children: list[Child],
    done: list[str],
    coder: bool,
    data: PublicData,
    labels: Labels,
    sink: Sink,
    console: Console,
    deadline: float | None,
    say: Callable[[str], None],
    segment_sink: Callable[[list[dict[str, Any]]], None] | None = None,
) -> bool:
    """Run what is left of a cycle's trials of `children` in one Tune run; True when a stop or the deadline cut it
    short.

    `done` holds the variant of each trial already recorded (a resumed cycle runs only the rest); each trial's
    rows reach `sink` as it ends (under scheduler=pbt its segments reach `segment_sink` first); `say` shows what
    the run will do (or why nothing runs).
    """
    planned = planned_trials(cfg, cycle, len(children), coder)
    remaining = planned - len(done)  # resume: finished trials stay, only the rest run
    if not children or remaining <= 0 or stop_requested(run_dir):
        say(f"{len(done)} of {planned} trials already recorded" if children else "nothing to run")
        return False
    say(
        f"{remaining} trials over {len(children)} variant(s), {cfg.search.max_concurrent} at a time, scheduler "
        f"{cfg.scheduler.name.value}" + (f" (resumed: {len(done)} already recorded)" if done else "")
    )
    relative = cfg.search.relative and cycle > 1  # the seed's cycle searches the configured ranges
    tried = set(done)
    seed = cfg.search.seed + 7919 * cycle + len(done)
    points = first_points(children, tried, cfg.search.space, relative, cfg.search.relative_span, seed)
    plan = SearchPlan([c.variant_id for c in children], points[:remaining], remaining, seed, relative)
    spec = trial_spec(cfg, children, cycle_dir / "trials", data, relative)
    progress = LiveProgress(console, f"cycle {cycle}", remaining, cfg.metric_sign(), cfg.task.metric)
    segments = pbt.SegmentLog() if cfg.scheduler.name.population_based else None
    con = KnowledgeBase(Path(cfg.paths.kb)).reader() if done else None  # the campaign's KB (campaign.run: paths.kb)
    forecaster = forecast.for_cycle(cfg, con, run_id, cycle)

    def record(trial: TrialRecord, epoch_rows: list[dict[str, Any]]) -> None:
        forecast.note(trial, forecaster)
        sink(trial, epoch_rows)
        progress.record(trial)

    ledger = TrialLedger(
        run_id,
        cycle,
        labels,
        spec.trials_root,
        spec.seed,
        cfg.search.metric,
        record,
        spec.code.relative,
        spec.code.own_knobs,
        segments,
        segment_sink,
    )
    stopper = StopRequest(str(run_dir), deadline)
    both = forecast.combined(stopper, forecaster)
    starts = TrialStarts(run_dir, run_id, cycle)  # events.jsonl's trial_start lines
    callbacks: list[tune.Callback] = [ledger, progress, starts]
    # A resumed cycle's new Tune run starts ASHA with empty rungs: its re-run trials would be judged against each
    # other only, so the cycle's recorded trials are replayed into them (from the KB the campaign writes to).
    earlier = None if con is None else partial(replay_earlier, cfg=cfg, con=con, run_id=run_id, cycle=cycle)
    run_search(
        cfg,
        spec,
        plan,
        cycle_dir / "tune",
        f"cycle_{cycle:04d}",
        callbacks,
        both,
        segments,
        ledger.stop_reasons,
        earlier,
    )
    return stopper.stop_all()
