"""Row makers for the KB tables, written through a real KnowledgeBase and read back through its views."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ralph_ray import records
from ralph_ray.agents.base import Usage
from ralph_ray.children import Child
from ralph_ray.config import AgentConfig, SafeguardsConfig, load_config
from ralph_ray.decision import CycleFacts, child_verdict, decide
from ralph_ray.kb import SCHEMAS, KnowledgeBase, open_reader
from ralph_ray.noise import Sample, welch_greater
from ralph_ray.replicates import Replicated, evidence
from ralph_ray.state import CampaignState, Phase, RunStatus
from ralph_ray.variants import RejectedBy, VariantStatus


def child(
    variant_id: str,
    status: VariantStatus,
    parent: str = "p",
    interventions: tuple[str, ...] = ("wider",),
    parent_score: float | None = 0.9,
) -> Child:
    return Child(
        variant_id,
        parent,
        Path("/x") / variant_id,
        list(interventions),
        "underfitting",
        "why",
        status,
        None,
        "diff",
        {},
        parent_score,
    )


def test_rows_fit_their_tables_and_read_back(tmp_path: Path):
    kb = KnowledgeBase(tmp_path / "kb")
    kb.init()
    agent = AgentConfig(price_in_per_m=2.0, price_out_per_m=10.0)
    children = [
        child("k", VariantStatus.kept),
        child("r", VariantStatus.rejected),
        child("p", VariantStatus.candidate),
        child("s", VariantStatus.seed, parent="", interventions=()),
    ]
    scores = {"k": (0.95, 0.94)}
    kb.put("variants", records.variant_rows("r1", 2, children, agent, scores), records.part("r1", 2, "record"))
    kb.put(
        "agent_usage",
        records.usage_rows("r1", 2, "coder", [("k", Usage(1, 1_000_000, 100_000, 2.0))], agent),
        records.part("r1", 2, "coder"),
    )
    kb.put("interventions", records.effect_rows("r1", "digits", 2, children, scores), records.part("r1", 2))
    cycle_dir = tmp_path / "runs" / "r1" / "cycle_0002"
    asked = [c for c in children if c.status is not VariantStatus.seed]
    kb.put("cycles", [records.cycle_row("r1", 2, 5, 0.95, asked, cycle_dir, "# cycle 2")], records.part("r1", 2))
    con = kb.reader()
    # A child identical to its parent ("p" of parent "p") is no new variant; the others keep their score.
    assert con.execute("select variant_id, status, selection_score from variants order by variant_id").fetchall() == [
        ("k", "kept", 0.95),
        ("r", "rejected", None),
        ("s", "seed", None),
    ]
    assert con.execute("select cost, tokens_in, backend from agent_usage").fetchone() == (3.0, 1_000_000, "heuristic")
    # One row per intervention of a judged child; none for the seed or a child identical to its parent.
    rows = con.execute("select variant_id, delta, outcome from interventions order by variant_id").fetchall()
    assert [(v, round(d, 6) if d is not None else None, o) for v, d, o in rows] == [
        ("k", 0.05, "kept"),
        ("r", None, "rejected"),
    ]
    assert con.execute("select children, rejected, parents, cycle_dir, analysis from cycles").fetchone() == (
        3,
        1,
        '["p"]',
        str(cycle_dir.resolve()),
        "# cycle 2",
    )


def test_run_status_and_decision_rows(tmp_path: Path):
    cfg = load_config([f"paths.kb={tmp_path / 'kb'}"])
    base = records.run_row(cfg, "r1", tmp_path / "runs" / "r1", None)
    state = CampaignState("r1", phase=Phase.train, cycle=3)
    running = records.run_status(base, RunStatus.running, state)
    assert (running["status"], running["cycle"], running["phase"]) == ("running", 3, "train")
    assert "finished_at" not in running and "stop_reason" not in running
    crashed = records.run_status(base, RunStatus.crashed, state, "KeyError: x")
    assert crashed["stop_reason"] == "KeyError: x" and crashed["finished_at"] is not None
    facts = CycleFacts(3, [0.9, 0.95, 0.95], None, 0, 10, 0.0, 0, 42.123, False)
    decision = decide(facts, SafeguardsConfig(max_cycles=3))
    data = records.decision_json(decision, facts, "v7")
    assert (data["decision"], data["reason"], data["elapsed_s"], data["best_variant_id"]) == (
        "stop",
        "max_cycles",
        42.1,
        "v7",
    )
    row = records.decision_row("r1", decision, facts, "v7")
    assert (row["decision"], row["exit_code"], row["tokens"], row["cycle"]) == ("stop", 0, 10, 3)
    assert records.part("r1", 3, "analyst") == "r1-c0003-analyst"
    assert records.trial_part("r1", 3, "t9").startswith(records.trial_parts("r1", 3))


def test_a_rejection_the_gate_never_saw_measures_no_intervention():
    """Review: since a child rejected before the gate is a variant of its own (REJECTED.md), an LLM's outage or a
    spent token budget would have counted as the intervention's `rejected` tries in intervention_effects."""
    for by, rows in ((RejectedBy.gate, 1), (RejectedBy.code, 1), (RejectedBy.coder, 0), (RejectedBy.budget, 0)):
        rejected = dataclasses.replace(child("r", VariantStatus.rejected), rejected_by=by)
        assert len(records.intervention_rows("run", "digits", 2, rejected, None)) == rows, by


def test_an_interventions_row_records_the_reference_its_verdict_used_and_its_basis(tmp_path: Path):
    """User trial: a child "did not beat its parent's replicate mean 0.9485", yet its row recorded the parent's best
    trial 0.9554 (delta -0.0223 instead of -0.0154), and intervention_effects averaged such deltas with deltas between
    replicate means with no column to tell them apart."""
    parent_reps = {"p": Replicated(2, (1, 2), Sample.of([0.9526, 0.9443]), Sample(()))}
    hopeless = child("h", VariantStatus.candidate, interventions=("replay",), parent_score=0.9554)
    not_worth = evidence(hopeless, 0.9331, parent_reps, 0.9554, 0.9)
    hopeless.status, hopeless.reason = child_verdict(1, 0, 0.9331, 0.9554, 0.0, None, not_worth)
    assert "its best trial 0.9331 did not beat its parent's replicate mean 0.9485 ±" in (hopeless.reason or "")
    (row,) = records.intervention_rows("r1", "digits", 2, hopeless, 0.9331, not_worth)
    assert (row["parent_score"], row["basis"]) == (pytest.approx(0.94845), "best_trial_vs_replicates")
    assert row["delta"] == pytest.approx(0.9331 - 0.94845)
    # Both replicated: the delta between the means the Welch test compared.
    kept = child("k", VariantStatus.candidate, interventions=("replay",), parent_score=0.9554)
    welch = welch_greater(Sample.of([0.968, 0.970]), parent_reps["p"].sample, 0.9)
    kept.status, kept.reason = child_verdict(1, 0, 0.975, 0.9554, 0.0, None, welch)
    (row,) = records.intervention_rows("r1", "digits", 2, kept, 0.975, welch)
    assert (row["child_score"], row["parent_score"], row["basis"]) == (
        pytest.approx(0.969),
        pytest.approx(0.94845),
        "replicates",
    )
    # An unreplicated parent: best trial against best trial (the parent's the evidence named, not the breed-time one).
    alone = child("a", VariantStatus.candidate, interventions=("replay",), parent_score=0.99)
    against_best = evidence(alone, 0.93, {}, 0.95, 0.9)
    alone.status, alone.reason = child_verdict(1, 0, 0.93, 0.95, 0.0, None, against_best)
    (row,) = records.intervention_rows("r1", "digits", 2, alone, 0.93, against_best)
    assert (row["parent_score"], row["basis"]) == (0.95, "best_trial")
    # Replicates off: its best trial against the parent's it was judged on; a rejected child compared nothing.
    (row,) = records.intervention_rows(
        "r1", "digits", 2, child("o", VariantStatus.kept, interventions=("replay",)), 0.93
    )
    assert (row["parent_score"], row["basis"]) == (0.9, "best_trial")
    (row,) = records.intervention_rows(
        "r1", "digits", 2, child("x", VariantStatus.rejected, interventions=("replay",)), None
    )
    assert row["basis"] is None

    kb = KnowledgeBase(tmp_path / "kb")
    kb.init()
    rows = [
        row
        for c, score, comparison in (
            (hopeless, 0.9331, not_worth),
            (kept, 0.975, welch),
            (alone, 0.93, against_best),
            (child("x", VariantStatus.rejected, interventions=("replay",)), None, None),
        )
        for row in records.intervention_rows("r1", "digits", 2, c, score, comparison)
    ]
    kb.put("interventions", rows, records.part("r1", 2))
    effect = (
        kb.reader()
        .execute("select n, tried, n_replicates, mean_delta_replicates, n_best_trial from intervention_effects")
        .fetchone()
    )
    assert effect[:3] == (3, 4, 1) and effect[3] == pytest.approx(0.969 - 0.94845) and effect[4] == 2


def test_a_kb_written_before_the_basis_column_still_reads(tmp_path: Path):
    """An interventions table whose parts (and schema part) predate `basis` reads it as NULL, and the view counts
    its deltas in neither basis."""
    kb = KnowledgeBase(tmp_path / "kb")
    kb.init()
    folder = kb.parquet / "interventions"
    old = pa.schema([f for f in SCHEMAS["interventions"] if f.name != "basis"])
    pq.write_table(old.empty_table(), folder / "_schema.parquet")
    row = {
        k: v for k, v in records.intervention_rows("old", "digits", 2, child("k", VariantStatus.kept), 0.95)[0].items()
    }
    row.pop("basis")
    pq.write_table(pa.Table.from_pylist([row], schema=old), folder / "old.parquet")
    con = open_reader(kb.root)
    assert con.execute("select basis, delta from interventions").fetchone() == (None, pytest.approx(0.05))
    assert con.execute("select n, n_replicates, n_best_trial from intervention_effects").fetchone() == (1, 0, 0)


def test_a_child_the_gate_caught_reaching_outside_keeps_the_mark_on_its_variant_row(tmp_path: Path):
    """User trial: a child whose first draft read the held-out labels through the engine was refused by the gate,
    passed on its second attempt, and its variants row said nothing of it: no SQL found it. Every refusal is on the
    row, and stays there when the verdict re-writes it without them (a resumed driver rebuilds a child from the KB)."""
    kb = KnowledgeBase(tmp_path / "kb")
    kb.init()
    agent = AgentConfig()
    caught = "attempt 1: train.py line 3: imports ralph_ray.tasks: of the engine a trainer may import only harness"
    cheat = dataclasses.replace(child("c", VariantStatus.candidate), refusals=[caught])
    honest = child("h", VariantStatus.candidate)
    kb.put("variants", records.variant_rows("r1", 2, [cheat, honest], agent), records.part("r1", 2, "write"))
    judged = dataclasses.replace(cheat, status=VariantStatus.kept, refusals=[])  # as a resumed driver has it
    kb.put("variants", records.variant_rows("r1", 2, [judged], agent, {"c": (0.95, None)}), records.part("r1", 2, "j"))
    con = open_reader(kb.root)
    found = con.execute(
        "select variant_id, status, refusals from variants where refusals like '%imports ralph_ray%'"
    ).fetchall()
    assert found == [("c", "kept", json.dumps([caught]))]
    assert con.execute("select refusals from variants where variant_id = 'h'").fetchone() == (None,)


def test_a_kb_written_before_the_refusals_column_still_reads(tmp_path: Path):
    """A variants table whose parts (and schema part) predate `refusals` reads it as NULL."""
    kb = KnowledgeBase(tmp_path / "kb")
    kb.init()
    folder = kb.parquet / "variants"
    old = pa.schema([f for f in SCHEMAS["variants"] if f.name != "refusals"])
    pq.write_table(old.empty_table(), folder / "_schema.parquet")
    row = {"run_id": "old", "variant_id": "k", "cycle": 2, "status": "kept"}
    pq.write_table(pa.Table.from_pylist([row], schema=old), folder / "old.parquet")
    con = open_reader(kb.root)
    assert con.execute("select status, refusals from variants").fetchone() == ("kept", None)
