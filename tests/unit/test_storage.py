"""SQLite storage: migrations, WAL, all-or-nothing imports, caches and annotations."""

from __future__ import annotations

import dataclasses
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

import core.storage as storage
import core.storage.db as storage_db
from core.base.errors import DataError, StorageError
from core.base.examples import RAGExample, example_hash
from core.data import builtin_examples
from core.storage import Store, default_db_path


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAGSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("RAGSCOPE_DB", raising=False)


@pytest.fixture
def store() -> Iterator[Store]:
    with Store() as s:
        yield s


@pytest.fixture(scope="module")
def demo() -> list[RAGExample]:
    return builtin_examples()


def test_default_path_follows_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert default_db_path() == tmp_path / "cache" / "ragscope.sqlite3"
    monkeypatch.setenv("RAGSCOPE_DB", str(tmp_path / "other.db"))
    assert default_db_path() == tmp_path / "other.db"


def test_new_db_is_migrated_with_wal_and_fks(store: Store, tmp_path: Path) -> None:
    assert Path(store.path) == tmp_path / "cache" / "ragscope.sqlite3"
    assert store.schema_version() == len(storage.MIGRATIONS) >= 1
    assert store._conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert store._conn.execute("PRAGMA foreign_keys").fetchone()[0] == 1
    tables = {
        r[0] for r in store._conn.execute("SELECT name FROM sqlite_master WHERE type='table'")
    }
    assert {
        "schema_version",
        "datasets",
        "examples",
        "analyses",
        "annotations",
        "explanations",
    } <= tables


def test_reopen_is_idempotent_and_applies_new_migrations(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, demo: list[RAGExample]
) -> None:
    path = tmp_path / "db.sqlite3"
    with Store(path) as s:
        s.import_dataset("demo", demo, source="x", fmt="ragscope")
    n = len(storage.MIGRATIONS)
    with Store(path) as s:
        assert s.schema_version() == n
        assert s._conn.execute("SELECT COUNT(*) FROM schema_version").fetchone()[0] == n
    extra = "CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT);\nCREATE INDEX notes_body ON notes(body);"
    monkeypatch.setattr(storage_db, "MIGRATIONS", (*storage.MIGRATIONS, extra))
    monkeypatch.setattr(storage_db, "SCHEMA_VERSION", n + 1)
    with Store(path) as s:
        assert s.schema_version() == n + 1
        assert s._conn.execute("SELECT COUNT(*) FROM notes").fetchone()[0] == 0
        assert len(s.load_examples("demo")) == len(demo)


def test_failed_migration_leaves_db_unchanged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "db.sqlite3"
    Store(path).close()
    n = len(storage.MIGRATIONS)
    bad = "CREATE TABLE half (id INTEGER);\nCREATE TABLE broken (;"
    monkeypatch.setattr(storage_db, "MIGRATIONS", (*storage.MIGRATIONS, bad))
    monkeypatch.setattr(storage_db, "SCHEMA_VERSION", n + 1)
    with pytest.raises(
        StorageError, match=f"schema version {n + 1} failed.*unchanged at version {n}"
    ):
        Store(path)
    con = sqlite3.connect(path)
    names = {r[0] for r in con.execute("SELECT name FROM sqlite_master")}
    assert (
        "half" not in names
        and con.execute("SELECT MAX(version) FROM schema_version").fetchone()[0] == n
    )
    con.close()


def test_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite3"
    with Store(path) as s:
        s._conn.execute("INSERT INTO schema_version VALUES (99, 'future')")
    with pytest.raises(StorageError, match=r"schema version 99.*upgrade ragscope.*RAGSCOPE_DB"):
        Store(path)


def test_not_a_database(tmp_path: Path) -> None:
    path = tmp_path / "junk.sqlite3"
    path.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(StorageError, match="not a usable ragscope database"):
        Store(path)


def test_import_load_round_trip(store: Store, demo: list[RAGExample]) -> None:
    assert store.import_dataset("demo", demo, source="assets", fmt="ragscope", meta={"v": 1}) == 12
    assert store.load_examples("demo") == demo
    (info,) = store.list_datasets()
    assert (info.name, info.source, info.format, info.n_examples) == (
        "demo",
        "assets",
        "ragscope",
        12,
    )
    assert dict(info.meta) == {"v": 1}
    with pytest.raises(dataclasses.FrozenInstanceError):
        info.name = "x"  # type: ignore[misc]


def test_existing_name_needs_replace(store: Store, demo: list[RAGExample]) -> None:
    store.import_dataset("demo", demo, source=None, fmt=None)
    with pytest.raises(StorageError, match="already stored; pass replace=True"):
        store.import_dataset("demo", demo[:2], source=None, fmt=None)
    assert len(store.load_examples("demo")) == 12
    assert store.import_dataset("demo", demo[:2], source="new", fmt=None, replace=True) == 2
    assert store.load_examples("demo") == demo[:2]
    assert [d.source for d in store.list_datasets()] == ["new"]


def test_failed_import_keeps_earlier_data(store: Store, demo: list[RAGExample]) -> None:
    store.import_dataset("demo", demo, source="v1", fmt=None)

    with pytest.raises(DataError, match="duplicate id"):
        store.import_dataset(
            "demo", [demo[0], demo[1], demo[0]], source="v2", fmt=None, replace=True
        )

    def exploding() -> Iterator[RAGExample]:
        yield demo[0]
        raise RuntimeError("reader died")

    with pytest.raises(RuntimeError, match="reader died"):
        store.import_dataset("demo", exploding(), source="v3", fmt=None, replace=True)
    with pytest.raises(RuntimeError):
        store.import_dataset("other", exploding(), source="v3", fmt=None)
    with pytest.raises(DataError, match="not a RAGExample"):
        store.import_dataset("other", [demo[0], {"id": "x"}], source=None, fmt=None)  # type: ignore[list-item]

    assert [(d.name, d.source, d.n_examples) for d in store.list_datasets()] == [("demo", "v1", 12)]
    assert store.load_examples("demo") == demo
    assert store._conn.execute("SELECT COUNT(*) FROM examples").fetchone()[0] == 12


def test_delete_and_unknown(store: Store, demo: list[RAGExample]) -> None:
    store.import_dataset("a", demo[:3], source=None, fmt=None)
    store.import_dataset("b", demo[3:5], source=None, fmt=None)
    store.delete_dataset("a")
    assert [d.name for d in store.list_datasets()] == ["b"]
    assert store._conn.execute("SELECT COUNT(*) FROM examples").fetchone()[0] == 2  # cascade
    with pytest.raises(StorageError, match="no dataset named 'a'.*stored: 'b'"):
        store.load_examples("a")
    with pytest.raises(StorageError, match="no dataset named"):
        store.delete_dataset("a")


def test_analyses_cache(store: Store, demo: list[RAGExample]) -> None:
    ex = demo[0]
    key = dict(example_hash=example_hash(ex), model="m", detector="redeep", config_hash="c1")
    assert store.get_analysis(**key) is None
    store.put_analysis(
        **key, result={"score": 0.25, "tokens": [1, 2]}, dataset="demo", example_id=ex.id
    )
    rec = store.get_analysis(**key)
    assert (
        rec is not None
        and rec.result == {"score": 0.25, "tokens": [1, 2]}
        and rec.example_id == ex.id
    )
    store.put_analysis(**key, result=b"\x00\x01raw")
    rec2 = store.get_analysis(**key)
    assert rec2 is not None and rec2.result == b"\x00\x01raw"
    assert store._conn.execute("SELECT COUNT(*) FROM analyses").fetchone()[0] == 1
    assert store.get_analysis(**{**key, "config_hash": "c2"}) is None
    with pytest.raises(DataError, match="not JSON-serialisable"):
        store.put_analysis(**key, result={"x": object()})


def test_example_hash_is_about_model_input(demo: list[RAGExample]) -> None:
    ex = demo[1]
    same_input = dataclasses.replace(ex, id="other", label=None, spans=())
    assert example_hash(same_input) == example_hash(ex)
    assert example_hash(ex.with_response(ex.response + " More.")) != example_hash(ex)


def test_annotations(store: Store, demo: list[RAGExample]) -> None:
    store.import_dataset("demo", demo, source=None, fmt=None)
    a = store.add_annotation(
        "demo", "demo-02", 10, 20, "Evident Conflict", note="n", annotator="ann"
    )
    b = store.add_annotation("demo", "demo-02", 0, 5, "Subtle Conflict")
    store.add_annotation("demo", "demo-01", 3, 4, "Evident Baseless Info")
    got = store.list_annotations("demo", "demo-02")
    assert [(x.id, x.start, x.end) for x in got] == [(b, 0, 5), (a, 10, 20)]
    assert len(store.list_annotations("demo")) == 3
    store.update_annotation(a, end=25, note="wider")
    (upd,) = [x for x in store.list_annotations("demo", "demo-02") if x.id == a]
    assert (upd.start, upd.end, upd.label, upd.note) == (10, 25, "Evident Conflict", "wider")
    with pytest.raises(DataError, match="empty or negative"):
        store.add_annotation("demo", "demo-02", 5, 5, "x")
    with pytest.raises(DataError, match="empty or negative"):
        store.update_annotation(a, start=30)
    with pytest.raises(StorageError, match="no annotation"):
        store.update_annotation(999, label="x")
    # Annotations survive re-importing the dataset.
    store.import_dataset("demo", demo, source=None, fmt=None, replace=True)
    assert len(store.list_annotations("demo")) == 3
    store.delete_annotation(b)
    assert [x.id for x in store.list_annotations("demo", "demo-02")] == [a]


def test_explanations(store: Store) -> None:
    key = dict(model="smol", feature_key="sae-L12/7", prompt_hash="p1")
    assert store.get_explanation(**key) is None
    store.put_explanation(**key, text="Fires on dates.")
    store.put_explanation(**key, text="Fires on years.")
    assert store.get_explanation(**key) == "Fires on years."
    assert store.get_explanation(**{**key, "prompt_hash": "p2"}) is None


def test_threads_share_one_store(store: Store) -> None:
    errors: list[BaseException] = []

    def work(k: int) -> None:
        try:
            for i in range(25):
                store.put_analysis(
                    example_hash=f"h{k}-{i}",
                    model="m",
                    detector="d",
                    config_hash="c",
                    result=[k, i],
                )
                assert store.get_analysis(
                    example_hash=f"h{k}-{i}", model="m", detector="d", config_hash="c"
                )
        except BaseException as e:  # collected for the main thread
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert store._conn.execute("SELECT COUNT(*) FROM analyses").fetchone()[0] == 200


def test_memory_store() -> None:
    with Store(":memory:") as s:
        assert s.schema_version() == len(storage.MIGRATIONS)
        assert s.list_datasets() == []
