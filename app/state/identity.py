"""Who is signed in, by rules a hostile identity provider account cannot bend.

With logins configured (``[auth]`` in ``.streamlit/secrets.toml``), Streamlit keeps the
identity provider's ID-token claims in a signed cookie (``st.user``) for 30 days. This
module decides what they are worth:

- The identity is the e-mail address only when the provider says it verified it
  (``email_verified`` true); otherwise ``sub:<sub>@<issuer host>``, which can never
  equal an e-mail address (an address has no ``:``), so an account whose subject or
  unverified address reads ``alice@example.com`` is not Alice.
- Logging out (:func:`log_out`) records the moment in the database
  (:class:`core.storage.logins.LoginsRepository`); a session issued (``iat``) at or
  before its identity's last logout is refused, so a copied cookie no longer signs in.
- A session older than :func:`session_max_age_s` (``RAGSCOPE_SESSION_HOURS``, default
  24 h) is refused too.
- Logins over plain HTTP to another host are refused (Streamlit never marks its cookie
  ``Secure``; a reverse proxy with HTTPS does, docs/deployment.md).
- Admins (``RAGSCOPE_ADMINS``, comma-separated identities) may control anyone's job.
"""

from __future__ import annotations

import math
import os
import re
import time
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import streamlit as st

from app.state.datasets import get_store
from core.base.errors import RagscopeError
from core.services.jobs import JobActor
from core.services.llmserve import is_loopback_host

REQUIRED = ("redirect_uri", "cookie_secret", "client_id", "client_secret", "server_metadata_url")
ADMINS_ENV = "RAGSCOPE_ADMINS"
"""Comma-separated identities allowed to cancel, resume or discard anyone's job."""
SESSION_HOURS_ENV = "RAGSCOPE_SESSION_HOURS"
"""How long a login lasts, in hours (default :data:`SESSION_HOURS`)."""
SESSION_HOURS = 24.0
SUB_PREFIX = "sub:"
"""Identities of users whose e-mail address is not verified: ``sub:<sub>@<issuer>``."""
_EMAIL = re.compile(r"^[^\s:@<>()\[\]\\,;\"]{1,64}@[A-Za-z0-9.-]{1,253}$")
_MAX_SUB = 255
_MAX_NAME = 100


@dataclass(frozen=True)
class Identity:
    """A signed-in user.

    Attributes:
        id: What their decisions and jobs are recorded under: the e-mail address the
            identity provider verified, else ``sub:<subject>@<issuer host>``.
        name: What the page calls them (the provider's ``name``; display only).
    """

    id: str
    name: str


@dataclass(frozen=True)
class Login:
    """The visitor's login as the app sees it.

    Attributes:
        identity: The signed-in user, or ``None``.
        problem: Why a signed-in session is refused (logged out since, expired, no
            usable identity, plain HTTP), to show on the login screen.
        can_log_in: Whether logging in can help (not over plain HTTP).
    """

    identity: Identity | None
    problem: str | None = None
    can_log_in: bool = True


def auth_section() -> dict[str, Any] | None:
    """The ``[auth]`` secrets section, or ``None``."""
    try:
        section = st.secrets.get("auth")
    except FileNotFoundError:  # no secrets.toml anywhere: no logins
        return None
    return dict(section) if isinstance(section, Mapping) else None


def auth_configured() -> bool:
    """Whether logins are required: ``[auth]`` holds a complete OpenID Connect setup
    (``redirect_uri``, ``cookie_secret``, ``client_id``, ``client_secret``,
    ``server_metadata_url``)."""
    section = auth_section()
    return section is not None and all(section.get(k) for k in REQUIRED)


def insecure_redirect(section: Mapping[str, Any]) -> str | None:
    """Why ``[auth]``'s ``redirect_uri`` is unsafe (plain HTTP to another machine:
    the session cookie would cross the network in clear), or ``None``."""
    uri = str(section.get("redirect_uri") or "")
    parts = urlsplit(uri)
    if parts.scheme == "https" or (
        parts.scheme == "http" and is_loopback_host(parts.hostname or "")
    ):
        return None
    return (
        f"logins are configured with redirect_uri {uri[:200]!r}, which is not https: the "
        "session cookie would travel in clear. Serve ragscope behind an HTTPS reverse "
        "proxy (docs/deployment.md) and set redirect_uri to its https:// address"
    )


def _clean(value: object, limit: int) -> str | None:
    """``value`` if it is non-empty text of at most ``limit`` visible characters."""
    if not isinstance(value, str) or not value.strip() or len(value) > limit:
        return None
    if any(unicodedata.category(c) in ("Cc", "Cf", "Cs", "Co") for c in value):
        return None
    return value


def _verified(value: object) -> bool:
    # Some providers (e.g. Amazon Cognito) send the string "true".
    return value is True or (isinstance(value, str) and value.lower() == "true")


def identity_from_claims(claims: Mapping[str, object]) -> Identity | None:
    """The identity an ID token's claims prove, or ``None`` (no usable ``sub`` or
    verified ``email``): the e-mail address only with ``email_verified`` true, else
    ``sub:<sub>@<issuer host>``."""
    email = _clean(claims.get("email"), 254)
    if email is not None and _verified(claims.get("email_verified")) and _EMAIL.match(email):
        ident = email
    else:
        sub = _clean(claims.get("sub"), _MAX_SUB)
        if sub is None:
            return None
        iss = claims.get("iss")
        host = urlsplit(iss).hostname if isinstance(iss, str) else None
        ident = f"{SUB_PREFIX}{sub}@{host}" if host else f"{SUB_PREFIX}{sub}"
    name = _clean(claims.get("name"), _MAX_NAME)
    return Identity(id=ident, name=name or ident)


def session_max_age_s() -> float:
    """How long a login lasts (``RAGSCOPE_SESSION_HOURS``; a bad value: the default)."""
    raw = os.environ.get(SESSION_HOURS_ENV)
    try:
        hours = float(raw) if raw else SESSION_HOURS
    except ValueError:
        hours = SESSION_HOURS
    if not math.isfinite(hours) or hours <= 0:
        hours = SESSION_HOURS
    return hours * 3600.0


def _issued_at(claims: Mapping[str, object]) -> float | None:
    iat = claims.get("iat")
    if isinstance(iat, int | float) and not isinstance(iat, bool) and math.isfinite(iat):
        return float(iat)
    return None


def check_session(
    identity: Identity, claims: Mapping[str, object], *, now: float | None = None
) -> str | None:
    """Why a session for ``identity`` with these claims is refused, or ``None``: it was
    issued at or before the identity's last logout, or longer ago than
    :func:`session_max_age_s`.

    Raises:
        StorageError: The database cannot be read.
    """
    now = time.time() if now is None else now
    iat = _issued_at(claims)
    revoked = get_store().logins_revoked_at(identity.id)
    if revoked is not None and (iat is None or iat <= revoked):
        return "you logged out of this session; log in again"
    if iat is not None and now - iat > session_max_age_s():
        return "your login has expired; log in again"
    return None


def _claims() -> dict[str, object]:
    return {k: st.user.get(k) for k in ("email", "email_verified", "sub", "iss", "name", "iat")}


def current_login() -> Login:
    """The visitor's login: the identity, or why a signed-in session is refused."""
    section = auth_section()
    if section is None or not all(section.get(k) for k in REQUIRED):
        return Login(identity=None)
    insecure = insecure_redirect(section)
    if insecure is not None:
        return Login(identity=None, problem=insecure, can_log_in=False)
    if not st.user.is_logged_in:
        return Login(identity=None)
    claims = _claims()
    who = identity_from_claims(claims)
    if who is None:
        return Login(
            identity=None,
            problem="the identity provider returned no verified e-mail address or subject "
            "id; ask the administrator to grant the `email` or `openid` scope",
        )
    try:
        problem = check_session(who, claims)
    except RagscopeError as e:
        problem = f"the login cannot be checked ({e})"
    return Login(identity=None, problem=problem) if problem else Login(identity=who)


def current_identity() -> Identity | None:
    """The signed-in user, or ``None`` (logins not configured, not signed in, or the
    session refused: :func:`current_login` says why)."""
    return current_login().identity


def admins() -> frozenset[str]:
    """The identities in ``RAGSCOPE_ADMINS``."""
    raw = os.environ.get(ADMINS_ENV, "")
    return frozenset(a.strip() for a in raw.split(",") if a.strip())


def job_actor() -> JobActor | None:
    """Who controls jobs in this session: ``None`` without logins (anyone may), else the
    signed-in identity (an admin when listed in ``RAGSCOPE_ADMINS``).

    A signed-out visitor with logins configured never gets this far (the login gate).
    """
    if not auth_configured():
        return None
    who = current_identity()
    if who is None:
        return JobActor(id="", admin=False)  # controls nothing
    return JobActor(id=who.id, admin=who.id in admins())


def log_out() -> None:
    """Revoke the signed-in identity's sessions (server-side), then log out."""
    who = current_identity()
    if who is not None:
        get_store().revoke_logins(who.id)
    st.logout()
