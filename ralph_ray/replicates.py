"""Replicates: which variants' best knobs run again with fresh seeds, the trials that do it, and the samples
they leave in the KB (noise.Sample) for the keep verdict, the plateau rule and the target.

Replicates belong to a (variant, knobs) pair, not to a variant: a variant's best knobs move when a later search
trial of it scores higher, and a mean measured on its old knobs would then stand beside knobs it never measured
(user trial: a child bred from its parent's new best knobs was kept against the mean of the old ones, so a knob
change was counted as its intervention's win). So a variant's replicates are those of its best knobs as they
stand (`Tally.at`); one whose best moved has none until its new best runs again.

Replicate trials are ordinary trials (the same trainable, ledger, frozen scoring and KB rows), marked
`replicate` and given their own seeds. Here they run as one Tune run of fixed points to the end (FIFO: ASHA
would cut a replicate short, and a replicate's knobs are chosen already); the asynchronous campaign queues them
in its pool instead (popsearch). A resumed cycle runs only the replicates still missing.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

import duckdb
from ray import tune
from ray.tune.schedulers import FIFOScheduler, TrialScheduler
from ray.tune.search import Searcher
from rich.console import Console

from ralph_ray import sql
from ralph_ray.children import Child
from ralph_ray.config import Config
from ralph_ray.events import TrialStarts
from ralph_ray.ledger import STOPPED_WITH_CYCLE, Sink, TrialLedger, TrialRecord
from ralph_ray.noise import SEED_FIX, Comparison, Sample, describe, floor, welch_greater, worth_replicating
from ralph_ray.progress import LiveProgress
from ralph_ray.search import StopRequest, storage_path, trial_spec
from ralph_ray.tasks.base import Labels, MetricKind
from ralph_ray.trials import REPLICATE_KEY, SEED_KEY, PublicData, read_files, run_trial
from ralph_ray.variants import VariantStatus


@dataclass(frozen=True)
class Replicated:
    """What the KB holds of one variant's replicates of one set of knobs."""

    run: int  # replicate trials recorded, whatever their end
    seeds: tuple[int, ...]
    sample: Sample  # selection scores of the completed ones
    tests: Sample  # their test scores


def knob_key(knobs: dict[str, Any] | str | None) -> str:
    """Knobs as the ledger writes them to `trials.knobs` (sorted JSON), so equal knobs compare equal."""
    values = json.loads(knobs or "{}") if isinstance(knobs, str) or knobs is None else knobs
    return json.dumps(values, sort_keys=True, default=str)


class Tally:
    """Every replicate recorded so far, by (variant, knobs)."""

    def __init__(self) -> None:
        self.runs: dict[tuple[str, str], list[tuple[int, float | None, float | None]]] = {}

    def note(
        self, variant: str, knobs: dict[str, Any] | str, seed: int, score: float | None, test: float | None
    ) -> None:
        """A replicate trial was recorded (`score`, `test`: None unless it completed)."""
        self.runs.setdefault((variant, knob_key(knobs)), []).append((int(seed), score, test))

    def at(self, best: dict[str, dict[str, Any]]) -> dict[str, Replicated]:
        """Each variant's replicates of its best knobs (`best`: variant -> its best search trial's knobs); a variant
        whose best knobs were never replicated is absent, whatever other knobs of it were."""
        found = {}
        for variant, knobs in best.items():
            runs = self.runs.get((variant, knob_key(knobs)))
            if runs:
                found[variant] = Replicated(
                    len(runs),
                    tuple(seed for seed, _, _ in runs),
                    Sample.of([score for _, score, _ in runs]),
                    Sample.of([test for _, _, test in runs]),
                )
        return found


def recorded(con: duckdb.DuckDBPyConnection, run_id: str) -> dict[str, Replicated]:
    """Every variant's replicates of its best knobs so far (those a stop of the run cut short run again)."""
    tally = Tally()
    for variant, knobs, seed, score, test in con.execute(
        sql.REPLICATES_FOR_RUN, [run_id, STOPPED_WITH_CYCLE]
    ).fetchall():
        tally.note(variant, knobs, seed, score, test)
    return tally.at(best_knobs(con, run_id))


def samples(reps: dict[str, Replicated]) -> dict[str, Sample]:
    """The selection-score sample of each replicated variant."""
    return {v: r.sample for v, r in reps.items()}


def fresh_seeds(base: int, used: tuple[int, ...], count: int) -> list[int]:
    """The seeds a variant's replicates still need to reach `count`: base + 1, base + 2, ... (the search trials run
    with `base`), skipping those already run."""
    seeds, candidate = [], base
    while len(seeds) + len(used) < count:
        candidate += 1
        if candidate not in used:
            seeds.append(candidate)
    return seeds


def needing(children: list[Child], best: dict[str, float], reps: dict[str, Replicated], count: int) -> list[str]:
    """Variants whose best knobs must run again before this cycle's children are judged, parents first.

    The seed always (every later verdict needs its sample); a child only when its best search trial beats its
    parent's replicate mean (a child below that is discarded without replicates), with its parent if the parent
    has no replicates of its best knobs yet (a parent chosen for exploration may never have been replicated, and a
    knob-search cycle may have moved its best since: `reps` holds only replicates of each variant's best knobs).
    """
    wanted: list[str] = []
    for child in children:
        if child.variant_id not in best:
            continue
        if child.status is VariantStatus.seed:
            wanted.append(child.variant_id)
        elif child.status is VariantStatus.candidate:
            parent = reps.get(child.parent_id)
            parent_sample = parent.sample if parent else Sample(())
            if worth_replicating(best[child.variant_id], parent_sample, best.get(child.parent_id)):
                wanted += [child.parent_id, child.variant_id]
    return [v for i, v in enumerate(wanted) if v and v not in wanted[:i] and short(reps.get(v), count)]


def short(rep: Replicated | None, count: int) -> bool:
    """Whether a variant has run fewer than `count` replicates (of its best knobs: `rep` comes from Tally.at)."""
    return rep is None or rep.run < count


def worth(best: float | None, parent: Replicated | None, parent_best: float | None) -> bool:
    """noise.worth_replicating against a parent's recorded replicates (none yet: its best trial)."""
    return worth_replicating(best, parent.sample if parent else Sample(()), parent_best)


def points(
    variants: list[str], knobs: dict[str, dict[str, Any]], reps: dict[str, Replicated], count: int, base_seed: int
) -> list[dict[str, Any]]:
    """The trial configs of the replicates still missing: each variant's best knobs, a fresh seed, the mark (`reps`:
    the replicates of those knobs, so a variant whose best moved runs the same seeds again on its new best)."""
    configs = []
    for variant in variants:
        used = reps[variant].seeds if variant in reps else ()
        for seed in fresh_seeds(base_seed, used, count):
            configs.append({"variant": variant, **knobs.get(variant, {}), SEED_KEY: seed, REPLICATE_KEY: True})
    return configs


def split_examples(labels: Labels) -> int | None:
    """The selection split's size where the selection score is an accuracy over it (its sampling error is then
    binomial and counted in a keep verdict: noise.welch_greater); None for any other metric."""
    metric = labels.metric
    if metric.name == "accuracy" and metric.kind is MetricKind.classification and len(labels.selection) > 1:
        return len(labels.selection)
    return None


def evidence(
    child: Child,
    best: float | None,
    reps: dict[str, Replicated],
    parent_best: float | None,
    confidence: float,
    examples: int | None = None,
) -> Comparison:
    """A child's replicates against its parent's (`examples`: the selection split's size where its sampling error
    counts); a child that was not worth replicating says why."""
    parent = reps[child.parent_id].sample if child.parent_id in reps else Sample(())
    mine = reps[child.variant_id].sample if child.variant_id in reps else Sample(())
    if not worth_replicating(best, parent, parent_best):
        shown = f"{best:.4f}" if best is not None else "-"
        # The reference worth_replicating used: an unreplicated parent's best trial (the note said "replicate mean -")
        against = (
            f"replicate mean {describe(parent, confidence)}"
            if parent.mean is not None
            else f"best trial {parent_best:.4f}"
            if parent_best is not None
            else "score (none yet)"
        )
        note = f"not replicated: its best trial {shown} did not beat its parent's {against}"
        return Comparison(
            mine, parent, confidence, None, note, parent_best=parent_best if parent.mean is None else None
        )
    tests = tuple(reps[v].tests if v in reps else Sample(()) for v in (child.variant_id, child.parent_id))
    return welch_greater(mine, parent, confidence, examples, (tests[0], tests[1]))


def comparisons(
    children: list[Child],
    scores: dict[str, tuple[float, float | None]],
    reps: dict[str, Replicated],
    confidence: float,
    examples: int | None = None,
) -> dict[str, Comparison]:
    """The evidence each scored candidate child is judged on."""
    return {
        c.variant_id: evidence(
            c, scores[c.variant_id][0], reps, scores.get(c.parent_id, (c.parent_score, None))[0], confidence, examples
        )
        for c in children
        if c.status is VariantStatus.candidate and c.variant_id in scores
    }


def campaign_floor(reps: dict[str, Replicated], confidence: float, discarded: Collection[str]) -> float | None:
    """The score the campaign has reached with the stated confidence (noise.floor), or None before any. A variant
    its verdict `discarded` never counts: the pick ranks it last (sql._leaderboard), so a floor it raised would stop
    the run "target met" (and reset the plateau count) on a variant the run does not pick (review)."""
    found = floor(samples({v: r for v, r in reps.items() if v not in discarded}), confidence)
    return found[1] if found else None


# Replicates that repeat an earlier one of theirs, on selection and test, before the console blames the trainer
COPIES_TO_WARN = 2


def seed_ignored(reps: dict[str, Replicated]) -> str | None:
    """A warning where variants' replicates, each with its own seed, scored the same on selection and test at least
    COPIES_TO_WARN times (copies of one run: no keep verdict rests on them, noise.welch_greater); None otherwise.

    Test scores too: two seeds may well score the same accuracy on a small selection split, but seldom on both. Yet
    seldom is not never: the shipped digits seed's two replicates of a child tied on both (0.9721 and 0.9861, an
    accuracy on ~360 images moving in steps of 0.0028; their val_loss 0.079 and 0.110) and the console blamed a
    trainer that seeds from harness.seed() (user trial). One such tie is a few percent's chance; two (a third copy
    of one variant, or a second variant's pair) are its square. A trainer that ignores its seed copies every
    replicate, so it is still said, at the latest once two variants are replicated (the KB's rows here hold scores
    only, not the losses or predictions that would tell one tie apart from a copy)."""
    copies = sorted(
        v
        for v, r in reps.items()
        if r.sample.unvaried and (r.tests.unvaried or not r.tests.n) and len(set(r.seeds)) > 1
    )
    if sum(reps[v].sample.n - 1 for v in copies) < COPIES_TO_WARN:
        return None
    shown = ", ".join(f"{v} {reps[v].sample.values[0]:.4f} x{reps[v].sample.n}" for v in copies[:3])
    return (
        f"warning: replicates scored the same whatever their seed ({shown}{', ...' if len(copies) > 3 else ''}), so "
        f"no child is shown better on them: train.py seems to ignore harness.seed(); {SEED_FIX}"
    )


class FixedPoints(Searcher):
    """A searcher that answers with the given trial configs, in order, then says it has finished."""

    def __init__(self, configs: list[dict[str, Any]]) -> None:
        super().__init__()
        self.configs = list(configs)

    def set_search_properties(self, metric: str | None, mode: str | None, config: dict[str, Any], **spec: Any) -> bool:
        return True  # the points are the whole space

    def suggest(self, trial_id: str) -> dict[str, Any] | str | None:
        return self.configs.pop(0) if self.configs else Searcher.FINISHED

    def on_trial_complete(self, trial_id: str, result: dict[str, Any] | None = None, error: bool = False) -> None:
        return None


class SpareReplicates(TrialScheduler):
    """A scheduler (ASHA) that never stops a replicate trial: a replicate's knobs are chosen already, and a sample
    of only the replicates that survived a rung would be biased upwards. Everything else goes to `inner`."""

    def __init__(self, inner: TrialScheduler) -> None:
        super().__init__()
        self.inner = inner
        self._supports_buffered_results = inner.supports_buffered_results

    @property
    def metric(self) -> str | None:
        return self.inner.metric

    def set_search_properties(self, metric: str | None, mode: str | None, **spec: Any) -> bool:
        return self.inner.set_search_properties(metric, mode, **spec)

    def on_trial_add(self, tune_controller: Any, trial: Any) -> None:
        self.inner.on_trial_add(tune_controller, trial)

    def on_trial_error(self, tune_controller: Any, trial: Any) -> None:
        self.inner.on_trial_error(tune_controller, trial)

    def on_trial_result(self, tune_controller: Any, trial: Any, result: dict[str, Any]) -> str:
        if (trial.config or {}).get(REPLICATE_KEY):
            return TrialScheduler.CONTINUE
        return self.inner.on_trial_result(tune_controller, trial, result)

    def on_trial_complete(self, tune_controller: Any, trial: Any, result: dict[str, Any]) -> None:
        self.inner.on_trial_complete(tune_controller, trial, result)

    def on_trial_remove(self, tune_controller: Any, trial: Any) -> None:
        self.inner.on_trial_remove(tune_controller, trial)

    def choose_trial_to_run(self, tune_controller: Any) -> Any:
        return self.inner.choose_trial_to_run(tune_controller)

    def debug_string(self) -> str:
        return self.inner.debug_string()

    def save(self, checkpoint_path: str) -> None:
        self.inner.save(checkpoint_path)

    def restore(self, checkpoint_path: str) -> None:
        self.inner.restore(checkpoint_path)


def run(
    cfg: Config,
    run_id: str,
    cycle: int,
    cycle_dir: Path,
    files: dict[str, Path],
    configs: list[dict[str, Any]],
    data: PublicData,
    labels: Labels,
    sink: Sink,
    console: Console,
    run_dir: Path,
    deadline: float | None,
    label: str = "replicates",
) -> bool:
    """Run replicate trials (fixed configs, to the end) in one Tune run; True when a stop or the deadline cut it
    short. `files`: each variant's folder of files; `label` names the run (finaltrain runs its one trial here too)."""
    tag = label.replace(" ", "_")
    spec = trial_spec(cfg, [], cycle_dir / "trials", data, relative=False)
    spec = replace(spec, code=replace(spec.code, variants={v: read_files(path) for v, path in files.items()}))
    progress = LiveProgress(console, f"cycle {cycle} {label}", len(configs), cfg.metric_sign(), cfg.task.metric)

    def record(trial: TrialRecord, epoch_rows: list[dict[str, Any]]) -> None:
        sink(trial, epoch_rows)
        progress.record(trial)

    ledger = TrialLedger(run_id, cycle, labels, spec.trials_root, spec.seed, cfg.search.metric, record)
    stopper = StopRequest(str(run_dir), deadline)
    trainable = tune.with_resources(
        tune.with_parameters(run_trial, spec=spec), {"cpu": cfg.resources.cpu, "gpu": cfg.resources.gpu}
    )
    tuner = tune.Tuner(
        trainable,
        param_space={},
        tune_config=tune.TuneConfig(
            metric=cfg.search.metric,
            mode=cfg.search.mode,
            search_alg=FixedPoints(configs),
            scheduler=FIFOScheduler(),
            num_samples=len(configs),
            max_concurrent_trials=cfg.search.max_concurrent,
            reuse_actors=cfg.search.reuse_actors,
            trial_dirname_creator=lambda trial: trial.trial_id,
        ),
        run_config=tune.RunConfig(
            name=f"cycle_{cycle:04d}_{tag}_{len(list((cycle_dir / 'tune').glob(f'*{tag}*'))) + 1}",
            storage_path=storage_path(cfg, cycle_dir / "tune"),
            callbacks=[ledger, progress, TrialStarts(run_dir, run_id, cycle)],
            stop=stopper,
            verbose=0,
            failure_config=tune.FailureConfig(max_failures=cfg.safeguards.max_failures),
            checkpoint_config=tune.CheckpointConfig(num_to_keep=1),
        ),
    )
    tuner.fit()
    return stopper.stop_all()


def best_knobs(con: duckdb.DuckDBPyConnection, run_id: str) -> dict[str, dict[str, Any]]:
    """Each variant's best search trial's knobs (what its replicates run)."""
    return {v: json.loads(k or "{}") for v, _, k, *_ in con.execute(sql.VARIANT_SCORES, [run_id]).fetchall()}


def say(configs: list[dict[str, Any]], log: Callable[[str], None]) -> None:
    """One line naming what will be replicated."""
    variants = sorted({str(c["variant"]) for c in configs})
    log(f"{len(configs)} replicate trial(s) (fresh seeds of the best knobs) of {', '.join(variants)}")
