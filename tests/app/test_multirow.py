"""The aligned multi-row heatmap HTML: one cell per token per row on every line, hovers
with every row's value, flags and focus, escaping and length checks."""

from __future__ import annotations

import re

import numpy as np
import pytest

from app.components.multirow import HeatRow, gold_row, multirow_html


def _tables(out: str) -> list[str]:
    return re.findall(r"<table>(.*?)</table>", out, flags=re.S)


def test_every_row_has_one_cell_under_each_token_on_every_line() -> None:
    tokens = [f" word{k}" for k in range(40)]  # ~240 characters: several lines
    rows = [
        HeatRow(name="a", values=np.linspace(0, 1, 40)),
        gold_row([0] * 20 + [1] * 20),
        HeatRow(name="b", values=np.full(40, np.nan)),
    ]
    out = multirow_html(tokens, rows, line_chars=60)
    tables = _tables(out)
    assert len(tables) >= 3
    seen = []
    for t in tables:
        trs = re.findall(r"<tr>(.*?)</tr>", t, flags=re.S)
        assert len(trs) == 1 + len(rows)  # the token row, then one row per HeatRow
        toks = re.findall(r'data-tok="(\d+)"', trs[0])
        seen += [int(j) for j in toks]
        for tr in trs[1:]:
            assert len(re.findall(r'class="rs-mr-cell"', tr)) == len(toks)
    assert seen == list(range(40))  # each token once, in order
    # The row names label every line.
    assert all(">gold span</td>" in t for t in tables)


def test_hover_lists_every_rows_value_and_the_colours_follow_the_values() -> None:
    rows = [
        HeatRow(name="raw", values=np.asarray([0.0, 1.0])),
        HeatRow(name="act", values=np.asarray([0.5, 1.0]), shown=["2.000", "4.000"]),
        gold_row([0, 1]),
    ]
    out = multirow_html(["Paris", " <b>"], rows, flagged=[False, True], positions=[7, 8])
    titles = re.findall(r'<td class="rs-mr-tok[^"]*" data-tok="1" title="([^"]*)"', out)
    assert titles == [
        "token 1: &#x27; &lt;b&gt;&#x27;&#10;position: 8&#10;raw: 1.000&#10;act: 4.000"
        "&#10;gold span: hallucinated&#10;flagged: yes"
    ]
    assert "<b>" not in out.split("</style>", 1)[1]
    cells = re.findall(r'class="rs-mr-cell" style="background-color: (#[0-9a-f]{6});"', out)
    # raw 0 -> white, raw 1 -> the scale's red; gold faithful -> grey-white, hallucinated -> blue.
    assert cells[0] == "#ffffff" and cells[1] == "#d7301f"
    assert cells[4] == "#f4f5f8" and cells[5] == "#1f4fd1"
    assert re.search(r'class="rs-mr-tok rs-mr-flag" data-tok="1"', out)
    assert not re.search(r'class="rs-mr-tok rs-mr-flag" data-tok="0"', out)


def test_focus_highlights_the_span_tokens() -> None:
    rows = [HeatRow(name="s", values=np.zeros(5))]
    out = multirow_html(list("abcde"), rows, focus=(1, 3))
    focused = re.findall(r'class="rs-mr-tok[^"]*rs-mr-focus" data-tok="(\d)"', out)
    assert focused == ["1", "2", "3"]
    assert "the current span" in out


def test_a_newline_token_ends_the_line() -> None:
    out = multirow_html(["a", "\n", "b"], [HeatRow(name="s", values=np.zeros(3))])
    assert len(_tables(out)) == 2
    assert "↵" in out


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"rows": [HeatRow(name="x", values=np.zeros(2))]}, "row 'x' has 2 values"),
        ({"flagged": [True]}, "flagged has 1"),
        ({"positions": [1, 2]}, "2 positions"),
    ],
)
def test_lengths_must_match_the_tokens(kw: dict, match: str) -> None:
    args = {"rows": [HeatRow(name="ok", values=np.zeros(3))], **kw}
    with pytest.raises(ValueError, match=match):
        multirow_html(["a", "b", "c"], **args)
