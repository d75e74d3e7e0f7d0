"""Which final training won: the one rule, pure (the app may import it beside the KB reader)."""

from __future__ import annotations

import math
from typing import Any, Callable


def final_winner(finals: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The final trial with the best selection score (stored oriented: higher wins; ties: the first written, as
    sql.FINAL_TRIAL orders them); None before one has scored. The one rule for "which final won": the console, the
    report, `status`, the app's Status page, `export`'s default and bench/fashion.py all ask it."""
    scored = [t for t in finals if t.get("selection_score") is not None and t.get("status") == "completed"]
    return max(scored, key=lambda t: t["selection_score"]) if scored else None


def worse_than_search(
    final: dict[str, Any] | None, search: dict[str, Any] | None, value: Callable[[Any], Any] = lambda s: s
) -> str | None:
    """A warning when a final trial's selection score is below its variant's best search trial's (both stored
    oriented; `search`: its leaderboard row), else None. `value` shows a score as the metric's own (a min metric's is
    stored as -value). A user trial's final (0.0341 MSE, `deepen` added) shipped over the search's 0.0287 unsaid."""
    if not final or not search:
        return None
    mine, theirs = final.get("selection_score"), search.get("selection_score")
    if mine is None or theirs is None or _nan(mine) or _nan(theirs) or mine >= theirs:
        return None
    added = f" with {final['final_added']} added" if final.get("final_added") else ""
    return (
        f"the final training of {final['variant_id']} scored worse on selection ({value(mine):.4f}) than its best "
        f"search trial ({value(theirs):.4f}): its longer run{added} did not help. `python -m ralph_ray export RUN_ID` "
        "ships the final training by default; `export RUN_ID --search` ships the search's version"
    )


def _nan(score: Any) -> bool:
    return isinstance(score, float) and math.isnan(score)
