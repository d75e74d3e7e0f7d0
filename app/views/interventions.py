"""Interventions: measured effects across every campaign in this KB (what the heuristic agent ranks by)."""

from __future__ import annotations

import figures
import kbdata
import pandas as pd
import shell
import streamlit as st

from ralph_ray import sql

COLUMNS = {
    "task": st.column_config.TextColumn("task"),
    "metric": st.column_config.TextColumn("metric", help="the task's metric as the runs declared it"),
    "direction": st.column_config.TextColumn(
        "direction", help="max: a positive delta is a gain; min (a loss, bits per byte): stored as -value, so too"
    ),
    "intervention": st.column_config.TextColumn("intervention"),
    "diagnosis": st.column_config.TextColumn("diagnosis", help="what the analyst saw in the parent"),
    "mean_delta": st.column_config.NumberColumn(
        "mean delta", format="%+.4f", help="child minus parent selection score"
    ),
    "n": st.column_config.NumberColumn("n", help="children with a score (measured effects)"),
    "ci_low": st.column_config.NumberColumn("95% low", format="%+.4f", help="Student's t interval of the mean"),
    "ci_high": st.column_config.NumberColumn("95% high", format="%+.4f", help="Student's t interval of the mean"),
    "interval": st.column_config.TextColumn("interval", help="mean ± half-width (n, 95% Student t); none at n = 1"),
    "tried": st.column_config.NumberColumn("tried"),
    "win_rate": st.column_config.ProgressColumn("win rate", format="percent", min_value=0.0, max_value=1.0),
    "kept": st.column_config.NumberColumn("kept"),
    "rejected": st.column_config.NumberColumn("rejected", help="refused by the validation gate"),
    "unscored": st.column_config.NumberColumn(
        "unscored", help="trained but never scored: stopped at an ASHA rung or crashed (the offline agent: no gain)"
    ),
}


def body(run: shell.Campaign) -> None:
    effects = kbdata.frame(run.kb_root, sql.APP_EFFECTS)
    if effects.empty:
        shell.empty(
            run.kb_root,
            "No intervention measured yet: effects appear once a campaign's children (cycle 2 on) are trained and "
            "judged. "
            f"Run a campaign with an agent: `python -m ralph_ray agent=heuristic paths.kb={run.kb_root}`.",
            ("interventions", "runs"),
        )
        return
    scope = figures.records(kbdata.frame(run.kb_root, sql.APP_EFFECTS_SCOPE))[0]
    st.caption(
        f"Across all {scope['campaigns']} campaign(s) and {scope['tasks']} task(s) in this KB: {scope['tried']} "
        "intervention(s) tried. "
        "Click a column header to sort."
    )
    left, right = st.columns(2)
    tasks = sorted(effects["task"].dropna().unique())
    task = left.selectbox(
        "task", ["all", *tasks], index=1 + tasks.index(run.task) if run.task in tasks else 0, key="effects_task"
    )
    diagnoses = sorted(effects["diagnosis"].dropna().unique())
    picked = right.multiselect("diagnosis", diagnoses, default=diagnoses, key="effects_diagnosis")
    shown = effects if task == "all" else effects[effects["task"] == task]
    shown = with_t_intervals(shown[shown["diagnosis"].isin(picked) | shown["diagnosis"].isna()])
    st.dataframe(
        shown, width="stretch", hide_index=True, column_order=list(COLUMNS), column_config=COLUMNS, placeholder="-"
    )
    if not shown.dropna(subset=["mean_delta"]).empty:
        st.altair_chart(figures.effects_chart(shown), width="stretch")


def with_t_intervals(effects: pd.DataFrame) -> pd.DataFrame:
    """The effects with Student's t 95% intervals of the mean delta (none at n = 1: one child shows no spread)."""
    rows = figures.records(effects)
    widths = [figures.half_width(r["sd_delta"], r["n"]) for r in rows]
    return effects.assign(
        ci_low=[None if w is None else r["mean_delta"] - w for r, w in zip(rows, widths, strict=True)],
        ci_high=[None if w is None else r["mean_delta"] + w for r, w in zip(rows, widths, strict=True)],
        interval=[
            None if r["mean_delta"] is None else figures.spread_text(r["mean_delta"], r["sd_delta"], r["n"])
            for r in rows
        ],
    )


shell.page("Interventions", body)
