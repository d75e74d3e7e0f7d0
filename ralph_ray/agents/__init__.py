"""Agent backends: `none` (knob search only), `heuristic` (offline default), and LLM backends.

The prompts and the intervention catalog are files in the top-level `agents/` folder, not strings here.
"""

from __future__ import annotations

from ralph_ray.agents.base import Analyst, Coder
from ralph_ray.config import AgentBackend, Config


def make_agents(cfg: Config) -> tuple[Analyst | None, Coder | None]:
    """The analyst and coder for the configured backend (both None for knob search only)."""
    backend = cfg.agent.backend
    if backend is AgentBackend.none:
        return None, None
    if backend is AgentBackend.heuristic:
        from ralph_ray.agents.heuristic import HeuristicAnalyst, HeuristicCoder

        return HeuristicAnalyst(seed=cfg.agent.seed, exploration=cfg.agent.exploration), HeuristicCoder()
    raise NotImplementedError(f"agent backend {backend.value} is not built yet")
