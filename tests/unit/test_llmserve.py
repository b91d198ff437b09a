"""The local OpenAI-compatible endpoint (``ragscope serve-llm``).

In-process (uvicorn in a thread): the openai client (through core.explain) gets the
model's own continuation; the models route; field checks. Then the CLI's server in a
subprocess faces a bounded loop of malformed and hostile requests (each on a socket
with a timeout), slow clients, oversize bodies and headers and foreign origins, and
still answers a normal chat request at the end, with its peak memory barely moved.
Last, in-process servers on 127.0.0.1 (the tiny model, each forward slowed to a known
pace) face crowds of idle sockets from several loopback addresses, a full house and
clients that walk away mid-generation. Every loop is bounded; every socket has a timeout.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import select
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from core.base.errors import DataError
from core.base.llm import LLMEndpoint, chat, probe_context
from core.engine.generate import AnswerStream, GenerationConfig
from core.services.llmserve import (
    MAX_HEADER_BYTES,
    ServeLimits,
    _prompt_ids,
    is_loopback_host,
    make_server,
    start,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")

KEY = "s3cret-test-key"
NAME = "tiny-random-llama (seed 0)"


@pytest.fixture(scope="module")
def base_url(tiny_model) -> Iterator[str]:
    srv = start(tiny_model, name="tiny-served")
    yield srv.base_url
    srv.stop()


def _post(url: str, body: dict, headers: dict | None = None) -> tuple[int, dict]:
    host, port = url.split("//")[1].split("/")[0].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    try:
        conn.request(
            "POST",
            "/v1/chat/completions",
            body=json.dumps(body).encode(),
            headers={"Content-Type": "application/json", **(headers or {})},
        )
        r = conn.getresponse()
        return r.status, json.loads(r.read())
    finally:
        conn.close()


def test_the_openai_client_gets_the_models_own_answer(tiny_model, base_url) -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    body = {"model": "tiny-served", "messages": messages, "max_tokens": 5, "temperature": 1.0}
    status, reply = _post(base_url, body)
    assert status == 200
    ids = _prompt_ids(tiny_model, messages)
    stream = AnswerStream.from_ids(
        tiny_model, ids, GenerationConfig(max_new_tokens=5, temperature=1.0, seed=0)
    )
    want = "".join(stream).strip()
    assert reply["choices"][0]["message"]["content"] == want
    assert reply["usage"]["prompt_tokens"] == len(ids) and reply["model"] == "tiny-served"
    # Through ragscope's own client (the openai SDK), as the explanations use it.
    endpoint = LLMEndpoint(model="tiny-served", base_url=base_url, temperature=1.0, max_retries=0)
    text = chat(endpoint, "Be brief.", "Hi")
    assert isinstance(text, str) and text.strip()


def test_models_route_and_bad_fields(tiny_model, base_url) -> None:
    import urllib.request

    with urllib.request.urlopen(f"{base_url}/models", timeout=30) as r:
        entry = json.loads(r.read())["data"][0]
    assert entry["id"] == "tiny-served" and entry["max_model_len"] == tiny_model.info.n_ctx
    # the explainer reads the served model's context from the listing (to fit its prompts)
    assert probe_context(LLMEndpoint(model="tiny-served", base_url=base_url)) == (
        tiny_model.info.n_ctx
    )
    assert probe_context(LLMEndpoint(model="another", base_url=base_url)) is None
    msg = [{"role": "user", "content": "x"}]
    for body, status, param in (
        ({"model": "tiny-served", "messages": []}, 400, "messages"),
        (
            {"model": "tiny-served", "messages": [{"role": "robot", "content": "x"}]},
            400,
            "messages",
        ),
        ({"model": "tiny-served", "messages": msg, "max_tokens": 10**6}, 400, "max_tokens"),
        ({"model": "gpt-4o", "messages": msg}, 404, "model"),
        ({"messages": msg}, 400, "model"),
        ({"model": "tiny-served", "messages": msg, "stream": True}, 400, "stream"),
    ):
        got, reply = _post(base_url, body)
        assert got == status, body
        assert reply["error"]["param"] == param and reply["error"]["message"]


def test_a_public_address_needs_a_key_and_limits_are_checked(tiny_model) -> None:
    with pytest.raises(DataError, match="API key"):
        make_server(tiny_model, "0.0.0.0", 0)
    with pytest.raises(DataError, match="max_in_flight"):
        ServeLimits(max_in_flight=0)
    assert (
        is_loopback_host("127.0.0.5")
        and is_loopback_host("[::1]")
        and is_loopback_host("LOCALHOST")
    )
    assert not is_loopback_host("localhost.evil.example") and not is_loopback_host("10.0.0.1")


# --------------------------------------------------------------------------- hostile clients

TIMEOUT = 1.5  # the server's --read-timeout in these tests


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Iterator[tuple[int, int]]:
    """``ragscope serve-llm`` on the tiny model in a subprocess: ``(port, pid)``."""
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    env = {**os.environ, "RAGSCOPE_SERVE_API_KEY": KEY}
    cmd = [sys.executable, "-m", "core.cli", "serve-llm", "--model", "tiny", "--device", "cpu"]
    cmd += ["--port", "0", "--max-body-bytes", "65536", "--read-timeout", str(TIMEOUT)]
    cmd += ["--max-in-flight", "2"]
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + 240  # loading is slow on a busy machine
        port = None
        while port is None:
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            m = re.search(r"http://127\.0\.0\.1:(\d+)/v1", log.read_text())
            port = int(m.group(1)) if m else None
            time.sleep(0.2)
        yield port, proc.pid
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


def _raw(
    port: int, data: bytes, *, then: bytes = b"", timeout: float = 10.0
) -> tuple[int, dict[str, str], bytes]:
    """Send ``data`` as is and read the reply; then send ``then`` (a body the server
    refused unread: errors ignored). The status, headers and body of the reply (status
    0: the server closed the connection without one)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        try:
            s.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            pass
        buf = b""
        try:
            while chunk := s.recv(65536):
                buf += chunk
                head, sep, body = buf.partition(b"\r\n\r\n")
                if sep:
                    m = re.search(rb"(?i)content-length: *(\d+)", head)
                    if m and len(body) >= int(m.group(1)):
                        break
        except ConnectionResetError:
            pass
        try:
            s.sendall(then)
        except OSError:
            pass
    if not buf:
        return 0, {}, b""
    head, _, body = buf.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:] if ": " in line)
    return int(lines[0].split()[1]), {k.lower(): v for k, v in headers.items()}, body


def _until_closed(s: socket.socket, within: float) -> bytes | None:
    """Everything the server sends on ``s`` until it closes it (``None``: still open
    after ``within`` seconds)."""
    deadline = time.monotonic() + within
    got = b""
    while (left := deadline - time.monotonic()) > 0:
        if not select.select([s], [], [], left)[0]:
            break
        try:
            chunk = s.recv(65536)
        except (ConnectionResetError, TimeoutError):
            return got
        if not chunk:
            return got
        got += chunk
    return None


def _stating(port: int, length: int) -> bytes:
    """Request headers stating a ``length``-byte body (none of it sent)."""
    return _request(port, b"", headers={"Content-Length": str(length)})


def _request(
    port: int,
    body: bytes,
    *,
    method: str = "POST",
    path: str = "/v1/chat/completions",
    headers: dict[str, str] | None = None,
    auth: bool = True,
) -> bytes:
    h = {"Host": f"127.0.0.1:{port}", "Content-Type": "application/json"}
    h["Content-Length"] = str(len(body))
    if auth:
        h["Authorization"] = f"Bearer {KEY}"
    h.update(headers or {})
    lines = [f"{method} {path} HTTP/1.1"] + [f"{k}: {v}" for k, v in h.items() if v is not None]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def _chat_body(**over) -> bytes:
    body = {"model": NAME, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3}
    return json.dumps({**body, **over}).encode()


def _peak_rss_kib(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"VmHWM:\s+(\d+)", status).group(1))


def test_hostile_requests_get_json_errors_and_the_server_survives(served) -> None:
    port, _ = served
    ok = _chat_body()
    nested = b'{"model": "x", "messages": ' + b"[" * 5000 + b"]" * 5000 + b"}"
    cases: list[tuple[str, bytes, int]] = [
        ("no key", _request(port, ok, auth=False), 401),
        ("wrong key", _request(port, ok, headers={"Authorization": "Bearer nope"}), 401),
        ("basic auth", _request(port, ok, headers={"Authorization": "Basic eDp5"}), 401),
        ("no Content-Length", _request(port, b"", headers={"Content-Length": None}), 411),
        ("bad Content-Length", _request(port, ok, headers={"Content-Length": "12abc"}), 400),
        ("negative length", _request(port, ok, headers={"Content-Length": "-5"}), 400),
        ("chunked", _request(port, b"", headers={"Transfer-Encoding": "chunked"}), 411),
        ("text/plain", _request(port, ok, headers={"Content-Type": "text/plain"}), 415),
        (
            "form post",
            _request(port, ok, headers={"Content-Type": "application/x-www-form-urlencoded"}),
            415,
        ),
        (
            "latin-1 JSON",
            _request(port, ok, headers={"Content-Type": "application/json; charset=latin-1"}),
            415,
        ),
        ("not JSON", _request(port, b"hello, world"), 400),
        ("not UTF-8", _request(port, b'{"model": "\xff\xfe"}'), 400),
        ("truncated JSON", _request(port, ok[:-3]), 400),
        ("deeply nested", _request(port, nested), 400),
        ("huge integer", _request(port, b'{"max_tokens": ' + b"9" * 5000 + b"}"), 400),
        ("a list body", _request(port, b"[1, 2, 3]"), 400),
        (
            "NaN temperature",
            _request(port, ok.replace(b'"max_tokens": 3', b'"temperature": NaN')),
            400,
        ),
        (
            "infinite top_p",
            _request(port, ok.replace(b'"max_tokens": 3', b'"top_p": Infinity')),
            400,
        ),
        ("temperature 3", _request(port, _chat_body(temperature=3)), 400),
        ("temperature text", _request(port, _chat_body(temperature="hot")), 400),
        ("top_p 0", _request(port, _chat_body(top_p=0)), 400),
        ("max_tokens 0", _request(port, _chat_body(max_tokens=0)), 400),
        ("max_tokens true", _request(port, _chat_body(max_tokens=True)), 400),
        ("max_tokens 1.5", _request(port, _chat_body(max_tokens=1.5)), 400),
        ("max_tokens 10**30", _request(port, _chat_body(max_tokens=10**30)), 400),
        ("seed -1", _request(port, _chat_body(seed=-1)), 400),
        ("seed 2**64", _request(port, _chat_body(seed=2**64)), 400),
        ("unknown model", _request(port, _chat_body(model="gpt-4o")), 404),
        (
            "lone surrogate",
            _request(
                port, _chat_body()[:-1] + b', "messages": [{"role": "user", "content": "\\ud800"}]}'
            ),
            400,
        ),
        (
            "too many chars",
            _request(port, _chat_body(messages=[{"role": "user", "content": "x" * 40_000}])),
            400,
        ),
        (
            "over the context",
            _request(
                port, _chat_body(messages=[{"role": "user", "content": "ab " * 8000}], max_tokens=8)
            ),
            400,
        ),
        ("foreign Host", _request(port, ok, headers={"Host": "evil.example"}), 403),
        ("rebinding Host", _request(port, ok, headers={"Host": f"attacker.example:{port}"}), 403),
        ("foreign Origin", _request(port, ok, headers={"Origin": "https://evil.example"}), 403),
        ("opaque Origin", _request(port, ok, headers={"Origin": "null"}), 403),
        ("unknown route", _request(port, ok, path="/v1/embeddings"), 404),
        ("wrong method", _request(port, b"", method="DELETE", path="/v1/models"), 405),
        ("over the body cap", _stating(port, 70_000), 413),
        ("garbage", b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\0" * 64, 400),
        (
            "header bomb",
            b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nX: " + b"a" * 2**20,
            400,
        ),
    ]
    seen = []
    for what, data, want in cases:
        status, headers, body = _raw(port, data)
        seen.append((what, status))
        assert status == want, (what, status, body[:300])
        if status != 400 or headers.get("content-type") == "application/json":
            err = json.loads(body)["error"]
            assert err["message"] and "Traceback" not in err["message"], what
    # the rest of the contract: loopback Host names and Origins are served
    for headers in ({"Host": f"localhost:{port}"}, {"Origin": "http://localhost:8501"}):
        status, _, body = _raw(port, _request(port, _chat_body(), headers=headers))
        assert status == 200, (headers, body[:300])
    # ... and after all that, a normal request through the openai client still works
    endpoint = LLMEndpoint(
        model=NAME, base_url=f"http://127.0.0.1:{port}/v1", api_key=KEY, max_retries=0
    )
    assert chat(endpoint, "Be brief.", "Hi").strip()
    assert len(seen) == len(cases)


def test_slow_clients_are_cut_off_at_the_timeout(served) -> None:
    port, _ = served
    # Headers in, body trickling: 408 and the connection closed, at the timeout.
    t0 = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(_stating(port, 100) + b"{")
        reply = b""
        while chunk := s.recv(4096):
            reply += chunk
    took = time.monotonic() - t0
    assert reply.startswith(b"HTTP/1.1 408") and b"did not arrive" in reply
    assert TIMEOUT - 0.2 < took < TIMEOUT + 3
    # Headers never finished: the connection is closed at the timeout, without a reply.
    t0 = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        assert s.recv(4096) == b""
    assert TIMEOUT - 0.2 < time.monotonic() - t0 < TIMEOUT + 3


def test_unfinished_requests_hold_no_place(served) -> None:
    """Headers in and the body never sent (the server's --max-in-flight is 2): those
    requests are not admitted, so a complete one is answered beside them."""
    port, _ = served
    held = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(5)]
    try:
        for s in held:
            s.sendall(_stating(port, 50))
        time.sleep(0.3)
        status, _, body = _raw(port, _request(port, _chat_body()))
        assert status == 200, body[:300]
    finally:
        for s in held:
            s.close()


def test_unauthorised_requests_are_refused_at_once_and_closed(served) -> None:
    """No key: 401 before the (never sent) body is awaited, and the connection closed."""
    port, _ = served
    t0 = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(_request(port, b"", auth=False, headers={"Content-Length": "50"}))
        reply = _until_closed(s, 5.0)
    assert reply is not None and reply.startswith(b"HTTP/1.1 401"), reply
    assert b"invalid_api_key" in reply and b"connection: close" in reply.lower()
    assert time.monotonic() - t0 < TIMEOUT, "the 401 waited for the body"


def test_the_header_cap_holds_however_the_headers_arrive(served) -> None:
    """16 KiB of request line and headers: in one read (20 KB, 100 KB) or in pieces,
    over it is refused (431, or 400 from h11 for an unfinished block) and the connection
    closed; just under it is served."""
    port, _ = served

    def get(extra: int) -> bytes:
        head = _request(port, b"", method="GET", path="/v1/models", headers={"Content-Type": None})
        return head[:-2] + b"X-Pad: " + b"a" * extra + b"\r\n\r\n"

    for size, pieces in ((20_000, 1), (100_000, 1), (20_000, 10)):
        data = get(size)
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            step = -(-len(data) // pieces)
            try:
                for i in range(0, len(data), step):
                    s.sendall(data[i : i + step])
                    if pieces > 1:
                        time.sleep(0.02)
            except (BrokenPipeError, ConnectionResetError):
                pass  # refused before the rest arrived
            reply = _until_closed(s, 5.0)
        assert reply is not None, f"{size} bytes of headers: the connection stayed open"
        status = reply[:12]
        assert status in (b"HTTP/1.1 431", b"HTTP/1.1 400"), (size, pieces, reply[:200])
        if status == b"HTTP/1.1 431":
            assert b"send fewer or shorter headers" in reply
    under = get(MAX_HEADER_BYTES - len(get(0)) - 64)
    status, _, body = _raw(port, under)
    assert status == 200, body[:300]


def test_only_the_apps_origin_is_accepted(served) -> None:
    """By default the Streamlit app's origins; any other page, another localhost port
    included, gets 403."""
    port, _ = served
    for origin, want in (
        ("http://localhost:8501", 200),
        ("http://127.0.0.1:8501", 200),
        ("http://localhost:9999", 403),
        ("http://127.0.0.1:8000", 403),
        ("http://localhost", 403),
        ("https://localhost:8501", 403),
        ("http://localhost:8501/path", 403),
    ):
        status, _, body = _raw(port, _request(port, _chat_body(), headers={"Origin": origin}))
        assert status == want, (origin, body[:300])
        if want == 403:
            assert origin.encode() in body and b"--allow-origin" in body


def test_oversize_bodies_do_not_grow_the_server(served) -> None:
    port, pid = served
    before = _peak_rss_kib(pid)
    mib = 1024 * 1024
    for _ in range(4):  # stated 64 MiB, then sent: refused after the headers, never read
        status, _, _ = _raw(port, _stating(port, 64 * mib), then=b"x" * (16 * mib))
        assert status == 413
    for _ in range(4):  # stated small, then 16 MiB more: the rest is not a request
        status, _, _ = _raw(port, _request(port, _chat_body()), then=b"y" * (16 * mib))
        assert status == 200
    grew = _peak_rss_kib(pid) - before
    assert grew < 16 * 1024, f"peak RSS grew by {grew} KiB after 128 MiB were sent"
    status, _, _ = _raw(port, _request(port, _chat_body()))
    assert status == 200


# --------------------------------------------------------------------------- crowds and walkouts


class _Paced:
    """The tiny model's HF module with every forward taking at least ``delay`` seconds
    (so a long generation is long on any machine), counting the forwards."""

    def __init__(self, inner, delay: float) -> None:
        self.inner, self.delay, self.calls = inner, delay, 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        time.sleep(self.delay)
        return self.inner(*args, **kwargs)

    def __getattr__(self, name: str):
        return getattr(self.inner, name)


@pytest.fixture
def paced(tiny_model, monkeypatch) -> _Paced:
    slow = _Paced(tiny_model.hf_model, 0.05)
    monkeypatch.setattr(tiny_model, "hf_model", slow)
    return slow


def _from(addr: str, port: int) -> socket.socket:
    """A connection to the server from the loopback address ``addr``."""
    return socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(addr, 0))


def _ask(port: int, body: bytes, *, addr: str = "127.0.0.1", key: str | None = None) -> int:
    """Send a chat request from ``addr`` and wait for the reply: its status (0: closed)."""
    with _from(addr, port) as s:
        s.sendall(
            _request(port, body, auth=False, headers={"Authorization": key and f"Bearer {key}"})
        )
        reply = s.recv(65536)
    return int(reply.split()[1]) if reply else 0


def _open_now(socks: list[socket.socket]) -> list[bool]:
    """Which of ``socks`` the server has not closed (nothing readable within 0.2 s)."""
    ready = set(select.select(socks, [], [], 0.2)[0])
    return [s not in ready for s in socks]


def _settle(socks: list[socket.socket], want: list[bool], within: float = 5.0) -> list[bool]:
    """:func:`_open_now` once it reads ``want`` or ``within`` seconds have passed (a
    loaded machine may take a moment to accept and close)."""
    deadline = time.monotonic() + within
    while (now := _open_now(socks)) != want and time.monotonic() < deadline:
        time.sleep(0.1)
    return now


def test_idle_connections_never_turn_a_request_away(tiny_model) -> None:
    """45 idle sockets (silent, half a request line, headers without their body; no key
    needed), renewed three times, from one address: a real client still gets 200 each
    time, and the server keeps at most its per-client cap of them open."""
    limits = ServeLimits(read_timeout=10.0)
    srv = start(tiny_model, name=NAME, limits=limits, api_key=KEY)
    port = srv.port
    idle: list[socket.socket] = []
    try:
        for _ in range(3):
            for i in range(45):
                s = _from("127.0.0.1", port)
                if i % 3 == 1:
                    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n")
                elif i % 3 == 2:
                    s.sendall(_stating(port, 80))
                idle.append(s)
            time.sleep(0.2)
            assert _ask(port, _chat_body(), key=KEY) == 200
            still = sum(_open_now(idle))
            assert still <= limits.max_client_connections, still
    finally:
        for s in idle:
            s.close()
        srv.stop()


_FLOOD = """
import socket, sys, time
port, rate, seconds = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
window, opened, said = [], 0, False
deadline = time.monotonic() + seconds
while time.monotonic() < deadline:
    due = time.monotonic() + 1.0 / rate
    try:
        window.append(socket.create_connection(("127.0.0.1", port), timeout=2))
        opened += 1
    except OSError:
        pass
    if len(window) > 200:
        window.pop(0).close()
    if opened >= 300 and not said:
        print("flooding", flush=True)
        said = True
    time.sleep(max(0.0, due - time.monotonic()))
print(opened, flush=True)
"""


def test_a_half_open_flood_never_pushes_out_a_real_client(tiny_model) -> None:
    """From the same address as a real client, another process floods the server with
    half-open sockets without the key (1,000 a second, 200 kept open at a time, until
    the client is done): every request of the real client is answered, on its keep-alive
    connection and on fresh ones (before, making room closed the oldest idle connection
    whoever owned it: ~30% reset). A fresh connection sends its request as it opens,
    as a real client does; the gate cannot tell a socket that has not spoken *yet*
    from a silent one, so the flood's pace is bounded: a fresh connection stays safe
    while it speaks before ``max_client_connections`` newer sockets arrive (16 ms
    here; a flood in a thread of this process, sharing its GIL, once delayed the
    client's send past that)."""
    srv = start(tiny_model, name=NAME, limits=ServeLimits(), api_key=KEY)
    port = srv.port
    attacker = subprocess.Popen(
        [sys.executable, "-c", _FLOOD, str(port), "1000", "120"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as kept:
            assert _exchange(kept, _request(port, _chat_body(max_tokens=1))) == 200
            assert attacker.stdout is not None
            assert select.select([attacker.stdout], [], [], 30)[0], "the flood never started"
            assert attacker.stdout.readline().strip() == "flooding"
            statuses = []
            for _ in range(8):
                statuses.append(_exchange(kept, _request(port, _chat_body(max_tokens=1))))
                with socket.create_connection(("127.0.0.1", port), timeout=10) as fresh:
                    statuses.append(_exchange(fresh, _request(port, _chat_body(max_tokens=1))))
            still = attacker.poll() is None
        assert statuses == [200] * 16, statuses
        assert still, "the flood had ended before the last request"
    finally:
        attacker.kill()
        attacker.communicate(timeout=10)
        srv.stop()


def _exchange(sock: socket.socket, request: bytes) -> int:
    """Send ``request`` on ``sock`` and read one whole reply (its ``Content-Length``
    body too, so the connection can carry the next); its status (0: closed, reset)."""
    try:
        sock.sendall(request)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            if not chunk:
                return 0
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        length = int(re.search(rb"(?i)content-length:\s*(\d+)", head).group(1))
        while len(body) < length:
            chunk = sock.recv(65536)
            if not chunk:
                return 0
            body += chunk
        return int(head.split()[1])
    except OSError:
        return 0


def test_connection_caps_close_the_oldest_idle_first(tiny_model, paced) -> None:
    """Per address, then in all, a newcomer closes the oldest idle connection; a
    connection answering an admitted request is never closed to make room, and when
    every one is busy the newcomer gets 503."""
    limits = ServeLimits(read_timeout=10.0, max_connections=8, max_client_connections=4)
    srv = start(tiny_model, name=NAME, limits=limits)
    port = srv.port
    socks: list[socket.socket] = []
    try:
        socks += [_from("127.0.0.1", port) for _ in range(6)]  # a1..a6: a1, a2 make room
        assert _settle(socks, [False, False, True, True, True, True]) == [False] * 2 + [True] * 4
        socks += [_from("127.0.0.2", port) for _ in range(4)]  # b1..b4: 8 open, the cap
        socks.append(_from("127.0.0.3", port))  # c1: over 8 in all, a3 makes room
        assert _settle(socks, [False] * 3 + [True] * 8) == [False] * 3 + [True] * 8
        # a busy connection from 127.0.0.4 stays while 4 more from there come and go
        with _from("127.0.0.4", port) as busy:
            busy.sendall(_request(port, _chat_body(max_tokens=40), auth=False))
            time.sleep(0.5)  # admitted and generating (40 paced tokens: two seconds or more)
            more = [_from("127.0.0.4", port) for _ in range(4)]
            assert _settle(more, [False, True, True, True]) == [False, True, True, True]
            reply = busy.recv(65536)
            assert reply.startswith(b"HTTP/1.1 200"), reply[:200]
            for s in more:
                s.close()
    finally:
        for s in socks:
            s.close()
        srv.stop()
    # every connection busy: the newcomer is told so
    srv = start(
        tiny_model,
        name=NAME,
        limits=ServeLimits(max_in_flight=1, max_connections=2, max_client_connections=1),
    )
    try:
        with _from("127.0.0.1", srv.port) as busy:
            busy.sendall(_request(srv.port, _chat_body(max_tokens=40), auth=False))
            time.sleep(0.5)
            with _from("127.0.0.1", srv.port) as late:
                reply = _until_closed(late, 5.0)
            assert reply is not None and reply.startswith(b"HTTP/1.1 503"), reply
            assert b"too_many_connections" in reply and b"127.0.0.1" in reply
            assert busy.recv(65536).startswith(b"HTTP/1.1 200")
    finally:
        srv.stop()


def test_a_client_that_walks_away_frees_its_place(tiny_model, paced) -> None:
    """Two long generations (400 paced tokens, 20 s or more), one generating and one
    queued, both abandoned: with --max-in-flight 2 the next request is answered within
    a few seconds (a second or less unloaded), and no more tokens are generated for the
    clients that left."""
    srv = start(tiny_model, name=NAME, limits=ServeLimits(max_in_flight=2))
    port = srv.port
    try:
        gone = [_from("127.0.0.1", port) for _ in range(2)]
        for s in gone:
            s.sendall(_request(port, _chat_body(max_tokens=400), auth=False))
        deadline = time.monotonic() + 10
        while paced.calls < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert paced.calls >= 3, "the first generation did not start"
        for s in gone:
            s.close()
        t0 = time.monotonic()
        status = 0
        while status != 200 and time.monotonic() - t0 < 6:
            status = _ask(port, _chat_body(max_tokens=1))
            if status != 200:
                time.sleep(0.1)
        took = time.monotonic() - t0
        assert status == 200 and took < 3.0, (status, took)
        calls = paced.calls
        time.sleep(0.5)
        assert paced.calls == calls, "a generation went on after its client left"
    finally:
        srv.stop()


def test_origins_and_caps_are_checked_when_set(tiny_model) -> None:
    """--allow-origin replaces the default; a value that is not an origin, or caps that
    admitted requests could fill, are refused up front."""
    srv = start(tiny_model, name=NAME, limits=ServeLimits(allow_origins=("http://localhost:9999",)))
    try:
        for origin, want in (("http://localhost:9999", 200), ("http://localhost:8501", 403)):
            status, _, body = _raw(
                srv.port, _request(srv.port, _chat_body(), auth=False, headers={"Origin": origin})
            )
            assert status == want, (origin, body[:300])
    finally:
        srv.stop()
    with pytest.raises(DataError, match="allow_origin.*'localhost:8501' is not a web origin"):
        ServeLimits(allow_origins=("localhost:8501",))
    with pytest.raises(DataError, match="max_connections"):
        ServeLimits(max_in_flight=4, max_connections=4, max_client_connections=4)
