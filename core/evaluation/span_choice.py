"""Choosing a set's span rule for span F1, and measuring the choice honestly.

:func:`choose_span_rule` reads a detector's out-of-fold verdicts of a cross-validation
(token scores, answer probability and flag, each from a detector that never saw the
answer) and picks the :class:`~core.learning.span_rule.SpanRule` with the best span F1
(character overlap, micro over the answers, as LettuceDetect and RAGTruth count it)
among those that flag at most :data:`MAX_FAITHFUL_SHARE` of faithful answers'
characters on average. Nested over the same folds: for each fold the rule is chosen on
the other folds' answers and applied to that fold, so the span precision, recall, F1
and faithful share it reports are of rules that never saw the answers they are measured
on; the rule it returns is then chosen on every answer. Beside it: the flag-everything
baseline (every character of every answer), without which a span F1 means little (the
judge's plain spans at its own token threshold are the run's ``spans``).

Every candidate's spans come from :func:`core.pipeline.span_judge.rule_spans`, the
function ``ragscope judge`` and the pages use, so what is measured is what is shown.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from itertools import product
from typing import Any

import numpy as np

from core.base.examples import RAGExample
from core.learning.contract import Verdict
from core.learning.metrics import group_resamples
from core.learning.span_rule import Extend, SpanRule
from core.pipeline.span_judge import rule_spans
from core.signals.smoothing import token_flags

THRESHOLDS: tuple[float, ...] = tuple(round(0.05 + 0.025 * i, 3) for i in range(37))
"""Span thresholds tried (0.05 to 0.95)."""
ANSWER_WEIGHTS: tuple[float, ...] = (0.0, 1.0, 2.0)
GAPS: tuple[int, ...] = (1, 3)
GATES: tuple[bool, ...] = (False, True)
EXTENDS: tuple[Extend, ...] = ("words", "sentence")
MAX_FAITHFUL_SHARE = 0.10
"""Most of a faithful answer's characters a chosen rule may flag on average."""


@dataclass(frozen=True)
class _Counts:
    """Per candidate rule ``c`` and answer ``i``: predicted and overlapping characters,
    and the share of the answer flagged."""

    rules: tuple[SpanRule, ...]
    pred: np.ndarray  # [C, N]
    overlap: np.ndarray  # [C, N]
    gold: np.ndarray  # [N]
    length: np.ndarray  # [N]
    faithful: np.ndarray  # [N] bool

    def metrics(self, c: int | np.ndarray, idx: np.ndarray) -> dict[str, Any]:
        """Span P/R/F1 and faithful share of rule ``c`` (one per answer when an array)
        over answers ``idx``."""
        if isinstance(c, np.ndarray):
            pred = self.pred[c[idx], idx].sum()
            ov = self.overlap[c[idx], idx].sum()
            share_rows = self.pred[c[idx], idx] / np.maximum(self.length[idx], 1)
        else:
            pred = self.pred[c, idx].sum()
            ov = self.overlap[c, idx].sum()
            share_rows = self.pred[c, idx] / np.maximum(self.length[idx], 1)
        gold = self.gold[idx].sum()
        return _prf(float(pred), float(ov), float(gold)) | {
            "faithful_share": _mean(share_rows[self.faithful[idx]]),
        }


def _prf(pred: float, overlap: float, gold: float) -> dict[str, Any]:
    p = overlap / pred if pred else 0.0
    r = overlap / gold if gold else None
    f = (2 * p * r / (p + r) if p + r else 0.0) if r is not None else None
    return {"precision": p, "recall": r, "f1": f}


def _mean(x: np.ndarray) -> float | None:
    return float(x.mean()) if x.size else None


def candidates() -> tuple[SpanRule, ...]:
    """Every rule :func:`choose_span_rule` tries."""
    return tuple(
        SpanRule(
            threshold=t,
            answer_weight=w,
            gate=g,
            gap_tokens=k,
            extend=x,
            chosen="cross-validation",
        )
        for w, k, x, g, t in product(ANSWER_WEIGHTS, GAPS, EXTENDS, GATES, THRESHOLDS)
    )


def _overlap(spans: Sequence[tuple[int, int, float]], gold: Sequence[tuple[int, int]]) -> int:
    return sum(max(0, min(b, gb) - max(a, ga)) for a, b, _ in spans for ga, gb in gold)


def span_counts(
    examples: Sequence[RAGExample],
    verdicts: Sequence[Verdict],
    answer_thresholds: Sequence[float],
    rules: Sequence[SpanRule],
) -> _Counts:
    """Each rule's predicted and gold-overlapping characters on each answer."""
    n, c = len(examples), len(rules)
    pred = np.zeros((c, n))
    overlap = np.zeros((c, n))
    for i, (e, v, t) in enumerate(zip(examples, verdicts, answer_thresholds, strict=True)):
        gold = [(s.start, s.end) for s in e.spans]
        # A rule's characters depend only on which tokens it flags, its gap and its
        # widening (a gated rule on an answer the judge flags spans as its ungated twin;
        # on one it does not, nothing): each distinct flag set is spanned once, by the
        # function the judge uses.
        done: dict[tuple[bytes, int, str], tuple[float, float]] = {}
        combined: dict[float, np.ndarray] = {}
        tok = v.token_scores
        for j, rule in enumerate(rules):
            if tok is None or (rule.gate and not v.hallucinated):
                continue
            if rule.answer_weight not in combined:
                thr = v.threshold if v.threshold is not None else t
                combined[rule.answer_weight] = rule.combined(tok, v.score, thr)
            flags = np.flatnonzero(token_flags(combined[rule.answer_weight], rule.threshold))
            key = (flags.tobytes(), rule.gap_tokens, rule.extend)
            if key not in done:
                spans, _ = rule_spans(e.response, v, replace(rule, gate=False), answer_threshold=t)
                done[key] = (sum(b - a for a, b, _ in spans), _overlap(spans, gold))
            pred[j, i], overlap[j, i] = done[key]
    return _Counts(
        rules=tuple(rules),
        pred=pred,
        overlap=overlap,
        gold=np.asarray([sum(s.end - s.start for s in e.spans) for e in examples], float),
        length=np.asarray([len(e.response) for e in examples], float),
        faithful=np.asarray([e.label is False for e in examples]),
    )


def _best(counts: _Counts, idx: np.ndarray) -> int:
    """The rule with the best span F1 on answers ``idx`` among those within the faithful
    share (all rules when none is); ties go to the higher threshold."""
    pred = counts.pred[:, idx].sum(axis=1)
    ov = counts.overlap[:, idx].sum(axis=1)
    gold = counts.gold[idx].sum()
    p = np.divide(ov, pred, out=np.zeros_like(ov), where=pred > 0)
    r = ov / gold if gold else np.zeros_like(ov)
    f1 = np.divide(2 * p * r, p + r, out=np.zeros_like(p), where=(p + r) > 0)
    faithful = idx[counts.faithful[idx]]
    if faithful.size:
        share = (counts.pred[:, faithful] / np.maximum(counts.length[faithful], 1)).mean(axis=1)
        ok = share <= MAX_FAITHFUL_SHARE
        if ok.any():
            f1 = np.where(ok, f1, -1.0)
    thr = np.asarray([r.threshold for r in counts.rules])
    order = np.lexsort((thr, f1))  # by F1, then threshold
    return int(order[-1])


def choose_span_rule(
    examples: Sequence[RAGExample],
    verdicts: Sequence[Verdict | None],
    answer_thresholds: Sequence[float | None],
    fold: Sequence[int],
    groups: Sequence[str],
    *,
    n_boot: int = 1000,
    seed: int = 0,
) -> dict[str, Any] | None:
    """The span rule chosen for span F1 on out-of-fold verdicts, with its nested
    measurement (see the module docstring); ``None`` when no answer has token scores and
    gold to compare (hallucinated answers without span labels are left out).

    Args:
        examples: The answers.
        verdicts: Each answer's out-of-fold verdict (``None``: not scored).
        answer_thresholds: The answer threshold of the fold that judged each.
        fold: Each answer's fold.
        groups: Each answer's source (bootstrap resamples whole sources).
    """
    keep = [
        i
        for i, (e, v, t) in enumerate(zip(examples, verdicts, answer_thresholds, strict=True))
        if v is not None
        and v.token_scores is not None
        and v.token_offsets is not None
        and t is not None
        and (e.spans or e.label is False)
    ]
    if not keep or not any(examples[i].spans for i in keep):
        return None  # nothing to find: no answer with token scores has gold spans
    exs = [examples[i] for i in keep]
    vs = [v for v in (verdicts[i] for i in keep) if v is not None]
    ts = [float(t) for t in (answer_thresholds[i] for i in keep) if t is not None]
    folds = np.asarray([fold[i] for i in keep])
    sub = span_counts(exs, vs, ts, candidates())
    if sub.gold.sum() == 0:
        return None
    n = len(exs)
    everything = np.arange(n)
    chosen_per_answer = np.zeros(n, dtype=int)
    per_fold = []
    for f in sorted(set(folds.tolist())):
        test = np.flatnonzero(folds == f)
        train = np.flatnonzero(folds != f)
        if not train.size or sub.gold[train].sum() == 0:
            chosen_per_answer[test] = _best(sub, everything)
            continue
        c = _best(sub, train)
        chosen_per_answer[test] = c
        rule = sub.rules[c]
        per_fold.append({"fold": int(f), **rule.to_json(), "measured": None})
    nested = sub.metrics(chosen_per_answer, everything)
    hits = _hits(exs, vs, ts, sub, chosen_per_answer)
    ci = _f1_ci(sub, chosen_per_answer, np.asarray([groups[i] for i in keep]), n_boot, seed)
    final = sub.rules[_best(sub, everything)]
    baseline = _prf(float(sub.length.sum()), float(sub.gold.sum()), float(sub.gold.sum()))
    by_dataset = _by_dataset(exs, sub, chosen_per_answer)
    n_faithful = int(sub.faithful.sum())
    measured = {
        "precision": nested["precision"],
        "recall": nested["recall"],
        "f1": nested["f1"],
        "f1_ci_low": ci[0],
        "f1_ci_high": ci[1],
        "faithful_share": nested["faithful_share"],
        "n_answers": n,
        "n_faithful": n_faithful,
        "n_with_spans": int((sub.gold > 0).sum()),
        "flag_everything_f1": baseline["f1"],
        "flag_everything_precision": baseline["precision"],
    }
    return {
        "rule": replace(final, measured=measured).to_json(),
        "nested": nested | {"f1_ci": list(ci)},
        "flag_everything": baseline,
        "by_dataset": by_dataset,
        "folds": per_fold,
        "hits": hits,
    }


def _by_dataset(
    examples: Sequence[RAGExample], counts: _Counts, chosen: np.ndarray
) -> dict[str, dict[str, Any]]:
    """Per dataset with span labels: the nested span P/R/F1 and faithful share of its
    answers (the rules chosen over every dataset's), and flagging everything there: a
    span F1 means little without it (a set whose gold spans cover whole answers is
    easy to "find" by flagging everything)."""
    names = np.asarray([e.provenance.dataset or "" for e in examples])
    out: dict[str, dict[str, Any]] = {}
    for name in sorted(set(names.tolist())):
        idx = np.flatnonzero(names == name)
        gold = float(counts.gold[idx].sum())
        if not gold:
            continue
        every = _prf(float(counts.length[idx].sum()), gold, gold)
        out[name] = {
            "n": int(idx.size),
            **counts.metrics(chosen, idx),
            "flag_everything_f1": every["f1"],
        }
    return out


def _hits(
    examples: Sequence[RAGExample],
    verdicts: Sequence[Verdict],
    answer_thresholds: Sequence[float],
    counts: _Counts,
    chosen: np.ndarray,
) -> list[list[Any]]:
    """``[example id, start, end]`` of every gold span the nested rules' spans overlap:
    the correctly flagged gold spans (``ragscope evaluate --evidence --flagged-by`` scores
    their types)."""
    out: list[list[Any]] = []
    for i, (e, v, t) in enumerate(zip(examples, verdicts, answer_thresholds, strict=True)):
        if not e.spans:
            continue
        spans, _ = rule_spans(e.response, v, counts.rules[int(chosen[i])], answer_threshold=t)
        for g in e.spans:
            if any(a < g.end and g.start < b for a, b, _ in spans):
                out.append([e.id, g.start, g.end])
    return out


def _f1_ci(
    counts: _Counts, chosen: np.ndarray, groups: np.ndarray, n_boot: int, seed: int
) -> tuple[float | None, float | None]:
    """95% interval of the nested span F1, resampling whole sources."""
    if n_boot <= 0:
        return None, None
    idx = np.arange(len(chosen))
    pred = counts.pred[chosen, idx]
    ov = counts.overlap[chosen, idx]
    has = (counts.gold > 0).astype(int)
    f1s = []
    for pick in group_resamples(has, groups, n_boot, seed):
        m = _prf(float(pred[pick].sum()), float(ov[pick].sum()), float(counts.gold[pick].sum()))
        if m["f1"] is not None:
            f1s.append(m["f1"])
    if not f1s:
        return None, None
    lo, hi = np.percentile(f1s, [2.5, 97.5])
    return float(lo), float(hi)


def recorded_rule(chosen: Mapping[str, Any], run: str, datasets: Sequence[str]) -> SpanRule:
    """The rule :func:`choose_span_rule` chose (its ``chosen`` result, as a CV run saves
    it), with the run and data it was measured on: what an artifact records.

    Raises:
        DataError: ``chosen`` holds no valid rule.
    """
    rule = SpanRule.from_json(chosen.get("rule"))
    measured = {**rule.measured, "run": run, "datasets": "+".join(datasets)}
    return SpanRule.from_json({**rule.to_json(), "measured": measured})
