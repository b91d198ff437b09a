"""The ``paces`` table: how fast feature extraction runs on this machine, once measured."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

from core.storage.db import Database, now_iso

MAX_PACE = 10.0
"""The slowest pace read back (seconds per character): anything above is not a pace this
code wrote, and is ignored (measured again)."""


MAX_AGE = timedelta(days=1)
"""How long a recorded pace is used: the machine's load changes, and one reading timed
beside other work (or with a detector's one-time loading in it) must not stick for good."""


class PacesRepository(Database):
    """Measured extraction paces, keyed by loaded model and detector choice."""

    def put_pace(self, *, model: str, detectors: str, seconds_per_char: float) -> None:
        """Record a measured pace (replaces an earlier one).

        Args:
            model: The loaded model instance (name, weights, device, dtype).
            detectors: The detector choice (names and feature configurations).
            seconds_per_char: The pace measured; not finite or not positive: not recorded.
        """
        if not (math.isfinite(seconds_per_char) and 0 < seconds_per_char <= MAX_PACE):
            return
        with self._tx() as c:
            c.execute(
                "INSERT INTO paces (model, detectors, seconds_per_char, measured_at) "
                "VALUES (?, ?, ?, ?) ON CONFLICT (model, detectors) DO UPDATE SET "
                "seconds_per_char = excluded.seconds_per_char, measured_at = excluded.measured_at",
                (model, detectors, float(seconds_per_char), now_iso()),
            )

    def get_pace(self, *, model: str, detectors: str) -> float | None:
        """The pace recorded for this key in the last :data:`MAX_AGE`, or ``None`` (none,
        too old, or not a plausible one)."""
        rows = self._query(
            "SELECT seconds_per_char, measured_at FROM paces WHERE model = ? AND detectors = ?",
            (model, detectors),
        )
        if not rows:
            return None
        v, at = rows[0]
        try:
            when = datetime.fromisoformat(at)
        except (TypeError, ValueError):
            return None
        if when.tzinfo is None or not timedelta(0) <= datetime.now(UTC) - when <= MAX_AGE:
            return None
        ok = isinstance(v, float) and math.isfinite(v) and 0 < v <= MAX_PACE
        return v if ok else None
