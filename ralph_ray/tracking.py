"""Experiment trackers: a finished (or stopped) campaign, as MLflow runs, TensorBoard event files and W&B runs.

What is written comes from the KB, after the campaign's record is complete, through each library's own client:

- MLflow (`MlflowClient`): one run per campaign (config, env.json and the report as artifacts; tag `best_variant`:
  the pick, the leaderboard's rank 1, with its best trial's scores),
  a nested run per variant (lineage, interventions and status as tags, its diff as `diff.patch`, its best scores),
  and a run per trial nested under its variant (knobs and seed as params, every per-epoch metric with the epoch as
  step, the frozen selection and test scores, status and reason as tags). Offline by default: a SQLite store and
  artifacts under `<run_dir>/tracking/mlflow/`, or the server / store at `tracking.mlflow_uri`.
- TensorBoard (tensorboardX's `SummaryWriter`): per trial, every per-epoch metric as a scalar and its knobs with
  the final scores in the HParams tab; per variant, its lineage and diff as text; for the campaign, the config and
  the report as text; under `<run_dir>/tracking/tensorboard/` (`tensorboard --logdir` it).
- Weights & Biases (`wandb.init`): a run per trial (job type `trial`: knobs, seed, variant and cycle as config,
  every per-epoch metric with the epoch as step, the frozen scores in the summary), a run per variant (`variant`:
  lineage and interventions as config, its diff as an artifact) and one for the campaign (`campaign`: its config,
  env.json and the report as an artifact), all in the group `<run_id>` of the project `ralph_ray-<task>`.
  Offline by default (`tracking.wandb_mode=offline`: nothing leaves the machine; `wandb sync` uploads the runs
  under `<run_dir>/tracking/wandb/` later); `tracking.wandb_mode=online` logs straight to W&B once you are logged in.

Why not Ray Tune's logger callbacks: a Tune trial's results hold only what the trainer reported while training;
the frozen scores are computed by the driver after the trial, variants and lineage are not Tune trials, and the
trial config carries the variant's code. Reading the KB gives every tracker the same, complete record, and a run
recorded before tracking was switched on can be published later (`python -m ralph_ray track RUN_ID`).
"""

from __future__ import annotations

import json
import math
import numbers
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb

from ralph_ray import sql
from ralph_ray.config import TrackingConfig
from ralph_ray.environment import ENV_FILE
from ralph_ray.kb import open_reader
from ralph_ray.rundir import CampaignError

TRACKING_DIR = "tracking"
# Every MLflow run this module writes carries its campaign's id (a re-publish replaces them).
RUN_TAG = "ralph_ray.run_id"
KIND_TAG = "ralph_ray.kind"  # campaign | variant | trial
_MLFLOW_BATCH = 100  # MLflow's limit of params per log_batch call is 100, and of metrics 1000
_PARAM_CHARS = 6000  # MLflow's limit on a param value


_PACKAGES = {
    "mlflow": ("mlflow", "mlflow-skinny"),
    "tensorboard": ("tensorboardX", "tensorboardX"),
    "wandb": ("wandb", "wandb"),
}


class TrackingError(CampaignError):
    """A tracker is asked for but its package is missing, or the run is not in the KB."""


def check(cfg: TrackingConfig) -> None:
    """Before a campaign starts: every tracker asked for is installed (found, not imported: MLflow takes seconds)."""
    import importlib.util

    if cfg.wandb and cfg.wandb_mode not in WANDB_MODES:
        raise TrackingError(f"tracking.wandb_mode={cfg.wandb_mode!r}: use offline (the default) or online")
    for name in cfg.trackers():
        module, package = _PACKAGES[name]
        if importlib.util.find_spec(module) is None:
            raise TrackingError(
                f"tracking={name} needs {package}: pip install 'ralph_ray[tracking]' "
                f"(or pip install {package}), or drop tracking={name}"
            )


def track_campaign(cfg: TrackingConfig, kb_root: Path, run_id: str, say: Callable[[str], None]) -> dict[str, str]:
    """Publish a recorded campaign to the configured trackers and say where each went (nothing when none is on)."""
    if not cfg.trackers():
        return {}
    written = publish(load(open_reader(kb_root), run_id), cfg.trackers(), cfg.mlflow_uri, cfg.wandb_mode)
    for name, where in written.items():
        say(f"  {name}: {where}")
    return written


@dataclass(frozen=True)
class Trial:
    """One trial as the trackers log it."""

    trial_id: str
    variant_id: str
    cycle: int
    status: str
    reason: str | None
    knobs: dict[str, Any]
    seed: int
    epochs: dict[int, dict[str, float]]  # epoch -> metric -> value
    final: dict[str, float]  # val_metric, selection_score, test_score, seconds (those recorded)


@dataclass(frozen=True)
class Variant:
    """One variant as the trackers log it."""

    variant_id: str
    parent_id: str | None
    cycle: int
    status: str | None
    interventions: list[str]
    path: str | None
    depth: int | None
    diagnosis: str | None
    diff: str
    selection_score: float | None
    test_score: float | None


@dataclass(frozen=True)
class Record:
    """A campaign's complete record, read from the KB and its run dir."""

    run_id: str
    experiment: str
    task: str
    status: str | None
    stop_reason: str | None
    config: str
    run_dir: Path
    variants: list[Variant]
    trials: list[Trial]
    pick: str | None = None  # the leaderboard's rank 1 (by replicate mean where replicated): the best variant

    def files(self) -> dict[str, Path]:
        """The campaign's files worth attaching: its env.json and its report folder's files."""
        found = {ENV_FILE: self.run_dir / ENV_FILE}
        report = self.run_dir / "report"
        found.update({f"report/{p.name}": p for p in sorted(report.glob("*")) if p.is_file()})
        return {name: path for name, path in found.items() if path.exists()}


def load(con: duckdb.DuckDBPyConnection, run_id: str) -> Record:
    """Read one campaign's record (runs row, lineage with diffs, trials with their epochs) from the KB."""
    run = con.execute(sql.RUN, [run_id]).fetchdf()
    if run.empty:
        raise TrackingError(
            f"no campaign {run_id} in the knowledge base: check the run id (`python -m ralph_ray status`) and --kb"
        )
    r = run.iloc[0]
    epochs: dict[str, dict[int, dict[str, float]]] = {}
    for trial_id, epoch, metric, value in con.execute(sql.EPOCHS_FOR_RUN, [run_id]).fetchall():
        if value is not None:
            epochs.setdefault(trial_id, {}).setdefault(int(epoch), {})[metric] = float(value)
    trials = [
        Trial(
            t.trial_id,
            t.variant_id,
            int(t.cycle),
            t.status,
            _text(t.reason),
            json.loads(t.knobs or "{}"),
            int(t.seed),
            epochs.get(t.trial_id, {}),
            {
                k: float(getattr(t, k))
                for k in ("val_metric", "selection_score", "test_score", "seconds")
                if _number(getattr(t, k))
            },
        )
        for t in con.execute(sql.TRIALS_FOR_RUN, [run_id]).fetchdf().itertuples()
    ]
    variants = [
        Variant(
            v.variant_id,
            _text(v.parent_id),
            int(v.cycle),
            _text(v.status),
            json.loads(v.interventions or "[]"),
            _text(v.path),  # the lineage view's `seed > batchnorm > knobs`
            int(v.depth) if _number(v.depth) else None,
            _text(v.diagnosis),
            v.diff or "",
            _float(v.selection_score),
            _float(v.test_score),
        )
        for v in con.execute(sql.VARIANT_LINEAGE, [run_id]).fetchdf().itertuples()
    ]
    return Record(
        run_id,
        str(r["experiment"]),
        str(r["task"]),
        _text(r["status"]),
        _text(r.get("stop_reason")),
        str(r["config"] or "{}"),
        Path(str(r["run_dir"])),
        variants,
        trials,
        next(iter(con.execute(sql.PICK, [run_id]).fetchone() or ()), None),
    )


def publish(
    record: Record, trackers: list[str], mlflow_uri: str | None = None, wandb_mode: str = "offline"
) -> dict[str, str]:
    """Write `record` to each named tracker; returns tracker -> where it was written."""
    writers: dict[str, Callable[[], str]] = {
        "mlflow": lambda: to_mlflow(record, mlflow_uri or default_mlflow_uri(record.run_dir)),
        "tensorboard": lambda: to_tensorboard(record, record.run_dir / TRACKING_DIR / "tensorboard"),
        "wandb": lambda: to_wandb(record, record.run_dir / TRACKING_DIR / "wandb", wandb_mode),
    }
    unknown = sorted(set(trackers) - set(writers))
    if unknown:
        raise TrackingError(
            f"unknown tracker(s) {unknown}: use tracking=mlflow, tracking=tensorboard, tracking=wandb or a list "
            "(tracking=[mlflow,tensorboard])"
        )
    return {name: writers[name]() for name in trackers}


def default_mlflow_uri(run_dir: Path) -> str:
    """The offline store: a SQLite file under the run dir (MLflow 3 keeps its ./mlruns file store for old runs only)."""
    folder = (run_dir / TRACKING_DIR / "mlflow").resolve()
    folder.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{folder / 'mlflow.db'}"


# ---------------------------------------------------------------------------------------------------------------
# MLflow


def to_mlflow(record: Record, uri: str) -> str:
    """Log the campaign, its variants and its trials as MLflow runs (replacing an earlier publish of the same run)."""
    try:
        from mlflow.entities import Metric, Param
        from mlflow.tracking import MlflowClient
    except ImportError as err:
        raise TrackingError(
            "tracking=mlflow needs MLflow: pip install 'ralph_ray[tracking]' (or mlflow-skinny)"
        ) from err
    client = MlflowClient(tracking_uri=uri)
    experiment_id = _experiment(client, f"ralph_ray/{record.experiment}", uri)
    for old in client.search_runs([experiment_id], f"tags.`{RUN_TAG}` = '{record.run_id}'", max_results=50000):
        client.delete_run(old.info.run_id)

    def start(name: str, kind: str, parent: str | None, tags: dict[str, Any]) -> str:
        base = {
            RUN_TAG: record.run_id,
            KIND_TAG: kind,
            "mlflow.runName": name,
            **({"mlflow.parentRunId": parent} if parent else {}),
        }
        run = client.create_run(experiment_id, tags={k: _tag(v) for k, v in {**base, **tags}.items() if v is not None})
        return run.info.run_id

    def finish(run_id: str, params: dict[str, Any], metrics: list[Metric], status: str = "FINISHED") -> None:
        items = [Param(k, _tag(v)[:_PARAM_CHARS]) for k, v in params.items()]
        for i in range(0, max(len(items), len(metrics)), _MLFLOW_BATCH):
            client.log_batch(run_id, metrics=metrics[i : i + _MLFLOW_BATCH], params=items[i : i + _MLFLOW_BATCH])
        client.set_terminated(run_id, status)

    # The campaign's best variant is its pick, as the report, status and export name it: a raw max over best trials
    # named the luckiest single trial's variant instead (user trial: the seed, while rank 1 was its child).
    best = next((v for v in record.variants if v.variant_id == record.pick), None)
    campaign = start(
        record.run_id,
        "campaign",
        None,
        {
            "task": record.task,
            "status": record.status,
            "stop_reason": record.stop_reason,
            "best_variant": best.variant_id if best else None,
        },
    )
    client.log_text(campaign, record.config, "config.json")
    for name, path in record.files().items():
        client.log_artifact(campaign, str(path), str(Path(name).parent) if "/" in name else None)
    by_variant: dict[str, str] = {}
    for v in record.variants:
        run = start(
            v.variant_id,
            "variant",
            campaign,
            {
                "variant_id": v.variant_id,
                "parent_id": v.parent_id,
                "status": v.status,
                "cycle": v.cycle,
                "lineage": v.path,
                "depth": v.depth,
                "diagnosis": v.diagnosis,
                "interventions": " + ".join(v.interventions) or "seed",
            },
        )
        if v.diff:
            client.log_text(run, v.diff, "diff.patch")
        finish(run, {}, _scores(v.selection_score, v.test_score))
        by_variant[v.variant_id] = run
    for t in record.trials:
        run = start(
            t.trial_id,
            "trial",
            by_variant.get(t.variant_id, campaign),
            {
                "trial_id": t.trial_id,
                "variant_id": t.variant_id,
                "cycle": t.cycle,
                "status": t.status,
                "reason": t.reason,
            },
        )
        stamp = int(time.time() * 1000)
        metrics = [
            Metric(name, value, stamp, epoch) for epoch, row in sorted(t.epochs.items()) for name, value in row.items()
        ]
        metrics += [Metric(name, value, stamp, max(t.epochs, default=0)) for name, value in t.final.items()]
        finish(run, {**t.knobs, "seed": t.seed}, metrics, "FINISHED" if t.status == "completed" else "KILLED")
    finish(
        campaign,
        {"experiment": record.experiment, "task": record.task, "run_id": record.run_id},
        _scores(best.selection_score if best else None, best.test_score if best else None),
    )
    return uri


def _experiment(client: Any, name: str, uri: str) -> str:
    """The MLflow experiment's id, created with its artifacts beside a local store (not in the cwd)."""
    found = client.get_experiment_by_name(name)
    if found is not None:
        return found.experiment_id
    location = None
    if uri.startswith("sqlite:///"):
        location = (Path(uri.removeprefix("sqlite:///")).parent / "artifacts").resolve().as_uri()
    return client.create_experiment(name, artifact_location=location)


def _scores(selection: float | None, test: float | None) -> list[Any]:
    from mlflow.entities import Metric

    pairs = (("selection_score", selection), ("test_score", test))
    return [Metric(name, value, int(time.time() * 1000), 0) for name, value in pairs if value is not None]


# ---------------------------------------------------------------------------------------------------------------
# TensorBoard


def to_tensorboard(record: Record, logdir: Path) -> str:
    """Write TensorBoard event files: one folder per trial (scalars, hparams), the variants and the campaign as text."""
    try:
        from tensorboardX import SummaryWriter
    except ImportError as err:
        raise TrackingError("tracking=tensorboard needs tensorboardX: pip install 'ralph_ray[tracking]'") from err
    root = logdir / record.run_id
    if root.exists():  # a re-publish replaces the earlier event files rather than appending a second copy
        import shutil

        shutil.rmtree(root)
    with SummaryWriter(str(root / "campaign")) as writer:
        writer.add_text("config", _code(record.config))
        for name, path in record.files().items():
            if path.suffix in (".md", ".json", ".txt"):
                writer.add_text(name, path.read_text())
        for v in record.variants:
            writer.add_text(f"variant/{v.variant_id}", _variant_text(v))
    for t in record.trials:
        with SummaryWriter(str(root / "trials" / t.trial_id)) as writer:
            for epoch, row in sorted(t.epochs.items()):
                for name, value in row.items():
                    writer.add_scalar(name, value, epoch)
            hparams = {
                k: v
                for k, v in {**t.knobs, "seed": t.seed, "variant": t.variant_id}.items()
                if isinstance(v, (int, float, str, bool))
            }
            # The final scores both as scalars (the Scalars tab) and with the knobs (the HParams tab).
            for name, value in t.final.items():
                writer.add_scalar(f"final/{name}", value, max(t.epochs, default=0))
            writer.add_hparams(hparams, {f"hparam/{k}": v for k, v in t.final.items()}, name=".")
    return str(root)


# ---------------------------------------------------------------------------------------------------------------
# Weights & Biases

WANDB_MODES = ("offline", "online")


def to_wandb(record: Record, root: Path, mode: str = "offline") -> str:
    """Write W&B runs (offline by default: files under `root`, for `wandb sync`); returns where they are."""
    if mode not in WANDB_MODES:
        raise TrackingError(f"tracking.wandb_mode={mode!r}: use offline (the default) or online (after wandb login)")
    try:
        import wandb
    except ImportError as err:
        raise TrackingError("tracking=wandb needs wandb: pip install 'ralph_ray[tracking]'") from err
    folder = root / record.run_id
    if folder.exists():  # a re-publish replaces the earlier offline runs rather than adding a second copy
        import shutil

        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    # Quiet, no system metrics, no code or git capture: the KB already holds the code of every variant.
    settings = wandb.Settings(silent=True, console="off", x_disable_stats=True, save_code=False, disable_git=True)
    common = {
        "project": f"ralph_ray-{record.task}",
        "group": record.run_id,
        "dir": str(folder),
        "mode": mode,
        "settings": settings,
        "reinit": "create_new",
    }

    def artifact_of(name: str, files: dict[str, str | Path]) -> Any:
        artifact = wandb.Artifact(name, type="ralph_ray")
        for file_name, content in files.items():
            if isinstance(content, Path):
                artifact.add_file(str(content), name=file_name)
            else:
                with artifact.new_file(file_name) as handle:
                    handle.write(content)
        return artifact

    config = json.loads(record.config)
    with wandb.init(name=record.run_id, job_type="campaign", config=config, **common) as run:
        run.summary.update({"status": record.status, "stop_reason": record.stop_reason})
        if record.files():
            run.log_artifact(artifact_of(f"{record.run_id}-report", dict(record.files())))
    for v in record.variants:
        config = {
            "variant_id": v.variant_id,
            "parent_id": v.parent_id,
            "cycle": v.cycle,
            "status": v.status,
            "interventions": v.interventions,
            "lineage": v.path,
            "depth": v.depth,
            "diagnosis": v.diagnosis,
        }
        with wandb.init(name=f"variant {v.variant_id}", job_type="variant", config=config, **common) as run:
            run.summary.update({"selection_score": v.selection_score, "test_score": v.test_score})
            if v.diff:
                run.log_artifact(artifact_of(f"{record.run_id}-{v.variant_id}-diff", {"diff.patch": v.diff}))
    for t in record.trials:
        config = {**t.knobs, "seed": t.seed, "variant_id": t.variant_id, "cycle": t.cycle}
        tags = [t.status]
        with wandb.init(
            name=f"trial {t.trial_id}", job_type="trial", config=config, tags=tags, notes=t.reason, **common
        ) as run:
            for epoch, row in sorted(t.epochs.items()):
                run.log({**row, "epoch": epoch}, step=epoch)
            run.summary.update({**t.final, "status": t.status, "reason": t.reason})
    return str(folder)


def _variant_text(v: Variant) -> str:
    lines = [
        f"**{v.variant_id}** ({v.status}), parent {v.parent_id or '-'}, cycle {v.cycle}",
        f"lineage: {v.path or '-'}",
        f"interventions: {' + '.join(v.interventions) or 'seed'}",
        f"selection {v.selection_score}, test {v.test_score}",
    ]
    return "  \n".join(lines) + ("\n\n" + _code(v.diff) if v.diff else "")


def _code(text: str) -> str:
    """Markdown code block (TensorBoard renders text summaries as markdown)."""
    return "```\n" + text + "\n```"


def _tag(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, default=str)


def _text(value: Any) -> str | None:
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else str(value)


def _number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not math.isnan(value)  # numpy's scalars too


def _float(value: Any) -> float | None:
    return float(value) if _number(value) else None
