"""The ``counterfactuals`` table: saved counterfactual sessions."""

from __future__ import annotations

from typing import Any, Protocol

from core.base.errors import DataError
from core.base.examples import RAGExample
from core.base.safeio import parse_json
from core.storage.db import Database


class SavedSession(Protocol):
    """What :meth:`Store.save_counterfactual` stores (a :class:`core.interventions.counterfactual.Counterfactual`)."""

    @property
    def name(self) -> str: ...

    @property
    def model(self) -> str: ...

    @property
    def created_at(self) -> str: ...

    @property
    def original(self) -> RAGExample: ...

    def to_json(self) -> str: ...


class CounterfactualsRepository(Database):
    """Saved counterfactual sessions (original, edit, scores) as JSON."""

    def save_counterfactual(self, cf: SavedSession) -> int:
        """Store a counterfactual session (original, edit, scores); returns its id."""
        with self._tx() as c:
            cur = c.execute(
                "INSERT INTO counterfactuals (name, model, example_id, created_at, json) "
                "VALUES (?, ?, ?, ?, ?)",
                (cf.name, cf.model, cf.original.id, cf.created_at, cf.to_json()),
            )
            return int(cur.lastrowid or 0)

    def list_counterfactuals(self, model: str | None = None) -> list[tuple[int, str, str, str]]:
        """``(id, name, example id, created at)`` of the saved sessions, newest first."""
        sql = "SELECT id, name, example_id, created_at FROM counterfactuals"
        params: tuple[Any, ...] = ()
        if model is not None:
            sql += " WHERE model = ?"
            params = (model,)
        return [tuple(r) for r in self._query(sql + " ORDER BY id DESC", params)]

    def load_counterfactual(self, cf_id: int) -> dict[str, Any]:
        """A saved session's JSON object (:func:`core.interventions.counterfactual.load_session` makes
        the session of it).

        Raises:
            DataError: No such id, or its JSON cannot be read back.
        """
        rows = self._query("SELECT json FROM counterfactuals WHERE id = ?", (cf_id,))
        if not rows:
            raise DataError(f"no saved counterfactual with id {cf_id}")
        payload = parse_json(str(rows[0][0]), source=f"saved counterfactual {cf_id}")
        if not isinstance(payload, dict):
            raise DataError(f"saved counterfactual {cf_id} is not a JSON object")
        return payload

    def delete_counterfactual(self, cf_id: int) -> None:
        with self._tx() as c:
            c.execute("DELETE FROM counterfactuals WHERE id = ?", (cf_id,))
