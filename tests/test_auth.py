"""Nobody gets in: a campaign's Ray refuses clients without its token, `cluster.auth_mode=disabled` is an explicit
opt-out that the config, the report and the app show, no file a campaign writes holds the token, and the app
listens on localhost only (exposed on purpose, it says so and asks for a shared secret before stopping anything).

Exposure is read from the listening sockets (psutil), never by connecting to a non-loopback address.
"""

from __future__ import annotations

import io
import json
import os
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest
from procs import CHROMIUM, CHROMIUM_ARGS, free_port, gcs_probe
from rich.console import Console
from streamlit.testing.v1 import AppTest

from ralph_ray import PROJECT_ROOT
from ralph_ray.campaign import Outcome, run
from ralph_ray.config import load_config
from ralph_ray.kb import KnowledgeBase, now, open_reader
from ralph_ray.raycluster import DEFAULT_TOKEN_PATH, split_address

ENTRY = PROJECT_ROOT / "app" / "leaderboard.py"
SECRET_FIELD = "stop_secret_given"
TINY = [
    "agent=none",
    "safeguards.max_cycles=1",
    "search.num_samples=2",
    "safeguards.replicates=0",  # one trial decides (replicates: tests/test_noise.py)
    "search.max_concurrent=2",
    "scheduler=fifo",
    "scheduler.max_t=1",
    "scheduler.grace_period=1",
    "safeguards.trial_timeout_s=120",
    "+search.space.EPOCHS={type: choice, values: [1]}",
]


def session_token() -> str:
    """The token this process's Ray runs with (Ray's loader: RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH, ~/.ray/auth_token)."""
    from ray._raylet import AuthenticationTokenLoader

    return AuthenticationTokenLoader.instance().get_raw_token(ignore_auth_mode=True)


@pytest.fixture(scope="module")
def campaign(ray_session: None, tmp_path_factory: pytest.TempPathFactory) -> Outcome:
    """One tiny finished campaign on the session's (token-mode) Ray."""
    root = tmp_path_factory.mktemp("auth_campaign")
    cfg = load_config([f"paths.runs={root / 'runs'}", f"paths.kb={root / 'kb'}", "run_id=tok", *TINY])
    return run(cfg, Console(file=io.StringIO()))


# -- Ray ----------------------------------------------------------------------------------------------------------


def test_a_campaigns_ray_refuses_clients_without_its_token_and_serves_its_own_driver(ray_session: None):
    import ray

    assert os.environ["RAY_AUTH_MODE"] == "token"
    assert ray.get(ray.remote(lambda: 41 + 1).remote()) == 42  # the campaign's own driver
    gcs = f"127.0.0.1:{split_address(ray.get_runtime_context().gcs_address)[1]}"  # the GCS listens on every interface
    # (Not a second `ray.init`: it swaps a loopback address for the machine's own before connecting.)
    probes = [
        gcs_probe(gcs, RAY_AUTH_MODE="disabled"),
        gcs_probe(gcs, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN="0" * 64),
        gcs_probe(gcs, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=session_token()),
    ]
    without, wrong, right = (p.communicate(timeout=60)[0] for p in probes)
    assert without.startswith("refused") and "InvalidAuthToken" in without, without
    assert wrong.startswith("refused") and "InvalidAuthToken" in wrong, wrong
    assert right.startswith("answered: 1 nodes"), right  # the same probe with the token: the refusals were the token
    if not (os.environ.get("RAY_AUTH_TOKEN") or os.environ.get("RAY_AUTH_TOKEN_PATH")):
        assert stat.S_IMODE(DEFAULT_TOKEN_PATH.stat().st_mode) == 0o600  # Ray would leave it readable by everyone


def test_no_file_a_campaign_writes_holds_the_token_and_the_report_shows_the_auth_mode(campaign: Outcome):
    assert int(campaign.exit_code) == 0
    token = session_token().encode()
    written = [p for folder in (campaign.run_dir, campaign.kb_root) for p in Path(folder).rglob("*") if p.is_file()]
    assert len(written) > 20 and any(p.suffix == ".parquet" for p in written)
    assert not [p for p in written if token in p.read_bytes()]
    assert "auth_mode: token" in (campaign.run_dir / "config.yaml").read_text()
    assert (
        "- Ray auth: token (every Ray process needed the token)"
        in (campaign.run_dir / "report" / "final_report.md").read_text()
    )


@pytest.mark.slow
def test_disabled_is_an_explicit_opt_out_shown_in_the_config_and_the_report(tmp_path: Path):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "ralph_ray",
            f"paths.runs={tmp_path / 'runs'}",
            f"paths.kb={tmp_path / 'kb'}",
            "run_id=open",
            "cluster.auth_mode=disabled",
            "resources.ray_num_cpus=2",
            *TINY,
        ],
        cwd=tmp_path,
        env={**os.environ, "RAY_AUTH_MODE": "token"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Ray runs without authentication (cluster.auth_mode=disabled)" in result.stderr
    run_dir = tmp_path / "runs" / "open"
    assert "auth_mode: disabled" in (run_dir / "config.yaml").read_text()
    report = (run_dir / "report" / "final_report.md").read_text()
    assert "- Ray auth: **disabled** (cluster.auth_mode=disabled" in report
    config = open_reader(tmp_path / "kb").execute("select config from runs where run_id = 'open'").fetchone()[0]
    assert json.loads(config)["cluster"]["auth_mode"] == "disabled"


# -- the app ------------------------------------------------------------------------------------------------------


def listening(pid: int) -> set[str]:
    """The addresses a process and its children listen on (TCP)."""
    procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    return {c.laddr.ip for p in procs for c in p.net_connections(kind="tcp") if c.status == psutil.CONN_LISTEN}


@pytest.fixture()
def app_server(tmp_path: Path) -> Iterator[Callable[..., tuple[int, set[str]]]]:
    """Start `streamlit run app/leaderboard.py` (from an unrelated folder, as a user may) and return its port and
    the addresses it listens on; killed with its process group afterwards."""
    servers: list[subprocess.Popen] = []

    def start(kb: Path, *flags: str) -> tuple[int, set[str]]:
        port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("STREAMLIT_")}
        server = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "streamlit",
                "run",
                str(ENTRY),
                "--server.port",
                str(port),
                *flags,
                "--",
                "--kb",
                str(kb),
            ],
            cwd=tmp_path,
            env=env,
            stdout=(tmp_path / "app.log").open("w"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        servers.append(server)
        deadline = time.monotonic() + 60
        while not (bound := listening(server.pid)):
            assert server.poll() is None, (tmp_path / "app.log").read_text()[-2000:]
            assert time.monotonic() < deadline, "the app did not listen within 60 s"
            time.sleep(0.2)
        return port, bound

    yield start
    for server in servers:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()


def test_the_app_listens_on_localhost_only_by_default(app_server, tmp_path: Path):
    _, bound = app_server(tmp_path / "kb")
    assert bound == {"127.0.0.1"}


def test_the_app_sends_no_usage_stats_and_loads_its_favicon_from_itself():
    text = (PROJECT_ROOT / "app" / ".streamlit" / "config.toml").read_text()
    assert 'address = "127.0.0.1"' in text and "gatherUsageStats = false" in text
    # A material or emoji page icon makes the browser fetch the favicon from a CDN (fonts.gstatic.com, twemoji).
    assert (
        'page_icon=str(Path(APP_DIR) / "favicon.png")' in ENTRY.read_text()
        and (ENTRY.parent / "favicon.png").stat().st_size > 0
    )


@pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian's Chromium is not installed: apt-get install -y chromium")
def test_no_request_leaves_the_machine_on_any_page(app_server, campaign: Outcome):
    from playwright.sync_api import sync_playwright

    port, _ = app_server(campaign.kb_root)
    local, outside = f"http://127.0.0.1:{port}/", []

    def route(
        request_route,
    ) -> None:  # every request passes here first: anything not for the app is recorded, never sent
        url = request_route.request.url
        if url.startswith((local, f"ws://127.0.0.1:{port}/")) or url.startswith(("data:", "blob:")):
            request_route.continue_()
        else:
            outside.append(url)
            request_route.abort()

    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=str(CHROMIUM),
            args=CHROMIUM_ARGS,
        )
        page = browser.new_page()
        page.route("**/*", route)
        for path in ("", "lineage", "curves", "diff", "interventions", "status"):
            page.goto(local + path)
            page.locator('[data-testid="stSidebar"]').wait_for(timeout=30_000)
            page.locator('[data-testid="stMain"]').get_by_text("tok", exact=False).first.wait_for(timeout=30_000)
            page.wait_for_timeout(1500)  # charts, the lineage graph and the favicon load after the first draw
        browser.close()
    assert outside == []


def kb_with_running(root: Path, auth_mode: str | None = "token") -> Path:
    """A KB with one running campaign (its `runs` row, as the orchestrator writes at its start) and its run dir."""
    kb = KnowledgeBase(root / "kb")
    kb.init()
    run_dir = root / "runs" / "r1"
    run_dir.mkdir(parents=True)
    config = {"safeguards": {"max_cycles": 3}, "cluster": {"mode": "ClusterMode.local", "auth_mode": auth_mode}}
    kb.append(
        "runs",
        [
            {
                "run_id": "r1",
                "experiment": "digits",
                "task": "digits",
                "run_dir": str(run_dir),
                "status": "running",
                "config": json.dumps(config),
                "started_at": now(),
                "cycle": 1,
                "phase": "train",
            }
        ],
        "r1",
    )
    return kb.root


def open_status(kb_root: Path) -> AppTest:
    at = AppTest.from_file(str(ENTRY), default_timeout=60)
    at.session_state["kb_root"] = str(kb_root)
    at.switch_page("views/status.py").run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def shown(at: AppTest) -> str:
    return "\n".join(
        str(e.value) for kind in ("info", "warning", "error", "caption", "markdown") for e in getattr(at, kind)
    )


def test_on_localhost_no_banner_stop_needs_no_secret_and_the_auth_mode_shows(streamlit_options, tmp_path: Path):
    at = open_status(kb_with_running(tmp_path))
    assert "exposed" not in shown(at) and "Ray auth: token" in shown(at)
    assert SECRET_FIELD not in [t.key for t in at.text_input] and at.button(key="stop")
    at.button(key="stop").click().run()
    at.button(key="stop_confirm").click().run()  # Stop asks for confirmation first
    assert (tmp_path / "runs" / "r1" / "STOP").exists()


def test_the_disabled_opt_out_stands_out_on_the_status_page(streamlit_options, tmp_path: Path):
    at = open_status(kb_with_running(tmp_path, "disabled"))
    assert any("Ray auth: disabled" in e.value for e in at.error)


def test_exposed_without_a_secret_the_app_says_so_and_cannot_stop(
    streamlit_options, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.delenv("RALPH_APP_SECRET", raising=False)
    monkeypatch.chdir(tmp_path)  # no .streamlit/secrets.toml here
    streamlit_options("server.address", "0.0.0.0")
    at = open_status(kb_with_running(tmp_path))
    assert any("This app is exposed" in w.value and "0.0.0.0" in w.value for w in at.warning)
    assert "has no shared secret" in shown(at) and "python -m ralph_ray stop r1" in shown(at)
    assert not at.button


def test_exposed_the_stop_button_asks_for_the_shared_secret(
    streamlit_options, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("RALPH_APP_SECRET", "s3cret-for-the-test")
    streamlit_options("server.address", "0.0.0.0")
    at = open_status(kb_with_running(tmp_path))
    stop_file = tmp_path / "runs" / "r1" / "STOP"
    at.text_input(key=SECRET_FIELD).input("guess").run()
    at.button(key="stop").click().run()
    at.button(key="stop_confirm").click().run()  # Stop asks for confirmation first
    assert any("Wrong shared secret" in e.value for e in at.error) and not stop_file.exists()
    at.text_input(key=SECRET_FIELD).input("s3cret-for-the-test").run()
    at.button(key="stop").click().run()
    at.button(key="stop_confirm").click().run()
    assert stop_file.exists()
