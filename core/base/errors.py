"""Typed errors for ragscope.

Every error a user can cause names the offending record or value and the fix.
Pages catch these and show them with ``st.error``; the CLI prints them and
exits non-zero.
"""

from __future__ import annotations

import re
import reprlib
from collections.abc import Iterable, Sized
from itertools import islice

MAX_MESSAGE = 2_000
"""The longest message an error carries (characters). Messages are built from input
(a record's two million keys, a 60 MB value): a longer one is cut in the middle, saying
how much was left out, so the start (where) and the end (the fix) stay."""

MAX_VALUE = 80
"""The longest quoted value in a message (:func:`quoted`)."""

MAX_LISTED = 10
"""The most items a message lists (:func:`listed`)."""


def bounded(text: str, limit: int = MAX_MESSAGE) -> str:
    """``text``, or its start and end with the middle cut out when over ``limit``."""
    if len(text) <= limit:
        return text
    head, tail = text[: limit * 3 // 4], text[-(limit // 4) :]
    return f"{head} ... [{len(text) - len(head) - len(tail):,} characters cut] ... {tail}"


def quoted(value: object, max_len: int = MAX_VALUE) -> str:
    """A value for a message: its ``repr``, shortened (``reprlib``) to ``max_len``
    characters; a long string keeps its start and says how long it is."""
    if isinstance(value, str):
        if len(value) <= max_len - 2:
            return repr(value)
        return f"{value[: max_len - 2]!r}... ({len(value):,} characters)"
    short = reprlib.Repr()  # one per call: pages run in threads (3.11's takes no arguments)
    short.maxlevel = 2
    short.maxtuple = short.maxlist = short.maxdict = short.maxset = short.maxfrozenset = 4
    short.maxstring = short.maxother = max_len
    r = short.repr(value)
    return r if len(r) <= max_len else r[: max_len - 3] + "..."


def listed(items: Iterable[object], n: int = MAX_LISTED, *, empty: str = "(none)") -> str:
    """Items for a message: the first ``n`` quoted (:func:`quoted`), then "and N more"."""
    head = [quoted(x) for x in islice(items, n)]
    if not head:
        return empty
    more = len(items) - len(head) if isinstance(items, Sized) else 0
    return ", ".join(head) + (f" and {more:,} more" if more > 0 else "")


_NATIVE_PREFIX = re.compile(r"^\[[\d:]+\]\s+\S+:\d+:\s*")
"""How a native library's message opens (XGBoost: ``[12:00:01] /build/src/x.cc:42: ``)."""


def brief(error: BaseException, max_len: int = 200) -> str:
    """An exception from a library, for a message: its type and its first line, without
    a native library's time and source path prefix or the backtrace after it."""
    first = next((ln for ln in str(error).splitlines() if ln.strip()), "")
    first = _NATIVE_PREFIX.sub("", first.strip())
    if len(first) > max_len:
        first = first[: max_len - 3] + "..."
    return f"{type(error).__name__}: {first}" if first else type(error).__name__


class RagscopeError(Exception):
    """Base class of every error ragscope raises on purpose. Its message is
    :func:`bounded` (messages are built from input)."""

    def __init__(self, *args: object) -> None:
        if len(args) == 1 and isinstance(args[0], str):
            args = (bounded(args[0]),)
        super().__init__(*args)


class DataError(RagscopeError, ValueError):
    """A record, file or field is malformed.

    Attributes:
        source: Where the record came from (``file.jsonl:12``, a record id, ...).
        field: The offending field, when one is to blame.
    """

    def __init__(self, message: str, *, source: str | None = None, field: str | None = None):
        self.source = source
        self.field = field
        where = ""
        if source:
            where += f"{source}: "
        if field:
            where += f"field {quoted(field)}: "
        super().__init__(f"{bounded(where, MAX_MESSAGE // 4)}{message}")
        self.reason = bounded(message)


class ModelError(RagscopeError, RuntimeError):
    """A model cannot be loaded or run (missing weights, unsupported architecture, ...)."""


class NotFittedError(RagscopeError, RuntimeError):
    """A learner or detector was used before it was fitted."""


class StorageError(RagscopeError, RuntimeError):
    """The analysis database cannot be opened, migrated or written."""


class LLMError(RagscopeError, RuntimeError):
    """The LLM that writes feature explanations is not configured, unreachable or gave
    nothing usable. Messages never include the API key."""
