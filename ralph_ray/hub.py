"""`export RUN_ID [VARIANT] --to hf REPO_ID`: push an export bundle to the Hugging Face Hub with the hub's own client.

`huggingface_hub`'s `HfApi.create_repo` (private unless the repo exists) and `upload_folder` (one commit of the whole
bundle). The token is the hub client's own (`HF_TOKEN`, else the one `hf auth login` stored); `HF_ENDPOINT` points
it at another hub (a mirror, an Enterprise hub, or the tests' loopback server), read when the push starts.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from ralph_ray.rundir import CampaignError

if TYPE_CHECKING:
    from huggingface_hub import HfApi

INSTALL_FIX = 'pip install -e ".[hub]"  (or pip install huggingface_hub)'
TOKEN_FIX = "set HF_TOKEN to a token with write access (https://huggingface.co/settings/tokens) or run `hf auth login`"


class HubError(CampaignError):
    """A push that cannot happen (no client, no token, the hub refused); the message names the fix."""


def client(repo_id: str) -> HfApi:
    """The hub client with its token, checked before anything is exported: the package and a token are there."""
    try:
        from huggingface_hub import HfApi, get_token
    except ImportError:
        raise HubError(f"--to hf needs the huggingface_hub package: {INSTALL_FIX}") from None
    token = get_token()
    if not token:
        raise HubError(f"--to hf {repo_id}: no Hugging Face token; {TOKEN_FIX}")
    return HfApi(endpoint=os.environ.get("HF_ENDPOINT") or None, token=token)


def push(api: HfApi, bundle: Path, repo_id: str, message: str) -> str:
    """Create `repo_id` (a private model repo) if it does not exist and upload `bundle` as one commit; its URL."""
    from httpx import HTTPError  # the hub client's transport: connection refused, timeouts
    from huggingface_hub.errors import HfHubHTTPError

    try:
        api.create_repo(repo_id, repo_type="model", private=True, exist_ok=True)
        commit = api.upload_folder(folder_path=bundle, repo_id=repo_id, repo_type="model", commit_message=message)
    except HfHubHTTPError as err:
        status = err.response.status_code if err.response is not None else "?"
        fix = TOKEN_FIX if status in (401, 403) else "check the repo id (namespace/name) and HF_ENDPOINT"
        raise HubError(
            f"the hub at {api.endpoint} refused the push to {repo_id} ({status}): {_first_line(err)}; {fix}"
        ) from None
    except (HTTPError, OSError, ValueError) as err:  # unreachable, a timeout, a malformed answer
        raise HubError(
            f"cannot push to {repo_id} at {api.endpoint}: {_first_line(err)}; check the network and HF_ENDPOINT"
        ) from None
    return str(commit.commit_url)


def _first_line(err: Exception) -> str:
    text = str(err).strip()
    return text.splitlines()[0][:300] if text else type(err).__name__
