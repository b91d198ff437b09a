"""The ``datasets`` and ``examples`` tables: stored datasets and their examples."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from core.base.errors import DataError, StorageError
from core.base.examples import RAGExample, control_character
from core.storage.db import Database, dumps, now_iso

MAX_NAME = 200
"""Longest dataset name stored (characters)."""


def check_dataset_name(name: object) -> str:
    """``name`` if it can name a stored dataset: text, not blank, at most
    :data:`MAX_NAME` characters, and no control or format character (a NUL, a newline,
    a bidi override: each breaks a command line, a log or what a page shows).

    Raises:
        DataError: It cannot, naming the character and its position.
    """
    if not isinstance(name, str) or not name.strip():
        raise DataError("a dataset needs a non-empty name", field="name")
    if len(name) > MAX_NAME:
        raise DataError(
            f"a dataset name is at most {MAX_NAME} characters, not {len(name)} "
            f"({name[:40]!r}...); choose a shorter name",
            field="name",
        )
    if (bad := control_character(name)) is not None:
        raise DataError(
            f"the dataset name {name!r} holds the control character U+{ord(bad[1]):04X} at "
            f"position {bad[0]}; choose a name of visible characters",
            field="name",
        )
    return name


@dataclass(frozen=True, kw_only=True)
class DatasetInfo:
    """A stored dataset (without its examples)."""

    id: int
    name: str
    source: str | None
    format: str | None
    created_at: str
    n_examples: int
    meta: Mapping[str, Any]


class DatasetsRepository(Database):
    """Datasets, stored whole: imported in one transaction, loaded in import order."""

    def import_dataset(
        self,
        name: str,
        examples: Iterable[RAGExample],
        *,
        source: str | None,
        fmt: str | None,
        replace: bool = False,
        meta: Mapping[str, Any] | None = None,
    ) -> int:
        """Store a dataset and its examples, all or nothing.

        Everything happens in one transaction: if anything fails (a bad example, a
        duplicate id, an error raised while ``examples`` is iterated) nothing changes,
        and a dataset being replaced keeps its old contents.

        Args:
            name: Unique dataset name.
            examples: The examples, in order; ids must be unique.
            source: Where they came from (a path or URL), for display.
            fmt: The format they were read as.
            replace: Replace a stored dataset of the same name.
            meta: Extra JSON-able facts to keep with the dataset.

        Returns:
            The number of examples stored.

        Raises:
            StorageError: ``name`` exists and ``replace`` is false, or the write fails.
            DataError: ``name`` is blank, too long or holds a control character
                (:func:`check_dataset_name`); two examples share an id, or an item is
                not a RAGExample.
        """
        check_dataset_name(name)
        meta_json = dumps(dict(meta or {}), "meta")
        try:
            with self._tx() as c:
                row = c.execute("SELECT id FROM datasets WHERE name = ?", (name,)).fetchone()
                if row is not None:
                    if not replace:
                        raise StorageError(
                            f"a dataset named {name!r} is already stored; pass replace=True to "
                            "overwrite it, delete it first, or choose another name"
                        )
                    c.execute("DELETE FROM datasets WHERE id = ?", (row[0],))
                cur = c.execute(
                    "INSERT INTO datasets (name, source, format, created_at, n_examples, meta) "
                    "VALUES (?, ?, ?, ?, 0, ?)",
                    (name, source, fmt, now_iso(), meta_json),
                )
                ds_id = cur.lastrowid
                seen: dict[str, int] = {}
                for pos, ex in enumerate(examples):
                    if not isinstance(ex, RAGExample):
                        raise DataError(
                            f"item {pos} is a {type(ex).__name__}, not a RAGExample",
                            source=f"dataset {name!r}",
                        )
                    if ex.id in seen:
                        raise DataError(
                            f"duplicate id {ex.id!r} (items {seen[ex.id]} and {pos}); ids must "
                            "be unique in a dataset",
                            source=ex.provenance.source or f"dataset {name!r}",
                            field="id",
                        )
                    seen[ex.id] = pos
                    c.execute(
                        "INSERT INTO examples (dataset_id, example_id, position, json) "
                        "VALUES (?, ?, ?, ?)",
                        (ds_id, ex.id, pos, ex.to_json()),
                    )
                c.execute("UPDATE datasets SET n_examples = ? WHERE id = ?", (len(seen), ds_id))
        except sqlite3.Error as e:
            raise StorageError(f"could not store dataset {name!r} in {self.path} ({e})") from e
        return len(seen)

    def list_datasets(self) -> list[DatasetInfo]:
        """The stored datasets, by name."""
        rows = self._query(
            "SELECT id, name, source, format, created_at, n_examples, meta "
            "FROM datasets ORDER BY name"
        )
        return [
            DatasetInfo(
                id=r[0],
                name=r[1],
                source=r[2],
                format=r[3],
                created_at=r[4],
                n_examples=r[5],
                meta=MappingProxyType(json.loads(r[6])),
            )
            for r in rows
        ]

    def _dataset_id(self, name: str) -> int:
        row = self._query("SELECT id FROM datasets WHERE name = ?", (name,))
        if not row:
            names = [d[0] for d in self._query("SELECT name FROM datasets ORDER BY name")]
            raise StorageError(
                f"no dataset named {name!r} in {self.path}; stored: "
                f"{', '.join(map(repr, names)) or '(none)'}; import it first"
            )
        return int(row[0][0])

    def load_examples(self, name: str) -> list[RAGExample]:
        """The examples of a stored dataset, in import order.

        Raises:
            StorageError: No dataset has that name.
        """
        with self._lock:
            ds_id = self._dataset_id(name)
            rows = self._query(
                "SELECT example_id, json FROM examples WHERE dataset_id = ? ORDER BY position",
                (ds_id,),
            )
        out = []
        for ex_id, text in rows:
            try:
                out.append(RAGExample.from_dict(json.loads(text)))
            except (DataError, json.JSONDecodeError) as e:
                raise StorageError(
                    f"stored example {ex_id!r} of dataset {name!r} no longer loads ({e}); "
                    "re-import the dataset with replace=True"
                ) from e
        return out

    def delete_dataset(self, name: str) -> None:
        """Delete a dataset and its examples (analyses and annotations stay).

        Raises:
            StorageError: No dataset has that name.
        """
        with self._tx() as c:
            ds_id = self._dataset_id(name)
            c.execute("DELETE FROM datasets WHERE id = ?", (ds_id,))
