"""The small console commands beside `run`: status, stop, report, export and track of a campaign, and kb check."""

from __future__ import annotations

import json
import os
from datetime import datetime
from pathlib import Path

import duckdb
from rich.console import Console
from rich.table import Table

from ralph_ray import liveness, sql
from ralph_ray.control import request_stop
from ralph_ray.exit_codes import ExitCode
from ralph_ray.kb import DEFAULT_KB, KB_ENV, DamagedRunError, now, open_reader
from ralph_ray.state import CampaignState, RunStatus

COMMANDS = ("status", "stop", "report", "export", "track", "kb")
USAGE = """usage: ralph-ray status [RUN_ID] | stop RUN_ID | report RUN_ID   [--runs DIR] [--kb DIR]
       ralph-ray export RUN_ID [VARIANT] [--search] [--out DIR] [--to hf REPO_ID]
       ralph-ray track RUN_ID [mlflow] [tensorboard] [wandb] [--mlflow-uri URI]
       ralph-ray kb check [--repair] [--kb DIR] | kb compact [--kb DIR] | kb sql "QUERY" [--csv] [--kb DIR]
  status   the latest (or named) campaign: phase, cycle, best, budgets, leaderboard; one recorded as running whose
           run dir has not changed for longer than any phase may take (a trial, a breeding phase's agent calls
           and smoke runs; at least RALPH_APP_STALE_S, 300 s) is stopped unexpectedly
  stop     ask a running campaign to stop cleanly at its next check (writes <runs>/<run_id>/STOP); a run that is
           not running exits 2 and writes nothing
  report   (re)write <runs>/<run_id>/report/final_report.md and progress.png
  export   the campaign's result (or a named variant) as a self-contained bundle (default
           <runs>/<run_id>/export/<variant>): the final training's winner as it trained, where one ran; else, or with
           --search, the search's rank 1 (a named variant: its final trial, else its best search trial);
           --to hf REPO_ID also pushes it to the Hugging Face Hub (needs HF_TOKEN; a private repo if new)
  track    publish a recorded campaign to MLflow, TensorBoard and/or W&B (offline) (default: mlflow and tensorboard;
           under <runs>/<run_id>/tracking)
  kb check list the knowledge base's damaged Parquet parts; --repair moves them to <kb>/damaged/ (deletes nothing)
  kb compact merge finished campaigns' parts into one sorted file per table (fast queries on a big KB)
  kb sql   one SQL query over the KB's views (leaderboard, curves, lineage, ...), printed (--csv: as CSV)
The KB is --kb DIR, else $RALPH_KB, else ./kb. A run id not under --runs is found in the run dir the KB recorded.
"""
KB_SQL_USAGE = """usage: ralph-ray kb sql "QUERY" [--csv] [--kb DIR]
  one SQL query over the knowledge base's views, printed as a table (--csv: as CSV on stdout); read-only, no lock
  views: leaderboard (one row per variant, ranked: rank 1 is the pick), curves, lineage, intervention_effects,
         budgets, not_applicable, and the tables runs, cycles, variants, trials, epochs, interventions, decisions,
         agent_usage, segments
  --kb DIR  the KB root (default $RALPH_KB, else ./kb)
  e.g. ralph-ray kb sql "select variant_id, rank, mean_score, ci_low, ci_high from leaderboard where run_id = 'ID'"
"""


def usage(argv: list[str]) -> str:
    """The help of a command line (`kb sql --help`: the kb sql usage; any other command: the commands' usage)."""
    args = [a for a in argv if a not in ("-h", "--help")]
    return KB_SQL_USAGE if args[:2] == ["kb", "sql"] else USAGE


def main(argv: list[str], console: Console) -> int:
    """Dispatch a command (see USAGE); returns an exit code."""
    if argv[0] in ("export", "track"):
        return _publish(argv, console)
    args, runs, kb = _options(argv)
    if args[0] == "kb":
        from ralph_ray import kbcheck

        return kbcheck.main(args[1:], kb, console)
    command, rest = args[0], args[1:]
    if command != "status" and not rest:
        console.print(f"[red]error:[/] `{command}` needs a run id\n{USAGE}", highlight=False)
        return ExitCode.safeguard_or_config
    run_id = rest[0] if rest else _latest(runs)
    if run_id is None:
        console.print(
            f"[red]error:[/] no campaign under {runs.resolve()}: run `python -m ralph_ray` first (or pass --runs DIR)"
        )
        return ExitCode.safeguard_or_config
    run_dir = runs / run_id
    if not (run_dir / "state.json").exists():
        recorded = _recorded_run_dir(kb, run_id)
        if recorded is None:
            console.print(
                f"[red]error:[/] no campaign {run_id} under {runs.resolve()} (pass --runs DIR if it lives elsewhere)"
            )
            return ExitCode.safeguard_or_config
        # One KB shared by several runs dirs: the KB's runs row says where this run lives (user trial).
        console.print(f"run {run_id} is not under {runs.resolve()}: using {recorded}, as the knowledge base records")
        run_dir, runs = recorded, recorded.parent
    if command == "stop":
        return _stop(console, run_dir, runs, kb)
    if command == "report":
        from ralph_ray.report import write_report

        try:
            console.print(f"wrote {write_report(kb, run_id, run_dir)}")
        except (DamagedRunError, FileNotFoundError) as err:  # a damaged part of the run's own (report.refuse_damaged)
            console.print("[red]error:[/] ", end="")
            console.print(str(err), markup=False, highlight=False)
            return ExitCode.safeguard_or_config
        return ExitCode.ok
    return _status(console, run_dir, kb)


def _recorded_run_dir(kb: Path, run_id: str) -> Path | None:
    """The run dir the KB's runs row records for `run_id`, where it still holds the run (None: no KB, no row, gone)."""
    try:
        con = open_reader(kb)
    except FileNotFoundError:
        return None
    try:
        row = con.execute(sql.RUN_DIR, [run_id]).fetchone()
    except duckdb.Error:  # a damaged or foreign KB: the caller's "no campaign" stands
        return None
    finally:
        con.close()
    run_dir = Path(str(row[0])) if row and row[0] else None
    return run_dir if run_dir is not None and (run_dir / "state.json").exists() else None


def _stop(console: Console, run_dir: Path, runs: Path, kb: Path) -> int:
    """Ask a running campaign to stop; a run that is not running (finished, crashed, interrupted) is told, and no
    STOP file is left behind (a later resume would clear it without a word)."""
    state = CampaignState.load(run_dir)
    resume = liveness.resume_for(state.run_id, *_run_paths(run_dir, kb))
    if state.status is not RunStatus.running:
        console.print(
            f"[red]error:[/] run {state.run_id} is not running: {_status_line(state)}; nothing to stop"
            + ("" if state.status is RunStatus.finished else f" (continue it with `{resume}`)"),
            highlight=False,
        )
        return ExitCode.safeguard_or_config
    if liveness.driver_alive(state.driver) is False:
        # Nobody is left to read a STOP file (and a resume would clear it without a word).
        why = liveness.why_stale(None, {}, state.driver)
        console.print(
            f"[red]error:[/] run {state.run_id}: {why}; nothing to stop (continue it with `{resume}`)", highlight=False
        )
        return ExitCode.safeguard_or_config
    path = request_stop(run_dir, "ralph-ray stop")
    console.print(f"stop requested: {path} (the campaign ends its cycle cleanly; resume with `{resume}`)")
    quiet, config = liveness.quiet_s(run_dir), _stored_config(run_dir)
    if liveness.is_stale(state.status.value, quiet, config, state.driver):
        why = liveness.why_stale(quiet, config, state.driver)
        console.print(f"[yellow]  but it looks stopped unexpectedly: {why}[/]", highlight=False)
    return ExitCode.ok


def _status_line(state: CampaignState, stale: bool = False, clock: tuple[float, float | None] | None = None) -> str:
    """The run's status, cycle, phase and elapsed time (`clock`: live_elapsed's, read once by the caller), and its
    stop reason where it stopped."""
    elapsed, since = clock or live_elapsed(state, stale)
    return (
        f"{'stopped unexpectedly?' if stale else state.status.value}, cycle {state.cycle}, "
        f"phase {state.phase.value}, elapsed {elapsed:.0f}s"
        + (f" ({state.elapsed_s:.0f}s when state.json was saved + {since:.0f}s since)" if since is not None else "")
        + (f", stopped: {state.stop_reason}" if state.stop_reason else "")
        # A crash recorded before its exit code was (runs of older versions) has none to show, not "exit None".
        + (f" (exit {state.exit_code})" if state.stop_reason and state.exit_code is not None else "")
    )


def live_elapsed(state: CampaignState, stale: bool = False) -> tuple[float, float | None]:
    """The campaign time so far, and the seconds added to state.json's since it was saved (None: none added).

    state.json is saved at phase changes: an async run stays in its train phase for minutes, and its recorded
    elapsed lagged behind (user trial: "elapsed 13s" at about 60 s). While its driver runs (the recorded process is
    alive), the campaign's clock has run on since the save; a finished, dead or unknown driver's has not.
    """
    if state.status is not RunStatus.running or stale or liveness.driver_alive(state.driver) is not True:
        return state.elapsed_s, None
    since = max(0.0, (now() - datetime.fromisoformat(state.updated_at)).total_seconds())
    return state.elapsed_s + since, since


def _run_paths(run_dir: Path, kb: Path) -> tuple[Path, Path]:
    """Where a resume finds the run and its KB from any folder: the run dir's own folder, and the KB its config.yaml
    names where absolute (a relative one is the driver's working directory's), else the one this command read."""
    stored = Path(str((_stored_config(run_dir).get("paths") or {}).get("kb") or kb))
    return run_dir.parent.resolve(), stored if stored.is_absolute() else kb


def _status(console: Console, run_dir: Path, kb: Path) -> int:
    """Print one run's status, best so far, budgets and leaderboard (stopped unexpectedly where it is stale)."""
    state = CampaignState.load(run_dir)
    config = _stored_config(run_dir)
    quiet = liveness.quiet_s(run_dir)
    # A driver killed with SIGKILL (or a lost machine) leaves state.json at `running` for good (user trial): the
    # staleness rule of the app says it stopped unexpectedly.
    stale = liveness.is_stale(state.status.value, quiet, config, state.driver)
    clock = live_elapsed(state, stale)  # one reading for the status line and the time budget
    console.print(f"[bold]run {state.run_id}[/]: {_status_line(state, stale, clock)}")
    if stale:
        resume = liveness.resume_for(state.run_id, *_run_paths(run_dir, kb))
        why = liveness.why_stale(quiet, config, state.driver)
        console.print(f"[red]  {why}; continue it with `{resume}`[/]", highlight=False)
    # Scores are stored oriented (higher is better): a min metric's (lm's bits per byte) are shown as its values.
    from ralph_ray.finals import final_winner, worse_than_search
    from ralph_ray.report import fetch_rows, metric_values, replicate_spread

    task = _stored_task(run_dir)
    sign, value = metric_values(task)
    best = (
        f"{value(state.best_selection_score):.4f} ({state.best_variant_id})"
        if state.best_selection_score is not None
        else "-"
    )
    # A run with no finished cycle yet (an async campaign's first generation still open) printed `best per cycle: []`
    # beside a best selection score, which read as a contradiction (user trial).
    per_cycle = [round(value(b), 4) if b is not None else None for b in state.best_by_cycle]
    # The best single search trial (its luck included), not the pick: the pick (rank 1, by replicate mean where
    # replicated) is named below and heads the leaderboard (user trial: the two read as two answers to "best").
    console.print(
        f"  best single trial, selection {task.get('metric') or 'score'} ({'lower' if sign < 0 else 'higher'} is "
        f"better): {best}; " + (f"best per cycle: {per_cycle}" if per_cycle else "no cycle finished yet")
    )
    try:
        con = open_reader(kb)
    except FileNotFoundError as err:
        console.print(f"  {err}")
        return ExitCode.ok
    calls, tokens, cost, _ = con.execute(sql.USAGE_FOR_RUN, [state.run_id]).fetchone()
    row = con.execute(sql.RUN_CONFIG, [state.run_id]).fetchone()
    config = json.loads(row[0] if row and row[0] else "{}")
    guards = config.get("safeguards", {})

    def limit(key: str, unit: str = "") -> str:
        """A budget's limit as the user set it, or that none is set."""
        return "no limit" if guards.get(key) is None else f"{guards[key]}{unit}"

    console.print(
        f"  budgets: cycles {state.cycle}/{limit('max_cycles')}, "
        f"time {clock[0]:.0f}s/{limit('campaign_time_s', 's')}, "
        f"tokens {tokens}/{limit('tokens_per_campaign')}, cost {cost:.4f}/{limit('cost_per_campaign')}, "
        f"agent calls {calls}"
    )
    board = fetch_rows(con, sql.LEADERBOARD_FOR_RUN, [state.run_id, 10])
    if board and board[0]["replicates"]:
        console.print(
            f"  pick (rank 1, by replicate mean): {board[0]['variant_id']}, {replicate_spread(board[0], value)}"
        )
    finals = fetch_rows(con, sql.FINAL_TRIAL, [state.run_id])  # safeguards.final_share: the pick trained longer
    final = final_winner(finals)
    if final is not None and final["test_score"] is not None:
        of = "the pick" if len(finals) == 1 else f"{len(finals)} candidates, won by"
        console.print(
            f"  final training of {of} {final['variant_id']}: selection "
            f"{value(final['selection_score']):.4f}, test {value(final['test_score']):.4f} (export's default)"
        )
        searched = fetch_rows(con, sql.LEADERBOARD_ROW, [state.run_id, final["variant_id"]])
        if warning := worse_than_search(final, searched[0] if searched else None, value):
            console.print(f"  [yellow]warning:[/] {warning.replace('RUN_ID', state.run_id)}", highlight=False)
    table = Table(title="leaderboard", header_style="bold")
    # The scores' columns name the metric (user trial: `selection` / `test` said not which score they were)
    named = [f"{split} {task['metric']}" if task.get("metric") else split for split in ("selection", "test")]
    for column in ("rank", "variant", "parent", "interventions", "status", *named, "replicates", "trials"):
        table.add_column(column, no_wrap=column in ("rank", "variant"))  # ids stay whole, to copy into export
    for row in board:
        table.add_row(
            str(row["rank"]),
            row["variant_id"],
            row["parent_id"] or "-",
            " + ".join(json.loads(row["interventions"] or "[]")) or "-",
            row["status"] or "-",
            f"{value(row['selection_score']):.4f}" if row["selection_score"] is not None else "-",
            f"{value(row['test_score']):.4f}" if row["test_score"] is not None else "-",
            replicate_spread(row, value),
            str(row["trials"]),
        )
    console.print(table)
    return ExitCode.ok


def _stored_task(run_dir: Path) -> dict:
    """The task section of the run's config.yaml (its metric and direction), or {} where the file is gone."""
    return dict(_stored_config(run_dir).get("task") or {})


def _stored_config(run_dir: Path) -> dict:
    """The run's config.yaml as a dict, or {} where the file is gone."""
    from omegaconf import OmegaConf

    stored = run_dir / "config.yaml"
    raw = OmegaConf.to_container(OmegaConf.load(stored)) if stored.exists() else {}
    return raw if isinstance(raw, dict) else {}


def _publish(argv: list[str], console: Console) -> int:
    """`export RUN_ID [VARIANT] [--search] [--out DIR] [--to hf REPO_ID]` and `track RUN_ID [mlflow] [tensorboard]
    [wandb] [--mlflow-uri URI]`."""
    from ralph_ray.rundir import CampaignError

    argv, out = _take(argv, "--out")
    search = "--search" in argv  # export: as the search ran it, not the final training
    argv = [a for a in argv if a != "--search"]
    argv, uri = _take(argv, "--mlflow-uri")
    argv, repo_id, well_formed = _take_hub(argv)
    args, _runs, kb = _options(argv)
    command, rest = args[0], args[1:]
    if not rest:
        console.print(f"[red]error:[/] `{command}` needs a run id\n{USAGE}", highlight=False)
        return ExitCode.safeguard_or_config
    if not well_formed or (repo_id is not None and command != "export"):
        console.print(f"[red]error:[/] --to takes `hf REPO_ID` (e.g. --to hf me/digits-best) after export\n{USAGE}")
        return ExitCode.safeguard_or_config
    try:
        if command == "export":
            from ralph_ray import hub
            from ralph_ray.export import export, shipped_warning

            # A push that cannot happen (no package, no token) fails before a bundle is written.
            api = hub.client(repo_id) if repo_id is not None else None
            variant = rest[1] if len(rest) > 1 else None
            bundle = export(kb.resolve(), rest[0], variant, Path(out) if out else None, search)
            console.print(f"exported {bundle} (run it: python {bundle / 'reproduce.py'})")
            if warning := shipped_warning(bundle):
                console.print(f"[yellow]warning:[/] {warning}", highlight=False)
            if api is not None and repo_id is not None:
                message = f"ralph_ray export of variant {bundle.name} from campaign {rest[0]}"
                url = hub.push(api, bundle, repo_id, message)
                console.print(f"pushed to the Hugging Face Hub: {url}", highlight=False)
            return ExitCode.ok
        from ralph_ray import tracking

        record = tracking.load(open_reader(kb), rest[0])
        for name, where in tracking.publish(record, rest[1:] or ["mlflow", "tensorboard"], uri).items():
            console.print(f"{name}: {where}")
    except (CampaignError, FileNotFoundError) as err:
        console.print("[red]error:[/] ", end="")
        console.print(str(err), markup=False, highlight=False)
        return ExitCode.safeguard_or_config
    return ExitCode.ok


def _take(argv: list[str], flag: str) -> tuple[list[str], str | None]:
    """`argv` without `flag VALUE`, and the value (None when absent)."""
    if flag not in argv or argv.index(flag) + 1 >= len(argv):
        return argv, None
    i = argv.index(flag)
    return argv[:i] + argv[i + 2 :], argv[i + 1]


def _take_hub(argv: list[str]) -> tuple[list[str], str | None, bool]:
    """`argv` without `--to hf REPO_ID`, the repo id (None when absent), and False for a `--to` not of that form."""
    if "--to" not in argv:
        return argv, None, True
    i = argv.index("--to")
    if argv[i + 1 : i + 2] != ["hf"] or len(argv) < i + 3 or argv[i + 2].startswith("-"):
        return argv, None, False
    return argv[:i] + argv[i + 3 :], argv[i + 2], True


def _options(argv: list[str]) -> tuple[list[str], Path, Path]:
    """The positional arguments and the --runs / --kb folders (default runs/ and kb/) of a command line."""
    args, runs, kb = [], Path("runs"), Path(os.environ.get(KB_ENV) or DEFAULT_KB)
    items = iter(argv)
    for item in items:
        if item == "--runs":
            runs = Path(next(items, "runs"))
        elif item == "--kb":
            kb = Path(next(items, "kb"))
        elif item.startswith("paths.runs="):
            runs = Path(item.split("=", 1)[1])
        elif item.startswith("paths.kb="):
            kb = Path(item.split("=", 1)[1])
        else:
            args.append(item)
    return args, runs, kb


def _latest(runs: Path) -> str | None:
    """The id of the run whose state.json changed last (None: no run under `runs`)."""
    found = sorted((p for p in runs.glob("*/state.json")), key=lambda p: p.stat().st_mtime)
    return found[-1].parent.name if found else None
