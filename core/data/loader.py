"""Dataset loaders: files on disk -> validated :class:`~core.base.examples.RAGExample` lists.

One entry point, :func:`load_dataset`, reads the formats ragscope knows and returns a
:class:`LoadReport`. Every bad record becomes a :class:`~core.base.errors.DataError` whose
message starts with ``path:LINE: field 'x': ...``; with ``on_error="raise"`` the first
one is raised, with ``on_error="skip"`` they are collected and the good records kept.

Formats (``fmt=``):

* ``ragtruth_jsonl`` -- one RAGTruth-style record per line, as published with RAGLens
  (``input``, ``output``, ``hall_info``, ``model``, ``context``); also the Dolly
  "accurate context" set in the same layout.
* ``ragtruth_pair`` -- the original RAGTruth release: a directory holding
  ``response.jsonl`` and ``source_info.jsonl``.
* ``interpdetect`` -- InterpDetect's generated-response files (``documents``,
  ``prompt_spans``, ``response``, ``labels``, ``labels_gpt``, ...).
* ``generic`` -- any JSONL or CSV file read through a :class:`ColumnMapping`.
* ``ragscope`` -- ragscope's own JSONL: one :meth:`RAGExample.to_dict` per line
  (written by :func:`save_jsonl`).

Blank lines are skipped; line numbers in messages are 1-based physical lines. Each
format's reader is its own module of :mod:`core.data`; this one dispatches to them.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path

from core.base.errors import DataError
from core.base.examples import RAGExample, dedupe_ids
from core.base.safeio import replacing
from core.data.generic import _Generic
from core.data.interpdetect_format import _InterpDetect
from core.data.ragscope import _ragscope_record
from core.data.ragtruth import _RagtruthJsonl
from core.data.ragtruth_pair import PAIR_RESPONSES, PAIR_SOURCES, _load_ragtruth_pair
from core.data.records import (
    FORMATS,
    ColumnMapping,
    Format,
    LoadReport,
    OnError,
    _Collector,
    _read_csv,
    _read_jsonl,
)


def load_dataset(
    path: str | os.PathLike[str],
    *,
    fmt: Format = "auto",
    on_error: OnError = "raise",
    mapping: ColumnMapping | None = None,
    dataset: str | None = None,
    limit: int | None = None,
) -> LoadReport:
    """Load a dataset file (or RAGTruth directory) into validated examples.

    Args:
        path: The file to read; for ``ragtruth_pair`` the directory or its
            ``response.jsonl``.
        fmt: The format, or ``"auto"`` to use :func:`detect_format`.
        on_error: ``"raise"`` stops at the first bad record; ``"skip"`` keeps the good
            ones and lists the bad ones in :attr:`LoadReport.errors`.
        mapping: Columns for ``generic`` files (default: :class:`ColumnMapping()`).
        dataset: Dataset name for provenance and generated ids (default: the file
            stem, or the directory name for ``ragtruth_pair``).
        limit: Read at most this many records.

    Returns:
        A :class:`LoadReport`.

    Raises:
        DataError: The file is missing or unreadable, the format is unknown, a generic
            file lacks a mapped column, or (with ``on_error="raise"``) a record is bad;
            the message starts with ``path:LINE: field 'x':``.
    """
    if on_error not in ("raise", "skip"):
        raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
    if limit is not None and (not isinstance(limit, int) or limit < 0):
        raise ValueError(f"limit must be a non-negative integer or None, got {limit!r}")
    if fmt not in FORMATS:
        raise DataError(
            f"unknown format {fmt!r}; use one of {', '.join(FORMATS)}", source=str(path)
        )
    p = Path(path)
    if not p.exists():
        raise DataError("no such file or directory; check the path", source=str(path))
    if fmt == "auto":
        fmt = detect_format(p)  # type: ignore[assignment]  # a detected format is one of FORMATS
    col = _Collector(str(path), on_error=on_error, limit=limit)
    if fmt == "ragtruth_pair":
        _load_ragtruth_pair(p, col, dataset)
    else:
        if p.is_dir():
            raise DataError(f"format {fmt!r} reads a file, not a directory", source=str(path))
        ds = dataset or p.stem
        if fmt == "ragtruth_jsonl":
            col.run(_read_jsonl(p), _RagtruthJsonl(ds, col.warnings))
        elif fmt == "interpdetect":
            col.run(_read_jsonl(p), _InterpDetect(ds, col.warnings))
        elif fmt == "ragscope":
            col.run(_read_jsonl(p), _ragscope_record)
        else:
            m = mapping or ColumnMapping()
            if p.suffix.lower() in (".csv", ".tsv"):
                col.run(_read_csv(p, m, col.warnings), _Generic(ds, m, csv_values=True))
            else:
                col.run(_read_jsonl(p), _Generic(ds, m, csv_values=False))
    return col.report(fmt)


def detect_format(path: str | os.PathLike[str]) -> str:
    """Guess a file's format from its layout and first record.

    Rules: a directory (or a ``response.jsonl``/``source_info.jsonl``) with both
    RAGTruth files is ``ragtruth_pair``; ``.csv``/``.tsv`` is ``generic``; otherwise the
    first non-blank JSON line decides: ``input``+``output``+``hall_info`` ->
    ``ragtruth_jsonl``; ``documents``+``response``+(``prompt_spans`` or ``labels``) ->
    ``interpdetect``; ``id``+``task``+``passages``+``response``+``spans`` ->
    ``ragscope``; anything else -> ``generic`` (read through a :class:`ColumnMapping`).

    Raises:
        DataError: The path is missing, empty, or its first record is not JSON.
    """
    p = Path(path)
    if p.is_dir():
        if (p / PAIR_RESPONSES).is_file() and (p / PAIR_SOURCES).is_file():
            return "ragtruth_pair"
        raise DataError(
            f"a dataset directory must hold {PAIR_RESPONSES} and {PAIR_SOURCES} "
            "(the RAGTruth release layout); pass a file instead",
            source=str(path),
        )
    if not p.is_file():
        raise DataError("no such file; check the path", source=str(path))
    pair = (p.parent / PAIR_RESPONSES).is_file() and (p.parent / PAIR_SOURCES).is_file()
    if p.name in (PAIR_RESPONSES, PAIR_SOURCES) and pair:
        return "ragtruth_pair"
    if p.suffix.lower() in (".csv", ".tsv"):
        return "generic"
    for src, obj in _read_jsonl(p):
        if isinstance(obj, DataError):
            raise DataError(f"cannot detect the format: {obj.reason}", source=src)
        keys = set(obj) if isinstance(obj, Mapping) else set()
        if {"input", "output", "hall_info"} <= keys:
            return "ragtruth_jsonl"
        if {"documents", "response"} <= keys and keys & {"prompt_spans", "labels"}:
            return "interpdetect"
        if {"id", "task", "passages", "response", "spans"} <= keys:
            return "ragscope"
        return "generic"
    raise DataError("the file is empty (no records)", source=str(path))


def save_jsonl(examples: Iterable[RAGExample], path: str | os.PathLike[str]) -> Path:
    """Write examples as ragscope JSONL (one :meth:`RAGExample.to_dict` per line).

    The file is written to a temporary name and then renamed, so a failure leaves any
    earlier file intact.

    Args:
        examples: The examples; ids must be unique.
        path: Destination file; parent directories are created.

    Returns:
        The path written.

    Raises:
        DataError: Two examples share an id.
    """
    exs = dedupe_ids(examples)
    p = Path(path)
    with replacing(p) as f:
        for ex in exs:
            f.write(ex.to_json() + "\n")
    return p
