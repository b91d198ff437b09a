"""Token flags become spans a person can review (core.pipeline.word_spans): whole words, merged across
short gaps and across detectors, never punctuation alone."""

from __future__ import annotations

import re

import numpy as np

from core.learning.contract import Verdict
from core.pipeline.word_spans import (
    GAP_TOKENS,
    answer_spans,
    detector_spans,
    passage_sentences,
)

TEXT = "The Haggle run ended in 1820 . It was long and the bridge fell ."


def _tokens(text: str) -> np.ndarray:
    """Word and punctuation tokens with their leading space, like a BPE tokenizer's."""
    return np.array([(m.start(), m.end()) for m in re.finditer(r"\s?\w+|\s?[^\w\s]", text)])


def _verdict(name: str, flagged: list[int], text: str = TEXT) -> Verdict:
    offs = _tokens(text)
    scores = np.full(len(offs), 0.1)
    scores[flagged] = 0.9
    return Verdict(
        detector=name, example_id="x", score=0.5, token_scores=scores, token_offsets=offs
    )


def _words(text: str) -> list[str]:
    return [text[a:b] for a, b in _tokens(text)]


def test_spans_snap_to_whole_words_and_drop_punctuation() -> None:
    words = _words(TEXT)
    assert words[:3] == ["The", " Haggle", " run"]
    offs = _tokens(TEXT)
    # A token boundary inside "Haggle": the detector's fragment "aggle run" is widened.
    offs[1] = (offs[1][0] + 2, offs[1][1])
    scores = np.full(len(offs), 0.1)
    scores[[1, 2]] = 0.9
    scores[words.index(" .")] = 0.95  # a full stop alone
    v = Verdict(detector="d", example_id="x", score=0.5, token_scores=scores, token_offsets=offs)
    spans = detector_spans(TEXT, v, 0.5)
    assert [TEXT[a:b] for a, b, _ in spans] == ["Haggle run"]
    assert spans[0][2] == 0.9


def test_flagged_runs_merge_across_short_gaps_only() -> None:
    words = _words(TEXT)
    i = words.index(" It")
    assert GAP_TOKENS == 2
    two_apart = detector_spans(TEXT, _verdict("d", [i, i + 3]), 0.5)  # " It" .. " and"
    assert [TEXT[a:b] for a, b, _ in two_apart] == ["It was long and"]
    three_apart = detector_spans(TEXT, _verdict("d", [i, i + 4]), 0.5)
    assert [TEXT[a:b] for a, b, _ in three_apart] == ["It", "the"]


def test_detectors_spans_merge_and_name_every_detector() -> None:
    words = _words(TEXT)
    i = words.index(" 1820")
    verdicts = {
        "ensemble": _verdict("ensemble", [i - 1, i]),  # "in 1820"
        "nll": _verdict("nll", [i]),
        "spad": _verdict("spad", [words.index(" bridge")]),
        "raglens": Verdict(detector="raglens", example_id="x", score=0.9),  # no tokens
    }
    spans = answer_spans(
        TEXT, verdicts, {"ensemble": 0.5, "nll": 0.5, "spad": 0.95, "raglens": 0.5}
    )
    assert [(s.text, sorted(s.detectors)) for s in spans] == [("in 1820", ["ensemble", "nll"])]
    assert spans[0].score == 0.9 and spans[0].detectors["nll"] == (0.9, 0.5)
    lower = answer_spans(TEXT, verdicts, {"spad": 0.5})
    assert [s.text for s in lower] == ["bridge"]


def test_passage_sentences_are_stripped() -> None:
    assert passage_sentences(["  One. Two!\nThree"]) == [(0, 2, 6), (0, 7, 11), (0, 12, 17)]
    # a line without a full stop (a title, a list item) is a sentence of its own
    assert passage_sentences(["Title line\nBody. More"]) == [(0, 0, 10), (0, 11, 16), (0, 17, 21)]
