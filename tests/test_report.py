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
