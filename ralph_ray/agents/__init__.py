"""Agent backends: `none` (knob search only), `heuristic` (offline default), and LLM backends.

The prompts and the intervention catalog are files in the top-level `agents/` folder, not strings here.
"""

from __future__ import annotations

import functools
import weakref
from pathlib import Path
from typing import TYPE_CHECKING

from ralph_ray.agents.base import Analyst, Coder
from ralph_ray.config import AgentBackend, Config, sandbox_policy

if TYPE_CHECKING:
    from ralph_ray.agents.catalog import Searched
    from ralph_ray.agents.llm import ChatClient

SPARE_RECOMMENDATIONS = 2  # an LLM analyst proposes this many ideas beyond children_per_parent (for duplicates)
# The configs whose endpoint `preflight` has just checked, by id (the weak reference tells a reused id): the next
# make_agents of that config (the campaign loop's) skips the check instead of probing the endpoint a second time.
_PREFLIGHTED: dict[int, weakref.ref[Config]] = {}


def searched_knobs(cfg: Config) -> Searched:
    """For each searched knob, what a child's trials train for its own value of it (`space.trained_value`): what the
    offline agent's knob moves are held to."""
    from ralph_ray.space import trained_value

    space, relative = cfg.search.space, cfg.search.relative
    return {name: functools.partial(trained_value, name, space=space, relative=relative) for name in space}


def make_agents(cfg: Config, run_id: str | None = None) -> tuple[Analyst | None, Coder | None]:
    """The analyst and coder for the configured backend (both None for knob search only).

    LLM and CLI backends check their endpoint or command here, before any training: a wrong key, an
    unreachable endpoint or a missing CLI raises AgentConfigError. The endpoint is not probed again where
    `preflight(cfg)` checked this very config just before (a campaign start: once, not twice). `run_id` lets
    agent=hybrid read the run's history from the knowledge base.
    """
    backend = cfg.agent.backend
    checked = _PREFLIGHTED.pop(id(cfg), None)
    build = _Builder(cfg, probe=checked is None or checked() is not cfg)
    if backend is AgentBackend.none:
        return None, None
    if backend is AgentBackend.heuristic:
        return build.heuristic()
    if backend is AgentBackend.openai:
        return build.analyst(AgentBackend.openai), build.coder(AgentBackend.openai)
    if backend is AgentBackend.cli:
        return build.analyst(cfg.agent.analyst or AgentBackend.heuristic), build.coder(AgentBackend.cli)
    if backend is AgentBackend.hybrid:
        from ralph_ray.agents.hybrid import HybridAnalyst, HybridCoder, HybridPolicy

        heuristic_analyst, heuristic_coder = build.heuristic()
        llm_side = cfg.agent.hybrid_llm
        llm_analyst = build.analyst(
            cfg.agent.analyst or (AgentBackend.openai if llm_side is AgentBackend.openai else AgentBackend.heuristic)
        )
        policy = HybridPolicy(
            Path(cfg.paths.kb).resolve(),
            run_id,
            cfg.agent.stall_cycles,
            cfg.agent.llm_fail_children,
            cfg.safeguards.min_delta,
        )
        return HybridAnalyst(policy, heuristic_analyst, llm_analyst), HybridCoder(
            policy, heuristic_coder, build.coder(llm_side)
        )
    raise NotImplementedError(f"agent backend {backend.value} is not built yet")


def preflight(cfg: Config) -> None:
    """The backend's startup checks alone (endpoint, key, model; a CLI on PATH), run before anything of the run is
    written: a refused start leaves no run behind, a refused resume its run as it was (not rewritten as crashed).
    The next make_agents of `cfg` (the campaign loop's) relies on this check rather than probing again."""
    _PREFLIGHTED.pop(id(cfg), None)
    make_agents(cfg)
    _PREFLIGHTED[id(cfg)] = weakref.ref(cfg)


class _Builder:
    """Builds one backend's agents; analyst and coder share one endpoint client, checked once (`probe`: at all)."""

    def __init__(self, cfg: Config, probe: bool = True) -> None:
        self.cfg, self.probe = cfg, probe
        self._chat: ChatClient | None = None

    def heuristic(self) -> tuple[Analyst, Coder]:
        from ralph_ray.agents.heuristic import HeuristicAnalyst, HeuristicCoder, Watched

        timed = self.cfg.trial.budget_s is not None
        gpu = self.cfg.resources.gpu > 0
        analyst = HeuristicAnalyst(
            seed=self.cfg.agent.seed,
            exploration=self.cfg.agent.exploration,
            timed=timed,
            gpu=gpu,
            mirror_invariant=self.cfg.task.mirror_invariant,
            images=self.cfg.task.images,
            searched=searched_knobs(self.cfg),
            metric=Watched(self.cfg.search.metric, self.cfg.search.mode == "min"),
        )
        return analyst, HeuristicCoder(searched=searched_knobs(self.cfg))

    def analyst(self, kind: AgentBackend) -> Analyst:
        if kind is AgentBackend.heuristic:
            return self.heuristic()[0]
        from ralph_ray.agents.catalog import load_catalog
        from ralph_ray.agents.llm import LLMAnalyst

        mirror_invariant, images = self.cfg.task.mirror_invariant, self.cfg.task.images
        # The catalog shown leaves out what the task forbids, as the heuristic analyst skips it.
        catalog = [(i.name, i.description) for i in load_catalog() if i.unsuited_to(images, mirror_invariant) is None]
        return LLMAnalyst(
            self.chat(),
            self.cfg.agent,
            self.cfg.population.children_per_parent + SPARE_RECOMMENDATIONS,
            catalog,
            self.cfg.trial.budget_s,
            mirror_invariant,
        )

    def coder(self, kind: AgentBackend) -> Coder:
        if kind is AgentBackend.cli:
            from ralph_ray.agents.cli import CliCoder

            coder = CliCoder(self.cfg.agent, sandbox_policy(self.cfg), tuple(self.cfg.sandbox.agent_paths))
            coder.check()
            return coder
        from ralph_ray.agents.llm import LLMCoder

        return LLMCoder(self.chat(), self.cfg.agent)

    def chat(self) -> ChatClient:
        """The endpoint client (the openai SDK is imported only when an LLM backend is chosen)."""
        if self._chat is None:
            from ralph_ray.agents.llm import ChatClient

            self._chat = ChatClient(self.cfg.agent)
            if self.probe:
                self._chat.preflight()
        return self._chat
