"""The leaderboard's cost column and its front of score against cost (AppTest), on the real tiny campaign and a
hand-written KB whose front is known."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
from app_support import Tiny, kb_with_run, open_page, tiny_fixture  # noqa: F401 (the `tiny` fixture)

from ralph_ray import sql
from ralph_ray.front import cost_seconds
from ralph_ray.kb import KnowledgeBase, open_reader


def front_chart(at) -> tuple[dict, pa.Table]:
    """The score-against-cost chart's spec and its points (the chart whose x is the cost), cheapest first."""
    for chart in at.get("vega_lite_chart"):
        spec = json.loads(chart.proto.spec)
        if "cost_s" in json.dumps(spec):
            tables = [pa.ipc.open_stream(d.data.data).read_all() for d in chart.proto.datasets]
            return spec, next(t for t in tables if "cost_s" in t.column_names)
    raise AssertionError("no score-against-cost chart on the page")


def dominated(row: dict, rows: list[dict]) -> bool:
    """The front's definition, by brute force: another row scores at least as well for no more cost (and differs)."""
    return any(
        o["cost_s"] <= row["cost_s"]
        and o["selection_score"] >= row["selection_score"]
        and (o["cost_s"], o["selection_score"]) != (row["cost_s"], row["selection_score"])
        for o in rows
    )


def test_every_score_shows_the_cost_its_best_trial_recorded(tiny: Tiny):
    at = open_page(tiny.kb_root)
    shown = at.dataframe[0].value
    con = open_reader(tiny.kb_root)
    wall = dict(con.execute("select trial_id, seconds from trials where run_id = ?", [tiny.run_id]).fetchall())
    train = dict(con.execute(sql.TRAIN_SECONDS_PER_TRIAL, [tiny.run_id]).fetchall())
    assert train  # the harness reports train_seconds with every epoch
    scored = shown.dropna(subset=["selection_score"]).to_dict("records")
    assert len(scored) >= 2
    for row in scored:
        trial = row["best_trial_id"]
        assert row["cost_s"] == cost_seconds(train.get(trial), wall[trial]) > 0, row
        assert bool(row["on_front"]) == (not dominated(row, scored)), row
    assert shown.iloc[0]["on_front"]  # the best score is on the front whatever it cost
    spec, points = front_chart(at)
    assert sorted(points.column("variant_id").to_pylist()) == sorted(r["variant_id"] for r in scored)
    assert {r["variant_id"]: r["on_front"] for r in points.to_pylist()} == {
        r["variant_id"]: bool(r["on_front"]) for r in scored
    }
    line = next(layer for layer in spec["layer"] if layer["mark"].get("interpolate") == "step-after")
    assert line["transform"] == [{"filter": "datum.on_front"}]  # the step line runs through the front only
    assert any(t.get("field") == "variant_id" for layer in spec["layer"] for t in layer["encoding"].get("tooltip", []))


def test_the_front_leaves_out_a_dominated_variant_and_ends_at_the_dearer_best(tmp_path: Path):
    kb_root = kb_with_run(tmp_path, "finished", stop_reason="max_cycles")
    kb = KnowledgeBase(kb_root)
    # variant, selection score, wall seconds, reported training seconds (None: an older trainer reported none)
    trials = [("cheap", 0.90, 12.0, 10.0), ("dominated", 0.88, 35.0, 30.0), ("dear", 0.95, 95.0, None)]
    for n, (variant, score, seconds, train_s) in enumerate(trials):
        kb.append(
            "variants",
            [{"run_id": "r1", "variant_id": variant, "parent_id": None, "cycle": 1, "status": "kept"}],
            f"r1-v{n}",
        )
        if train_s is not None:
            kb.append(
                "epochs",
                [{"run_id": "r1", "trial_id": f"t{n}", "epoch": 3, "metric": "train_seconds", "value": train_s}],
                f"r1-t{n}",
            )
        row = {
            "run_id": "r1",
            "cycle": 1,
            "trial_id": f"t{n}",
            "variant_id": variant,
            "status": "completed",
            "selection_score": score,
            "test_score": score - 0.01,
            "seconds": seconds,
            "epochs": 3,
        }
        kb.append("trials", [row], f"r1-t{n}")
    at = open_page(kb_root)
    shown = at.dataframe[0].value.set_index("variant_id")
    assert shown["cost_s"].to_dict() == {"dear": 95.0, "cheap": 10.0, "dominated": 30.0}
    assert shown["on_front"].to_dict() == {"dear": True, "cheap": True, "dominated": False}
    _, points = front_chart(at)
    front = [p["variant_id"] for p in points.to_pylist() if p["on_front"]]
    assert front == ["cheap", "dear"]  # cheapest first: the step line goes up to the right


def test_the_score_columns_name_the_metric(tmp_path: Path):
    """User trial: the leaderboard's columns said `selection` / `test`, not which metric (macro_f1)."""
    config = json.dumps({"task": {"metric": "macro_f1", "direction": "max"}, "safeguards": {"max_cycles": 3}})
    kb = KnowledgeBase(kb_with_run(tmp_path, "finished", stop_reason="max_cycles", config=config))
    kb.append("variants", [{"run_id": "r1", "variant_id": "seed", "cycle": 1, "status": "seed"}], "r1-v")
    row = {"run_id": "r1", "cycle": 1, "trial_id": "t1", "variant_id": "seed", "status": "completed"}
    kb.append("trials", [{**row, "selection_score": 0.84, "test_score": 0.82, "seconds": 3.0, "epochs": 2}], "r1-t")
    at = open_page(kb.root)
    columns = json.loads(at.dataframe[0].proto.columns)
    assert columns["selection_score"]["label"] == "selection macro_f1"
    assert columns["test_score"]["label"] == "test macro_f1"
