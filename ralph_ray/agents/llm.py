"""LLM agents over any OpenAI-compatible chat-completions endpoint (OpenAI, vLLM, Ollama, llama.cpp, GLM...).

The analyst returns JSON (validated; a bad answer goes back with the error); the coder returns a unified
diff that `patching` applies with git (a diff that does not apply goes back with git's error). The
`openai` SDK does the HTTP: timeouts, retries with backoff on 429/5xx/dropped connections, any base_url.
One client serves every thread of a cycle (the SDK's client is thread-safe).

Errors: a wrong key (401/403), a wrong model or URL (404, or at start a model GET /models does not list), a base_url
missing the /v1 its server serves under, or an endpoint that cannot be reached at start are `AgentConfigError` (the
campaign stops, exit code 2); anything else is an `AgentError` (one child or one analysis fails and the campaign goes
on).
"""

from __future__ import annotations

import difflib
import json
import os
import re
import threading
import time
import warnings
from pathlib import Path
from typing import Any

import openai

from ralph_ray.agents import prompts
from ralph_ray.agents.base import (
    AgentConfigError,
    AgentConfigWarning,
    AgentError,
    Analysis,
    Diagnosis,
    Draft,
    InterventionEffect,
    ParentView,
    Recommendation,
    Usage,
)
from ralph_ray.agents.patching import PatchFailed, answer_diff, apply_diff, require_git
from ralph_ray.config import AgentConfig
from ralph_ray.variants import mutable_names

PREFLIGHT_TIMEOUT_S = 15.0
_WARNED: set[tuple[str, str]] = set()  # (endpoint, model) pairs warned of: the check runs at each start
MODELS_SHOWN = 10  # of the ids /models lists, how many an unknown agent.model's error names (OpenAI lists ~100)
_NAME = re.compile(r"^[a-z][a-z0-9_]{0,63}$")
_JSON_FENCE = re.compile(r"```(?:json)?\s*\n(.*?)\n```", re.DOTALL)
Message = dict[str, str]


class ChatClient:
    """One OpenAI-compatible endpoint: a chat call that counts usage, and errors that name the fix (never the key)."""

    def __init__(self, cfg: AgentConfig) -> None:
        assert cfg.base_url and cfg.model, "config validation requires agent.base_url and agent.model"
        key = os.environ.get(cfg.api_key_env, "") if cfg.api_key_env else ""
        self.base_url, self.model, self.key_env = cfg.base_url, cfg.model, cfg.api_key_env
        self.timeout_s, self.retries = cfg.timeout_s, cfg.http_retries
        self.temperature, self.max_tokens = cfg.temperature, cfg.max_tokens
        self._secret = key
        # A keyless local server still gets a placeholder: the SDK insists on one, the server ignores it.
        self._client = openai.OpenAI(
            api_key=key or "no-key", base_url=cfg.base_url, timeout=cfg.timeout_s, max_retries=cfg.http_retries
        )

    def preflight(self) -> None:
        """Fail fast, before any training: the endpoint answers, accepts the key and lists agent.model where it lists
        any (GET /models, no tokens spent)."""
        probe = self._client.with_options(max_retries=1, timeout=min(self.timeout_s, PREFLIGHT_TIMEOUT_S))
        try:
            listed = probe.models.list()
        except (openai.AuthenticationError, openai.PermissionDeniedError) as err:
            raise self._key_error(err) from None
        except openai.APIConnectionError as err:  # includes timeouts
            raise AgentConfigError(
                self._redact(
                    f"cannot reach the LLM endpoint {self.base_url} ({_cause(err)})\n"
                    f"  fix: check agent.base_url (it usually ends in /v1) and that the server is running"
                )
            ) from None
        except openai.NotFoundError:
            self._refuse_missing_v1(probe)
            return  # the server does not serve /models (some proxies): the first real call will tell
        except openai.APIStatusError:
            return  # as above: a proxy may answer a route it does not serve with another status
        self._check_model([m.id for m in getattr(listed, "data", None) or [] if getattr(m, "id", None)])

    def _refuse_missing_v1(self, probe: openai.OpenAI) -> None:
        """Where GET /models is a 404 and agent.base_url lacks /v1, refuse the start if <base_url>/v1/models answers:
        the server serves the API under /v1, and every chat call would 404 mid-run (user trial)."""
        root = self.base_url.rstrip("/")
        if root.endswith("/v1"):
            return
        try:
            probe.with_options(base_url=f"{root}/v1").models.list()
        except (openai.AuthenticationError, openai.PermissionDeniedError):
            pass  # the route is there, behind a key: the same wrong base_url
        except (openai.APIStatusError, openai.APIConnectionError):
            return  # not there either: a server that really serves no /models
        raise AgentConfigError(
            self._redact(
                f"the LLM endpoint {root} serves the API under /v1 (GET {root}/models: 404, {root}/v1/models answers): "
                f"agent.base_url should end in /v1: {root}/v1"
            )
        )

    def _check_model(self, served: list[str]) -> None:
        """Warn (once per endpoint and model) where agent.model is not among the ids the server lists: a wrong one
        answered 404 only at the first chat call, mid-run. Only a warning: Azure lists base models, not deployments,
        a LiteLLM proxy lists wildcard routes, llama.cpp answers to any name (review); a real 404 stops the campaign
        at its first agent call with exit 2. Ollama also serves `name` as `name:latest`."""
        if not served or self.model in served or f"{self.model}:latest" in served:
            return
        if (
            any(s.endswith(f"/{self.model}") or s.endswith("*") for s in served)
            or (self.base_url, self.model) in _WARNED
        ):
            return
        _WARNED.add((self.base_url, self.model))
        close = difflib.get_close_matches(self.model, served, n=1)
        shown = ", ".join(served[:MODELS_SHOWN]) + (
            f" (and {len(served) - MODELS_SHOWN} more)" if len(served) > MODELS_SHOWN else ""
        )
        hint = f"did you mean agent.model={close[0]}? " if close else ""
        warnings.warn(
            self._redact(
                f"the LLM endpoint {self.base_url} does not list model {self.model!r} (it lists {shown}): if it does "
                f"not serve it, the campaign stops at its first agent call with exit 2; {hint}set agent.model to a "
                "model this server serves"
            ),
            AgentConfigWarning,
            stacklevel=2,
        )

    def chat(self, messages: list[Message], usage: Usage, json_mode: bool = False) -> tuple[str, bool]:
        """The model's answer to `messages` and whether it was cut at max_tokens; adds the call to `usage`."""
        options: dict[str, Any] = {}
        if self.temperature is not None:
            options["temperature"] = self.temperature
        if self.max_tokens is not None:
            options["max_tokens"] = self.max_tokens
        if json_mode:
            options["response_format"] = {"type": "json_object"}
        start = time.perf_counter()
        try:
            response = self._client.chat.completions.create(model=self.model, messages=messages, **options)  # type: ignore[arg-type]
        except (openai.AuthenticationError, openai.PermissionDeniedError) as err:
            raise self._key_error(err) from None
        except openai.NotFoundError as err:
            raise AgentConfigError(
                self._redact(
                    f"the LLM endpoint {self.base_url} answered 404 for model {self.model!r}: {_body(err)}\n"
                    f"  fix: check agent.model (a model this server serves) and agent.base_url (usually ending in /v1)"
                )
            ) from None
        except openai.APITimeoutError:
            raise AgentError(
                f"no answer from {self.base_url} within agent.timeout_s={self.timeout_s:g}s "
                f"({self.retries + 1} tries): raise agent.timeout_s or check the server"
            ) from None
        except openai.APIConnectionError as err:
            raise AgentError(
                self._redact(f"lost the LLM endpoint {self.base_url} after {self.retries + 1} tries ({_cause(err)})")
            ) from None
        except openai.RateLimitError as err:
            raise AgentError(
                self._redact(
                    f"rate limited (429) by {self.base_url} after {self.retries + 1} tries: {_body(err)}; "
                    "raise agent.http_retries or lower agent.concurrency"
                )
            ) from None
        except openai.APIStatusError as err:
            raise AgentError(self._redact(f"the LLM endpoint answered HTTP {err.status_code}: {_body(err)}")) from None
        finally:
            usage.seconds += time.perf_counter() - start
        usage.calls += 1
        choice = response.choices[0] if response.choices else None
        text = (choice.message.content or "") if choice is not None else ""
        if response.usage is not None:
            usage.tokens_in += response.usage.prompt_tokens or 0
            usage.tokens_out += response.usage.completion_tokens or 0
        else:  # some servers omit usage: estimate (4 characters a token) and say so
            usage.tokens_in += sum(len(m["content"]) for m in messages) // 4
            usage.tokens_out += len(text) // 4
            usage.estimated = True
        return text, choice is not None and choice.finish_reason == "length"

    def _key_error(self, err: openai.APIStatusError) -> AgentConfigError:
        where = f"the key in ${self.key_env}" if self.key_env else "no key (agent.api_key_env=null)"
        fix = (
            f"put a valid key for this endpoint in {self.key_env}, or point agent.api_key_env at the variable that "
            "holds one"
            if self.key_env
            else "set agent.api_key_env to the NAME of an environment variable holding the key"
        )
        return AgentConfigError(
            self._redact(
                f"the LLM endpoint {self.base_url} refused {where} (HTTP {err.status_code}: {_body(err)})\n  fix: {fix}"
            )
        )

    def _redact(self, text: str) -> str:
        """Never let the key out, even when a server echoes it back in an error body."""
        return text.replace(self._secret, "***") if len(self._secret) >= 4 else text


class LLMAnalyst:
    """Diagnoses a parent from its code, curves, lineage and the KB's effects; returns ranked recommendations."""

    def __init__(
        self,
        chat: ChatClient,
        cfg: AgentConfig,
        n_recommendations: int,
        catalog: list[tuple[str, str]],
        budget_s: float | None = None,  # trial.budget_s: every trial trains this long, whatever its EPOCHS
        mirror_invariant: bool = True,  # task.mirror_invariant: False tells the analyst never to mirror inputs
    ) -> None:
        self.chat, self.answer_retries, self.json_mode = chat, cfg.answer_retries, cfg.json_mode
        self.n_recommendations, self.catalog, self.budget_s = n_recommendations, catalog, budget_s
        self.mirror_invariant = mirror_invariant

    def analyse(self, parent: ParentView, effects: list[InterventionEffect], usage: Usage) -> Analysis:
        """Ask, validate, and send a malformed answer back with what was wrong (bounded)."""
        system = prompts.render(
            "analyst",
            program=parent.program.strip() + prompts.task_note(self.mirror_invariant),
            n_recommendations=str(self.n_recommendations),
            diagnoses=prompts.diagnoses_list(),
            budget=prompts.budget_note(self.budget_s),
        )
        messages = [
            {"role": "system", "content": system},
            {"role": "user", "content": prompts.show_parent(parent, effects, self.catalog)},
        ]
        problem = ""
        for _ in range(self.answer_retries + 1):
            text, cut = self.chat.chat(messages, usage, self.json_mode)
            try:
                return parse_analysis(parent.variant_id, text)
            except ValueError as err:
                problem = str(err) + (" (the answer was cut at agent.max_tokens: be shorter)" if cut else "")
                messages += [
                    {"role": "assistant", "content": text},
                    {
                        "role": "user",
                        "content": f"That answer is not valid: {problem}. "
                        "Reply with the JSON object only, in the format given.",
                    },
                ]
        raise AgentError(f"the analyst's answer was still invalid after {self.answer_retries + 1} tries: {problem}")


class LLMCoder:
    """Implements one recommendation as a unified diff, applied with git; retries a diff that does not apply."""

    def __init__(self, chat: ChatClient, cfg: AgentConfig) -> None:
        require_git()
        self.chat, self.answer_retries = chat, cfg.answer_retries
        self._last: dict[Path, list[Message]] = {}  # per work dir: the conversation whose diff the gate judged
        self._lock = threading.Lock()

    def write(
        self, parent: ParentView, recommendation: Recommendation, workdir: Path, feedback: str | None, usage: Usage
    ) -> Draft:
        """Edit `workdir`; `feedback` (the gate's refusal of the last diff) continues that conversation."""
        with self._lock:
            previous = self._last.pop(workdir, None)
        if feedback is not None and previous is not None:
            messages = previous + [
                {
                    "role": "user",
                    "content": f"The engine applied that diff, but the validation gate refused the result: "
                    f"{feedback}\nWrite a new diff, against the original files shown first, that fixes this.",
                }
            ]
        else:
            system = prompts.render("coder", program=parent.program.strip(), mutable=", ".join(mutable_names(workdir)))
            task = (
                f"## The change to make\n\n{prompts.show_recommendation(recommendation)}\n\n"
                f"## The files\n\n{prompts.show_files(workdir)}"
            )
            if (
                feedback is not None
            ):  # the conversation is gone (e.g. a resumed campaign): the gate's verdict still helps
                task += f"\n\n## An earlier attempt was refused by the validation gate\n\n{feedback}"
            messages = [{"role": "system", "content": system}, {"role": "user", "content": task}]
        problem = ""
        for _ in range(self.answer_retries + 1):
            text, cut = self.chat.chat(messages, usage)
            messages = messages + [{"role": "assistant", "content": text}]
            try:
                diff, whole = answer_diff(text, workdir)
                apply_diff(workdir, diff)
            except PatchFailed as err:
                problem = str(err) + (" (the answer was cut at agent.max_tokens)" if cut else "")
                messages.append(
                    {
                        "role": "user",
                        "content": f"That diff does not apply: {problem}\n"
                        "Reply with a corrected diff against the original files, in ONE ```diff block.",
                    }
                )
                continue
            with self._lock:
                self._last[workdir] = messages
            rationale = _rationale(text) or recommendation.rationale
            if whole is not None:  # the child's record says so: the diff is the engine's, not the model's
                rationale = f"(answered with the whole of {whole}; the engine diffed it) {rationale}"
            return Draft(workdir, [recommendation.intervention], rationale)
        raise AgentError(f"no applicable diff after {self.answer_retries + 1} tries: {problem}")


def parse_analysis(variant_id: str, text: str) -> Analysis:
    """Validate an analyst's JSON answer; ValueError says what is wrong, in words the model can act on."""
    data = _json_object(text)
    for key in ("diagnoses", "summary", "recommendations"):
        if key not in data:
            raise ValueError(f"missing key {key!r} (required: diagnoses, summary, recommendations)")
    diagnoses = data["diagnoses"]
    if not isinstance(diagnoses, list) or not diagnoses:
        raise ValueError("`diagnoses` must be a non-empty list")
    recs = data["recommendations"]
    if not isinstance(recs, list) or not recs:
        raise ValueError("`recommendations` must be a non-empty list")
    parsed = []
    for index, rec in enumerate(recs):
        where = f"recommendations[{index}]"
        if not isinstance(rec, dict):
            raise ValueError(f"{where} must be an object")
        for key in ("intervention", "diagnosis", "rationale"):
            if not isinstance(rec.get(key), str) or not rec[key].strip():
                raise ValueError(f"{where}.{key} must be a non-empty string")
        name = re.sub(r"[\s\-]+", "_", rec["intervention"].strip().lower())
        if not _NAME.match(name):
            raise ValueError(f"{where}.intervention {rec['intervention']!r} is not a short snake_case name")
        priority = rec.get("priority", 0.0)
        if isinstance(priority, bool) or not isinstance(priority, (int, float)):
            raise ValueError(f"{where}.priority must be a number")
        details = rec.get("details", "")
        parsed.append(
            Recommendation(
                name,
                _diagnosis(rec["diagnosis"], f"{where}.diagnosis"),
                rec["rationale"].strip(),
                float(priority),
                details.strip() if isinstance(details, str) else json.dumps(details),
            )
        )
    summary = data["summary"] if isinstance(data["summary"], str) else json.dumps(data["summary"])
    ranked = sorted(parsed, key=lambda r: -r.priority)  # stable: ties keep the model's order
    return Analysis(variant_id, [_diagnosis(d, "diagnoses") for d in diagnoses], summary.strip(), ranked)


def _json_object(text: str) -> dict[str, Any]:
    fenced = _JSON_FENCE.search(text)
    body = fenced.group(1) if fenced else text
    start, end = body.find("{"), body.rfind("}")
    if start < 0 or end < start:
        raise ValueError("no JSON object found")
    try:
        data = json.loads(body[start : end + 1])
    except json.JSONDecodeError as err:
        raise ValueError(f"not valid JSON ({err.msg} at line {err.lineno} column {err.colno})") from None
    if not isinstance(data, dict):
        raise ValueError("the answer must be a JSON object")
    return data


def _diagnosis(value: Any, where: str) -> Diagnosis:
    try:
        return Diagnosis(str(value).strip().lower())
    except ValueError:
        raise ValueError(f"{where}: {value!r} is not one of {prompts.diagnoses_list()}") from None


def _rationale(answer: str) -> str:
    """The coder's own words around its diff (first few lines), for the child's record."""
    prose = re.sub(r"```.*?(```|\Z)", " ", answer, flags=re.DOTALL)
    return " ".join(prose.split())[:400]


def _body(err: openai.APIStatusError) -> str:
    message = err.body.get("message") if isinstance(err.body, dict) else None
    if isinstance(err.body, dict) and isinstance(err.body.get("error"), dict):
        message = err.body["error"].get("message", message)
    return " ".join(str(message or err.message).split())[:300]


def _cause(err: Exception) -> str:
    cause = err.__cause__ or err.__context__
    return f"{type(err).__name__}: {cause}" if cause else str(err)
