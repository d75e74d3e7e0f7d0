"""A loopback OpenAI-compatible server that answers every call, after a delay, as a slow LLM agent would.

The analyst gets a fixed, valid analysis; the coder a unified diff computed from the request that sets one
non-searched knob (DROPOUT, WEIGHT_DECAY, MOMENTUM) to a new value per call, so every child is a new variant
that passes the gate. Used by tests/test_async.py and bench/clock.py (`SlowLLM(delay_s=20)`).
"""

from __future__ import annotations

import itertools
import json
import threading
from typing import Any

from llm_server import Reply, ScriptedLLM, edit_line

ANALYSIS = {
    "diagnoses": ["overfitting"],
    "summary": "Validation loss rises while the train loss keeps falling.",
    "recommendations": [
        {
            "intervention": "add_dropout",
            "diagnosis": "overfitting",
            "rationale": "regularise the classifier",
            "details": "raise DROPOUT",
            "priority": 0.9,
        },
        {
            "intervention": "weight_decay",
            "diagnosis": "overfitting",
            "rationale": "an L2 penalty",
            "details": "raise WEIGHT_DECAY",
            "priority": 0.8,
        },
        {
            "intervention": "momentum",
            "diagnosis": "plateau",
            "rationale": "smoother steps",
            "details": "change MOMENTUM",
            "priority": 0.7,
        },
    ],
}
EDITS = [
    ("DROPOUT", [0.1, 0.2, 0.3, 0.4, 0.05, 0.15, 0.25, 0.35]),
    ("WEIGHT_DECAY", [1e-4, 3e-4, 1e-3, 5e-5, 2e-4, 5e-4, 2e-3, 3e-5]),
    ("MOMENTUM", [0.8, 0.85, 0.95, 0.7, 0.75, 0.88, 0.92, 0.6]),
]


class _Forever:
    """A script that never runs out: every call gets the same (callable) reply."""

    def __init__(self, reply: Reply) -> None:
        self.reply = reply

    def popleft(self) -> Reply:
        return self.reply

    def extend(self, replies: Any) -> None:
        raise TypeError("a SlowLLM answers every call itself")

    def __bool__(self) -> bool:
        return True


class SlowLLM(ScriptedLLM):
    """Answers analyst and coder calls after `delay_s` seconds each."""

    def __init__(self, delay_s: float) -> None:
        super().__init__()
        self.calls = itertools.count()
        self.count_lock = threading.Lock()
        self.script = _Forever(Reply(self._answer, delay_s=delay_s))  # type: ignore[assignment]
        self.models = ["slow"]

    def _answer(self, body: dict[str, Any]) -> str:
        system = body["messages"][0]["content"]
        if "diagnose one trainer" in system:
            return json.dumps(ANALYSIS)
        with self.count_lock:
            n = next(self.calls)
        name, values = EDITS[n % len(EDITS)]
        value = values[(n // len(EDITS)) % len(values)]
        return edit_line(rf"^{name} = .*$", f"{name} = {value!r}  # set by the slow LLM (call {n})")(body)

    def overrides(self) -> list[str]:
        """The campaign overrides that point agent=openai at this server."""
        return [
            "agent=openai",
            f"agent.base_url={self.base_url}",
            "agent.model=slow",
            "agent.api_key_env=null",
            "agent.timeout_s=120",
            "agent.http_retries=1",
        ]
