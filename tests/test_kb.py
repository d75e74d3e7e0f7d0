"""The knowledge base: atomic Parquet parts, views, and readers in other processes while a writer appends."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import duckdb
import pytest

from ralph_ray.kb import DB_FILE, DamagedPartWarning, KnowledgeBase, open_reader, part_run
from ralph_ray.sql import TABLES


def trial_row(run_id: str, trial_id: str, score: float | None, status: str = "completed") -> dict:
    return {
        "run_id": run_id,
        "cycle": 1,
        "trial_id": trial_id,
        "variant_id": "v1",
        "status": status,
        "knobs": "{}",
        "epochs": 2,
        "selection_score": score,
        "test_score": score,
        "seconds": 1.0,
    }


def test_empty_kb_has_queryable_views(tmp_path: Path):
    kb = KnowledgeBase(tmp_path / "kb")
    kb.init()
    con = kb.reader()
    for view in ("runs", "cycles", "variants", "trials", "epochs", "leaderboard", "curves"):
        assert con.execute(f"select count(*) from {view}").fetchone() == (0,)


def test_leaderboard_ranks_variants_across_campaigns(tmp_path: Path):
    kb = KnowledgeBase(tmp_path / "kb")
    kb.init()
    kb.append(
        "trials",
        [trial_row("r1", "a", 0.9), trial_row("r1", "b", 0.95), trial_row("r1", "c", None, "stopped_early")],
        "r1",
    )
    kb.append("trials", [{**trial_row("r2", "d", 0.8), "variant_id": "v2"}], "r2")
    kb.append("epochs", [{"run_id": "r1", "trial_id": "a", "epoch": 1, "metric": "val_acc", "value": 0.5}], "r1")
    con = kb.reader()
    rows = con.execute(
        "select run_id, variant_id, selection_score, best_trial_id, trials, completed, stopped_early, rank from "
        "leaderboard"
    ).fetchall()
    assert rows == [("r1", "v1", 0.95, "b", 3, 2, 1, 1), ("r2", "v2", 0.8, "d", 1, 1, 0, 1)]
    assert con.execute("select val_acc from curves where trial_id = 'a'").fetchone() == (0.5,)


def test_leaderboard_best_trial_of_tied_scores_is_one_row_on_every_read(tmp_path: Path):
    # Ties on the selection score are common (one selection image apart): the best trial, its test score and its
    # knobs must come from one row, the first written (finals.final_winner's rule), and the same row on every read.
    kb = KnowledgeBase(tmp_path / "kb")
    kb.init()
    order = [7, 3, 11, 0, 5, 9, 1, 10, 2, 8, 4, 6]  # written in this order: the first written is not the smallest id
    for i in order:  # one part per trial, as the engine writes them: many scan orders to differ
        row = {**trial_row("r1", f"t{i:02d}", 0.9), "test_score": 0.5 + i / 100, "knobs": f'{{"i": {i}}}'}
        kb.append("trials", [row], f"r1-{i}")
    con = kb.reader()
    reads = {
        con.execute("select best_trial_id, test_score, best_knobs, selection_score from leaderboard").fetchone()
        for _ in range(20)
    }
    assert reads == {("t07", 0.5 + 7 / 100, '{"i": 7}', 0.9)}


def test_runs_view_keeps_latest_status(tmp_path: Path):
    kb = KnowledgeBase(tmp_path / "kb")
    kb.init()
    kb.append("runs", [{"run_id": "r1", "status": "running"}], "r1")
    kb.append("runs", [{"run_id": "r1", "status": "finished", "stop_reason": "max_cycles"}], "r1")
    assert kb.reader().execute("select status, stop_reason from runs").fetchall() == [("finished", "max_cycles")]


def test_unknown_column_is_refused(tmp_path: Path):
    kb = KnowledgeBase(tmp_path / "kb")
    kb.init()
    with pytest.raises(ValueError, match="no columns"):
        kb.append("trials", [{"run_id": "r", "bogus": 1}], "r")


def test_open_reader_without_kb_names_the_fix(tmp_path: Path):
    with pytest.raises(FileNotFoundError, match="run a campaign first"):
        open_reader(tmp_path / "nothing")


def test_kb_duckdb_opens_read_only_from_any_cwd_and_moves(tmp_path: Path):
    kb = KnowledgeBase(tmp_path / "kb")
    kb.init()
    kb.append("trials", [trial_row("r1", "a", 0.7)], "r1")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    query = (
        "import duckdb; c = duckdb.connect('{db}', read_only=True); "
        "print(c.execute('select selection_score from leaderboard').fetchone()[0])"
    )
    out = subprocess.run(
        [sys.executable, "-c", query.format(db=tmp_path / "kb" / DB_FILE)],
        cwd=elsewhere,
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == "0.7"
    # A KB copied elsewhere gets its views re-pointed when it is opened there.
    shutil.copytree(tmp_path / "kb", tmp_path / "moved")
    shutil.rmtree(tmp_path / "kb")
    KnowledgeBase(tmp_path / "moved").init()
    out = subprocess.run(
        [sys.executable, "-c", query.format(db=tmp_path / "moved" / DB_FILE)],
        cwd=elsewhere,
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == "0.7"


def test_duckdb_shell_reads_the_views(tmp_path: Path):
    shell = shutil.which("duckdb") or str(Path(sys.executable).parent / "duckdb")
    if not Path(shell).exists():
        pytest.skip("duckdb-cli is not installed (pip install -e '.[dev]')")
    kb = KnowledgeBase(tmp_path / "kb")
    kb.init()
    kb.append("trials", [trial_row("r1", "a", 0.625)], "r1")
    out = subprocess.run(
        [
            shell,
            str(tmp_path / "kb" / DB_FILE),
            "-readonly",
            "-csv",
            "-c",
            "select selection_score from leaderboard limit 5",
        ],
        cwd="/",
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["selection_score", "0.625"]


READER = textwrap.dedent("""
    import sys, time, duckdb
    from pathlib import Path
    from ralph_ray.kb import open_reader
    root, db = Path(sys.argv[1]), sys.argv[2]
    seen, errors = 0, 0
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        con = open_reader(root)  # in-memory views: never locks
        n = con.execute("select count(*) from trials").fetchone()[0]
        assert con.execute("select count(*) from trials where selection_score is null").fetchone()[0] == 0
        seen = max(seen, n)
        try:
            shell = duckdb.connect(db, read_only=True)  # the file the duckdb shell opens
            shell.execute("select count(*) from leaderboard").fetchone()
            shell.close()
        except duckdb.IOException as err:
            errors += 1
            print("LOCK", err, file=sys.stderr)
        if n >= 200:
            break
    print(seen, errors)
""")


def test_concurrent_reader_while_writing(tmp_path: Path):
    kb = KnowledgeBase(tmp_path / "kb")
    kb.init()
    reader = subprocess.Popen(
        [sys.executable, "-c", READER, str(tmp_path / "kb"), str(tmp_path / "kb" / DB_FILE)],
        cwd="/",
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    for i in range(200):
        kb.append("trials", [trial_row("r1", f"t{i}", 0.5 + i / 1000)], f"r1-{i}")
    out, err = reader.communicate(timeout=60)
    assert reader.returncode == 0, err
    seen, lock_errors = map(int, out.split())
    assert seen == 200
    assert lock_errors == 0, err


def test_compaction_merges_a_cycles_parts_without_losing_or_doubling_rows(tmp_path: Path):
    kb = KnowledgeBase(tmp_path / "kb")
    kb.init()
    for n in range(5):
        kb.append(
            "trials",
            [{"run_id": "r", "cycle": 1, "trial_id": f"t{n}", "variant_id": "v", "status": "completed"}],
            f"r-c1-t{n}",
        )
    kb.append(
        "trials",
        [{"run_id": "r", "cycle": 12, "trial_id": "other", "variant_id": "v", "status": "completed"}],
        "r-c12-other",
    )
    assert kb.compact("trials", "r-c1-", "r-c0001-compacted") == 5
    files = sorted(p.name for p in (kb.parquet / "trials").glob("*.parquet"))
    assert "r-c0001-compacted.parquet" in files and len(files) == 3  # schema part, compacted part, cycle 12 untouched
    kb.append(
        "trials", [{"run_id": "r", "cycle": 1, "trial_id": "t5", "variant_id": "v", "status": "failed"}], "r-c1-t5"
    )
    assert kb.compact("trials", "r-c1-", "r-c0001-compacted") == 1  # a resumed cycle folds in its new parts
    con = kb.reader()
    assert con.execute("select count(*), count(distinct trial_id) from trials where cycle = 1").fetchone() == (6, 6)
    assert kb.compact("trials", "r-c1-", "r-c0001-compacted") == 0


def test_budgets_sum_each_runs_own_rows_and_a_run_without_any_reads_zero(tmp_path: Path):
    from ralph_ray import sql

    kb = KnowledgeBase(tmp_path / "kb")
    kb.init()
    for run_id in ("a", "b", "idle"):
        kb.put("runs", [{"run_id": run_id, "status": "finished"}], f"{run_id}-run")
    kb.put("trials", [trial_row("a", "t1", 0.5), trial_row("a", "t2", None, "failed"), trial_row("b", "t3", 0.7)], "t")
    kb.put("cycles", [{"run_id": "a", "cycle": 1}, {"run_id": "a", "cycle": 2}, {"run_id": "b", "cycle": 1}], "c")
    kb.put("agent_usage", [{"run_id": "a", "cycle": 1, "tokens_in": 10, "tokens_out": 5, "cost": 0.25}], "u")
    kb.put("decisions", [{"run_id": "a", "cycle": 1, "best_selection_score": 0.4}], "d1")
    kb.put("decisions", [{"run_id": "a", "cycle": 2, "best_selection_score": 0.5}], "d2")
    con = kb.reader()
    columns = "cycles, trials, trial_hours, tokens, cost, best_selection_score"
    got = {
        run_id: con.execute(f"select {columns} from ({sql.BUDGET_FOR_RUN})", [run_id]).fetchone()
        for run_id in ("a", "b", "idle")
    }
    assert got["a"] == (2, 2, pytest.approx(2 / 3600), 15, 0.25, 0.5)
    assert got["b"] == (1, 1, pytest.approx(1 / 3600), 0, 0.0, None)
    assert got["idle"] == (0, 0, 0, 0, 0, None)


def test_a_finished_run_folds_into_one_part_per_table_and_reads_the_same(tmp_path: Path):
    kb = KnowledgeBase(tmp_path / "kb")
    kb.init()
    for run_id in ("r1", "r1-b"):  # the second id starts with the first: its parts must stay its own
        kb.put("runs", [{"run_id": run_id, "status": "finished"}], run_id)
        for cycle in (1, 2):
            kb.put("trials", [trial_row(run_id, f"{run_id}-t{cycle}", cycle / 10)], f"{run_id}-c{cycle:04d}-trials")
            epochs = [
                {"run_id": run_id, "trial_id": f"{run_id}-t{cycle}", "epoch": 1, "metric": "val_acc", "value": 0.1}
            ]
            kb.put("epochs", epochs, f"{run_id}-c{cycle:04d}-epochs")
            kb.put("decisions", [{"run_id": run_id, "cycle": cycle, "decision": "continue"}], f"{run_id}-c{cycle:04d}")
    before = {t: sorted(kb.reader().execute(f"select * exclude (written_at) from {t}").fetchall()) for t in TABLES}
    assert kb.compact_run("r1") == 7  # runs 1 + trials 2 + epochs 2 + decisions 2
    names = {t: sorted(p.name for p in (kb.parquet / t).glob("*.parquet")) for t in ("trials", "runs")}
    assert names["trials"] == [
        "_schema.parquet",
        "r1-all.parquet",
        "r1-b-c0001-trials.parquet",
        "r1-b-c0002-trials.parquet",
    ]
    assert names["runs"] == ["_schema.parquet", "r1-all.parquet", "r1-b.parquet"]
    after = {t: sorted(kb.reader().execute(f"select * exclude (written_at) from {t}").fetchall()) for t in TABLES}
    assert after == before
    assert kb.compact_run("r1") == 0  # nothing left to fold


def test_lineage_path_reads_as_interventions_from_the_seed(tmp_path: Path):
    # A SQL user reads `seed > batchnorm > knobs > raise_lr + mixup`, not the JSON lists the variants table stores.
    kb = KnowledgeBase(tmp_path / "kb")
    kb.init()
    chain = [
        ("v1", None, None),
        ("v2", "v1", '["batchnorm"]'),
        ("v3", "v2", "[]"),
        ("v4", "v3", '["raise_lr", "mixup"]'),
    ]
    kb.append(
        "variants",
        [
            {"run_id": "r", "variant_id": v, "parent_id": p, "cycle": i + 1, "status": "kept", "interventions": iv}
            for i, (v, p, iv) in enumerate(chain)
        ],
        "r",
    )
    rows = kb.reader().execute("select variant_id, depth, step, path from lineage order by variant_id").fetchall()
    assert rows == [
        ("v1", 0, "seed", "seed"),
        ("v2", 1, "batchnorm", "seed > batchnorm"),
        ("v3", 2, "knobs", "seed > batchnorm > knobs"),
        ("v4", 3, "raise_lr + mixup", "seed > batchnorm > knobs > raise_lr + mixup"),
    ]


def test_leaderboard_ranks_replicated_variants_by_their_replicate_mean_before_lucky_best_trials(tmp_path: Path):
    kb = KnowledgeBase(tmp_path / "kb")
    kb.init()

    def row(trial: str, variant: str, score: float, replicate: bool = False) -> dict:
        return {**trial_row("r1", trial, score), "variant_id": variant, "replicate": replicate}

    kb.append(
        "trials",
        [
            row("a1", "lucky", 0.99),  # one lucky search trial, never replicated
            row("b1", "steady", 0.97),  # best trial below lucky's, replicates 0.96 on average
            *(row(f"b{i}", "steady", s, True) for i, s in ((2, 0.95), (3, 0.96), (4, 0.97))),
            row("c1", "flashy", 0.98),  # best trial above steady's, but its replicates average 0.94
            *(row(f"c{i}", "flashy", s, True) for i, s in ((2, 0.93), (3, 0.94), (4, 0.95))),
        ],
        "r1",
    )
    rows = kb.reader().execute("select variant_id, rank, selection_score, mean_score from leaderboard").fetchall()
    assert [(v, r) for v, r, _, _ in rows] == [("steady", 1), ("flashy", 2), ("lucky", 3)]
    assert rows[0][2:] == (0.97, pytest.approx(0.96)) and rows[2][3] is None
    # Without replicates the best search trial ranks, as before.
    kb.append("trials", [{**row("d1", "other", 0.9), "run_id": "r2"}, {**row("d2", "more", 0.8), "run_id": "r2"}], "r2")
    ranked = kb.reader().execute("select variant_id, rank from leaderboard where run_id = 'r2' order by rank")
    assert ranked.fetchall() == [("other", 1), ("more", 2)]


def test_the_pick_never_contradicts_a_verdict_and_exact_ties_go_to_the_ancestor(tmp_path: Path):
    # User trials: a discarded raise_lr child whose replicate mean equalled the seed's exactly (0.95914577) ranked 1
    # on its luckier best trial and was exported; another, on a higher mean not shown better at 90%, was the pick
    # beside "kept: none". The verdict is the campaign's own test: a discarded variant ranks below the rest.
    from ralph_ray import sql

    kb = KnowledgeBase(tmp_path / "kb")
    kb.init()
    variants = [("seed", None, "seed", 1), ("tied", "seed", "discarded", 2), ("noisy", "seed", "discarded", 2)]
    variants += [("later", "seed", "kept", 3)]
    kb.put(
        "variants",
        [{"run_id": "r1", "variant_id": v, "parent_id": p, "status": s, "cycle": c} for v, p, s, c in variants],
        "r1",
    )

    def row(trial: str, variant: str, score: float, replicate: bool = False) -> dict:
        return {**trial_row("r1", trial, score), "variant_id": variant, "replicate": replicate}

    def replicas(variant: str, scores: tuple[float, ...]) -> list[dict]:
        return [row(f"{variant}{i}", variant, s, True) for i, s in enumerate(scores)]

    kb.append("trials", [row("s", "seed", 0.96), *replicas("seed", (0.95914577, 0.95914577))], "c1")
    kb.append("trials", [row("t", "tied", 0.99), *replicas("tied", (0.95914577, 0.95914577))], "c2")
    kb.append("trials", [row("n", "noisy", 0.98), *replicas("noisy", (0.96, 0.99))], "c2b")
    rows = kb.reader().execute("select variant_id, rank from leaderboard where run_id = 'r1' order by rank")
    assert rows.fetchall() == [("seed", 1), ("noisy", 2), ("tied", 3)]
    assert kb.reader().execute(sql.PICK, ["r1"]).fetchone() == ("seed",)
    # Between variants no verdict rejected, an exact tie of replicate means goes to the earlier (the ancestor), not
    # to the luckier best trial.
    kb.append("trials", [row("l", "later", 0.999), *replicas("later", (0.95914577, 0.95914577))], "c3")
    rows = kb.reader().execute("select variant_id, rank from leaderboard where run_id = 'r1' order by rank")
    assert rows.fetchall()[:2] == [("seed", 1), ("later", 2)]
    assert kb.reader().execute(sql.PICK, ["r1"]).fetchone() == ("seed",)


def test_a_trial_cut_by_the_campaigns_end_says_so_also_as_older_kbs_recorded_it(tmp_path: Path):
    """User trial: a trial cut by max_cycles read "stopped with the cycle (manual stop or time budget)". The reason
    names the campaign's end now; rows of older KBs read as the new reason, so every query still matches them."""
    from ralph_ray import history
    from ralph_ray.statuses import LEGACY_STOPPED_WITH_CYCLE, STOPPED_WITH_CYCLE

    assert "max_cycles" in STOPPED_WITH_CYCLE and "campaign's end" in STOPPED_WITH_CYCLE
    kb = KnowledgeBase(tmp_path / "kb")
    kb.init()
    old = {**trial_row("r1", "old", None, "stopped_early"), "reason": LEGACY_STOPPED_WITH_CYCLE}
    new = {**trial_row("r1", "new", None, "stopped_early"), "reason": STOPPED_WITH_CYCLE}
    asha = {**trial_row("r1", "asha", None, "stopped_early"), "reason": "ASHA: val_acc 0.3 at epoch 2 ..."}
    kb.append("trials", [old, new, asha, trial_row("r1", "done", 0.9)], "r1")
    reasons = dict(kb.reader().execute("select trial_id, reason from trials").fetchall())
    assert reasons["old"] == reasons["new"] == STOPPED_WITH_CYCLE and reasons["asha"].startswith("ASHA:")
    # a resumed cycle runs both cut trials again: the trials it keeps are the ASHA stop and the completed one
    assert sorted(history.trials_done(kb.reader(), "r1", 1, STOPPED_WITH_CYCLE)) == ["v1", "v1"]


def test_the_readme_lists_every_column_of_every_view(tmp_path: Path):
    """A user asked which columns `leaderboard`, `interventions`, `budgets`... have: the README's table says, and
    stays what the views give (`view | columns` rows; a note in brackets after the names is not a column)."""
    import re

    from ralph_ray import PROJECT_ROOT
    from ralph_ray.sql import ALL_TABLES

    kb = KnowledgeBase(tmp_path / "kb")
    kb.init()
    con = kb.reader()
    views = (*ALL_TABLES, "leaderboard", "curves", "lineage", "intervention_effects", "budgets", "not_applicable")
    readme = (PROJECT_ROOT / "README.md").read_text()
    listed = {
        name: {c.strip() for c in re.sub(r"\([^)]*\)|then one column per metric:", "", cells).split(",")}
        for name, cells in re.findall(r"^\| `(\w+)` \| ([^|]+) \|$", readme, flags=re.M)
    }
    for view in views:
        columns = {row[0] for row in con.execute(f"describe {view}").fetchall()}
        assert listed.get(view) == columns, view


def _two_runs_one_damaged(tmp_path: Path, damaged: str = "old") -> tuple[Path, Path]:
    """Two runs as the writers leave them ('old' finished and folded into `old-all`, 'new' still in its cycles'
    parts), with one trials part of `damaged` cut to 100 bytes as a user trial's `truncate -s 100` did."""
    kb = KnowledgeBase(tmp_path / "kb")
    kb.init()
    for run_id in ("old", "new"):
        kb.put("runs", [{"run_id": run_id, "status": "finished"}], run_id)
        kb.put("trials", [trial_row(run_id, f"{run_id}-t1", 0.5)], f"{run_id}-c0001-trials")
    kb.compact_run("old")
    bad = next(p for p in (kb.parquet / "trials").glob(f"{damaged}-*.parquet"))
    with bad.open("r+b") as part:
        part.truncate(100)
    return kb.root, bad


def test_a_campaigns_reader_leaves_out_another_runs_damaged_part_and_names_it(tmp_path: Path):
    """User trial: one truncated part of another run stopped every new campaign on the KB (a raw DuckDB traceback
    from KnowledgeBase.reader()); the campaign's reader now leaves it out, as status and the app do."""
    root, bad = _two_runs_one_damaged(tmp_path)
    (root / DB_FILE).unlink()  # stale: a new campaign's init writes it again
    kb = KnowledgeBase(root)  # a new campaign's writer
    kb.init()
    assert kb.reader().execute("select trial_id from trials").fetchall() == [("new-t1",)]
    mine, others = kb.check_parts("new")
    assert mine == {} and list(others) == [bad]
    note = kb.damaged_note(bad, others[bad])
    assert str(bad) in note and "run old" in note and f"python -m ralph_ray kb check --repair --kb {root}" in note


def test_a_damaged_part_of_the_run_itself_is_its_own_and_a_longer_run_id_keeps_its_parts(tmp_path: Path):
    root, bad = _two_runs_one_damaged(tmp_path, damaged="new")
    kb = KnowledgeBase(root)
    assert kb.check_parts("new")[0] == {bad: kb.damaged[bad]}
    assert kb.check_parts("old")[0] == {}
    for name, runs, run in (
        ("r1-b-c0001-trials.parquet", {"r1", "r1-b"}, "r1-b"),  # the longest id that names it
        ("r1-c1-abc123-1764-9f3e.parquet", {"r1", "r1-b"}, "r1"),  # one trial's part
        ("20261202-003015-ab12-all-r2.parquet", set(), "20261202-003015-ab12"),  # no runs row to read: from its name
        ("_kb-000003.parquet", {"r1"}, None),  # the compacted file: many runs'
    ):
        assert part_run(Path(name), runs) == run, name


def test_the_damaged_part_warning_names_the_runs_missing_rows_and_the_repair(tmp_path: Path):
    root, bad = _two_runs_one_damaged(tmp_path)
    with pytest.warns(DamagedPartWarning) as said:
        con = open_reader(root)
    text = str(said[0].message)
    assert str(bad) in text and "run old's trials rows" in text and "kb check --repair --kb" in text
    assert con.execute("select run_id from runs order by run_id").fetchall() == [("new",), ("old",)]


def test_compact_kb_leaves_a_damaged_part_where_it_is_and_merges_the_rest(tmp_path: Path):
    """A campaign's end runs compact_kb once 32 finished runs' parts pile up: one damaged `-all` part among them
    failed it (pq.read_table). It now stays where it is, for `kb check` to name, and the rest are merged."""
    root, bad = _two_runs_one_damaged(tmp_path)
    kb = KnowledgeBase(root)
    kb.compact_run("new")
    kb.compact_grace_s = 0.0
    assert kb.compact_kb()["trials"] == 1
    assert bad.exists() and not (kb.parquet / "trials" / "new-all.parquet").exists()
    with pytest.warns(DamagedPartWarning, match=bad.name):
        assert open_reader(root).execute("select trial_id from trials").fetchall() == [("new-t1",)]


def test_a_part_with_intact_ends_but_a_bad_footer_is_left_out_as_a_truncated_one(tmp_path: Path):
    """Review: a part whose `PAR1` ends are intact but whose footer is not (a bad footer length, garbage between the
    magic bytes) fails DuckDB with a plain `duckdb.Error` ("Footer length error"), not the truncated part's
    InvalidInputException: the readers caught only the latter, so every campaign on the KB crashed again."""
    root, bad = _two_runs_one_damaged(tmp_path)
    (root / DB_FILE).unlink()  # stale: a new campaign's init writes it again
    real = next((root / "parquet" / "trials").glob("new-*.parquet")).read_bytes()
    bad.write_bytes(real[:-8] + (10**6).to_bytes(4, "little") + b"PAR1")  # a real part, its footer length wrong
    runs_bad = root / "parquet" / "runs" / "old-all.parquet"
    runs_bad.write_bytes(b"PAR1" + b"\x07" * 200 + b"PAR1")
    kb = KnowledgeBase(root)
    kb.init()  # the views' binding in kb.duckdb fails on it too: the shell's file waits for the repair
    assert kb.reader().execute("select trial_id from trials").fetchall() == [("new-t1",)]
    mine, others = kb.check_parts("new")
    assert mine == {} and set(others) == {bad, runs_bad}
    with pytest.warns(DamagedPartWarning, match=bad.name):
        assert open_reader(root).execute("select run_id from runs").fetchall() == [("new",)]


def _compacted(tmp_path: Path) -> KnowledgeBase:
    """Runs r1 and r2 finished, folded (compact_run) and merged into `_kb-000001` (compact_kb), as a KB of many
    campaigns leaves them; r3 a new campaign that has written its runs row and no trial yet."""
    kb = KnowledgeBase(tmp_path / "kb")
    kb.init()
    kb.compact_grace_s = 0.0
    for run_id in ("r1", "r2"):
        kb.put("runs", [{"run_id": run_id, "status": "finished"}], run_id)
        kb.put("trials", [trial_row(run_id, f"{run_id}-t1", 0.5)], f"{run_id}-c0001-trials")
        kb.compact_run(run_id)
    kb.compact_kb()
    kb.put("runs", [{"run_id": "r3", "status": "running"}], "r3")
    return kb


def test_a_damaged_compacted_file_holds_the_rows_of_the_runs_compacted_into_it(tmp_path: Path):
    """Review: after compact_kb a damaged `trials/_kb-000001` was nobody's own (r1 had a readable runs row), so
    `resume=r1` went on and `report r1` wrote `trials: 0` over a good report. It is the own part of every run whose
    trials can only be in compacted files; a new campaign with no trials yet goes on with a warning."""
    kb = _compacted(tmp_path)
    bad = kb.parquet / "trials" / "_kb-000001.parquet"
    with bad.open("r+b") as part:
        part.truncate(100)
    for run_id in ("r1", "r2"):
        assert set(KnowledgeBase(kb.root).check_parts(run_id)[0]) == {bad}, run_id
    mine, others = KnowledgeBase(kb.root).check_parts("r3")
    assert mine == {} and list(others) == [bad]
    # r1 resumed: its new trials in a part of its own; its older ones still only in the damaged file
    kb.put("trials", [trial_row("r1", "r1-t2", 0.6)], "r1-c0002-trials")
    assert set(KnowledgeBase(kb.root).check_parts("r1")[0]) == {bad}
    from ralph_ray.kb import own_damaged

    assert "r1" in own_damaged(kb.root, "r1", "a resume would go on without them")
    # r3 ends: compact_kb merges its runs row (the damaged trials file is never merged again), its trials stay in
    # `r3-all`: the damaged file holds none of them, so its report is not refused
    kb.put("trials", [trial_row("r3", "r3-t1", 0.7)], "r3-c0001-trials")
    kb.compact_run("r3")
    assert kb.compact_kb() == {"runs": 1}
    assert KnowledgeBase(kb.root).check_parts("r3")[0] == {}
    assert set(KnowledgeBase(kb.root).check_parts("r2")[0]) == {bad}


def test_a_damaged_manifest_is_the_own_part_of_the_runs_it_lists_and_compact_kb_leaves_its_table(tmp_path: Path):
    """A damaged manifest hides which `_kb-*` file is live: compact_kb took the compacted file for an uncommitted one
    and deleted it (r1's and r2's trials gone for good). The table is now left as it is for `kb check` to name."""
    kb = _compacted(tmp_path)
    bad = kb.parquet / "trials" / "_m-000001.manifest"
    bad.write_bytes(b"not parquet")
    assert set(KnowledgeBase(kb.root).check_parts("r1")[0]) == {bad}
    assert KnowledgeBase(kb.root).check_parts("r3")[0] == {}
    kb.put("trials", [trial_row("r3", "r3-t1", 0.7)], "r3-c0001-trials")
    kb.compact_run("r3")
    assert kb.compact_kb() == {"runs": 1}
    assert sorted(p.name for p in (kb.parquet / "trials").iterdir()) == [
        "_kb-000001.parquet",
        "_m-000001.manifest",
        "_schema.parquet",
        "r3-all.parquet",
    ]


def test_the_repair_of_a_damaged_manifest_then_a_compaction_keeps_the_compacted_rows_on_disk(tmp_path: Path):
    """Review: `kb check --repair` moved a damaged manifest aside, and the next compact_kb took the compacted file it
    listed for an uncommitted write and deleted it: r1's and r2's trials were gone for good. It is moved aside now,
    beside the manifest, where its rows still read."""
    from ralph_ray.kbcheck import check

    kb = _compacted(tmp_path)
    (kb.parquet / "trials" / "_m-000001.manifest").write_bytes(b"not parquet")
    assert [d.path.name for d in check(kb.root, repair=True)] == ["_m-000001.manifest"]
    kb.compact_kb()
    kept = kb.root / "damaged" / "trials" / "_kb-000001.parquet.unlisted"
    assert not (kb.parquet / "trials" / "_kb-000001.parquet").exists()  # out of the views: no manifest lists it
    rows = duckdb.sql(f"select trial_id from read_parquet('{kept}') order by trial_id").fetchall()
    assert rows == [("r1-t1",), ("r2-t1",)]


def _truncate(path: Path) -> Path:
    with path.open("r+b") as part:
        part.truncate(100)
    return path


def test_a_damaged_compacted_file_is_not_the_own_part_of_a_run_compacted_later_with_no_rows_in_its_table(
    tmp_path: Path,
):
    """Review: r1 (pbt: segments rows) compacted, its `segments/_kb-000001` damaged; r3 (no segments) finished and
    compact_kb merged its other tables. r3 had no `-all` part in segments and was compacted, so the damaged file
    counted as its own: its resume and report were refused. The manifest records the runs each file holds now."""
    from ralph_ray.kb import own_damaged

    kb = _compacted(tmp_path)  # r1, r2 in `_kb-000001`; r3 running
    kb.put("segments", [{"run_id": "r1", "cycle": 1, "trial_id": "r1-t1", "segment": 0}], "r1-c0001-segments")
    kb.compact_run("r1")
    assert kb.compact_kb() == {"segments": 1}
    bad = _truncate(kb.parquet / "segments" / "_kb-000001.parquet")
    kb.put("trials", [trial_row("r3", "r3-t1", 0.7)], "r3-c0001-trials")
    kb.compact_run("r3")
    assert kb.compact_kb() == {"runs": 1, "trials": 1}  # r3 compacted: runs and trials, none of it in segments
    mine, others = KnowledgeBase(kb.root).check_parts("r3")
    assert mine == {} and list(others) == [bad]
    assert own_damaged(kb.root, "r3", "a resume would go on without them") is None
    assert set(KnowledgeBase(kb.root).check_parts("r1")[0]) == {bad}  # r1's segments are in it
    assert KnowledgeBase(kb.root).check_parts("r2")[0] == {}  # r2 was compacted before it, with no segments either


def test_a_run_resumed_after_compaction_then_compacted_again_owns_its_rows_in_a_damaged_compacted_file(
    tmp_path: Path,
):
    """Review: r1 compacted, r4 compacted after it (the manifest listing `r1-all` replaced was replaced), then r1
    resumed and folded into `r1-all` again: with that part standing, the damaged `trials/_kb-000002` holding r1's
    first trials was not its own, and its resume went on without them."""
    from ralph_ray.kb import own_damaged

    kb = _compacted(tmp_path)
    for run_id in ("r4", "r1"):  # r4 finishes and is compacted; r1 is resumed (its new trials in a part of its own)
        kb.put("runs", [{"run_id": run_id, "status": "finished"}], run_id)
        kb.put("trials", [trial_row(run_id, f"{run_id}-t2", 0.6)], f"{run_id}-c0002-trials")
        kb.compact_run(run_id)
        if run_id == "r4":
            kb.compact_kb()
    assert "r1-all.parquet" in {p.name for p in (kb.parquet / "trials").iterdir()}
    bad = _truncate(kb.parquet / "trials" / "_kb-000002.parquet")
    assert kb.compact_kb() == {"runs": 1}  # compacted again: the damaged trials file is left as it is
    assert set(KnowledgeBase(kb.root).check_parts("r1")[0]) == {bad}
    assert "r1" in own_damaged(kb.root, "r1", "a resume would go on without them")
    assert set(KnowledgeBase(kb.root).check_parts("r4")[0]) == {bad}
    assert KnowledgeBase(kb.root).check_parts("r3")[0] == {}  # never compacted: its report goes on


def test_a_manifest_from_before_the_run_ids_record_falls_back_to_the_conservative_rule(tmp_path: Path):
    """A KB compacted before manifests recorded their files' runs: ownership of a damaged `_kb-*` file is the old
    rule (every run compacted with no part of its own beside it), views read it as before, and the next compaction
    records the runs of its rows, the old file's included."""
    import pyarrow.parquet as pq

    kb = _compacted(tmp_path)
    for table in ("runs", "trials"):  # the manifests as an older ralph_ray wrote them: `part` and `hidden` only
        manifest = kb.parquet / table / "_m-000001.manifest"
        pq.write_table(pq.read_table(manifest).drop_columns(["run_ids"]), manifest)
    before = open_reader(kb.root).execute("select run_id, trial_id from trials order by all").fetchall()
    assert before == [("r1", "r1-t1"), ("r2", "r2-t1")]
    kb.put("trials", [trial_row("r3", "r3-t1", 0.7)], "r3-c0001-trials")
    kb.compact_run("r3")
    kb.compact_kb()  # generation 2 over the old file: its record names the old file's runs too
    held = pq.read_table(kb.parquet / "trials" / "_m-000002.manifest").to_pylist()
    assert [sorted(row["run_ids"]) for row in held if not row["hidden"]] == [["r1", "r2", "r3"]]
    manifest = kb.parquet / "trials" / "_m-000002.manifest"
    pq.write_table(pq.read_table(manifest).drop_columns(["run_ids"]), manifest)
    kb.put("runs", [{"run_id": "r5", "status": "finished"}], "r5")  # r5: no trials, compacted later
    kb.compact_run("r5")
    kb.compact_kb()
    bad = _truncate(kb.parquet / "trials" / "_kb-000002.parquet")
    for run_id in ("r1", "r3", "r5"):  # r5 too: without the record, no way to tell it holds none of r5's rows
        assert set(KnowledgeBase(kb.root).check_parts(run_id)[0]) == {bad}, run_id


def test_no_knowledge_base_yet_has_no_damaged_part_and_a_resume_is_not_refused_by_it(tmp_path: Path):
    """Review: an existing but empty KB folder gave `resume=` a DuckDB IOException traceback."""
    import io

    from rich.console import Console

    from ralph_ray.__main__ import resume_alone
    from ralph_ray.config import load_config
    from ralph_ray.kb import own_damaged

    (tmp_path / "kb").mkdir()
    assert own_damaged(tmp_path / "kb", "r1", "") is None
    assert own_damaged(tmp_path / "missing", "r1", "") is None
    cfg = load_config(["resume=r1", f"paths.runs={tmp_path / 'runs'}", f"paths.kb={tmp_path / 'kb'}"])
    said = io.StringIO()
    assert resume_alone(cfg, Console(file=said)) and said.getvalue() == ""
