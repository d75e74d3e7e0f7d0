"""Knobs, failures, comparison and noise as the pages show them, over KBs written with the real writer."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pyarrow as pa
import pytest
from app_support import kb_with_run, open_page, texts

from ralph_ray.kb import KnowledgeBase, now

LRS = (0.001, 0.01, 0.1, 0.3, 0.5, 1.0)


def trial(run_id: str, n: int, variant: str, score: float | None, **extra) -> dict:
    return {
        "run_id": run_id,
        "cycle": 1 if variant == "seed" else 2,
        "trial_id": f"t{n}",
        "variant_id": variant,
        "status": "completed" if score is not None else "failed",
        "selection_score": score,
        "test_score": score,
        "seconds": 1.0,
        "epochs": 3,
        **extra,
    }


def insight_kb(tmp_path: Path) -> Path:
    """Campaign r1: a seed and a child, six knob samples whose score follows LR (WIDTH is noise), a failed trial
    with its work dir, three replicates of the child's best knobs; campaign r2 (older) with its own curves."""
    root = kb_with_run(tmp_path, "finished", stop_reason="max_cycles")
    kb = KnowledgeBase(root)
    kb.append(
        "runs",
        [
            {
                "run_id": "r2",
                "experiment": "digits",
                "task": "digits",
                "status": "finished",
                "started_at": now() - timedelta(days=1),
                "config": "{}",
            }
        ],
        "r2",
    )
    kb.put(
        "variants",
        [
            {"run_id": "r1", "variant_id": "seed", "cycle": 1, "status": "seed"},
            {"run_id": "r1", "variant_id": "kid", "parent_id": "seed", "cycle": 2, "status": "kept"},
            {"run_id": "r1", "variant_id": "dud", "parent_id": "seed", "cycle": 2, "status": "discarded"},
        ],
        "r1-v",
    )
    work = tmp_path / "trials" / "t9"
    work.mkdir(parents=True)
    (work / "stderr.log").write_text("Traceback (most recent call last):\nRuntimeError: CUDA out of memory\n")
    (work / "train.py").write_text("LR = 0.5  # learning rate\n")
    rows = [
        trial("r1", i, "seed", 0.8 + 0.1 * (i / len(LRS)), knobs=json.dumps({"LR": lr, "WIDTH": 16 + (i % 2) * 16}))
        for i, lr in enumerate(LRS)
    ]
    best = json.dumps({"LR": 0.2, "WIDTH": 32})
    rows += [trial("r1", 10 + i, "kid", s, knobs=best, seed=i) for i, s in enumerate((0.95, 0.96, 0.97))]
    rows += [
        trial(
            "r1",
            9,
            "dud",
            None,
            knobs=json.dumps({"LR": 0.5, "WIDTH": 16}),
            reason="exit 1: RuntimeError: CUDA out of memory",
            work_dir=str(work),
        )
    ]
    kb.append("trials", rows, "r1-t")
    kb.append("trials", [trial("r2", 1, "old", 0.9, knobs='{"LR": 0.1}')], "r2-t")
    kb.append(
        "epochs",
        [
            {"run_id": r, "trial_id": t, "epoch": e, "metric": "val_acc", "value": 0.5 + e / 10}
            for r, t in (("r1", "t10"), ("r2", "t1"))
            for e in (1, 2, 3)
        ],
        "e",
    )
    kb.append(
        "interventions",
        [
            {
                "run_id": "r1",
                "task": "digits",
                "cycle": 2,
                "variant_id": f"k{i}",
                "intervention": name,
                "diagnosis": "underfitting",
                "delta": d,
                "outcome": "kept",
            }
            for i, (name, d) in enumerate((("once", 0.01), ("thrice", 0.01), ("thrice", 0.02), ("thrice", 0.03)))
        ],
        "i",
    )
    return root


def replicates(means: dict[str, float], knobs: str) -> list[dict]:
    """Three replicate trials per variant around its mean (-0.01, 0, +0.01), on the best trial's knobs."""
    return [
        trial("r1", 10 * (n + 1) + i, variant, base + d, replicate=True, knobs=knobs)
        for n, (variant, base) in enumerate(means.items())
        for i, d in enumerate((-0.01, 0, 0.01))
    ]


def test_leaderboard_shows_the_best_knobs_as_columns_the_why_and_replicates(tmp_path: Path):
    at = open_page(insight_kb(tmp_path))
    board = at.dataframe[0].value
    kid = board[board["variant_id"] == "kid"].iloc[0]
    assert kid["LR"] == 0.2 and kid["WIDTH"] == 32
    assert kid["spread"].startswith("0.9600 ± 0.0248 (n=3")  # t(0.975, 2) = 4.303 x 0.01 / sqrt(3)
    dud = board[board["variant_id"] == "dud"].iloc[0]
    assert dud["reason"] == "no trial completed: 1 failed (see Trials)"


def test_leaderboard_ranks_by_replicate_means_and_says_when_ranks_1_and_2_are_within_noise(tmp_path: Path):
    # "flashy" has the far better best trial (0.99 vs 0.93), but the two replicate means are 0.005 apart, less
    # than the leader's 95% interval (+-0.0248): the board ranks by those means and says it cannot tell them apart.
    root = kb_with_run(tmp_path, "finished", stop_reason="max_cycles")
    kb = KnowledgeBase(root)
    kb.put(
        "variants", [{"run_id": "r1", "variant_id": v, "cycle": 1, "status": "kept"} for v in ("flashy", "calm")], "v"
    )
    knobs = '{"LR": 0.1}'  # the replicates ran the best trial's knobs (only those count)
    rows = [trial("r1", 1, "flashy", 0.99, knobs=knobs), trial("r1", 2, "calm", 0.93, knobs=knobs)]
    rows += replicates({"flashy": 0.955, "calm": 0.96}, knobs)
    kb.append("trials", rows, "t")
    at = open_page(root)
    assert list(at.dataframe[0].value["variant_id"]) == ["calm", "flashy"]
    assert (
        "Ranks 1 and 2 are within noise: 0.0050 apart (rank 1's replicate mean 0.9600, rank 2's replicate mean "
        "0.9550), less than the leader's ±0.0248" in texts(at)
    )
    # The Status page names the same pick and what ranked it.
    status = texts(open_page(root, "views/status.py"))
    assert "Pick (rank 1): **calm**, by its replicate mean 0.9600 ± 0.0248 (95% t) over 3 fresh seeds" in status


def test_within_noise_compares_what_ranks_each_variant(tmp_path: Path):
    """User trial: the note compared best trials though rank 1 is ranked by its replicate mean. Here calm (replicate
    mean 0.96, its search trial 0.93) ranks above flashy (best trial 0.975, never replicated): 0.015 apart by what
    ranks them, inside calm's +-0.0248; their best trials are 0.045 apart, which said nothing."""
    root = kb_with_run(tmp_path, "finished", stop_reason="max_cycles")
    kb = KnowledgeBase(root)
    kb.put(
        "variants", [{"run_id": "r1", "variant_id": v, "cycle": 1, "status": "kept"} for v in ("flashy", "calm")], "v"
    )
    knobs = '{"LR": 0.1}'  # the replicates ran the best trial's knobs
    rows = [trial("r1", 1, "flashy", 0.975, knobs=knobs), trial("r1", 2, "calm", 0.93, knobs=knobs)]
    rows += [trial("r1", 10 + i, "calm", 0.96 + d, replicate=True, knobs=knobs) for i, d in enumerate((-0.01, 0, 0.01))]
    kb.append("trials", rows, "t")
    at = open_page(root)
    assert list(at.dataframe[0].value["variant_id"]) == ["calm", "flashy"]
    assert (
        "Ranks 1 and 2 are within noise: 0.0150 apart (rank 1's replicate mean 0.9600, rank 2's best trial 0.9750)"
        in texts(at)
    )


def test_the_best_variant_is_the_pick_on_every_page_and_a_clipped_interval_says_so(tmp_path: Path):
    """User trial: the Lineage page's thick border ("the best variant") and the Leaderboard chart's "best first"
    followed the luckiest single trial (the seed's 0.99) while the board's rank 1 is its child (replicate mean); and
    an accuracy interval reached 1.0751. The Status page's decisions name the best single trial as such."""
    from pickkb import KID_LOW, pick_kb

    root, _ = pick_kb(tmp_path)
    at = open_page(root, "views/lineage.py")
    assert at.selectbox(key="lineage_variant").value == "kid"  # the best variant: first, and the one bordered
    assert "thick border: the best variant, the pick (the Leaderboard's rank 1" in texts(at)
    board = open_page(root)
    spread = board.dataframe[0].value.set_index("variant_id")["spread"]
    assert spread["kid"] == f"0.9700 ± 0.3812 (n=2, 95% t; clipped to [{KID_LOW:.4f}, 1.0000])"
    status = open_page(root, "views/status.py")
    assert "Pick (rank 1): **kid**" in texts(status)


def test_trials_page_lists_every_trial_with_knobs_and_opens_a_failure(tmp_path: Path):
    at = open_page(insight_kb(tmp_path), "views/trials.py")
    table = at.dataframe[0].value
    assert len(table) == 10 and {"LR", "WIDTH", "reason", "work_dir"} <= set(table.columns)
    assert at.selectbox(key="trials_pick").value == "t9"  # the failure first
    shown = texts(at)
    assert "CUDA out of memory" in shown and "exit 1" in shown
    assert any("RuntimeError: CUDA out of memory" in c.value for c in at.code)  # its stderr tail
    assert any("LR = 0.5" in c.value for c in at.code)  # its train.py as run
    at.multiselect(key="trials_status").set_value(["failed"]).run()
    assert list(at.dataframe[0].value["trial_id"]) == ["t9"]
    assert at.get("download_button")


def test_knobs_page_ranks_the_knob_that_moves_the_score_first(tmp_path: Path):
    at = open_page(insight_kb(tmp_path), "views/knobs.py", knobs_scope="seed")
    bars = pa.ipc.open_stream(at.get("vega_lite_chart")[0].proto.datasets[0].data.data).read_all().to_pylist()
    ranked = sorted(bars, key=lambda b: -b["importance"])
    assert ranked[0]["parameter"] == "LR"
    assert "PED-ANOVA" in texts(at)
    parallel = pa.ipc.open_stream(at.get("vega_lite_chart")[1].proto.datasets[0].data.data).read_all()
    assert set(parallel.column("knob").to_pylist()) == {"LR", "WIDTH"} and parallel.num_rows == 2 * len(LRS)
    assert len(at.get("vega_lite_chart")) == 3  # importance, parallel coordinates, slices


def test_compare_page_overlays_two_campaigns_best_variants(tmp_path: Path):
    at = open_page(insight_kb(tmp_path), "views/compare.py", run_id="r1")
    assert at.multiselect(key="compare_pick").value == ["r1/kid", "r2/old"]
    lines = pa.ipc.open_stream(at.get("vega_lite_chart")[0].proto.datasets[0].data.data).read_all()
    assert set(lines.column("run_id").to_pylist()) == {"r1", "r2"}


def test_interventions_page_uses_student_t_and_no_interval_at_n_1(tmp_path: Path):
    at = open_page(insight_kb(tmp_path), "views/interventions.py")
    shown = {r["intervention"]: r for r in at.dataframe[0].value.to_dict("records")}
    assert shown["once"]["interval"] == "n=1, no interval"
    assert shown["once"]["ci_low"] != shown["once"]["ci_low"]  # NaN: no zero-width interval
    assert shown["thrice"]["ci_high"] - shown["thrice"]["mean_delta"] == pytest.approx(4.3027 * 0.01 / 3**0.5, rel=1e-3)


@pytest.mark.parametrize(
    ("basis", "kind"),
    [("replicates", "replicate means"), ("best_trial_vs_replicates", "child's best trial vs parent's replicate mean")],
)
def test_lineage_vs_parent_compares_what_the_verdict_compared(tmp_path: Path, basis: str, kind: str):
    """User trial: the Lineage page's "vs parent" took the child's best trial (0.99) minus the parent's score its
    verdict compared (here the parent's replicate mean 0.955): +0.0350, of two kinds. It now shows the two scores
    the verdict compared, as the report's `compared` column names them (the KB's `interventions` row)."""
    import sys

    from ralph_ray import PROJECT_ROOT
    from ralph_ray.report import COMPARED

    sys.path.insert(0, str(PROJECT_ROOT / "app"))
    import figures

    assert figures.COMPARED == COMPARED  # the app names each basis as the report does
    root = kb_with_run(tmp_path, "finished", stop_reason="max_cycles")
    kb = KnowledgeBase(root)
    child = 0.96 if basis == "replicates" else 0.99
    kb.put(
        "variants",
        [
            {"run_id": "r1", "variant_id": "seed", "cycle": 1, "status": "seed", "interventions": "[]"},
            {
                "run_id": "r1",
                "variant_id": "kid",
                "parent_id": "seed",
                "cycle": 2,
                "status": "kept",
                "interventions": '["batchnorm", "mixup"]',
                "parent_score": 0.955,
            },
            {
                "run_id": "r1",
                "variant_id": "new",
                "parent_id": "seed",
                "cycle": 2,
                "status": "candidate",
                "interventions": '["cosine"]',
                "parent_score": 0.95,
            },
        ],
        "v",
    )
    rows = [trial("r1", 1, "seed", 0.95), trial("r1", 2, "kid", 0.99), trial("r1", 3, "new", 0.97)]
    kb.append("trials", rows, "t")
    effect = {"run_id": "r1", "task": "digits", "cycle": 2, "variant_id": "kid", "parent_id": "seed"}
    effect |= {"parent_score": 0.955, "child_score": child, "delta": child - 0.955, "basis": basis, "outcome": "kept"}
    kb.append("interventions", [effect | {"intervention": n} for n in ("batchnorm", "mixup")], "i")

    metrics = {m.label: m for m in open_page(root, "views/lineage.py", lineage_variant="kid").metric}
    assert metrics["selection score"].value == "0.9900" and not metrics["selection score"].delta
    versus = metrics[f"vs parent ({kind})"]  # the label names what both scores are
    assert versus.value == f"{child - 0.955:+.4f}" and versus.delta == f"{child:.4f} vs 0.9550"
    # Not judged yet (no interventions row): nothing compared, so no delta of mixed kinds
    fresh = {m.label: m for m in open_page(root, "views/lineage.py", lineage_variant="new").metric}
    assert fresh["vs parent"].value == "-" and not fresh["vs parent"].delta


def test_the_leaderboard_says_discarded_variants_rank_last(tmp_path: Path):
    """The rank puts a discarded child below every other variant whatever its scores (sql.py), but neither the
    board nor its within-noise note said so: here the discarded "kid" has the higher replicate mean (0.96 vs 0.955)
    and ranks 2nd, and the note read as if rank 1 had simply measured higher."""
    root = kb_with_run(tmp_path, "finished", stop_reason="max_cycles")
    kb = KnowledgeBase(root)
    kb.put(
        "variants",
        [
            {"run_id": "r1", "variant_id": "seed", "cycle": 1, "status": "seed"},
            {"run_id": "r1", "variant_id": "kid", "parent_id": "seed", "cycle": 2, "status": "discarded"},
        ],
        "v",
    )
    knobs = '{"LR": 0.1}'
    rows = [trial("r1", 1, "seed", 0.95, knobs=knobs), trial("r1", 2, "kid", 0.99, knobs=knobs)]
    rows += replicates({"seed": 0.955, "kid": 0.96}, knobs)
    kb.append("trials", rows, "t")
    at = open_page(root)
    assert list(at.dataframe[0].value["variant_id"]) == ["seed", "kid"]
    shown = texts(at)
    assert "Ranks 1 and 2 are within noise" in shown
    assert "Rank 2 is discarded: a discarded variant ranks below every other, whatever its scores" in shown
    assert "then by the best trial; a discarded variant (its verdict found it no better than its parent) ranks" in shown
