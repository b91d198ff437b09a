"""Safe readers for files from outside: bounded, typed, and never able to run code.

Everything ragscope reads that someone else may have made (detector artifacts, SAE
folders, feature caches, datasets, uploads) goes through these helpers:

- :func:`read_bounded` reads a regular file only (no FIFOs, devices or, where asked,
  symlinks) and refuses one over a size cap before reading it, so nothing unbounded
  enters memory.
- :func:`parse_json` turns every way a JSON text can be malformed (syntax with its
  line and column, integers over Python's digit limit, nesting deeper than a cap,
  lone surrogates) into a :class:`~core.base.errors.DataError` naming the source.
- :func:`sha256_file` hashes a file in chunks (artifact integrity).
- :func:`check_zip` bounds a zip container (``.skops``, ``.npz``) by member count and
  uncompressed size before anything is decompressed (zip bombs).
- :func:`load_skops` loads a skops file only when every node of its schema is one of an
  exact allowlist of ``(loader, module, class)`` triples: no package prefixes, and
  never a function, method, partial or operator reference, so a file cannot smuggle
  a callable into an estimator (e.g. a ``FunctionTransformer`` that runs a command at
  the first ``predict``).

Writing goes the other way round: :func:`replacing` (and :func:`replace_file`) writes a
new file beside the destination, under a fresh name no one else can have made (so no
planted symlink is followed), and renames it over the destination only once it is
whole; a failure leaves the earlier file as it was.

No pickle, no ``torch.load`` without ``weights_only=True``, no ``eval`` anywhere in
ragscope; ruff's banned-api and bandit rules in ``pyproject.toml`` enforce it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import stat
import tempfile
import zipfile
from collections.abc import Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import IO, Any, Literal, overload

import numpy as np

from core.base.errors import DataError, brief

MiB = 1024 * 1024

MAX_JSON_DEPTH = 64
"""Deepest nesting accepted in any JSON ragscope reads from outside (real records nest
a handful of levels; a deeper one is a mistake or an attack on a recursive reader)."""

MAX_SKOPS_BYTES = 64 * MiB
"""Largest skops file read (the shipped ones are under 3 MB)."""

MAX_ZIP_MEMBERS = 20_000
MAX_ZIP_BYTES = 1024 * MiB


@overload
def replacing(
    path: str | os.PathLike[str], mode: Literal["w"] = "w"
) -> AbstractContextManager[IO[str]]: ...
@overload
def replacing(
    path: str | os.PathLike[str], mode: Literal["wb"]
) -> AbstractContextManager[IO[bytes]]: ...
def replacing(
    path: str | os.PathLike[str], mode: Literal["w", "wb"] = "w"
) -> AbstractContextManager[IO[Any]]:
    """A new file in ``path``'s folder to write (text as UTF-8 with ``\\n`` line ends, or
    bytes), moved over ``path`` when the block ends without an error; on an error it is
    removed and ``path`` is left as it was. Its name is made with ``O_EXCL``, so a
    symlink planted at a predictable name is never followed; the folder is created."""
    return _replacing(Path(path), mode)


@contextmanager
def _replacing(dest: Path, mode: Literal["w", "wb"]) -> Iterator[IO[Any]]:
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name[:64]}.", suffix=".partial", dir=dest.parent)
    try:
        if mode == "wb":
            f: IO[Any] = os.fdopen(fd, "wb")
        else:
            f = os.fdopen(fd, "w", encoding="utf-8", newline="\n")
        with f:
            yield f
        os.replace(tmp, dest)
    finally:
        if os.path.lexists(tmp):
            os.unlink(tmp)


def replace_file(path: str | os.PathLike[str], data: str | bytes) -> Path:
    """Write ``data`` to ``path`` through :func:`replacing`; returns the path."""
    if isinstance(data, bytes):
        with replacing(path, "wb") as fb:
            fb.write(data)
    else:
        with replacing(path) as ft:
            ft.write(data)
    return Path(path)


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
    limit: int = MAX_SKOPS_BYTES,
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
        raise DataError(f"not a readable skops file ({brief(e)}); {retrain}", source=str(p)) from e
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


# ----------------------------------------------------------------------------- fitted models


@dataclasses.dataclass(frozen=True)
class FittedAt:
    """Where a fitted model came from, for error messages: ``source`` (the artifact
    folder), ``label`` (its file or attribute, then tree / node) and the fix."""

    source: str
    label: str
    retrain: str

    def at(self, more: str) -> FittedAt:
        return FittedAt(self.source, f"{self.label}, {more}", self.retrain)

    def fail(self, problem: str) -> DataError:
        return DataError(
            f"{self.label}: {problem}; the fitted model is damaged or crafted and is not used "
            f"(it could crash the process at its first prediction); {self.retrain}",
            source=self.source,
        )


def _array(where: FittedAt, name: str, value: Any, shape: tuple[int, ...] | None = None) -> Any:
    """``value`` as a finite float array of ``shape`` (when given)."""
    a = np.asarray(value)
    if a.dtype.kind not in "fiub":
        raise where.fail(f"{name} holds {a.dtype} values, not numbers")
    if shape is not None and a.shape != shape:
        raise where.fail(f"{name} has shape {a.shape}, not {shape}")
    bad = np.flatnonzero(~np.isfinite(a.astype(np.float64, copy=False)).ravel())
    if bad.size:
        raise where.fail(f"{name} holds a non-finite value at flat index {int(bad[0])}")
    return a


def _count(where: FittedAt, name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 0:
        raise where.fail(f"{name} is {value!r}, not a count")
    return int(value)


def _width(where: FittedAt, model: Any, width: int | None) -> int:
    """The model's ``n_features_in_``, which must be ``width`` when that is known."""
    n = _count(where, "n_features_in_", getattr(model, "n_features_in_", None))
    if width is not None and n != width:
        raise where.fail(f"it reads {n} features, but the detector gives it {width}")
    return n


def check_tree_arrays(
    where: FittedAt,
    *,
    left: np.ndarray,
    right: np.ndarray,
    feature: np.ndarray,
    threshold: np.ndarray,
    n_features: int,
    leaf_feature: int | None,
) -> None:
    """One binary tree's node arrays (scikit-learn's or XGBoost's): children within the
    tree and after their parent (so every path ends), -1 for both children exactly at
    leaves, split features within ``[0, n_features)`` (``leaf_feature`` at leaves, when
    the format fixes it), finite split thresholds."""
    n = left.shape[0]
    if n < 1 or any(a.shape != (n,) for a in (right, feature, threshold)):
        raise where.fail(
            f"node arrays of lengths {[a.shape for a in (left, right, feature, threshold)]} "
            "disagree (or the tree is empty)"
        )
    ids = np.arange(n)
    leaf = left == -1
    checks: tuple[tuple[Any, str], ...] = (
        (leaf != (right == -1), "one child is -1 and the other is not"),
        (~leaf & ((left <= ids) | (left >= n)), "left child {l} is outside ({i}, {n})"),
        (~leaf & ((right <= ids) | (right >= n)), "right child {r} is outside ({i}, {n})"),
        (
            ~leaf & ((feature < 0) | (feature >= n_features)),
            "split feature {f} is outside [0, {nf})",
        ),
        (~leaf & ~np.isfinite(threshold.astype(np.float64)), "split threshold {t} is not finite"),
    )
    if leaf_feature is not None:
        checks += ((leaf & (feature != leaf_feature), f"leaf feature {{f}} is not {leaf_feature}"),)
    for bad, msg in checks:
        hit = np.flatnonzero(bad)
        if hit.size:
            i = int(hit[0])
            text = msg.format(
                i=i, n=n, nf=n_features, l=left[i], r=right[i], f=feature[i], t=threshold[i]
            )
            raise where.fail(f"node {i} of {n}: {text}")


def _sk_tree(model: Any, width: int | None, where: FittedAt) -> None:
    n_in = _width(where, model, width)
    tree = model.tree_
    n = _count(where, "node_count", tree.node_count)
    if _count(where, "the tree's n_features", tree.n_features) != n_in:
        raise where.fail(f"its tree reads {tree.n_features} features, not {n_in}")
    arrays = {
        k: np.asarray(getattr(tree, k))
        for k in ("children_left", "children_right", "feature", "threshold")
    }
    check_tree_arrays(
        where,
        left=arrays["children_left"],
        right=arrays["children_right"],
        feature=arrays["feature"],
        threshold=arrays["threshold"],
        n_features=n_in,
        leaf_feature=-2,
    )
    n_classes = len(getattr(model, "classes_", ()))
    _array(where, "the node values", tree.value, (n, int(tree.n_outputs), n_classes))


def _forest(model: Any, width: int | None, where: FittedAt) -> None:
    n_in = _width(where, model, width)
    trees = model.estimators_
    if not isinstance(trees, list) or not trees:
        raise where.fail("it holds no trees")
    if len(trees) > MAX_BOOSTER_TREES:
        raise where.fail(
            f"it holds {len(trees):,} trees, over the {MAX_BOOSTER_TREES:,} ragscope loads"
        )
    for i, t in enumerate(trees):
        if type(t).__name__ != "DecisionTreeClassifier":
            raise where.fail(f"tree {i} is a {type(t).__name__}")
        _sk_tree(t, n_in, where.at(f"tree {i}"))


MAX_BOOSTER_BYTES = 16 * MiB
"""Largest XGBoost model file read (SPAD's search tops out at 399 trees of depth 6, about
4 MB; the shipped one is 119 trees, 0.1 MB)."""
MAX_BOOSTER_TREES = 4000
"""Most trees a booster may hold (ten times SPAD's largest search)."""
MAX_TREE_NODES = 2047
"""Most nodes of one tree (depth 10; SPAD's deepest search tree has 127)."""


def read_booster_file(path: Path, retrain: str) -> bytearray:
    """An XGBoost JSON model file's bytes, refused before XGBoost parses it when it is
    over :data:`MAX_BOOSTER_BYTES`, holds over :data:`MAX_BOOSTER_TREES` trees or a tree
    over :data:`MAX_TREE_NODES` nodes (counted in the JSON itself, not from the
    parameters it states): loading a booster costs time and memory by its size, and
    nothing ragscope trains comes near these.

    Raises:
        DataError: Over a cap (named), or not a tree booster's JSON.
    """
    raw = read_bounded(path, MAX_BOOSTER_BYTES, what="XGBoost model file")
    where = FittedAt(str(path.parent), path.name, retrain)
    doc = parse_json(raw, source=str(path), max_depth=16)
    try:
        trees = doc["learner"]["gradient_booster"]["model"]["trees"]
        if not isinstance(trees, list):
            raise TypeError("trees is not a list")
        if len(trees) > MAX_BOOSTER_TREES:
            raise where.fail(
                f"it holds {len(trees):,} trees, over the {MAX_BOOSTER_TREES:,} ragscope loads"
            )
        for k, tree in enumerate(trees):
            n = len(tree["left_children"])
            if n > MAX_TREE_NODES:
                raise where.at(f"tree {k}").fail(
                    f"it has {n:,} nodes, over the {MAX_TREE_NODES:,} ragscope loads"
                )
    except (KeyError, TypeError) as e:
        raise where.fail(f"not an XGBoost tree model ({brief(e)})") from e
    return bytearray(raw)


def _booster_json(where: FittedAt, booster: Any) -> dict[str, Any]:
    model = parse_json(bytes(booster.save_raw("json")), source=where.source, max_depth=16)
    try:
        learner = model["learner"]
        params = learner["learner_model_param"]
        gb = learner["gradient_booster"]
        if gb["name"] != "gbtree":
            raise where.fail(f"booster {gb['name']!r} is not a tree booster (gbtree)")
        return {"params": params, "model": gb["model"]}
    except (KeyError, TypeError) as e:
        raise where.fail(f"the booster's model has no {e}") from e


def _booster(model: Any, width: int | None, where: FittedAt) -> None:
    """An XGBoost booster: its feature count and every tree (XGBoost does not check
    child or feature indices when it loads a model)."""
    n_in = _count(where, "num_features()", model.num_features())
    if width is not None and n_in != width:
        raise where.fail(f"the booster reads {n_in} features, but the detector gives it {width}")
    doc = _booster_json(where, model)
    try:
        n_class = max(int(doc["params"]["num_class"]), 1)
        trees = doc["model"]["trees"]
        info = doc["model"]["tree_info"]
        if int(doc["params"]["num_feature"]) != n_in or len(info) != len(trees):
            raise where.fail("the booster's feature count or tree list disagree")
        if len(trees) > MAX_BOOSTER_TREES:
            raise where.fail(
                f"it holds {len(trees):,} trees, over the {MAX_BOOSTER_TREES:,} ragscope loads"
            )
        for k, (tree, group) in enumerate(zip(trees, info, strict=True)):
            at = where.at(f"tree {k}")
            if not 0 <= int(group) < n_class:
                raise at.fail(f"output group {group} is outside [0, {n_class})")
            param = tree["tree_param"]
            n = int(param["num_nodes"])
            if int(param["num_feature"]) > n_in or int(param["size_leaf_vector"]) > 1:
                raise at.fail("the tree reads more features or outputs than the booster")
            if any(int(s) != 0 for s in tree["split_type"]) or tree["categories_nodes"]:
                raise at.fail("categorical splits, which ragscope never trains")
            arrays = {
                k: np.asarray(tree[k])
                for k in ("left_children", "right_children", "split_indices", "split_conditions")
            }
            if any(len(tree[k]) != n for k in ("default_left", "base_weights", "split_type")):
                raise at.fail(f"node arrays are not {n} long")
            check_tree_arrays(
                at,
                left=arrays["left_children"],
                right=arrays["right_children"],
                feature=arrays["split_indices"],
                threshold=arrays["split_conditions"],
                n_features=n_in,
                leaf_feature=None,
            )
            _array(at, "the leaf values", arrays["split_conditions"], (n,))
    except (KeyError, TypeError, ValueError) as e:
        if isinstance(e, DataError):
            raise
        raise where.fail(f"the booster's model is malformed ({brief(e)})") from e


def _xgb_classifier(model: Any, width: int | None, where: FittedAt) -> None:
    _booster(model.get_booster(), width, where)


def _linear(model: Any, width: int | None, where: FittedAt) -> None:
    n_in = _width(where, model, width)
    k = len(getattr(model, "classes_", ()))
    rows = 1 if k == 2 else k
    _array(where, "coef_", model.coef_, (rows, n_in))
    _array(where, "intercept_", model.intercept_, (rows,))


def _scaler(model: Any, width: int | None, where: FittedAt) -> None:
    n_in = _width(where, model, width)
    for name in ("mean_", "scale_", "var_"):
        v = getattr(model, name, None)
        if v is not None:
            _array(where, name, v, (n_in,))
    scale = getattr(model, "scale_", None)
    if scale is not None and not bool(np.all(np.asarray(scale) > 0)):
        raise where.fail("scale_ holds a value <= 0")


def _svc(model: Any, width: int | None, where: FittedAt) -> None:
    n_in = _width(where, model, width)
    k = len(model.classes_)
    sv = _array(where, "support_vectors_", model.support_vectors_)
    n_sv = sv.shape[0] if sv.ndim == 2 else -1
    if sv.ndim != 2 or sv.shape[1] != n_in:
        raise where.fail(f"support_vectors_ has shape {sv.shape}, not [n, {n_in}]")
    counts = np.asarray(model._n_support)
    if counts.shape != (k,) or int(counts.sum()) != n_sv or bool(np.any(counts < 0)):
        raise where.fail(f"its support counts {counts.tolist()} do not add up to {n_sv}")
    pairs = k * (k - 1) // 2
    _array(where, "dual_coef_", model._dual_coef_, (k - 1, n_sv))
    _array(where, "intercept_", model._intercept_, (pairs,))
    _array(where, "support_", model.support_, (n_sv,))
    for name in ("_probA", "_probB"):  # the public probA_ / probB_ are deprecated
        v = np.asarray(getattr(model, name, np.empty(0)))
        if v.shape not in ((0,), (pairs,)):
            raise where.fail(f"{name} has shape {v.shape}, not ({pairs},)")
        _array(where, name, v)


def _calibrated(model: Any, width: int | None, where: FittedAt) -> None:
    n_in = _width(where, model, width)
    for i, cc in enumerate(model.calibrated_classifiers_):
        at = where.at(f"calibrated classifier {i}")
        check_fitted(cc.estimator, width=n_in, where=at)
        for c in cc.calibrators:
            _array(at, "the sigmoid calibration", [c.a_, c.b_])


def _pipeline(model: Any, width: int | None, where: FittedAt) -> None:
    for name, step in model.steps:
        known = _CHECKS.get(type(step).__name__)
        if known is None:
            raise where.fail(f"step {name!r} is a {type(step).__name__}, which is not checked")
        known(step, width, where.at(f"step {name!r}"))


def _ebm(model: Any, width: int | None, where: FittedAt) -> None:
    """An EBM: every term reads features that exist, and its score table has one cell
    per bin of those features (plus missing and unseen)."""
    n_in = _width(where, model, width)
    bins = model.bins_
    if len(bins) != n_in:
        raise where.fail(f"it has bins for {len(bins)} features, not {n_in}")
    cuts: list[list[int]] = []
    for f, levels in enumerate(bins):
        sizes = []
        for level in levels:
            if isinstance(level, dict):  # a categorical feature: category -> bin 1, 2, ...
                sizes.append(max(level.values(), default=0))
                continue
            c = _array(where.at(f"feature {f}"), "bin cuts", level)
            if c.ndim != 1 or bool(np.any(np.diff(c) <= 0)):
                raise where.fail(f"feature {f}'s bin cuts are not increasing")
            sizes.append(c.shape[0] + 1)
        if not sizes:
            raise where.fail(f"feature {f} has no bins")
        cuts.append(sizes)
    terms, scores = model.term_features_, model.term_scores_
    if len(terms) != len(scores):
        raise where.fail(f"{len(terms)} terms but {len(scores)} score tables")
    for t, (feats, table) in enumerate(zip(terms, scores, strict=True)):
        if not feats or any(not 0 <= int(f) < n_in for f in feats):
            raise where.fail(f"term {t} reads features {list(feats)} outside [0, {n_in})")
        shape = tuple(cuts[int(f)][min(len(feats), len(cuts[int(f)])) - 1] + 2 for f in feats)
        _array(where.at(f"term {t}"), "the score table", table, shape)
    _array(where, "intercept_", np.ravel(model.intercept_))


def _logistic_calibrator(model: Any, width: int | None, where: FittedAt) -> None:
    coef = _array(where, "coef", model.coef_)
    if coef.ndim != 1 or (width is not None and coef.shape != (width,)):
        raise where.fail(f"it reads {coef.shape} inputs, not {width}")
    _array(where, "mean", model.mean_, coef.shape)
    _array(where, "scale", model.scale_, coef.shape)
    _array(where, "intercept", [model.intercept_])
    if not bool(np.all(np.asarray(model.scale_) > 0)):
        raise where.fail("its scale holds a value <= 0")


def _mlp_head(model: Any, width: int | None, where: FittedAt) -> None:
    mean = _array(where, "mean", model.mean_)
    if width is not None and mean.shape != (width,):
        raise where.fail(f"it reads {mean.shape} inputs, not {width}")
    _array(where, "scale", model.scale_, mean.shape)
    for i, (w, b) in enumerate(zip(model.coefs_, model.intercepts_, strict=True)):
        _array(where, f"w{i}", w)
        _array(where, f"b{i}", b)


def _platt(model: Any, width: int | None, where: FittedAt) -> None:
    _array(where, "its slope and intercept", [model.a_, model.b_])


def _torch_module(model: Any, width: int | None, where: FittedAt) -> None:
    for name, param in model.named_parameters():
        _array(where, name, param.detach().cpu().numpy())


def _selection(model: Any, width: int | None, where: FittedAt) -> None:
    picked = [*model.heads, *model.layers]
    if any(not isinstance(i, int) or i < 0 or (width is not None and i >= width) for i in picked):
        raise where.fail("it selects a column outside its features")
    _array(where, "beta and the ranges", [model.beta, *model.ecs_range, *model.pks_range])


_CHECKS: dict[str, Any] = {
    "DecisionTreeClassifier": _sk_tree,
    "RandomForestClassifier": _forest,
    "Booster": _booster,
    "XGBClassifier": _xgb_classifier,
    "LogisticRegression": _linear,
    "StandardScaler": _scaler,
    "SVC": _svc,
    "CalibratedClassifierCV": _calibrated,
    "Pipeline": _pipeline,
    "ExplainableBoostingClassifier": _ebm,
    "LogisticCalibrator": _logistic_calibrator,
    "MLPHead": _mlp_head,
    "PlattCalibrator": _platt,
    "Sequential": _torch_module,
    "Selection": _selection,
}
"""Class name -> consistency check, for every fitted model an artifact can hold."""
CHECKED_TYPES = frozenset(_CHECKS)
"""The class names :func:`check_fitted` checks (the conformance test holds every fitted
part an artifact can hold to this list)."""


FITTED_DEPTH = 4
"""How deep :func:`check_fitted` walks containers of fitted parts."""


def fitted_parts(model: Any) -> list[tuple[str, Any]]:
    """The parts of a container of fitted models, labelled (nothing for other objects)."""
    if isinstance(model, dict):
        return [(f"[{k!r}]", v) for k, v in model.items()]
    if isinstance(model, list | tuple):
        return [(f"[{i}]", v) for i, v in enumerate(model)]
    if dataclasses.is_dataclass(model) and not isinstance(model, type):
        return [(f.name, getattr(model, f.name)) for f in dataclasses.fields(model)]
    return []


def check_fitted(model: Any, *, width: int | None, where: FittedAt, depth: int = 0) -> None:
    """Refuse a fitted model whose arrays are inconsistent, before anything predicts.

    Native predictors (scikit-learn's trees, XGBoost, libsvm) index memory with the
    numbers a model file holds and do not check them: a child or feature index out of
    range crashes the whole process at the first prediction. Every model type an
    artifact can hold is checked here: tree child / feature indices and thresholds,
    XGBoost boosters' trees and feature counts, linear coefficients and scalers
    (shapes, finite), SVC support arrays, EBM terms and score tables, ragscope's own
    logistic and MLP heads. Containers are walked (a mapping's values, a list's or
    tuple's items, a dataclass's fields: a per-dataset stacker inside its record is
    checked like a detector's own), width unknown, at most :data:`FITTED_DEPTH` deep;
    other objects (plain values) pass.

    Args:
        model: The fitted model.
        width: The number of features the detector gives it (``None``: unknown).
        where: The artifact folder, file and fix, for the error.

    Raises:
        DataError: Naming the artifact, the file, the tree and node or array at fault.
    """
    check = _CHECKS.get(type(model).__name__)
    if check is None:
        if depth < FITTED_DEPTH:
            for label, part in fitted_parts(model):
                check_fitted(part, width=None, where=where.at(label), depth=depth + 1)
        return
    try:
        check(model, width, where)
    except DataError:
        raise
    except (AttributeError, KeyError, TypeError, ValueError, IndexError) as e:
        raise where.fail(f"it is malformed ({type(e).__name__}: {str(e)[:200]})") from e
