"""Curves: per-epoch metrics of chosen variants' trials (ASHA's stops marked), and the campaign's progress."""

from __future__ import annotations

import figures
import kbdata
import shell
import streamlit as st

from ralph_ray import sql

DEFAULT_VARIANTS = 3


def body(run: shell.Campaign) -> None:
    board = kbdata.frame(run.kb_root, sql.APP_LEADERBOARD, (run.run_id,))
    if board.empty:
        shell.no_trials_yet(run, "curve")
        return
    ranked = list(board["variant_id"])
    labels = {
        r["variant_id"]: (
            f"{figures.short(r['variant_id'])} · {r['status']} · "
            f"{figures.score_text(r['selection_score'], sign=run.sign)}"
        )
        for r in figures.records(board)
    }
    left, right = st.columns([3, 1])
    chosen = left.multiselect(
        "variants", ranked, default=ranked[:DEFAULT_VARIANTS], format_func=labels.get, key="curves_variants"
    )
    curves = kbdata.frame(run.kb_root, sql.APP_CURVES, (run.run_id, tuple(chosen))) if chosen else board.head(0)
    metrics = [m for m in figures.CURVE_METRICS if m in curves and curves[m].notna().any()] or list(
        figures.CURVE_METRICS[:1]
    )
    metric = right.selectbox("metric", metrics, key="curves_metric")
    if not chosen:
        st.info("Pick a variant with recorded epochs.")
    elif curves.empty:
        shell.empty(run.kb_root, "Pick a variant with recorded epochs.", ("epochs", "trials"), runs=(run.run_id,))
    else:
        st.altair_chart(figures.curves_chart(curves, metric), width="stretch")
        stopped = curves.loc[curves["status"] == "stopped_early", "trial_id"].nunique()
        st.caption(
            f"{curves['trial_id'].nunique()} trial(s) of {len(chosen)} variant(s); {stopped} stopped early by ASHA "
            "(dashed, with a cross at the epoch where it stopped)."
        )

    st.subheader("Progress")
    timeline = kbdata.frame(run.kb_root, sql.TRIAL_TIMELINE, (run.run_id,))
    st.altair_chart(figures.progress_chart(timeline, run.target, run.sign), width="stretch")
    st.caption(
        "Every finished trial by the time it ended: scored trials as points, stopped or failed ones as ticks at the "
        "bottom; the line is the best selection score so far"
        + (", the dashed rule the target." if run.target is not None else ".")
    )


shell.page("Curves", body)
