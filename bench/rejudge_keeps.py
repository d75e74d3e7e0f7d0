"""The keep test with the selection split's sampling error, on recorded keeps: how many would it still keep?

    python bench/rejudge_keeps.py [RESULTS_JSON] [--examples N] [--name NAME]

Reads the keeps `bench/false_keeps.py` recorded in its "after" mode (replicates + the one-sided Welch test), each
with the evidence it was judged on (`child 0.9638 ± 0.0047 (n=3) vs parent 0.9378 ± 0.0190 (n=3)`: the replicates'
means and their 90% Student-t half-widths, from which their standard deviations follow), and judges each again two
ways: as `noise.welch_greater(examples=N)` does now (the least sampling variance the split gives the difference,
`noise.split_variance`: the child wins its gain's examples and loses none), and with each side's binomial variance
added as if scored on independent splits (the first version, dropped for this figure).
No training runs. Each keep's "really better" is the benchmark's own (5 new seeds on the same selection split), so
it cannot see the split's sampling error either: what this prints is the test's cost in kept children, not its gain.
"""

from __future__ import annotations

import argparse
import json
import math
import re
from pathlib import Path

from _common import RESULTS, save
from scipy import stats

from ralph_ray.noise import split_variance

EVIDENCE = re.compile(
    r"child ([\d.]+) ± ([\d.]+) \(n=(\d+)\) vs parent ([\d.]+) ± ([\d.]+) \(n=(\d+)\), one-sided Welch p=([\d.e-]+)"
)
CONFIDENCE = 0.9  # the campaigns' safeguards.confidence (their intervals and their test)

_parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
_parser.add_argument("results", nargs="?", type=Path, default=RESULTS / "false_keeps.json")
_parser.add_argument("--examples", type=int, default=359, help="the selection split's size (digits: 359)")
_parser.add_argument("--name", default="rejudge_keeps")


def binomial(mean: float, examples: int) -> float:
    """One side's binomial variance, held one example off 0 and 1 (the independent-splits version)."""
    p = min(max(mean, 1.0 / examples), 1.0 - 1.0 / examples)
    return p * (1.0 - p) / examples


def rejudge(evidence: str, examples: int) -> tuple[float, float, float]:
    """(the recorded p, the p with the split's least error, the p with independent binomial errors) of one keep."""
    found = EVIDENCE.search(evidence)
    if found is None:
        raise ValueError(f"no replicate evidence in {evidence!r}")
    mc, hc, nc, mp, hp, np_, old = found.groups()
    means, halves, counts = (float(mc), float(mp)), (float(hc), float(hp)), (int(nc), int(np_))
    seeds = [
        (half * math.sqrt(n) / stats.t.ppf(0.5 + CONFIDENCE / 2, n - 1)) ** 2 / n for half, n in zip(halves, counts)
    ]
    denominator = sum(v**2 / (n - 1) for v, n in zip(seeds, counts))

    def p_with(known: float) -> float:
        spread = sum(seeds) + known
        df = spread**2 / denominator if denominator > 0 else math.inf
        t = (means[0] - means[1]) / math.sqrt(spread)
        return float(stats.norm.sf(t) if math.isinf(df) else stats.t.sf(t, df))

    floor = p_with(split_variance(means[0] - means[1], examples))
    return float(old), floor, p_with(sum(binomial(m, examples) for m in means))


def main() -> None:
    args = _parser.parse_args()
    recorded = json.loads(args.results.read_text())["modes"]
    keeps = [k for mode, ks in recorded.items() if mode.startswith("after") for k in ks]
    rows = []
    for keep in keeps:
        old, new, independent = rejudge(keep["judged_on"], args.examples)
        rows.append(
            {
                **keep,
                "old_p": old,
                "new_p": new,
                "independent_p": independent,
                "still_kept": new < 1 - CONFIDENCE,
                "kept_if_independent": independent < 1 - CONFIDENCE,
            }
        )
    still = [r for r in rows if r["still_kept"]]
    blunt = [r for r in rows if r["kept_if_independent"]]
    true_keeps = [r for r in rows if r["really_better"]]
    lines = [
        f"{len(rows)} keeps recorded by `{args.results.name}` (replicates + Welch at {CONFIDENCE:.0%}), judged again "
        f"with the {args.examples}-example selection split's sampling error: **{len(still)} of {len(rows)} still "
        f"kept** with its least error on the difference (the test now), {len(blunt)} of {len(rows)} with both sides' "
        f"binomial errors as if independent ({len(true_keeps)} of {len(rows)} were really better by 5 new seeds on the "
        "same split, which cannot see the split's own error)",
        "",
        "| campaign | child | old p | p now | p, independent errors | kept now | 5-seed gain |",
        "| --- | --- | --- | --- | --- | --- | --- |",
        *(
            f"| {r['campaign']} | {r['child']} | {r['old_p']:.3g} | {r['new_p']:.3g} | {r['independent_p']:.3g} | "
            f"{'yes' if r['still_kept'] else 'no'} | {r['gain']:+.4f} |"
            for r in rows
        ),
    ]
    figures = {
        "examples": args.examples,
        "keeps": len(rows),
        "still_kept": len(still),
        "kept_if_independent": len(blunt),
    }
    save(args.name, {**figures, "rows": rows}, lines)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
