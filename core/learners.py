"""Small learners shared by detectors, following the scikit-learn contract.

:class:`LogisticCalibrator` standardises features and fits a class-balanced
logistic regression (scikit-learn); it saves as plain JSON so artifacts stay
readable and need no pickle.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Self

import numpy as np

from core.errors import DataError, NotFittedError


class LogisticCalibrator:
    """Standardise, then class-balanced logistic regression; JSON round trip.

    Args:
        C: Inverse regularisation strength.
        max_iter: Solver iterations.
        class_weight: ``"balanced"`` (default: the classes weigh the same) or ``None``
            (every example weighs the same, so probabilities stay calibrated to the
            training base rate).
    """

    def __init__(
        self, C: float = 1.0, max_iter: int = 1000, class_weight: str | None = "balanced"
    ) -> None:
        if class_weight not in ("balanced", None):
            raise ValueError(f"class_weight must be 'balanced' or None, got {class_weight!r}")
        self.C = C
        self.max_iter = max_iter
        self.class_weight = class_weight
        self.mean_: np.ndarray | None = None
        self.scale_: np.ndarray | None = None
        self.coef_: np.ndarray | None = None
        self.intercept_: float | None = None

    def fit(self, X: np.ndarray, y: np.ndarray) -> Self:
        from sklearn.linear_model import LogisticRegression

        X = np.asarray(X, dtype=np.float64)
        y = np.asarray(y).astype(int).ravel()
        if X.ndim != 2 or X.shape[0] != y.shape[0]:
            raise DataError(f"X must be [n, d] with n = len(y); got {X.shape} and {y.shape}")
        classes = set(np.unique(y).tolist())
        if classes != {0, 1}:
            raise DataError(
                f"training needs both faithful (0) and hallucinated (1) examples; got classes {sorted(classes)}"
            )
        X = np.nan_to_num(X, nan=0.0, posinf=0.0, neginf=0.0)
        self.mean_ = X.mean(axis=0)
        scale = X.std(axis=0)
        self.scale_ = np.where(scale > 1e-12, scale, 1.0)
        lr = LogisticRegression(C=self.C, class_weight=self.class_weight, max_iter=self.max_iter)
        lr.fit((X - self.mean_) / self.scale_, y)
        self.coef_ = lr.coef_[0].astype(np.float64)
        self.intercept_ = float(lr.intercept_[0])
        return self

    def decision_function(self, X: np.ndarray) -> np.ndarray:
        if (
            self.coef_ is None
            or self.mean_ is None
            or self.scale_ is None
            or self.intercept_ is None
        ):
            raise NotFittedError("LogisticCalibrator is not fitted; call fit() first")
        X = np.nan_to_num(np.asarray(X, dtype=np.float64), nan=0.0, posinf=0.0, neginf=0.0)
        return ((X - self.mean_) / self.scale_) @ self.coef_ + self.intercept_

    def predict_proba(self, X: np.ndarray) -> np.ndarray:
        """Probability of class 1 for each row, shape ``[n]``."""
        return 1.0 / (1.0 + np.exp(-self.decision_function(X)))

    def contributions(self, x: np.ndarray) -> np.ndarray:
        """Per-feature contribution to the logit for one row (standardised value x weight)."""
        if self.coef_ is None or self.mean_ is None or self.scale_ is None:
            raise NotFittedError("LogisticCalibrator is not fitted; call fit() first")
        return (np.asarray(x, dtype=np.float64) - self.mean_) / self.scale_ * self.coef_

    def to_json(self) -> dict[str, Any]:
        if self.coef_ is None:
            raise NotFittedError("LogisticCalibrator is not fitted; nothing to save")
        return {
            "kind": "logistic",
            "C": self.C,
            "class_weight": self.class_weight,
            "mean": self.mean_.tolist(),
            "scale": self.scale_.tolist(),
            "coef": self.coef_.tolist(),
            "intercept": self.intercept_,
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Self:
        if d.get("kind") != "logistic":
            raise DataError(f"not a logistic calibrator: kind={d.get('kind')!r}")
        obj = cls(C=float(d["C"]), class_weight=d.get("class_weight", "balanced"))
        obj.mean_ = np.asarray(d["mean"], dtype=np.float64)
        obj.scale_ = np.asarray(d["scale"], dtype=np.float64)
        obj.coef_ = np.asarray(d["coef"], dtype=np.float64)
        obj.intercept_ = float(d["intercept"])
        if not (obj.mean_.shape == obj.scale_.shape == obj.coef_.shape):
            raise DataError("logistic calibrator arrays disagree in length")
        return obj
