"""A coding-agent CLI as the coder (Claude Code, Codex, Aider, OpenCode, any command): it edits the child's work dir.

The command comes from a template in `agents/cli/<name>.yaml` (or `agent.cli_command`). It runs with the
work dir (a copy of the parent's files, nothing else) as its cwd, in its own process group that is killed
at the time limit, with an environment stripped of secrets except those it is allowed. The child's diff is
whatever it changed. Its tokens cannot be counted, so they are estimated (4 characters a token) and marked.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from ralph_ray import cli_templates
from ralph_ray.agents import prompts
from ralph_ray.agents.base import AgentConfigError, AgentError, Draft, ParentView, Recommendation, Usage
from ralph_ray.cli_templates import CliTemplate, TemplateError
from ralph_ray.config import AgentConfig
from ralph_ray.sandbox import Jail, Policy, View, keep_niceness_in_session
from ralph_ray.secretenv import SECRET_ENV
from ralph_ray.variants import mutable_names, unified_diff

TERM_GRACE_S = 5.0  # between SIGTERM and SIGKILL for a command past its time limit
TAIL_CHARS = 1500  # of the command's output, in an error message
OUTPUT_LOG = "output.log"  # the command's stdout and stderr, in its scratch folder


def load_template(cfg: AgentConfig) -> CliTemplate:
    """The configured template (`cli_templates.load_template`), its errors as the campaign's AgentConfigError."""
    try:
        return cli_templates.load_template(cfg.cli_template, cfg.cli_command)
    except TemplateError as err:
        raise AgentConfigError(str(err)) from None


def command_line(template: CliTemplate, values: dict[str, str], files: list[str], model: str | None) -> list[str]:
    """The argv: the template split like a shell would (no shell runs), placeholders filled inside each argument."""
    line = template.command + (f" {template.model_args}" if model and template.model_args else "")
    argv: list[str] = []
    for token in shlex.split(line):
        if token == "{files}":
            argv.extend(files)
            continue
        for key, value in values.items():
            token = token.replace("{" + key + "}", value)
        argv.append(token)
    return argv


def clean_env(allowed: set[str], engine_secret: str | None) -> dict[str, str]:
    """The engine's environment minus every secret-looking variable (and the engine's own key) not allowed."""
    env = {}
    for name, value in os.environ.items():
        if name in allowed:
            env[name] = value
        elif name != engine_secret and not SECRET_ENV.search(name):
            env[name] = value
    return env


class CliCoder:
    """Runs the configured command in the child's work dir with the recommendation and program.md as the prompt."""

    def __init__(self, cfg: AgentConfig, sandbox: Policy | None = None, paths: tuple[str, ...] = ()) -> None:
        # The campaign passes its sandbox policy: the command then sees the child's work dir, its own program
        # files, `paths` (its config folders, read-write) and the network, not the run dir or the KB.
        self.sandbox, self.paths = sandbox, tuple(Path(p).expanduser() for p in paths)
        self.template = load_template(cfg)
        self.model, self.timeout_s = cfg.model, cfg.cli_timeout_s
        self.allowed = set(self.template.env) | set(cfg.cli_env)
        self.engine_secret = cfg.api_key_env

    def check(self) -> None:
        """Fail fast when the command is not installed."""
        program = shlex.split(self.template.command)[0]
        if shutil.which(program) is None and not Path(program).is_file():
            raise AgentConfigError(
                f"the CLI agent `{program}` (template {self.template.name}) is not on PATH\n"
                "  fix: install it, or choose another with agent.cli_template / agent.cli_command"
            )

    def write(
        self, parent: ParentView, recommendation: Recommendation, workdir: Path, feedback: str | None, usage: Usage
    ) -> Draft:
        """Run the command once; the edit it leaves in `workdir` is the child."""
        files = mutable_names(workdir)
        refused = (
            f"## Your last attempt was refused\n\nThe validation gate said: {feedback}\nAvoid that this time."
            if feedback
            else ""
        )
        prompt = prompts.render(
            "cli",
            program=parent.program.strip(),
            recommendation=prompts.show_recommendation(recommendation),
            feedback=refused,
            mutable=", ".join(files),
        )
        scratch = Path(tempfile.mkdtemp(prefix="ralph-cli-"))
        try:
            (scratch / "prompt.md").write_text(prompt)
            values = {
                "prompt": prompt,
                "prompt_file": str(scratch / "prompt.md"),
                "model": self.model or "",
                "workdir": str(workdir.resolve()),
                "scratch": str(scratch),
            }
            argv = command_line(self.template, values, files, self.model)
            on_stdin = "{prompt}" not in self.template.command and "{prompt_file}" not in self.template.command
            start = time.perf_counter()
            try:
                output = self._run(argv, workdir, scratch, prompt if on_stdin else None)
            except AgentError:
                # the call ran and spent its tokens whatever its end (an error, its timeout): counted now, or the
                # rejected child's usage showed no call and the budgets and agent_usage never saw them
                said = (scratch / OUTPUT_LOG).read_text(errors="replace") if (scratch / OUTPUT_LOG).exists() else ""
                _count(usage, prompt, said)
                raise
            finally:
                usage.seconds += time.perf_counter() - start
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        _remove_tool_litter(parent.files_dir, workdir)
        diff = unified_diff(parent.files_dir, workdir)
        _count(usage, prompt, output + diff)
        if not diff:
            raise AgentError(f"`{argv[0]}` exited cleanly but changed nothing: {_tail(output) or 'no output'}")
        return Draft(
            workdir, [recommendation.intervention], " ".join(output.split())[-400:] or recommendation.rationale
        )

    def _run(self, argv: list[str], workdir: Path, scratch: Path, stdin_text: str | None) -> str:
        """Run in a new process group with a time limit; the group dies with the call, whatever happens."""
        out_path = scratch / OUTPUT_LOG
        env = clean_env(self.allowed, self.engine_secret)
        jail: Jail | None = None
        if self.sandbox is not None:
            view = View(
                writable=(workdir, scratch, *self.paths),
                harness=False,
                network=True,
                extra_readable=program_files(argv, (workdir, scratch)),
                home=Path.home() if self.paths else None,
            )
            jail = Jail(self.sandbox, view, cuda=False)  # no runner watches its memory: RLIMIT_AS without a cgroup
            command, env = jail.command(argv, workdir), jail.env(env)
        else:
            command = argv
        with open(out_path, "wb") as out:
            try:
                proc = subprocess.Popen(
                    command,
                    cwd=workdir,
                    env=env,
                    start_new_session=True,
                    preexec_fn=lambda: _enter(jail),
                    stdin=subprocess.PIPE if stdin_text is not None else subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                )
            except (FileNotFoundError, PermissionError) as err:
                if jail is not None:
                    jail.close()
                raise AgentConfigError(
                    f"cannot start the CLI agent `{argv[0]}`: {err.strerror}\n"
                    "  fix: install it, or choose another with agent.cli_template / agent.cli_command"
                ) from None
            try:
                if stdin_text is not None:
                    try:
                        proc.stdin.write(stdin_text.encode())  # type: ignore[union-attr]
                        proc.stdin.close()  # type: ignore[union-attr]
                    except BrokenPipeError:
                        pass  # the command does not read stdin; its exit status tells the rest
                proc.wait(timeout=self.timeout_s)
            except subprocess.TimeoutExpired:
                _kill_group(proc)
                raise AgentError(
                    f"`{argv[0]}` ran past agent.cli_timeout_s={self.timeout_s:g}s and was killed "
                    f"(its whole process group): {_tail(_redact(out_path.read_text(errors='replace')))}"
                ) from None
            finally:
                _kill_group(proc)  # helpers it left behind (language servers, daemons) go too
                if jail is not None:
                    jail.close()
        output = _redact(out_path.read_text(errors="replace"))
        if proc.returncode != 0:
            raise AgentError(f"`{argv[0]}` exited with code {proc.returncode}: {_tail(output) or 'no output'}")
        return output


def _count(usage: Usage, prompt: str, answer: str) -> None:
    """Add one call to `usage`, its tokens estimated (a CLI reports none): 4 characters a token."""
    usage.calls += 1
    usage.tokens_in += len(prompt) // 4
    usage.tokens_out += len(answer) // 4
    usage.estimated = True


def program_files(argv: list[str], inside: tuple[Path, ...]) -> tuple[Path, ...]:
    """The folders of the command's own files (its program, a script it runs), for the sandbox to show read-only."""
    folders = set()
    for token in [shutil.which(argv[0]) or argv[0], *argv[1:]]:
        path = Path(token)
        if (
            path.is_absolute()
            and path.is_file()
            and not any(path.resolve().is_relative_to(p.resolve()) for p in inside)
        ):
            folders.add(path.resolve().parent)
    return tuple(sorted(folders))


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the command's process group, give it a moment, SIGKILL what is left; reap the command."""
    for sig, grace in ((signal.SIGTERM, TERM_GRACE_S), (signal.SIGKILL, None)):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            break  # the group is gone
        if grace is not None:
            try:
                proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                pass
    proc.wait()


def _remove_tool_litter(parent: Path, workdir: Path) -> None:
    """New hidden files and folders (`.aider*`, `.cache`...) are the tool's bookkeeping, not the child's code."""
    before = {p.relative_to(parent) for p in parent.rglob("*")}
    for path in sorted(workdir.rglob("*"), key=lambda p: len(p.parts)):
        relative = path.relative_to(workdir)
        if relative in before or not path.exists():
            continue
        if any(part.startswith(".") for part in relative.parts):
            shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()


def _redact(text: str) -> str:
    """A tool may print a key it was given (or found); what it says goes into logs and the KB, so keys become ***."""
    for name, value in os.environ.items():
        if SECRET_ENV.search(name) and len(value) >= 8:
            text = text.replace(value, "***")
    return text


def _tail(text: str) -> str:
    text = text.strip()
    return ("..." + text[-TAIL_CHARS:]) if len(text) > TAIL_CHARS else text


def _enter(jail: Jail | None) -> None:
    """In the agent's child, before exec: its session's autogroup keeps the breeder's niceness, then the jail."""
    keep_niceness_in_session()
    if jail is not None:
        jail.enter()
