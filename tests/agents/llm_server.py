"""Agent-test fixtures: a scripted OpenAI-compatible server on loopback, and a parent to work on.

The server speaks the wire protocol (GET /v1/models, POST /v1/chat/completions) and answers each chat call
with the next reply of a per-test script, so the LLM backend is tested end to end through the real SDK.
Test modules import the fixtures by name (`from llm_server import llm_server, parent, workdir`):
a conftest.py here would shadow tests/conftest.py; shared helpers live in tests/procs.py.
"""

from __future__ import annotations

import difflib
import json
import re
import shutil
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable

import pytest

from ralph_ray import PROJECT_ROOT
from ralph_ray.agents.base import EpochPoint, ParentView, TrialSummary

SEED = PROJECT_ROOT / "trainers" / "digits"
# A coder's answer the digits seed takes: a small diff the gate passes (the campaign tests' written child).
GOOD_DIFF = """\
I set the dropout before the classifier to 0.2.

```diff
--- a/train.py
+++ b/train.py
@@ -24,2 +24,2 @@
-DROPOUT = 0.0  # dropout before the classifier
+DROPOUT = 0.2  # dropout before the classifier
 VAL_FRACTION = 0.15  # share of train carved out for per-epoch validation
```
"""


@dataclass
class Reply:
    """One scripted answer: a chat message (text, or built from the request), or an HTTP error, maybe late."""

    content: str | Callable[[dict[str, Any]], str] = ""
    status: int = 200
    delay_s: float = 0.0
    usage: tuple[int, int] | None = (120, 30)  # prompt, completion tokens; None: no usage in the answer
    headers: dict[str, str] = field(default_factory=dict)
    error: str = "scripted error"


class ScriptedLLM:
    """A loopback chat-completions server; `requests` keeps every chat request (body and Authorization header),
    `gets` every GET's path."""

    def __init__(self) -> None:
        self.script: deque[Reply] = deque()
        self.requests: list[dict[str, Any]] = []
        self.gets: list[str] = []  # the path of every GET (the preflight's GET /models, and any probe beside it)
        self.key: str | None = None  # when set, any other bearer token gets 401
        self.models = ["scripted"]  # the ids GET /v1/models lists (the preflight checks agent.model against them)
        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def add(self, *replies: Reply | str) -> None:
        """Queue replies (a plain string is a 200 answer with that text)."""
        with self.lock:
            self.script.extend(r if isinstance(r, Reply) else Reply(r) for r in replies)

    def chats(self) -> list[list[dict[str, str]]]:
        """The messages of every chat request so far."""
        return [r["body"]["messages"] for r in self.requests]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _handler(llm: ScriptedLLM) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # quiet
            pass

        def _send(self, status: int, payload: dict[str, Any], headers: dict[str, str] | None = None) -> None:
            data = json.dumps(payload).encode()
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up (a timeout test)

        def _authorised(self) -> bool:
            if llm.key is None or self.headers.get("Authorization") == f"Bearer {llm.key}":
                return True
            self._send(
                401,
                {
                    "error": {
                        "message": "Incorrect API key provided.",
                        "type": "invalid_request_error",
                        "code": "invalid_api_key",
                    }
                },
            )
            return False

        def do_GET(self) -> None:
            with llm.lock:
                llm.gets.append(self.path)
            if self.path.rstrip("/") != "/v1/models":
                return self._send(404, {"error": {"message": f"no route {self.path}"}})
            if self._authorised():
                self._send(
                    200,
                    {
                        "object": "list",
                        "data": [
                            {"id": name, "object": "model", "created": 0, "owned_by": "test"} for name in llm.models
                        ],
                    },
                )

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
            if self.path.rstrip("/") != "/v1/chat/completions":
                return self._send(404, {"error": {"message": f"no route {self.path}"}})
            if not self._authorised():
                return
            with llm.lock:
                llm.requests.append({"body": body, "authorization": self.headers.get("Authorization")})
                reply = (
                    llm.script.popleft()
                    if llm.script
                    else Reply(status=500, error="the test's script ran out of replies")
                )
            if reply.delay_s:
                time.sleep(reply.delay_s)
            if reply.status != 200:  # `{authorization}` in the error echoes the header back, as careless proxies do
                error = reply.error.replace("{authorization}", self.headers.get("Authorization", ""))
                return self._send(reply.status, {"error": {"message": error, "type": "scripted"}}, reply.headers)
            text = reply.content(body) if callable(reply.content) else reply.content
            answer: dict[str, Any] = {
                "id": "chatcmpl-scripted",
                "object": "chat.completion",
                "created": 0,
                "model": body.get("model", "?"),
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            }
            if reply.usage is not None:
                answer["usage"] = {
                    "prompt_tokens": reply.usage[0],
                    "completion_tokens": reply.usage[1],
                    "total_tokens": sum(reply.usage),
                }
            self._send(200, answer, reply.headers)

    return Handler


def edit_line(pattern: str, new_line: str, path: str = "train.py") -> Callable[[dict[str, Any]], str]:
    """A coder reply computed from the request: the file as the prompt shows it, with the line matching
    `pattern` replaced, as a unified diff (for parents whose code a test cannot know in advance)."""

    def reply(body: dict[str, Any]) -> str:
        prompt = body["messages"][1]["content"]
        source = re.search(rf"### {re.escape(path)}\n\n```python\n(.*?)\n```", prompt, re.DOTALL).group(1) + "\n"  # type: ignore[union-attr]
        edited = re.sub(pattern, new_line, source, count=1, flags=re.MULTILINE)
        diff = "".join(
            difflib.unified_diff(
                source.splitlines(keepends=True), edited.splitlines(keepends=True), f"a/{path}", f"b/{path}"
            )
        )
        return f"Done.\n\n```diff\n{diff}```\n"

    return reply


@pytest.fixture()
def llm_server():
    """A scripted OpenAI-compatible server on 127.0.0.1 (a fresh port per test)."""
    server = ScriptedLLM()
    yield server
    server.close()


@pytest.fixture()
def parent(tmp_path: Path) -> ParentView:
    """The digits seed as a parent with two trials (one overfitting curve), as the engine hands it to agents."""
    files = tmp_path / "parent"
    shutil.copytree(SEED, files)
    curve = [
        EpochPoint(
            e,
            train_loss=1.0 / e,
            val_loss=0.3 + 0.02 * e,
            val_acc=0.9 + 0.005 * min(e, 4),
            lr=0.05,
            grad_norm=1.2,
            epoch_seconds=0.4,
        )
        for e in range(1, 9)
    ]
    trials = [
        TrialSummary("t_0001", "completed", None, {"LR": 0.05, "EPOCHS": 8}, 0.945, curve),
        TrialSummary("t_0002", "stopped_early", "asha", {"LR": 0.2, "EPOCHS": 8}, None, curve[:2]),
    ]
    return ParentView("seed0000abcd", files, 0.945, trials, [], [], (SEED / "program.md").read_text())


@pytest.fixture()
def workdir(parent: ParentView, tmp_path: Path) -> Path:
    """A child's work dir: a copy of the parent's files, as children.py prepares it."""
    work = tmp_path / "work"
    shutil.copytree(parent.files_dir, work)
    return work
