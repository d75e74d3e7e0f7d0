"""Who can reach the app: localhost only unless a user exposes it on purpose; exposed, it says so on every page
and the Stop button asks for a shared secret.

`streamlit run app/leaderboard.py` binds 127.0.0.1 (app/.streamlit/config.toml, read beside the script); a user
exposes it with `--server.address 0.0.0.0` (or another address). The secret comes from $RALPH_APP_SECRET or
`stop_secret` in .streamlit/secrets.toml; without one, an exposed app cannot stop campaigns.
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Callable
from typing import Any

import streamlit as st

LOOPBACK = ("127.0.0.1", "localhost", "::1")
SECRET_ENV = "RALPH_APP_SECRET"
SECRET_KEY = "stop_secret"  # in .streamlit/secrets.toml


def bound_address() -> str:
    """The address the server listens on; empty where no address is set (Streamlit then listens on every interface)."""
    return str(st.get_option("server.address") or "")


def exposed() -> bool:
    """True unless the server listens on a loopback address only."""
    address = bound_address().strip("[]")
    return not (address in LOOPBACK or address.startswith("127."))


def shared_secret() -> str | None:
    """The shared secret that lets an exposed app stop campaigns: $RALPH_APP_SECRET, else secrets.toml's stop_secret."""
    if os.environ.get(SECRET_ENV):
        return os.environ[SECRET_ENV]
    try:
        value = st.secrets.get(SECRET_KEY)
    except FileNotFoundError:  # no secrets.toml anywhere
        return None
    return str(value) if value else None


def banner() -> None:
    """On every page of an exposed app: who can see it and what that means."""
    if not exposed():
        return
    where = bound_address() or "every interface"
    st.warning(
        f"**This app is exposed** (listening on {where}): anyone who reaches it sees every variant's code and "
        "results, with no login. The Stop button asks for the shared secret. To keep it on this machine, start it "
        "without `--server.address` and reach it through an SSH tunnel (README: Ports and access).",
        icon=":material/public:",
    )


def stop_permission(run_id: str) -> Callable[[], bool] | None:
    """What stopping needs here: None where an exposed app has no secret (stop from the command line); else a check
    to call on the click (always true on localhost; exposed, the secret typed into the field this draws)."""
    if not exposed():
        return lambda: True
    secret = shared_secret()
    if secret is None:
        st.info(
            f"This app is exposed and has no shared secret, so it cannot stop campaigns: set ${SECRET_ENV} (or "
            f"`{SECRET_KEY}` in .streamlit/secrets.toml) where the app runs, or stop it where the campaign runs: "
            f"`python -m ralph_ray stop {run_id}`."
        )
        return None
    given = st.text_input(
        "Shared secret",
        type="password",
        key="stop_secret_given",
        help=f"${SECRET_ENV} or `{SECRET_KEY}` in .streamlit/secrets.toml where the app runs",
    )
    return lambda: hmac.compare_digest(given.encode(), secret.encode())


def show_ray_auth(config: dict[str, Any]) -> None:
    """The campaign's Ray auth mode, as its config recorded it; the opt-out stands out."""
    mode = (config.get("cluster") or {}).get("auth_mode")
    if mode == "disabled":
        st.error(
            "**Ray auth: disabled** (cluster.auth_mode=disabled): anyone who reached this campaign's Ray ports "
            "could run code on its machines.",
            icon=":material/lock_open:",
        )
    else:
        st.caption(
            f"Ray auth: {mode or 'not recorded'}" + (" (every Ray process needs the token)" if mode == "token" else "")
        )


def show_sandbox(config: dict[str, Any]) -> None:
    """How the campaign ran agent-written code, as its config recorded it; the opt-out stands out."""
    box = config.get("sandbox") or {}
    if box.get("mode") == "none":
        st.error(
            "**Sandbox: none** (sandbox=none): agent-written code ran as a plain subprocess that could read runs/, "
            "kb/ and the engine, so its scores are not protected against label theft.",
            icon=":material/shield:",
        )
    else:
        st.caption(
            f"Sandbox: {box.get('mode') or 'not recorded'}"
            + (" (work dir, public data and harness only)" if box.get("mode") == "bwrap" else "")
        )
