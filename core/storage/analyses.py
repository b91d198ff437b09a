"""The ``analyses`` table: the analysis cache, one result (JSON or bytes) per example
hash, model, detector and config hash."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from core.storage.db import Database, dumps, now_iso

HASHES_PER_QUERY = 500
"""Example hashes asked about in one query (SQLite allows 32,766 parameters; a page's
selection of thousands of answers takes a few queries instead of one per answer)."""


@dataclass(frozen=True, kw_only=True)
class AnalysisRecord:
    """A cached analysis result.

    Attributes:
        result: The decoded JSON value, or raw bytes when stored as bytes.
    """

    id: int
    dataset: str | None
    example_id: str | None
    example_hash: str
    model: str
    detector: str
    config_hash: str
    created_at: str
    result: Any


class AnalysesRepository(Database):
    """The analysis cache, keyed by example hash, model, detector and config hash."""

    def put_analysis(
        self,
        *,
        example_hash: str,
        model: str,
        detector: str,
        config_hash: str,
        result: bytes | Mapping[str, Any] | list[Any],
        dataset: str | None = None,
        example_id: str | None = None,
    ) -> None:
        """Store (or overwrite) one analysis result.

        Args:
            example_hash: :func:`example_hash` of the analysed example.
            model: The analysing model's id.
            detector: Detector name.
            config_hash: Hash of the detector's config (and artifact version).
            result: JSON-able mapping/list, or bytes (e.g. an ``.npz`` payload).
            dataset: Dataset name, for listing results per example.
            example_id: Example id, for listing results per example.
        """
        if isinstance(result, bytes | bytearray | memoryview):
            enc, blob = "bytes", bytes(result)
        else:
            enc, blob = "json", dumps(result, "result").encode("utf-8")
        with self._tx() as c:
            c.execute(
                "INSERT INTO analyses (dataset, example_id, example_hash, model, detector, "
                "config_hash, created_at, encoding, result) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (example_hash, model, detector, config_hash) DO UPDATE SET "
                "dataset = excluded.dataset, example_id = excluded.example_id, "
                "created_at = excluded.created_at, encoding = excluded.encoding, "
                "result = excluded.result",
                (
                    dataset,
                    example_id,
                    example_hash,
                    model,
                    detector,
                    config_hash,
                    now_iso(),
                    enc,
                    blob,
                ),
            )

    def has_analysis(
        self, *, example_hash: str, model: str, detector: str, config_hash: str
    ) -> bool:
        """Whether a result is stored for this key (without reading it)."""
        rows = self._query(
            "SELECT 1 FROM analyses WHERE example_hash = ? AND model = ? AND detector = ? "
            "AND config_hash = ? LIMIT 1",
            (example_hash, model, detector, config_hash),
        )
        return bool(rows)

    def stored_hashes(
        self, *, example_hashes: Sequence[str], model: str, detector: str, config_hash: str
    ) -> set[str]:
        """Which of ``example_hashes`` have a result stored for this model and detector
        (without reading any): one query per :data:`HASHES_PER_QUERY` hashes."""
        found: set[str] = set()
        unique = list(dict.fromkeys(example_hashes))
        for i in range(0, len(unique), HASHES_PER_QUERY):
            part = unique[i : i + HASHES_PER_QUERY]
            marks = ", ".join("?" * len(part))
            rows = self._query(
                "SELECT example_hash FROM analyses WHERE model = ? AND detector = ? "
                f"AND config_hash = ? AND example_hash IN ({marks})",
                (model, detector, config_hash, *part),
            )
            found.update(r[0] for r in rows)
        return found

    def get_analysis(
        self, *, example_hash: str, model: str, detector: str, config_hash: str
    ) -> AnalysisRecord | None:
        """The stored analysis for this key, or ``None``."""
        rows = self._query(
            "SELECT id, dataset, example_id, created_at, encoding, result FROM analyses "
            "WHERE example_hash = ? AND model = ? AND detector = ? AND config_hash = ?",
            (example_hash, model, detector, config_hash),
        )
        if not rows:
            return None
        rid, ds, ex_id, created, enc, blob = rows[0]
        value = bytes(blob) if enc == "bytes" else json.loads(bytes(blob).decode("utf-8"))
        return AnalysisRecord(
            id=rid,
            dataset=ds,
            example_id=ex_id,
            example_hash=example_hash,
            model=model,
            detector=detector,
            config_hash=config_hash,
            created_at=created,
            result=value,
        )
