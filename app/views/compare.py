"""Compare: the curves and scores of variants from different campaigns in this KB, overlaid."""

from __future__ import annotations

import figures
import kbdata
import shell
import streamlit as st

from ralph_ray import sql

COLUMNS = {
    "campaign": st.column_config.TextColumn("campaign"),
    "variant_id": st.column_config.TextColumn("variant"),
    "experiment": st.column_config.TextColumn("experiment"),
    "rank": st.column_config.NumberColumn("rank", width="small"),
    "status": st.column_config.TextColumn("status"),
    "selection_score": st.column_config.NumberColumn("selection", format="%.4f"),
    "test_score": st.column_config.NumberColumn("test", format="%.4f"),
}


def key(rec: dict) -> str:
    """A (campaign, variant) pair as the picker and the query name it."""
    return f"{rec['run_id']}/{rec['variant_id']}"


def _sign(rec: dict) -> float:
    """-1 for a campaign whose task's metric is minimised (its stored scores are -value), else 1."""
    return -1.0 if rec.get("direction") == "min" else 1.0


def body(run: shell.Campaign) -> None:
    scored = kbdata.frame(run.kb_root, sql.APP_COMPARABLE)
    if scored.empty:
        shell.no_trials_yet(run, "scored variant")
        return
    records = {key(r): r for r in figures.records(scored)}
    # Default: the best variant of this campaign and of the newest other campaign (when there is one).
    best = {}
    for rec in records.values():
        best.setdefault(rec["run_id"], key(rec))
    others = [k for run_id, k in best.items() if run_id != run.run_id]
    default = [k for k in (best.get(run.run_id), *others[:1]) if k]
    left, right = st.columns([3, 1])
    chosen = left.multiselect(
        "variants (any campaign in this KB)",
        list(records),
        default=default,
        key="compare_pick",
        format_func=lambda k: (
            f"{records[k]['run_id']} · {figures.short(records[k]['variant_id'])} · "
            f"#{records[k]['rank']} · {figures.score_text(records[k]['selection_score'], sign=_sign(records[k]))}"
        ),
    )
    if not chosen:
        st.info("Pick variants to compare.")
        return
    curves = kbdata.frame(run.kb_root, sql.APP_CURVES_ACROSS, (tuple(chosen),))
    metrics = [m for m in figures.CURVE_METRICS if m in curves and curves[m].notna().any()] or list(
        figures.CURVE_METRICS[:1]
    )
    metric = right.selectbox("metric", metrics, key="compare_metric")
    picked = scored[scored.apply(lambda r: key(r) in chosen, axis=1)].rename(columns={"run_id": "campaign"})
    # Each campaign's scores as its own metric's values (a min metric's are stored negated)
    signs = picked["direction"].map(lambda d: -1.0 if d == "min" else 1.0)
    picked = picked.assign(selection_score=picked["selection_score"] * signs, test_score=picked["test_score"] * signs)
    st.dataframe(
        picked, width="stretch", hide_index=True, column_order=list(COLUMNS), column_config=COLUMNS, placeholder="-"
    )
    if curves.empty:
        chosen_runs = {
            records[k]["run_id"] for k in chosen
        }  # another campaign's damaged part holds none of their epochs
        shell.empty(run.kb_root, "No recorded epochs for these variants.", ("epochs", "trials"), runs=chosen_runs)
        return
    st.altair_chart(figures.compare_chart(curves, metric), width="stretch")
    campaigns = curves["run_id"].nunique()
    st.caption(
        f"{curves['trial_id'].nunique()} trial(s) of {len(chosen)} variant(s) from {campaigns} campaign(s): one colour "
        "per campaign and variant, one line per trial."
    )


shell.page("Compare", body)
