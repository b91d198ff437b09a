"""Heads & layers' context attribution section on the tiny model (AppTest).

The section's table is :func:`core.signals.passage_attention.context_reading` of the page's
own traced pass (checked against a fresh trace), the head group and the span follow the
URL, and the ablation check shows the drops :func:`check_span` computes.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from streamlit.testing.v1 import AppTest

from app.components.context_view import span_id
from app.state.heads import KEY_HEADS_CHECK, KEY_HEADS_GROUP, KEY_HEADS_SPAN
from app.state.links import P_GROUP, P_SPAN
from app.state.session import STATE_KEY
from core.data import builtin_examples
from core.engine.layout import render
from core.engine.model import LoadedModel
from core.engine.trace import trace
from core.pipeline.word_spans import passage_sentences
from core.signals.passage_attention import read_context, reading_needs

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

    # The check: two passes, the drops shown.
    at.button(key=KEY_HEADS_CHECK).click().run()
    no_exception(at)
    (res,) = at.session_state[STATE_KEY].heads.checks.values()
    assert res is not None
    assert f"{res.drop_top:+.2f}" in page_text(at) and f"{res.drop_random:+.2f}" in page_text(at)


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
