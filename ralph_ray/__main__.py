"""`python -m ralph_ray [hydra overrides]`: run a campaign. Exit codes: see ralph_ray.exit_codes."""

from __future__ import annotations

import errno
import os
import shlex
import sys
import traceback
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

from rich.console import Console

from ralph_ray.exit_codes import ExitCode

if TYPE_CHECKING:
    from ralph_ray.config import Config

USAGE = """usage: python -m ralph_ray [+experiment=NAME] [key=value ...] [--cfg]
       python -m ralph_ray resume=RUN_ID [key=value ...]
       python -m ralph_ray status [RUN_ID] | stop RUN_ID | report RUN_ID   (also: ralph-ray ...)
       python -m ralph_ray export RUN_ID [VARIANT] [--to hf REPO_ID] | track RUN_ID [mlflow] [tensorboard] [wandb]
       python -m ralph_ray kb check [--repair] | kb compact   (damaged parts moved aside; finished runs merged)
       python -m ralph_ray init NAME --template classification|regression|lm|PLUGIN   (a task folder of your own)

Runs a campaign. Without arguments: the embedded digits experiment (offline, CPU).
  python -m ralph_ray +experiment=cifar10 data.root=/path/to/cifar
  python -m ralph_ray population.parents=1 population.children_per_parent=1   # the serial Ralph loop
  python -m ralph_ray agent=none                                               # knob search only
  python -m ralph_ray task=diabetes                                # a regression task (MSE, lower is better)
  python -m ralph_ray task=./my_task                                           # your own task folder (see init)
  python -m ralph_ray task=mytask       # a task installed as a package (entry-point group ralph_ray.tasks)
  python -m ralph_ray resume=RUN_ID safeguards.max_cycles=8                     # continue after a crash or stop
  python -m ralph_ray cluster=address paths.storage=s3://bucket/ralph   # on a Ray cluster's head (ray up cluster.yaml)
  --cfg   print the composed config and exit
  --config-dir DIR (-cd DIR)   also look for config groups in DIR (Hydra's way to add your own experiments:
          DIR/experiment/mine.yaml, then +experiment=mine)
Config groups live in conf/ (experiment, task, data, search, scheduler, safeguards, target, population,
agent, resources, paths, cluster, trial, sandbox, tracking).
Exit codes: 0 target met or clean stop, 2 invalid config/data or a safeguard, 3 plateau, 4 unrecoverable error
(no trial completed included), 130 interrupted (Ctrl-C; resume=RUN_ID goes on), 143 the same by SIGTERM.
"""


# The overrides that say where a resumed run lives (an experiment may set paths.runs); the rest apply to its config.
LOCATES_A_RUN = ("resume=", "paths.runs=", "+paths.runs=", "++paths.runs=", "+experiment=", "experiment=", "hydra.")


def main(argv: list[str] | None = None) -> int:
    """Parse overrides, validate the config before Ray starts, run the campaign, return the exit code."""
    with plain_warnings():
        return _main(list(sys.argv[1:] if argv is None else argv))


@contextmanager
def plain_warnings() -> Iterator[None]:
    """While the command line runs, the project's own warnings (DamagedPartWarning, AnalystWarning, ...: categories
    defined in ralph_ray) print as one line `warning: <message>`, not Python's `path.py:207: Category: message` and
    its source line; any other warning keeps Python's shape. Ray workers and trials run in processes of their own,
    which never enter this hook; it is put back when the command ends (tests call main in-process)."""
    before = warnings.formatwarning

    def one_line(
        message: Warning | str, category: type[Warning], filename: str, lineno: int, line: str | None = None
    ) -> str:
        if category.__module__.split(".", 1)[0] == "ralph_ray":
            return f"warning: {message}\n"
        return before(message, category, filename, lineno, line)

    warnings.formatwarning = one_line
    try:
        yield
    finally:
        warnings.formatwarning = before


def _main(argv: list[str]) -> int:
    """main's body: the command, or a campaign from its overrides (see USAGE)."""
    err = Console(stderr=True, soft_wrap=True)
    if any(a in ("-h", "--help") for a in argv):
        from ralph_ray.commands import COMMANDS, usage

        # `kb sql --help` asks about kb sql (and `status --help` about the commands), not about running a campaign
        print(usage(argv) if argv[0] in COMMANDS else USAGE)
        return ExitCode.ok
    from ralph_ray.commands import COMMANDS

    if argv and argv[0] == "init":
        from ralph_ray import scaffold

        return scaffold.main(argv[1:])
    if argv and argv[0] in COMMANDS:
        from ralph_ray import commands

        # Piped (status | less, a log file), rich would fit its tables to 80 columns and cut scores to "0.99…"
        piped = not sys.stdout.isatty() and "COLUMNS" not in os.environ
        return commands.main(argv, Console(soft_wrap=True, width=200 if piped else None))
    show_cfg = "--cfg" in argv
    argv = [a for a in argv if a != "--cfg"]
    try:
        argv = config_dirs(argv)
    except ValueError as error:
        err.print(f"error: {error}", style="red", markup=False, highlight=False)
        return ExitCode.safeguard_or_config

    from ralph_ray.config import ConfigError, load_config, resume_config

    try:
        # A resume's overrides apply to the stored run's config, whose task's knobs the default task may lack
        # (`resume=ID search.space.EPOCHS.values=[2]` was refused as an unknown key): compose only what finds the run.
        resuming = any(a.startswith("resume=") for a in argv)
        cfg = load_config([a for a in argv if a.startswith(LOCATES_A_RUN)] if resuming else argv)
        if cfg.resume:
            cfg = resume_config(Path(cfg.paths.runs) / cfg.resume, argv)
    except ConfigError as error:
        err.print(str(error), style="red", markup=False, highlight=False)
        return ExitCode.safeguard_or_config
    if show_cfg:
        from omegaconf import OmegaConf

        print(OmegaConf.to_yaml(OmegaConf.structured(cfg)))
        return ExitCode.ok
    if cfg.resume and not (resume_alone(cfg, err) and resume_has_budget(cfg, argv, err)):
        return ExitCode.safeguard_or_config

    from ralph_ray.campaign import REFUSALS, run
    from ralph_ray.config import ClusterMode
    from ralph_ray.liveness import resume_for
    from ralph_ray.raycluster import RayStartError, ensure_ray
    from ralph_ray.sandbox import check
    from ralph_ray.sigterm import arrived, install, restore

    before = install()  # SIGTERM (timeout, systemd, docker stop, Kubernetes) ends the campaign as Ctrl-C does
    try:
        check(cfg.sandbox.policy())  # before Ray starts: no sandbox, no campaign (unless sandbox=none)
        if cfg.cluster.mode is ClusterMode.address:
            ensure_ray(cluster=cfg.cluster)  # an unreachable or refusing cluster stops here, before a run is recorded
        return int(run(cfg).exit_code)
    except REFUSALS as error:
        err.print("[red]error:[/] ", end="")
        err.print(str(error), markup=False, highlight=False)  # server messages may hold [brackets]
        return ExitCode.safeguard_or_config
    except RayStartError as error:  # a loaded machine, not a bug: one line, and the command that retries
        err.print("[red]error:[/] ", end="")
        err.print(str(error), markup=False, highlight=False)
        if error.resume:
            err.print(f"  the run is recorded as crashed; retry with `{error.resume}`", highlight=False)
        return ExitCode.error
    except KeyboardInterrupt as interrupt:
        run_id = getattr(interrupt, "run_id", None)  # campaign.Interrupted: the run is recorded as interrupted
        terminated = arrived(interrupt)
        if terminated:
            err.print("[yellow]SIGTERM: stopping as a Ctrl-C does[/]")
        if run_id is None:
            err.print("[yellow]interrupted before a run was recorded[/]")
        elif getattr(interrupt, "finished", False):
            err.print(
                f"[yellow]interrupted after run {run_id} finished (recorded finished, its results in the knowledge "
                f"base): its report was cut short; write it with `python -m ralph_ray report {run_id}`[/]",
                highlight=False,
            )
        else:
            err.print(
                f"[yellow]interrupted: run {run_id} is recorded as interrupted and its finished trials are in the "
                f"knowledge base; continue with `{resume_for(run_id, cfg.paths.runs, cfg.paths.kb)}`[/]",
                highlight=False,
            )
        return ExitCode.terminated if terminated else ExitCode.interrupted
    except Exception as error:  # noqa: BLE001 - the last line of defence prints the traceback and exits 4
        err.print("[red]unrecoverable error:[/]")
        traceback.print_exc()
        if disk_full(error):  # its traceback is hundreds of chained lines (Tune's too): the cause, last, in words
            err.print(
                f"[red]the disk is full[/] (No space left on device): free space where the runs "
                f"({cfg.paths.runs}) and the knowledge base ({cfg.paths.kb}) live, then continue the run with "
                "`python -m ralph_ray resume=RUN_ID` (`python -m ralph_ray status` names it; the knowledge base's "
                "parts are written atomically, `python -m ralph_ray kb check` confirms them)",
                highlight=False,
            )
        return ExitCode.error
    finally:
        restore(before)


def disk_full(error: BaseException) -> bool:
    """Whether an error, or one it was raised from or while handling, is a full disk (ENOSPC, EDQUOT), also as the
    text of an error that wraps it (Ray and Tune pass a worker's error on as a message)."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if "No space left on device" in str(current) or "Disk quota exceeded" in str(current):
            return True
        current = current.__cause__ or current.__context__
    return False


def resume_alone(cfg: Config, err: Console) -> bool:
    """Whether no other driver runs the run a resume names (rundir.refuse_live_driver) and none of its KB parts is
    damaged, checked before Ray starts and before its state is touched; where its driver's host cannot be checked
    from here, said once and let go."""
    from ralph_ray.kb import RESUME_WOULD, own_damaged
    from ralph_ray.rundir import CampaignError, refuse_live_driver

    try:
        note = refuse_live_driver(Path(cfg.paths.runs) / str(cfg.resume), cfg.paths.runs, cfg.paths.kb)
        # A damaged part of its own: refused here, before the run's state is touched (Campaign checks it again).
        if refusal := own_damaged(cfg.paths.kb, str(cfg.resume), RESUME_WOULD):
            raise CampaignError(refusal)
    except CampaignError as error:
        err.print("[red]error:[/] ", end="")
        err.print(str(error), markup=False, highlight=False)
        return False
    if note:
        err.print(f"[yellow]warning:[/] {note}", highlight=False)
    return True


def resume_has_budget(cfg: Config, argv: list[str], err: Console) -> bool:
    """Whether a resume can go on; a finished run whose budget it has not raised would stop again at once, before
    any trial: refused here, before Ray starts, with the command that raises it (with safeguards.final_share, what
    is left of the final training may still run: a warning instead)."""
    from ralph_ray.rundir import spent_on_resume

    spent = spent_on_resume(Path(cfg.paths.runs) / str(cfg.resume), cfg.safeguards)
    if not spent:
        return True
    raised = {s.key for s in spent}
    kept = [a for a in argv if a.lstrip("+").split("=", 1)[0] not in raised]
    command = shlex.join(["python", "-m", "ralph_ray", *kept, *(s.override for s in spent)])
    used = "; ".join(s.used for s in spent)
    if cfg.safeguards.final_share and cfg.safeguards.campaign_time_s is not None:
        err.print(
            f"[yellow]warning:[/] run {cfg.resume} has spent its budget ({used}): this resume only runs what is left "
            f"of the final training (safeguards.final_share); to search on, raise it: {command}",
            highlight=False,
        )
        return True
    err.print(
        f"[red]error:[/] run {cfg.resume} stopped with its budget spent ({used}), and this resume does not raise it, "
        f"so it would stop again at once\n  fix: raise it, e.g. {command}",
        highlight=False,
    )
    return False


def config_dirs(argv: list[str]) -> list[str]:
    """Hydra's `--config-dir DIR` (`-cd DIR`, `--config-dir=DIR`) as the override `hydra.searchpath=[file://DIR]`:
    DIR's config groups (e.g. DIR/experiment/*.yaml) join the project's conf/, which keeps its own."""
    rest, dirs = [], []
    items = iter(argv)
    for item in items:
        if item in ("--config-dir", "-cd") or item.startswith("--config-dir="):
            value = item.split("=", 1)[1] if "=" in item else next(items, "")
            folder = Path(value).expanduser().resolve()
            if not value or not folder.is_dir():
                raise ValueError(
                    f"--config-dir {value or '(missing)'}: no such folder; fix: point it at a folder "
                    "that holds config groups, e.g. ./conf with conf/experiment/mine.yaml"
                )
            dirs.append(f"file://{folder}")
        else:
            rest.append(item)
    return rest + ([f"hydra.searchpath=[{','.join(dirs)}]"] if dirs else [])


if __name__ == "__main__":
    sys.exit(main())
