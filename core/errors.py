"""Typed errors for ragscope.

Every error a user can cause names the offending record or value and the fix.
Pages catch these and show them with ``st.error``; the CLI prints them and
exits non-zero.
"""

from __future__ import annotations


class RagscopeError(Exception):
    """Base class of every error ragscope raises on purpose."""


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
            where += f"field {field!r}: "
        super().__init__(f"{where}{message}")
        self.reason = message


class ModelError(RagscopeError, RuntimeError):
    """A model cannot be loaded or run (missing weights, unsupported architecture, ...)."""


class NotFittedError(RagscopeError, RuntimeError):
    """A learner or detector was used before it was fitted."""


class StorageError(RagscopeError, RuntimeError):
    """The analysis database cannot be opened, migrated or written."""


class LLMError(RagscopeError, RuntimeError):
    """The LLM that writes feature explanations is not configured, unreachable or gave
    nothing usable. Messages never include the API key."""
