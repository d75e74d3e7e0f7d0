"""`python -m ralph_ray kb sql`: one query over a real KB's views, as a table or CSV, with exit 2 and the views named
on a bad query (kb check and kb compact: tests/app/test_app_health.py, tests/test_kb_compact.py)."""

from __future__ import annotations

import csv
import io
import subprocess
import sys
from pathlib import Path

from ralph_ray.kb import KnowledgeBase


def kb_sql(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ralph_ray", "kb", "sql", *args], capture_output=True, text=True, timeout=120
    )


def test_kb_sql_prints_a_query_over_the_views_as_a_table_or_csv(tmp_path: Path):
    kb = KnowledgeBase(tmp_path / "kb")
    kb.init()
    rows = [
        {"run_id": "r1", "cycle": 1, "trial_id": f"t{n}", "variant_id": "v", "status": "completed", "epochs": n}
        for n in (3, 5, 7)
    ]
    kb.append("trials", rows, "r1-trials")
    query = "select trial_id, epochs from trials where epochs > 4 order by trial_id"
    done = kb_sql(query, "--kb", str(kb.root))
    assert done.returncode == 0, done.stderr
    cells = [line.split("│")[1].strip() for line in done.stdout.splitlines() if line.startswith("│")]
    assert cells == ["trial_id", "varchar", "t5", "t7"]  # header, type, then the rows the query kept
    done = kb_sql(query, "--csv", "--kb", str(kb.root))
    assert done.returncode == 0 and list(csv.DictReader(io.StringIO(done.stdout))) == [
        {"trial_id": "t5", "epochs": "5"},
        {"trial_id": "t7", "epochs": "7"},
    ]
    wrong = kb_sql("select * from leaderbord", "--kb", str(kb.root))
    assert wrong.returncode == 2 and "leaderbord" in wrong.stdout and "leaderboard" in wrong.stdout  # the views named
    missing = kb_sql("select 1", "--kb", str(tmp_path / "none"))
    assert missing.returncode == 2 and "no knowledge base" in missing.stdout
