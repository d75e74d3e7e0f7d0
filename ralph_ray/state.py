"""`state.json`: the orchestrator's resumable state, rewritten atomically after every phase."""

from __future__ import annotations

import enum
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ralph_ray import liveness
from ralph_ray.control import STOP_FILE
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
    """Whether a campaign is running, finished, died, or was interrupted (Ctrl-C; `resume=RUN_ID` goes on)."""

    running = "running"
    finished = "finished"
    crashed = "crashed"
    interrupted = "interrupted"


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
    # With replicates: the campaign's confident floor after each cycle (noise.floor; the plateau and target read it).
    floor_by_cycle: list[float | None] = field(default_factory=list)
    gate_fail_streak: int = 0
    stop_reason: str | None = None
    exit_code: int | None = None
    elapsed_s: float = 0.0  # campaign time across resumes
    interrupted: Phase | None = None  # the phase a manual stop or the time budget cut short (a resume re-enters it)
    updated_at: str = field(default_factory=lambda: now().isoformat())
    # The process that runs it (liveness.this_driver): `status` and the app tell a killed driver from a quiet one.
    driver: dict[str, Any] | None = None

    def save(self, run_dir: Path) -> None:
        """Write state.json via a temp file and rename, so a crash never leaves half a file."""
        self.updated_at = now().isoformat()
        data = {
            **asdict(self),
            "phase": self.phase.value,
            "status": self.status.value,
            "interrupted": self.interrupted.value if self.interrupted else None,
        }
        tmp = run_dir / ".state.json.tmp"
        tmp.write_text(json.dumps(data, indent=2))
        os.replace(tmp, run_dir / "state.json")

    def note_cycle(self, best: tuple[str, float] | None, best_trial_id: str | None, gate_fail_streak: int) -> None:
        """What the record phase learnt: the best variant and trial so far, and the gate's failure streak."""
        self.best_variant_id, self.best_selection_score = best or (None, None)
        self.best_trial_id, self.gate_fail_streak = best_trial_id, gate_fail_streak
        self.best_by_cycle = self.best_by_cycle[: self.cycle - 1] + [self.best_selection_score]

    def conclude(self, stop: bool, reason: str, exit_code: int) -> Phase:
        """Apply a cycle's decision: a stop finishes the run with its reason and exit code, else the next cycle
        starts. Returns the phase to go on with."""
        if not stop:
            self.cycle += 1
            return Phase.select
        self.stop_reason, self.exit_code, self.status = reason, exit_code, RunStatus.finished
        return Phase.done

    @classmethod
    def load(cls, run_dir: Path) -> CampaignState:
        """Read a run's state.json."""
        data = json.loads((run_dir / "state.json").read_text())
        interrupted = data.get("interrupted")
        return cls(
            **{
                **data,
                "phase": Phase(data["phase"]),
                "status": RunStatus(data["status"]),
                "interrupted": Phase(interrupted) if interrupted else None,
            }
        )


def open_state(run_dir: Path, run_id: str, resuming: bool) -> CampaignState:
    """A new run's state, or a resumed run's, set to go on; saved before it is returned."""
    if not resuming:
        state = CampaignState(run_id=run_id)
    else:
        state = CampaignState.load(run_dir)
        (run_dir / STOP_FILE).unlink(missing_ok=True)  # a resume is the user's wish to go on
        if state.phase is Phase.done:
            # Re-enter the phase a stop cut short, or re-decide under the (possibly raised) limits.
            state.phase, state.interrupted = state.interrupted or Phase.decide, None
        if state.status in (RunStatus.interrupted, RunStatus.crashed):
            # A Ctrl-C decided nothing, and a crash's error is behind a resume: the run goes on as it was (a crash's
            # exit code kept would be the resumed run's outcome where no decision stops it, and `status` would show it)
            state.stop_reason = state.exit_code = None
        state.status = RunStatus.running
    state.driver = liveness.this_driver()
    state.save(run_dir)
    return state
