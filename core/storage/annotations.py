"""The ``annotations`` table: human labels on character ranges of responses."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from core.base.errors import DataError, StorageError
from core.storage.db import Database, now_iso


@dataclass(frozen=True, kw_only=True)
class Annotation:
    """A human label on the character range ``[start, end)`` of a response."""

    id: int
    dataset: str
    example_id: str
    start: int
    end: int
    label: str
    note: str | None
    annotator: str | None
    created_at: str
    updated_at: str


class AnnotationsRepository(Database):
    """Human labels, keyed by dataset name and example id."""

    def add_annotation(
        self,
        dataset: str,
        example_id: str,
        start: int,
        end: int,
        label: str,
        *,
        note: str | None = None,
        annotator: str | None = None,
    ) -> int:
        """Add a human label on ``[start, end)`` of an example's response; returns its id.

        Annotations are keyed by dataset name and example id (not a foreign key), so
        re-importing a dataset keeps them.

        Raises:
            DataError: The range is empty or negative, or the label is empty.
        """
        _check_range(start, end)
        if not isinstance(label, str) or not label.strip():
            raise DataError("an annotation needs a non-empty label", field="label")
        now = now_iso()
        with self._tx() as c:
            cur = c.execute(
                "INSERT INTO annotations (dataset, example_id, span_start, span_end, label, "
                "note, annotator, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (dataset, example_id, start, end, label, note, annotator, now, now),
            )
            return int(cur.lastrowid or 0)

    def update_annotation(
        self,
        annotation_id: int,
        *,
        start: int | None = None,
        end: int | None = None,
        label: str | None = None,
        note: str | None = None,
    ) -> None:
        """Change fields of an annotation (``None`` leaves a field as it is).

        Raises:
            StorageError: No annotation has that id.
            DataError: The new range is empty or negative.
        """
        with self._tx() as c:
            row = c.execute(
                "SELECT span_start, span_end, label, note FROM annotations WHERE id = ?",
                (annotation_id,),
            ).fetchone()
            if row is None:
                raise StorageError(f"no annotation with id {annotation_id}")
            s = row[0] if start is None else start
            e = row[1] if end is None else end
            _check_range(s, e)
            c.execute(
                "UPDATE annotations SET span_start = ?, span_end = ?, label = ?, note = ?, "
                "updated_at = ? WHERE id = ?",
                (
                    s,
                    e,
                    row[2] if label is None else label,
                    row[3] if note is None else note,
                    now_iso(),
                    annotation_id,
                ),
            )

    def delete_annotation(self, annotation_id: int) -> None:
        """Delete an annotation (no error when it is already gone)."""
        with self._tx() as c:
            c.execute("DELETE FROM annotations WHERE id = ?", (annotation_id,))

    def list_annotations(self, dataset: str, example_id: str | None = None) -> list[Annotation]:
        """Annotations of a dataset (or one example), by example then position."""
        sql = (
            "SELECT id, dataset, example_id, span_start, span_end, label, note, annotator, "
            "created_at, updated_at FROM annotations WHERE dataset = ?"
        )
        params: list[Any] = [dataset]
        if example_id is not None:
            sql += " AND example_id = ?"
            params.append(example_id)
        sql += " ORDER BY example_id, span_start, span_end, id"
        return [
            Annotation(
                id=r[0],
                dataset=r[1],
                example_id=r[2],
                start=r[3],
                end=r[4],
                label=r[5],
                note=r[6],
                annotator=r[7],
                created_at=r[8],
                updated_at=r[9],
            )
            for r in self._query(sql, params)
        ]


def _check_range(start: Any, end: Any) -> None:
    if not all(isinstance(x, int) and not isinstance(x, bool) for x in (start, end)):
        raise DataError(f"start and end must be integers, got {start!r}, {end!r}", field="start")
    if start < 0 or end <= start:
        raise DataError(f"range [{start}, {end}) is empty or negative", field="end")
