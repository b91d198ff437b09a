"""Detectors' token flags turned into whole-word spans of the answer (each detector's own,
and their union for a researcher), and the passages' sentences. The spans a set shows are
decided once by :mod:`core.pipeline.span_judge`, on :func:`flagged_spans`.

A detector flags the tokens scoring at least its token threshold
(:func:`core.learning.contract.flag_threshold`). Its flagged runs separated by at most
:data:`GAP_TOKENS` unflagged tokens merge; each span is then widened to whole words and
trimmed of surrounding whitespace, and a span with no letter or digit (a full stop, a
space) is dropped. Spans of several detectors that overlap merge into one span naming
them all. The ensemble's token scores feed spans like any other token detector's.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from core.learning.contract import Verdict
from core.signals.smoothing import token_flags

GAP_TOKENS = 2
"""Flagged runs of one detector separated by at most this many unflagged tokens merge
(a claim is rarely flagged on every one of its tokens)."""

_WORD = re.compile(r"\w", re.UNICODE)


@dataclass(frozen=True, kw_only=True)
class DetectorSpan:
    """A flagged span of an answer, whole words.

    Attributes:
        start, end: Character range ``[start, end)`` of the answer.
        text: The answer's text there.
        detectors: Detector name -> ``(highest token score in the span, its token
            threshold)``.
    """

    start: int
    end: int
    text: str
    detectors: Mapping[str, tuple[float, float]]

    @property
    def score(self) -> float:
        """The highest token score of any detector that flags the span."""
        return max(s for s, _ in self.detectors.values())

    @property
    def margin(self) -> float:
        """How far the closest detector is above its threshold (small: uncertain)."""
        return min(s - t for s, t in self.detectors.values())


def _snap(text: str, start: int, end: int) -> tuple[int, int]:
    """``[start, end)`` widened to whole words and trimmed of surrounding whitespace."""
    start, end = max(0, min(start, len(text))), max(0, min(end, len(text)))
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    while start > 0 and _WORD.match(text[start - 1]) and _WORD.match(text[start]):
        start -= 1
    while end < len(text) and end > 0 and _WORD.match(text[end - 1]) and _WORD.match(text[end]):
        end += 1
    return start, end


def detector_spans(
    response: str, verdict: Verdict, threshold: float, *, gap_tokens: int = GAP_TOKENS
) -> list[tuple[int, int, float]]:
    """One detector's flagged spans of ``response``: ``(start, end, highest token
    score)``, whole words, in answer order (see the module docstring)."""
    if verdict.token_scores is None or verdict.token_offsets is None:
        return []
    return flagged_spans(
        response, verdict.token_scores, verdict.token_offsets, threshold, gap_tokens=gap_tokens
    )


def flagged_spans(
    response: str,
    token_scores: np.ndarray,
    token_offsets: np.ndarray,
    threshold: float,
    *,
    gap_tokens: int = GAP_TOKENS,
) -> list[tuple[int, int, float]]:
    """``(start, end, highest score)`` of the runs of tokens scoring at least
    ``threshold``, runs within ``gap_tokens`` tokens merged, widened to whole words,
    spans of punctuation or space alone dropped, in answer order."""
    scores = np.asarray(token_scores, dtype=np.float64).reshape(-1)
    offsets = np.asarray(token_offsets).reshape(-1, 2)
    n = min(scores.shape[0], offsets.shape[0])
    flagged = np.flatnonzero(token_flags(scores[:n], threshold))
    runs: list[list[int]] = []
    for j in flagged.tolist():
        if runs and j - runs[-1][1] - 1 <= gap_tokens:
            runs[-1][1] = j
        else:
            runs.append([j, j])
    out: list[tuple[int, int, float]] = []
    for a, b in runs:
        start, end = _snap(response, int(offsets[a, 0]), int(offsets[b, 1]))
        if end <= start or not any(c.isalnum() for c in response[start:end]):
            continue
        merge_into(out, start, end, float(scores[a : b + 1].max()))
    return out


def merge_into(out: list[tuple[int, int, float]], start: int, end: int, score: float) -> None:
    """Append ``(start, end, score)`` to spans in answer order, merged into the last one
    when it reaches into it (widened into the previous span: one span, its highest score)."""
    if out and start < out[-1][1]:
        prev = out[-1]
        out[-1] = (prev[0], max(prev[1], end), max(prev[2], score))
    else:
        out.append((start, end, score))


def answer_spans(
    response: str,
    verdicts: Mapping[str, Verdict],
    thresholds: Mapping[str, float],
    *,
    gap_tokens: int = GAP_TOKENS,
) -> list[DetectorSpan]:
    """The flagged spans of an answer, merged across detectors, in answer order: every
    detector in ``thresholds`` whose verdict gives token scores flags its
    :func:`detector_spans`; overlapping spans merge, naming each detector once with its
    highest score."""
    parts: list[tuple[int, int, str, float, float]] = []
    for name, thr in thresholds.items():
        v = verdicts.get(name)
        if v is None:
            continue
        for start, end, score in detector_spans(response, v, thr, gap_tokens=gap_tokens):
            parts.append((start, end, name, score, float(thr)))
    parts.sort()
    spans: list[DetectorSpan] = []
    group: list[tuple[int, int, str, float, float]] = []
    for part in parts:
        if group and part[0] >= max(p[1] for p in group):
            spans.append(_merged(response, group))
            group = []
        group.append(part)
    if group:
        spans.append(_merged(response, group))
    return spans


def _merged(response: str, parts: Sequence[tuple[int, int, str, float, float]]) -> DetectorSpan:
    start, end = min(p[0] for p in parts), max(p[1] for p in parts)
    by: dict[str, tuple[float, float]] = {}
    for _, _, name, score, thr in parts:
        if name not in by or score > by[name][0]:
            by[name] = (score, thr)
    return DetectorSpan(
        start=start, end=end, text=response[start:end], detectors=dict(sorted(by.items()))
    )


_PASSAGE_BOUNDARY = re.compile(r"[.!?]+[\"'”’)\]]*(?=\s|$)|\n")
"""Where a passage sentence ends: ., ! or ? (and any closing quote or bracket) before
white space or the end, or a line break. A stop inside a token is not an end: "4.5 m",
"3.14" and "example.com" stay whole."""
_LIST_MARK = re.compile(r"\s*(?:\d{1,3}|[A-Za-z])[.)]")
"""A list item's mark ("4.", "b)"): a stop after it does not end a sentence."""


def passage_sentences(passages: Sequence[str]) -> list[tuple[int, int, int]]:
    """``(passage index, start, end)`` of every sentence of the passages (stripped); a line
    without a full stop (a title, a list item) is a sentence of its own. A sentence ends
    at :data:`_PASSAGE_BOUNDARY` (not inside "4.5", not after a list mark such as "4.")."""
    out = []
    for k, p in enumerate(passages):
        at = 0
        for m in [*_PASSAGE_BOUNDARY.finditer(p), None]:
            if m is None:
                end, nxt = len(p), len(p)
            elif m.group() == "\n":
                end, nxt = m.start(), m.end()
            else:
                end = nxt = m.end()
                if _LIST_MARK.fullmatch(p, at, end):
                    continue  # "4. Click": the mark opens the item
            start, stop = at, end
            while start < stop and p[start].isspace():
                start += 1
            while stop > start and p[stop - 1].isspace():
                stop -= 1
            if stop > start:
                out.append((k, start, stop))
            at = nxt
    return out
