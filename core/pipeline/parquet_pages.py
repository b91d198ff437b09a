"""What a Parquet column chunk really decodes to, read from its pages' own headers.

A Parquet footer states each column chunk's decompressed size
(``total_uncompressed_size``), but nothing checks that claim against the pages: a
68 KB shard whose footer understated it made ``features import`` plan batches for tiny
values and decode 4.2 GB. A page's header is another matter: the reader allocates
exactly ``uncompressed_page_size`` bytes to decompress the page into, and a page that
decompresses to more is an error, not a larger buffer. So :func:`chunk_pages` walks a
chunk's pages (dictionary page first, then data pages) and reads each header (Thrift's
compact protocol, parsed here with bounded reads: at most :data:`HEADER_LIMIT` bytes a
header, :data:`PAGES_LIMIT` pages a chunk) without decompressing anything, giving the
true decompressed total and the largest page. :mod:`core.pipeline.featurestore` plans
its reads from these, never from the footer's sizes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import BinaryIO

from core.base.errors import DataError

HEADER_LIMIT = 1 << 20
"""Most bytes one page header may take (real ones take tens; statistics can add a few KB)."""
PAGES_LIMIT = 1_000_000
"""Most pages walked in one column chunk."""
_MAX_DEPTH = 16


@dataclass(frozen=True)
class ChunkPages:
    """A column chunk as its page headers describe it.

    Attributes:
        pages: Pages walked.
        uncompressed: Their decompressed bytes in all.
        largest: The largest page's decompressed bytes (no value is larger).
    """

    pages: int
    uncompressed: int
    largest: int


class _Reader:
    """Thrift compact protocol over a bytes buffer, bounded."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def byte(self) -> int:
        if self.pos >= len(self.data):
            raise ValueError("the page header runs past its bytes")
        b = self.data[self.pos]
        self.pos += 1
        return b

    def varint(self) -> int:
        out = shift = 0
        for _ in range(10):
            b = self.byte()
            out |= (b & 0x7F) << shift
            if not b & 0x80:
                return out
            shift += 7
        raise ValueError("a varint longer than 10 bytes")

    def zigzag(self) -> int:
        n = self.varint()
        return (n >> 1) ^ -(n & 1)

    def skip(self, kind: int, depth: int) -> None:
        if depth > _MAX_DEPTH:
            raise ValueError("the page header nests too deep")
        if kind in (1, 2):  # bool: in a field header's type
            return
        if kind == 3:
            self.byte()
        elif kind in (4, 5, 6):
            self.varint()
        elif kind == 7:
            self.advance(8)
        elif kind == 8:
            self.advance(self.varint())
        elif kind in (9, 10):
            head = self.byte()
            size = head >> 4 if head >> 4 != 15 else self.varint()
            for _ in range(size):
                self.skip_element(head & 0x0F, depth + 1)
        elif kind == 11:
            size = self.varint()
            if size:
                types = self.byte()
                for _ in range(size):
                    self.skip_element(types >> 4, depth + 1)
                    self.skip_element(types & 0x0F, depth + 1)
        elif kind == 12:
            self.struct(depth + 1)
        else:
            raise ValueError(f"unknown Thrift type {kind}")

    def skip_element(self, kind: int, depth: int) -> None:
        if kind in (1, 2):  # a bool inside a list or map takes one byte
            self.byte()
        else:
            self.skip(kind, depth)

    def advance(self, n: int) -> None:
        if n < 0 or self.pos + n > len(self.data):
            raise ValueError("the page header runs past its bytes")
        self.pos += n

    def struct(self, depth: int, wanted: frozenset[int] = frozenset()) -> dict[int, int]:
        """Skip a struct to its end; the integer fields whose ids are ``wanted``."""
        got: dict[int, int] = {}
        last = 0
        while True:
            head = self.byte()
            if head == 0:
                return got
            kind, delta = head & 0x0F, head >> 4
            fid = last + delta if delta else self.zigzag()
            last = fid
            if fid in wanted and kind in (4, 5, 6):
                got[fid] = self.zigzag()
            else:
                self.skip(kind, depth)


def _header(f: BinaryIO, at: int, file_size: int) -> tuple[int, int, int]:
    """``(header bytes, uncompressed page size, compressed page size)`` of the page at ``at``."""
    size = 512  # a header takes tens of bytes; statistics can add a few KB: read more then
    while True:
        f.seek(at)
        data = f.read(min(size, file_size - at))
        r = _Reader(data)
        try:
            fields = r.struct(0, frozenset({2, 3}))
            break
        except ValueError as e:
            if "runs past" not in str(e) or size >= HEADER_LIMIT or len(data) < size:
                raise
            size = min(8 * size, HEADER_LIMIT)
    if 2 not in fields or 3 not in fields:
        raise ValueError("a page header without its sizes")
    return r.pos, fields[2], fields[3]


def chunk_pages(
    f: BinaryIO, file_size: int, start: int, compressed: int, *, where: str
) -> ChunkPages:
    """Walk the pages of the column chunk that starts at byte ``start`` and takes
    ``compressed`` bytes (both from the footer: a lie there only changes which bytes are
    walked, and each page still has to parse and fit in the file).

    Raises:
        DataError: A page header that is malformed, negative, over
            :data:`HEADER_LIMIT` or past the file's end, or over :data:`PAGES_LIMIT`
            pages (``where`` names the shard, row group and column).
    """
    end = start + compressed
    if start < 4 or compressed < 0 or end > file_size:
        raise DataError(f"{where}: the column chunk lies outside the file", source=where)
    pos, pages, total, largest = start, 0, 0, 0
    try:
        while pos < end:
            pages += 1
            if pages > PAGES_LIMIT:
                raise ValueError(f"over {PAGES_LIMIT:,} pages")
            head, size, packed = _header(f, pos, file_size)
            if size < 0 or packed < 0:
                raise ValueError("a negative page size")
            total += size
            largest = max(largest, size)
            pos += head + packed
            if pos > file_size:
                raise ValueError("a page runs past the end of the file")
    except ValueError as e:
        raise DataError(f"{where}: unreadable page headers ({e})", source=where) from None
    return ChunkPages(pages=pages, uncompressed=total, largest=largest)
