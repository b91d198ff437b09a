"""Counted nouns in the sentences core writes for a person: "1 answer", "3 answers"."""

from __future__ import annotations


def plural(n: int, noun: str, many: str | None = None) -> str:
    """``noun`` for one, else its plural (``many``, else ``noun`` + s): "answer",
    "answers"."""
    return noun if n == 1 else (many or f"{noun}s")


def counted(n: int, noun: str, many: str | None = None) -> str:
    """``n`` and ``noun``, plural unless one (:func:`plural`): "1 answer", "2 answers",
    "1 of 1 detector"."""
    return f"{n} {plural(n, noun, many)}"
