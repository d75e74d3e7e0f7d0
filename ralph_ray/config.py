"""Typed config schemas, composed by Hydra from conf/ and validated once at the entry.

`DictConfig` stops here: `load_config` returns a plain `Config` dataclass that the engine passes inward.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from ralph_ray import PROJECT_ROOT

CONF_DIR = PROJECT_ROOT / "conf"
CIFAR10_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
CIFAR10_MD5 = "c58f30108f718f92721af3b95e74349a"


class ConfigError(ValueError):
    """A config value the engine cannot run with; names the key and the fix."""

    def __init__(self, key: str, problem: str, fix: str) -> None:
        super().__init__(f"config error at `{key}`: {problem}\n  fix: {fix}")
        self.key = key


class SpaceKind(enum.Enum):
    """How Optuna samples a knob."""

    uniform = "uniform"
    loguniform = "loguniform"
    int = "int"
    choice = "choice"


class SchedulerKind(enum.Enum):
    """Trial schedulers: ASHA stops laggards; FIFO runs every trial to the end (for baselines)."""

    asha = "asha"
    fifo = "fifo"


@dataclass
class KnobSpace:
    """The search range of one UPPER_CASE trainer knob."""

    type: SpaceKind = SpaceKind.uniform
    low: Optional[float] = None
    high: Optional[float] = None
    values: Optional[List[Any]] = None


@dataclass
class TaskConfig:
    """Which frozen task and which seed trainer."""

    name: str = "digits"
    trainer: str = "trainers/digits"  # relative to the project root, or absolute
    split_seed: int = 0
    selection_fraction: float = 0.2
    test_fraction: float = 0.2


@dataclass
class DataConfig:
    """Where a dataset that does not ship with the code lives, and how to fetch it."""

    root: Optional[str] = None
    download: bool = True
    url: str = CIFAR10_URL
    md5: str = CIFAR10_MD5


@dataclass
class SearchConfig:
    """One Tune run per cycle: Optuna samples knobs, reported `metric` ranks trials during training."""

    num_samples: int = 8
    max_concurrent: int = 2
    seed: int = 0
    metric: str = "val_acc"
    mode: str = "max"
    reuse_actors: bool = True
    space: Dict[str, KnobSpace] = field(default_factory=dict)


@dataclass
class SchedulerConfig:
    """ASHA over epochs (time attribute = epoch)."""

    name: SchedulerKind = SchedulerKind.asha
    max_t: int = 12
    grace_period: int = 2
    reduction_factor: float = 2.0


@dataclass
class SafeguardsConfig:
    """Limits that keep a campaign bounded; each stop rule is recorded in the cycle's decision.json."""

    trial_timeout_s: float = 600.0
    cycle_time_s: Optional[float] = None  # Tune's time budget per cycle
    campaign_time_s: Optional[float] = None  # no new cycle starts past this
    max_cycles: int = 5
    plateau_cycles: int = 3  # stop when the best has not risen by min_delta for this many cycles
    min_delta: float = 0.002
    tokens_per_cycle: Optional[int] = None  # agent tokens (in + out) per cycle
    tokens_per_campaign: Optional[int] = None
    cost_per_campaign: Optional[float] = None  # in the currency of agent.price_*
    gate_fail_cycles: int = 2  # stop when no child passes the validation gate for this many cycles
    smoke_timeout_s: float = 120.0  # the validation gate's smoke run


@dataclass
class TargetConfig:
    """The campaign's goal on the frozen selection score (null: no target, run until another rule stops it)."""

    selection_score: Optional[float] = None


class AgentBackend(enum.Enum):
    """Who writes children: none (knob search only), the offline heuristic, an LLM endpoint, a coding CLI."""

    none = "none"
    heuristic = "heuristic"
    openai = "openai"
    cli = "cli"
    hybrid = "hybrid"


@dataclass
class AgentConfig:
    """The analyst and coder agents."""

    backend: AgentBackend = AgentBackend.heuristic
    max_retries: int = 2  # gate failures sent back to the coder before a child is rejected
    exploration: float = 1.0  # bonus for interventions the KB has not measured yet (UCB-style)
    concurrency: int = 4  # children of one cycle requested at once
    seed: int = 0
    price_in_per_m: float = 0.0  # cost per million input tokens (for cost budgets and the report)
    price_out_per_m: float = 0.0  # cost per million output tokens


@dataclass
class PopulationConfig:
    """How each cycle branches: parents x children, and the knob samples each child gets."""

    parents: int = 2
    children_per_parent: int = 3
    trials_per_child: int = 2  # Optuna knob samples per child (the first runs the child's own knobs)
    explore: float = 0.2  # chance a parent slot goes to a random non-top variant
    one_per_lineage: bool = True  # prefer parents from different first-generation branches


@dataclass
class ResourcesConfig:
    """Per-trial resources and what the local Ray instance may use."""

    cpu: float = 1.0
    gpu: float = 0.0
    ray_num_cpus: Optional[int] = None


@dataclass
class PathsConfig:
    """Run directories and the knowledge base root (relative to the working directory)."""

    runs: str = "runs"
    kb: str = "kb"


@dataclass
class Config:
    """The whole, typed experiment config."""

    experiment: str = "digits"
    run_id: Optional[str] = None
    task: TaskConfig = field(default_factory=TaskConfig)
    data: DataConfig = field(default_factory=DataConfig)
    search: SearchConfig = field(default_factory=SearchConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    safeguards: SafeguardsConfig = field(default_factory=SafeguardsConfig)
    target: TargetConfig = field(default_factory=TargetConfig)
    population: PopulationConfig = field(default_factory=PopulationConfig)
    agent: AgentConfig = field(default_factory=AgentConfig)
    resources: ResourcesConfig = field(default_factory=ResourcesConfig)
    paths: PathsConfig = field(default_factory=PathsConfig)
    resume: Optional[str] = None  # a run id to continue (python -m ralph_ray resume=<run_id>)

    def trainer_dir(self) -> Path:
        """The seed trainer's folder, resolved against the project root."""
        path = Path(self.task.trainer)
        return path if path.is_absolute() else PROJECT_ROOT / path


KNOWN_TASKS = ("digits", "cifar10")


def load_config(overrides: list[str] | None = None) -> Config:
    """Compose conf/ with Hydra overrides into a validated `Config`; raises ConfigError on any problem."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import ConfigKeyError

    overrides = list(overrides or [])
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            raw = compose(config_name="config", overrides=overrides)
    except (HydraException, ConfigKeyError) as err:
        raise _override_error(err) from None
    return to_config(raw)


def resume_config(run_dir: Path, overrides: list[str] | None = None) -> Config:
    """A stored run's config (its config.yaml) with `key=value` overrides on top, e.g. a raised max_cycles."""
    stored = run_dir / "config.yaml"
    if not stored.exists():
        raise ConfigError("resume", f"no {stored}", "check the run id and paths.runs (runs live under <paths.runs>/<run_id>/)")
    raw = OmegaConf.load(stored)
    plain = [o.lstrip("+") for o in overrides or [] if not o.startswith(("resume=", "+experiment", "experiment="))]
    try:
        raw = OmegaConf.merge(raw, OmegaConf.from_dotlist(plain))
    except OmegaConfBaseException as err:
        raise ConfigError("override", _first_line(err), "resume takes plain key=value overrides (e.g. safeguards.max_cycles=8)") from None
    cfg = to_config(raw)
    cfg.resume = run_dir.name
    return cfg


def to_config(raw: Any) -> Config:
    """Merge a composed config onto the schema (types, unknown keys) and check its values."""
    OmegaConf.set_struct(raw, False)
    raw_dict = OmegaConf.to_container(raw, resolve=True)
    raw_dict.pop("hydra", None)  # type: ignore[union-attr]
    try:
        merged = OmegaConf.merge(OmegaConf.structured(Config), raw_dict)
        cfg: Config = OmegaConf.to_object(merged)  # type: ignore[assignment]
    except OmegaConfBaseException as err:
        key = getattr(err, "full_key", None) or "?"
        raise ConfigError(str(key), _first_line(err), _fix_for(str(key))) from None
    validate(cfg)
    return cfg


def validate(cfg: Config) -> None:
    """Check values a type cannot express: signs, ranges, known names, required data roots."""
    if cfg.task.name not in KNOWN_TASKS:
        raise ConfigError("task.name", f"unknown task {cfg.task.name!r}", f"use one of {', '.join(KNOWN_TASKS)}")
    if not (cfg.trainer_dir() / "train.py").exists():
        raise ConfigError("task.trainer", f"{cfg.trainer_dir()}/train.py does not exist", "point task.trainer at a folder holding train.py")
    for key, value in (("task.selection_fraction", cfg.task.selection_fraction), ("task.test_fraction", cfg.task.test_fraction)):
        if not 0.0 < value < 0.5:
            raise ConfigError(key, f"must be in (0, 0.5), got {value}", f"set {key}=0.2")
    _positive("search.num_samples", cfg.search.num_samples)
    _positive("search.max_concurrent", cfg.search.max_concurrent)
    if cfg.search.mode not in ("max", "min"):
        raise ConfigError("search.mode", f"must be max or min, got {cfg.search.mode!r}", "set search.mode=max")
    for name, space in cfg.search.space.items():
        _check_space(name, space)
    _positive("scheduler.max_t", cfg.scheduler.max_t)
    _positive("scheduler.grace_period", cfg.scheduler.grace_period)
    if cfg.scheduler.grace_period > cfg.scheduler.max_t:
        raise ConfigError("scheduler.grace_period", f"{cfg.scheduler.grace_period} exceeds scheduler.max_t={cfg.scheduler.max_t}", "lower grace_period or raise max_t")
    if cfg.scheduler.reduction_factor <= 1:
        raise ConfigError("scheduler.reduction_factor", f"must be > 1, got {cfg.scheduler.reduction_factor}", "set scheduler.reduction_factor=2")
    _positive("safeguards.trial_timeout_s", cfg.safeguards.trial_timeout_s)
    _positive("safeguards.max_cycles", cfg.safeguards.max_cycles)
    for key in ("cycle_time_s", "campaign_time_s", "tokens_per_cycle", "tokens_per_campaign", "cost_per_campaign"):
        value = getattr(cfg.safeguards, key)
        if value is not None:
            _positive(f"safeguards.{key}", value)
    _positive("safeguards.plateau_cycles", cfg.safeguards.plateau_cycles)
    _positive("safeguards.gate_fail_cycles", cfg.safeguards.gate_fail_cycles)
    _positive("safeguards.smoke_timeout_s", cfg.safeguards.smoke_timeout_s)
    if cfg.safeguards.min_delta < 0:
        raise ConfigError("safeguards.min_delta", f"must be >= 0, got {cfg.safeguards.min_delta}", "set safeguards.min_delta=0.002")
    if cfg.target.selection_score is not None and not 0.0 < cfg.target.selection_score <= 1.0:
        raise ConfigError("target.selection_score", f"must be in (0, 1], got {cfg.target.selection_score}", "set target.selection_score=0.99 or null")
    _positive("population.parents", cfg.population.parents)
    _positive("population.children_per_parent", cfg.population.children_per_parent)
    _positive("population.trials_per_child", cfg.population.trials_per_child)
    if not 0.0 <= cfg.population.explore <= 1.0:
        raise ConfigError("population.explore", f"must be in [0, 1], got {cfg.population.explore}", "set population.explore=0.2")
    if cfg.agent.max_retries < 0:
        raise ConfigError("agent.max_retries", f"must be >= 0, got {cfg.agent.max_retries}", "set agent.max_retries=2")
    _positive("agent.concurrency", cfg.agent.concurrency)
    if cfg.agent.exploration < 0:
        raise ConfigError("agent.exploration", f"must be >= 0, got {cfg.agent.exploration}", "set agent.exploration=1.0")
    _positive("resources.cpu", cfg.resources.cpu)
    if cfg.resources.gpu < 0:
        raise ConfigError("resources.gpu", f"must be >= 0, got {cfg.resources.gpu}", "set resources.gpu=0 (CPU) or 1")
    if cfg.resources.ray_num_cpus is not None:
        _positive("resources.ray_num_cpus", cfg.resources.ray_num_cpus)
    if cfg.task.name == "cifar10" and not cfg.data.root:
        raise ConfigError("data.root", "cifar10 needs a data root", "pass data.root=/path/to/cifar (the folder holding or to hold cifar-10-batches-py)")


def _check_space(name: str, space: KnobSpace) -> None:
    key = f"search.space.{name}"
    if not name.isupper():
        raise ConfigError(key, f"{name!r} is not an UPPER_CASE knob", "name the trainer's module-level constant, e.g. LR")
    if space.type is SpaceKind.choice:
        if not space.values:
            raise ConfigError(f"{key}.values", "a choice needs a non-empty list", f"set {key}.values=[...]")
        return
    if space.low is None or space.high is None:
        raise ConfigError(key, f"a {space.type.value} range needs low and high", f"set {key}.low and {key}.high")
    if space.low >= space.high:
        raise ConfigError(f"{key}.low", f"low={space.low} must be below high={space.high}", "swap or widen the range")
    if space.type is SpaceKind.loguniform and space.low <= 0:
        raise ConfigError(f"{key}.low", "a loguniform range must be positive", "use a low above 0")


def _positive(key: str, value: float) -> None:
    if value <= 0:
        raise ConfigError(key, f"must be positive, got {value}", f"set {key} to a value above 0")


def _override_error(err: Exception) -> ConfigError:
    """Turn Hydra's composition errors into a ConfigError naming the offending override."""
    text = str(err)
    key = "override"
    for token in text.replace("'", " ").split():
        if "." in token or "=" in token:
            key = token.split("=")[0]
            break
    fix = "check the key against conf/ (`python -m ralph_ray --cfg` prints the composed config); add new keys with +key=value only where the schema has them"
    if "Could not find" in text or "not found in" in text.lower():
        fix = "choose an option that exists under conf/<group>/ (e.g. +experiment=cifar10)"
    return ConfigError(key, _first_line(err), fix)


def _fix_for(key: str) -> str:
    return f"check `{key}` against the schema in ralph_ray/config.py (spelling and type)"


def _first_line(err: Exception) -> str:
    return str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
