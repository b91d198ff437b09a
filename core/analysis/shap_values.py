"""SHAP values of the ``spad`` detector, and the per-tag means of SPAD's seven sources.

:func:`shap_values` runs ``shap.TreeExplainer`` on the fitted detector's XGBoost
booster and always hands back a :class:`ShapResult` with an ``(n_samples,
n_features)`` float64 array and one base value (the explainer's expected value,
in log-odds), whatever shape the installed shap version returns
(:func:`as_2d`). The values are exact TreeSHAP: each row plus the base value
is the example's raw margin, and they equal XGBoost's own ``pred_contribs``.

Numbers only: the figures of these values (beeswarm, bars, source x tag grid,
waterfall, the seven sources per token or per tag) are built above the engine, in
``app/components/shap_charts.py``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from core.base.errors import ModelError
from core.detectors.spad import SpadDetector
from core.learning.contract import Features, require_fitted
from core.signals.attribution import FEATURE_NAMES, POS_TAGS, SOURCES

if TYPE_CHECKING:
    import pandas as pd
    from jaxtyping import Float

GridKind = Literal["mean", "mean_abs"]


# --------------------------------------------------------------------------- adapter


def as_2d(values: Any, expected: Any, n_samples: int, n_features: int) -> tuple[np.ndarray, float]:
    """Normalise a shap output to an ``(n_samples, n_features)`` array and one base value.

    shap versions and model types return: a 2-D array; a list of per-class
    arrays (binary classifiers: ``[faithful, hallucinated]``); a 3-D array with the
    class last ``(n, f, k)`` or first ``(k, n, f)``; a 1-D array for one sample; or an
    ``Explanation``. The expected value may be a scalar or one per class. The last
    class (hallucinated) is kept.

    Raises:
        ModelError: The output has none of these shapes.
    """
    if hasattr(values, "values") and hasattr(values, "base_values"):  # shap.Explanation
        expected = values.base_values if expected is None else expected
        values = values.values
    if isinstance(values, list | tuple):
        values = values[-1]
    arr = np.asarray(values, dtype=np.float64)
    want = (n_samples, n_features)
    if arr.ndim == 3:
        if arr.shape[:2] == want:
            arr = arr[..., -1]
        elif arr.shape[1:] == want:
            arr = arr[-1]
    elif arr.ndim == 1 and n_samples == 1:
        arr = arr[None, :]
    if arr.shape != want:
        raise ModelError(
            f"shap returned values of shape {np.shape(values)}; expected {want} "
            "(samples x features), a per-class list or a 3-D array of them"
        )
    base = np.asarray(expected, dtype=np.float64).reshape(-1)
    if base.size == 0:
        raise ModelError("shap returned no expected value")
    # One base per sample (Explanation.base_values) is the same number for a tree model.
    if base.size == n_samples and n_samples > 1 and not np.allclose(base, base[0]):
        raise ModelError("shap returned a different base value per sample")
    return arr, float(base[-1])


def _response_matrix(
    detector: SpadDetector, features: Sequence[Features]
) -> Float[np.ndarray, "n feature"]:

    require_fitted(detector, "booster_", detector.name)
    if not features:
        raise ModelError("shap_values needs the features of at least one example")
    for f in features:
        if detector.model_key_ and f.model != detector.model_key_:
            raise ModelError(
                f"spad was trained on {detector.model_key_!r} but the features of "
                f"{f.example_id!r} come from {f.model!r}; retrain or load the matching model"
            )
        if f.names != detector.names_:
            raise ModelError(
                f"the features of {f.example_id!r} are not the fitted detector's columns"
            )
    return np.stack([f.response for f in features]).astype(np.float32)


def shap_values(detector: SpadDetector, features: Sequence[Features]) -> ShapResult:
    """TreeSHAP values of a fitted ``spad`` detector on ``features``.

    Args:
        detector: A fitted :class:`~core.detectors.spad.SpadDetector`.
        features: Its features of ``n`` examples (the 126 POS x source features).

    Returns:
        :class:`ShapResult`: ``values`` ``[n, 126]`` and ``base`` such that
        ``values.sum(1) + base`` is each example's raw margin (log-odds).

    Raises:
        NotFittedError: The detector is not fitted.
        ModelError: The features come from another model or have other columns.
    """
    import shap

    X = _response_matrix(detector, features)
    explainer = shap.TreeExplainer(detector.booster_)
    raw = explainer.shap_values(X)
    values, base = as_2d(raw, explainer.expected_value, X.shape[0], X.shape[1])
    return ShapResult(
        values=values,
        base=base,
        data=X.astype(np.float64),
        names=tuple(detector.names_),
        example_ids=tuple(f.example_id for f in features),
    )


# --------------------------------------------------------------------------- result


def _sigmoid(x: np.ndarray | float) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-np.asarray(x, dtype=np.float64)))


def _feature_parts(name: str) -> tuple[str, str]:
    source, _, tag = name.partition("_")
    return source, tag


@dataclass(frozen=True, kw_only=True, eq=False)
class ShapResult:
    """SHAP values of a response-level detector on ``n`` examples.

    Attributes:
        values: ``[n, f]`` SHAP values (log-odds of "hallucinated").
        base: The explainer's expected value (log-odds); ``values.sum(1) + base``
            is each example's margin.
        data: ``[n, f]`` the feature values explained.
        names: The ``f`` feature names (``RAG_NOUN`` style for spad).
        example_ids: The ``n`` examples, in row order.
    """

    values: Float[np.ndarray, "n feature"]
    base: float
    data: Float[np.ndarray, "n feature"]
    names: tuple[str, ...]
    example_ids: tuple[str, ...]

    def __post_init__(self) -> None:
        n, f = len(self.example_ids), len(self.names)
        if self.values.shape != (n, f) or self.data.shape != (n, f):
            raise ValueError(
                f"values {self.values.shape} and data {self.data.shape} must both be "
                f"({n}, {f}): examples x features"
            )

    def __len__(self) -> int:
        return len(self.example_ids)

    @property
    def margins(self) -> np.ndarray:
        """``[n]`` raw margins (log-odds): base plus the row's SHAP values."""
        return self.values.sum(1) + self.base

    @property
    def scores(self) -> np.ndarray:
        """``[n]`` hallucination probabilities, ``sigmoid(margin)``."""
        return _sigmoid(self.margins)

    @property
    def mean_abs(self) -> np.ndarray:
        """``[f]`` mean ``|SHAP|`` per feature (global importance)."""
        return np.abs(self.values).mean(0)

    def top(self, k: int) -> list[int]:
        """Indices of the ``k`` features with the largest mean ``|SHAP|`` (ties by name order)."""
        order = np.argsort(-self.mean_abs, kind="stable")
        return [int(i) for i in order[: max(0, k)]]

    def grid(self, kind: GridKind = "mean") -> Float[np.ndarray, "source tag"]:
        """``[7, 18]`` mean SHAP (or mean ``|SHAP|``) of the spad features, sources x tags.

        Raises:
            ValueError: The features are not the 126 POS x source features.
        """
        if self.names != FEATURE_NAMES:
            raise ValueError("the source x tag grid needs the 126 spad features")
        v = self.values if kind == "mean" else np.abs(self.values)
        return v.mean(0).reshape(len(SOURCES), len(POS_TAGS))

    @property
    def direction(self) -> np.ndarray:
        """``[f]`` Spearman correlation of each feature's value with its SHAP value.

        Positive: higher values push towards "hallucinated"; negative: towards
        "faithful"; NaN where the feature or its SHAP values are constant.
        """
        from scipy.stats import rankdata

        out = np.full(len(self.names), np.nan)
        rx = rankdata(self.data, axis=0)
        rv = rankdata(self.values, axis=0)
        for j in range(len(self.names)):
            if np.ptp(rx[:, j]) > 0 and np.ptp(rv[:, j]) > 0:
                out[j] = float(np.corrcoef(rx[:, j], rv[:, j])[0, 1])
        return out

    def to_frame(self) -> pd.DataFrame:
        """One row per feature: ``feature``, ``source``, ``tag``, ``mean |SHAP|``,
        ``mean SHAP``, ``mean value``, ``direction`` (:attr:`direction`), sorted by
        ``mean |SHAP|`` (largest first)."""
        import pandas as pd

        parts = [_feature_parts(n) for n in self.names]
        df = pd.DataFrame(
            {
                "feature": list(self.names),
                "source": [p[0] for p in parts],
                "tag": [p[1] for p in parts],
                "mean |SHAP|": self.mean_abs,
                "mean SHAP": self.values.mean(0),
                "mean value": self.data.mean(0),
                "direction": self.direction,
            }
        )
        return df.sort_values("mean |SHAP|", ascending=False, kind="stable").reset_index(drop=True)


# --------------------------------------------------------------------------- token sources


def pos_means(
    values: Float[np.ndarray, "resp 7"], pos: Sequence[str]
) -> tuple[list[str], np.ndarray, np.ndarray]:
    """The mean seven-vector of the tokens of each POS tag present (tags in
    :data:`~core.signals.attribution.POS_TAGS` order).

    Returns:
        ``(tags, [k, 7] means, [k] token counts)``; these means are the spad features
        of the present tags.
    """
    v = np.asarray(values, dtype=np.float64)
    if v.ndim != 2 or v.shape[0] != len(pos):
        raise ValueError(f"need one tag per row of values; got {v.shape} and {len(pos)} tags")
    tags = [t for t in POS_TAGS if t in set(pos)]
    tags += sorted(set(pos) - set(POS_TAGS))
    arr = np.asarray(list(pos), dtype=object)
    means = np.stack([v[arr == t].mean(0) for t in tags]) if tags else np.zeros((0, v.shape[1]))
    counts = np.asarray([int((arr == t).sum()) for t in tags], dtype=np.int64)
    return tags, means, counts
