"""Label-persistence smoothing: exact against brute-force enumeration, batched, stable."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from core.base.errors import DataError
from core.learning.metrics import token_prf
from core.signals.smoothing import (
    CLIP,
    answer_score,
    flagged_spans,
    forward_backward,
    smooth_tokens,
    span_overlap_f1,
    token_flags,
)


def brute_force(s: np.ndarray, p_stay: float) -> np.ndarray:
    """P(z_i = 1 | s) by summing over every one of the 2^T label sequences."""
    c = np.clip(s, CLIP, 1 - CLIP)
    post = np.zeros(len(c))
    total = 0.0
    for z in itertools.product((0, 1), repeat=len(c)):
        w = 0.5
        for i, zi in enumerate(z):
            w *= c[i] if zi else 1 - c[i]
            if i:
                w *= p_stay if zi == z[i - 1] else 1 - p_stay
        total += w
        post += w * np.asarray(z)
    return post / total


@pytest.mark.parametrize("p_stay", [0.5, 0.7, 0.93, 0.993, 1.0])
@pytest.mark.parametrize("length", [1, 2, 5, 10])
def test_equals_brute_force(p_stay: float, length: int) -> None:
    rng = np.random.default_rng(length)
    s = rng.uniform(0, 1, size=length)
    s[0] = 0.0  # clipped emissions are part of the definition
    got = smooth_tokens(s, p_stay)
    np.testing.assert_allclose(got, brute_force(s, p_stay), rtol=1e-5, atol=1e-6)


def test_batch_with_padding_equals_one_by_one() -> None:
    rng = np.random.default_rng(0)
    seqs = [rng.uniform(size=n) for n in (7, 1, 10, 3)]
    batch = smooth_tokens(seqs, 0.9)
    for s, b in zip(seqs, batch, strict=True):
        np.testing.assert_allclose(b, brute_force(s, 0.9), rtol=1e-5, atol=1e-6)
    # The padded array interface marks padding as NaN and leaves real positions exact.
    pad = np.full((2, 10), 0.123)
    pad[0, :7], pad[1, :3] = seqs[0], seqs[3]
    post = forward_backward(pad, [7, 3], 0.9)
    assert np.isnan(post[0, 7:]).all() and np.isnan(post[1, 3:]).all()
    np.testing.assert_allclose(post[1, :3], brute_force(seqs[3], 0.9), rtol=1e-5)


def test_stable_on_long_answers() -> None:
    # 5,000 confident tokens would underflow a probability-space forward pass.
    s = np.full(5000, 0.999)
    s[2500:2600] = 0.001
    post = smooth_tokens(s, 0.993)
    assert np.isfinite(post).all()
    assert post[:2000].min() > 0.99 and post[2540:2560].max() < 0.5


def test_persistence_fills_a_gap_and_removes_a_lone_spike() -> None:
    s = np.asarray([0.05] * 10 + [0.9, 0.9, 0.3, 0.9, 0.9] + [0.05] * 10 + [0.7] + [0.05] * 10)
    post = smooth_tokens(s, 0.9)
    assert post[12] > 0.5  # the dip inside the span is filled
    assert post[25] < s[25]  # a lone token is damped
    assert post[:5].max() < 0.05


def test_p_stay_half_returns_the_clipped_scores() -> None:
    s = np.asarray([0.0, 0.3, 1.0])
    np.testing.assert_allclose(smooth_tokens(s, 0.5), np.clip(s, CLIP, 1 - CLIP), rtol=1e-6)


def test_answer_score_is_the_max_of_smoothed_scores() -> None:
    s = np.asarray([0.1, 0.2, 0.95, 0.9, 0.1])
    assert answer_score(s, 0.93) == pytest.approx(float(brute_force(s, 0.93).max()), rel=1e-5)
    assert answer_score(np.zeros(0)) == 0.0


@pytest.mark.parametrize(
    ("scores", "p_stay", "match"),
    [
        ([0.2, 1.5], 0.9, "probabilities"),
        ([0.2, float("nan")], 0.9, "probabilities"),
        ([0.2, 0.3], 1.2, "p_stay"),
    ],
)
def test_bad_input_is_refused(scores: list[float], p_stay: float, match: str) -> None:
    with pytest.raises(DataError, match=match):
        smooth_tokens(np.asarray(scores), p_stay)


def test_flagged_spans_and_overlap_f1() -> None:
    offsets = np.asarray([[0, 3], [3, 7], [7, 12], [12, 15], [15, 20]])
    spans = flagged_spans(np.asarray([0.9, 0.8, 0.1, 0.7, 0.2]), offsets, 0.5)
    assert spans == [(0, 7), (12, 15)]
    m = span_overlap_f1(spans, [(4, 6)])
    assert m["precision"] == 0.5 and m["recall"] == 1.0
    assert m["f1"] == pytest.approx(2 / 3)
    assert span_overlap_f1([], [])["f1"] == 1.0
    assert span_overlap_f1([], [(0, 2)])["f1"] == 0.0


def test_token_flags_take_the_threshold_itself_and_never_a_nan() -> None:
    scores = np.array([0.2, 0.5, np.nan, 0.7, 0.49999])
    assert token_flags(scores, 0.5).tolist() == [False, True, False, True, False]
    assert token_flags([], 0.5).shape == (0,)
    offsets = np.array([[0, 3], [4, 7], [8, 9], [10, 12], [13, 15]])
    assert flagged_spans(scores, offsets, 0.5) == [(4, 7), (10, 12)]


def test_token_prf_counts_the_flags_against_gold_tokens() -> None:
    flags = np.array([True, True, False, False, True])
    gold = np.array([1, 0, 1, 0, 1])
    m = token_prf(flags, gold)
    assert m["precision"] == pytest.approx(2 / 3) and m["recall"] == pytest.approx(2 / 3)
    assert m["f1"] == pytest.approx(2 / 3)
    assert token_prf(np.zeros(3, bool), np.zeros(3, int)) == {
        "precision": 0.0,
        "recall": 0.0,
        "f1": 0.0,
    }
