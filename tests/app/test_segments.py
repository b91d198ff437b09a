"""The segment strip: one coloured block per layout segment, labels and hover ranges."""

from __future__ import annotations

import pytest

from app.components.segments import segment_figure, segment_rows
from core.engine.layout import Segment

SEGMENTS = (
    Segment(kind="template", start=0, end=5),
    Segment(kind="instruction", start=5, end=20),
    Segment(kind="passage", start=20, end=60, index=0),
    Segment(kind="instruction", start=60, end=63),
    Segment(kind="passage", start=63, end=90, index=1),
    Segment(kind="question", start=90, end=98),
    Segment(kind="template", start=98, end=104),
    Segment(kind="response", start=104, end=130),
)


def test_rows_label_colour_and_count_every_segment() -> None:
    rows = segment_rows(SEGMENTS)
    assert [r.label for r in rows] == [
        "template",
        "instruction",
        "passage 1",
        "instruction",
        "passage 2",
        "question",
        "template",
        "answer",
    ]
    assert [r.n_tokens for r in rows] == [5, 15, 40, 3, 27, 8, 6, 26]
    assert rows[2].color != rows[4].color  # passages are told apart


def test_figure_bars_cover_the_layout_with_hover_ranges() -> None:
    fig = segment_figure(SEGMENTS)
    assert len(fig.data) == len(SEGMENTS)
    assert [b.base[0] for b in fig.data] == [s.start for s in SEGMENTS]
    assert [b.x[0] for b in fig.data] == [len(s) for s in SEGMENTS]
    assert "tokens 20–59" in fig.data[2].hovertemplate
    assert fig.data[-1].text[0] == "answer (26)"
    # The legend names each kind once, with passages grouped.
    assert sorted(b.name for b in fig.data if b.showlegend) == [
        "answer",
        "instruction",
        "passage",
        "question",
        "template",
    ]


def test_gaps_are_refused() -> None:
    with pytest.raises(ValueError, match="expected 5"):
        segment_rows(
            [Segment(kind="template", start=0, end=5), Segment(kind="response", start=6, end=9)]
        )
