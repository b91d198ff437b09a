"""Span precision/recall/F1 by character overlap (RAGTruth / LettuceDetect)."""

from __future__ import annotations

import pytest

from core.learning.metrics import SPAN_F1_NOTE, span_overlap_metrics


def test_span_overlap_by_hand() -> None:
    # answer 0: predicted [0, 10) and [20, 25), gold [5, 22) -> overlap 5 + 2 = 7
    # answer 1: faithful, predicted [0, 4) -> 4 false characters, no gold
    # answer 2: hallucinated, nothing predicted, gold [3, 9) -> 6 missed characters
    m = span_overlap_metrics(
        [[(0, 10), (20, 25)], [(0, 4)], []],
        [[(5, 22)], [], [(3, 9)]],
    )
    assert (m["predicted_chars"], m["gold_chars"], m["overlap_chars"]) == (19, 23, 7)
    assert m["precision"] == pytest.approx(7 / 19)
    assert m["recall"] == pytest.approx(7 / 23)
    p, r = 7 / 19, 7 / 23
    assert m["f1"] == pytest.approx(2 * p * r / (p + r))
    assert m["n_answers"] == 3


def test_span_overlap_is_micro_not_a_mean_of_answers() -> None:
    # a perfect short answer and a missed long one: micro recall 2/12, not (1 + 0) / 2
    m = span_overlap_metrics([[(0, 2)], []], [[(0, 2)], [(0, 10)]])
    assert m["precision"] == 1.0
    assert m["recall"] == pytest.approx(2 / 12)


def test_nothing_predicted_is_zero_and_no_gold_is_none() -> None:
    none = span_overlap_metrics([[], []], [[(0, 5)], []])
    assert (none["precision"], none["recall"], none["f1"]) == (0.0, 0.0, 0.0)
    nogold = span_overlap_metrics([[(0, 3)]], [[]])
    assert (nogold["precision"], nogold["recall"], nogold["f1"]) == (None, None, None)
    assert nogold["predicted_chars"] == 3
    assert span_overlap_metrics([], [])["f1"] is None


def test_misaligned_answers_are_refused() -> None:
    with pytest.raises(ValueError, match="2 answers of predicted spans but 1"):
        span_overlap_metrics([[], []], [[]])


def test_the_note_names_what_it_compares_with() -> None:
    assert "58.9" in SPAN_F1_NOTE and "character overlap" in SPAN_F1_NOTE
