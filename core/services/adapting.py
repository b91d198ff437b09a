"""Adapting a detector set to a dataset from its reviews: the reviewed answers' labels
(:mod:`core.review.answers`), the set's verdicts on them, each detector's calibration of
the dataset's own (:mod:`core.evaluation.adapt`), written as a derived set that judges
the dataset's answers from then on. ``ragscope adapt`` runs it in a terminal and as the
worker of the Review page's background job (:func:`core.services.jobs.start_adapt_job`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from core.base.errors import DataError
from core.base.examples import RAGExample
from core.detectors.ensemble import EnsembleDetector
from core.engine.model import LoadedModel
from core.evaluation.adapt import (
    REFIT_PROCEDURE,
    AdaptRecord,
    DetectorAdaptation,
    Reviewed,
    fit_adaptation,
    fit_refit,
    missing_reviews,
    reviews_hash,
    write_adapted_set,
)
from core.learning.contract import Verdict, judge_features
from core.pipeline.extract import FeatureCache, iter_features
from core.pipeline.sets import DetectorSet
from core.review import AnswerBook, ReviewBook
from core.storage import Store


@dataclass(frozen=True, kw_only=True)
class AdaptResult:
    """What an adaptation wrote.

    Attributes:
        folder: The derived set's folder.
        dataset: The dataset it judges.
        record: What it records of how it was made.
        detectors: Each detector's calibration (or why none).
    """

    folder: Path
    dataset: str
    record: AdaptRecord
    detectors: tuple[DetectorAdaptation, ...]

    def summary(self) -> dict[str, object]:
        """A JSON-able summary (the job's result)."""
        return {
            "folder": str(self.folder),
            "dataset": self.dataset,
            "reviews_hash": self.record.reviews_hash,
            "n_reviews": self.record.n_reviews,
            "n_random": self.record.n_random,
            "refit": self.record.refit,
            "calibrated": {
                a.name: {
                    "threshold": a.calibration.threshold,
                    "n": a.calibration.n,
                    "n_positive": a.calibration.n_positive,
                }
                for a in self.detectors
                if a.calibration is not None
            },
            "not_calibrated": {a.name: a.reason for a in self.detectors if a.calibration is None},
        }


def reviewed_answers(store: Store, queue: str, examples: Sequence[RAGExample]) -> list[Reviewed]:
    """The answers of ``examples`` with a label in review queue ``queue``, by the label
    rules (:data:`core.review.LABEL_RULES`), in the examples' order."""
    items = ReviewBook(store).items(queue, sort="position")
    labels = AnswerBook(store).labels(queue, examples, items)
    return [
        Reviewed(example=ex, label=bool(lab.label), random=lab.random)
        for ex in examples
        if (lab := labels[ex.id]).label is not None
    ]


def answers_dataset(examples: Sequence[RAGExample]) -> str:
    """The one dataset name (``provenance.dataset``) the answers share: what the derived
    set is routed by.

    Raises:
        DataError: None, or several.
    """
    names = {e.provenance.dataset for e in examples}
    if len(names) != 1 or not next(iter(names)):
        shown = sorted(str(n) for n in names)[:5]
        raise DataError(
            f"the reviewed answers must come from one named dataset to adapt a set to it; "
            f"they come from {shown}: import them as one dataset first"
        )
    return str(next(iter(names)))


def adapt_set(
    store: Store,
    model: LoadedModel,
    base: DetectorSet,
    queue: str,
    examples: Sequence[RAGExample],
    dest_root: Path,
    *,
    refit: bool = False,
    progress: Callable[[int, int], None] | None = None,
) -> AdaptResult:
    """Fit ``base`` to ``examples``' dataset from the reviews of ``queue`` and write the
    derived set under ``dest_root``.

    The set that judges the dataset now (``base``'s expert for it, or an earlier
    adaptation, else ``base``) judges every reviewed answer (features from the cache);
    each of its calibrated detectors gets the dataset's own calibration and threshold
    from the answers reviewed in the random order (:func:`fit_adaptation`). With
    ``refit``, its ensemble also gets a stacker of the dataset's own fitted on every
    reviewed answer, and its calibration reads that stacker's out-of-fold scores
    (:func:`~core.evaluation.adapt.fit_refit`).

    Raises:
        DataError: No reviewed answer, answers of several datasets, too few reviewed in
            the random order (the message says how many more of each class), or no
            detector that can be calibrated.
    """
    reviewed = reviewed_answers(store, queue, examples)
    if not reviewed:
        raise DataError(
            f"no answer of {queue!r} has a label yet: review answers (whole answers, in the "
            "random order) first"
        )
    dataset = answers_dataset([r.example for r in reviewed])
    short = missing_reviews([r.label for r in reviewed if r.random])
    if short is not None:
        raise DataError(short)
    judging = base.for_dataset(dataset)
    dets = judging.fitted
    ensemble = next((d for d in dets if isinstance(d, EnsembleDetector)), None)
    verdicts: dict[str, list[Verdict]] = {d.name: [] for d in dets}
    rows: list[np.ndarray] = []
    answers = [r.example for r in reviewed]
    got = iter_features(model, answers, dets, cache=FeatureCache(store), on_error="skip")
    for i, one in enumerate(got, start=1):
        if one.error is not None or one.features is None:
            raise DataError(
                f"the reviewed answer {one.example.id!r} cannot be judged: {one.error}; "
                "fix or remove its reviews"
            )
        for d in dets:
            verdicts[d.name].append(judge_features(d, one.features[d.name], dataset))
        if ensemble is not None:
            rows.append(ensemble.review_row(one.features[ensemble.name]))
        if progress is not None:
            progress(i, len(reviewed))
    refitted: dict[str, EnsembleDetector] = {}
    refit_note = ""
    if ensemble is not None:
        fitted, raw, refit_note = _refit(ensemble, rows, reviewed, dataset, refit=refit)
        if fitted is not None:
            refitted[ensemble.name] = fitted
        if raw is not None:
            verdicts[ensemble.name] = [
                dataclasses.replace(v, raw_by_dataset={**v.raw_by_dataset, dataset: float(r)})
                for v, r in zip(verdicts[ensemble.name], raw, strict=True)
            ]
    elif refit:
        refit_note = "no refit: the set has no ensemble"
    adaptations = fit_adaptation(verdicts, reviewed, dataset)
    record = AdaptRecord(
        base_set=judging.name,
        deferred_from=judging.deferred_from,
        dataset=dataset,
        reviews_hash=reviews_hash(reviewed),
        n_reviews=len(reviewed),
        n_random=sum(r.random for r in reviewed),
        n_random_hallucinated=sum(r.random and r.label for r in reviewed),
        calibrated=(),
        refit=refit_note,
        refitted=any(dataset in e.dataset_stackers_ for e in refitted.values()),
    )
    folder = write_adapted_set(judging, adaptations, record, dest_root, refitted=refitted)
    return AdaptResult(folder=folder, dataset=dataset, record=record, detectors=tuple(adaptations))


def _refit(
    ensemble: EnsembleDetector,
    rows: Sequence[np.ndarray],
    reviewed: Sequence[Reviewed],
    dataset: str,
    *,
    refit: bool,
) -> tuple[EnsembleDetector | None, np.ndarray | None, str]:
    """The ensemble an adaptation writes (``None``: copied as it is), the raw scores its
    calibration of ``dataset`` reads (``None``: its verdicts' own), and what the record
    says of the refit. Without a refit, a reviewed stacker an earlier adaptation fitted
    is dropped: its scores of these answers are not out of fold."""
    had = ensemble.dataset_stackers_.get(dataset)
    if had is not None and not had.reviewed:
        note = "no refit: the ensemble has a stacker trained on this dataset" if refit else ""
        return None, None, note
    note = ""
    if refit:
        x = np.stack(rows)
        got = fit_refit(x, np.asarray([r.label for r in reviewed]), base=x[:, -1])
        if got.stacker is not None and got.out_of_fold is not None:
            return (
                ensemble.with_review_stacker(dataset, got.stacker),
                got.out_of_fold,
                f"{REFIT_PROCEDURE}; fitted on {got.n} reviewed answers "
                f"({got.n_positive} hallucinated), out-of-fold AUROC {got.auroc:.3f} vs "
                f"the base reading's {got.base_auroc:.3f}",
            )
        note = f"no refit: {got.reason}"
    if had is None:
        return None, None, note
    pooled = np.asarray([float(r[-1]) for r in rows])  # the pooled stacker's logit
    return ensemble.with_review_stacker(dataset, None), 1.0 / (1.0 + np.exp(-pooled)), note


@dataclass(frozen=True, kw_only=True)
class AdaptStatus:
    """Where a dataset stands in the review loop (what the Review page shows).

    Attributes:
        dataset: The answers' dataset name (``None``: they come from several, or none).
        n_random_hallucinated, n_random_faithful: Labels drawn at random (they calibrate).
        n_labelled: Answers with a label, in any order.
        missing: How many more random reviews calibrating needs (``None``: enough).
        current: The set adapted to this dataset now, if any.
        stale: Whether the reviews changed since :attr:`current` was fitted.
        problem: Why the dataset cannot be adapted (``None``: it can).
        reviewed: The labelled answers an adaptation would judge.
        judging: The set that judges the dataset now (what an adaptation derives from).
    """

    dataset: str | None
    n_random_hallucinated: int
    n_random_faithful: int
    n_labelled: int
    missing: str | None
    current: DetectorSet | None
    stale: bool
    problem: str | None = None
    reviewed: tuple[RAGExample, ...] = ()
    judging: DetectorSet | None = None


def adapt_status(
    store: Store, dset: DetectorSet, queue: str, examples: Sequence[RAGExample]
) -> AdaptStatus:
    """What the review loop of ``queue`` has gathered, and the set adapted from it."""
    reviewed = reviewed_answers(store, queue, examples)
    random = [r.label for r in reviewed if r.random]
    try:
        dataset: str | None = answers_dataset(examples)
        problem = None
    except DataError as e:
        dataset, problem = None, str(e)
    judging = dset.for_dataset(dataset) if dataset else None
    current = judging if judging is not None and judging.adapted is not None else None
    return AdaptStatus(
        dataset=dataset,
        n_random_hallucinated=sum(random),
        n_random_faithful=len(random) - sum(random),
        n_labelled=len(reviewed),
        missing=missing_reviews(random),
        current=current,
        stale=current is not None
        and current.adapted is not None
        and current.adapted.reviews_hash != reviews_hash(reviewed),
        problem=problem,
        reviewed=tuple(r.example for r in reviewed),
        judging=judging,
    )
