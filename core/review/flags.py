"""Flags to review: the spans the set decides on each answer (:func:`set_flags`, the
default: :func:`core.pipeline.span_judge.decide_spans`, the spans every page and
``ragscope judge`` show), or, for a researcher, the whole-word spans chosen detectors flag
at their own token thresholds (:func:`core.pipeline.word_spans.answer_spans`); a scan of a
dataset that says why it found none, and the verdicts of a dataset."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from core.base.examples import RAGExample
from core.base.words import counted
from core.engine.model import LoadedModel
from core.learning.contract import Verdict
from core.pipeline.extract import FeatureCache
from core.pipeline.judge import AnswerVerdict, judge_many
from core.pipeline.sets import DetectorSet
from core.pipeline.word_spans import GAP_TOKENS, answer_spans
from core.signals.smoothing import smooth_tokens


@dataclass(frozen=True, kw_only=True)
class Flag:
    """A flagged span of one answer, whole words (a set's span or a :class:`core.pipeline.word_spans.DetectorSpan`).

    Attributes:
        example_id: The example.
        start, end: Character range ``[start, end)`` of the answer.
        sources: Detector name -> ``(max token score in the span, its token threshold)``.
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


def _smoothed(verdict: Verdict, p_stay: float) -> Verdict:
    if verdict.token_scores is None or not np.asarray(verdict.token_scores).size:
        return verdict
    scores = np.asarray(
        smooth_tokens(np.asarray(verdict.token_scores, dtype=np.float64), p_stay), dtype=np.float64
    )
    return dataclasses.replace(verdict, token_scores=scores)


def propose_flags(
    example: RAGExample,
    verdicts: Mapping[str, Verdict],
    thresholds: Mapping[str, float],
    *,
    p_stay: float | None = None,
    gap_tokens: int = GAP_TOKENS,
) -> list[Flag]:
    """The flagged spans of one answer, in answer order: :func:`core.pipeline.word_spans.answer_spans`
    (each detector in ``thresholds`` that gives token scores flags its tokens at or above
    its threshold, runs merged across gaps of up to ``gap_tokens`` tokens, widened to
    whole words, punctuation and whitespace alone dropped; spans of several detectors
    that overlap merge). With ``p_stay``, token scores are first smoothed
    (:func:`core.signals.smoothing.smooth_tokens`)."""
    if p_stay is not None:
        verdicts = {n: _smoothed(v, p_stay) for n, v in verdicts.items()}
    return [
        Flag(example_id=example.id, start=s.start, end=s.end, sources=s.detectors)
        for s in answer_spans(example.response, verdicts, thresholds, gap_tokens=gap_tokens)
    ]


@dataclass(frozen=True, kw_only=True)
class DetectorScan:
    """What one detector flagged in a scan.

    Attributes:
        detector: The detector.
        threshold: Its token threshold in the scan.
        n_scored: Answers it gave token scores for.
        top: Its highest token score over them (``None``: it scored no token).
        n_spans: Spans it flags (alone or with others).
    """

    detector: str
    threshold: float
    n_scored: int
    top: float | None
    n_spans: int


@dataclass(frozen=True, kw_only=True)
class Scan:
    """The flags of a dataset's answers and, per detector, why there are so few.

    Attributes:
        flags: Every answer's flags, answer by answer.
        n_answers: Answers scanned.
        detectors: One :class:`DetectorScan` per detector given a threshold.
    """

    flags: tuple[Flag, ...]
    n_answers: int
    detectors: tuple[DetectorScan, ...]

    def summary(self, *, new: int, unread: int = 0, again: str | None = None) -> str:
        """What the scan found, for a person: spans, how many are new in the queue,
        answers that could not be read, and for each detector that flags nothing why
        (no token scores; no token reaching its threshold, with the highest score).
        ``again``: the set's name when the scan read answers already scanned
        (:func:`scanned_head`)."""
        n_flags, old = len(self.flags), len(self.flags) - new
        out = (
            f"{scanned_head(self.n_answers, again)}: {counted(n_flags, 'flagged span')}, "
            f"{new} new in the queue ({old} {'was' if old == 1 else 'were'} there already)."
        )
        if unread:
            out += f" {counted(unread, 'answer')} could not be read."
        for d in self.detectors:
            if d.n_spans:
                continue
            if d.top is None:
                out += f" {d.detector} gives no token scores, so no spans."
            elif d.top < d.threshold:
                these = "this answer" if d.n_scored == 1 else f"these {d.n_scored} answers"
                out += (
                    f" No token of {these} reaches {d.detector}'s token "
                    f"threshold {d.threshold:.3f} (highest {d.top:.3f}): lower the "
                    "threshold to flag its most suspect words."
                )
            else:
                out += (
                    f" {d.detector}'s tokens at or above its threshold {d.threshold:.3f} "
                    "are punctuation or spaces only, so no spans."
                )
        return out


def scan_flags(
    examples: Sequence[RAGExample],
    verdicts: Mapping[str, Mapping[str, Verdict]],
    thresholds: Mapping[str, float],
    *,
    p_stay: float | None = None,
) -> Scan:
    """:func:`propose_flags` on every answer (``verdicts``: example id -> detector ->
    verdict) with a note per detector of what it flagged (:class:`Scan`; its highest
    token score is after smoothing when ``p_stay`` is given, as the flags are)."""
    if p_stay is not None:
        verdicts = {
            i: {n: _smoothed(v, p_stay) for n, v in by.items()} for i, by in verdicts.items()
        }
    flags = tuple(
        f for ex in examples for f in propose_flags(ex, verdicts.get(ex.id, {}), thresholds)
    )
    per: list[DetectorScan] = []
    for name, thr in thresholds.items():
        scored = [
            np.asarray(v.token_scores, dtype=np.float64)
            for ex in examples
            if (v := verdicts.get(ex.id, {}).get(name)) is not None
            and v.token_scores is not None
            and np.asarray(v.token_scores).size
        ]
        per.append(
            DetectorScan(
                detector=name,
                threshold=float(thr),
                n_scored=len(scored),
                top=max(float(s.max()) for s in scored) if scored else None,
                n_spans=sum(name in f.sources for f in flags),
            )
        )
    return Scan(flags=flags, n_answers=len(examples), detectors=tuple(per))


@dataclass(frozen=True, kw_only=True)
class SetScan:
    """The set's spans of a dataset's scanned answers, and for every answer the set calls
    hallucinated without a span, why.

    Attributes:
        flags: Every answer's spans, answer by answer.
        n_answers: Answers scanned.
        n_hallucinated: Of them, those the set calls hallucinated.
        unflagged: ``(example id, why)`` of each answer the set calls hallucinated but
            flags no span on (:attr:`core.pipeline.span_judge.SpanDecision.note`).
        rule: The span rule, in words (``None``: no detector of the set scores tokens).
    """

    flags: tuple[Flag, ...]
    n_answers: int
    n_hallucinated: int
    unflagged: tuple[tuple[str, str], ...]
    rule: str | None

    def summary(self, *, new: int, unread: int = 0, again: str | None = None) -> str:
        """What the scan found, for a person (the spans, how many are new, and why a
        hallucinated answer has none); ``again``: the set's name when the scan read
        answers already scanned (:func:`scanned_head`)."""
        n_flags, old = len(self.flags), len(self.flags) - new
        out = (
            f"{scanned_head(self.n_answers, again)}: the set calls "
            f"{self.n_hallucinated} hallucinated and flags {counted(n_flags, 'span')}, "
            f"{new} new in the queue ({old} {'was' if old == 1 else 'were'} there already)."
        )
        if unread:
            out += f" {counted(unread, 'answer')} could not be read."
        for example_id, why in self.unflagged[:5]:
            out += f" {example_id}: {why}."
        if len(self.unflagged) > 5:
            out += f" ({len(self.unflagged) - 5} more such answers.)"
        if self.rule:
            out += f" Spans: {self.rule}."
        return out


def set_flags(judged: Sequence[AnswerVerdict]) -> SetScan:
    """The set's spans of each judged answer as flags to review (each span's source is
    the set's span judge with its score and the rule's threshold; the members that
    agree ride along in the span, not as sources)."""
    flags: list[Flag] = []
    unflagged: list[tuple[str, str]] = []
    rule = None
    for v in judged:
        d = v.span_decision
        if d is not None and d.rule is not None:
            rule = d.rule.describe()
        for s in v.spans:
            judge = d.judge if d is not None and d.judge else v.judge
            flags.append(
                Flag(
                    example_id=v.example_id,
                    start=s.start,
                    end=s.end,
                    sources={judge: (s.score, s.threshold)},
                )
            )
        if v.hallucinated and not v.spans:
            unflagged.append((v.example_id, d.note if d is not None else "no span"))
    return SetScan(
        flags=tuple(flags),
        n_answers=len(judged),
        n_hallucinated=sum(v.hallucinated for v in judged),
        unflagged=tuple(unflagged),
        rule=rule,
    )


def judge_dataset(
    model: LoadedModel,
    examples: Sequence[RAGExample],
    dset: DetectorSet,
    *,
    cache: FeatureCache | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> list[AnswerVerdict]:
    """The set's verdict on each answer (:func:`core.pipeline.judge.judge_many`: one
    trace per answer, features from ``cache`` where there, each answer by the set's
    expert for its dataset where it has one, calibrated for its dataset): the
    probabilities and flags every page shows for that answer. Answers that cannot be
    read are left out."""
    out: list[AnswerVerdict] = []
    for i, got in enumerate(judge_many(model, examples, dset, cache=cache), start=1):
        if progress is not None:
            progress(i, len(examples))
        if isinstance(got, AnswerVerdict):
            out.append(got)
    return out


def dataset_verdicts(
    model: LoadedModel,
    examples: Sequence[RAGExample],
    dset: DetectorSet,
    *,
    cache: FeatureCache | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> tuple[list[RAGExample], dict[str, dict[str, Verdict]]]:
    """Each detector's verdict on each answer as the set judges it
    (:func:`judge_dataset`). Returns the examples read and
    ``{example id: {name: verdict}}``; answers that cannot be read are left out."""
    return split_verdicts(
        examples, judge_dataset(model, examples, dset, cache=cache, progress=progress)
    )


def split_verdicts(
    examples: Sequence[RAGExample], judged: Sequence[AnswerVerdict]
) -> tuple[list[RAGExample], dict[str, dict[str, Verdict]]]:
    """The examples judged and each one's detector verdicts (``{id: {name: verdict}}``)."""
    by_id = {e.id: e for e in examples}
    kept = [by_id[v.example_id] for v in judged if v.example_id in by_id]
    return kept, {v.example_id: dict(v.verdicts) for v in judged if v.example_id in by_id}


def scanned_head(n_answers: int, again: str | None = None) -> str:
    """How a scan's report starts: ``Scanned 3 answers`` for answers not scanned before;
    for answers scanned again (``again``: the name of the set that judged them now)
    ``Scanned again 3 answers with the default set (their verdicts replace the earlier
    scan's)``."""
    if again is None:
        return f"Scanned {counted(n_answers, 'answer')}"
    theirs = "its verdict replaces" if n_answers == 1 else "their verdicts replace"
    return (
        f"Scanned again {counted(n_answers, 'answer')} with the {again} set ({theirs} the "
        "earlier scan's)"
    )
