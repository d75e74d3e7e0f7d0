"""`state.json`: the orchestrator's resumable state, rewritten atomically after every phase."""

from __future__ import annotations

import enum
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ralph_ray.kb import now


class Phase(str, enum.Enum):
    """Where a campaign is."""

    prepare = "prepare"
    train = "train"
    record = "record"
    done = "done"
    crashed = "crashed"


@dataclass
class CampaignState:
    """What a campaign has finished so far."""

    run_id: str
    phase: Phase = Phase.prepare
    cycle: int = 0
    best_selection_score: float | None = None
    best_trial_id: str | None = None
    stop_reason: str | None = None
    updated_at: str = field(default_factory=lambda: now().isoformat())

    def save(self, run_dir: Path) -> None:
        """Write state.json via a temp file and rename, so a crash never leaves half a file."""
        self.updated_at = now().isoformat()
        data = {**asdict(self), "phase": self.phase.value}
        tmp = run_dir / ".state.json.tmp"
        tmp.write_text(json.dumps(data, indent=2))
        os.replace(tmp, run_dir / "state.json")

    @classmethod
    def load(cls, run_dir: Path) -> CampaignState:
        """Read a run's state.json."""
        data = json.loads((run_dir / "state.json").read_text())
        return cls(**{**data, "phase": Phase(data["phase"])})
