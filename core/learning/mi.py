"""Mutual information of many continuous features with a binary label (RAGLens step 2).

Each feature is discretised into ``bins`` bins and the MI of the bin index with
the label is ``sum_{b,c} p(b, c) log(p(b, c) / (p(b) p(c)))`` in nats. Binning:

- ``quantile`` (the paper): the ``bins - 1`` inner quantiles of the feature are the
  thresholds; ties (a feature that is 0 on most answers) collapse bins instead of
  splitting equal values;
- ``uniform`` (the public code): equal-width thresholds between the feature's min and max.

A value ``x`` falls in bin ``#{thresholds t : t < x}``. Computed for all features
at once, in column chunks so memory stays ``O(n * bins * chunk)``. Equal to
``sklearn.metrics.mutual_info_score`` of each column's bins (tested), which takes one
call per feature: 13x slower on 1,000 answers x 2,048 features (measured 2026-11-28).
"""

from __future__ import annotations

from typing import Literal

import numpy as np

Binning = Literal["quantile", "uniform"]
BINNINGS: tuple[str, ...] = ("quantile", "uniform")


def thresholds(x: np.ndarray, bins: int, binning: Binning = "quantile") -> np.ndarray:
    """``[bins - 1, f]`` bin thresholds of each column of ``x`` (``[n, f]``)."""
    if bins < 2:
        raise ValueError(f"bins must be >= 2, got {bins}")
    if binning not in BINNINGS:
        raise ValueError(f"binning must be one of {BINNINGS}, got {binning!r}")
    x = np.asarray(x, dtype=np.float64)
    q = np.arange(1, bins) / bins
    if binning == "quantile":
        return np.quantile(x, q, axis=0)
    lo, hi = x.min(0), x.max(0)
    return lo[None, :] + q[:, None] * (hi - lo)[None, :]


def bin_index(x: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """``[n, f]`` bin of each value: how many of its column's thresholds lie strictly below."""
    x = np.asarray(x, dtype=np.float64)
    return (x[:, None, :] > edges[None, :, :]).sum(1)


def mutual_information(
    x: np.ndarray,
    y: np.ndarray,
    *,
    bins: int = 50,
    binning: Binning = "quantile",
    chunk: int = 512,
) -> np.ndarray:
    """``[f]`` MI (nats) of each column of ``x`` (``[n, f]``) with the 0/1 labels ``y``."""
    x = np.asarray(x)
    y = np.asarray(y).astype(np.int64).ravel()
    if x.ndim != 2 or x.shape[0] != y.shape[0]:
        raise ValueError(f"x must be [n, f] with n = len(y); got {x.shape} and {y.shape}")
    if not np.isin(y, (0, 1)).all():
        raise ValueError("y must hold 0/1 labels")
    n, f = x.shape
    out = np.zeros(f, dtype=np.float64)
    if n == 0:
        return out
    p_c = np.bincount(y, minlength=2) / n  # [2]
    for s in range(0, f, chunk):
        xc = x[:, s : s + chunk]
        fc = xc.shape[1]
        b = bin_index(xc, thresholds(xc, bins, binning))  # [n, fc]
        flat = b + bins * np.arange(fc)[None, :]
        joint = (
            np.stack(
                [np.bincount(flat[y == c].ravel(), minlength=bins * fc) for c in (0, 1)], axis=-1
            ).reshape(fc, bins, 2)
            / n
        )  # [fc, bins, 2]
        p_b = joint.sum(-1, keepdims=True)  # [fc, bins, 1]
        denom = p_b * p_c[None, None, :]
        with np.errstate(divide="ignore", invalid="ignore"):
            terms = np.where(joint > 0, joint * np.log(joint / denom), 0.0)
        out[s : s + fc] = terms.sum((1, 2))
    return np.maximum(out, 0.0)


def top_features(mi: np.ndarray, k: int) -> np.ndarray:
    """Indices of the ``k`` largest MI values, largest first (ties: lower index first)."""
    order = np.argsort(-np.asarray(mi), kind="stable")
    return order[: max(0, min(k, order.size))]
