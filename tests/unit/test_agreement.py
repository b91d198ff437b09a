"""Cross-detector agreement: the verdict table, correlations, gold matrix, pairwise
right/wrong shares and the disagreement ranking, against hand-computed cases."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import spearmanr

from core.analysis.detector_agreement import (
    disagreements,
    gold_matrix,
    pairwise_gold,
    score_correlation,
    verdict_table,
)
from core.base.examples import RAGExample
from core.learning.contract import Verdict

SCORES = {  # example -> (a, b, c) scores; threshold 0.5 for all
    "e0": (0.9, 0.8, 0.2),  # gold 1: a right, b right, c wrong
    "e1": (0.1, 0.7, 0.3),  # gold 0: a right, b wrong, c right
    "e2": (0.6, 0.2, 0.7),  # gold 1: a right, b wrong, c right
    "e3": (0.4, 0.3, 0.1),  # gold 0: all right
    "e4": (0.2, 0.9, 0.8),  # unlabelled
}
GOLD = {"e0": True, "e1": False, "e2": True, "e3": False, "e4": None}


def _examples() -> list[RAGExample]:
    return [
        RAGExample(id=i, question="q", passages=("p",), response="r", label=GOLD[i]) for i in SCORES
    ]


def _verdicts(skip: str | None = None):
    out = {}
    for i, row in SCORES.items():
        out[i] = {
            d: Verdict(detector=d, example_id=i, score=s, hallucinated=s >= 0.5)
            for d, s in zip("abc", row, strict=True)
            if not (i == skip and d == "c")
        }
    return out


def test_table_keeps_answers_every_detector_judged():
    t = verdict_table(_examples(), _verdicts(skip="e3"), ["a", "b", "c"])
    assert t.example_ids == ("e0", "e1", "e2", "e4")
    np.testing.assert_array_equal(t.calls[:, 1], [1, 1, 0, 1])
    np.testing.assert_array_equal(t.gold, [1, 0, 1, -1])
    assert list(t.frame().columns) == ["example", "gold", "a", "b", "c"]


def test_correlation_gold_matrix_and_pairs_match_hand_counts():
    t = verdict_table(_examples(), _verdicts(), ["a", "b", "c"])
    corr = score_correlation(t)
    a, b = t.scores[:, 0], t.scores[:, 1]
    assert corr.loc["a", "b"] == pytest.approx(spearmanr(a, b).statistic)
    assert corr.loc["c", "c"] == pytest.approx(1.0)
    right = gold_matrix(t)
    np.testing.assert_array_equal(right, [[1, 1, 0], [1, 0, 1], [1, 0, 1], [1, 1, 1], [-1, -1, -1]])
    pairs = pairwise_gold(t).set_index(["A", "B"])
    # a vs b over the 4 labelled answers: both right e0, e3; only a e1, e2
    assert pairs.loc[("a", "b")].to_dict() == pytest.approx(
        {"both right": 0.5, "only A": 0.5, "only B": 0.0, "neither": 0.0, "n": 4}
    )
    # b vs c: both e3; only b e0; only c e1, e2
    assert pairs.loc[("b", "c")].to_dict() == pytest.approx(
        {"both right": 0.25, "only A": 0.25, "only B": 0.5, "neither": 0.0, "n": 4}
    )
    assert len(pairs) == 3


def test_disagreements_rank_split_calls_first():
    t = verdict_table(_examples(), _verdicts(), ["a", "b", "c"])
    d = disagreements(t)
    # calls: e0 1,1,0  e1 0,1,0  e2 1,0,1  e3 0,0,0  e4 0,1,1 -> e3 is unanimous, last
    assert d["example"].iloc[-1] == "e3" and d["split"].iloc[-1] == 0.0
    assert set(d["example"].iloc[:4]) == {"e0", "e1", "e2", "e4"}
    assert d["split"].iloc[0] == pytest.approx(1 / 3)
    top = d.iloc[:4]
    assert list(top["score spread"]) == sorted(top["score spread"], reverse=True)
    assert list(d.columns[-3:]) == ["a", "b", "c"]


def test_a_detector_without_signal_is_left_out_named_never_a_flag():
    """Issue 67: after an adaptation four detectors scored every answer 0.500 against a
    threshold of 0.500; Agreement drew four blank rows and counted their flags. A
    detector whose calibration carries no signal on the answers is left out, with why;
    one without it on some answers only calls none there (it is never a flag)."""
    why = "no signal on mine: its calibration there is flat"
    verdicts = _verdicts()
    for i in verdicts:
        verdicts[i]["c"] = Verdict(
            detector="c", example_id=i, score=0.5, threshold=0.5, no_signal=why
        )
    t = verdict_table(_examples(), verdicts, ["a", "b", "c"])
    assert t.detectors == ("a", "b") and dict(t.left_out) == {"c": why}
    assert t.scores.shape == (5, 2) and t.calls.shape == (5, 2)
    # no signal on one answer only: the detector stays, no flag there
    some = _verdicts()
    some["e0"]["c"] = Verdict(
        detector="c", example_id="e0", score=0.5, threshold=0.5, no_signal=why
    )
    t = verdict_table(_examples(), some, ["a", "b", "c"])
    assert t.detectors == ("a", "b", "c") and not t.left_out
    assert t.calls[list(t.example_ids).index("e0"), 2] == 0
