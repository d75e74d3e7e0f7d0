"""Which environment variables are secrets: the one rule every child process's environment is filtered by.

A bottom-layer module (no engine imports): config checks a key's name with it, the trial runner strips secrets
from trainers' environments, and CLI agents get only the secrets their template allows.
"""

from __future__ import annotations

import os
import re
from typing import Mapping

# Variables whose names look like credentials never reach trainer code (agents write it; an API key must not leak).
SECRET_ENV = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL", re.IGNORECASE)


def is_secret(name: str) -> bool:
    """True when a variable's name looks like a credential."""
    return SECRET_ENV.search(name) is not None


def public_env(environ: Mapping[str, str] | None = None, allowed: frozenset[str] = frozenset()) -> dict[str, str]:
    """The environment (default: this process's) minus every secret-looking variable not in `allowed`."""
    source = os.environ if environ is None else environ
    return {name: value for name, value in source.items() if name in allowed or not is_secret(name)}
