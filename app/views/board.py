"""Leaderboard: the campaign's variants ranked (discarded last; replicate mean where replicated, else best trial)."""

from __future__ import annotations

from typing import Any

import figures
import kbdata
import knobstats
import pandas as pd
import shell
import streamlit as st

from ralph_ray import front, sql

STATUSES = list(figures.STATUS_STYLE)  # every variant status the KB records
# The leaderboard view's rank (ralph_ray/sql.py), as the report's legend says it
RANKING = (
    "Ranked by the replicate mean where a variant has one (a best trial is the luckiest of its samples), then by the "
    "best trial; a discarded variant (its verdict found it no better than its parent) ranks below every other "
    "whatever its scores."
)
DISCARDED_LAST = "a discarded variant ranks below every other, whatever its scores"


def score_columns(metric: str | None) -> dict[str, Any]:
    """The selection and test columns, labelled with the task's metric (`selection macro_f1`; user trial: `selection`
    / `test` said not which score they were); unnamed where the config records no metric."""

    def label(split: str) -> str:
        return f"{split} {metric}" if metric else split

    return {
        "selection_score": st.column_config.NumberColumn(
            label("selection"), format="%.4f", help="best completed trial, frozen selection split"
        ),
        "test_score": st.column_config.NumberColumn(
            label("test"), format="%.4f", help="that trial's test score (never used for selection)"
        ),
    }


COLUMNS = {
    "rank": st.column_config.NumberColumn("rank", width="small"),
    "variant_id": st.column_config.TextColumn("variant"),
    **score_columns(None),
    "cost_s": st.column_config.NumberColumn("cost s", format="%.1f", help=f"the best trial's cost: {front.COST_HELP}"),
    "on_front": st.column_config.CheckboxColumn(
        "front", width="small", help="no other variant scores at least as well for no more cost"
    ),
    "parent_id": st.column_config.TextColumn("parent"),
    "interventions": st.column_config.ListColumn("interventions"),
    "status": st.column_config.TextColumn("status"),
    "cycle": st.column_config.NumberColumn("cycle", width="small"),
    "completed": st.column_config.NumberColumn("completed", width="small"),
    "stopped_early": st.column_config.NumberColumn("stopped early", width="small", help="stopped by ASHA"),
    "failed": st.column_config.NumberColumn("failed", width="small"),
    "trial_hours": st.column_config.NumberColumn("trial-hours", format="%.3f"),
    "spread": st.column_config.TextColumn(
        "replicates",
        help="the best knobs run again with fresh seeds (safeguards.replicates): mean ± 95% Student-t interval",
    ),
    "reason": st.column_config.TextColumn("why", help="the variant's recorded reason, else how its trials ended"),
    "best_trial_id": st.column_config.TextColumn("best trial"),
}
# Then the best trial's knobs, then the rest.
LEAD = ["rank", "variant_id", "selection_score", "test_score", "cost_s", "on_front", "spread"]


def body(run: shell.Campaign) -> None:
    board = kbdata.frame(run.kb_root, sql.APP_BOARD, (run.run_id,))
    if board.empty:
        shell.no_trials_yet(run, "finished trial")
        return
    board = board.assign(
        interventions=board["interventions"].map(figures.interventions),
        reason=[figures.why(r) for r in figures.records(board)],
    )
    sign = run.sign  # scores are ranked and compared as stored (oriented), shown as the metric's values
    board = with_cost(with_spread(board, kbdata.frame(run.kb_root, sql.APP_REPLICATES, (run.run_id,)), sign))
    board, knobs = knobstats.with_knobs(board, "best_knobs")
    best = figures.records(board.head(1))[0]
    cols = st.columns(5)
    target = run.target
    delta = (
        None
        if target is None or best["selection_score"] is None
        else f"{sign * (best['selection_score'] - target):+.4f} vs target"
    )
    cols[0].metric(
        "best selection score",
        figures.score_text(best["selection_score"], sign=sign),
        delta,
        delta_color="normal" if sign > 0 else "inverse",  # green when better: lower, for a min metric
    )
    cols[1].metric("its test score", figures.score_text(best["test_score"], sign=sign))
    cols[2].metric("target", figures.score_text(target, sign=sign) if target is not None else "none")
    cols[3].metric("variants ranked", len(board))
    cols[4].metric(
        "trials",
        int(board["trials"].sum()),
        f"{int(board['stopped_early'].sum())} stopped early, {int(board['failed'].sum())} failed",
        delta_color="off",
        delta_arrow="off",
    )

    left, right = st.columns([3, 1])
    # Every status as an option, whatever this run has now: a live redraw never invalidates the choice.
    chosen = left.multiselect("status", STATUSES, default=STATUSES, key="board_status")
    # In the metric's units: a floor for a max metric, a ceiling for a min metric (e.g. bits per byte)
    floor = right.number_input(
        f"{'min' if sign > 0 else 'max'} selection score",
        value=None,
        step=0.01,
        format="%.4f",
        key="board_min",
        placeholder="any",
    )
    shown = board[board["status"].isin(chosen) | (board["status"].isna() & (len(chosen) == len(STATUSES)))]
    if floor is not None:
        shown = shown[shown["selection_score"] >= floor * sign]  # the stored score against the bound, stored alike
    order = LEAD + knobs + [c for c in COLUMNS if c not in LEAD]
    if board["spread"].isna().all():
        order.remove("spread")  # no knobs were repeated with other seeds: no column of dashes
    config = (
        COLUMNS
        | score_columns((run.config.get("task") or {}).get("metric"))
        | {
            k: st.column_config.NumberColumn(k, format="%.4g", help="the best trial's knob")
            if knobstats.is_numeric(board[k])
            else st.column_config.TextColumn(k)
            for k in knobs
        }
    )
    st.dataframe(
        figures.as_values(shown, sign),
        width="stretch",
        hide_index=True,
        column_order=order,
        column_config=config,
        placeholder="-",
    )
    st.caption(
        f"{len(shown)} of {len(board)} variants ({run.metric_note}); the best trial's knobs "
        f"({', '.join(knobs) or 'none'}) follow its scores. {RANKING} Variants without a trial (rejected by the gate) "
        "are on the Lineage page; every trial is on Trials."
    )
    st.altair_chart(figures.score_chart(shown, target, sign), width="stretch")
    st.altair_chart(figures.front_chart(board, target, sign), width="stretch")
    st.caption(
        "Score against cost: every scored variant at its best trial's cost (training seconds where reported, else "
        "wall seconds); the step line is the front, the variants no other variant beats for the same or less "
        "cost (ringed). A gain bought with compute sits further right. All variants, whatever the filters."
    )
    tie = within_noise(board, sign)
    if tie:
        st.caption(tie)


def with_spread(board: pd.DataFrame, replicates: pd.DataFrame, sign: float = 1.0) -> pd.DataFrame:
    """The board with its best knobs' replicate spread (`spread` text, `half_width`); None where never repeated.

    Replicate trials (fresh seeds of the best knobs, what the keep verdict compared) come with the leaderboard
    view's mean and 95% t interval; a KB without them falls back to trials that merely share the best knobs.
    """
    found = {(r["variant_id"], r["knobs"]): r for r in figures.records(replicates)}
    spread, width = [], []
    for rec in figures.records(board):
        n = rec.get("replicates")
        if n is not None and not pd.isna(n) and int(n) > 0:
            half = rec.get("half_width")
            known = half is not None and not pd.isna(half)
            mean = sign * rec["mean_score"]
            spread.append(
                f"{mean:.4f} ± {half:.4f} (n={int(n)}, 95% t{_clipped(rec, sign)})"
                if known
                else f"n={int(n)}, no interval"
            )
            width.append(float(half) if known else None)
            continue
        rep = found.get((rec["variant_id"], rec["best_knobs"]))
        spread.append(None if rep is None else figures.spread_text(sign * rep["mean"], rep["sd"], rep["n"]))
        width.append(None if rep is None else figures.half_width(rep["sd"], rep["n"]))
    return board.assign(spread=spread, half_width=width)


def _clipped(rec: dict, sign: float) -> str:
    """`; clipped to [0.8274, 1.0000]` where the view cut the interval at the metric's range (accuracy's 1 at n=2)."""
    if not rec.get("ci_clipped"):
        return ""
    low, high = sorted((sign * rec["ci_low"], sign * rec["ci_high"]))
    return f"; clipped to [{low:.4f}, {high:.4f}]"


def with_cost(board: pd.DataFrame) -> pd.DataFrame:
    """The board with its best trial's cost (`cost_s`) and whether the variant is on the score-against-cost front."""
    rows = figures.records(board[["variant_id", "selection_score", "best_seconds", "best_train_seconds"]])
    for row in rows:
        row["cost_s"] = front.cost_seconds(row["best_train_seconds"], row["best_seconds"])
    # The KB's scores are oriented (higher is better) whatever the metric's direction: "max" here.
    on = {
        r["variant_id"]
        for r in front.cost_front(rows, cost=lambda r: r["cost_s"], score=lambda r: r["selection_score"])
    }
    return board.assign(cost_s=[r["cost_s"] for r in rows], on_front=board["variant_id"].isin(on))


def within_noise(board: pd.DataFrame, sign: float = 1.0) -> str | None:
    """A note when the first two ranks differ by less than the leader's replicate interval, each measured as the
    ranking measures it: by its replicate mean where replicated, else by its best trial; a discarded one is named as
    such, since it ranks last whatever it measured (a higher mean at rank 2 read as a misranking)."""
    top = figures.records(board.dropna(subset=["selection_score"]).head(2))
    if len(top) < 2 or top[0].get("half_width") is None:
        return None
    measures = [_ranked_by(r) for r in top]
    gap = measures[0][1] - measures[1][1]
    if abs(gap) >= top[0]["half_width"]:
        return None
    (what1, score1), (what2, score2) = measures
    discarded = " and ".join(f"rank {n}" for n, r in enumerate(top, 1) if r.get("status") == "discarded")
    last = f" {discarded.capitalize()} {'are' if ' and ' in discarded else 'is'} discarded: {DISCARDED_LAST}."
    return (
        f"Ranks 1 and 2 are within noise: {abs(gap):.4f} apart (rank 1's {what1} {sign * score1:.4f}, rank 2's "
        f"{what2} {sign * score2:.4f}), less than the leader's ±{top[0]['half_width']:.4f} "
        "(95% t interval of its replicates)." + (last if discarded else "")
    )


def _ranked_by(rec: dict) -> tuple[str, float]:
    """What ranks a board row: its replicate mean where it has one, else its best trial's selection score."""
    mean = rec.get("mean_score")
    if mean is not None and not pd.isna(mean):
        return "replicate mean", float(mean)
    return "best trial", float(rec["selection_score"])


shell.page("Leaderboard", body)
