"""The OpenAI-compatible chat client ragscope's LLM features use (feature explanations,
their fidelity check, LLM-feedback mitigation).

:class:`LLMEndpoint` is resolved from ``RAGSCOPE_LLM_*`` settings (environment or
Streamlit secrets); :func:`chat` sends one system + user turn and returns the reply
text; :func:`probe_context` asks the server its context length. The API key is only
ever handed to the ``openai`` client: it is not in any repr, message or log.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from core.base.errors import DataError, LLMError

ENV_BASE_URL = "RAGSCOPE_LLM_BASE_URL"


ENV_MODEL = "RAGSCOPE_LLM_MODEL"


ENV_API_KEY = "RAGSCOPE_LLM_API_KEY"


ENV_OPENAI_KEY = "OPENAI_API_KEY"


ENV_CONTEXT = "RAGSCOPE_LLM_CONTEXT"


CONFIG_HELP = (
    f"Set `{ENV_MODEL}` (the model name the server knows) and either `{ENV_BASE_URL}` "
    "(an OpenAI-compatible server, e.g. `http://localhost:11434/v1` for Ollama or "
    f"`http://localhost:8000/v1` for vLLM) or `{ENV_API_KEY}` (or `{ENV_OPENAI_KEY}`) for "
    "api.openai.com, as environment variables or as top-level keys of "
    f"`.streamlit/secrets.toml`. For a small-context model set `{ENV_CONTEXT}` (tokens; vLLM "
    "and `ragscope serve-llm` state it themselves) and prompts are cut to fit."
)
"""How to configure the explainer (shown by the app and in :class:`~core.base.errors.LLMError`)."""


NO_KEY = "unused"
"""Sent as the key to servers that need none (the ``openai`` client insists on one)."""


def _safe_url(url: str | None) -> str:
    """``url`` without any ``user:password@`` part (for messages and reprs)."""
    if not url:
        return "https://api.openai.com/v1 (the openai default)"
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, f"***@{host}", parts.path, parts.query, parts.fragment))


def _setting(name: str, env: Mapping[str, str], secrets: Mapping[str, Any]) -> str | None:
    for source in (env, secrets):
        value = source.get(name)
        if value is not None and str(value).strip():
            return str(value).strip()
    return None


@dataclass(frozen=True, kw_only=True)
class LLMEndpoint:
    """An OpenAI-compatible chat endpoint that writes the explanations.

    Attributes:
        model: The model name the server knows.
        base_url: The server's base URL (``None``: api.openai.com).
        api_key: The key (``None``: a server that needs none). Never shown.
        timeout: Seconds one request may take.
        max_retries: Retries of the ``openai`` client (connection errors, 429, 5xx).
        temperature: Sampling temperature (``None``: the server's default).
        context: The explainer's context in tokens, when known (``RAGSCOPE_LLM_CONTEXT``,
            else :func:`probe_context`); prompts are cut to fit it (:class:`PromptBudget`).
    """

    model: str
    base_url: str | None = None
    api_key: str | None = field(default=None, repr=False)
    timeout: float = 60.0
    max_retries: int = 2
    temperature: float | None = 0.0
    context: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.model, str) or not self.model.strip():
            raise DataError(f"the explainer needs a model name; set {ENV_MODEL}", field="model")
        if self.base_url is not None and not self.base_url.startswith(("http://", "https://")):
            raise DataError(
                f"{ENV_BASE_URL} must start with http:// or https://, got "
                f"{_safe_url(self.base_url)!r}",
                field="base_url",
            )
        if not self.timeout > 0 or self.max_retries < 0:
            raise DataError(
                f"timeout must be > 0 and max_retries >= 0, got {self.timeout}, {self.max_retries}"
            )
        if self.context is not None and self.context < MIN_CONTEXT:
            raise DataError(
                f"{ENV_CONTEXT} must be at least {MIN_CONTEXT} tokens, got {self.context}",
                field="context",
            )

    def __repr__(self) -> str:
        key = "'***'" if self.api_key else "None"
        return (
            f"LLMEndpoint(model={self.model!r}, base_url={_safe_url(self.base_url)!r}, "
            f"api_key={key}, timeout={self.timeout}, max_retries={self.max_retries}, "
            f"context={self.context})"
        )

    __str__ = __repr__

    @property
    def where(self) -> str:
        """The server, safe to show."""
        return _safe_url(self.base_url)

    @classmethod
    def resolve(
        cls,
        env: Mapping[str, str] | None = None,
        secrets: Mapping[str, Any] | None = None,
    ) -> LLMEndpoint | None:
        """The endpoint the settings describe, or ``None`` when none is configured.

        Each of :data:`SETTING_NAMES` is read from ``env`` (default ``os.environ``),
        else from ``secrets`` (the app passes its Streamlit secrets). The key is
        ``RAGSCOPE_LLM_API_KEY``, else ``OPENAI_API_KEY``. Configured means a model
        and a base URL or a key (without a base URL the client talks to
        api.openai.com, which needs one). ``RAGSCOPE_LLM_CONTEXT`` (optional) is the
        explainer's context in tokens.

        Raises:
            DataError: A setting is malformed (the base URL is not http(s), the context
                not a whole number of at least :data:`MIN_CONTEXT`).
        """
        env = os.environ if env is None else env
        secrets = secrets or {}
        model = _setting(ENV_MODEL, env, secrets)
        base_url = _setting(ENV_BASE_URL, env, secrets)
        key = _setting(ENV_API_KEY, env, secrets) or _setting(ENV_OPENAI_KEY, env, secrets)
        if model is None or (base_url is None and key is None):
            return None
        raw_context = _setting(ENV_CONTEXT, env, secrets)
        context = None
        if raw_context is not None:
            try:
                context = int(raw_context)
            except ValueError:
                raise DataError(
                    f"{ENV_CONTEXT} must be a whole number of tokens (e.g. 8192), got "
                    f"{raw_context!r}",
                    field="context",
                ) from None
        return cls(model=model, base_url=base_url, api_key=key, context=context)

    @staticmethod
    def missing(
        env: Mapping[str, str] | None = None, secrets: Mapping[str, Any] | None = None
    ) -> list[str]:
        """The settings still needed for :meth:`resolve` to find an endpoint (empty: none)."""
        env = os.environ if env is None else env
        secrets = secrets or {}
        out = []
        if _setting(ENV_MODEL, env, secrets) is None:
            out.append(ENV_MODEL)
        has_key = any(_setting(n, env, secrets) for n in (ENV_API_KEY, ENV_OPENAI_KEY))
        if _setting(ENV_BASE_URL, env, secrets) is None and not has_key:
            out.append(f"{ENV_BASE_URL} or {ENV_API_KEY}")
        return out


def _scrub(text: str, endpoint: LLMEndpoint) -> str:
    """``text`` with the key (and any password in the base URL) blanked out."""
    for secret in (endpoint.api_key, urlsplit(endpoint.base_url or "").password):
        if secret:
            text = text.replace(secret, "***")
    return text


def chat(endpoint: LLMEndpoint, system: str, user: str) -> str:
    """One chat completion; its reply text (stripped, never empty).

    Raises:
        LLMError: HTTP error, no connection, timeout or an empty reply (the key is
            never in the message, and the client's exception is not chained, since its
            request carries the key in a header).
    """
    import openai

    where = f"the LLM endpoint {endpoint.where} (model {endpoint.model!r})"
    client = openai.OpenAI(
        base_url=endpoint.base_url,
        api_key=endpoint.api_key or NO_KEY,
        timeout=endpoint.timeout,
        max_retries=endpoint.max_retries,
    )
    kwargs: dict[str, Any] = {}
    if endpoint.temperature is not None:
        kwargs["temperature"] = endpoint.temperature
    message: str | None = None
    try:
        reply = client.chat.completions.create(
            model=endpoint.model,
            messages=[{"role": "system", "content": system}, {"role": "user", "content": user}],
            **kwargs,
        )
    except openai.APIStatusError as e:
        body = e.body if e.body is not None else e.message
        detail = body if isinstance(body, str) else json.dumps(body, default=str)
        hint = {
            401: f"check {ENV_API_KEY} (or {ENV_OPENAI_KEY})",
            403: f"check {ENV_API_KEY} (or {ENV_OPENAI_KEY})",
            404: f"check {ENV_MODEL} and {ENV_BASE_URL} (most servers' base URL ends in /v1)",
            429: "rate-limited: wait and try again",
        }.get(e.status_code, "a server error: try again later" if e.status_code >= 500 else "")
        detail = _scrub(detail, endpoint)[:300]  # scrubbed before cutting: no partial key
        message = f"{where} answered HTTP {e.status_code}: {detail}" + (f"; {hint}" if hint else "")
    except openai.APITimeoutError:
        message = (
            f"{where} did not answer within {endpoint.timeout:g} s; try again or raise the timeout"
        )
    except openai.APIConnectionError as e:
        message = f"could not reach {where} ({type(e.__cause__ or e).__name__}); is the server up?"
    except openai.OpenAIError as e:
        message = f"{where} failed ({type(e).__name__}: {_scrub(str(e), endpoint)[:300]})"
    finally:
        client.close()
    if message is not None:
        raise LLMError(_scrub(message, endpoint)) from None
    choices = getattr(reply, "choices", None) or []
    content = choices[0].message.content if choices else None
    if not content or not content.strip():
        finish = choices[0].finish_reason if choices else "no choices"
        raise LLMError(
            f"{where} returned an empty reply (finish reason: {finish}); try another model"
        )
    return _scrub(content.strip(), endpoint)


CONTEXT_FIELDS = ("max_model_len", "context_length", "context_window", "max_context_length")
"""Fields of a ``/models`` entry that servers use for the model's context (vLLM, ours, others)."""


def probe_context(endpoint: LLMEndpoint, *, timeout: float = 3.0) -> int | None:
    """The explainer's context in tokens as its server's ``/models`` listing states it.

    vLLM and ``ragscope serve-llm`` list ``max_model_len``; some servers use another of
    :data:`CONTEXT_FIELDS`. ``None`` when the server does not say, is not reachable
    within ``timeout`` or is api.openai.com (no base URL: its listing states none). One
    quick request, no retries; never raises.
    """
    if endpoint.base_url is None:
        return None
    import openai

    client = openai.OpenAI(
        base_url=endpoint.base_url,
        api_key=endpoint.api_key or NO_KEY,
        timeout=timeout,
        max_retries=0,
    )
    try:
        listed = list(client.models.list())
    except Exception:  # a probe: any failure means "not stated"
        return None
    finally:
        client.close()
    for m in listed:
        if getattr(m, "id", None) != endpoint.model:
            continue
        extra = getattr(m, "model_extra", None) or {}
        for name in CONTEXT_FIELDS:
            value = extra.get(name)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
    return None


SETTING_NAMES: tuple[str, ...] = (
    ENV_BASE_URL,
    ENV_MODEL,
    ENV_API_KEY,
    ENV_OPENAI_KEY,
    ENV_CONTEXT,
)
"""Every setting :meth:`LLMEndpoint.resolve` reads (environment or Streamlit secrets)."""


MIN_CONTEXT = 1024
"""The smallest explainer context accepted (smaller cannot hold a useful prompt)."""
