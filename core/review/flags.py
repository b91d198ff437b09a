"""Flags to review: detectors' token scores on one answer turned into flagged character spans (merged across detectors), the verdicts of a dataset, and the passage sentences that bear on a flag."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from core.contract import Detector, Verdict
from core.embed import embed
from core.examples import RAGExample
from core.extract import FeatureCache, extract_features
from core.model import LoadedModel
from core.smoothing import flagged_spans, smooth_tokens

if TYPE_CHECKING:
    pass


@dataclass(frozen=True, kw_only=True)
class Flag:
    """A flagged character span of one answer.

    Attributes:
        example_id: The example.
        start, end: Character range ``[start, end)`` of the answer.
        sources: Detector name -> ``(max token score in the span, its threshold)``.
    """

    example_id: str
    start: int
    end: int
    sources: Mapping[str, tuple[float, float]]

    @property
    def score(self) -> float:
        return max(s for s, _ in self.sources.values())

    @property
    def margin(self) -> float:
        """How far the closest detector is above its threshold (small: uncertain)."""
        return min(s - t for s, t in self.sources.values())


def propose_flags(
    example: RAGExample,
    verdicts: Mapping[str, Verdict],
    thresholds: Mapping[str, float],
    *,
    p_stay: float | None = None,
) -> list[Flag]:
    """The flagged spans of one answer, merged across detectors, in answer order.

    Each detector in ``thresholds`` that gives token scores flags the maximal runs of
    tokens scoring at least its threshold (after :func:`core.smoothing.smooth_tokens`
    with ``p_stay`` when given). Spans of any detectors that overlap merge into one.
    """

    raw: list[tuple[int, int, str, float, float]] = []
    for name, thr in thresholds.items():
        v = verdicts.get(name)
        if v is None or v.token_scores is None or v.token_offsets is None:
            continue
        scores = np.asarray(v.token_scores, dtype=np.float64)
        if not scores.size:
            continue
        if p_stay is not None:
            scores = smooth_tokens(scores, p_stay)
        offs = np.asarray(v.token_offsets)
        for s, e in flagged_spans(scores, offs, thr):
            inside = (offs[:, 0] < e) & (s < offs[:, 1])
            start = max(0, min(s, len(example.response)))
            end = min(max(e, start + 1), len(example.response))
            if end > start:
                raw.append((start, end, name, float(scores[inside].max()), float(thr)))
    raw.sort()
    flags: list[Flag] = []
    cur: list[tuple[int, int, str, float, float]] = []
    for item in raw:
        if cur and item[0] < max(x[1] for x in cur):
            cur.append(item)
            continue
        if cur:
            flags.append(_merge(example.id, cur))
        cur = [item]
    if cur:
        flags.append(_merge(example.id, cur))
    return flags


def _merge(example_id: str, parts: Sequence[tuple[int, int, str, float, float]]) -> Flag:
    sources: dict[str, tuple[float, float]] = {}
    for _, _, name, score, thr in parts:
        old = sources.get(name)
        if old is None or score > old[0]:
            sources[name] = (score, thr)
    return Flag(
        example_id=example_id,
        start=min(p[0] for p in parts),
        end=max(p[1] for p in parts),
        sources=dict(sorted(sources.items())),
    )


def dataset_verdicts(
    model: LoadedModel,
    examples: Sequence[RAGExample],
    detectors: Sequence[Detector],
    *,
    cache: FeatureCache | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> tuple[list[RAGExample], dict[str, dict[str, Verdict]]]:
    """Every detector's verdict on every example (one trace per example, features from
    the cache when there); returns the examples read and ``{example id: {name: verdict}}``.
    Examples that cannot be read are left out."""

    ext = extract_features(
        model, examples, list(detectors), cache=cache, progress=progress, on_error="skip"
    )
    out: dict[str, dict[str, Verdict]] = {e.id: {} for e in ext.examples}
    for d in detectors:
        for f in ext.features[d.name]:
            out[f.example_id][d.name] = d.predict(f)
    return list(ext.examples), out


_SENTENCE = re.compile(r"[^.!?\n]+(?:[.!?]+|$)")


def passage_sentences(passages: Sequence[str]) -> list[tuple[int, int, int]]:
    """``(passage index, start, end)`` of every sentence of the passages (stripped)."""
    out = []
    for k, p in enumerate(passages):
        for m in _SENTENCE.finditer(p):
            start, end = m.start(), m.end()
            while start < end and p[start].isspace():
                start += 1
            while end > start and p[end - 1].isspace():
                end -= 1
            if end > start:
                out.append((k, start, end))
    return out


def related_context(
    passages: Sequence[str], claim: str, *, k: int = 2, floor: float = 0.3
) -> list[tuple[int, int, int, float]]:
    """The passage sentences closest in meaning to ``claim`` (sentence embeddings,
    :mod:`core.embed`): up to ``k`` of ``(passage, start, end, cosine)`` with cosine >=
    ``floor``, closest first. What a reviewer checks the flagged claim against."""

    sents = passage_sentences(passages)
    if not sents or not claim.strip():
        return []
    vecs = embed([passages[p][a:b] for p, a, b in sents])
    q = embed([claim])[0]
    sims = vecs @ q
    order = np.argsort(-sims, kind="stable")[:k]
    return [(*sents[i], float(sims[i])) for i in order if sims[i] >= floor]
