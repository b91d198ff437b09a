"""The ``explanations`` table: LLM-written explanations of features, cached."""

from __future__ import annotations

from collections.abc import Sequence

from core.storage.db import Database, now_iso


class ExplanationsRepository(Database):
    """Cached feature explanations, keyed by model, feature and prompt hash."""

    def put_explanation(self, *, model: str, feature_key: str, prompt_hash: str, text: str) -> None:
        """Cache an LLM-written explanation of a feature (overwrites the same key).

        Args:
            model: The analysed model (the SAE's host model).
            feature_key: Which feature, e.g. ``"sae-L12/1234"``.
            prompt_hash: Hash of the explainer prompt and explainer model.
            text: The explanation.
        """
        with self._tx() as c:
            c.execute(
                "INSERT INTO explanations (model, feature_key, prompt_hash, text, created_at) "
                "VALUES (?, ?, ?, ?, ?) ON CONFLICT (model, feature_key, prompt_hash) "
                "DO UPDATE SET text = excluded.text, created_at = excluded.created_at",
                (model, feature_key, prompt_hash, text, now_iso()),
            )

    def get_explanation(self, *, model: str, feature_key: str, prompt_hash: str) -> str | None:
        """The cached explanation for this key, or ``None``."""
        rows = self._query(
            "SELECT text FROM explanations WHERE model = ? AND feature_key = ? AND prompt_hash = ?",
            (model, feature_key, prompt_hash),
        )
        return rows[0][0] if rows else None

    def latest_explanation(self, *, model: str, feature_key: str) -> str | None:
        """The most recently cached explanation of a feature, from any prompt (``None``: none)."""
        rows = self._query(
            "SELECT text FROM explanations WHERE model = ? AND feature_key = ? "
            "ORDER BY created_at DESC, id DESC LIMIT 1",
            (model, feature_key),
        )
        return rows[0][0] if rows else None

    def find_explanation(
        self, *, model: str, feature_key: str, prompt_hashes: Sequence[str]
    ) -> tuple[str, str] | None:
        """``(prompt_hash, text)`` of the first of ``prompt_hashes`` cached, or ``None``."""
        if not prompt_hashes:
            return None
        marks = ", ".join("?" * len(prompt_hashes))
        rows = self._query(
            "SELECT prompt_hash, text FROM explanations WHERE model = ? AND feature_key = ? "
            f"AND prompt_hash IN ({marks})",
            (model, feature_key, *prompt_hashes),
        )
        found = dict(rows)
        for h in prompt_hashes:
            if h in found:
                return h, found[h]
        return None
