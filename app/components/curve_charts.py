"""The review loop's learning curves for the Benchmark (plotly, pandas): saved
:class:`~core.evaluation.review_curve.CurveRun` in, a figure or a table out (pure, tested
without Streamlit). Every number is the run's; names from files go through
:func:`~app.components.charts.plain`."""

from __future__ import annotations

import math
from collections.abc import Sequence

import pandas as pd
import plotly.graph_objects as go

from app.components.charts import GUIDE_COLOR, PALETTE, plain
from core.evaluation.review_curve import CurveRun

CURVE_METRICS: dict[str, str] = {
    "ece": "ECE (lower is better)",
    "balanced_accuracy": "balanced accuracy",
    "auroc": "AUROC (calibration keeps the ranking)",
    "refit_auroc": "AUROC after a refit",
    "refit_ece": "ECE after a refit (lower is better)",
    "refit_balanced_accuracy": "balanced accuracy after a refit",
}
"""What the curves can show: metric key -> axis title."""

DASH = {"random": "solid", "uncertainty": "dot"}


def _rgba(hex_color: str, alpha: float) -> str:
    r, g, b = (int(hex_color[i : i + 2], 16) for i in (1, 3, 5))
    return f"rgba({r},{g},{b},{alpha})"


def curve_figure(runs: Sequence[CurveRun], metric: str) -> go.Figure:
    """``metric`` on the answers not reviewed, against the number of reviews: one line
    per dataset and order (the mean over seeds, a band from 2.5% to 97.5% for the random
    order), the unadapted reading dotted grey, the dataset's own 5-fold CV dashed."""
    fig = go.Figure()
    for k, run in enumerate(runs):
        color = PALETTE[k % len(PALETTE)]
        name = plain(run.dataset)
        for order in ("random", "uncertainty"):
            pts = [p for p in run.points if p.order == order and metric in p.adapted]
            pts = [p for p in pts if math.isfinite(p.adapted[metric][0])]
            if not pts:
                continue
            xs = [p.n for p in pts]
            mean = [p.adapted[metric][0] for p in pts]
            if order == "random":
                lo = [p.adapted[metric][1] for p in pts]
                hi = [p.adapted[metric][2] for p in pts]
                fig.add_trace(
                    go.Scatter(
                        x=xs + xs[::-1],
                        y=hi + lo[::-1],
                        fill="toself",
                        fillcolor=_rgba(color, 0.15),
                        mode="lines",
                        line={"width": 0},
                        hoverinfo="skip",
                        showlegend=False,
                    )
                )
            fig.add_trace(
                go.Scatter(
                    x=xs,
                    y=mean,
                    mode="lines+markers",
                    name=f"{name}, {order} order",
                    line={"color": color, "dash": DASH[order]},
                )
            )
        # a refit's reference is the same metric of the unadapted reading
        plain_metric = metric.removeprefix("refit_")
        base = [p for p in run.points if p.order == "random" and plain_metric in p.unadapted]
        if base:
            fig.add_trace(
                go.Scatter(
                    x=[p.n for p in base],
                    y=[p.unadapted[plain_metric][0] for p in base],
                    mode="lines",
                    name=f"{name}, unadapted",
                    line={"color": GUIDE_COLOR, "dash": "dot", "width": 1},
                )
            )
        own = run.own_cv.get(metric)
        sizes = [p.n for p in run.points]
        if own is not None and math.isfinite(own) and sizes:
            fig.add_trace(
                go.Scatter(
                    x=[min(sizes), max(sizes)],
                    y=[own, own],
                    mode="lines",
                    name=f"{name}, own 5-fold CV",
                    line={"color": color, "dash": "dash", "width": 1},
                )
            )
    fig.update_layout(
        xaxis_title="answers reviewed",
        yaxis_title=CURVE_METRICS.get(metric, metric),
        xaxis={"type": "log", "tickvals": sorted({p.n for r in runs for p in r.points})},
        legend={"orientation": "h", "y": -0.25},
        margin={"l": 10, "r": 10, "t": 30, "b": 10},
        height=440,
    )
    return fig


def curve_frame(run: CurveRun) -> pd.DataFrame:
    """One row per order and number of reviews: each metric's mean and interval."""
    rows = []
    for p in run.points:
        row: dict[str, object] = {
            "order": p.order,
            "reviews": p.n,
            "left to score": p.n_rest,
            "calibrated": f"{p.calibrated_share:.0%}",
            "refit kept": f"{p.refit_share:.0%}" if math.isfinite(p.refit_share) else "-",
        }
        for key, label in (
            ("ece", "ECE"),
            ("balanced_accuracy", "bal. acc."),
            ("auroc", "AUROC"),
            ("refit_auroc", "refit AUROC"),
            ("refit_ece", "refit ECE"),
            ("refit_balanced_accuracy", "refit bal. acc."),
        ):
            mean, lo, hi = p.adapted.get(key, (math.nan,) * 3)
            row[label] = "-" if not math.isfinite(mean) else f"{mean:.3f} [{lo:.3f}, {hi:.3f}]"
            if key in p.unadapted:
                base = p.unadapted[key][0]
                row[f"unadapted {label}"] = "-" if not math.isfinite(base) else f"{base:.3f}"
        rows.append(row)
    return pd.DataFrame(rows)
