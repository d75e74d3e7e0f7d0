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
