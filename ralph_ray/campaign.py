"""A campaign from start to report: the run dir, the KB, the environment record, then one loop to the end.

The loop is `generations.Campaign` (a barrier per cycle) or `asyncrun.AsyncCampaign` (one asynchronous Tune run,
population.mode=async); this module only opens the run, picks the loop, runs the final training of the pick
(finaltrain, where safeguards.final_share keeps time for it) and closes the run (report, timeline, trackers).
"""

from __future__ import annotations

import logging
import os
import threading
import warnings
from pathlib import Path
from typing import Any, Callable

import numpy as np
from rich.console import Console
from rich.markup import escape

from ralph_ray import environment, finaltrain, history, liveness, records, sigterm, timeline, tracking, warmcheck
from ralph_ray.agents import preflight
from ralph_ray.agents.base import AgentConfigError, AgentConfigWarning
from ralph_ray.asha import epochs_past_max_t
from ralph_ray.asyncrun import AsyncCampaign
from ralph_ray.config import (
    Config,
    PopulationMode,
    budget_unread,
    final_unread,
    knob_overridden,
    sandbox_policy,
    schedule_unsized,
    short_budget,
)
from ralph_ray.control import STOP_FILE
from ralph_ray.decision import StopReason
from ralph_ray.events import EventedKB
from ralph_ray.exit_codes import ExitCode
from ralph_ray.faults import interrupt_point
from ralph_ray.generations import Campaign, Outcome
from ralph_ray.kb import DamagedRunError
from ralph_ray.raycluster import ClusterError, RayStartError, watch_head
from ralph_ray.report import write_report
from ralph_ray.rundir import CampaignError, locate, open_run
from ralph_ray.sandbox import SandboxError, SandboxMode, announce, bound_folders, hidden_paths
from ralph_ray.space import seed_off_space
from ralph_ray.state import CampaignState, RunStatus
from ralph_ray.tasks import prepare_splits, read_images, reads
from ralph_ray.tasks.base import DataError, describe, text_memory_note, unusual_direction

INTERRUPTED = "SIGINT (Ctrl-C)"  # the stop reason of an interrupted run (state.json, the runs row)
TERMINATED = "SIGTERM"  # ... of one SIGTERM ended (sigterm.Terminated, handled as Ctrl-C)
# The start of Optuna's warning about a categorical choice that is not a scalar (driver_setup says why it is silenced).
OPTUNA_SCALAR_CHOICES = "Choices for a categorical distribution should be a tuple of None, bool, int, float and str"
# The errors `python -m ralph_ray` exits 2 for (__main__ catches the same): a run one ends records that exit code, any
# other crash 4 (user trial: a run its agent's 404 ended showed "exit None" in `status`).
REFUSALS: tuple[type[Exception], ...] = (DataError, CampaignError, AgentConfigError, ClusterError, SandboxError)


class Interrupted(KeyboardInterrupt):
    """Ctrl-C (SIGINT) or SIGTERM ended the campaign of `run_id`, recorded as interrupted; `resume=run_id` continues
    it; `code` is the exit code (130, or 143 for SIGTERM). With `finished`, the run had already ended (recorded
    finished) and the signal cut only its report, timeline or tracking."""

    def __init__(self, run_id: str, finished: bool = False, code: ExitCode = ExitCode.interrupted) -> None:
        super().__init__(run_id)
        self.run_id = run_id
        self.finished = finished
        self.code = code


def run(cfg: Config, console: Console | None = None) -> Outcome:
    """Run (or, with cfg.resume, continue) a campaign until a stop rule fires; Ctrl-C raises Interrupted."""
    driver_setup()
    console, kb_root = console or Console(soft_wrap=True), Path(cfg.paths.kb).resolve()
    run_id, run_dir, resuming = locate(cfg)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", AgentConfigWarning)
        preflight(cfg)  # the agents' endpoint or CLI: a refusal (exit 2) writes nothing of the run
    for warning in caught:
        if issubclass(warning.category, AgentConfigWarning):
            console.print(f"[yellow]warning:[/] {warning.message}", highlight=False)
        else:  # not ours to word: shown as Python would have
            warnings.showwarning(warning.message, warning.category, warning.filename, warning.lineno)
    # The sandbox first, then the data: either missing stops here, before a run is recorded or Ray starts.
    announce(sandbox_policy(cfg), console.print)
    cfg.trial.warm = warmcheck.announce(sandbox_policy(cfg), cfg.trial.warm, console.print)
    tracking.check(cfg.tracking)
    console.print(f"[bold]prepare[/] task {cfg.task.name}: frozen splits")
    with reads.recording() as opened:
        splits = prepare_splits(cfg)
    hide_what_prepare_read(cfg, opened, console.print)
    console.print(f"  {describe(splits.metric)}", highlight=False)
    if note := text_memory_note(splits):
        console.print(f"  note: {note}", highlight=False)
    if warning := unusual_direction(splits.metric):
        console.print(f"[yellow]warning:[/] {warning}", highlight=False)
    infer_images(cfg, splits.train_x, console.print)  # before the run row records the config and the agents read it
    for warning in start_warnings(cfg):
        console.print(f"[yellow]warning:[/] {warning}", highlight=False)
    state = open_run(cfg, run_dir, resuming, console.print)
    console.print(
        f"[bold]ralph_ray[/] run [cyan]{run_id}[/] ({cfg.experiment}, agent {cfg.agent.backend.value}, "
        f"population.mode={cfg.population.mode}, {cfg.population.parents} x {cfg.population.children_per_parent}"
        f"{_shape_note(cfg)})\n"
        f"  run dir: {run_dir}\n  knowledge base: {kb_root}"
    )
    kb = EventedKB(kb_root, run_dir)  # a KnowledgeBase that also writes <run_dir>/events.jsonl
    kb.init()
    base = records.run_row(cfg, run_id, run_dir, history.started_at(kb.reader(), run_id) if resuming else None)
    base["environment"] = environment.record(run_dir)  # also <run_dir>/env.json; a resume records where it resumed
    kb.put("runs", [records.run_status(base, RunStatus.running, state)], run_id)
    loop: Campaign | None = None
    watch = None
    resume = liveness.resume_for(run_id, cfg.paths.runs, cfg.paths.kb)  # what every message of this run prints
    try:
        loop = campaign_class(cfg)(cfg, console, run_dir, kb, state, splits, base)
        watch = watch_head(
            cfg.cluster, lambda reason: head_lost(reason, loop, state, run_dir, kb, base, console, resume)
        )
        outcome = loop.loop()
        finaltrain.run(loop, outcome)  # safeguards.final_share: the pick trains once more for the time kept for it
    except KeyboardInterrupt as signalled:
        # Ctrl-C or SIGTERM: recorded as interrupted, with no decision (nothing decided the campaign is over); the
        # trials it cut short run again on resume, as after a kill. The time up to the signal counts (the loop adds
        # it only when a phase or generation ends: a resume's campaign_time_s would overshoot by the rest).
        code, reason = _signal_code(signalled)
        with _ENDING:
            if loop is not None:
                loop.charge_time()
            state.status, state.stop_reason, state.exit_code = RunStatus.interrupted, reason, int(code)
            state.save(run_dir)
            kb.put("runs", [records.run_status(base, RunStatus.interrupted, state, reason)], run_id)
            _driver_done(state, run_dir)
        raise Interrupted(run_id, code=code) from None
    except BaseException as err:
        with _ENDING:
            if loop is not None:
                loop.charge_time()
            state.status, state.stop_reason = RunStatus.crashed, stop_reason(err)
            state.exit_code = int(ExitCode.safeguard_or_config if isinstance(err, REFUSALS) else ExitCode.error)
            state.save(run_dir)
            kb.put("runs", [records.run_status(base, RunStatus.crashed, state, state.stop_reason)], run_id)
            _driver_done(state, run_dir)
        if isinstance(err, RayStartError):
            err.resume = resume  # the CLI names it: Ray's start may well succeed on a less loaded machine
        raise
    finally:
        if watch is not None:
            watch.set()
    kb.put("runs", [records.run_status(base, RunStatus.finished, state, outcome.stop_reason)], run_id)
    if outcome.stop_reason == StopReason.manual_stop.value:
        (run_dir / STOP_FILE).unlink(missing_ok=True)  # honoured: STOP is there only while a stop is requested
    try:
        interrupt_point("report")
        kb.compact_run(run_id)  # a finished run's cycles fold into one part per table: readers pay per file opened
        try:
            console.print(f"  report: {write_report(kb_root, run_id, run_dir)}")
        except DamagedRunError as refused:  # its own part damaged (report.refuse_damaged): the run is over all the same
            console.print(
                f"[yellow]warning:[/] run {run_id} finished and is recorded; its report was not written: "
                f"{escape(str(refused))}",
                highlight=False,
            )
        console.print(f"  timeline: {timeline.write(kb_root, run_id, run_dir)} (open in ui.perfetto.dev)")
        tracking.track_campaign(cfg.tracking, kb_root, run_id, console.print)
    except KeyboardInterrupt as signalled:
        # The run is over and recorded; what Ctrl-C cut can be written again (compaction is atomic, `report` rewrites).
        _driver_done(state, run_dir)
        raise Interrupted(run_id, finished=True, code=_signal_code(signalled)[0]) from None
    _driver_done(state, run_dir)
    return outcome


def start_warnings(cfg: Config) -> list[str]:
    """The warnings on the config and the seed's code printed before the run is recorded: a budget or final training
    the seed does not read, a schedule sized for its own epochs, a knob set again (or read as a fallback), seed values
    off the space, epochs past ASHA's last rung."""
    checks = (budget_unread, final_unread, schedule_unsized, knob_overridden, seed_off_space, epochs_past_max_t)
    return [warning for check in checks if (warning := check(cfg))]


def stop_reason(err: BaseException) -> str:
    """An error as one line for the recorded stop reason (state.json, the runs row, `status`): an AgentConfigError's
    second line, `  fix: ...`, joined as `...; fix: ...` (the console still shows the message as raised)."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return f"{type(err).__name__}: {'; '.join(lines)}"


def _driver_done(state: CampaignState, run_dir: Path) -> None:
    """Record that this driver writes the run no more (rundir.refuse_live_driver): a run is recorded finished before
    its final training, compaction and report still write it, so the status alone cannot tell (review)."""
    state.driver = {**(state.driver or {}), "done": True}
    state.save(run_dir)


# Held while the run's final status is recorded: the head watch's thread (head_lost) and the main thread's own
# ending (interrupted, crashed) must not both charge the time and write state.json and the runs row at once.
_ENDING = threading.Lock()


def head_lost(
    reason: str,
    loop: Campaign | None,
    state: CampaignState,
    run_dir: Path,
    kb: EventedKB,
    base: dict[str, Any],
    console: Console,
    resume: str,
) -> None:
    """The cluster's head is gone (raycluster.watch_head's thread): Ray would end this process with std::_Exit(1)
    before any handler runs, so record the run crashed, name the resume and exit 4 first."""
    run_id = base["run_id"]
    _ENDING.acquire()  # never released: this thread ends the process below, and the main thread's ending waits
    if state.status is not RunStatus.running:  # the main thread recorded the end first
        _ENDING.release()
        return
    if loop is not None:
        loop.charge_time()
    state.status, state.stop_reason, state.exit_code = RunStatus.crashed, reason, int(ExitCode.error)
    state.save(run_dir)
    kb.put("runs", [records.run_status(base, RunStatus.crashed, state, reason)], run_id)
    console.print(
        f"[red]error:[/] {reason}: run {run_id} is recorded as crashed and its finished trials are in the knowledge "
        f"base; once the head runs again (or at a new one: cluster.address=<head>:<port>), continue with "
        f"`{resume}`",
        highlight=False,
    )
    console.file.flush()
    os._exit(ExitCode.error)  # the main thread waits on Ray calls that cannot return, and Ray's exit would say 1


def _signal_code(signalled: KeyboardInterrupt) -> tuple[ExitCode, str]:
    """The exit code and stop reason of a KeyboardInterrupt: Ctrl-C's, or SIGTERM's (sigterm.Terminated)."""
    if sigterm.arrived(signalled):
        return ExitCode.terminated, TERMINATED
    return ExitCode.interrupted, INTERRUPTED


def hide_what_prepare_read(cfg: Config, opened: set[str], say: Callable[[str], None]) -> None:
    """Hide from every run the data files prepare() read where runs could read them too (tasks/reads.py), or with
    sandbox.hide_prepare_reads=false only name them."""
    found = reads.exposed(opened, bound_folders(), hidden_paths(sandbox_policy(cfg)))
    if not found or cfg.sandbox.mode is SandboxMode.none:
        return
    shown = f"{', '.join(map(str, found[:5]))}{' ...' if len(found) > 5 else ''}"
    if not cfg.sandbox.hide_prepare_reads:
        say(
            f"  [yellow]warning[/]: prepare.py read {len(found)} file(s) or folder(s) every trial can read "
            f"(sandbox.hide_prepare_reads=false): {shown}"
        )
        return
    cfg.sandbox.prepare_reads = sorted({*cfg.sandbox.prepare_reads, *map(str, found)})  # a resume's stored ones stay
    say(
        f"  [yellow]sandbox[/]: prepare.py read {len(found)} file(s) or folder(s) every trial could read; hidden from "
        f"them now: {shown}\n    fix (to say it yourself): `def hidden_paths(data): return [<those paths>]` in "
        "prepare.py; sandbox.hide_prepare_reads=false keeps them visible (a vocabulary trainers read too)"
    )


def infer_images(cfg: Config, train_x: Any, say: Callable[[str], None]) -> None:
    """Set task.images, where the task leaves it unset, from the prepared train inputs (tasks.read_images), and say
    how to overrule it."""
    if cfg.task.images is not None:
        return
    reading = read_images(train_x)
    cfg.task.images = reading.images
    found, other = ("images", "false") if reading.images else ("not images", "true")
    say(
        f"  task.images: inputs of shape {tuple(np.shape(train_x))} read as {found} ({reading.why}); "
        f"if that is wrong, set `task: {{images: {other}}}` in task.yaml"
    )


def driver_setup() -> None:
    """What the driver asks of Ray Tune and Optuna: Ctrl-C reaches the campaign; no warning of a failed trial's score
    or of a choice of lists."""
    # Tune's own SIGINT handler ends Tuner.fit() as if the run were over: the campaign then decided (continue, or "no
    # trial completed" with the trials the signal killed) and exited 0 or 4 with its run still `running`.
    os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = "1"
    # A failed trial reports the worst score, -inf (trials.run_trial), which Tune's TensorBoard logger passes to
    # tensorboardX: "NaN or Inf found in input tensor." on the console for every failed trial.
    logging.getLogger("tensorboardX.x2num").setLevel(logging.ERROR)
    # A choice of lists (`HIDDEN: {type: choice, values: [[64, 32], [128, 64]]}`) makes Optuna warn, once per value at
    # every campaign start, that such choices cannot go to persistent storage. Every study here lives in memory (Tune's
    # OptunaSearch and the pool's studies are created without storage), where a list is sampled, enqueued and told
    # like a number (tests/test_popsearch.py runs TPE over one), so the warning says nothing about the run.
    warnings.filterwarnings("ignore", message=OPTUNA_SCALAR_CHOICES, category=UserWarning)


def campaign_class(cfg: Config) -> type[Campaign]:
    """The barrier loop (population.mode=generations), or one Tune run for the campaign (async: asyncrun)."""
    if cfg.population.run_mode is PopulationMode.asynchronous:
        return AsyncCampaign
    return Campaign


def _shape_note(cfg: Config) -> str:
    """Why a campaign runs the serial 1x1 shape when its budget chose it (config.resolve_shape)."""
    pop = cfg.population
    if (pop.parents, pop.children_per_parent) != (1, 1) or not short_budget(cfg) or not pop.shape_by_budget:
        return ""  # a shape given as 1 x 1 was the user's choice, not the budget's
    return (
        f": the serial loop, as a {cfg.safeguards.campaign_time_s:g}-s budget"
        f" <= population.serial_up_to_s={pop.serial_up_to_s:g} calls for;"
        " population.parents=2 population.children_per_parent=3 for the population"
    )
