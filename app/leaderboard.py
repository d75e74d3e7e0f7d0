"""ralph_ray's live leaderboard: reads a knowledge base only (never the orchestrator, never Ray).

    streamlit run app/leaderboard.py                       # the KB at ./kb (or $RALPH_KB)
    streamlit run app/leaderboard.py -- --kb path/to/kb    # any KB root (`paths.kb` of a campaign)

It listens on 127.0.0.1 only (app/.streamlit/config.toml); `--server.address 0.0.0.0` exposes it on purpose
(access.py: a banner on every page, and Stop asks for a shared secret). Nothing it serves loads from elsewhere.
"""

from __future__ import annotations

import sys
from pathlib import Path

# `streamlit run` puts this folder on sys.path for the pages' imports; AppTest and other embedders do not.
APP_DIR = str(Path(__file__).resolve().parent)
if APP_DIR not in sys.path:
    sys.path.insert(0, APP_DIR)

import access  # noqa: E402
import shell  # noqa: E402
import streamlit as st  # noqa: E402

# A local file: a material or emoji icon makes the browser fetch the favicon from a CDN.
st.set_page_config(page_title="ralph_ray leaderboard", page_icon=str(Path(APP_DIR) / "favicon.png"), layout="wide")
access.banner()
navigation = st.navigation(
    [
        st.Page("views/board.py", title="Leaderboard", icon=":material/leaderboard:", default=True),
        st.Page("views/lineage.py", title="Lineage", icon=":material/account_tree:"),
        st.Page("views/trials.py", title="Trials", icon=":material/table_rows:"),
        st.Page("views/knobs.py", title="Knobs", icon=":material/tune:"),
        st.Page("views/curves.py", title="Curves", icon=":material/show_chart:"),
        st.Page("views/compare.py", title="Compare", icon=":material/compare_arrows:"),
        st.Page("views/diff.py", title="Diff", icon=":material/difference:"),
        st.Page("views/interventions.py", title="Interventions", icon=":material/science:"),
        st.Page("views/status.py", title="Status and budgets", icon=":material/monitor_heart:"),
    ]
)
shell.sidebar()
navigation.run()
shell.warm_imports()  # after the page: its first render never waits on the other pages' imports
