"""Which code interventions apply to which trainer, and (with --compare) the offline agent against knob search.

    python bench/interventions.py                      # the applicability table (seconds; the last comparison kept)
    python bench/interventions.py --compare            # + campaigns: agent=heuristic vs agent=none per trainer
    python bench/interventions.py --compare --trainers digits module_loader --seeds 0 --cycles 3   # reduced

The table covers the differently written fixture trainers (tests/fixtures/trainers) and the seed trainers.
The comparison runs, per trainer and campaign seed, one campaign with the offline (heuristic) agent and one with
agent=none (knob search only) at the same budget (same cycles, same trials per cycle), and reports the best
variant's test accuracy. The full figure asked for is 5 cycles x 3 seeds on every trainer; on 2 shared cores that
is hours, so what ran is recorded exactly (trainers, seeds, cycles) in bench/results/interventions.json.
A fixture runs as a task folder: a copy of trainers/digits (its prepare and program.md) with the fixture's train.py.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from _common import RESULTS, config, rows, save
from omegaconf import OmegaConf

from ralph_ray import PROJECT_ROOT, sql
from ralph_ray.agents.catalog import NotApplicable, check_files, load_catalog
from ralph_ray.agents.transforms import TRANSFORMS
from ralph_ray.campaign import run
from ralph_ray.kb import open_reader
from ralph_ray.knobs import read_knobs

FIXTURES = PROJECT_ROOT / "tests" / "fixtures" / "trainers"
SEEDS = PROJECT_ROOT / "trainers"


def trainer_dirs() -> dict[str, Path]:
    """Fixture trainers and seed trainers by name."""
    found = {p.parent.name: p.parent for p in sorted(FIXTURES.glob("*/train.py"))}
    return found | {name: SEEDS / name for name in ("digits", "cifar10")}


# Users' trainers kept as test fixtures (the table only: the comparison runs single-file trainers on digits): a
# train_one_epoch(...) layout, a model class in models.py, a Lightning-style fit(), a regression MLP.
USERS = {
    "fmnist_cnn": PROJECT_ROOT / "tests" / "fixtures" / "images28" / "fmnist_cnn",
    "block_cnn (models.py)": PROJECT_ROOT / "tests" / "fixtures" / "multifile" / "block_cnn",
    "lit_classifier": PROJECT_ROOT / "tests" / "fixtures" / "lightning" / "lit_classifier",
    "store_sales": PROJECT_ROOT / "tests" / "fixtures" / "regression" / "store_sales",
}


def table() -> dict[str, dict[str, str | None]]:
    """Per trainer: each catalog entry -> None when it applies (to train.py, or a layer one to the model's class in
    the models.py it imports), else the reason: the analyst's own decision (check_files)."""
    catalog = load_catalog()
    out: dict[str, dict[str, str | None]] = {}
    for name, folder in (trainer_dirs() | USERS).items():
        files = {path.name: path.read_text() for path in sorted(folder.glob("*.py"))}
        out[name] = {}
        for entry in catalog:
            try:
                check_files(entry, files)
                out[name][entry.name] = None
            except NotApplicable as reason:
                out[name][entry.name] = str(reason).removeprefix(f"{entry.name}: ")
    return out


def table_lines(applies: dict[str, dict[str, str | None]]) -> list[str]:
    catalog = load_catalog()
    code = [e.name for e in catalog if e.transform is not None]
    names = list(applies)
    lines = ["| intervention | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for entry in catalog:
        kind = "code" if entry.transform else "knob"
        cells = ["yes" if applies[t][entry.name] is None else "-" for t in names]
        lines.append(f"| `{entry.name}` ({kind}) | " + " | ".join(cells) + " |")
    counts = [sum(applies[t][n] is None for n in code) for t in names]
    lines.append("| **code interventions that apply** | " + " | ".join(f"**{c}**" for c in counts) + " |")
    return lines


def task_folder(root: Path, trainer: str) -> Path:
    """A task folder for a trainer: the seed's own folder, or the digits task with the fixture's train.py."""
    folder = trainer_dirs()[trainer]
    if folder.parent == SEEDS:
        return folder
    task = root / "tasks" / trainer
    shutil.copytree(SEEDS / "digits", task, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(folder / "train.py", task / "train.py")
    return task


def foreign_knobs(task: Path) -> list[str]:
    """The task.yaml's search-space knobs the task's train.py lacks (a fixture names its knobs its own way: `BATCH`,
    not `BATCH_SIZE`): both arms search without them, as config validation would refuse them."""
    space = OmegaConf.load(task / "task.yaml").get("search", {}).get("space", {}) or {}
    knobs = read_knobs((task / "train.py").read_text())
    return [name for name in space if name not in knobs]


def campaign(root: Path, trainer: str, task: Path, agent: str, seed: int, cycles: int) -> dict[str, object]:
    start = time.perf_counter()
    # plateau_cycles past the cycle count: both arms get the same budget (every cycle runs)
    outcome = run(
        config(
            root,
            f"{trainer}-{agent}-{seed}",
            f"safeguards.max_cycles={cycles}",
            f"agent={agent}",
            f"agent.seed={seed}",
            f"search.seed={seed}",
            f"task.trainer={task}",
            f"safeguards.plateau_cycles={cycles + 1}",
            *(f"~search.space.{name}" for name in foreign_knobs(task)),
        )
    )
    con = open_reader(outcome.kb_root)
    board = rows(con, sql.BENCH_LEADERBOARD, [outcome.run_id])
    seed_row = next(r for r in board if r["status"] == "seed")
    interventions = rows(con, sql.INTERVENTIONS_FOR_RUN, [outcome.run_id])
    return {
        "run_id": outcome.run_id,
        "stop_reason": outcome.stop_reason,
        "minutes": round((time.perf_counter() - start) / 60, 2),
        "seed_test": seed_row["test_score"],
        # board[0] is the leaderboard's rank 1: the best replicate mean where any variant was replicated
        "best_test": board[0]["test_score"],
        "best_mean_test": board[0]["mean_test_score"],  # over its replicates (fresh seeds): less luck than one trial
        "best_replicates": board[0]["replicates"],
        "best_interventions": board[0]["interventions"],
        "picked_by_best_trial_test": max(board, key=lambda r: r["selection_score"] or -1.0)["test_score"],
        "children": [{"intervention": i["intervention"], "delta": i["delta"]} for i in interventions],
    }


KEPT = "(comparison recorded by `--compare` on"


def previous_comparison() -> tuple[dict[str, object], list[str]]:
    """The last recorded comparison (its json keys and markdown section), which a table-only run keeps as it was:
    the table takes seconds, the comparison hours."""
    json_path, md_path = RESULTS / "interventions.json", RESULTS / "interventions.md"
    if not json_path.exists() or not md_path.exists():
        return {}, []
    old = json.loads(json_path.read_text())
    if "comparison" not in old:
        return {}, []
    figures = {k: old[k] for k in ("comparison", "comparison_ran") if k in old}
    figures["comparison_recorded"] = old.get("comparison_recorded", old["date"])
    text = md_path.read_text()
    start, end = text.find("Offline agent vs knob search"), text.rfind("\n- date:")
    if start < 0:
        return figures, []
    section = "\n".join(line for line in text[start:end].splitlines() if not line.startswith(KEPT)).strip()
    note = f"{KEPT} {figures['comparison_recorded']}; this run rebuilt only the table)"
    return figures, ["", *section.splitlines(), "", note]


def compare(trainers: list[str], seeds: list[int], cycles: int) -> dict[str, object]:
    root = Path(tempfile.mkdtemp(prefix="bench-interventions-"))
    out: dict[str, object] = {}
    for trainer in trainers:
        task = task_folder(root, trainer)
        runs = {
            agent: [campaign(root, trainer, task, agent, s, cycles) for s in seeds] for agent in ("heuristic", "none")
        }
        summary = {}
        for agent, done in runs.items():
            tests = [r["best_test"] for r in done]
            means = [r["best_mean_test"] for r in done if r.get("best_mean_test") is not None]
            summary[agent] = {
                "best_test_mean": round(statistics.mean(tests), 4),
                "best_test_std": round(statistics.stdev(tests), 4) if len(tests) > 1 else None,
                "replicate_test_mean": round(statistics.mean(means), 4) if means else None,
                "best_trial_pick_test_mean": round(statistics.mean(r["picked_by_best_trial_test"] for r in done), 4),
            }
        out[trainer] = {"summary": summary, "runs": runs}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compare", action="store_true", help="also run agent=heuristic vs agent=none campaigns")
    parser.add_argument("--trainers", nargs="+", default=None, help="trainers to compare (default: all but cifar10)")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--cycles", type=int, default=5)
    parser.add_argument("--name", default="interventions", help="results file name (a partial comparison apart)")
    args = parser.parse_args()
    applies = table()
    figures: dict[str, object] = {
        "transforms": sorted(TRANSFORMS),
        "applicability": applies,
        "code_interventions_applying": {
            t: sum(why is None for n, why in row.items() if load_catalog().get(n).transform)
            for t, row in applies.items()
        },
    }
    lines = [
        "Which catalog entries apply (`-`: not applicable; the reasons are in interventions.json):",
        "",
        *table_lines(applies),
    ]
    if args.compare:
        trainers = args.trainers or [t for t in trainer_dirs() if t != "cifar10"]
        full = (
            args.seeds == [0, 1, 2]
            and args.cycles == 5
            and set(trainers) == {t for t in trainer_dirs() if t != "cifar10"}
        )
        figures["comparison"] = compare(trainers, args.seeds, args.cycles)
        figures["comparison_ran"] = {
            "trainers": trainers,
            "campaign_seeds": args.seeds,
            "cycles": args.cycles,
            "reduced": not full,
        }
        lines += [
            "",
            (
                f"Offline agent vs knob search ({'full' if full else 'REDUCED'}: trainers {', '.join(trainers)}; "
                f"campaign seeds {args.seeds}; {args.cycles} cycles):"
            ),
            "",
        ]
        for trainer, result in figures["comparison"].items():  # type: ignore[union-attr]
            s = result["summary"]
            lines.append(
                f"- {trainer}: heuristic best test {s['heuristic']['best_test_mean']} vs agent=none "
                f"{s['none']['best_test_mean']} "
                f"(std {s['heuristic']['best_test_std']} / {s['none']['best_test_std']}); "
                f"the picks' replicate test means {s['heuristic']['replicate_test_mean']} vs "
                f"{s['none']['replicate_test_mean']}; picked by best trial (the old rank) "
                f"{s['heuristic']['best_trial_pick_test_mean']} vs {s['none']['best_trial_pick_test_mean']}"
            )
    else:
        kept, kept_lines = previous_comparison()
        figures |= kept
        lines += kept_lines
    save(args.name, figures, lines)


if __name__ == "__main__":
    main()
