"""Knobs: which knobs matter for the selection score (Optuna's importance), parallel coordinates and slices,
over the whole campaign or one variant's trials."""

from __future__ import annotations

import figures
import kbdata
import knobstats
import pandas as pd
import shell
import streamlit as st

from ralph_ray import sql

CAMPAIGN = "every variant"


@st.cache_data(show_spinner=False, max_entries=64)  # keyed by the trials themselves: no TTL needed
def importances(table: pd.DataFrame, names: tuple[str, ...]) -> dict[str, float]:
    """Cached: the same trials give the same importances on every redraw. The stored scores are oriented (higher is
    better) whatever the metric's direction, so they are maximised."""
    return knobstats.importances(table, list(names))


def body(run: shell.Campaign) -> None:
    trials = kbdata.frame(run.kb_root, sql.APP_TRIALS, (run.run_id,))
    # Search trials only: a replicate repeats chosen knobs, a final training trains longer than any sample
    trials = trials[trials["kind"] == "search"] if "kind" in trials else trials
    table, knobs = knobstats.with_knobs(trials, "knobs")
    scored = table.dropna(subset=[knobstats.SCORE]) if not table.empty else table
    if scored.empty or not knobs:
        shell.no_trials_yet(run, "scored trial with knobs")
        return
    counts = scored["variant_id"].value_counts()
    scopes = [CAMPAIGN, *counts.index]
    scope = st.selectbox(
        "trials of",
        scopes,
        key="knobs_scope",
        format_func=lambda v: v if v == CAMPAIGN else f"variant {figures.short(v)} ({counts[v]} scored)",
    )
    rows = scored if scope == CAMPAIGN else scored[scored["variant_id"] == scope]
    params = list(knobs)
    if scope == CAMPAIGN and rows["variant_id"].nunique() > 1:
        rows = rows.assign(**{knobstats.VARIANT: rows["variant_id"].map(figures.short)})
        params.append(knobstats.VARIANT)  # how much the code changes matter, beside the knobs
    st.caption(
        f"{len(rows)} scored trial(s); knobs that vary among them: "
        f"{', '.join(knobstats.varying(rows, knobs)) or 'none'}."
    )

    st.subheader("Parameter importance")
    found = importances(rows[[*params, knobstats.SCORE]].reset_index(drop=True), tuple(params))
    if found:
        st.altair_chart(knobstats.importance_chart(found), width="stretch")
        st.caption(
            "Optuna's PED-ANOVA importance evaluator over a study rebuilt from these trials (the newest "
            f"{knobstats.MAX_TRIALS}): how much each parameter's values in the best "
            f"{knobstats.top_quantile(len(rows)):.0%} of scores differ from its values over all of them"
            + (" (`variant`: which code the trial ran)." if knobstats.VARIANT in params else ".")
        )
    else:
        st.info(
            f"Importance needs at least {knobstats.MIN_TRIALS} scored trials, a knob that varies "
            "and scores that differ."
        )

    numeric = knobstats.numeric_knobs(rows, knobs)
    if not numeric:
        st.info("No numeric knob varies among these trials: nothing to draw.")
        return
    st.subheader("Parallel coordinates")
    rows = figures.as_values(rows, run.sign)  # drawn as the metric's values
    st.altair_chart(knobstats.parallel_chart(rows, numeric), width="stretch")
    st.caption("One line per scored trial; each axis spans that knob's range among them (log where it spans 100x).")
    st.subheader("Slices")
    st.altair_chart(knobstats.slice_chart(rows, numeric))
    st.caption("The selection score against each knob's value, one panel per knob, coloured by cycle.")


shell.page("Knobs", body)
