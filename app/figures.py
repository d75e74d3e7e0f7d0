"""Pure builders for what the pages draw: the lineage graph, altair charts, budget rows. No Streamlit here."""

from __future__ import annotations

import colorsys
import json
import math
import re
from dataclasses import dataclass
from typing import Any

import altair as alt
import networkx as nx
import pandas as pd

# How each variant status the KB records looks in the lineage graph: (Vega point shape, border colour).
# The keys are the values of `ralph_ray.variants.VariantStatus` (tests/app checks they agree; the app imports no
# engine module to learn them).
STATUS_STYLE = {
    "seed": ("diamond", "#1f2937"),
    "candidate": ("circle", "#2563eb"),
    "kept": ("square", "#166534"),
    "discarded": ("circle", "#9ca3af"),
    "rejected": ("triangle-down", "#b91c1c"),
    "crashed": ("cross", "#b91c1c"),
}
NO_SCORE_FILL = "#e5e7eb"
ROW_PX = 80  # the lineage graph's pixels per row: a node, its label below and its edge's label above
LINEAGE_PICK = "pick"  # the lineage chart's click selection (the page reads the clicked variant from it)
# How a trial ended: the values of `ralph_ray.statuses.TrialStatus` (tests/app checks they agree).
TRIAL_STATUSES = ["completed", "stopped_early", "failed"]
# Distinct hues for variants (Streamlit's default palette gives neighbours near-identical blues).
VARIANT_COLORS = alt.Scale(scheme="tableau20")
# the last six are harness.probes telemetry: offered only where a trainer reports them
CURVE_METRICS = (
    "val_acc",
    "val_loss",
    "train_loss",
    "lr",
    "grad_norm",
    "epoch_seconds",
    "gen_gap",
    "weight_norm",
    "update_norm",
    "update_ratio",
    "eff_rank",
    "plateau",
)


def interventions(text: Any) -> list[str]:
    """The names in a `variants.interventions` JSON list (empty for NULL or bad JSON)."""
    if not isinstance(text, str) or not text:
        return []
    try:
        names = json.loads(text)
    except json.JSONDecodeError:
        return [text]
    return [str(n) for n in names] if isinstance(names, list) else [str(names)]


def why(rec: dict[str, Any]) -> str | None:
    """Why a variant stands where it does: its recorded reason, else how its trials ended when none completed."""
    if rec.get("reason"):
        return str(rec["reason"])
    if "completed" not in rec or rec.get("completed") or not rec.get("trials"):
        return None  # no trial counts to tell (a lineage row), or it did complete one
    counts = (("stopped_early", "stopped early"), ("failed", "failed"))
    ended = [f"{int(rec.get(k) or 0)} {label}" for k, label in counts if rec.get(k)]
    return "no trial completed: " + ", ".join(ended) + " (see Trials)"


# What a child's verdict compared with its parent (`interventions.basis`, records.EffectBasis), as the report's
# `compared` column names it (tests/app checks they agree; the app imports no report module).
COMPARED = {
    "replicates": "replicate means",
    "best_trial": "best trials",
    "best_trial_vs_replicates": "child's best trial vs parent's replicate mean",
}


def compared(effects: pd.DataFrame) -> dict[str, dict[str, Any]]:
    """Each judged child's `interventions` row (one per intervention, the same scores; the last of the cycle-ordered
    rows where several): the child's and parent's scores its verdict compared and their `basis`. A child that
    compared none (refused, crashed, not judged yet) is absent."""
    return {
        str(rec["variant_id"]): rec
        for rec in records(effects)
        if rec.get("child_score") is not None and rec.get("parent_score") is not None
    }


def versus_parent(row: dict[str, Any] | None, sign: float = 1.0) -> tuple[str, str, str | None]:
    """The Lineage page's 'vs parent' as the verdict compared it: (label naming what both scores are, the child's gain
    in the metric's units, 'child vs parent'); never a best trial against a mean it did not compare. Without a
    comparison: ('vs parent', '-', None)."""
    if not row:
        return "vs parent", "-", None
    child, parent = float(row["child_score"]), float(row["parent_score"])
    kind = COMPARED.get(row.get("basis") or "", "kind not recorded")  # a KB from before `basis`
    return f"vs parent ({kind})", f"{sign * (child - parent):+.4f}", f"{sign * child:.4f} vs {sign * parent:.4f}"


def half_width(sd: Any, n: Any, level: float = 0.95) -> float | None:
    """Half the width of Student's t interval for a mean of `n` values with sample sd `sd` (None below n = 2)."""
    if n is None or pd.isna(n) or int(n) < 2 or sd is None or pd.isna(sd):
        return None
    from scipy.stats import t  # only where an interval is drawn

    return float(t.ppf(0.5 + level / 2, int(n) - 1) * float(sd) / math.sqrt(int(n)))


def spread_text(mean: Any, sd: Any, n: Any) -> str:
    """'mean ± half-width (n=…, 95% t)', or 'n=1, no interval'."""
    width = half_width(sd, n)
    if width is None:
        return f"n={int(n or 0)}, no interval"
    return f"{mean:.4f} ± {width:.4f} (n={int(n)}, 95% t)"


def round_floats(text: Any, digits: int = 4) -> Any:
    """Long floats in a recorded text (`best 0.9637883008356546`) at `digits` decimals; other values unchanged."""
    if not isinstance(text, str):
        return text
    return re.sub(rf"(?<![\w.])(-?\d+\.\d{{{digits + 1}}})\d+", lambda m: f"{float(m.group(0)):.{digits}f}", text)


def records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """Rows as dicts, NaN and NaT as None (so a page asks `is None`)."""
    return [
        {k: (None if not isinstance(v, (list, dict)) and pd.isna(v) else v) for k, v in rec.items()}
        for rec in frame.to_dict("records")
    ]


def short(variant_id: Any) -> str:
    """A variant id as the graph and the pickers show it."""
    return str(variant_id)[:12] if isinstance(variant_id, str) else "-"


def score_text(value: Any, digits: int = 4, sign: float = 1.0) -> str:
    """A score for display (`sign` -1: a min metric's stored score, shown as its value); a dash when there is none."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{sign * value:.{digits}f}"


# The KB stores scores oriented (higher is better): a min metric's (lm's bits per byte) as -value. Pages rank and
# compare on the stored scores, then show these columns as the metric's values (`as_values`).
SCORE_COLUMNS = (
    "selection_score",
    "test_score",
    "mean_score",
    "final_selection_score",
    "final_test_score",
    "parent_score",
    "child_score",
    "best_selection_score",
    "running best",
    "target",
    "mean",
)


def as_values(frame: pd.DataFrame, sign: float) -> pd.DataFrame:
    """The frame with its score columns as the metric's values (`sign` -1: negated, an interval's ends swapped)."""
    if sign > 0:
        return frame
    out = frame.assign(**{c: -frame[c] for c in SCORE_COLUMNS if c in frame.columns})
    if "ci_low" in frame.columns and "ci_high" in frame.columns:
        out = out.assign(ci_low=-frame["ci_high"], ci_high=-frame["ci_low"])
    return out


def _fill(score: Any, low: float, high: float) -> str:
    """Red (worst of the run) to green (best) as a hex colour; light grey without a score."""
    if score is None or (isinstance(score, float) and math.isnan(score)):
        return NO_SCORE_FILL
    share = 1.0 if high <= low else (float(score) - low) / (high - low)
    red, green, blue = colorsys.hsv_to_rgb(0.33 * share, 0.45, 0.95)
    return f"#{round(red * 255):02x}{round(green * 255):02x}{round(blue * 255):02x}"


def lineage_frames(
    lineage: pd.DataFrame, best_id: str | None = None, sign: float = 1.0
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The lineage graph as two tables: nodes (position, fill, status, label) and edges (ends, interventions).

    Layout: networkx's BFS layers from the seed, a column per generation (`x`, left to right), each node of a column
    in a row of its own (`y`, one apart, centred; siblings together, in their parents' order); variants whose parent
    is not in the run hang from a hidden root, so several roots still make one graph.
    """
    records_ = lineage.to_dict("records")
    ids = [str(rec["variant_id"]) for rec in records_]
    known, root = set(ids), "\0root"
    graph = nx.Graph()
    graph.add_node(root)
    for rec in records_:
        parent = rec.get("parent_id")
        has_parent = isinstance(parent, str) and parent in known and parent != rec["variant_id"]
        graph.add_edge(parent if has_parent else root, str(rec["variant_id"]))
    position = _rows(graph, root, ids)
    scores = [s for s in lineage["selection_score"] if s is not None and not pd.isna(s)]
    low, high = (min(scores), max(scores)) if scores else (0.0, 1.0)
    nodes = pd.DataFrame(
        [
            {
                "variant_id": variant,
                "x": float(position[variant][0]),
                "y": float(position[variant][1]),
                "status": rec.get("status") or "candidate",
                "score": score_text(rec.get("selection_score"), sign=sign),
                "fill": _fill(rec.get("selection_score"), low, high),
                "best": variant == best_id,
                "label": f"{short(variant)} · {score_text(rec.get('selection_score'), sign=sign)}",
                "cycle": rec.get("cycle"),
                "interventions": ", ".join(interventions(rec.get("interventions")))
                or ("knobs" if rec.get("parent_id") else "seed"),
                "aria": f"variant {variant}",  # what the browser reads (and a test clicks)
            }
            for variant, rec in zip(ids, records_)
        ],
        columns=["variant_id", "x", "y", "status", "score", "fill", "best", "label", "cycle", "interventions", "aria"],
    )
    edges = pd.DataFrame(
        [
            {
                "parent_id": rec["parent_id"],
                "variant_id": str(rec["variant_id"]),
                "x": float(position[rec["parent_id"]][0]),
                "y": float(position[rec["parent_id"]][1]),
                "x2": float(position[str(rec["variant_id"])][0]),
                "y2": float(position[str(rec["variant_id"])][1]),
                "label": ", ".join(interventions(rec.get("interventions"))) or "knobs",
            }
            for rec in records_
            if graph.has_edge(rec.get("parent_id"), str(rec["variant_id"]))
        ],
        columns=["parent_id", "variant_id", "x", "y", "x2", "y2", "label"],
    )
    edges["mx"], edges["my"] = (edges["x"] + edges["x2"]) / 2, (edges["y"] + edges["y2"]) / 2
    return nodes, edges


def _rows(graph: nx.Graph, root: str, ids: list[str]) -> dict[str, tuple[float, float]]:
    """(generation, row) of each node below `root`: rows one apart and centred per generation, siblings together."""
    order = {variant: n for n, variant in enumerate(ids)}
    position: dict[str, tuple[float, float]] = {root: (-1.0, 0.0)}
    for depth, layer in enumerate(list(nx.bfs_layers(graph, root))[1:]):
        # Under the row of the parent (its neighbour one generation back), then in the KB's order
        parent_row = {v: min(position[n][1] for n in graph[v] if n in position) for v in layer}
        ranked = sorted(layer, key=lambda v: (parent_row[v], order.get(v, 0)))
        position.update({v: (float(depth), slot - (len(ranked) - 1) / 2) for slot, v in enumerate(ranked)})
    position.pop(root)
    return position


def lineage_chart(lineage: pd.DataFrame, best_id: str | None = None, sign: float = 1.0) -> alt.LayerChart:
    """The lineage tree, clickable: fill = score, shape and border = status, edge label = interventions.

    A click selects a node (the selection `LINEAGE_PICK`, field `variant_id`); the page opens that variant.
    Drawn as SVG so each node is an element the browser (and a test) can address by its aria label.
    """
    nodes, edges = lineage_frames(lineage, best_id, sign)
    rows = max(2, int(nodes.groupby("x").size().max()) if not nodes.empty else 1)
    # Rows one apart (lineage_frames), ROW_PX each: the domain spans every row and half a row beyond the outermost
    x_scale = alt.Scale(nice=False, zero=False, padding=60)
    y_scale = alt.Scale(domain=[-rows / 2, rows / 2], nice=False, zero=False)
    x, y = alt.X("x:Q", axis=None, scale=x_scale), alt.Y("y:Q", axis=None, scale=y_scale)
    statuses = [s for s in STATUS_STYLE if s in set(nodes["status"])] or ["candidate"]
    pick = alt.selection_point(name=LINEAGE_PICK, fields=["variant_id"], on="click", empty=True)
    links = alt.Chart(edges).mark_rule(color="#9ca3af", aria=False).encode(x=x, y=y, x2="x2:Q", y2="y2:Q")
    link_text = (
        alt.Chart(edges)
        .mark_text(fontSize=10, color="#4b5563", dy=-7, aria=False)
        .encode(x=alt.X("mx:Q", axis=None, scale=x_scale), y=alt.Y("my:Q", axis=None, scale=y_scale), text="label:N")
    )
    points = (
        alt.Chart(nodes)
        .mark_point(filled=True, size=520, cursor="pointer")
        .encode(
            x=x,
            y=y,
            fill=alt.Fill("fill:N", scale=None),
            shape=alt.Shape(
                "status:N",
                scale=alt.Scale(domain=statuses, range=[STATUS_STYLE[s][0] for s in statuses]),
                legend=alt.Legend(title="status", orient="bottom"),
            ),
            stroke=alt.Stroke(
                "status:N", scale=alt.Scale(domain=statuses, range=[STATUS_STYLE[s][1] for s in statuses])
            ),
            strokeWidth=alt.condition("datum.best", alt.value(4), alt.value(1.5)),
            opacity=alt.condition(pick, alt.value(1.0), alt.value(0.45)),
            description="aria:N",
            tooltip=[
                alt.Tooltip("variant_id:N", title="variant"),
                "status:N",
                alt.Tooltip("score:N", title="selection score"),
                "cycle:Q",
                "interventions:N",
            ],
        )
        .add_params(pick)
    )
    labels = alt.Chart(nodes).mark_text(fontSize=11, dy=22, aria=False).encode(x=x, y=y, text="label:N")
    return (
        alt.layer(links, link_text, points, labels)
        .properties(
            height=ROW_PX * rows,
            # The height is the rows' alone, the legend below it: without an autosize of its own Streamlit sets
            # `fit`, which squeezed the legend and labels into it (two siblings 25 px apart, drawn over each other)
            autosize=alt.AutoSizeParams(type="fit-x", contains="padding"),
            usermeta={"embedOptions": {"renderer": "svg"}},
        )
        .configure_view(stroke=None)
    )


def curves_chart(curves: pd.DataFrame, metric: str) -> alt.LayerChart:
    """Per-epoch `metric` of each trial, coloured by variant; ASHA-stopped trials dashed, an x at their end."""
    data = curves[["trial_id", "variant_id", "status", "epoch", metric]].dropna(subset=[metric]).copy()
    data["variant"] = data["variant_id"].map(short)
    data["stopped early"] = data["status"].eq("stopped_early")
    base = alt.Chart(data).encode(
        x=alt.X("epoch:Q", title="epoch", axis=alt.Axis(tickMinStep=1)),
        y=alt.Y(f"{metric}:Q", title=metric, scale=alt.Scale(zero=False)),
        color=alt.Color("variant:N", title="variant", scale=VARIANT_COLORS),
        tooltip=["variant", "trial_id", "status", "epoch", alt.Tooltip(f"{metric}:Q", format=".4f")],
    )
    lines = base.mark_line(point=alt.OverlayMarkDef(size=18)).encode(
        detail="trial_id:N",
        strokeDash=alt.StrokeDash(
            "stopped early:N",
            title="stopped early",
            scale=alt.Scale(domain=[False, True], range=[[1, 0], [5, 4]]),
            legend=alt.Legend(symbolType="stroke", symbolStrokeWidth=2),
        ),  # lines, not dots
    )
    last = data.sort_values("epoch").groupby("trial_id").tail(1)
    stops = (
        alt.Chart(last[last["stopped early"]])
        .mark_point(shape="cross", size=120, filled=True)
        .encode(
            x="epoch:Q",
            y=f"{metric}:Q",
            color=alt.Color("variant:N", scale=VARIANT_COLORS),
            tooltip=[
                "variant",
                "trial_id",
                alt.Tooltip("epoch:Q", title="stopped at epoch"),
                alt.Tooltip(f"{metric}:Q", format=".4f"),
            ],
        )
    )
    return alt.layer(lines, stops).properties(height=340)


def compare_chart(curves: pd.DataFrame, metric: str) -> alt.Chart:
    """Per-epoch `metric` of trials from several campaigns: one colour per (campaign, variant), one line per trial."""
    data = curves[["run_id", "trial_id", "variant_id", "status", "epoch", metric]].dropna(subset=[metric]).copy()
    data["variant"] = data["run_id"] + " · " + data["variant_id"].map(short)
    data["trial"] = data["run_id"] + "/" + data["trial_id"]
    return (
        alt.Chart(data)
        .mark_line(point=alt.OverlayMarkDef(size=18))
        .encode(
            x=alt.X("epoch:Q", title="epoch", axis=alt.Axis(tickMinStep=1)),
            y=alt.Y(f"{metric}:Q", title=metric, scale=alt.Scale(zero=False)),
            color=alt.Color("variant:N", title="campaign · variant", scale=VARIANT_COLORS),
            detail="trial:N",
            tooltip=["variant", "trial_id", "status", "epoch", alt.Tooltip(f"{metric}:Q", format=".4f")],
        )
        .properties(height=340)
    )


def progress_frame(timeline: pd.DataFrame) -> pd.DataFrame:
    """The trial timeline with the running best selection score of the search trials (scored trials only carry a
    score). Replicates are left out, as report.running_best leaves them out: a fresh seed of knobs already ranked is
    luck, not progress (the line peaked above the best the leaderboard named)."""
    data = timeline.sort_values("written_at").reset_index(drop=True).copy()
    search = (
        data["selection_score"].where(~data["replicate"].astype(bool))
        if "replicate" in data
        else data["selection_score"]
    )
    data["running best"] = search.cummax().ffill()
    return data


def progress_chart(timeline: pd.DataFrame, target: float | None, sign: float = 1.0) -> alt.LayerChart:
    """Every finished trial over time (scored: a point; stopped or failed: a bottom tick) and the running best.
    Scores as stored (oriented); `sign` -1 draws a min metric's values."""
    data = as_values(progress_frame(timeline), sign)
    target = None if target is None else sign * target
    scored = data.dropna(subset=["selection_score"])
    floor = float(scored["selection_score"].min()) if not scored.empty else 0.0
    unscored = data[data["selection_score"].isna()].assign(y=floor)
    x = alt.X("written_at:T", title="time")
    layers = [
        alt.Chart(scored)
        .mark_circle(size=50, opacity=0.75)
        .encode(
            x=x,
            y=alt.Y("selection_score:Q", title="selection score", scale=alt.Scale(zero=False)),
            color=alt.Color("status:N"),
            tooltip=["trial_id", "variant_id", "cycle", "status", alt.Tooltip("selection_score:Q", format=".4f")],
        ),
        alt.Chart(unscored)
        .mark_tick(thickness=2, size=12)
        .encode(x=x, y="y:Q", color=alt.Color("status:N"), tooltip=["trial_id", "variant_id", "cycle", "status"]),
        alt.Chart(data.dropna(subset=["running best"]))
        .mark_line(interpolate="step-after", color="#111827")
        .encode(x=x, y="running best:Q", tooltip=[alt.Tooltip("running best:Q", format=".4f")]),
    ]
    if target is not None:
        layers.append(
            alt.Chart(pd.DataFrame({"target": [target]}))
            .mark_rule(strokeDash=[6, 4], color="#dc2626")
            .encode(y="target:Q")
        )
    return alt.layer(*layers).properties(height=320)


def score_chart(board: pd.DataFrame, target: float | None, sign: float = 1.0) -> alt.LayerChart:
    """Each variant's best selection score in the leaderboard's order (rank 1, the pick, first: by replicate mean where
    replicated), with the campaign's target as a dashed rule. Scores as stored (oriented); `sign` -1 draws a min
    metric's values."""
    data = as_values(board.dropna(subset=["selection_score"]), sign)
    data = data.assign(variant=data["variant_id"].map(short))
    target = None if target is None else sign * target
    points = (
        alt.Chart(data)
        .mark_circle(size=90, opacity=0.9)
        .encode(
            x=alt.X(
                "variant:N",
                # The rank, not the best trial's score: the seed's lucky trial put it first beside a pick (rank 1)
                # ranked by its replicate mean (user trial)
                sort=alt.EncodingSortField("rank", order="ascending"),
                title="variant (by rank, the pick first)",
                axis=alt.Axis(labelAngle=-45),
            ),
            y=alt.Y("selection_score:Q", title="selection score", scale=alt.Scale(zero=False)),
            color=alt.Color("status:N"),
            tooltip=[
                "variant_id",
                "status",
                alt.Tooltip("selection_score:Q", format=".4f"),
                alt.Tooltip("test_score:Q", format=".4f"),
            ],
        )
    )
    layers = [points]
    if target is not None:
        layers.append(
            alt.Chart(pd.DataFrame({"target": [target]}))
            .mark_rule(strokeDash=[6, 4], color="#dc2626", size=2)
            .encode(y="target:Q", tooltip=[alt.Tooltip("target:Q", title="target")])
        )
    return alt.layer(*layers).properties(height=260)


def front_chart(board: pd.DataFrame, target: float | None, sign: float = 1.0) -> alt.LayerChart:
    """Each scored variant's best selection score against its cost, the front as a step line, its points ringed.
    Scores as stored (oriented); `sign` -1 draws a min metric's values.

    `board` carries `cost_s` and `on_front` (views/board.py's `with_cost`, through `ralph_ray.front`). One slim data
    set filtered per layer: the chart's share of the page's redraw stays small.
    """
    columns = ["variant_id", "status", "cost_s", "selection_score", "test_score", "on_front"]
    data = as_values(board.dropna(subset=["selection_score", "cost_s"])[columns].sort_values("cost_s"), sign)
    target = None if target is None else sign * target
    base = alt.Chart(data).encode(
        # From zero: a variant that cost twice as much sits twice as far right.
        x=alt.X("cost_s:Q", title="cost of the best trial (s)", scale=alt.Scale(zero=True)),
        y=alt.Y("selection_score:Q", title="selection score", scale=alt.Scale(zero=False)),
    )
    tooltip = [
        "variant_id",
        "status",
        alt.Tooltip("cost_s:Q", title="cost s", format=".1f"),
        alt.Tooltip("selection_score:Q", format=".4f"),
        alt.Tooltip("test_score:Q", format=".4f"),
        alt.Tooltip("on_front:N", title="on the front"),
    ]
    layers = [
        base.transform_filter(alt.datum.on_front).mark_line(interpolate="step-after", color="#111827"),
        # The front's points ringed in the same layer (a layer costs the redraw ~15 ms of altair's own work).
        base.mark_point(filled=True, size=110, opacity=0.9, stroke="#111827").encode(
            color=alt.Color("status:N", legend=alt.Legend(symbolStrokeWidth=0)),
            strokeWidth=alt.condition(alt.datum.on_front, alt.value(2.5), alt.value(0)),
            tooltip=tooltip,
        ),
    ]
    if target is not None:
        layers.append(
            alt.Chart(pd.DataFrame({"target": [target]}))
            .mark_rule(strokeDash=[6, 4], color="#dc2626", size=2)
            .encode(y="target:Q", tooltip=[alt.Tooltip("target:Q", title="target")])
        )
    return alt.layer(*layers).properties(height=300)


def effects_chart(effects: pd.DataFrame) -> alt.LayerChart:
    """Mean delta per intervention with its 95% interval (the interventions table, drawn)."""
    data = effects.dropna(subset=["mean_delta"]).assign(
        label=lambda d: d["intervention"] + " | " + d["diagnosis"].fillna("-")
    )
    y = alt.Y(
        "label:N",
        sort=alt.EncodingSortField("mean_delta", order="descending"),
        title=None,
        axis=alt.Axis(labelLimit=320),
    )
    rules = (
        alt.Chart(data)
        .mark_rule()
        .encode(y=y, x=alt.X("ci_low:Q", title="delta in selection score (95% Student-t interval)"), x2="ci_high:Q")
    )
    points = (
        alt.Chart(data)
        .mark_point(filled=True, size=70)
        .encode(
            y=y,
            x="mean_delta:Q",
            color=alt.Color("task:N"),
            tooltip=[
                "task",
                "intervention",
                "diagnosis",
                "n",
                alt.Tooltip("mean_delta:Q", format="+.4f"),
                alt.Tooltip("win_rate:Q", format=".0%"),
            ],
        )
    )
    zero = alt.Chart(pd.DataFrame({"x": [0.0]})).mark_rule(color="#9ca3af").encode(x="x:Q")
    return alt.layer(zero, rules, points).properties(height=alt.Step(26))  # a fixed band per row: never squashed


@dataclass(frozen=True)
class Budget:
    """One safeguard: what was used against its limit (None: no limit set)."""

    name: str
    used: float
    limit: float | None
    unit: str

    @property
    def share(self) -> float | None:
        """Used / limit, clipped to [0, 1] (None without a limit)."""
        return None if not self.limit else min(1.0, max(0.0, self.used / self.limit))

    def text(self) -> str:
        """'used / limit unit', or 'used unit (no limit)'."""
        fmt = (lambda v: f"{v:,.0f}") if self.unit in ("s", "tokens", "cycles") else (lambda v: f"{v:,.4g}")
        return (
            f"{fmt(self.used)} / {fmt(self.limit)} {self.unit}"
            if self.limit
            else f"{fmt(self.used)} {self.unit} (no limit)"
        )


def budgets(config: dict[str, Any], spent: dict[str, Any], elapsed_s: float, cycle: int) -> list[Budget]:
    """The campaign's safeguards (from its config) against what it spent (the `budgets` view)."""
    guards = config.get("safeguards") or {}
    return [
        Budget("cycles", cycle, guards.get("max_cycles"), "cycles"),
        Budget("campaign time", elapsed_s, guards.get("campaign_time_s"), "s"),
        Budget("agent tokens", float(spent.get("tokens") or 0), guards.get("tokens_per_campaign"), "tokens"),
        Budget("agent cost", float(spent.get("cost") or 0), guards.get("cost_per_campaign"), "cost"),
        Budget("trial hours", float(spent.get("trial_hours") or 0), None, "h"),
    ]
