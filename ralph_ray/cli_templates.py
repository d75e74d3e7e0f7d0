"""CLI agent templates (`agents/cli/<name>.yaml`): how to call one coding agent, loaded by one function.

A bottom-layer module (no engine imports): config validation and the CLI coder both load templates here, so a
template that config accepts is the template the coder runs.
"""

from __future__ import annotations

from dataclasses import dataclass

import yaml

from ralph_ray import PROJECT_ROOT

TEMPLATES_DIR = PROJECT_ROOT / "agents" / "cli"


class TemplateError(ValueError):
    """A template that is missing, not valid YAML, or without a command; names the config key and the fix."""

    def __init__(self, key: str, problem: str, fix: str) -> None:
        super().__init__(f"{problem}\n  fix: {fix}")
        self.key, self.problem, self.fix = key, problem, fix


@dataclass(frozen=True)
class CliTemplate:
    """How to call one coding agent: its command line, extra arguments for a model, the secrets it may see."""

    name: str
    command: str
    model_args: str | None
    env: tuple[str, ...]


def known_templates() -> list[str]:
    """The shipped template names, sorted."""
    return sorted(p.stem for p in TEMPLATES_DIR.glob("*.yaml"))


def load_template(name: str, command: str | None = None) -> CliTemplate:
    """The template `name`, with `command` (agent.cli_command, when set) replacing its command line."""
    path = TEMPLATES_DIR / f"{name}.yaml"
    known = ", ".join(known_templates())
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except FileNotFoundError:
        raise TemplateError(
            "agent.cli_template",
            f"no CLI template {path}",
            f"set agent.cli_template to one of {known}, or set agent.cli_command",
        ) from None
    except yaml.YAMLError as err:
        raise TemplateError("agent.cli_template", f"{path} is not valid YAML: {err}", f"repair {path}") from None
    if not isinstance(data, dict):
        raise TemplateError("agent.cli_template", f"{path} is not a mapping", "give it command, model_args, env")
    line = command or data.get("command")
    if not line:
        raise TemplateError(
            "agent.cli_command",
            f"template {name} has no command of its own",
            f"set agent.cli_command='my-agent {{prompt_file}}', or agent.cli_template to one of {known}",
        )
    return CliTemplate(name, " ".join(str(line).split()), data.get("model_args"), tuple(data.get("env") or ()))
