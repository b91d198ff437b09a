"""Small learners shared by detectors, following the scikit-learn contract.

:class:`LogisticCalibrator` standardises features and fits a class-balanced
logistic regression (scikit-learn); it saves as plain JSON so artifacts stay
readable and need no pickle. :func:`choose_c` picks a logistic regression's strength by
(optionally grouped) cross-validation; :class:`MLPHead` is a small MLP kept as plain arrays
(safetensors, no pickle).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Self

import numpy as np

from core.base.errors import DataError, NotFittedError


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
        if self.coef_ is None or self.mean_ is None or self.scale_ is None:
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


def choose_c(
    X: np.ndarray,
    y: np.ndarray,
    grid: Sequence[float],
    *,
    groups: np.ndarray | None = None,
    scoring: str = "neg_log_loss",
    class_weight: str | None = None,
    folds: int = 5,
    seed: int = 0,
) -> tuple[float, float]:
    """The regularisation strength in ``grid`` with the best cross-validated ``scoring``
    of a standardised logistic regression, and that score.

    Folds are stratified by ``y`` and, when ``groups`` is given (e.g. the answer a
    window comes from, or an example's source), never split a group. With too few
    examples of a class to cross-validate, the middle of the grid is returned (score NaN).

    Not ``GridSearchCV`` over a scaler + logistic pipeline: it picks the same ``C`` with
    the same score (tested) but fits each strength from scratch, 1.4-2x slower on 300-20,000
    rows (measured 2026-11-28); ``LogisticRegressionCV`` cannot standardise per fold.

    Args:
        X: ``[n, d]`` features.
        y: ``[n]`` 0/1 labels.
        grid: Candidate ``C`` values.
        groups: ``[n]`` group ids kept within one fold.
        scoring: A scikit-learn scorer name (``neg_log_loss``, ``roc_auc``, ...).
        class_weight: ``"balanced"`` or ``None``.
        folds: Most folds to use (fewer when a class is rarer).
        seed: Shuffling seed.
    """
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import get_scorer
    from sklearn.model_selection import StratifiedGroupKFold, StratifiedKFold
    from sklearn.preprocessing import StandardScaler

    y = np.asarray(y).astype(int)
    grid = [float(c) for c in grid]
    if not grid:
        raise ValueError("choose_c needs at least one candidate C")
    k = min(folds, int(np.bincount(y, minlength=2).min()))
    if groups is not None:
        k = min(k, len(np.unique(groups)))
    if k < 2:
        return grid[len(grid) // 2], float("nan")
    X = np.nan_to_num(np.asarray(X, dtype=np.float64), nan=0.0, posinf=0.0, neginf=0.0)
    if groups is None:
        splits = list(StratifiedKFold(n_splits=k, shuffle=True, random_state=seed).split(X, y))
    else:
        cv = StratifiedGroupKFold(n_splits=k, shuffle=True, random_state=seed)
        splits = list(cv.split(X, y, groups))
    splits = [
        (a, b) for a, b in splits if len(set(y[a].tolist())) == 2 and len(set(y[b].tolist())) == 2
    ]
    if not splits:
        return grid[len(grid) // 2], float("nan")
    scorer = get_scorer(scoring)
    # Many more rows than columns (e.g. Lookback Lens windows): Newton steps converge in a
    # handful of iterations; otherwise L-BFGS, whose steps do not grow with the columns cubed.
    solver = "newton-cholesky" if X.shape[0] >= 4 * X.shape[1] else "lbfgs"
    # Each fold walks the grid from the strongest penalty to the weakest, warm-starting
    # from the previous solution (the regularisation path): the same optima as fitting
    # each strength from scratch, in a fraction of the iterations.
    order = sorted(range(len(grid)), key=lambda i: grid[i])
    fold_scores = np.zeros((len(splits), len(grid)))
    for f, (a, b) in enumerate(splits):
        scaler = StandardScaler().fit(X[a])
        Xa, Xb = scaler.transform(X[a]), scaler.transform(X[b])
        lr = LogisticRegression(
            class_weight=class_weight, max_iter=2000, warm_start=True, solver=solver
        )
        for i in order:
            lr.set_params(C=grid[i]).fit(Xa, y[a])
            fold_scores[f, i] = scorer(lr, Xb, y[b])
    scores = [float(v) for v in fold_scores.mean(axis=0)]
    best = int(np.argmax(scores))
    return grid[best], scores[best]


def grouped_folds(
    y: np.ndarray, groups: np.ndarray, folds: int = 5, seed: int = 0
) -> list[tuple[np.ndarray, np.ndarray]]:
    """Up to ``folds`` (train, test) index pairs, stratified by ``y`` and never splitting a
    group; fewer folds when there are fewer groups or members of a class, and only
    folds whose two parts hold both classes (empty when none do)."""
    from sklearn.model_selection import StratifiedGroupKFold

    y = np.asarray(y).astype(int)
    k = min(folds, int(np.bincount(y, minlength=2).min()), len(np.unique(groups)))
    if k < 2:
        return []
    cv = StratifiedGroupKFold(n_splits=k, shuffle=True, random_state=seed)
    return [
        (a, b)
        for a, b in cv.split(np.zeros((len(y), 1)), y, groups)
        if len(set(y[a].tolist())) == 2 and len(set(y[b].tolist())) == 2
    ]


def grouped_logistic(
    X: np.ndarray,
    y: np.ndarray,
    grid: Sequence[float],
    *,
    groups: np.ndarray | None = None,
    seed: int = 0,
) -> tuple[LogisticCalibrator, float]:
    """A standardised, class-balanced L2 logistic regression whose strength is the one in
    ``grid`` with the best source-grouped cross-validated log loss (:func:`choose_c`),
    fitted on all of ``X``; and that negated log loss (NaN when too few to cross-validate).

    Log loss, a proper score, picks the strength: AUROC ties across strengths that rank
    alike and would pick the weakest, squashing probabilities towards 0.5.
    """
    strength, cv_score = choose_c(
        X, y, grid, groups=groups, scoring="neg_log_loss", class_weight="balanced", seed=seed
    )
    return LogisticCalibrator(C=strength).fit(X, y), cv_score


class MLPHead:
    """A small MLP classifier (scikit-learn's ``MLPClassifier``) on standardised inputs,
    kept as plain arrays: it predicts with numpy and saves to safetensors (no pickle).

    Args:
        hidden: Hidden layer widths (ReLU).
        alpha: L2 penalty.
        seed: Initialisation and early-stopping split seed.
        max_iter: Most epochs (early stopping on a 10% split usually ends sooner).
    """

    def __init__(
        self,
        hidden: Sequence[int] = (256, 128, 64),
        alpha: float = 1e-3,
        seed: int = 0,
        max_iter: int = 200,
    ) -> None:
        self.hidden = tuple(int(h) for h in hidden)
        self.alpha = alpha
        self.seed = seed
        self.max_iter = max_iter
        self.mean_: np.ndarray | None = None
        self.scale_: np.ndarray | None = None
        self.coefs_: list[np.ndarray] | None = None
        self.intercepts_: list[np.ndarray] | None = None

    def fit(self, X: np.ndarray, y: np.ndarray) -> Self:
        import warnings

        from sklearn.exceptions import ConvergenceWarning
        from sklearn.neural_network import MLPClassifier

        X = np.nan_to_num(np.asarray(X, dtype=np.float64), nan=0.0, posinf=0.0, neginf=0.0)
        y = np.asarray(y).astype(int).ravel()
        if set(np.unique(y).tolist()) != {0, 1}:
            raise DataError("training needs both faithful (0) and hallucinated (1) examples")
        self.mean_ = X.mean(axis=0)
        scale = X.std(axis=0)
        self.scale_ = np.where(scale > 1e-12, scale, 1.0)
        # Balanced classes by oversampling the rarer one (MLPClassifier takes no weights).
        rng = np.random.default_rng(self.seed)
        pos, neg = np.flatnonzero(y == 1), np.flatnonzero(y == 0)
        small, large = (pos, neg) if pos.size < neg.size else (neg, pos)
        idx = np.concatenate([large, small, rng.choice(small, large.size - small.size)])
        mlp = MLPClassifier(
            hidden_layer_sizes=self.hidden,
            alpha=self.alpha,
            early_stopping=len(idx) >= 50,
            random_state=self.seed,
            max_iter=self.max_iter,
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            mlp.fit((X[idx] - self.mean_) / self.scale_, y[idx])
        self.coefs_ = [np.asarray(c, dtype=np.float32) for c in mlp.coefs_]
        self.intercepts_ = [np.asarray(b, dtype=np.float32) for b in mlp.intercepts_]
        return self

    def decision_function(self, X: np.ndarray) -> np.ndarray:
        if self.coefs_ is None or self.intercepts_ is None or self.mean_ is None:
            raise NotFittedError("MLPHead is not fitted; call fit() first")
        assert self.scale_ is not None
        h = (np.nan_to_num(np.asarray(X, dtype=np.float64)) - self.mean_) / self.scale_
        for i, (w, b) in enumerate(zip(self.coefs_, self.intercepts_, strict=True)):
            h = h @ w + b
            if i < len(self.coefs_) - 1:
                h = np.maximum(h, 0.0)
        return h[:, 0]

    def predict_proba(self, X: np.ndarray) -> np.ndarray:
        """Probability of class 1 for each row, shape ``[n]``."""
        return 1.0 / (1.0 + np.exp(-self.decision_function(X)))

    def arrays(self) -> dict[str, np.ndarray]:
        """Every learned array by name (what :meth:`from_arrays` reads back)."""
        if self.coefs_ is None or self.intercepts_ is None or self.mean_ is None:
            raise NotFittedError("MLPHead is not fitted; nothing to save")
        assert self.scale_ is not None
        out = {"mean": self.mean_.astype(np.float64), "scale": self.scale_.astype(np.float64)}
        for i, (w, b) in enumerate(zip(self.coefs_, self.intercepts_, strict=True)):
            out[f"w{i}"], out[f"b{i}"] = w, b
        return out

    @classmethod
    def from_arrays(cls, arrays: Mapping[str, np.ndarray], hidden: Sequence[int]) -> Self:
        """An :class:`MLPHead` from :meth:`arrays` (shapes checked against ``hidden``).

        Raises:
            DataError: Missing arrays or shapes that do not chain.
        """
        obj = cls(hidden=hidden)
        n = len(obj.hidden) + 1
        try:
            obj.mean_ = np.asarray(arrays["mean"], dtype=np.float64)
            obj.scale_ = np.asarray(arrays["scale"], dtype=np.float64)
            obj.coefs_ = [np.asarray(arrays[f"w{i}"], dtype=np.float32) for i in range(n)]
            obj.intercepts_ = [np.asarray(arrays[f"b{i}"], dtype=np.float32) for i in range(n)]
        except KeyError as e:
            raise DataError(f"MLP head arrays lack {e.args[0]!r}") from e
        width = obj.mean_.shape[0]
        for w, b in zip(obj.coefs_, obj.intercepts_, strict=True):
            if w.ndim != 2 or w.shape[0] != width or b.shape != (w.shape[1],):
                raise DataError("MLP head arrays do not chain (wrong shapes)")
            width = w.shape[1]
        if width != 1 or obj.scale_.shape != obj.mean_.shape:
            raise DataError("MLP head arrays do not end in one output")
        return obj
