"""Who is using the app: private by default, real logins for teams.

By default the app listens on localhost only (``.streamlit/config.toml``) and nobody
logs in: reviewer names are typed, which is fine on one's own machine. Serving it to
a team is an explicit choice (``--server.address 0.0.0.0``) and should come with
logins: with an ``[auth]`` section in ``.streamlit/secrets.toml`` (Streamlit's
OpenID Connect login, README "Security"), :func:`login_gate` shows only a login
screen until the visitor has signed in with the identity provider, on every page,
and the Review page records decisions under the signed-in identity
(:func:`current_identity`) instead of a typed name, so one annotator cannot review
as another. The identity rules, the server-side logout and the session age live in
:mod:`app.state.identity`; the deployment (HTTPS, what the proxy must close) in
docs/deployment.md. Served on a network without logins, every page carries a warning
(:func:`exposure_banner`).
"""

from __future__ import annotations

import streamlit as st

from app.state.identity import (
    Identity,
    auth_configured,
    current_identity,
    current_login,
    log_out,
)
from app.text import code, md
from core.services.llmserve import is_loopback_host

__all__ = [
    "Identity",
    "auth_configured",
    "current_identity",
    "exposure_banner",
    "login_gate",
    "network_exposed",
]

KEY_LOGIN = "auth.login"
KEY_LOGOUT = "auth.logout"


def login_gate() -> None:
    """With logins configured: the login screen (and nothing else) until the visitor
    signs in, then their name and a logout button in the sidebar."""
    if not auth_configured():
        return
    login = current_login()
    who = login.identity
    if who is None:
        st.title("ragscope")
        st.markdown(
            "This ragscope server is shared by a team: sign in with your organisation's "
            "account to continue. Your reviews are recorded under the identity you sign "
            "in with."
        )
        if login.problem is not None:
            st.error(f"Not signed in: {md(login.problem)}.")
        if login.can_log_in:
            st.button(
                "Log in", key=KEY_LOGIN, type="primary", icon=":material/login:", on_click=st.login
            )
        st.stop()
    with st.sidebar:
        st.caption(f"Signed in as **{md(who.name)}** ({code(who.id)})")
        st.button("Log out", key=KEY_LOGOUT, icon=":material/logout:", on_click=log_out)


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
