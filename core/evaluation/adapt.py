"""Adapting a detector set to one dataset from its reviewed answers.

A set trained on other data judges a user's dataset with its pooled calibration and
threshold: probabilities right for none of its answers' base rate. The reviewers' labels
of the dataset's answers fix that. From the answers reviewed **in the dataset's random
order** (:mod:`core.data.sampling`: an unbiased sample), each calibrated detector of the
set gets a calibration and threshold of the dataset's own (:func:`fit_review_calibration`: Platt
scaling of its raw scores, as training fits per dataset, and the threshold at the
dataset's base rate among the reviewed answers, which is where calibrated probabilities
give the best balanced accuracy and varies far less than a threshold searched on a few
dozen answers: :mod:`core.evaluation.review_curve` measured both), once at
least :data:`MIN_ADAPT_ANSWERS` of them with :data:`MIN_ADAPT_CLASS` of each class are
reviewed; answers reviewed in another order never calibrate (their sample is biased).
A detector whose scores carry no signal on them (all equal, or ranking them no better
than chance: :func:`no_signal`) gets no calibration of the dataset's own and keeps its
base calibration: a flat fit gives every answer the base rate, which is also the
threshold, and would flag every answer.

:func:`write_adapted_set` writes the result as a **derived set**: a copy of the base
set's artifacts (their files, and so their verified hashes, unchanged) whose
``cfg.json`` gains the dataset's calibration under ``calibration_by_dataset`` and an
``adapted`` record (:class:`AdaptRecord`: the base set, the dataset, the reviews'
content hash, the procedure), plus ``adapted.json`` naming its base set and dataset.
:func:`core.pipeline.sets.load_set` routes the dataset's answers to it
(:meth:`~core.pipeline.sets.DetectorSet.for_dataset`); the base set is never touched.

**Refit** (optional): the ensemble also gets a response stacker of the dataset's own
(:meth:`core.detectors.ensemble.EnsembleDetector.with_review_stacker`), a strongly
regularised logistic regression over its members' logits and its pooled stacker's logit
(:func:`fit_refit`), fitted on every answer with a label (any order: the stacker ranks,
the calibration fixes its probabilities). The ensemble's calibration for the dataset is
then fitted on that stacker's **out-of-fold** scores of the random-order answers
(:data:`REFIT_FOLDS` folds), never on scores of answers it was fitted on. The members
themselves are not refitted: that needs the training sets' features and hours of this
machine's CPU (``ragscope train`` with the reviewed answers exported as a dataset).
The learning curves (:mod:`core.evaluation.review_curve`) run the same functions.
"""

from __future__ import annotations

import hashlib
import json
import math
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
from sklearn.metrics import roc_auc_score
from sklearn.model_selection import StratifiedKFold

from core.base.errors import DataError
from core.base.examples import RAGExample, example_hash
from core.base.words import counted
from core.detectors.ensemble import EnsembleDetector
from core.learning.artifact import read_artifact_cfg, write_artifact
from core.learning.calibration import DatasetCalibration, PlattCalibrator
from core.learning.contract import Verdict
from core.learning.learners import LogisticCalibrator
from core.pipeline.sets import ADAPTED_FILE, AdaptedInfo, DetectorSet, adapted_set_name

MIN_ADAPT_ANSWERS = 20
"""The fewest answers reviewed in the random order that calibrate a detector for a
dataset."""

MIN_ADAPT_CLASS = 5
"""The fewest of each class (faithful, hallucinated) among them."""

PROCEDURE = (
    "calibration: Platt scaling of each calibrated detector's raw score on the answers "
    f"reviewed in the dataset's random order (at least {MIN_ADAPT_ANSWERS}, "
    f"{MIN_ADAPT_CLASS} of each class), threshold at their share of hallucinated answers; "
    "a detector whose scores rank them no better than chance keeps its base calibration"
)
"""The procedure an adapted set records."""

REFIT_C = 0.03
"""The reviewed stacker's inverse L2 strength (on standardised inputs): chosen on the
learning curves (100 random reviews, 20 seeds; stronger shrinkage helped on all three
dev sets, e.g. Dolly AC 0.703 AUROC at C=1 vs 0.710), so the curves' refit numbers are
mildly optimistic."""

REFIT_FOLDS = 5
"""Folds of the reviewed stacker's out-of-fold scores (what the calibration reads)."""

REFIT_PROCEDURE = (
    f"refit: the ensemble's stacker of the dataset's own, an L2 logistic regression "
    f"(C={REFIT_C}, standardised inputs) over its members' logits and its pooled stacker's "
    f"logit, fitted on every reviewed answer (at least {MIN_ADAPT_ANSWERS}, "
    f"{MIN_ADAPT_CLASS} of each class) and kept when its {REFIT_FOLDS}-fold out-of-fold "
    "scores rank them better (AUROC) than the base reading; its calibration fitted on "
    "those out-of-fold scores of the random-order answers"
)
"""What an adapted set records of its refit."""


@dataclass(frozen=True, kw_only=True)
class Reviewed:
    """One reviewed answer: its label and whether it was drawn at random."""

    example: RAGExample
    label: bool
    random: bool


def fit_review_calibration(raw: np.ndarray, y: np.ndarray) -> DatasetCalibration:
    """A dataset's own calibration from reviewed answers drawn at random: Platt scaling
    of the raw scores, and the threshold at the share of hallucinated answers among them
    (the mean calibrated probability: for calibrated probabilities the threshold that
    maximises balanced accuracy is the base rate).

    Raises:
        DataError: One class only, or lengths that differ.
    """
    y = np.asarray(y).astype(int)
    cal = PlattCalibrator().fit(raw, y)
    return DatasetCalibration(
        calibrator=cal,
        threshold=float(np.clip(y.mean(), 1e-3, 1 - 1e-3)),
        n=int(y.size),
        n_positive=int(y.sum()),
    )


def reviews_hash(reviewed: Sequence[Reviewed]) -> str:
    """The content hash of the reviews an adaptation is fitted from: each answer's
    content hash, label and whether it was drawn at random (order does not matter)."""
    rows = sorted(f"{example_hash(r.example)}:{int(r.label)}:{int(r.random)}" for r in reviewed)
    return hashlib.sha256("\n".join(rows).encode("utf-8")).hexdigest()


def missing_reviews(labels: Sequence[bool], *, purpose: str = "calibrating") -> str | None:
    """``None`` when answers labelled ``labels`` (drawn at random) are enough to
    calibrate (``purpose``), else how many more are needed, in words."""
    n, pos = len(labels), int(sum(bool(x) for x in labels))
    more_pos, more_neg = max(MIN_ADAPT_CLASS - pos, 0), max(MIN_ADAPT_CLASS - (n - pos), 0)
    more_any = max(MIN_ADAPT_ANSWERS - n - more_pos - more_neg, 0)
    if not (more_pos or more_neg or more_any):
        return None
    parts = [
        f"{more_pos} more hallucinated" if more_pos else "",
        f"{more_neg} more faithful" if more_neg else "",
        f"{more_any} more of either" if more_any else "",
    ]
    return (
        f"{counted(n, 'answer')} reviewed in the random order ({pos} hallucinated); "
        f"{purpose} needs "
        f"at least {MIN_ADAPT_ANSWERS} with {MIN_ADAPT_CLASS} of each class: review "
        + ", ".join(p for p in parts if p)
        + " in the random order"
    )


def fit_review_stacker(x: np.ndarray, y: np.ndarray) -> LogisticCalibrator:
    """The reviewed stacker: an unweighted L2 logistic regression (:data:`REFIT_C`) on
    standardised rows (:meth:`~core.detectors.ensemble.EnsembleDetector.review_row`)."""
    return LogisticCalibrator(C=REFIT_C, class_weight=None).fit(x, np.asarray(y).astype(int))


@dataclass(frozen=True, kw_only=True)
class Refit:
    """A reviewed stacker fitted on every reviewed answer (:func:`fit_refit`).

    Attributes:
        stacker: Fitted on all the rows (``None``: too few answers; :attr:`reason`).
        out_of_fold: Per row, the score of a stacker fitted without its fold (what the
            calibration reads).
        n, n_positive: Answers it was fitted on, and of them hallucinated.
        auroc, base_auroc: The out-of-fold scores' AUROC on the reviewed answers, and the
            base reading's (NaN: too few answers to fit).
        reason: Why there is no stacker, in words.
    """

    stacker: LogisticCalibrator | None
    out_of_fold: np.ndarray | None
    n: int
    n_positive: int
    auroc: float = math.nan
    base_auroc: float = math.nan
    reason: str | None = None


def fit_refit(x: np.ndarray, y: np.ndarray, base: np.ndarray, seed: int = 0) -> Refit:
    """The reviewed stacker on every reviewed answer's row ``x`` and label ``y``, and its
    out-of-fold scores (:data:`REFIT_FOLDS` stratified folds, fewer when a class is
    smaller). No stacker under :data:`MIN_ADAPT_ANSWERS` answers or
    :data:`MIN_ADAPT_CLASS` of a class, nor when its out-of-fold scores rank the
    reviewed answers no better (AUROC) than ``base``, the base reading's scores of them:
    where the set already ranks a dataset well, a stacker fitted on a few dozen answers
    mostly adds noise (the learning curves measured it: RAGTruth QA 0.815 -> 0.805)."""
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y).astype(int)
    base = np.asarray(base, dtype=np.float64)
    n, pos = int(y.size), int(y.sum())
    if x.ndim != 2 or x.shape[0] != n or base.shape != (n,):
        raise DataError(
            f"the refit needs one row and one base score per label; got {x.shape}, "
            f"{base.shape} and {n}"
        )
    if n < MIN_ADAPT_ANSWERS or min(pos, n - pos) < MIN_ADAPT_CLASS:
        return Refit(
            stacker=None,
            out_of_fold=None,
            n=n,
            n_positive=pos,
            reason=(
                f"{n} reviewed answers ({pos} hallucinated); the refit needs at least "
                f"{MIN_ADAPT_ANSWERS} with {MIN_ADAPT_CLASS} of each class"
            ),
        )
    k = min(REFIT_FOLDS, pos, n - pos)
    oof = np.empty(n, dtype=np.float64)
    folds = StratifiedKFold(n_splits=k, shuffle=True, random_state=seed)
    for train, test in folds.split(x, y):
        oof[test] = fit_review_stacker(x[train], y[train]).predict_proba(x[test])
    auroc = float(roc_auc_score(y, oof))
    base_auroc = float(roc_auc_score(y, base))
    if auroc <= base_auroc:
        return Refit(
            stacker=None,
            out_of_fold=oof,
            n=n,
            n_positive=pos,
            auroc=auroc,
            base_auroc=base_auroc,
            reason=(
                f"on the {n} reviewed answers its out-of-fold AUROC ({auroc:.3f}) does not "
                f"beat the base reading's ({base_auroc:.3f}), so it is not kept"
            ),
        )
    return Refit(
        stacker=fit_review_stacker(x, y),
        out_of_fold=oof,
        n=n,
        n_positive=pos,
        auroc=auroc,
        base_auroc=base_auroc,
    )


@dataclass(frozen=True, kw_only=True)
class DetectorAdaptation:
    """What an adaptation fitted for one detector of the set.

    Attributes:
        calibration: The dataset's own calibration and threshold (``None``: not fitted).
        reason: Why not, in words (``None`` when fitted).
    """

    name: str
    calibration: DatasetCalibration | None
    reason: str | None = None


def raw_scores(verdicts: Sequence[Verdict], dataset: str) -> np.ndarray | None:
    """The raw scores a dataset's own calibration reads (the detector's scorer of that
    dataset when it has one, else its pooled raw score); ``None`` when the detector's
    scores are not calibrated (no raw score to calibrate)."""
    out = []
    for v in verdicts:
        raw = v.raw_by_dataset.get(dataset, v.raw_score)
        if raw is None:
            return None
        out.append(float(raw))
    return np.asarray(out, dtype=np.float64)


def fit_adaptation(
    verdicts: Mapping[str, Sequence[Verdict]],
    reviewed: Sequence[Reviewed],
    dataset: str,
) -> list[DetectorAdaptation]:
    """Each detector's calibration and threshold for ``dataset`` from the answers
    reviewed in its random order.

    Args:
        verdicts: Detector name -> its verdicts on ``reviewed``'s answers, in order.
        reviewed: The reviewed answers.
        dataset: The dataset's name (``provenance.dataset`` of its answers).

    Raises:
        DataError: A detector's verdicts do not match ``reviewed`` one to one.
    """
    use = np.asarray([r.random for r in reviewed], dtype=bool)
    y = np.asarray([r.label for r in reviewed], dtype=int)
    short = missing_reviews([bool(v) for v in y[use]])
    out = []
    for name, vs in verdicts.items():
        if len(vs) != len(reviewed) or any(
            v.example_id != r.example.id for v, r in zip(vs, reviewed, strict=False)
        ):
            raise DataError(f"{name}'s verdicts are not one per reviewed answer, in order")
        raw = raw_scores(vs, dataset)
        if raw is None:
            out.append(
                DetectorAdaptation(
                    name=name,
                    calibration=None,
                    reason="its scores are not calibrated probabilities (no raw score)",
                )
            )
        elif short is not None:
            out.append(DetectorAdaptation(name=name, calibration=None, reason=short))
        else:
            cal = fit_review_calibration(raw[use], y[use])
            silent = no_signal(raw[use], y[use], cal)
            out.append(
                DetectorAdaptation(name=name, calibration=None, reason=silent)
                if silent is not None
                else DetectorAdaptation(name=name, calibration=cal)
            )
    return out


def no_signal(raw: np.ndarray, y: np.ndarray, cal: DatasetCalibration) -> str | None:
    """Why a calibration fitted on reviewed answers (raw scores ``raw``, labels ``y``)
    carries no signal, or ``None``: the scores are all equal, they rank the answers no
    better than chance (AUROC at most 0.5), or the fit is flat
    (:attr:`~core.learning.calibration.PlattCalibrator.flat`). Such a calibration gives
    every answer the reviewed base rate, which is also its threshold, so it would flag
    every answer: the detector keeps its base calibration instead."""
    n = int(np.size(y))
    keep = "it keeps its base calibration"
    if np.ptp(raw) <= 0:
        return f"no signal on the {n} reviewed answers: its scores are all equal; {keep}"
    auroc = float(roc_auc_score(np.asarray(y).astype(int), raw))
    if auroc <= 0.5 or cal.calibrator.flat:
        return (
            f"no signal on the {n} reviewed answers: its scores rank them no better than "
            f"chance (AUROC {auroc:.2f}); {keep}"
        )
    return None


@dataclass(frozen=True, kw_only=True)
class AdaptRecord:
    """What a derived set records of how it was made (``adapted.json`` and each
    artifact's ``cfg.json["adapted"]``).

    Attributes:
        base_set: The set it was derived from (the one that judged the dataset).
        deferred_from: The set that deferred to :attr:`base_set` for the dataset, when
            the base was an expert (routing starts from it).
        dataset: The dataset (``provenance.dataset`` of its answers).
        reviews_hash: :func:`reviews_hash` of the reviews it was fitted from.
        n_reviews: Answers with a label.
        n_random: Of them, drawn in the random order.
        n_random_hallucinated: Of those, hallucinated.
        calibrated: The detectors that got a calibration of the dataset's own.
        refit: What the refit did (:data:`REFIT_PROCEDURE` and on how many answers), or
            why there was none; empty when none was asked.
        refitted: Whether the ensemble got a reviewed stacker.
        procedure: :data:`PROCEDURE`.
        created_at: When (UTC, ISO 8601).
    """

    base_set: str
    deferred_from: str | None
    dataset: str
    reviews_hash: str
    n_reviews: int
    n_random: int
    n_random_hallucinated: int
    calibrated: tuple[str, ...]
    refit: str = ""
    refitted: bool = False
    procedure: str = PROCEDURE
    created_at: str = ""

    def info(self) -> AdaptedInfo:
        return AdaptedInfo(
            base_set=self.deferred_from or self.base_set,
            dataset=self.dataset,
            reviews_hash=self.reviews_hash,
            n_reviews=self.n_reviews,
            n_random=self.n_random,
            created_at=self.created_at,
            refit=self.refitted,
        )

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["calibrated"] = list(self.calibrated)
        return d


# What write_artifact records itself; the rest of a cfg.json is kept when refitted.
_OWN_CFG = frozenset(
    {"detector", "artifact_version", "config", "config_hash", "model", "versions", "files"}
)


def write_adapted_set(
    base: DetectorSet,
    adaptations: Sequence[DetectorAdaptation],
    record: AdaptRecord,
    dest_root: Path,
    *,
    refitted: Mapping[str, EnsembleDetector] | None = None,
) -> Path:
    """Write the derived set into ``dest_root/<adapted_set_name(...)>`` (replaced when
    there) and return its folder. Each artifact of ``base`` is copied as it is (its
    files keep their recorded hashes) and its ``cfg.json`` gains the dataset's
    calibration and the :class:`AdaptRecord`; a detector in ``refitted`` (the ensemble
    with a reviewed stacker) has its weights and config written anew, its hashes with
    them, and keeps the rest of its ``cfg.json``.

    Raises:
        DataError: No detector got a calibration (nothing to adapt), or an artifact of
            the base set has no ``cfg.json``.
    """
    fitted = {a.name: a.calibration for a in adaptations if a.calibration is not None}
    if not fitted:
        reasons = "; ".join(f"{a.name}: {a.reason}" for a in adaptations[:3])
        raise DataError(f"no detector could be calibrated for {record.dataset!r} ({reasons})")
    stamped = AdaptRecord(
        **{**asdict(record), "calibrated": tuple(sorted(fitted))}
        | {"created_at": record.created_at or datetime.now(UTC).isoformat(timespec="seconds")}
    )
    name = adapted_set_name(stamped.info().base_set, record.dataset)
    dest = dest_root / name
    staging = dest_root / f".{name}.writing"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    for card in base.detectors:
        shutil.copytree(card.folder, staging / card.name, symlinks=False)
        cfg_path = staging / card.name / "cfg.json"
        cfg = read_artifact_cfg(cfg_path)
        cal = fitted.get(card.name)
        if cal is not None:
            by = dict(cfg.get("calibration_by_dataset") or {})
            by[record.dataset] = cal.to_json()
            cfg["calibration_by_dataset"] = by
        cfg["adapted"] = stamped.to_json()
        det = (refitted or {}).get(card.name)
        if det is None:
            cfg_path.write_text(json.dumps(cfg, indent=2) + "\n", encoding="utf-8")
            continue
        weights, files = det.fitted_state()
        write_artifact(
            staging / card.name,
            name=det.name,
            config=det.config,
            model_key=str(det.model_key_),
            weights=weights,
            extra={k: v for k, v in cfg.items() if k not in _OWN_CFG},
            files=files,
        )
    (staging / ADAPTED_FILE).write_text(
        json.dumps(stamped.info().to_json(), indent=2) + "\n", encoding="utf-8"
    )
    old = dest_root / f".{name}.replaced"
    shutil.rmtree(old, ignore_errors=True)
    if dest.exists():
        dest.rename(old)
    staging.rename(dest)
    shutil.rmtree(old, ignore_errors=True)
    return dest
