"""Context attribution: which passage text one span of an answer drew on, per head group,
and whether removing it matters (Heads & layers, below "One answer, one head").

The section opens on the first span the detector set flags on the answer (its
:class:`core.pipeline.judge.AnswerVerdict`'s ``spans``, decided once by
:func:`core.pipeline.span_judge.decide_spans`), with a picker of the others; any answer
tokens can be read instead (advanced), and are when the set flags no span (then the
answer's first sentence by default). Everything shown is read from core: the attention
from the page's traced pass (:func:`core.signals.passage_attention.context_reading`), a
flagged span's own type, reason and evidence from the set, for other tokens the passage
sentence the text alignment would cite (:func:`core.pipeline.evidence.find_evidence`: a
similarity, not a verdict), the ablation of one span
(:func:`core.evaluation.attribution_check.check_span`) and the shipped check over RAGTruth
QA dev (:func:`core.evaluation.attribution_check.latest_run`).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import streamlit as st

from app.components.highlight import Mark, marked_html
from app.state.heads import (
    KEY_HEADS_CHECK,
    KEY_HEADS_FLAGGED,
    KEY_HEADS_GROUP,
    KEY_HEADS_SPAN,
    KEY_HEADS_SPAN_FROM,
    HeadsState,
)
from app.state.links import P_GROUP, P_SPAN, bind, follow, one_of, publish
from app.state.session import seed_widget
from app.text import code, md
from core.analysis.heads_layers import HeadView
from core.base.errors import RagscopeError
from core.base.paths import shipped_runs_dir
from core.engine.model import LoadedModel
from core.evaluation.attribution_check import KIND, SpanCheck, check_span, latest_run, too_few
from core.pipeline.evidence import Evidence, SpanFinding, find_evidence
from core.pipeline.judge import AnswerVerdict
from core.pipeline.span_judge import Span, answer_sentences
from core.pipeline.word_spans import passage_sentences
from core.signals.passage_attention import GROUP_LABELS, ContextReading, context_reading

FLAGGED = "flagged"
ANY_TOKENS = "any"
SPAN_FROM: tuple[str, ...] = (FLAGGED, ANY_TOKENS)
"""What the section reads: a span the set flags, or any answer tokens (advanced)."""
SPAN_FROM_LABELS = {FLAGGED: "A span the set flagged", ANY_TOKENS: "Any tokens (advanced)"}
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


@dataclass(frozen=True)
class Flagged:
    """A span the set flags on the answer, and the answer tokens ``[a, b)`` it covers."""

    span: Span
    tokens: tuple[int, int]


@dataclass(frozen=True)
class Picked:
    """The answer tokens ``[a, b)`` the section reads, and the set's span when they are
    one the set flags (``None``: tokens the set does not flag as a span)."""

    tokens: tuple[int, int]
    flagged: Span | None = None


def answer_tag(view: HeadView) -> str:
    """A short id of the answer the view reads (its example and text): the widgets and the
    remembered span are per answer, so another answer opens on its own first span."""
    said = f"{view.example.id}|{view.layout.response_text}".encode()
    return hashlib.sha256(said).hexdigest()[:12]


def flagged_tokens(view: HeadView, answer: AnswerVerdict | None) -> list[Flagged]:
    """The spans the set flags on the answer, in answer order, with their answer tokens."""
    if answer is None:
        return []
    n = len(view.layout.response_text)
    return [
        Flagged(span=s, tokens=view.layout.chars_to_tokens(s.start, s.end))
        for s in answer.spans
        if 0 <= s.start < s.end <= n  # a verdict of another text cannot be placed here
    ]


def span_label(span: Span) -> str:
    """A flagged span as a picker shows it: its text, the set's type and its token score."""
    text = span.text if len(span.text) <= 80 else span.text[:79] + "…"
    return f"“{text}” ({span.type or 'no type'}; token score {span.score:.2f})"


def _seed(key: str, value: object, *, linked: bool) -> None:
    # An opened link's value replaces the widget's; a remembered one only fills it.
    if linked:
        st.session_state[key] = value
    else:
        seed_widget(key, value)


def _slider(view: HeadView, tag: str, want: tuple[int, int], *, linked: bool) -> tuple[int, int]:
    """Any answer tokens ``[a, b)``: a range slider over the answer's token indices."""
    n = len(view.response_tokens)
    if n < 2:
        return 0, n
    key = f"{KEY_HEADS_SPAN}.{tag}"  # one slider per answer: its options are 0..n-1
    _seed(key, (want[0], want[1] - 1), linked=linked)  # the slider shows first and last
    picked: Any = st.slider(  # a range slider: its value is set as a pair (the seed)
        "Answer tokens (first and last, by index; the span's text is shown below)",
        min_value=0,
        max_value=n - 1,
        key=key,
    )
    return int(picked[0]), int(picked[1]) + 1


def _pick_flagged(
    view: HeadView, flagged: list[Flagged], tag: str, want: tuple[int, int], *, linked: bool
) -> Picked:
    """One of the set's spans (the one ``want`` names, else the first), or any tokens."""
    at = next((i for i, f in enumerate(flagged) if f.tokens == want), None)
    mode_key = f"{KEY_HEADS_SPAN_FROM}.{tag}"
    _seed(mode_key, ANY_TOKENS if at is None else FLAGGED, linked=linked)
    mode = st.radio(
        "Tokens to read",
        SPAN_FROM,
        key=mode_key,
        format_func=SPAN_FROM_LABELS.__getitem__,
        horizontal=True,
    )
    if mode == ANY_TOKENS:
        tokens = _slider(view, tag, want, linked=linked)
        same = next((f.span for f in flagged if f.tokens == tokens), None)
        return Picked(tokens=tokens, flagged=same)
    key = f"{KEY_HEADS_FLAGGED}.{tag}"
    _seed(key, at or 0, linked=linked)
    i = st.selectbox(
        "Span the set flagged",
        range(len(flagged)),
        key=key,
        format_func=lambda k: span_label(flagged[k].span),
    )
    return Picked(tokens=flagged[i].tokens, flagged=flagged[i].span)


def _no_span_note(answer: AnswerVerdict | None) -> None:
    """Why the section reads the first sentence: the set flags no span, or none judged."""
    if answer is None:
        st.caption(
            "No detector set judged this answer here, so there is no flagged span to open "
            "on: the section reads the answer's first sentence; pick any tokens below."
        )
        return
    d = answer.span_decision
    note = f" (its note: {md(d.note)})" if d is not None and d.note else ""
    st.info(
        f"The set flags no span on this answer{note}: the section reads the answer's first "
        "sentence; pick any tokens below."
    )


def pick_tokens(view: HeadView, state: HeadsState, answer: AnswerVerdict | None) -> Picked:
    """The answer tokens the section reads, tied to the URL: the set's first span by
    default (another of its spans, or any tokens, by choice), the answer's first sentence
    when the set flags none; a link that names tokens opens them.

    Args:
        view: The page's view of the answer.
        state: The page's state (its remembered span).
        answer: The set's verdict on the answer (``None``: no set judged it).
    """
    n = len(view.response_tokens)
    tag = answer_tag(view)
    flagged = flagged_tokens(view, answer)
    default = flagged[0].tokens if flagged else first_sentence(view)
    span = state.span
    if state.span_answer != tag or span is None or not 0 <= span[0] < span[1] <= n:
        state.span, state.span_answer = default, tag
    link = follow(P_SPAN, parse_span(n))
    want = link.value or state.span or default
    linked = link.value is not None
    if flagged:
        picked = _pick_flagged(view, flagged, tag, want, linked=linked)
    else:
        _no_span_note(answer)
        picked = Picked(tokens=_slider(view, tag, want, linked=linked))
    publish(
        P_SPAN,
        span_id(picked.tokens),
        default=span_id(default),  # a fresh view's span stays out of the URL
        missing=link.missing,
        what="answer span",
        where="in this answer",
    )
    state.span = picked.tokens
    return picked


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
    # mean_difference is the mean of drop(top) - drop(random): positive, the sentence
    # ended lower without its most attended passage sentence.
    diff = float(att["mean_difference"])
    mean = "no lower" if diff == 0 else f"{abs(diff):.2f} nats {'lower' if diff > 0 else 'higher'}"
    line = (
        f"Over {md(run.get('dataset'))} ({att['n']} answer sentences, {att.get('n_sources')} "
        f"sources), a sentence's log-probability ended lower without its most attended "
        f"passage sentence (all heads) than without a random one of about the same length "
        f"in **{att['win_rate']:.0%}**{ci_text} of cases (50%: no better than chance); on "
        f"average it ended {mean} (`ragscope evaluate --attribution`)."
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


def _evidence_words(ev: Evidence, aligned: str) -> str:
    """A passage sentence and its alignment score with ``aligned``, labelled as a
    similarity (not a verdict)."""
    how = "text similarity" if ev.how == "text" else "attention and text similarity"
    return (
        f"passage {ev.passage + 1}, “{md(ev.text, max_len=300)}” (alignment score "
        f"{ev.score:.2f}: the {how} of that sentence with {aligned}, not a verdict)"
    )


def _set_finding(span: Span) -> None:
    """The set's own finding on a span it flags: its type, reason and evidence."""
    said = (
        f"**The set's finding** on this span (its token score {span.score:.2f}, at or above "
        f"the set's span threshold {span.threshold:.2f})"
    )
    if span.type is None:
        st.markdown(f"{said}: the set gives it no type or evidence.")
        return
    ev = span.evidence
    cites = (
        f"It cites {_evidence_words(ev, 'the span')}."
        if ev is not None
        else "It cites no passage sentence."
    )
    st.markdown(f"{said}: *{md(span.type)}*, {md(span.reason or '')}. {cites}")


def _text_alignment(
    view: HeadView, chars: tuple[int, int], picked: Picked, answer: AnswerVerdict | None
) -> None:
    """The set's finding on a span it flags; for other tokens, the passage sentence the
    text alignment would cite (a similarity: the set does not flag these tokens)."""
    if picked.flagged is not None:
        _set_finding(picked.flagged)
        return
    found = find_evidence(view.layout.passage_texts, view.layout.response_text, *chars)
    st.markdown(f"**Text alignment**: {_unflagged_words(chars, answer)}; {_cited(found)}")


def _unflagged_words(chars: tuple[int, int], answer: AnswerVerdict | None) -> str:
    """What the set says of answer characters ``chars`` that are not one of its spans."""
    if answer is None:
        return "no detector set judged these tokens"
    near = next((s for s in answer.spans if s.start < chars[1] and chars[0] < s.end), None)
    if near is None:
        return "the set does not flag these tokens"
    return (
        f"these tokens are not a span the set flags (they overlap its span "
        f"“{md(near.text, max_len=80)}”: pick it to read the set's finding)"
    )


def _cited(found: SpanFinding) -> str:
    """The passage sentence the text alignment would cite, with its similarity score."""
    if found.evidence is None:
        return "no passage sentence aligns with them closely enough to cite."
    return (
        "the sentence the alignment would cite is "
        f"{_evidence_words(found.evidence, 'these tokens')}."
    )


def context_section(
    state: HeadsState,
    model: LoadedModel,
    view: HeadView,
    copying: Sequence[tuple[int, int]],
    answer: AnswerVerdict | None,
) -> None:
    """The section: span and head group pickers, the attended passage text, the head groups
    side by side, the set's finding (or the text alignment's pick), and the ablation check.

    Args:
        state: The page's state.
        model: The loaded model.
        view: The page's view of the answer (its traced pass).
        copying: The copying heads marked above ``(layer, head)``.
        answer: The set's verdict on the answer, whose spans the section opens on
            (``None``: no set judged it).
    """
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
    picked = pick_tokens(view, state, answer)
    group = _group(reading, state)
    span = picked.tokens
    a, b = span
    chars = view.layout.tokens_to_chars(a, b)
    if picked.flagged is not None:
        st.markdown(
            f"**Span the set flagged** (answer tokens {a}-{b - 1}): "
            f"{md(picked.flagged.text, max_len=400)}"
        )
    else:
        text = view.layout.response_text[chars[0] : chars[1]]
        st.markdown(f"**Span** (answer tokens {a}-{b - 1}): {md(text, max_len=400)}")
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
    _text_alignment(view, chars, picked, answer)
    _check(state, model, reading, view, span, group)


SPAN_LOGPROB = "the span's log-probability"


def nats_change(drop: float, what: str) -> str:
    """How removing a sentence moved ``what`` (a log-probability), from its drop in nats
    (:class:`~core.evaluation.attribution_check.SpanCheck`: positive means it fell)."""
    if abs(drop) < 0.005:  # "by 0.00 nats" would read as a measured move
        return f"leaves {what} unchanged (within 0.01 nats)"
    return f"{'lowers' if drop > 0 else 'raises'} {what} by **{abs(drop):.2f}** nats"


def check_sentence(res: SpanCheck, reading: ContextReading) -> str:
    """The ablation check of one span in plain words: what removing each sentence did to
    the span's log-probability, and whether the attention is faithful to the model."""
    top = reading.units[res.top_unit][0] + 1
    other = reading.units[res.random_unit][0] + 1
    if res.faithful:
        ends = "ends lower without the most attended sentence than without the random one"
        verdict = "the attention is faithful to the model here"
    else:
        ends = "ends no lower without the most attended sentence than without the random one"
        verdict = "the attention is not faithful to the model here"
    return (
        f"Removing the most attended sentence (passage {top}) "
        f"{nats_change(res.drop_top, SPAN_LOGPROB)}; removing a random "
        f"sentence of about the same length (passage {other}) "
        f"{nats_change(res.drop_random, 'it')}. The span's log-probability {ends}: "
        f"{verdict} (with every passage it is {res.logprob:.2f} nats)."
    )


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
        "one of about the same length. The attention is faithful to the model when the "
        "span's log-probability ends lower without the first.",
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
            st.markdown(check_sentence(res, reading))
    line = shipped_check_line()
    if line:
        st.caption(line)
    else:
        st.caption(
            "No attribution check is shipped; run "
            + code("ragscope evaluate --attribution shared:ragtruth_qa_dev")
            + "."
        )
