"""Replay recorded learning curves through ASHA's rungs: which rule keeps the best-at-end config, for what epochs.

    python bench/asha_replay.py KB_DIR RUN_ID [DRAWS] [CONFIGS] [--rule=NAME:OVERRIDE,...] [--name=RESULTS]
        [-- OVERRIDES...]

The curves come from a campaign that ran every trial to its end, for example (digits, 100 configs, ~5 min on 2 cores):

    python -m ralph_ray agent=none scheduler=fifo search.num_samples=100 safeguards.max_cycles=1 \\
        population.mode=generations safeguards.replicates=0 paths.kb=/tmp/replay/kb run_id=fifo100
    python bench/asha_replay.py /tmp/replay/kb fifo100
    python bench/asha_replay.py /tmp/bench-asha-XXXX/kb '%all-to-the-end'   # RUN_ID is a LIKE pattern: pool runs

Fashion-MNIST with 8-epoch trials (40 configs, ~30 min on 2 cores), rules of one's own beside the built-in ones:

    python -m ralph_ray agent=none scheduler=fifo search.num_samples=40 safeguards.max_cycles=1 \\
        population.mode=generations safeguards.replicates=0 paths.kb=/tmp/replay8/kb run_id=fifo8 task=fashion \\
        task.subsample=20000 '+search.space.EPOCHS={type: choice, values: [8]}' scheduler.max_t=8
    python bench/asha_replay.py /tmp/replay8/kb fifo8 200 10 --tolerance=0.005 --name=asha_replay_fashion8 \\
        '--rule=g1 r3 1SE:scheduler.margin_z=1,scheduler.grace_period=1,scheduler.reduction_factor=3' \\
        -- task=fashion task.subsample=20000 scheduler.max_t=8

Reads each completed trial's per-epoch ranking metric (`search.metric`, val_acc) and its frozen selection score from
the KB. Each draw picks CONFIGS curves (default 10) at random and replays them through each rule's scheduler, built by
`ralph_ray.search.scheduler` from the config as a campaign builds it (Tune's own brackets, the noise margin of
ralph_ray/asha.py), as `search.max_concurrent` trials side by side: one epoch each in turn, the next curve starting
in a slot when its trial stops or ends. A draw keeps the best when a curve of its best-at-end set (the highest
selection score; ties count as one set) runs to the end. Epoch share: the epochs replayed over CONFIGS x the last
epoch (what running every config to the end costs). No training runs here: the replay takes seconds, so a rule can
be tried on hundreds of draws that bench/asha.py would need hours of campaigns for.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import random
import sys
from dataclasses import dataclass
from pathlib import Path

from _common import save

from ralph_ray.config import Config, load_config
from ralph_ray.kb import open_reader
from ralph_ray.search import scheduler

DEFAULT_RULE = "the default (the task's rungs, margin auto)"


def _rule(text: str) -> tuple[str, list[str]]:
    """`--rule=NAME:OVERRIDE,OVERRIDE`: a rule of one's own."""
    name, sep, overrides = text.partition(":")
    if not sep or not name or not overrides:
        raise argparse.ArgumentTypeError(f"{text!r}: a rule is NAME:OVERRIDE,OVERRIDE")
    return name, overrides.split(",")


_parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
_parser.add_argument("kb", type=Path, help="a KB root holding curves run to the end")
_parser.add_argument("run_id", help="a run id, or a LIKE pattern")
_parser.add_argument("draws", nargs="?", type=int, default=96)
_parser.add_argument("configs", nargs="?", type=int, default=10)
_parser.add_argument("--rule", type=_rule, action="append", default=[], help="NAME:OVERRIDE,... (repeatable)")
_parser.add_argument(
    "--tolerance", type=float, default=0.005, help="'near': a config within this of the best-at-end selection score"
)
_parser.add_argument("--name", default="asha_replay", help="the results' name under bench/results/")
RULES = {  # name: scheduler overrides over the task's own (the task's default is added last)
    "plain ASHA, grace 2, reduction 2": [
        "scheduler.margin=0",
        "scheduler.grace_period=2",
        "scheduler.reduction_factor=2",
    ],
    "margin only: grace 2, reduction 2, margin auto": ["scheduler.grace_period=2", "scheduler.reduction_factor=2"],
    "rungs only: grace 4, reduction 3, no margin": [
        "scheduler.margin=0",
        "scheduler.grace_period=4",
        "scheduler.reduction_factor=3",
    ],
    # candidates for a default that keeps the best at half the epochs (2026-11-27)
    "grace 2, reduction 2, margin 1 SE": [
        "scheduler.grace_period=2",
        "scheduler.reduction_factor=2",
        "scheduler.margin_z=1",
    ],
    "grace 2, reduction 2, margin 1.5 SE": [
        "scheduler.grace_period=2",
        "scheduler.reduction_factor=2",
        "scheduler.margin_z=1.5",
    ],
    "grace 1, reduction 2, margin auto": ["scheduler.grace_period=1", "scheduler.reduction_factor=2"],
    "grace 1, reduction 3, margin auto": ["scheduler.grace_period=1", "scheduler.reduction_factor=3"],
    "grace 2, reduction 3, margin auto": ["scheduler.grace_period=2", "scheduler.reduction_factor=3"],
    "grace 3, reduction 2, margin auto": ["scheduler.grace_period=3", "scheduler.reduction_factor=2"],
    "grace 2, reduction 4, margin auto": ["scheduler.grace_period=2", "scheduler.reduction_factor=4"],
    "grace 2, reduction 3, margin 2.5 SE": [
        "scheduler.grace_period=2",
        "scheduler.reduction_factor=3",
        "scheduler.margin_z=2.5",
    ],
}
CURVES = """
select t.trial_id, t.selection_score, e.epoch, e.value
from trials t join epochs e on e.run_id = t.run_id and e.trial_id = t.trial_id
where t.run_id like ? and t.status = 'completed' and e.metric = ? and t.selection_score is not null
order by t.trial_id, e.epoch
"""


@dataclass(frozen=True)
class Curve:
    """One trial run to its end: its ranking metric per epoch and its frozen selection score."""

    trial_id: str
    values: tuple[float, ...]
    selection: float


class _Trial:
    """What Tune's scheduler reads of a trial."""

    def __init__(self, trial_id: str) -> None:
        self.trial_id = trial_id


def load_curves(kb: Path, run_id: str, metric: str, last_epoch: int) -> list[Curve]:
    """Every completed trial of the run with a report at each epoch 1..last_epoch."""
    rows = open_reader(kb).execute(CURVES, [run_id, metric]).fetchall()
    by_trial: dict[str, tuple[float, dict[int, float]]] = {}
    for trial_id, selection, epoch, value in rows:
        by_trial.setdefault(trial_id, (selection, {}))[1][int(epoch)] = float(value)
    return [
        Curve(trial_id, tuple(epochs[e] for e in range(1, last_epoch + 1)), selection)
        for trial_id, (selection, epochs) in sorted(by_trial.items())
        if all(e in epochs for e in range(1, last_epoch + 1))
    ]


def replay(cfg: Config, curves: list[Curve], slots: int) -> tuple[set[str], int]:
    """Run the curves through a fresh scheduler, `slots` at a time; the trials that reached the end, and the epochs."""
    sched = scheduler(cfg)
    sched.set_search_properties(cfg.search.metric, cfg.search.mode)
    queue, running, finished, epochs = list(curves), [], set(), 0
    while queue or running:
        while queue and len(running) < slots:
            curve = queue.pop(0)
            trial = _Trial(curve.trial_id)
            sched.on_trial_add(None, trial)  # type: ignore[arg-type]
            running.append([curve, trial, 0])
        for slot in list(running):
            curve, trial, done = slot
            slot[2] = done = done + 1
            epochs += 1
            action = sched.on_trial_result(None, trial, {"epoch": done, cfg.search.metric: curve.values[done - 1]})  # type: ignore[arg-type]
            if done == len(curve.values):
                finished.add(curve.trial_id)
            if action == "STOP" or done == len(curve.values):
                sched.on_trial_complete(None, trial, {})  # type: ignore[arg-type]
                running.remove(slot)
    return finished, epochs


def main() -> None:
    argv = sys.argv[1:]
    split = argv.index("--") if "--" in argv else len(argv)
    args, overrides_all = _parser.parse_args(argv[:split]), argv[split + 1 :]
    kb, run_id, draws, configs = args.kb, args.run_id, args.draws, args.configs
    rules = RULES | dict(args.rule) | {DEFAULT_RULE: []}  # the task's default last, after rules of one's own
    base = load_config(overrides_all)
    last = base.scheduler.max_t
    curves = load_curves(kb, run_id, base.search.metric, last)
    if len(curves) < configs:
        sys.exit(f"error: {len(curves)} complete curves of {last} epochs in run {run_id} of {kb}; need >= {configs}")
    figures: dict[str, dict] = {}
    for rule, overrides in rules.items():
        cfg = load_config([*overrides_all, "scheduler=asha", *overrides])
        kept, near, shares = 0, 0, []
        for draw in range(draws):
            picked = random.Random(draw).sample(curves, configs)  # the same draws for every rule
            best = max(c.selection for c in picked)
            with contextlib.redirect_stderr(io.StringIO()):  # the scheduler says its margin once per replay
                finished, epochs = replay(cfg, picked, base.search.max_concurrent)
            kept += any(c.selection == best and c.trial_id in finished for c in picked)
            near += any(c.selection >= best - args.tolerance and c.trial_id in finished for c in picked)
            shares.append(epochs / (configs * last))
        rungs = scheduler(cfg).rungs()
        figures[rule] = {"kept": kept, "near": near, "draws": draws, "epoch_share": sum(shares) / draws, "rungs": rungs}
    lines = [
        f"{base.task.name}: {len(curves)} curves of {last} epochs from run `{run_id}`, {draws} draws of {configs} "
        f"configs, {base.search.max_concurrent} side by side; kept = a config of the best-at-end set ran to the end; "
        f"near = one within {args.tolerance:g} of the best-at-end selection score did:",
        "| rule | rungs (epochs) | best-at-end kept | near it kept | epoch share |",
        "| --- | --- | --- | --- | --- |",
    ]
    for rule, f in figures.items():
        lines.append(
            f"| {rule} | {', '.join(f'{r:g}' for r in f['rungs'])} | **{f['kept']}/{f['draws']}** "
            f"({f['kept'] / f['draws']:.2f}) | {f['near']}/{f['draws']} ({f['near'] / f['draws']:.2f}) | "
            f"{f['epoch_share']:.2f} |"
        )
    save(args.name, {"run_id": run_id, "curves": len(curves), "configs": configs, "rules": figures}, lines)


if __name__ == "__main__":
    main()
