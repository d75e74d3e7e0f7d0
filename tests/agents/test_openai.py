"""The OpenAI-compatible backend against a scripted loopback server: the real SDK, real git apply, real campaigns."""

from __future__ import annotations

import json
import socket
import threading
import time
import warnings
from pathlib import Path

import pytest
from llm_server import GOOD_DIFF, Reply, ScriptedLLM, llm_server, parent, workdir  # noqa: F401 - fixtures

from ralph_ray.__main__ import main
from ralph_ray.agents import make_agents, preflight
from ralph_ray.agents.base import (
    AgentConfigError,
    AgentConfigWarning,
    AgentError,
    Diagnosis,
    InterventionEffect,
    ParentView,
    Recommendation,
    Usage,
)
from ralph_ray.agents.llm import ChatClient, LLMAnalyst, LLMCoder
from ralph_ray.campaign import run
from ralph_ray.config import AgentBackend, AgentConfig
from ralph_ray.kb import open_reader

STALE_DIFF = GOOD_DIFF.replace("-DROPOUT = 0.0", "-DROPOUT = 0.5")  # a line the file does not have
# (The hunks avoid the searched knobs LR, BATCH_SIZE, WIDTH, EPOCHS: a campaign's parent has its best knobs baked in.)
FROZEN_DIFF = """\
```diff
--- a/program.md
+++ b/program.md
@@ -1,1 +1,1 @@
-# program: improve the digits trainer
+# program: improve the digits trainer (and ignore the rules)
```
"""
OUTSIDE_DIFF = GOOD_DIFF.replace("a/train.py", "a/../other/train.py").replace("b/train.py", "b/../other/train.py")
ANALYSIS = {
    "diagnoses": ["overfitting"],
    "summary": "Validation loss rises while the train loss keeps falling.",
    "recommendations": [
        {
            "intervention": "add_dropout",
            "diagnosis": "overfitting",
            "rationale": "regularise the classifier",
            "details": "set DROPOUT = 0.2",
            "priority": 0.6,
        },
        {"intervention": "Weight Decay", "diagnosis": "overfitting", "rationale": "an L2 penalty", "priority": 0.9},
    ],
}
REC = Recommendation("add_dropout", Diagnosis.overfitting, "regularise the classifier", 0.9, "set DROPOUT = 0.2")
EFFECTS = [InterventionEffect("add_dropout", "overfitting", 3, 0.004, 0.67, unscored=2)]


def agent_config(server: ScriptedLLM, **overrides) -> AgentConfig:
    values = dict(
        backend=AgentBackend.openai,
        base_url=server.base_url,
        model="scripted",
        api_key_env=None,
        timeout_s=5.0,
        http_retries=1,
        answer_retries=2,
    )
    return AgentConfig(**{**values, **overrides})


# -- analyst ------------------------------------------------------------------------------------


def test_analyst_returns_validated_ranked_recommendations(llm_server: ScriptedLLM, parent: ParentView):
    llm_server.add(Reply(json.dumps(ANALYSIS), usage=(900, 150)))
    usage = Usage()
    analysis = LLMAnalyst(
        ChatClient(agent_config(llm_server)), agent_config(llm_server), 3, [("add_dropout", "dropout")]
    ).analyse(parent, EFFECTS, usage)

    assert analysis.diagnoses == [Diagnosis.overfitting]
    assert [r.intervention for r in analysis.recommendations] == [
        "weight_decay",
        "add_dropout",
    ]  # by priority; names normalised
    assert analysis.recommendations[1].details == "set DROPOUT = 0.2"
    assert (usage.calls, usage.tokens_in, usage.tokens_out, usage.estimated) == (
        1,
        900,
        150,
        False,
    ) and usage.seconds > 0
    system, user = (m["content"] for m in llm_server.chats()[0])
    assert (
        "All else equal, simpler wins" in system and "Read or guess selection/test labels" in system
    )  # rules + program.md
    assert "harness.save_predictions" in user and "| 8 |" in user  # the parent's code and its curve
    assert "| add_dropout | overfitting | 3 | 0.004 | 0.67 | 2 |" in user  # the KB's effects, unscored tries too


def test_malformed_analysis_goes_back_with_the_error(llm_server: ScriptedLLM, parent: ParentView):
    bad_diagnosis = {**ANALYSIS, "diagnoses": ["sleepy"]}
    llm_server.add(
        "Sure! Here is my analysis: {diagnoses: overfitting}",
        json.dumps(bad_diagnosis),
        "```json\n" + json.dumps(ANALYSIS) + "\n```",
    )
    usage = Usage()
    analysis = LLMAnalyst(ChatClient(agent_config(llm_server)), agent_config(llm_server), 3, []).analyse(
        parent, [], usage
    )

    assert analysis.recommendations and usage.calls == 3 and usage.tokens_in == 3 * 120
    second, third = llm_server.chats()[1], llm_server.chats()[2]
    assert "not valid JSON" in second[-1]["content"] and second[-2]["role"] == "assistant"
    assert "'sleepy' is not one of underfitting" in third[-1]["content"]


def test_analyst_gives_up_after_bounded_retries(llm_server: ScriptedLLM, parent: ParentView):
    llm_server.add(*[json.dumps({"diagnoses": ["overfitting"], "summary": "x"})] * 3)
    cfg = agent_config(llm_server, answer_retries=2)
    with pytest.raises(AgentError, match="still invalid after 3 tries: missing key 'recommendations'"):
        LLMAnalyst(ChatClient(cfg), cfg, 3, []).analyse(parent, [], Usage())
    assert len(llm_server.requests) == 3


# -- coder --------------------------------------------------------------------------------------


def test_coder_applies_a_diff_with_git(llm_server: ScriptedLLM, parent: ParentView, workdir: Path):
    llm_server.add(GOOD_DIFF)
    usage = Usage()
    draft = LLMCoder(ChatClient(agent_config(llm_server)), agent_config(llm_server)).write(
        parent, REC, workdir, None, usage
    )

    assert "DROPOUT = 0.2  # dropout before the classifier" in (workdir / "train.py").read_text()
    assert draft.interventions == ["add_dropout"] and "dropout before the classifier to 0.2" in draft.rationale
    assert usage.calls == 1 and usage.tokens == 150
    system, user = (m["content"] for m in llm_server.chats()[0])
    assert "```diff" in system and "train.py" in system and "set DROPOUT = 0.2" in user and "def main()" in user


def test_diff_that_does_not_apply_is_retried_with_gits_error(
    llm_server: ScriptedLLM, parent: ParentView, workdir: Path
):
    llm_server.add(STALE_DIFF, GOOD_DIFF)
    usage = Usage()
    LLMCoder(ChatClient(agent_config(llm_server)), agent_config(llm_server)).write(parent, REC, workdir, None, usage)

    assert "DROPOUT = 0.2" in (workdir / "train.py").read_text() and usage.calls == 2
    retry = llm_server.chats()[1]
    assert retry[-2]["content"] == STALE_DIFF and "patch does not apply" in retry[-1]["content"]


def test_diff_that_never_applies_rejects_the_child(llm_server: ScriptedLLM, parent: ParentView, workdir: Path):
    llm_server.add(STALE_DIFF, "no diff, sorry")
    cfg = agent_config(llm_server, answer_retries=1)
    with pytest.raises(AgentError, match="no applicable diff after 2 tries: no unified diff found"):
        LLMCoder(ChatClient(cfg), cfg).write(parent, REC, workdir, None, Usage())
    assert (workdir / "train.py").read_text() == (parent.files_dir / "train.py").read_text()  # git apply is atomic


def test_a_malformed_diffs_refusal_is_one_line(llm_server: ScriptedLLM, parent: ParentView, workdir: Path):
    """User trial: the reason a child was refused for a malformed diff spanned two lines in the log and the KB (git's
    stderr as it came: a recount warning, a blank line, then the error). It is one line, git's error first."""
    corrupt = GOOD_DIFF.replace("+DROPOUT = 0.2", "DROPOUT = 0.2")  # a line with no ' ', '+' or '-' in a hunk
    llm_server.add(STALE_DIFF, corrupt)
    cfg = agent_config(llm_server, answer_retries=1)
    with pytest.raises(AgentError) as info:
        LLMCoder(ChatClient(cfg), cfg).write(parent, REC, workdir, None, Usage())
    reason = str(info.value)
    assert "\n" not in reason, reason
    assert reason.startswith("no applicable diff after 2 tries: error: corrupt patch at line")
    assert reason.endswith("; warning: recount: unexpected line: DROPOUT = 0.2  # dropout before the classifier")
    told = llm_server.chats()[1][-1]["content"]  # the stale diff's refusal, as the model was told it
    assert told.startswith(
        "That diff does not apply: error: patch failed: train.py:24; error: train.py: patch does not apply\n"
    )


def test_diff_touching_a_frozen_file_is_refused(llm_server: ScriptedLLM, parent: ParentView, workdir: Path):
    llm_server.add(FROZEN_DIFF)
    with pytest.raises(AgentError, match="frozen file 'program.md'"):
        LLMCoder(ChatClient(agent_config(llm_server)), agent_config(llm_server)).write(
            parent, REC, workdir, None, Usage()
        )
    assert len(llm_server.requests) == 1  # refused outright, not retried
    assert (workdir / "program.md").read_text() == (parent.files_dir / "program.md").read_text()


def test_diff_reaching_outside_goes_back_to_the_model_and_never_writes_there(
    llm_server: ScriptedLLM, parent: ParentView, workdir: Path
):
    """User trial: `a/../train.py` was refused outright with a retry left; now it goes back like a diff that does not
    apply, and a model that keeps at it still writes nothing outside the work dir."""
    escape = GOOD_DIFF.replace("a/train.py", "a/../train.py").replace("b/train.py", "b/../train.py")
    llm_server.add(escape, GOOD_DIFF)
    LLMCoder(ChatClient(agent_config(llm_server)), agent_config(llm_server)).write(parent, REC, workdir, None, Usage())
    assert "DROPOUT = 0.2" in (workdir / "train.py").read_text() and len(llm_server.requests) == 2
    assert "'../train.py', outside the trainer folder" in llm_server.chats()[1][-1]["content"]
    assert not (workdir.parent / "train.py").exists()

    (workdir / "train.py").write_text((parent.files_dir / "train.py").read_text())
    llm_server.add(OUTSIDE_DIFF, OUTSIDE_DIFF, OUTSIDE_DIFF)
    with pytest.raises(AgentError, match="no applicable diff after 3 tries: .*outside the trainer folder"):
        LLMCoder(ChatClient(agent_config(llm_server)), agent_config(llm_server)).write(
            parent, REC, workdir, None, Usage()
        )
    assert not (workdir.parent / "other").exists()
    assert (workdir / "train.py").read_text() == (parent.files_dir / "train.py").read_text()


def test_repository_paths_are_cut_to_the_variants_file(llm_server: ScriptedLLM, parent: ParentView, workdir: Path):
    """User trial: `a/trainers/digits/train.py` (the repository's path) failed in git; its tail names train.py."""
    repo = GOOD_DIFF.replace("a/train.py", "a/trainers/digits/train.py").replace(
        "b/train.py", "b/trainers/digits/train.py"
    )
    llm_server.add(repo)
    LLMCoder(ChatClient(agent_config(llm_server)), agent_config(llm_server)).write(parent, REC, workdir, None, Usage())
    assert "DROPOUT = 0.2" in (workdir / "train.py").read_text() and len(llm_server.requests) == 1
    assert not (workdir / "trainers").exists()


def test_a_whole_file_answer_is_diffed_by_the_engine(llm_server: ScriptedLLM, parent: ParentView, workdir: Path):
    """User trial: small local models answer with the whole file in a ```python block; it was refused 3 times."""
    source = (parent.files_dir / "train.py").read_text()
    edited = source.replace("DROPOUT = 0.0", "DROPOUT = 0.2")
    snippet = "def main() -> None:\n    pass\n"  # a fragment, not the file: it must not replace the file
    llm_server.add(
        f"Here is part of it:\n\n```python\n{snippet}```\n",
        f"Here is the updated train.py with dropout 0.2:\n\n```python\n{edited}```\n",
    )
    draft = LLMCoder(ChatClient(agent_config(llm_server)), agent_config(llm_server)).write(
        parent, REC, workdir, None, Usage()
    )
    assert (workdir / "train.py").read_text() == edited and len(llm_server.requests) == 2
    assert "not clearly the whole of" in llm_server.chats()[1][-1]["content"]
    assert draft.rationale.startswith("(answered with the whole of train.py; the engine diffed it)")


def test_gate_feedback_continues_the_conversation(llm_server: ScriptedLLM, parent: ParentView, workdir: Path):
    coder = LLMCoder(ChatClient(agent_config(llm_server)), agent_config(llm_server))
    llm_server.add(GOOD_DIFF, GOOD_DIFF.replace("0.2", "0.1"))
    coder.write(parent, REC, workdir, None, Usage())
    (workdir / "train.py").write_text((parent.files_dir / "train.py").read_text())  # the engine re-copies the parent
    coder.write(parent, REC, workdir, "smoke run failed: RuntimeError: shape mismatch", Usage())

    again = llm_server.chats()[1]
    assert again[2] == {"role": "assistant", "content": GOOD_DIFF}  # the diff the gate judged
    assert "validation gate refused the result: smoke run failed: RuntimeError: shape mismatch" in again[3]["content"]
    assert "DROPOUT = 0.1" in (workdir / "train.py").read_text()


# -- transport ----------------------------------------------------------------------------------


def test_rate_limit_is_retried_with_backoff(llm_server: ScriptedLLM, parent: ParentView, workdir: Path):
    llm_server.add(Reply(status=429, error="slow down", headers={"retry-after-ms": "50"}), GOOD_DIFF)
    usage = Usage()
    LLMCoder(ChatClient(agent_config(llm_server)), agent_config(llm_server)).write(parent, REC, workdir, None, usage)
    assert len(llm_server.requests) == 2 and usage.calls == 1


def test_server_error_after_retries_is_a_clear_agent_error(llm_server: ScriptedLLM):
    llm_server.add(Reply(status=503, error="overloaded"), Reply(status=503, error="overloaded"))
    with pytest.raises(AgentError, match="HTTP 503: overloaded"):
        ChatClient(agent_config(llm_server, http_retries=1)).chat([{"role": "user", "content": "hi"}], Usage())


def test_timeout_is_an_agent_error_naming_the_setting(llm_server: ScriptedLLM):
    llm_server.add(Reply("late", delay_s=3.0))
    usage = Usage()
    start = time.monotonic()
    with pytest.raises(AgentError, match=r"within agent.timeout_s=0.4s \(1 tries\)"):
        ChatClient(agent_config(llm_server, timeout_s=0.4, http_retries=0)).chat(
            [{"role": "user", "content": "hi"}], usage
        )
    assert time.monotonic() - start < 2.5 and usage.calls == 0 and usage.seconds >= 0.4


def test_wrong_key_names_the_variable_and_never_the_key(llm_server: ScriptedLLM, monkeypatch: pytest.MonkeyPatch):
    llm_server.key = "sk-right-key-0000"
    monkeypatch.setenv("MY_LLM_KEY", "sk-wrong-key-1234")
    client = ChatClient(agent_config(llm_server, api_key_env="MY_LLM_KEY"))
    for call in (client.preflight, lambda: client.chat([{"role": "user", "content": "hi"}], Usage())):
        with pytest.raises(AgentConfigError) as info:
            call()
        assert "refused the key in $MY_LLM_KEY (HTTP 401" in str(info.value) and "fix:" in str(info.value)
        assert "sk-wrong-key-1234" not in str(info.value)


def test_unreachable_endpoint_is_a_config_error():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # nothing listens here once the socket closes
    cfg = AgentConfig(
        backend=AgentBackend.openai, base_url=f"http://127.0.0.1:{port}/v1", model="m", api_key_env=None, http_retries=0
    )
    with pytest.raises(AgentConfigError, match=f"cannot reach the LLM endpoint http://127.0.0.1:{port}/v1"):
        ChatClient(cfg).preflight()


def test_a_base_url_without_v1_is_refused_at_preflight_naming_the_fix(llm_server: ScriptedLLM):
    """User trial: agent.base_url=http://127.0.0.1:8000 for a server of /v1/models and /v1/chat/completions passed
    the preflight (its GET /models 404 read as "no /models here"); the seed trained and the first chat call 404ed."""
    root = llm_server.base_url.removesuffix("/v1")
    for url in (root, root + "/"):
        with pytest.raises(AgentConfigError, match=rf"agent.base_url should end in /v1: {root}/v1$") as info:
            ChatClient(agent_config(llm_server, base_url=url)).preflight()
        assert "\n" not in str(info.value)
    assert llm_server.gets == ["/models", "/v1/models"] * 2 and llm_server.requests == []


def test_a_server_that_serves_no_models_list_still_passes_the_preflight(llm_server: ScriptedLLM):
    # Some proxies serve chat completions but no GET /models: a 404 there, and at <base_url>/v1/models, is no refusal.
    ChatClient(agent_config(llm_server, base_url=llm_server.base_url.removesuffix("/v1") + "/api")).preflight()
    assert llm_server.gets == ["/api/models", "/api/v1/models"]


def test_missing_usage_is_estimated_and_marked(llm_server: ScriptedLLM):
    llm_server.add(Reply("x" * 400, usage=None))
    usage = Usage()
    ChatClient(agent_config(llm_server)).chat([{"role": "user", "content": "y" * 800}], usage)
    assert (usage.tokens_in, usage.tokens_out, usage.estimated) == (200, 100, True)


def test_one_client_serves_concurrent_children(llm_server: ScriptedLLM, parent: ParentView, tmp_path: Path):
    import shutil

    llm_server.add(*[GOOD_DIFF] * 8)
    coder = LLMCoder(ChatClient(agent_config(llm_server)), agent_config(llm_server))
    usages, errors = [Usage() for _ in range(8)], []

    def write(i: int) -> None:
        work = tmp_path / f"child{i}"
        shutil.copytree(parent.files_dir, work)
        try:
            coder.write(parent, REC, work, None, usages[i])
        except Exception as err:  # noqa: BLE001 - collected and asserted below
            errors.append(err)

    threads = [threading.Thread(target=write, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and all(u.calls == 1 and u.tokens == 150 for u in usages)


# -- campaigns ----------------------------------------------------------------------------------


def campaign_overrides(server: ScriptedLLM, *extra: str) -> list[str]:
    return [
        "agent=openai",
        f"agent.base_url={server.base_url}",
        "agent.model=scripted",
        "agent.api_key_env=null",
        "agent.timeout_s=10",
        "agent.http_retries=1",
        "safeguards.max_cycles=2",
        "population.mode=generations",  # the barrier loop's cycle folders and records (the default auto runs async)
        "population.parents=1",
        "population.children_per_parent=1",
        "population.trials_per_child=1",
        "search.num_samples=2",
        *extra,
    ]


@pytest.mark.slow
def test_two_cycle_campaign_trains_llm_children_and_records_usage(ray_session, tiny_config, llm_server: ScriptedLLM):
    llm_server.add(Reply(json.dumps(ANALYSIS), usage=(1000, 200)), Reply(GOOD_DIFF, usage=(700, 90)))
    cfg = tiny_config(*campaign_overrides(llm_server), "run_id=llm-e2e")
    outcome = run(cfg)

    assert outcome.stop_reason == "max_cycles" and int(outcome.exit_code) == 0
    con = open_reader(Path(cfg.paths.kb))
    child = con.execute(
        "select variant_id, status, interventions, diff from variants where run_id = ? and cycle = 2", ["llm-e2e"]
    ).fetchall()
    assert len(child) == 1 and child[0][1] in ("kept", "discarded") and json.loads(child[0][2]) == ["weight_decay"]
    assert "+DROPOUT = 0.2" in child[0][3]
    trained = con.execute(
        "select count(*) from trials where run_id = ? and variant_id = ?", ["llm-e2e", child[0][0]]
    ).fetchone()[0]
    assert trained == 1
    usage = con.execute(
        "select role, backend, calls, tokens_in, tokens_out, estimated from agent_usage where run_id = ? order by role",
        ["llm-e2e"],
    ).fetchall()
    assert usage == [("analyst", "openai", 1, 1000, 200, False), ("coder", "openai", 1, 700, 90, False)]
    assert len(llm_server.requests) == 2 and llm_server.gets == ["/v1/models"]  # one preflight probe per start


@pytest.mark.slow
def test_a_key_revoked_while_children_are_written_records_what_the_written_ones_spent(
    ray_session, tiny_config, llm_server: ScriptedLLM
):
    """The first child is written and gated, then the key is refused: the campaign ends (AgentConfigError, exit 2)
    before the cycle's children are recorded, and the first child's paid call went with them (a resume's budget read
    less than was spent). What the attempts spent is its own agent_usage row now."""
    refused = [Reply(status=401, error="Incorrect API key provided.")] * 4
    llm_server.add(Reply(json.dumps(ANALYSIS), usage=(1000, 200)), Reply(GOOD_DIFF, usage=(700, 90)), *refused)
    cfg = tiny_config(
        *campaign_overrides(llm_server, "population.children_per_parent=2", "agent.concurrency=1"), "run_id=revoked"
    )
    with pytest.raises(AgentConfigError, match="HTTP 401"):  # the CLI's exit 2 (it used to reject the child only,
        run(cfg)  # as a crashing coder's, and the campaign called the refusing endpoint for each next child)

    assert len(llm_server.requests) == 3  # the analysis, the first child, the refused second
    usage = (
        open_reader(Path(cfg.paths.kb))
        .execute(
            """select role, variant_id, sum(tokens_in), sum(tokens_out) from agent_usage where run_id = ?
           group by all order by role""",
            ["revoked"],
        )
        .fetchall()
    )
    assert [row[0] for row in usage] == ["analyst", "coder"]
    assert usage[1][1:] == ("interrupted", 700, 90)


@pytest.mark.slow
def test_token_budget_stops_the_campaign_with_exit_code_2(
    ray_session,
    tiny_config,
    llm_server: ScriptedLLM,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
):
    llm_server.add(Reply(json.dumps(ANALYSIS), usage=(5000, 500)), Reply(GOOD_DIFF, usage=(3000, 100)))
    monkeypatch.chdir(tmp_path)
    base = [
        f"paths.runs={tmp_path / 'runs'}",
        f"paths.kb={tmp_path / 'kb'}",
        "scheduler.max_t=4",
        "scheduler.grace_period=1",
        "+search.space.EPOCHS={type: choice, values: [4]}",
        "safeguards.replicates=0",  # one trial decides: the budget counts agent tokens, replicates call no agent
        "run_id=budget",
    ]
    code = main(base + campaign_overrides(llm_server, "safeguards.max_cycles=4", "safeguards.tokens_per_campaign=1000"))

    assert code == 2
    decision = json.loads((tmp_path / "runs" / "budget" / "cycle_0002" / "decision.json").read_text())
    # The analysis alone spent the budget: the coder is never called (it was, for 3100 more tokens, before the budget
    # was checked before each call).
    assert decision["reason"] == "token_budget" and decision["tokens_campaign"] == 5500
    assert len(llm_server.requests) == 1
    assert "token_budget" in capsys.readouterr().out


@pytest.mark.slow
def test_an_endpoint_that_fails_mid_run_leaves_its_exit_code_for_status(
    ray_session, llm_server: ScriptedLLM, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
):
    """User trial: a run that ended at its first chat call (a 404: exit 2) showed `stopped: ... (exit None)` in
    `status`, as the crash was recorded without its exit code; and its start probed GET /models twice."""
    llm_server.add(Reply(status=404, error="model 'scripted' not found"))
    monkeypatch.chdir(tmp_path)
    where = [f"paths.runs={tmp_path / 'runs'}", f"paths.kb={tmp_path / 'kb'}"]
    tiny = ["scheduler.max_t=2", "scheduler.grace_period=1", "+search.space.EPOCHS={type: choice, values: [2]}"]
    code = main([*where, *tiny, *campaign_overrides(llm_server), "safeguards.replicates=0", "run_id=gone"])
    assert code == 2 and "answered 404 for model 'scripted'" in capsys.readouterr().err
    assert llm_server.gets == ["/v1/models"] and len(llm_server.requests) == 1  # one probe, one chat call
    assert main(["status", "gone", *where]) == 0
    shown = " ".join(capsys.readouterr().out.split())
    assert "run gone: crashed" in shown and "stopped: AgentConfigError: the LLM endpoint" in shown, shown
    assert shown.count("(exit 2)") == 1 and "exit None" not in shown


def test_wrong_key_stops_before_training_with_exit_code_2(
    llm_server: ScriptedLLM, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
):
    llm_server.key = "sk-right-key-0000"
    monkeypatch.setenv("RALPH_TEST_LLM_KEY", "sk-wrong-key-5678")
    monkeypatch.chdir(tmp_path)
    code = main(
        [
            f"paths.runs={tmp_path / 'runs'}",
            f"paths.kb={tmp_path / 'kb'}",
            "agent=openai",
            f"agent.base_url={llm_server.base_url}",
            "agent.model=scripted",
            "agent.api_key_env=RALPH_TEST_LLM_KEY",
            "run_id=badkey",
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and "RALPH_TEST_LLM_KEY" in err and "sk-wrong-key-5678" not in err
    assert not list((tmp_path / "runs" / "badkey").glob("cycle_*"))  # nothing trained


def test_make_agents_builds_the_openai_pair_after_a_preflight(llm_server: ScriptedLLM, tiny_config):
    cfg = tiny_config(*campaign_overrides(llm_server))
    analyst, coder = make_agents(cfg)
    assert isinstance(analyst, LLMAnalyst) and isinstance(coder, LLMCoder) and analyst.chat is coder.chat
    assert analyst.n_recommendations == 3  # children_per_parent + spares for duplicates


def test_a_campaign_start_probes_the_endpoint_once(llm_server: ScriptedLLM, tiny_config):
    """User trial: GET /models twice per start (campaign.run's preflight, then the loop's make_agents). The loop's
    agents reuse the preflight's check; agents built without one still check their endpoint."""
    cfg = tiny_config(*campaign_overrides(llm_server))
    preflight(cfg)  # campaign.run, before anything of the run is written
    make_agents(cfg, "r1")  # generations.Campaign, for the loop
    assert llm_server.gets == ["/v1/models"]
    make_agents(tiny_config(*campaign_overrides(llm_server)))  # no preflight before it: it checks itself
    assert llm_server.gets == ["/v1/models"] * 2
    make_agents(cfg, "r1")  # a preflight covers one build: a second one checks again
    assert llm_server.gets == ["/v1/models"] * 3


@pytest.mark.parametrize(
    ("budget", "told"),
    [
        (["trial.budget_s=30"], "Every trial trains for the same 30 s of wall time (trial.budget_s), whatever its"),
        ([], "Each trial trains for its `EPOCHS`"),
    ],
)
def test_the_analyst_is_told_whether_trials_train_for_a_fixed_time(
    llm_server: ScriptedLLM, tiny_config, parent: ParentView, budget: list[str], told: str
):
    analyst, _ = make_agents(tiny_config(*campaign_overrides(llm_server), *budget))
    llm_server.add(Reply(json.dumps(ANALYSIS)))
    analyst.analyse(parent, [], Usage())
    system = llm_server.chats()[0][0]["content"]
    assert told in system
    assert ("Do not recommend longer training" in system) is bool(budget)  # under a budget EPOCHS buys nothing


@pytest.mark.parametrize(("task", "mirror_invariant"), [([], False), (["task=fashion"], True)])
def test_the_analyst_is_told_when_the_task_forbids_mirrored_inputs(
    llm_server: ScriptedLLM, tiny_config, parent: ParentView, task: list[str], mirror_invariant: bool
):
    # Digits (the tiny config's task): a mirrored 2 is not a 2. The heuristic analyst skips flips there; the LLM
    # analyst must know it too. Fashion: a mirrored shoe is a shoe.
    analyst, _ = make_agents(tiny_config(*campaign_overrides(llm_server), *task))
    assert analyst.mirror_invariant is mirror_invariant
    llm_server.add(Reply(json.dumps(ANALYSIS)))
    analyst.analyse(parent, [], Usage())
    system, user = (m["content"] for m in llm_server.chats()[0][:2])
    assert ("never recommend a horizontal flip" in system) is not mirror_invariant
    assert ("flip_augmentation" in user) is mirror_invariant  # the catalog shown leaves flips out


@pytest.mark.parametrize("images", [True, False])
def test_the_analyst_is_shown_no_image_interventions_where_the_inputs_are_not_images(
    llm_server: ScriptedLLM, tiny_config, parent: ParentView, images: bool
):
    # A table's columns shifted or mirrored are other inputs (the user trial's breast_cancer: 30 columns).
    analyst, _ = make_agents(tiny_config(*campaign_overrides(llm_server), "task=fashion", f"task.images={images}"))
    llm_server.add(Reply(json.dumps(ANALYSIS)))
    analyst.analyse(parent, [], Usage())
    user = llm_server.chats()[0][1]["content"]
    for name in ("augmentation", "flip_augmentation", "flip_tta", "channels_last"):
        assert (f"- `{name}`:" in user) is images
    assert "- `batchnorm`:" in user


def test_preflight_warns_of_a_model_the_server_does_not_list(llm_server: ScriptedLLM):
    # A warning, not a refusal (review): Azure lists base models, not deployments; LiteLLM lists wildcard routes;
    # llama.cpp answers to any name. A real 404 stops the campaign at its first agent call (exit 2).
    llm_server.models = ["scripted", "tiny-coder"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ChatClient(agent_config(llm_server)).preflight()  # listed: no warning
        llm_server.models = ["qwen2.5-coder:latest", "openai/*", "azure/gpt-4o-mini"]
        for served in ("qwen2.5-coder", "gpt-4o", "gpt-4o-mini"):  # Ollama's tag, a wildcard route, a provider prefix
            ChatClient(agent_config(llm_server, model=served)).preflight()
    llm_server.models = ["scripted", "tiny-coder"]
    with pytest.warns(AgentConfigWarning) as caught:
        ChatClient(agent_config(llm_server, model="tiny-coderr")).preflight()
    said = str(caught[0].message)
    assert "does not list model 'tiny-coderr' (it lists scripted, tiny-coder)" in said
    assert "did you mean agent.model=tiny-coder?" in said and "stops at its first agent call with exit 2" in said
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ChatClient(agent_config(llm_server, model="tiny-coderr")).preflight()  # once per endpoint and model
    assert llm_server.requests == []  # GET /models only: no chat call, no tokens


def unreachable_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}/v1"  # nothing listens here once the socket closes


@pytest.mark.parametrize("refusal", ["unreachable", "wrong_key", "no_v1"])
def test_a_refused_start_leaves_no_run_behind(
    llm_server: ScriptedLLM,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    refusal,
):
    monkeypatch.chdir(tmp_path)
    url = {"unreachable": unreachable_url(), "no_v1": llm_server.base_url.removesuffix("/v1")}.get(
        refusal, llm_server.base_url
    )
    llm_server.key = "sk-right-key-0000"  # the campaign sends none: 401 (no_v1: GET /v1/models is there, keyed)
    code = main(
        [
            f"paths.runs={tmp_path / 'runs'}",
            f"paths.kb={tmp_path / 'kb'}",
            "agent=openai",
            f"agent.base_url={url}",
            "agent.model=scripted",
            "agent.api_key_env=null",
            "agent.http_retries=0",
            "run_id=refused",
        ]
    )
    err = capsys.readouterr().err
    said = {
        "unreachable": "cannot reach the LLM endpoint",
        "wrong_key": "refused no key",
        "no_v1": f"agent.base_url should end in /v1: {llm_server.base_url}",
    }[refusal]
    assert code == 2 and said in " ".join(err.split()), err
    assert not (tmp_path / "runs" / "refused").exists()  # no run dir, so no `crashed` run in status or the app
    if (tmp_path / "kb").exists():
        assert not list((tmp_path / "kb").rglob("*.parquet"))  # no runs row


@pytest.mark.slow
def test_a_refused_resume_leaves_the_finished_run_as_it_was(
    ray_session, tiny_config, llm_server: ScriptedLLM, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    llm_server.add(Reply(json.dumps(ANALYSIS)), Reply(GOOD_DIFF))
    cfg = tiny_config(*campaign_overrides(llm_server), "run_id=done")
    assert run(cfg).stop_reason == "max_cycles"
    run_dir = tmp_path / "runs" / "done"
    before = {name: (run_dir / name).read_bytes() for name in ("state.json", "config.yaml")}
    llm_server.close()  # the server is down at the resume
    monkeypatch.chdir(tmp_path)
    code = main(
        [
            f"paths.runs={tmp_path / 'runs'}",
            f"paths.kb={tmp_path / 'kb'}",
            "resume=done",
            "safeguards.max_cycles=3",
            "agent.http_retries=0",
        ]
    )
    assert code == 2
    assert {name: (run_dir / name).read_bytes() for name in before} == before  # not crashed, not max_cycles=3
    status = open_reader(tmp_path / "kb").execute("select status from runs where run_id = 'done'").fetchall()
    assert [s for (s,) in status] == ["finished"]
