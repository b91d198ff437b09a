"""Untrusted text inside Markdown: shown as the characters it is, never as markup.

Questions, passages, answers, ids, dataset and file names, reviewer names and notes,
LLM-written explanations and error messages that quote any of those come from
outside. Streamlit renders ``st.markdown``, ``st.caption``, ``st.info``/``st.error``
and widget labels as Markdown (GitHub-flavoured, plus ``:color[...]``, ``:icon:`` and
``$LaTeX$``), so such text could add images that call out to other hosts, links,
headings or fake formatting. :func:`md` escapes every character Markdown gives a
meaning to (CommonMark allows a backslash before any ASCII punctuation), so the
text is shown verbatim; :func:`code` shows it in inline code.

Raw HTML is already never rendered by Streamlit's Markdown (``unsafe_allow_html``
stays off); HTML ragscope builds itself goes through :func:`html.escape` (see
``app/components/highlight.py`` and ``heatmap.py``).
"""

from __future__ import annotations

import re

_SPECIAL = re.compile(r"([\\`*_\[\]<>!|$~:@])")
"""Characters that make markup anywhere in a line: escapes, code, emphasis, links and
images, raw HTML, tables, LaTeX, strikethrough, Streamlit's ``:color[...]`` and
``:icon:``, and the ``:``/``@`` of GFM's bare URL and e-mail autolinks."""
_WWW = re.compile(r"(?i)\b(www)\.")
"""GFM also autolinks bare ``www.`` names."""
_JOINER = "\u2060"
"""WORD JOINER: invisible, and it breaks the ``://``, ``www.`` and ``@`` that
Streamlit's renderer turns into links even after a backslash escape."""
_LINE_START = re.compile(r"^(\s*)([-+=#>]|\d+[.)])")
"""What makes a block at the start of a line (lists, headings, quotes, setext
underlines); after :data:`_BREAKS` only the text's own start is one."""
_BREAKS = re.compile(r"\s*[\r\n\u2028\u2029]+\s*")


def md(text: object, *, max_len: int | None = None) -> str:
    """``text`` escaped for Markdown: line breaks become spaces (a line break could
    start a heading, list or quote), then every character that makes markup gets a
    backslash (CommonMark allows one before any ASCII punctuation), so the text shows
    exactly as it is. Ordinary punctuation (``-``, ``.``, parentheses) is left alone
    where it cannot make markup, so names read the same in the Markdown source.
    ``max_len`` cuts long text first (with an ellipsis)."""
    s = _BREAKS.sub(" ", str(text))
    if max_len is not None and len(s) > max_len:
        s = s[: max(max_len - 1, 0)] + "…"
    s = _SPECIAL.sub(r"\\\1", s)
    # Streamlit's renderer links bare URLs, www. names and e-mail addresses in the text
    # it has already unescaped, so a backslash does not stop them: an invisible word
    # joiner inside every '://', before every '@' and before the dot of 'www.' does.
    s = _WWW.sub(lambda m: m.group(1) + _JOINER + "\\.", s)
    s = s.replace("\\://", "\\:" + _JOINER + "//").replace("\\@", _JOINER + "\\@")
    return _LINE_START.sub(_escape_marker, s, count=1)


def _escape_marker(m: re.Match[str]) -> str:
    mark = m.group(2)  # "1." -> "1\.": only punctuation can be escaped
    return m.group(1) + (mark[:-1] + "\\" + mark[-1] if mark[0].isdigit() else "\\" + mark)


def code(text: object, *, max_len: int | None = None) -> str:
    """``text`` as inline code: a backtick fence longer than any backtick run in it,
    so it cannot close early; line breaks become spaces."""
    s = _BREAKS.sub(" ", str(text))
    if max_len is not None and len(s) > max_len:
        s = s[: max(max_len - 1, 0)] + "…"
    longest = max((len(m) for m in re.findall(r"`+", s)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if s.startswith("`") or s.endswith("`") or not s.strip() else ""
    return f"{fence}{pad}{s}{pad}{fence}"


def md_lines(text: object) -> str:
    """Multi-line untrusted text for Markdown: each line escaped with :func:`md`, the
    lines kept apart by hard breaks (a model's answer, a passage)."""
    lines = str(text).replace("\r\n", "\n").replace("\r", "\n").split("\n")
    return "  \n".join(md(line) for line in lines)
