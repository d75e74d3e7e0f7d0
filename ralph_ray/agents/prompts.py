"""The LLM and CLI agents' prompts: markdown programs in `agents/prompts/`, plus the data they are shown.

A prompt file holds the rules and the output format; `{{name}}` marks where the engine puts a value.
The data (code, curves, lineage, measured effects) is formatted here, the same way for every backend.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from ralph_ray import PROJECT_ROOT
from ralph_ray.agents.base import (
    AgentConfigError,
    Diagnosis,
    InterventionEffect,
    ParentView,
    Recommendation,
    TrialSummary,
)
from ralph_ray.agents.siblings import bred_from, refusals
from ralph_ray.sql import PROBE_METRICS, RL_METRICS
from ralph_ray.variants import mutable_names

PROMPTS_DIR = PROJECT_ROOT / "agents" / "prompts"
MAX_TRIALS_SHOWN = 6  # the best trials of a parent, by selection score
MAX_CURVE_ROWS = 16  # longer curves are thinned evenly (first and last epoch always kept)
_PLACEHOLDER = re.compile(r"\{\{\s*([a-z_]+)\s*\}\}")


def render(name: str, **values: str) -> str:
    """`agents/prompts/<name>.md` with its `{{placeholders}}` filled; one the engine lacks is a config error."""
    path = PROMPTS_DIR / f"{name}.md"
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise AgentConfigError(f"prompt file {path} is missing: restore it from the repository") from None
    unknown = sorted({m.group(1) for m in _PLACEHOLDER.finditer(text)} - set(values))
    if unknown:
        raise AgentConfigError(
            f"{path} uses {', '.join('{{' + u + '}}' for u in unknown)}; "
            f"the engine fills only {', '.join('{{' + v + '}}' for v in sorted(values))}"
        )
    return _PLACEHOLDER.sub(lambda m: values[m.group(1)], text)


def diagnoses_list() -> str:
    """The diagnosis values an analyst may use, for the prompt."""
    return ", ".join(d.value for d in Diagnosis)


def budget_note(budget_s: float | None) -> str:
    """What a trial's compute is held to, for the analyst: under `trial.budget_s` more EPOCHS buy nothing."""
    if budget_s is None:
        return (
            "Each trial trains for its `EPOCHS` (more epochs cost more time; the campaign's budget is shared by all "
            "trials)."
        )
    return (
        f"Every trial trains for the same {budget_s:g} s of wall time (trial.budget_s), whatever its `EPOCHS`: the "
        "trainer's epochs end when `harness.time_left()` runs out. Do not recommend longer training or a higher "
        "`EPOCHS`: it changes nothing. A gain must come from better training code within the same time (a faster "
        "epoch counts, since it fits more steps into the budget)."
    )


def task_note(mirror_invariant: bool) -> str:
    """What the task forbids, appended to its program: on digits a mirrored 2 is no longer a 2, so flips teach noise."""
    if mirror_invariant:
        return ""
    return (
        "\n\nMirroring an input changes its label in this task (task.mirror_invariant=false): never recommend a "
        "horizontal flip or any augmentation that mirrors inputs."
    )


def show_files(folder: Path) -> str:
    """The mutable files of a variant, each in a fenced block under its path."""
    blocks = []
    for name in mutable_names(folder):
        blocks.append(f"### {name}\n\n```python\n{(folder / name).read_text(errors='replace').rstrip()}\n```")
    return "\n\n".join(blocks)


def show_recommendation(rec: Recommendation) -> str:
    """One recommendation as the coder reads it."""
    lines = [f"**{rec.intervention}** (answers: {_value(rec.diagnosis)})", "", f"Why: {rec.rationale}"]
    if rec.details:
        lines += ["", f"What to change: {rec.details}"]
    return "\n".join(lines)


def show_parent(parent: ParentView, effects: list[InterventionEffect], catalog: list[tuple[str, str]]) -> str:
    """Everything the analyst may know about a parent, as markdown: code, trials and curves, lineage, KB effects."""
    score = "not scored yet" if parent.selection_score is None else f"{parent.selection_score:.4f}"
    parts = [
        f"# Parent {parent.variant_id}: selection score {score}",
        "## Lineage (changes from the seed, oldest first)\n\n" + (", ".join(parent.lineage) or "the seed itself"),
        "## Code (the best trial's knobs written in)\n\n" + show_files(parent.files_dir),
        "## Trials\n\n" + _show_trials(parent.trials),
        "## What the knowledge base measured (selection-score change of children over parents)\n\n"
        + _show_effects(effects),
    ]
    if parent.children:
        parts.append(_show_children(parent))
    if catalog:
        parts.append(
            "## Catalog interventions (names to reuse when one fits)\n\n"
            + "\n".join(f"- `{n}`: {d}" for n, d in catalog)
        )
    return "\n\n".join(parts)


def _show_children(parent: ParentView) -> str:
    """This parent's children so far in the run: what the gate refused for it and what was bred from it, as the
    offline analyst weighs them (agents/siblings.py), so an LLM does not propose a refused edit again."""
    refused, bred = refusals(parent), bred_from(parent)
    lines = [f"- `{c.variant_id}`: {' + '.join(c.interventions) or '-'}, {c.status}" for c in parent.children]
    advice = []
    if refused:
        advice.append(
            "Refused by the validation gate for this very code (do not propose again unless you change the approach):\n"
            + "\n".join(f"- `{name}`: {why}" for name, why in refused.items())
        )
    if bred:
        advice.append(f"Already bred from this parent (propose again only if nothing else fits): {', '.join(bred)}")
    return "\n\n".join(["## This parent's children so far in this run", "\n".join(lines), *advice])


def _show_trials(trials: list[TrialSummary]) -> str:
    if not trials:
        return "no trial recorded"
    ranked = sorted(trials, key=lambda t: (t.selection_score is None, -(t.selection_score or 0.0)))
    out = []
    for trial in ranked[:MAX_TRIALS_SHOWN]:
        score = "-" if trial.selection_score is None else f"{trial.selection_score:.4f}"
        reason = f" ({trial.reason})" if trial.reason else ""
        head = f"### {trial.trial_id}: {trial.status.value}, selection {score}{reason}"
        out.append(f"{head}\n\nknobs: {json.dumps(trial.knobs, sort_keys=True)}\n\n{_show_curve(trial)}")
    if len(ranked) > MAX_TRIALS_SHOWN:
        out.append(f"({len(ranked) - MAX_TRIALS_SHOWN} more trials not shown)")
    return "\n\n".join(out)


def _show_curve(trial: TrialSummary) -> str:
    points = trial.curve
    if not points:
        return "no epoch reported"
    if len(points) > MAX_CURVE_ROWS:
        step = (len(points) - 1) / (MAX_CURVE_ROWS - 1)
        points = [points[round(i * step)] for i in range(MAX_CURVE_ROWS)]
    # The probes (`harness.probes`), RL telemetry (agents.rl) and every other metric the trainer named (a
    # search.metric such as val_f1), each only where a curve carries it: the LLM reads what the heuristic reads.
    fields = [name for name in (*PROBE_METRICS, *RL_METRICS) if any(getattr(p, name) is not None for p in points)]
    others = sorted({name for p in points for name in p.others})
    header = ["epoch", "train_loss", "val_loss", "val_acc", "lr", "grad_norm", "seconds", *fields, *others]
    rows = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for p in points:
        values = [p.train_loss, p.val_loss, p.val_acc, p.lr, p.grad_norm, p.epoch_seconds]
        values += [getattr(p, name) for name in fields] + [p.others.get(name) for name in others]
        rows.append("| " + " | ".join([str(p.epoch)] + [_num(v) for v in values]) + " |")
    return "\n".join(rows)


def _show_effects(effects: list[InterventionEffect]) -> str:
    if not effects:
        return "nothing measured yet"
    rows = [
        "| intervention | diagnosis | children scored | mean delta | win rate | trained, unscored (stopped, crashed) |",
        "|---|---|---|---|---|---|",
    ]
    for e in sorted(effects, key=lambda e: (e.diagnosis, -(e.mean_delta or 0.0))):
        measured = f"{e.count} | {_num(e.mean_delta)} | {_num(e.win_rate)}"
        rows.append(f"| {e.intervention} | {e.diagnosis} | {measured} | {e.unscored} |")
    return "\n".join(rows)


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


def _value(diagnosis: Diagnosis | str) -> str:
    return diagnosis.value if isinstance(diagnosis, Diagnosis) else str(diagnosis)
