"""agent=hybrid: whose turn it is, replayed from the knowledge base; and a campaign where the LLM takes over."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from llm_server import Reply, ScriptedLLM, edit_line, llm_server  # noqa: F401 - fixtures

from ralph_ray.agents.hybrid import HybridPolicy, Side, replay
from ralph_ray.kb import KnowledgeBase, open_reader

REJ, KEPT, DISC, CRASH = "rejected", "kept", "discarded", "crashed"


def test_heuristic_until_the_campaign_stalls():
    assert replay([], {}, 1, 3, 0.002).side is Side.heuristic  # nothing finished yet
    assert replay([0.90, 0.95], {2: [KEPT]}, 1, 3, 0.002).side is Side.heuristic  # still improving
    turn = replay([0.90, 0.95, 0.951], {2: [KEPT], 3: [DISC]}, 1, 3, 0.002)  # +0.001 < min_delta: a stalled cycle
    assert turn.side is Side.llm and "no improvement by 0.002 for 1 cycle(s)" in turn.why
    assert replay([0.90, 0.95, 0.951], {}, 2, 3, 0.002).side is Side.heuristic  # stall_cycles=2 waits one more


def test_llm_keeps_its_turn_while_its_children_pass():
    best = [0.90, 0.90, 0.90, 0.90, 0.90]
    assert (
        replay(best, {3: [REJ, DISC], 4: [REJ], 5: [REJ]}, 1, 3, 0.002).side is Side.llm
    )  # the streak restarted at cycle 3


def test_llm_hands_back_after_k_failed_children_in_a_row():
    best = [0.90, 0.90, 0.90, 0.90]  # cycle 2 stalls: cycles 3 and 4 are the LLM's
    turn = replay(best, {2: [DISC], 3: [REJ, CRASH], 4: [REJ]}, 1, 3, 0.002)
    assert turn.side is Side.heuristic and "3 LLM children in a row failed" in turn.why
    # The stall count starts afresh at the hand-back (cycles 1-4 never improved, yet cycle 5 is the heuristic's);
    # after stall_cycles more cycles without improvement the LLM gets another turn.
    assert replay(best + [0.90], {2: [DISC], 3: [REJ, CRASH], 4: [REJ], 5: [DISC]}, 1, 3, 0.002).side is Side.llm


def test_an_llm_cycle_without_children_counts_as_a_failure():
    assert replay([0.9, 0.9, 0.9], {}, 1, 1, 0.002).side is Side.heuristic


def test_policy_reads_the_run_from_the_knowledge_base(tmp_path: Path):
    kb = KnowledgeBase(tmp_path / "kb")
    kb.init()
    decisions = [{"run_id": "r1", "cycle": c, "best_selection_score": s} for c, s in ((1, 0.90), (2, 0.90))]
    kb.put("decisions", decisions, "r1-decisions")
    kb.put(
        "variants",
        [
            {"run_id": "r1", "variant_id": "seed", "cycle": 1, "status": "seed"},
            {"run_id": "r1", "variant_id": "aaa", "cycle": 2, "status": DISC},
        ],
        "r1-variants",
    )
    assert HybridPolicy(tmp_path / "kb", "r1", 1, 3, 0.002).turn().side is Side.llm
    assert HybridPolicy(tmp_path / "kb", "another-run", 1, 3, 0.002).turn().side is Side.heuristic
    assert HybridPolicy(tmp_path / "no-kb", "r1", 1, 3, 0.002).turn().side is Side.heuristic


ANALYSIS = {
    "diagnoses": ["overfitting"],
    "summary": "the heuristic's ideas ran dry",
    "recommendations": [
        {"intervention": "add_dropout", "diagnosis": "overfitting", "rationale": "regularise", "priority": 0.9}
    ],
}


@pytest.mark.slow
def test_hybrid_campaign_hands_a_stalled_cycle_to_the_llm(ray_session, tiny_config, llm_server: ScriptedLLM):
    llm_server.add(
        Reply(json.dumps(ANALYSIS), usage=(800, 100)),
        Reply(edit_line(r"^DROPOUT = .*$", "DROPOUT = 0.123  # dropout before the classifier"), usage=(600, 80)),
    )
    # min_delta=0.5: no cycle can improve enough, so cycle 2 (the heuristic's) stalls and cycle 3 is the LLM's.
    cfg = tiny_config(
        "agent=hybrid",
        f"agent.base_url={llm_server.base_url}",
        "agent.model=scripted",
        "agent.api_key_env=null",
        "agent.stall_cycles=1",
        "safeguards.min_delta=0.5",
        "safeguards.plateau_cycles=3",
        "safeguards.max_cycles=3",
        "population.parents=1",
        "population.children_per_parent=1",
        "population.trials_per_child=1",
        "search.num_samples=2",
        "run_id=hybrid-e2e",
    )
    from ralph_ray.campaign import run

    outcome = run(cfg)
    assert outcome.stop_reason == "max_cycles"
    con = open_reader(Path(cfg.paths.kb))
    usage = con.execute(
        "select cycle, role, tokens_in from agent_usage where run_id = 'hybrid-e2e' and tokens_in + tokens_out > 0 "
        "order by cycle, role"
    ).fetchall()
    assert usage == [(3, "analyst", 800), (3, "coder", 600)]  # the heuristic's cycle 2 cost nothing
    analyses = {c: (outcome.run_dir / f"cycle_{c:04d}" / "analysis.md").read_text() for c in (2, 3)}
    assert "[hybrid: heuristic;" in analyses[2] and "[hybrid: llm; the LLM takes over" in analyses[3]
    diff = con.execute("select diff from variants where run_id = 'hybrid-e2e' and cycle = 3").fetchone()[0]
    assert "+DROPOUT = 0.123" in diff
