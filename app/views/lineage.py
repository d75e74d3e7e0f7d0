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
    verdicts = figures.compared(kbdata.frame(run.kb_root, sql.INTERVENTIONS_FOR_RUN, (run.run_id,)))
    details(records[picked], run.sign, verdicts.get(picked))


def _clicked(event: Any) -> str | None:
    """The variant of the node clicked last (None when the selection is empty)."""
    points = event.selection.get(figures.LINEAGE_PICK) if event is not None else None
    return str(points[0]["variant_id"]) if points else None


def details(rec: dict, sign: float = 1.0, verdict: dict | None = None) -> None:
    """A variant's status, reason, rationale, diagnosis and scores (`sign` -1: a min metric's, shown as values), and
    against its parent what its verdict compared (`verdict`: its `interventions` row, figures.compared)."""
    cols = st.columns(5)
    cols[0].metric("status", rec.get("status") or "-")
    cols[1].metric(
        "selection score", figures.score_text(rec.get("selection_score"), sign=sign), help="its best search trial"
    )
    # What the verdict compared, named (user trial: the child's best trial minus whatever parent score the row held,
    # its replicate mean, a difference of two kinds the verdict never made, read as the child's gain)
    label, gain, scores = figures.versus_parent(verdict, sign)
    cols[2].metric(
        label,
        gain,
        scores,
        delta_color="off",
        delta_arrow="off",
        help=f"{label}: the child's score minus its parent's, as its verdict compared them (the report's `compared`): "
        "replicate means, best trials, or the child's best trial against the parent's replicate mean where the child "
        "was not worth replicating; `-` where it compared none (the seed, refused by the gate, crashed, not judged "
        "yet)",
    )
    cols[3].metric("test score", figures.score_text(rec.get("test_score"), sign=sign))
    cols[4].metric("cycle · depth", f"{rec.get('cycle')} · {rec.get('depth') if rec.get('depth') is not None else '-'}")
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
