"""Agreement between two reviewers: Cohen's kappa of their accept / reject decisions and the span-overlap F1 of their accepted spans; Cohen's kappa of their answer labels."""

from __future__ import annotations

import warnings
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import combinations

from sklearn.metrics import cohen_kappa_score

from core.review.answers import AnswerLabel
from core.review.book import DECISIONS, ReviewItem
from core.storage import ANSWER_LABELS


@dataclass(frozen=True, kw_only=True)
class Agreement:
    """Two reviewers on the items both reviewed.

    Attributes:
        reviewers: The pair.
        n_items: Items both reviewed.
        kappa: Cohen's kappa of their accept / reject decisions (``None`` with fewer
            than two items, NaN when both always gave one same answer).
        span_f1: Span-overlap F1 of their accepted spans (one reviewer's as
            predicted, the other's as gold), micro-averaged over answers (``None``
            when neither accepted any).
    """

    reviewers: tuple[str, str]
    n_items: int
    kappa: float | None
    span_f1: float | None


def agreement(
    items: Sequence[ReviewItem], a: str | None = None, b: str | None = None
) -> Agreement | None:
    """Agreement of two reviewers (default: the pair with the most items in common);
    ``None`` when no item has two reviews."""
    if a is None or b is None:
        counts: dict[tuple[str, str], int] = {}
        for it in items:
            names = sorted({r.reviewer for r in it.reviews})
            for pair in combinations(names, 2):
                counts[pair] = counts.get(pair, 0) + 1
        if not counts:
            return None
        a, b = max(counts, key=lambda p: (counts[p], tuple(-ord(ch) for ch in p[0])))
    both = [
        (it, ra, rb)
        for it in items
        if (ra := it.review_by(a)) is not None and (rb := it.review_by(b)) is not None
    ]
    if not both:
        return None
    da = [ra.decision for _, ra, _ in both]
    db = [rb.decision for _, _, rb in both]
    kappa: float | None = None
    if len(both) >= 2:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            kappa = float(cohen_kappa_score(da, db, labels=list(DECISIONS)))
    spans_a: dict[str, list[tuple[int, int]]] = {}
    spans_b: dict[str, list[tuple[int, int]]] = {}
    for it, ra, rb in both:
        for rv, spans in ((ra, spans_a), (rb, spans_b)):
            if rv is not None and rv.decision == "accept":
                spans.setdefault(it.example_id, []).append((rv.start, rv.end))
    hits_p = hits_g = n_p = n_g = 0
    for ex in set(spans_a) | set(spans_b):
        p, g = spans_a.get(ex, []), spans_b.get(ex, [])
        hits_p += sum(any(x0 < y1 and y0 < x1 for y0, y1 in g) for x0, x1 in p)
        hits_g += sum(any(x0 < y1 and y0 < x1 for y0, y1 in p) for x0, x1 in g)
        n_p, n_g = n_p + len(p), n_g + len(g)
    span_f1: float | None = None
    if n_p or n_g:
        prec = hits_p / n_p if n_p else 0.0
        rec = hits_g / n_g if n_g else 0.0
        span_f1 = 2 * prec * rec / (prec + rec) if prec + rec > 0 else 0.0
    return Agreement(reviewers=(a, b), n_items=len(both), kappa=kappa, span_f1=span_f1)


@dataclass(frozen=True, kw_only=True)
class AnswerAgreement:
    """Two reviewers' labels of the answers both labelled (answer marks, or their span
    decisions by :data:`~core.review.answers.LABEL_RULES`).

    Attributes:
        kappa: Cohen's kappa of their faithful / hallucinated labels (``None`` with
            fewer than two answers, NaN when both always gave one same label).
        agree: The share of those answers they label alike.
    """

    reviewers: tuple[str, str]
    n_answers: int
    kappa: float | None
    agree: float


def answer_agreement(
    labels: Iterable[AnswerLabel], a: str | None = None, b: str | None = None
) -> AnswerAgreement | None:
    """Agreement of two reviewers on whole answers (default: the pair with the most
    answers in common); ``None`` when no answer has two reviewers' labels."""
    per = [{r.reviewer: r.label for r in lab.reviewers} for lab in labels]
    if a is None or b is None:
        counts = Counter(pair for p in per for pair in combinations(sorted(p), 2))
        if not counts:
            return None
        a, b = min(counts, key=lambda pair: (-counts[pair], pair))
    both = [(p[a], p[b]) for p in per if a in p and b in p]
    if not both:
        return None
    kappa: float | None = None
    if len(both) >= 2:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            kappa = float(
                cohen_kappa_score([x for x, _ in both], [y for _, y in both], labels=ANSWER_LABELS)
            )
    agree = sum(x == y for x, y in both) / len(both)
    return AnswerAgreement(reviewers=(a, b), n_answers=len(both), kappa=kappa, agree=agree)
