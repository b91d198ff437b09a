"""The shipped deployment for teams (docs/deploy/nginx.conf, parsed with crossplane and
served by a real nginx, and .streamlit/config.toml): what Streamlit itself cannot close,
the proxy does — HTTPS only, Secure cookies, no metrics or agent API from outside,
downloads only for a browser with a login cookie, Streamlit reached on loopback only."""

from __future__ import annotations

import datetime
import ipaddress
import os
import shutil
import socket
import ssl
import subprocess
import threading
import time
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import crossplane
import httpx
import pytest

from tools.browser import stop_process

REPO = Path(__file__).resolve().parents[2]
NGINX = REPO / "docs" / "deploy" / "nginx.conf"
Directive = dict[str, Any]


def _walk(block: list[Directive]) -> Iterator[Directive]:
    for d in block:
        yield d
        yield from _walk(d.get("block") or [])


def _find(block: list[Directive], name: str) -> list[Directive]:
    return [d for d in block if d["directive"] == name]


@pytest.fixture(scope="module")
def servers() -> list[Directive]:
    parsed = crossplane.parse(str(NGINX))
    assert parsed["status"] == "ok", parsed["errors"]
    top = parsed["config"][0]["parsed"]
    (http,) = _find(top, "http")
    return _find(http["block"], "server")


def _https(servers: list[Directive]) -> Directive:
    (https,) = [s for s in servers if any("ssl" in d["args"] for d in _find(s["block"], "listen"))]
    return https


def _location(server: Directive, prefix: str) -> Directive:
    for d in _find(server["block"], "location"):
        if d["args"][-1] == prefix:
            return d
    raise AssertionError(f"no location {prefix} in the HTTPS server")


def test_plain_http_only_redirects_to_https(servers: list[Directive]) -> None:
    plain = [s for s in servers if s is not _https(servers)]
    assert plain
    for s in plain:
        (ret,) = _find(s["block"], "return")
        assert ret["args"][0] == "301" and ret["args"][1].startswith("https://")
        assert not [d for d in _walk(s["block"]) if d["directive"] == "proxy_pass"]


def test_cookies_are_secure_and_https_is_sticky(servers: list[Directive]) -> None:
    https = _https(servers)
    (flags,) = _find(https["block"], "proxy_cookie_flags")
    assert flags["args"][0] == "~" and "secure" in flags["args"][1:]  # every cookie
    headers = [d["args"] for d in _walk(https["block"]) if d["directive"] == "add_header"]
    assert ["Strict-Transport-Security", "max-age=31536000", "always"] in headers


@pytest.mark.parametrize("path", ["/_stcore/metrics", "/_stcore/agent"])
def test_metrics_and_the_agent_api_are_refused(servers: list[Directive], path: str) -> None:
    loc = _location(_https(servers), path)
    assert loc["args"][0] == "^~"  # a prefix that no regex location can override
    (ret,) = _find(loc["block"], "return")
    assert ret["args"] == ["404"]
    assert not _find(loc["block"], "proxy_pass")


def test_downloads_need_a_login_cookie(servers: list[Directive]) -> None:
    media = _location(_https(servers), "/media/")
    assert media["args"][0] == "^~"
    (gate,) = _find(media["block"], "if")
    assert gate["args"] == ["$cookie__streamlit_user", "=", ""]
    assert [d["args"] for d in gate["block"]] == [["401"]]
    # The gate comes before the content is fetched.
    names = [d["directive"] for d in media["block"]]
    assert names.index("if") < names.index("proxy_pass")
    # Its own add_header replaces the server's: HSTS must be repeated, and no cache
    # keeps a copy for the next user.
    headers = [d["args"][0] for d in _find(media["block"], "add_header")]
    assert {"Strict-Transport-Security", "Cache-Control"} <= set(headers)


def test_streamlit_is_reached_on_loopback_only(servers: list[Directive]) -> None:
    targets = {
        d["args"][0] for d in _walk(_https(servers)["block"]) if d["directive"] == "proxy_pass"
    }
    assert targets == {"http://127.0.0.1:8501"}
    config = tomllib.loads((REPO / ".streamlit" / "config.toml").read_text())
    server = config["server"]
    assert server["address"] == "localhost"
    assert server["enableXsrfProtection"] is True
    assert server.get("enableAgentApi", False) is False
    assert server.get("enableStaticServing", False) is False
    assert not server.get("unsafeMetricsUserAttributes")
    assert not server.get("trustedUserHeaders")


# --- The same file served by a real nginx ----------------------------------------------
#
# Parsing shows the rules are written; this shows nginx applies them. The shipped file is
# started as it is, with only what is specific to a deployment replaced (ports, the
# certificate, Streamlit's address, where nginx keeps its pid, logs and temp files), in
# front of a small HTTP server that stands in for Streamlit and records what reaches it.


def _nginx_binary() -> str | None:
    found = shutil.which("nginx")
    if found:
        return found
    return "/usr/sbin/nginx" if os.access("/usr/sbin/nginx", os.X_OK) else None


NGINX_BIN = _nginx_binary()
needs_nginx = pytest.mark.skipif(
    NGINX_BIN is None, reason="needs a real nginx binary: apt-get install nginx"
)
HOST = "ragscope.example.org"  # the shipped server_name, kept as it is


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _self_signed(folder: Path) -> tuple[Path, Path]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, HOST)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName(HOST), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = folder / "fullchain.pem", folder / "privkey.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


def _render(text: str, replacements: list[tuple[str, str, int]]) -> str:
    """Replace each deployment-specific value; a target that is not there exactly as
    often as expected fails, so the test breaks when the shipped file changes shape."""
    for old, new, count in replacements:
        found = text.count(old)
        assert found == count, f"docs/deploy/nginx.conf: {old!r} found {found}x, not {count}x"
        text = text.replace(old, new)
    return text


class _Upstream(BaseHTTPRequestHandler):
    """Stands in for Streamlit: answers every path 200 with the path, sets the login
    cookie on /oauth2callback (without Secure, as Streamlit does), records requests."""

    seen: list[tuple[str, dict[str, str]]]

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        self.seen.append((self.path, {k.lower(): v for k, v in self.headers.items()}))
        body = self.path.encode()
        self.send_response(200)
        if self.path.startswith("/oauth2callback"):
            self.send_header("Set-Cookie", "_streamlit_user=x; Path=/; HttpOnly")
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@dataclass
class _Proxy:
    http: str
    https: str
    client: httpx.Client
    seen: list[tuple[str, dict[str, str]]]

    def get(self, url: str, headers: dict[str, str] | None = None) -> httpx.Response:
        self.client.cookies.clear()  # each request carries only the cookies it names
        return self.client.get(url, headers=headers)

    def paths(self) -> list[str]:
        return [p for p, _ in self.seen]


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[_Proxy]:
    assert NGINX_BIN is not None
    tmp = tmp_path_factory.mktemp("nginx")
    cert, key = _self_signed(tmp)
    seen: list[tuple[str, dict[str, str]]] = []
    handler = type("Upstream", (_Upstream,), {"seen": seen})
    upstream = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    http_port, https_port = _free_port(), _free_port()
    unprivileged = (
        f"pid {tmp}/nginx.pid;\nerror_log {tmp}/error.log;\n"
        + ("user root;\n" if os.geteuid() == 0 else "")  # workers read tmp (mode 0700)
    )
    temp = "".join(
        f"    {kind}_temp_path {tmp}/{kind}_temp;\n"
        for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
    )
    conf = tmp / "nginx.conf"
    conf.write_text(
        unprivileged
        + _render(
            NGINX.read_text(),
            [
                ("worker_processes auto;", "worker_processes 1;", 1),
                ("http {\n", f"http {{\n    access_log {tmp}/access.log;\n{temp}", 1),
                ("listen 80;", f"listen 127.0.0.1:{http_port};", 1),
                ("listen [::]:80;", "", 1),
                ("listen 443 ssl;", f"listen 127.0.0.1:{https_port} ssl;", 1),
                ("listen [::]:443 ssl;", "", 1),
                ("/etc/ssl/ragscope/fullchain.pem", str(cert), 1),
                ("/etc/ssl/ragscope/privkey.pem", str(key), 1),
                ("http://127.0.0.1:8501", f"http://127.0.0.1:{upstream.server_port}", 2),
            ],
        )
    )
    cmd = [NGINX_BIN, "-p", str(tmp), "-e", str(tmp / "error.log"), "-c", str(conf)]
    check = subprocess.run([*cmd, "-t"], capture_output=True, text=True, timeout=10)
    assert check.returncode == 0, check.stderr
    nginx = subprocess.Popen(
        [*cmd, "-g", "daemon off;"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    ca = ssl.create_default_context(cafile=str(cert))
    try:
        deadline = time.monotonic() + 5
        while True:
            assert nginx.poll() is None, nginx.communicate(timeout=5)[1]
            try:
                socket.create_connection(("127.0.0.1", https_port), timeout=0.5).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "nginx did not listen within 5 s"
                time.sleep(0.05)
        with httpx.Client(verify=ca, timeout=5, follow_redirects=False) as client:
            yield _Proxy(
                f"http://127.0.0.1:{http_port}", f"https://127.0.0.1:{https_port}", client, seen
            )
    finally:
        stop_process(nginx, timeout_s=5)
        upstream.shutdown()
        upstream.server_close()


@needs_nginx
def test_real_nginx_redirects_plain_http_without_proxying(proxy: _Proxy) -> None:
    before = len(proxy.seen)
    r = proxy.get(proxy.http + "/media/x.csv?a=1", headers={"Host": HOST})
    assert r.status_code == 301
    assert r.headers["location"] == f"https://{HOST}/media/x.csv?a=1"
    assert len(proxy.seen) == before  # nothing reached Streamlit in clear


@needs_nginx
def test_real_nginx_proxies_https_with_hsts(proxy: _Proxy) -> None:
    r = proxy.get(proxy.https + "/", headers={"Host": HOST})
    assert r.status_code == 200 and r.text == "/"
    assert r.headers["strict-transport-security"] == "max-age=31536000"
    path, headers = proxy.seen[-1]
    assert path == "/"
    assert headers["host"] == HOST and headers["x-forwarded-proto"] == "https"
    assert headers["connection"] == "close"  # no upgrade asked, none forwarded
    assert "upgrade" not in headers


@needs_nginx
def test_real_nginx_marks_streamlit_cookies_secure(proxy: _Proxy) -> None:
    r = proxy.get(proxy.https + "/oauth2callback?code=c&state=s")
    assert r.status_code == 200
    (cookie,) = r.headers.get_list("set-cookie")
    attrs = [a.strip().lower() for a in cookie.split(";")]
    assert attrs[0] == "_streamlit_user=x"
    assert "secure" in attrs and "httponly" in attrs and "samesite=lax" in attrs


@needs_nginx
def test_real_nginx_serves_media_only_with_a_login_cookie(proxy: _Proxy) -> None:
    url = proxy.https + "/media/abc.csv"
    refused = proxy.get(url)
    assert refused.status_code == 401
    assert refused.headers["strict-transport-security"] == "max-age=31536000"
    assert "/media/abc.csv" not in proxy.paths()
    empty = proxy.get(url, headers={"Cookie": "_streamlit_user="})
    assert empty.status_code == 401
    other = proxy.get(url, headers={"Cookie": "session=x"})
    assert other.status_code == 401
    assert "/media/abc.csv" not in proxy.paths()
    ok = proxy.get(url, headers={"Cookie": "_streamlit_user=x"})
    assert ok.status_code == 200 and ok.text == "/media/abc.csv"
    assert ok.headers["cache-control"] == "private, no-store"
    assert ok.headers["strict-transport-security"] == "max-age=31536000"


@needs_nginx
@pytest.mark.parametrize(
    "path",
    [
        "/_stcore/metrics",
        "/_stcore/metrics?format=json",
        "//_stcore/metrics",
        "/_stcore/%6Detrics",
        "/_stcore/agent/run",
        "/_stcore/agent",
    ],
)
def test_real_nginx_refuses_metrics_and_the_agent_api(proxy: _Proxy, path: str) -> None:
    cookie = {"Cookie": "_streamlit_user=x"}  # not even for a signed-in browser
    r = proxy.get(proxy.https + path, headers=cookie)
    assert r.status_code == 404
    assert not [p for p in proxy.paths() if "metrics" in p or "agent" in p]


@needs_nginx
def test_real_nginx_forwards_the_websocket_upgrade(proxy: _Proxy) -> None:
    r = proxy.get(
        proxy.https + "/_stcore/stream",
        headers={"Upgrade": "websocket", "Connection": "Upgrade", "Sec-WebSocket-Version": "13"},
    )
    assert r.status_code == 200  # the stand-in does not switch protocols; nginx passed it
    path, headers = proxy.seen[-1]
    assert path == "/_stcore/stream"
    assert headers["upgrade"] == "websocket" and headers["connection"] == "upgrade"
