"""Context attribution: which passage text one span of an answer drew on, per head group,
and whether removing it matters (Heads & layers, below "One answer, one head").

Everything shown is read from core: the attention from the page's traced pass
(:func:`core.signals.passage_attention.context_reading`), the text alignment a flagged
span would carry as evidence (:func:`core.pipeline.evidence.find_evidence`), the
ablation of one span (:func:`core.evaluation.attribution_check.check_span`) and the
shipped check over RAGTruth QA dev (:func:`core.evaluation.attribution_check.latest_run`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pandas as pd
import streamlit as st

from app.components.highlight import Mark, marked_html
from app.state.heads import KEY_HEADS_CHECK, KEY_HEADS_GROUP, KEY_HEADS_SPAN, HeadsState
from app.state.links import P_GROUP, P_SPAN, bind, one_of
from app.text import code, md
from core.analysis.heads_layers import HeadView
from core.base.errors import RagscopeError
from core.base.paths import shipped_runs_dir
from core.engine.model import LoadedModel
from core.evaluation.attribution_check import KIND, check_span, latest_run, too_few
from core.pipeline.evidence import find_evidence
from core.pipeline.span_judge import answer_sentences
from core.pipeline.word_spans import passage_sentences
from core.signals.passage_attention import GROUP_LABELS, ContextReading, context_reading

TOP_UNITS = 5
"""Passage sentences listed and shaded per span."""
SHADE = "255, 152, 0"
"""RGB of the shading of attended passage sentences (alpha by share)."""


def span_id(span: tuple[int, int]) -> str:
    """``a-b``: answer tokens ``[a, b)`` as a link's value."""
    return f"{span[0]}-{span[1]}"


def parse_span(n_tokens: int) -> Callable[[str], tuple[int, int] | None]:
    """A parser of ``a-b`` with ``0 <= a < b <= n_tokens``."""

    def parse(raw: str) -> tuple[int, int] | None:
        m = re.fullmatch(r"(\d{1,6})-(\d{1,6})", raw)
        if m is None:
            return None
        a, b = int(m.group(1)), int(m.group(2))
        return (a, b) if 0 <= a < b <= n_tokens else None

    return parse


def first_sentence(view: HeadView) -> tuple[int, int]:
    """The answer tokens of the answer's first sentence (the whole answer when none)."""
    n = len(view.response_tokens)
    for s, e in answer_sentences(view.layout.response_text):
        a, b = view.layout.chars_to_tokens(s, e)
        if b > a:
            return a, b
    return 0, max(n, 1)


def _slider_span(view: HeadView, state: HeadsState) -> tuple[int, int]:
    """The answer tokens the section reads: a range slider tied to the URL."""
    tokens = view.response_tokens
    n = len(tokens)
    if state.span is None or not (0 <= state.span[0] < state.span[1] <= n):
        state.span = first_sentence(view)
    if n < 2:
        return 0, n
    key = f"{KEY_HEADS_SPAN}.{n}"  # one slider per answer length: its options are 0..n-1

    def widget() -> tuple[int, int]:
        picked: Any = st.slider(  # a range slider: its value is set as a pair (the seed)
            "Answer tokens (first and last, by index; the span's text is shown below)",
            min_value=0,
            max_value=n - 1,
            key=key,
        )
        return int(picked[0]), int(picked[1]) + 1

    def parse(raw: str) -> tuple[int, int] | None:
        span = parse_span(n)(raw)
        return None if span is None else (span[0], span[1] - 1)

    span = bind(
        P_SPAN,
        key,
        widget,
        parse=parse,  # the slider's value is its first and last token
        to_id=span_id,
        seed=(state.span[0], state.span[1] - 1),
        default=span_id(first_sentence(view)),  # a fresh view's span stays out of the URL
        what="answer span",
        where="in this answer",
    )
    state.span = span
    return span


def _group(reading: ContextReading, state: HeadsState) -> str:
    if state.group not in reading.groups:
        state.group = "all"
    group = bind(
        P_GROUP,
        KEY_HEADS_GROUP,
        lambda: st.radio(
            "Head group",
            list(reading.groups),
            key=KEY_HEADS_GROUP,
            format_func=lambda g: GROUP_LABELS[g],
            horizontal=True,
        ),
        parse=one_of(reading.groups),
        seed=state.group,
        default="all",
        what="head group",
    )
    state.group = group
    return group


def top_units(reading: ContextReading, group: str, span: tuple[int, int]) -> list[int]:
    """The span's most attended passage sentences, best first (those with a share)."""
    shares = reading.unit_shares(group, slice(*span))
    order = np.argsort(-shares, kind="stable")[:TOP_UNITS]
    return [int(k) for k in order if shares[k] > 0]


def units_frame(reading: ContextReading, group: str, span: tuple[int, int]) -> pd.DataFrame:
    """Rank, passage, share and text of the span's most attended passage sentences."""
    shares = reading.unit_shares(group, slice(*span))
    rows = []
    for rank, k in enumerate(top_units(reading, group, span), start=1):
        p, s, e = reading.units[k]
        rows.append(
            {
                "rank": rank,
                "passage": p + 1,
                "share of passage attention": float(shares[k]),
                "sentence": reading.layout.passage_texts[p][s:e],
            }
        )
    return pd.DataFrame(rows, columns=["rank", "passage", "share of passage attention", "sentence"])


def groups_frame(reading: ContextReading, span: tuple[int, int]) -> pd.DataFrame:
    """Per head group: the layers it spans, the passage share and its top sentence."""
    rows = []
    for g in reading.groups:
        shares = reading.unit_shares(g, slice(*span))
        k = int(np.argmax(shares)) if shares.any() else None
        layers = np.nonzero(reading.heads[g].any(axis=1))[0]
        p, s, e = reading.units[k] if k is not None else (0, 0, 0)
        rows.append(
            {
                "head group": GROUP_LABELS[g],
                "layers": f"{layers.min()}-{layers.max()}" if layers.size else "-",
                "heads": int(reading.heads[g].sum()),
                "attention on passages": reading.mass(g, slice(*span)),
                "top sentence": "-"
                if k is None
                else f"passage {p + 1}: {reading.layout.passage_texts[p][s:e]}",
                "its share": None if k is None else float(shares[k]),
            }
        )
    return pd.DataFrame(rows)


def passage_marks(
    reading: ContextReading, group: str, span: tuple[int, int]
) -> dict[int, list[Mark]]:
    """Per passage: its top sentences shaded by their share (title: rank and share)."""
    shares = reading.unit_shares(group, slice(*span))
    top = top_units(reading, group, span)
    peak = float(shares[top[0]]) if top else 1.0
    out: dict[int, list[Mark]] = {}
    for rank, k in enumerate(top, start=1):
        p, s, e = reading.units[k]
        alpha = 0.15 + 0.6 * float(shares[k]) / peak
        out.setdefault(p, []).append(
            Mark(
                s,
                e,
                f"rgba({SHADE}, {alpha:.2f})",
                f"#{rank}: {shares[k]:.1%} of the passage attention",
            )
        )
    return out


def shipped_check_line() -> str | None:
    """The shipped ablation check, in one sentence (``None`` when none is shipped)."""
    try:
        run = latest_run(shipped_runs_dir() / KIND)
    except RagscopeError as e:
        return f"The shipped attribution check cannot be read: {md(e)}"
    if run is None:
        return None
    att = dict(run.get("attention") or {})
    if not att.get("n"):
        return None
    ci = att.get("win_rate_ci")
    ci_text = f" [{ci[0]:.0%}, {ci[1]:.0%}]" if ci else ""
    line = (
        f"Over {md(run.get('dataset'))} ({att['n']} answer sentences, {att.get('n_sources')} "
        f"sources), removing the most attended passage sentence (all heads) lowered a "
        f"sentence's log-probability more than removing a random one of the same length in "
        f"**{att['win_rate']:.0%}**{ci_text} of cases (mean extra drop "
        f"{att['mean_difference']:+.2f} nats; `ragscope evaluate --attribution`)."
    )
    warn = too_few(run)
    return line + (f" {warn}" if warn else "")


def _attended_passages(
    reading: ContextReading, view: HeadView, group: str, span: tuple[int, int]
) -> None:
    """The span's passage sentences by attention share, and each passage shaded by it."""
    frame = units_frame(reading, group, span)
    if frame.empty:
        st.info("These tokens put no attention on any passage sentence.")
    else:
        st.dataframe(
            frame,
            hide_index=True,
            width="stretch",
            column_config={
                "share of passage attention": st.column_config.ProgressColumn(
                    "share of passage attention", format="percent", min_value=0.0, max_value=1.0
                )
            },
        )
        marks = passage_marks(reading, group, span)
        first = reading.units[top_units(reading, group, span)[0]][0]
        for p in sorted(marks):
            with st.expander(
                f"Passage {p + 1}, its most attended sentences shaded", expanded=p == first
            ):
                st.html(marked_html(view.layout.passage_texts[p], marks[p]))


def _text_alignment(view: HeadView, chars: tuple[int, int]) -> None:
    """The evidence text alignment finds for the span (what a flagged span would show)."""
    found = find_evidence(view.layout.passage_texts, view.layout.response_text, *chars)
    said = "**Text alignment** (the evidence a span flagged here would cite)"
    if found.evidence is None:
        st.markdown(f"{said}: {md(found.reason)}")
    else:
        ev = found.evidence
        st.markdown(
            f"{said}: passage {ev.passage + 1}, "
            f"{md(ev.text, max_len=300)} (score {ev.score:.2f}; {found.type})"
        )


def context_section(
    state: HeadsState,
    model: LoadedModel,
    view: HeadView,
    copying: Sequence[tuple[int, int]],
) -> None:
    """The section: span and head group pickers, the attended passage text, the head groups
    side by side, the text alignment's pick, and the ablation check."""
    st.subheader("Context attribution")
    st.caption(
        "Which passage text the model drew on for a span of the answer: the attention of "
        "each answer token (read where it was predicted) on the passage tokens, averaged "
        "over a group of heads and summed over the span's tokens and each passage "
        "sentence. Attention says where the model looked, not that it used it: the check "
        "below removes the top sentence and measures what the span loses."
    )
    if not view.layout.passage_texts:
        st.info("This answer was read without passages: there is nothing to attribute to.")
        return
    try:
        reading = context_reading(
            view.layout,
            view.attention,
            view.context,
            passage_sentences(view.layout.passage_texts),
            copying=copying,
        )
    except ValueError as e:
        st.error(f"The attention of this answer cannot be attributed: {md(e)}")
        return
    span = _slider_span(view, state)
    group = _group(reading, state)
    a, b = span
    chars = view.layout.tokens_to_chars(a, b)
    text = view.layout.response_text[chars[0] : chars[1]]
    st.markdown(f"**Span** (tokens {a}-{b - 1}): {md(text, max_len=400)}")
    mass = reading.mass(group, slice(a, b))
    st.caption(
        f"{mass:.0%} of these tokens' attention ({GROUP_LABELS[group]}) went to the passages; "
        "the rest to the question, the prompt template and the answer so far. Shares below "
        "are of the passage part."
    )
    _attended_passages(reading, view, group, span)
    with st.expander("Every head group side by side"):
        st.dataframe(
            groups_frame(reading, span),
            hide_index=True,
            width="stretch",
            column_config={
                "attention on passages": st.column_config.NumberColumn(format="%.2f"),
                "its share": st.column_config.NumberColumn(format="%.2f"),
            },
        )
    _text_alignment(view, chars)
    _check(state, model, reading, view, span, group)


def _check(
    state: HeadsState,
    model: LoadedModel,
    reading: ContextReading,
    view: HeadView,
    span: tuple[int, int],
    group: str,
) -> None:
    key = (view.example.id + "|" + view.layout.response_text, span[0], span[1], group)
    if st.button(
        "Check it: remove the top sentence",
        key=KEY_HEADS_CHECK,
        help="Two passes without a passage sentence: the most attended one, and a random "
        "one of about the same length. Faithful attribution: the span loses more "
        "log-probability without the first.",
    ):
        try:
            with st.spinner("Scoring the answer without each sentence…"):
                state.checks[key] = check_span(model, reading, span, group=group)
        except (RagscopeError, ValueError) as e:
            st.error(f"The check failed: {md(e)}")
    if key in state.checks:
        res = state.checks[key]
        if res is None:
            st.info(
                "Nothing to compare: the passages hold fewer than two sentences, or "
                "the span attends to none."
            )
        else:
            verdict = "faithful here" if res.faithful else "not faithful here"
            st.markdown(
                f"Without the top sentence the span's log-probability drops by "
                f"**{res.drop_top:+.2f}** nats; without a random sentence of the same length "
                f"(passage {reading.units[res.random_unit][0] + 1}) by "
                f"**{res.drop_random:+.2f}**: {verdict} "
                f"(the span's log-probability: {res.logprob:.2f} nats)."
            )
    line = shipped_check_line()
    if line:
        st.caption(line)
    else:
        st.caption(
            "No attribution check is shipped; run "
            + code("ragscope evaluate --attribution shared:ragtruth_qa_dev")
            + "."
        )
