"""Judge answers with a detector set: one verdict object behind every page and command.

:func:`judge` gives an :class:`AnswerVerdict` for one answer (:func:`judge_answer` a
:class:`Judgement`: that, the features pages draw from, and the rule that judges it as
another dataset's answer, :meth:`Judgement.as_dataset`): the set's overall verdict
(its answer-level judge, :data:`core.pipeline.sets.ANSWER_JUDGE`, else a vote of its detectors),
each detector's calibrated probability with the threshold of the same calibration, the
spans the set flags (:mod:`core.pipeline.span_judge`) and the time taken. :func:`judge_many` does the same
for many answers, streaming and resumable through the feature cache (``ragscope
judge``). :func:`answer_verdict` builds the object from verdicts already computed (the
app's pages, which stream them one detector at a time).

:func:`judge_stream` runs :func:`core.pipeline.extract.stream_example` (the one shared pass with
the passages, and one without them when a detector asks) and turns each detector's
features into its verdict as soon as they exist, so a page can show the first verdicts
while the rest are computed. Extra needs (the surprisal the Playground colours tokens
by) ride along in the same pass instead of a pass of their own.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import pandas as pd

from core.base.errors import DataError
from core.base.examples import RAGExample
from core.base.words import plural
from core.engine.model import LoadedModel
from core.engine.trace import Needs, Trace
from core.learning.contract import Detector, Features, Verdict, calibrated_as, judge_features
from core.pipeline.extract import (
    WARM_UP,
    FeatureCache,
    Step,
    example_chars,
    iter_features,
    stream_example,
)
from core.pipeline.sets import ANSWER_JUDGE, DetectorSet
from core.pipeline.span_judge import Span, SpanDecision, decide_spans

VOTE = "vote"
"""The overall judge of a set without :data:`core.pipeline.sets.ANSWER_JUDGE`: the share of its
detectors that flag the answer, flagged from half of them up."""


@dataclass(frozen=True)
class Judged:
    """One step of :func:`judge_stream`.

    Attributes:
        step: The extraction step (a finished pass, or one detector's features).
        verdict: That detector's verdict (``"features"`` steps only).
        seconds: Wall time of the step, the prediction included.
    """

    step: Step
    verdict: Verdict | None
    seconds: float

    @property
    def detector(self) -> str | None:
        return self.step.detector


def judge_stream(
    model: LoadedModel,
    example: RAGExample,
    detectors: Sequence[Detector],
    *,
    extra: Needs | None = None,
    on_trace: Callable[[Trace], None] | None = None,
) -> Iterator[Judged]:
    """Each fitted detector's verdict on ``example``'s answer, as soon as it is ready;
    calibrated for the example's dataset when the detector was trained on it among
    others (:func:`core.learning.contract.for_dataset`), else by its pooled calibration.

    Args:
        extra: Also recorded in the shared pass with the passages (see
            :func:`core.pipeline.extract.stream_example`).
        on_trace: Called with that pass as soon as it is done.

    Raises:
        DataError: The example cannot be laid out or a detector cannot read it.
        NotFittedError: A detector is not fitted.
    """
    by_name = {d.name: d for d in detectors}
    t0 = time.perf_counter()
    for step in stream_example(model, example, detectors, extra=extra, on_trace=on_trace):
        verdict = None
        if step.stage == "features":
            assert step.detector is not None and step.features is not None
            det = by_name[step.detector]
            verdict = judge_features(det, step.features, example.provenance.dataset)
        now = time.perf_counter()
        yield Judged(step=step, verdict=verdict, seconds=now - t0)
        t0 = time.perf_counter()  # the consumer's own time is not this step's


def warm_up(
    model: LoadedModel,
    detectors: Sequence[Detector],
    *,
    on_step: Callable[[Judged], None] | None = None,
) -> float:
    """Judge :data:`WARM_UP` once with ``detectors``, so that what they load on first use
    (imports, spaCy, the SAE, the sentence embedder, the lens's float32 unembedding, the
    kernels of a first pass) is ready before a real answer: the app runs it in the
    background when a set is loaded, and ``ragscope bench --playground`` times it.

    Args:
        on_step: Told each finished step (a pass, or one detector's verdict), so a page
            can say how far it is.

    Returns:
        The seconds it took.
    """
    t0 = time.perf_counter()
    for j in judge_stream(model, WARM_UP, detectors):
        if on_step is not None:
            on_step(j)
    return time.perf_counter() - t0


@dataclass(frozen=True, kw_only=True, eq=False)
class AnswerVerdict:
    """A detector set's verdict on one answer: the one object every page, the report,
    ``ragscope judge`` and the Python API read.

    Attributes:
        example_id: The answer's example id.
        set_name: The detector set that judged it.
        deferred_from: The set asked, when it deferred to :attr:`set_name` as its
            expert for the answer's dataset (:meth:`core.pipeline.sets.DetectorSet.for_dataset`).
        judge: Which detector gives the overall verdict (``"ensemble"``), or
            :data:`VOTE` when the set has none.
        probability: The judge's calibrated probability that the answer is
            hallucinated (for :data:`VOTE`: the share of detectors that flag it).
        threshold: The threshold :attr:`probability` is compared with, from the same
            calibration.
        hallucinated: The overall verdict.
        calibrated_for: The training dataset whose own calibration judged the answer
            (``None``: the pooled one of all the training data).
        verdicts: Each detector's verdict (calibrated probability, its threshold,
            flagged or not, which calibration applied), in the set's order.
        spans: The spans the set flags on the answer, whole words, each with its score,
            the members that agree, its evidence, type and reason
            (:func:`core.pipeline.span_judge.decide_spans`).
        span_decision: How the spans were decided (the span judge, its rule) and why
            there are none when there are none.
        seconds: Wall time of the features and predictions.
        judged_as: The training dataset the answer was asked to be judged as
            (:func:`judge_many`'s ``judge_as``; :data:`POOLED`: all the training data);
            ``None``: as its own dataset's.
        set_id: :attr:`core.pipeline.sets.DetectorSet.set_id` of the set that judged it
            (its name and the state of its artifacts): a kept verdict whose set id is
            not the id of the set that judges the answer now is stale.
    """

    example_id: str
    set_name: str
    judge: str
    probability: float
    threshold: float
    hallucinated: bool
    calibrated_for: str | None
    verdicts: Mapping[str, Verdict]
    spans: tuple[Span, ...] = ()
    span_decision: SpanDecision | None = None
    seconds: float = 0.0
    labels: Mapping[str, Any] = field(default_factory=dict)
    deferred_from: str | None = None
    judged_as: str | None = None
    set_id: str = ""

    @property
    def n_flagged(self) -> int:
        """How many detectors flag the answer."""
        return sum(bool(v.hallucinated) for v in self.verdicts.values())

    @property
    def n_voting(self) -> int:
        """How many detectors count: all but those whose calibration carries no signal
        for the answer (:attr:`core.learning.contract.Verdict.no_signal`)."""
        return len(self.verdicts) - len(self.no_signal)

    @property
    def no_signal(self) -> tuple[str, ...]:
        """The detectors whose calibration carries no signal for the answer: they make
        no call and are left out of the vote and the counts."""
        return tuple(n for n, v in self.verdicts.items() if v.no_signal is not None)

    @property
    def no_signal_note(self) -> str:
        """What every page says of the detectors with no signal for the answer (empty
        when there are none): who, why, and that they are left out."""
        if not self.no_signal:
            return ""
        why = "; ".join(f"{n}: {self.verdicts[n].no_signal}" for n in self.no_signal)
        return (
            f"No signal ({why}). A calibration without signal gives every answer the same "
            "probability, so it makes no call: left out of the vote and the counts."
        )

    @property
    def counts(self) -> str:
        """``7 of 11 detectors flag it``, naming those left out for having no signal."""
        n = self.n_voting
        out = f"{self.n_flagged} of {n} {plural(n, 'detector')} flag{'s' if n == 1 else ''} it"
        if silent := self.no_signal:
            out += f" ({', '.join(silent)}: no signal here, left out)"
        return out

    @property
    def summary(self) -> str:
        """One line: ``Hallucinated: ensemble p = 0.71 ≥ 0.38; 7 of 12 detectors flag it``."""
        head = "Hallucinated" if self.hallucinated else "Faithful"
        sign = "≥" if self.hallucinated else "<"
        what = (
            f"{self.judge} p = {self.probability:.2f} {sign} {self.threshold:.2f}"
            if self.judge != VOTE
            else f"{self.counts} ({sign} half)"
        )
        tail = f"; {self.counts}" if self.judge != VOTE else ""
        by = (
            f" (by the {self.set_name} set, the {self.deferred_from} set's expert for this "
            "answer's dataset)"
            if self.deferred_from
            else ""
        )
        return f"{head}: {what}{tail}{by}{judged_as_words(self.judged_as)}"

    def to_record(self) -> dict[str, Any]:
        """The verdict as JSON-ready data (the schema of ``ragscope judge``'s output)."""
        return {
            "id": self.example_id,
            "set": self.set_name,
            "set_id": self.set_id,
            "deferred_from": self.deferred_from,
            "judge": self.judge,
            "hallucinated": self.hallucinated,
            "probability": self.probability,
            "threshold": self.threshold,
            "calibrated_for": self.calibrated_for,
            "n_flagged": self.n_flagged,
            "n_detectors": len(self.verdicts),
            "n_no_signal": len(self.no_signal),
            "detectors": {
                name: {
                    "probability": v.score,
                    "threshold": v.threshold,
                    "hallucinated": v.hallucinated,
                    "call": v.call,
                    "calibrated_for": v.calibrated_for,
                    "raw_score": v.judged_raw,
                    **({"no_signal": v.no_signal} if v.no_signal is not None else {}),
                }
                for name, v in self.verdicts.items()
            },
            "spans": [span_record(s) for s in self.spans],
            **self._span_facts(),
            "seconds": self.seconds,
            **({"labels": dict(self.labels)} if self.labels else {}),
            **({"judged_as": self.judged_as} if self.judged_as is not None else {}),
        }

    def _span_facts(self) -> dict[str, Any]:
        d = self.span_decision
        if d is None:
            return {}
        return {
            "span_judge": d.judge,
            "span_rule": d.rule.describe() if d.rule is not None else None,
            "span_note": d.note or None,
        }

    def lettuce_spans(self) -> list[dict[str, Any]]:
        """The spans in the schema other span detectors (LettuceDetect) write
        (:func:`lettuce_spans`)."""
        return lettuce_spans(self.to_record())


def lettuce_spans(record: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A verdict record's spans (:meth:`AnswerVerdict.to_record`) in the schema other span
    detectors write (LettuceDetect's ``predict(..., output_format="spans")``): ``start``,
    ``end``, ``text`` and ``confidence`` (the span's score) per span."""
    return [
        {"start": s["start"], "end": s["end"], "text": s["text"], "confidence": s["score"]}
        for s in record.get("spans", [])
    ]


def span_record(s: Span) -> dict[str, Any]:
    """One span as JSON-ready data (``ragscope judge``'s ``spans``)."""
    ev = s.evidence
    return {
        "start": s.start,
        "end": s.end,
        "text": s.text,
        "score": s.score,
        "threshold": s.threshold,
        "detectors": sorted(s.detectors),
        "type": s.type,
        "reason": s.reason,
        "evidence": (
            {
                "passage": ev.passage,
                "start": ev.start,
                "end": ev.end,
                "text": ev.text,
                "score": ev.score,
                "how": ev.how,
            }
            if ev is not None
            else None
        ),
    }


ROW_COLUMNS = (
    "id",
    "set",
    "deferred_from",
    "judge",
    "hallucinated",
    "probability",
    "threshold",
    "calibrated_for",
    "n_flagged",
    "n_detectors",
)
"""The answer-level columns of :func:`verdict_rows`, in order; then per detector
``<detector>.probability``, ``.threshold``, ``.hallucinated``, ``.calibrated_for``, then
``spans`` (and ``label`` when any answer has one)."""
DETECTOR_COLUMNS = ("probability", "threshold", "hallucinated", "calibrated_for")


def verdict_rows(verdicts: Iterable[AnswerVerdict | Mapping[str, Any]]) -> pd.DataFrame:
    """One row per answer (``ragscope judge``'s CSV and Parquet): the columns of
    :data:`ROW_COLUMNS`, each detector's :data:`DETECTOR_COLUMNS` as
    ``<detector>.<column>``, ``spans`` as JSON text of ``[{start, end, text, score,
    detectors}]``, and ``label`` (the gold verdict) when any answer has one.

    Args:
        verdicts: Verdicts, or their :meth:`AnswerVerdict.to_record` records (as a
            JSONL output holds them).
    """
    rows: list[dict[str, Any]] = []
    names: dict[str, None] = {}
    labelled = judged_as = False
    for v in verdicts:
        rec = v.to_record() if isinstance(v, AnswerVerdict) else v
        row = {k: rec.get(k) for k in ROW_COLUMNS}
        for name, d in rec.get("detectors", {}).items():
            names.setdefault(name)
            row.update({f"{name}.{k}": d.get(k) for k in DETECTOR_COLUMNS})
        row["spans"] = json.dumps(rec.get("spans", []), ensure_ascii=False)
        label = (rec.get("labels") or {}).get("hallucinated")
        labelled |= label is not None
        row["label"] = label
        row["judged_as"] = rec.get("judged_as")
        judged_as |= row["judged_as"] is not None
        rows.append(row)
    columns = [
        *ROW_COLUMNS,
        *(f"{n}.{k}" for n in names for k in DETECTOR_COLUMNS),
        "spans",
        *(("label",) if labelled else ()),
        *(("judged_as",) if judged_as else ()),
    ]
    return pd.DataFrame(rows, columns=columns)


def overall_verdict(
    verdicts: Mapping[str, Verdict],
) -> tuple[str, float, float, bool, str | None]:
    """``(judge, probability, threshold, hallucinated, calibrated_for)`` of a set's
    verdicts: the :data:`core.pipeline.sets.ANSWER_JUDGE`'s own when it judged, else the share of
    detectors that flag the answer against one half (:data:`VOTE`).

    Raises:
        DataError: No verdicts to judge by.
    """
    top = verdicts.get(ANSWER_JUDGE)
    if top is not None and top.threshold is not None and top.called:
        assert top.hallucinated is not None
        return ANSWER_JUDGE, top.score, top.threshold, top.hallucinated, top.calibrated_for
    if not verdicts:
        raise DataError("no detector judged the answer: the set has no detectors for this model")
    # A detector whose calibration carries no signal here makes no call: it has no vote.
    voting = [v for v in verdicts.values() if v.no_signal is None]
    share = sum(bool(v.hallucinated) for v in voting) / len(voting) if voting else 0.0
    return VOTE, share, 0.5, share >= 0.5, None


def answer_verdict(
    example: RAGExample,
    detectors: Sequence[Detector],
    verdicts: Mapping[str, Verdict],
    *,
    set_name: str,
    seconds: float = 0.0,
    deferred_from: str | None = None,
    evidence: bool = True,
    judged_as: str | None = None,
    set_id: str = "",
) -> AnswerVerdict:
    """The :class:`AnswerVerdict` of verdicts already computed (each as
    :func:`core.learning.contract.for_dataset` gave it), its spans decided by the set
    (:func:`core.pipeline.span_judge.decide_spans`; ``evidence``: with each span's
    evidence, type and reason)."""
    judge, p, thr, flagged, cal = overall_verdict(verdicts)
    decision = decide_spans(example, detectors, verdicts, flagged=flagged, evidence=evidence)
    labels = {}
    if example.label is not None:
        labels["hallucinated"] = bool(example.label)
    return AnswerVerdict(
        example_id=example.id,
        set_name=set_name,
        judge=judge,
        probability=p,
        threshold=thr,
        hallucinated=flagged,
        calibrated_for=cal,
        verdicts={d.name: verdicts[d.name] for d in detectors if d.name in verdicts},
        spans=decision.spans,
        span_decision=decision,
        seconds=seconds,
        labels=labels,
        deferred_from=deferred_from,
        judged_as=judged_as,
        set_id=set_id,
    )


@dataclass(frozen=True, kw_only=True, eq=False)
class Judgement:
    """One answer judged by a set, with what pages draw besides the verdict.

    Attributes:
        example: The judged answer.
        asked: The set asked to judge it.
        judged_by: The set whose detectors judged it (``asked.for_example(example)``:
            its expert for the answer's dataset where it has one; after
            :meth:`as_dataset`, the set that judges that dataset).
        verdicts: Detector name -> its verdict, in :attr:`judged_by`'s order.
        features: Detector name -> the features its verdict was computed from (every
            detector of the set that first judged the answer).
        answer: The set's verdict (:func:`answer_verdict` of :attr:`verdicts`).
        seconds: Wall time of the trace and the predictions.
        first: The judgement :meth:`as_dataset` started from (``None``: this is it).
    """

    example: RAGExample
    asked: DetectorSet
    judged_by: DetectorSet
    verdicts: Mapping[str, Verdict]
    features: Mapping[str, Features]
    answer: AnswerVerdict
    seconds: float
    first: Judgement | None = None

    def as_dataset(self, dataset: str | None) -> Judgement:
        """The answer judged as if it came from training dataset ``dataset`` (``None``:
        by all the detectors' training data); no pass is run. The rule, applied to the
        first judgement:

        1. The set that judges answers of ``dataset`` (:meth:`DetectorSet.for_dataset`
           of :attr:`asked`) is the one that judged: each detector's calibration and
           threshold for ``dataset`` (:func:`core.learning.contract.calibrated_as`).
        2. It is another (the asked set's expert for ``dataset``, or the asked set
           itself for an answer its expert judged) and reads features all kept: that
           set's detectors predict from them (an expert reads the same features).
        3. Otherwise as in 1.
        """
        base = self.first or self
        target = base.asked.for_dataset(dataset)
        if target is base.judged_by or not all(n in base.features for n in target.names):
            by = base.judged_by
            verdicts = {d.name: calibrated_as(d, base.verdicts[d.name], dataset) for d in by.fitted}
        else:
            by = target
            verdicts = {
                d.name: judge_features(d, base.features[d.name], dataset) for d in by.fitted
            }
        return replace(
            base,
            judged_by=by,
            verdicts=verdicts,
            answer=_answer_of(base.example, by, verdicts, base.seconds),
            first=base,
        )

    def judge_as_options(self) -> list[str]:
        """The training datasets :meth:`as_dataset` can judge the answer as
        (:func:`judge_as_options` of the asked set)."""
        return judge_as_options((self.first or self).asked)


POOLED = "pooled"
"""What ``judge_as`` (:func:`judge_many`, ``ragscope judge --judge-as``) names to judge by
all the detectors' training data: their pooled calibrations and thresholds."""


def judge_as_options(dset: DetectorSet) -> list[str]:
    """The training datasets a set can judge an answer as: those a calibrated detector of
    the set keeps a calibration of its own for, and those the set has an expert for,
    sorted."""
    own = {
        n
        for c in dset.detectors
        if c.calibrated
        for n in (getattr(c.detector, "dataset_calibration_", None) or {})
    }
    return sorted({*own, *dset.experts})


def _answer_of(
    example: RAGExample, by: DetectorSet, verdicts: Mapping[str, Verdict], seconds: float
) -> AnswerVerdict:
    return answer_verdict(
        example,
        by.fitted,
        verdicts,
        set_name=by.name,
        seconds=seconds,
        deferred_from=by.deferred_from,
        set_id=by.set_id,
    )


def judge_answer(
    model: LoadedModel,
    example: RAGExample,
    dset: DetectorSet,
    *,
    by: DetectorSet | None = None,
    extra: Needs | None = None,
    on_step: Callable[[Judged], None] | None = None,
    on_trace: Callable[[Trace], None] | None = None,
) -> Judgement:
    """The set's :class:`Judgement` of ``example``'s answer: one shared traced pass
    (:func:`judge_stream`; ``on_step`` after each step, e.g. to show verdicts as they
    come), by the set's expert for the answer's dataset when it has one.

    Args:
        by: ``dset.for_example(example)`` when the caller has it already.

    Raises:
        DataError: The example cannot be laid out or a detector cannot read it.
    """
    judged_by = by if by is not None else dset.for_example(example)
    got: dict[str, Verdict] = {}
    features: dict[str, Features] = {}
    t0 = time.perf_counter()
    for step in judge_stream(model, example, judged_by.fitted, extra=extra, on_trace=on_trace):
        if step.verdict is not None and step.detector is not None:
            assert step.step.features is not None
            got[step.detector] = step.verdict
            features[step.detector] = step.step.features
        if on_step is not None:
            on_step(step)
    seconds = time.perf_counter() - t0
    return _judgement(example, dset, judged_by, got, features, seconds)


def judgement_from(
    example: RAGExample,
    dset: DetectorSet,
    features: Mapping[str, Features],
    *,
    by: DetectorSet | None = None,
    seconds: float = 0.0,
) -> Judgement:
    """The set's :class:`Judgement` of ``example``'s answer from features a pass already
    computed (e.g. a page that traced the answer for views of its own): the verdicts
    :func:`judge_answer` would give on the same features, and no pass run.

    Args:
        features: Detector name -> features, for every detector of the set that judges
            the answer.
        by: ``dset.for_example(example)`` when the caller has it already.
        seconds: What the pass and the predictions took.

    Raises:
        DataError: ``features`` lacks a detector of the set that judges the answer.
    """
    judged_by = by if by is not None else dset.for_example(example)
    if missing := [n for n in judged_by.names if n not in features]:
        raise DataError(
            f"no features of {', '.join(missing)} for {example.id!r}: trace the answer "
            f"with every detector of the {judged_by.name} set"
        )
    ds = example.provenance.dataset
    verdicts = {d.name: judge_features(d, features[d.name], ds) for d in judged_by.fitted}
    return _judgement(example, dset, judged_by, verdicts, features, seconds)


def _judgement(
    example: RAGExample,
    asked: DetectorSet,
    judged_by: DetectorSet,
    verdicts: Mapping[str, Verdict],
    features: Mapping[str, Features],
    seconds: float,
) -> Judgement:
    ordered = {n: verdicts[n] for n in judged_by.names}
    return Judgement(
        example=example,
        asked=asked,
        judged_by=judged_by,
        verdicts=ordered,
        features=dict(features),
        answer=_answer_of(example, judged_by, ordered, seconds),
        seconds=seconds,
    )


def judge(
    model: LoadedModel,
    example: RAGExample,
    dset: DetectorSet,
    *,
    extra: Needs | None = None,
    on_step: Callable[[Judged], None] | None = None,
    on_trace: Callable[[Trace], None] | None = None,
) -> AnswerVerdict:
    """The set's verdict on ``example``'s answer (:func:`judge_answer`'s, without what
    pages draw besides).

    Raises:
        DataError: The example cannot be laid out or a detector cannot read it.
    """
    return judge_answer(
        model, example, dset, extra=extra, on_step=on_step, on_trace=on_trace
    ).answer


@dataclass(frozen=True)
class JudgeFailure:
    """An answer :func:`judge_many` could not judge, and why (the others go on)."""

    example_id: str
    error: DataError


def judge_many(
    model: LoadedModel,
    examples: Iterable[RAGExample],
    dset: DetectorSet,
    *,
    cache: FeatureCache | None = None,
    batch_size: int | None = None,
    on_error: Literal["raise", "skip"] = "skip",
    judge_as: str | None = None,
) -> Iterator[AnswerVerdict | JudgeFailure]:
    """The set's verdict on each answer, in order, as each is done: features from
    ``cache`` where it has them (a stopped run resumes there), the rest traced
    ``batch_size`` answers per pass (:func:`core.pipeline.extract.iter_features`). An answer that
    cannot be judged is yielded as a :class:`JudgeFailure` (``on_error="skip"``). An
    answer of a dataset the set has an expert for is judged by the expert, on the same
    features (:meth:`core.pipeline.sets.DetectorSet.for_dataset`).

    Args:
        judge_as: Judge every answer as if it came from this training dataset (one of
            :func:`judge_as_options`; :data:`POOLED`: by all the training data), the
            rule of :meth:`Judgement.as_dataset`; ``None``: each as its own dataset's.

    Raises:
        DataError: ``judge_as`` names a dataset the set keeps nothing of its own for.
    """
    if judge_as is not None:
        check_judge_as(dset, judge_as)
    dets = dset.fitted
    t0 = time.perf_counter()
    for got in iter_features(
        model, examples, dets, cache=cache, on_error=on_error, batch_size=batch_size
    ):
        if got.error is not None or got.features is None:
            err = got.error or DataError(f"no features for {got.example.id!r}")
            yield JudgeFailure(got.example.id, err)
            t0 = time.perf_counter()
            continue
        ds = got.example.provenance.dataset if judge_as is None else _as_named(judge_as)
        by = dset.for_dataset(ds)
        verdicts = {d.name: judge_features(d, got.features[d.name], ds) for d in by.fitted}
        now = time.perf_counter()
        yield answer_verdict(
            got.example,
            by.fitted,
            verdicts,
            set_name=by.name,
            seconds=now - t0,
            deferred_from=by.deferred_from,
            judged_as=judge_as,
            set_id=by.set_id,
        )
        t0 = time.perf_counter()


def check_judge_as(dset: DetectorSet, judge_as: str) -> None:
    """Refuse to judge answers as a dataset ``dset`` keeps nothing of its own for (it
    would silently judge by the pooled calibration).

    Raises:
        DataError: Naming the datasets it can judge as.
    """
    if judge_as != POOLED and judge_as not in judge_as_options(dset):
        known = ", ".join([*judge_as_options(dset), POOLED])
        raise DataError(
            f"the {dset.name} set keeps no calibration or expert of its own for "
            f"{judge_as!r}; judge as one of: {known}",
            field="judge-as",
        )


def judged_as_words(judge_as: str | None) -> str:
    """How a verdict says what it was judged as (empty: as its own dataset's)."""
    if judge_as is None:
        return ""
    return "; judged by all the training data" if judge_as == POOLED else f"; judged as {judge_as}"


def _as_named(judge_as: str) -> str | None:
    """The training dataset ``judge_as`` names (``None``: :data:`POOLED`)."""
    return None if judge_as == POOLED else judge_as


def time_judging(
    model: LoadedModel, example: RAGExample, dset: DetectorSet, cache: FeatureCache | None
) -> float:
    """Seconds per character (:func:`core.pipeline.extract.example_chars`) to judge
    ``example`` as :func:`judge_many` does (its trace, every verdict, the spans and their
    evidence), measured by judging it here (its features are kept in ``cache``, so the
    time counts towards the action it estimates), warm: :data:`WARM_UP` is judged first,
    so what the detectors load on first use is not in the pace.

    Raises:
        DataError: The example cannot be judged.
    """
    for got in judge_many(model, [WARM_UP], dset):
        if isinstance(got, JudgeFailure):
            raise got.error
    t0 = time.perf_counter()
    for got in judge_many(model, [example], dset, cache=cache):
        if isinstance(got, JudgeFailure):
            raise got.error
    return (time.perf_counter() - t0) / example_chars(example)
