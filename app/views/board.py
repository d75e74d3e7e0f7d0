"""Leaderboard: the campaign's variants ranked by selection score, with the target."""

from __future__ import annotations

import streamlit as st

import figures
import kbdata
import shell
from ralph_ray import sql

STATUSES = list(figures.STATUS_STYLE)  # every variant status the KB records
COLUMNS = {
    "rank": st.column_config.NumberColumn("rank", width="small"),
    "variant_id": st.column_config.TextColumn("variant"),
    "selection_score": st.column_config.NumberColumn("selection", format="%.4f", help="best completed trial, frozen selection split"),
    "test_score": st.column_config.NumberColumn("test", format="%.4f", help="that trial's test score (never used for selection)"),
    "parent_id": st.column_config.TextColumn("parent"),
    "interventions": st.column_config.ListColumn("interventions"),
    "status": st.column_config.TextColumn("status"),
    "cycle": st.column_config.NumberColumn("cycle", width="small"),
    "completed": st.column_config.NumberColumn("completed", width="small"),
    "stopped_early": st.column_config.NumberColumn("stopped early", width="small", help="stopped by ASHA"),
    "failed": st.column_config.NumberColumn("failed", width="small"),
    "trial_hours": st.column_config.NumberColumn("trial-hours", format="%.3f"),
    "best_trial_id": st.column_config.TextColumn("best trial"),
    "best_knobs": st.column_config.TextColumn("best knobs"),
}


def body(run: shell.Campaign) -> None:
    board = kbdata.frame(run.kb_root, sql.APP_LEADERBOARD, (run.run_id,))
    if board.empty:
        shell.no_trials_yet(run, "finished trial")
        return
    board = board.assign(interventions=board["interventions"].map(figures.interventions))
    best = figures.records(board.head(1))[0]
    cols = st.columns(5)
    target = run.target
    delta = None if target is None or best["selection_score"] is None else f"{best['selection_score'] - target:+.4f} vs target"
    cols[0].metric("best selection score", figures.score_text(best["selection_score"]), delta)
    cols[1].metric("its test score", figures.score_text(best["test_score"]))
    cols[2].metric("target", figures.score_text(target) if target is not None else "none")
    cols[3].metric("variants ranked", len(board))
    cols[4].metric("trials", int(board["trials"].sum()),
                   f"{int(board['stopped_early'].sum())} stopped early, {int(board['failed'].sum())} failed", delta_color="off", delta_arrow="off")

    left, right = st.columns([3, 1])
    # Every status as an option, whatever this run has now: a live redraw never invalidates the choice.
    chosen = left.multiselect("status", STATUSES, default=STATUSES, key="board_status")
    floor = right.number_input("min selection score", value=None, step=0.01, format="%.4f", key="board_min", placeholder="any")
    shown = board[board["status"].isin(chosen) | (board["status"].isna() & (len(chosen) == len(STATUSES)))]
    if floor is not None:
        shown = shown[shown["selection_score"] >= floor]
    st.dataframe(shown, width="stretch", hide_index=True, column_order=list(COLUMNS), column_config=COLUMNS, placeholder="-")
    st.caption(f"{len(shown)} of {len(board)} variants. Variants without a trial (rejected by the gate) are on the Lineage page.")
    st.altair_chart(figures.score_chart(shown, target), width="stretch")


shell.page("Leaderboard", body)
