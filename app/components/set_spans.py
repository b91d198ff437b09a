"""The spans the set flags on one answer, where and why: the answer with each span marked
(darker: a higher score), and a row per span with its type, the reason, the passage text
it departs from (or that none supports it), its score and the members that agree.

Everything shown comes from :class:`core.pipeline.judge.AnswerVerdict` (its ``spans``
and ``span_decision``, decided once by :func:`core.pipeline.span_judge.decide_spans`); this
module only draws it.
"""

from __future__ import annotations

import pandas as pd
import streamlit as st

from app.components.highlight import Mark, marked_html
from app.text import md
from core.pipeline.evidence import NO_SUPPORT
from core.pipeline.judge import AnswerVerdict


def span_background(score: float) -> str:
    """A span's background: red, more opaque for a higher score."""
    s = min(max(float(score), 0.0), 1.0)
    return f"rgba(214,48,49,{0.18 + 0.6 * s:.2f})"


def span_rows(answer: AnswerVerdict) -> pd.DataFrame:
    """One row per span: the text, type, reason, evidence, score and agreeing members."""
    rows = [
        {
            "span": s.text,
            "type": s.type or "",
            "reason": s.reason or "",
            "departs from": (
                f"passage {s.evidence.passage + 1}: {s.evidence.text}"
                if s.evidence is not None
                else NO_SUPPORT
            ),
            "score": f"{s.score:.3f}",
            "members that agree": ", ".join(s.detectors) or "none",
        }
        for s in answer.spans
    ]
    cols = ["span", "type", "reason", "departs from", "score", "members that agree"]
    return pd.DataFrame(rows, columns=cols)


def set_spans_section(answer: AnswerVerdict, response: str) -> None:
    """Where the set says the answer departs from its sources, and why (see the module
    docstring); when it flags no span, why not."""
    d = answer.span_decision
    st.markdown("**Where and why** (the set's spans)")
    if not answer.spans:
        st.caption(md(d.note) if d is not None and d.note else "The set flags no span.")
        return
    marks = [
        Mark(s.start, s.end, span_background(s.score), f"{s.type}: {s.reason}")
        for s in answer.spans
    ]
    st.html(marked_html(response, marks))
    st.table(span_rows(answer))
    if d is not None and d.rule is not None:
        st.caption(
            f"Spans by the set's **{md(d.judge or '')}** token scores: {md(d.rule.describe())}. "
            "Each span's evidence is the passage sentence it aligns with best (words and "
            "meaning); *contradicted*: that sentence states another value, *unsupported*: "
            "no passage says it."
        )
