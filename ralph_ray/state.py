"""`state.json`: the orchestrator's resumable state, rewritten atomically after every phase."""

from __future__ import annotations

import enum
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ralph_ray.control import STOP_FILE, stop_requested  # noqa: F401 - re-exported for campaign and search
from ralph_ray.kb import now


class Phase(str, enum.Enum):
    """The next step a campaign will run (a resumed campaign starts there)."""

    select = "select"
    analyse = "analyse"
    write = "write"
    train = "train"
    record = "record"
    decide = "decide"
    done = "done"


class RunStatus(str, enum.Enum):
    """Whether a campaign is running, finished, or died."""

    running = "running"
    finished = "finished"
    crashed = "crashed"


@dataclass
class CampaignState:
    """What a campaign has finished so far."""

    run_id: str
    phase: Phase = Phase.select
    status: RunStatus = RunStatus.running
    cycle: int = 1
    best_selection_score: float | None = None
    best_variant_id: str | None = None
    best_trial_id: str | None = None
    best_by_cycle: list[float | None] = field(default_factory=list)
    gate_fail_streak: int = 0
    stop_reason: str | None = None
    exit_code: int | None = None
    elapsed_s: float = 0.0  # campaign time across resumes
    interrupted: Phase | None = None  # the phase a manual stop or the time budget cut short (a resume re-enters it)
    updated_at: str = field(default_factory=lambda: now().isoformat())

    def save(self, run_dir: Path) -> None:
        """Write state.json via a temp file and rename, so a crash never leaves half a file."""
        self.updated_at = now().isoformat()
        data = {**asdict(self), "phase": self.phase.value, "status": self.status.value,
                "interrupted": self.interrupted.value if self.interrupted else None}
        tmp = run_dir / ".state.json.tmp"
        tmp.write_text(json.dumps(data, indent=2))
        os.replace(tmp, run_dir / "state.json")

    @classmethod
    def load(cls, run_dir: Path) -> CampaignState:
        """Read a run's state.json."""
        data = json.loads((run_dir / "state.json").read_text())
        interrupted = data.get("interrupted")
        return cls(**{**data, "phase": Phase(data["phase"]), "status": RunStatus(data["status"]),
                      "interrupted": Phase(interrupted) if interrupted else None})
