"""Benchmark charts: ROC and PR curves, breakdown bars and the confusion matrix (plotly).

Every function here is pure: labels and scores (or a table) in, numbers or a
``go.Figure`` out, so the maths is unit-tested without Streamlit. Labels are 1 for
hallucinated (the positive class) and 0 for faithful; a score is a detector's
response-level hallucination score, higher meaning more likely hallucinated.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from core.learning.metrics import ConfusionCounts, ci_columns

if TYPE_CHECKING:
    import pandas as pd
    import plotly.graph_objects as go

PALETTE: tuple[str, ...] = (
    "#1f77b4",
    "#e8743b",
    "#2a9d8f",
    "#8e6bbf",
    "#d62728",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
    "#8c564b",
    "#e377c2",
    "#2ca02c",
    "#393b79",
)
"""Trace colours, in the order series are given: twelve, one per shipped detector."""

GUIDE_COLOR = "#9aa0aa"
"""Colour of the chance (ROC) and prevalence (PR) lines."""

CONFUSION_SCALE: tuple[tuple[float, str], ...] = ((0.0, "#f4f6fb"), (1.0, "#2f5fb3"))

_MARGIN = {"l": 10, "r": 10, "t": 40, "b": 10}


def plain(text: object) -> str:
    """Untrusted text (a run, detector, dataset or generator name) for plotly: plotly
    reads a few HTML tags in labels, legends and hover text (links too), so ``<``, ``>``
    and ``&`` are written as entities, which it shows as the characters."""
    return html.escape(str(text), quote=False)


@dataclass(frozen=True, kw_only=True, eq=False)
class ScoreSeries:
    """One detector's test scores, with the labels they are judged against.

    Attributes:
        name: Legend name (a detector, or ``run · detector`` when comparing runs).
        labels: Gold labels, shape ``[n]``, 1 = hallucinated.
        scores: Hallucination scores, shape ``[n]``.
    """

    name: str
    labels: np.ndarray
    scores: np.ndarray

    def __post_init__(self) -> None:
        y = np.asarray(self.labels).astype(int)
        s = np.asarray(self.scores, dtype=np.float64)
        if y.shape != s.shape or y.ndim != 1:
            raise ValueError(
                f"{self.name}: labels {y.shape} and scores {s.shape} must be equal 1-d shapes"
            )
        object.__setattr__(self, "labels", y)
        object.__setattr__(self, "scores", s)

    @property
    def both_classes(self) -> bool:
        """Whether the labels hold both classes (else no curve or area is defined)."""
        return self.labels.size > 0 and 0 < int(self.labels.sum()) < self.labels.size

    @property
    def prevalence(self) -> float:
        """Share of hallucinated examples (NaN when there are none)."""
        return float(self.labels.mean()) if self.labels.size else math.nan


@dataclass(frozen=True, kw_only=True)
class Curve:
    """A ROC or PR curve.

    Attributes:
        x: False positive rate (ROC) or recall (PR), shape ``[k]``.
        y: True positive rate (ROC) or precision (PR), shape ``[k]``.
        thresholds: Score threshold of each point (the extra PR end point has none:
            NaN), shape ``[k]``.
        area: AUROC (ROC) or average precision (PR).
    """

    x: np.ndarray
    y: np.ndarray
    thresholds: np.ndarray
    area: float


GREY = "#b8b8b8"
"""What a statistic from too few answers is drawn in (:func:`greyed`)."""


def greyed(fig: go.Figure, note: str = "too few answers: not an estimate") -> go.Figure:
    """``fig`` in greys, with ``note`` above it: a statistic the page shows although it
    rests on too few answers (the warning beside it says how many more are needed)."""
    for trace in fig.data:
        if trace.type == "heatmap":
            trace.update(colorscale="Greys")
        elif trace.type == "bar":
            trace.update(marker_color=GREY)
        elif trace.type == "scatter":
            trace.update(line_color=GREY, marker_color=GREY)
    fig.add_annotation(
        text=note, xref="paper", yref="paper", x=0.5, y=1.0, yanchor="bottom",
        showarrow=False, font={"color": "#777777"},
    )  # fmt: skip
    return fig


def roc_points(series: ScoreSeries) -> Curve | None:
    """The ROC curve and AUROC; ``None`` when the labels hold one class only."""
    from sklearn.metrics import roc_auc_score, roc_curve

    if not series.both_classes:
        return None
    fpr, tpr, thr = roc_curve(series.labels, series.scores)
    # sklearn's first threshold is +inf (predict nothing); keep it finite for hover text.
    thr = np.where(np.isfinite(thr), thr, np.nan)
    return Curve(
        x=fpr, y=tpr, thresholds=thr, area=float(roc_auc_score(series.labels, series.scores))
    )


def pr_points(series: ScoreSeries) -> Curve | None:
    """The precision-recall curve and average precision; ``None`` with one class only."""
    from sklearn.metrics import average_precision_score, precision_recall_curve

    if not series.both_classes:
        return None
    precision, recall, thr = precision_recall_curve(series.labels, series.scores)
    thr = np.append(thr, np.nan)  # the last point (recall 0, precision 1) has no threshold
    return Curve(
        x=recall,
        y=precision,
        thresholds=thr,
        area=float(average_precision_score(series.labels, series.scores)),
    )


def _axis_layout(fig: go.Figure, title: str, x_title: str, y_title: str) -> None:
    fig.update_layout(
        title={"text": title, "x": 0.0, "xanchor": "left"},
        template="plotly_white",
        height=470,
        margin=_MARGIN,
        # Below the axes: a legend inside them would hide some curve, whatever the corner.
        legend={"yanchor": "top", "y": -0.2, "xanchor": "left", "x": 0.0},
        hovermode="closest",
    )
    fig.update_xaxes(title=x_title, range=[-0.01, 1.01], constrain="domain", zeroline=False)
    fig.update_yaxes(
        title=y_title, range=[-0.01, 1.02], scaleanchor="x", scaleratio=1, zeroline=False
    )


def _skipped_note(fig: go.Figure, skipped: Sequence[str], what: str) -> None:
    if skipped:
        fig.add_annotation(
            text=f"No {what} for {', '.join(skipped)}: the test labels hold one class only",
            xref="paper",
            yref="paper",
            x=0.5,
            y=0.5,
            showarrow=False,
            font={"color": "#8a5a00"},
            bgcolor="#fff6e0",
        )


def _guide(x: list[float], y: list[float], name: str) -> go.Scatter:
    """A dashed no-skill line (chance, prevalence) without hover."""
    import plotly.graph_objects as go

    return go.Scatter(
        x=x,
        y=y,
        mode="lines",
        name=name,
        line={"dash": "dash", "color": GUIDE_COLOR, "width": 1},
        hoverinfo="skip",
    )


def _curve_figure(
    series: Sequence[ScoreSeries],
    guides: Sequence[go.Scatter],
    points: Callable[[ScoreSeries], Curve | None],
    *,
    kind: str,
    area: str,
    shape: str,
    axes: tuple[str, str, str],
    hover: tuple[str, str],
) -> go.Figure:
    """One curve per series (``points``; ``None`` = one class only, listed in a note),
    its ``area`` in the legend, over the ``guides``."""
    import plotly.graph_objects as go

    fig = go.Figure(data=list(guides))
    skipped = []
    for k, s in enumerate(series):
        c = points(s)
        if c is None:
            skipped.append(plain(s.name))
            continue
        fig.add_trace(
            go.Scatter(
                x=c.x,
                y=c.y,
                customdata=c.thresholds,
                mode="lines",
                line={"color": PALETTE[k % len(PALETTE)], "width": 2, "shape": shape},
                # The name comes from a saved run: escaped, and kept out of the hover
                # template's own text (where "%{...}" would be read as a placeholder).
                name=f"{plain(s.name)} ({area} {c.area:.3f})",
                hovertemplate=(
                    f"<b>%{{fullData.name}}</b><br>{hover[0]} %{{x:.3f}} · {hover[1]} %{{y:.3f}}"
                    "<br>threshold %{customdata:.3f}<extra></extra>"
                ),
            )
        )
    _axis_layout(fig, *axes)
    _skipped_note(fig, skipped, kind)
    return fig


def roc_figure(series: Sequence[ScoreSeries]) -> go.Figure:
    """ROC curves, one trace per series with its AUROC in the legend, and the chance line."""
    return _curve_figure(
        series,
        [_guide([0, 1], [0, 1], "chance (0.5)")],
        roc_points,
        kind="ROC curve",
        area="AUROC",
        shape="hv",
        axes=("ROC", "False positive rate", "True positive rate (recall)"),
        hover=("FPR", "TPR"),
    )


def pr_figure(series: Sequence[ScoreSeries]) -> go.Figure:
    """Precision-recall curves with AP in the legend and a line at each prevalence.

    The prevalence (share of hallucinated test examples) is what precision a
    detector without skill gets; one dashed line per distinct prevalence.
    """
    prevalences = sorted({round(s.prevalence, 6) for s in series if s.both_classes})
    return _curve_figure(
        series,
        [_guide([0, 1], [p, p], f"prevalence ({p:.3f})") for p in prevalences],
        pr_points,
        kind="PR curve",
        area="AP",
        shape="vh",
        axes=("Precision-recall", "Recall", "Precision"),
        hover=("recall", "precision"),
    )


def _ci_error_bars(
    ci: Sequence[tuple[float | None, float | None]], y: Sequence[float | None]
) -> dict[str, object] | None:
    """Plotly ``error_y`` for bars ``y`` with intervals ``ci`` (None: no interval known)."""
    known = [
        (a, b, v) if v is not None and a is not None and b is not None else None
        for (a, b), v in zip(ci, y, strict=True)
    ]
    if not any(k is not None for k in known):
        return None
    # distances from the bar's top to the interval's ends (0: none known)
    return {
        "type": "data",
        "symmetric": False,
        "array": [k[1] - k[2] if k is not None else 0 for k in known],
        "arrayminus": [k[2] - k[0] if k is not None else 0 for k in known],
        "thickness": 1.2,
        "width": 3,
    }


def breakdown_figure(
    frame: pd.DataFrame, by: str, *, metric: str = "AUROC", group: str = "detector"
) -> go.Figure:
    """Grouped bars of ``metric`` per value of ``by``, one bar colour per ``group``.

    Args:
        frame: Rows of :meth:`core.evaluation.evaluate.EvalRun.breakdown` (columns ``group``,
            ``by``, ``n``, ``metric``); a missing metric (one class) is left out as a
            gap, with ``n`` on hover. With the interval's columns
            (:func:`core.learning.metrics.ci_columns`), each bar carries its interval as an error bar (and on hover).
        by: The breakdown column (``task`` or ``generator``).
        metric: The value column.
        group: The column that names a bar colour.
    """
    import plotly.graph_objects as go

    fig = go.Figure()
    cats = sorted({str(v) for v in frame[by]}) if len(frame) else []
    for k, (name, part) in enumerate(frame.groupby(group, sort=False)):
        vals = {str(r[by]): r for _, r in part.iterrows()}
        y = [_num(vals[c][metric]) if c in vals else None for c in cats]
        n = [int(vals[c]["n"]) if c in vals else 0 for c in cats]
        lo_col, hi_col = ci_columns(metric)
        ci = [
            (_num(vals[c].get(lo_col)), _num(vals[c].get(hi_col))) if c in vals else (None, None)
            for c in cats
        ]
        error_y = _ci_error_bars(ci, y)
        has_ci = error_y is not None
        ci_text = [f"[{a:.3f}, {b:.3f}]" if a is not None and b is not None else "–" for a, b in ci]
        fig.add_trace(
            go.Bar(
                x=[plain(c) for c in cats],
                y=y,
                name=plain(name),
                marker_color=PALETTE[k % len(PALETTE)],
                customdata=list(zip(n, ci_text, strict=True)),
                error_y=error_y,
                text=[f"{v:.2f}" if v is not None else "–" for v in y],
                # at the bar's foot when an error bar stands on its top
                textposition="inside" if has_ci else "outside",
                textangle=0,
                insidetextanchor="start",
                cliponaxis=False,
                hovertemplate=(
                    f"<b>%{{fullData.name}}</b><br>{by} %{{x}}<br>{metric} %{{y:.3f}}"
                    + ("<br>95% CI %{customdata[1]}" if has_ci else "")
                    + "<br>n = %{customdata[0]}<extra></extra>"
                ),
            )
        )
    fig.update_layout(
        barmode="group",
        template="plotly_white",
        # A label wider than its bar is hidden (hover still gives the value), so many
        # detectors' bars never print over each other.
        uniformtext={"minsize": 9, "mode": "hide"},
        height=320,
        margin={"l": 10, "r": 10, "t": 30, "b": 10},
        legend={"orientation": "h", "yanchor": "bottom", "y": 1.02, "x": 0.0},
        yaxis={"title": metric, "range": [0, 1.12]},
        xaxis={"title": by},
    )
    if metric == "AUROC":
        fig.add_hline(y=0.5, line={"dash": "dash", "color": GUIDE_COLOR, "width": 1})
    return fig


def _num(v: object) -> float | None:
    if v is None:
        return None
    f = float(v)  # type: ignore[arg-type]
    return None if math.isnan(f) else f


def confusion_figure(counts: ConfusionCounts, *, title: str | None = None) -> go.Figure:
    """The confusion matrix as a heatmap with the count (and share) in each cell."""
    import plotly.graph_objects as go

    m = counts.matrix()
    total = max(counts.n, 1)
    names = [["true positive", "false negative"], ["false positive", "true negative"]]
    text = [
        [f"<b>{m[i, j]}</b><br>{names[i][j]}<br>{m[i, j] / total:.0%}" for j in range(2)]
        for i in range(2)
    ]
    fig = go.Figure(
        go.Heatmap(
            z=m.tolist(),
            x=["hallucinated", "faithful"],
            y=["hallucinated", "faithful"],
            text=text,
            texttemplate="%{text}",
            textfont={"size": 15},
            colorscale=[list(s) for s in CONFUSION_SCALE],
            zmin=0,
            zmax=max(int(m.max()), 1),
            showscale=False,
            xgap=3,
            ygap=3,
            hovertemplate="actual %{y} · predicted %{x}: %{z}<extra></extra>",
        )
    )
    fig.update_layout(
        title={"text": title, "x": 0.0, "xanchor": "left"} if title else None,
        template="plotly_white",
        height=340,
        margin={"l": 10, "r": 10, "t": 40 if title else 10, "b": 10},
    )
    fig.update_xaxes(title="Predicted", side="top", showgrid=False)
    fig.update_yaxes(title="Actual", autorange="reversed", showgrid=False)
    return fig
