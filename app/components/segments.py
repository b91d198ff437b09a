"""Segment strip: which token ranges of the prompt are template, instruction, question,
passage k and answer, as one horizontal stacked bar (plotly).

:func:`segment_rows` and :func:`segment_figure` are pure (they take anything with
``kind``, ``label``, ``start`` and ``end``, such as :class:`core.engine.layout.Segment`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import plotly.graph_objects as go


class SegmentLike(Protocol):
    """What the strip reads from a segment."""

    @property
    def kind(self) -> str: ...

    @property
    def label(self) -> str: ...

    @property
    def start(self) -> int: ...

    @property
    def end(self) -> int: ...


SEGMENT_COLORS: dict[str, str] = {
    "template": "#b8bcc6",
    "instruction": "#8c96a8",
    "question": "#8e6bbf",
    "response": "#e8743b",
}
"""Colour per segment kind; passages cycle through :data:`PASSAGE_COLORS`."""

PASSAGE_COLORS: tuple[str, ...] = ("#2a9d8f", "#4c9be8", "#66a61e", "#1b7f79", "#7fb3e0")


@dataclass(frozen=True, kw_only=True)
class SegmentRow:
    """One bar of the strip."""

    label: str
    kind: str
    start: int
    end: int
    color: str

    @property
    def n_tokens(self) -> int:
        return self.end - self.start


def segment_rows(segments: Sequence[SegmentLike]) -> list[SegmentRow]:
    """One row per segment with its colour.

    Raises:
        ValueError: A segment is empty or the segments are not contiguous.
    """
    rows: list[SegmentRow] = []
    passage_k = 0
    prev_end: int | None = None
    for s in segments:
        if s.end <= s.start:
            raise ValueError(f"segment {s.label!r} is empty ([{s.start}, {s.end}))")
        if prev_end is not None and s.start != prev_end:
            raise ValueError(f"segment {s.label!r} starts at {s.start}, expected {prev_end}")
        prev_end = s.end
        if s.kind == "passage":
            color = PASSAGE_COLORS[passage_k % len(PASSAGE_COLORS)]
            passage_k += 1
        else:
            color = SEGMENT_COLORS.get(s.kind, "#999999")
        label = "answer" if s.kind == "response" else s.label
        rows.append(SegmentRow(label=label, kind=s.kind, start=s.start, end=s.end, color=color))
    return rows


def segment_figure(segments: Sequence[SegmentLike], *, height: int = 150) -> go.Figure:
    """A horizontal stacked bar: one block per segment, width = its token count.

    Hover shows the label, the token range and the count; blocks wide enough carry
    their label inside.
    """
    import plotly.graph_objects as go

    rows = segment_rows(segments)
    total = rows[-1].end if rows else 0
    fig = go.Figure()
    seen: set[str] = set()
    for r in rows:
        # Show a readable label inside blocks that take at least ~6% of the strip.
        inside = r.n_tokens >= 0.06 * max(total, 1)
        legend_name = "passage" if r.kind == "passage" else r.label
        fig.add_trace(
            go.Bar(
                x=[r.n_tokens],
                y=["prompt + answer"],
                base=[r.start],
                orientation="h",
                name=legend_name,
                legendgroup=legend_name,
                showlegend=legend_name not in seen,
                marker={"color": r.color, "line": {"color": "#ffffff", "width": 1}},
                text=[f"{r.label} ({r.n_tokens})" if inside else ""],
                textposition="inside",
                insidetextanchor="middle",
                textfont={"color": "#ffffff", "size": 12},
                hovertemplate=(
                    f"<b>{r.label}</b><br>tokens {r.start}–{r.end - 1}"
                    f"<br>{r.n_tokens} tokens<extra></extra>"
                ),
            )
        )
        seen.add(legend_name)
    fig.update_layout(
        barmode="overlay",
        height=height,
        margin={"l": 10, "r": 10, "t": 10, "b": 30},
        legend={"orientation": "h", "yanchor": "bottom", "y": 1.02, "x": 0},
        xaxis={"title": {"text": "token position"}, "range": [0, max(total, 1)]},
        yaxis={"showticklabels": False},
        plot_bgcolor="#ffffff",
        uniformtext={"minsize": 9, "mode": "hide"},
    )
    return fig
