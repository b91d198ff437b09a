"""SQLite storage for datasets, analyses, annotations and cached explanations.

One file (WAL mode, foreign keys on) with a versioned schema: ``schema_version`` records
which entries of :data:`MIGRATIONS` have been applied; opening a database applies the
missing ones in order, each in its own transaction. A database written by a newer
ragscope (a higher version than this code knows) is refused with a
:class:`~core.errors.StorageError` that says what to do.

A :class:`Store` holds one connection shared by all threads behind a lock, which is what
a Streamlit server (one thread per session) needs.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import MappingProxyType, TracebackType
from typing import Any, Protocol

from core.errors import DataError, StorageError
from core.examples import RAGExample
from core.safeio import parse_json


class SavedSession(Protocol):
    """What :meth:`Store.save_counterfactual` stores (a :class:`core.counterfactual.Counterfactual`)."""

    name: str
    model: str
    created_at: str

    @property
    def original(self) -> RAGExample: ...

    def to_json(self) -> str: ...


DB_FILENAME = "ragscope.sqlite3"

#: Schema migrations, applied in order; entry ``k`` brings the schema to version ``k + 1``.
#: Never edit an entry that has shipped: append a new one.
MIGRATIONS: tuple[str, ...] = (
    """
    CREATE TABLE datasets (
        id INTEGER PRIMARY KEY,
        name TEXT NOT NULL UNIQUE,
        source TEXT,
        format TEXT,
        created_at TEXT NOT NULL,
        n_examples INTEGER NOT NULL,
        meta TEXT NOT NULL DEFAULT '{}'
    );
    CREATE TABLE examples (
        dataset_id INTEGER NOT NULL REFERENCES datasets(id) ON DELETE CASCADE,
        example_id TEXT NOT NULL,
        position INTEGER NOT NULL,
        json TEXT NOT NULL,
        PRIMARY KEY (dataset_id, example_id)
    );
    CREATE UNIQUE INDEX examples_by_position ON examples(dataset_id, position);
    CREATE TABLE analyses (
        id INTEGER PRIMARY KEY,
        dataset TEXT,
        example_id TEXT,
        example_hash TEXT NOT NULL,
        model TEXT NOT NULL,
        detector TEXT NOT NULL,
        config_hash TEXT NOT NULL,
        created_at TEXT NOT NULL,
        encoding TEXT NOT NULL CHECK (encoding IN ('json', 'bytes')),
        result BLOB NOT NULL,
        UNIQUE (example_hash, model, detector, config_hash)
    );
    CREATE INDEX analyses_by_example ON analyses(dataset, example_id);
    CREATE TABLE annotations (
        id INTEGER PRIMARY KEY,
        dataset TEXT NOT NULL,
        example_id TEXT NOT NULL,
        span_start INTEGER NOT NULL CHECK (span_start >= 0),
        span_end INTEGER NOT NULL CHECK (span_end > span_start),
        label TEXT NOT NULL,
        note TEXT,
        annotator TEXT,
        created_at TEXT NOT NULL,
        updated_at TEXT NOT NULL
    );
    CREATE INDEX annotations_by_example ON annotations(dataset, example_id);
    CREATE TABLE explanations (
        id INTEGER PRIMARY KEY,
        model TEXT NOT NULL,
        feature_key TEXT NOT NULL,
        prompt_hash TEXT NOT NULL,
        text TEXT NOT NULL,
        created_at TEXT NOT NULL,
        UNIQUE (model, feature_key, prompt_hash)
    );
    """,
    """
    CREATE TABLE counterfactuals (
        id INTEGER PRIMARY KEY,
        name TEXT NOT NULL,
        model TEXT NOT NULL,
        example_id TEXT NOT NULL,
        created_at TEXT NOT NULL,
        json TEXT NOT NULL
    );
    CREATE INDEX counterfactuals_by_model ON counterfactuals(model, created_at);
    """,
    # 3: annotation review (core.review): the queue, one review per item and reviewer,
    # and an append-only audit trail.
    """
    CREATE TABLE review_items (
        id INTEGER PRIMARY KEY,
        dataset TEXT NOT NULL,
        example_id TEXT NOT NULL,
        span_start INTEGER NOT NULL CHECK (span_start >= 0),
        span_end INTEGER NOT NULL CHECK (span_end > span_start),
        answer_len INTEGER NOT NULL,
        sources TEXT NOT NULL,
        score REAL NOT NULL,
        margin REAL NOT NULL,
        task TEXT,
        generator TEXT,
        position INTEGER NOT NULL,
        created_at TEXT NOT NULL,
        UNIQUE (dataset, example_id, span_start, span_end)
    );
    CREATE INDEX review_items_by_dataset ON review_items(dataset, position);
    CREATE TABLE reviews (
        id INTEGER PRIMARY KEY,
        item_id INTEGER NOT NULL REFERENCES review_items(id),
        reviewer TEXT NOT NULL,
        decision TEXT NOT NULL CHECK (decision IN ('accept', 'reject')),
        span_start INTEGER NOT NULL,
        span_end INTEGER NOT NULL,
        kind TEXT CHECK (kind IS NULL OR kind IN ('baseless', 'conflict')),
        evidence TEXT CHECK (evidence IS NULL OR evidence IN ('evident', 'subtle')),
        note TEXT,
        version INTEGER NOT NULL,
        created_at TEXT NOT NULL,
        updated_at TEXT NOT NULL,
        UNIQUE (item_id, reviewer)
    );
    CREATE TABLE review_audit (
        id INTEGER PRIMARY KEY,
        item_id INTEGER NOT NULL,
        reviewer TEXT NOT NULL,
        at TEXT NOT NULL,
        action TEXT NOT NULL,
        before TEXT,
        after TEXT NOT NULL
    );
    CREATE INDEX review_audit_by_item ON review_audit(item_id, id);
    CREATE TRIGGER review_audit_no_update BEFORE UPDATE ON review_audit
    BEGIN
        SELECT RAISE(ABORT, 'the review audit trail is append-only');
    END;
    CREATE TRIGGER review_audit_no_delete BEFORE DELETE ON review_audit
    BEGIN
        SELECT RAISE(ABORT, 'the review audit trail is append-only');
    END;
    """,
    # 4: each review item remembers the content hash of the answer it was flagged on, so
    # an item whose dataset was re-imported with another answer shows as stale.
    """
    ALTER TABLE review_items ADD COLUMN example_hash TEXT;
    """,
)
SCHEMA_VERSION = len(MIGRATIONS)


def default_db_path() -> Path:
    """Where the database lives unless told otherwise.

    ``RAGSCOPE_DB`` (a file path) wins; else ``$RAGSCOPE_CACHE_DIR/ragscope.sqlite3``;
    else ``~/.cache/ragscope/ragscope.sqlite3``.
    """
    env = os.environ.get("RAGSCOPE_DB")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("RAGSCOPE_CACHE_DIR")
    root = Path(base).expanduser() if base else Path.home() / ".cache" / "ragscope"
    return root / DB_FILENAME


def now_iso(timespec: str = "seconds") -> str:
    """The current UTC time as ISO 8601 (the timestamps the database stores)."""
    return datetime.now(UTC).isoformat(timespec=timespec)


def _now() -> str:
    return now_iso()


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


class Store:
    """The ragscope database.

    Use as a context manager (``with Store() as db: ...``) or call :meth:`close`.
    Every method is safe to call from several threads: one connection is shared
    behind a re-entrant lock.

    Args:
        path: Database file (created with its folder when missing); ``":memory:"``
            for a throw-away database. Default: :func:`default_db_path`.

    Raises:
        StorageError: The file cannot be opened, is not a ragscope database, or was
            written by a newer ragscope.
    """

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        self.path = str(path) if path is not None else str(default_db_path())
        self._lock = threading.RLock()
        if self.path != ":memory:":
            try:
                Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise StorageError(
                    f"cannot create the folder for the database {self.path} ({e.strerror}); "
                    "set RAGSCOPE_DB or RAGSCOPE_CACHE_DIR to a writable place"
                ) from e
        try:
            self._conn = sqlite3.connect(
                self.path, timeout=30.0, isolation_level=None, check_same_thread=False
            )
        except sqlite3.Error as e:
            raise StorageError(
                f"cannot open the database {self.path} ({e}); "
                "set RAGSCOPE_DB or RAGSCOPE_CACHE_DIR to a writable place"
            ) from e
        try:
            self._conn.execute("PRAGMA foreign_keys = ON")
            self._conn.execute("PRAGMA busy_timeout = 30000")
            self._conn.execute("PRAGMA journal_mode = WAL")
            self._migrate()
        except sqlite3.DatabaseError as e:
            self._conn.close()
            raise StorageError(
                f"{self.path} is not a usable ragscope database ({e}); move it away or "
                "point RAGSCOPE_DB at another file"
            ) from e
        except BaseException:
            self._conn.close()
            raise

    # -- lifecycle ---------------------------------------------------------------

    def close(self) -> None:
        """Close the connection (idempotent)."""
        with self._lock:
            self._conn.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Store({self.path!r})"

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        """One write transaction: committed on success, rolled back on any exception."""
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                yield self._conn
            except BaseException:
                if self._conn.in_transaction:
                    self._conn.execute("ROLLBACK")
                raise
            self._conn.execute("COMMIT")

    def _query(self, sql: str, params: Iterable[Any] = ()) -> list[tuple[Any, ...]]:
        with self._lock:
            return self._conn.execute(sql, tuple(params)).fetchall()

    def transaction(self) -> AbstractContextManager[sqlite3.Connection]:
        """One write transaction (``BEGIN IMMEDIATE``; committed on success, rolled back
        on any exception), for modules that keep their own tables here (:mod:`core.review`)."""
        return self._tx()

    def query(self, sql: str, params: Iterable[Any] = ()) -> list[tuple[Any, ...]]:
        """Rows of one read statement."""
        return self._query(sql, params)

    # -- schema ------------------------------------------------------------------

    def schema_version(self) -> int:
        """The schema version of the open database (0 for an empty file)."""
        with self._lock:
            return self._read_version()

    def _read_version(self) -> int:
        has = self._conn.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'schema_version'"
        ).fetchone()
        if not has:
            return 0
        row = self._conn.execute("SELECT MAX(version) FROM schema_version").fetchone()
        return int(row[0] or 0)

    def _migrate(self) -> None:
        with self._lock:
            if self._read_version() >= SCHEMA_VERSION:
                self._check_not_newer(self._read_version())
                return
            for target in range(1, SCHEMA_VERSION + 1):
                # BEGIN IMMEDIATE then re-read: another process may have migrated meanwhile.
                with self._tx() as c:
                    c.execute(
                        "CREATE TABLE IF NOT EXISTS schema_version ("
                        "version INTEGER PRIMARY KEY, applied_at TEXT NOT NULL)"
                    )
                    current = self._read_version()
                    self._check_not_newer(current)
                    if current >= target:
                        continue
                    try:
                        for stmt in _statements(MIGRATIONS[target - 1]):
                            c.execute(stmt)
                    except sqlite3.Error as e:
                        raise StorageError(
                            f"migrating {self.path} to schema version {target} failed ({e}); "
                            f"the database is unchanged at version {current}. Report this bug; "
                            "meanwhile point RAGSCOPE_DB at a new file"
                        ) from e
                    c.execute(
                        "INSERT INTO schema_version (version, applied_at) VALUES (?, ?)",
                        (target, _now()),
                    )

    def _check_not_newer(self, version: int) -> None:
        if version > SCHEMA_VERSION:
            raise StorageError(
                f"the database {self.path} has schema version {version}, but this ragscope "
                f"knows only up to version {SCHEMA_VERSION}; upgrade ragscope, or point "
                "RAGSCOPE_DB at another file (or move this one away) to start a new database"
            )

    # -- datasets ----------------------------------------------------------------

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
            DataError: Two examples share an id, or an item is not a RAGExample.
        """
        if not isinstance(name, str) or not name.strip():
            raise DataError("a dataset needs a non-empty name", field="name")
        meta_json = _dumps(dict(meta or {}), "meta")
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
                    (name, source, fmt, _now(), meta_json),
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

    # -- analyses ----------------------------------------------------------------

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
            enc, blob = "json", _dumps(result, "result").encode("utf-8")
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
                    _now(),
                    enc,
                    blob,
                ),
            )

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

    # -- annotations -------------------------------------------------------------

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
        now = _now()
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
                    _now(),
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

    # -- explanations ------------------------------------------------------------

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
                (model, feature_key, prompt_hash, text, _now()),
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

    # -- counterfactuals ---------------------------------------------------------

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
        return [tuple(r) for r in self._query(sql + " ORDER BY id DESC", params)]  # type: ignore[misc]

    def load_counterfactual(self, cf_id: int) -> dict[str, Any]:
        """A saved session's JSON object (:func:`core.counterfactual.load_session` makes
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


def _statements(script: str) -> list[str]:
    """Split a migration script into complete SQL statements.

    ``executescript`` would commit the surrounding transaction, so statements run one
    by one inside it instead.
    """
    out: list[str] = []
    buf = ""
    for line in script.splitlines(keepends=True):
        buf += line
        if sqlite3.complete_statement(buf):
            if buf.strip():
                out.append(buf.strip())
            buf = ""
    if buf.strip():
        raise StorageError(f"incomplete SQL statement in a migration: {buf.strip()[:80]!r}")
    return out


def _check_range(start: Any, end: Any) -> None:
    if not all(isinstance(x, int) and not isinstance(x, bool) for x in (start, end)):
        raise DataError(f"start and end must be integers, got {start!r}, {end!r}", field="start")
    if start < 0 or end <= start:
        raise DataError(f"range [{start}, {end}) is empty or negative", field="end")


def _dumps(value: Any, what: str) -> str:
    try:
        return json.dumps(value, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise DataError(f"{what} is not JSON-serialisable ({e})", field=what) from e
