"""Cross-validation and cross-domain tables for the Benchmark (pandas).

Every function here is pure: saved runs (:class:`~core.evaluation.cv_run.CVRun`,
:class:`~core.evaluation.matrix.MatrixRun`) in, a ``pd.DataFrame`` out, so what the page
shows is tested without Streamlit. Numeric frames are what the page offers as CSV; the
``*_table`` functions format them for display (3 decimals, ``-`` where a metric is
undefined, e.g. a part with one class only). Frames keep names (runs, detectors,
datasets, generators) as they are (the CSV goes through
:func:`core.review.export.safe_csv`); the figures of the same runs are in
:mod:`app.components.cv_charts`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np
import pandas as pd

from core.evaluation.comparison import p_text
from core.evaluation.cv_run import CVRun, format_span_prf
from core.evaluation.matrix import MatrixRun
from core.learning.calibration import Reliability
from core.learning.metrics import ci_columns

MISSING = "-"

OWN_AUROC = "AUROC, own stacker & calibration"
OWN_BA = "balanced accuracy, own calibration"
OWN_ECE = "ECE, own calibration"
TOKEN_AP = "token AP"
AUROC_LOW, AUROC_HIGH = ci_columns("AUROC")
SPAN_PRF = "span P/R/F1 (char)"
SPAN_F1 = "span F1 (char)"
DATASET_METRICS: tuple[str, ...] = (
    "AUROC",
    "balanced accuracy",
    "ECE",
    OWN_AUROC,
    OWN_BA,
    OWN_ECE,
    TOKEN_AP,
    SPAN_F1,
)
"""Per-dataset metrics; the *own calibration* ones judge each dataset's answers by the
calibration and threshold fitted on that dataset alone (runs that combine datasets);
the own AUROC differs from the pooled one only where the ensemble has a stacker of that
dataset's own (``dataset_stackers``)."""
"""What the per-dataset bars of a cross-validation can show (columns of
:func:`breakdown_frame`)."""

MATRIX_METRICS: dict[str, str] = {
    "AUROC": "auroc",
    "AP": "ap",
    "balanced accuracy": "balanced_accuracy",
}
"""Matrix metric label -> key of a :attr:`~core.evaluation.matrix.MatrixRun.cells` cell."""


# --------------------------------------------------------------------------- formatting


def _num(v: Any) -> float | None:
    """A finite float, or ``None`` (missing, NaN, not a number)."""
    if v is None or isinstance(v, bool):
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def fmt(v: Any, digits: int = 3) -> str:
    """A metric with ``digits`` decimals; undefined as ``-``."""
    f = _num(v)
    return MISSING if f is None else f"{f:.{digits}f}"


def _span_f1(spans: Any) -> float | None:
    """The F1 of a part's span metrics, or ``None`` (none measured, an older run)."""
    return _num(spans.get("f1")) if isinstance(spans, Mapping) else None


def _ci(ci: Any) -> tuple[float | None, float | None]:
    if isinstance(ci, Sequence) and not isinstance(ci, str) and len(ci) == 2:
        return _num(ci[0]), _num(ci[1])
    return None, None


def fmt_ci(ci: Any) -> str:
    """``[lo, hi]`` to 3 decimals, or ``-``."""
    lo, hi = _ci(ci)
    return MISSING if lo is None or hi is None else f"[{lo:.3f}, {hi:.3f}]"


def series_name(run: CVRun, detector: str, compare: bool) -> str:
    """A detector's name in charts: ``run · detector`` when several runs are compared."""
    return f"{run.name} · {detector}" if compare else detector


def describe_cv(run: CVRun) -> str:
    """What a cross-validation was, in plain text (escape it before Markdown)."""
    n, n_pos = len(run.labels), int(sum(run.labels))
    cal = ", ".join(run.calibrate_on) if run.calibrate_on else "every dataset"
    part = (
        "cross-fitted scores of each fold's training answers"
        if run.calibration == "crossfit"
        else "each fold's validation part"
    )
    length = (run.baseline.get("answer_length") or {}).get("auroc")
    base = f"; answer length alone: AUROC {length:.3f}" if isinstance(length, float) else ""
    return (
        f"{run.k}-fold source-grouped cross-validation on {', '.join(run.datasets)}: "
        f"{n} answers, {n_pos} hallucinated; thresholds by {run.criterion.replace('_', ' ')}, "
        f"calibrated on {part} of {cal}; seed {run.seed}; data hash {run.data_hash}{base}"
    )


# --------------------------------------------------------------------------- CV tables


def cv_frame(run: CVRun) -> pd.DataFrame:
    """:meth:`CVRun.to_frame`: one row per detector, unrounded (the CSV download)."""
    return run.to_frame()


def cv_metric_table(run: CVRun) -> pd.DataFrame:
    """The metric table shown for one run: pooled out-of-fold metrics to 3 decimals,
    CIs as ``[lo, hi]``, the fold spread as ``mean ± sd``, span precision / recall / F1
    by character overlap as the run stored it (``-`` in runs saved before it)."""
    rows = []
    for _, r in cv_frame(run).iterrows():
        mean, sd = _num(r["fold AUROC mean"]), _num(r["fold AUROC sd"])
        rows.append(
            {
                "detector": r["detector"],
                "AUROC": fmt(r["AUROC"]),
                "AUROC 95% CI": fmt_ci([r[c] for c in ci_columns("AUROC")]),
                "AUROC length-matched": fmt(r.get("AUROC length-matched")),
                "folds mean ± sd": MISSING
                if mean is None or sd is None
                else f"{mean:.3f} ± {sd:.3f}",
                "AP": fmt(r["AP"]),
                "AP 95% CI": fmt_ci([r[c] for c in ci_columns("AP")]),
                "balanced acc": fmt(r["balanced acc"]),
                "F1": fmt(r["F1"]),
                "ECE": fmt(r["ECE"]),
                "token AP": fmt(r["token AP"]),
                SPAN_PRF: format_span_prf(run.result(r["detector"]).spans),
                "token AUROC": fmt(r["token AUROC"]),
            }
        )
    return pd.DataFrame(rows)


def fold_frame(runs: Sequence[CVRun]) -> pd.DataFrame:
    """One row per run, detector and fold: the per-fold metrics (the fold spread's data)."""
    compare = len(runs) > 1
    rows = []
    for run in runs:
        for r in run.results:
            for f in r.folds:
                rows.append(
                    {
                        "series": series_name(run, r.detector, compare),
                        "run": run.name,
                        "detector": r.detector,
                        "fold": f.get("fold"),
                        "n": f.get("n"),
                        "hallucinated": f.get("n_positive"),
                        "AUROC": _num(f.get("auroc")),
                        "AP": _num(f.get("ap")),
                        "balanced accuracy": _num(f.get("balanced_accuracy")),
                        "threshold": _num(f.get("threshold")),
                        "ECE": _num(f.get("ece")),
                    }
                )
    return pd.DataFrame(rows)


def breakdown_frame(runs: Sequence[CVRun], by: Literal["generator", "dataset"]) -> pd.DataFrame:
    """One row per (run ·) detector and generator or dataset: pooled out-of-fold n,
    hallucinated, AUROC, balanced accuracy and ECE (undefined as ``None``). The
    ``detector`` column names the bar colour of :func:`app.components.charts.breakdown_figure`."""
    compare = len(runs) > 1
    rows = []
    for run in runs:
        for r in run.results:
            parts = r.by_generator if by == "generator" else r.by_dataset
            for key, m in parts.items():
                lo, hi = _ci(m.get("auroc_ci"))  # a malformed interval reads as none
                rows.append(
                    {
                        "detector": series_name(run, r.detector, compare),
                        by: key,
                        "n": m.get("n"),
                        "hallucinated": m.get("n_positive"),
                        "AUROC": _num(m.get("auroc")),
                        AUROC_LOW: lo,
                        AUROC_HIGH: hi,
                        "balanced accuracy": _num(m.get("balanced_accuracy")),
                        "ECE": _num(m.get("ece")),
                        OWN_AUROC: _num(m.get("own_auroc")),
                        OWN_BA: _num(m.get("own_balanced_accuracy")),
                        OWN_ECE: _num(m.get("own_ece")),
                        TOKEN_AP: _num(m.get("token_ap")),
                        SPAN_F1: _span_f1(m.get("spans")),
                    }
                )
    return pd.DataFrame(
        rows,
        columns=["detector", by, "n", "hallucinated", *DATASET_METRICS, AUROC_LOW, AUROC_HIGH],
    )


def breakdown_table(frame: pd.DataFrame) -> pd.DataFrame:
    """:func:`breakdown_frame` with its metrics to 3 decimals."""
    out = frame.copy()
    for c in DATASET_METRICS:
        out[c] = [fmt(v) for v in out[c]]
    return out


def oof_frame(run: CVRun) -> pd.DataFrame:
    """One row per answer: its dataset, generator, label and fold, and per detector the
    calibrated out-of-fold score, the raw score and whether its fold's threshold flagged it."""
    out = pd.DataFrame(
        {
            "id": list(run.ids),
            "dataset": list(run.example_datasets),
            "generator": list(run.generators),
            "hallucinated": list(run.labels),
            "fold": list(run.fold),
        }
    )
    for r in run.results:
        out[f"{r.detector} score"] = list(r.scores)
        out[f"{r.detector} raw score"] = list(r.raw_scores)
        out[f"{r.detector} flagged"] = list(r.flagged)
    return out


# --------------------------------------------------------------------------- comparisons


def comparison_frame(run: CVRun) -> pd.DataFrame:
    """One row per detector: its AUROC minus the best detector's and minus answer
    length's, each with a 95% CI and p (paired source-grouped bootstrap); empty for a
    run saved before comparisons were recorded."""
    c = run.comparisons
    rows = []
    for det, row in (c.get("rows") or {}).items():
        out: dict[str, Any] = {"detector": det}
        for key, label in (("vs_best", f"vs {c.get('reference')}"), ("vs_length", "vs length")):
            v = row.get(key) or {}
            lo, hi = _ci(v.get("ci"))
            out |= {
                f"Δ AUROC {label}": _num(v.get("delta")),
                f"{label} CI low": lo,
                f"{label} CI high": hi,
                f"{label} p": _num(v.get("p")),
            }
        rows.append(out)
    return pd.DataFrame(rows)


def comparison_table(run: CVRun) -> pd.DataFrame:
    """:func:`comparison_frame` for display: ``+0.012 [-0.020, +0.041]`` and p."""
    c = run.comparisons
    ref = c.get("reference")
    rows = []
    for det, row in (c.get("rows") or {}).items():
        cells: dict[str, Any] = {"detector": det}
        for key, label in (("vs_best", f"vs {ref}"), ("vs_length", "vs answer length")):
            v = row.get(key)
            lo, hi = _ci((v or {}).get("ci"))
            d, p = _num((v or {}).get("delta")), _num((v or {}).get("p"))
            cells[f"Δ AUROC {label} [95% CI]"] = (
                MISSING
                if d is None or lo is None or hi is None
                else f"{d:+.3f} [{lo:+.3f}, {hi:+.3f}]"
            )
            cells[f"p ({label})"] = MISSING if p is None else p_text(p)
        rows.append(cells)
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------- calibration


def _nan_to_none(a: np.ndarray) -> list[float | None]:
    return [None if not np.isfinite(v) else float(v) for v in np.asarray(a, dtype=np.float64)]


def reliability_frame(series: Mapping[str, Reliability]) -> pd.DataFrame:
    """One row per series and bin: its edges, answers, mean predicted and observed rate."""
    rows = []
    for name, rel in series.items():
        for i, c in enumerate(rel.counts):
            rows.append(
                {
                    "detector": name,
                    "bin low": float(rel.edges[i]),
                    "bin high": float(rel.edges[i + 1]),
                    "answers": int(c),
                    "mean predicted": _nan_to_none(rel.mean_predicted)[i],
                    "observed share hallucinated": _nan_to_none(rel.observed)[i],
                    "ECE": float(rel.ece),
                }
            )
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------- matrix


def matrix_frame(run: MatrixRun) -> pd.DataFrame:
    """Every cell of every detector, long: detector, trained on, tested on, n,
    hallucinated, AUROC with its CI, AP with its CI, balanced accuracy (the CSV)."""
    rows = []
    for det, by_train in run.cells.items():
        for train in run.rows():
            for test in run.datasets:
                c = (by_train.get(train) or {}).get(test)
                if not c:
                    continue
                a_lo, a_hi = _ci(c.get("auroc_ci"))
                p_lo, p_hi = _ci(c.get("ap_ci"))
                rows.append(
                    {
                        "detector": det,
                        "trained on": train,
                        "tested on": test,
                        "n": c.get("n"),
                        "hallucinated": c.get("n_positive"),
                        "AUROC": _num(c.get("auroc")),
                        "AUROC 95% CI low": a_lo,
                        "AUROC 95% CI high": a_hi,
                        "AP": _num(c.get("ap")),
                        "AP 95% CI low": p_lo,
                        "AP 95% CI high": p_hi,
                        "balanced accuracy": _num(c.get("balanced_accuracy")),
                    }
                )
    return pd.DataFrame(rows)


def _matrix_cell(run: MatrixRun, detector: str, train: str, test: str) -> Mapping[str, Any]:
    return (run.cells[detector].get(train) or {}).get(test) or {}


def matrix_table(run: MatrixRun, detector: str, metric: str = "AUROC") -> pd.DataFrame:
    """Training (rows) x test (columns) for one detector: ``value [lo, hi]`` (CIs where
    the metric has one), empty where a pair was not run."""
    key = MATRIX_METRICS[metric]
    body = []
    for train in run.rows():
        row = []
        for test in run.datasets:
            c = _matrix_cell(run, detector, train, test)
            v = _num(c.get(key))
            if not c:
                row.append("")
            elif v is None:
                row.append(MISSING)
            else:
                ci = fmt_ci(c.get(f"{key}_ci"))
                row.append(f"{v:.3f}" + ("" if ci == MISSING else f" {ci}"))
        body.append(row)
    out = pd.DataFrame(body, index=run.rows(), columns=list(run.datasets))
    out.index.name = "trained on \\ tested on"
    return out
