"""Trackers, the environment record, export and the timeline, read back from one real two-cycle campaign.

One campaign serves the four (tracking, environment, export, timeline): each needs a finished run with a child
variant, and a campaign costs a minute of CPU. The trackers' output is read with each library's own reader
(MlflowClient, TensorBoard's EventAccumulator); the exported bundle is run by hand (reproduce.py) in a subprocess.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from ralph_ray import commands, sandbox, sql
from ralph_ray.campaign import Outcome, run
from ralph_ray.config import TrackingConfig, load_config
from ralph_ray.environment import ENV_FILE, PROJECT_ROOT
from ralph_ray.exit_codes import ExitCode
from ralph_ray.kb import open_reader
from ralph_ray.tracking import KIND_TAG, RUN_TAG, TrackingError, default_mlflow_uri, load, publish

RUN_ID = "tracked"


@pytest.fixture(scope="module")
def campaign(ray_session: None, tmp_path_factory: pytest.TempPathFactory) -> Outcome:
    """Two cycles (the seed, then one child), two trials each, published to MLflow, TensorBoard and W&B (offline)."""
    root = tmp_path_factory.mktemp("tracked")
    overrides = [
        f"paths.runs={root / 'runs'}",
        f"paths.kb={root / 'kb'}",
        f"run_id={RUN_ID}",
        "population.mode=generations",  # the barrier loop's cycle folders and records (the default auto runs async)
        "safeguards.max_cycles=2",
        "search.num_samples=2",
        "safeguards.replicates=0",  # one trial decides (replicates: tests/test_noise.py)
        "search.max_concurrent=2",
        "scheduler.max_t=3",
        "scheduler.grace_period=1",  # digits' task.yaml sets 4
        "+search.space.EPOCHS={type: choice, values: [3]}",
        "population.parents=1",
        "population.children_per_parent=1",
        "tracking=[mlflow,tensorboard,wandb]",
    ]
    if sandbox.available() is not None:
        overrides.append("sandbox=none")
    outcome = run(load_config(overrides), Console(quiet=True))
    assert outcome.best_variant_id is not None
    return outcome


def _mlflow_runs(outcome: Outcome) -> tuple[Any, list[Any]]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=default_mlflow_uri(outcome.run_dir))
    experiment = client.get_experiment_by_name("ralph_ray/digits")
    return client, client.search_runs([experiment.experiment_id], f"tags.`{RUN_TAG}` = '{RUN_ID}'")


def _kb_trials(outcome: Outcome) -> list[dict[str, Any]]:
    return open_reader(outcome.kb_root).execute(sql.TRIALS_FOR_RUN, [RUN_ID]).fetchdf().to_dict("records")


def test_mlflow_holds_the_campaign_its_variants_and_trials(campaign: Outcome) -> None:
    client, runs = _mlflow_runs(campaign)
    kinds = {kind: [r for r in runs if r.data.tags[KIND_TAG] == kind] for kind in ("campaign", "variant", "trial")}
    trials = _kb_trials(campaign)
    assert len(kinds["campaign"]) == 1 and len(kinds["trial"]) == len(trials) == 4
    camp = kinds["campaign"][0]
    artifacts = {a.path for a in client.list_artifacts(camp.info.run_id)}
    assert {"config.json", ENV_FILE, "report"} <= artifacts
    assert "report/final_report.md" in {a.path for a in client.list_artifacts(camp.info.run_id, "report")}
    assert camp.data.metrics["selection_score"] == pytest.approx(campaign.best_selection_score)
    # Each variant: nested under the campaign, its lineage and status as tags, a child's diff as an artifact.
    variants = {r.data.tags["variant_id"]: r for r in kinds["variant"]}
    child = next(r for r in variants.values() if r.data.tags.get("parent_id"))
    assert child.data.tags["mlflow.parentRunId"] == camp.info.run_id
    assert child.data.tags["lineage"].startswith("seed > ") and "[" not in child.data.tags["lineage"]
    diff = client.download_artifacts(child.info.run_id, "diff.patch")
    assert Path(diff).read_text().startswith("--- a/")
    # Each trial: under its variant, knobs as params, per-epoch metrics by epoch, the frozen scores.
    by_id = {r.data.tags["trial_id"]: r for r in kinds["trial"]}
    for row in trials:
        logged = by_id[row["trial_id"]]
        assert logged.data.tags["mlflow.parentRunId"] == variants[row["variant_id"]].info.run_id
        assert {k: json.loads(v) for k, v in logged.data.params.items() if k != "seed"} == json.loads(row["knobs"])
        if row["status"] == "completed":
            assert logged.data.metrics["selection_score"] == pytest.approx(row["selection_score"])
        history = client.get_metric_history(logged.info.run_id, "val_acc")
        assert [m.step for m in history] == list(range(1, row["epochs"] + 1))


def test_tensorboard_event_files_hold_curves_hparams_and_text(campaign: Outcome) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    root = campaign.run_dir / "tracking" / "tensorboard" / RUN_ID
    con = open_reader(campaign.kb_root)
    for row in _kb_trials(campaign):
        events = EventAccumulator(str(root / "trials" / row["trial_id"]))
        events.Reload()
        curve = [(e.step, e.value) for e in events.Scalars("val_acc")]
        recorded = con.execute(
            "select epoch, value from epochs where run_id = ? and trial_id = ? and metric = ? order by epoch",
            [RUN_ID, row["trial_id"], "val_acc"],
        ).fetchall()
        assert curve == [(epoch, pytest.approx(value)) for epoch, value in recorded]
        if row["status"] == "completed":
            assert events.Scalars("final/selection_score")[-1].value == pytest.approx(row["selection_score"])
    text = EventAccumulator(str(root / "campaign"))
    text.Reload()
    tags = text.Tags()["tensors"]
    assert "config/text_summary" in tags and any(t.startswith("variant/") for t in tags)


def _wandb_log(raw: bytes) -> Iterator[bytes]:
    """The records of a W&B transaction log (`run-*.wandb`): a 7-byte header (`:W&B`, magic, version), then LevelDB
    log blocks of 32 KiB whose chunks are a checksum (4 bytes), a length (2, little-endian) and a type (1 full,
    2 first, 3 middle, 4 last). wandb 0.31 reads these files only in its Go core, so the test walks the blocks and
    parses each record with wandb's own protobuf classes."""
    assert raw[:4] == b":W&B"
    pos, block, pending = 7, 32768, b""
    while pos + 7 <= len(raw):
        if block - pos % block < 7:  # a block's tail too short for a chunk header is padding
            pos += block - pos % block
            continue
        length, kind = int.from_bytes(raw[pos + 4 : pos + 6], "little"), raw[pos + 6]
        chunk = raw[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind == 1:
            yield chunk
        elif kind in (2, 3):
            pending = (pending if kind == 3 else b"") + chunk
        elif kind == 4:
            yield pending + chunk


def _wandb_runs(folder: Path) -> dict[str, dict[str, Any]]:
    """Every offline W&B run under `folder` by name: project, group, job type, config, history rows, summary."""
    from wandb.proto import wandb_internal_pb2 as pb

    def items(update: Any) -> dict[str, Any]:
        return {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in update}

    runs = {}
    for path in folder.rglob("run-*.wandb"):
        run: dict[str, Any] = {"config": {}, "history": [], "summary": {}, "artifacts": {}}
        for data in _wandb_log(path.read_bytes()):
            record = pb.Record()
            record.ParseFromString(data)
            kind = record.WhichOneof("record_type")
            if kind == "run":
                r = record.run
                run.update(name=r.display_name, project=r.project, group=r.run_group, job_type=r.job_type)
                run["config"].update(items(r.config.update))
            elif kind == "config":
                run["config"].update(items(record.config.update))
            elif kind == "history":
                run["history"].append(items(record.history.item))
            elif kind == "summary":
                run["summary"].update(items(record.summary.update))
            elif kind == "artifact":
                run["artifacts"][record.artifact.name] = [c.path for c in record.artifact.manifest.contents]
        runs[run["name"]] = run
    return runs


def test_wandb_offline_runs_hold_the_campaign_its_variants_and_trials(campaign: Outcome) -> None:
    runs = _wandb_runs(campaign.run_dir / "tracking" / "wandb" / RUN_ID)
    assert {(r["project"], r["group"]) for r in runs.values()} == {("ralph_ray-digits", RUN_ID)}
    camp = runs[RUN_ID]
    assert camp["job_type"] == "campaign" and camp["config"]["run_id"] == RUN_ID
    assert {"env.json", "report/final_report.md"} <= set(camp["artifacts"][f"{RUN_ID}-report"])
    variants = {r["config"]["variant_id"]: r for r in runs.values() if r["job_type"] == "variant"}
    child = next(r for r in variants.values() if r["config"]["parent_id"])
    assert child["config"]["lineage"].startswith("seed > ")
    assert child["artifacts"][f"{RUN_ID}-{child['config']['variant_id']}-diff"] == ["diff.patch"]
    for row in _kb_trials(campaign):
        logged = runs[f"trial {row['trial_id']}"]
        assert logged["job_type"] == "trial" and logged["config"]["variant_id"] in variants
        assert {k: logged["config"][k] for k in json.loads(row["knobs"])} == json.loads(row["knobs"])
        assert [h["epoch"] for h in logged["history"]] == list(range(1, row["epochs"] + 1))
        if row["status"] == "completed":
            assert logged["summary"]["selection_score"] == pytest.approx(row["selection_score"])


def test_the_environment_is_recorded_in_the_run_dir_and_the_kb(campaign: Outcome) -> None:
    env = json.loads((campaign.run_dir / ENV_FILE).read_text())
    assert env["python"] == sys.version.split()[0] and {"ray", "torch", "duckdb"} <= set(env["packages"])
    if (PROJECT_ROOT / ".git").exists():  # HEAD may have moved on since the campaign started: an ancestor of it
        ancestor = ["git", "-C", str(PROJECT_ROOT), "merge-base", "--is-ancestor", env["git"]["commit"], "HEAD"]
        assert subprocess.run(ancestor).returncode == 0 and isinstance(env["git"]["dirty"], bool)
    stored = open_reader(campaign.kb_root).execute("select environment from runs where run_id = ?", [RUN_ID]).fetchone()
    assert json.loads(stored[0]) == env
    report = (campaign.run_dir / "report" / "final_report.md").read_text()
    assert f"- environment: Python {env['python']}, torch {env['packages']['torch']}" in report


def test_track_republishes_without_duplicating_runs(campaign: Outcome) -> None:
    before = len(_mlflow_runs(campaign)[1])
    code = commands.main(["track", RUN_ID, "mlflow", "--kb", str(campaign.kb_root)], Console(quiet=True))
    assert code == ExitCode.ok and len(_mlflow_runs(campaign)[1]) == before
    record = load(open_reader(campaign.kb_root), RUN_ID)
    with pytest.raises(TrackingError, match="tracking=mlflow"):
        publish(record, ["comet"])
    with pytest.raises(TrackingError, match="wandb_mode"):
        publish(record, ["wandb"], wandb_mode="shared")
    assert TrackingConfig(mlflow=True, wandb=True).trackers() == ["mlflow", "wandb"]


def test_export_bundle_runs_standalone_and_reproduces_the_score(campaign: Outcome, tmp_path: Path) -> None:
    out = tmp_path / "bundle"
    done = subprocess.run(
        [sys.executable, "-m", "ralph_ray", "export", RUN_ID, "--kb", str(campaign.kb_root), "--out", str(out)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    scores = json.loads((out / "scores.json").read_text())
    assert scores["variant_id"] == campaign.best_variant_id
    knobs = json.loads((out / "knobs.json").read_text())
    train = (out / "trainer" / "train.py").read_text()
    assert all(f"{name} = {value!r}" in train for name, value in knobs.items())
    assert "--- a/train.py" in (out / "diff_vs_seed.patch").read_text()
    lineage = json.loads((out / "lineage.json").read_text())
    assert lineage[0]["parent_id"] is None and lineage[-1]["variant_id"] == campaign.best_variant_id
    assert {"README.md", "config.yaml", ENV_FILE, "reproduce.py"} <= {p.name for p in out.iterdir()}
    # By hand, from another folder: its own data prep, training and frozen scoring.
    ran = subprocess.run(
        [sys.executable, str(out / "reproduce.py"), "--work", str(tmp_path / "work")],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
    )
    assert ran.returncode == 0, ran.stderr[-2000:]
    result = json.loads(ran.stdout.strip().splitlines()[-1])
    assert result["selection_score"] == pytest.approx(scores["selection_score"], abs=0.03)


def test_export_of_an_unknown_variant_names_the_fix(campaign: Outcome, capsys: pytest.CaptureFixture[str]) -> None:
    code = commands.main(["export", RUN_ID, "nope", "--kb", str(campaign.kb_root)], Console())
    assert code == ExitCode.safeguard_or_config
    assert "python -m ralph_ray status" in capsys.readouterr().out


def test_timeline_is_a_valid_trace_of_every_trial_on_non_overlapping_slots(campaign: Outcome) -> None:
    from ralph_ray.timeline import TIMELINE_FILE

    data = json.loads((campaign.run_dir / TIMELINE_FILE).read_text())
    events = data["traceEvents"]
    # The Trace Event Format's object form: every event has a phase and a pid; complete events a ts and a dur in us.
    assert all(e["ph"] in ("X", "M") and isinstance(e["pid"], int) for e in events)
    spans = [e for e in events if e["ph"] == "X"]
    assert sorted(e["args"]["trial_id"] for e in spans) == sorted(r["trial_id"] for r in _kb_trials(campaign))
    assert all(isinstance(e["ts"], int) and e["ts"] >= 0 and isinstance(e["dur"], int) and e["dur"] > 0 for e in spans)
    named = {e["tid"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {e["tid"] for e in spans} == named
    for slot in named:  # a slot runs one trial at a time
        row = sorted((e["ts"], e["ts"] + e["dur"]) for e in spans if e["tid"] == slot)
        assert all(end <= start + 1 for (_, end), (start, _) in zip(row, row[1:]))  # 1 us: rounding


def test_events_follow_phases_verdicts_trial_ends_and_the_decision(campaign: Outcome) -> None:
    from ralph_ray.events import EVENTS_FILE

    events = [json.loads(line) for line in (campaign.run_dir / EVENTS_FILE).read_text().splitlines()]
    assert all(e["run_id"] == RUN_ID and e["ts"] for e in events)
    phases = [(e["cycle"], e["phase"]) for e in events if e["event"] == "phase"]
    assert (1, "train") in phases and (2, "write") in phases and phases[-1][1] == "done"
    ends = [e for e in events if e["event"] == "trial_end"]
    assert sorted(e["trial_id"] for e in ends) == sorted(r["trial_id"] for r in _kb_trials(campaign))
    starts = {e["trial_id"]: e for e in events if e["event"] == "trial_start"}
    assert all(starts[e["trial_id"]]["ts"] <= e["ts"] and starts[e["trial_id"]]["cycle"] == e["cycle"] for e in ends)
    child = [e for e in events if e["event"] == "variant" and e["parent_id"]]
    assert child and child[0]["status"] in ("candidate", "rejected")  # the gate's verdict, then the judgement
    decisions = [e for e in events if e["event"] == "decision"]
    assert [d["decision"] for d in decisions] == ["continue", "stop"]
    assert [e["ts"] for e in events] == sorted(e["ts"] for e in events)


def test_mlflow_names_the_pick_as_the_best_variant_not_the_luckiest_trials(tmp_path: Path) -> None:
    """User trial: the campaign's `best_variant` tag was a raw max over best trials (the seed's lucky 0.99), while
    the report, status and export named the leaderboard's rank 1 (its child, by replicate mean)."""
    from mlflow.tracking import MlflowClient
    from pickkb import RUN, pick_kb

    kb, _ = pick_kb(tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    publish(load(open_reader(kb), RUN), ["mlflow"], uri)
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("ralph_ray/digits")
    (camp,) = client.search_runs([experiment.experiment_id], f"tags.`{KIND_TAG}` = 'campaign'")
    assert camp.data.tags["best_variant"] == "kid"
    assert camp.data.metrics["selection_score"] == pytest.approx(0.97)  # the pick's best trial
