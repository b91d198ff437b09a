"""A small thread-safe LRU of computed results, shared by every session.

``st.cache_data`` only stores what its own function returns; results that a streamed
computation produces piece by piece (the Playground's analysis and verdicts, computed
in one shared pass) are put here by the code that produced them, and read back by any
page that needs the same result, so nothing is computed twice and a display control
never recomputes anything.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable
from typing import Generic, TypeVar

V = TypeVar("V")


class Memo(Generic[V]):
    """At most ``max_entries`` values by key, the least recently used dropped first."""

    def __init__(self, max_entries: int = 64) -> None:
        if max_entries < 1:
            raise ValueError(f"max_entries must be >= 1, got {max_entries}")
        self.max_entries = max_entries
        self._items: OrderedDict[Hashable, V] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Hashable) -> V | None:
        with self._lock:
            value = self._items.get(key)
            if value is not None:
                self._items.move_to_end(key)
            return value

    def put(self, key: Hashable, value: V) -> None:
        with self._lock:
            self._items[key] = value
            self._items.move_to_end(key)
            while len(self._items) > self.max_entries:
                self._items.popitem(last=False)

    def pop(self, key: Hashable) -> V | None:
        """Drop ``key``'s value (returned; ``None`` when there was none)."""
        with self._lock:
            return self._items.pop(key, None)

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)
