"""The connection to the ragscope database: opening, transactions, schema versions.

:class:`Database` opens one SQLite file (WAL mode, foreign keys on), applies the missing
:data:`~core.storage.migrations.MIGRATIONS` (each in its own transaction) and refuses a
database written by a newer ragscope. It holds one connection shared by all threads
behind a lock; the table repositories (:mod:`core.storage.datasets` and its siblings)
are written against it.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from core.base.errors import DataError, StorageError
from core.storage.migrations import MIGRATIONS, SCHEMA_VERSION

DB_FILENAME = "ragscope.sqlite3"


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


def dumps(value: Any, what: str) -> str:
    """``value`` as the JSON text a column stores.

    Raises:
        DataError: ``value`` is not JSON-serialisable (``what`` names it).
    """
    try:
        return json.dumps(value, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise DataError(f"{what} is not JSON-serialisable ({e})", field=what) from e


class Database:
    """One open ragscope database (:class:`~core.storage.Store` documents its use).

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

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.path!r})"

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
        """Rows of one read statement."""
        with self._lock:
            return self._conn.execute(sql, tuple(params)).fetchall()

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
                        (target, now_iso()),
                    )

    def _check_not_newer(self, version: int) -> None:
        if version > SCHEMA_VERSION:
            raise StorageError(
                f"the database {self.path} has schema version {version}, but this ragscope "
                f"knows only up to version {SCHEMA_VERSION}; upgrade ragscope, or point "
                "RAGSCOPE_DB at another file (or move this one away) to start a new database"
            )


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
