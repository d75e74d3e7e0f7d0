"""`export --to hf REPO_ID` through huggingface_hub's own client against a loopback server that speaks the Hub API
routes `create_repo` and `upload_folder` use (create, validate-yaml, preupload, commit with base64 files); it records
what it received. Never the real hub."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from rich.console import Console
from test_export_scores import RUN, write_kb

from ralph_ray import commands
from ralph_ray.exit_codes import ExitCode

TOKEN = "hf_loopback_test_token"
REPO = "me/digits-best"
pytest.importorskip("huggingface_hub")


@dataclass
class Hub:
    """What the loopback hub was sent: (method, path, authorization, body) per request."""

    url: str
    requests: list[tuple[str, str, str, bytes]] = field(default_factory=list)

    def bodies(self, route: str) -> list[bytes]:
        return [body for _, path, _, body in self.requests if route in path]


@pytest.fixture()
def hub() -> Iterator[Hub]:
    record = Hub("")

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # repo_info after a refused create: the repo is not there either
            self._note(b"")
            self._answer(404, {"error": "Repository not found"})

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self._note(body)
            if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                self._answer(401, {"error": "Invalid credentials in Authorization header"})
            elif self.path == "/api/repos/create":
                data = json.loads(body)
                self._answer(200, {"url": f"{record.url}/{data['organization']}/{data['name']}"})
            elif self.path == "/api/validate-yaml":
                self._answer(200, {})
            elif "/preupload/" in self.path:
                files = json.loads(body)["files"]
                modes = [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False} for f in files]
                self._answer(200, {"files": modes})
            elif "/commit/" in self.path:
                self._answer(200, {"commitUrl": f"{record.url}/{REPO}/commit/{'a' * 40}", "commitOid": "a" * 40})
            else:
                self._answer(404, {"error": f"no route {self.path}"})

        def _note(self, body: bytes) -> None:
            record.requests.append((self.command, self.path, self.headers.get("Authorization") or "", body))

        def _answer(self, status: int, data: dict) -> None:
            payload = json.dumps(data).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    record.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield record
    server.shutdown()
    server.server_close()


def export(tmp_path: Path, hub: Hub, token: str | None, *extra: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env |= {"HF_ENDPOINT": hub.url, "HF_HOME": str(tmp_path / "hf_home"), "HF_HUB_DISABLE_TELEMETRY": "1"}
    if token is not None:
        env["HF_TOKEN"] = token
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [*extra, env.get("PYTHONPATH")]))
    argv = ["export", RUN, "--kb", str(tmp_path / "kb"), "--out", str(tmp_path / "bundle"), "--to", "hf", REPO]
    return subprocess.run(
        [sys.executable, "-m", "ralph_ray", *argv], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120
    )


def test_the_bundle_is_pushed_with_the_hub_client(tmp_path: Path, hub: Hub) -> None:
    write_kb(tmp_path)
    done = export(tmp_path, hub, TOKEN)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"pushed to the Hugging Face Hub: {hub.url}/{REPO}/commit/" in done.stdout
    assert all(auth == f"Bearer {TOKEN}" for _, _, auth, _ in hub.requests)
    created = json.loads(hub.bodies("/api/repos/create")[0])
    assert (created["organization"], created["name"], created["visibility"]) == ("me", "digits-best", "private")
    bundle = tmp_path / "bundle"
    local = {p.relative_to(bundle).as_posix(): p.read_bytes() for p in bundle.rglob("*") if p.is_file()}
    asked = json.loads(hub.bodies(f"/api/models/{REPO}/preupload/main")[0])["files"]
    assert sorted(f["path"] for f in asked) == sorted(local)
    lines = [json.loads(line) for line in hub.bodies(f"/api/models/{REPO}/commit/main")[0].splitlines()]
    assert lines[0]["key"] == "header" and "campaign scored" in lines[0]["value"]["summary"]
    sent = {f["value"]["path"]: base64.b64decode(f["value"]["content"]) for f in lines if f["key"] == "file"}
    assert sent == local  # every file of the bundle, byte for byte (model card, scores, trainer, reproduce.py)
    assert {"README.md", "scores.json", "trainer/train.py", "reproduce.py"} <= set(sent)


def test_no_token_exits_2_naming_the_fix_and_sends_nothing(tmp_path: Path, hub: Hub) -> None:
    write_kb(tmp_path)
    done = export(tmp_path, hub, None)
    assert done.returncode == ExitCode.safeguard_or_config, done.stderr
    assert "no Hugging Face token" in done.stdout and "HF_TOKEN" in done.stdout and "hf auth login" in done.stdout
    assert hub.requests == [] and not (tmp_path / "bundle").exists()  # checked before anything is written


def test_a_refused_token_exits_2_naming_the_fix(tmp_path: Path, hub: Hub) -> None:
    write_kb(tmp_path)
    done = export(tmp_path, hub, "hf_wrong")
    assert done.returncode == ExitCode.safeguard_or_config, done.stderr
    assert "refused the push to me/digits-best (401)" in done.stdout and "HF_TOKEN" in done.stdout


def test_without_huggingface_hub_exits_2_naming_the_install(tmp_path: Path, hub: Hub) -> None:
    write_kb(tmp_path)
    shadow = tmp_path / "shadow"  # an environment without the package: its import fails as a missing one would
    shadow.mkdir()
    (shadow / "huggingface_hub.py").write_text("raise ImportError(\"No module named 'huggingface_hub'\")\n")
    done = export(tmp_path, hub, TOKEN, str(shadow))
    assert done.returncode == ExitCode.safeguard_or_config, done.stderr
    assert "needs the huggingface_hub package" in done.stdout and 'pip install -e ".[hub]"' in done.stdout
    assert hub.requests == []


def test_to_needs_hf_and_a_repo_id(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_kb(tmp_path)
    code = commands.main(["export", RUN, "--kb", str(tmp_path / "kb"), "--to", "s3"], Console(width=200))
    assert code == ExitCode.safeguard_or_config
    assert "--to takes `hf REPO_ID`" in capsys.readouterr().out
