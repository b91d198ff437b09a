"""Dataset loaders: files on disk -> validated :class:`~core.examples.RAGExample` lists.

One entry point, :func:`load_dataset`, reads the formats ragscope knows and returns a
:class:`LoadReport`. Every bad record becomes a :class:`~core.errors.DataError` whose
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

Blank lines are skipped; line numbers in messages are 1-based physical lines.
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, get_args

from core.errors import DataError
from core.examples import TASKS, Provenance, RAGExample, Span, Task, dedupe_ids, parse_label
from core.paths import builtin_dir, repo_root
from core.safeio import MiB, parse_json
from core.storage import Store

if TYPE_CHECKING:
    import pandas as pd

Format = Literal["auto", "ragtruth_jsonl", "ragtruth_pair", "interpdetect", "generic", "ragscope"]
FORMATS: tuple[str, ...] = get_args(Format)
OnError = Literal["raise", "skip"]

PAIR_RESPONSES = "response.jsonl"
PAIR_SOURCES = "source_info.jsonl"
INTERPDETECT_GENERATOR = "Qwen3-0.6B"

_PASSAGE_MARKER = re.compile(r"^passage (\d+):", re.MULTILINE)
_PAIR_TASKS: dict[str, Task] = {"qa": "qa", "summary": "summary", "data2txt": "data2txt"}


# --------------------------------------------------------------------------- results


@dataclass(frozen=True)
class LoadReport:
    """What :func:`load_dataset` read.

    Attributes:
        path: The file or directory that was read.
        n_read: Records read (good and bad; blank lines do not count).
        examples: The records that loaded, in file order.
        errors: One :class:`DataError` per skipped record (empty with ``on_error="raise"``).
        warnings: Records that loaded with an adjustment worth knowing (a passage cut
            short in the prompt, an id made unique, labels dropped), one line each.
        fmt: The format the file was read as.
    """

    path: str
    n_read: int
    examples: tuple[RAGExample, ...]
    errors: tuple[DataError, ...]
    warnings: tuple[str, ...] = ()
    fmt: str = ""

    def summary(self, *, max_errors: int = 5, max_warnings: int = 3) -> str:
        """Human-readable lines: counts, then the first errors and warnings (each once)."""
        n_bad = len(self.errors)
        lines = [
            f"{self.path}: {len(self.examples)} of {self.n_read} records loaded"
            + (f" as {self.fmt}" if self.fmt else "")
            + (f", {n_bad} skipped" if n_bad else "")
            + (f", {len(self.warnings)} warnings" if self.warnings else "")
        ]
        for e in self.errors[:max_errors]:
            lines.append(f"  error: {e}")
        if n_bad > max_errors:
            lines.append(f"  ... and {n_bad - max_errors} more errors")
        for w in self.warnings[:max_warnings]:
            lines.append(f"  warning: {w}")
        if len(self.warnings) > max_warnings:
            lines.append(f"  ... and {len(self.warnings) - max_warnings} more warnings")
        return "\n".join(lines)

    def to_frame(self) -> pd.DataFrame:
        """The errors as a table with columns ``source``, ``field``, ``reason``."""
        import pandas as pd

        return pd.DataFrame(
            [(e.source, e.field, e.reason) for e in self.errors],
            columns=["source", "field", "reason"],
        )


@dataclass(frozen=True, kw_only=True)
class ColumnMapping:
    """Which columns of a generic JSONL/CSV file hold which part of an example.

    Attributes:
        response: Column with the response text.
        passages: Column with the passages: a JSON list of strings, or one string
            (split on ``passage_sep`` when that is set).
        question: Column with the question; ``None`` when the file has none.
        id: Column with a unique id; ``None`` to number records ``<dataset>-<line>``.
        label: Optional column with the response label (true/false/0/1/yes/no).
        spans: Optional column with hallucinated spans: JSON ``[[start, end], ...]``
            or ``[{"start": .., "end": .., "type": .., "note": ..}, ...]``.
        task: Optional column with the task; otherwise ``default_task`` for all rows.
        default_task: Task used when ``task`` is ``None`` or a row leaves it empty.
        generator: Optional column naming the model that wrote the response.
        passage_sep: Separator that splits a single-string passages column.
    """

    response: str = "response"
    passages: str = "passages"
    question: str | None = "question"
    id: str | None = "id"
    label: str | None = None
    spans: str | None = None
    task: str | None = None
    default_task: Task = "qa"
    generator: str | None = None
    passage_sep: str | None = None

    def columns(self) -> list[str]:
        """The columns this mapping reads."""
        cols = [self.id, self.question, self.passages, self.response, self.label]
        cols += [self.spans, self.task, self.generator]
        return [c for c in cols if c is not None]


# --------------------------------------------------------------------------- public API


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
        fmt = detect_format(p)  # type: ignore[assignment]
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
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(f".{p.name}.tmp-{os.getpid()}")
    try:
        with tmp.open("w", encoding="utf-8", newline="\n") as f:
            for ex in exs:
                f.write(ex.to_json() + "\n")
        os.replace(tmp, p)
    finally:
        tmp.unlink(missing_ok=True)
    return p


def builtin_examples() -> list[RAGExample]:
    """The hand-written demo examples shipped in ``assets/examples/demo.jsonl``.

    Raises:
        DataError: The file is missing (a broken install) or malformed.
    """
    path = repo_root() / "assets" / "examples" / "demo.jsonl"
    if not path.is_file():
        raise DataError(
            "the built-in examples are missing; reinstall ragscope or restore the file",
            source=str(path),
        )
    return list(load_dataset(path, fmt="ragscope").examples)


DEMO = "demo"
BUILTIN = "builtin"
BUILTIN_ANSWERS = "builtin-answers"
BUILTIN_SPLITS: tuple[str, ...] = ("train", "validation", "test")
BUILTIN_CORPUS_FILE = "corpus.jsonl"
"""The built-in corpus in :func:`core.paths.builtin_dir` (generated by ``tools/corpus``)."""
BUILTIN_REBUILD_COMMAND = "python -m tools.corpus"


def builtin_answers_path() -> Path:
    """The embedded model's own greedy answers to the built-in corpus prompts (unlabelled)."""
    return repo_root() / "assets" / "builtin" / "answers.jsonl"


def resolve_dataset(spec: str, *, on_error: OnError = "raise") -> tuple[str, list[RAGExample]]:
    """Examples for a dataset spec, with the name to record for it.

    ``spec`` is ``demo`` (the 12 hand-written examples), ``builtin`` (the
    built-in labelled corpus), ``builtin-answers`` (the embedded model's own
    unlabelled answers to the corpus prompts), a file or folder to load, or
    the name of a dataset stored with ``ragscope datasets import``.
    """
    if spec == DEMO:
        return DEMO, builtin_examples()
    if spec == BUILTIN_ANSWERS:
        return BUILTIN_ANSWERS, list(load_dataset(builtin_answers_path()).examples)
    if spec == BUILTIN:
        return BUILTIN, load_builtin()
    p = Path(spec)
    if p.exists():
        return p.stem if p.is_file() else p.name, list(load_dataset(p, on_error=on_error).examples)

    with Store() as store:
        names = [d.name for d in store.list_datasets()]
        if spec not in names:
            raise DataError(
                f"no such file and no stored dataset named {spec!r}; use demo, builtin, a path, "
                f"or one of the stored datasets: {', '.join(names) or '(none yet)'}",
                source=spec,
            )
        return spec, store.load_examples(spec)


def shared_data_dir() -> Path | None:
    """The development data folder, or ``None`` when it is not there.

    ``RAGSCOPE_SHARED_DATA`` wins when set; otherwise ``../shared/data`` next to the
    repository root.
    """
    env = os.environ.get("RAGSCOPE_SHARED_DATA")
    cand = Path(env).expanduser() if env else repo_root().parent / "shared" / "data"
    return cand if cand.is_dir() else None


# --------------------------------------------------------------------------- driver

_Record = tuple[str, Any]  # (path:line, parsed object or the DataError it raised)


class _Collector:
    """Runs a converter over records, applying on_error, limit and the id check."""

    def __init__(self, path: str, *, on_error: OnError, limit: int | None) -> None:
        self.path = path
        self.on_error = on_error
        self.limit = limit
        self.n_read = 0
        self.examples: list[RAGExample] = []
        self.errors: list[DataError] = []
        self.warnings: list[str] = []
        self._seen: dict[str, str] = {}

    def fail(self, err: DataError) -> None:
        if self.on_error == "raise":
            raise err
        self.errors.append(err)

    def run(self, records: Iterable[_Record], convert: Callable[[Any, str], RAGExample]) -> None:
        for src, obj in records:
            if self.limit is not None and self.n_read >= self.limit:
                return
            self.n_read += 1
            try:
                if isinstance(obj, DataError):
                    raise obj
                ex = convert(obj, src)
                if ex.id in self._seen:
                    raise DataError(
                        f"duplicate id {ex.id!r} (first at {self._seen[ex.id]}); "
                        "ids must be unique in a dataset",
                        source=src,
                        field="id",
                    )
            except DataError as e:
                self.fail(_relocate(e, src))
                continue
            except (
                KeyError,
                TypeError,
                AttributeError,
                ValueError,
                IndexError,
                RecursionError,
                OverflowError,
            ) as e:
                err = DataError(
                    f"malformed record ({type(e).__name__}: {str(e)[:200]})", source=src
                )
                err.__cause__ = e
                self.fail(err)
                continue
            self._seen[ex.id] = src
            self.examples.append(ex)

    def report(self, fmt: str) -> LoadReport:
        return LoadReport(
            path=self.path,
            n_read=self.n_read,
            examples=tuple(self.examples),
            errors=tuple(self.errors),
            warnings=tuple(self.warnings),
            fmt=fmt,
        )


def _relocate(e: DataError, src: str) -> DataError:
    """The same error, located at ``src`` (the line being read) when it names elsewhere."""
    if e.source == src or (e.source or "").startswith(src + ":"):
        return e  # already here, or more precisely (a column on this line)
    where = f" (record's own source: {e.source})" if e.source else ""
    new = DataError(e.reason + where, source=src, field=e.field)
    new.__cause__ = e
    return new


MAX_RECORD_BYTES = 64 * MiB
"""Longest JSONL line or CSV physical line read (a record, not a whole file)."""
MAX_CSV_FIELD = 16 * MiB
"""Longest CSV field (the csv module's own default, 128 KiB, is too small for long
passages; a field over this is almost always an unclosed quote)."""
_BOM = b"\xef\xbb\xbf"


def _lines(path: Path) -> Iterator[tuple[int, bytes | DataError]]:
    """``(line number, bytes)`` per physical line (BOM stripped from the first), or a
    :class:`DataError` for a line over :data:`MAX_RECORD_BYTES` (skipped unread)."""
    try:
        f = path.open("rb")
    except OSError as e:
        raise DataError(f"cannot open the file ({e.strerror})", source=str(path)) from e
    with f:
        line_no = 0
        while True:
            try:
                raw = f.readline(MAX_RECORD_BYTES + 1)
            except OSError as e:
                raise DataError(f"cannot read the file ({e.strerror})", source=str(path)) from e
            if not raw:
                return
            line_no += 1
            if line_no == 1 and raw.startswith(_BOM):
                raw = raw[len(_BOM) :]
            if len(raw) > MAX_RECORD_BYTES and not raw.endswith(b"\n"):
                while (rest := f.readline(MiB)) and not rest.endswith(b"\n"):
                    pass
                yield (
                    line_no,
                    DataError(
                        f"the line is over {MAX_RECORD_BYTES // MiB} MiB; a record this long is "
                        "not a RAG example (a missing line break?)",
                        source=f"{path}:{line_no}",
                    ),
                )
                continue
            yield line_no, raw


def _decode(raw: bytes, path: Path, line_no: int) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataError(
            f"not UTF-8 text (byte {e.start + 1} of the line: {e.reason}); save the file as UTF-8",
            source=f"{path}:{line_no}:{e.start + 1}",
        ) from e


def _read_jsonl(path: Path) -> Iterator[_Record]:
    """Yield ``(path:line, object)`` per non-blank line; a bad line yields a DataError
    located at ``path:line:column`` where it has a column (JSON syntax, bad bytes)."""
    for line_no, raw in _lines(path):
        src = f"{path}:{line_no}"
        if isinstance(raw, DataError):
            yield src, raw
            continue
        if not raw.strip():
            continue
        try:
            text = _decode(raw, path, line_no).rstrip("\r\n")
            yield src, parse_json(text, source=str(path), line=line_no)
        except DataError as e:
            yield src, e


class _BadLine(Exception):
    """A physical CSV line that could not be read (carries its DataError)."""

    def __init__(self, err: DataError) -> None:
        self.err = err


class _CsvLines:
    """Decoded CSV lines for the csv reader, counting physical lines itself (the reader's
    ``line_num`` skips lines that failed); an unreadable line raises :class:`_BadLine`
    out of the reader, which starts afresh on the next line."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.line = 0  # physical lines handed out (or refused) so far
        self._it = _lines(path)

    def __iter__(self) -> _CsvLines:
        return self

    def __next__(self) -> str:
        line_no, raw = next(self._it)
        self.line = line_no
        if isinstance(raw, DataError):
            raise _BadLine(raw)
        try:
            return _decode(raw, self.path, line_no)
        except DataError as e:
            raise _BadLine(e) from None


def _read_csv(path: Path, m: ColumnMapping, warnings: list[str]) -> Iterator[_Record]:
    """Yield ``(path:line, row dict)`` per CSV row; ``line`` is the row's first line.

    Strict parsing: a stray quote is an error at its row (the next rows still load);
    an unclosed quote is an error at the line where it opens (nothing after it can be
    read reliably, so reading stops there). Duplicate header names and columns nobody
    reads are warnings; so are cells beyond the header in a row.
    """
    delim = "\t" if path.suffix.lower() == ".tsv" else ","
    csv.field_size_limit(MAX_CSV_FIELD)  # process-wide; every CSV read sets it the same
    lines = _CsvLines(path)
    reader = csv.reader(lines, delimiter=delim, strict=True)
    try:
        header = next(reader, None) or []
    except _BadLine as e:
        raise DataError(f"cannot read the CSV header ({e.err.reason})", source=e.err.source) from e
    except csv.Error as e:
        raise DataError(f"cannot read the CSV header ({e})", source=f"{path}:1") from e
    missing = [c for c in m.columns() if c not in header]
    if missing:
        raise DataError(
            f"column(s) {', '.join(map(repr, missing))} not in the file; available "
            f"columns: {', '.join(map(repr, header)) or '(none)'}; pass a ColumnMapping "
            "that names the right columns",
            source=f"{path}:1",
            field=missing[0],
        )
    dupes = sorted({c for c in header if header.count(c) > 1})
    if dupes:
        warnings.append(
            f"{path}:1: column(s) {', '.join(map(repr, dupes))} appear more than once; the "
            "last of each is read"
        )
    unused = [c for c in header if c not in m.columns() and c not in dupes]
    if unused:
        warnings.append(
            f"{path}:1: column(s) {', '.join(map(repr, unused[:10]))}"
            f"{' ...' if len(unused) > 10 else ''} are not read by the column mapping"
        )
    while True:
        start = lines.line + 1
        try:
            cells = next(reader)
        except StopIteration:
            return
        except _BadLine as e:
            yield f"{path}:{lines.line}", e.err
            continue
        except csv.Error as e:
            msg = str(e)
            if "unexpected end of data" in msg or "field larger than field limit" in msg:
                yield (
                    f"{path}:{start}",
                    DataError(
                        "a quoted field opens here and never closes (or is over "
                        f"{MAX_CSV_FIELD // MiB} MiB); close the quote; the rest of the file was "
                        "not read",
                        source=f"{path}:{start}",
                    ),
                )
                return
            yield f"{path}:{start}", DataError(f"malformed CSV ({msg})", source=f"{path}:{start}")
            continue
        if not cells:
            continue  # a blank line
        if len(cells) > len(header):
            warnings.append(
                f"{path}:{start}: {len(cells) - len(header)} cell(s) beyond the header ignored"
            )
        row = {h: (cells[i] if i < len(cells) else None) for i, h in enumerate(header)}
        yield f"{path}:{start}", row


# --------------------------------------------------------------------------- helpers


def _short(s: Any, n: int = 60) -> str:
    r = repr(s)
    return r if len(r) <= n else r[: n - 4] + "...'"


def _obj(d: Any, src: str) -> Mapping[str, Any]:
    if not isinstance(d, Mapping):
        raise DataError(f"expected a JSON object, got {type(d).__name__}", source=src)
    return d


def _get(d: Mapping[str, Any], key: str, src: str, typ: type | tuple[type, ...], what: str) -> Any:
    """A required field of the given type."""
    if key not in d or d[key] is None:
        raise DataError("missing required field", source=src, field=key)
    v = d[key]
    if not isinstance(v, typ) or isinstance(v, bool) and bool not in _as_tuple(typ):
        raise DataError(f"expected {what}, got {type(v).__name__}", source=src, field=key)
    return v


def _as_tuple(t: type | tuple[type, ...]) -> tuple[type, ...]:
    return t if isinstance(t, tuple) else (t,)


def _stable_hash(*parts: str) -> str:
    h = hashlib.sha1()
    for p in parts:
        h.update(p.encode("utf-8"))
        h.update(b"\x00")
    return h.hexdigest()[:6]


def _parse_span(
    item: Any, k: int, response: str, src: str, fld: str, *, allow_inclusive: bool = False
) -> Span:
    """One span from ``{start, end, text?, ...}`` or ``[start, end]``, checked against the text.

    ``type`` is read from ``label_type``, ``type`` or ``meta.label_type``; ``note`` from
    ``note``, ``meta.exp`` or a string ``meta``. When ``text`` is given it must equal
    ``response[start:end]``; with ``allow_inclusive`` an inclusive ``end`` that matches
    ``text`` is accepted and converted.
    """
    text = typ = note = None
    if isinstance(item, Mapping):
        start, end, text = item.get("start"), item.get("end"), item.get("text")
        meta = item.get("meta")
        meta_d = meta if isinstance(meta, Mapping) else {}
        typ = item.get("label_type") or item.get("type") or meta_d.get("label_type")
        note = item.get("note") or meta_d.get("exp") or (meta if isinstance(meta, str) else None)
    elif isinstance(item, list | tuple) and len(item) in (2, 3):
        start, end = item[0], item[1]
        typ = item[2] if len(item) == 3 else None
    else:
        raise DataError(
            f"span {k} must be {{start, end}} or [start, end], got {_short(item)}",
            source=src,
            field=fld,
        )
    if not all(isinstance(x, int) and not isinstance(x, bool) for x in (start, end)):
        raise DataError(
            f"span {k} needs integer start and end, got {_short(start)}, {_short(end)}",
            source=src,
            field=fld,
        )
    n = len(response)
    if text is not None and response[start:end] != text:
        if allow_inclusive and response[start : end + 1] == text:
            end += 1
        else:
            raise DataError(
                f"span {k} [{start}, {end}) text {_short(text)} does not match the "
                f"response there {_short(response[start:end])}; offsets must be "
                "[start, end) characters of the response",
                source=src,
                field=fld,
            )
    if end > n:
        raise DataError(
            f"span {k} [{start}, {end}) runs past the response ({n} characters)",
            source=src,
            field=fld,
        )
    try:
        return Span(
            start=start,
            end=end,
            type=str(typ) if typ is not None else None,
            note=str(note) if note else None,
        )
    except DataError as e:
        raise DataError(f"span {k}: {e.reason}", source=src, field=fld) from e


def _spans(
    raw: Any, response: str, src: str, fld: str, *, allow_inclusive: bool = False
) -> tuple[Span, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise DataError(
            f"expected a list of spans, got {type(raw).__name__}", source=src, field=fld
        )
    return tuple(
        _parse_span(it, k, response, src, fld, allow_inclusive=allow_inclusive)
        for k, it in enumerate(raw)
    )


def split_passages(text: str) -> list[str]:
    """Split RAGTruth's ``"passage 1:...\\n\\npassage 2:..."`` into passages.

    Markers count only at a line start and in sequence (1, 2, 3, ...); each passage
    loses its ``passage N:`` label and surrounding whitespace, so it is still a
    verbatim substring of the text. Without markers the stripped text is one passage.
    Empty passages are dropped.
    """
    marks = []
    for m in _PASSAGE_MARKER.finditer(text):
        if int(m.group(1)) == len(marks) + 1:
            marks.append(m)
    if not marks or text[: marks[0].start()].strip():
        return [text.strip()] if text.strip() else []
    bounds = [m.start() for m in marks[1:]] + [len(text)]
    parts = [text[m.end() : b].strip() for m, b in zip(marks, bounds, strict=True)]
    return [p for p in parts if p]


def _cut_prefix(passage: str, prompt: str) -> str | None:
    """The start of ``passage`` that ends ``prompt``, when the prompt was cut inside it."""
    anchor = passage[:64]
    i = prompt.find(anchor)
    while i >= 0:
        tail = prompt[i:].rstrip()
        if tail and passage.startswith(tail):
            return tail
        i = prompt.find(anchor, i + 1)
    return None


def _place_passages(
    passages: list[str], prompt: str, src: str, fld: str, warnings: list[str]
) -> list[str]:
    """Passages as the prompt holds them (see :func:`_RagtruthJsonl` for the rule)."""
    if not passages:
        raise DataError("no passage text", source=src, field=fld)
    out: list[str] = []
    for k, p in enumerate(passages):
        if p in prompt:
            out.append(p)
            continue
        cut = _cut_prefix(p, prompt)
        if cut is None:
            raise DataError(
                f"passage {k + 1} ({_short(p, 50)}) does not occur in the prompt; "
                "passages must be verbatim parts of the prompt",
                source=src,
                field=fld,
            )
        out.append(cut)
        dropped = len(passages) - k - 1
        warnings.append(
            f"{src}: the prompt is cut short inside passage {k + 1}; kept the "
            f"{len(cut)} of {len(p)} characters the model saw"
            + (f" and dropped {dropped} later passage(s)" if dropped else "")
        )
        break
    return out


# --------------------------------------------------------------------------- formats


def _ragscope_extension(d: Mapping[str, Any], src: str, spans: Sequence[Span]) -> dict[str, Any]:
    """The optional ``ragscope`` object of a RAGTruth-style record (written by
    :func:`core.review.ragtruth_record`): id, task, label, split, group, own_prompt."""
    raw = d.get("ragscope")
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise DataError("expected an object", source=src, field="ragscope")
    out: dict[str, Any] = {}
    checks: dict[str, tuple[type | tuple[type, ...], str]] = {
        "id": (str, "a non-empty string"),
        "task": (str, f"one of {', '.join(TASKS)}"),
        "label": (bool, "true or false"),
        "split": (str, "train, validation or test"),
        "group": (str, "a string"),
        "own_prompt": (bool, "true or false"),
    }
    for key, (typ, what) in checks.items():
        v = raw.get(key)
        if v is None:
            continue
        if not isinstance(v, typ) or (key == "id" and not v.strip()):
            raise DataError(f"expected {what}, got {v!r}", source=src, field=f"ragscope.{key}")
        out[key] = v
    if out.get("task") is not None and out["task"] not in TASKS:
        raise DataError(
            f"expected one of {', '.join(TASKS)}, got {out['task']!r}",
            source=src,
            field="ragscope.task",
        )
    if out.get("label") is False and spans:
        raise DataError(
            "label is false but hall_info has spans; fix one of them",
            source=src,
            field="ragscope.label",
        )
    return out


class _RagtruthJsonl:
    """RAGTruth/RAGLens JSONL records.

    Rules: ``prompt`` is ``input`` verbatim; ``context.passages`` is split on its
    ``passage N:`` markers (:func:`split_passages`) and each passage must occur in the
    prompt. When the prompt was cut short inside a passage (6 Dolly records), the
    passage is cut to the part the prompt holds -- what the generator actually saw --
    and a warning is reported. ``label = bool(hall_info)``; spans take ``meta.label_type``
    as type and ``meta.exp`` as note and must match their ``text``. Records have no id:
    ``<dataset>-<line:05d>-<hash6>`` where the hash covers prompt and response.
    """

    def __init__(self, dataset: str, warnings: list[str]) -> None:
        self.dataset = dataset
        self.warnings = warnings

    def __call__(self, obj: Any, src: str) -> RAGExample:
        d = _obj(obj, src)
        prompt = _get(d, "input", src, str, "the prompt string")
        response = _get(d, "output", src, str, "the response string")
        ctx = _get(d, "context", src, Mapping, "an object {question, passages}")
        question = ctx.get("question")
        if question is not None and not isinstance(question, str):
            raise DataError("expected a string", source=src, field="context.question")
        raw = ctx.get("passages")
        if not isinstance(raw, str):
            raise DataError(
                "expected the passages as one string", source=src, field="context.passages"
            )
        passages = _place_passages(
            split_passages(raw), prompt, src, "context.passages", self.warnings
        )
        hall = d.get("hall_info", [])
        spans = _spans(hall, response, src, "hall_info")
        model = d.get("model")
        line = int(src.rsplit(":", 1)[1])
        ours = _ragscope_extension(d, src, spans)
        return RAGExample(
            id=ours.get("id") or f"{self.dataset}-{line:05d}-{_stable_hash(prompt, response)}",
            task=ours.get("task", "qa"),
            question=question,
            passages=tuple(passages),
            response=response,
            label=ours.get("label", bool(spans)),
            spans=spans,
            prompt=prompt if ours.get("own_prompt", True) else None,
            provenance=Provenance(
                dataset=self.dataset,
                generator=str(model) if model is not None else None,
                source=src,
                split=ours.get("split"),
                group=ours.get("group"),
            ),
        )


class _InterpDetect:
    """InterpDetect JSONL records (e.g. FinQA answered by Qwen3-0.6B).

    Rules:
        * Passages: the prompt is kept verbatim. Its documents are cleaned versions of
          ``documents`` (capitalised, spaces before punctuation removed), so the
          ``documents`` strings usually do not occur in it; the passages are then the
          prompt's own document substrings, located with ``prompt_spans`` (INCLUSIVE
          ends, converted to exclusive): the ``len(documents)`` spans between the
          ``Context:`` and ``Question:`` header spans. If that layout is not found,
          ``prompt`` is dropped (``None``) and ``documents`` are used as passages,
          with a warning.
        * ``labels`` spans already use exclusive ends (their ``text`` equals
          ``response[start:end]``); an inclusive end matching ``text`` is accepted too.
          Each span's note records the span detector's confidence.
        * Response label: ``labels_gpt`` (1 = hallucinated) when present, else
          ``labels_llama``, else ``bool(labels)``. Spans are kept only when the
          response label is hallucinated (they are a separate, noisy detector's
          output); dropped spans are reported as warnings.
        * Ids: the file's ``id``. Some ids repeat with a different response to the same
          question (resamples); later ones become ``<id>-r2``, ``<id>-r3``, ... with a
          warning. A repeated id with an identical response stays a duplicate error.
    """

    def __init__(self, dataset: str, warnings: list[str]) -> None:
        self.dataset = dataset
        self.warnings = warnings
        self._responses: dict[str, list[str]] = {}

    def __call__(self, obj: Any, src: str) -> RAGExample:
        d = _obj(obj, src)
        rid = _get(d, "id", src, (str, int), "a string id")
        rid = str(rid)
        question = _get(d, "question", src, str, "the question string")
        docs = _get(d, "documents", src, list, "a list of document strings")
        if not docs or not all(isinstance(x, str) and x.strip() for x in docs):
            raise DataError(
                "expected a non-empty list of non-empty strings", source=src, field="documents"
            )
        response = _get(d, "response", src, str, "the response string")
        prompt = d.get("prompt")
        if prompt is not None and not isinstance(prompt, str):
            raise DataError("expected a string", source=src, field="prompt")

        passages: list[str] = list(docs)
        if prompt is not None and not (question in prompt and all(x in prompt for x in docs)):
            located = self._passages_from_spans(d, prompt, len(docs), src)
            if located is not None and question in prompt:
                passages = located
            else:
                self.warnings.append(
                    f"{src}: documents not located in the prompt; using them without "
                    "the verbatim prompt"
                )
                prompt = None

        label: bool | None = None
        for key in ("labels_gpt", "labels_llama"):
            if d.get(key) is not None:
                try:
                    label = parse_label(d[key], src)
                except DataError as e:
                    raise DataError(e.reason, source=src, field=key) from e
                break
        spans = _spans(d.get("labels"), response, src, "labels", allow_inclusive=True)
        spans = tuple(
            Span(start=s.start, end=s.end, type=None, note=_confidence_note(d, k))
            for k, s in enumerate(spans)
        )
        if label is None and "labels" in d:
            label = bool(spans)
        if label is False and spans:
            self.warnings.append(
                f"{src}: judged faithful but the span detector marked {len(spans)} "
                "span(s); spans dropped"
            )
            spans = ()

        prev = self._responses.setdefault(rid, [])
        ex_id = rid
        if prev and response not in prev:
            ex_id = f"{rid}-r{len(prev) + 1}"
            self.warnings.append(
                f"{src}: id {rid!r} repeats with another response; using {ex_id!r}"
            )
        prev.append(response)

        return RAGExample(
            id=ex_id,
            task="qa",
            question=question,
            passages=tuple(passages),
            response=response,
            label=label,
            spans=spans,
            prompt=prompt,
            provenance=Provenance(
                dataset=self.dataset, generator=INTERPDETECT_GENERATOR, source=src
            ),
        )

    @staticmethod
    def _passages_from_spans(
        d: Mapping[str, Any], prompt: str, n_docs: int, src: str
    ) -> list[str] | None:
        raw = d.get("prompt_spans")
        if not isinstance(raw, list):
            return None
        pieces: list[str] = []
        for it in raw:
            if not (
                isinstance(it, list | tuple)
                and len(it) == 2
                and all(isinstance(x, int) and not isinstance(x, bool) for x in it)
                and 0 <= it[0] <= it[1] < len(prompt)
            ):
                raise DataError(
                    f"prompt span {_short(it)} is not [start, end] (inclusive) inside the "
                    f"prompt ({len(prompt)} characters)",
                    source=src,
                    field="prompt_spans",
                )
            pieces.append(prompt[it[0] : it[1] + 1])
        heads = [i for i, s in enumerate(pieces) if s.strip().rstrip(":").lower() == "context"]
        tails = [i for i, s in enumerate(pieces) if s.strip().rstrip(":").lower() == "question"]
        if len(heads) != 1 or len(tails) != 1 or tails[0] - heads[0] - 1 != n_docs:
            return None
        docs = [s.strip() for s in pieces[heads[0] + 1 : tails[0]]]
        return docs if all(docs) else None


def _confidence_note(d: Mapping[str, Any], k: int) -> str | None:
    try:
        conf = d["labels"][k].get("confidence")
    except (KeyError, IndexError, TypeError, AttributeError):
        return None
    if isinstance(conf, int | float) and not isinstance(conf, bool):
        return f"span detector confidence {conf:.3f} (model-made label)"
    return None


class _Generic:
    """Records read through a :class:`ColumnMapping` (JSONL objects or CSV rows)."""

    def __init__(self, dataset: str, m: ColumnMapping, *, csv_values: bool) -> None:
        self.dataset = dataset
        self.m = m
        self.csv_values = csv_values

    def _value(self, d: Mapping[str, Any], col: str | None, src: str, *, required: bool) -> Any:
        if col is None:
            return None
        if col not in d:
            raise DataError(
                f"column {col!r} is missing; available: {', '.join(map(repr, d)) or '(none)'}; "
                "pass a ColumnMapping that names the right columns",
                source=src,
                field=col,
            )
        v = d[col]
        if self.csv_values and isinstance(v, str) and not v.strip():
            v = None
        if v is None and required:
            raise DataError("empty value", source=src, field=col)
        return v

    def _json_cell(self, v: Any) -> Any:
        if self.csv_values and isinstance(v, str) and v.lstrip().startswith(("[", "{")):
            try:
                return parse_json(v, source="cell")
            except DataError:
                return v
        return v

    def __call__(self, obj: Any, src: str) -> RAGExample:
        m = self.m
        d = _obj(obj, src)
        response = self._value(d, m.response, src, required=True)
        if not isinstance(response, str):
            raise DataError(
                f"expected a string, got {type(response).__name__}", source=src, field=m.response
            )
        raw_p = self._value(d, m.passages, src, required=True)
        if isinstance(raw_p, str) and m.passage_sep is None:
            raw_p = self._json_cell(raw_p)
        if isinstance(raw_p, str):
            parts = raw_p.split(m.passage_sep) if m.passage_sep else [raw_p]
            passages = [x.strip() for x in parts if x.strip()]
        elif isinstance(raw_p, list) and all(isinstance(x, str) for x in raw_p):
            passages = list(raw_p)
        else:
            raise DataError(
                f"expected a list of strings or one string, got {_short(raw_p)}",
                source=src,
                field=m.passages,
            )
        question = self._value(d, m.question, src, required=False)
        if question is not None and not isinstance(question, str):
            raise DataError(
                f"expected a string, got {type(question).__name__}", source=src, field=m.question
            )
        label = None
        if m.label is not None:
            try:
                label = parse_label(self._value(d, m.label, src, required=False), src)
            except DataError as e:
                raise DataError(e.reason, source=src, field=m.label) from e
        spans: tuple[Span, ...] = ()
        if m.spans is not None:
            raw_s = self._value(d, m.spans, src, required=False)
            if isinstance(raw_s, str):
                try:
                    raw_s = parse_json(raw_s, source="spans")
                except DataError as e:
                    raise DataError(
                        f"spans are not valid JSON ({e.reason})", source=src, field=m.spans
                    ) from e
            spans = _spans(raw_s, response, src, m.spans)
        task = self._value(d, m.task, src, required=False) if m.task else None
        task = str(task).strip().lower() if task is not None else m.default_task
        if task not in TASKS:
            raise DataError(
                f"unknown task {task!r}; use one of {', '.join(TASKS)}",
                source=src,
                field=m.task or "task",
            )
        if m.id is None:
            ex_id = f"{self.dataset}-{int(src.rsplit(':', 1)[1]):05d}"
        else:
            raw_id = self._value(d, m.id, src, required=True)
            if isinstance(raw_id, bool) or not isinstance(raw_id, str | int):
                raise DataError(
                    f"expected a string id, got {_short(raw_id)}", source=src, field=m.id
                )
            ex_id = str(raw_id).strip()
        gen = self._value(d, m.generator, src, required=False)
        return RAGExample(
            id=ex_id,
            task=task,  # type: ignore[arg-type]
            question=question,
            passages=tuple(passages),
            response=response,
            label=label,
            spans=spans,
            provenance=Provenance(
                dataset=self.dataset, generator=str(gen) if gen is not None else None, source=src
            ),
        )


def _ragscope_record(obj: Any, src: str) -> RAGExample:
    return RAGExample.from_dict(_obj(obj, src), source=src)


def _load_ragtruth_pair(p: Path, col: _Collector, dataset: str | None) -> None:
    """Read RAGTruth's ``response.jsonl`` + ``source_info.jsonl`` (see :class:`_PairSources`)."""
    folder = p if p.is_dir() else p.parent
    resp, srcs = folder / PAIR_RESPONSES, folder / PAIR_SOURCES
    for f in (resp, srcs):
        if not f.is_file():
            raise DataError(
                f"the RAGTruth layout needs {PAIR_RESPONSES} and {PAIR_SOURCES} side by side; "
                f"{f.name} is missing",
                source=str(folder),
            )
    sources = _PairSources(srcs, col)
    col.run(_read_jsonl(resp), _PairResponse(dataset or folder.name, sources))


class _PairSources:
    """RAGTruth ``source_info.jsonl``: ``source_id`` -> (task, question, passages, prompt).

    Rules per ``task_type``:
        * ``QA``: ``source_info`` is ``{question, passages}``; passages are split on
          their ``passage N:`` markers and must occur in ``prompt`` (as in
          ``ragtruth_jsonl``).
        * ``Summary``: ``source_info`` is the text to summarise; it (stripped) is the
          one passage and must occur in ``prompt``.
        * ``Data2txt``: ``source_info`` is a JSON object. The passage is the substring of
          ``prompt`` that holds it: ``json.dumps(source_info, ensure_ascii=False)``
          when that occurs verbatim; else the ASCII-escaped, indented (2/4) or
          Python-repr rendering when one occurs; else the first JSON value in the
          prompt that decodes to exactly ``source_info`` (whatever its spacing or
          escaping). If none is found the record is a DataError.

    The prompt is always kept verbatim. Sources are converted on first use and cached;
    unreadable lines are reported (or raised) once, where they are.
    """

    def __init__(self, path: Path, col: _Collector) -> None:
        self.path = path
        self._raw: dict[str, tuple[str, Mapping[str, Any]]] = {}
        self._done: dict[str, tuple[Task, str | None, tuple[str, ...], str] | DataError] = {}
        self.warnings = col.warnings
        for src, obj in _read_jsonl(path):
            try:
                if isinstance(obj, DataError):
                    raise obj
                d = _obj(obj, src)
                sid = str(_get(d, "source_id", src, (str, int), "a source id"))
                if sid in self._raw:
                    raise DataError(
                        f"duplicate source_id {sid!r} (first at {self._raw[sid][0]})",
                        source=src,
                        field="source_id",
                    )
                self._raw[sid] = (src, d)
            except DataError as e:
                col.fail(e)

    def get(self, sid: str, resp_src: str) -> tuple[Task, str | None, tuple[str, ...], str]:
        if sid not in self._done:
            if sid not in self._raw:
                raise DataError(
                    f"source_id {sid!r} is not in {self.path}", source=resp_src, field="source_id"
                )
            src, d = self._raw[sid]
            try:
                self._done[sid] = self._convert(d, src)
            except DataError as e:
                self._done[sid] = e
        got = self._done[sid]
        if isinstance(got, DataError):
            raise DataError(
                f"its source record is unusable: {got}", source=resp_src, field="source_id"
            )
        return got

    def _convert(
        self, d: Mapping[str, Any], src: str
    ) -> tuple[Task, str | None, tuple[str, ...], str]:
        tt = _get(d, "task_type", src, str, "QA, Summary or Data2txt")
        task = _PAIR_TASKS.get(tt.strip().lower())
        if task is None:
            raise DataError(
                f"unknown task_type {tt!r}; expected QA, Summary or Data2txt",
                source=src,
                field="task_type",
            )
        prompt = _get(d, "prompt", src, str, "the prompt string")
        if "source_info" not in d or d["source_info"] is None:
            raise DataError("missing required field", source=src, field="source_info")
        si = d["source_info"]
        question: str | None = None
        if task == "qa":
            if not isinstance(si, Mapping):
                raise DataError(
                    "a QA source_info must be {question, passages}", source=src, field="source_info"
                )
            question = si.get("question")
            if not isinstance(question, str):
                raise DataError("expected a string", source=src, field="source_info.question")
            if question.strip() and question not in prompt:
                raise DataError(
                    "the question does not occur in the prompt",
                    source=src,
                    field="source_info.question",
                )
            raw = si.get("passages")
            if not isinstance(raw, str):
                raise DataError(
                    "expected the passages as one string", source=src, field="source_info.passages"
                )
            passages = _place_passages(
                split_passages(raw), prompt, src, "source_info.passages", self.warnings
            )
        elif isinstance(si, str):
            passages = _place_passages([si.strip()], prompt, src, "source_info", self.warnings)
        elif task == "data2txt" and isinstance(si, Mapping | list):
            found = _locate_record(si, prompt)
            if found is None:
                raise DataError(
                    "the structured data is not in the prompt (neither as JSON text nor as "
                    "a JSON object equal to source_info)",
                    source=src,
                    field="source_info",
                )
            passages = [found]
        else:
            raise DataError(
                f"unexpected {type(si).__name__} for task_type {tt!r}",
                source=src,
                field="source_info",
            )
        return task, question, tuple(passages), prompt


def _locate_record(si: Any, prompt: str) -> str | None:
    """The substring of ``prompt`` holding the structured record ``si`` (see _PairSources)."""
    renders = [
        json.dumps(si, ensure_ascii=False),
        json.dumps(si),
        json.dumps(si, ensure_ascii=False, indent=2),
        json.dumps(si, ensure_ascii=False, indent=4),
        str(si),
    ]
    for r in renders:
        if r in prompt:
            return r
    dec = json.JSONDecoder()
    opener = "{" if isinstance(si, Mapping) else "["
    i = prompt.find(opener)
    while i >= 0:
        try:
            val, end = dec.raw_decode(prompt, i)
        except json.JSONDecodeError:
            pass
        else:
            if val == si:
                return prompt[i:end]
        i = prompt.find(opener, i + 1)
    return None


class _PairResponse:
    def __init__(self, dataset: str, sources: _PairSources) -> None:
        self.dataset = dataset
        self.sources = sources

    def __call__(self, obj: Any, src: str) -> RAGExample:
        d = _obj(obj, src)
        rid = str(_get(d, "id", src, (str, int), "a string id"))
        sid = str(_get(d, "source_id", src, (str, int), "a source id"))
        response = _get(d, "response", src, str, "the response string")
        spans = _spans(d.get("labels", []), response, src, "labels")
        task, question, passages, prompt = self.sources.get(sid, src)
        model = d.get("model")
        return RAGExample(
            id=rid,
            task=task,
            question=question,
            passages=passages,
            response=response,
            label=bool(spans),
            spans=spans,
            prompt=prompt,
            provenance=Provenance(
                dataset=self.dataset,
                generator=str(model) if model is not None else None,
                source=src,
            ),
        )


def load_builtin(split: str | None = None) -> list[RAGExample]:
    """Read the shipped corpus (``assets/builtin/corpus.jsonl``), optionally one split.

    Raises:
        DataError: The file is missing (rebuild it with ``python -m tools.corpus``) or the
            split is unknown.
    """
    if split is not None and split not in BUILTIN_SPLITS:
        raise DataError(f"unknown split {split!r}; use one of {', '.join(BUILTIN_SPLITS)}")
    path = builtin_dir() / BUILTIN_CORPUS_FILE
    if not path.is_file():
        raise DataError(
            f"the built-in corpus is missing; rebuild it with `{BUILTIN_REBUILD_COMMAND}` "
            "(from the repository root)",
            source=str(path),
        )
    exs = list(load_dataset(path, fmt="ragscope").examples)
    return exs if split is None else [e for e in exs if e.provenance.split == split]
