"""Reading records: bounded lines, JSONL and CSV, and what a load reports.

The low layer of :mod:`core.data`: :class:`LoadReport` (what a load read),
:class:`ColumnMapping` (the columns of a generic file; the CSV reader checks its header
against one), the ``_Collector`` that runs a format's converter over records (applying
``on_error``, ``limit`` and the unique-id check), line reading bounded by
:data:`MAX_RECORD_BYTES` with located UTF-8 and JSON errors, the strict CSV reader, and
the small field helpers every format reader uses.
"""

from __future__ import annotations

import csv
import hashlib
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, get_args

from core.base.errors import DataError, listed, quoted
from core.base.examples import RAGExample, Task
from core.base.safeio import MiB, parse_json

if TYPE_CHECKING:
    import pandas as pd

Format = Literal["auto", "ragtruth_jsonl", "ragtruth_pair", "interpdetect", "generic", "ragscope"]
FORMATS: tuple[str, ...] = get_args(Format)
OnError = Literal["raise", "skip"]


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

    def require_examples(self) -> None:
        """Check that some record loaded: a dataset of none is never stored.

        Raises:
            DataError: No record loaded (every one was bad, or there was none), naming
                the file and how many records were read and skipped.
        """
        if self.examples:
            return
        if not self.n_read:
            reason = "no record was read (the file holds none); nothing was stored"
        else:
            reason = (
                f"no record was good: all {self.n_read:,} records read were bad "
                f"({len(self.errors):,} skipped, listed above); nothing was stored. Fix "
                "them, or check the format"
            )
        raise DataError(reason, source=self.path)

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
                        f"duplicate id {quoted(ex.id)} (first at {self._seen[ex.id]}); "
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
            f"column(s) {listed(missing)} not in the file; available "
            f"columns: {listed(header)}; pass a ColumnMapping "
            "that names the right columns",
            source=f"{path}:1",
            field=missing[0],
        )
    counts = Counter(header)
    dupes = sorted(c for c, k in counts.items() if k > 1)
    if dupes:
        warnings.append(
            f"{path}:1: column(s) {listed(dupes)} appear more than once; the last of each is read"
        )
    read = set(m.columns())
    unused = [c for c in header if c not in read and counts[c] == 1]
    if unused:
        warnings.append(f"{path}:1: column(s) {listed(unused)} are not read by the column mapping")
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
    return quoted(s, n)


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
