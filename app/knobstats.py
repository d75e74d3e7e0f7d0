"""Knob insight over a campaign's trials: knobs as columns, Optuna's parameter importance, parallel coordinates
and slice charts. Pure functions of DataFrames (no Streamlit)."""

from __future__ import annotations

import json
import math
import warnings
from typing import Any

import altair as alt
import pandas as pd

SCORE = "selection_score"
VARIANT = "variant"  # the variant as one more (categorical) parameter in a campaign-wide importance
MIN_TRIALS = 3  # fewer scored trials say nothing about importance
MAX_TRIALS = 1000  # the newest trials that importance reads
TARGET_QUANTILE = 0.1  # importance for reaching the best tenth of the scores (PED-ANOVA's gamma')
MIN_TOP = 3  # ... but at least this many trials in that top group (and at most half): one trial is no distribution
LOG_SPAN = 100.0  # a positive knob whose values span this factor is read on a log scale


def parse(text: Any) -> dict[str, Any]:
    """A trial's knobs JSON as a dict ({} for NULL or bad JSON)."""
    if not isinstance(text, str) or not text:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


def with_knobs(frame: pd.DataFrame, column: str) -> tuple[pd.DataFrame, list[str]]:
    """`frame` with one column per knob found in its JSON `column` (sorted by name), and those names."""
    parsed = [parse(t) for t in frame[column]] if column in frame else []
    names = sorted({name for knobs in parsed for name in knobs})
    if not names:
        return frame, []
    knobs = pd.DataFrame([{n: k.get(n) for n in names} for k in parsed], index=frame.index)
    return pd.concat([frame.drop(columns=[n for n in names if n in frame]), knobs], axis=1), names


def is_numeric(values: pd.Series) -> bool:
    """True when every value is a number (not a bool)."""
    return bool(values.dropna().map(lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)).all())


def varying(table: pd.DataFrame, names: list[str]) -> list[str]:
    """The knobs that take more than one value among these trials (a constant knob explains nothing)."""
    return [n for n in names if table[n].dropna().astype(str).nunique() > 1]


def numeric_knobs(table: pd.DataFrame, names: list[str]) -> list[str]:
    """The varying knobs whose values are all numbers (the ones an axis can show)."""
    return [n for n in varying(table, names) if is_numeric(table[n])]


def _log_scale(values: pd.Series) -> bool:
    low, high = float(values.min()), float(values.max())
    return low > 0 and high / low >= LOG_SPAN


def importances(table: pd.DataFrame, names: list[str], minimize: bool = False) -> dict[str, float]:
    """Each parameter's importance for reaching the best tenth of selection scores (`top_quantile`), by Optuna's
    PED-ANOVA evaluator over a study rebuilt from these scored trials (the newest MAX_TRIALS); {} with fewer than
    MIN_TRIALS, no knob varying or every score equal. Not fANOVA: its forest took 2.3 s on 200 trials of a
    real-shaped KB and 10-38 s on 200 noisy ones (a campaign's scores mostly are), on every redraw of a live page;
    PED-ANOVA takes milliseconds."""
    import optuna  # only the Knobs page pays for the import
    from optuna.distributions import CategoricalDistribution, FloatDistribution

    scored = table.dropna(subset=[SCORE]).tail(MAX_TRIALS)
    params = [n for n in varying(scored, names) if scored[n].notna().all()]
    # Equal scores have no best group: PED-ANOVA would give every parameter 0, shown as equal shares of 1.
    if len(scored) < MIN_TRIALS or not params or scored[SCORE].nunique() < 2:
        return {}
    distributions: dict[str, Any] = {}
    for name in params:
        values = scored[name]
        if is_numeric(values):
            low, high = float(values.min()), float(values.max())
            distributions[name] = FloatDistribution(low, high, log=_log_scale(values))
        else:
            distributions[name] = CategoricalDistribution(sorted(values.astype(str).unique()))
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="minimize" if minimize else "maximize")
    for rec in scored.to_dict("records"):
        values = {
            n: (float(rec[n]) if isinstance(distributions[n], FloatDistribution) else str(rec[n])) for n in params
        }
        study.add_trial(optuna.trial.create_trial(params=values, distributions=distributions, value=float(rec[SCORE])))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        evaluator = optuna.importance.PedAnovaImportanceEvaluator(target_quantile=top_quantile(len(scored)))
    found = optuna.importance.get_param_importances(study, evaluator=evaluator)
    return {name: float(value) for name, value in found.items()}


def top_quantile(trials: int) -> float:
    """The share of trials that counts as "the best": TARGET_QUANTILE, widened to MIN_TOP trials, at most half."""
    return min(0.5, max(TARGET_QUANTILE, MIN_TOP / trials))


def importance_chart(found: dict[str, float]) -> alt.Chart:
    """Importances as bars, most important on top."""
    data = pd.DataFrame({"parameter": list(found), "importance": list(found.values())})
    return (
        alt.Chart(data)
        .mark_bar()
        .encode(
            x=alt.X("importance:Q", title="importance (PED-ANOVA, sums to 1)", scale=alt.Scale(domain=[0, 1])),
            y=alt.Y("parameter:N", sort="-x", title=None),
            tooltip=["parameter", alt.Tooltip("importance:Q", format=".3f")],
        )
        .properties(height=alt.Step(28))  # a fixed band per parameter: never squashed
    )


def parallel_chart(table: pd.DataFrame, names: list[str]) -> alt.Chart:
    """Parallel coordinates: one line per scored trial across its knobs (each axis spans that knob's range, log
    where wide), coloured by selection score."""
    scored = table.dropna(subset=[SCORE]).reset_index(drop=True)
    rows = []
    for name in names:
        values = scored[name].astype(float)
        shown = values.map(math.log10) if _log_scale(values) else values
        low, high = float(shown.min()), float(shown.max())
        for i, (value, position) in enumerate(zip(values, shown, strict=True)):
            rows.append(
                {
                    "trial_id": scored.at[i, "trial_id"],
                    "knob": name,
                    "value": value,
                    SCORE: scored.at[i, SCORE],
                    "position": 0.5 if high <= low else (position - low) / (high - low),
                }
            )
    data = pd.DataFrame(rows)
    return (
        alt.Chart(data)
        .mark_line(point=True, opacity=0.7)
        .encode(
            x=alt.X("knob:N", sort=names, title=None, axis=alt.Axis(labelAngle=0)),
            y=alt.Y("position:Q", title="low → high (each knob's own range)", axis=alt.Axis(labels=False)),
            color=alt.Color(f"{SCORE}:Q", title="selection", scale=alt.Scale(scheme="viridis")),
            detail="trial_id:N",
            tooltip=["trial_id", "knob", alt.Tooltip("value:Q", format=".4g"), alt.Tooltip(f"{SCORE}:Q", format=".4f")],
        )
        .properties(height=300)
    )


def slice_chart(table: pd.DataFrame, names: list[str]) -> alt.ConcatChart:
    """A slice plot: selection score against each knob's value, one panel per knob (log x where wide)."""
    # Only the columns a panel draws: the whole trials table (knobs JSON, reasons, paths) went to the browser once
    # per panel and was most of the Knobs page's payload (150 kB of 190 kB on a 200-trial campaign).
    scored = table.dropna(subset=[SCORE])[["trial_id", "variant_id", "cycle", SCORE, *names]]
    panels = []
    for name in names:
        values = scored[name].astype(float)
        panels.append(
            alt.Chart(scored[["trial_id", "variant_id", "cycle", SCORE]].assign(value=values))
            .mark_circle(size=60, opacity=0.75)
            .encode(
                x=alt.X(
                    "value:Q", title=name, scale=alt.Scale(type="log" if _log_scale(values) else "linear", zero=False)
                ),
                y=alt.Y(f"{SCORE}:Q", title="selection score", scale=alt.Scale(zero=False)),
                color=alt.Color("cycle:O", title="cycle"),
                tooltip=[
                    "trial_id",
                    "variant_id",
                    alt.Tooltip("value:Q", title=name, format=".4g"),
                    alt.Tooltip(f"{SCORE}:Q", format=".4f"),
                ],
            )
            .properties(width=220, height=200)
        )
    return alt.concat(*panels, columns=3)
