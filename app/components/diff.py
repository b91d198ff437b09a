"""Word-level diff of two texts as HTML: the new text, with the old text's removed words
struck through (red) and the added ones marked (green)."""

from __future__ import annotations

import difflib
import html

_DEL = '<del style="background:#fbd0d0;color:#7a0000">{}</del>'
_INS = '<ins style="background:#cdeccd;color:#0b4f0b;text-decoration:none">{}</ins>'


def word_diff_html(old: str, new: str, css_class: str = "rs-diff") -> str:
    """``new`` with ``old``'s removed words struck and the added words marked (escaped)."""
    a, b = old.split(), new.split()
    parts = []
    for tag, i0, i1, j0, j1 in difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes():
        if tag == "equal":
            parts.append(html.escape(" ".join(a[i0:i1])))
            continue
        if i1 > i0:
            parts.append(_DEL.format(html.escape(" ".join(a[i0:i1]))))
        if j1 > j0:
            parts.append(_INS.format(html.escape(" ".join(b[j0:j1]))))
    return f'<div class="{css_class}" style="line-height:1.7">' + " ".join(parts) + "</div>"
