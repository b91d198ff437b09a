"""InterpDetect (Tan et al., 2025): chunk ECS of every head + PKS of every layer -> classifier.

Features (``specs/interpdetect.md``), per response sentence ``r`` (spaCy
sentences of the response; context chunks are the passages' sentences):

- ``ECS_L{l}H{h}``: cosine of the sentence embeddings of ``r`` and of the
  context sentence that head ``(l, h)`` attends to most from ``r``'s
  generation positions (summed attention), for EVERY head;
- ``PKS_L{l}``: mean over ``r``'s tokens of the layer's Parametric Knowledge
  Score (logit-lens JSD across the FFN).

Learning, per chunk: StandardScaler -> drop near-constant features (one value
in >= 95% of rows) -> drop duplicates -> correlated-feature selection
(|Pearson| > 0.9, keep the feature a shallow random forest ranks higher), all
three from feature-engine; then LogisticRegression, SVC, RandomForest and
XGBoost are fitted and the one with the best validation F1 (response level:
score = highest chunk probability, at its best threshold) is kept. Response score =
highest chunk probability.

The fitted scaler + classifier on the kept columns is saved with skops (a
safe, non-pickle format); loading accepts only scikit-learn, XGBoost and
NumPy types.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Self
from zipfile import BadZipFile

import numpy as np

from core.base.errors import DataError, ModelError
from core.base.examples import RAGExample
from core.base.safeio import SkopsType
from core.detectors.common import FittedDetector, Writers, head_name, layer_name, shared_pks
from core.engine.model import ModelInfo
from core.engine.trace import Needs
from core.learning.artifact import read_skops
from core.learning.contract import (
    DetectorConfig,
    Features,
    PageRole,
    Run,
    Verdict,
    check_features,
    check_fit_inputs,
    require_fitted,
    thresholded_verdict,
    tokens_from_chunks,
)
from core.learning.labels import response_labels
from core.learning.metrics import best_threshold
from core.signals.chunking import chunk_example
from core.signals.ecs import chunk_ecs, chunk_means, ecs_needs
from core.signals.lens import pks_needs

if TYPE_CHECKING:
    import pandas as pd

ClassifierName = Literal["lr", "svc", "rf", "xgb"]
CLASSIFIERS: tuple[ClassifierName, ...] = ("lr", "svc", "rf", "xgb")
PIPELINE_FILE = "pipeline.skops"
SKOPS_TYPES: frozenset[SkopsType] = frozenset(
    {
        ("ObjectNode", "sklearn.pipeline", "Pipeline"),
        ("ObjectNode", "sklearn.preprocessing._data", "StandardScaler"),
        ("ObjectNode", "sklearn.linear_model._logistic", "LogisticRegression"),
        ("ObjectNode", "sklearn.calibration", "CalibratedClassifierCV"),
        ("ObjectNode", "sklearn.calibration", "_CalibratedClassifier"),
        ("ObjectNode", "sklearn.calibration", "_SigmoidCalibration"),
        ("ObjectNode", "sklearn.svm._classes", "SVC"),
        ("ObjectNode", "sklearn.ensemble._forest", "RandomForestClassifier"),
        ("ObjectNode", "sklearn.tree._classes", "DecisionTreeClassifier"),
        ("TreeNode", "sklearn.tree._tree", "Tree"),
        ("ObjectNode", "xgboost.sklearn", "XGBClassifier"),
        ("ObjectNode", "xgboost.core", "Booster"),
    }
)
"""The exact classes a fitted pipeline holds (scaler + one of :data:`CLASSIFIERS`), as
``(skops loader, module, class)``; a pipeline file with anything else is refused."""


@dataclass(frozen=True, kw_only=True)
class InterpDetectConfig(DetectorConfig):
    """InterpDetect options.

    Attributes:
        pool: Attention pooling over a (response, context) sentence pair
            (``sum``: the paper's summed attention; ``mean`` also offered).
        embedder: ``minilm`` (all-MiniLM-L6-v2; the paper used bge-base) or ``model``.
        pks_final_norm: Apply LN_f in the PKS lens (``False``: the public code).
        classifiers: Candidates, chosen by validation F1.
        const_tol: DropConstantFeatures ``tol``.
        corr_threshold: SmartCorrelatedSelection ``threshold``.
        lr_c: The logistic regression's ``C`` (1.0: scikit-learn's default, which the
            paper's code uses; smaller regularises more, for small training sets).
        seed: Random state of the forest, SVC and XGBoost.
    """

    FIT_ONLY: ClassVar[frozenset[str]] = frozenset(
        {"classifiers", "const_tol", "corr_threshold", "lr_c", "seed"}
    )

    pool: Literal["mean", "sum"] = "sum"
    embedder: Literal["minilm", "model"] = "minilm"
    pks_final_norm: bool = True
    classifiers: tuple[str, ...] = CLASSIFIERS
    const_tol: float = 0.95
    corr_threshold: float = 0.9
    lr_c: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        bad = [c for c in self.classifiers if c not in CLASSIFIERS]
        if bad or not self.classifiers:
            raise ValueError(f"classifiers must be a non-empty subset of {CLASSIFIERS}, got {bad}")
        if not 0.5 <= self.const_tol <= 1.0 or not 0.0 < self.corr_threshold <= 1.0:
            raise ValueError("const_tol must be in [0.5, 1] and corr_threshold in (0, 1]")
        if type(self.lr_c) not in (int, float) or not math.isfinite(self.lr_c) or self.lr_c <= 0:
            raise ValueError(f"lr_c must be a positive finite number, got {self.lr_c!r}")


def chunk_targets(f: Features, example: RAGExample) -> np.ndarray:
    """Gold label per response chunk: overlaps a span; without spans, the response label."""
    assert f.chunk_offsets is not None
    o = f.chunk_offsets
    if example.spans:
        lab = np.zeros(o.shape[0], dtype=np.int64)
        for s in example.spans:
            lab |= ((o[:, 0] < s.end) & (s.start < o[:, 1])).astype(np.int64)
        return lab
    if example.label is None:
        raise DataError(f"example {example.id!r} has no label; train on labelled data")
    return np.full(o.shape[0], int(bool(example.label)), dtype=np.int64)


def make_classifier(name: str, *, seed: int, pos_weight: float, lr_c: float = 1.0) -> Any:
    """A fresh candidate classifier (class-balanced; ``lr_c``: the logistic regression's
    inverse regularisation strength)."""
    if name == "lr":
        from sklearn.linear_model import LogisticRegression

        return LogisticRegression(C=lr_c, max_iter=2000, class_weight="balanced")
    if name == "svc":
        from sklearn.calibration import CalibratedClassifierCV
        from sklearn.svm import SVC

        # SVC(probability=True) is deprecated in scikit-learn 1.9; this is its replacement.
        return CalibratedClassifierCV(
            SVC(class_weight="balanced", random_state=seed), ensemble=False
        )
    if name == "rf":
        from sklearn.ensemble import RandomForestClassifier

        return RandomForestClassifier(
            n_estimators=200, max_depth=5, class_weight="balanced", random_state=seed, n_jobs=1
        )
    if name == "xgb":
        from xgboost import XGBClassifier

        return XGBClassifier(
            n_estimators=200,
            max_depth=5,
            learning_rate=0.1,
            scale_pos_weight=pos_weight,
            random_state=seed,
            n_jobs=1,
            eval_metric="logloss",
        )
    raise ValueError(f"unknown classifier {name!r}; use one of {CLASSIFIERS}")


def select_features(
    X: pd.DataFrame, y: np.ndarray, *, const_tol: float, corr_threshold: float, seed: int
) -> list[str]:
    """The columns feature-engine keeps: not near-constant, not duplicated, not correlated."""
    from feature_engine.selection import (
        DropConstantFeatures,
        DropDuplicateFeatures,
        SmartCorrelatedSelection,
    )
    from sklearn.ensemble import RandomForestClassifier
    from sklearn.pipeline import Pipeline
    from sklearn.preprocessing import StandardScaler

    steps: list[tuple[str, Any]] = [
        ("scale", StandardScaler().set_output(transform="pandas")),
        ("constant", DropConstantFeatures(tol=const_tol, missing_values="ignore")),
        ("duplicate", DropDuplicateFeatures()),
    ]
    pipe = Pipeline(steps)
    try:
        Z = pipe.fit_transform(X, y)
    except ValueError as e:
        # feature-engine refuses to drop every column (all near-constant).
        raise DataError(f"InterpDetect cannot select features on the training data: {e}") from e
    if Z.shape[1] > 1 and len(set(y.tolist())) == 2:
        corr = SmartCorrelatedSelection(
            threshold=corr_threshold,
            method="pearson",
            selection_method="model_performance",
            estimator=RandomForestClassifier(
                n_estimators=20, max_depth=3, random_state=seed, n_jobs=1
            ),
            scoring="roc_auc",
            cv=3,
        )
        Z = corr.fit_transform(Z, y)
    if Z.shape[1] == 0:
        raise DataError("every InterpDetect feature is constant on the training data")
    return [str(c) for c in Z.columns]


def _response_f1(chunk_prob: Sequence[np.ndarray], y: np.ndarray) -> float:
    """Response-level F1 (score = highest chunk probability) at its best threshold.

    Comparing classifiers at a fixed 0.5 would favour the class-balanced ones:
    a calibrated SVC puts few chunks above 0.5 when hallucinated chunks are
    rare. The evaluation picks the detector's threshold on validation the same way.
    """
    from sklearn.metrics import f1_score

    scores = np.asarray([float(p.max()) if p.size else 0.0 for p in chunk_prob])
    t = best_threshold(y, scores, "f1")
    return float(f1_score(y, (scores >= t).astype(int), zero_division=0))


class InterpDetectDetector(FittedDetector):
    """Chunk-level ECS of every head and PKS of every layer, classic classifier on top."""

    gives_token_scores: ClassVar[bool] = True

    name: ClassVar[str] = "interpdetect"
    explained_on: ClassVar[frozenset[PageRole]] = frozenset({"head-stats"})
    reads_heads: ClassVar[bool] = True
    Config: ClassVar[type[InterpDetectConfig]] = InterpDetectConfig
    fitted_attr = "pipeline_"
    load_errors = (BadZipFile,)

    def __init__(self, config: InterpDetectConfig | None = None) -> None:
        self.config: InterpDetectConfig = config or self.Config()
        self.model_key_: str | None = None
        self.names_: tuple[str, ...] | None = None
        self.kept_: tuple[str, ...] | None = None
        self.classifier_name_: str | None = None
        self.pipeline_: Any = None
        self.candidates_: dict[str, float] = {}
        self.threshold_: float = 0.5
        self.train_info_: dict[str, Any] = {}

    # -- features ---------------------------------------------------------------

    def needs(self, model: ModelInfo) -> Needs:

        return ecs_needs(
            model.n_layers, hidden_at_response=self.config.embedder == "model"
        ) | pks_needs(model.n_layers)

    def features(self, run: Run) -> Features:

        if run.trace is None:
            raise ModelError("interpdetect needs a trace (attention patterns, residual stream)")
        model = run.require_model(self.name)
        info = model.info
        chunks = chunk_example(run.layout, "sentence")
        layers = list(range(info.n_layers))
        ce = chunk_ecs(
            run.trace, chunks, layers, pool=self.config.pool, embedder=self.config.embedder
        )
        pks = shared_pks(run, model, final_norm=self.config.pks_final_norm)
        rows = np.concatenate(
            [ce.ecs.reshape(len(chunks.response), -1), chunk_means(pks, chunks)], axis=1
        )
        names = tuple(head_name(ly, h) for ly in layers for h in range(info.n_heads)) + tuple(
            layer_name(ly) for ly in layers
        )
        return Features(
            detector=self.name,
            example_id=run.example.id,
            model=info.key,
            names=names,
            response=rows.mean(0),
            token_offsets=run.layout.response_offsets,
            chunk_names=names,
            chunks=rows,
            chunk_offsets=chunks.response_offsets,
        )

    # -- learning ---------------------------------------------------------------

    def _frame(self, features: Sequence[Features]) -> pd.DataFrame:
        import pandas as pd

        assert self.names_ is not None
        rows = [f.chunks for f in features if f.chunks is not None and f.chunks.shape[0]]
        data = np.concatenate(rows) if rows else np.zeros((0, len(self.names_)))
        return pd.DataFrame(data.astype(np.float64), columns=list(self.names_))

    def _chunk_probs(self, f: Features) -> np.ndarray:
        import pandas as pd

        assert self.kept_ is not None and self.names_ is not None
        if f.chunks is None or f.chunks.shape[0] == 0:
            return np.zeros(0)
        X = pd.DataFrame(f.chunks.astype(np.float64), columns=list(self.names_))[list(self.kept_)]
        return self.pipeline_.predict_proba(X)[:, 1]

    def fit(
        self,
        features: Sequence[Features],
        examples: Sequence[RAGExample],
        *,
        validation: tuple[Sequence[Features], Sequence[RAGExample]] | None = None,
    ) -> Self:
        """Select features on the training chunks, fit each classifier, keep the best on validation."""
        from sklearn.pipeline import Pipeline
        from sklearn.preprocessing import StandardScaler

        check_fit_inputs(self.name, features, examples, same_columns=True)
        self.names_ = features[0].names
        self.model_key_ = features[0].model
        X = self._frame(features)
        y = np.concatenate(
            [
                chunk_targets(f, e)
                for f, e in zip(features, examples, strict=True)
                if f.chunks is not None and f.chunks.shape[0]
            ]
        )
        if len(set(y.tolist())) < 2:
            raise DataError(
                "interpdetect needs hallucinated and faithful chunks in the training data"
            )
        c = self.config
        self.kept_ = tuple(
            select_features(
                X, y, const_tol=c.const_tol, corr_threshold=c.corr_threshold, seed=c.seed
            )
        )
        pos_weight = float((y == 0).sum()) / max(1.0, float((y == 1).sum()))
        if validation is not None and len(validation[0]):
            v_feats, v_y, on = validation[0], response_labels(validation[1]), "validation"
        else:
            v_feats, v_y, on = features, response_labels(examples), "train"
        best: tuple[float, str, Any] | None = None
        self.candidates_ = {}
        for name in c.classifiers:
            pipe = Pipeline(
                [
                    ("scale", StandardScaler()),
                    (
                        "clf",
                        make_classifier(name, seed=c.seed, pos_weight=pos_weight, lr_c=c.lr_c),
                    ),
                ]
            )
            pipe.fit(X[list(self.kept_)], y)
            self.pipeline_ = pipe
            f1 = _response_f1([self._chunk_probs(f) for f in v_feats], v_y)
            self.candidates_[name] = f1
            if best is None or f1 > best[0] + 1e-12:
                best = (f1, name, pipe)
        assert best is not None
        _, self.classifier_name_, self.pipeline_ = best
        self.train_info_ = {
            "n_train": len(features),
            "n_chunks": int(len(y)),
            "n_positive_chunks": int(y.sum()),
            "n_features": len(self.names_),
            "n_kept": len(self.kept_),
            "classifier": self.classifier_name_,
            "f1_on": on,
            "f1": self.candidates_,
        }
        return self

    def pinned(self) -> Mapping[str, Any]:
        """The classifier chosen on validation: the four candidates score on scales of
        their own (an SVC's calibrated probabilities, a balanced logistic regression's,
        a booster's), so a calibrator fitted on another candidate's scores would
        misread this one's."""
        require_fitted(self, "pipeline_", self.name)
        return {"classifiers": (self.classifier_name_,)}

    # -- scoring ----------------------------------------------------------------

    def predict(self, features: Features) -> Verdict:
        require_fitted(self, "pipeline_", self.name)
        check_features(self.name, features, self.model_key_, self.names_)
        probs = self._chunk_probs(features).astype(np.float32)
        score = float(probs.max()) if probs.size else 0.0
        token_scores = (
            tokens_from_chunks(probs, features.chunk_offsets, features.token_offsets)
            if features.chunk_offsets is not None and probs.size
            else None
        )
        expl: dict[str, float] = {"max_chunk_probability": score, "n_chunks": float(probs.size)}
        if probs.size and features.chunks is not None:
            top = int(probs.argmax())
            assert self.names_ is not None and self.kept_ is not None
            col = {n: i for i, n in enumerate(self.names_)}
            for n in self.kept_[:20]:
                expl[n] = float(features.chunks[top, col[n]])
        return thresholded_verdict(
            self,
            features,
            score,
            token_scores=token_scores,
            chunk_scores=probs,
            explanation=expl,
        )

    # -- artifacts --------------------------------------------------------------

    def fitted_state(self) -> tuple[dict[str, Any], Writers]:
        import skops.io as sio

        weights = {
            "names": list(self.names_ or ()),
            "kept": list(self.kept_ or ()),
            "classifier": self.classifier_name_,
            "candidates_f1": self.candidates_,
            "pipeline_file": PIPELINE_FILE,
        }
        return weights, {PIPELINE_FILE: lambda path: sio.dump(self.pipeline_, path)}

    def fitted_models(self) -> Mapping[str, tuple[Any, int | None]]:
        return {PIPELINE_FILE: (self.pipeline_, len(self.kept_ or ()))}

    def restore_state(self, folder: Path, w: Mapping[str, Any], cfg: Mapping[str, Any]) -> None:
        self.pipeline_ = read_skops(folder / PIPELINE_FILE, SKOPS_TYPES, self.name)
        self.names_ = tuple(str(n) for n in w["names"])
        self.kept_ = tuple(str(n) for n in w["kept"])
        self.classifier_name_ = str(w["classifier"])
        self.candidates_ = {str(k): float(v) for k, v in w.get("candidates_f1", {}).items()}
        if not set(self.kept_) <= set(self.names_):
            raise ValueError("kept columns are not among the feature names")
