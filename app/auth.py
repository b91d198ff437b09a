"""Who is using the app: private by default, real logins for teams.

By default the app listens on localhost only (``.streamlit/config.toml``) and nobody
logs in: reviewer names are typed, which is fine on one's own machine. Serving it to
a team is an explicit choice (``--server.address 0.0.0.0``) and should come with
logins: with an ``[auth]`` section in ``.streamlit/secrets.toml`` (Streamlit's
OpenID Connect login, README "Security"), :func:`login_gate` shows only a login
screen until the visitor has signed in with the identity provider, on every page,
and the Review page records decisions under the signed-in identity
(:func:`current_identity`) instead of a typed name, so one annotator cannot review
as another. Served on a network without logins, every page carries a warning
(:func:`exposure_banner`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import streamlit as st

from app.text import md
from core.llmserve import is_loopback_host

KEY_LOGIN = "auth.login"
KEY_LOGOUT = "auth.logout"
REQUIRED = ("redirect_uri", "cookie_secret", "client_id", "client_secret", "server_metadata_url")


@dataclass(frozen=True)
class Identity:
    """A signed-in user.

    Attributes:
        id: What their decisions are recorded under: the e-mail address the identity
            provider vouches for, else its subject id (stable per provider).
        name: What the page calls them.
    """

    id: str
    name: str


def _auth_section() -> dict[str, Any] | None:
    try:
        section = st.secrets.get("auth")
    except FileNotFoundError:  # no secrets.toml anywhere: no logins
        return None
    return dict(section) if isinstance(section, Mapping) else None


def auth_configured() -> bool:
    """Whether logins are required: ``[auth]`` holds a complete OpenID Connect setup
    (``redirect_uri``, ``cookie_secret``, ``client_id``, ``client_secret``,
    ``server_metadata_url``)."""
    section = _auth_section()
    return section is not None and all(section.get(k) for k in REQUIRED)


def current_identity() -> Identity | None:
    """The signed-in user, or ``None`` (logins not configured, or not signed in)."""
    if not auth_configured() or not st.user.is_logged_in:
        return None
    email = st.user.get("email")
    verified = st.user.get("email_verified")
    sub = st.user.get("sub")
    ident = email if isinstance(email, str) and email and verified is not False else sub
    if not isinstance(ident, str) or not ident:
        return None
    name = st.user.get("name")
    return Identity(id=ident, name=name if isinstance(name, str) and name else ident)


def login_gate() -> None:
    """With logins configured: the login screen (and nothing else) until the visitor
    signs in, then their name and a logout button in the sidebar."""
    if not auth_configured():
        return
    who = current_identity()
    if who is None:
        st.title("ragscope")
        st.markdown(
            "This ragscope server is shared by a team: sign in with your organisation's "
            "account to continue. Your reviews are recorded under the identity you sign "
            "in with."
        )
        if st.user.is_logged_in:
            st.error(
                "The identity provider returned no e-mail address or subject id; ask the "
                "administrator to grant the `email` or `openid` scope."
            )
        st.button(
            "Log in", key=KEY_LOGIN, type="primary", icon=":material/login:", on_click=st.login
        )
        st.stop()
    with st.sidebar:
        st.caption(f"Signed in as **{md(who.name)}**")
        st.button("Log out", key=KEY_LOGOUT, icon=":material/logout:", on_click=st.logout)


def network_exposed() -> bool:
    """Whether the server listens beyond this machine (``server.address`` unset, a
    wildcard or a non-loopback address)."""
    address = st.get_option("server.address")
    return not address or not is_loopback_host(str(address))


def exposure_banner() -> None:
    """A warning on every page when the app is reachable from other hosts without logins."""
    if network_exposed() and not auth_configured():
        st.warning(
            "This ragscope server is reachable from other machines and nobody has to sign "
            "in: anyone who can reach it can read your datasets and record reviews under "
            "any name. Serve it on localhost (the default) or configure logins (README, "
            "Security).",
            icon=":material/public:",
        )
