"""An API key never lands in the run dir, the knowledge base, the console or trainer code.

A campaign runs against the scripted loopback LLM with a distinctive key; the server demands the key (so it
was sent) and echoes it back in an error body (so redaction is exercised). The coder's first diff makes the
smoke run die with every *KEY* variable in its last stderr line (which the gate's verdict quotes into the
log and the KB); its fix prints the trainer's whole environment. Then every file the campaign wrote,
decoded where it is Parquet, and everything it printed are searched for the key.
"""

from __future__ import annotations

import json
import sys
import uuid
from pathlib import Path

import pyarrow.parquet as pq
import pytest

sys.path.insert(0, str(Path(__file__).parent / "agents"))  # the scripted LLM server lives beside the agent tests
from llm_server import Reply, ScriptedLLM  # noqa: E402

from ralph_ray.campaign import run  # noqa: E402
from ralph_ray.kb import open_reader  # noqa: E402

KEY_ENV = "RALPH_SECRETS_TEST_API_KEY"
ANALYSIS = {
    "diagnoses": ["overfitting"],
    "summary": "val loss rises",
    "recommendations": [
        {"intervention": "add_dropout", "diagnosis": "overfitting", "rationale": "regularise", "priority": 0.9},
        {
            "intervention": "print_environment",
            "diagnosis": "overfitting",
            "rationale": "a leak attempt",
            "priority": 0.5,
        },
    ],
}
SEED = Path(__file__).resolve().parents[1] / "trainers" / "digits" / "train.py"


def diff_after_main(added: str) -> str:
    """A diff that adds one line at the top of the seed's main(), against the seed as it is today."""
    lines = SEED.read_text().splitlines()
    at = lines.index("def main() -> None:")  # 0-based: the hunk starts at line at + 1
    return (
        "```diff\n--- a/train.py\n+++ b/train.py\n"
        f"@@ -{at + 1},2 +{at + 1},3 @@\n {lines[at]}\n+    {added}\n {lines[at + 1]}\n```\n"
    )


CRASH_DIFF = diff_after_main(
    'raise SystemExit("secrets: " + " ".join(v for k, v in __import__("os").environ.items() if "KEY" in k.upper()))'
)
LEAKY_DIFF = diff_after_main('print("ENVIRONMENT", dict(__import__("os").environ), flush=True)')


@pytest.mark.slow
def test_api_key_never_written_anywhere(
    ray_session, tiny_config, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
):
    key = f"sk-ralph-{uuid.uuid4().hex}"
    monkeypatch.setenv(KEY_ENV, key)
    server = ScriptedLLM()
    server.key = key
    server.add(
        json.dumps(ANALYSIS), Reply(status=400, error="bad request from {authorization}"), CRASH_DIFF, LEAKY_DIFF
    )
    try:
        cfg = tiny_config(
            "agent=openai",
            f"agent.base_url={server.base_url}",
            "agent.model=scripted",
            f"agent.api_key_env={KEY_ENV}",
            "agent.http_retries=0",
            "agent.concurrency=1",
            "safeguards.max_cycles=2",
            "population.parents=1",
            "population.children_per_parent=2",
            "population.trials_per_child=1",
            "search.num_samples=2",
            "run_id=secrets",
        )
        run(cfg)
    finally:
        server.close()
    out, err = capfd.readouterr()

    assert (
        all(r["authorization"] == f"Bearer {key}" for r in server.requests) and len(server.requests) == 4
    )  # the key was used
    con = open_reader(tmp_path / "kb")
    reasons = [
        r[0]
        for r in con.execute("select reason from variants where run_id = 'secrets' and status = 'rejected'").fetchall()
    ]
    assert any("bad request from Bearer ***" in (r or "") for r in reasons)  # the echoed key was redacted
    assert (
        server.chats()[3][-1]["content"].count("smoke run failed: train.py exited with code 1: secrets:") == 1
    )  # the gate's verdict
    printed = list((tmp_path / "runs" / "secrets").rglob("stdout.log"))
    assert any("ENVIRONMENT" in p.read_text() for p in printed)  # the child's trainer dumped its environment...

    leaks = [f"captured {name}" for name, text in (("stdout", out), ("stderr", err)) if key in text]
    for path in tmp_path.rglob("*"):
        if not path.is_file():
            continue
        if key.encode() in path.read_bytes():
            leaks.append(str(path))
        elif path.suffix == ".parquet" and key in str(pq.read_table(path).to_pylist()):  # compressed columns
            leaks.append(str(path))
    assert not leaks, f"the API key leaked into: {leaks}"  # ...without the key in it
