"""A run dir: its id, opening it for a new or resumed campaign, and the files each cycle's phases leave there
for the next phase (and for a resume).

    <runs>/<run_id>/ state.json  config.yaml  data/  data_smoke/  smoke_work/ (warm smoke runs)  variants/<id>/
        cycle_0001/ parents.json  analysis.md  recommendations.json  children.json  decision.json
                    parents/<id>/ (a parent's code, best knobs baked in)  drafts/  trials/  tune/
"""

from __future__ import annotations

import json
import os
import secrets
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from omegaconf import OmegaConf

from ralph_ray import liveness
from ralph_ray.children import Child, write_meta
from ralph_ray.config import Config, SafeguardsConfig
from ralph_ray.decision import BUDGET_REASONS, Spent, spent_budgets
from ralph_ray.gate import write_smoke_data
from ralph_ray.population import Candidate
from ralph_ray.state import CampaignState, RunStatus, open_state
from ralph_ray.tasks.base import Splits, write_public
from ralph_ray.trials import PublicData

ANALYSIS_FILE = "analysis.md"
RECOMMENDATIONS_FILE = "recommendations.json"


class CampaignError(RuntimeError):
    """A campaign that cannot start or resume (e.g. its run dir is taken); the message names the fix."""


def new_run_id() -> str:
    """A sortable, unique run id: UTC timestamp plus a random suffix."""
    return f"{datetime.now(timezone.utc):%Y%m%d-%H%M%S}-{secrets.token_hex(2)}"


def locate(cfg: Config) -> tuple[str, Path, bool]:
    """The run's id, its folder and whether it resumes (a resume needs its state; a new run must not take an
    existing run's folder)."""
    resuming = cfg.resume is not None
    run_id = cfg.resume or cfg.run_id or new_run_id()
    for key, folder in (("paths.runs", cfg.paths.runs), ("paths.kb", cfg.paths.kb)):
        ensure_writable(key, Path(folder))
    run_dir = Path(cfg.paths.runs).resolve() / run_id
    if resuming and not (run_dir / "state.json").exists():
        raise CampaignError(f"cannot resume {run_id}: no {run_dir / 'state.json'} (check the run id and paths.runs)")
    if resuming:
        refuse_live_driver(run_dir, cfg.paths.runs, cfg.paths.kb)  # its warning: the CLI says it, once
    if not resuming and (run_dir / "state.json").exists():
        raise CampaignError(
            f"run {run_id} already exists at {run_dir}: resume it with resume={run_id}, or pick another run_id"
        )
    return run_id, run_dir, resuming


def refuse_live_driver(run_dir: Path, runs: str | Path, kb: str | Path) -> str | None:
    """Refuse (CampaignError) to resume a run recorded as running whose driver still runs on this host: two drivers
    on one run dir overwrite each other's state.json and both decide its end (user trial). Returns a warning where a
    running run's driver is on another host, boot or PID namespace, which this process cannot check, or where an
    ended run's driver still lives (exiting, or a notebook that ran it)."""
    if not (run_dir / "state.json").exists():
        return None  # locate() says what is missing
    state = CampaignState.load(run_dir)
    driver, alive = state.driver or {}, liveness.driver_alive(state.driver)
    if alive and driver.get("pid") == os.getpid():
        return None  # this process ran it and its campaign has returned (a test, a notebook running two in turn)
    where = f"PID {driver.get('pid')} on {driver.get('host')}"
    if alive and driver.get("done"):
        # It wrote its last (campaign._driver_done): what is left is Ray's shutdown after Ctrl-C, or a process (a
        # notebook) that lives on. Refusing would be a dead end: `stop` answers that the run is not running (review).
        # Not the status alone: a run is recorded finished before its final training, compaction and report.
        return (
            f"run {state.run_id} is recorded {state.status.value}, and its driver ({where}) is still exiting or "
            "lives on in the process that ran it; it no longer writes the run: resuming"
        )
    if alive:
        raise CampaignError(
            f"run {state.run_id} is still running (its driver, {where}, is alive; recorded {state.status.value}): "
            "a second driver on its run dir would overwrite its state and both would decide its end; stop it "
            f"first (`{liveness.stop_for(state.run_id, runs, kb)}`) and resume once it has ended, or wait for it "
            "to end"
        )
    if alive is None and state.status is RunStatus.running and driver:
        return (
            f"run {state.run_id} is recorded as running by a driver this machine cannot check ({where}): if it "
            f"still runs, stop it first (`{liveness.stop_for(state.run_id, runs, kb)}`), as two drivers on one run "
            "dir overwrite each other's state; resuming anyway"
        )
    return None


def spent_on_resume(run_dir: Path, guards: SafeguardsConfig) -> list[Spent]:
    """The budgets a finished run has spent that `guards` (its resume's) have not raised, when they would stop the
    resume at once: a spent time budget always (it cuts any trial short), the others when the run stopped on a budget
    with no phase cut short to run again. Empty: the resume has something to do."""
    if not (run_dir / "state.json").exists():
        return []  # locate() says what is missing
    state = CampaignState.load(run_dir)
    if state.status is not RunStatus.finished:
        return []  # a crash or Ctrl-C: the resume finishes what was cut short first
    last = _last_decision(run_dir, state.cycle)
    spent = spent_budgets(
        state.cycle, state.elapsed_s, int(last.get("tokens_campaign", 0)), float(last.get("cost_campaign", 0.0)), guards
    )
    time_spent = any(s.key == "safeguards.campaign_time_s" for s in spent)
    stopped_on_it = state.interrupted is None and state.stop_reason in {r.value for r in BUDGET_REASONS}
    return spent if time_spent or (stopped_on_it and spent) else []


def _last_decision(run_dir: Path, cycle: int) -> dict[str, Any]:
    """A run's last decision.json: the async loop's deepest generation folder that has one (named by the deepest
    generation with a verdict, which the closed-generation count in state.json need not match), else the barrier
    loop's folder of `cycle`."""
    generations = sorted((run_dir / "generations").glob("gen_*/decision.json"))  # gen_0001..: zero-padded, in order
    for path in [*generations[-1:], cycle_dir(run_dir, cycle) / "decision.json"]:
        if path.exists():
            return json.loads(path.read_text())
    return {}


def ensure_writable(key: str, folder: Path) -> None:
    """Check that `folder` (a config key's) can be made and written, or stop with the key and the fix.

    A probe that leaves nothing behind: folders it had to make are removed again, so a campaign that stops at
    a later check (a missing dataset) leaves no empty runs/ or kb/ in the user's working directory.
    """
    missing = [p for p in (folder, *folder.parents) if not p.exists()]
    try:
        folder.mkdir(parents=True, exist_ok=True)
        writable = os.access(folder, os.W_OK | os.X_OK)
    except OSError as err:
        raise CampaignError(
            f"{key}={folder} cannot be created ({err.strerror}): point {key} at a folder you can "
            f"write, e.g. {key}=./{folder.name or 'runs'}"
        ) from None
    finally:
        for made in missing:  # deepest first
            if made.is_dir():
                made.rmdir()
    if not writable:
        raise CampaignError(
            f"{key}={folder} is not writable: point {key} at a folder you can write, or fix its permissions"
        )


def open_run(cfg: Config, run_dir: Path, resuming: bool, say: Callable[[str], None]) -> CampaignState:
    """Make the run dir, write the config it runs with, and return its state, saved and set to go on."""
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.structured(cfg)))
    state = open_state(run_dir, run_dir.name, resuming)
    if resuming:
        say(f"[bold]resume[/] run [cyan]{state.run_id}[/] at cycle {state.cycle}, phase {state.phase.value}")
    return state


def write_data(splits: Splits, run_dir: Path, task: str) -> tuple[PublicData, Path]:
    """The run's public data for trials (data/, also shipped in memory) and the gate's smoke data (data_smoke/)."""
    data_dir = run_dir / "data"
    hashes = write_public(splits, data_dir, task)
    data = PublicData({name: (data_dir / name).read_bytes() for name in hashes}, hashes)
    return data, write_smoke_data(splits, run_dir / "data_smoke", task)


def cycle_dir(run_dir: Path, cycle: int) -> Path:
    """The folder of one cycle of a run."""
    return run_dir / f"cycle_{cycle:04d}"


@dataclass(frozen=True)
class CycleFiles:
    """One cycle's folder: what select, analyse, write and decide leave there, read back by later phases."""

    run_dir: Path
    cycle: int

    @property
    def path(self) -> Path:
        """The cycle's folder (made on first use)."""
        path = cycle_dir(self.run_dir, self.cycle)
        path.mkdir(parents=True, exist_ok=True)
        return path

    def baked(self, variant_id: str) -> Path:
        """Where a parent's code lies with its best trial's knobs written in."""
        return self.path / "parents" / variant_id

    def save_parents(self, parents: list[Candidate]) -> None:
        """The parents select chose."""
        (self.path / "parents.json").write_text(json.dumps([asdict(p) for p in parents], indent=2, default=str))

    def parents(self) -> list[Candidate]:
        """The parents select chose."""
        return [Candidate(**p) for p in json.loads((self.path / "parents.json").read_text())]

    def save_analysis(self, notes: list[str], recommendations: dict[str, Any]) -> None:
        """The analyst's notes (analysis.md) and its recommendations per parent (recommendations.json)."""
        (self.path / ANALYSIS_FILE).write_text(f"# cycle {self.cycle}: analysis\n\n" + "\n".join(notes))
        (self.path / RECOMMENDATIONS_FILE).write_text(json.dumps(recommendations, indent=2))

    def analysis(self) -> str:
        """The text of analysis.md ('' for a cycle without one, such as the seed's)."""
        path = self.path / ANALYSIS_FILE
        return path.read_text() if path.exists() else ""

    def recommendations(self) -> dict[str, Any]:
        """recommendations.json: parent id -> its analysis entry (see children.analysis_json)."""
        return json.loads((self.path / RECOMMENDATIONS_FILE).read_text() or "{}")

    def save_children(self, children: list[Child]) -> None:
        """The cycle's children as they stand (write saves them, record saves their verdicts), in children.json and
        each variant's meta.json."""
        (self.path / "children.json").write_text(json.dumps([c.as_json() for c in children], indent=2, default=str))
        for child in children:
            if (child.files_dir.parent / "diff.patch").exists():  # a variant folder (variants/<id>/), never a user's
                write_meta(child)

    def children(self) -> list[Child]:
        """The cycle's children (none before write)."""
        path = self.path / "children.json"
        return [Child.from_json(c) for c in json.loads(path.read_text())] if path.exists() else []

    def save_decision(self, data: dict[str, Any]) -> None:
        """decision.json."""
        (self.path / "decision.json").write_text(json.dumps(data, indent=2))
