"""Plain objects in the shape Tune hands its schedulers, for tests that drive a scheduler as Tune does."""

from __future__ import annotations


class TuneTrial:
    """What Tune's scheduler reads of a trial: its id."""

    def __init__(self, trial_id: str) -> None:
        self.trial_id = trial_id
