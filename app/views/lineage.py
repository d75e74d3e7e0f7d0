"""Lineage: the tree of variants grown from the seed; pick a node for its story."""

from __future__ import annotations

import figures
import kbdata
import pandas as pd
import shell
import streamlit as st

from ralph_ray import sql

SMALL_TREE = 8  # variants drawn at natural size; more are fitted to the page width


def body(run: shell.Campaign) -> None:
    tree = kbdata.frame(run.kb_root, sql.APP_LINEAGE, (run.run_id,))
    if tree.empty:
        shell.no_trials_yet(run, "variant")
        return
    scored = tree.dropna(subset=["selection_score"])
    best_id = scored.sort_values("selection_score", ascending=False)["variant_id"].iloc[0] if not scored.empty else None
    st.graphviz_chart(figures.lineage_dot(tree, best_id), width="stretch" if len(tree) > SMALL_TREE else "content")
    st.caption(
        "Fill: selection score (red = the run's worst, green = its best, grey = none). Double octagon: the seed; "
        "bold border: kept; dashed: discarded or rejected; thick border: the best variant. Edges: the interventions."
    )

    records = {r["variant_id"]: r for r in figures.records(tree)}
    order = [best_id] + [v for v in records if v != best_id] if best_id else list(records)
    picked = st.selectbox(
        "variant",
        order,
        key="lineage_variant",
        format_func=lambda v: (
            f"{figures.short(v)} · {records[v]['status']} · {figures.score_text(records[v]['selection_score'])}"
        ),
    )
    details(records[picked])


def details(rec: dict) -> None:
    """A variant's status, reason, rationale, diagnosis and scores."""
    cols = st.columns(4)
    cols[0].metric("status", rec.get("status") or "-")
    score, parent = rec.get("selection_score"), rec.get("parent_score")
    cols[1].metric(
        "selection score",
        figures.score_text(score),
        None if score is None or parent is None else f"{score - parent:+.4f} vs parent",
    )
    cols[2].metric("test score", figures.score_text(rec.get("test_score")))
    cols[3].metric("cycle · depth", f"{rec.get('cycle')} · {rec.get('depth') if rec.get('depth') is not None else '-'}")
    facts = {
        "variant": rec["variant_id"],
        "parent": rec.get("parent_id") or "none (the seed)",
        "interventions": ", ".join(figures.interventions(rec.get("interventions"))) or "none",
        "diagnosis": rec.get("diagnosis") or "none",
        "reason": figures.why(rec) or "none",
        "trials": str(int(rec.get("trials") or 0)),
        "path from the seed": figures.path_text(rec.get("path")),
    }
    st.table(pd.DataFrame({"value": list(facts.values())}, index=list(facts)))
    st.markdown("**Rationale**")
    st.markdown(rec.get("rationale") or "_none recorded_")


shell.page("Lineage", body)
