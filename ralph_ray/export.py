"""`python -m ralph_ray export RUN_ID [VARIANT] [--search] [--out DIR]`: the campaign's result (or a named variant) as
a self-contained bundle.

Which training it ships: where the campaign's final training scored (`safeguards.final_share`), its winner as it
trained there (the code with what the final added, its knobs, its longer budget, which `reproduce.py` gives the
trainer); else, or with `--search`, the leaderboard's rank 1 as the search ran it (its best search trial). A named
variant ships its own final trial where it has a scored one, else its best search trial.

The bundle holds the variant's trainer with that trial's knobs written in, its `program.md`, the diff against
the seed, its scores (with the replicates' mean and 95% Student-t interval where there are any), the knobs, the
lineage with each step's interventions, the run's config and environment, the best trial's checkpoint where one was
kept, a model card, and `reproduce.py`, which prepares the task's data, trains the variant by hand and scores it as the
campaign did (ralph_ray must be importable: the trainer's helper and the frozen scoring live there).
"""

from __future__ import annotations

import json
import math
import shutil
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import duckdb
import pandas as pd

from ralph_ray import sql
from ralph_ray.environment import ENV_FILE
from ralph_ray.finals import final_winner, worse_than_search
from ralph_ray.kb import open_reader
from ralph_ray.knobs import read_knobs, rewrite_knobs
from ralph_ray.noise import Sample, half_width
from ralph_ray.report import fetch_rows
from ralph_ray.rundir import CampaignError
from ralph_ray.scoring import clip_interval
from ralph_ray.variants import final_code_dir, unified_diff

TRAINER = "trainer"  # the bundle's folder with the trainer's files
TRAIN_FILE = "train.py"
CONFIDENCE = 0.95  # the replicates' interval, as the leaderboard's ci_low/ci_high
REPRODUCE = '''"""Train this exported variant by hand and score it as the campaign did: python reproduce.py [--seed N].

Needs ralph_ray importable (pip install -e <the ralph_ray checkout>): the trainer imports its small helper
(ralph_ray.harness), the data comes from the task's frozen preparation, and the scores from the frozen metric.
"""

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from omegaconf import OmegaConf

from ralph_ray import harness
from ralph_ray.config import to_config
from ralph_ray.scoring import score_predictions
from ralph_ray.tasks import prepare_splits
from ralph_ray.tasks.base import write_public

HERE = Path(__file__).resolve().parent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seed", type=int, default=json.loads((HERE / "scores.json").read_text())["seed"])
    parser.add_argument("--work", type=Path, default=HERE / "work", help="where the data and predictions go")
    args = parser.parse_args()
    cfg = to_config(OmegaConf.load(HERE / "config.yaml"))
    splits = prepare_splits(cfg)  # the same frozen splits as the campaign (same task, data config and seed)
    data, work = args.work / "data", args.work
    write_public(splits, data, cfg.task.name)
    threads = str(max(1, int(cfg.resources.cpu)))
    env = {**os.environ, harness.ENV_DATA_DIR: str(data), harness.ENV_SEED: str(args.seed),
           harness.ENV_METRICS_FILE: str(work / "metrics.jsonl"),
           harness.ENV_PREDICTIONS_FILE: str(work / "predictions.npz"),
           "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}
    recorded = json.loads((HERE / "scores.json").read_text())
    budget_s = recorded.get("budget_s") or cfg.trial.budget_s  # a final training's own budget, else the search's
    if budget_s is not None:
        env[harness.ENV_BUDGET_S] = str(budget_s)
    subprocess.run([sys.executable, "train.py"], cwd=HERE / "trainer", env=env, check=True)
    labels = splits.labels()
    scores = score_predictions(work / "predictions.npz", labels)
    sign = labels.metric.sign  # scores are oriented (a min metric's are -value): printed as the metric's values
    metric = (recorded.get("metric") or {}).get("name") or labels.metric.name
    shown = lambda score: "-" if score is None else f"{score:.4f}"  # noqa: E731
    # For a reader, with the metric named (stderr); the JSON line on stdout keeps its keys for scripts
    print(f"selection {metric} {shown(sign * scores.selection)} (recorded {shown(recorded['selection_score'])}), "
          f"test {metric} {shown(sign * scores.test)} (recorded {shown(recorded['test_score'])})", file=sys.stderr)
    print(json.dumps({"selection_score": sign * scores.selection, "test_score": sign * scores.test,
                      "recorded_selection_score": recorded["selection_score"],
                      "recorded_test_score": recorded["test_score"], "metric": metric}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
'''


class ExportError(CampaignError):
    """A run or variant that cannot be exported; the message names the fix."""


@dataclass(frozen=True)
class Step:
    """One variant on the way from the seed to the exported one."""

    variant_id: str
    parent_id: str | None
    cycle: int
    status: str | None
    interventions: list[str]
    step: str  # the lineage view's text for this step (`batchnorm`, `knobs`, `seed`)
    path: str  # and for the steps from the seed (`seed > batchnorm > knobs`)
    diagnosis: str | None
    rationale: str | None
    selection_score: float | None
    files_dir: Path


def run_config(run: pd.Series) -> dict[str, Any]:
    """The runs row's config as a dict; {} where it has none (None, or NaN as pandas may give a missing value)."""
    config = run.get("config")
    return json.loads(str(config)) if pd.notna(config) and config else {}


def export(
    kb_root: Path, run_id: str, variant_id: str | None = None, out: Path | None = None, search: bool = False
) -> Path:
    """Write the bundle of `variant_id` (default: the final training's winner, else the leaderboard's rank 1; see the
    module's docstring) and return its folder; `search`: as the search ran it, never a final trial."""
    con = open_reader(kb_root)
    run = con.execute(sql.RUN, [run_id]).fetchdf()
    if run.empty:
        raise ExportError(
            f"no campaign {run_id} in the knowledge base {kb_root}: check the run id "
            "(`python -m ralph_ray status`) and --kb"
        )
    run_dir = Path(str(run.iloc[0]["run_dir"]))
    finals = [] if search else fetch_rows(con, sql.FINAL_TRIAL, [run_id])
    final = final_winner([f for f in finals if variant_id in (None, f["variant_id"])])
    variant_id = variant_id or (final["variant_id"] if final else None)
    board = (
        con.execute(sql.LEADERBOARD_ROW, [run_id, variant_id])
        if variant_id
        else con.execute(sql.LEADERBOARD_FOR_RUN, [run_id, 1])
    ).fetchdf()
    if board.empty or board.iloc[0]["selection_score"] is None or math.isnan(board.iloc[0]["selection_score"]):
        raise ExportError(
            f"no scored variant {variant_id or '(best)'} in run {run_id}: pick one from "
            f"`python -m ralph_ray status {run_id}` (it needs a completed trial)"
        )
    best = board.iloc[0]
    chain = _lineage(con, run_id, str(best["variant_id"]))
    variant, seed = chain[-1], chain[0]
    out = (out or run_dir / "export" / variant.variant_id).resolve()
    if out.exists():
        shutil.rmtree(out)
    trainer = out / TRAINER
    edited = final and final["final_added"]  # the final ran a copy with additions
    code = final_code_dir(run_dir, variant.variant_id) if edited else variant.files_dir
    if not code.is_dir():
        raise ExportError(
            f"the final training's code of {variant.variant_id} is missing ({code}): export the search's with --search"
        )
    shutil.copytree(code, trainer)
    knobs = json.loads((final["knobs"] if final else best["best_knobs"]) or "{}")
    train = trainer / TRAIN_FILE
    present = read_knobs(train.read_text())
    train.write_text(rewrite_knobs(train.read_text(), {k: v for k, v in knobs.items() if k in present}))
    (out / "diff_vs_seed.patch").write_text(unified_diff(seed.files_dir, trainer))
    trial = _trial(con, run_id, str(final["trial_id"] if final else best["best_trial_id"]))
    task = run_config(run.iloc[0]).get("task") or {}
    scores = (
        _final_scores(final, best)
        if final
        else _scores(con, run_id, variant.variant_id, best, trial, (task.get("metric"), task.get("direction")))
    )
    # Scores are stored oriented (a min metric's as -value); the bundle shows the metric's own values (user trial:
    # an MSE read "selection: -0.0341" under "higher is better").
    sign = -1.0 if task.get("direction") == "min" else 1.0
    scores = _as_values(scores, sign, task)
    chain = [replace(s, selection_score=None if s.selection_score is None else sign * s.selection_score) for s in chain]
    if final:  # a final that scored below the search's best of its variant still ships by default: said
        warning = worse_than_search(final, best.to_dict(), lambda score: sign * score)
        scores["final_training"]["warning"] = warning and warning.replace("RUN_ID", run_id)
    _write_json(out / "scores.json", scores)
    _write_json(out / "knobs.json", knobs)
    _write_json(out / "lineage.json", [_step_json(s) for s in chain])
    for name in ("config.yaml", ENV_FILE):
        if (run_dir / name).exists():
            shutil.copy2(run_dir / name, out / name)
    checkpoint = Path(trial["work_dir"]) / "checkpoint"
    if trial["work_dir"] and checkpoint.is_dir():
        shutil.copytree(checkpoint, out / "checkpoint")
    (out / "reproduce.py").write_text(REPRODUCE)
    budget_s = (run_config(run.iloc[0]).get("trial") or {}).get("budget_s")
    (out / "README.md").write_text(_card(run, chain, knobs, scores, (out / "checkpoint").exists(), budget_s))
    return out


def shipped_warning(bundle: Path) -> str | None:
    """What the bundle's scores.json warns of (a final training that scored below the search's best of its
    variant), for the console after an export; None when nothing."""
    scores = json.loads((bundle / "scores.json").read_text())
    return (scores.get("final_training") or {}).get("warning")


def _lineage(con: duckdb.DuckDBPyConnection, run_id: str, variant_id: str) -> list[Step]:
    """The variants from the seed down to `variant_id`, in that order."""
    rows = {r.variant_id: r for r in con.execute(sql.VARIANT_LINEAGE, [run_id]).fetchdf().itertuples()}
    chain: list[Step] = []
    current: str | None = variant_id
    while current is not None and current in rows and len(chain) < 10_000:
        r = rows[current]
        chain.append(
            Step(
                r.variant_id,
                _text(r.parent_id),
                int(r.cycle),
                _text(r.status),
                json.loads(r.interventions or "[]"),
                str(r.step),
                str(r.path),
                _text(r.diagnosis),
                _text(r.rationale),
                _float(r.selection_score),
                Path(str(r.files_dir)),
            )
        )
        current = _text(r.parent_id)
    if not chain:
        raise ExportError(f"variant {variant_id} has no record in run {run_id}: is the KB complete?")
    return chain[::-1]


def _trial(con: duckdb.DuckDBPyConnection, run_id: str, trial_id: str) -> dict[str, Any]:
    trials = con.execute(sql.TRIALS_FOR_RUN, [run_id]).fetchdf()
    row = trials[trials["trial_id"] == trial_id]
    return {} if row.empty else row.iloc[0].to_dict()


def _scores(
    con: duckdb.DuckDBPyConnection,
    run_id: str,
    variant_id: str,
    best: Any,
    trial: dict[str, Any],
    metric: tuple[str | None, str | None] = (None, None),
) -> dict:
    """The recorded scores of the best trial, and its replicates' mean with a 95% Student-t interval where n >= 2.

    The replicates are the ones the leaderboard counts (fresh seeds of the variant's best knobs, `noise`), so the
    interval is its ci_low/ci_high, clipped as it is to the range of a built-in `metric` (name, direction:
    accuracy's [0, 1]; `clipped` says so); the best search trial is not one of them (it was picked for its luck too).
    """
    replicates = con.execute(sql.EXPORT_REPLICATES, [run_id, variant_id]).fetchall()
    spread: dict[str, Any] = {"n": len(replicates), "seeds": [int(r[2]) for r in replicates], "confidence": CONFIDENCE}
    for i, name in enumerate(("selection", "test")):
        sample = Sample.of([r[i] for r in replicates])
        half = half_width(sample, CONFIDENCE)
        if sample.mean is not None and half is not None:
            low, high, clipped = clip_interval(sample.mean - half, sample.mean + half, *metric)
            spread[name] = {
                "mean": sample.mean,
                "sd": sample.sd,
                "n": sample.n,
                "ci95": [low, high],
                "clipped": clipped,
            }
    return {
        "variant_id": variant_id,
        "trial_id": str(best["best_trial_id"]),
        "selection_score": _float(best["selection_score"]),
        "test_score": _float(best["test_score"]),
        "seed": int(trial.get("seed", 0)),
        "epochs": int(trial.get("epochs", 0)),
        "trials_of_variant": int(best["trials"]),
        "replicates": spread,
    }


def _final_scores(final: dict[str, Any], best: Any) -> dict:
    """A final trial's recorded scores, its budget (reproduce.py gives it to the trainer) and the variant's best search
    trial beside them; no replicates (one long run: the variant's replicates trained its search budget)."""
    return {
        "variant_id": str(final["variant_id"]),
        "trial_id": str(final["trial_id"]),
        "selection_score": _float(final["selection_score"]),
        "test_score": _float(final["test_score"]),
        "seed": int(final["seed"] or 0),
        "epochs": int(final["epochs"] or 0),
        "trials_of_variant": int(best["trials"]),
        "budget_s": _float(final["final_budget_s"]),  # None in a KB from before it was recorded: the search's
        "final_training": {
            # safeguards.final_additions that applied, in order: ["cosine", "shift", "deepen"]
            "added": final["final_added"].split(" + ") if final["final_added"] else [],
            "train_seconds": _float(final["train_seconds"]),
            "search_best": {
                "trial_id": str(best["best_trial_id"]),
                "selection_score": _float(best["selection_score"]),
                "test_score": _float(best["test_score"]),
            },
        },
        "replicates": {"n": 0, "seeds": [], "confidence": CONFIDENCE, "why_none": "one long run, not replicated"},
    }


def _as_values(scores: dict[str, Any], sign: float, task: dict[str, Any]) -> dict[str, Any]:
    """`scores` (oriented, as the KB stores them) as the metric's own values (`sign` -1: a min metric's, stored as
    -value), with the metric named: what scores.json, the model card and reproduce.py show."""

    def value(score: Any) -> Any:
        return None if score is None else sign * score

    out = {**scores, "selection_score": value(scores["selection_score"]), "test_score": value(scores["test_score"])}
    replicates = dict(scores["replicates"])
    for name in ("selection", "test"):
        if name in replicates:  # the mean and interval flip with the sign; the spread (sd) does not
            spread = replicates[name]
            replicates[name] = {
                **spread,
                "mean": value(spread["mean"]),
                "ci95": sorted(value(v) for v in spread["ci95"]),
            }
    out["replicates"] = replicates
    if "final_training" in scores:
        search = scores["final_training"]["search_best"]
        search = {
            **search,
            "selection_score": value(search["selection_score"]),
            "test_score": value(search["test_score"]),
        }
        out["final_training"] = {**scores["final_training"], "search_best": search}
    direction = task.get("direction") or "max"
    out["metric"] = {"name": task.get("metric") or "accuracy", "direction": direction}
    out["scores_are"] = f"the metric's own values ({'lower' if direction == 'min' else 'higher'} is better)"
    return out


def _card(
    run: Any,
    chain: list[Step],
    knobs: dict[str, Any],
    scores: dict[str, Any],
    checkpoint: bool,
    budget_s: float | None = None,
) -> str:
    """The bundle's README: what it is, how it scored, how it came to be, how to run it (`budget_s`: the search
    trials' `trial.budget_s`, None where the campaign set none)."""
    r, v = run.iloc[0], chain[-1]
    rep = scores["replicates"]
    steps = "\n".join(
        f"| {s.cycle} | `{s.variant_id}` | {s.step} | "
        f"{s.diagnosis or '-'} | {'-' if s.selection_score is None else f'{s.selection_score:.4f}'} |"
        for s in chain
    )
    extra = f", `checkpoint/` (trial `{scores['trial_id']}`'s)" if checkpoint else ""
    knob_lines = "\n".join(f"- `{k} = {v!r}`" for k, v in knobs.items())
    how = _trained(scores, budget_s)
    metric = scores["metric"]
    return f"""# Variant {v.variant_id} of campaign {r["run_id"]} ({r["experiment"]}, task {r["task"]})

Exported by `python -m ralph_ray export`. Path from the seed: **{v.path}**.

## Scores (frozen evaluation: {metric["name"]}, {"lower" if metric["direction"] == "min" else "higher"} is better)

- selection: {scores["selection_score"]:.4f} (trial `{scores["trial_id"]}`); {_interval(rep, "selection")}
- test: {"-" if scores["test_score"] is None else f"{scores['test_score']:.4f}"} (scored once, never used to select);
  {_interval(rep, "test")}

{how}

## Knobs written into `trainer/train.py`

{knob_lines or "- (none)"}

## Lineage

| cycle | variant | interventions | diagnosis | selection |
| --- | --- | --- | --- | --- |
{steps}

## Files

- `trainer/`: the variant's files (`train.py` with the knobs above, `program.md`)
- `diff_vs_seed.patch`: everything that differs from the seed trainer, knobs included
- `scores.json`, `knobs.json`, `lineage.json` (with each step's rationale), `config.yaml` (the campaign's config),
  `env.json` (Python, packages, git commit, hardware it ran on){extra}

## Run it

```
pip install -e /path/to/ralph_ray      # the trainer's helper and the frozen data preparation and metric
python reproduce.py                    # prepares the data under work/, trains, prints selection/test scores
```

Or by hand: `python -m ralph_ray.prepare` with the campaign's task and data settings, then
`RALPH_DATA_DIR=<printed dir> python trainer/train.py` (predictions go to `predictions.npz`).
Scores reproduce within the noise of one training run (seed {scores["seed"]}; GPU kernels are not bit-exact).
"""


def _trained(scores: dict[str, Any], budget_s: float | None = None) -> str:
    """Which training the bundle ships: the campaign's final training (how long, what it added) or the search's (with
    the search trials' budget where `trial.budget_s` was set)."""
    final = scores.get("final_training")
    if final is None:
        # Named only where set (user trial: the card cited `trial.budget_s` for a campaign that set none)
        budget = (
            f"a {budget_s:g}-s budget, `trial.budget_s` of the campaign's config"
            if budget_s is not None
            else "no time budget: the trainer's own epochs"
        )
        return f"Trained as the search ran it: the variant's best search trial ({budget})."
    budget = "" if scores.get("budget_s") is None else f" of a {scores['budget_s']:.0f}-s budget"
    seconds = "-" if final["train_seconds"] is None else f"{final['train_seconds']:.0f}"
    added = (
        f", its code with {' + '.join(final['added'])} added (`safeguards.final_additions`)" if final["added"] else ""
    )
    search = final["search_best"]
    test = "-" if search["test_score"] is None else f"{search['test_score']:.4f}"
    warning = f"\n\n**Warning**: {final['warning']}." if final.get("warning") else ""
    return (
        f"Trained by the campaign's final training (`safeguards.final_share`): {scores['epochs']} epoch(s), "
        f"{seconds} s of training{budget}{added}; `reproduce.py` gives the trainer that budget. The same variant's "
        f"best search trial (`{search['trial_id']}`): selection {search['selection_score']:.4f}, test {test} "
        f"(`export --search` ships that one).{warning}"
    )


def _interval(replicates: dict[str, Any], name: str) -> str:
    """`replicates: mean 0.9712, 95% CI [0.9650, 0.9774] (Student t, n=3)`, or why there is no interval."""
    spread = replicates.get(name)
    if spread is None:
        why = replicates.get("why_none") or f"{replicates['n']} replicate(s) at the best knobs: an interval needs 2"
        return f"no interval ({why})"
    low, high = spread["ci95"]
    # at n=2 the t interval of an accuracy near 1 reaches past 1: clipped to the metric's range, and said
    clipped = ", clipped to the metric's range" if spread.get("clipped") else ""
    return (
        f"replicates: mean {spread['mean']:.4f}, 95% CI [{low:.4f}, {high:.4f}] (Student t, n={spread['n']}{clipped})"
    )


def _step_json(s: Step) -> dict[str, Any]:
    return {
        "variant_id": s.variant_id,
        "parent_id": s.parent_id,
        "cycle": s.cycle,
        "status": s.status,
        "interventions": s.interventions,
        "diagnosis": s.diagnosis,
        "rationale": s.rationale,
        "selection_score": s.selection_score,
    }


def _write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2, default=str) + "\n")


def _text(value: Any) -> str | None:
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else str(value)


def _float(value: Any) -> float | None:
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else float(value)
