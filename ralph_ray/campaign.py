"""The orchestrator: a thin sequencer of a campaign's steps. Each step's logic lives in its own module.

prepare data (frozen) -> snapshot the seed variant -> Tune run (Optuna + ASHA, subprocess trials)
-> every finished trial to the knowledge base -> summary.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path

from omegaconf import OmegaConf
from rich.console import Console

from ralph_ray import harness
from ralph_ray.config import Config
from ralph_ray.exit_codes import ExitCode
from ralph_ray.kb import KnowledgeBase, now
from ralph_ray.ledger import TrialLedger, TrialRecord, TrialStatus
from ralph_ray.progress import LiveProgress
from ralph_ray.raycluster import ensure_ray
from ralph_ray.state import CampaignState, Phase
from ralph_ray.tasks import prepare_splits
from ralph_ray.tasks.base import Splits, sha256_file, write_public
from ralph_ray.trials import TrialSpec
from ralph_ray.variants import Variant, snapshot

OUTPUT_LIMIT_BYTES = 50 * 1024 * 1024


class CampaignError(RuntimeError):
    """A campaign that cannot start (e.g. its run dir is taken); the message names the fix."""


@dataclass(frozen=True)
class Outcome:
    """How a campaign ended."""

    run_id: str
    run_dir: Path
    kb_root: Path
    exit_code: ExitCode
    stop_reason: str
    best: TrialRecord | None
    records: list[TrialRecord]


def new_run_id() -> str:
    """A sortable, unique run id: UTC timestamp plus a random suffix."""
    return f"{datetime.utcnow():%Y%m%d-%H%M%S}-{secrets.token_hex(2)}"


def run(cfg: Config, console: Console | None = None) -> Outcome:
    """Run one campaign (in this issue: one cycle of knob search over the seed trainer)."""
    console = console or Console(soft_wrap=True)
    run_id = cfg.run_id or new_run_id()
    run_dir = Path(cfg.paths.runs).resolve() / run_id
    kb_root = Path(cfg.paths.kb).resolve()
    if (run_dir / "state.json").exists():
        raise CampaignError(f"run {run_id} already exists at {run_dir}: pick another run_id (or leave run_id unset)")
    # Data first: a missing or corrupt dataset stops here, before a run is recorded or Ray starts.
    console.print(f"[bold]prepare[/] task {cfg.task.name}: frozen splits")
    splits = prepare_splits(cfg)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.structured(cfg)))
    state = CampaignState(run_id=run_id)
    state.save(run_dir)
    console.print(f"[bold]ralph_ray[/] run [cyan]{run_id}[/] ({cfg.experiment})\n  run dir: {run_dir}\n  knowledge base: {kb_root}")

    kb = KnowledgeBase(kb_root)
    kb.init()
    started = now()
    run_row = {"run_id": run_id, "experiment": cfg.experiment, "task": cfg.task.name, "run_dir": str(run_dir),
               "config": json.dumps(asdict(cfg), default=str), "started_at": started}
    kb.append("runs", [{**run_row, "status": "running"}], run_id)
    try:
        outcome = _run_cycles(cfg, console, run_id, run_dir, kb, state, splits)
    except BaseException as err:
        state.phase, state.stop_reason = Phase.crashed, f"{type(err).__name__}: {err}"
        state.save(run_dir)
        kb.append("runs", [{**run_row, "status": "crashed", "stop_reason": state.stop_reason, "finished_at": now()}], run_id)
        raise
    kb.append("runs", [{**run_row, "status": "finished", "stop_reason": outcome.stop_reason, "finished_at": now()}], run_id)
    _print_summary(console, outcome)
    return outcome


def _run_cycles(cfg: Config, console: Console, run_id: str, run_dir: Path, kb: KnowledgeBase, state: CampaignState, splits: Splits) -> Outcome:
    data_dir = run_dir / "data"
    hashes = write_public(splits, data_dir, cfg.task.name)
    frozen = {str(data_dir / name): digest for name, digest in hashes.items()}
    frozen[harness.__file__] = sha256_file(Path(harness.__file__))
    console.print(f"  train {len(splits.train_y)}  selection {len(splits.selection_y)}  test {len(splits.test_y)} (selection/test labels stay with the engine)")

    cycle = 1
    cycle_dir = run_dir / f"cycle_{cycle:04d}"
    seed = snapshot(cfg.trainer_dir(), run_dir / "variants")
    kb.append("variants", [{"run_id": run_id, "variant_id": seed.variant_id, "parent_id": None, "cycle": cycle,
                            "files_dir": str(seed.files_dir), "diff": ""}], f"{run_id}-c{cycle}")
    state.phase, state.cycle = Phase.train, cycle
    state.save(run_dir)

    ensure_ray(cfg.resources.ray_num_cpus)
    spec = TrialSpec(
        trainer_dir=str(seed.files_dir), trials_root=str(cycle_dir / "trials"), data_dir=str(data_dir),
        frozen=frozen, labels=splits.labels(), timeout_s=cfg.safeguards.trial_timeout_s,
        output_limit_bytes=OUTPUT_LIMIT_BYTES, threads=max(1, int(cfg.resources.cpu)), seed=cfg.search.seed,
    )
    records = _train(cfg, console, run_id, cycle, seed, spec, cycle_dir, kb)

    completed = [r for r in records if r.status is TrialStatus.completed]
    best = max(completed, key=lambda r: r.selection_score or 0.0, default=None)
    kb.append("cycles", [{"run_id": run_id, "cycle": cycle, "started_at": None, "finished_at": now(), "trials": len(records),
                          "best_selection_score": best.selection_score if best else None}], f"{run_id}-c{cycle}")
    state.phase = Phase.done
    state.best_selection_score = best.selection_score if best else None
    state.best_trial_id = best.trial_id if best else None
    state.stop_reason = "max_cycles" if best else "no trial completed"
    state.save(run_dir)
    code = ExitCode.ok if best else ExitCode.error
    return Outcome(run_id, run_dir, kb.root, code, state.stop_reason, best, records)


def _train(cfg: Config, console: Console, run_id: str, cycle: int, variant: Variant, spec: TrialSpec, cycle_dir: Path, kb: KnowledgeBase) -> list[TrialRecord]:
    """One Tune run; each trial's rows reach the KB the moment it ends."""
    from ralph_ray.search import run_search

    console.print(f"[bold]train[/] cycle {cycle}: {cfg.search.num_samples} trials of variant {variant.variant_id}, "
                  f"{cfg.search.max_concurrent} at a time, scheduler {cfg.scheduler.name.value}")
    progress = LiveProgress(console, f"cycle {cycle}", cfg.search.num_samples)

    def sink(record: TrialRecord, epoch_rows: list[dict[str, object]]) -> None:
        tag = f"{run_id}-c{cycle}-{record.trial_id}"
        kb.append("epochs", epoch_rows, tag)
        kb.append("trials", [record.row()], tag)  # after its epochs: a visible trial always has its curve
        progress.record(record)

    ledger = TrialLedger(run_id, cycle, variant.variant_id, spec.trials_root, spec.seed, cfg.search.metric, sink)
    run_search(cfg, spec, cycle_dir / "tune", f"cycle_{cycle:04d}", [ledger, progress])
    return ledger.records


def _print_summary(console: Console, outcome: Outcome) -> None:
    counts = {status: sum(r.status is status for r in outcome.records) for status in TrialStatus}
    console.print(f"[bold]done[/] run {outcome.run_id}: " + ", ".join(f"{n} {s.value}" for s, n in counts.items()))
    if outcome.best:
        b = outcome.best
        console.print(f"  best trial {b.trial_id}: selection {b.selection_score:.4f}, test {b.test_score:.4f}, knobs {b.knobs}")
    console.print(f"  run dir: {outcome.run_dir}\n  knowledge base: {outcome.kb_root}  "
                  f"(duckdb {outcome.kb_root}/kb.duckdb -readonly -c \"select * from leaderboard limit 5\")")
