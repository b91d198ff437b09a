"""Heads & layers' context attribution section on the tiny model (AppTest).

The section's table is :func:`core.signals.passage_attention.context_reading` of the page's
own traced pass (checked against a fresh trace), the head group and the span follow the
URL, and the ablation check shows the drops :func:`check_span` computes, in plain words.
With a detector set, the section opens on the first span the set flags (the set's own
type and reason shown), or says the set flags none and reads the first sentence.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

import app.components.context_view as context_view
import app.state.verdicts as verdicts
from app.components.context_view import ANY_TOKENS, check_sentence, span_id
from app.state.heads import (
    KEY_HEADS_CHECK,
    KEY_HEADS_FLAGGED,
    KEY_HEADS_GROUP,
    KEY_HEADS_SPAN,
    KEY_HEADS_SPAN_FROM,
)
from app.state.links import P_GROUP, P_SPAN
from app.state.session import STATE_KEY
from app.text import md
from core.data import builtin_examples
from core.engine.layout import render
from core.engine.model import LoadedModel
from core.engine.trace import trace
from core.evaluation.attribution_check import SpanCheck
from core.pipeline.evidence import Evidence, SpanFinding
from core.pipeline.span_judge import Span, SpanDecision
from core.pipeline.word_spans import passage_sentences
from core.signals.passage_attention import ContextReading, read_context, reading_needs

HEADS = "views/heads.py"
EXAMPLE = "demo-02-waggle-dance"
SHARE = "share of passage attention"


def _table(at: AppTest):
    tables = [d.value for d in at.dataframe if SHARE in d.value.columns]
    assert len(tables) == 1, "expected one attended-sentences table"
    return tables[0]


def _slider_key(at: AppTest) -> str:
    keys = [s.key for s in at.slider if str(s.key).startswith(KEY_HEADS_SPAN)]
    assert len(keys) == 1
    return keys[0]


def _key(widgets: object, prefix: str) -> str:
    """The key of the one widget whose key starts with ``prefix`` (keys are per answer)."""
    keys = [w.key for w in widgets if str(w.key).startswith(prefix)]  # type: ignore[attr-defined]
    assert len(keys) == 1, keys
    return keys[0]


def _example():
    return next(e for e in builtin_examples() if e.id == EXAMPLE)


def _reading(tiny_model: LoadedModel) -> ContextReading:
    layout = render(_example(), tiny_model)
    return read_context(
        trace(tiny_model, layout, reading_needs(tiny_model.info.n_layers)),
        passage_sentences(layout.passage_texts),
    )


# The set flags "the direction of the food relative to the sun" (the gold span), typed
# and reasoned by the set; the text alignment of the first sentence would say otherwise.
FLAG_START, FLAG_END = 48, 93
REASON = 'the passage says "angle" shows the direction; the answer says "duration"'


def _flagged_span() -> Span:
    example = _example()
    response, passage = example.response, example.passages[0]
    start = passage.index("The angle")
    end = passage.index("sun.", start) + len("sun.")
    evidence = Evidence(
        passage=0, start=start, end=end, text=passage[start:end], score=0.77, how="text"
    )
    return Span(
        start=FLAG_START,
        end=FLAG_END,
        text=response[FLAG_START:FLAG_END],
        score=0.91,
        threshold=0.5,
        finding=SpanFinding(evidence=evidence, type="contradicted", reason=REASON),
    )


def _judged_with(monkeypatch: pytest.MonkeyPatch, **changes: object) -> None:
    """The set's verdict on every answer, with ``changes`` to its spans (the boundary the
    page reads: :attr:`DetectorVerdicts.answer`)."""
    real = verdicts.answer_verdicts

    def changed(*args: object, **kwargs: object) -> verdicts.DetectorVerdicts:
        judged = real(*args, **kwargs)  # type: ignore[arg-type]
        assert judged.answer is not None
        return dataclasses.replace(judged, answer=dataclasses.replace(judged.answer, **changes))

    monkeypatch.setattr(verdicts, "answer_verdicts", changed)


def _open_heads(make_app: Callable[[], AppTest], span: str | None = None) -> AppTest:
    at = make_app()
    if span is not None:
        at.query_params[P_SPAN] = span
    at.run()
    at.switch_page(HEADS).run()
    return at


def test_section_reads_the_pages_trace(
    open_page: Callable[[str], AppTest],
    page_text: Callable[[AppTest], str],
    no_exception: Callable[[AppTest], None],
    tiny_model: LoadedModel,
) -> None:
    at = open_page(HEADS)
    assert "Context attribution" in [h.value for h in at.subheader]
    heads = at.session_state[STATE_KEY].heads
    example = next(e for e in builtin_examples() if e.id == EXAMPLE)
    a, b = heads.span
    layout = render(example, tiny_model)
    reading = read_context(
        trace(tiny_model, layout, reading_needs(tiny_model.info.n_layers)),
        passage_sentences(layout.passage_texts),
    )
    shares = reading.unit_shares("all", slice(a, b))
    table = _table(at)
    top = np.argsort(-shares, kind="stable")[: len(table)]
    np.testing.assert_allclose(table[SHARE].to_numpy(), shares[top], rtol=1e-5)
    assert table["rank"].tolist() == list(range(1, len(table) + 1))

    # Another group and span: the URL carries both, the table changes.
    at.radio(key=KEY_HEADS_GROUP).set_value("late").run()
    no_exception(at)
    assert at.query_params[P_GROUP] == "late"
    key = _slider_key(at)
    at.slider(key=key).set_value((0, 1)).run()
    no_exception(at)
    assert at.query_params[P_SPAN] == span_id((0, 2))
    late = reading.unit_shares("late", slice(0, 2))
    np.testing.assert_allclose(
        _table(at)[SHARE].to_numpy(), np.sort(late)[::-1][: len(_table(at))], rtol=1e-5
    )

    # The check: two passes, the drops shown unsigned ("lowers" or "raises" by them).
    at.button(key=KEY_HEADS_CHECK).click().run()
    no_exception(at)
    (res,) = at.session_state[STATE_KEY].heads.checks.values()
    assert res is not None
    assert check_sentence(res, reading) in page_text(at)
    assert f"**{abs(res.drop_top):.2f}** nats" in page_text(at)
    assert f"**{abs(res.drop_random):.2f}** nats" in page_text(at)
    # No set here: the tokens are not called flagged, and no type is named for them.
    assert "no detector set judged these tokens" in page_text(at)
    assert "alignment score" in page_text(at) and "; unsupported)" not in page_text(at)


def test_a_link_reopens_the_span_and_group(
    make_app: Callable[[], AppTest],
    page_text: Callable[[AppTest], str],
    no_exception: Callable[[AppTest], None],
) -> None:
    at = make_app()
    at.query_params[P_SPAN] = "1-3"
    at.query_params[P_GROUP] = "early"
    at.run()
    at.switch_page(HEADS).run()
    no_exception(at)
    heads = at.session_state[STATE_KEY].heads
    assert heads.span == (1, 3) and heads.group == "early"
    at2 = make_app()
    at2.query_params[P_SPAN] = "9999-10000"
    at2.run()
    at2.switch_page(HEADS).run()
    no_exception(at2)
    assert "which is not in this answer" in page_text(at2)


def test_the_section_opens_on_the_set_s_first_span(
    make_app: Callable[[], AppTest],
    with_demo_detectors: Path,
    monkeypatch: pytest.MonkeyPatch,
    page_text: Callable[[AppTest], str],
    no_exception: Callable[[AppTest], None],
    tiny_model: LoadedModel,
) -> None:
    flagged = _flagged_span()
    _judged_with(monkeypatch, spans=(flagged,))
    at = _open_heads(make_app)
    no_exception(at)
    layout = render(_example(), tiny_model)
    a, b = layout.chars_to_tokens(FLAG_START, FLAG_END)
    assert (a, b) != (0, len(layout.response_positions))  # not the first sentence (the answer)

    # The picker of the set's spans holds it; the section reads its tokens, not the
    # first sentence, and a fresh view keeps its span out of the URL.
    picker = at.selectbox(key=_key(at.selectbox, KEY_HEADS_FLAGGED))
    assert picker.value == 0 and flagged.text in picker.options[0]
    assert "contradicted" in picker.options[0] and "token score 0.91" in picker.options[0]
    assert not [s for s in at.slider if str(s.key).startswith(KEY_HEADS_SPAN)]
    assert at.session_state[STATE_KEY].heads.span == (a, b)
    assert P_SPAN not in at.query_params
    text = page_text(at)
    assert f"**Span the set flagged** (answer tokens {a}-{b - 1}): {md(flagged.text)}" in text

    # The set's own type and reason, its evidence's score labelled a similarity; no
    # bare "(score x; type)" of a type recomputed here.
    assert f"*contradicted*, {md(REASON)}" in text
    assert "alignment score 0.77: the text similarity of that sentence with the span" in text
    assert "; unsupported)" not in text and "; contradicted)" not in text

    # Any tokens (advanced): the slider starts on the span; other tokens are not flagged.
    at.radio(key=_key(at.radio, KEY_HEADS_SPAN_FROM)).set_value(ANY_TOKENS).run()
    no_exception(at)
    slider = at.slider(key=_slider_key(at))
    assert tuple(slider.value) == (a, b - 1)
    assert f"*contradicted*, {md(REASON)}" in page_text(at)  # the same tokens: its span
    at.slider(key=_slider_key(at)).set_value((a, b - 2)).run()  # part of the span
    assert "these tokens are not a span the set flags (they overlap its span" in page_text(at)
    assert "*contradicted*" not in page_text(at)
    at.slider(key=_slider_key(at)).set_value((0, 1)).run()
    no_exception(at)
    assert at.query_params[P_SPAN] == span_id((0, 2))
    text = page_text(at)
    assert "the set does not flag these tokens" in text and "*contradicted*" not in text
    assert "; unsupported)" not in text and "; contradicted)" not in text


def test_a_link_opens_a_flagged_span_or_any_tokens(
    make_app: Callable[[], AppTest],
    with_demo_detectors: Path,
    monkeypatch: pytest.MonkeyPatch,
    no_exception: Callable[[AppTest], None],
    tiny_model: LoadedModel,
) -> None:
    _judged_with(monkeypatch, spans=(_flagged_span(),))
    a, b = render(_example(), tiny_model).chars_to_tokens(FLAG_START, FLAG_END)
    # A link naming other tokens opens them, in the advanced pick.
    at = _open_heads(make_app, span="1-3")
    no_exception(at)
    assert at.radio(key=_key(at.radio, KEY_HEADS_SPAN_FROM)).value == ANY_TOKENS
    assert tuple(at.slider(key=_slider_key(at)).value) == (1, 2)
    assert at.session_state[STATE_KEY].heads.span == (1, 3)
    assert at.query_params[P_SPAN] == "1-3"
    # A link naming the flagged span's tokens opens it in the picker.
    at2 = _open_heads(make_app, span=span_id((a, b)))
    no_exception(at2)
    assert at2.selectbox(key=_key(at2.selectbox, KEY_HEADS_FLAGGED)).value == 0
    assert at2.session_state[STATE_KEY].heads.span == (a, b)


def test_without_a_flagged_span_the_section_says_so_and_reads_the_first_sentence(
    make_app: Callable[[], AppTest],
    with_demo_detectors: Path,
    monkeypatch: pytest.MonkeyPatch,
    page_text: Callable[[AppTest], str],
    no_exception: Callable[[AppTest], None],
    tiny_model: LoadedModel,
) -> None:
    note = "the set calls this answer faithful, so it flags no span"
    decision = SpanDecision(judge=None, rule=None, spans=(), top=None, note=note)
    _judged_with(monkeypatch, spans=(), span_decision=decision)
    at = _open_heads(make_app)
    no_exception(at)
    assert f"The set flags no span on this answer (its note: {md(note)})" in page_text(at)
    # No picker of spans: the token slider, on the answer's first sentence (the whole
    # one-sentence answer here).
    assert not [s for s in at.selectbox if str(s.key).startswith(KEY_HEADS_FLAGGED)]
    assert not [r for r in at.radio if str(r.key).startswith(KEY_HEADS_SPAN_FROM)]
    n = len(render(_example(), tiny_model).response_positions)
    assert at.session_state[STATE_KEY].heads.span == (0, n)
    assert tuple(at.slider(key=_slider_key(at)).value) == (0, n - 1)
    assert "the set does not flag these tokens" in page_text(at)


def _checks(*pairs: tuple[float, float]) -> Iterator[SpanCheck]:
    for top, other in itertools.cycle(pairs):
        yield SpanCheck(top_unit=0, random_unit=1, logprob=-12.5, drop_top=top, drop_random=other)


def test_the_check_says_lowers_or_raises_and_faithful_to_the_model(
    open_page: Callable[[str], AppTest],
    monkeypatch: pytest.MonkeyPatch,
    page_text: Callable[[AppTest], str],
    no_exception: Callable[[AppTest], None],
    tiny_model: LoadedModel,
) -> None:
    """Negative drops read "raises ... by" their size, never a signed "drops by -x"."""
    results = _checks((-2.43, -7.27), (-0.5, 0.81))
    monkeypatch.setattr(context_view, "check_span", lambda *a, **k: next(results))
    at = open_page(HEADS)
    reading = _reading(tiny_model)
    p_top, p_other = reading.units[0][0] + 1, reading.units[1][0] + 1
    at.button(key=KEY_HEADS_CHECK).click().run()
    no_exception(at)
    text = page_text(at)
    assert (
        f"Removing the most attended sentence (passage {p_top}) raises the span's "
        f"log-probability by **2.43** nats; removing a random sentence of about the same "
        f"length (passage {p_other}) raises it by **7.27** nats. The span's "
        "log-probability ends lower without the most attended sentence than without the "
        "random one: the attention is faithful to the model here (with every passage it "
        "is -12.50 nats)." in text
    )
    # Another group, another check: one lowers, one raises; not faithful to the model.
    at.radio(key=KEY_HEADS_GROUP).set_value("late").run()
    at.button(key=KEY_HEADS_CHECK).click().run()
    no_exception(at)
    text = page_text(at)
    assert "raises the span's log-probability by **0.50** nats" in text
    assert "lowers it by **0.81** nats" in text
    assert "the attention is not faithful to the model here" in text
    for said in ("drops by -", "by **-", "faithful here", "; unsupported)"):
        assert said not in text


@pytest.mark.parametrize(
    ("difference", "said"), [(0.31, "0.31 nats lower"), (-0.27, "0.27 nats higher")]
)
def test_the_shipped_check_line_is_unsigned(
    monkeypatch: pytest.MonkeyPatch, difference: float, said: str
) -> None:
    run = {
        "dataset": "shared:ragtruth_qa_dev",
        "n_spans": 40,
        "attention": {
            "n": 40,
            "n_sources": 9,
            "win_rate": 0.6,
            "win_rate_ci": [0.45, 0.74],
            "mean_difference": difference,
        },
    }
    monkeypatch.setattr(context_view, "latest_run", lambda _dir: run)
    line = context_view.shipped_check_line()
    assert line is not None
    assert f"on average it ended {said}" in line and "**60%** [45%, 74%] of cases" in line
    assert "-0." not in line and "+0." not in line
