"""The report's score-against-cost front: a gain bought with more compute is visible as such (the rule: test_front)."""

from __future__ import annotations

from ralph_ray.report import cost_section


def test_the_section_reads_training_seconds_and_shows_a_min_metrics_own_values():
    trials = [
        {"trial_id": "t1", "variant_id": "v", "seconds": 40.0, "selection_score": -2.5, "test_score": -2.6},
        {"trial_id": "t2", "variant_id": "w", "seconds": 60.0, "selection_score": -2.0, "test_score": -2.1},
        {"trial_id": "t3", "variant_id": "w", "seconds": 5.0, "selection_score": None, "test_score": None},
        {
            "trial_id": "r",
            "variant_id": "w",
            "seconds": 9.0,
            "selection_score": -1.0,
            "test_score": -1.0,
            "replicate": 1,
        },
    ]
    lines = cost_section(trials, {"t1": 12.0}, lambda score: None if score is None else -score)
    table = [line for line in lines if line.startswith("| ") and "cost s" not in line and "---" not in line]
    assert table == ["| 12.0 | 2.5000 | 2.6000 | t1 | v |", "| 60.0 | 2.0000 | 2.1000 | t2 | w |"]


def test_a_min_metrics_report_warns_of_a_final_worse_than_the_search_in_its_own_values(tmp_path):
    """User trial: a final training (`deepen` added) scored 0.0341 MSE against the search's 0.0287 for the same
    variant, and the report set the two side by side without a word."""
    from test_export_scores import RUN, write_mse_kb  # the min metric's KB, as the real writer stores it

    from ralph_ray.report import write_report

    kb = write_mse_kb(tmp_path)
    report = write_report(kb.root, RUN, tmp_path / "runs" / RUN).read_text()
    final = report.split("## Final training of the pick")[1].split("\n## ")[0]
    assert "selection 0.0341, test **0.0355**" in final and "best search trial: selection 0.0287" in final
    assert "**warning**: the final training of child scored worse on selection (0.0341) than its best search " in final
    assert "`export RUN_ID --search` ships the search's version" in final
    assert (tmp_path / "runs" / RUN / "report" / "progress.png").stat().st_size > 0


def _async_kb(tmp_path, scored: bool = True):
    """An async campaign as the real writer records it: a seed searched to 0.8490, a replicate of it that drew
    0.8586, three cycles rows (one per lineage depth) and four decisions, the last `stop after cycle 4`."""
    import json

    from ralph_ray.kb import KnowledgeBase

    kb = KnowledgeBase(tmp_path / "kb")
    kb.init()
    run_dir = tmp_path / "runs" / "r1"
    (run_dir / "variants" / "seed" / "files").mkdir(parents=True)
    config = json.dumps({"task": {"name": "news", "metric": "macro_f1", "direction": "max"}})
    kb.append(
        "runs",
        [{"run_id": "r1", "experiment": "news", "task": "news", "run_dir": str(run_dir), "config": config}],
        "r1",
    )
    files = str(run_dir / "variants" / "seed" / "files")
    kb.append(
        "variants", [{"run_id": "r1", "variant_id": "seed", "cycle": 1, "status": "seed", "files_dir": files}], "r1-v"
    )
    scores = [("t1", 0.8012, False), ("t2", 0.8490, False), ("rep1", 0.8586, True), ("t3", 0.8301, False)]
    for trial_id, score, replicate in scores:  # one part each: written_at orders the timeline
        kb.append(
            "trials",
            [
                {
                    "run_id": "r1",
                    "cycle": 1,
                    "trial_id": trial_id,
                    "variant_id": "seed",
                    "status": "completed" if scored else "failed",
                    "selection_score": score if scored else None,
                    "test_score": score - 0.02 if scored else None,
                    "seconds": 2.0,
                    "epochs": 2,
                    "replicate": replicate,
                }
            ],
            f"r1-{trial_id}",
        )
    kb.append("cycles", [{"run_id": "r1", "cycle": c, "trials": 1} for c in (1, 2, 3)], "r1-cycles")
    decisions = [(c, "continue", "none", 0) for c in (1, 2, 3)] + [(4, "stop", "max_cycles", 0)]
    if not scored:
        decisions = [(1, "stop", "no_trial_completed", 4)]
    kb.append(
        "decisions",
        [
            {"run_id": "r1", "cycle": c, "decision": d, "reason": r, "exit_code": e, "rationale": "-", "elapsed_s": 9.0}
            for c, d, r, e in decisions
        ],
        "r1-decisions",
    )
    return kb, run_dir


def test_the_progress_line_leaves_replicates_out_as_the_cost_front_does(tmp_path):
    """User trial: progress.png's running best stepped up to a replicate's 0.8586, above the 0.8490 that status, the
    report and the decisions gave as the best single trial."""
    from ralph_ray import sql
    from ralph_ray.kb import open_reader
    from ralph_ray.report import fetch_rows, running_best

    kb, _ = _async_kb(tmp_path)
    timeline = fetch_rows(open_reader(kb.root), sql.TRIAL_TIMELINE, ["r1"])
    assert [t["trial_id"] for t in timeline] == ["t1", "t2", "rep1", "t3"]
    steps = running_best(timeline)
    assert [t["trial_id"] for t, _ in steps] == ["t1", "t2", "t3"]
    assert [best for _, best in steps] == [0.8012, 0.8490, 0.8490]


def test_the_cost_section_counts_the_cycles_the_decisions_count(tmp_path):
    """User trial: an async run's report said "cycles: 3" under "stop after cycle 4" (its KB has a cycles row per
    lineage depth, its decisions one per generation closed; status and max_cycles count the latter)."""
    from ralph_ray.report import write_report

    kb, run_dir = _async_kb(tmp_path)
    report = write_report(kb.root, "r1", run_dir).read_text()
    assert "- outcome: stop after cycle 4" in report
    assert "- cycles: 4, trials: 4" in report


def test_a_run_without_a_completed_trial_has_no_best_variant(tmp_path):
    """User trial: a run whose every trial failed (exit 4) named its seed, 0 completed, "best variant"."""
    from ralph_ray.report import write_report

    kb, run_dir = _async_kb(tmp_path, scored=False)
    report = write_report(kb.root, "r1", run_dir).read_text()
    assert "- best variant: none (no variant has a completed trial)" in report
    assert "The seed is the best variant" not in report and "None: no variant has a completed trial." in report


def test_a_child_asha_stopped_in_every_trial_is_shown_not_judged_with_the_fix(tmp_path):
    """User trial: children with 1-2 trials each were all stopped by ASHA at epoch 2; the report's table said only
    `discarded` and `-`, the reason was in events.jsonl alone."""
    from ralph_ray.report import write_report

    kb, run_dir = _async_kb(tmp_path)
    kb.append(
        "variants",
        [{"run_id": "r1", "variant_id": "cosine", "parent_id": "seed", "cycle": 2, "status": "discarded"}],
        "r1-v2",
    )
    stopped = {"run_id": "r1", "cycle": 2, "variant_id": "cosine", "status": "stopped_early", "seconds": 1.0}
    kb.append(
        "trials", [{**stopped, "trial_id": "c1", "epochs": 2}, {**stopped, "trial_id": "c2", "epochs": 2}], "r1-c"
    )
    report = write_report(kb.root, "r1", run_dir).read_text()
    row = next(line for line in report.splitlines() if line.startswith("| ") and "| cosine |" in line)
    assert "| discarded (not judged: no trial completed) | - | - |" in row and row.endswith("| 0/2/0 |")
    assert "raise `scheduler.grace_period` or `population.trials_per_child`" in report
    seed_row = next(line for line in report.splitlines() if line.startswith("| ") and "| seed |" in line)
    assert "not judged" not in seed_row


def _siblings_kb(tmp_path):
    """A campaign as the real writer records it: the seed `p` (first trial 0.9554, replicate mean 0.94845) and its
    children: `k` kept on replicates, `h` not worth replicating, `r` refused by the gate, `x` crashed, and `c`, which
    the gate caught importing the engine (the held-out labels) on its first attempt and let run on its second."""
    import dataclasses
    import json

    from ralph_ray import records
    from ralph_ray.children import Child
    from ralph_ray.config import AgentConfig
    from ralph_ray.decision import child_verdict
    from ralph_ray.gate import GateError, check_reach
    from ralph_ray.kb import KnowledgeBase
    from ralph_ray.noise import Sample, welch_greater
    from ralph_ray.replicates import Replicated, evidence
    from ralph_ray.variants import RejectedBy, VariantStatus

    kb = KnowledgeBase(tmp_path / "kb")
    kb.init()
    run_dir = tmp_path / "runs" / "r1"
    config = json.dumps({"task": {"name": "digits", "metric": "accuracy", "direction": "max"}})
    kb.append(
        "runs", [{"run_id": "r1", "experiment": "e", "task": "digits", "run_dir": str(run_dir), "config": config}], "r1"
    )

    def child(variant_id: str, intervention: str, **changes) -> Child:
        files = run_dir / "variants" / variant_id / "files"
        files.mkdir(parents=True)
        made = Child(
            variant_id,
            "p",
            files,
            [intervention],
            "underfitting",
            "why",
            VariantStatus.candidate,
            None,
            "diff",
            {},
            0.9554,
        )  # the parent's best trial when it was bred from: its first
        return dataclasses.replace(made, **changes)

    seed = dataclasses.replace(
        child("p", "-"), parent_id="", interventions=[], status=VariantStatus.seed, parent_score=None
    )
    try:  # what the gate says of a draft that reads the held-out labels through the engine
        check_reach({"train.py": "from ralph_ray.tasks import digits\n"})
    except GateError as err:
        caught = f"attempt 1: {err}"
    kids = [
        child("k", "wider"),
        child("h", "dropout"),
        child("r", "mixup", status=VariantStatus.rejected, reason="smoke run failed: NaN", rejected_by=RejectedBy.gate),
        child("x", "deeper"),
        child("c", "label_smoothing", refusals=[caught]),
    ]
    agent = AgentConfig()
    kb.put("variants", records.variant_rows("r1", 1, [seed], agent), records.part("r1", 1, "seed"))
    kb.put("variants", records.variant_rows("r1", 2, kids, agent), records.part("r1", 2, "bred"))
    trials = [("p", "t1", 0.9554, False), ("p", "t2", 0.9526, True), ("p", "t3", 0.9443, True)]
    trials += [("k", "t4", 0.975, False), ("k", "t5", 0.968, True), ("k", "t6", 0.970, True)]
    trials += [("h", "t7", 0.9331, False), ("c", "t8", 0.99, False), ("x", "t9", None, False)]
    for variant, trial_id, score, replicate in trials:
        kb.append(
            "trials",
            [
                {
                    "run_id": "r1",
                    "cycle": 1 if variant == "p" else 2,
                    "trial_id": trial_id,
                    "variant_id": variant,
                    "status": "failed" if score is None else "completed",
                    "selection_score": score,
                    "test_score": score,
                    "seconds": 2.0,
                    "epochs": 2,
                    "replicate": replicate,
                    "knobs": "{}",
                }
            ],
            f"r1-{trial_id}",
        )
    reps = {"p": Replicated(2, (1, 2), Sample.of([0.9526, 0.9443]), Sample(()))}
    verdicts = {
        "k": (0.975, welch_greater(Sample.of([0.968, 0.970]), reps["p"].sample, 0.9)),
        "h": (0.9331, evidence(kids[1], 0.9331, reps, 0.9554, 0.9)),
        "c": (0.99, None),  # replicates off for it: its best trial against its parent's
        "x": (None, None),
    }
    judged, scores = [], {}
    for kid in kids:
        if kid.variant_id in verdicts:
            score, comparison = verdicts[kid.variant_id]
            failed = int(score is None)
            kid.status, kid.reason = child_verdict(1, failed, score, 0.9554, 0.0, kid.reason, comparison)
            kid.parent_score = records.measured(score, 0.9554, comparison)[1]
            if score is not None:
                scores[kid.variant_id] = (score, None)
            kb.put(
                "interventions",
                records.intervention_rows("r1", "digits", 2, kid, score, comparison),
                records.part("r1", 2, "effects", kid.variant_id),
            )
            judged.append(kid)
        else:
            kb.put(
                "interventions",
                records.intervention_rows("r1", "digits", 2, kid, None),
                records.part("r1", 2, "refused", kid.variant_id),
            )
    kb.put("variants", records.variant_rows("r1", 2, judged, agent, scores), records.part("r1", 2, "judged"))
    return kb, run_dir


def test_siblings_show_their_parents_score_as_their_verdicts_compared_it(tmp_path):
    """User trial: siblings of one parent showed different parent scores in the report's Interventions table, the
    parent's first trial (0.9554) beside its replicate mean (0.9485): a child that compared no score of its own
    (refused by the gate, crashed) carried the parent's score from when it was bred. A parent score is the one the
    child's verdict compared its own with, and what was compared is named; none where nothing was."""
    from ralph_ray.kb import open_reader
    from ralph_ray.report import write_report

    kb, run_dir = _siblings_kb(tmp_path)
    report = write_report(kb.root, "r1", run_dir).read_text()
    table = report.split("## Interventions")[1].split("\n## ")[0]
    rows = {cells[1]: cells for line in table.splitlines() if line.startswith("| 2 |") for cells in [line.split(" | ")]}
    assert rows["k"][4] == rows["h"][4] == "0.9485"  # both compared with the parent's replicate mean
    assert "replicate means" in rows["k"][7] and "replicate mean" in rows["h"][7]
    assert rows["c"][4] == "0.9554" and "best trials" in rows["c"][7]  # judged on best trials: the parent's best
    assert rows["r"][4] == rows["x"][4] == "-"  # nothing compared: no parent score
    con = open_reader(kb.root)
    shown = con.execute(
        "select variant_id, parent_score from interventions where parent_score is not null and basis is null"
    ).fetchall()
    assert shown == []  # the KB says the same: a parent score only beside what it was compared with
    assert con.execute("select parent_score from variants where variant_id in ('r', 'x')").fetchall() == [(None,)] * 2


def test_a_child_the_gate_caught_reaching_outside_is_marked_in_the_report(tmp_path):
    """User trial: a child caught reading held-out labels left no mark on its variant row, and the report said
    nothing of it: it shows in the leaderboard and in a section of what the gate refused."""
    from ralph_ray.report import write_report

    kb, run_dir = _siblings_kb(tmp_path)
    report = write_report(kb.root, "r1", run_dir).read_text()
    board = report.split("## Leaderboard")[1].split("\n## ")[0]
    (line,) = [row for row in board.splitlines() if row.startswith("| ") and " | c | " in row]
    assert "caught reaching outside" in line
    refused = report.split("## What the gate refused")[1].split("\n## ")[0]
    assert "c (+label_smoothing), kept" in refused and "**reached outside its work dir**" in refused
    assert "imports ralph_ray.tasks" in refused
    assert "r (+mixup), rejected" in refused and "smoke run failed: NaN" in refused


def test_a_damaged_part_of_the_run_refuses_the_report_and_keeps_the_old_one(tmp_path):
    """User trial: `report RUN` over a half-truncated part of that run overwrote a good report with one of
    `trials: 0` and exited 0. It now refuses, naming the file and the repair, and the old report stays."""
    import pytest

    from ralph_ray.kb import DamagedPartWarning, DamagedRunError
    from ralph_ray.report import write_report

    kb, run_dir = _async_kb(tmp_path)
    kb.append("runs", [{"run_id": "other", "status": "finished"}], "other")  # another campaign on the same KB
    kb.append("trials", [{"run_id": "other", "trial_id": "o1", "variant_id": "seed"}], "other-c1-o1")
    good = write_report(kb.root, "r1", run_dir).read_text()
    assert "trials: 4" in good
    kb.compact_run("r1")  # the finished run folded into `r1-all`, as a campaign's end leaves it
    bad = kb.parquet / "trials" / "r1-all.parquet"
    with bad.open("r+b") as part:
        part.truncate(bad.stat().st_size // 2)
    with pytest.raises(DamagedRunError) as refused:
        write_report(kb.root, "r1", run_dir)
    assert str(bad) in str(refused.value) and f"python -m ralph_ray kb check --repair --kb {kb.root}" in str(
        refused.value
    )
    assert (run_dir / "report" / "final_report.md").read_text() == good
    # Another run's damaged part leaves this report whole (it is skipped with a warning, as status skips it).
    bad.rename(tmp_path / "aside.parquet")
    kb.append("trials", [{"run_id": "r1", "trial_id": "t9", "variant_id": "seed", "status": "failed"}], "r1-c1-t9")
    other = next((kb.parquet / "trials").glob("other-*.parquet"))
    other.write_bytes(b"not parquet")
    with pytest.warns(DamagedPartWarning, match="run other's trials rows"):
        assert "trials: 1" in write_report(kb.root, "r1", run_dir).read_text()


def test_a_damaged_compacted_file_refuses_the_report_of_a_run_compacted_into_it(tmp_path):
    """Review: after compact_kb, a truncated `trials/_kb-000001` was no part of r1's own (r1's runs row still read),
    so `report r1` wrote `trials: 0` over a good report. It refuses, naming the command that writes the report once
    repaired (at a campaign's end "run this command again" would start a campaign)."""
    import io

    import pytest
    from rich.console import Console

    from ralph_ray import commands
    from ralph_ray.kb import DamagedRunError
    from ralph_ray.report import write_report

    kb, run_dir = _async_kb(tmp_path)
    kb.append("runs", [{"run_id": "other", "status": "finished"}], "other")
    kb.append("trials", [{"run_id": "other", "trial_id": "o1", "variant_id": "seed"}], "other-c1-o1")
    good = write_report(kb.root, "r1", run_dir).read_text()
    kb.compact_grace_s = 0.0
    for run_id in ("r1", "other"):
        kb.compact_run(run_id)
    kb.compact_kb()
    bad = kb.parquet / "trials" / "_kb-000001.parquet"
    with bad.open("r+b") as part:
        part.truncate(100)
    with pytest.raises(DamagedRunError) as refused:
        write_report(kb.root, "r1", run_dir)
    command = f"python -m ralph_ray report r1 paths.runs={run_dir.parent} paths.kb={kb.root}"
    assert str(bad) in str(refused.value) and f"write the report with `{command}`" in str(refused.value)
    (run_dir / "state.json").write_text("{}")  # a run dir as the campaign leaves it (the command looks for it)
    said = io.StringIO()  # the `report` command: exit 2 with the same message (no traceback)
    assert (
        commands.main(
            ["report", "r1", "--runs", str(run_dir.parent), "--kb", str(kb.root)], Console(file=said, soft_wrap=True)
        )
        == 2
    )
    assert str(bad) in " ".join(said.getvalue().split())
    assert (run_dir / "report" / "final_report.md").read_text() == good


def test_the_leaderboard_legend_says_discarded_variants_rank_last(tmp_path):
    """User trial: a discarded child with the higher replicate mean ranked 2nd under a legend that said only
    "ranked by the replicate mean"; sql.LEADERBOARD ranks a discarded variant below every other."""
    from ralph_ray.report import write_report

    kb, run_dir = _async_kb(tmp_path)
    report = write_report(kb.root, "r1", run_dir).read_text()
    assert "a discarded variant (its verdict found it no better than its parent) ranks below every other" in report
