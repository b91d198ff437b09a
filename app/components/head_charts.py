"""Heads and layers charts (plotly): copying scores, ECS and PKS statistics, one answer's
attention.

Every function here is pure: a result of the engine in, a ``go.Figure`` out; the
numbers come from :mod:`core.signals.copying_heads` (:class:`~core.signals.copying_heads.CopyingScores`) and
:mod:`core.analysis.heads_layers` (:class:`~core.analysis.heads_layers.HeadStats` over many answers,
:class:`~core.analysis.heads_layers.HeadView` for one). NaN cells (an undefined correlation, a
missing class) are drawn blank.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from core.analysis.heads_layers import EcsKind, Head, HeadStats, HeadView, visible_text
from core.signals.copying_heads import CopyingScores

if TYPE_CHECKING:
    import plotly.graph_objects as go

FAITHFUL_COLOR = "#1f77b4"
HALLUCINATED_COLOR = "#d62728"


# --------------------------------------------------------------------------- copying scores


def copying_figure(result: CopyingScores, *, top: int | None = None) -> go.Figure:
    """Layer x head heatmap of the scores; the ``top`` heads (default 32) are marked."""
    import plotly.graph_objects as go

    title = "exact: sum Re(λ) / sum |λ|" if result.mode == "exact" else "paper: rank-combined"
    fig = go.Figure(
        go.Heatmap(
            z=result.scores,
            x=[f"H{h}" for h in range(result.n_heads)],
            y=[f"L{li}" for li in range(result.n_layers)],
            colorscale="RdBu" if result.mode == "exact" else "Viridis",
            zmid=0.0 if result.mode == "exact" else None,
            colorbar={"title": "copying"},
            hovertemplate="layer %{y}, head %{x}<br>score %{z:.3f}<extra></extra>",
        )
    )
    best = result.top_heads(top)
    fig.add_trace(
        go.Scatter(
            x=[f"H{h}" for _, h in best],
            y=[f"L{li}" for li, _ in best],
            mode="markers",
            marker={"symbol": "circle-open", "color": "black", "size": 9},
            name=f"top {len(best)}",
            hoverinfo="skip",
        )
    )
    fig.update_layout(
        title=f"Copying score per head ({title})",
        xaxis_title="head",
        yaxis_title="layer",
        yaxis={"autorange": "reversed"},
    )
    return fig


# --------------------------------------------------------------------------- many answers


def ecs_figure(stats: HeadStats, kind: EcsKind, *, marked: Sequence[Head] = ()) -> go.Figure:
    """Layer x head heatmap of one grid; NaN cells stay blank.

    Args:
        stats: The statistics to draw.
        kind: ``faithful`` / ``hallucinated`` (mean ECS, one shared colour range),
            ``difference`` (faithful - hallucinated, centred on 0) or ``r``
            (Pearson r with ``1 - y``, from -1 to 1).
        marked: Heads to circle (e.g. the top copying heads).
    """
    import plotly.graph_objects as go

    z = stats.ecs(kind)
    n = {"faithful": stats.n_faithful, "hallucinated": stats.n_hallucinated}
    if kind in ("faithful", "hallucinated"):
        both = np.concatenate([stats.ecs_faithful.ravel(), stats.ecs_hallucinated.ravel()])
        lo, hi = _finite_range(both)
        scale: dict[str, Any] = {"colorscale": "Viridis", "zmin": lo, "zmax": hi}
        title = f"Mean ECS, {kind} {stats.unit} (n = {n[kind]})"
        value = "mean ECS"
    elif kind == "difference":
        m = _finite_abs_max(z)
        scale = {"colorscale": "RdBu", "zmid": 0.0, "zmin": -m, "zmax": m}
        title = "Mean ECS, faithful − hallucinated"
        value = "difference"
    else:
        scale = {"colorscale": "RdBu", "zmin": -1.0, "zmax": 1.0}
        title = "Pearson r of ECS with faithfulness (1 − label)"
        value = "r"
    fig = go.Figure(
        go.Heatmap(
            z=z,
            x=[f"H{h}" for h in range(stats.n_heads)],
            y=[f"L{ly}" for ly in range(stats.n_layers)],
            colorbar={"title": value, "thickness": 12},
            hovertemplate=f"layer %{{y}}, head %{{x}}<br>{value} %{{z:.3f}}<extra></extra>",
            hoverongaps=False,
            **scale,
        )
    )
    _mark_heads(fig, marked)
    fig.update_layout(
        title=title,
        xaxis_title="head",
        yaxis_title="layer",
        yaxis={"autorange": "reversed"},
        margin={"l": 50, "r": 10, "t": 50, "b": 40},
        height=_grid_height(stats.n_layers),
        showlegend=False,
    )
    return fig


def pks_figure(stats: HeadStats) -> go.Figure:
    """PKS per layer: the two class means (top) and Pearson r with the label (bottom)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    layers = np.arange(stats.n_layers)
    fig = make_subplots(
        rows=2,
        cols=1,
        shared_xaxes=True,
        row_heights=[0.62, 0.38],
        vertical_spacing=0.08,
    )
    for name, values, color, count in (
        ("faithful", stats.pks_faithful, FAITHFUL_COLOR, stats.n_faithful),
        ("hallucinated", stats.pks_hallucinated, HALLUCINATED_COLOR, stats.n_hallucinated),
    ):
        fig.add_trace(
            go.Scatter(
                x=layers,
                y=values,
                mode="lines+markers",
                name=f"{name} (n = {count})",
                line={"color": color},
                hovertemplate=f"layer %{{x}}<br>{name} mean PKS %{{y:.4f}} bits<extra></extra>",
            ),
            row=1,
            col=1,
        )
    fig.add_trace(
        go.Bar(
            x=layers,
            y=stats.pks_r,
            name="Pearson r with label",
            marker={"color": np.where(np.nan_to_num(stats.pks_r) >= 0, "#d62728", "#1f77b4")},
            hovertemplate="layer %{x}<br>r %{y:.3f}<extra></extra>",
            showlegend=False,
        ),
        row=2,
        col=1,
    )
    fig.update_yaxes(title_text="mean PKS (bits)", row=1, col=1)
    fig.update_yaxes(title_text="r with label", range=[-1, 1], row=2, col=1)
    fig.update_xaxes(title_text="layer", row=2, col=1)
    fig.update_layout(
        title=f"PKS per layer, faithful vs hallucinated {stats.unit}",
        legend={"orientation": "h", "y": 1.02, "yanchor": "bottom", "x": 1, "xanchor": "right"},
        margin={"l": 60, "r": 10, "t": 70, "b": 40},
        height=440,
    )
    return fig


def _finite_range(v: np.ndarray) -> tuple[float, float]:
    f = np.asarray(v, dtype=np.float64)
    f = f[np.isfinite(f)]
    if f.size == 0:
        return 0.0, 1.0
    lo, hi = float(f.min()), float(f.max())
    return (lo, hi) if hi > lo else (lo - 0.5, hi + 0.5)


def _finite_abs_max(v: np.ndarray) -> float:
    f = np.abs(np.asarray(v, dtype=np.float64))
    f = f[np.isfinite(f)]
    m = float(f.max()) if f.size else 0.0
    return m if m > 0 else 1.0


def mean_ecs_figure(grid: np.ndarray, *, title: str) -> go.Figure:
    """A ``[layer, head]`` grid of mean ECS values as a heatmap (NaN cells stay blank):
    one answer's picture (the Learn page, audit reports)."""
    import plotly.graph_objects as go

    n_layers, n_heads = grid.shape
    fig = go.Figure(
        go.Heatmap(
            z=grid,
            x=[f"H{h}" for h in range(n_heads)],
            y=[f"L{ly}" for ly in range(n_layers)],
            colorscale="Viridis",
            colorbar={"title": "ECS"},
            hovertemplate="%{y} %{x}: mean ECS %{z:.3f}<extra></extra>",
        )
    )
    fig.update_layout(
        title=title,
        height=_grid_height(n_layers),
        margin={"l": 10, "r": 10, "t": 50, "b": 30},
        yaxis={"autorange": "reversed"},
    )
    return fig


def _grid_height(n_layers: int) -> int:
    return int(min(max(260, 18 * n_layers + 110), 720))


def _mark_heads(fig: go.Figure, heads: Sequence[Head], *, name: str = "marked") -> None:
    import plotly.graph_objects as go

    if not heads:
        return
    fig.add_trace(
        go.Scatter(
            x=[f"H{h}" for _, h in heads],
            y=[f"L{ly}" for ly, _ in heads],
            mode="markers",
            marker={"symbol": "circle-open", "color": "black", "size": 9, "line": {"width": 1.5}},
            name=name,
            hoverinfo="skip",
            showlegend=False,
        )
    )


# --------------------------------------------------------------------------- one answer


def _passage_bounds(fig: go.Figure, view: HeadView) -> None:
    """Dotted lines between the passages, each named at its top."""
    for start, label in view.context_bounds():
        if start > 0:
            fig.add_vline(x=start - 0.5, line={"color": "white", "dash": "dot", "width": 1})
        fig.add_annotation(
            x=start,
            y=1.0,
            yref="paper",
            yanchor="bottom",
            xanchor="left",
            text=label,
            showarrow=False,
            font={"size": 11},
        )


def attention_figure(view: HeadView, head: Head, *, max_ticks: int = 80) -> go.Figure:
    """Answer tokens x context tokens heatmap of ``head``'s attention.

    The positions token ECS averages are marked; dotted lines separate passages.
    Tick labels are the token texts (thinned to about ``max_ticks`` per axis); the
    hover names both tokens.
    """
    import plotly.graph_objects as go

    layer, h = view.check_head(head)
    z = view.attention[layer, h]  # [resp, ctx]
    resp = [visible_text(t) for t in view.response_tokens]
    ctx = [visible_text(t) for t in view.context_tokens]
    n_t, n_c = z.shape
    custom = np.empty((n_t, n_c, 2), dtype=object)
    custom[:, :, 0] = np.asarray(resp, dtype=object)[:, None]
    custom[:, :, 1] = np.asarray(ctx, dtype=object)[None, :]
    fig = go.Figure(
        go.Heatmap(
            z=z,
            x=np.arange(n_c),
            y=np.arange(n_t),
            customdata=custom,
            colorscale="Viridis",
            zmin=0.0,
            colorbar={"title": "attention", "thickness": 12},
            hovertemplate=(
                "answer token %{y}: %{customdata[0]}<br>context token %{x}: "
                "%{customdata[1]}<br>attention %{z:.4f}<extra></extra>"
            ),
        )
    )
    index = {int(p): i for i, p in enumerate(view.context)}
    tops = view.top_positions[layer, h]  # [resp, k]
    if tops.size:
        fig.add_trace(
            go.Scatter(
                x=[index[int(p)] for p in tops.ravel()],
                y=np.repeat(np.arange(n_t), tops.shape[1]),
                mode="markers",
                marker={"symbol": "square-open", "color": "#ff4b4b", "size": 6},
                name=f"top-{view.k} for ECS",
                hoverinfo="skip",
            )
        )
    _passage_bounds(fig, view)
    step_x = max(1, math.ceil(n_c / max_ticks))
    step_y = max(1, math.ceil(n_t / max_ticks))
    fig.update_xaxes(
        title_text="context tokens",
        tickmode="array",
        tickvals=list(range(0, n_c, step_x)),
        ticktext=ctx[::step_x],
        tickangle=-90,
        tickfont={"size": 9},
    )
    fig.update_yaxes(
        title_text="answer tokens",
        tickmode="array",
        tickvals=list(range(0, n_t, step_y)),
        ticktext=resp[::step_y],
        tickfont={"size": 9},
        autorange="reversed",
    )
    fig.update_layout(
        title={"text": f"Attention of L{layer}H{h}: answer → context", "y": 0.98},
        height=int(min(max(360, 14 * n_t + 220), 1000)),
        margin={"l": 90, "r": 10, "t": 70, "b": 110},
        legend={"orientation": "h", "y": 1.0, "yanchor": "bottom", "x": 1, "xanchor": "right"},
    )
    return fig


def beta_words(beta: float) -> str:
    """What ReDeEP's chosen ``beta`` means for the score, in words."""
    if not math.isfinite(beta):
        return "its β is not recorded"
    if beta == 0:
        return (
            "β = 0: the search on validation answers gave the heads' ECS (copying from "
            "the passages) no weight, so the score follows the layers' PKS (the model's "
            "own knowledge pushing into the answer) alone"
        )
    return (
        f"β = {beta:.2f}: each unit of the heads' ECS (copying from the passages) "
        f"counts against {beta:.2f} units of the layers' PKS (the model's own knowledge)"
    )
