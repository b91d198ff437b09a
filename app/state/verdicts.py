"""The shipped detectors' verdicts on one answer: streamed as each detector finishes,
and kept per model, input and detector set (for every page and session), so a display
control never recomputes them."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import streamlit as st

from app.state.analysis import input_signature
from app.state.detectors import ArtifactCard, DetectorSet
from app.state.memo import Memo
from core.base.errors import RagscopeError, brief
from core.base.examples import RAGExample
from core.learning.contract import decision_threshold
from core.pipeline.judge import AnswerVerdict, Judged, Judgement, judge_answer, warm_up

if TYPE_CHECKING:
    import pandas as pd

    from app.state.analysis import Analysis
    from core.engine.model import LoadedModel
    from core.engine.trace import Needs, Trace
    from core.learning.contract import Features, Verdict

log = logging.getLogger(__name__)

OnStep = Callable[[Judged, "ArtifactCard | None"], None]
"""Called after each step of a streamed run: the step, and the detector it judged
(``None`` for a finished pass)."""


@dataclass(frozen=True, kw_only=True, eq=False)
class DetectorVerdicts:
    """The shipped detectors' verdicts on one analysed answer.

    Attributes:
        signature: :func:`input_signature` of the analysed input.
        detectors: The detectors that judged it.
        verdicts: One verdict per detector, aligned with ``detectors``.
        seconds: Wall time of the shared trace and the predictions (when first computed).
        features: Detector name -> the features its verdict was computed from.
        answer: The set's verdict on the answer (:class:`core.pipeline.judge.AnswerVerdict`,
            built by :func:`core.pipeline.judge.answer_verdict` from these verdicts): the overall
            verdict, each detector's probability, threshold and flag, the spans. What
            every page shows; ``None`` when no detector judged the answer.
        example: The judged answer (``None`` when no detector judged it).
        asked: The set the page asked to judge with; :attr:`detectors` are those of the
            set that judged (``asked.for_example(example)``: its expert for the answer's
            dataset, where it has one).
        judged_by: The set whose detectors these are.
        judgement: Core's judgement these are read from (:class:`core.pipeline.judge.
            Judgement`): it holds the rule that judges the answer as another dataset's.
    """

    signature: str
    detectors: tuple[ArtifactCard, ...]
    verdicts: tuple[Verdict, ...]
    seconds: float
    features: Mapping[str, Features] = field(default_factory=dict)
    answer: AnswerVerdict | None = None
    example: RAGExample | None = None
    asked: DetectorSet | None = None
    judged_by: DetectorSet | None = None
    judgement: Judgement | None = None

    def __post_init__(self) -> None:
        assert len(self.detectors) == len(self.verdicts), "one verdict per detector"
        assert self.answer is None or tuple(self.answer.verdicts) == tuple(
            d.name for d in self.detectors
        ), "the answer verdict judges with the same detectors"

    def verdict(self, name: str) -> Verdict | None:
        """Detector ``name``'s verdict on the answer (the one :attr:`answer` holds), or
        ``None`` when the set has no such detector."""
        return self.answer.verdicts.get(name) if self.answer is not None else None

    def with_token_scores(self) -> dict[str, Verdict]:
        """Detector name -> verdict, for the detectors that score single tokens."""
        return {
            v.detector: v
            for v in self.verdicts
            if v.token_scores is not None and v.token_offsets is not None
        }

    def calibrated_as(self, dataset: str | None) -> DetectorVerdicts:
        """These verdicts judged as if the answer came from training dataset ``dataset``
        (``None``: by all the detectors' training data), by core's rule
        (:meth:`core.pipeline.judge.Judgement.as_dataset`); no pass is run."""
        if self.judgement is None:
            return self
        return from_judgement(self.signature, self.judgement.as_dataset(dataset))

    def judge_as_options(self) -> list[str]:
        """The training datasets :meth:`calibrated_as` can judge the answer as
        (:meth:`core.pipeline.judge.Judgement.judge_as_options`)."""
        return [] if self.judgement is None else self.judgement.judge_as_options()

    def to_frame(self) -> pd.DataFrame:
        """One row per detector: ``detector``, ``score`` (a calibrated probability when
        ``calibrated``), ``threshold``, ``verdict``, ``calibrated``, ``calibrated for``, ``AUROC``
        and where it comes from (missing facts are empty)."""
        return verdict_frame(self.detectors, self.verdicts)


def from_judgement(signature: str, judgement: Judgement) -> DetectorVerdicts:
    """The page's view of core's :class:`~core.pipeline.judge.Judgement` of an input."""
    by = judgement.judged_by
    return DetectorVerdicts(
        signature=signature,
        detectors=by.detectors,
        verdicts=tuple(judgement.verdicts[n] for n in by.names),
        seconds=judgement.seconds,
        features=judgement.features,
        answer=judgement.answer,
        example=judgement.example,
        asked=judgement.asked,
        judged_by=by,
        judgement=judgement,
    )


def verdict_frame(
    detectors: tuple[ArtifactCard, ...] | list[ArtifactCard],
    verdicts: tuple[Verdict, ...] | list[Verdict],
) -> pd.DataFrame:
    """The verdict table of :meth:`DetectorVerdicts.to_frame`, for any detectors judged
    so far (the Playground shows it growing while the others run)."""
    import pandas as pd

    rows = []
    for d, v in zip(detectors, verdicts, strict=True):
        # The threshold the verdict was flagged at, from the fit of its calibration.
        threshold = v.threshold if v.threshold is not None else decision_threshold(d.detector, v)
        if not d.calibrated:
            calibrated_for = ""
        elif v.calibrated_for:
            calibrated_for = v.calibrated_for
        else:
            calibrated_for = "all its training data"
        rows.append(
            {
                "detector": d.name,
                "score": v.score,
                "threshold": threshold,
                "verdict": v.call,
                "calibrated": d.calibrated,
                "calibrated for": calibrated_for,
                "AUROC": d.auroc,
                "AUROC from": d.auroc_from,
            }
        )
    columns = ["detector", "score", "threshold", "verdict", "calibrated", "calibrated for"]
    frame = pd.DataFrame(rows, columns=[*columns, "AUROC", "AUROC from"])
    return frame.astype({"AUROC": "Float64"})


@st.cache_resource(show_spinner=False)
def _verdicts() -> Memo[DetectorVerdicts]:
    """Every session's verdicts, by model instance, input signature and detector set."""
    return Memo(max_entries=64)


@st.cache_resource(show_spinner=False)
def _failures() -> Memo[RagscopeError]:
    """Why the detectors could not judge an input (same keys): the page that shows the
    error after a streamed run does not run them again."""
    return Memo(max_entries=64)


def known_verdicts(
    model: LoadedModel, example: RAGExample, signature: str, shipped: DetectorSet
) -> DetectorVerdicts | None:
    """The verdicts on this input when some page already computed them, else ``None``."""
    judged = shipped.for_example(example)
    return _verdicts().get((model.instance_key, signature, judged.cache_id))


def stream_verdicts(
    model: LoadedModel,
    example: RAGExample,
    signature: str,
    shipped: DetectorSet,
    *,
    on_step: OnStep | None = None,
    extra: Needs | None = None,
    on_trace: Callable[[Trace], None] | None = None,
    retry: bool = False,
) -> DetectorVerdicts:
    """Every detector's verdict on ``example``'s answer, by the set that judges it
    (``shipped.for_example(example)``: its expert for the answer's dataset, where it has
    one), computed one detector at a time (:func:`core.pipeline.judge.judge_stream`: one shared pass, plus one
    without the passages when a detector asks) with ``on_step`` after each step, and
    kept for every page. Already known verdicts are returned at once (and a known
    failure raised again).

    Args:
        signature: :func:`app.state.analysis.input_signature` of the input.
        extra: Also recorded in the shared pass (the Playground's surprisal).
        on_trace: Called with the shared pass as soon as it is done.
        retry: Run again even when this input failed before (a user's new click:
            the cause may be gone); otherwise a known failure is raised again.

    Raises:
        DataError: The example cannot be laid out for the detectors.
        ModelError: A detector cannot run (missing trace, spaCy model, other model).
    """
    judged = shipped.for_example(example)  # once per answer: the cache key and the judging
    key = (model.instance_key, signature, judged.cache_id)
    found = _verdicts().get(key)
    if found is not None:
        return found
    if retry:
        _failures().pop(key)
    elif (failed := _failures().get(key)) is not None:
        raise failed
    by_name = {s.name: s for s in judged.detectors}

    def step(j: Judged) -> None:
        if on_step is not None:
            on_step(j, by_name.get(j.detector) if j.detector is not None else None)

    try:
        judgement = judge_answer(
            model, example, shipped, by=judged, extra=extra, on_step=step, on_trace=on_trace
        )
    except RagscopeError as e:
        _failures().put(key, e)
        raise
    out = from_judgement(signature, judgement)
    _verdicts().put(key, out)
    return out


def keep_judgement(model: LoadedModel, judgement: Judgement) -> DetectorVerdicts:
    """Keep core's judgement of an answer that a page computed from a pass of its own
    (Compare's :func:`core.interventions.counterfactual.judge_pair`), so every page
    shows that verdict (:func:`answer_verdicts`) without judging the answer again. The
    verdicts already kept for the input stay (they are the same: one rule in core).

    Raises:
        ValueError: The judgement is not by the set that judges its answer.
    """
    example, asked = judgement.example, judgement.asked
    if judgement.judged_by is not asked.for_example(example):
        raise ValueError(f"{example.id!r} was judged by another set than the one that judges it")
    signature = input_signature(example, None)
    key = (model.instance_key, signature, judgement.judged_by.cache_id)
    found = _verdicts().get(key)
    if found is not None:
        return found
    out = from_judgement(signature, judgement)
    _verdicts().put(key, out)
    return out


def detector_verdicts(
    model: LoadedModel, analysis: Analysis, shipped: DetectorSet
) -> DetectorVerdicts:
    """Every loaded shipped detector's verdict on ``analysis``'s answer (kept).

    The example is traced once for all of them (:func:`stream_verdicts`).

    Raises:
        DataError: The example cannot be laid out for the detectors.
        ModelError: A detector cannot run (missing trace, spaCy model, other model).
    """
    if not shipped.detectors:
        return DetectorVerdicts(
            signature=analysis.signature, detectors=(), verdicts=(), seconds=0.0
        )
    return stream_verdicts(model, analysis.example, analysis.signature, shipped)


def answer_verdicts(
    model: LoadedModel,
    example: RAGExample,
    shipped: DetectorSet,
    *,
    response_ids: Sequence[int] | None = None,
) -> DetectorVerdicts:
    """The set's verdicts on ``example``'s answer as every page shows them: the ones the
    Playground (or another page) computed for the same input, else computed now and kept
    (:func:`stream_verdicts`). A page that shows a score or a verdict for an answer reads
    it here (:attr:`DetectorVerdicts.answer`), never from a detector of its own.

    Raises:
        DataError: The example cannot be laid out for the detectors.
        ModelError: A detector cannot run.
    """
    ids = tuple(int(i) for i in response_ids) if response_ids is not None else None
    signature = input_signature(example, ids)
    if not shipped.detectors:
        return DetectorVerdicts(signature=signature, detectors=(), verdicts=(), seconds=0.0)
    return stream_verdicts(model, example, signature, shipped)


WARM_ENV = "RAGSCOPE_WARM_DETECTORS"


@dataclass
class Warming:
    """The background warm-up of one model's detector set (:func:`core.pipeline.judge.warm_up`)
    and how far it is: the Playground says what is still loading."""

    detectors: int
    ready: int = 0
    seconds: float | None = None
    failed: str | None = None
    thread: threading.Thread | None = None

    @property
    def running(self) -> bool:
        return self.thread is not None and self.thread.is_alive()

    def run(self, model: LoadedModel, shipped: DetectorSet) -> None:
        def step(j: Judged) -> None:
            if j.step.stage == "features":
                self.ready += 1

        try:
            self.seconds = warm_up(model, [s.detector for s in shipped.detectors], on_step=step)
        except Exception as e:  # a detector that cannot run says so on the user's own answer
            self.failed = brief(e)
            log.warning("warming the detectors up failed", exc_info=True)
        else:
            log.info("detectors warmed up in %.1f s", self.seconds)


@st.cache_resource(show_spinner=False, max_entries=4)
def _warming(
    model_id: str, detectors_id: str, _model: LoadedModel, _shipped: DetectorSet
) -> Warming:
    warming = Warming(detectors=len(_shipped.detectors))
    warming.thread = threading.Thread(
        target=warming.run, args=(_model, _shipped), name="ragscope-warm-detectors", daemon=True
    )
    warming.thread.start()
    return warming


def warm_detectors(model: LoadedModel, shipped: DetectorSet) -> Warming | None:
    """Judge a tiny answer once with every loaded detector on a background thread (once
    per model and detector set, :func:`core.pipeline.judge.warm_up`), so the resources
    they load on first use (spaCy, the SAE, sentence embeddings, ...) are ready before
    the first real Analyse; its :class:`Warming` says how far it is.
    ``RAGSCOPE_WARM_DETECTORS=0`` turns it off (the app tests count forward passes)."""
    if not shipped.detectors or os.environ.get(WARM_ENV, "1").strip() == "0":
        return None
    return _warming(model.instance_key, shipped.cache_id, model, shipped)
