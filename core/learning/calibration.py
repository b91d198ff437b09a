"""Calibration: turning a detector's score into a probability, and checking it.

- :class:`PlattCalibrator` maps a score ``s`` in [0, 1] to ``sigmoid(a * logit(s) + b)``
  (Platt scaling on the logit, fitted by an unweighted logistic regression). It is
  strictly increasing when ``a > 0``, so it never changes a ranking (AUROC, AP); it only
  makes ``0.8`` mean "about 80% of such answers are hallucinated" on the data it was
  fitted on. It saves as two numbers in JSON.
- :func:`reliability` bins predicted probabilities and compares each bin's mean
  prediction with its observed rate (the reliability diagram);
  :func:`expected_calibration_error` is the count-weighted mean gap (ECE).
- :class:`DatasetCalibration` is one dataset's own calibrator and threshold, for a
  detector trained on several datasets whose base rates differ (a probability pooled
  over a 50%-hallucinated template corpus and an 18%-hallucinated real set is right for
  neither); :func:`read_dataset_calibrations` reads a ``cfg.json``'s map of them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Self, TypeGuard, TypeVar

import numpy as np

from core.base.errors import DataError

T = TypeVar("T")

_EPS = 1e-6


def logit(p: np.ndarray) -> np.ndarray:
    """``log(p / (1 - p))`` with ``p`` clipped to ``[1e-6, 1 - 1e-6]``."""
    q = np.clip(np.asarray(p, dtype=np.float64), _EPS, 1.0 - _EPS)
    return np.log(q / (1.0 - q))


def _number(v: Any) -> TypeGuard[float]:
    return isinstance(v, int | float) and not isinstance(v, bool) and bool(np.isfinite(v))


MAX_PLATT = 100.0
"""Largest slope and intercept magnitude a saved Platt calibrator may hold (fitted ones
are a few units; a slope is never negative)."""

FLAT_SLOPE = 1e-6
"""A Platt slope below this is flat: every score maps to one probability (the base rate
of the answers it was fitted on), so the calibration carries no signal
(:attr:`PlattCalibrator.flat`)."""

PLATT_C: tuple[float, ...] = (1e4, 1e2, 1.0, 1e-2)
"""Inverse L2 strengths a Platt fit tries in turn until its slope and intercept are
within :data:`MAX_PLATT` (the first, nearly unregularised, almost always is)."""


class PlattCalibrator:
    """``p = sigmoid(a * logit(score) + b)``, fitted on held-out scores and labels.

    Attributes:
        a_: Slope (>= 0; 0 when the scores ranked the wrong way round).
        b_: Intercept.
        n_: How many answers it was fitted on.
    """

    def __init__(self) -> None:
        self.a_: float | None = None
        self.b_: float | None = None
        self.n_: int = 0

    def fit(self, scores: np.ndarray, y: np.ndarray) -> Self:
        """Fit on scores in [0, 1] and 0/1 labels (both classes needed).

        Raises:
            DataError: Lengths differ, or one class only.
        """
        from sklearn.linear_model import LogisticRegression

        s = logit(np.asarray(scores, dtype=np.float64).ravel())
        y = np.asarray(y).astype(int).ravel()
        if s.shape != y.shape:
            raise DataError(f"calibration needs one label per score; got {s.size} and {y.size}")
        if set(np.unique(y).tolist()) != {0, 1}:
            raise DataError(
                "calibration needs faithful and hallucinated answers in its held-out part"
            )
        # Nearly unregularised: two parameters, no class weights (so the base rate holds).
        # Scores that separate the classes perfectly (a detector a few dozen reviewed
        # answers agree with) drive the slope towards infinity: then the least
        # regularisation that keeps it within what a saved calibrator may hold.
        a = b = 0.0
        for c in PLATT_C:
            lr = LogisticRegression(C=c, max_iter=1000)
            lr.fit(s[:, None], y)
            a, b = float(lr.coef_[0, 0]), float(lr.intercept_[0])
            if abs(a) <= MAX_PLATT and abs(b) <= MAX_PLATT:
                break
        self.a_, self.b_ = a, b
        if self.a_ < 0:
            # Scores that rank the wrong way on held-out data are not turned round (that
            # would be a different detector): they carry no information, the base rate.
            self.a_, self.b_ = 0.0, float(logit(np.asarray(y.mean())))
        self.n_ = int(y.size)
        return self

    @property
    def fitted(self) -> bool:
        return self.a_ is not None and self.b_ is not None

    @property
    def flat(self) -> bool:
        """Whether it maps every score to (nearly) one probability: a slope under
        :data:`FLAT_SLOPE`, as the fit leaves it when the scores ranked its answers the
        wrong way round or were all equal. Such a calibration carries no signal: its
        probability is the base rate of the answers it was fitted on, and comparing that
        with a threshold chosen on the same answers would flag every answer or none
        (:func:`core.learning.contract.for_dataset` makes no call with it)."""
        return self.a_ is not None and self.a_ < FLAT_SLOPE

    def transform(self, scores: np.ndarray | float) -> np.ndarray:
        """Calibrated probabilities of ``scores`` (same shape)."""
        if self.a_ is None or self.b_ is None:
            raise DataError("the calibrator is not fitted")
        z = self.a_ * logit(np.asarray(scores, dtype=np.float64)) + self.b_
        return 1.0 / (1.0 + np.exp(-z))

    def inverse(self, p: float) -> float:
        """The raw score whose calibrated probability is ``p`` (for thresholds)."""
        if self.a_ is None or self.b_ is None or self.a_ == 0:
            raise DataError("the calibrator is not fitted or not invertible (slope 0)")
        z = (float(logit(np.asarray(p))) - self.b_) / self.a_
        return float(1.0 / (1.0 + np.exp(-z)))

    def to_json(self) -> dict[str, Any]:
        if self.a_ is None or self.b_ is None:
            raise DataError("the calibrator is not fitted; nothing to save")
        return {"kind": "platt", "a": self.a_, "b": self.b_, "n": self.n_}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Self:
        """Read :meth:`to_json` back.

        Raises:
            DataError: Another kind, or non-finite numbers.
        """
        if not isinstance(d, Mapping) or d.get("kind") != "platt":
            raise DataError("not a Platt calibrator (kind must be 'platt')")
        a, b = d.get("a"), d.get("b")
        if not (_number(a) and _number(b)):
            raise DataError("a Platt calibrator needs finite numbers a and b")
        if not (0 <= a <= MAX_PLATT and abs(b) <= MAX_PLATT):
            raise DataError(
                f"a Platt calibrator needs 0 <= a <= {MAX_PLATT:g} and |b| <= {MAX_PLATT:g} "
                f"(fitted ones are a few units), got a={a!r}, b={b!r}"
            )
        obj = cls()
        obj.a_, obj.b_ = float(a), float(b)
        n = d.get("n", 0)
        obj.n_ = int(n) if isinstance(n, int) and not isinstance(n, bool) else 0
        return obj


MIN_DATASET_ANSWERS = 40
"""The fewest answers of a dataset that get a calibration of their own."""

MIN_DATASET_CLASS = 8
"""The fewest answers of each class (faithful, hallucinated) that dataset needs."""


def enough_for_own(y: np.ndarray) -> bool:
    """Whether answers labelled ``y`` (0/1) are enough for a dataset's own fit (its
    calibration, or the ensemble's stacker of its own): at least
    :data:`MIN_DATASET_ANSWERS`, with :data:`MIN_DATASET_CLASS` of each class."""
    n, pos = int(np.size(y)), int(np.sum(y))
    return n >= MIN_DATASET_ANSWERS and min(pos, n - pos) >= MIN_DATASET_CLASS


MAX_DATASET_CALIBRATIONS = 64
"""The most per-dataset calibrations an artifact may hold (a bound on hostile files)."""

MAX_DATASET_NAME = 200
"""The longest dataset name an artifact's per-dataset calibration may carry."""


@dataclass(frozen=True, kw_only=True)
class DatasetCalibration:
    """One training dataset's own calibration of a detector's raw score.

    Attributes:
        calibrator: Raw score -> probability, fitted on that dataset's cross-fitted
            (or validation) scores only.
        threshold: The decision threshold on that probability, chosen on the same
            answers by the training criterion.
        n: Answers it was fitted on.
        n_positive: Hallucinated answers among them.
    """

    calibrator: PlattCalibrator
    threshold: float
    n: int
    n_positive: int

    def apply(self, raw: float) -> float:
        """The calibrated probability of raw score ``raw``, in [0, 1]."""
        return float(np.clip(self.calibrator.transform(raw), 0.0, 1.0))

    def to_json(self) -> dict[str, Any]:
        return {
            "calibration": self.calibrator.to_json(),
            "threshold": self.threshold,
            "n": self.n,
            "n_positive": self.n_positive,
        }

    @classmethod
    def from_json(cls, d: object) -> DatasetCalibration:
        """Read :meth:`to_json` back.

        Raises:
            DataError: Not that shape, or numbers out of range.
        """
        if not isinstance(d, Mapping) or set(d) != {"calibration", "threshold", "n", "n_positive"}:
            raise DataError(
                "a per-dataset calibration needs exactly calibration, threshold, n, n_positive"
            )
        thr, n, pos = d["threshold"], d["n"], d["n_positive"]
        if not (_number(thr) and 0.0 <= thr <= 1.0):
            raise DataError(f"a per-dataset threshold must be in [0, 1], not {thr!r}")
        counts = (n, pos)
        if not all(isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in counts):
            raise DataError("a per-dataset calibration's n and n_positive must be counts")
        if pos > n:
            raise DataError("a per-dataset calibration has more hallucinated answers than answers")
        return cls(
            calibrator=PlattCalibrator.from_json(d["calibration"]),
            threshold=float(thr),
            n=n,
            n_positive=pos,
        )


def read_dataset_calibrations(d: object) -> dict[str, DatasetCalibration]:
    """A ``cfg.json``'s ``calibration_by_dataset`` (dataset name -> calibration), read as
    untrusted: at most :data:`MAX_DATASET_CALIBRATIONS`, names of one line.

    Raises:
        DataError: Not a map of that shape (naming the dataset when one entry is bad).
    """
    if not isinstance(d, Mapping):
        raise DataError("calibration_by_dataset must map dataset names to calibrations")
    if len(d) > MAX_DATASET_CALIBRATIONS:
        raise DataError(
            f"calibration_by_dataset has {len(d)} datasets; at most {MAX_DATASET_CALIBRATIONS}"
        )
    out = {}
    for name, entry in d.items():
        if not isinstance(name, str) or not 0 < len(name) <= MAX_DATASET_NAME or "\n" in name:
            raise DataError("calibration_by_dataset has a dataset name that is not one short line")
        try:
            out[name] = DatasetCalibration.from_json(entry)
        except DataError as e:
            raise DataError(f"calibration_by_dataset[{name!r}]: {e}") from e
    return out


SPLIT_SUFFIX = re.compile(
    r"[_.-](dev|develop|development|test|testing|train|training|val|valid|validation|"
    r"heldout|held_out|holdout|eval)$",
    re.IGNORECASE,
)
"""A dataset name's split suffix: ``ragtruth_qa_dev`` and ``ragtruth_qa_test`` are
parts of one family, ``ragtruth_qa``."""


def dataset_family(name: str) -> str:
    """``name`` without its split suffix (:data:`SPLIT_SUFFIX`), lower-cased."""
    return SPLIT_SUFFIX.sub("", name.strip()).lower()


def match_dataset(own: Mapping[str, T], dataset: str | None) -> tuple[str, T] | None:
    """What a training dataset keeps for answers of ``dataset`` (its own calibration, its
    expert set): the entry of ``dataset`` itself, else the one of the single training
    dataset of the same family (another split of the same source: a held-out
    ``ragtruth_qa_test`` is judged like the ``ragtruth_qa_dev`` a detector was trained
    on), else ``None`` (the pooled calibration, the set itself). Returns the training
    dataset's name with its entry."""
    if not dataset or not own:
        return None
    if dataset in own:
        return dataset, own[dataset]
    fam = dataset_family(dataset)
    same = [n for n in own if dataset_family(n) == fam]
    return (same[0], own[same[0]]) if len(same) == 1 else None


@dataclass(frozen=True, kw_only=True)
class Reliability:
    """A reliability diagram: equal-width probability bins.

    Attributes:
        edges: ``[n_bins + 1]`` bin edges on [0, 1].
        mean_predicted: ``[n_bins]`` mean predicted probability per bin (NaN when empty).
        observed: ``[n_bins]`` share of hallucinated answers per bin (NaN when empty).
        counts: ``[n_bins]`` answers per bin.
        ece: Expected calibration error: sum over bins of count share x |gap|.
    """

    edges: np.ndarray
    mean_predicted: np.ndarray
    observed: np.ndarray
    counts: np.ndarray
    ece: float

    def to_json(self) -> dict[str, Any]:
        def clean(a: np.ndarray) -> list[float | None]:
            return [None if not np.isfinite(v) else float(v) for v in a]

        return {
            "edges": [float(v) for v in self.edges],
            "mean_predicted": clean(self.mean_predicted),
            "observed": clean(self.observed),
            "counts": [int(c) for c in self.counts],
            "ece": float(self.ece),
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Self:
        def arr(key: str) -> np.ndarray:
            return np.asarray([np.nan if v is None else v for v in d[key]], dtype=np.float64)

        return cls(
            edges=arr("edges"),
            mean_predicted=arr("mean_predicted"),
            observed=arr("observed"),
            counts=np.asarray(d["counts"], dtype=np.int64),
            ece=float(d["ece"]),
        )


def reliability(y: np.ndarray, p: np.ndarray, n_bins: int = 10) -> Reliability:
    """Reliability diagram and ECE of probabilities ``p`` against 0/1 labels ``y``.

    Bins are ``[k/n, (k+1)/n)``, the last one closed at 1. The non-empty bins' means
    equal ``sklearn.calibration.calibration_curve``'s (tested), which returns neither the
    counts that ECE and the diagram need nor the empty bins, and closes its bins on the
    right: an isotonic probability of exactly 0.5 would change bin.
    """
    y = np.asarray(y, dtype=np.float64).ravel()
    p = np.clip(np.asarray(p, dtype=np.float64).ravel(), 0.0, 1.0)
    if y.shape != p.shape:
        raise DataError(f"reliability needs one label per probability; got {y.size} and {p.size}")
    edges = np.linspace(0.0, 1.0, n_bins + 1)
    idx = np.minimum((p * n_bins).astype(int), n_bins - 1)
    counts = np.bincount(idx, minlength=n_bins)
    sum_p = np.bincount(idx, weights=p, minlength=n_bins)
    sum_y = np.bincount(idx, weights=y, minlength=n_bins)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_p = np.where(counts > 0, sum_p / np.maximum(counts, 1), np.nan)
        obs = np.where(counts > 0, sum_y / np.maximum(counts, 1), np.nan)
    gaps = np.where(counts > 0, np.abs(mean_p - obs), 0.0)
    ece = float((counts * gaps).sum() / max(int(counts.sum()), 1))
    return Reliability(edges=edges, mean_predicted=mean_p, observed=obs, counts=counts, ece=ece)


def expected_calibration_error(y: np.ndarray, p: np.ndarray, n_bins: int = 10) -> float:
    """ECE of ``p`` against ``y`` with ``n_bins`` equal-width bins (:func:`reliability`)."""
    return reliability(y, p, n_bins).ece
