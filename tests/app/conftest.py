"""The app's pages run with the options `streamlit run` reads from app/.streamlit/config.toml (tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest


@pytest.fixture(autouse=True)
def _app_options(streamlit_options: Callable[..., None]) -> Iterator[None]:
    yield
