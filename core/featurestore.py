"""A shareable feature store: the feature cache's entries as Parquet shards (Apache Arrow).

A store is a folder of ``part-<writer>-<n>.parquet`` files. Each row is one (example,
detector) with the feature cache's own key — model key, example content hash,
detector name, feature config hash — plus the example's id and dataset, and the
features as the cache stores them (the bounded ``.npz`` payload of
:meth:`core.contract.Features.to_bytes`, no pickle). Each shard's schema metadata holds
its writer's manifest (format, ragscope version, model, detectors with their configs
and feature hashes, datasets with their data hashes); :func:`read_manifest` merges
them, and a writer also leaves the merged view in ``manifest.json``.

- :class:`ShardWriter` appends rows and writes a new shard every ``flush_every``
  examples (written to a temporary name, then renamed: a reader never sees half a
  shard, and a stopped writer loses at most the examples not yet flushed). It skips
  keys any shard of the folder already holds, so re-running resumes, and shards from
  two machines merge without duplicates.
- :func:`import_store` merges a store into the local feature cache (skipping keys the
  cache holds); :func:`store_keys` lists the keys a folder holds.

Everything read from a store is treated as hostile: only ``part-*.parquet`` files of
bounded size, the exact column names and Arrow types of :data:`SCHEMA`, bounded
payloads, and each payload parsed by the cache's own checked reader before it is
stored. A bad row is reported with its file and row, never stored, and never stops
the others.
"""

from __future__ import annotations

import json
import os
import re
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from core import __version__
from core.contract import Detector, Features
from core.errors import DataError
from core.examples import RAGExample, example_hash
from core.safeio import parse_json
from core.storage import Store

STORE_FORMAT = 1
SCHEMA = pa.schema(
    [
        ("model", pa.string()),
        ("example_hash", pa.string()),
        ("example_id", pa.string()),
        ("dataset", pa.string()),
        ("detector", pa.string()),
        ("config_hash", pa.string()),
        ("features", pa.large_binary()),
    ]
)
KEY_COLUMNS = ("model", "example_hash", "detector", "config_hash")
MANIFEST_KEY = b"ragscope.manifest"
SHARD_LIMIT = 4 << 30
"""Largest shard file read (bytes)."""
PAYLOAD_LIMIT = 256 << 20
"""Largest features payload of one row (bytes)."""
MANIFEST_LIMIT = 4 << 20
_SHARD = re.compile(r"^part-[A-Za-z0-9_-]{1,64}-[0-9]{1,9}\.parquet$")

Key = tuple[str, str, str, str]
"""(model key, example hash, detector, feature config hash): the feature cache's key."""


def feature_key(model_key: str, example: RAGExample, detector: Detector) -> Key:
    """The cache key of one example's features for one (plain) detector."""
    return (model_key, example_hash(example), detector.name, detector.config.feature_hash())


def shard_files(folder: str | Path) -> list[Path]:
    """The store's shards, sorted (other files are ignored).

    Raises:
        DataError: ``folder`` is not a folder.
    """
    root = Path(folder)
    if not root.is_dir():
        raise DataError("is not a feature store folder (no such folder)", source=str(root))
    return sorted(p for p in root.iterdir() if _SHARD.match(p.name) and p.is_file())


def _open(path: Path) -> pq.ParquetFile:
    """A shard opened for reading, after the checks every shard gets.

    Raises:
        DataError: Too large, unreadable, or not of :data:`SCHEMA` exactly.
    """
    size = path.stat().st_size
    if size > SHARD_LIMIT:
        raise DataError(
            f"the shard is {size:,} bytes, over the {SHARD_LIMIT:,}-byte limit", source=str(path)
        )
    try:
        pf = pq.ParquetFile(path)
        schema = pf.schema_arrow
    except (pa.ArrowException, OSError, ValueError) as e:
        raise DataError(f"not a readable Parquet shard ({e})", source=str(path)) from e
    got = [(f.name, f.type) for f in schema]
    want = [(f.name, f.type) for f in SCHEMA]
    if got != want:
        raise DataError(
            f"not a ragscope feature shard: columns {[n for n, _ in got]} (expected "
            f"{[n for n, _ in want]} with their types)",
            source=str(path),
        )
    return pf


def shard_manifest(path: Path) -> dict[str, Any]:
    """The manifest a shard carries (``{}`` when it has none).

    Raises:
        DataError: An unreadable shard or manifest.
    """
    meta = _open(path).schema_arrow.metadata or {}
    raw = meta.get(MANIFEST_KEY)
    if raw is None:
        return {}
    if len(raw) > MANIFEST_LIMIT:
        raise DataError("the shard's manifest is too large", source=str(path))
    doc = parse_json(raw, source=str(path))
    if not isinstance(doc, dict):
        raise DataError("the shard's manifest is not a JSON object", source=str(path))
    return doc


def read_manifest(folder: str | Path) -> dict[str, Any]:
    """The store's manifest: every shard's merged (models, detectors, datasets, versions).

    Raises:
        DataError: An unreadable shard.
    """
    merged: dict[str, Any] = {
        "format": STORE_FORMAT,
        "models": [],
        "detectors": {},
        "datasets": {},
        "ragscope_versions": [],
        "shards": 0,
    }
    for path in shard_files(folder):
        m = shard_manifest(path)
        merged["shards"] += 1
        for k_list, v in (("models", m.get("model")), ("ragscope_versions", m.get("ragscope"))):
            if isinstance(v, str) and v not in merged[k_list]:
                merged[k_list].append(v)
        for key in ("detectors", "datasets"):
            if isinstance(m.get(key), dict):
                merged[key].update(m[key])
    return merged


def _rows(path: Path, columns: Sequence[str]) -> Iterator[dict[str, Any]]:
    pf = _open(path)
    for batch in pf.iter_batches(columns=list(columns), batch_size=256):
        yield from batch.to_pylist()


def store_keys(folder: str | Path) -> set[Key]:
    """Every key the store's shards hold (reading only the key columns).

    Raises:
        DataError: An unreadable shard.
    """
    keys: set[Key] = set()
    if not Path(folder).exists():
        return keys
    for path in shard_files(folder):
        for r in _rows(path, KEY_COLUMNS):
            keys.add((r["model"], r["example_hash"], r["detector"], r["config_hash"]))
    return keys


@dataclass
class ShardWriter:
    """Appends features to a store folder as Parquet shards (see the module docstring).

    Attributes:
        folder: The store folder (made when missing).
        manifest: This writer's manifest (model, detectors, datasets), stored in each shard.
        flush_every: Examples per shard.
    """

    folder: Path
    manifest: Mapping[str, Any]
    flush_every: int = 32
    writer: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    written: int = 0
    skipped: int = 0
    _seen: set[Key] = field(default_factory=set)
    _rows: list[dict[str, Any]] = field(default_factory=list)
    _examples: int = 0
    _parts: int = 0

    def __post_init__(self) -> None:
        self.folder = Path(self.folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self._seen = store_keys(self.folder)

    def holds(self, key: Key) -> bool:
        """Whether the store (any shard, or this writer's pending rows) holds ``key``."""
        return key in self._seen

    def add(self, key: Key, example: RAGExample, features: Features) -> bool:
        """Queue one (example, detector) row unless its key is stored already; returns
        whether it was queued."""
        if key in self._seen:
            self.skipped += 1
            return False
        self._seen.add(key)
        model, ex_hash, detector, cfg = key
        self._rows.append(
            {
                "model": model,
                "example_hash": ex_hash,
                "example_id": example.id,
                "dataset": example.provenance.dataset,
                "detector": detector,
                "config_hash": cfg,
                "features": features.to_bytes(),
            }
        )
        return True

    def example_done(self) -> None:
        """One example's rows are all queued: flush when ``flush_every`` have been."""
        self._examples += 1
        if self._examples >= self.flush_every:
            self.flush()

    def flush(self) -> None:
        """Write the queued rows as a new shard (atomically)."""
        self._examples = 0
        if not self._rows:
            return
        meta = {
            MANIFEST_KEY: json.dumps(
                {"format": STORE_FORMAT, "ragscope": __version__, **self.manifest}
            ).encode()
        }
        table = pa.Table.from_pylist(self._rows, schema=SCHEMA.with_metadata(meta))
        name = f"part-{self.writer}-{self._parts:06d}.parquet"
        tmp = self.folder / f".tmp-{name}"
        pq.write_table(table, tmp, compression="zstd")
        os.replace(tmp, self.folder / name)
        self._parts += 1
        self.written += len(self._rows)
        self._rows = []

    def close(self) -> None:
        """Flush, then leave the merged manifest in ``manifest.json``."""
        self.flush()
        tmp = self.folder / f".tmp-manifest-{self.writer}.json"
        tmp.write_text(json.dumps(read_manifest(self.folder), indent=2))
        os.replace(tmp, self.folder / "manifest.json")


@dataclass(frozen=True)
class ImportReport:
    """What :func:`import_store` did."""

    imported: int
    present: int
    rejected: tuple[str, ...]


def import_store(folder: str | Path, store: Store) -> ImportReport:
    """Merge a store folder into the local feature cache; keys the cache holds are left
    as they are. Bad shards and rows are listed in ``rejected`` (file and row) and skipped.

    Raises:
        DataError: ``folder`` is not a folder.
    """
    imported = present = 0
    rejected: list[str] = []
    for path in shard_files(folder):
        try:
            rows = _rows(path, [f.name for f in SCHEMA])
            for i, r in enumerate(rows):
                where = f"{path.name} row {i}"
                key = {k: r[k] for k in KEY_COLUMNS}
                blob = r["features"]
                if not all(isinstance(v, str) and 0 < len(v) <= 512 for v in key.values()):
                    rejected.append(f"{where}: a key column is missing or too long")
                    continue
                if not isinstance(blob, bytes) or len(blob) > PAYLOAD_LIMIT:
                    rejected.append(
                        f"{where}: no features payload, or one over {PAYLOAD_LIMIT:,} bytes"
                    )
                    continue
                if store.has_analysis(**key):
                    present += 1
                    continue
                try:
                    feats = Features.from_bytes(blob, example_id=r["example_id"] or None)
                except DataError as e:
                    rejected.append(f"{where}: {e}")
                    continue
                if feats.detector != key["detector"] or feats.model != key["model"]:
                    rejected.append(
                        f"{where}: the payload is {feats.detector!r} features of "
                        f"{feats.model!r}, not what its key says"
                    )
                    continue
                store.put_analysis(
                    **key,
                    result=blob,
                    dataset=r["dataset"] if isinstance(r["dataset"], str) else None,
                    example_id=r["example_id"] if isinstance(r["example_id"], str) else None,
                )
                imported += 1
        except DataError as e:
            rejected.append(f"{path.name}: {e.reason}")
        except (pa.ArrowException, OSError, ValueError) as e:
            rejected.append(f"{path.name}: unreadable ({type(e).__name__}: {str(e)[:160]})")
    return ImportReport(imported=imported, present=present, rejected=tuple(rejected))
