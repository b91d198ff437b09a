"""The shared learners: choose_c's warm-started regularisation path."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import StratifiedGroupKFold, cross_val_score
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from core.learning.learners import choose_c

GRID = (0.001, 0.01, 0.1, 1.0, 10.0)


def _data(n: int, d: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    w = rng.normal(size=d)
    y = (X @ w + rng.normal(scale=2.0, size=n) > 0).astype(int)
    return X, y, np.arange(n) // 4


@pytest.mark.parametrize(("n", "d"), [(600, 12), (60, 40)], ids=["tall-newton", "wide-lbfgs"])
def test_choose_c_matches_fitting_each_strength_from_scratch(n: int, d: int) -> None:
    """Walking the grid with warm starts (Newton steps for tall data, L-BFGS for wide)
    scores every strength like independent fits do, so it picks the same C."""
    X, y, groups = _data(n, d)
    c, score = choose_c(X, y, GRID, groups=groups, scoring="neg_log_loss", class_weight="balanced")
    splits = list(
        StratifiedGroupKFold(n_splits=5, shuffle=True, random_state=0).split(X, y, groups)
    )
    ref = [
        cross_val_score(
            make_pipeline(
                StandardScaler(),
                LogisticRegression(C=cc, class_weight="balanced", max_iter=5000, tol=1e-8),
            ),
            X,
            y,
            cv=splits,
            scoring="neg_log_loss",
        ).mean()
        for cc in GRID
    ]
    assert c == GRID[int(np.argmax(ref))]
    assert score == pytest.approx(max(ref), abs=1e-4)


def test_choose_c_falls_back_to_the_middle_without_enough_of_a_class() -> None:
    X, _, _ = _data(20, 3)
    y = np.zeros(20, dtype=int)
    y[0] = 1
    c, score = choose_c(X, y, GRID)
    assert c == GRID[2] and np.isnan(score)
