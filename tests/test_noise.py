"""Telling gains from noise: the statistics on known samples, the replicate plan, and the verdicts they give."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from scipy import stats
from taskdirs import digits_task

from ralph_ray import PROJECT_ROOT, history, sql
from ralph_ray.__main__ import main
from ralph_ray.campaign import run
from ralph_ray.children import Child
from ralph_ray.config import SafeguardsConfig
from ralph_ray.decision import NO_SCORE_REASON, CycleFacts, StopReason, child_verdict, decide
from ralph_ray.kb import SCHEMAS, KnowledgeBase, open_reader
from ralph_ray.ledger import STOPPED_WITH_CYCLE
from ralph_ray.noise import Comparison, Sample, describe, floor, half_width, lower_bound, welch_greater
from ralph_ray.replicates import (
    Replicated,
    Tally,
    best_knobs,
    campaign_floor,
    evidence,
    fresh_seeds,
    needing,
    points,
    recorded,
    seed_ignored,
)
from ralph_ray.trials import REPLICATE_KEY, SEED_KEY
from ralph_ray.variants import VariantStatus


def test_interval_and_lower_bound_of_a_known_sample():
    sample = Sample.of([0.96, 0.97, 0.98, None])  # a failed replicate (no score) is left out
    assert sample.n == 3 and sample.mean == pytest.approx(0.97) and sample.sd == pytest.approx(0.01)
    # t(0.975, 2) = 4.3027: 0.97 +- 4.3027 * 0.01 / sqrt(3)
    assert half_width(sample, 0.95) == pytest.approx(4.3027 * 0.01 / 3**0.5, rel=1e-4)
    # one-sided: t(0.9, 2) = 1.8856
    assert lower_bound(sample, 0.9) == pytest.approx(0.97 - 1.8856 * 0.01 / 3**0.5, rel=1e-4)
    assert half_width(Sample.of([0.9]), 0.95) is None and lower_bound(Sample(()), 0.9) is None
    assert describe(sample, 0.95) == "0.9700 ± 0.0248 (n=3)" and describe(Sample.of([0.9]), 0.95) == "0.9000 (n=1)"


def test_welch_matches_scipy_and_needs_two_values_a_side():
    child, parent = Sample.of([0.975, 0.978, 0.981]), Sample.of([0.960, 0.966, 0.963])
    found = welch_greater(child, parent, 0.9)
    expected = stats.ttest_ind(child.values, parent.values, equal_var=False, alternative="greater").pvalue
    assert found.p_value == pytest.approx(expected) and found.p_value < 0.01 and found.better
    assert "better at 90%" in found.text() and "Welch p=" in found.text()
    # The seed trainer's own spread (selection 0.9647 +- 0.0043 over 3 seeds): a 0.003 gain is noise.
    noisy = welch_greater(Sample.of([0.9680, 0.9650, 0.9710]), Sample.of([0.9610, 0.9694, 0.9638]), 0.9)
    assert not noisy.better and "not shown better" in noisy.text()
    assert welch_greater(Sample.of([0.99]), parent, 0.9).p_value is None  # one value: no test, never better
    # One side without spread is still a test: the other side's spread counts
    assert welch_greater(Sample.of([0.9, 0.9]), Sample.of([0.8, 0.81]), 0.9).p_value is not None


def test_replicates_that_did_not_vary_with_their_seeds_are_no_test():
    """User trial: a `--seed default=0` trainer ignored harness.seed(); each replicate was a copy of one run, and a keep
    read "better at 90%: child 0.9777 ± 0.0000 (n=3) vs parent 0.9387 ± 0.0000 (n=3), one-sided Welch p=6.76e-05",
    the seeds' own spread (0.008 on five real seeds) counted as none. Before, too, their means decided: p 0 or 1."""
    for examples in (None, 359):
        found = welch_greater(Sample.of([0.9777] * 3), Sample.of([0.9387] * 3), 0.9, examples=examples)
        assert not found.better and found.p_value is None and found.unvaried
        said = found.text()
        assert said.startswith("not shown better at 90%: child 0.9777 ± 0.0000 (n=3) vs parent 0.9387 ± 0.0000 (n=3)")
        assert "(does train.py ignore harness.seed()? seed torch, numpy and random from harness.seed()" in said
        assert "Welch p=" not in said
    # 112/113 three times has a standard deviation of 1e-16, not 0: copies are told by their values, not by sd == 0
    assert welch_greater(Sample.of([112 / 113] * 3), Sample.of([111 / 113] * 3), 0.9).unvaried
    assert not Sample.of([0.9]).unvaried and not Sample.of([0.9, 0.91]).unvaried and Sample.of([0.9, 0.9]).unvaried
    # Replicates that varied on one side are a test as before
    assert not welch_greater(Sample.of([0.9777] * 3), Sample.of([0.93, 0.94, 0.95]), 0.9).unvaried
    # The console's warning wants copies on both splits: two seeds may tie on a small selection split by chance
    copies = Replicated(3, (1, 2, 3), Sample.of([0.9387] * 3), Sample.of([0.9411] * 3))
    tie = Replicated(3, (1, 2, 3), Sample.of([0.9387] * 3), Sample.of([0.93, 0.94, 0.95]))
    warning = seed_ignored({"p": copies, "c": tie})
    assert warning is not None and "(p 0.9387 x3)" in warning and "train.py seems to ignore harness.seed()" in warning
    assert seed_ignored({"c": tie}) is None and seed_ignored({}) is None
    # ... and so does the verdict (review): an accuracy tied on selection across honest seeds, its test scores varying,
    # is tested (the split's floor gives it a spread), not refused as copies
    child, parent = Sample.of([0.9777] * 3), Sample.of([0.9387] * 3)
    varied = (Sample.of([0.95, 0.96, 0.97]), Sample.of([0.93, 0.94, 0.95]))
    tested = welch_greater(child, parent, 0.9, 359, varied)
    assert not tested.unvaried and tested.p_value is not None and tested.better
    copied = (Sample.of([0.96] * 3), Sample.of([0.94] * 3))
    assert welch_greater(child, parent, 0.9, 359, copied).unvaried
    assert welch_greater(child, parent, 0.9, None, varied).unvaried  # a loss does not tie by chance


def test_two_replicates_that_tied_by_chance_are_no_warning():
    """User trial: the shipped digits seed's two replicates of a child tied on both splits (selection 0.9721, test
    0.9861: an accuracy on ~360 images moves in steps of 0.0028) while their predictions and val_loss (0.079, 0.110)
    differed, and the console said "train.py seems to ignore harness.seed()" of a trainer that seeds from it."""
    parent = Replicated(2, (1, 2), Sample.of([0.9777, 0.9582]), Sample.of([0.9833, 0.9833]))
    child = Replicated(2, (1, 2), Sample.of([0.9721, 0.9721]), Sample.of([0.9861, 0.9861]))
    assert seed_ignored({"f675087d77ba": parent, "adb285a05420": child}) is None
    assert seed_ignored({"adb285a05420": child}) is None
    # A trainer that ignores its seed copies every replicate: two variants' two copies each say so, as three of one
    copied_parent = Replicated(2, (1, 2), Sample.of([0.9387] * 2), Sample.of([0.9411] * 2))
    warning = seed_ignored({"p": copied_parent, "c": child})
    assert warning is not None and "(c 0.9721 x2, p 0.9387 x2)" in warning and "ignore harness.seed()" in warning
    three = Replicated(3, (1, 2, 3), Sample.of([0.9721] * 3), Sample.of([0.9861] * 3))
    assert "(c 0.9721 x3)" in (seed_ignored({"f675087d77ba": parent, "c": three}) or "")
    # a failed third replicate leaves two: one tie, no warning
    assert seed_ignored({"c": Replicated(3, (1, 2, 3), child.sample, child.tests)}) is None


def test_a_keep_counts_the_selection_splits_sampling_error_where_the_score_is_an_accuracy():
    """User trial (breast cancer, a 113-example selection split): a child one example ahead on three replicates that
    did not vary was kept as "better at 90%, p=3.93e-29"; replicates vary the seed on one fixed split, so their
    spread says nothing of that split's own sampling error."""
    # (Replicates that did not vary at all are no test now: test_replicates_that_did_not_vary_with_their_seeds_...)
    one_example = welch_greater(Sample.of([112 / 113] * 3), Sample.of([111 / 113] * 2 + [111.01 / 113]), 0.9, 113)
    assert not one_example.better and one_example.p_value == pytest.approx(0.16, abs=0.01)  # one standard error
    assert "counting the 113-example selection split's sampling error (at least ±0.0088 on the difference)" in (
        one_example.text()
    )
    assert welch_greater(Sample.of([112 / 113] * 3), Sample.of([111 / 113] * 2 + [111.01 / 113]), 0.9).better
    child, parent = Sample.of([112 / 113, 112 / 113, 111 / 113]), Sample.of([111 / 113, 111 / 113, 110 / 113])
    assert not welch_greater(child, parent, 0.9, examples=113).better  # Welch alone: p 0.05, "better"
    # A gain the split can show: 3 points on 1,000 examples (30 examples won: 5.5 standard errors)...
    shown = welch_greater(Sample.of([0.93, 0.931, 0.929]), Sample.of([0.90, 0.901, 0.899]), 0.9, examples=1000)
    assert shown.better and shown.p_value < 0.01
    # ...and digits' recorded keeps (bench/rejudge_keeps.py): a +0.026 gain on 359 images with the seeds' spread kept
    digits = welch_greater(Sample.of([0.9610, 0.9638, 0.9666]), Sample.of([0.9266, 0.9378, 0.9490]), 0.9, examples=359)
    assert digits.better
    # with the seeds' own spread far above the split's, the test stays a Welch test in effect
    seeds = welch_greater(Sample.of([0.95, 0.90, 0.99]), Sample.of([0.90, 0.85, 0.94]), 0.9, examples=100_000)
    plain = welch_greater(Sample.of([0.95, 0.90, 0.99]), Sample.of([0.90, 0.85, 0.94]), 0.9)
    assert seeds.p_value == pytest.approx(plain.p_value, rel=0.01)
    assert welch_greater(Sample.of([0.99]), Sample.of([0.9, 0.9]), 0.9, examples=113).p_value is None


def test_floor_is_the_highest_lower_bound():
    tight, wide = Sample.of([0.95, 0.951, 0.952]), Sample.of([0.90, 0.99, 0.97])
    assert floor({"tight": tight, "wide": wide, "single": Sample.of([0.999])}, 0.9)[0] == "tight"
    assert floor({}, 0.9) is None


def test_child_verdict_with_evidence_keeps_only_a_shown_gain():
    better = Comparison(Sample.of([0.98, 0.981]), Sample.of([0.96, 0.961]), 0.9, 0.001)
    worse = Comparison(Sample.of([0.96, 0.97]), Sample.of([0.96, 0.961]), 0.9, 0.3)
    assert child_verdict(2, 0, 0.99, 0.96, 0.002, None, better) == (VariantStatus.kept, better.text())
    # A best trial far above its parent's is no keep when the replicates do not show it.
    assert child_verdict(2, 0, 0.99, 0.96, 0.002, None, worse) == (VariantStatus.discarded, worse.text())
    assert child_verdict(2, 2, None, 0.96, 0.002, None, better)[0] is VariantStatus.crashed


def facts(**overrides) -> CycleFacts:
    base = dict(
        cycle=3,
        best_by_cycle=[0.95, 0.97, 0.99],
        target=None,
        tokens_cycle=0,
        tokens_campaign=0,
        cost_campaign=0.0,
        gate_fail_streak=0,
        elapsed_s=1.0,
        manual_stop=False,
    )
    return CycleFacts(**{**base, **overrides})


def test_plateau_and_target_read_the_floor_with_replicates():
    guards = SafeguardsConfig(plateau_cycles=2, max_cycles=10)
    # The single best trial rose every cycle, the confident floor did not: a plateau.
    stuck = decide(facts(floor_by_cycle=[0.95, 0.9505, 0.951]), guards)
    assert stuck.reason is StopReason.plateau and "lower bound" in stuck.rationale
    assert not decide(facts(), guards).stop  # without replicates, the rising best trial is progress
    # The target is met by the floor, not by a lucky trial.
    assert not decide(facts(target=0.98, floor_by_cycle=[0.9, 0.95, 0.97]), guards).stop
    met = decide(facts(target=0.96, floor_by_cycle=[0.9, 0.95, 0.97]), guards)
    assert met.reason is StopReason.target_met and met.best_selection_score == 0.99


def child(variant: str, parent: str, status: VariantStatus) -> Child:
    return Child(variant, parent, Path("."), [], "", "", status, None, "", {}, None)


def test_a_child_not_worth_replicating_names_the_score_it_did_not_beat():
    """User trial: the reason read "did not beat its parent's replicate mean -" where the parent had no replicates
    and the reference was its best trial."""
    hopeless = child("b", "p", VariantStatus.candidate)
    unreplicated = evidence(hopeless, 0.8515, {}, 0.8605, 0.9)
    assert unreplicated.text().endswith("did not beat its parent's best trial 0.8605")
    reps = {"p": Replicated(3, (1, 2, 3), Sample.of([0.86, 0.861, 0.862]), Sample(()))}
    assert "did not beat its parent's replicate mean 0.8610" in evidence(hopeless, 0.8515, reps, 0.8605, 0.9).text()


def test_plan_replicates_the_seed_and_children_with_a_chance_and_their_unreplicated_parents():
    seed, hopeful, hopeless = (
        child("s", "", VariantStatus.seed),
        child("a", "p", VariantStatus.candidate),
        child("b", "s", VariantStatus.candidate),
    )
    reps = {"s": Replicated(3, (1, 2, 3), Sample.of([0.96, 0.961, 0.962]), Sample(()))}
    best = {"s": 0.97, "a": 0.98, "b": 0.955, "p": 0.975}
    # b's best trial does not beat the seed's replicate mean; a's parent p was never replicated.
    assert needing([seed, hopeful, hopeless], best, reps, 3) == ["p", "a"]
    assert needing([seed], best, {}, 2) == ["s"]
    assert fresh_seeds(0, (1, 3), 3) == [2] and fresh_seeds(10, (), 2) == [11, 12]
    configs = points(["a"], {"a": {"LR": 0.1}}, {}, 2, 0)
    assert configs == [
        {"variant": "a", "LR": 0.1, SEED_KEY: 1, REPLICATE_KEY: True},
        {"variant": "a", "LR": 0.1, SEED_KEY: 2, REPLICATE_KEY: True},
    ]


def trial_row(trial_id: str, knobs: dict, score: float, replicate: bool = False, seed: int = 0) -> dict:
    return {
        "run_id": "r",
        "cycle": 1,
        "trial_id": trial_id,
        "variant_id": "s",
        "status": "completed",
        "knobs": json.dumps(knobs, sort_keys=True),
        "seed": seed,
        "epochs": 4,
        "selection_score": score,
        "test_score": score,
        "replicate": replicate,
    }


def test_the_campaign_floor_leaves_out_a_discarded_child(tmp_path: Path):
    """Review: a discarded child's replicates (not shown better than the seed's at 90%, yet a higher lower bound) set
    the floor the target and the plateau read, so a run could stop "target met" while its pick, the seed, is below."""
    kb = KnowledgeBase(tmp_path / "kb")
    kb.init()
    kb.put(
        "variants",
        [
            {"run_id": "r", "variant_id": "s", "parent_id": None, "cycle": 1, "interventions": "[]", "status": "seed"},
            {
                "run_id": "r",
                "variant_id": "kid",
                "parent_id": "s",
                "cycle": 2,
                "interventions": "[]",
                "status": "discarded",
            },
        ],
        "v",
    )
    knobs = {"LR": 0.1}
    rows = [trial_row("s0", knobs, 0.84), {**trial_row("k0", knobs, 0.86), "variant_id": "kid", "cycle": 2}]
    rows += [trial_row(f"s{i}", knobs, score, True, i) for i, score in ((1, 0.83), (2, 0.834), (3, 0.838))]
    rows += [
        {**trial_row(f"k{i}", knobs, score, True, i), "variant_id": "kid", "cycle": 2}
        for i, score in ((1, 0.845), (2, 0.85), (3, 0.855))
    ]
    kb.append("trials", rows, "t")
    con = open_reader(kb.root)
    reps, discarded = recorded(con, "r"), history.discarded(con, "r")
    seed_bound = lower_bound(reps["s"].sample, 0.9)
    assert discarded == {"kid"} and seed_bound < lower_bound(reps["kid"].sample, 0.9)
    assert campaign_floor(reps, 0.9, discarded) == seed_bound
    assert con.execute(sql.PICK, ["r"]).fetchone() == ("s",)


def test_replicates_belong_to_the_knobs_they_ran(tmp_path: Path):
    """User trial: the seed was replicated at its best knobs then (0.9526, 0.9443); a later search trial of other knobs
    scored 0.9777 and became its best, was never replicated, and its leaderboard row showed those knobs beside the
    old knobs' mean 0.9485, the mean a child bred from the new knobs was then kept against."""
    old, new = {"LR": 0.0376, "WIDTH": 16}, {"LR": 0.119, "WIDTH": 32}
    kb = KnowledgeBase(tmp_path / "kb")
    kb.init()
    for row in (
        trial_row("a", old, 0.9554),
        trial_row("a1", old, 0.9526, True, 1),
        trial_row("a2", old, 0.9443, True, 2),
        trial_row("b", new, 0.9777),
    ):
        kb.append("trials", [row], row["trial_id"])  # one part each, in this order (written_at)
    con = open_reader(kb.root)
    # Its best knobs moved: no replicates of them yet, so a hopeful child's verdict replicates the parent again first,
    # at its new best knobs, with the seeds the old ones ran.
    reps = recorded(con, "r")
    assert "s" not in reps
    hopeful = child("c", "s", VariantStatus.candidate)
    assert needing([hopeful], {"s": 0.9777, "c": 0.98}, reps, 2) == ["s", "c"]
    assert [(c["LR"], c[SEED_KEY]) for c in points(["s"], best_knobs(con, "r"), reps, 2, 0)] == [(0.119, 1), (0.119, 2)]
    board = "select best_knobs, replicates, mean_score from leaderboard where run_id = 'r'"
    assert con.execute(board).fetchone() == (json.dumps(new, sort_keys=True), 0, None)
    for row in (trial_row("b1", new, 0.97, True, 1), trial_row("b2", new, 0.98, True, 2)):
        kb.append("trials", [row], row["trial_id"])
    con = open_reader(kb.root)
    reps = recorded(con, "r")
    assert reps["s"].seeds == (1, 2) and reps["s"].sample.mean == pytest.approx(0.975)
    # The leaderboard's mean, its interval and the export's spread count only replicates of the best knobs.
    best, n, mean = con.execute(board).fetchone()
    assert (n, mean) == (2, pytest.approx(0.975))
    assert sorted(r[0] for r in con.execute(sql.EXPORT_REPLICATES, ["r", "s"]).fetchall()) == [0.97, 0.98]
    # The async campaign's own count (the pool's best knobs: the trial's knobs read back) agrees.
    tally = Tally()
    for v, knobs, seed, score, test in con.execute(sql.REPLICATES_FOR_RUN, ["r", STOPPED_WITH_CYCLE]).fetchall():
        tally.note(v, knobs, seed, score, test)
    assert set(tally.at({"s": json.loads(best)})["s"].sample.values) == {0.97, 0.98}
    assert "s" not in tally.at({"s": {"WIDTH": 16, "LR": 0.119}})


CAMPAIGN = [
    "search.num_samples=2",
    "search.max_concurrent=2",
    "scheduler.max_t=2",
    "scheduler.grace_period=1",
    "safeguards.trial_timeout_s=120",
    "+search.space.EPOCHS={type: choice, values: [2]}",
    "population.trials_per_child=1",
    "population.parents=1",
    "population.children_per_parent=2",
    "safeguards.max_cycles=2",
    "safeguards.replicates=2",
    "population.breeder_nice=0",  # async: the breeder at the trials' priority (tests/test_async.py's TINY)
]


def replicate_record(kb_root: Path, run_id: str):
    con = open_reader(kb_root)
    trials = con.execute(
        "select variant_id, seed, replicate, status, selection_score from trials where run_id = ? "
        "and reason is distinct from ?",
        [run_id, STOPPED_WITH_CYCLE],
    ).fetchall()
    variants = con.execute(
        "select variant_id, parent_id, status, reason from variants where run_id = ?", [run_id]
    ).fetchall()
    board = {
        row[0]: row[1:]
        for row in con.execute(
            "select variant_id, replicates, mean_score, ci_low, ci_high, selection_score from leaderboard "
            "where run_id = ?",
            [run_id],
        ).fetchall()
    }
    return trials, variants, board


@pytest.mark.parametrize("mode", ["generations", "async"])
def test_a_campaign_replicates_the_seed_and_judges_children_on_their_replicates(
    ray_session, tiny_config, mode, capsys: pytest.CaptureFixture[str]
):
    outcome = run(tiny_config(*CAMPAIGN, f"run_id=noise-{mode}", f"population.mode={mode}"))
    assert outcome.exit_code == 0
    trials, variants, board = replicate_record(outcome.kb_root, f"noise-{mode}")
    seed = next(v for v, _, status, _ in variants if status == "seed")
    # The seed's best knobs ran twice more, with fresh seeds, as trials marked replicate (async: again on each new
    # best of its knob samples since, with the same seeds; the run's end may have cut the last of these).
    con = open_reader(outcome.kb_root)
    per_knobs = con.execute(
        "select knobs, list(seed order by seed) from trials where run_id = ? and variant_id = ? and replicate "
        "and reason is distinct from ? group by knobs order by min(written_at)",
        [f"noise-{mode}", seed, STOPPED_WITH_CYCLE],
    ).fetchall()
    assert per_knobs and per_knobs[0][1] == [1, 2] and all(seeds in ([1], [1, 2]) for _, seeds in per_knobs)
    assert all(s == 0 for _, s, rep, _, _ in trials if not rep)  # search trials keep the search seed
    n, mean, low, high, best = board[seed]
    # The leaderboard counts only the replicates of its best knobs.
    (shown,) = con.execute(
        "select best_knobs from leaderboard where run_id = ? and variant_id = ?", [f"noise-{mode}", seed]
    ).fetchone()
    assert n == sum(len(seeds) for knobs, seeds in per_knobs if knobs == shown)
    assert not n or low < mean < high
    searched = [score for v, _, rep, _, score in trials if v == seed and not rep and score is not None]
    assert best == max(searched)  # search trials only
    children = [(v, status, reason) for v, parent, status, reason in variants if parent == seed]
    assert children
    for variant, status, reason in children:
        if status == "rejected" or status == "crashed":
            continue
        replicated = sum(rep for v, _, rep, _, _ in trials if v == variant)
        assert status in ("kept", "discarded")
        if all(score is None for v, _, _, _, score in trials if v == variant):
            assert status == "discarded" and reason == NO_SCORE_REASON  # ASHA stopped its one trial: nothing to judge
            continue
        # Each verdict states its evidence: a Welch test over both samples, or why the child was not replicated (or
        # its replicates gave no sample: they failed). Async: a replicated child is replicated again at a new best.
        assert replicated == 0 or replicated >= 2
        # (replicates that tie on both sides by chance are no test: "every replicate scoring the same")
        tested = ("Welch p=", "too few replicates", "every replicate scoring the same")
        assert any(t in reason for t in tested) if replicated else "not replicated" in reason
        assert status != "kept" or "better at 90%" in reason
    # Each interventions row records the reference its verdict named, and what kind of delta it is.
    effects = con.execute(
        "select i.basis, i.child_score, i.parent_score, v.reason from interventions i join variants v "
        "using (run_id, variant_id) where run_id = ? and i.delta is not null",
        [f"noise-{mode}"],
    ).fetchall()
    for basis, child_score, parent_score, reason in effects:
        if "too few replicates" in reason:
            continue  # its replicates gave no sample: its best trial against the parent's reference, nothing to read
        said = {
            "replicates": f"child {child_score:.4f}",
            "best_trial_vs_replicates": f"its best trial {child_score:.4f} did not beat its parent's replicate mean "
            f"{parent_score:.4f}",
            "best_trial": f"its best trial {child_score:.4f} did not beat its parent's best trial {parent_score:.4f}",
        }[basis]
        assert said in reason and (basis != "replicates" or f"parent {parent_score:.4f}" in reason)
    report = (outcome.run_dir / "report" / "final_report.md").read_text()
    assert "| replicates |" in report
    # The campaign's pick is the replicated variant with the best replicate mean, a discarded child after every
    # variant no verdict rejected, in the report and in `status`.
    status_of = {v: status for v, _, status, _ in variants}
    eligible = {v: row for v, row in board.items() if status_of.get(v) != "discarded"} or board
    top = max((mean for n, mean, *_ in eligible.values() if n), default=None)
    picks = [v for v, (n, mean, *_) in eligible.items() if n and mean == top] or [
        v for v, (*_, best) in eligible.items() if best == max(b for *_, b in eligible.values() if b is not None)
    ]
    assert any(f"- best variant: {p}, selection" in report for p in picks)
    assert main(["status", f"noise-{mode}", "--runs", str(outcome.run_dir.parent), "--kb", str(outcome.kb_root)]) == 0
    out = capsys.readouterr().out
    assert any(f"pick (rank 1, by replicate mean): {p}, " in out for p in picks)


def test_a_trainer_that_ignores_its_seed_is_warned_of_once_and_no_child_is_kept_on_copies(
    ray_session, tiny_config, tmp_path: Path
):
    """User trial: a trainer seeding from its own `--seed default=0` ran every replicate the same, shown as
    `± 0.0000` with no word, and a child was kept on `p=6.76e-05`."""
    import io

    from rich.console import Console

    source = (PROJECT_ROOT / "trainers" / "digits" / "train.py").read_text()
    assert "    seed = harness.seed()\n" in source
    fixed = digits_task(tmp_path / "seed0", source.replace("    seed = harness.seed()\n", "    seed = 0\n"))
    said = io.StringIO()
    # three replicates: the seed's own copies are warned of (two can tie by chance, replicates.seed_ignored)
    three = [o for o in CAMPAIGN if not o.startswith("safeguards.replicates=")] + ["safeguards.replicates=3"]
    outcome = run(
        tiny_config(*three, "run_id=seed0", f"task.trainer={fixed}", "agent=heuristic"),
        Console(file=said, width=400),
    )
    assert outcome.exit_code == 0
    trials, variants, _ = replicate_record(outcome.kb_root, "seed0")
    seed = next(v for v, _, status, _ in variants if status == "seed")
    copies = [score for v, s, rep, status, score in trials if v == seed and rep and status == "completed"]
    assert len(copies) >= 3 and len(set(copies)) == 1  # fresh seeds 1, 2, 3: the same run three times
    console = said.getvalue()
    assert console.count("warning: replicates scored the same whatever their seed (") == 1
    assert f"{seed} {copies[0]:.4f} x" in console and "train.py seems to ignore harness.seed()" in console
    for variant, parent, status, reason in variants:
        replicated = [score for v, _, rep, _, score in trials if v == variant and rep and score is not None]
        if parent == seed and len(set(replicated)) == 1 and len(replicated) >= 2:  # judged on copies of copies
            assert (
                status == "discarded" and "does train.py ignore harness.seed()?" in reason and "Welch p=" not in reason
            )


def test_an_async_variant_is_replicated_again_when_its_best_knobs_move(ray_session, tiny_config, tmp_path: Path):
    """User trial: the seed, replicated at its best knobs then, found better knobs by its later knob samples and was
    never replicated at them; its leaderboard row showed the new knobs beside the old knobs' mean. Here its own
    knobs (LR 0.0001) are replicated first, and its first knob sample at LR 0.1 becomes its best."""
    source = (PROJECT_ROOT / "trainers" / "digits" / "train.py").read_text()
    assert "LR = 0.05 " in source
    slow = digits_task(tmp_path / "slow_lr", source.replace("LR = 0.05 ", "LR = 0.0001 "))
    outcome = run(
        tiny_config(
            "run_id=moved",
            "population.mode=async",
            "agent=none",  # no child: the slot runs knob samples of the seed (its search goes on under a time budget)
            f"task.trainer={slow}",
            "~search.space",
            "+search.space={LR: {type: choice, values: [0.0001, 0.1]}, EPOCHS: {type: choice, values: [2]}}",
            "search.num_samples=1",
            "search.max_concurrent=1",  # its own knobs first, alone: they are replicated before any knob sample
            "scheduler.max_t=2",
            "scheduler.grace_period=2",
            "safeguards.replicates=2",
            # The run ends once a replicated mean's lower bound passes 0.5: LR 0.1's, never LR 0.0001's (~0.1)
            "target.selection_score=0.5",
            "safeguards.campaign_time_s=400",
            "population.breeder_nice=0",
        )
    )
    con = open_reader(outcome.kb_root)
    (seed,) = con.execute("select variant_id from variants where run_id = 'moved' and status = 'seed'").fetchone()
    replicated = con.execute(
        "select json_extract(knobs, '$.LR')::double, list(seed order by seed), avg(selection_score) from trials "
        "where run_id = 'moved' and variant_id = ? and replicate and status = 'completed' group by all order by 1",
        [seed],
    ).fetchall()
    assert [(lr, seeds) for lr, seeds, _ in replicated] == [(0.0001, [1, 2]), (0.1, [1, 2])]
    best_knobs, n, mean = con.execute(
        "select best_knobs, replicates, mean_score from leaderboard where run_id = 'moved' and variant_id = ?", [seed]
    ).fetchone()
    assert json.loads(best_knobs)["LR"] == 0.1
    assert n == 2 and mean == pytest.approx(replicated[1][2])  # the mean of the knobs it shows, not of all four


def test_a_kb_written_before_replicates_reads_them_as_absent(tmp_path: Path):
    kb = KnowledgeBase(tmp_path / "kb")
    kb.init()
    trials = kb.parquet / "trials"
    old = pa.schema([f for f in SCHEMAS["trials"] if f.name != "replicate"])
    pq.write_table(old.empty_table(), trials / "_schema.parquet")  # an old KB: no part has the `replicate` column
    rows = [
        {
            "run_id": "old",
            "cycle": 1,
            "trial_id": t,
            "variant_id": "v",
            "status": "completed",
            "knobs": "{}",
            "seed": 0,
            "epochs": 2,
            "selection_score": s,
            "test_score": s,
        }
        for t, s in (("a", 0.9), ("b", 0.95))
    ]
    pq.write_table(pa.Table.from_pylist(rows, schema=old), trials / "old.parquet")
    con = open_reader(kb.root)
    row = con.execute(
        "select selection_score, trials, replicates, mean_score, ci_low from leaderboard where run_id = 'old'"
    ).fetchone()
    assert row == (0.95, 2, 0, None, None)
    assert con.execute("select count(*) from trials where replicate is null").fetchone()[0] == 2
