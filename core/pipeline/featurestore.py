"""A shareable feature store: the feature cache's entries as Parquet shards (Apache Arrow).

A store is a folder of ``part-<writer>-<n>.parquet`` files. Each row is one (example,
detector) with the feature cache's own key — model key, example content hash,
detector name, feature config hash — plus the example's id and dataset, and the
features as the cache stores them (the bounded ``.npz`` payload of
:meth:`core.learning.contract.Features.to_bytes`, no pickle). Each shard's schema metadata holds
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
bounded size and the exact column names and Arrow types of :data:`SCHEMA`; memory is
bounded by decompressed sizes before anything is materialised (the footer's row counts
and each column chunk's decompressed size, as its pages' own headers state it, never as
the footer claims it: :mod:`core.pipeline.parquet_pages`, are checked first, then one
row group is read at a time in batches sized from them, and a row group that decodes to
far more than it decompresses to, a dictionary bomb, is stopped). Each row is checked as the detectors'
own extraction writes it (:func:`import_store`). A bad row is reported with its file
and row, never stored, and never stops the others.
"""

from __future__ import annotations

import json
import os
import re
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from core import __version__
from core.base.errors import DataError
from core.base.examples import RAGExample, example_hash
from core.base.safeio import parse_json, replace_file
from core.detectors import DETECTORS
from core.learning.contract import Detector, Features
from core.pipeline.parquet_pages import chunk_pages
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
PAYLOAD_LIMIT = 128 << 20
"""Largest features payload of one row (bytes)."""
MANIFEST_LIMIT = 4 << 20
ROWS_LIMIT = 100_000
"""Most rows one shard may declare (a writer's shard holds ``flush_every`` examples x
detectors: a few hundred)."""
TEXT_LIMIT = 512
"""Longest key, example id or dataset name of a row (characters)."""
FEATURES_COLUMN_LIMIT = 256 << 20
"""Most bytes the features column of one row group may decompress to (the writer keeps
its row groups near :data:`ROW_GROUP_BYTES`)."""
TEXT_COLUMN_LIMIT = 16 << 20
"""Most bytes a text column of one row group may decompress to."""
PAGE_LIMIT = PAYLOAD_LIMIT + (1 << 20)
"""Most bytes one page may decompress to: a page holds at least one value, so one
payload and its length (the writer writes a page per value or per MiB: ``data_page_size``
and ``write_batch_size``). Reading a shard holds about one page and one batch at a time,
so it peaks near ``2 * PAGE_LIMIT + 2 * BATCH_BYTES`` above the process's own size,
whatever its footer says."""
BATCH_BYTES = 16 << 20
"""About the most bytes one read batch materialises (rows are read one at a time when a
row group's column is larger)."""
SHARD_READ_LIMIT = 4 << 30
"""Most bytes one shard may materialise when read, in all."""
ROW_GROUP_BYTES = 32 << 20
"""About the features bytes of one row group the writer writes."""
_SHARD = re.compile(r"^part-[A-Za-z0-9_-]{1,64}-[0-9]{1,9}\.parquet$")
_HASH = re.compile(r"^[0-9a-f]{64}$")
_CONFIG = re.compile(r"^[0-9a-f]{16}$")

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
        # Column chunks stream through a small buffer (never pre-read whole), and the
        # footer's strings and lists are bounded before they are decoded.
        pf = pq.ParquetFile(
            path,
            pre_buffer=False,
            buffer_size=1 << 20,
            thrift_string_size_limit=2 * MANIFEST_LIMIT,
            thrift_container_size_limit=4 * ROWS_LIMIT,
        )
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


@dataclass(frozen=True)
class _Group:
    """How one row group is read: rows per batch and the bytes it may materialise."""

    index: int
    batch_size: int
    budget: int


def _plan(pf: pq.ParquetFile, path: Path, columns: Sequence[str]) -> list[_Group]:
    """How each row group is read, from its pages' own headers
    (:func:`core.pipeline.parquet_pages.chunk_pages`: what each page really decompresses
    to, never the footer's claimed sizes), before any value is read.

    A value is never larger than the page it sits in (a data or dictionary page), so
    batches of ``BATCH_BYTES // largest page`` rows (at least one) materialise at most
    about ``max(BATCH_BYTES, largest page)`` per column. What a row group may materialise
    in all is about what its pages decompress to (twice, plus 2 KiB a row and column):
    more means a value repeated many times by dictionary encoding.

    Raises:
        DataError: Too many rows, unreadable page headers, or a column of a row group
            whose pages decompress to more than its limit (:data:`FEATURES_COLUMN_LIMIT`,
            :data:`TEXT_COLUMN_LIMIT`).
    """
    meta = pf.metadata
    groups = [meta.row_group(g) for g in range(meta.num_row_groups)]
    rows = sum(rg.num_rows for rg in groups)
    if max(rows, meta.num_rows) > ROWS_LIMIT:
        raise DataError(
            f"the shard declares {max(rows, meta.num_rows):,} rows, over the "
            f"{ROWS_LIMIT:,}-row limit (not read)",
            source=str(path),
        )
    plan = []
    size_on_disk = path.stat().st_size
    with path.open("rb") as f:
        for g, rg in enumerate(groups):
            largest, budget = 1, 0
            for name in columns:
                col = rg.column(SCHEMA.names.index(name))
                dict_at = col.dictionary_page_offset if col.has_dictionary_page else None
                start = dict_at if dict_at else col.data_page_offset
                pages = chunk_pages(
                    f,
                    size_on_disk,
                    int(start),
                    int(col.total_compressed_size),
                    where=f"{path}: row group {g}, column {name!r}",
                )
                limit = FEATURES_COLUMN_LIMIT if name == "features" else TEXT_COLUMN_LIMIT
                if pages.uncompressed > limit:
                    raise DataError(
                        f"row group {g}: the {name!r} column decompresses to "
                        f"{pages.uncompressed:,} bytes, over the {limit:,}-byte limit (not read)",
                        source=str(path),
                    )
                if pages.largest > PAGE_LIMIT:
                    raise DataError(
                        f"row group {g}: a page of the {name!r} column decompresses to "
                        f"{pages.largest:,} bytes, over the {PAGE_LIMIT:,}-byte limit (not read)",
                        source=str(path),
                    )
                largest = max(largest, pages.largest)
                budget += 2 * pages.uncompressed + 2048 * rg.num_rows
            plan.append(_Group(g, max(1, min(256, BATCH_BYTES // largest)), budget))
    return plan


def _rows(path: Path, columns: Sequence[str]) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(row number, row)`` of a shard, one row group and a bounded batch at a time.

    Raises:
        DataError: A shard over its limits (:func:`_plan`), before any row is read; a row
            group that materialises more than its budget or the shard more than
            :data:`SHARD_READ_LIMIT` (rows before it were yielded).
    """
    pf = _open(path)
    i = total = 0
    for group in _plan(pf, path, columns):
        read = 0
        batches = pf.iter_batches(
            batch_size=group.batch_size, row_groups=[group.index], columns=list(columns)
        )
        for batch in batches:
            read += batch.nbytes
            total += batch.nbytes
            if read > group.budget or total > SHARD_READ_LIMIT:
                raise DataError(
                    f"row group {group.index} expands to over "
                    f"{min(group.budget, SHARD_READ_LIMIT):,} bytes once decoded (values "
                    f"repeated by dictionary encoding?); not read from row {i} on",
                    source=str(path),
                )
            for r in batch.to_pylist():
                yield i, r
                i += 1


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


def _text_ok(value: Any) -> bool:
    return isinstance(value, str) and 0 < len(value) <= TEXT_LIMIT


def store_keys(folder: str | Path, wanted: Callable[[Key], bool] | None = None) -> set[Key]:
    """Every key the store's shards hold (reading only the key columns), or only those
    ``wanted`` keeps (memory then grows with those, not with the store).

    Raises:
        DataError: An unreadable shard, or one over the limits of :func:`_plan`.
    """
    keys: set[Key] = set()
    if not Path(folder).exists():
        return keys
    for path in shard_files(folder):
        for _, r in _rows(path, KEY_COLUMNS):
            key = (r["model"], r["example_hash"], r["detector"], r["config_hash"])
            if all(_text_ok(k) for k in key) and (wanted is None or wanted(key)):
                keys.add(key)
    return keys


@dataclass
class ShardWriter:
    """Appends features to a store folder as Parquet shards (see the module docstring).

    Attributes:
        folder: The store folder (made when missing).
        manifest: This writer's manifest (model, detectors, datasets), stored in each shard.
        flush_every: Examples per shard.
        wanted: Which of the folder's keys to remember as held (default: all); a run
            passes the keys of its own examples, so a large store costs no memory.
    """

    folder: Path
    manifest: Mapping[str, Any]
    flush_every: int = 32
    wanted: Callable[[Key], bool] | None = None
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
        self._seen = store_keys(self.folder, self.wanted)

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
        # Row groups of about ROW_GROUP_BYTES, well inside what a reader accepts.
        size = sum(len(r["features"]) for r in self._rows)
        per_group = max(1, len(self._rows) * ROW_GROUP_BYTES // max(1, size))
        pq.write_table(
            table,
            tmp,
            compression="zstd",
            row_group_size=per_group,
            use_dictionary=list(SCHEMA.names[:-1]),
            data_page_size=1 << 20,
            write_batch_size=16,  # pages split after each 16 rows: a page is ~1 MiB or a value
        )
        os.replace(tmp, self.folder / name)
        self._parts += 1
        self.written += len(self._rows)
        self._rows = []

    def close(self) -> None:
        """Flush, then leave the merged manifest in ``manifest.json``."""
        self.flush()
        replace_file(
            self.folder / "manifest.json", json.dumps(read_manifest(self.folder), indent=2)
        )


@dataclass(frozen=True)
class ImportReport:
    """What :func:`import_store` did."""

    imported: int
    present: int
    rejected: tuple[str, ...]


class _Reject(Exception):
    """One row refused (the reason is the message)."""


def _feature_hashes(manifest: Mapping[str, Any]) -> dict[str, str]:
    """Detector name -> the feature hash re-derived from the config the shard's manifest
    records for it (the hash the local detector with that config reads and writes);
    detectors whose config does not re-derive the recorded hash are left out."""
    out: dict[str, str] = {}
    detectors = manifest.get("detectors")
    for name, entry in (detectors if isinstance(detectors, dict) else {}).items():
        try:
            cls = DETECTORS.get(name)
            if cls.composite or not isinstance(entry, dict):
                continue
            config = entry.get("config")
            derived = cls.Config.from_dict(config if isinstance(config, dict) else {})
            if derived.feature_hash() == entry.get("feature_hash"):
                out[name] = derived.feature_hash()
        except (DataError, TypeError, ValueError):
            continue
    return out


@dataclass
class _Checker:
    """Checks each row of a store as the detectors' own extraction would write it.

    Attributes:
        by_hash: Local examples by :func:`example_hash` (the examples known here).
        by_id: Local examples by id (ids that name one local example only).
        shapes: (model, detector, config hash) -> (names, token names, chunk names) of the
            first row accepted: every other row of that key must have the same columns.
    """

    by_hash: dict[str, RAGExample]
    by_id: dict[str, RAGExample]
    shapes: dict[tuple[str, str, str], tuple[tuple[str, ...], ...]] = field(default_factory=dict)
    hashes: dict[str, str] = field(default_factory=dict)
    model: str | None = None

    def shard(self, path: Path) -> None:
        """Start a shard: its manifest's model and re-derived detector config hashes."""
        manifest = shard_manifest(path)
        self.model = manifest.get("model") if isinstance(manifest.get("model"), str) else None
        self.hashes = _feature_hashes(manifest)

    def key(self, r: Mapping[str, Any]) -> dict[str, str]:
        """The row's cache key, re-derived where it can be.

        Raises:
            _Reject: Why the key cannot be this row's.
        """
        key = {k: r[k] for k in KEY_COLUMNS}
        if not all(_text_ok(v) for v in key.values()):
            raise _Reject(f"a key column is missing or over {TEXT_LIMIT} characters")
        if not all(v is None or _text_ok(v) for v in (r["example_id"], r["dataset"])):
            raise _Reject(f"the example id or dataset is empty or over {TEXT_LIMIT} characters")
        if not _HASH.match(key["example_hash"]) or not _CONFIG.match(key["config_hash"]):
            raise _Reject("the example hash or config hash is not a ragscope hash")
        if self.model is not None and key["model"] != self.model:
            raise _Reject(f"model {key['model']!r}, but the shard was written with {self.model!r}")
        derived = self.hashes.get(key["detector"])
        if derived is None:
            raise _Reject(
                f"no {key['detector']!r} config in the shard's manifest re-derives its "
                "feature hash (an unknown or composite detector, or an altered manifest)"
            )
        if key["config_hash"] != derived:
            raise _Reject(
                f"config hash {key['config_hash']} is not {derived}, the hash of the "
                f"{key['detector']} config the shard's manifest records"
            )
        local = self.by_id.get(r["example_id"])
        if local is not None and example_hash(local) != key["example_hash"]:
            raise _Reject(
                f"filed under example hash {key['example_hash'][:12]}..., but the local "
                f"example {r['example_id']!r} hashes to "
                f"{example_hash(local)[:12]}... (another example's hash, or another version "
                "of it)"
            )
        return key

    def features(self, key: Mapping[str, str], r: Mapping[str, Any]) -> None:
        """Check the payload as extraction writes it.

        Raises:
            _Reject: Why it cannot be the features its key names.
        """
        blob = r["features"]
        if not isinstance(blob, bytes) or len(blob) > PAYLOAD_LIMIT:
            raise _Reject(f"no features payload, or one over {PAYLOAD_LIMIT:,} bytes")
        try:
            feats = Features.from_bytes(blob, example_id=r["example_id"] or None)
            example = self.by_hash.get(key["example_hash"])
            if example is not None:
                feats.check_fits(example)
        except DataError as e:
            raise _Reject(str(e)) from e
        if feats.detector != key["detector"] or feats.model != key["model"]:
            raise _Reject(
                f"the payload is {feats.detector!r} features of {feats.model!r}, not what its "
                "key says"
            )
        cols = (feats.names, feats.token_names, feats.chunk_names)
        first = self.shapes.setdefault((key["model"], key["detector"], key["config_hash"]), cols)
        if cols != first:
            raise _Reject(
                f"its {key['detector']} features have other names than the store's other "
                f"{key['detector']} rows ({len(feats.names)} response, {len(feats.token_names)} "
                f"token features; expected {len(first[0])} and {len(first[1])})"
            )


def import_store(
    folder: str | Path, store: Store, examples: Iterable[RAGExample] = ()
) -> ImportReport:
    """Merge a store folder into the local feature cache; keys the cache holds are left
    as they are. Bad shards and rows are listed in ``rejected`` (file and row) and skipped.

    Every row is checked as the detectors' own extraction writes it: the key's hashes,
    the detector config re-derived from the shard's manifest (and its model), a payload
    of finite floats and possible offsets, for the detector and model its key names, with
    the same columns as the other rows of that detector. Rows of ``examples`` (known
    here) must also fit the example: its hash, and offsets within its response. Rows of
    examples not known here are stored once they pass the rest, and
    :meth:`core.pipeline.extract.FeatureCache.get` checks them against the example (offsets equal
    its tokens under the model) when one is used; what does not fit is recomputed.

    Raises:
        DataError: ``folder`` is not a folder.
    """
    local = list(examples)
    ids = Counter(e.id for e in local)
    check = _Checker(
        by_hash={example_hash(e): e for e in local},
        by_id={e.id: e for e in local if ids[e.id] == 1},
    )
    imported = present = 0
    rejected: list[str] = []
    for path in shard_files(folder):
        try:
            check.shard(path)
            for i, r in _rows(path, SCHEMA.names):
                try:
                    key = check.key(r)
                    if store.has_analysis(**key):
                        present += 1
                        continue
                    check.features(key, r)
                except _Reject as e:
                    rejected.append(f"{path.name} row {i}: {e}")
                    continue
                store.put_analysis(
                    **key,
                    result=r["features"],
                    dataset=r["dataset"],
                    example_id=r["example_id"],
                )
                imported += 1
        except DataError as e:
            rejected.append(f"{path.name}: {e.reason}")
        except (pa.ArrowException, OSError, ValueError) as e:
            rejected.append(f"{path.name}: unreadable ({type(e).__name__}: {str(e)[:160]})")
    return ImportReport(imported=imported, present=present, rejected=tuple(rejected))
