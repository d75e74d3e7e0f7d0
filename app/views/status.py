"""Status and budgets: where the campaign is, what it spent against its safeguards, its decisions; stop it."""

from __future__ import annotations

import json
from pathlib import Path

import access
import figures
import kbdata
import pandas as pd
import shell
import streamlit as st

from ralph_ray import sql
from ralph_ray.control import STOP_FILE, request_stop
from ralph_ray.finals import final_winner

DECISION_COLUMNS = [
    "cycle",
    "decision",
    "reason",
    "rationale",
    "best_selection_score",
    "best_variant_id",
    "elapsed_s",
    "tokens",
    "cost",
    "exit_code",
]

# When the first decisions row comes: a barrier campaign decides at each cycle's end; an async one writes a row per
# generation once a deeper generation is judged (asyncrun), or at its stop
FIRST_DECISION = {
    False: "No decision yet: the first one comes at the end of cycle 1.",
    True: "No decision yet: this async campaign writes one per generation, the first once a generation-2 child has "
    "its verdict (or when the campaign stops).",
}


def body(run: shell.Campaign) -> None:
    spent = figures.records(kbdata.frame(run.kb_root, sql.BUDGET_FOR_RUN, (run.run_id,)))
    spent = spent[0] if spent else {}
    decisions = kbdata.frame(run.kb_root, sql.DECISIONS_FOR_RUN, (run.run_id,))
    if not decisions.empty:  # the engine's rationales carry raw floats: shown at 4 decimals
        decisions = decisions.assign(rationale=decisions["rationale"].map(figures.round_floats))
    last = figures.records(decisions.tail(1))[0] if not decisions.empty else {}
    # Where the campaign is: its `runs` row, which the orchestrator rewrites at every phase.
    cycle = run.cycle or spent.get("cycles") or 0
    phase = run.phase or ("done" if run.status == "finished" else "-")
    elapsed = float(last.get("elapsed_s") or 0.0)  # campaign time across resumes, as of the last decision
    since = last.get("written_at") or run.started_at
    if run.running and since is not None:  # plus the time since, which the next decision will count
        elapsed += max(0.0, (pd.Timestamp.now(tz="UTC") - pd.Timestamp(since)).total_seconds())

    cols = st.columns(4)
    cols[0].metric("status", "stale" if run.stale else run.status)
    cols[1].metric("cycle", f"{cycle} / {(run.config.get('safeguards') or {}).get('max_cycles', '?')}")
    cols[2].metric("phase", phase)
    # The Leaderboard's best (its first row), not the last decision's: the same number on both pages mid-cycle.
    board = figures.records(kbdata.frame(run.kb_root, sql.APP_LEADERBOARD, (run.run_id,)))
    top = board[:1]
    best = top[0]["selection_score"] if top else None
    sign = run.sign
    cols[3].metric(
        "best selection score",
        figures.score_text(best, sign=sign),
        None
        if best is None or run.target is None
        else f"{sign * (best - run.target):+.4f} vs target {sign * run.target:.4f}",
        delta_color="normal" if sign > 0 else "inverse",  # green when better: lower, for a min metric
    )
    if sign < 0:
        st.caption(f"Scores as the metric's values: {run.metric_note}.")

    if top:
        st.caption(pick_line(top[0], sign))
        final = final_line(figures.records(kbdata.frame(run.kb_root, sql.FINAL_TRIAL, (run.run_id,))), board, sign)
        if final:
            st.caption(final)

    if not run.live:
        why = f"**Stopped: {run.stop_reason or 'no reason recorded'}**"
        shown = {"crashed": st.error, "interrupted": st.warning}.get(run.status, st.success)
        shown(why + (f"\n\n{last['rationale']}" if last.get("rationale") else ""))
    access.show_ray_auth(run.config)
    access.show_sandbox(run.config)
    stop_button(run)

    st.subheader("Budgets")
    for item in figures.budgets(run.config, spent, elapsed, int(cycle)):
        if item.share is None:
            st.markdown(f"**{item.name}**: {item.text()}")
        else:
            st.progress(item.share, text=f"**{item.name}**: {item.text()}")
    counts = kbdata.frame(run.kb_root, sql.TRIAL_STATUS_COUNTS, (run.run_id,))
    finished = ", ".join(f"{r['n']} {r['status']}" for r in figures.records(counts))
    st.caption("trials: " + (finished or "none finished yet"))

    st.subheader("Decisions")
    if decisions.empty:
        shell.empty(run.kb_root, FIRST_DECISION[run.asynchronous], ("decisions",), runs=(run.run_id,))
    else:
        st.dataframe(
            figures.as_values(decisions[[c for c in DECISION_COLUMNS if c in decisions]], run.sign),
            width="stretch",
            hide_index=True,
            placeholder="-",
            column_config={
                # The best single trial so far, as the decision saw it: not the pick (rank 1, by replicate mean)
                "best_selection_score": st.column_config.NumberColumn(
                    "best single trial", format="%.4f", help="the campaign's best single search trial at this decision"
                ),
                "best_variant_id": st.column_config.TextColumn(
                    "its variant", help="the variant of that trial (the pick, rank 1, is named above)"
                ),
                "elapsed_s": st.column_config.NumberColumn("elapsed s", format="%.0f"),
                "rationale": st.column_config.TextColumn("rationale", width="large"),
            },
        )

    environment = figures.records(kbdata.frame(run.kb_root, sql.RUN, (run.run_id,)))
    st.subheader("Environment")
    env = json.loads(environment[0]["environment"]) if environment and environment[0]["environment"] else None
    if env is None:
        st.caption("not recorded (the campaign predates env.json)")
    else:
        st.caption(environment_line(env))
        with st.expander("env.json: versions, commit, hardware, Ray nodes"):
            st.json(env, expanded=1)


def pick_line(row: dict, sign: float = 1.0) -> str:
    """The campaign's pick (the board's rank 1) and what ranks it: its replicate mean, or its best trial alone."""
    n = row.get("replicates")
    if n is None or pd.isna(n) or int(n) == 0:
        return f"Pick (rank 1): **{row['variant_id']}**, by its best trial (not replicated with fresh seeds)."
    half = row.get("half_width")
    interval = "" if half is None or pd.isna(half) else f" ± {half:.4f} (95% t)"
    mean = figures.score_text(row["mean_score"], sign=sign)
    return (
        f"Pick (rank 1): **{row['variant_id']}**, by its replicate mean {mean}"
        f"{interval} over {int(n)} fresh seeds of its best knobs."
    )


def final_line(finals: list[dict], board: list[dict], sign: float = 1.0) -> str | None:
    """The final training (safeguards.final_share) once it has scored: the pick's, or with several candidates the
    winner by `finals.final_winner` (`finals`: the FINAL_TRIAL rows), with its rank in the search (`board`: the
    leaderboard's rows); None before or without one."""
    row = final_winner(finals)
    if row is None:
        return None
    selection, test = (
        figures.score_text(row["selection_score"], sign=sign),
        figures.score_text(row["test_score"], sign=sign),
    )
    rank = next((r["rank"] for r in board if r["variant_id"] == row["variant_id"]), "-")
    ships = " `export` ships it by default, as it trained (`--search`: the pick as searched)."
    if len(finals) == 1 and rank == 1:
        return (
            f"Final training of the pick (its best knobs, trained longer after the search): selection {selection}, "
            f"test **{test}**.{ships}"
        )
    which = (
        f"Final training of {len(finals)} candidates (their best knobs, side by side, longer than the search's "
        "trials), won by"
        if len(finals) > 1
        else "Final training (its best knobs, trained longer after the search) of"  # a resume's pick changed since
    )
    return (
        f"{which} **{row['variant_id']}** (rank {rank} in the search): selection {selection}, test **{test}**.{ships}"
    )


def environment_line(env: dict) -> str:
    """The run's environment in one line: Python, torch, Ray, host, CPUs, GPUs and the project's commit."""
    pkgs, git = env.get("packages") or {}, env.get("git") or {}
    gpus = ", ".join(f"{g.get('name')} ({g.get('memory_mib')} MiB)" for g in env.get("gpus") or []) or "no GPU"
    commit = git.get("commit")
    code = f"{commit[:12]}{' (dirty)' if git.get('dirty') else ''}" if commit else "not a git checkout"
    return (
        f"Python {env.get('python')} · torch {pkgs.get('torch', '-')} · ray {pkgs.get('ray', '-')} · "
        f"{env.get('hostname')} ({env.get('cpus')} CPUs, {gpus}) · ralph_ray at {code}"
    )


def stop_button(run: shell.Campaign) -> None:
    """The app's stop: the same STOP file as `python -m ralph_ray stop RUN_ID`; the campaign ends its cycle cleanly."""
    run_dir = Path(run.run_dir)
    stop_file = run_dir / STOP_FILE
    if not run.running:
        return
    if stop_file.exists():
        st.warning(
            f"Stop requested ({_read(stop_file) or 'by hand'}): the campaign records what it has and stops at its next "
            "check."
        )
        return
    allowed = access.stop_permission(run.run_id)  # exposed: the shared secret first
    if allowed is None:
        return
    if st.button(
        "Stop the campaign",
        type="primary",
        icon=":material/stop_circle:",
        key="stop",
        help=f"asks first; then writes {stop_file}; the current cycle ends cleanly and is recorded",
    ):
        st.session_state.stop_asked = run.run_id
    if st.session_state.get("stop_asked") != run.run_id:
        return
    st.warning(
        f"Stop campaign `{run.run_id}`? It finishes recording its current cycle and exits; you can resume it "
        f"later with `python -m ralph_ray resume={run.run_id}`."
    )
    yes, no = st.columns(2)
    if no.button("Cancel", key="stop_cancel"):
        st.session_state.stop_asked = None
        st.rerun(scope="fragment")
    if yes.button("Yes, stop it", type="primary", key="stop_confirm"):
        st.session_state.stop_asked = None
        if not allowed():
            st.error("Wrong shared secret: nothing was stopped.")
            return
        if not run_dir.is_dir():
            st.error(
                f"The run dir `{run_dir}` is not reachable from here: stop the campaign where it runs, with "
                f"`python -m ralph_ray stop {run.run_id} --runs DIR`."
            )
            return
        request_stop(run_dir, "app")
        st.warning(f"Stop requested: `{stop_file}` written.")


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None  # a resume removed it meanwhile


shell.page("Status and budgets", body)
