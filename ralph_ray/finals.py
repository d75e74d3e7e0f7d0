"""Which final training won: the one rule, pure (the app may import it beside the KB reader)."""

from __future__ import annotations

from typing import Any


def final_winner(finals: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The final trial with the best selection score (stored oriented: higher wins; ties: the first written, as
    sql.FINAL_TRIAL orders them); None before one has scored. The one rule for "which final won": the console, the
    report, `status`, the app's Status page, `export`'s default and bench/fashion.py all ask it."""
    scored = [t for t in finals if t.get("selection_score") is not None and t.get("status") == "completed"]
    return max(scored, key=lambda t: t["selection_score"]) if scored else None
