"""The ``revoked_logins`` table: logging out revokes every session of that identity.

Streamlit keeps a signed-in user in a signed cookie that stays valid for 30 days, and
logging out only asks the browser to forget it: a copy of the cookie still signs in.
So logging out also records here when the identity logged out, and the app refuses
any session issued (the identity provider's ``iat``) at or before that moment
(:func:`app.auth.current_identity`): the user logs in again, which issues a new one.
"""

from __future__ import annotations

import math
import time

from core.base.errors import DataError
from core.storage.db import Database

MAX_IDENTITY = 1_000
"""Longest identity recorded (an identity provider's ``sub`` is at most 255 ASCII
characters; e-mail addresses are shorter still)."""


def _identity(identity: object) -> str:
    if not isinstance(identity, str) or not identity or len(identity) > MAX_IDENTITY:
        raise DataError("a login's identity must be non-empty text", field="identity")
    return identity


class LoginsRepository(Database):
    """Revoked logins: when each identity last logged out."""

    def revoke_logins(self, identity: str, at: float | None = None) -> float:
        """Revoke every session of ``identity`` issued at or before ``at`` (default:
        now); returns the moment recorded (a later revocation is never moved back).

        Raises:
            DataError: ``identity`` is empty or ``at`` is not a finite time.
        """
        ident = _identity(identity)
        when = time.time() if at is None else at
        if not isinstance(when, int | float) or not math.isfinite(when):
            raise DataError(f"a revocation time must be a finite number, not {at!r}")
        with self._tx() as c:
            c.execute(
                "INSERT INTO revoked_logins (identity, revoked_at) VALUES (?, ?) "
                "ON CONFLICT(identity) DO UPDATE SET "
                "revoked_at = MAX(revoked_at, excluded.revoked_at)",
                (ident, float(when)),
            )
            row = c.execute(
                "SELECT revoked_at FROM revoked_logins WHERE identity = ?", (ident,)
            ).fetchone()
        return float(row[0])

    def logins_revoked_at(self, identity: str) -> float | None:
        """When ``identity`` last logged out (Unix time), or ``None`` if never.

        Raises:
            DataError: ``identity`` is empty.
        """
        rows = self._query(
            "SELECT revoked_at FROM revoked_logins WHERE identity = ?", (_identity(identity),)
        )
        if not rows:
            return None
        value = rows[0][0]
        # A damaged value revokes everything before now rather than nothing.
        ok = isinstance(value, int | float) and math.isfinite(value)
        return float(value) if ok else time.time()
