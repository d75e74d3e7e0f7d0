"""Shared helpers for the benchmarks: configs in a temp dir, result files, versions."""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from importlib.metadata import version
from pathlib import Path

from ralph_ray.config import Config, KnobSpace, SpaceKind, load_config

# BENCH_RESULTS=<dir>: write the result files there instead (a GPU machine whose files come back from one folder).
RESULTS = Path(os.environ.get("BENCH_RESULTS") or Path(__file__).resolve().parent / "results")


def machine() -> str:
    """The machine in words: architecture, CPU cores and the GPU torch sees (or none)."""
    import torch  # here, not at import: most benchmarks never need it

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    return f"{platform.machine()}, {os.cpu_count()} CPU cores, {gpu}"


def config(root: Path, name: str, *overrides: str) -> Config:
    """A config whose runs and KB live under `root` (one cycle unless the overrides say otherwise)."""
    return load_config(
        [
            f"paths.runs={root / 'runs'}",
            f"paths.kb={root / 'kb'}",
            f"run_id={name}",
            "safeguards.max_cycles=1",
            # The barrier loop, as every figure recorded before auto became the default; the clock benches pass
            # population.mode=async themselves.
            "population.mode=generations",
            # The 2 x 3 shape every figure was recorded with: left null, a short campaign_time_s would run 1 x 1.
            "population.parents=2",
            "population.children_per_parent=3",
            *overrides,
        ]
    )


def fixed_knobs(cfg: Config, **knobs: object) -> Config:
    """Make every trial use the same knob values (a one-value choice per knob)."""
    cfg.search.space = {name: KnobSpace(type=SpaceKind.choice, values=[value]) for name, value in knobs.items()}
    return cfg


def save(name: str, figures: dict, lines: list[str], command: str | None = None) -> None:
    """Write bench/results/<name>.json and .md with the machine, versions and command (default: this script's own
    command line, its arguments included)."""
    meta = {
        "date": time.strftime("%Y-%m-%d"),
        "command": command or " ".join(["python", f"bench/{Path(sys.argv[0]).name}", *sys.argv[1:]]),
        "machine": machine(),
        "python": sys.version.split()[0],
        **{pkg: version(pkg) for pkg in ("ray", "optuna", "torch", "duckdb")},
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps({**meta, **figures}, indent=2, default=str))
    body = "\n".join(f"- {k}: {v}" for k, v in meta.items())
    (RESULTS / f"{name}.md").write_text(f"# {name}\n\n" + "\n".join(lines) + f"\n\n{body}\n")
    print("\n".join(lines))


def rows(con: object, query: str, params: list[object]) -> list[dict[str, object]]:
    """Query results as dicts."""
    cursor = con.execute(query, params)  # type: ignore[attr-defined]
    names = [d[0] for d in cursor.description]
    return [dict(zip(names, row)) for row in cursor.fetchall()]
