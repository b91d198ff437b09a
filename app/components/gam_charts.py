"""RAGLens charts (plotly): a fitted detector's importances, shape functions, contributions.

Pure: a fitted detector (or an answer's explanation) in, a ``go.Figure`` out. Plotly
only (no matplotlib global state), so concurrent app sessions never share a figure.
The numbers come from the EBM itself (:meth:`RaglensDetector.importances`,
:meth:`RaglensDetector.shape_function`, :meth:`RaglensDetector.contributions`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np

from core.detectors.raglens import INTERCEPT, RaglensDetector

if TYPE_CHECKING:
    import plotly.graph_objects as go

RED = "#d62728"
BLUE = "#1f77b4"
GREY = "#7f7f7f"


def importance_figure(detector: RaglensDetector, top: int = 20) -> go.Figure:
    """Horizontal bars of the EBM importance (mean |contribution|) of the top features."""
    import plotly.graph_objects as go

    rows = detector.importances()[: max(1, top)]
    names = [f"F{k}" for k, _ in rows][::-1]
    vals = [v for _, v in rows][::-1]
    fig = go.Figure(
        go.Bar(
            x=vals,
            y=names,
            orientation="h",
            marker_color=BLUE,
            hovertemplate="%{y}: mean |contribution| %{x:.4f} log-odds<extra></extra>",
        )
    )
    fig.update_layout(
        title=f"EBM importance of the top {len(rows)} SAE features",
        xaxis_title="mean |contribution| (log-odds)",
        height=max(260, 22 * len(rows) + 90),
        margin={"l": 70, "r": 20, "t": 50, "b": 40},
    )
    return fig


def _steps(edges: np.ndarray, scores: np.ndarray) -> tuple[list[float], list[float]]:
    """Step-line points: each bin's score held flat from its lower to its upper edge."""
    xs: list[float] = []
    ys: list[float] = []
    for i, s in enumerate(scores):
        xs += [float(edges[i]), float(edges[i + 1])]
        ys += [float(s), float(s)]
    return xs, ys


def shape_function_figure(
    detector: RaglensDetector, feature: int, *, title: str | None = None
) -> go.Figure:
    """One feature's shape function (activation -> log-odds) above its activation histogram."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    sf = detector.shape_function(feature)
    edges, scores = sf["edges"], sf["scores"]
    fig = make_subplots(
        rows=2, cols=1, shared_xaxes=True, row_heights=[0.72, 0.28], vertical_spacing=0.04
    )
    xs, ys = _steps(edges, scores)
    fig.add_trace(
        go.Scatter(
            x=xs,
            y=ys,
            mode="lines",
            line={"color": RED, "width": 2, "shape": "linear"},
            name="contribution",
            hovertemplate="activation %{x:.3g} → %{y:+.3f} log-odds<extra></extra>",
        ),
        row=1,
        col=1,
    )
    fig.add_hline(y=0.0, line={"color": GREY, "width": 1, "dash": "dot"}, row=1, col=1)
    dens, dedges = sf["density"], sf["density_edges"]
    if dens.size and dedges.size == dens.size + 1:
        centers = (dedges[:-1] + dedges[1:]) / 2
        fig.add_trace(
            go.Bar(
                x=centers,
                y=dens,
                width=np.diff(dedges),
                marker_color=GREY,
                name="training answers",
                hovertemplate="activation %{x:.3g}: %{y} answers<extra></extra>",
            ),
            row=2,
            col=1,
        )
    fig.update_yaxes(title_text="log-odds", zeroline=False, row=1, col=1)
    fig.update_yaxes(title_text="answers", row=2, col=1)
    fig.update_xaxes(title_text=f"max activation of F{feature} over the answer", row=2, col=1)
    fig.update_layout(
        title=title or f"Shape function of SAE feature F{feature}",
        showlegend=False,
        height=380,
        margin={"l": 60, "r": 20, "t": 50, "b": 45},
        bargap=0.02,
    )
    return fig


def contributions_figure(explanation: Mapping[str, float], top: int = 12) -> go.Figure:
    """An answer's largest per-feature contributions (red: towards hallucinated)."""
    import plotly.graph_objects as go

    items = [(k, v) for k, v in explanation.items() if k != INTERCEPT]
    items.sort(key=lambda kv: -abs(kv[1]))
    items = items[: max(1, top)][::-1]
    fig = go.Figure(
        go.Bar(
            x=[v for _, v in items],
            y=[k for k, _ in items],
            orientation="h",
            marker_color=[RED if v > 0 else BLUE for _, v in items],
            hovertemplate="%{y}: %{x:+.4f} log-odds<extra></extra>",
        )
    )
    icpt = explanation.get(INTERCEPT)
    fig.update_layout(
        title="Largest contributions to this answer's score"
        + (f" (intercept {icpt:+.3f})" if icpt is not None else ""),
        xaxis_title="contribution (log-odds of hallucinated)",
        height=max(240, 24 * len(items) + 90),
        margin={"l": 70, "r": 20, "t": 50, "b": 40},
    )
    fig.add_vline(x=0.0, line={"color": GREY, "width": 1})
    return fig
