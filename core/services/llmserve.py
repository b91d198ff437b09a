"""A local OpenAI-compatible chat endpoint backed by a loaded model (``ragscope serve-llm``).

The Feature explanations page and the LLM judge talk to any OpenAI-compatible server.
Offline, the only LLM at hand is the analysing model itself; this serves it, so the
whole explanation pipeline runs for real (explanations by a 135M model are weak, but
they are its own). Routes:

- ``POST /v1/chat/completions``: ``messages`` through the model's chat template,
  greedy (``temperature`` 0, default) or sampled (``temperature``, ``top_p``, ``seed``),
  at most ``max_tokens`` (default 256) new tokens; the usual
  ``choices[0].message.content`` reply with token usage.
- ``GET /v1/models``: the one model, by the name the server was started with, with its
  context as ``max_model_len`` (as vLLM lists it; the explainer reads it to fit prompts).

The server is built to face clients it cannot trust (a browser tab on the same
machine, a teammate's script, a fuzzer). It runs on uvicorn + Starlette, the ASGI
stack Streamlit already brings: a maintained HTTP parser (h11) with a header size
cap, keep-alive timeouts and flow control, instead of the standard library's
``http.server``, which has no limits at all. On top of it, :class:`Guard` checks every
request before any handler runs:

1. The request line and headers together are at most :data:`MAX_HEADER_BYTES` (16 KiB),
   however they arrive: h11 refuses an unfinished block over it (400) and the guard a
   finished one (431, also when it came in one read); the connection is closed.
2. ``Host`` must be a loopback name when bound to loopback (a DNS rebinding page cannot
   reach it), and an ``Origin``, when sent, one of the served app's origins
   (``--allow-origin``; by default the Streamlit app's ``http://localhost:8501`` and
   ``http://127.0.0.1:8501``; another localhost port is another site); 403 otherwise.
3. With an API key (``--api-key`` / ``RAGSCOPE_SERVE_API_KEY``) every request must
   carry ``Authorization: Bearer <key>`` (compared in constant time); 401 otherwise,
   before the request counts for anything.
4. A POST must be ``application/json`` (UTF-8; 415 otherwise, which also blocks
   cross-site "simple" form posts), state a ``Content-Length`` (411 without; chunked
   bodies are refused), at most :attr:`ServeLimits.max_body_bytes` (413 before a byte
   of the body is read), and arrive within :attr:`ServeLimits.read_timeout` seconds
   (408, connection closed). The request line and headers have the same deadline
   (:func:`guarded_h11`), so a slow client cannot hold a connection open.
5. Only then, with the whole request read, does it take one of the
   :attr:`ServeLimits.max_in_flight` places (503 with ``Retry-After`` beyond); one
   generation runs at a time (the model is shared). A client that disconnects stops
   its generation before the next token, and its place is free again.

Connections are capped too (:class:`ConnectionGate`): at most
:attr:`ServeLimits.max_client_connections` per client address and
:attr:`ServeLimits.max_connections` in all. A connection over a cap closes the oldest
one that has not yet carried a complete, authorised request (a silent one first, the
client's own first), never one that has: idle, half-open or slow sockets, however many,
however renewed and from whatever address, never push out a real client's connection
once its first bytes are in, or turn its complete request away (a connection that has
not spoken yet looks silent: it is safe while its request arrives before
``max_client_connections`` newer sockets from its address do); only when no connection
is still unproven is the newcomer refused (503).

The body is then parsed with bounded depth and digits (:func:`core.base.safeio.parse_json`)
and every field is checked (:func:`parse_request`): ``model`` must be the served name
(404), ``temperature``/``top_p``/``max_tokens``/``seed`` finite and in range, the
prompt's length checked in characters before it is tokenized, then in tokens against
the context. Every error, expected or not, is an HTTP reply with an OpenAI-style body
``{"error": {"message", "type", "param", "code"}}``; nothing reaches the client as a
traceback, and nothing a client sends can stop the server.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import json
import math
import select
import socket
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import uvicorn
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from uvicorn.protocols.http.h11_impl import STATUS_PHRASES, H11Protocol

from core.base.errors import DataError
from core.base.safeio import MiB, parse_json
from core.engine.chat_template import render_chat, template_of
from core.engine.generate import AnswerStream, GenerationConfig
from core.engine.model import LoadedModel

DEFAULT_MAX_TOKENS = 256
ENV_API_KEY = "RAGSCOPE_SERVE_API_KEY"
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
MAX_SEED = 2**63 - 1
MAX_HEADER_BYTES = 16 * 1024
# The Streamlit app (``make app``, port 8501) is the one web page that may call.
DEFAULT_ORIGINS = ("http://localhost:8501", "http://127.0.0.1:8501")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


@dataclass(frozen=True, kw_only=True)
class ServeLimits:
    """What one client may ask of the server.

    Attributes:
        max_body_bytes: Largest request body (JSON) accepted.
        read_timeout: Seconds a client has to send the request line and headers, and
            again the body.
        max_in_flight: Requests admitted at once (queued behind the one generating);
            a request is admitted once it is complete (headers and body) and authorised.
        max_prompt_chars: Characters of message content accepted before tokenizing
            (``None``: 16 per token of the model's context).
        max_messages: Messages per request.
        max_connections: Open connections in all (more than ``max_in_flight``, so the
            admitted requests can never fill them).
        max_client_connections: Open connections from one client address.
        allow_origins: The web origins (``scheme://host[:port]``) whose pages may call,
            by default the Streamlit app's; a request with another ``Origin`` is refused.
    """

    max_body_bytes: int = 1 * MiB
    read_timeout: float = 10.0
    max_in_flight: int = 4
    max_prompt_chars: int | None = None
    max_messages: int = 256
    max_connections: int = 64
    max_client_connections: int = 16
    allow_origins: tuple[str, ...] = DEFAULT_ORIGINS

    def __post_init__(self) -> None:
        if self.max_body_bytes < 1024:
            raise DataError(f"max_body_bytes must be at least 1024, got {self.max_body_bytes}")
        if not (math.isfinite(self.read_timeout) and self.read_timeout > 0):
            raise DataError(f"read_timeout must be positive seconds, got {self.read_timeout}")
        if self.max_in_flight < 1:
            raise DataError(f"max_in_flight must be at least 1, got {self.max_in_flight}")
        if self.max_prompt_chars is not None and self.max_prompt_chars < 1:
            raise DataError(f"max_prompt_chars must be positive, got {self.max_prompt_chars}")
        if self.max_client_connections < 1:
            raise DataError(
                f"max_client_connections must be at least 1, got {self.max_client_connections}"
            )
        if self.max_connections < max(self.max_client_connections, self.max_in_flight + 1):
            raise DataError(
                f"max_connections must be at least max_client_connections "
                f"({self.max_client_connections}) and more than max_in_flight "
                f"({self.max_in_flight}), got {self.max_connections}"
            )
        allowed_origins(self.allow_origins)

    def prompt_chars(self, n_ctx: int) -> int:
        return self.max_prompt_chars if self.max_prompt_chars is not None else 16 * n_ctx


class RequestError(Exception):
    """A request the server refuses: its HTTP status and OpenAI-style error fields."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",  # noqa: A002 (the OpenAI field's name)
        param: str | None = None,
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
        close: bool = False,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = dict(headers or {})
        self.close = close

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


# ----------------------------------------------------------------------------- requests


@dataclass(frozen=True, kw_only=True)
class ChatRequest:
    """A checked ``/chat/completions`` request."""

    messages: tuple[tuple[str, str], ...]
    max_tokens: int
    temperature: float
    top_p: float
    seed: int


def _number(body: Mapping[str, Any], key: str, lo: float, hi: float, default: float) -> float:
    v = body.get(key)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise RequestError(400, f"{key} must be a number, got {type(v).__name__}", param=key)
    x = float(v)  # an int too large for a float is refused below as not finite
    if not math.isfinite(x) or not lo <= x <= hi:
        raise RequestError(400, f"{key} must be a finite number in [{lo:g}, {hi:g}]", param=key)
    return x


def _integer(body: Mapping[str, Any], key: str, lo: int, hi: int, default: int) -> int:
    v = body.get(key)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int):
        raise RequestError(400, f"{key} must be a whole number, got {type(v).__name__}", param=key)
    if not lo <= v <= hi:
        raise RequestError(400, f"{key} must be in [{lo}, {hi}]", param=key)
    return v


def parse_request(body: Any, *, served: str, n_ctx: int, limits: ServeLimits) -> ChatRequest:
    """Check a parsed ``/chat/completions`` body.

    Raises:
        RequestError: 400 for a malformed field (named in ``param``), 404 for another
            model than ``served``.
    """
    if not isinstance(body, dict):
        raise RequestError(400, "the request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str):
        raise RequestError(400, "model is required (a string)", param="model")
    if model != served:
        raise RequestError(
            404,
            f"the model {model[:100]!r} does not exist here; this server serves {served!r}",
            param="model",
            code="model_not_found",
        )
    if body.get("stream"):
        raise RequestError(400, "streaming is not supported; leave stream unset", param="stream")
    if body.get("n") not in (None, 1):
        raise RequestError(400, "n must be 1", param="n")
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw:
        raise RequestError(
            400, "messages must be a non-empty list of {role, content}", param="messages"
        )
    if len(raw) > limits.max_messages:
        raise RequestError(
            400, f"at most {limits.max_messages} messages per request", param="messages"
        )
    messages = []
    for i, m in enumerate(raw):
        if not isinstance(m, dict) or not isinstance(m.get("content"), str):
            raise RequestError(400, f"messages[{i}] needs a string content", param="messages")
        role = m.get("role")
        if role not in ("system", "user", "assistant"):
            raise RequestError(
                400, f"messages[{i}] has an unknown role {str(role)[:40]!r}", param="messages"
            )
        messages.append((role, m["content"]))
    chars = sum(len(c) for _, c in messages)
    cap = limits.prompt_chars(n_ctx)
    if chars > cap:
        raise RequestError(
            400,
            f"the messages hold {chars:,} characters, over this server's {cap:,}; send a "
            "shorter prompt",
            param="messages",
            code="context_length_exceeded",
        )
    for s in (c for _, c in messages):
        if any(0xD800 <= ord(ch) <= 0xDFFF for ch in s):
            raise RequestError(400, "messages hold a lone UTF-16 surrogate", param="messages")
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    return ChatRequest(
        messages=tuple(messages),
        max_tokens=_integer({"max_tokens": max_tokens}, "max_tokens", 1, n_ctx, DEFAULT_MAX_TOKENS),
        temperature=_number(body, "temperature", 0.0, 2.0, 0.0),
        top_p=_number(body, "top_p", 1e-6, 1.0, 1.0),
        seed=_integer(body, "seed", 0, MAX_SEED, 0),
    )


def _prompt_ids(model: LoadedModel, messages: Any) -> list[int]:
    """Token ids of ``messages`` (``(role, content)`` pairs or OpenAI-style dicts) through
    the model's chat template, ready for the answer."""
    clean = [{"role": m[0], "content": m[1]} if isinstance(m, tuple) else dict(m) for m in messages]
    tok = model.tokenizer
    if template_of(tok) is not None:
        text = render_chat(tok, clean, source=model.info.name)
    else:
        text = "\n\n".join(f"{m['role']}: {m['content']}" for m in clean) + "\n\nassistant: "
    return list(tok(text, add_special_tokens=False)["input_ids"])


def complete(
    model: LoadedModel,
    req: ChatRequest,
    name: str,
    *,
    should_stop: Callable[[], bool] | None = None,
) -> dict[str, Any]:
    """One chat completion in the OpenAI response format.

    ``should_stop`` is asked before every token (the client went away: stop there).

    Raises:
        RequestError: The prompt plus ``max_tokens`` is over the model's context (400),
            or ``should_stop`` said stop (499, which nobody is left to read).
    """

    ids = _prompt_ids(model, req.messages)
    if len(ids) + req.max_tokens > model.info.n_ctx:
        raise RequestError(
            400,
            f"the prompt has {len(ids)} tokens and asks for {req.max_tokens} more, over the "
            f"served model's context of {model.info.n_ctx} tokens; send a shorter prompt (fewer "
            "or shorter examples) or a smaller max_tokens",
            param="messages",
            code="context_length_exceeded",
        )
    cfg = GenerationConfig(
        max_new_tokens=req.max_tokens, temperature=req.temperature, top_p=req.top_p, seed=req.seed
    )
    stream = AnswerStream.from_ids(model, ids, cfg, should_stop=should_stop)
    for _ in stream:
        pass
    out = stream.result()
    if out.stop == "cancelled":
        raise RequestError(
            499, "the client went away; generation stopped", code="client_closed", close=True
        )
    return {
        "id": f"chatcmpl-ragscope-{time.time_ns()}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": name,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": out.text.strip()},
                "finish_reason": "stop" if out.stop == "eos" else "length",
            }
        ],
        "usage": {
            "prompt_tokens": len(ids),
            "completion_tokens": len(out.token_ids),
            "total_tokens": len(ids) + len(out.token_ids),
        },
    }


# ----------------------------------------------------------------------------- the guard

Peer = tuple[str, int]
Origin = tuple[str, str, int]


def is_loopback_host(host: str) -> bool:
    """Whether ``host`` (a name or address, no port) is this machine's loopback."""
    h = host.strip().lower().strip("[]")
    if h in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(h).is_loopback
    except ValueError:
        return False


def _host_of(value: str) -> str:
    """The host of a ``Host`` header (``name``, ``name:port``, ``[v6]:port``)."""
    v = value.strip()
    if v.startswith("["):
        return v[1 : v.find("]")] if "]" in v else v
    return v.rsplit(":", 1)[0] if v.count(":") == 1 else v


def _origin(value: str) -> Origin | None:
    """``(scheme, host, port)`` of a web origin as browsers send it (``null``, a path,
    credentials or another scheme: ``None``)."""
    try:
        parts = urlsplit(value.strip())
        port = parts.port
    except ValueError:
        return None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return None
    if parts.path not in ("", "/") or parts.query or parts.fragment or "@" in parts.netloc:
        return None
    default = 443 if parts.scheme == "https" else 80
    return parts.scheme, parts.hostname.lower(), port if port is not None else default


def allowed_origins(values: Iterable[str]) -> frozenset[Origin]:
    """The origins a browser page may call from (``--allow-origin``), checked.

    Raises:
        DataError: A value that is not an origin (``scheme://host[:port]``).
    """
    out = set()
    for v in values:
        o = _origin(v)
        if o is None:
            raise DataError(
                f"{v[:200]!r} is not a web origin; give scheme://host[:port] as the browser "
                "shows it, e.g. http://localhost:8501",
                field="allow_origin",
            )
        out.add(o)
    return frozenset(out)


def _header_bytes(scope: Scope) -> int:
    """Bytes of the request line and headers as sent (give or take whitespace)."""
    line = len(scope.get("method", "")) + len(scope.get("raw_path") or b"") + 12
    line += len(scope.get("query_string") or b"") + 1
    return line + sum(len(k) + len(v) + 4 for k, v in scope.get("headers", ()))


def _error_bytes(err: RequestError) -> bytes:
    """``err`` as a whole HTTP/1.1 reply that closes the connection (for a connection
    refused before any request was read)."""
    data = json.dumps(err.body()).encode("utf-8")
    head = f"HTTP/1.1 {err.status} {STATUS_PHRASES[err.status].decode('latin-1')}\r\n"
    head += f"content-type: application/json\r\ncontent-length: {len(data)}\r\n"
    head += "".join(f"{k.lower()}: {v}\r\n" for k, v in err.headers.items())
    return (head + "connection: close\r\n\r\n").encode("latin-1") + data


async def send_error(send: Send, err: RequestError) -> None:
    """Reply with ``err`` as JSON (and ``Connection: close`` when the body is unread)."""
    data = json.dumps(err.body()).encode("utf-8")
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(data)).encode()),
    ]
    headers += [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in err.headers.items()]
    if err.close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": err.status, "headers": headers})
    await send({"type": "http.response.body", "body": data})


class ConnectionGate:
    """The server's open connections, oldest first, and what each has done.

    A connection is *trusted* once it has carried a complete, authorised request (the
    guard admitted it), *busy* while the guard answers one on it, and otherwise
    *pending*: it has not yet proved anything, whether it said nothing (a half-open
    socket) or started a request. A connection over a cap (per client address, then in
    all) closes the oldest pending one that has sent nothing, else the oldest pending
    one, the client's own first. A newcomer is pending, so it never pushes out a trusted
    or busy connection: a flood of half-open sockets, however many and however renewed,
    and whoever sends it (the same address as a real client's, on one machine), only
    ever closes its own kind. Only when no connection under the cap is pending is the
    newcomer refused (503). Used from the server's event loop only (no lock).
    """

    def __init__(self, *, max_connections: int, max_per_client: int) -> None:
        self.max_connections = max_connections
        self.max_per_client = max_per_client
        self._open: dict[Peer, asyncio.BaseTransport] = {}
        self._busy: set[Peer] = set()
        self._trusted: set[Peer] = set()
        self._spoke: set[Peer] = set()

    def __len__(self) -> int:
        return len(self._open)

    def admit(self, peer: Peer, transport: asyncio.BaseTransport) -> RequestError | None:
        """Register a new connection, making room if need be; the refusal if there is none."""
        mine = [p for p in self._open if p[0] == peer[0]]
        if len(mine) >= self.max_per_client and not self._evict(mine):
            return RequestError(
                503,
                f"all {len(mine)} connections from {peer[0]} are answering or have answered "
                f"requests (at most {self.max_per_client} per client); retry when one is free",
                type="server_error",
                code="too_many_connections",
                headers={"Retry-After": "1"},
            )
        if len(self._open) >= self.max_connections and not self._evict(list(self._open)):
            return RequestError(
                503,
                f"all {len(self._open)} connections are answering or have answered requests; "
                "retry shortly",
                type="server_error",
                code="too_many_connections",
                headers={"Retry-After": "1"},
            )
        self._open[peer] = transport
        return None

    def _evict(self, peers: list[Peer]) -> bool:
        """Close the oldest pending connection of ``peers`` that has sent nothing, else the
        oldest pending one; ``False`` when every one is trusted or busy. A connection
        whose bytes wait unread in its socket (the server accepts connections in batches
        before it reads them) has spoken."""
        pending = [p for p in peers if p not in self._busy and p not in self._trusted]
        self._spoke |= self._waiting([p for p in pending if p not in self._spoke])
        silent = [p for p in pending if p not in self._spoke]
        for p in silent or pending:
            self._forget(p).close()
            return True
        return False

    def _waiting(self, peers: list[Peer]) -> set[Peer]:
        """Those of ``peers`` with bytes to read already (one ``poll`` without waiting)."""
        by_fd: dict[int, Peer] = {}
        for p in peers:
            sock = self._open[p].get_extra_info("socket")
            fd = sock.fileno() if sock is not None else -1
            if fd >= 0:
                by_fd[fd] = p
        if not by_fd:
            return set()
        poller = select.poll()
        for fd in by_fd:
            poller.register(fd, select.POLLIN)
        return {by_fd[fd] for fd, ev in poller.poll(0) if ev & select.POLLIN}

    def _forget(self, peer: Peer) -> asyncio.BaseTransport:
        self._busy.discard(peer)
        self._trusted.discard(peer)
        self._spoke.discard(peer)
        return self._open.pop(peer)

    def closed(self, peer: Peer, transport: asyncio.BaseTransport) -> None:
        if self._open.get(peer) is transport:
            self._forget(peer)

    def spoke(self, peer: Peer) -> None:
        """The connection has sent bytes (it is no longer a silent, half-open socket)."""
        if peer in self._open:
            self._spoke.add(peer)

    def hold(self, peer: Peer) -> None:
        """The connection carries an admitted request: trusted from now on, and never
        closed to make room while busy."""
        if peer in self._open:
            self._busy.add(peer)
            self._trusted.add(peer)

    def release(self, peer: Peer) -> None:
        self._busy.discard(peer)


class Guard:
    """ASGI middleware: every check of the module docstring before a handler runs, then
    the checked body handed on (the handler's ``receive`` replays it)."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        limits: ServeLimits,
        api_key: str | None,
        loopback_only: bool,
        origins: frozenset[Origin],
        gate: ConnectionGate | None = None,
    ) -> None:
        self.app = app
        self.limits = limits
        self.api_key = api_key
        self.loopback_only = loopback_only
        self.origins = origins
        self.gate = gate
        self.in_flight = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            if scope["type"] == "lifespan":
                await self.app(scope, receive, send)
            return  # websockets: not served (closing without accepting refuses them)
        try:
            self._check_headers(scope)
            body = await self._read_body(scope, receive)
        except RequestError as e:
            await send_error(send, e)
            return
        # Only a complete, authorised request takes a place: idle and slow clients never do.
        if self.in_flight >= self.limits.max_in_flight:
            await send_error(
                send,
                RequestError(
                    503,
                    f"the server is busy ({self.in_flight} requests in flight); retry shortly",
                    type="server_error",
                    code="overloaded",
                    headers={"Retry-After": "1"},
                    close=True,
                ),
            )
            return
        peer = scope.get("client")
        self.in_flight += 1
        if self.gate is not None and peer:
            self.gate.hold(peer)
        try:
            await self.app(scope, _replay(body, receive), send)
        finally:
            self.in_flight -= 1
            if self.gate is not None and peer:
                self.gate.release(peer)

    def _check_headers(self, scope: Scope) -> None:
        size = _header_bytes(scope)
        if size > MAX_HEADER_BYTES:
            raise RequestError(
                431,
                f"the request line and headers are {size:,} bytes, over this server's "
                f"{MAX_HEADER_BYTES:,}; send fewer or shorter headers",
                close=True,
            )
        headers = _headers(scope)
        if self.loopback_only:
            host = headers.get("host")
            if host is None or not is_loopback_host(_host_of(host)):
                raise RequestError(
                    403,
                    "this server answers only requests addressed to localhost (Host header)",
                    type="permission_error",
                    close=True,
                )
        origin = headers.get("origin")
        if origin is not None and _origin(origin) not in self.origins:
            allowed = ", ".join(f"{s}://{h}:{p}" for s, h, p in sorted(self.origins)) or "none"
            raise RequestError(
                403,
                f"requests from the web page {origin[:100]!r} are refused (Origin header); "
                f"this server accepts {allowed} (serve-llm --allow-origin)",
                type="permission_error",
                close=True,
            )
        if self.api_key is not None:
            auth = headers.get("authorization", "")
            scheme, _, token = auth.partition(" ")
            ok = scheme.lower() == "bearer" and hmac.compare_digest(
                token.strip().encode("utf-8", "replace"), self.api_key.encode("utf-8")
            )
            if not ok:
                raise RequestError(
                    401,
                    "missing or wrong API key; send Authorization: Bearer <key>",
                    type="invalid_request_error",
                    code="invalid_api_key",
                    headers={"WWW-Authenticate": "Bearer"},
                    close=True,
                )
        if scope["method"] not in ("POST", "PUT", "PATCH"):
            return
        ctype = headers.get("content-type", "")
        media, _, params = ctype.partition(";")
        charset = params.strip().lower().removeprefix("charset=").strip('"') if params else "utf-8"
        if media.strip().lower() != "application/json" or charset not in ("utf-8", "utf8"):
            raise RequestError(
                415,
                f"Content-Type must be application/json (UTF-8), got {ctype[:80]!r}",
                close=True,
            )
        if "transfer-encoding" in headers:
            raise RequestError(
                411, "chunked bodies are not accepted; send a Content-Length", close=True
            )
        length = headers.get("content-length")
        if length is None:
            raise RequestError(411, "a Content-Length header is required", close=True)
        if not length.isdigit() or len(length) > 18:
            raise RequestError(400, f"bad Content-Length {length[:40]!r}", close=True)
        if int(length) > self.limits.max_body_bytes:
            raise RequestError(
                413,
                f"the body is {int(length):,} bytes, over this server's "
                f"{self.limits.max_body_bytes:,}",
                close=True,
            )

    async def _read_body(self, scope: Scope, receive: Receive) -> bytes:
        if scope["method"] not in ("POST", "PUT", "PATCH"):
            return b""
        declared = int(_headers(scope)["content-length"])
        chunks: list[bytes] = []
        got = 0
        try:
            async with asyncio.timeout(self.limits.read_timeout):
                while True:
                    msg = await receive()
                    if msg["type"] == "http.disconnect":
                        raise RequestError(400, "the client went away", close=True)
                    part = msg.get("body", b"")
                    got += len(part)
                    if got > declared or got > self.limits.max_body_bytes:
                        raise RequestError(413, "the body is longer than stated", close=True)
                    chunks.append(part)
                    if not msg.get("more_body", False):
                        break
        except TimeoutError:
            raise RequestError(
                408,
                f"the body did not arrive within {self.limits.read_timeout:g} s",
                close=True,
            ) from None
        return b"".join(chunks)


def _headers(scope: Scope) -> dict[str, str]:
    """Header name -> value (the first of repeated ones; names lowercased by the server)."""
    out: dict[str, str] = {}
    for k, v in scope.get("headers", ()):
        out.setdefault(k.decode("latin-1").lower(), v.decode("latin-1"))
    return out


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


# ----------------------------------------------------------------------------- the app


async def _watch_disconnect(receive: Receive, gone: threading.Event) -> None:
    """Set ``gone`` when the client disconnects (the request's body is already read, so
    the next message is the disconnect)."""
    while (await receive())["type"] != "http.disconnect":
        pass
    gone.set()


def make_app(
    model: LoadedModel,
    *,
    name: str | None = None,
    limits: ServeLimits | None = None,
    api_key: str | None = None,
    loopback_only: bool = True,
    gate: ConnectionGate | None = None,
) -> ASGIApp:
    """The guarded ASGI app answering the routes in the module docstring (with ``gate``,
    the connections of a server built by :func:`make_server`)."""
    served = name or model.info.display_name
    lim = limits or ServeLimits()
    lock = threading.Lock()  # one generation at a time: the model is shared

    def error(err: RequestError) -> JSONResponse:
        headers = dict(err.headers)
        if err.close:
            headers["Connection"] = "close"
        return JSONResponse(err.body(), status_code=err.status, headers=headers)

    async def models(request: Request) -> JSONResponse:
        entry: dict[str, object] = {"id": served, "object": "model", "owned_by": "ragscope"}
        entry["max_model_len"] = model.info.n_ctx
        return JSONResponse({"object": "list", "data": [entry]})

    def run(req: ChatRequest, gone: threading.Event) -> dict[str, Any]:
        # Wait for the model in short steps: a client that leaves the queue leaves at once.
        while not lock.acquire(timeout=0.05):
            if gone.is_set():
                raise RequestError(499, "the client went away", code="client_closed", close=True)
        try:
            return complete(model, req, served, should_stop=gone.is_set)
        finally:
            lock.release()

    async def chat(request: Request) -> JSONResponse:
        try:
            body = parse_json(await request.body(), source="the request body")
        except DataError as e:
            return error(RequestError(400, e.reason))
        gone = threading.Event()
        watcher = asyncio.ensure_future(_watch_disconnect(request.receive, gone))
        try:
            req = parse_request(body, served=served, n_ctx=model.info.n_ctx, limits=lim)
            return JSONResponse(await run_in_threadpool(run, req, gone))
        except RequestError as e:
            return error(e)
        finally:
            watcher.cancel()

    async def http_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, HTTPException)
        msg = {404: f"no route {request.url.path[:200]}", 405: "method not allowed"}.get(
            exc.status_code, str(exc.detail)
        )
        return error(RequestError(exc.status_code, msg, headers=exc.headers))

    async def server_error(request: Request, exc: Exception) -> JSONResponse:
        return error(RequestError(500, "internal error; see the server log", type="server_error"))

    app = Starlette(
        routes=[
            Route("/v1/models", models, methods=["GET"]),
            Route("/v1/chat/completions", chat, methods=["POST"]),
        ],
        exception_handlers={HTTPException: http_error, Exception: server_error},
    )
    return Guard(
        app,
        limits=lim,
        api_key=api_key,
        loopback_only=loopback_only,
        origins=allowed_origins(lim.allow_origins),
        gate=gate,
    )


# ----------------------------------------------------------------------------- the server


def guarded_h11(header_timeout: float, gate: ConnectionGate) -> type[H11Protocol]:
    """uvicorn's h11 protocol with a deadline for each request's line and headers, and
    every connection admitted through ``gate``.

    uvicorn closes idle keep-alive connections but has no deadline for a request that
    has started and never completes its headers; without one a client trickling bytes
    holds a connection forever. Its own ``limit_concurrency`` counts idle connections
    too (forty half-open sockets answered everyone else 503); the gate replaces it.
    """

    class GuardedH11Protocol(H11Protocol):
        _timer: asyncio.TimerHandle | None = None
        _armed_for: object = None
        _admitted = False
        _spoken = False

        def _arm(self) -> None:
            self._disarm()
            self._armed_for = self.cycle
            self._timer = self.loop.call_later(header_timeout, self._late)

        def _disarm(self) -> None:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None

        def _late(self) -> None:
            if self.cycle is self._armed_for and not self.transport.is_closing():
                self.transport.close()

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]  # uvicorn's protocol is only ever given a Transport
            super().connection_made(transport)
            if self.client is not None:
                refused = gate.admit(self.client, transport)
                if refused is not None:
                    transport.write(_error_bytes(refused))
                    transport.close()
                    return
                self._admitted = True
            self._arm()

        def data_received(self, data: bytes) -> None:
            if self._admitted and not self._spoken and self.client is not None:
                self._spoken = True
                gate.spoke(self.client)
            super().data_received(data)

        def handle_events(self) -> None:
            super().handle_events()
            if self._timer is not None and self.cycle is not self._armed_for:
                self._disarm()  # a new request's headers are in

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            if self._admitted and self.client is not None:
                gate.closed(self.client, self.transport)
            super().connection_lost(exc)

    return GuardedH11Protocol


@dataclass
class RunningServer:
    """A server started by :func:`start`: its address, and :meth:`stop`."""

    server: uvicorn.Server
    thread: threading.Thread | None
    host: str
    port: int

    @property
    def base_url(self) -> str:
        h = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{h}:{self.port}/v1"

    def stop(self, timeout: float = 10.0) -> None:
        self.server.should_exit = True
        if self.thread is not None:
            self.thread.join(timeout)


def make_server(
    model: LoadedModel,
    host: str = "127.0.0.1",
    port: int = 8000,
    *,
    name: str | None = None,
    limits: ServeLimits | None = None,
    api_key: str | None = None,
) -> tuple[uvicorn.Server, socket.socket]:
    """A uvicorn server for :func:`make_app` and its bound (not yet serving) socket.

    Raises:
        DataError: A non-loopback address without an API key (anyone on the network
            could use the model), or an address that cannot be bound.
    """
    lim = limits or ServeLimits()
    loopback = is_loopback_host(host)
    if not loopback and not api_key:
        raise DataError(
            f"serving on {host} reaches other machines; set an API key (--api-key or "
            f"{ENV_API_KEY}) or keep the default 127.0.0.1",
            field="host",
        )
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.create_server((host, port), family=family, reuse_port=False)
    except OSError as e:
        raise DataError(f"cannot listen on {host}:{port} ({e.strerror or e})", field="port") from e
    gate = ConnectionGate(
        max_connections=lim.max_connections, max_per_client=lim.max_client_connections
    )
    app = make_app(model, name=name, limits=lim, api_key=api_key, loopback_only=loopback, gate=gate)
    config = uvicorn.Config(
        app,
        http=guarded_h11(lim.read_timeout, gate),
        lifespan="off",
        ws="none",
        log_level="warning",
        access_log=False,
        server_header=False,
        timeout_keep_alive=5,
        # Not uvicorn's limit: it counts idle connections too, so they could fill it and
        # turn every real request away (503). The gate caps connections instead.
        limit_concurrency=None,
        h11_max_incomplete_event_size=MAX_HEADER_BYTES,
    )
    return uvicorn.Server(config), sock


def start(
    model: LoadedModel,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    name: str | None = None,
    limits: ServeLimits | None = None,
    api_key: str | None = None,
    timeout: float = 30.0,
) -> RunningServer:
    """Serve in a background thread until :meth:`RunningServer.stop` (tests, notebooks)."""
    server, sock = make_server(model, host, port, name=name, limits=limits, api_key=api_key)
    bound = sock.getsockname()
    t = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    t.start()
    deadline = time.monotonic() + timeout
    while not server.started:
        if not t.is_alive() or time.monotonic() > deadline:
            raise DataError(f"the server on {host}:{bound[1]} did not start")
        time.sleep(0.02)
    return RunningServer(server=server, thread=t, host=bound[0], port=bound[1])
