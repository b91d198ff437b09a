"""Statistics that stay ours give the libraries' numbers on fixed inputs (each keeps a
one-line reason in its docstring: the library lacks what we need, or is slower), and the
bootstraps draw exactly what the plain loops they replaced drew."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.calibration import calibration_curve
from sklearn.metrics import roc_auc_score

from core.learning.calibration import reliability
from core.learning.metrics import group_resamples, grouped_bootstrap_ci, is_binary, response_metrics


def test_reliability_bins_equal_sklearn_calibration_curve_and_add_the_counts() -> None:
    rng = np.random.default_rng(0)
    p = rng.random(500)
    p = p[np.abs(p * 10 - np.round(p * 10)) > 1e-6]  # nothing on a bin edge
    y = (rng.random(p.size) < p).astype(int)
    got = reliability(y, p, n_bins=10)
    observed, predicted = calibration_curve(y, p, n_bins=10, strategy="uniform")
    filled = got.counts > 0
    np.testing.assert_allclose(got.observed[filled], observed, rtol=1e-12)
    np.testing.assert_allclose(got.mean_predicted[filled], predicted, rtol=1e-12)
    assert got.counts.sum() == p.size
    gaps = np.abs(observed - predicted) * got.counts[filled]
    assert got.ece == pytest.approx(gaps.sum() / p.size, rel=1e-12)


def _concatenated(y: np.ndarray, groups: np.ndarray, n_boot: int, seed: int) -> list[np.ndarray]:
    """Resampling whole groups as first written: one array per picked group, joined."""
    _, g = np.unique(groups, return_inverse=True)
    members = [np.flatnonzero(g == k) for k in range(g.max() + 1)]
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n_boot):
        idx = np.concatenate([members[k] for k in rng.integers(0, len(members), len(members))])
        if is_binary(y[idx]):
            out.append(idx)
    return out


def test_group_resamples_draw_what_joining_each_groups_members_drew() -> None:
    rng = np.random.default_rng(1)
    groups = rng.choice(np.array(["q1", "q2", "q3", "q4", "q5", "q6", "q7"]), size=40)
    y = rng.integers(0, 2, 40)
    got = list(group_resamples(y, groups, 200, seed=3))
    want = _concatenated(y, groups, 200, seed=3)
    assert len(got) == len(want) > 150
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a, b)


def test_the_answer_level_auroc_interval_is_the_bootstrap_of_answers() -> None:
    rng = np.random.default_rng(2)
    y = rng.integers(0, 2, 120)
    s = y * 0.8 + rng.normal(size=120)
    got = response_metrics(y, s, 0.5, n_boot=300, seed=4)["auroc_ci"]
    draws = np.random.default_rng(4)
    boots = []
    for _ in range(300):
        idx = draws.integers(0, y.size, y.size)
        if is_binary(y[idx]):
            boots.append(roc_auc_score(y[idx], s[idx]))
    assert got == [float(np.percentile(boots, 2.5)), float(np.percentile(boots, 97.5))]
    assert got == grouped_bootstrap_ci(y, s, np.arange(y.size), n_boot=300, seed=4)


@pytest.mark.parametrize("n_answers", [7, 90, 600])
def test_the_grouped_auroc_interval_is_sklearns_auroc_on_every_resample(n_answers: int) -> None:
    """The resamples' AUROCs are computed together as weighted Mann-Whitney statistics;
    they must be ``roc_auc_score`` on each resample's indices, ties and skipped
    one-class resamples included (at 7 answers many resamples hold one class)."""
    rng = np.random.default_rng(n_answers)
    groups = rng.integers(0, max(n_answers // 4, 2), n_answers)
    y = (rng.random(n_answers) < 0.3).astype(int)
    y[:2] = [0, 1]
    s = np.round(y * 0.6 + rng.normal(size=n_answers), 1)  # many ties
    boots = [roc_auc_score(y[i], s[i]) for i in group_resamples(y, groups, 400, seed=5)]
    want = [float(np.percentile(boots, 2.5)), float(np.percentile(boots, 97.5))]
    got = grouped_bootstrap_ci(y, s, groups, n_boot=400, seed=5)
    assert got == pytest.approx(want, abs=1e-12)
