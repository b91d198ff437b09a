"""The shipped deployment for teams (docs/deploy/nginx.conf, parsed with crossplane,
and .streamlit/config.toml): what Streamlit itself cannot close, the proxy does —
HTTPS only, Secure cookies, no metrics or agent API from outside, downloads only for
a browser with a login cookie, Streamlit reached on loopback only."""

from __future__ import annotations

import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import crossplane
import pytest

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
