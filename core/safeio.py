"""Safe readers for files from outside: bounded, typed, and never able to run code.

Everything ragscope reads that someone else may have made (detector artifacts, SAE
folders, feature caches, datasets, uploads) goes through these helpers:

- :func:`read_bounded` reads a regular file only (no FIFOs, devices or, where asked,
  symlinks) and refuses one over a size cap before reading it, so nothing unbounded
  enters memory.
- :func:`parse_json` turns every way a JSON text can be malformed (syntax with its
  line and column, integers over Python's digit limit, nesting deeper than a cap,
  lone surrogates) into a :class:`~core.errors.DataError` naming the source.
- :func:`sha256_file` hashes a file in chunks (artifact integrity).
- :func:`check_zip` bounds a zip container (``.skops``, ``.npz``) by member count and
  uncompressed size before anything is decompressed (zip bombs).
- :func:`load_skops` loads a skops file only when every node of its schema is one of an
  exact allowlist of ``(loader, module, class)`` triples: no package prefixes, and
  never a function, method, partial or operator reference, so a file cannot smuggle
  a callable into an estimator (e.g. a ``FunctionTransformer`` that runs a command at
  the first ``predict``).

No pickle, no ``torch.load`` without ``weights_only=True``, no ``eval`` anywhere in
ragscope; ruff's banned-api and bandit rules in ``pyproject.toml`` enforce it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import stat
import zipfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from core.errors import DataError

MiB = 1024 * 1024

MAX_JSON_DEPTH = 64
"""Deepest nesting accepted in any JSON ragscope reads from outside (real records nest
a handful of levels; a deeper one is a mistake or an attack on a recursive reader)."""

MAX_ZIP_MEMBERS = 20_000
MAX_ZIP_BYTES = 1024 * MiB


def regular_file(path: Path, *, follow_symlinks: bool = True) -> os.stat_result:
    """``path``'s stat, refusing anything but a regular file.

    Raises:
        DataError: Missing, a symlink (unless followed), a directory, FIFO or device.
    """
    try:
        st = path.stat() if follow_symlinks else path.lstat()
    except OSError as e:
        raise DataError(f"cannot read it ({e.strerror or e})", source=str(path)) from e
    if stat.S_ISLNK(st.st_mode):
        raise DataError("is a symbolic link; copy the real file here instead", source=str(path))
    if not stat.S_ISREG(st.st_mode):
        raise DataError("is not a regular file", source=str(path))
    return st


def read_bounded(
    path: str | os.PathLike[str], limit: int, *, what: str = "file", follow_symlinks: bool = True
) -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes.

    The size is checked before reading and again while reading (a file that grows in
    between is still cut off), so at most ``limit + 1`` bytes are ever held.

    Raises:
        DataError: Not a regular file, unreadable, or larger than ``limit`` (the
            message names the size, the cap and ``what`` it is).
    """
    p = Path(path)
    st = regular_file(p, follow_symlinks=follow_symlinks)
    if st.st_size > limit:
        raise DataError(
            f"the {what} is {st.st_size:,} bytes, over the {limit:,}-byte limit; is this the "
            "right file?",
            source=str(p),
        )
    try:
        with p.open("rb") as f:
            data = f.read(limit + 1)
    except OSError as e:
        raise DataError(f"cannot read it ({e.strerror or e})", source=str(p)) from e
    if len(data) > limit:
        raise DataError(f"the {what} grew over the {limit:,}-byte limit while read", source=str(p))
    return data


def json_depth_ok(value: Any, max_depth: int = MAX_JSON_DEPTH) -> bool:
    """Whether ``value`` (parsed JSON) nests at most ``max_depth`` containers deep.

    Iterative, so it cannot itself overflow the stack.
    """
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, dict):
            if d > max_depth:
                return False
            stack.extend((x, d + 1) for x in v.values())
        elif isinstance(v, list):
            if d > max_depth:
                return False
            stack.extend((x, d + 1) for x in v)
    return True


def has_lone_surrogate(s: str) -> bool:
    """Whether ``s`` holds a UTF-16 surrogate code point on its own (``"\\ud800"``):
    valid in JSON escapes and Python strings, but not encodable as UTF-8, so SQLite,
    files and browsers refuse it later."""
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def parse_json(
    text: str | bytes,
    *,
    source: str,
    max_depth: int = MAX_JSON_DEPTH,
    line: int | None = None,
) -> Any:
    """Parse JSON from outside, every failure a :class:`DataError` naming where.

    Args:
        text: The JSON text (bytes are decoded as UTF-8; a leading BOM is accepted).
        source: What to name in errors: a path, or ``path:line`` for a record.
        max_depth: Deepest container nesting accepted.
        line: The file line ``text`` starts on, when ``source`` is the file: errors
            are then located as ``path:line:column`` (JSONL records).

    Raises:
        DataError: Not UTF-8 (with the byte offset), invalid JSON (with line and
            column), an integer over Python's digit limit, or nesting over ``max_depth``.
    """
    at = source if line is None else f"{source}:{line}"
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8-sig")
        except UnicodeDecodeError as e:
            where = at if line is None else f"{at}:{e.start + 1}"
            raise DataError(
                f"not UTF-8 text (byte {e.start + 1}: {e.reason}); save it as UTF-8", source=where
            ) from e
    if text.startswith("\ufeff"):
        text = text[1:]
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        if line is None:
            raise DataError(
                f"invalid JSON at line {e.lineno}, column {e.colno} ({e.msg})", source=source
            ) from e
        where = f"{source}:{line + e.lineno - 1}:{e.colno}"
        raise DataError(f"invalid JSON ({e.msg})", source=where) from e
    except RecursionError as e:
        raise DataError(
            f"JSON nested too deeply (over {max_depth} levels); flatten the record", source=at
        ) from e
    except ValueError as e:  # e.g. "Exceeds the limit (4300 digits) for integer string conversion"
        raise DataError(f"unreadable JSON value ({e})", source=at) from e
    if not json_depth_ok(value, max_depth):
        raise DataError(
            f"JSON nested too deeply (over {max_depth} levels); flatten the record", source=at
        )
    return value


def read_json_file(
    path: str | os.PathLike[str],
    limit: int,
    *,
    what: str = "JSON file",
    follow_symlinks: bool = True,
    max_depth: int = MAX_JSON_DEPTH,
) -> Any:
    """:func:`read_bounded` then :func:`parse_json`."""
    data = read_bounded(path, limit, what=what, follow_symlinks=follow_symlinks)
    return parse_json(data, source=str(path), max_depth=max_depth)


def sha256_file(path: str | os.PathLike[str], chunk: int = MiB) -> str:
    """Hex SHA-256 of a file, read in chunks."""
    h = hashlib.sha256()
    with Path(path).open("rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def check_zip(
    zf: zipfile.ZipFile,
    *,
    source: str,
    max_members: int = MAX_ZIP_MEMBERS,
    max_bytes: int = MAX_ZIP_BYTES,
) -> None:
    """Refuse a zip container with too many members or too many bytes once unpacked.

    Raises:
        DataError: Over ``max_members`` members or ``max_bytes`` uncompressed.
    """
    infos = zf.infolist()
    if len(infos) > max_members:
        raise DataError(
            f"the archive holds {len(infos):,} members, over the limit of {max_members:,}",
            source=source,
        )
    total = sum(i.file_size for i in infos)
    if total > max_bytes:
        raise DataError(
            f"the archive unpacks to {total:,} bytes, over the limit of {max_bytes:,}",
            source=source,
        )


# ----------------------------------------------------------------------------- skops

SkopsType = tuple[str, str, str]
"""``(loader, module, class)`` of one node in a skops schema, e.g.
``("ObjectNode", "sklearn.pipeline", "Pipeline")``."""

SKOPS_PLAIN_DATA: frozenset[SkopsType] = frozenset(
    {
        ("DictNode", "builtins", "dict"),
        ("ListNode", "builtins", "list"),
        ("TupleNode", "builtins", "tuple"),
        ("JsonNode", "builtins", "str"),
        ("JsonNode", "builtins", "int"),
        ("JsonNode", "builtins", "float"),
        ("JsonNode", "builtins", "bool"),
        ("JsonNode", "builtins", "NoneType"),
        ("BytearrayNode", "builtins", "bytearray"),
        ("BytesNode", "builtins", "bytes"),
        ("NdArrayNode", "numpy", "ndarray"),
        ("NdArrayNode", "numpy", "float64"),
        ("NdArrayNode", "numpy", "float32"),
        ("NdArrayNode", "numpy", "int64"),
        ("NdArrayNode", "numpy", "int32"),
        ("NdArrayNode", "numpy", "bool"),
        # A reference to the type ``str`` (estimators record the dtype of their feature
        # names); the only type reference allowed.
        ("TypeNode", "builtins", "str"),
    }
)
"""Nodes that hold data only (skops reads arrays with ``allow_pickle=False``)."""

SKOPS_CALLABLE_LOADERS = frozenset(
    {"FunctionNode", "MethodNode", "PartialNode", "OperatorFuncNode", "TypeNode"}
)
"""Loaders that bring back a callable: refused whatever the module (``TypeNode`` only
for the exact types allowed above)."""


def skops_types(schema: Any) -> set[SkopsType]:
    """Every ``(loader, module, class)`` in a skops schema, wherever it nests.

    Over-approximates on purpose: any mapping with a ``__loader__`` key counts, even
    one skops would read as data, so nothing skops instantiates can be missed.
    """
    out: set[SkopsType] = set()
    stack = [schema]
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            if "__loader__" in v:
                out.add(
                    (str(v.get("__loader__")), str(v.get("__module__")), str(v.get("__class__")))
                )
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
    return out


def load_skops(
    path: str | os.PathLike[str],
    allowed: Iterable[SkopsType],
    *,
    limit: int = 256 * MiB,
    retrain: str = "retrain it",
) -> Any:
    """A skops file whose every node is in ``allowed`` (plus :data:`SKOPS_PLAIN_DATA`).

    The schema is read and checked before skops builds anything; then skops loads the
    file trusting exactly the (allowed) types it holds.

    Args:
        path: The ``.skops`` file.
        allowed: The exact ``(loader, module, class)`` triples this file may hold.
        limit: Largest file accepted (the unpacked size is bounded separately).
        retrain: How to make a good file, for the error message.

    Raises:
        DataError: Over a size limit, not a skops zip, or a node outside the allowlist
            (named, with the file and ``retrain``).
    """
    import skops.io as sio  # heavy; only detectors with skops files need it

    p = Path(path)
    read_bounded(p, limit, what="skops file")  # type and size checks; bytes unused
    allow = frozenset(allowed) | SKOPS_PLAIN_DATA
    try:
        with zipfile.ZipFile(p) as zf:
            check_zip(zf, source=str(p))
            info = zf.getinfo("schema.json")
            if info.file_size > 64 * MiB:
                raise DataError("schema.json is over 64 MiB", source=str(p))
            schema = parse_json(zf.read(info), source=f"{p}!schema.json", max_depth=512)
    except (zipfile.BadZipFile, KeyError, OSError) as e:
        raise DataError(
            f"not a readable skops file ({type(e).__name__}: {e}); {retrain}", source=str(p)
        ) from e
    found = skops_types(schema)
    bad = sorted(t for t in found if t not in allow)
    if bad:
        callables = [t for t in bad if t[0] in SKOPS_CALLABLE_LOADERS]
        worst = callables[0] if callables else bad[0]
        kind = "a function or type reference" if callables else "a type outside the allowlist"
        names = ", ".join(f"{m}.{c} ({ld})" for ld, m, c in bad[:5])
        raise DataError(
            f"refusing to load: it holds {kind}, {worst[1]}.{worst[2]} ({worst[0]}); "
            f"not allowed here: {names}{' ...' if len(bad) > 5 else ''}. Only the exact "
            f"estimator classes ragscope writes are loaded; {retrain}",
            source=str(p),
        )
    trusted = sorted({f"{m}.{c}" for _, m, c in found})
    try:
        return sio.load(p, trusted=trusted)  # noqa: TID251 (the checked, allowlisted load)
    except Exception as e:  # skops raises many types on a malformed but allowed tree
        raise DataError(
            f"malformed skops file ({type(e).__name__}: {str(e)[:200]}); {retrain}",
            source=str(p),
        ) from e


def json_default(o: Any) -> Any:
    """``json.dumps(default=...)`` for what ragscope writes: numpy arrays and scalars,
    tuples and sets (as lists), paths (as strings), dataclasses (as dicts)."""
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, tuple | set | frozenset):
        return list(o)
    if isinstance(o, Path):
        return str(o)
    if dataclasses.is_dataclass(o) and not isinstance(o, type):
        return dataclasses.asdict(o)
    raise TypeError(f"cannot write {type(o).__name__} to JSON")
