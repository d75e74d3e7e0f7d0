"""Typed config schemas, composed by Hydra from conf/ and validated once at the entry.

`DictConfig` stops here: `load_config` returns a plain `Config` dataclass that the engine passes inward.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import enum
import math
import os
import re
import shlex
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from ralph_ray import PROJECT_ROOT
from ralph_ray.cli_templates import TemplateError, load_template
from ralph_ray.harness import TRAIN_SECONDS
from ralph_ray.knobs import KnobError, is_knob_name, is_literal, near_knobs, parse, read_knobs, reported_metrics
from ralph_ray.resumable import missing_resume_calls, parallel_problem, refusal
from ralph_ray.sandbox import Policy, SandboxMode
from ralph_ray.secretenv import SECRET_ENV
from ralph_ray.seedcheck import (
    config_files,
    config_value,
    fallback_knobs,
    harness_problem,
    overridden_knobs,
    ship_fix,
    shipped_split,
    shown,
    sized_schedule,
    unread_problem,
    unshipped_config,
)
from ralph_ray.tasks import TASKS, find_task, task_names
from ralph_ray.tasks.base import ScoredBy
from ralph_ray.tasks.folder import TaskError, TaskFolder, load_task
from ralph_ray.variants import TRAINER_FILES, globbed, globs_file

CONF_DIR = PROJECT_ROOT / "conf"
# safeguards.final_additions' names -> the offline agent's transform that adds each to the final's copy of the pick's
# code (finaltrain applies them in the list's order; a name is also what the trials table's `final_added` records)
FINAL_ADDITIONS = {
    "cosine": "cosine_lr_schedule",  # a cosine learning-rate schedule along the final's budget
    "one_cycle": "one_cycle_schedule",  # or a one-cycle schedule
    "shift": "shift_augmentation",  # random 1-pixel shifts of the training images
    "flip": "flip_augmentation",  # random left-right flips (mirror-invariant tasks only)
    "deepen": "deepen",  # a hidden layer (Linear + ReLU) before the classifier
    "flip_tta": "flip_tta",  # outputs averaged over each image and its mirror at test time (mirror-invariant only)
}
FINAL_SCHEDULES = ("cosine", "one_cycle")  # at most one of them
# The settings final_additions replaced (2026-11-29): what to set instead, and a saved run's config migrated on resume
LEGACY_FINAL_KEYS = {
    "safeguards.final_schedule": "safeguards.final_additions=[cosine] (or [one_cycle])",
    "safeguards.final_augment": "safeguards.final_additions=[shift,flip]",
    "safeguards.final_deepen": "safeguards.final_additions=[deepen]",
}


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


class SamplerKind(enum.Enum):
    """Optuna's sampler of knob values: TPE (the default, it learns from the trials so far) or plain random
    sampling (a baseline for benchmarks: what the search adds over drawing knobs blind)."""

    tpe = "tpe"
    random = "random"


class SchedulerKind(enum.Enum):
    """Trial schedulers: ASHA stops laggards; FIFO runs every trial to the end (for baselines); PBT clones and
    perturbs trials while they train (population based training, ralph_ray.pbt); PB2 does so with a Gaussian-process
    bandit choosing the new knobs (Parker-Holder et al. 2020, for small populations)."""

    asha = "asha"
    fifo = "fifo"
    pbt = "pbt"
    pb2 = "pb2"

    @property
    def population_based(self) -> bool:
        """PBT or PB2: trials clone and perturb each other through checkpoints (ralph_ray.pbt)."""
        return self in (SchedulerKind.pbt, SchedulerKind.pb2)


@dataclass
class KnobSpace:
    """The search range of one UPPER_CASE trainer knob."""

    type: SpaceKind = SpaceKind.uniform
    low: Optional[float] = None
    high: Optional[float] = None
    values: Optional[List[Any]] = None


@dataclass
class TaskConfig:
    """Which task: its folder (frozen prepare.py, train.py, program.md, task.yaml) and how its data is split."""

    name: str = "digits"
    trainer: str = "trainers/digits"  # the task folder, relative to the project root or absolute (task=./path sets it)
    # What of the task folder the seed variant holds, and so what trials and agents see (globs on paths relative to
    # the folder): code and notes. Raw data kept beside the trainer stays out; add a file the trainer reads here.
    trainer_files: List[str] = field(default_factory=lambda: list(TRAINER_FILES))
    split_seed: int = 0
    selection_fraction: float = 0.2
    test_fraction: float = 0.2
    subsample: int = 0  # a task that reads it (fashion) keeps a stratified sample of this many images (0: all)
    # Whether mirroring an input left to right keeps its label (garments, natural images: yes; digits, letters: no).
    # Where false the offline agent does not propose flips (a child that mirrored digits lost 0.033 selection).
    mirror_invariant: bool = True
    # Whether the inputs are images (shifts, flips and channels-last mean something): false keeps the offline agent
    # from proposing them (on 30 table columns they only failed the gate; on 16, 25 or 64 they would shift rows).
    # None: inferred from the prepared train inputs when the campaign starts (tasks.image_inputs).
    images: Optional[bool] = None
    # Read from the task's prepare.py (METRIC) when the config is validated; recorded so reports and the app know
    # how to read a score. Scores are stored oriented (higher is better): a min metric's score is -value.
    metric: Optional[str] = None
    direction: Optional[str] = None
    scored_by: Optional[str] = None  # "model": the engine scores the trainer's exported model (ralph_ray.modeleval)


@dataclass
class DataConfig:
    """Where a dataset that does not ship with the code lives, and how to fetch it."""

    root: Optional[str] = None
    download: bool = True
    url: Optional[str] = None  # where to fetch it from (None: the task's own default, e.g. cifar10's)
    md5: Optional[str] = None  # its archive's md5 (None: the task's own)


@dataclass
class SearchConfig:
    """One Tune run per cycle: Optuna samples knobs, reported `metric` ranks trials during training."""

    num_samples: int = 8  # the seed's knob search (cycle 1); later cycles: population.trials_per_child per child
    max_concurrent: int = 2
    seed: int = 0
    metric: str = "val_acc"
    mode: str = "max"
    reuse_actors: bool = True
    space: Dict[str, KnobSpace] = field(default_factory=dict)
    # After cycle 1, numeric knobs are sampled as factors on each variant's own value (so an agent's
    # knob change is searched around rather than undone): uniform/loguniform/int in [1/span, span],
    # numeric choices as their ratios to the middle choice.
    relative: bool = True
    relative_span: float = 2.0
    sampler: SamplerKind = SamplerKind.tpe
    # The conf/search option the first run composed (search=..., an experiment's, else the default), recorded by
    # load_config: a resume's `search=` is compared with it (None: a run recorded before it was, or a hand-made Config).
    group: Optional[str] = None


@dataclass
class SchedulerConfig:
    """ASHA over epochs (time attribute = epoch)."""

    name: SchedulerKind = SchedulerKind.asha
    max_t: int = 12
    grace_period: int = 2
    reduction_factor: float = 2.0
    # A trial stops at a rung only when its metric is below the rung's cutoff by more than `margin` (ralph_ray.asha):
    # auto = margin_z standard errors of an accuracy over the validation examples its reported values reveal
    # (0, plain ASHA, for a metric that is no such accuracy); a number sets it by hand (0: plain ASHA).
    margin: str = "auto"
    margin_z: float = 2.0
    # A learning-curve forecaster beside the scheduler (ralph_ray.forecast): a trial whose power-law forecast of its
    # final metric cannot beat the best final so far at safeguards.confidence stops early, its forecast recorded.
    forecast: bool = False
    # scheduler=pbt: every perturbation_interval epochs the bottom quantile_fraction of trials copy a top trial's
    # checkpoint and config (its variant too) and perturb the knobs in `mutate` (null: every searched knob; leave
    # out knobs that shape the model, such as WIDTH, since a clone keeps the donor's weights).
    perturbation_interval: int = 2
    quantile_fraction: float = 0.25
    resample_probability: float = 0.25
    mutate: Optional[List[str]] = None
    synch: bool = True  # all trials perturb at the same epochs (segments line up; slots wait for the slowest)


@dataclass
class SafeguardsConfig:
    """Limits that keep a campaign bounded; each stop rule is recorded in the cycle's decision.json."""

    trial_timeout_s: float = 600.0
    cycle_time_s: Optional[float] = None  # Tune's time budget per cycle
    campaign_time_s: Optional[float] = None  # no new cycle starts past this
    max_cycles: int = 5
    plateau_cycles: int = 3  # stop when the best has not risen by min_delta for this many cycles
    min_delta: float = 0.002
    # Fresh-seed runs of a variant's best knobs before it is judged (0: off, a child is kept on one trial beating
    # its parent's by min_delta); the keep verdict, the plateau rule and the target then read these replicates
    # through Student-t statistics at `confidence` (ralph_ray.noise).
    replicates: int = 3
    confidence: float = 0.9
    tokens_per_cycle: Optional[int] = None  # agent tokens (in + out) per cycle
    tokens_per_campaign: Optional[int] = None
    cost_per_campaign: Optional[float] = None  # in the currency of agent.price_*
    gate_fail_cycles: int = 2  # stop when no child passes the validation gate for this many cycles
    smoke_timeout_s: float = 120.0  # the validation gate's smoke run
    # Retries of a trial whose node or actor was lost (from its last checkpoint); a trainer's own failure is final.
    max_failures: int = 2
    checkpoint_every_s: float = (
        0.0  # trainers checkpoint at most this often (0: every epoch); only on a cluster with paths.storage
    )
    # The share of campaign_time_s kept for the final training of the pick (ralph_ray.finaltrain): the search stops
    # at campaign_time_s x (1 - final_share), then the rank-1 variant's best knobs train once for the rest, on every
    # slot's CPUs, as a marked trial. 0: off (the search has the whole budget). Needs campaign_time_s.
    final_share: float = 0.0
    # What the final training adds to a copy of the pick's code, each where it applies (names of FINAL_ADDITIONS, in
    # order: the offline agent's own transforms). The search's short trials reward what learns fast at a constant
    # rate with few parameters; a schedule, a regulariser or more capacity pays over the final's long run (Fashion:
    # README, Figures). Flips, in training or at test, only where the task is mirror invariant. Empty: as searched.
    final_additions: List[str] = field(default_factory=list)
    # How many of the search's best train in the final share, side by side, the slots split between them: the pick
    # (rank 1, its best knobs) and the next best distinct (variant, knobs) by their best search trial. 1: the pick
    # alone. A short trial's ranking of the top few is within noise, and what wins over a long run (augmentation,
    # normalisation) often loses at the search's budget; the long run's selection score then names the winner.
    final_candidates: int = 1

    @property
    def search_time_s(self) -> Optional[float]:
        """Seconds the search may run: campaign_time_s less the final training's share (None: no time budget)."""
        if self.campaign_time_s is None:
            return None
        return self.campaign_time_s * (1.0 - self.final_share)


@dataclass
class TargetConfig:
    """The campaign's goal on the frozen selection metric, in the metric's own units and direction (e.g. an MSE to get
    below for a min metric); null: no target, run until another rule stops it."""

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
    exploration: float = 0.01  # UCB bonus (in score units) for interventions the KB has measured little
    concurrency: int = 4  # children of one cycle requested at once
    seed: int = 0
    price_in_per_m: float = 0.0  # cost per million input tokens (for cost budgets and the report)
    price_out_per_m: float = 0.0  # cost per million output tokens
    # LLM endpoint (agent=openai, and the LLM side of agent=hybrid): any OpenAI-compatible chat-completions server.
    base_url: Optional[str] = (
        None  # e.g. https://api.openai.com/v1, http://localhost:11434/v1 (Ollama), http://localhost:8000/v1 (vLLM)
    )
    model: Optional[str] = None  # the model name the server knows (CLI templates pass it on as {model})
    api_key_env: Optional[str] = "OPENAI_API_KEY"  # the NAME of the environment variable holding the key; null: no key
    timeout_s: float = 120.0  # per HTTP request
    http_retries: int = 4  # retries with backoff on 429, 5xx, timeouts and dropped connections
    temperature: Optional[float] = 0.2  # null: the server's default
    max_tokens: Optional[int] = 4096  # per answer; null: the server's default
    answer_retries: int = 2  # a malformed analysis or a diff that does not apply goes back with the error this often
    json_mode: bool = False  # ask the server for response_format=json_object in the analyst's calls
    analyst: Optional[AgentBackend] = None  # who diagnoses parents (heuristic or openai); null: the backend's own
    # agent=cli: an external coding agent edits the child's work dir.
    cli_template: str = "generic"  # agents/cli/<name>.yaml: claude, codex, aider, opencode, generic
    cli_command: Optional[str] = (
        None  # replaces the template's command; placeholders {prompt} {prompt_file} {model} {workdir} {scratch}
    )
    cli_timeout_s: float = 900.0  # per call; the command's whole process group is killed past it
    cli_env: List[str] = field(
        default_factory=list
    )  # secret-looking variables the command may see, besides the template's
    # agent=hybrid: the heuristic until the campaign stalls, then the LLM, back when the LLM's children keep failing.
    hybrid_llm: AgentBackend = AgentBackend.openai  # the LLM side: openai or cli
    stall_cycles: int = 1  # cycles without improvement (safeguards.min_delta) before the LLM takes over
    llm_fail_children: int = 3  # LLM children rejected or crashed in a row before the heuristic takes back over


class PopulationMode(enum.Enum):
    """How a campaign's generations run: overlapping in one Tune run (async), or one barrier cycle each."""

    asynchronous = "async"
    generations = "generations"
    auto = "auto"  # async, or generations where the run needs a barrier (resolved at load: `resolve_mode`)


@dataclass
class TrialConfig:
    """What every trial gets: an equal training-time budget (null: the trainer's own EPOCHS)."""

    budget_s: Optional[float] = None  # seconds of training per trial; the trainer sees it as harness.time_left()
    grace_s: float = 10.0  # past budget_s + grace_s of training the engine stops the trial (last epoch, predictions)
    # Fork each trial from a warm server of its worker (torch already imported, inside the same sandbox) instead
    # of starting a new interpreter; where that cannot work the campaign says why and starts trials cold.
    warm: bool = True
    # With warm starts, keep one trainer forked ahead per worker: on a GPU it starts CUDA and its libraries while
    # the trial before it trains (0.5-0.7 s a trial off the clock), at the cost of a CUDA context's GPU memory.
    prestart: bool = True


@dataclass
class SandboxConfig:
    """How agent-written code runs (conf/sandbox/bwrap.yaml; `sandbox=none` is the explicit opt-out)."""

    mode: SandboxMode = SandboxMode.bwrap  # bwrap: bubblewrap isolation; none: a plain subprocess (limits stay)
    memory_mb: int = (
        Policy.memory_mb
    )  # per trial, smoke run or CLI agent: a cgroup where one can be made, else RLIMIT_AS
    processes: int = Policy.processes  # processes + threads (cgroup pids.max; else RLIMIT_NPROC)
    file_size_mb: int = Policy.file_size_mb  # largest file a run may write (RLIMIT_FSIZE)
    output_mb: int = 50  # stdout + stderr of one run; past it the rest is dropped with a marker and the trial fails
    network: bool = False  # trials reach no network unless this is on (CLI agents always have it: their API)
    # Folders a CLI agent keeps its login and settings in (e.g. ~/.claude, ~/.config/opencode), bound read-write
    # into its sandbox; nothing else of home is there.
    agent_paths: List[str] = field(default_factory=list)
    # Set by the campaign: data files the task's prepare() read in folders trials see (the system folders, the
    # Python environment), hidden from every run as `hidden_paths` would hide them (tasks/reads.py).
    prepare_reads: List[str] = field(default_factory=list)
    # false: those files stay visible (a vocabulary or a model's config.json that prepare() and the trainers both
    # read); the campaign still names them, as a warning
    hide_prepare_reads: bool = True

    def policy(self, hidden: tuple[str, ...] = ()) -> Policy:
        """The runtime policy, with paths that must stay hidden from the run (data.root, runs, kb)."""
        return Policy(self.mode, self.memory_mb, self.processes, self.file_size_mb, self.network, hidden)


@dataclass
class PopulationConfig:
    """How each cycle branches: parents x children, and the knob samples each child gets."""

    # async: one Tune run per campaign, children bred in the background while every slot trains (a child's
    # generation is its parent's + 1); generations: the barrier loop, one Tune run per cycle; auto: async unless
    # the run needs barrier cycles (PBT/PB2, data-parallel trials), resolved at load so a run's config.yaml
    # records the mode it ran in.
    mode: str = PopulationMode.auto.value  # a string: `async` is no Python name for an enum member

    @property
    def run_mode(self) -> PopulationMode:
        """`mode` as its enum (validated at load)."""
        return PopulationMode(self.mode)

    # The shape: parents x children_per_parent. Left null (the default) it is chosen by the campaign's time budget
    # at load (`resolve_shape`): the serial 1x1 Ralph loop when safeguards.campaign_time_s <= serial_up_to_s, where
    # the serial loop measured level with or ahead of 2x3 at equal wall (digits 120 and 300 s, lm 300 s: README,
    # Figures, bench/loop_vs_serial.py), else 2 x 3 (ahead on lm at 900 s). A number is used as given.
    parents: Optional[int] = None
    children_per_parent: Optional[int] = None
    serial_up_to_s: float = 300.0  # 0: never serial by budget
    shape_by_budget: bool = (
        False  # set at load where the shape was left null (the console then says the budget chose it)
    )
    trials_per_child: int = 2  # knob samples per child (the first runs its own knobs; a knob-search child's: none)
    explore: float = 0.2  # chance a parent slot goes to a random non-top variant
    one_per_lineage: bool = True  # prefer parents from different first-generation branches
    # async: the background breeder (analysis, coding, the gate's smoke runs) runs this much nicer than the trials,
    # so a trial under a time budget keeps its CPU while children are written (0: the trials' priority).
    breeder_nice: int = 10


@dataclass
class ResourcesConfig:
    """Per-trial resources and what the local Ray instance may use."""

    cpu: float = 1.0  # per worker of a trial
    gpu: float = 0.0  # per worker of a trial
    ray_num_cpus: Optional[int] = None
    # N > 1: each trial is a data-parallel job of N workers (Ray Train's TorchTrainer, ralph_ray.dataparallel),
    # each running train.py with the torch.distributed environment set; placed by `placement` (a Ray
    # placement-group strategy: PACK packs a trial's workers on one node when they fit, SPREAD spreads them).
    workers_per_trial: int = 1
    placement: str = "PACK"
    # true: a trial of one worker runs through Ray Train too (a process group of one: NCCL on a GPU), the
    # data-parallel path without its scaling: to measure that path's cost, or to keep one code path across N.
    ray_train: bool = False

    @property
    def data_parallel(self) -> bool:
        """Whether each trial is a Ray Train worker group (ralph_ray.dataparallel) rather than one process."""
        return self.workers_per_trial > 1 or self.ray_train


@dataclass
class PathsConfig:
    """Run directories and the knowledge base root (relative to the working directory)."""

    runs: str = "runs"
    kb: str = "kb"
    # Tune's storage (results, checkpoints): null = inside the run dir; a folder every node sees (NFS) or a
    # pyarrow.fs URI (s3://bucket/ralph, gs://..., file:///...). On a multi-node cluster, set it so a trial
    # lost with its node resumes from its checkpoint on another node.
    storage: Optional[str] = None


@dataclass
class TrackingConfig:
    """Experiment trackers a campaign is published to when it ends (ralph_ray.tracking): tracking=mlflow|tensorboard|
    wandb, or a list (tracking=[mlflow,wandb])."""

    mlflow: bool = False
    tensorboard: bool = False
    wandb: bool = False
    mlflow_uri: Optional[str] = None  # null: an offline SQLite store under <run_dir>/tracking/mlflow/
    wandb_mode: str = "offline"  # offline: runs under <run_dir>/tracking/wandb (wandb sync); online after wandb login

    def trackers(self) -> list[str]:
        """The names of the trackers switched on."""
        return [name for name in ("mlflow", "tensorboard", "wandb") if getattr(self, name)]


class ClusterMode(enum.Enum):
    """Where Ray runs: started in this process (one machine), or a running cluster joined by address."""

    local = "local"
    address = "address"


AUTH_MODES = ("token", "disabled")


@dataclass
class ClusterConfig:
    """How the campaign reaches Ray (conf/cluster/local.yaml, conf/cluster/address.yaml)."""

    mode: ClusterMode = ClusterMode.local
    address: Optional[str] = (
        None  # mode=address: auto (a cluster this machine belongs to), host:port; null: $RAY_ADDRESS
    )
    # RAY_AUTH_MODE for this driver (it overrides the environment's): token, Ray's own generated secret, so nobody
    # who merely reaches Ray's ports can run code; the head and every worker run with the same mode and token.
    # disabled is the explicit opt-out, shown in the run's config, its report and the app.
    auth_mode: str = "token"
    connect_timeout_s: float = 15.0  # how long joining a cluster may take before it is reported unreachable
    # mode=local: start a local Ray that outlives the campaign, for the next local campaigns of this user to join
    # (they reuse a kept one whenever it is there and checks out: ralph_ray.localray); stop it with
    # `python -m ralph_ray.localray stop`.
    keep_ray: bool = False


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
    trial: TrialConfig = field(default_factory=TrialConfig)
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)
    agent: AgentConfig = field(default_factory=AgentConfig)
    resources: ResourcesConfig = field(default_factory=ResourcesConfig)
    paths: PathsConfig = field(default_factory=PathsConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    resume: Optional[str] = None  # a run id to continue (python -m ralph_ray resume=<run_id>)

    def trainer_dir(self) -> Path:
        """The seed trainer's folder, resolved against the project root."""
        path = Path(self.task.trainer)
        return path if path.is_absolute() else PROJECT_ROOT / path

    def seed_entry(self) -> Path:
        """The seed trainer's train.py (the file the engine sets knobs in and agents edit)."""
        return self.trainer_dir() / "train.py"

    def task_folder(self) -> Path:
        """The task's folder: the seed trainer's folder, which also holds the frozen prepare.py and task.yaml."""
        return self.trainer_dir()

    def target_score(self) -> float | None:
        """The target as the engine compares scores (higher is better): the metric's target times its sign."""
        target = self.target.selection_score
        if target is None:
            return None
        return self.metric_sign() * target

    def metric_sign(self) -> float:
        """-1 for a min metric, else 1: a stored (oriented) score times it is the metric's own value, as shown."""
        return -1.0 if self.task.direction == "min" else 1.0


def load_config(overrides: list[str] | None = None) -> Config:
    """Compose conf/ with Hydra overrides into a validated `Config`; raises ConfigError on any problem."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import ConfigKeyError

    overrides = list(overrides or [])
    _check_override_syntax(overrides)
    _refuse_search_group_override(overrides)
    chosen = _task_path(overrides)
    composed = [o for o in overrides if not (chosen is not None and o.startswith("task="))]
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            raw = compose(config_name="config", overrides=[_forced(o) for o in composed], return_hydra_config=True)
    except (HydraException, ConfigKeyError) as err:
        raise _override_error(err) from None
    OmegaConf.set_struct(raw, False)
    search_group = _search_group(str(raw.hydra.runtime.choices.get("search") or "")) or None  # what resume compares
    raw.pop("hydra")
    if chosen is not None:
        raw.task.name, raw.task.trainer = chosen[0], str(chosen[1])
    if not any(o.lstrip("+").startswith("experiment=") for o in composed):
        raw.experiment = raw.task.name  # task=diabetes without an experiment file is the diabetes experiment
    raw = _with_task_yaml(raw, composed)
    raw.search.group = search_group
    return to_config(raw, composed)


def _refuse_search_group_override(overrides: list[str]) -> None:
    """Exit 2 (ConfigError) for a first run's `search.group=...`: load_config records the group `search=` composed
    there (a resume compares its `search=` with it), so the override was dropped without a word."""
    for override in overrides:
        key, _, value = override.partition("=")
        if key.lstrip("+~") == "search.group":
            group = _search_group(value) or "<group>"
            raise ConfigError(
                "search.group",
                f"search.group is recorded, not set: it is the search group a first run composes (`{override}`)",
                f"choose the search group with search=<group> (search={group}), and drop {key}",
            )


def _search_group(option: str) -> str:
    """A search group's option as one spelling: `digits.yaml` (which Hydra takes too) is `digits`."""
    return option.strip().removesuffix(".yaml")


def _check_override_syntax(overrides: list[str]) -> None:
    """Exit 2 (ConfigError), before Hydra composes, for an override the shell split, one Hydra's grammar cannot read,
    or an UPPER_CASE knob given as a config key: each with the override to write instead."""
    _refuse_split_values(overrides)
    _refuse_unreadable(overrides)
    _refuse_knob_overrides(overrides)


def _refuse_split_values(overrides: list[str]) -> None:
    """Exit 2 (ConfigError) where the shell split an unquoted value at its spaces (`+search.space.X={type: choice,
    values: [a, b]}` arrives as five words, and Hydra said only "no viable alternative at input '{type:'"), with the
    override whole, quoted, as the fix."""
    for at, override in enumerate(overrides):
        key, eq, value = override.partition("=")
        if not eq or _open_brackets(value) <= 0:
            continue
        pieces = [value]
        for word in overrides[at + 1 :]:
            pieces.append(word)
            if _open_brackets(" ".join(pieces)) <= 0:
                break
        whole = re.sub(r"([:,])(?=\S)", r"\1 ", " ".join(pieces))  # `{type:choice,...}` -> `{type: choice, ...}`
        raise ConfigError(
            key.lstrip("+~"),
            f"`{override}` is cut short: unquoted, the shell split its value at the spaces",
            f"quote it whole, with a space after each colon: {shlex.quote(f'{key}={whole}')}",
        )


def _refuse_unreadable(overrides: list[str]) -> None:
    """Exit 2 (ConfigError) naming the override Hydra's grammar cannot read, and how to write it: Hydra named none
    (`no viable alternative at input '{type:choice values:['`, blamed on a key `https://hydra.cc/...`)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    parser = OverridesParser.create()
    for override in overrides:
        if override.startswith("task="):
            continue  # a folder's path (`task=~/my task`), which _task_path reads and Hydra never sees (review)
        try:
            parser.parse_override(override)
        except HydraException as err:
            key = override.partition("=")[0].lstrip("+~")
            raise ConfigError(
                key,
                f"Hydra cannot read `{override}`: {_first_line(err)}",
                "quote the override whole and write a mapping with a space after each colon and comma "
                "('+search.space.X={type: choice, values: [a, b]}'); quote a string value holding brackets, "
                "parentheses, spaces, `=`, `#` or `~` (key='a value', agent.base_url='https://h/v1?api-version=1')",
            ) from None


def _open_brackets(text: str) -> int:
    """How many `{` and `[` of a value are left open (outside quoted strings: `task.name='a[b'` is whole)."""
    bare = re.sub(r"'[^']*'|\"[^\"]*\"", "", text)
    return bare.count("{") + bare.count("[") - bare.count("}") - bare.count("]")


def _refuse_knob_overrides(overrides: list[str]) -> None:
    """Exit 2 (ConfigError) for an UPPER_CASE knob given as a bare override (`COMPILE=true`): knobs are train.py's
    constants, not config keys, and Hydra said only "Could not override 'COMPILE'" with "did you mean `run_id`?"."""
    knobs = [o for o in overrides if is_knob_name(o.lstrip("+~").partition("=")[0]) and "=" in o]
    if not knobs:
        return
    literals, searched = [], []
    for override in knobs:
        name, _, value = override.lstrip("+~").partition("=")
        literals.append(f"`{name} = {_python_literal(override, value)}`")
        values = value if value.startswith("[") else f"[{value}]"
        searched.append(f"search.space.{name}={{type: choice, values: {values}}}")
    names = [o.lstrip("+~").partition("=")[0] for o in knobs]
    kept = [o for o in overrides if o not in knobs]
    command = " ".join(["python -m ralph_ray", *(shlex.quote(o) for o in [*kept, *searched])])
    raise ConfigError(
        names[0],
        f"{', '.join(names)} {'is a knob' if len(names) == 1 else 'are knobs'}, an UPPER_CASE constant of train.py, "
        "not a config key the command line sets",
        f"set it in train.py ({', '.join(literals)}), or search it through search.space (a choice of one value "
        f"trains that value in every trial): {command}",
    )


def _python_literal(override: str, value: str) -> str:
    """An override's value as a Python literal (`true` -> `True`, `1e-3` -> `0.001`), as Hydra reads it."""
    parsed = _hydra_value(override)
    return repr(parsed[1]) if parsed is not None else value


def _hydra_value(override: str) -> tuple[str, Any] | None:
    """(key, value) of `key=value` as Hydra reads it (`{type:choice}` is a dict there, where YAML reads
    `type:choice` as one key); None where Hydra does not read it as one plain value."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        parsed = OverridesParser.create().parse_override(override)
        value = parsed.value()
    except (HydraException, ValueError):
        return None
    if parsed.is_delete() or not isinstance(value, (str, int, float, bool, list, dict, type(None))):
        return None  # a deletion, a sweep or a function (`~a`, `a,b`, `range(3)`): not one value
    return parsed.key_or_group, value


def _as_keys(override: str) -> Any:
    """`key=value` as a config to merge (`a.b=v` -> {a: {b: v}}), the value as Hydra composed it: YAML would read
    `+search.space.X={type:choice,values:[a,b]}` as a key `type:choice` ("not in 'KnobSpace'")."""
    parsed = _hydra_value(override)
    if parsed is None:
        return OmegaConf.from_dotlist([override.lstrip("+")])
    keys = OmegaConf.create()
    OmegaConf.update(keys, parsed[0], parsed[1], force_add=True)
    return keys


def _forced(override: str) -> str:
    """`key=value` as `++key=value` where the key is a field of the schema that the conf/ yaml may not list (e.g.
    `task.mirror_invariant`, set by a task's own task.yaml) or a knob's space: Hydra refuses to override a key its
    composed yaml lacks, though the schema or task.yaml has it. Any other override goes to Hydra as written (a typo
    still gets its error)."""
    key, eq, _ = override.partition("=")
    if not eq or "." not in key or key.startswith(("+", "~")):
        return override
    # A knob's space that only the task's task.yaml declares (`search.space.PATIENCE.high=20`): composed after
    # Hydra, so Hydra alone refused it ("Could not override"); a misspelt knob still fails validation, by name.
    if not _schema_leaf(key) and not key.startswith("search.space."):
        return override
    return "++" + override


def _schema_leaf(dotted: str) -> bool:
    """Whether a dotted key names a leaf field of `Config` (not a group, not an entry of a dict such as the space)."""
    kind: Any = Config
    for part in dotted.split("."):
        hints = typing.get_type_hints(kind) if dataclasses.is_dataclass(kind) else {}
        if part not in hints:
            return False
        kind = hints[part]
    return not dataclasses.is_dataclass(kind)


def _task_path(overrides: list[str]) -> tuple[str, Path] | None:
    """The name and folder of `task=<value with a path separator>` (e.g. task=./my_task, resolved) or of an installed
    plug-in (task=<its entry point's name>); None for a shipped task=<name>, which conf/task/ composes.

    A bare name is a shipped task, else an installed plug-in, else a folder here (task=my_task); ./my_task is always
    the folder.
    """
    values = [o.split("=", 1)[1] for o in overrides if o.startswith("task=")]
    if not values:
        return None
    value = values[-1]
    is_path = any(sep in value for sep in ("/", os.sep)) or value.startswith((".", "~"))
    if not is_path:
        try:
            known = find_task(value)
        except TaskError as err:
            raise ConfigError("task", err.problem, err.fix) from None
        if known is not None and value not in TASKS:
            return value, known.folder
        if (CONF_DIR / "task" / f"{value}.yaml").exists() or not Path(value).is_dir():
            return None
    folder = Path(value).expanduser().resolve()
    return folder.name, folder


def _with_task_yaml(raw: Any, overrides: list[str]) -> Any:
    """The composed config with the task folder's task.yaml merged in, then the user's key=value overrides again.

    So a task brings its own search space and defaults (task.yaml wins over conf/ groups), an experiment file's own
    keys win over its task's (it is the more specific of the two), and an override on the command line wins over both.
    """
    task_yaml = _task_yaml(raw.task.trainer)
    if not task_yaml.is_file():
        return raw  # a folder without task.yaml is reported by validation, with the fix
    try:
        own = OmegaConf.load(task_yaml)
        if OmegaConf.select(own, "search.space") is not None:
            raw.search.space = {}  # the task's knobs replace the default group's, not join them
        merged = OmegaConf.merge(raw, own)
        experiment = _experiment_keys(overrides)
        if experiment is not None:
            merged = OmegaConf.merge(merged, experiment)
        # In the order given, as Hydra applies them: `~search.space +search.space={...}` replaces the task's space,
        # and `+search.space.EPOCHS=... ~search.space.EPOCHS` leaves none (the deletions once ran first, so a later
        # one was undone by the addition it meant to remove).
        for o in overrides:
            if o.startswith("~"):
                _delete(merged, o[1:].split("=", 1)[0])
            elif "=" in o and not (CONF_DIR / o.lstrip("+").split("=", 1)[0]).is_dir():
                merged = OmegaConf.merge(merged, _as_keys(o))
        return merged
    except OmegaConfBaseException as err:
        raise ConfigError(
            "task",
            f"{task_yaml}: {_first_line(err)}",
            "task.yaml holds config keys at the top level (search:, task:, scheduler:, ...), as conf/ does",
        ) from None


def _delete(cfg: Any, dotted: str) -> None:
    """Remove a dotted key from a composed config (a `~key` override), if it is there."""
    parent_key, _, leaf = dotted.rpartition(".")
    parent = OmegaConf.select(cfg, parent_key) if parent_key else cfg
    if parent is not None and leaf in parent:
        del parent[leaf]


def _experiment_keys(overrides: list[str]) -> Any:
    """The keys of the `+experiment=NAME` file (`# @package _global_`, its defaults list left out: Hydra has composed
    those), found as Hydra finds it: conf/ first, then each `hydra.searchpath` folder (--config-dir); None if none."""
    names = [o.split("=", 1)[1] for o in overrides if o.lstrip("+").startswith("experiment=")]
    if not names:
        return None
    folders = [CONF_DIR]
    for o in overrides:
        if o.startswith("hydra.searchpath="):
            folders += [Path(p.strip().removeprefix("file://")) for p in o.split("=", 1)[1].strip("[]").split(",")]
    for folder in folders:
        path = folder / "experiment" / f"{names[-1]}.yaml"
        if path.is_file() and "@package _global_" in path.read_text():
            keys = OmegaConf.load(path)
            keys.pop("defaults", None)
            return keys
    return None


def resume_config(run_dir: Path, overrides: list[str] | None = None) -> Config:
    """A stored run's config (its config.yaml) with `key=value` overrides on top, e.g. a raised max_cycles."""
    stored = run_dir / "config.yaml"
    if not stored.exists():
        raise ConfigError(
            "resume", f"no {stored}", "check the run id and paths.runs (runs live under <paths.runs>/<run_id>/)"
        )
    raw = OmegaConf.load(stored)
    raw = OmegaConf.create(_migrate_final_additions(OmegaConf.to_container(raw)))  # type: ignore[arg-type]
    stored_raw = raw.copy()
    _check_override_syntax(list(overrides or []))
    plain = [o.lstrip("+") for o in overrides or [] if not o.startswith(("resume=", "+experiment", "experiment="))]
    # A config group's choice (sandbox=none, agent=none) replaces that section with the group's file, as on a first
    # run; from_dotlist would set the section to the string ("str is not a subclass of SandboxConfig").
    groups = [o for o in plain if "=" in o and (CONF_DIR / o.split("=", 1)[0]).is_dir()]
    # task= / search= naming the run's own (the first run's command again) change nothing; any other is refused
    own = [o for o in groups if o.startswith(("task=", "search="))]
    for choice in own:
        _refuse_another_task_or_search(stored_raw, choice, list(overrides or []))
    try:
        for choice in groups:
            if choice not in own:
                raw = OmegaConf.merge(raw, _group_choice(choice))
        plain = [o for o in plain if o not in groups]
        for override in plain:
            if override.startswith("~"):  # `~search.space.WIDTH`: a deletion, as on a first run (not a dotlist key)
                _delete(raw, override[1:].split("=", 1)[0])
            else:
                raw = OmegaConf.merge(raw, _as_keys(override))
    except OmegaConfBaseException as err:
        raise ConfigError(
            "override", _first_line(err), "resume takes plain key=value overrides (e.g. safeguards.max_cycles=8)"
        ) from None
    _keep_the_stored_trainer(stored_raw, raw)
    _refuse_frozen_changes(stored_raw, raw)
    _refuse_knob_changes(stored_raw, raw)
    cfg = to_config(raw, plain)
    cfg.resume = run_dir.name
    return cfg


# What a resume may not change: the task (its data, splits and trainer) and what its trials are ranked by. A run's
# trials must all be scored on the same frozen splits; `task.split_seed=1` on a resume rewrote data/*.npy and scored
# the later cycles on another split than the first. The search space keeps its knobs (_refuse_knob_changes: the KB's
# trials, parents and replicates are knobs of that space); their bounds stay open to a resume (README).
# search.group too: it is what a resume's `search=` is compared with (None in a run recorded before it stays None).
FROZEN_ON_RESUME = ("task", "search.metric", "search.mode", "search.group")


def _refuse_another_task_or_search(stored: Any, choice: str, overrides: list[str]) -> None:
    """Exit 2 (ConfigError) for a resume's `task=` / `search=` other than the run's own: `task=` naming another task
    folder; `search=` naming another search group than the one the run recorded (search.group), or, for a run
    recorded without it, one whose metric or mode, composed as a first run composes them with the resume's other
    arguments, differ from the run's. The run's own is taken and changes nothing (README); the knobs are
    _refuse_knob_changes'."""
    group, value = choice.split("=", 1)
    if group == "search":
        _refuse_another_search(stored, value, overrides)
        return
    asked, kept = _own_choice(stored, group, value, overrides), _own_choice(stored, group, None, overrides)
    if asked != kept:
        raise ConfigError(
            "resume",
            f"a resumed run keeps its task and search space: {choice} is {asked}, this run's is {kept}",
            f"resume without {group}= (the run's own is kept), or start a new campaign with {choice} (no resume=)",
        )


def _refuse_another_search(stored: Any, value: str, overrides: list[str]) -> None:
    """Exit 2 (ConfigError) for a resume's `search=value` other than the run's own search group (see the caller).

    The recorded group decides where there is one: a first run `search.metric=val_loss search.mode=min` is the
    digits group ranked by val_loss, so `search=digits` is its own (it was refused as "ranked by val_acc")."""
    search = OmegaConf.select(stored, "search")
    ranking = f"ranked by {search.get('metric')} ({search.get('mode')})"
    own, asked = search.get("group"), _search_group(value)
    if own is not None:
        if asked == own:
            return
        problem = f"this resume names search={asked}, and this run's search group is {own} ({ranking})"
    else:
        composed = _own_choice(stored, "search", value, overrides)
        if composed == ranking:
            return
        problem = f"search={asked} is {composed}, and this run is {ranking} (its config.yaml)"
    raise ConfigError(
        "resume",
        f"a resumed run keeps its search space and ranking: {problem}",
        f"drop search= on a resume (the run's own is kept), or start a new campaign with search={asked} (no resume=)",
    )


def _own_choice(stored: Any, group: str, value: str | None, overrides: list[str]) -> str:
    """What decides whether `task=value` / `search=value` is the stored run's (a task's value None: the stored run's
    own): the task folder; for a run recorded without search.group, what a search group sets that a resume freezes
    besides the knobs, its metric and mode.

    Not the knobs: a first run's `+`/`~search.space` overrides and experiment change them after the group (a first
    run `search=digits ~search.space.WIDTH` refused its own resume given the same arguments, review); the final
    config's knobs are checked against the run's (_refuse_knob_changes)."""
    if group == "task":
        if value is None:
            folder = Path(str(OmegaConf.select(stored, "task.trainer"))).expanduser()
        else:
            chosen = _task_path([f"task={value}"])
            folder = chosen[1] if chosen else Path(str(_group_choice(f"task={value}").task.trainer))
        return f"the task in {(folder if folder.is_absolute() else PROJECT_ROOT / folder).resolve()}"
    group_search = _group_choice(f"search={value}").search
    ranked = {key: group_search.get(key) for key in ("metric", "mode")}
    # as a first run composes them (_with_task_yaml): the task's task.yaml, the experiment's keys, the command line
    task_yaml = _task_yaml(OmegaConf.select(stored, "task.trainer"))
    layers = [OmegaConf.load(task_yaml) if task_yaml.is_file() else None, _experiment_keys(overrides)]
    layers += [_as_keys(o) for o in overrides if o.lstrip("+").split("=", 1)[0] in ("search.metric", "search.mode")]
    for layer in (layer for layer in layers if layer is not None):
        ranked = {key: OmegaConf.select(layer, f"search.{key}", default=was) for key, was in ranked.items()}
    return f"ranked by {ranked['metric']} ({ranked['mode']})"


def _refuse_knob_changes(stored: Any, asked: Any) -> None:
    """Exit 2 (ConfigError) where a resume's overrides add or remove a knob of the search space (`+search.space.X`,
    `~search.space.X`): the run's trials and parents are points of that space. A knob's bounds stay open."""
    before = list(OmegaConf.select(stored, "search.space") or {})
    after = list(OmegaConf.select(asked, "search.space") or {})
    added, removed = [k for k in after if k not in before], [k for k in before if k not in after]
    if not added and not removed:
        return
    change = " and ".join(
        [*([f"adds {', '.join(added)}"] if added else []), *([f"removes {', '.join(removed)}"] if removed else [])]
    )
    raise ConfigError(
        "search.space",
        f"a resume keeps the search space's knobs ({', '.join(before) or 'none'}), and this resume {change}",
        f"it may change a knob's bounds: {_bounds_example(stored)}; to add or remove a knob start a new campaign "
        "(no resume=), or resume without it",
    )


def _bounds_example(stored: Any) -> str:
    """An override that changes a bound of one of the stored run's knobs (`search.space.LR.high=0.5`)."""
    space = OmegaConf.select(stored, "search.space") or {}
    for name, knob in space.items():
        if knob.get("high") is not None:
            return f"search.space.{name}.high=... (now {knob.high})"
    first = next(iter(space), None)
    return f"search.space.{first}.values=[...]" if first else "search.space.KNOB.high=..."


def _keep_the_stored_trainer(stored: Any, asked: Any) -> None:
    """A resume's `task.trainer` naming the stored folder another way (./mytask, a trailing /, a symlink) is the
    stored value: the first run stored it resolved, and only a different folder is a change (review)."""
    before, after = OmegaConf.select(stored, "task.trainer"), OmegaConf.select(asked, "task.trainer")
    if not isinstance(before, str) or not isinstance(after, str) or before == after:
        return
    kept = Path(before).expanduser()
    kept = (kept if kept.is_absolute() else PROJECT_ROOT / kept).resolve()
    # a relative folder: from here, as task=./path resolves it, or from the project root, as trainer_dir reads it
    given = Path(after).expanduser()
    if kept in {given.resolve(), (PROJECT_ROOT / given).resolve()}:
        asked.task.trainer = before


def _refuse_frozen_changes(stored: Any, asked: Any) -> None:
    """Exit 2 (ConfigError) naming each frozen key (FROZEN_ON_RESUME) whose value a resume's overrides change."""
    changed = []
    for key in FROZEN_ON_RESUME:
        before, after = _leaves(OmegaConf.select(stored, key), key), _leaves(OmegaConf.select(asked, key), key)
        for leaf in sorted(before.keys() | after.keys()):
            if before.get(leaf) != after.get(leaf):
                changed.append(f"{leaf} (stored {before.get(leaf)!r}, asked {after.get(leaf)!r})")
    if changed:
        raise ConfigError(
            "resume",
            f"a resumed run keeps its task and metric, and this resume changes {'; '.join(changed)}",
            "start a new campaign with the new value (no resume=), or resume without it",
        )


def _leaves(node: Any, prefix: str) -> dict[str, Any]:
    """A config section's values by dotted key (a plain value: itself under `prefix`)."""
    value = OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else node
    if not isinstance(value, dict):
        return {prefix: value}
    return {k: v for name, inner in value.items() for k, v in _leaves(inner, f"{prefix}.{name}").items()}


def _group_choice(choice: str) -> Any:
    """`group=option` composed as a first run composes it (its file's defaults included): {group: {...}}."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException

    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            section = compose(overrides=[f"+{choice}"])
    except HydraException:
        group, option = choice.split("=", 1)
        options = ", ".join(sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml")))
        raise ConfigError(group, f"no option {option!r} in conf/{group}/", f"one of {options}") from None
    OmegaConf.set_struct(section, False)
    return section


def to_config(raw: Any, overrides: list[str] | None = None) -> Config:
    """Merge a composed config onto the schema (types, unknown keys) and check its values; `overrides`: the command
    line's, to say where a refused value was set."""
    OmegaConf.set_struct(raw, False)
    raw_dict = OmegaConf.to_container(raw, resolve=True)
    raw_dict.pop("hydra", None)  # type: ignore[union-attr]
    for name in raw_dict.get("safeguards") or {}:  # type: ignore[union-attr]
        if f"safeguards.{name}" in LEGACY_FINAL_KEYS:  # +safeguards.final_deepen=true (resume migrates a saved one)
            key = f"safeguards.{name}"
            raise ConfigError(key, "is no setting any more", _legacy_fix(key))
    try:
        merged = OmegaConf.merge(OmegaConf.structured(Config), raw_dict)
        cfg: Config = OmegaConf.to_object(merged)  # type: ignore[assignment]
    except OmegaConfBaseException as err:
        key = str(getattr(err, "full_key", None) or "?")
        where = _set_on_command_line(overrides or [], key) or _set_in_task_yaml(raw_dict, key)
        raise ConfigError(key, _first_line(err) + where, _fix_for(key, err)) from None
    if cfg.population.mode == PopulationMode.auto.value:
        cfg.population.mode = resolve_mode(cfg).value
    pop = cfg.population
    pop.shape_by_budget = pop.shape_by_budget or pop.parents is None or pop.children_per_parent is None
    pop.parents, pop.children_per_parent = resolve_shape(cfg)
    validate(cfg)
    return cfg


def _migrate_final_additions(stored: dict[str, Any]) -> dict[str, Any]:
    """A run saved before safeguards.final_additions (its config.yaml, on resume): its three settings as that list."""
    guards = stored.get("safeguards") or {}
    if "final_additions" in guards or not any(f"safeguards.{k}" in LEGACY_FINAL_KEYS for k in guards):
        return stored
    schedule = guards.pop("final_schedule", None)
    augment, deepen = guards.pop("final_augment", False), guards.pop("final_deepen", False)
    old = [*([schedule] if schedule else []), *(["shift", "flip"] if augment else []), *(["deepen"] if deepen else [])]
    guards["final_additions"] = old
    return stored


def resolve_mode(cfg: Config) -> PopulationMode:
    """What `population.mode=auto` runs: async (it measures better), or barrier cycles where only they work."""
    # PBT/PB2 train a cycle's trials as one population; data-parallel trials have their own trainable.
    if cfg.scheduler.name.population_based or cfg.resources.data_parallel:
        return PopulationMode.generations
    return PopulationMode.asynchronous


POPULATION_SHAPE = (2, 3)  # parents x children when the budget doesn't call for the serial loop
SERIAL_SHAPE = (1, 1)


def short_budget(cfg: Config) -> bool:
    """Whether the campaign's time budget is one a shape left null runs serially (population.serial_up_to_s)."""
    budget = cfg.safeguards.campaign_time_s
    return budget is not None and 0 < budget <= cfg.population.serial_up_to_s


def resolve_shape(cfg: Config) -> tuple[int, int]:
    """(parents, children_per_parent): as given, or where left null by the campaign's time budget (see the field)."""
    pop = cfg.population
    default = SERIAL_SHAPE if short_budget(cfg) else POPULATION_SHAPE
    return (
        default[0] if pop.parents is None else pop.parents,
        default[1] if pop.children_per_parent is None else pop.children_per_parent,
    )


def validate(cfg: Config) -> None:
    """Check values a type cannot express: signs, ranges, known names, required data roots."""
    task = _check_task(cfg)
    _check_task_paths(cfg)
    scores_model = cfg.task.scored_by == ScoredBy.model.value
    if problem := harness_problem(_seed_code(cfg), cfg.seed_entry(), scores_model):  # before its knobs' own check
        raise ConfigError("task.trainer", *problem)
    for key, value in (
        ("task.selection_fraction", cfg.task.selection_fraction),
        ("task.test_fraction", cfg.task.test_fraction),
    ):
        if not 0.0 < value < 0.5:
            raise ConfigError(key, f"must be in (0, 0.5), got {value}", f"set {key}=0.2")
    _positive("search.num_samples", cfg.search.num_samples)
    _positive("search.max_concurrent", cfg.search.max_concurrent)
    if cfg.search.mode not in ("max", "min"):
        raise ConfigError("search.mode", f"must be max or min, got {cfg.search.mode!r}", "set search.mode=max")
    for name, space in cfg.search.space.items():
        try:
            _check_space(name, space)
        except ConfigError:
            if is_knob_name(
                name
            ):  # a knob the trainer lacks is the likelier mistake: `LRR.low=...` for LR (user trial)
                _check_space_in_trainer(cfg)
            raise
    _check_space_in_trainer(cfg)
    if problem := unread_problem(_seed_code(cfg), list(cfg.search.space), cfg.seed_entry()):
        raise ConfigError("search.space", *problem)
    _check_metric_in_trainer(cfg)
    if not cfg.search.space and cfg.agent.backend is AgentBackend.none:
        # A user trial: 111 trials in 60 s, each the seed's same run (same knobs, same seed).
        raise ConfigError(
            "search.space",
            "is empty and agent=none: knob search has no knob to sample, so every trial is the seed's same run",
            "name the knobs to search in the task's task.yaml (search: {space: {LR: {type: loguniform, low: 0.0001, "
            "high: 0.1}}}), or let an agent change the code (agent=heuristic)",
        )
    if cfg.search.relative_span <= 1:
        raise ConfigError(
            "search.relative_span", f"must be > 1, got {cfg.search.relative_span}", "set search.relative_span=2"
        )
    _positive("scheduler.max_t", cfg.scheduler.max_t)
    _positive("scheduler.grace_period", cfg.scheduler.grace_period)
    # ASHA's first rung; the other schedulers never read it (a task.yaml's grace must not refuse a short fifo run).
    if cfg.scheduler.name is SchedulerKind.asha and cfg.scheduler.grace_period > cfg.scheduler.max_t:
        raise ConfigError(
            "scheduler.grace_period",
            f"{cfg.scheduler.grace_period} exceeds scheduler.max_t={cfg.scheduler.max_t}",
            f"set scheduler.grace_period={cfg.scheduler.max_t} (or less), or raise scheduler.max_t",
        )
    if cfg.scheduler.margin != "auto" and not _non_negative_number(cfg.scheduler.margin):
        raise ConfigError(
            "scheduler.margin",
            f"must be auto or a number >= 0, got {cfg.scheduler.margin!r}",
            "set scheduler.margin=auto (the metric's noise) or scheduler.margin=0 (plain ASHA)",
        )
    if cfg.scheduler.margin_z < 0:
        raise ConfigError(
            "scheduler.margin_z", f"must be >= 0, got {cfg.scheduler.margin_z}", "set scheduler.margin_z=2"
        )
    if cfg.scheduler.reduction_factor <= 1:
        raise ConfigError(
            "scheduler.reduction_factor",
            f"must be > 1, got {cfg.scheduler.reduction_factor}",
            "set scheduler.reduction_factor=2",
        )
    if cfg.scheduler.name.population_based:
        _check_pbt(cfg)
    _positive("safeguards.trial_timeout_s", cfg.safeguards.trial_timeout_s)
    _positive("safeguards.max_cycles", cfg.safeguards.max_cycles)
    for key in ("cycle_time_s", "campaign_time_s", "tokens_per_cycle", "tokens_per_campaign", "cost_per_campaign"):
        value = getattr(cfg.safeguards, key)
        if value is not None:
            _positive(f"safeguards.{key}", value)
    _positive("safeguards.plateau_cycles", cfg.safeguards.plateau_cycles)
    _positive("safeguards.gate_fail_cycles", cfg.safeguards.gate_fail_cycles)
    _positive("safeguards.smoke_timeout_s", cfg.safeguards.smoke_timeout_s)
    if cfg.safeguards.max_failures < 0:
        raise ConfigError(
            "safeguards.max_failures",
            f"must be >= 0, got {cfg.safeguards.max_failures}",
            "set safeguards.max_failures=2 (0: never retry)",
        )
    if cfg.safeguards.checkpoint_every_s < 0:
        raise ConfigError(
            "safeguards.checkpoint_every_s",
            f"must be >= 0, got {cfg.safeguards.checkpoint_every_s}",
            "set safeguards.checkpoint_every_s=0 (every epoch)",
        )
    if not 0.0 <= cfg.safeguards.final_share < 1.0:
        raise ConfigError(
            "safeguards.final_share",
            f"must be in [0, 1), got {cfg.safeguards.final_share}",
            "set safeguards.final_share=0.2 (a fifth of the campaign for the final training) or 0 (off)",
        )
    if cfg.safeguards.final_share > 0 and (cfg.resources.data_parallel or cfg.scheduler.name.population_based):
        what = "data-parallel trials" if cfg.resources.data_parallel else f"scheduler={cfg.scheduler.name.value}"
        raise ConfigError(
            "safeguards.final_share",
            f"is {cfg.safeguards.final_share}, but the final training runs one plain trial: not with {what} "
            "(a group of workers, a population's checkpoints and schedules)",
            "set safeguards.final_share=0",
        )
    unknown = [name for name in cfg.safeguards.final_additions if name not in FINAL_ADDITIONS]
    if unknown:
        raise ConfigError(
            "safeguards.final_additions",
            f"names {', '.join(map(repr, unknown))}: each must be one of {', '.join(FINAL_ADDITIONS)}",
            "set safeguards.final_additions=[cosine,shift,flip] (or [] to train the pick's code as searched)",
        )
    schedules = [name for name in cfg.safeguards.final_additions if name in FINAL_SCHEDULES]
    if len(schedules) > 1 or len(set(cfg.safeguards.final_additions)) < len(cfg.safeguards.final_additions):
        raise ConfigError(
            "safeguards.final_additions",
            f"lists {', '.join(cfg.safeguards.final_additions)}: each at most once, and one schedule at most",
            "name each once, and one of cosine and one_cycle at most",
        )
    if not 1 <= cfg.safeguards.final_candidates <= max(1, cfg.search.max_concurrent):
        raise ConfigError(
            "safeguards.final_candidates",
            f"must be from 1 to search.max_concurrent ({cfg.search.max_concurrent}): the candidates train side by "
            f"side, one slot's share each; got {cfg.safeguards.final_candidates}",
            f"set safeguards.final_candidates={max(1, min(2, cfg.search.max_concurrent))} (1: the pick alone)",
        )
    if cfg.safeguards.final_share > 0 and cfg.safeguards.campaign_time_s is None:
        raise ConfigError(
            "safeguards.final_share",
            f"is {cfg.safeguards.final_share}, a share of a time budget, but safeguards.campaign_time_s is not set",
            "set safeguards.campaign_time_s=1800 (or safeguards.final_share=0)",
        )
    if cfg.safeguards.min_delta < 0:
        raise ConfigError(
            "safeguards.min_delta", f"must be >= 0, got {cfg.safeguards.min_delta}", "set safeguards.min_delta=0.002"
        )
    if cfg.safeguards.replicates == 1 or cfg.safeguards.replicates < 0:
        raise ConfigError(
            "safeguards.replicates",
            f"must be 0 (off) or at least 2 (a t-test needs a spread), got {cfg.safeguards.replicates}",
            "set safeguards.replicates=3, or 0 to judge children on one trial",
        )
    if not 0.5 <= cfg.safeguards.confidence < 1.0:
        raise ConfigError(
            "safeguards.confidence",
            f"must be in [0.5, 1), got {cfg.safeguards.confidence}",
            "set safeguards.confidence=0.9",
        )
    if (
        cfg.target.selection_score is not None
        and task.metric.name in FRACTION_METRICS
        and not 0.0 < cfg.target.selection_score <= 1.0
    ):
        raise ConfigError(
            "target.selection_score",
            f"{task.metric.name} is in (0, 1], got {cfg.target.selection_score}",
            "set target.selection_score=0.99 or null",
        )
    _check_target_sign(cfg, task)
    _positive("population.parents", cfg.population.parents)
    _positive("population.children_per_parent", cfg.population.children_per_parent)
    _positive("population.trials_per_child", cfg.population.trials_per_child)
    if cfg.population.serial_up_to_s < 0:
        raise ConfigError(
            "population.serial_up_to_s",
            f"must be >= 0, got {cfg.population.serial_up_to_s}",
            "set population.serial_up_to_s=300 (or 0: never run the serial shape by budget)",
        )
    if cfg.population.mode not in {m.value for m in PopulationMode}:
        raise ConfigError(
            "population.mode",
            f"must be auto, async or generations, got {cfg.population.mode!r}",
            "set population.mode=async (one Tune run), generations (barrier cycles) or auto (the default)",
        )
    if cfg.trial.budget_s is not None:
        _positive("trial.budget_s", cfg.trial.budget_s)
    if cfg.trial.grace_s < 0:
        raise ConfigError("trial.grace_s", f"must be >= 0, got {cfg.trial.grace_s}", "set trial.grace_s=10")
    if not 0 <= cfg.population.breeder_nice <= 19:
        raise ConfigError(
            "population.breeder_nice",
            f"must be a niceness step in 0..19, got {cfg.population.breeder_nice}",
            "set population.breeder_nice=10 (0: breed at the trials' CPU priority)",
        )
    if not 0.0 <= cfg.population.explore <= 1.0:
        raise ConfigError(
            "population.explore", f"must be in [0, 1], got {cfg.population.explore}", "set population.explore=0.2"
        )
    if cfg.agent.max_retries < 0:
        raise ConfigError("agent.max_retries", f"must be >= 0, got {cfg.agent.max_retries}", "set agent.max_retries=2")
    _positive("agent.concurrency", cfg.agent.concurrency)
    if cfg.agent.exploration < 0:
        raise ConfigError(
            "agent.exploration",
            f"must be >= 0, got {cfg.agent.exploration}",
            f"set agent.exploration={AgentConfig.exploration} (the default)",
        )
    _check_llm_agent(cfg)
    _positive("resources.cpu", cfg.resources.cpu)
    _check_workers(cfg)
    if cfg.resources.gpu < 0:
        raise ConfigError("resources.gpu", f"must be >= 0, got {cfg.resources.gpu}", "set resources.gpu=0 (CPU) or 1")
    if cfg.resources.ray_num_cpus is not None:
        _positive("resources.ray_num_cpus", cfg.resources.ray_num_cpus)
    _check_cluster(cfg)
    for key in ("memory_mb", "processes", "file_size_mb", "output_mb"):
        _positive(f"sandbox.{key}", getattr(cfg.sandbox, key))
    if task.data_root is not None and not cfg.data.root:
        raise ConfigError(
            "data.root",
            f"{cfg.task.name} needs a data root",
            f"pass data.root=/path/to/{cfg.task.name} ({task.data_root})",
        )


# Metrics whose values are fractions in [0, 1] (a target outside (0, 1] is a mistake).
FRACTION_METRICS = ("accuracy", "macro_f1")
# Words of a min metric's name that say it is never negative (an MSE, an error, bits per byte, a perplexity):
# `recon_mse`, lm's `bits_per_byte`.
# Not "loss" (a Gaussian NLL or an ELBO loss may be negative), and no name with a word that makes a difference or a
# log of one (log_mse, mse_delta: review), whose values may be negative.
NEVER_NEGATIVE = frozenset(
    {"mse", "rmse", "mae", "mape", "bpb", "bpc", "bits_per_byte", "perplexity", "ppl", "wer", "cer"}
)
MAY_BE_NEGATIVE = frozenset({"log", "nll", "delta", "diff", "gain", "elbo", "neg", "change", "improvement"})


def _check_target_sign(cfg: Config, task: TaskFolder) -> None:
    """A target is in the metric's own units. A negative one for a min metric that is never negative can never be
    met: it is most likely the negated score the KB stores, copied (a user trial wrote -0.03 for an MSE of 0.03).
    A metric of another name may be negative: its target is taken as given."""
    target, name = cfg.target.selection_score, task.metric.name
    if target is None or target >= 0 or task.metric.direction.value != "min":
        return
    words = {name.lower(), *re.split(r"[^a-z0-9]+", name.lower())}
    if words & NEVER_NEGATIVE and not words & MAY_BE_NEGATIVE:
        raise ConfigError(
            "target.selection_score",
            f"is {target:g}, but {name} is never negative, so it could never be met: a target is in the metric's "
            f"own units (the {name} to get at or below), not the negated score the knowledge base stores",
            f"set target.selection_score={-target:g} (or null)",
        )


def _check_task_paths(cfg: Config) -> None:
    """The trainer files include train.py, and the run and KB folders lie outside the task folder (whose files the
    seed is copied from and which the sandbox hides from trials)."""
    if not globs_file(cfg.task.trainer_files, "train.py"):
        raise ConfigError(
            "task.trainer_files",
            f"is {list(cfg.task.trainer_files)}, which leaves out the trainer itself (train.py)",
            f"keep train.py's pattern: task: {{trainer_files: {list(TRAINER_FILES)} + the files your trainer reads}} "
            "in task.yaml",
        )
    folder = cfg.task_folder().expanduser().resolve()
    for key in ("runs", "kb"):
        path = Path(getattr(cfg.paths, key)).expanduser().resolve()
        if path == folder or folder in path.parents:
            raise ConfigError(
                f"paths.{key}",
                f"{path} lies inside the task folder {folder}: the seed is copied from that folder, and trials "
                "cannot see inside it",
                f"run from outside the task folder (cd {folder.parent}), or set paths.{key}=/somewhere/else",
            )


def _check_task(cfg: Config) -> TaskFolder:
    """Load the task folder (every part there, a METRIC with a direction) and record its metric in cfg.task."""
    folder = cfg.task_folder().expanduser().resolve()
    shipped = {ref.folder.resolve(): name for name, ref in TASKS.items()}
    if folder in shipped and cfg.task.name not in TASKS:
        raise ConfigError(
            "task.name",
            f"unknown task {cfg.task.name!r}",
            f"use one of {', '.join(task_names())}, or a task folder of your own: task=./path/to/folder",
        )
    try:
        if folder in shipped:
            find_task(shipped[folder])  # a plug-in that claims a shipped task's name is refused, naming both
        task = load_task(folder)
        task.hidden_paths(cfg.data)  # a broken declaration stops here, not when the first run is sandboxed
    except TaskError as err:
        raise ConfigError("task", err.problem, err.fix) from None
    for key, declared in (("metric", task.metric.name), ("direction", task.metric.direction.value)):
        given = getattr(cfg.task, key)
        if given is not None and given != declared:
            raise ConfigError(
                f"task.{key}",
                f"{given!r} differs from {declared!r}, which {folder}/prepare.py declares",
                f"drop task.{key}: the task's METRIC decides it",
            )
        setattr(cfg.task, key, declared)
    cfg.task.scored_by = task.metric.scored_by.value
    if (
        cfg.search.metric in (task.metric.name, f"val_{task.metric.name}")
        and cfg.search.mode != task.metric.direction.value
    ):
        raise ConfigError(
            "search.mode",
            f"search.metric={cfg.search.metric} is the task's {task.metric.name}, better when "
            f"{'higher' if task.metric.direction.value == 'max' else 'lower'}, but search.mode={cfg.search.mode}",
            f"set search.mode={task.metric.direction.value} (in the task's task.yaml)",
        )
    named = _direction_by_name(cfg.search.metric)
    if named is not None and cfg.search.mode != named:
        # User trial: search.mode=min with the classification template's own val_acc started a campaign that ranked
        # its worst configs first (only the task metric's exact name and val_ prefix were checked).
        raise ConfigError(
            "search.mode",
            f"search.metric={cfg.search.metric} reads as {'an accuracy' if named == 'max' else 'a loss or an error'}, "
            f"better when {'higher' if named == 'max' else 'lower'}, but search.mode={cfg.search.mode}",
            f"set search.mode={named}",
        )
    return task


# Metric names whose direction their name says (the trainer's reported names: val_acc, val_loss, val_bpb, ...).
_HIGHER = re.compile(r"(^|_)(acc|accuracy|f1|macro_f1|auc|auroc|r2|precision|recall|top\d+)($|_)")
_LOWER = re.compile(r"(^|_)(loss|mse|rmse|mae|bpb|bpc|perplexity|ppl|error|err|nll)($|_)")


_NEGATED = re.compile(r"(^|_)(neg|negative|minus)($|_)")


def _direction_by_name(metric: str) -> str | None:
    """The direction a metric's name says: max for an accuracy (val_acc, f1_macro), min for a loss or an error, the
    other way for a negated one (val_neg_loss, neg_mean_squared_error); None where it says neither."""
    name = metric.lower()
    higher, lower = bool(_HIGHER.search(name)), bool(_LOWER.search(name))
    if higher == lower:
        return None
    if _NEGATED.search(name):
        higher = not higher
    return "max" if higher else "min"


def _check_llm_agent(cfg: Config) -> None:
    """The LLM and CLI backends' keys: an endpoint and model where an LLM is used, a key variable that is set."""
    agent = cfg.agent
    for key in ("timeout_s", "cli_timeout_s", "max_tokens"):
        if getattr(agent, key) is not None:
            _positive(f"agent.{key}", getattr(agent, key))
    for key in ("http_retries", "answer_retries"):
        if getattr(agent, key) < 0:
            raise ConfigError(f"agent.{key}", f"must be >= 0, got {getattr(agent, key)}", f"set agent.{key}=2")
    if agent.temperature is not None and not 0.0 <= agent.temperature <= 2.0:
        raise ConfigError(
            "agent.temperature", f"must be in [0, 2], got {agent.temperature}", "set agent.temperature=0.2 or null"
        )
    if agent.analyst not in (None, AgentBackend.heuristic, AgentBackend.openai):
        raise ConfigError(
            "agent.analyst",
            f"{agent.analyst.value} cannot diagnose parents",
            "set agent.analyst=heuristic, openai or null",
        )
    if agent.hybrid_llm not in (AgentBackend.openai, AgentBackend.cli):
        raise ConfigError(
            "agent.hybrid_llm", f"must be openai or cli, got {agent.hybrid_llm.value}", "set agent.hybrid_llm=openai"
        )
    backend = agent.backend
    llm_side = agent.hybrid_llm if backend is AgentBackend.hybrid else backend
    if backend is AgentBackend.hybrid:
        _positive("agent.llm_fail_children", agent.llm_fail_children)
        _positive("agent.stall_cycles", agent.stall_cycles)
        if agent.stall_cycles >= cfg.safeguards.plateau_cycles:
            raise ConfigError(
                "agent.stall_cycles",
                f"{agent.stall_cycles} >= safeguards.plateau_cycles={cfg.safeguards.plateau_cycles}: "
                "the plateau rule would stop the campaign before the LLM takes over",
                "lower agent.stall_cycles or raise safeguards.plateau_cycles",
            )
    if llm_side is AgentBackend.cli:
        try:
            load_template(agent.cli_template, agent.cli_command)
        except TemplateError as err:
            raise ConfigError(err.key, err.problem, err.fix) from None
    uses_endpoint = llm_side is AgentBackend.openai or agent.analyst is AgentBackend.openai
    if backend in (AgentBackend.none, AgentBackend.heuristic) or not uses_endpoint:
        return
    if not agent.base_url:
        raise ConfigError(
            "agent.base_url",
            "an OpenAI-compatible endpoint is needed",
            "set agent.base_url=https://api.openai.com/v1 (or your vLLM/Ollama/llama.cpp server, ending in /v1)",
        )
    if not agent.model:
        raise ConfigError("agent.model", "no model named", "set agent.model=<a model the endpoint serves>")
    if agent.api_key_env and not SECRET_ENV.search(agent.api_key_env):
        raise ConfigError(
            "agent.api_key_env",
            f"{agent.api_key_env!r} does not look like a secret's name, so trainer code and CLI agents would see it",
            "keep the key in a variable whose name contains KEY, TOKEN or SECRET (e.g. GLM_API_KEY)",
        )
    if agent.api_key_env and not os.environ.get(agent.api_key_env):
        raise ConfigError(
            "agent.api_key_env",
            f"environment variable {agent.api_key_env} is not set",
            f"export {agent.api_key_env}=<your key>, or agent.api_key_env=null for a server without a key",
        )


def _check_cluster(cfg: Config) -> None:
    """The cluster group and the storage URI: an address only where one is joined, a known auth mode."""
    cluster = cfg.cluster
    if cluster.mode is ClusterMode.local and cluster.address is not None:
        raise ConfigError(
            "cluster.address",
            f"{cluster.address!r} is set but cluster=local starts Ray in this process",
            f"join the cluster with `cluster=address cluster.address={cluster.address}`",
        )
    if cluster.address is not None and cluster.address.startswith("ray://"):
        raise ConfigError(
            "cluster.address",
            "Ray Client (ray://) runs Tune's driver on the head, out of reach of the knowledge base writer",
            "run the campaign on a cluster node (`ray attach cluster.yaml`, or `ray exec`) with cluster.address=auto",
        )
    if cluster.auth_mode not in AUTH_MODES:
        raise ConfigError(
            "cluster.auth_mode",
            f"must be one of {', '.join(AUTH_MODES)}, got {cluster.auth_mode!r}",
            "leave cluster.auth_mode=token (the default), or set disabled to join a cluster started without auth",
        )
    _positive("cluster.connect_timeout_s", cluster.connect_timeout_s)
    storage = cfg.paths.storage
    if storage is not None and "://" in storage and not storage.split("://", 1)[0].replace("+", "").isalnum():
        raise ConfigError(
            "paths.storage",
            f"{storage!r} is not a URI",
            "use a folder, or a URI such as s3://bucket/ralph or file:///mnt/shared/ralph",
        )


def _check_space(name: str, space: KnobSpace) -> None:
    """Raise ConfigError where a search knob has no UPPER_CASE name or an unusable range."""
    key = f"search.space.{name}"
    if not is_knob_name(name):
        raise ConfigError(
            key, f"{name!r} is not an UPPER_CASE knob", "name the trainer's module-level constant, e.g. LR"
        )
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
    if space.type is SpaceKind.int:  # `low: 4.5` was truncated to 4, below the range as written
        for bound, value, whole in (("low", space.low, math.ceil), ("high", space.high, math.floor)):
            if not float(value).is_integer():
                raise ConfigError(
                    f"{key}.{bound}",
                    f"an int range takes whole numbers, got {bound}={value:g}",
                    f"set {key}.{bound}={whole(value)}, or type: uniform to search fractions",
                )


def sandbox_policy(cfg: Config) -> Policy:
    """The sandbox policy of a campaign's runs: its config, with the campaign's own folders and raw data hidden.

    Raw data: data.root, and where the task's prepare.py says it reads labelled data besides (`hidden_paths`: e.g.
    fashion's Debian folder under /usr, which the sandbox otherwise binds read-only for every run)."""
    local = [
        cfg.data.root,
        cfg.paths.runs,
        cfg.paths.kb,
        cfg.paths.storage,
        str(cfg.task_folder()),
    ]  # + the frozen prepare.py
    hidden = [str(Path(p).expanduser().resolve()) for p in local if p and "://" not in p]
    hidden += [str(p) for p in load_task(cfg.task_folder()).hidden_paths(cfg.data)]
    hidden += cfg.sandbox.prepare_reads
    return cfg.sandbox.policy(tuple(dict.fromkeys(hidden)))


PLACEMENTS = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")


def _check_workers(cfg: Config) -> None:
    """resources.workers_per_trial: a positive count, a known placement, barrier cycles for N > 1."""
    res = cfg.resources
    _positive("resources.workers_per_trial", res.workers_per_trial)
    if res.placement not in PLACEMENTS:
        raise ConfigError(
            "resources.placement", f"must be one of {', '.join(PLACEMENTS)}, got {res.placement!r}", "set PACK"
        )
    if res.data_parallel and cfg.population.run_mode is not PopulationMode.generations:
        raise ConfigError(
            "resources.workers_per_trial" if res.workers_per_trial > 1 else "resources.ray_train",
            "data-parallel trials run in barrier cycles only (population.mode=async has its own trainable)",
            "set population.mode=generations, or resources.workers_per_trial=1 resources.ray_train=false",
        )
    entry = cfg.seed_entry()
    # The gate's own rule (resumable.parallel_problem), so a seed and its children are held to the same one.
    problem = parallel_problem(entry.read_text(), str(entry), res.workers_per_trial) if entry.exists() else None
    if problem:
        raise ConfigError(
            "resources.workers_per_trial", problem, "make the seed data-parallel (above), or set workers_per_trial=1"
        )


def _check_space_in_trainer(cfg: Config) -> None:
    """Every knob of search.space is a knob of the seed's train.py: else every trial of the campaign would fail
    (`cannot set knobs`), as a user's own trainer with other knob names than its task.yaml's space did."""
    entry = cfg.seed_entry()
    try:
        knobs = read_knobs(entry.read_text())
    except (OSError, SyntaxError, ValueError, KnobError):
        return  # a missing or broken seed is the task check's and the gate's to explain
    missing = [name for name in cfg.search.space if name not in knobs]
    computed = {name: node for name, node in near_knobs(parse(entry.read_text())).items() if name in missing}
    if computed:  # defined, but not as a literal the search can rewrite (not "does not define": it does)
        problems = [_not_a_literal(cfg, name, node, entry) for name, node in computed.items()]
        raise ConfigError(
            f"search.space.{next(iter(computed))}" if len(computed) == 1 else "search.space",
            "; ".join(problem for problem, _ in problems),
            "; ".join(fix for _, fix in problems),
        )
    if missing:
        near = {name: difflib.get_close_matches(name, list(knobs), n=1, cutoff=0.75) for name in missing}
        # A misspelt knob (`WIDHT` for WIDTH, a user trial) names its likely spelling first
        typos = " ".join(f"did you mean {found[0]} for {name}?" for name, found in near.items() if found)
        raise ConfigError(
            "search.space",
            f"names {', '.join(missing)}, which {entry} does not define (its knobs: {', '.join(knobs) or 'none'})",
            (f"{typos} " if typos else "")
            + "define each as a module-level UPPER_CASE constant in train.py, or drop it from the space: "
            + " ".join(f"~search.space.{name}" for name in missing),
        )
    for name, space in cfg.search.space.items():
        if problem := _range_on_seed_value(name, space, knobs[name], entry):
            raise ConfigError(f"search.space.{name}", *problem)


def _not_a_literal(cfg: Config, name: str, node: ast.Assign | ast.AnnAssign, entry: Path) -> tuple[str, str]:
    """(problem, fix) for a searched knob that train.py assigns something other than a literal: what to write instead
    (the value its config file holds, where it reads one from there; else a value of its space)."""
    written = ast.unparse(node).splitlines()[0]
    where = f"{entry}:{node.lineno} sets {written}"
    assert node.value is not None  # near_knobs gives assignments with a value only
    if isinstance(node, ast.AnnAssign) and is_literal(node.value):
        literal = ast.unparse(node.value)
        return f"{where}, an annotated constant: a knob is a plain `NAME = literal`", (
            f"write `{name} = {literal}` in train.py; the search sets it"
        )
    problem = f"{where}, which is not a literal (a number, string, bool or tuple the search rewrites)"
    files = config_files(cfg.trainer_dir(), _seed_code(cfg))
    keys = [n.value for n in ast.walk(node.value) if isinstance(n, ast.Constant) and isinstance(n.value, str)]
    read = next((found for key in keys if (found := config_value(files, key))), None)
    if read is not None:
        file, dotted, value = read
        shown_file = file.relative_to(cfg.trainer_dir())
        _, left_out = shipped_split(cfg.trainer_dir(), [file], cfg.task.trainer_files)
        ship = ""
        if left_out:  # the trials never get the file: where train.py still reads it, each would fail to find it
            ship = (
                f"; {shown_file} is not among task.trainer_files, so where train.py still reads it every trial "
                f"would fail to find it: {ship_fix(cfg.trainer_dir(), file, cfg.task.trainer_files)}"
            )
        return f"{problem}: its value comes from {shown_file} ({dotted}: {shown(value)})", (
            f"move it into train.py as a literal: write `{name} = {value!r}` in train.py; the search sets it (and "
            f"remove `{dotted}` from {shown_file}, so nothing reads another value){ship}"
        )
    return problem, f"write `{name} = {_example(cfg.search.space[name])!r}` in train.py; the search sets it"


def _example(space: KnobSpace) -> Any:
    """A value of a knob's space to write as its seed value: the first choice, or the range's low end."""
    if space.type is SpaceKind.choice and space.values:
        return space.values[0]
    if space.type is SpaceKind.int and space.low is not None:
        return math.ceil(space.low)
    return space.low


def _range_on_seed_value(name: str, space: KnobSpace, value: Any, entry: Path) -> tuple[str, str] | None:
    """(problem, fix) where a range cannot hold the seed's own value of its knob: an int range over `LR = 3e-3`
    trained every trial at LR 1 to 3 (one-class and NaN trials, a user trial); a range over a string or a tuple."""
    if space.type is SpaceKind.choice:
        return None
    written = f"{entry}'s {name} = {value!r}"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return (
            f"is a {space.type.value} range, but {written} is a {type(value).__name__}",
            f"search {name} over its values: search.space.{name}={{type: choice, values: [...]}}",
        )
    if space.type is SpaceKind.int and isinstance(value, float):  # DROPOUT = 0.0 over [0, 1] trains 0 or 1 too
        kind = "loguniform" if value > 0 else "uniform"
        return (
            f"is an int range, but {written} is a float: every trial would train a whole number",
            f"set search.space.{name}.type={kind} (with low and high around {value:g})",
        )
    return None


def _seed_code(cfg: Config) -> list[Path]:
    """The Python files the seed variant ships (task.trainer_files), as the trials run them; never prepare.py."""
    found = globbed(cfg.trainer_dir(), cfg.task.trainer_files)
    return sorted(path for path in found if path.suffix == ".py" and path.name != "prepare.py")


def _check_metric_in_trainer(cfg: Config) -> None:
    """search.metric is a name the seed's code reports: else the first trial's result stopped the campaign after Ray
    started, with Tune's traceback and the trainer's source in base64 (a user's `search.metric=val_accuracy`)."""
    reported: set[str] = {"epoch", TRAIN_SECONDS}
    for path in _seed_code(cfg):
        try:
            found = reported_metrics(path.read_text())
        except (OSError, SyntaxError, ValueError):
            return  # a broken seed is the gate's to explain
        if found is None:
            return  # `report(**metrics)`: the names are known at run time only
        reported |= found
    if cfg.search.metric in reported or len(reported) == 2:  # no report call: seedcheck refused it already
        return
    names = sorted(reported - {"epoch", TRAIN_SECONDS})
    near = difflib.get_close_matches(cfg.search.metric, names, n=1, cutoff=0.6)
    raise ConfigError(
        "search.metric",
        f"{cfg.search.metric!r} is not reported by {cfg.trainer_dir()}: its report(...) calls pass {', '.join(names)}",
        f"set search.metric={near[0] if near else names[0]} (and search.mode to its direction) in the task's "
        "task.yaml or on the command line, or report it from train.py",
    )


# What a trainer calls (or reads) to train for trial.budget_s: without one, its trials run their own EPOCHS.
BUDGET_READERS = ("epochs(", "time_left(", "progress(", "lr_factor(", "RALPH_BUDGET_S")


def budget_unread(cfg: Config) -> str | None:
    """A warning when trial.budget_s is set and the seed's code reads no budget (a user's `for epoch in
    range(EPOCHS)` trainer ran every epoch under `trial.budget_s=5`, and nothing said so); else None."""
    if cfg.trial.budget_s is None or _reads_budget(cfg):
        return None
    return (
        f"trial.budget_s={cfg.trial.budget_s:g} is set, but {cfg.trainer_dir()}'s code reads no budget "
        "(harness.epochs, time_left, progress or lr_factor): its trials train their own EPOCHS, and past budget_s + "
        "trial.grace_s of training the engine stops them unscored; loop `for epoch in harness.epochs(EPOCHS):`"
    )


def final_unread(cfg: Config) -> str | None:
    """A warning when safeguards.final_share keeps time for a longer final training but the seed's code reads no
    budget: its final trains the same EPOCHS as a search trial (a user's `range(EPOCHS)` autoencoder's final ran
    exactly as long as its search, and only the additions differed); else None."""
    if not cfg.safeguards.final_share or _reads_budget(cfg):
        return None
    return (
        f"safeguards.final_share={cfg.safeguards.final_share:g} keeps time to train the pick longer, but "
        f"{cfg.trainer_dir()}'s code reads no budget (harness.epochs, time_left, progress or lr_factor): its final "
        "training runs its own EPOCHS, as long as a search trial; loop `for epoch in harness.epochs(EPOCHS):` (or "
        "set safeguards.final_share=0)"
    )


def schedule_unsized(cfg: Config) -> str | None:
    """A warning when trial.budget_s or safeguards.final_share lets harness.epochs run as many epochs as fit, the seed
    reads that budget (BUDGET_READERS), and it builds an LR scheduler sized up front (a user's LambdaLR over
    `EPOCHS * steps` trained 10 of its final's 19 epochs at lr 0, and its 4-s search trials never annealed); else None.
    A seed that reads no budget trains its own EPOCHS, so its schedule fits (budget_unread, final_unread warn)."""
    budgets = [f"trial.budget_s={cfg.trial.budget_s:g}"] if cfg.trial.budget_s is not None else []
    budgets += [f"safeguards.final_share={cfg.safeguards.final_share:g}"] if cfg.safeguards.final_share else []
    if not budgets or not _reads_budget(cfg) or not (built := sized_schedule(_seed_code(cfg))):
        return None  # a trainer that reads no budget runs its own EPOCHS (budget_unread, final_unread say so)
    return (
        f"{' and '.join(budgets)}: harness.epochs runs as many epochs as the time allows, not EPOCHS, but "
        f"{cfg.trainer_dir()}'s code builds {built}, sized by a step or epoch count, and never calls "
        "harness.progress or harness.lr_factor: where more epochs fit than it counts, the schedule ends early (at its "
        "last lr, or OneCycleLR raises past total_steps), and where fewer fit it never anneals; size it by time: "
        "`LambdaLR(optimizer, lambda epoch: harness.lr_factor(epoch, EPOCHS, "
        '"cosine", warmup_epochs=1))` stepped once per epoch, or per step `lr = peak * shape(harness.progress(step, '
        "total_steps))` (README, An equal time budget per trial)"
    )


def knob_overridden(cfg: Config) -> str | None:
    """A warning when the seed sets a searched knob's value again after all: a dataclass field that reads it set to a
    literal (`lr: float = LR`, then `dataclasses.replace(TrainConfig(), lr=1e-3)`: a user's every trial would train
    lr=1e-3 while the KB recorded sampled LR values, and the unread-knob check saw LR read), or the knob read only as
    the fallback of a key its config file sets (`CFG.get("hidden", HIDDEN)` beside config.yaml's `hidden: 32`); else
    None. A warning, not exit 2: the call may sit off the trials' path (a debug helper)."""
    found = overridden_knobs(_seed_code(cfg), list(cfg.search.space))
    warnings = []
    if found:
        warnings.append(
            f"{cfg.trainer_dir()}'s code sets a knob's field to a literal in a constructor or dataclasses.replace "
            f"call: {', '.join(found)}; where the trials run that call, each trains the literal while the KB records "
            "the sampled values; fix: leave the field to its knob default (`lr: float = LR`) and drop the literal from "
            "that call (README, Add your own task, step 3)"
        )
    fallbacks = fallback_knobs(_seed_code(cfg), list(cfg.search.space), cfg.trainer_dir(), cfg.task.trainer_files)
    if fallbacks:
        warnings.append(
            f"{cfg.trainer_dir()}'s code reads a searched knob only as the fallback of a key its config file sets: "
            f"{', '.join(text for text, _ in fallbacks)}; every trial trains the file's value while the KB records "
            f"the sampled ones, so the search does nothing; fix: {'; '.join(fix for _, fix in fallbacks)} (README, "
            "Add your own task, step 3)"
        )
    if unshipped := unshipped_config(_seed_code(cfg), cfg.trainer_dir(), cfg.task.trainer_files):
        warnings.append(f"{unshipped} (README, Add your own task, step 1)")
    return "\n".join(warnings) or None


def _reads_budget(cfg: Config) -> bool:
    """Whether the seed's code calls (or reads) anything that trains for the time it is given."""
    return any(reader in path.read_text(errors="replace") for path in _seed_code(cfg) for reader in BUDGET_READERS)


def _check_pbt(cfg: Config) -> None:
    """scheduler=pbt: barrier cycles, epochs as its clock, knobs to perturb, a seed trainer that resumes."""
    sched = cfg.scheduler
    _positive("scheduler.perturbation_interval", sched.perturbation_interval)
    if not 0.0 < sched.quantile_fraction <= 0.5:
        raise ConfigError(
            "scheduler.quantile_fraction",
            f"must be in (0, 0.5], got {sched.quantile_fraction}",
            "set scheduler.quantile_fraction=0.25",
        )
    if cfg.population.run_mode is not PopulationMode.generations:
        raise ConfigError(
            "scheduler",
            "pbt runs a cycle's trials as one population, which population.mode=async has not",
            "set population.mode=generations, or scheduler=asha",
        )
    if cfg.trial.budget_s is not None:
        raise ConfigError(
            "scheduler", "pbt perturbs every N epochs, not under a time budget", "set trial.budget_s=null"
        )
    mutate = list(cfg.search.space) if sched.mutate is None else sched.mutate
    unknown = [name for name in mutate if name not in cfg.search.space]
    if unknown or not mutate:
        raise ConfigError(
            "scheduler.mutate",
            f"names knobs outside search.space: {', '.join(unknown)}" if unknown else "no knob to perturb",
            f"list knobs of search.space ({', '.join(cfg.search.space) or 'none yet'}), e.g. scheduler.mutate=[LR]",
        )
    ranged = (SpaceKind.uniform, SpaceKind.loguniform)
    unbounded = [name for name in mutate if name in cfg.search.space and cfg.search.space[name].type not in ranged]
    if sched.name is SchedulerKind.pb2 and unbounded:  # PB2's bandit proposes reals between a knob's bounds
        raise ConfigError(
            "scheduler.mutate",
            f"pb2 perturbs real-valued knobs only (uniform or loguniform), not {', '.join(unbounded)}",
            "list only such knobs, e.g. scheduler.mutate=[LR], or set scheduler=pbt",
        )
    entry = cfg.seed_entry()
    missing = missing_resume_calls(entry.read_text()) if entry.exists() else []
    if missing:
        raise ConfigError("scheduler", refusal(str(entry), missing), "add the calls, or set scheduler=asha")


def _non_negative_number(text: str) -> bool:
    """Whether `text` reads as a finite number >= 0."""
    try:
        return 0.0 <= float(text) < float("inf")
    except ValueError:
        return False


def _positive(key: str, value: float) -> None:
    """Raise ConfigError where `key` is not above 0."""
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
    fix = (
        "check the key against conf/ (`python -m ralph_ray --cfg` prints the composed config); "
        "add new keys with +key=value only where the schema has them"
    )
    fix = _did_you_mean(key.lstrip("+~")) + fix
    group = re.search(r"Could not override '([\w-]+)'\. No match in the defaults list", text)
    if group and (CONF_DIR / group.group(1)).is_dir():  # `experiment=fashion`: an optional group takes a `+`
        key, fix = group.group(1), f"write +{group.group(1)}=... (a `+` adds a group the defaults list leaves out)"
    if key in LEGACY_FINAL_KEYS:
        fix = _legacy_fix(key)
    if "Could not find" in text or "not found in" in text.lower():
        fix = "choose an option that exists under conf/<group>/ (e.g. +experiment=cifar10)"
        missing = re.search(r"Could not find '([\w-]+)/([^']+)'", text)
        if missing:  # an unknown option of a group (agent=gpt): name the group and its options
            key = missing.group(1)
            options = sorted(p.stem for p in (PROJECT_ROOT / "conf" / key).glob("*.yaml"))
            near = difflib.get_close_matches(missing.group(2), options, n=1, cutoff=0.6)
            plus = "+" if key == "experiment" else ""  # the one group the defaults list leaves out
            fix = f"did you mean {plus}{key}={near[0]}? " if near else ""
            fix += f"choose one of {key}={', '.join(options)} (files in conf/{key}/)"
            plugins = [name for name in task_names() if name not in options] if key == "task" else []
            if plugins:
                fix += f", or an installed plug-in: {', '.join(plugins)}"
            if key == "task":
                fix += ", or a task folder: task=./path/to/folder"
    return ConfigError(key, _first_line(err), fix)


def _legacy_fix(key: str) -> str:
    """The fix for a safeguards key that became a name in safeguards.final_additions."""
    return f"{key} is a name in safeguards.final_additions now: set {LEGACY_FINAL_KEYS[key]}"


def _fix_for(key: str, err: Exception | None = None) -> str:
    """The fix for an unknown or mistyped key (the nearest known name, and where the schema is), or for a known key's
    value of the wrong kind (the values it takes: `search.sampler=cmaes` was told "did you mean `search.sampler`?")."""
    schema, leaf = getattr(err, "object_type", None), getattr(err, "key", None)
    hints = typing.get_type_hints(schema) if dataclasses.is_dataclass(schema) else {}
    if leaf in hints:
        kind = next((a for a in typing.get_args(hints[leaf]) if a is not type(None)), hints[leaf])  # Optional[X]: X
        value = str(getattr(err, "value", ""))
        if isinstance(kind, type) and issubclass(kind, enum.Enum):
            options = [str(member.value) for member in kind]
            near = difflib.get_close_matches(value, options, n=1, cutoff=0.6)
            return (f"did you mean {key}={near[0]}? " if near else "") + f"set {key} to one of {', '.join(options)}"
        name = getattr(kind, "__name__", str(kind))
        return f"set {key} to a value of type {name} (got {value!r}; the schema: ralph_ray/config.py)"
    return f"{_did_you_mean(key)}check `{key}` against the schema in ralph_ray/config.py (spelling and type)"


def _did_you_mean(key: str) -> str:
    """The schema's nearest names for a misspelt dotted key ("did you mean `a.b`? "), or nothing."""
    parent, _, leaf = key.rpartition(".")
    node: Any = Config()
    for part in parent.split(".") if parent else []:
        node = getattr(node, part, None)
    names = [f.name for f in dataclasses.fields(node)] if dataclasses.is_dataclass(node) else []
    near = difflib.get_close_matches(leaf, names, n=2, cutoff=0.75) or [n for n in names if n.startswith(leaf)][:2]
    return f"did you mean {' or '.join(f'`{parent}.{n}`' if parent else f'`{n}`' for n in near)}? " if near else ""


def _task_yaml(trainer: Any) -> Path:
    """The task.yaml of a `task.trainer` value (relative to the project root, or absolute)."""
    folder = Path(str(trainer)).expanduser()
    return (folder if folder.is_absolute() else PROJECT_ROOT / folder) / "task.yaml"


def _set_on_command_line(overrides: list[str], key: str) -> str:
    """Where a refused key came from when the command line sets it, or a section holding it (the last one wins)."""
    for override in reversed(overrides):
        name, eq, _ = override.lstrip("+~").partition("=")
        if eq and (key == name or key.startswith(f"{name}.")):
            return f" (set on the command line: {override})"
    return ""


def _set_in_task_yaml(raw: dict[str, Any], key: str) -> str:
    """Where a refused key came from when the task's task.yaml sets it to the refused value (the user looks there)."""
    task_yaml = _task_yaml((raw.get("task") or {}).get("trainer", ""))
    try:
        own = OmegaConf.select(OmegaConf.load(task_yaml), key) if task_yaml.is_file() else None
        found = own is not None and own == OmegaConf.select(OmegaConf.create(raw), key)
    except (OmegaConfBaseException, OSError):
        found = False
    return f" (set in {task_yaml})" if found else ""


def _first_line(err: Exception) -> str:
    """The first line of an error's message (its type's name where it has none)."""
    return str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
