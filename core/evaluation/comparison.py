"""Paired comparisons of detectors on the same answers: each one's AUROC against the
best one's and against answer length's, with a paired, source-grouped bootstrap
(:func:`core.learning.metrics.paired_difference`), as a cross-validation run stores and shows
them. A run file's comparisons are read as untrusted (:func:`checked_comparisons`)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, cast

import numpy as np

from core.base.errors import DataError
from core.learning.metrics import auroc_or_none, paired_difference


def compare_detectors(
    y: np.ndarray,
    scores: Mapping[str, np.ndarray],
    groups: np.ndarray,
    lengths: np.ndarray,
    *,
    n_boot: int = 1000,
    seed: int = 0,
) -> dict[str, Any]:
    """Each detector's AUROC against the best detector's and against answer length's on
    the same answers (:func:`core.learning.metrics.paired_difference`: paired, source-grouped
    bootstrap): whether a gap between two detectors, or over the length baseline, is
    more than the luck of which answers were drawn. ``{}`` without both classes."""
    aucs = {n: auroc_or_none(y, s) for n, s in scores.items()}
    ranked = [n for n, a in aucs.items() if a is not None]
    if not ranked:
        return {}
    best = max(ranked, key=lambda n: cast(float, aucs[n]))
    rows = {
        n: {
            "vs_best": None
            if n == best
            else paired_difference(y, scores[n], scores[best], groups, n_boot=n_boot, seed=seed),
            "vs_length": paired_difference(y, scores[n], lengths, groups, n_boot=n_boot, seed=seed),
        }
        for n in ranked
    }
    return {"reference": best, "n_boot": int(n_boot), "rows": rows}


def _finite(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def checked_comparisons(d: Any, run: Any) -> dict[str, Any]:
    """A run file's ``comparisons``, read as untrusted: numbers where numbers belong."""
    if not d:
        return {}
    bad = DataError(
        f"cross-validation run {run!r}: its paired comparisons are damaged (expected "
        "reference, rows of vs_best/vs_length with delta, ci and p); re-run it"
    )
    if not (isinstance(d, dict) and isinstance(d.get("reference"), str)):
        raise bad
    if not (isinstance(d.get("rows"), dict) and _finite(d.get("n_boot", 0))):
        raise bad
    rows: dict[str, Any] = {}
    for det, row in d["rows"].items():
        if not isinstance(row, dict):
            raise bad
        rows[str(det)] = {}
        for k in ("vs_best", "vs_length"):
            v = row.get(k)
            if v is not None:
                ci = v.get("ci") if isinstance(v, dict) else None
                if not (isinstance(ci, list) and len(ci) == 2 and all(map(_finite, ci))):
                    raise bad
                if not (_finite(v.get("delta")) and _finite(v.get("p"))):
                    raise bad
                v = {"delta": float(v["delta"]), "ci": [float(c) for c in ci], "p": float(v["p"])}
            rows[str(det)][k] = v
    return {"reference": d["reference"], "n_boot": int(d.get("n_boot", 0)), "rows": rows}


def comparison_lines(comparisons: Mapping[str, Any]) -> list[str]:
    """The markdown table of a run's paired comparisons (``[]`` when it has none)."""
    rows = comparisons.get("rows") or {}
    if not rows:
        return []
    ref = comparisons.get("reference")

    def cell(v: Mapping[str, Any] | None) -> str:
        if v is None:
            return "- | -"
        return f"{v['delta']:+.3f} [{v['ci'][0]:+.3f}, {v['ci'][1]:+.3f}] | {p_text(v['p'])}"

    lines = [
        "",
        f"Paired differences (each detector's AUROC minus the best one's, `{ref}`, and "
        "minus answer length's, on the same answers; 95% CIs from a paired "
        f"source-grouped bootstrap of {comparisons.get('n_boot')} resamples; p two-sided, "
        "unadjusted for the number of comparisons):",
        "",
        f"| detector | Δ AUROC vs {ref} [95% CI] | p | Δ AUROC vs answer length [95% CI] | p |",
        "|---|---|---|---|---|",
    ]
    for det, row in rows.items():
        lines.append(f"| {det} | {cell(row.get('vs_best'))} | {cell(row.get('vs_length'))} |")
    return lines


def p_text(p: float) -> str:
    """A p-value as shown: three decimals, or ``< 0.001``."""
    return "< 0.001" if p < 0.001 else f"{p:.3f}"
