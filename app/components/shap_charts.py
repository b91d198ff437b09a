"""SHAP charts of the ``spad`` detector and the seven-source views of SPAD (plotly).

Every function here is pure: a :class:`~core.analysis.shap_values.ShapResult` (or a ``[T, 7]``
source split) in, a ``go.Figure`` out; the numbers come from :mod:`core.analysis.shap_values`.
Plotly only (never matplotlib's global state, never ``show()``):

- :func:`summary_figure`: a beeswarm per feature (points = examples, x = SHAP
  value, colour = the feature's value from low to high), the top features by mean
  ``|SHAP|``;
- :func:`bar_figure`: mean ``|SHAP|`` per feature;
- :func:`grid_figure`: the 7 sources x 18 POS tags grid of mean SHAP;
- :func:`waterfall_figure`: one answer's top contributions, from the base value to
  its margin (``go.Waterfall``);
- :func:`token_sources_figure` / :func:`pos_sources_figure`: the seven sources of
  each answer token (or their mean per POS tag) as stacked bars.

Positive SHAP values push towards "hallucinated" and are drawn red; negative ones
blue, as in shap's own plots.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from core.analysis.shap_values import GridKind, ShapResult, pos_means
from core.base.words import plural
from core.signals.attribution import POS_TAGS, SOURCES

if TYPE_CHECKING:
    import plotly.graph_objects as go
    from jaxtyping import Float

POSITIVE_COLOR = "#ff0051"
"""Pushes towards "hallucinated" (shap's red)."""
NEGATIVE_COLOR = "#008bfb"
"""Pushes towards "faithful" (shap's blue)."""
VALUE_SCALE: tuple[tuple[float, str], ...] = ((0.0, NEGATIVE_COLOR), (1.0, POSITIVE_COLOR))
"""Feature value from low (blue) to high (red), as shap's beeswarm colours it."""
CONSTANT_COLOR = "#9a9a9a"
SOURCE_COLORS: dict[str, str] = {
    "Query": "#8e6bbf",
    "RAG": "#2a9d8f",
    "Past": "#e9c46a",
    "Self": "#f4a261",
    "FFN": "#e76f51",
    "LN": "#6c757d",
    "Init": "#264653",
}
"""One colour per SPAD source (stacked bars, legends)."""
GOLD_FILL = "rgba(31, 79, 209, 0.13)"
"""Band behind tokens inside a gold hallucination span (the app's gold blue, faint)."""
GOLD_LINE = "#1f4fd1"


# --------------------------------------------------------------------------- SHAP


def _swarm_points(
    result: ShapResult, idx: Sequence[int], labels: Sequence[bool | None] | None
) -> tuple[list[float], list[float], list[float], list[str], list[float], list[float], list[str]]:
    """The beeswarm's points: x, y, colour and hover of the varying features' points,
    then x, y and hover of the constant features' points (drawn grey)."""
    xs: list[float] = []
    ys: list[float] = []
    colors: list[float] = []
    texts: list[str] = []
    constant_x: list[float] = []
    constant_y: list[float] = []
    constant_t: list[str] = []
    gold = {True: "hallucinated", False: "faithful", None: "unlabelled"}
    for row, k in enumerate(idx):
        v = result.values[:, k]
        d = result.data[:, k]
        jitter = swarm_offsets(v)
        lo, hi = np.percentile(d, [5, 95])
        if hi <= lo:
            lo, hi = float(d.min()), float(d.max())
        for i in range(len(v)):
            tip = (
                f"{result.names[k]}<br>example {result.example_ids[i]}"
                + (f" ({gold[labels[i]]})" if labels is not None else "")
                + f"<br>value {d[i]:.4g}<br>SHAP {v[i]:+.4f}"
            )
            if hi > lo:
                xs.append(float(v[i]))
                ys.append(row + float(jitter[i]))
                colors.append(float(np.clip((d[i] - lo) / (hi - lo), 0.0, 1.0)))
                texts.append(tip)
            else:
                constant_x.append(float(v[i]))
                constant_y.append(row + float(jitter[i]))
                constant_t.append(tip)
    return xs, ys, colors, texts, constant_x, constant_y, constant_t


def summary_figure(
    result: ShapResult, top: int = 20, *, labels: Sequence[bool | None] | None = None
) -> go.Figure:
    """Beeswarm of the ``top`` features: one row per feature, one point per example.

    x is the SHAP value, the colour the feature's value relative to its range over
    these examples (5th to 95th percentile, as shap does; grey when constant).

    Args:
        result: The SHAP values to draw.
        top: How many features (largest mean ``|SHAP|`` first, at the top).
        labels: Optional gold label per example, shown in the hover.
    """
    import plotly.graph_objects as go

    idx = result.top(top)
    xs, ys, colors, texts, constant_x, constant_y, constant_t = _swarm_points(result, idx, labels)
    fig = go.Figure()
    fig.add_trace(
        go.Scatter(
            x=xs,
            y=ys,
            mode="markers",
            name="examples",
            marker={
                "color": colors,
                "colorscale": [list(s) for s in VALUE_SCALE],
                "cmin": 0.0,
                "cmax": 1.0,
                "size": 7,
                "opacity": 0.85,
                "line": {"width": 0},
                "colorbar": {
                    "title": {"text": "feature value", "side": "right"},
                    "tickvals": [0, 1],
                    "ticktext": ["low", "high"],
                    "thickness": 10,
                    "len": 0.6,
                },
            },
            hovertext=texts,
            hoverinfo="text",
            showlegend=False,
        )
    )
    if constant_x:
        fig.add_trace(
            go.Scatter(
                x=constant_x,
                y=constant_y,
                mode="markers",
                name="constant feature",
                marker={"color": CONSTANT_COLOR, "size": 7, "opacity": 0.85},
                hovertext=constant_t,
                hoverinfo="text",
                showlegend=False,
            )
        )
    fig.add_vline(x=0.0, line={"color": "#888888", "width": 1})
    fig.update_layout(
        title={
            "text": f"SHAP values of the top {len(idx)} {plural(len(idx), 'feature')} "
            f"({len(result)} {plural(len(result), 'answer')})"
        },
        height=int(max(260, 30 * len(idx) + 120)),
        margin={"l": 10, "r": 10, "t": 50, "b": 40},
        xaxis={"title": {"text": "SHAP value (log-odds; > 0 pushes towards hallucinated)"}},
        yaxis={
            "tickvals": list(range(len(idx))),
            "ticktext": [result.names[k] for k in idx],
            "autorange": "reversed",
            "automargin": True,
            "showgrid": True,
            "zeroline": False,
        },
        plot_bgcolor="#ffffff",
    )
    return fig


def bar_figure(result: ShapResult, top: int = 20) -> go.Figure:
    """Horizontal bars of mean ``|SHAP|`` for the ``top`` features (largest on top)."""
    import plotly.graph_objects as go

    idx = result.top(top)
    mean = result.values.mean(0)
    fig = go.Figure(
        go.Bar(
            x=[float(result.mean_abs[k]) for k in idx],
            y=[result.names[k] for k in idx],
            orientation="h",
            marker={"color": [POSITIVE_COLOR if mean[k] >= 0 else NEGATIVE_COLOR for k in idx]},
            customdata=[[float(mean[k])] for k in idx],
            hovertemplate="%{y}<br>mean |SHAP| %{x:.4f}<br>mean SHAP %{customdata[0]:+.4f}"
            "<extra></extra>",
        )
    )
    fig.update_layout(
        title={"text": f"Mean |SHAP| of the top {len(idx)} features"},
        height=int(max(260, 24 * len(idx) + 110)),
        margin={"l": 10, "r": 10, "t": 50, "b": 40},
        xaxis={"title": {"text": "mean |SHAP value| (log-odds)"}},
        yaxis={"autorange": "reversed", "automargin": True},
        plot_bgcolor="#ffffff",
    )
    return fig


def grid_figure(result: ShapResult, kind: GridKind = "mean") -> go.Figure:
    """The 7 sources x 18 POS tags heatmap of mean SHAP (or mean ``|SHAP|``)."""
    import plotly.graph_objects as go

    z = result.grid(kind)
    if kind == "mean":
        m = float(np.abs(z).max()) or 1.0
        scale: dict[str, Any] = {
            "colorscale": [[0.0, NEGATIVE_COLOR], [0.5, "#ffffff"], [1.0, POSITIVE_COLOR]],
            "zmid": 0.0,
            "zmin": -m,
            "zmax": m,
        }
        what, title = "mean SHAP", "Mean SHAP value by source and part of speech"
    else:
        scale = {
            "colorscale": [[0.0, "#ffffff"], [1.0, "#5b2a86"]],
            "zmin": 0.0,
            "zmax": float(z.max()) or 1.0,
        }
        what, title = "mean |SHAP|", "Mean |SHAP value| by source and part of speech"
    fig = go.Figure(
        go.Heatmap(
            z=z,
            x=list(POS_TAGS),
            y=list(SOURCES),
            colorbar={"title": {"text": what}, "thickness": 12},
            hovertemplate=f"%{{y}}_%{{x}}<br>{what} %{{z:+.4f}}<extra></extra>",
            xgap=1,
            ygap=1,
            **scale,
        )
    )
    fig.update_layout(
        title={"text": f"{title} ({len(result)} {plural(len(result), 'answer')})"},
        height=340,
        margin={"l": 10, "r": 10, "t": 50, "b": 40},
        xaxis={"title": {"text": "part of speech"}, "side": "bottom"},
        yaxis={"title": {"text": "source"}, "autorange": "reversed"},
        plot_bgcolor="#ffffff",
    )
    return fig


def waterfall_figure(result: ShapResult, i: int = 0, top: int = 10) -> go.Figure:
    """Answer ``i``'s SHAP waterfall: base value, its ``top`` contributions by ``|SHAP|``,
    the rest summed, and the margin it ends at (with the score ``sigmoid(margin)``)."""
    import plotly.graph_objects as go

    v = result.values[i]
    order = [int(k) for k in np.argsort(-np.abs(v), kind="stable")[: max(0, top)]]
    rest = [k for k in range(v.shape[0]) if k not in set(order)]
    labels = ["base value"]
    measures = ["absolute"]
    amounts = [result.base]
    texts = [f"{result.base:+.3f}"]
    for k in order:
        labels.append(f"{result.names[k]} = {result.data[i, k]:.3g}")
        measures.append("relative")
        amounts.append(float(v[k]))
        texts.append(f"{v[k]:+.3f}")
    if rest:
        other = float(v[rest].sum())
        labels.append(f"{len(rest)} other features")
        measures.append("relative")
        amounts.append(other)
        texts.append(f"{other:+.3f}")
    margin = float(result.margins[i])
    labels.append("margin f(x)")
    measures.append("total")
    amounts.append(margin)
    texts.append(f"{margin:+.3f}")
    fig = go.Figure(
        go.Waterfall(
            orientation="h",
            y=labels,
            x=amounts,
            measure=measures,
            text=texts,
            textposition="outside",
            increasing={"marker": {"color": POSITIVE_COLOR}},
            decreasing={"marker": {"color": NEGATIVE_COLOR}},
            totals={"marker": {"color": "#555555"}},
            connector={"line": {"color": "#b0b0b0", "width": 1}},
            hovertemplate="%{y}<br>%{text}<extra></extra>",
        )
    )
    score = float(result.scores[i])
    lo = min(0.0, *np.cumsum(amounts[:-1]), margin)
    hi = max(0.0, *np.cumsum(amounts[:-1]), margin)
    pad = 0.18 * (hi - lo or 1.0)
    fig.update_layout(
        title={
            "text": f"SHAP waterfall of {result.example_ids[i]}: margin {margin:+.3f} "
            f"(score {score:.3f})"
        },
        height=int(max(300, 30 * len(labels) + 110)),
        margin={"l": 10, "r": 10, "t": 50, "b": 40},
        xaxis={
            "title": {"text": "log-odds of hallucinated"},
            "range": [lo - pad, hi + pad],
        },
        yaxis={"autorange": "reversed", "type": "category", "automargin": True},
        plot_bgcolor="#ffffff",
        showlegend=False,
    )
    return fig


def swarm_offsets(x: np.ndarray, *, bins: int = 60, width: float = 0.38) -> np.ndarray:
    """Vertical offsets that spread points with close x values (a simple beeswarm).

    Points are binned by x; within a bin they take alternating offsets 0, +d, -d,
    +2d, ... in x order, scaled so the widest bin spans at most ``±width``.

    Args:
        x: ``[n]`` the values along the axis.
        bins: Bins over the range of ``x``.
        width: Largest offset (a row is 1 apart from the next).

    Returns:
        ``[n]`` offsets, deterministic.
    """
    x = np.asarray(x, dtype=np.float64).reshape(-1)
    n = x.shape[0]
    out = np.zeros(n, dtype=np.float64)
    if n < 2:
        return out
    span = float(x.max() - x.min())
    which = (
        np.zeros(n, dtype=np.int64)
        if span <= 0
        else np.minimum(((x - x.min()) / span * bins).astype(np.int64), bins - 1)
    )
    rank = np.zeros(n, dtype=np.int64)
    for b in np.unique(which):
        members = np.flatnonzero(which == b)
        members = members[np.argsort(x[members], kind="stable")]
        rank[members] = np.arange(members.shape[0])
    # 0, 1, -1, 2, -2, ...
    steps = np.where(rank % 2 == 1, (rank + 1) // 2, -(rank // 2)).astype(np.float64)
    biggest = float(np.abs(steps).max())
    if biggest > 0:
        out = steps * min(width / biggest, 0.08)
    return out


# --------------------------------------------------------------------------- token sources


def _tick(token: str) -> str:
    """A short, visible tick label for a token (spaces dropped, newline as ↵)."""
    t = token.replace("\n", "↵").replace("\t", "⇥").strip()
    return t if t else "␣"


def _gold_bands(fig: go.Figure, labels: Sequence[int] | None) -> int:
    """Shade the columns of gold-span tokens; returns how many were marked."""
    if labels is None:
        return 0
    marked = 0
    j = 0
    lab = [int(v) for v in labels]
    while j < len(lab):
        if lab[j] == 1:
            k = j
            while k + 1 < len(lab) and lab[k + 1] == 1:
                k += 1
            fig.add_vrect(
                x0=j - 0.5,
                x1=k + 0.5,
                fillcolor=GOLD_FILL,
                line={"width": 0},
                layer="below",
            )
            marked += k - j + 1
            j = k + 1
        else:
            j += 1
    return marked


def _token_customdata(
    v: Float[np.ndarray, "resp 7"],
    tokens: Sequence[str],
    pos: Sequence[str],
    labels: Sequence[int] | None,
) -> np.ndarray:
    """The ``[T, 7 + 4]`` hover data: token, tag, the seven sources, ``P_final``, gold."""
    t = len(tokens)
    gold = (
        ["inside a gold span" if int(labels[j]) == 1 else "outside" for j in range(t)]
        if labels is not None
        else ["n/a"] * t
    )
    custom = np.empty((t, len(SOURCES) + 4), dtype=object)
    custom[:, 0] = [repr(tok) for tok in tokens]
    custom[:, 1] = list(pos)
    custom[:, 2 : 2 + len(SOURCES)] = v
    custom[:, 2 + len(SOURCES)] = v.sum(1)
    custom[:, 3 + len(SOURCES)] = gold
    return custom


def _gold_marker_row(fig: go.Figure, v: Float[np.ndarray, "resp 7"], labels: Sequence[int]) -> None:
    """A marker row under the bars names the gold tokens (and gives the legend entry)."""
    import plotly.graph_objects as go

    p_final = v.sum(1)
    lo = float(min(0.0, np.minimum(v, 0).sum(1).min()))
    hi = float(max(p_final.max(), np.maximum(v, 0).sum(1).max(), 1e-12))
    y_mark = lo - 0.06 * (hi - lo)
    gold_idx = [j for j in range(len(labels)) if int(labels[j]) == 1]
    fig.add_trace(
        go.Scatter(
            x=gold_idx,
            y=[y_mark] * len(gold_idx),
            mode="markers",
            name="gold hallucination span",
            marker={"symbol": "triangle-up", "color": GOLD_LINE, "size": 8},
            hovertemplate="inside a gold hallucination span<extra></extra>",
        )
    )


def _source_traces(fig: go.Figure, v: Float[np.ndarray, "resp 7"], custom: np.ndarray) -> None:
    """One bar trace per source, then the ``P_final`` diamonds."""
    import plotly.graph_objects as go

    x = np.arange(len(v))
    rows = "<br>".join(f"{s}: %{{customdata[{2 + i}]:+.4g}}" for i, s in enumerate(SOURCES))
    for i, s in enumerate(SOURCES):
        fig.add_trace(
            go.Bar(
                x=x,
                y=v[:, i],
                name=s,
                marker={"color": SOURCE_COLORS[s], "line": {"width": 0}},
                customdata=custom,
                hovertemplate=(
                    f"<b>%{{customdata[0]}}</b> · %{{customdata[1]}} · <b>{s}</b><br>"
                    f"{rows}<br>P_final: %{{customdata[{2 + len(SOURCES)}]:.4g}}"
                    f"<br>gold: %{{customdata[{3 + len(SOURCES)}]}}<extra></extra>"
                ),
            )
        )
    fig.add_trace(
        go.Scatter(
            x=x,
            y=v.sum(1),
            mode="markers",
            name="P_final (sum)",
            marker={"symbol": "diamond", "color": "#111111", "size": 7},
            customdata=custom,
            hovertemplate="<b>%{customdata[0]}</b> · %{customdata[1]}<br>P_final: %{y:.4g}"
            f"<br>{rows}<extra></extra>",
        )
    )


def token_sources_figure(
    values: Float[np.ndarray, "resp 7"],
    tokens: Sequence[str],
    pos: Sequence[str],
    *,
    labels: Sequence[int] | None = None,
    title: str | None = None,
) -> go.Figure:
    """Stacked bars of the seven sources of every answer token, with ``P_final`` marked.

    Positive parts stack up from 0 and negative ones down, so each column's net height
    is the token's final probability (black diamond). Tokens inside a gold span sit on
    a shaded band, and a row of markers under the axis names them.

    Args:
        values: ``[T, 7]`` the split, columns :data:`~core.signals.attribution.SOURCES`.
        tokens: The ``T`` token texts.
        pos: The ``T`` POS tags.
        labels: Optional ``[T]`` gold labels (1 = inside a hallucinated span).
        title: Figure title (default names the token count).

    Raises:
        ValueError: The lengths differ or ``values`` is not ``[T, 7]``.
    """
    import plotly.graph_objects as go

    v = np.asarray(values, dtype=np.float64)
    t = len(tokens)
    if v.shape != (t, len(SOURCES)) or len(pos) != t or (labels is not None and len(labels) != t):
        raise ValueError(
            f"need [T, {len(SOURCES)}] values with T tokens, tags (and labels); got "
            f"{v.shape}, {t} tokens, {len(pos)} tags"
            + (f", {len(labels)} labels" if labels is not None else "")
        )
    x = np.arange(t)
    custom = _token_customdata(v, tokens, pos, labels)
    fig = go.Figure()
    _source_traces(fig, v, custom)
    marked = _gold_bands(fig, labels)
    if labels is not None and marked:
        _gold_marker_row(fig, v, labels)
    fig.update_layout(
        barmode="relative",
        title={"text": title or f"Seven sources of each answer token's probability ({t} tokens)"},
        height=480,
        margin={"l": 10, "r": 10, "t": 60, "b": 20},
        xaxis={
            "tickvals": x.tolist(),
            "ticktext": [_tick(tok) for tok in tokens],
            "tickangle": -60,
            "automargin": True,
            "tickfont": {"size": 11 if t <= 60 else 9},
            "range": [-0.6, t - 0.4],
        },
        yaxis={"title": {"text": "share of P(token)"}, "zeroline": True, "zerolinecolor": "#888"},
        legend={"orientation": "h", "yanchor": "bottom", "y": 1.0, "xanchor": "left", "x": 0.0},
        bargap=0.15,
        plot_bgcolor="#ffffff",
        hoverlabel={"align": "left"},
    )
    return fig


def pos_sources_figure(
    values: Float[np.ndarray, "resp 7"],
    pos: Sequence[str],
    *,
    title: str | None = None,
) -> go.Figure:
    """Stacked bars of the mean seven-vector per POS tag (the spad features of this answer)."""
    import plotly.graph_objects as go

    tags, means, counts = pos_means(values, pos)
    x = [f"{t} ({n})" for t, n in zip(tags, counts, strict=True)]
    total = means.sum(1) if len(tags) else np.zeros(0)
    custom = np.empty((len(tags), len(SOURCES) + 3), dtype=object)
    if len(tags):
        custom[:, 0] = tags
        custom[:, 1] = counts
        custom[:, 2 : 2 + len(SOURCES)] = means
        custom[:, 2 + len(SOURCES)] = total
    rows = "<br>".join(f"{s}: %{{customdata[{2 + i}]:+.4g}}" for i, s in enumerate(SOURCES))
    fig = go.Figure()
    for i, s in enumerate(SOURCES):
        fig.add_trace(
            go.Bar(
                x=x,
                y=means[:, i] if len(tags) else [],
                name=s,
                marker={"color": SOURCE_COLORS[s], "line": {"width": 0}},
                customdata=custom,
                hovertemplate=(
                    f"<b>%{{customdata[0]}}</b> · %{{customdata[1]}} tokens · <b>{s}</b><br>"
                    f"{rows}<br>mean P_final: %{{customdata[{2 + len(SOURCES)}]:.4g}}"
                    "<extra></extra>"
                ),
            )
        )
    fig.add_trace(
        go.Scatter(
            x=x,
            y=total,
            mode="markers",
            name="mean P_final",
            marker={"symbol": "diamond", "color": "#111111", "size": 8},
            hovertemplate="%{x}<br>mean P_final: %{y:.4g}<extra></extra>",
        )
    )
    fig.update_layout(
        barmode="relative",
        title={
            "text": title
            or f"Mean of the seven sources per part of speech ({len(tags)} tags, tokens in brackets)"
        },
        height=440,
        margin={"l": 10, "r": 10, "t": 60, "b": 10},
        xaxis={"title": {"text": "part of speech (tokens)"}, "automargin": True},
        yaxis={"title": {"text": "mean share of P(token)"}, "zerolinecolor": "#888"},
        legend={"orientation": "h", "yanchor": "bottom", "y": 1.0, "xanchor": "left", "x": 0.0},
        bargap=0.25,
        plot_bgcolor="#ffffff",
        hoverlabel={"align": "left"},
    )
    return fig
