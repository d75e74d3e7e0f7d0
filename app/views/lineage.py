"""Lineage: the tree of variants grown from the seed; click a node (or pick it) for its story."""

from __future__ import annotations

from typing import Any

import figures
import kbdata
import pandas as pd
import shell
import streamlit as st

from ralph_ray import sql


def body(run: shell.Campaign) -> None:
    tree = kbdata.frame(run.kb_root, sql.APP_LINEAGE, (run.run_id,))
    if tree.empty:
        shell.no_trials_yet(run, "variant")
        return
    # The best variant is the pick (the leaderboard's rank 1, by replicate mean where replicated), not the variant
    # of the luckiest single trial: the border and the report name the same one.
    pick = kbdata.frame(run.kb_root, sql.PICK, (run.run_id,))
    best_id = str(pick["variant_id"].iloc[0]) if not pick.empty else None
    event = st.altair_chart(
        figures.lineage_chart(tree, best_id, run.sign),
        width="stretch",
        on_select="rerun",
        selection_mode=figures.LINEAGE_PICK,
        key="lineage_graph",
    )
    st.caption(
        "Click a node for its story below. Fill: selection score (red = the run's worst, green = its best, grey = "
        "none). Shape and border: status (legend); thick border: the best variant, the pick (the Leaderboard's rank 1, "
        "by replicate mean where replicated). Edges: the interventions."
    )

    records = {r["variant_id"]: r for r in figures.records(tree)}
    order = [best_id] + [v for v in records if v != best_id] if best_id else list(records)
    clicked = _clicked(event)
    if clicked != st.session_state.get("lineage_clicked"):  # a new click on the graph picks the variant below
        st.session_state.lineage_clicked = clicked
        if clicked in records:
            st.session_state.lineage_variant = clicked
    picked = st.selectbox(
        "variant",
        order,
        key="lineage_variant",
        format_func=lambda v: (
            f"{figures.short(v)} · {records[v]['status']} · "
            f"{figures.score_text(records[v]['selection_score'], sign=run.sign)}"
        ),
    )
    details(records[picked], run.sign)


def _clicked(event: Any) -> str | None:
    """The variant of the node clicked last (None when the selection is empty)."""
    points = event.selection.get(figures.LINEAGE_PICK) if event is not None else None
    return str(points[0]["variant_id"]) if points else None


def details(rec: dict, sign: float = 1.0) -> None:
    """A variant's status, reason, rationale, diagnosis and scores (`sign` -1: a min metric's, shown as values)."""
    cols = st.columns(4)
    cols[0].metric("status", rec.get("status") or "-")
    score, parent = rec.get("selection_score"), rec.get("parent_score")
    cols[1].metric(
        "selection score",
        figures.score_text(score, sign=sign),
        None if score is None or parent is None else f"{sign * (score - parent):+.4f} vs parent",
        delta_color="normal" if sign > 0 else "inverse",  # green when better: lower, for a min metric
    )
    cols[2].metric("test score", figures.score_text(rec.get("test_score"), sign=sign))
    cols[3].metric("cycle · depth", f"{rec.get('cycle')} · {rec.get('depth') if rec.get('depth') is not None else '-'}")
    facts = {
        "variant": rec["variant_id"],
        "parent": rec.get("parent_id") or "none (the seed)",
        "interventions": ", ".join(figures.interventions(rec.get("interventions"))) or "none",
        "diagnosis": rec.get("diagnosis") or "none",
        "reason": figures.why(rec) or "none",
        "trials": str(int(rec.get("trials") or 0)),
        "path from the seed": rec.get("path") or "none",
    }
    st.table(pd.DataFrame({"value": list(facts.values())}, index=list(facts)))
    st.markdown("**Rationale**")
    st.markdown(rec.get("rationale") or "_none recorded_")


shell.page("Lineage", body)
