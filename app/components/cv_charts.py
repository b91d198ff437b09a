"""Cross-validation and cross-domain charts for the Benchmark (plotly).

Every function here is pure: saved runs (:class:`~core.evaluation.cv_run.CVRun`,
:class:`~core.evaluation.matrix.MatrixRun`) in, a ``go.Figure`` out, so what the page
shows is tested without Streamlit. The frames and tables of the same runs are in
:mod:`app.components.cv_tables`.

Names in figures (runs, detectors, datasets, generators) come from saved files; plotly
reads a few HTML tags (links included) in its text, so they enter a figure through
:func:`~app.components.charts.plain` and never into a hover template's own text.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from app.components.charts import GUIDE_COLOR, PALETTE, plain
from app.components.cv_tables import (
    MATRIX_METRICS,
    MISSING,
    _ci,
    _matrix_cell,
    _nan_to_none,
    _num,
    fmt,
    fmt_ci,
    series_name,
)
from core.base.words import plural
from core.evaluation.comparison import p_text
from core.evaluation.cv_run import CVRun
from core.evaluation.matrix import MatrixRun
from core.learning.calibration import Reliability

if TYPE_CHECKING:
    import plotly.graph_objects as go

FOLD_COLOR = "#6c8ebf"
POOLED_COLOR = "#1d2b4f"

# Chance is 0.5 for AUROC and balanced accuracy: red below, blue above.
DIVERGING_SCALE: tuple[tuple[float, str], ...] = (
    (0.0, "#c44e52"),
    (0.5, "#f4f4f4"),
    (1.0, "#2f5fb3"),
)
SEQUENTIAL_SCALE: tuple[tuple[float, str], ...] = ((0.0, "#f4f6fb"), (1.0, "#2f5fb3"))


# --------------------------------------------------------------------------- CV figures


def _error_bar(v: float | None, lo: float | None, hi: float | None) -> tuple[float, float]:
    """Plotly's asymmetric error bar of value ``v`` with interval ``[lo, hi]``: the
    lengths above and below (0 where undefined)."""
    if v is None:
        return 0.0, 0.0
    return (hi - v if hi is not None else 0.0), (v - lo if lo is not None else 0.0)


def _layout(fig: go.Figure, title: str, height: int) -> None:
    fig.update_layout(
        title={"text": title, "x": 0.0, "xanchor": "left"},
        template="plotly_white",
        height=height,
        margin={"l": 10, "r": 10, "t": 40, "b": 10},
        hovermode="closest",
    )


@dataclass(frozen=True, kw_only=True)
class _FoldPoints:
    """The points of :func:`fold_spread_figure`.

    Attributes:
        names: One row per (run ·) detector, in order.
        x: Each fold's AUROC (folds with one class only left out).
        y: The row of each fold's point.
        data: Each fold's ``[fold, n, n_positive]`` (its hover).
        pooled: Each row's pooled out-of-fold AUROC.
        plus: The length of its error bar above.
        minus: The length of its error bar below.
    """

    names: list[str]
    x: list[float]
    y: list[str]
    data: list[list[Any]]
    pooled: list[float | None]
    plus: list[float]
    minus: list[float]


def _fold_points(runs: Sequence[CVRun]) -> _FoldPoints:
    """Every fold's AUROC and every (run ·) detector's pooled AUROC with its CI."""
    compare = len(runs) > 1
    names: list[str] = []
    fx: list[float] = []
    fy: list[str] = []
    fdata: list[list[Any]] = []
    px: list[float | None] = []
    plus: list[float] = []
    minus: list[float] = []
    for run in runs:
        for r in run.results:
            name = plain(series_name(run, r.detector, compare))
            names.append(name)
            for f in r.folds:
                v = _num(f.get("auroc"))
                if v is not None:
                    fx.append(v)
                    fy.append(name)
                    fdata.append([f.get("fold"), f.get("n"), f.get("n_positive")])
            p = _num(r.pooled.get("auroc"))
            lo, hi = _ci(r.pooled.get("auroc_ci"))
            px.append(p)
            up, down = _error_bar(p, lo, hi)
            plus.append(up)
            minus.append(down)
    return _FoldPoints(names=names, x=fx, y=fy, data=fdata, pooled=px, plus=plus, minus=minus)


def _fold_range(pts: _FoldPoints) -> tuple[float, float]:
    """The x range of :func:`fold_spread_figure`: every point, error bar and chance."""
    px, plus, minus = pts.pooled, pts.plus, pts.minus
    values = [v for v in [*pts.x, *px] if v is not None]
    values += [p + d for p, d in zip(px, plus, strict=True) if p is not None]
    values += [p - d for p, d in zip(px, minus, strict=True) if p is not None]
    lo_x = max(0.0, min([0.5, *values]) - 0.04)
    hi_x = min(1.0, max([0.5, *values]) + 0.04)
    return lo_x, hi_x


def fold_spread_figure(runs: Sequence[CVRun]) -> go.Figure:
    """Per (run ·) detector: each fold's AUROC as an open circle and the pooled
    out-of-fold AUROC as a diamond with its 95% CI, on one row, over the chance line.

    Rows are categorical (first detector on top); a fold with one class only has no
    AUROC and no point.
    """
    import plotly.graph_objects as go

    pts = _fold_points(runs)
    names, px, plus, minus = pts.names, pts.pooled, pts.plus, pts.minus
    fig = go.Figure()
    fig.add_trace(
        go.Scatter(
            x=pts.x,
            y=pts.y,
            mode="markers",
            name="AUROC of each fold",
            marker={
                "symbol": "circle-open",
                "size": 11,
                "color": FOLD_COLOR,
                "line": {"width": 2},
            },
            customdata=pts.data,
            hovertemplate=(
                "<b>%{y}</b><br>fold %{customdata[0]}: AUROC %{x:.3f}"
                "<br>%{customdata[1]} answers, %{customdata[2]} hallucinated<extra></extra>"
            ),
        )
    )
    fig.add_trace(
        go.Scatter(
            x=px,
            y=names,
            mode="markers",
            name="pooled out-of-fold AUROC, 95% CI",
            marker={"symbol": "diamond", "size": 13, "color": POOLED_COLOR},
            error_x={
                "type": "data",
                "symmetric": False,
                "array": plus,
                "arrayminus": minus,
                "color": POOLED_COLOR,
                "thickness": 2,
                "width": 6,
            },
            hovertemplate="<b>%{y}</b><br>pooled AUROC %{x:.3f}<extra></extra>",
        )
    )
    lo_x, hi_x = _fold_range(pts)
    fig.add_vline(x=0.5, line={"dash": "dash", "color": GUIDE_COLOR, "width": 1})
    _layout(fig, "AUROC of each fold and pooled", 150 + 46 * max(len(names), 1))
    # Beside the title: below the axes it would crowd the axis title.
    fig.update_layout(
        legend={"orientation": "h", "yanchor": "bottom", "y": 1.0, "xanchor": "right", "x": 1.0}
    )
    fig.update_xaxes(title="AUROC (dashed: chance)", range=[lo_x, hi_x], zeroline=False)
    fig.update_yaxes(
        type="category",
        categoryorder="array",
        categoryarray=names,
        autorange="reversed",
        showgrid=True,
    )
    return fig


COMPARISONS: dict[str, str] = {"vs_best": "the best detector", "vs_length": "answer length"}
"""Key of a row of :attr:`~core.evaluation.cv_run.CVRun.comparisons` -> what it is compared with."""
COMPARISON_COLORS = {"vs_best": POOLED_COLOR, "vs_length": "#dd8452"}


def comparison_figure(run: CVRun) -> go.Figure:
    """A forest plot: per detector, its AUROC minus the best detector's and minus answer
    length's, each a dot with its 95% CI; right of the dashed zero line is better."""
    import plotly.graph_objects as go

    c = run.comparisons
    rows = c.get("rows") or {}
    names = [plain(d) for d in rows]
    fig = go.Figure()
    for key, what in COMPARISONS.items():
        if key == "vs_best":
            what = f"{what} ({plain(str(c.get('reference')))})"
        x: list[float | None] = []
        plus: list[float] = []
        minus: list[float] = []
        pvals: list[str] = []
        for row in rows.values():
            v = row.get(key) or {}
            d = _num(v.get("delta"))
            lo, hi = _ci(v.get("ci"))
            x.append(d)
            up, down = _error_bar(d, lo, hi)
            plus.append(up)
            minus.append(down)
            p = _num(v.get("p"))
            pvals.append(MISSING if p is None else p_text(p))
        fig.add_trace(
            go.Scatter(
                x=x,
                y=names,
                orientation="h",  # grouped along y: the two bars of a detector sit apart
                offsetgroup=key,
                mode="markers",
                name=f"Δ AUROC vs {what}, 95% CI",
                marker={"size": 11, "color": COMPARISON_COLORS[key]},
                error_x={
                    "type": "data",
                    "symmetric": False,
                    "array": plus,
                    "arrayminus": minus,
                    "color": COMPARISON_COLORS[key],
                    "thickness": 2,
                    "width": 5,
                },
                customdata=pvals,
                hovertemplate=(
                    f"<b>%{{y}}</b><br>Δ AUROC vs {what}: %{{x:+.3f}}"
                    "<br>p = %{customdata}<extra></extra>"
                ),
            )
        )
    fig.add_vline(x=0.0, line={"dash": "dash", "color": GUIDE_COLOR, "width": 1})
    _layout(fig, "AUROC differences on the same answers", 150 + 46 * max(len(names), 1))
    fig.update_layout(
        legend={"orientation": "h", "yanchor": "bottom", "y": 1.0, "xanchor": "right", "x": 1.0},
        scattermode="group",
        scattergap=0.45,
    )
    fig.update_xaxes(title="Δ AUROC (dashed: no difference)", zeroline=False)
    fig.update_yaxes(
        type="category",
        categoryorder="array",
        categoryarray=names,
        autorange="reversed",
        showgrid=True,
    )
    return fig


def reliability_figure(series: Mapping[str, Reliability]) -> go.Figure:
    """Reliability diagram: per series, each bin's mean predicted probability (x) against
    the share of its answers that are hallucinated (y), the marker's area growing with
    the bin's answers; ECE in the legend; the diagonal is perfect calibration.

    Empty bins are ``None`` (no marker); the line joins the bins that hold answers.
    """
    import plotly.graph_objects as go

    fig = go.Figure(
        go.Scatter(
            x=[0, 1],
            y=[0, 1],
            mode="lines",
            name="perfectly calibrated",
            line={"dash": "dash", "color": GUIDE_COLOR, "width": 1},
            hoverinfo="skip",
        )
    )
    most = max((int(np.max(r.counts)) for r in series.values() if len(r.counts)), default=1)
    for k, (name, rel) in enumerate(series.items()):
        counts = np.asarray(rel.counts, dtype=np.int64)
        sizes = [0.0 if c == 0 else 7.0 + 23.0 * math.sqrt(c / max(most, 1)) for c in counts]
        fig.add_trace(
            go.Scatter(
                x=_nan_to_none(rel.mean_predicted),
                y=_nan_to_none(rel.observed),
                mode="lines+markers",
                connectgaps=True,
                name=f"{plain(name)} (ECE {rel.ece:.3f})",
                line={"color": PALETTE[k % len(PALETTE)], "width": 1.5},
                marker={
                    "size": sizes,
                    "color": PALETTE[k % len(PALETTE)],
                    "opacity": 0.8,
                    "line": {"color": "white", "width": 1},
                },
                customdata=[
                    [float(rel.edges[i]), float(rel.edges[i + 1]), int(c)]
                    for i, c in enumerate(counts)
                ],
                hovertemplate=(
                    "<b>%{fullData.name}</b><br>bin %{customdata[0]:.1f}–"
                    "%{customdata[1]:.1f}: %{customdata[2]} answers"
                    "<br>mean predicted %{x:.3f} · observed %{y:.3f}<extra></extra>"
                ),
            )
        )
    # Tall enough for a square plot of useful size above the legend.
    _layout(fig, "Reliability of the calibrated out-of-fold scores", 560)
    fig.update_layout(legend={"yanchor": "top", "y": -0.2, "xanchor": "left", "x": 0.0})
    fig.update_xaxes(
        title="Mean predicted probability (bin)",
        range=[-0.02, 1.02],
        constrain="domain",
        zeroline=False,
    )
    fig.update_yaxes(
        title="Observed share hallucinated",
        range=[-0.02, 1.02],
        scaleanchor="x",
        scaleratio=1,
        zeroline=False,
    )
    return fig


# --------------------------------------------------------------------------- matrix


def _matrix_labels(
    run: MatrixRun, detector: str, metric: str, z: list[list[float | None]]
) -> tuple[list[list[str]], list[list[list[Any]]]]:
    """The text written in each cell of :func:`matrix_figure` (its value) and its hover
    (value with CI, counts)."""
    key = MATRIX_METRICS[metric]
    rows, cols = run.rows(), list(run.datasets)
    text: list[list[str]] = []
    hover: list[list[list[Any]]] = []
    for i, train in enumerate(rows):
        t_row, h_row = [], []
        for j, test in enumerate(cols):
            c = _matrix_cell(run, detector, train, test)
            v = z[i][j]
            t_row.append("" if not c else (MISSING if v is None else f"{v:.3f}"))
            ci = fmt_ci(c.get(f"{key}_ci"))
            n, n_pos = c.get("n", MISSING), c.get("n_positive", MISSING)
            cv = f" ({run.k}-fold CV)" if train == test else ""
            h_row.append(
                [
                    f"{metric} {fmt(v)}" + ("" if ci == MISSING else f", 95% CI {ci}"),
                    f"{n} {plural(n, 'answer')}, {n_pos} hallucinated{cv}",
                ]
            )
        text.append(t_row)
        hover.append(h_row)
    return text, hover


def matrix_figure(run: MatrixRun, detector: str, metric: str = "AUROC") -> go.Figure:
    """The training x test heatmap of one detector's ``metric`` (a key of
    :data:`MATRIX_METRICS`): values written in the cells, CI and counts on hover, empty
    cells blank, the diagonal (within-dataset cross-validation) outlined.

    ``z`` equals ``run.frame(detector, MATRIX_METRICS[metric])`` with NaN as ``None``.
    """
    import plotly.graph_objects as go

    key = MATRIX_METRICS[metric]
    rows, cols = run.rows(), list(run.datasets)
    frame = run.frame(detector, key)
    z = [[_num(v) for v in row] for row in frame.to_numpy(dtype=object).tolist()]
    text, hover = _matrix_labels(run, detector, metric, z)
    chance_centred = key != "ap"
    fig = go.Figure(
        go.Heatmap(
            z=z,
            x=[plain(c) for c in cols],
            y=[plain(r) for r in rows],
            text=text,
            texttemplate="%{text}",
            textfont={"size": 14},
            customdata=hover,
            colorscale=[list(s) for s in (DIVERGING_SCALE if chance_centred else SEQUENTIAL_SCALE)],
            zmin=0.0,
            zmax=1.0,
            zmid=0.5 if chance_centred else None,
            hoverongaps=False,
            xgap=3,
            ygap=3,
            colorbar={"title": {"text": metric}, "thickness": 12},
            hovertemplate=(
                "trained on <b>%{y}</b> · tested on <b>%{x}</b>"
                "<br>%{customdata[0]}<br>%{customdata[1]}<extra></extra>"
            ),
        )
    )
    for i, train in enumerate(rows):
        if train in cols:
            j = cols.index(train)
            fig.add_shape(
                type="rect",
                x0=j - 0.5,
                x1=j + 0.5,
                y0=i - 0.5,
                y1=i + 0.5,
                xref="x",
                yref="y",
                line={"color": POOLED_COLOR, "width": 2, "dash": "dot"},
            )
    _layout(
        fig,
        f"{metric} of {plain(detector)}: trained on (rows), tested on (columns)",
        170 + 52 * max(len(rows), 1),
    )
    fig.update_layout(margin={"t": 100})
    fig.update_xaxes(title="Tested on", side="top", showgrid=False, type="category")
    fig.update_yaxes(title="Trained on", autorange="reversed", showgrid=False, type="category")
    return fig
