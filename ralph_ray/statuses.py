"""How a trial ended, as the knowledge base records it: one enum for the ledger, the agents and the reports.

Ray-free on purpose (the ledger, which writes these, imports Ray; the agents that read them must not).
"""

from __future__ import annotations

import enum


class TrialStatus(str, enum.Enum):
    """How a trial ended."""

    completed = "completed"
    stopped_early = "stopped_early"
    failed = "failed"


# The reason of trials cut short by the end of their Tune run: the campaign's end (async: safeguards.max_cycles closing
# its last generation), a time budget or a stop request. A resumed cycle runs them again, and the intervention_effects
# view leaves out a child no trial of which got further (sql.py).
STOPPED_WITH_CYCLE = (
    "stopped with the cycle: the campaign's end cut it (safeguards.max_cycles, a time budget or a stop)"
)
# What KBs written before 2026-12-01 hold for it (a user's trials cut by max_cycles read "manual stop or time budget"):
# the trials view reads it as STOPPED_WITH_CYCLE (sql.py), so every query matches both.
LEGACY_STOPPED_WITH_CYCLE = "stopped with the cycle (manual stop or time budget)"
