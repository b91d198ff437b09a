"""Text with marked character ranges, as escaped HTML (the Review page, audit reports).

:func:`marked_html` is pure: it takes the text and ``(start, end, background, title)``
marks (overlaps resolve to the earlier mark) and returns one ``<div>``.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass

FLAG = "#ffd6a5"
"""Background of a flagged span."""
RELATED = "#cfe8ff"
"""Background of passage text related to the flagged span."""


@dataclass(frozen=True)
class Mark:
    """A character range ``[start, end)`` to mark, its background and hover title."""

    start: int
    end: int
    background: str = FLAG
    title: str = ""


def marked_html(text: str, marks: Sequence[Mark], *, css_class: str = "rs-marked") -> str:
    """``text`` (escaped, newlines kept) with each mark's range on its background."""
    n = len(text)
    spans = sorted(
        (Mark(max(0, m.start), min(n, m.end), m.background, m.title) for m in marks),
        key=lambda m: (m.start, m.end),
    )
    parts: list[str] = []
    pos = 0
    for m in spans:
        if m.end <= m.start or m.start < pos:
            continue  # empty, or overlaps an earlier mark
        parts.append(html.escape(text[pos : m.start]))
        title = f' title="{html.escape(m.title, quote=True)}"' if m.title else ""
        parts.append(
            f'<mark style="background:{m.background};padding:0 1px;border-radius:3px"{title}>'
            f"{html.escape(text[m.start : m.end])}</mark>"
        )
        pos = m.end
    parts.append(html.escape(text[pos:]))
    body = "".join(parts).replace("\n", "<br>")
    return f'<div class="{css_class}" style="line-height:1.7;white-space:normal">{body}</div>'
