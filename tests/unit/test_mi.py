"""Mutual information of pooled features with the label (RAGLens selection)."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.metrics import mutual_info_score

from core.learning.mi import bin_index, mutual_information, thresholds, top_features


def _direct(x: np.ndarray, y: np.ndarray, bins: int, binning: str) -> np.ndarray:
    """One feature at a time with scikit-learn, on the same bins."""
    out = []
    for j in range(x.shape[1]):
        col = x[:, j].astype(np.float64)
        if binning == "quantile":
            edges = np.quantile(col, np.arange(1, bins) / bins)
        else:
            edges = col.min() + np.arange(1, bins) / bins * (col.max() - col.min())
        b = np.array([int((v > edges).sum()) for v in col])
        out.append(mutual_info_score(y, b))
    return np.asarray(out)


@pytest.mark.parametrize("binning", ["quantile", "uniform"])
def test_vectorised_mi_equals_a_direct_computation(binning) -> None:
    rng = np.random.default_rng(0)
    n = 300
    y = rng.integers(0, 2, n)
    x = rng.normal(size=(n, 40))
    x[:, 3] += 1.5 * y  # informative
    x[:, 7] = np.where(rng.random(n) < 0.8, 0.0, np.abs(x[:, 7]))  # mostly zero (ties)
    x[:, 9] = 2.0  # constant
    got = mutual_information(x, y, bins=50, binning=binning, chunk=7)
    np.testing.assert_allclose(got, _direct(x, y, 50, binning), rtol=1e-9, atol=1e-12)
    assert got[9] == 0.0 and int(np.argmax(got)) == 3


def test_mi_bounds_and_perfect_predictor() -> None:
    y = np.array([0, 1] * 50)
    x = np.stack([y * 3.0 + 1.0, np.zeros(100)], axis=1)
    mi = mutual_information(x, y, bins=10)
    assert mi[0] == pytest.approx(np.log(2.0))  # H(Y) for balanced labels
    assert mi[1] == 0.0


def test_ties_never_split_equal_values() -> None:
    x = np.array([[0.0], [0.0], [0.0], [1.0], [2.0]])
    b = bin_index(x, thresholds(x, 4))
    assert len(set(b[:3, 0])) == 1 and b[3, 0] > b[0, 0] and b[4, 0] >= b[3, 0]


def test_top_features_orders_by_mi_then_index() -> None:
    assert top_features(np.array([0.1, 0.5, 0.5, 0.0]), 3).tolist() == [1, 2, 0]
    assert top_features(np.array([0.1]), 5).tolist() == [0]


def test_bad_input_is_refused() -> None:
    with pytest.raises(ValueError, match="0/1"):
        mutual_information(np.zeros((3, 2)), np.array([0, 2, 1]))
    with pytest.raises(ValueError, match=r"\[n, f\]"):
        mutual_information(np.zeros((3, 2)), np.array([0, 1]))
    with pytest.raises(ValueError, match="binning"):
        thresholds(np.zeros((3, 2)), 5, "log")  # type: ignore[arg-type]
