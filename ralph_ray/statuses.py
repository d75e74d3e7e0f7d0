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
