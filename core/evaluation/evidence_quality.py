"""How well :mod:`core.pipeline.evidence` finds what a flagged span departs from, on
gold spans whose annotators said it (RAGTruth's ``meta.exp``, kept as a span's ``note``).

**Evidence hit rate.** A gold span counts when its note has a line ``Original: <text>``
whose text is a real quote of a passage, found by :func:`locate_quote`; it is a *hit*
when :func:`~core.pipeline.evidence.find_evidence`'s evidence overlaps a located range
of the quote in the same passage. The baseline is the single candidate sentence
(:func:`~core.pipeline.evidence.candidate_sentences`, the same candidates) sharing the
most distinct lowercase words with the span, stop words left out (plain word overlap:
no weights, no stems, no embeddings; ties go to the first).

**Type balanced accuracy.** A gold span counts when its type says ``Baseless``
(unsupported) or ``Conflict`` (contradicted); balanced accuracy of ``find_evidence``'s
type against it, beside the majority class (0.5 balanced accuracy by definition; its plain
accuracy is the majority's share), with the confusion counts.

Intervals are 95% percentile intervals of a bootstrap that resamples whole sources
(:func:`core.base.examples.source_key`; :func:`core.learning.metrics.group_resamples`):
spans of one source's answers are not independent.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from core.base.examples import RAGExample, Span, source_key
from core.evaluation.cv_run import stamped_run
from core.evaluation.evaluate import save_run
from core.learning.metrics import MIN_CLASS_ANSWERS, group_resamples
from core.pipeline.evidence import STOPWORDS, candidate_sentences, find_all

KIND = "evidence"
QUOTE_OVERLAP = 0.6
"""Least share of a quote's words (with repeats) a window of passage words must hold."""
MIN_FUZZY_WORDS = 3
"""A quote of fewer words must occur exactly (a word or two match anywhere)."""
MAX_QUOTE_CHARS = 1_000

QUOTE_RULE = (
    "an annotator's `Original:` line is a quote when, once its surrounding quotation "
    "marks and a trailing parenthesis are dropped and it is cut at ellipses (the longest "
    "piece is kept), it does not read as a remark about the passages (*...*, 'no mention', "
    "'not mentioned/stated/found', 'passage N') and occurs in a passage: exactly "
    "(case and spacing aside; every occurrence counts), else, for at least "
    f"{MIN_FUZZY_WORDS} words, as the window of as many passage words holding at least "
    f"{QUOTE_OVERLAP:.0%} of its words"
)

_ORIGINAL = re.compile(r"^\s*Original\s*:\s*(.+?)\s*$", re.IGNORECASE | re.MULTILINE)
_REMARK = re.compile(
    r"^\*.*\*$|\bno\s*mention|\bnot\s+(?:\w+\s+){0,2}?(?:mention|stat|found|provid|discuss|"
    r"includ|specif)|\bnowhere\b|\bpassage\s*\d|\bsources?\b",
    re.IGNORECASE,
)
_WORD = re.compile(r"\w+", re.UNICODE)


# ----------------------------------------------------------------------------- quotes


def quote_of(note: str | None) -> str | None:
    """The passage text an annotator's note quotes on its ``Original:`` line, cleaned
    (see :data:`QUOTE_RULE`), or ``None`` when there is none or it is a remark."""
    if not note:
        return None
    m = _ORIGINAL.search(note[:10_000])
    if m is None:
        return None
    text = m.group(1).strip(' \t"“”')[:MAX_QUOTE_CHARS]
    text = re.sub(r"\s*\([^()]*\)\s*$", "", text).strip(' \t"“”')
    if _REMARK.search(text):
        return None
    pieces = [p.strip(" \t\"'“”‘’.,;:") for p in re.split(r"\.\.\.|…", text)]
    best = max(pieces, key=len, default="")
    return best if _WORD.search(best) else None


def locate_quote(passages: Sequence[str], quote: str) -> list[tuple[int, int, int]]:
    """``(passage, start, end)`` of where ``quote`` occurs (see :data:`QUOTE_RULE`):
    every exact occurrence, else the best fuzzy window; empty when it does not occur."""
    words = _WORD.findall(quote[:MAX_QUOTE_CHARS])
    if not words:
        return []
    exact = re.compile(r"\W+".join(re.escape(w) for w in words), re.IGNORECASE)
    found = [(k, m.start(), m.end()) for k, p in enumerate(passages) for m in exact.finditer(p)]
    if found or len(words) < MIN_FUZZY_WORDS:
        return found
    best: tuple[float, int, int, int] | None = None
    want = _counts(w.lower() for w in words)
    n = len(words)
    for k, p in enumerate(passages):
        toks = list(_WORD.finditer(p))
        have: dict[str, int] = {}
        shared = 0
        for i, t in enumerate(toks):
            w = t.group(0).lower()
            have[w] = have.get(w, 0) + 1
            if have[w] <= want.get(w, 0):
                shared += 1
            if i >= n:
                old = toks[i - n].group(0).lower()
                if have[old] <= want.get(old, 0):
                    shared -= 1
                have[old] -= 1
            score = shared / n
            if i >= min(n, len(toks)) - 1 and (best is None or score > best[0]):
                lo = toks[max(0, i - n + 1)]
                best = (score, k, lo.start(), t.end())
    if best is None or best[0] < QUOTE_OVERLAP:
        return []
    return [(best[1], best[2], best[3])]


def _counts(words: Iterable[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for w in words:
        out[w] = out.get(w, 0) + 1
    return out


def baseline_sentence(passages: Sequence[str], text: str) -> tuple[int, int, int] | None:
    """The candidate sentence sharing the most distinct lowercase non-stop words with
    ``text`` (the first of a tie; ``None`` when none shares one)."""
    want = {w.lower() for w in _WORD.findall(text)} - STOPWORDS
    best, best_n = None, 0
    for k, a, b in candidate_sentences(passages):
        n = len(want & {w.lower() for w in _WORD.findall(passages[k][a:b])})
        if n > best_n:
            best, best_n = (k, a, b), n
    return best


def _overlaps(where: tuple[int, int, int] | None, quotes: Sequence[tuple[int, int, int]]) -> bool:
    return where is not None and any(
        k == where[0] and a < where[2] and where[1] < b for k, a, b in quotes
    )


def gold_type(span: Span) -> str | None:
    """``unsupported`` for a Baseless label type, ``contradicted`` for a Conflict one."""
    t = (span.type or "").lower()
    if "baseless" in t:
        return "unsupported"
    if "conflict" in t:
        return "contradicted"
    return None


# ----------------------------------------------------------------------------- metrics


def _share_ci(values: np.ndarray, groups: np.ndarray, n_boot: int, seed: int) -> list[float] | None:
    if values.size == 0 or n_boot <= 0:
        return None
    means = [
        float(values[idx].mean())
        for idx in group_resamples(values, groups, n_boot, seed, both_classes=False)
    ]
    return [float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))]


def _balanced(y: np.ndarray, pred: np.ndarray) -> float:
    return float(np.mean([np.mean(pred[y == c] == c) for c in (0, 1)]))


def _hit_report(rows: Sequence[tuple[str, bool, bool]], n_boot: int, seed: int) -> dict[str, Any]:
    groups = np.asarray([g for g, _, _ in rows], dtype=object)
    ours = np.asarray([h for _, h, _ in rows], dtype=np.float64)
    base = np.asarray([b for _, _, b in rows], dtype=np.float64)
    diff = ours - base
    return {
        "n": len(rows),
        "n_sources": len(set(groups.tolist())),
        "hit_rate": float(ours.mean()) if rows else None,
        "hit_rate_ci": _share_ci(ours, groups, n_boot, seed),
        "baseline_hit_rate": float(base.mean()) if rows else None,
        "baseline_hit_rate_ci": _share_ci(base, groups, n_boot, seed),
        "difference": float(diff.mean()) if rows else None,
        "difference_ci": _share_ci(diff, groups, n_boot, seed),
        "baseline": "the candidate sentence with the most shared words (plain overlap)",
        "quote_rule": QUOTE_RULE,
    }


def _type_report(rows: Sequence[tuple[str, str, str]], n_boot: int, seed: int) -> dict[str, Any]:
    groups = np.asarray([g for g, _, _ in rows], dtype=object)
    y = np.asarray([gold == "contradicted" for _, gold, _ in rows], dtype=int)
    pred = np.asarray([p == "contradicted" for _, _, p in rows], dtype=int)
    both = bool(y.size) and 0 < int(y.sum()) < y.size
    ci = None
    if both and n_boot > 0:
        vals = [_balanced(y[idx], pred[idx]) for idx in group_resamples(y, groups, n_boot, seed)]
        ci = [float(np.percentile(vals, 2.5)), float(np.percentile(vals, 97.5))] if vals else None
    majority = "contradicted" if int(y.sum()) * 2 > y.size else "unsupported"
    confusion = {
        gold: {
            p: sum(1 for _, g, q in rows if g == gold and q == p)
            for p in ("unsupported", "contradicted")
        }
        for gold in ("unsupported", "contradicted")
    }
    return {
        "n": len(rows),
        "n_sources": len(set(groups.tolist())),
        "n_contradicted": int(y.sum()),
        "balanced_accuracy": _balanced(y, pred) if both else None,
        "balanced_accuracy_ci": ci,
        "accuracy": float(np.mean(y == pred)) if rows else None,
        "accuracy_ci": _share_ci((y == pred).astype(np.float64), groups, n_boot, seed),
        "majority": {
            "type": majority,
            "balanced_accuracy": 0.5,
            "accuracy": float(np.mean(y == int(majority == "contradicted"))) if rows else None,
        },
        "confusion": confusion,
    }


def evidence_quality(
    examples: Iterable[RAGExample],
    *,
    only: Callable[[RAGExample, Span], bool] | None = None,
    n_boot: int = 1000,
    seed: int = 0,
) -> dict[str, Any]:
    """The evidence hit rate and the type balanced accuracy of
    :func:`~core.pipeline.evidence.find_evidence` on ``examples``' gold spans (see the
    module docstring), JSON-ready.

    Args:
        examples: Labelled examples; their spans' ``type`` and ``note`` are read.
        only: Keep only the gold spans it accepts (e.g. those a detector flagged).
        n_boot: Bootstrap resamples of each interval (0: none).
        seed: The bootstrap's seed.

    Returns:
        ``evidence`` (``n``, ``hit_rate`` and ``baseline_hit_rate`` with ``*_ci``, their
        ``difference``...), ``type`` (``n``, ``balanced_accuracy``, ``accuracy``,
        ``majority``, ``confusion`` gold -> predicted -> count...) and the counts of
        examples and spans read.
    """
    hits: list[tuple[str, bool, bool]] = []
    types: list[tuple[str, str, str]] = []
    n_examples = n_spans = 0
    for ex in examples:
        spans = [s for s in ex.spans if only is None or only(ex, s)]
        n_examples += 1
        n_spans += len(spans)
        if not spans:
            continue
        group = source_key(ex)
        findings = find_all(ex.passages, ex.response, [(s.start, s.end) for s in spans])
        for span, found in zip(spans, findings, strict=True):
            gold = gold_type(span)
            if gold is not None:
                types.append((group, gold, found.type))
            quote = quote_of(span.note)
            where = locate_quote(ex.passages, quote) if quote else []
            if where:
                ev = found.evidence
                ours = None if ev is None else (ev.passage, ev.start, ev.end)
                base = baseline_sentence(ex.passages, ex.response[span.start : span.end])
                hits.append((group, _overlaps(ours, where), _overlaps(base, where)))
    return {
        "n_examples": n_examples,
        "n_spans": n_spans,
        "evidence": _hit_report(hits, n_boot, seed),
        "type": _type_report(types, n_boot, seed),
        "n_boot": n_boot,
    }


# ----------------------------------------------------------------------------- the run


def evidence_run(report: Mapping[str, Any], dataset: str) -> dict[str, Any]:
    """``report`` as a run to save: with its kind, name, dataset and time."""
    return stamped_run(KIND, dataset, report)


def _fmt(v: Any, ci: Any = None, pct: bool = False) -> str:
    if v is None:
        return "-"
    f = (lambda x: f"{x:.1%}") if pct else (lambda x: f"{x:.3f}")
    return f(v) + (f" [{f(ci[0])}, {f(ci[1])}]" if ci else "")


def evidence_markdown(run: Mapping[str, Any]) -> str:
    """The run as a markdown table (what ``ragscope evaluate --evidence`` prints)."""
    ev, ty = dict(run.get("evidence") or {}), dict(run.get("type") or {})
    maj = dict(ty.get("majority") or {})
    conf = dict(ty.get("confusion") or {})
    lines = [
        f"# Evidence and span types: {run.get('dataset', '')}",
        "",
        f"{run.get('n_examples')} answers, {run.get('n_spans')} gold spans; 95% CIs resample "
        "sources.",
        "",
        "| measure | ours | baseline | n spans (sources) |",
        "|---|---|---|---|",
        f"| evidence hit rate | {_fmt(ev.get('hit_rate'), ev.get('hit_rate_ci'), True)} "
        f"| {_fmt(ev.get('baseline_hit_rate'), ev.get('baseline_hit_rate_ci'), True)} "
        f"| {ev.get('n', 0)} ({ev.get('n_sources', 0)}) |",
        f"| type balanced accuracy | "
        f"{_fmt(ty.get('balanced_accuracy'), ty.get('balanced_accuracy_ci'))} "
        f"| {_fmt(maj.get('balanced_accuracy'))} | {ty.get('n', 0)} ({ty.get('n_sources', 0)}) |",
        f"| type accuracy | {_fmt(ty.get('accuracy'), ty.get('accuracy_ci'))} "
        f"| {_fmt(maj.get('accuracy'))} | {ty.get('n', 0)} ({ty.get('n_sources', 0)}) |",
        "",
        f"Hit rate minus baseline: {_fmt(ev.get('difference'), ev.get('difference_ci'), True)} "
        "(paired, same resamples). Baseline of the hit rate: "
        f"{ev.get('baseline', '')}; of the type: always `{maj.get('type', '-')}` (majority).",
        "",
        "| gold \\ ours | unsupported | contradicted |",
        "|---|---|---|",
        *(
            f"| {g} | {dict(conf.get(g) or {}).get('unsupported', 0)} "
            f"| {dict(conf.get(g) or {}).get('contradicted', 0)} |"
            for g in ("unsupported", "contradicted")
        ),
        "",
        f"Spans counted for the hit rate: {ev.get('quote_rule', '')}.",
    ]
    lines += [f"**Too few spans.** {w}" for w in too_few(run)]
    return "\n".join(lines)


MIN_SPANS = 30
"""Fewest spans for a hit rate to read as an estimate, and fewest of each type for a
type balanced accuracy (:data:`~core.learning.metrics.MIN_CLASS_ANSWERS`)."""


def too_few(run: Mapping[str, Any]) -> list[str]:
    """What in an evidence run rests on too few spans to be read as a fact, and how many
    more it needs (empty when nothing does)."""
    out = []
    n = int(dict(run.get("evidence") or {}).get("n") or 0)
    if n < MIN_SPANS:
        out.append(
            f"The hit rate rests on {n} quoted span{'' if n == 1 else 's'}: an anecdote, not "
            f"an estimate ({MIN_SPANS - n} more needed)."
        )
    conf = dict(dict(run.get("type") or {}).get("confusion") or {})
    per = {g: sum(dict(conf.get(g) or {}).values()) for g in ("unsupported", "contradicted")}
    short = {g: k for g, k in per.items() if k < MIN_CLASS_ANSWERS}
    if short:
        out.append(
            "The type balanced accuracy rests on "
            + " and ".join(f"{k} {g} span{'' if k == 1 else 's'}" for g, k in short.items())
            + f": fewer than {MIN_CLASS_ANSWERS} of a type make it an anecdote."
        )
    return out


def save_evidence_run(run: Mapping[str, Any], folder: str | Path) -> tuple[Path, Path]:
    """The run's JSON and markdown in ``folder``."""
    return save_run(str(run.get("name", KIND)), run, evidence_markdown(run), folder)
