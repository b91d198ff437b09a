"""The LRU that keeps streamed results (analyses, verdicts) for every page."""

from __future__ import annotations

import threading

import pytest

from app.state.memo import Memo


def test_least_recently_used_goes_first() -> None:
    m: Memo[int] = Memo(max_entries=2)
    m.put("a", 1)
    m.put("b", 2)
    assert m.get("a") == 1  # "a" is now the most recent
    m.put("c", 3)
    assert m.get("b") is None and m.get("a") == 1 and m.get("c") == 3
    m.put("a", 4)  # a new value for a known key replaces it
    assert m.get("a") == 4 and len(m) == 2
    with pytest.raises(ValueError, match="max_entries"):
        Memo(max_entries=0)


def test_threads_never_overfill_it() -> None:
    m: Memo[int] = Memo(max_entries=8)

    def fill(base: int) -> None:
        for i in range(500):
            m.put((base, i), i)
            m.get((base, i - 1))

    threads = [threading.Thread(target=fill, args=(b,)) for b in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(m) == 8
