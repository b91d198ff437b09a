"""Agreement charts (plotly): the detectors' score correlation and where each detector's
call matches gold, answer by answer. Pure: tables in, ``go.Figure`` out."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from core.analysis.detector_agreement import VerdictTable, gold_matrix

if TYPE_CHECKING:
    import pandas as pd
    import plotly.graph_objects as go

RIGHT, WRONG, UNLABELLED = "#3a8f5c", "#d1495b", "#d9d9d9"


def correlation_figure(corr: pd.DataFrame, *, title: str) -> go.Figure:
    """The ``[d, d]`` correlation matrix as an annotated heatmap on [-1, 1]."""
    import plotly.graph_objects as go

    names = list(corr.columns)
    z = corr.to_numpy(dtype=float)
    fig = go.Figure(
        go.Heatmap(
            z=z,
            x=names,
            y=names,
            zmin=-1,
            zmax=1,
            colorscale="RdBu",
            reversescale=True,
            text=[[("" if np.isnan(v) else f"{v:.2f}") for v in row] for row in z],
            texttemplate="%{text}",
            hovertemplate="%{y} vs %{x}: %{z:.3f}<extra></extra>",
            colorbar={"title": "r"},
        )
    )
    fig.update_layout(
        title=title,
        height=120 + 42 * len(names),
        margin={"l": 10, "r": 10, "t": 50, "b": 10},
        yaxis={"autorange": "reversed"},
    )
    return fig


MAX_ANSWER_TICKS = 60
"""Up to this many answers, the gold matrix names each one under its column."""

GOLD_KEY = (
    ("call matches gold", RIGHT),
    ("call differs from gold", WRONG),
    ("no gold", UNLABELLED),
)
"""The gold matrix's colours, as its legend names them."""


def _colour_key(fig: go.Figure) -> None:
    """The legend: a square of each colour of :data:`GOLD_KEY`."""
    import plotly.graph_objects as go

    for name, colour in GOLD_KEY:  # the legend: a square of each colour
        fig.add_trace(
            go.Scatter(
                x=[None],
                y=[None],
                mode="markers",
                marker={"symbol": "square", "size": 12, "color": colour},
                name=name,
                showlegend=True,
                hoverinfo="skip",
            )
        )


def gold_matrix_figure(table: VerdictTable, *, title: str) -> go.Figure:
    """Rows: detectors; columns: answers (hallucinated ones first, a line between them and
    the faithful ones); green where the call matches gold, red where it does not, grey
    without gold. A legend names the colours; each column is named by its answer's id
    (up to :data:`MAX_ANSWER_TICKS` answers; more are named on hover)."""
    import plotly.graph_objects as go

    right = gold_matrix(table)
    order = np.lexsort((np.arange(table.gold.size), -table.gold))
    z = right[order].T.astype(float)  # [d, n]
    ids = [table.example_ids[i] for i in order]
    gold = [
        "hallucinated" if g == 1 else "faithful" if g == 0 else "unlabelled"
        for g in table.gold[order]
    ]
    text = [
        [
            f"{ids[j]} ({gold[j]}): {d} {'right' if z[i, j] == 1 else 'wrong' if z[i, j] == 0 else 'no gold'}"
            for j in range(len(ids))
        ]
        for i, d in enumerate(table.detectors)
    ]
    fig = go.Figure(
        go.Heatmap(
            z=z,
            x=list(range(len(ids))),
            y=list(table.detectors),
            zmin=-1,
            zmax=1,
            colorscale=[
                [0.0, UNLABELLED],
                [0.33, UNLABELLED],
                [0.34, WRONG],
                [0.66, WRONG],
                [0.67, RIGHT],
                [1.0, RIGHT],
            ],  # fmt: skip
            showscale=False,
            text=text,
            hovertemplate="%{text}<extra></extra>",
            xgap=1 if len(ids) <= MAX_ANSWER_TICKS else 0,
            ygap=2,
        )
    )
    _colour_key(fig)
    n_h = int((table.gold == 1).sum())
    if 0 < n_h < len(ids):
        fig.add_vline(x=n_h - 0.5, line={"color": "#333", "width": 2})
    named = len(ids) <= MAX_ANSWER_TICKS
    fig.update_layout(
        title=title,
        height=(230 if named else 130) + 30 * len(table.detectors),
        margin={"l": 10, "r": 10, "t": 80, "b": 30},
        legend={"orientation": "h", "yanchor": "bottom", "y": 1.0, "x": 0},
        xaxis={
            "title": f"answers: {n_h} hallucinated (left of the line), then faithful"
            + ("" if named else " (hover for each answer)"),
            "showticklabels": named,
            "tickmode": "array",
            "tickvals": list(range(len(ids))) if named else [],
            "ticktext": ids if named else [],
            "tickangle": -60,
            "showgrid": False,
            "zeroline": False,
        },
        yaxis={"autorange": "reversed", "showgrid": False, "zeroline": False},
        plot_bgcolor="white",
    )
    return fig
