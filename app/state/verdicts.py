"""The shipped detectors' verdicts on one answer: streamed as each detector finishes,
and kept per model, input and detector set (for every page and session), so a display
control never recomputes them."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import streamlit as st

from app.state.analysis import input_signature
from app.state.detectors import ShippedDetector, ShippedDetectors
from app.state.memo import Memo
from core.base.errors import RagscopeError, brief
from core.base.examples import RAGExample
from core.learning.contract import calibrated_as, decision_threshold, judge_features
from core.pipeline.judge import AnswerVerdict, Judged, answer_verdict, judge_stream, warm_up

if TYPE_CHECKING:
    import pandas as pd

    from app.state.analysis import Analysis
    from core.engine.model import LoadedModel
    from core.engine.trace import Needs, Trace
    from core.learning.contract import Features, Verdict

log = logging.getLogger(__name__)

OnStep = Callable[[Judged, "ShippedDetector | None"], None]
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
    """

    signature: str
    detectors: tuple[ShippedDetector, ...]
    verdicts: tuple[Verdict, ...]
    seconds: float
    features: Mapping[str, Features] = field(default_factory=dict)
    answer: AnswerVerdict | None = None
    example: RAGExample | None = None
    asked: ShippedDetectors | None = None
    judged_by: ShippedDetectors | None = None

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
        (``None``: by all the detectors' training data), and :attr:`answer` rebuilt from
        them (:func:`core.pipeline.judge.answer_verdict`); no pass is run.

        By the set that judges answers of ``dataset`` (:meth:`core.pipeline.sets.DetectorSet.
        for_dataset` of :attr:`asked`): when that is the set that judged, each detector's
        calibration and threshold for ``dataset`` (:func:`core.learning.contract.calibrated_as`);
        when it is another (the asked set's expert for ``dataset``, or the asked set
        itself for an answer its expert judged), that set's detectors' predictions from
        the kept features (the expert reads the same features)."""
        if self.answer is None or self.example is None:
            return self
        judged = self.asked.for_example(self.example) if self.asked is not None else None
        target = self.asked.for_dataset(dataset) if self.asked is not None else None
        if (
            judged is None
            or target is None
            or target is judged
            or not all(n in self.features for n in target.names)
        ):
            detectors = self.detectors
            verdicts = tuple(
                calibrated_as(d.detector, v, dataset)
                for d, v in zip(self.detectors, self.verdicts, strict=True)
            )
            by = judged
        else:
            detectors = target.detectors
            verdicts = tuple(
                judge_features(d.detector, self.features[d.name], dataset) for d in detectors
            )
            by = target
        answer = _answer(self.example, detectors, verdicts, by, self.seconds)
        return replace(self, detectors=detectors, verdicts=verdicts, answer=answer, judged_by=by)

    def judge_as_options(self) -> list[str]:
        """The training datasets :meth:`calibrated_as` can judge the answer as: those the
        asked set's detectors keep a calibration of their own for, and those it has an
        expert for, sorted."""
        asked = self.asked.detectors if self.asked is not None else self.detectors
        experts = self.asked.experts if self.asked is not None else {}
        return sorted({*calibration_datasets(asked), *experts})

    def to_frame(self) -> pd.DataFrame:
        """One row per detector: ``detector``, ``score`` (a calibrated probability when
        ``calibrated``), ``threshold``, ``verdict``, ``calibrated``, ``calibrated for``, ``AUROC``
        and where it comes from (missing facts are empty)."""
        return verdict_frame(self.detectors, self.verdicts)


def _answer(
    example: RAGExample,
    detectors: tuple[ShippedDetector, ...],
    verdicts: tuple[Verdict, ...],
    by: ShippedDetectors | None,
    seconds: float,
) -> AnswerVerdict | None:
    """The :class:`AnswerVerdict` of these verdicts by the set ``by`` (``None`` without
    detectors)."""
    if not detectors:
        return None
    return answer_verdict(
        example,
        [d.detector for d in detectors],
        {d.name: v for d, v in zip(detectors, verdicts, strict=True)},
        set_name=by.name if by is not None else "",
        seconds=seconds,
        deferred_from=by.deferred_from if by is not None else None,
    )


def calibration_datasets(detectors: Iterable[ShippedDetector]) -> list[str]:
    """The training datasets some calibrated detector keeps a calibration of its own for
    (what an answer can be judged as), sorted."""
    return sorted(
        {
            n
            for d in detectors
            if d.calibrated
            for n in (getattr(d.detector, "dataset_calibration_", None) or {})
        }
    )


def verdict_frame(
    detectors: tuple[ShippedDetector, ...] | list[ShippedDetector],
    verdicts: tuple[Verdict, ...] | list[Verdict],
) -> pd.DataFrame:
    """The verdict table of :meth:`DetectorVerdicts.to_frame`, for any detectors judged
    so far (the Playground shows it growing while the others run)."""
    import pandas as pd

    rows = []
    for d, v in zip(detectors, verdicts, strict=True):
        # The threshold the verdict was flagged at, from the fit of its calibration.
        threshold = v.threshold if v.threshold is not None else decision_threshold(d.detector, v)
        flagged = v.hallucinated if v.hallucinated is not None else v.score >= threshold
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
                "verdict": "flagged" if flagged else "not flagged",
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
    model: LoadedModel, example: RAGExample, signature: str, shipped: ShippedDetectors
) -> DetectorVerdicts | None:
    """The verdicts on this input when some page already computed them, else ``None``."""
    judged = shipped.for_example(example)
    return _verdicts().get((model.instance_key, signature, judged.cache_id))


def stream_verdicts(
    model: LoadedModel,
    example: RAGExample,
    signature: str,
    shipped: ShippedDetectors,
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
    asked, shipped = shipped, shipped.for_example(example)
    key = (model.instance_key, signature, shipped.cache_id)
    found = _verdicts().get(key)
    if found is not None:
        return found
    if retry:
        _failures().pop(key)
    elif (failed := _failures().get(key)) is not None:
        raise failed
    by_name = {s.name: s for s in shipped.detectors}
    got: dict[str, Verdict] = {}
    features: dict[str, Features] = {}
    t0 = time.perf_counter()
    dets = [s.detector for s in shipped.detectors]
    try:
        for judged in judge_stream(model, example, dets, extra=extra, on_trace=on_trace):
            name = judged.detector
            if name is not None:
                assert judged.verdict is not None and judged.step.features is not None
                got[name] = judged.verdict
                features[name] = judged.step.features
            if on_step is not None:
                on_step(judged, by_name.get(name) if name is not None else None)
    except RagscopeError as e:
        _failures().put(key, e)
        raise
    verdicts = tuple(got[s.name] for s in shipped.detectors)
    seconds = time.perf_counter() - t0
    out = DetectorVerdicts(
        signature=signature,
        detectors=shipped.detectors,
        verdicts=verdicts,
        seconds=seconds,
        features=features,
        answer=_answer(example, shipped.detectors, verdicts, shipped, seconds),
        example=example,
        asked=asked,
        judged_by=shipped,
    )
    _verdicts().put(key, out)
    return out


def detector_verdicts(
    model: LoadedModel, analysis: Analysis, shipped: ShippedDetectors
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
    shipped: ShippedDetectors,
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

    def run(self, model: LoadedModel, shipped: ShippedDetectors) -> None:
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
    model_id: str, detectors_id: str, _model: LoadedModel, _shipped: ShippedDetectors
) -> Warming:
    warming = Warming(detectors=len(_shipped.detectors))
    warming.thread = threading.Thread(
        target=warming.run, args=(_model, _shipped), name="ragscope-warm-detectors", daemon=True
    )
    warming.thread.start()
    return warming


def warm_detectors(model: LoadedModel, shipped: ShippedDetectors) -> Warming | None:
    """Judge a tiny answer once with every loaded detector on a background thread (once
    per model and detector set, :func:`core.pipeline.judge.warm_up`), so the resources
    they load on first use (spaCy, the SAE, sentence embeddings, ...) are ready before
    the first real Analyse; its :class:`Warming` says how far it is.
    ``RAGSCOPE_WARM_DETECTORS=0`` turns it off (the app tests count forward passes)."""
    if not shipped.detectors or os.environ.get(WARM_ENV, "1").strip() == "0":
        return None
    return _warming(model.instance_key, shipped.cache_id, model, shipped)
