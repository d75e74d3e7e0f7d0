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


# The reason of trials cut short by a stop of the whole cycle (a stop request, the campaign's time budget): a resumed
# cycle runs them again, and the intervention_effects view leaves out a child no trial of which got further (sql.py).
STOPPED_WITH_CYCLE = "stopped with the cycle (manual stop or time budget)"
