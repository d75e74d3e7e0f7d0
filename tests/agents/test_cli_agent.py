"""The CLI backend with a scripted coding agent (a small Python program) and the shipped command templates."""

from __future__ import annotations

import json
import re
import sys
import textwrap
import time
from pathlib import Path

import pytest
from llm_server import parent, workdir  # noqa: F401 - fixtures
from procs import pid_alive

from ralph_ray.agents.base import AgentConfigError, AgentError, Diagnosis, ParentView, Recommendation, Usage
from ralph_ray.agents.cli import CliCoder, command_line, load_template
from ralph_ray.cli_templates import TEMPLATES_DIR
from ralph_ray.config import AgentBackend, AgentConfig

REC = Recommendation("add_dropout", Diagnosis.overfitting, "the classifier overfits", 0.9, "set DROPOUT = 0.25")
AGENT = textwrap.dedent("""\
    import json, os, pathlib, subprocess, sys, time
    prompt = pathlib.Path(sys.argv[1]).read_text() if len(sys.argv) > 1 else sys.stdin.read()
    out = pathlib.Path(os.environ["CLI_TEST_OUT"])
    out.mkdir(exist_ok=True)
    (out / "prompt.md").write_text(prompt)
    (out / "env.json").write_text(json.dumps(sorted(os.environ)))
    (out / "cwd.txt").write_text(os.getcwd())
    mode = os.environ["CLI_TEST_MODE"]
    train = pathlib.Path("train.py")
    if mode == "edit":
        train.write_text(train.read_text().replace("DROPOUT = 0.0", "DROPOUT = 0.25"))
        pathlib.Path(".agent-cache").mkdir()
        pathlib.Path(".agent-cache/index").write_text("the tool's own bookkeeping")
        print("I raised the dropout before the classifier to 0.25.")
    elif mode == "nothing":
        print("I looked around and changed nothing.")
    elif mode == "fail":
        print("model overloaded, try later", file=sys.stderr)
        sys.exit(3)
    elif mode == "hang":
        helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
        (out / "helper.pid").write_text(str(helper.pid))
        time.sleep(120)
""")


@pytest.fixture()
def scripted_agent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The agent program; it reports what it saw (prompt, environment, cwd) under the returned folder."""
    (tmp_path / "agent.py").write_text(AGENT)
    out = tmp_path / "agent-saw"
    monkeypatch.setenv("CLI_TEST_OUT", str(out))
    monkeypatch.setenv("CLI_TEST_MODE", "edit")
    return out


def cli_config(tmp_path: Path, command: str | None = None, **overrides) -> AgentConfig:
    command = command or f"{sys.executable} {tmp_path / 'agent.py'} {{prompt_file}}"
    return AgentConfig(**{"backend": AgentBackend.cli, "cli_command": command, "cli_timeout_s": 30.0, **overrides})


def test_scripted_agent_edits_the_work_dir(scripted_agent: Path, tmp_path: Path, parent: ParentView, workdir: Path):
    usage = Usage()
    draft = CliCoder(cli_config(tmp_path)).write(parent, REC, workdir, None, usage)

    assert "DROPOUT = 0.25  # dropout before the classifier" in (workdir / "train.py").read_text()
    assert draft.interventions == ["add_dropout"] and "raised the dropout" in draft.rationale
    assert not (workdir / ".agent-cache").exists()  # the tool's hidden litter is not part of the child
    assert Path((scripted_agent / "cwd.txt").read_text()).resolve() == workdir.resolve()
    prompt = (scripted_agent / "prompt.md").read_text()
    assert (
        "set DROPOUT = 0.25" in prompt and "Read or guess selection/test labels" in prompt
    )  # recommendation + program.md
    assert "All else equal, simpler wins" in prompt and "Edit only these files: train.py" in prompt
    assert (
        usage.calls == 1
        and usage.estimated
        and usage.tokens_in == len(prompt) // 4
        and usage.tokens_out > 0
        and usage.seconds > 0
    )


def test_gate_feedback_reaches_the_prompt(scripted_agent: Path, tmp_path: Path, parent: ParentView, workdir: Path):
    CliCoder(cli_config(tmp_path)).write(
        parent, REC, workdir, "train.py does not parse: invalid syntax at line 40", Usage()
    )
    assert (
        "The validation gate said: train.py does not parse: invalid syntax at line 40"
        in (scripted_agent / "prompt.md").read_text()
    )


def test_prompt_goes_to_stdin_without_a_placeholder(
    scripted_agent: Path, tmp_path: Path, parent: ParentView, workdir: Path
):
    CliCoder(cli_config(tmp_path, f"{sys.executable} {tmp_path / 'agent.py'}")).write(
        parent, REC, workdir, None, Usage()
    )
    assert "set DROPOUT = 0.25" in (scripted_agent / "prompt.md").read_text()


def test_environment_holds_no_engine_secrets(
    scripted_agent: Path, tmp_path: Path, parent: ParentView, workdir: Path, monkeypatch: pytest.MonkeyPatch
):
    for name in ("ENGINE_API_KEY", "SOME_SERVICE_TOKEN", "DB_PASSWORD", "ALLOWED_TOKEN"):
        monkeypatch.setenv(name, "x" * 12)
    cfg = cli_config(tmp_path, api_key_env="ENGINE_API_KEY", cli_env=["ALLOWED_TOKEN"])
    CliCoder(cfg).write(parent, REC, workdir, None, Usage())
    seen = set(json.loads((scripted_agent / "env.json").read_text()))
    assert not seen & {"ENGINE_API_KEY", "SOME_SERVICE_TOKEN", "DB_PASSWORD"}
    assert {"ALLOWED_TOKEN", "PATH", "CLI_TEST_OUT"} <= seen


def test_timeout_kills_the_whole_process_group(
    scripted_agent: Path, tmp_path: Path, parent: ParentView, workdir: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("CLI_TEST_MODE", "hang")
    start = time.monotonic()
    usage = Usage()
    with pytest.raises(AgentError, match=r"ran past agent.cli_timeout_s=1s and was killed \(its whole process group\)"):
        CliCoder(cli_config(tmp_path, cli_timeout_s=1.0)).write(parent, REC, workdir, None, usage)
    assert time.monotonic() - start < 8
    # the call it made up to its timeout counts (its tokens were spent): before, none did
    prompt = (scripted_agent / "prompt.md").read_text()
    assert usage.calls == 1 and usage.estimated and usage.tokens_in == len(prompt) // 4 and usage.seconds >= 1
    helper = int((scripted_agent / "helper.pid").read_text())
    deadline = time.monotonic() + 5
    while pid_alive(helper) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not pid_alive(helper)


@pytest.mark.parametrize(
    "mode, message, said",
    [  # said: what the scripted agent printed (its output counts as tokens out)
        ("fail", "exited with code 3: model overloaded, try later", "model overloaded, try later"),
        ("nothing", "exited cleanly but changed nothing: I looked around", "I looked around and changed nothing."),
    ],
)
def test_failed_or_idle_agent_rejects_the_child(
    scripted_agent: Path,
    tmp_path: Path,
    parent: ParentView,
    workdir: Path,
    monkeypatch: pytest.MonkeyPatch,
    mode: str,
    message: str,
    said: str,
):
    monkeypatch.setenv("CLI_TEST_MODE", mode)
    usage = Usage()
    with pytest.raises(AgentError, match=re.escape(message)):
        CliCoder(cli_config(tmp_path)).write(parent, REC, workdir, None, usage)
    # a failed call still spent its tokens: counted (estimated) whatever its end; before, a command that exited with
    # an error counted no call and no tokens, and the budgets and agent_usage never saw them
    prompt = (scripted_agent / "prompt.md").read_text()
    assert usage.calls == 1 and usage.estimated and usage.seconds > 0
    assert usage.tokens_in == len(prompt) // 4 and usage.tokens_out >= len(said) // 4 > 0


def test_missing_command_is_a_config_error(tmp_path: Path, parent: ParentView, workdir: Path):
    coder = CliCoder(cli_config(tmp_path, "no-such-coding-agent-xyz {prompt_file}"))
    with pytest.raises(AgentConfigError, match="`no-such-coding-agent-xyz` .* is not on PATH"):
        coder.check()
    with pytest.raises(AgentConfigError, match="cannot start the CLI agent"):
        coder.write(parent, REC, workdir, None, Usage())


@pytest.mark.parametrize("name", sorted(p.stem for p in TEMPLATES_DIR.glob("*.yaml") if p.stem != "generic"))
def test_shipped_templates_build_a_command_line(name: str):
    template = load_template(AgentConfig(backend=AgentBackend.cli, cli_template=name))
    values = {"prompt": "do it", "prompt_file": "/tmp/p.md", "model": "some-model", "workdir": "/w", "scratch": "/s"}
    argv = command_line(template, values, ["train.py", "model.py"], "some-model")
    assert argv[0] == {"claude": "claude", "codex": "codex", "aider": "aider", "opencode": "opencode"}[name]
    assert not any("{" in arg for arg in argv) and "some-model" in argv
    assert ("do it" in argv) or ("/tmp/p.md" in argv)
    assert all(f.endswith("_KEY") or f.endswith("_TOKEN") for f in template.env)


def test_generic_template_needs_a_command():
    with pytest.raises(AgentConfigError, match="set agent.cli_command"):
        load_template(AgentConfig(backend=AgentBackend.cli, cli_template="generic"))
