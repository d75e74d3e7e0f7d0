"""The final report of a campaign: `report/final_report.md` and `report/progress.png`, from the KB and run dir."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from ralph_ray import sql
from ralph_ray.environment import summary
from ralph_ray.finals import final_winner, worse_than_search
from ralph_ray.front import cost_front, cost_seconds
from ralph_ray.gate import reached_outside
from ralph_ray.kb import DamagedRunError, open_reader, own_damaged
from ralph_ray.liveness import locating
from ralph_ray.variants import unified_diff

KEPT_LIKE = ("kept", "seed")


def write_report(kb_root: Path, run_id: str, run_dir: Path) -> Path:
    """Write the report folder for one run and return the markdown's path.

    A damaged part of the run's own refuses (DamagedRunError) before anything is written: the report of the rest would
    replace a whole one (user trial: `trials: 0` over a report of 10, exit 0). Another run's is left out, as status
    leaves it out."""
    refuse_damaged(kb_root, run_id, run_dir)
    con = open_reader(kb_root)
    out = run_dir / "report"
    out.mkdir(parents=True, exist_ok=True)
    run = _one(con, sql.RUN, [run_id])
    budget = _one(con, sql.BUDGET_FOR_RUN, [run_id])
    decisions = fetch_rows(con, sql.DECISIONS_FOR_RUN, [run_id])
    board = fetch_rows(con, sql.LEADERBOARD_FOR_RUN, [run_id, 10])
    interventions = fetch_rows(con, sql.INTERVENTIONS_FOR_RUN, [run_id])
    variants = {v["variant_id"]: v for v in fetch_rows(con, sql.VARIANTS_FOR_RUN, [run_id])}
    timeline = fetch_rows(con, sql.TRIAL_TIMELINE, [run_id])

    config = json.loads(run.get("config") or "{}") if run else {}
    target = (config.get("target") or {}).get("selection_score")
    task = config.get("task") or {}
    # Scores are stored oriented (higher is better); a min metric's are -value: shown here as the metric's values.
    sign, value = metric_values(task)
    plot_progress(timeline, out / "progress.png", sign, task.get("metric"))

    spread = lambda row: replicate_spread(row, value)  # noqa: E731

    metric = f"{task.get('metric') or 'accuracy'}, {'lower' if sign < 0 else 'higher'} is better"
    last = decisions[-1] if decisions else {}
    # A variant with no completed trial is no one's best (user trial: a failed run's report named its seed, 0 done)
    best = board[0] if board and board[0]["selection_score"] is not None else None
    seed_id = next((v for v, row in variants.items() if row.get("status") == "seed"), None)
    kept = [i for i in interventions if i["outcome"] == "kept"]
    seed_row = _one(con, sql.LEADERBOARD_ROW, [run_id, seed_id]) if seed_id else {}
    lines = [
        f"# ralph_ray report: run {run_id}",
        "",
        f"- experiment: {run.get('experiment') if run else '?'} (task {run.get('task') if run else '?'})",
        f"- metric: {metric}",
        f"- target (selection {task.get('metric') or 'score'}): {target if target is not None else 'none'}",
        f"- outcome: {last.get('decision', 'running')} after cycle {last.get('cycle', '-')}, reason "
        f"**{last.get('reason', '-')}** "
        f"(exit code {last.get('exit_code', '-')}): {last.get('rationale', '')}",
        (
            f"- best variant: {best['variant_id']}, selection {_f(value(best['selection_score']))}, "
            f"test {_f(value(best['test_score']))}; over its replicates (fresh seeds, 95% t interval): {spread(best)}"
            if best
            else "- best variant: none (no variant has a completed trial)"
        ),
        f"- seed variant: {seed_id or '-'}, selection {_f(value(seed_row.get('selection_score')))}, test "
        f"{_f(value(seed_row.get('test_score')))} "
        f"(its best knob sample in cycle 1); over its replicates: {spread(seed_row)}",
        f"- Ray auth: {_auth(config)}",
        f"- sandbox: {_sandbox(config)}",
        f"- environment: {summary(run.get('environment') if run else None)}",
        "",
        "## Cost",
        "",
        f"- cycles: {_cycles(last, budget)}, trials: {budget.get('trials', 0) if budget else 0}, "
        f"trial-hours: {_f(budget and budget['trial_hours'])}",
        f"- wall time: {_f(last.get('elapsed_s'), 0)} s",
        f"- peak memory per trial: {_peak_memory(con.execute(sql.PEAK_MEMORY_FOR_RUN, [run_id]).fetchone())}",
        f"- agent tokens: {budget.get('tokens', 0) if budget else 0}, cost: {_f(budget and budget['cost'])}, "
        f"kept improvements: {len(kept)}, cost per kept improvement: "
        f"{_f((budget['cost'] / len(kept)) if budget and kept else None)}",
        "",
        "## Leaderboard (top 10 variants)",
        "",
        "Selection and test: the variant's best search trial. Replicates: its best knobs run again with fresh seeds, "
        "the mean selection score with a 95% Student-t interval (what the keep verdict compared; `-`: not replicated). "
        "Ranked by the replicate mean where a variant has one (a best trial is the luckiest of its samples), then by "
        "the best trial; a discarded variant (its verdict found it no better than its parent) ranks below every other "
        "whatever its scores.",
        "",
        "| rank | variant | parent | interventions | status | selection | test | replicates | "
        "trials (done/stopped/failed) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in board:
        lines.append(
            f"| {row['rank']} | {row['variant_id']} | {row['parent_id'] or '-'} | {_names(row['interventions'])} | "
            f"{row['status']}{UNJUDGED if _unjudged(row) else ''}"
            f"{CAUGHT if any(map(reached_outside, refusals(variants.get(row['variant_id'])))) else ''} | "
            f"{_f(value(row['selection_score']))} | {_f(value(row['test_score']))} | {spread(row)} | "
            f"{row['completed']}/{row['stopped_early']}/{row['failed']} |"
        )
    if any(_unjudged(row) for row in board):
        lines += ["", UNJUDGED_NOTE]
    lines += [
        "",
        "## Interventions",
        "",
        "Parent and child: the scores the child's verdict compared (`compared`; siblings judged before and after "
        "their parent's replicates were in compared different ones), `-` where it compared none (refused by the "
        "gate, crashed, or no trial completed).",
        "",
        "| cycle | variant | intervention | diagnosis | parent | child | gain (+ is better) | compared | outcome |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in interventions:
        lines.append(
            f"| {row['cycle']} | {row['variant_id']} | {row['intervention']} | {row['diagnosis']} | "
            f"{_f(value(row['parent_score']))} | "
            f"{_f(value(row['child_score']))} | {_f(row['delta'])} | {COMPARED.get(row.get('basis'), '-')} | "
            f"{row['outcome']} |"
        )
    lines += refused_section(list(variants.values()))
    finals = fetch_rows(con, sql.FINAL_TRIAL, [run_id])
    searched = {t["variant_id"]: _one(con, sql.LEADERBOARD_ROW, [run_id, t["variant_id"]]) for t in finals}
    lines += final_section(finals, searched, value)
    lines += cost_section(
        fetch_rows(con, sql.TRIALS_FOR_RUN, [run_id]),
        dict(con.execute(sql.TRAIN_SECONDS_PER_TRIAL, [run_id]).fetchall()),
        value,
    )
    lines += ["", "## Decisions", ""]
    lines += [f"- cycle {d['cycle']}: {d['decision']} ({d['reason']}): {d['rationale']}" for d in decisions]
    lines += ["", "## Best variant vs the seed", ""]
    if best is None:
        lines.append("None: no variant has a completed trial.")
    elif best and seed_id and best["variant_id"] != seed_id and best["variant_id"] in variants and seed_id in variants:
        diff = unified_diff(Path(variants[seed_id]["files_dir"]), Path(variants[best["variant_id"]]["files_dir"]))
        lines += ["```diff", diff.rstrip("\n"), "```"]
    else:
        lines.append("The seed is the best variant (no diff).")
    lines += ["", "![progress](progress.png)", ""]
    path = out / "final_report.md"
    path.write_text("\n".join(lines))
    return path


def refused_section(variants: list[dict[str, Any]]) -> list[str]:
    """Every variant the gate refused a draft of, with each refusal; one caught reaching outside its work dir (the
    engine, the KB, held-out labels) is named so, whether or not a later attempt passed (variants.refusals)."""
    found = [(v, refusals(v)) for v in variants]
    found = [(v, said) for v, said in found if said]
    if not found:
        return []
    lines = [
        "",
        "## What the gate refused",
        "",
        "Each refused draft (`variants.refusals`; a rejected child's reason where its KB predates that column). An "
        "engine import, a path outside the work dir or a sandbox breach in the smoke run is what reading the "
        "held-out labels looks like: a child caught so on one attempt may have passed on the next.",
        "",
    ]
    for v, said in found:
        flag = " **reached outside its work dir**" if any(map(reached_outside, said)) else ""
        lines.append(f"- {v['variant_id']} (+{_names(v.get('interventions'))}), {v['status']}:{flag} {'; '.join(said)}")
    return lines


def refusals(variant: dict[str, Any] | None) -> list[str]:
    """A variants row's gate refusals (`refusals`), or a rejected child's reason where none are recorded."""
    if not variant:
        return []
    said = json.loads(variant.get("refusals") or "[]")
    if not said and variant.get("status") == "rejected" and variant.get("rejected_by") in (None, "gate"):
        said = [variant["reason"]] if variant.get("reason") else []
    return [" ".join(line.split()) for line in said]  # one line each: a smoke run's traceback has many


def final_section(
    finals: list[dict[str, Any]], searched: dict[str, dict[str, Any]], value: Callable[[Any], Any]
) -> list[str]:
    """The final training of the pick (safeguards.final_share): what it trained, for how long, what it scored, beside
    the same variant's best search trial (`searched`: its leaderboard row; a resume's new pick has its own)."""
    if not finals:
        return []
    lines = [
        "",
        "## Final training of the pick",
        "",
        "After the search, the rank-1 variant's best knobs trained once more for the time `safeguards.final_share` "
        "kept for it (with `safeguards.final_candidates` above 1, beside the next best (variant, knobs) that train "
        "other code, the slots split between them; search trials had `trial.budget_s` each), with "
        "`safeguards.final_additions` (a schedule, augmentation, a hidden layer, flips at test time) added to its "
        "code where each applies. Its scores are not ranked with the search's: it trained longer than any of them.",
        "",
    ]
    best = final_winner(finals)
    if best is not None and len(finals) > 1:
        lines += [
            f"The long run's winner by selection: **{best['variant_id']}** (trial {best['trial_id']}), test "
            f"**{_f(value(best['test_score']))}**.",
            "",
        ]
    if best is not None:
        lines += [
            "`python -m ralph_ray export RUN_ID` exports it as it trained here (its code with what was added, its "
            "knobs, and `reproduce.py` with its budget); `--search` exports the search's rank 1 instead.",
            "",
        ]
    for trial in finals:
        what = f" (its code with {trial['final_added']} added)" if trial.get("final_added") else ""
        lines.append(
            f"- trial {trial['trial_id']} of {trial['variant_id']}{what}: {trial['status']}"
            f"{' (' + trial['reason'] + ')' if trial['reason'] else ''}, {trial['epochs']} epoch(s), "
            f"{_f(trial['train_seconds'], 0)} s of training ({_f(trial['seconds'], 0)} s wall): selection "
            f"{_f(value(trial['selection_score']))}, test **{_f(value(trial['test_score']))}**"
        )
        best = searched.get(trial["variant_id"]) or {}
        lines.append(
            f"  - the same variant's best search trial: selection {_f(value(best.get('selection_score')))}, test "
            f"{_f(value(best.get('test_score')))}"
        )
        if warning := worse_than_search(trial, best, value):
            lines.append(f"  - **warning**: {warning}")
    return lines


@dataclass(frozen=True)
class Point:
    """A scored search trial as the score-against-cost front reads it."""

    trial_id: str
    variant_id: str
    cost_s: float  # training seconds where the trainer reported them (train_seconds), else the trial's wall seconds
    selection: float  # oriented: higher is better
    test: float | None


def _cycles(last: dict[str, Any], budget: dict[str, Any]) -> int:
    """The cycles the run went through: the last decision's cycle, as the outcome line and `status` count them; the
    KB's cycles rows where no decision was made yet. An async run names each decision by the deepest judged
    generation (decision.generation_decided), so its last decision's cycle matches its cycles rows."""
    if last.get("cycle") is not None:
        return int(last["cycle"])
    return int(budget.get("cycles", 0)) if budget else 0


def _peak_memory(row: tuple[Any, ...] | None) -> str:
    """`trainer RSS up to 412 MiB (median 388, 12 trial(s)); GPU up to 2,310 MiB (12 trial(s))`, or `not recorded`."""
    if not row or not row[2]:
        return "not recorded"
    rss_max, rss_median, rss_n, gpu_max, gpu_n = row
    gpu = f"GPU up to {gpu_max:,.0f} MiB ({gpu_n} trial(s))" if gpu_n else "no GPU memory (no trial used CUDA)"
    return f"trainer RSS up to {rss_max:,.0f} MiB (median {rss_median:,.0f}, {rss_n} trial(s)); {gpu}"


def cost_section(trials: list[dict[str, Any]], train_s: dict[str, float], value: Any) -> list[str]:
    """The report's score-against-cost front over the run's scored search trials (replicates left out)."""
    points = [
        Point(
            t["trial_id"],
            t["variant_id"],
            cost_seconds(train_s.get(t["trial_id"]), t["seconds"]) or 0.0,
            t["selection_score"],
            t["test_score"],
        )
        for t in trials
        if t["selection_score"] is not None and not t.get("replicate") and not t.get("final")
    ]
    lines = [
        "",
        "## Score against cost",
        "",
        "Each score with what it cost: the trial's training seconds where its trainer reported them (`train_seconds`; "
        "under `trial.budget_s` every trial has the same budget), else its wall seconds. The front: the trials no "
        "other trial beats at the same or lower cost, cheapest first.",
        "",
    ]
    if not points:
        return [*lines, "No scored trial yet."]
    lines += ["| cost s | selection | test | trial | variant |", "| --- | --- | --- | --- | --- |"]
    lines += [
        f"| {p.cost_s:.1f} | {_f(value(p.selection))} | {_f(value(p.test))} | {p.trial_id} | {p.variant_id} |"
        for p in cost_front(points, cost=lambda p: p.cost_s, score=lambda p: p.selection)
    ]
    costs = sorted(p.cost_s for p in points)
    lines += [
        "",
        f"{len(points)} scored trial(s); cost from {costs[0]:.1f} s to {costs[-1]:.1f} s, median "
        f"{costs[len(costs) // 2]:.1f} s.",
    ]
    return lines


def running_best(timeline: list[dict[str, Any]]) -> list[tuple[dict[str, Any], float]]:
    """Each scored search trial in time order with the best selection score so far (oriented). Replicates are left
    out, as the cost front leaves them out: a fresh seed of knobs already ranked is luck, not progress (user trial:
    the line peaked at a replicate's 0.8586 above the 0.8490 that status and the report named best)."""
    best, running = [], float("-inf")
    for t in timeline:
        if t["selection_score"] is None or t.get("replicate"):
            continue
        running = max(running, t["selection_score"])
        best.append((t, running))
    return best


def plot_progress(timeline: list[dict[str, Any]], path: Path, sign: float = 1.0, metric: str | None = None) -> None:
    """Every completed trial as a point by time, kept vs discarded variants in two colours (replicates hollow), the
    best search trial so far as a step line; scores as the metric's values (`sign` -1: a min metric's, stored as
    -value)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=110)
    done = [t for t in timeline if t["selection_score"] is not None]
    if done:
        start = min(t["written_at"] for t in timeline)

        def minutes(t: dict[str, Any]) -> float:
            return (t["written_at"] - start).total_seconds() / 60

        for flag, colour, label in (
            (True, "tab:green", "kept variant (or seed)"),
            (False, "tab:gray", "discarded variant"),
        ):
            for replicate in (False, True):
                shown = [
                    t
                    for t in done
                    if (t["variant_status"] in KEPT_LIKE) is flag and bool(t.get("replicate")) is replicate
                ]
                if not shown and replicate:
                    continue
                ax.scatter(
                    [minutes(t) for t in shown],
                    [sign * t["selection_score"] for t in shown],
                    s=18,
                    c="none" if replicate else colour,
                    edgecolors=colour,
                    label=f"{label}, replicate" if replicate else label,
                    alpha=0.8,
                )
        steps = running_best(done)
        if steps:
            ax.step(
                [minutes(t) for t, _ in steps],
                [sign * best for _, best in steps],
                where="post",
                color="tab:blue",
                label="best search trial so far",
            )
        ax.legend(loc="best" if sign < 0 else "lower right")
    else:
        ax.text(0.5, 0.5, "no completed trial yet", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("minutes since the first trial ended")
    ax.set_ylabel(f"selection {metric or 'score'} ({'lower' if sign < 0 else 'higher'} is better)")
    ax.set_title("campaign progress")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


# A discarded child no trial of which completed was never judged (decision.NO_SCORE_REASON): the table says so, and
# how to have such children judged (a user's table showed `discarded` and `-` with the reason only in events.jsonl).
UNJUDGED = " (not judged: no trial completed)"
UNJUDGED_NOTE = (
    "Not judged: ASHA (or the campaign's own stop) ended every trial of the variant before its last epoch, so it was "
    "discarded without a score; to have such children judged, raise `scheduler.grace_period` or "
    "`population.trials_per_child`."
)


# What an interventions row's delta compares (records.EffectBasis), as the report's `compared` column says it.
COMPARED = {
    "replicates": "replicate means",
    "best_trial": "best trials",
    "best_trial_vs_replicates": "child's best trial vs parent's replicate mean",
}
# A variant the gate caught reaching outside its work dir on some attempt (refused_section lists what it did).
CAUGHT = " (caught reaching outside at the gate)"


def _unjudged(row: dict[str, Any]) -> bool:
    return row["status"] == "discarded" and not row["completed"] and bool(row["stopped_early"])


def fetch_rows(con: Any, query: str, params: list[Any]) -> list[dict[str, Any]]:
    """A query's rows as dicts by column name (the report and `status` read the views so)."""
    cursor = con.execute(query, params)
    names = [d[0] for d in cursor.description]
    return [dict(zip(names, row)) for row in cursor.fetchall()]


def _one(con: Any, query: str, params: list[Any]) -> dict[str, Any]:
    rows = fetch_rows(con, query, params)
    return rows[0] if rows else {}


def _auth(config: dict[str, Any]) -> str:
    """The run's Ray auth mode; the explicit opt-out in bold with what it means."""
    mode = (config.get("cluster") or {}).get("auth_mode")
    if mode == "disabled":
        return "**disabled** (cluster.auth_mode=disabled: anyone who reached the campaign's Ray ports could run code)"
    return f"{mode} (every Ray process needed the token)" if mode == "token" else "not recorded"


def _sandbox(config: dict[str, Any]) -> str:
    """How agent-written code ran; the explicit opt-out in bold with what it means."""
    box = config.get("sandbox") or {}
    if box.get("mode") == "none":
        return (
            "**none** (sandbox=none: agent-written code ran as a plain subprocess that could read runs/, kb/ and "
            "the engine, so its scores are not protected against label theft)"
        )
    if box.get("mode") == "bwrap":
        return (
            f"bwrap (work dir, public data and harness only; network {'on' if box.get('network') else 'off'}; "
            f"{box.get('memory_mb')} MiB, {box.get('processes')} processes per run)"
        )
    return "not recorded"


def _names(interventions: str | None) -> str:
    return " + ".join(json.loads(interventions or "[]")) or "-"


def refuse_damaged(kb_root: Path, run_id: str, run_dir: Path) -> None:
    """Raise DamagedRunError naming the damaged parts that hold `run_id`'s rows, the repair, and the command that
    writes the report then (at a campaign's end too, where "this command" would start a campaign); none: return."""
    would = "a report now would leave their rows out, so the report stays as it was"
    command = " ".join(["python -m ralph_ray report", run_id, *locating(run_dir.parent, kb_root)])
    if refusal := own_damaged(kb_root, run_id, would, again=f"write the report with `{command}`"):
        raise DamagedRunError(refusal)


def metric_values(task: dict[str, Any]) -> tuple[float, Callable[[Any], Any]]:
    """(sign, value): how a stored score (oriented, higher is better) reads as the task's metric (a min metric's
    score is -value). The report and `status` both show scores through it."""
    sign = -1.0 if task.get("direction") == "min" else 1.0
    return sign, lambda score: None if score is None else sign * score


def replicate_spread(row: dict[str, Any] | None, value: Callable[[Any], Any] = lambda score: score) -> str:
    """A leaderboard row's replicate mean with its 95% Student-t half-width and n (`value` turns an oriented score
    back into the metric's), or `-` where the variant was not replicated. The report and `status` both print it."""
    if not row or not row.get("replicates"):
        return "-"
    mean, half = _f(value(row["mean_score"])), row.get("half_width")
    if half is None:
        return f"{mean} (n={row['replicates']})"
    clipped = ""
    if row.get("ci_clipped"):  # the t interval left the metric's range (accuracy above 1 at n=2): the view cut it
        low, high = sorted((value(row["ci_low"]), value(row["ci_high"])))
        clipped = f", 95% CI clipped to [{_f(low)}, {_f(high)}]"
    return f"{mean} ± {_f(half)} (n={row['replicates']}{clipped})"


def _f(value: Any, digits: int = 4) -> str:
    return "-" if value is None else f"{value:.{digits}f}"
