"""The spans a set shows on an answer: one decision, by the set, like its verdict.

A set's spans are decided by one detector, its **span judge**: the set's
:data:`~core.pipeline.sets.ANSWER_JUDGE` (the ensemble, whose token stacker reads every
member's token scores) when it scores tokens; else the set's only detector; else the
first of its detectors that scores tokens and has a span rule chosen in cross-validation;
else the first that scores tokens at all. Its :class:`~core.learning.span_rule.SpanRule`
(recorded in its ``cfg.json``, else :func:`~core.learning.span_rule.default_rule` at its
token threshold) turns its token scores and its answer verdict into whole-word phrases
(:func:`rule_spans`), a gated rule only in answers the set flags (the set's verdict: its
ensemble's, or its members' vote, never the span judge's alone). The union of the
members' own flags no longer makes a span; each span lists the members that agree with
it (their own flags at their own token thresholds overlap it) as evidence of how many
signals point there.

Each span then gets what it departs from (:func:`core.pipeline.evidence.find_all`): the
passage sentence it most relies on, or that none supports it, a type (``unsupported``
or ``contradicted``) and a short reason. :func:`decide_spans` is the one place this
happens; ``ragscope judge``, every page and the Python API read its result through
:class:`core.pipeline.judge.AnswerVerdict`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from core.base.examples import RAGExample
from core.learning.contract import Detector, Verdict, flag_threshold, scores_tokens
from core.learning.span_rule import SpanRule, default_rule
from core.pipeline.evidence import Evidence, SpanFinding, find_all
from core.pipeline.word_spans import detector_spans, flagged_spans, merge_into


@dataclass(frozen=True, kw_only=True)
class Span:
    """A span of an answer the set flags, whole words.

    Attributes:
        start, end: Character range ``[start, end)`` of the answer.
        text: The answer's text there.
        score: The span judge's highest (combined) token score in it.
        threshold: The rule's threshold that score reached.
        detectors: The members that agree: name -> ``(highest token score in the span,
            its own token threshold)`` for each whose own flags overlap the span.
        finding: What it departs from (evidence, type, reason); ``None`` when not asked.
    """

    start: int
    end: int
    text: str
    score: float
    threshold: float
    detectors: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    finding: SpanFinding | None = None

    @property
    def margin(self) -> float:
        """How far the span's score is above the rule's threshold (small: uncertain)."""
        return self.score - self.threshold

    @property
    def evidence(self) -> Evidence | None:
        return self.finding.evidence if self.finding is not None else None

    @property
    def type(self) -> str | None:
        return self.finding.type if self.finding is not None else None

    @property
    def reason(self) -> str | None:
        return self.finding.reason if self.finding is not None else None


@dataclass(frozen=True, kw_only=True)
class SpanDecision:
    """The set's spans of one answer, and why there are none when there are none.

    Attributes:
        judge: The detector whose token scores decided (``None``: no detector of the
            set scores tokens).
        rule: Its span rule.
        spans: The spans, in answer order.
        top: The highest combined token score of the answer (``None``: no token scores).
        note: Why the answer has no span (empty when it has some).
    """

    judge: str | None
    rule: SpanRule | None
    spans: tuple[Span, ...]
    top: float | None
    note: str = ""


def span_judge(detectors: Sequence[Detector]) -> Detector | None:
    """The detector that decides a set's spans (see the module docstring)."""
    tokens = [d for d in detectors if scores_tokens(d)]
    for d in tokens:
        if d.composite:
            return d
    if len(detectors) == 1:
        return detectors[0] if tokens else None
    for d in tokens:
        rule = getattr(d, "span_rule_", None)
        if isinstance(rule, SpanRule) and rule.chosen == "cross-validation":
            return d
    return tokens[0] if tokens else None


def rule_of(detector: Detector) -> SpanRule:
    """The detector's recorded span rule, else the default at its token threshold."""
    rule = getattr(detector, "span_rule_", None)
    return rule if isinstance(rule, SpanRule) else default_rule(flag_threshold(detector))


def rule_spans(
    response: str,
    verdict: Verdict,
    rule: SpanRule,
    *,
    answer_threshold: float | None = None,
    flagged: bool | None = None,
) -> tuple[list[tuple[int, int, float]], float | None]:
    """The rule's spans of one answer, ``(start, end, highest combined score)`` in
    answer order, and the answer's highest combined token score (``None``: the verdict
    has no token scores). ``answer_threshold``: the threshold of the verdict's answer
    probability when the verdict does not carry it (out-of-fold verdicts). ``flagged``:
    whether the set flags the answer, which a gated rule asks (``None``: the verdict's
    own call, as when the verdict is the set's)."""
    if verdict.token_scores is None or verdict.token_offsets is None:
        return [], None
    tok = np.asarray(verdict.token_scores, dtype=np.float64).reshape(-1)
    if tok.size == 0:
        return [], None
    thr = verdict.threshold if verdict.threshold is not None else answer_threshold
    combined = rule.combined(tok, verdict.score, thr)
    top = float(combined.max())
    if rule.gate and not (verdict.hallucinated if flagged is None else flagged):
        return [], top
    spans = flagged_spans(
        response, combined, verdict.token_offsets, rule.threshold, gap_tokens=rule.gap_tokens
    )
    if rule.extend == "sentence":
        spans = to_sentences(response, spans)
    return spans, top


_BOUNDARY = re.compile(r"\n+|(?<=[^\W\d_][.!?])\s+|(?<=[)\]\"'”’%][.!?])\s+")
"""Where an answer sentence ends: a line break, or ., ! or ? after a letter or a closing
mark, then space (not after a digit: "4. Click" is one list item, "in 1.5 m" one claim)."""


def answer_sentences(response: str) -> list[tuple[int, int]]:
    """``[start, end)`` of each sentence, list item or line of the answer, stripped."""
    out, at = [], 0
    for m in [*_BOUNDARY.finditer(response), None]:
        end = m.start() if m is not None else len(response)
        a, b = at, end
        while a < b and response[a].isspace():
            a += 1
        while b > a and response[b - 1].isspace():
            b -= 1
        if b > a:
            out.append((a, b))
        if m is not None:
            at = m.end()
    return out


def to_sentences(
    response: str, spans: Sequence[tuple[int, int, float]]
) -> list[tuple[int, int, float]]:
    """Each span widened to the answer sentences it touches; spans that then overlap
    merge (the highest score kept)."""
    sents = answer_sentences(response)
    out: list[tuple[int, int, float]] = []
    for a, b, s in spans:
        hit = [(x, y) for x, y in sents if x < b and a < y]
        merge_into(out, min([a, *(x for x, _ in hit)]), max([b, *(y for _, y in hit)]), s)
    return out


def decide_spans(
    example: RAGExample,
    detectors: Sequence[Detector],
    verdicts: Mapping[str, Verdict],
    *,
    flagged: bool | None = None,
    evidence: bool = True,
) -> SpanDecision:
    """The set's spans of ``example``'s answer (see the module docstring).

    Args:
        detectors: The set's fitted detectors (their token thresholds and rules).
        verdicts: Their verdicts on the answer, by name.
        flagged: The set's verdict on the answer (``core.pipeline.judge.overall_verdict``):
            a gated rule gives spans only to answers the set flags. ``None``: the span
            judge's own verdict, which is the set's when the judge is its ensemble; a set
            without one votes, and its span judge (one member) may flag an answer the
            vote calls faithful.
        evidence: Also find each span's evidence, type and reason.
    """
    judge = span_judge([d for d in detectors if d.name in verdicts])
    if judge is None:
        return SpanDecision(
            judge=None,
            rule=None,
            spans=(),
            top=None,
            note="no detector of this set scores tokens, so it flags no span",
        )
    rule = rule_of(judge)
    verdict = verdicts[judge.name]
    flags = bool(verdict.hallucinated) if flagged is None else flagged
    found, top = rule_spans(example.response, verdict, rule, flagged=flags)
    members = {
        d.name: (verdicts[d.name], flag_threshold(d))
        for d in detectors
        if d.name != judge.name and d.name in verdicts and scores_tokens(d)
    }
    agree = _agreeing(example.response, found, members)
    findings: list[SpanFinding | None] = [None] * len(found)
    if evidence and found:
        findings = list(find_all(example.passages, example.response, [(a, b) for a, b, _ in found]))
    spans = tuple(
        Span(
            start=a,
            end=b,
            text=example.response[a:b],
            score=s,
            threshold=rule.threshold,
            detectors=agreeing,
            finding=f,
        )
        for (a, b, s), agreeing, f in zip(found, agree, findings, strict=True)
    )
    return SpanDecision(
        judge=judge.name,
        rule=rule,
        spans=spans,
        top=top,
        note="" if spans else _why_none(verdict, rule, top, flags),
    )


def _agreeing(
    response: str,
    spans: Sequence[tuple[int, int, float]],
    members: Mapping[str, tuple[Verdict, float]],
) -> list[dict[str, tuple[float, float]]]:
    """For each span, the members whose own flags overlap it, with their highest score
    in the overlap and their token threshold."""
    out: list[dict[str, tuple[float, float]]] = [{} for _ in spans]
    if not spans:
        return out
    for name, (v, thr) in members.items():
        for a, b, s in detector_spans(response, v, thr):
            for i, (sa, sb, _) in enumerate(spans):
                if a < sb and sa < b:
                    prev = out[i].get(name)
                    if prev is None or s > prev[0]:
                        out[i][name] = (s, thr)
    return [dict(sorted(d.items())) for d in out]


def _why_none(verdict: Verdict, rule: SpanRule, top: float | None, flagged: bool) -> str:
    if top is None:
        return f"{verdict.detector} gave no token scores for this answer, so no span"
    if rule.gate and not flagged:
        return (
            "the set calls this answer faithful, so it flags no span (the highest token "
            f"score was {top:.3f}; the span threshold is {rule.threshold:.3f})"
        )
    if top < rule.threshold:
        said = ": the set calls the answer hallucinated but cannot say where" if flagged else ""
        return f"no token reaches the span threshold {rule.threshold:.3f} (highest {top:.3f}){said}"
    return "the tokens at or above the span threshold are punctuation or spaces only"
