"""Check a GGUF file's header before anything else parses it.

A GGUF file states its own sizes: how many tensors and metadata entries it holds, how
long each key, string and array is, each tensor's shape and offset, and the model's
architecture (layers, widths, heads, context). transformers (through ``gguf``'s reader)
believes them: a crafted header makes it loop for minutes, build a model of thousands of
layers, or fail with a ``struct.error`` traceback. :func:`check_gguf` reads the header
itself, with every read bounded by the file's size and by :class:`Limits`, over a
read-only memory map (nothing is allocated from a count the file claims), and checks:

- the magic and version (2 or 3; either byte order);
- counts of tensors and metadata entries, key, string and array lengths;
- each tensor's name, dimensions, type and offset: its bytes must lie inside the file;
- the architecture's sizes (``ARCH.block_count``, ``embedding_length``,
  ``feed_forward_length``, head counts, ``context_length``, vocabulary) within sane
  bounds and consistent with the tensors present: one ``blk.N`` group per block, the
  embedding as wide as stated, and no more parameters implied than the file holds.

Every failure is a :class:`~core.base.errors.ModelError` naming the file and the field.
"""

from __future__ import annotations

import math
import mmap
import re
import struct
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from gguf import GGML_QUANT_SIZES, GGUF_DEFAULT_ALIGNMENT, GGUFValueType

from core.base.errors import ModelError

GGUF_MAGIC = b"GGUF"
VERSIONS = (2, 3)

_SCALARS: dict[GGUFValueType, str] = {
    GGUFValueType.UINT8: "B",
    GGUFValueType.INT8: "b",
    GGUFValueType.UINT16: "H",
    GGUFValueType.INT16: "h",
    GGUFValueType.UINT32: "I",
    GGUFValueType.INT32: "i",
    GGUFValueType.FLOAT32: "f",
    GGUFValueType.BOOL: "?",
    GGUFValueType.UINT64: "Q",
    GGUFValueType.INT64: "q",
    GGUFValueType.FLOAT64: "d",
}
_KEEP_ARRAY = 4096
"""Numeric arrays up to this many items are kept (per-layer head counts); longer ones
(token types, scores) are only skipped over."""
_KEEP_STRING = 4096
"""Strings up to this many bytes are kept (names); longer ones (chat templates) skipped."""
_TYPE_SIZES = {int(t): sizes for t, sizes in GGML_QUANT_SIZES.items()}
"""GGML tensor type -> (elements per block, bytes per block)."""
_BLOCK = re.compile(r"(?:^|\.)blk\.(\d{1,9})\.")


@dataclass(frozen=True, kw_only=True)
class Limits:
    """The most a GGUF header may claim. Real files are far below each: SmolLM2-135M has
    272 tensors, 33 metadata entries, 30 blocks of width 576 and 49,152 tokens; the
    largest open models have about 130 blocks, width 16,384 and 262,144 tokens."""

    tensors: int = 1 << 16
    kv: int = 1 << 12
    key_bytes: int = 1 << 12
    string_bytes: int = 1 << 24
    array_items: int = 1 << 21
    tensor_name_bytes: int = 256
    dims: int = 4  # GGML_MAX_DIMS
    alignment: int = 1 << 16
    block_count: int = 1024
    embedding_length: int = 1 << 17
    feed_forward_length: int = 1 << 20
    head_count: int = 1 << 12
    head_dim: int = 1 << 14
    context_length: int = 1 << 24
    vocab: int = 1 << 21
    experts: int = 1 << 10


LIMITS = Limits()


@dataclass(frozen=True, kw_only=True)
class GGUFArray:
    """A metadata array: its item type, length and (when short and numeric) its items."""

    item_type: GGUFValueType
    count: int
    items: tuple[int | float | bool, ...] | None


@dataclass(frozen=True, kw_only=True)
class GGUFTensorInfo:
    """One tensor's entry: GGML dimension order (``shape[0]`` is the innermost)."""

    name: str
    shape: tuple[int, ...]
    ggml_type: int
    offset: int
    n_bytes: int

    @property
    def n_elements(self) -> int:
        return math.prod(self.shape)


MetaValue = int | float | bool | str | None | GGUFArray


@dataclass(frozen=True, kw_only=True)
class GGUFHeader:
    """What :func:`check_gguf` read: metadata (long strings as ``None``), tensors, and
    where the tensor data starts."""

    path: Path
    version: int
    metadata: dict[str, MetaValue]
    tensors: tuple[GGUFTensorInfo, ...]
    data_offset: int
    architecture: str

    def arch_value(self, name: str) -> MetaValue:
        return self.metadata.get(f"{self.architecture}.{name}")


def _fail(path: Path, field: str, problem: str) -> ModelError:
    return ModelError(
        f"the GGUF file {path} is refused: field {field!r} {problem}. The file is damaged or "
        "crafted; re-download it or convert the model again with llama.cpp"
    )


class _Cursor:
    """Bounded reads over a memory map: every read checks the bytes are there."""

    def __init__(self, buf: mmap.mmap, path: Path, endian: str) -> None:
        self.buf = buf
        self.path = path
        self.size = len(buf)
        self.endian = endian
        self.pos = 0

    def take(self, n: int, field: str) -> int:
        """Advance over ``n`` bytes; the start of them."""
        if n < 0 or self.pos + n > self.size:
            raise _fail(
                self.path,
                field,
                f"needs {n} bytes at offset {self.pos} but the file ends at {self.size} "
                "(truncated)",
            )
        start = self.pos
        self.pos += n
        return start

    def scalar(self, fmt: str, field: str) -> int | float | bool:
        start = self.take(struct.calcsize(fmt), field)
        return struct.unpack_from(self.endian + fmt, self.buf, start)[0]

    def uint(self, fmt: str, field: str) -> int:
        value = self.scalar(fmt, field)
        assert isinstance(value, int)
        return value

    def string(self, field: str, limit: int, *, keep: bool = True) -> str | None:
        n = self.uint("Q", f"{field} (length)")
        if n > limit:
            raise _fail(self.path, field, f"claims a length of {n} bytes (the limit is {limit})")
        start = self.take(n, field)
        if not keep or n > _KEEP_STRING:
            return None
        try:
            return bytes(self.buf[start : start + n]).decode("utf-8")
        except UnicodeDecodeError:
            raise _fail(self.path, field, "is not UTF-8 text") from None


def _skip_strings(cur: _Cursor, key: str, count: int, limit: int) -> None:
    """Skip ``count`` strings (a vocabulary: the hot loop, so without the helpers)."""
    length = struct.Struct(cur.endian + "Q")
    pos, size, buf = cur.pos, cur.size, cur.buf
    for i in range(count):
        if pos + 8 > size:
            cur.pos = pos
            cur.take(8, f"{key}[{i}] (length)")
        (n,) = length.unpack_from(buf, pos)
        if n > limit:
            raise _fail(cur.path, f"{key}[{i}]", f"claims a length of {n} bytes (limit {limit})")
        pos += 8 + n
        if pos > size:
            cur.pos = pos - n
            cur.take(n, f"{key}[{i}]")
    cur.pos = pos


def _value_type(cur: _Cursor, field: str) -> GGUFValueType:
    raw = cur.uint("I", f"{field} (type)")
    try:
        return GGUFValueType(raw)
    except ValueError:
        raise _fail(cur.path, field, f"has an unknown value type {raw}") from None


def _read_value(cur: _Cursor, key: str, vtype: GGUFValueType, limits: Limits) -> MetaValue:
    if vtype == GGUFValueType.STRING:
        return cur.string(key, limits.string_bytes)
    if vtype != GGUFValueType.ARRAY:
        return cur.scalar(_SCALARS[vtype], key)
    item = _value_type(cur, f"{key} (array item)")
    count = cur.uint("Q", f"{key} (array length)")
    if count > limits.array_items:
        raise _fail(cur.path, key, f"claims {count} items (the limit is {limits.array_items})")
    if item == GGUFValueType.ARRAY:
        raise _fail(cur.path, key, "is an array of arrays (not supported)")
    if item == GGUFValueType.STRING:
        _skip_strings(cur, key, count, limits.string_bytes)
        return GGUFArray(item_type=item, count=count, items=None)
    fmt = _SCALARS[item]
    start = cur.take(count * struct.calcsize(fmt), key)
    items = None
    if count <= _KEEP_ARRAY:
        items = struct.unpack_from(f"{cur.endian}{count}{fmt}", cur.buf, start)
    return GGUFArray(item_type=item, count=count, items=items)


def _tensor_info(cur: _Cursor, index: int, limits: Limits) -> GGUFTensorInfo:
    where = f"tensor {index}"
    name = cur.string(f"{where} name", limits.tensor_name_bytes)
    assert name is not None  # names are short, so kept
    n_dims = cur.uint("I", f"{name} (number of dimensions)")
    if not 1 <= n_dims <= limits.dims:
        raise _fail(cur.path, name, f"has {n_dims} dimensions (1 to {limits.dims} allowed)")
    shape = tuple(cur.uint("Q", f"{name} (dimension {d})") for d in range(n_dims))
    if any(d < 1 or d > 1 << 40 for d in shape):
        raise _fail(cur.path, name, f"has the impossible shape {list(shape)}")
    raw_type = cur.uint("I", f"{name} (type)")
    if raw_type not in _TYPE_SIZES:
        raise _fail(cur.path, name, f"has an unknown tensor type {raw_type}")
    block, type_size = _TYPE_SIZES[raw_type]
    if shape[0] % block:
        raise _fail(cur.path, name, f"has a first dimension {shape[0]} not a multiple of {block}")
    offset = cur.uint("Q", f"{name} (offset)")
    n_bytes = math.prod(shape) // block * type_size
    return GGUFTensorInfo(
        name=name, shape=shape, ggml_type=raw_type, offset=offset, n_bytes=n_bytes
    )


def _parse(cur: _Cursor, limits: Limits) -> tuple[int, dict[str, MetaValue], list[GGUFTensorInfo]]:
    cur.take(len(GGUF_MAGIC), "magic")
    version = cur.uint("I", "version")
    if version not in VERSIONS:
        raise _fail(cur.path, "version", f"is {version} (ragscope reads GGUF versions 2 and 3)")
    n_tensors = cur.uint("Q", "tensor_count")
    if n_tensors > limits.tensors:
        raise _fail(cur.path, "tensor_count", f"is {n_tensors} (the limit is {limits.tensors})")
    n_kv = cur.uint("Q", "kv_count")
    if n_kv > limits.kv:
        raise _fail(cur.path, "kv_count", f"is {n_kv} (the limit is {limits.kv})")
    metadata: dict[str, MetaValue] = {}
    for i in range(n_kv):
        key = cur.string(f"key {i}", min(limits.key_bytes, _KEEP_STRING))
        assert key is not None  # keys are short, so kept
        if key in metadata:
            raise _fail(cur.path, key, "appears twice")
        metadata[key] = _read_value(cur, key, _value_type(cur, key), limits)
    tensors = [_tensor_info(cur, i, limits) for i in range(n_tensors)]
    return version, metadata, tensors


def _int_field(header: GGUFHeader, name: str, low: int, high: int, *, required: bool) -> int:
    """``ARCH.name`` as an int in ``[low, high]`` (the largest item when an array)."""
    key = f"{header.architecture}.{name}"
    value = header.metadata.get(key)
    if value is None:
        if required:
            raise _fail(header.path, key, "is missing (every model states it)")
        return low
    if isinstance(value, GGUFArray):
        if value.items is None or value.count == 0:
            raise _fail(header.path, key, f"is an array of {value.count} items (expected numbers)")
        items: tuple[object, ...] = value.items
    else:
        items = (value,)
    numbers = [v for v in items if isinstance(v, int) and not isinstance(v, bool)]
    if len(numbers) != len(items):
        raise _fail(header.path, key, f"is {value!r} (expected a whole number)")
    if min(numbers) < low or max(numbers) > high:
        raise _fail(header.path, key, f"is {value!r} (outside [{low}, {high}])")
    return max(numbers)


def _check_tensors(header: GGUFHeader, alignment: int, size: int) -> None:
    seen: set[str] = set()
    for t in header.tensors:
        if t.name in seen:
            raise _fail(header.path, t.name, "names two tensors")
        seen.add(t.name)
        if t.offset % alignment:
            raise _fail(header.path, f"{t.name} (offset)", f"{t.offset} is not {alignment}-aligned")
        end = header.data_offset + t.offset + t.n_bytes
        if end > size:
            raise _fail(
                header.path,
                f"{t.name} (offset)",
                f"puts its {t.n_bytes} bytes at {header.data_offset + t.offset}, past the end "
                f"of the file ({size} bytes)",
            )


def implied_parameters(*, vocab: int, width: int, blocks: int, ff: int, experts: int = 1) -> int:
    """The fewest parameters a model of these sizes has: the embedding, attention's query
    and output, a two-matrix MLP per expert (a lower bound for every architecture)."""
    return vocab * width + blocks * (2 * width * width + 2 * width * ff * max(experts, 1))


def plausible(implied: int, present: int) -> bool:
    """Whether weights of ``present`` elements can back a model stated to have at least
    ``implied`` parameters: a file may not make its loader build more than about twice
    what it holds (so what it allocates is bounded by what it hands over)."""
    return implied <= 2 * present + (1 << 20)


def _check_architecture(header: GGUFHeader, limits: Limits) -> None:
    """Sizes within bounds and consistent with the tensors present."""
    lim = limits
    n_blocks = _int_field(header, "block_count", 1, lim.block_count, required=True)
    width = _int_field(header, "embedding_length", 1, lim.embedding_length, required=True)
    ff = _int_field(header, "feed_forward_length", 0, lim.feed_forward_length, required=False)
    _int_field(header, "attention.head_count", 1, lim.head_count, required=False)
    _int_field(header, "attention.head_count_kv", 0, lim.head_count, required=False)
    _int_field(header, "attention.key_length", 1, lim.head_dim, required=False)
    _int_field(header, "attention.value_length", 1, lim.head_dim, required=False)
    _int_field(header, "context_length", 1, lim.context_length, required=False)
    experts = _int_field(header, "expert_count", 0, lim.experts, required=False)
    vocab = _int_field(header, "vocab_size", 1, lim.vocab, required=False)
    tokens = header.metadata.get("tokenizer.ggml.tokens")
    if isinstance(tokens, GGUFArray):
        if tokens.count > lim.vocab:
            raise _fail(header.path, "tokenizer.ggml.tokens", f"holds {tokens.count} tokens")
        vocab = max(vocab, tokens.count)
    blocks = {int(m.group(1)) for t in header.tensors if (m := _BLOCK.search(t.name))}
    if blocks != set(range(n_blocks)):
        missing = sorted(set(range(n_blocks)) - blocks)[:5]
        extra = sorted(blocks - set(range(n_blocks)))[:5]
        raise _fail(
            header.path,
            f"{header.architecture}.block_count",
            f"is {n_blocks} but the file holds tensors for {len(blocks)} blocks"
            + (f" (none for blocks {missing}...)" if missing else "")
            + (f" (and for blocks {extra} beyond it)" if extra else ""),
        )
    embedding = next((t for t in header.tensors if t.name == "token_embd.weight"), None)
    if embedding is not None and embedding.shape[0] != width:
        raise _fail(
            header.path,
            f"{header.architecture}.embedding_length",
            f"is {width} but token_embd.weight is {embedding.shape[0]} wide",
        )
    implied = implied_parameters(vocab=vocab, width=width, blocks=n_blocks, ff=ff, experts=experts)
    present = sum(t.n_elements for t in header.tensors)
    if not plausible(implied, present):
        raise _fail(
            header.path,
            f"{header.architecture}.embedding_length",
            f"with block_count {n_blocks}, feed_forward_length {ff} and {vocab} tokens implies "
            f"at least {implied:,} parameters, but the tensors hold {present:,}",
        )


def check_gguf(
    path: Path, limits: Limits = LIMITS, *, architectures: Collection[str] | None = None
) -> GGUFHeader:
    """Read and check a GGUF file's header (bounded; nothing else parses it first).

    Args:
        path: The GGUF file (a regular file).
        limits: The most the header may claim.
        architectures: The architectures the caller can load (all when ``None``).

    Returns:
        The header: metadata, tensor entries and where the data starts.

    Raises:
        ModelError: Not a GGUF file, a truncated one, or a field out of bounds or
            inconsistent, naming the file and the field.
    """
    with path.open("rb") as f:
        if f.read(len(GGUF_MAGIC)) != GGUF_MAGIC:
            raise ModelError(f"{path} is not a GGUF file (it does not start with {GGUF_MAGIC!r})")
        size = f.seek(0, 2)
        if size < 24:
            raise _fail(path, "tensor_count", f"cannot be read: the file has only {size} bytes")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            # The version is 2 or 3: a file written big-endian shows it in its last bytes.
            little = struct.unpack_from("<I", buf, 4)[0]
            endian = "<" if little & 0xFFFF else ">"
            cur = _Cursor(buf, path, endian)
            version, metadata, tensors = _parse(cur, limits)
            header_end = cur.pos
    alignment = metadata.get("general.alignment", GGUF_DEFAULT_ALIGNMENT)
    if (
        not isinstance(alignment, int)
        or isinstance(alignment, bool)
        or not 1 <= alignment <= limits.alignment
        or alignment & (alignment - 1)
    ):
        raise _fail(path, "general.alignment", f"is {alignment!r} (a power of two up to 65536)")
    arch = metadata.get("general.architecture")
    if not isinstance(arch, str) or not re.fullmatch(r"[a-z0-9_.-]{1,64}", arch):
        raise _fail(path, "general.architecture", f"is {arch!r} (expected a name like 'llama')")
    if architectures is not None and arch not in architectures:
        raise ModelError(
            f"the GGUF file {path} holds a {arch!r} model (general.architecture), which "
            f"transformers cannot dequantize. It dequantizes these architectures: "
            f"{', '.join(sorted(architectures))}"
        )
    header = GGUFHeader(
        path=path,
        version=version,
        metadata=metadata,
        tensors=tuple(tensors),
        data_offset=-(-header_end // alignment) * alignment,
        architecture=arch,
    )
    _check_tensors(header, alignment, size)
    _check_architecture(header, limits)
    return header
