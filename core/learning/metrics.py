"""Detection metrics: response-level AUROC (bootstrap CI), AP, balanced accuracy, F1,
precision, recall, Pearson r; token-level AP and AUROC; threshold choice."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from core.base.words import counted


def ci_columns(metric: str) -> tuple[str, str]:
    """The table columns of ``metric``'s 95% interval (low, high) in every run frame."""
    return f"{metric} 95% CI low", f"{metric} 95% CI high"


def is_binary(y: np.ndarray) -> bool:
    return y.size > 0 and 0 < y.sum() < y.size


MIN_CLASS_ANSWERS = 10
"""Fewest answers of each class (hallucinated, faithful) for an AUROC, AP, balanced
accuracy or correlation to be reported as an estimate: below it, reports say how many
more are needed (:func:`evidence_warning`)."""


def evidence_warning(y: np.ndarray | Sequence[int], what: str = "These answers") -> str | None:
    """Why metrics of answers labelled ``y`` (0/1) are not to be read as facts — none
    labelled, one class only, or fewer than :data:`MIN_CLASS_ANSWERS` of a class — with
    what would fix it; ``None`` when there is enough of both."""
    y = np.asarray(y)
    n, pos = int(y.size), int(np.sum(y))
    neg = n - pos
    if n == 0:
        return f"{what} hold no labelled answer: no metric can be computed."
    if pos == 0 or neg == 0:
        cls = "hallucinated" if neg == 0 else "faithful"
        return (
            f"{what} hold {n} answer{'' if n == 1 else 's'}, all {cls}: AUROC and AP are undefined, and balanced "
            "accuracy, F1, precision and recall are fixed by construction, not measured. "
            "Use data with both classes (more examples, e.g. a larger --limit)."
        )
    short = min(pos, neg)
    if short < MIN_CLASS_ANSWERS:
        more = MIN_CLASS_ANSWERS - short
        need = (
            f"{counted(more, 'more answer')} of each class"
            if max(pos, neg) < MIN_CLASS_ANSWERS
            else counted(more, f"more {'hallucinated' if pos < neg else 'faithful'} answer")
        )
        return (
            f"{what} hold {pos} hallucinated and {neg} faithful answers: with fewer than "
            f"{MIN_CLASS_ANSWERS} of a class these metrics are anecdotes, not estimates "
            f"({need} needed)."
        )
    return None


MIN_CORRELATION_ANSWERS = 20
"""Fewest answers for a correlation between detectors' scores to be read as one: with
fewer, a rank correlation of ±1 or ±0.5 is what chance alone often gives (below it,
:func:`correlation_warning` says how many more are needed)."""


def correlation_warning(n: int, what: str = "These correlations") -> str | None:
    """Why correlations over ``n`` answers are not to be read as facts, with what would
    fix it; ``None`` from :data:`MIN_CORRELATION_ANSWERS` answers on."""
    if n >= MIN_CORRELATION_ANSWERS:
        return None
    return (
        f"{what} come from {n} answer{'' if n == 1 else 's'}: with fewer than "
        f"{MIN_CORRELATION_ANSWERS} a correlation of ±1 or ±0.5 is often chance "
        f"({MIN_CORRELATION_ANSWERS - n} more answers needed)."
    )


@dataclass(frozen=True, kw_only=True)
class ConfusionCounts:
    """The 2x2 confusion matrix at one threshold (positive = hallucinated)."""

    tp: int
    fp: int
    tn: int
    fn: int

    @property
    def n(self) -> int:
        return self.tp + self.fp + self.tn + self.fn

    def matrix(self) -> np.ndarray:
        """Counts as ``[[tp, fn], [fp, tn]]``: rows actual (hallucinated, faithful),
        columns predicted (hallucinated, faithful)."""
        return np.array([[self.tp, self.fn], [self.fp, self.tn]], dtype=np.int64)

    def as_dict(self) -> dict[str, int]:
        return {"tp": self.tp, "fp": self.fp, "tn": self.tn, "fn": self.fn}


def confusion_counts(labels: np.ndarray, scores: np.ndarray, threshold: float) -> ConfusionCounts:
    """Counts when ``score >= threshold`` predicts hallucinated (as :func:`response_metrics`
    counts them)."""
    y = np.asarray(labels).astype(int)
    return _counts(y, (np.asarray(scores, dtype=np.float64) >= threshold).astype(int))


def _counts(y: np.ndarray, pred: np.ndarray) -> ConfusionCounts:
    return ConfusionCounts(
        tp=int(((pred == 1) & (y == 1)).sum()),
        fp=int(((pred == 1) & (y == 0)).sum()),
        tn=int(((pred == 0) & (y == 0)).sum()),
        fn=int(((pred == 0) & (y == 1)).sum()),
    )


def token_prf(flags: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    """Token-level precision, recall and F1 of ``flags`` (the tokens flagged, as
    :func:`core.signals.smoothing.token_flags` gives them) against gold token ``labels``; 0
    where undefined (nothing flagged, nothing labelled)."""
    from sklearn.metrics import precision_recall_fscore_support

    p, r, f1, _ = precision_recall_fscore_support(
        np.asarray(labels).astype(int).reshape(-1),
        np.asarray(flags).astype(int).reshape(-1),
        average="binary",
        zero_division=0,
    )
    return {"precision": float(p), "recall": float(r), "f1": float(f1)}


def response_metrics(
    y: np.ndarray,
    scores: np.ndarray,
    threshold: float | np.ndarray,
    *,
    n_boot: int = 1000,
    seed: int = 0,
) -> dict[str, Any]:
    """Response-level metrics at ``threshold`` with a bootstrap 95% CI for AUROC.

    ``threshold`` is one number, or one per answer (each answer's own calibration's
    threshold: :attr:`core.learning.contract.Verdict.threshold`); the report's ``threshold`` is
    then ``None`` and ``thresholds`` lists the distinct ones."""
    import warnings

    from sklearn.metrics import (
        average_precision_score,
        balanced_accuracy_score,
        f1_score,
        precision_score,
        recall_score,
        roc_auc_score,
    )

    y = np.asarray(y).astype(int)
    s = np.asarray(scores, dtype=np.float64)
    thr = np.asarray(threshold, dtype=np.float64)
    if thr.ndim == 1 and thr.size and bool(np.all(thr == thr[0])):
        thr = thr[0]  # one calibration judged every answer
    pred = (s >= thr).astype(int)
    with warnings.catch_warnings():
        # One class in a small split is reported as such, not warned about.
        warnings.simplefilter("ignore", UserWarning)
        balanced = float(balanced_accuracy_score(y, pred)) if y.size else None
    out: dict[str, Any] = {
        "n": int(y.size),
        "n_positive": int(y.sum()),
        "threshold": float(thr) if thr.ndim == 0 else None,
        **({} if thr.ndim == 0 else {"thresholds": sorted({float(t) for t in thr})}),
        "balanced_accuracy": balanced,
        "f1": float(f1_score(y, pred, zero_division=0)),
        "precision": float(precision_score(y, pred, zero_division=0)),
        "recall": float(recall_score(y, pred, zero_division=0)),
        "confusion": _counts(y, pred).as_dict(),
    }
    if not is_binary(y):
        out.update(auroc=None, auroc_ci=None, ap=None, pearson_r=None)
        return out
    out["auroc"] = float(roc_auc_score(y, s))
    out["ap"] = float(average_precision_score(y, s))
    out["pearson_r"] = float(np.corrcoef(y, s)[0, 1]) if s.std() > 0 else 0.0
    # Each answer its own group: the answer-level bootstrap, same draws as drawing answers.
    out["auroc_ci"] = grouped_bootstrap_ci(y, s, np.arange(y.size), n_boot=n_boot, seed=seed)
    return out


def auroc_or_none(y: np.ndarray, scores: np.ndarray) -> float | None:
    """AUROC of ``scores`` against 0/1 ``y``; ``None`` when ``y`` holds one class only."""
    from sklearn.metrics import roc_auc_score

    y = np.asarray(y).astype(int)
    return float(roc_auc_score(y, np.asarray(scores, dtype=np.float64))) if is_binary(y) else None


def length_bins(lengths: np.ndarray, n_bins: int = 5) -> np.ndarray:
    """Each answer's length quantile bin (0 .. ``n_bins - 1``; ties share a bin)."""
    v = np.asarray(lengths, dtype=np.float64)
    if v.size == 0:
        return np.zeros(0, np.int64)
    edges = np.unique(np.quantile(v, np.linspace(0, 1, n_bins + 1)[1:-1]))
    return np.searchsorted(edges, v, side="right").astype(np.int64)


def matched_auroc(y: np.ndarray, scores: np.ndarray, strata: np.ndarray) -> float | None:
    """AUROC over the (hallucinated, faithful) pairs that share a stratum, e.g. an answer
    length bin (:func:`length_bins`): how well ``scores`` rank answers of similar length,
    so a detector that only measures length scores about 0.5. The per-stratum AUROCs
    weighted by their pair counts; ``None`` when no stratum holds both classes."""
    y = np.asarray(y).astype(int)
    s = np.asarray(scores, dtype=np.float64)
    st = np.asarray(strata)
    total, pairs = 0.0, 0
    for k in np.unique(st):
        m = st == k
        n_pos = int(y[m].sum())
        n_neg = int(m.sum()) - n_pos
        auc = auroc_or_none(y[m], s[m])
        if auc is not None:
            total += auc * n_pos * n_neg
            pairs += n_pos * n_neg
    return total / pairs if pairs else None


def _group_draws(
    groups: np.ndarray, n_boot: int, seed: int
) -> tuple[np.ndarray, int, Iterator[np.ndarray]]:
    """Each answer's group index, the number of groups, and ``n_boot`` draws of group
    indices with replacement (as many as there are groups): one seeded sequence for every
    resampling below."""
    _, g = np.unique(np.asarray(groups), return_inverse=True)
    n_groups = int(g.max()) + 1 if g.size else 0
    rng = np.random.default_rng(seed)
    return g, n_groups, (rng.integers(0, n_groups, n_groups) for _ in range(n_boot))


def group_resamples(
    y: np.ndarray, groups: np.ndarray, n_boot: int, seed: int, *, both_classes: bool = True
) -> Iterator[np.ndarray]:
    """Indices of ``n_boot`` bootstrap resamples that draw whole groups (sources) with
    replacement; resamples holding one class only are skipped (unless ``both_classes`` is
    false: a share, such as a hit rate, is defined on any resample, and skipping those
    whose ``y`` are all 0 or all 1 would pull its interval towards the middle)."""
    g, _, draws = _group_draws(groups, n_boot, seed)
    order = np.argsort(g, kind="stable")  # each group's members, in index order
    size = np.bincount(g)
    start = np.cumsum(size) - size
    for pick in draws:
        lens = size[pick]
        within = np.arange(int(lens.sum())) - np.repeat(np.cumsum(lens) - lens, lens)
        idx = order[np.repeat(start[pick], lens) + within]
        if not both_classes or is_binary(y[idx]):
            yield idx


BOOT_CHUNK = 128
"""Resamples whose AUROCs are computed together (a chunk x answers matrix of weights)."""


def _resampled_aurocs(
    y: np.ndarray, s: np.ndarray, groups: np.ndarray, n_boot: int, seed: int
) -> np.ndarray:
    """The AUROC of every resample :func:`group_resamples` draws (the same draws, the
    same skips), all at once: a resample is a count per answer (how often its group was
    drawn), and the AUROC of an answer drawn k times is the Mann-Whitney statistic with
    weight k (ties count a half), so no resample is materialised. It equals
    ``roc_auc_score`` on each resample's indices (a test checks) without its per-call
    cost: 1,000 resamples of 2,600 answers take ~0.1 s instead of ~5 s."""
    g, n_groups, draws = _group_draws(groups, n_boot, seed)
    _, level = np.unique(s, return_inverse=True)  # ties share a level
    n_levels = int(level.max()) + 1
    pos = y == 1
    out: list[np.ndarray] = []
    picks = list(draws)
    for lo in range(0, len(picks), BOOT_CHUNK):
        chunk = picks[lo : lo + BOOT_CHUNK]
        counts = np.stack([np.bincount(p, minlength=n_groups) for p in chunk])[:, g]
        w = counts.astype(np.float64)  # resamples x answers
        p_lv = np.zeros((len(chunk), n_levels))
        n_lv = np.zeros((len(chunk), n_levels))
        np.add.at(p_lv.T, level[pos], w[:, pos].T)
        np.add.at(n_lv.T, level[~pos], w[:, ~pos].T)
        below = np.cumsum(n_lv, axis=1) - n_lv  # negatives scored strictly lower
        n_p, n_n = p_lv.sum(axis=1), n_lv.sum(axis=1)
        ok = (n_p > 0) & (n_n > 0)
        wins = (p_lv * (below + 0.5 * n_lv)).sum(axis=1)
        out.append(wins[ok] / (n_p[ok] * n_n[ok]))
    return np.concatenate(out) if out else np.empty(0)


def grouped_bootstrap_ci(
    y: np.ndarray,
    scores: np.ndarray,
    groups: np.ndarray,
    metric: Literal["auroc", "ap"] = "auroc",
    *,
    n_boot: int = 1000,
    seed: int = 0,
) -> list[float] | None:
    """95% percentile interval of AUROC or AP, resampling whole groups (sources) with
    replacement: answers to one question are not independent, so resampling answers
    alone would make the interval too narrow. ``None`` without both classes.

    Not ``scipy.stats.bootstrap``: it resamples observations, not groups, and cannot skip
    a resample of one class (its statistic would be NaN, and so its interval)."""
    from sklearn.metrics import average_precision_score

    y = np.asarray(y).astype(int)
    s = np.asarray(scores, dtype=np.float64)
    if not is_binary(y) or n_boot <= 0:
        return None
    if metric == "auroc":
        vals = _resampled_aurocs(y, s, np.asarray(groups), n_boot, seed)
    else:
        vals = np.asarray(
            [
                average_precision_score(y[idx], s[idx])
                for idx in group_resamples(y, groups, n_boot, seed)
            ]
        )
    if not vals.size:
        return None
    return [float(np.percentile(vals, 2.5)), float(np.percentile(vals, 97.5))]


def token_metrics(labels: np.ndarray, scores: np.ndarray) -> dict[str, Any]:
    """Token-level AP and AUROC over all labelled tokens."""
    from sklearn.metrics import average_precision_score, roc_auc_score

    y = np.asarray(labels).astype(int)
    if not is_binary(y):
        return {"n_tokens": int(y.size), "n_positive": int(y.sum()), "ap": None, "auroc": None}
    return {
        "n_tokens": int(y.size),
        "n_positive": int(y.sum()),
        "ap": float(average_precision_score(y, scores)),
        "auroc": float(roc_auc_score(y, scores)),
    }


def best_threshold(
    y: np.ndarray, scores: np.ndarray, criterion: Literal["f1", "balanced_accuracy"] = "f1"
) -> float:
    """The score threshold that maximises ``criterion`` on (validation) data."""
    from sklearn.metrics import balanced_accuracy_score, f1_score

    y = np.asarray(y).astype(int)
    s = np.asarray(scores, dtype=np.float64)
    if not is_binary(y):
        return 0.5
    cands = np.unique(s)
    best, best_t = -1.0, 0.5
    for t in cands:
        pred = (s >= t).astype(int)
        v = (
            f1_score(y, pred, zero_division=0)
            if criterion == "f1"
            else balanced_accuracy_score(y, pred)
        )
        if v > best:
            best, best_t = v, float(t)
    return best_t


def paired_difference(
    y: np.ndarray,
    a: np.ndarray,
    b: np.ndarray,
    groups: np.ndarray,
    *,
    n_boot: int = 1000,
    seed: int = 0,
) -> dict[str, Any] | None:
    """AUROC of scores ``a`` minus AUROC of scores ``b`` on the same answers, with a
    paired, source-grouped bootstrap: each resample draws whole groups (sources) with
    replacement and scores BOTH on it, so what the two share (the same hard answers)
    cancels and the interval is for the difference itself (two overlapping marginal
    CIs say little about it).

    Returns:
        ``delta`` (a - b on all answers), its 95% percentile interval ``ci``, and ``p``:
        the two-sided bootstrap p-value of "no difference" (twice the smaller share of
        resampled differences on either side of 0, at least ``1 / resamples``;
        unadjusted for multiple comparisons); ``None`` without both classes.
    """
    from sklearn.metrics import roc_auc_score

    y = np.asarray(y).astype(int)
    sa, sb = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if not (y.shape == sa.shape == sb.shape == np.asarray(groups).shape):
        raise ValueError(
            f"paired_difference needs equal lengths, got {y.shape}, {sa.shape}, {sb.shape}, "
            f"{np.asarray(groups).shape}"
        )
    if not is_binary(y) or n_boot <= 0:
        return None
    delta = float(roc_auc_score(y, sa) - roc_auc_score(y, sb))
    pos = y == 1
    vals = [
        _auroc(pos[idx], sa[idx]) - _auroc(pos[idx], sb[idx])
        for idx in group_resamples(y, groups, n_boot, seed)
    ]
    if not vals:
        return None
    d = np.asarray(vals)
    p = 2.0 * min(float(np.mean(d <= 0.0)), float(np.mean(d >= 0.0)))
    return {
        "delta": delta,
        "ci": [float(np.percentile(d, 2.5)), float(np.percentile(d, 97.5))],
        "p": float(min(1.0, max(p, 1.0 / d.size))),
    }


def _auroc(pos: np.ndarray, s: np.ndarray) -> float:
    """AUROC from ranks (Mann-Whitney U, ties counted half): ``roc_auc_score`` without
    its checks, for the thousands of resamples of a bootstrap."""
    from scipy.stats import rankdata

    n_pos = int(pos.sum())
    n_neg = pos.size - n_pos
    u = float(rankdata(s)[pos].sum()) - n_pos * (n_pos + 1) / 2.0
    return u / (n_pos * n_neg)


SPAN_F1_NOTE = (
    "Span F1 by character overlap, as RAGTruth and LettuceDetect report it. "
    "LettuceDetect-large reports 58.9 on RAGTruth's test split, trained on its "
    "15k-answer train split; ours is a 135M-parameter analyser's detector trained on "
    "420 RAGTruth QA answers."
)
"""What the span P/R/F1 column means and what to compare it with (the CV run's
markdown and the Benchmark page both show this text)."""


def span_overlap_metrics(
    predicted: Sequence[Sequence[tuple[int, int]]],
    gold: Sequence[Sequence[tuple[int, int]]],
) -> dict[str, Any]:
    """Span precision, recall and F1 by character overlap, micro over the corpus.

    ``predicted[i]`` and ``gold[i]`` are answer ``i``'s flagged and gold hallucinated
    ``[start, end)`` character ranges (an answer may have none of either). As
    LettuceDetect's character-level evaluator counts them: overlap = the characters
    each predicted span shares with each gold span, summed; precision = overlap /
    predicted characters, recall = overlap / gold characters, each 0 where its
    denominator is, F1 their harmonic mean (0 where both are 0). Spans of one answer
    that overlap each other would be counted twice; :func:`core.pipeline.word_spans.detector_spans`
    never gives such spans. ``None`` metrics when the corpus has no gold character
    (nothing to find: the answers carry no span labels).
    """
    if len(predicted) != len(gold):
        raise ValueError(f"{len(predicted)} answers of predicted spans but {len(gold)} of gold")
    n_pred = n_gold = n_overlap = 0
    for pred, ref in zip(predicted, gold, strict=True):
        n_pred += sum(max(0, int(e) - int(s)) for s, e in pred)
        n_gold += sum(max(0, int(e) - int(s)) for s, e in ref)
        for ps, pe in pred:
            for gs, ge in ref:
                n_overlap += max(0, min(int(pe), int(ge)) - max(int(ps), int(gs)))
    out: dict[str, Any] = {
        "n_answers": len(gold),
        "predicted_chars": n_pred,
        "gold_chars": n_gold,
        "overlap_chars": n_overlap,
        "precision": None,
        "recall": None,
        "f1": None,
    }
    if n_gold == 0:
        return out
    p = n_overlap / n_pred if n_pred else 0.0
    r = n_overlap / n_gold
    out |= {"precision": p, "recall": r, "f1": 2 * p * r / (p + r) if p + r else 0.0}
    return out
