"""SPAD (Lu et al., 2025): seven-source token probabilities by part of speech -> XGBoost.

Features (``specs/spad.md``, :mod:`core.signals.attribution`): every response token's final
probability split exactly into Query, RAG, Past, Self, FFN, LN and Init,
averaged over the tokens of each of 18 part-of-speech tags: 126 response
features named ``<source>_<tag>`` (``RAG_NOUN``, ``LN_NUM``, ...). The
per-token ``[T, 7]`` split and ``P_final`` are kept as token features
(:data:`TOKEN_NAMES`; :func:`split_errors` checks them).

Learning: XGBoost with ``scale_pos_weight = neg / pos``; hyper-parameters by
``RandomizedSearchCV`` (F1, stratified folds; the paper used 50 iterations
and 5 folds, the CPU-friendly default is 12 and 3), then a final fit on 85%
of the training data with early stopping (50 rounds) on the other 15%.
Validation data is not needed (thresholds are chosen by the evaluator).

Explanations are XGBoost's exact per-feature contributions
(``pred_contribs=True``, TreeSHAP values in log-odds): they and the ``bias``
entry sum to the response's raw margin. The booster saves in XGBoost's own
JSON format.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Self

import numpy as np

from core.base.errors import DataError, ModelError
from core.base.examples import RAGExample, source_key
from core.base.safeio import read_booster_file
from core.detectors.common import FittedDetector, Writers
from core.engine.model import ModelInfo
from core.engine.trace import Needs
from core.learning.contract import (
    DetectorConfig,
    ExplanationKind,
    Features,
    PageRole,
    Run,
    Verdict,
    check_features,
    check_fit_inputs,
    require_fitted,
    thresholded_verdict,
)
from core.learning.labels import response_labels
from core.signals.attribution import (
    FEATURE_NAMES,
    PROBE_CHUNK,
    SOURCES,
    TokenSources,
    pos_features,
    response_pos,
    spad_needs,
    token_sources,
)

if TYPE_CHECKING:
    import xgboost

BOOSTER_FILE = "model.json"
TOKEN_NAMES: tuple[str, ...] = (*SOURCES, "P_final")
"""Token feature columns: the seven sources, then the probability they sum to."""
BIAS = "bias"
"""Explanation key of the booster's base margin (the SHAP expected value)."""


@dataclass(frozen=True, kw_only=True)
class SpadConfig(DetectorConfig):
    """SPAD options (all but ``chunk_size`` shape only the learner).

    Attributes:
        n_iter: Randomized-search iterations (paper: 50); 0 skips the search and fits
            :data:`NO_SEARCH_PARAMS` (a quick fit on a few examples).
        cv: Stratified folds of the search (paper: 5), fewer when a class is rarer.
        holdout: Share of the training data held out for early stopping.
        early_stopping_rounds: Rounds without improvement before stopping.
        seed: Seed of the search, the folds, the hold-out split and XGBoost.
        chunk_size: Rows per vocabulary-size probe (memory, not values).
        scoring: What the search maximises: ``"f1"`` (the paper's), ``"roc_auc"`` or
            ``"average_precision"`` (threshold-free: F1 at 0.5 rewards a booster whose
            scores barely move as long as they land on the right side of 0.5).
        stop_metric: XGBoost's early-stopping metric: ``"logloss"`` (the paper's) or
            ``"auc"`` (log loss on a small hold-out often bottoms out after a few
            trees, leaving a booster that is nearly constant).
        missing: A part-of-speech tag absent from the response is ``"zero"`` in every
            source (the spec's features) or ``"nan"``: XGBoost's missing value, so an
            absent tag is not read as "no probability from any source".
        grouped: The search's folds and the early-stopping hold-out keep each source's
            answers (one question and its passages) together: answers to one question
            are not independent, and folds that split them reward boosters that
            memorise questions. ``False``: plain stratified folds over answers.
        params: Fixed XGBoost hyper-parameters (names from :func:`search_space`): no
            search, these are fitted. What :meth:`SpadDetector.pinned` gives the
            detectors refitted for a cross-fitted calibration, so the calibrator learns
            the scores of boosters shaped like the one it maps.
    """

    FIT_ONLY: ClassVar[frozenset[str]] = frozenset(
        {
            "n_iter",
            "cv",
            "holdout",
            "early_stopping_rounds",
            "seed",
            "chunk_size",
            "scoring",
            "stop_metric",
            "missing",
            "grouped",
            "params",
        }
    )

    n_iter: int = 12
    cv: int = 3
    holdout: float = 0.15
    early_stopping_rounds: int = 50
    seed: int = 0
    chunk_size: int = PROBE_CHUNK
    scoring: Literal["f1", "roc_auc", "average_precision"] = "f1"
    stop_metric: Literal["logloss", "auc"] = "logloss"
    missing: Literal["zero", "nan"] = "zero"
    grouped: bool = False
    params: Mapping[str, int | float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.scoring not in ("f1", "roc_auc", "average_precision"):
            raise ValueError(
                f"scoring must be f1, roc_auc or average_precision, got {self.scoring!r}"
            )
        if self.stop_metric not in ("logloss", "auc"):
            raise ValueError(f"stop_metric must be logloss or auc, got {self.stop_metric!r}")
        if self.missing not in ("zero", "nan"):
            raise ValueError(f"missing must be zero or nan, got {self.missing!r}")
        if self.n_iter < 0 or self.cv < 2:
            raise ValueError(f"n_iter must be >= 0 and cv >= 2, got {self.n_iter} and {self.cv}")
        if not 0.0 <= self.holdout < 0.5:
            raise ValueError(f"holdout must be in [0, 0.5), got {self.holdout}")
        if self.early_stopping_rounds < 1 or self.chunk_size < 1:
            raise ValueError("early_stopping_rounds and chunk_size must be >= 1")
        check_params(self.params)


_INT_PARAMS = frozenset({"n_estimators", "max_depth", "min_child_weight"})
_FLOAT_PARAMS = frozenset({"learning_rate", "subsample", "colsample_bytree", "gamma", "reg_lambda"})
_SHARES = frozenset({"learning_rate", "subsample", "colsample_bytree"})
"""Of the float parameters, those XGBoost wants in ``(0, 1]``."""


def check_params(params: object) -> None:
    """``params`` as fixed XGBoost hyper-parameters: a mapping of the searched names
    to finite non-negative numbers (ints where XGBoost wants counts; configs come from
    files, so anything else raises)."""
    if not isinstance(params, Mapping):
        raise ValueError(f"params must be a mapping of hyper-parameters, got {params!r}")
    for k, v in params.items():
        if k in _INT_PARAMS:
            ok = type(v) is int and v >= 1
        elif k in _FLOAT_PARAMS:
            ok = type(v) in (int, float) and math.isfinite(v) and v >= 0
            ok = ok and (0 < v <= 1 if k in _SHARES else True)
        else:
            raise ValueError(
                f"params: unknown hyper-parameter {k!r}; use some of "
                f"{sorted(_INT_PARAMS | _FLOAT_PARAMS)}"
            )
        if not ok:
            raise ValueError(
                f"params: {k} must be a non-negative number (an int >= 1 for counts, in (0, 1] "
                f"for {sorted(_SHARES)}), got {v!r}"
            )


NO_SEARCH_PARAMS: dict[str, Any] = {"n_estimators": 100, "max_depth": 2, "learning_rate": 0.1}
"""Hyper-parameters without a search (``n_iter=0``): shallow trees that still split on a
few dozen examples (the search's larger ``min_child_weight`` and ``gamma`` draws can
leave such a fit without a single split); XGBoost's defaults otherwise."""


def _grouped_holdout(
    y: np.ndarray, groups: np.ndarray, share: float, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """``(train, held-out)`` indices: about ``share`` of the answers, whole sources,
    stratified by label (one fold of a stratified grouped split)."""
    from sklearn.model_selection import StratifiedGroupKFold

    n = max(2, min(round(1.0 / share), len(set(groups.tolist()))))
    splitter = StratifiedGroupKFold(n_splits=n, shuffle=True, random_state=seed)
    tr, va = next(splitter.split(np.zeros(len(y)), y, groups))
    return tr, va


def search_space() -> dict[str, Any]:
    """The randomized-search distributions of the XGBoost hyper-parameters."""
    from scipy.stats import loguniform, randint, uniform

    return {
        "n_estimators": randint(50, 400),
        "max_depth": randint(2, 7),
        "learning_rate": loguniform(0.01, 0.3),
        "subsample": uniform(0.6, 0.4),
        "colsample_bytree": uniform(0.5, 0.5),
        "min_child_weight": randint(1, 6),
        "gamma": uniform(0.0, 1.0),
        "reg_lambda": loguniform(0.1, 10.0),
    }


def _classifier(seed: int, pos_weight: float, metric: str = "logloss", **params: Any) -> Any:
    from xgboost import XGBClassifier

    return XGBClassifier(
        objective="binary:logistic",
        eval_metric=metric,
        tree_method="hist",
        scale_pos_weight=pos_weight,
        random_state=seed,
        n_jobs=1,
        **params,
    )


class SpadDetector(FittedDetector):
    """Seven-source token probabilities by POS, XGBoost on top."""

    name: ClassVar[str] = "spad"
    explained_on: ClassVar[frozenset[PageRole]] = frozenset({"probability-sources"})
    explanation_kind: ClassVar[ExplanationKind] = "shap"
    Config: ClassVar[type[SpadConfig]] = SpadConfig
    fitted_attr = "booster_"

    def __init__(self, config: SpadConfig | None = None) -> None:
        self.config: SpadConfig = config or self.Config()
        self.booster_: xgboost.Booster | None = None
        self.model_key_: str | None = None
        self.names_: tuple[str, ...] = FEATURE_NAMES
        self.best_params_: dict[str, Any] = {}
        self.threshold_: float = 0.5
        self.train_info_: dict[str, Any] = {}

    # -- features ---------------------------------------------------------------

    def needs(self, model: ModelInfo) -> Needs:

        return spad_needs(model.n_layers)

    def sources(self, run: Run) -> TokenSources:
        """The seven-source split of ``run``'s response tokens (shared within the run)."""

        trace = run.trace
        if trace is None:
            raise ModelError("spad needs a trace (residual stream, z, patterns, logits)")
        model = run.require_model(self.name)
        cs = self.config.chunk_size
        return run.shared(("spad_sources", cs), lambda: token_sources(model, trace, chunk_size=cs))

    def features(self, run: Run) -> Features:

        src = self.sources(run)
        tags = response_pos(run.layout)
        tokens = np.concatenate([src.values, src.p_final[:, None]], axis=1)
        return Features(
            detector=self.name,
            example_id=run.example.id,
            model=run.model.key,
            names=FEATURE_NAMES,
            response=pos_features(src.values, tags),
            token_names=TOKEN_NAMES,
            tokens=tokens,
            token_offsets=src.token_offsets,
        )

    # -- learning ---------------------------------------------------------------

    def pinned(self) -> Mapping[str, Any]:
        """The searched hyper-parameters, fixed (``params``): another search would draw
        boosters whose scores spread differently."""
        require_fitted(self, "booster_", self.name)
        return {"params": dict(self.best_params_)} if self.best_params_ else {}

    def _check(self, features: Sequence[Features]) -> None:
        if len({f.model for f in features}) != 1:
            raise ModelError("spad: features come from several models; train on one")
        bad = [f.example_id for f in features if f.names != FEATURE_NAMES]
        if bad:
            raise DataError(f"spad: features of {bad[0]!r} are not the 126 POS x source features")

    def fit(self, features: Sequence[Features], examples: Sequence[RAGExample]) -> Self:
        """Randomized search, then a final fit with early stopping on a held-out 15%."""
        from sklearn.metrics import f1_score, make_scorer
        from sklearn.model_selection import (
            RandomizedSearchCV,
            StratifiedGroupKFold,
            StratifiedKFold,
            train_test_split,
        )

        check_fit_inputs(self.name, features, examples)
        self._check(features)
        y = response_labels(examples)
        X = self._design([f.response for f in features])
        n_pos, n_neg = int(y.sum()), int((1 - y).sum())
        if min(n_pos, n_neg) == 0:
            raise DataError("spad needs hallucinated and faithful responses in the training data")
        c = self.config
        pos_weight = n_neg / n_pos
        folds = min(c.cv, n_pos, n_neg)
        groups = np.asarray([source_key(e) for e in examples])
        if c.grouped:
            folds = min(folds, len(set(groups.tolist())))
        best: dict[str, Any] = dict(c.params) or ({} if c.n_iter else dict(NO_SEARCH_PARAMS))
        cv_f1: float | None = None
        if folds >= 2 and c.n_iter and not c.params:
            splitter = (
                StratifiedGroupKFold(n_splits=folds, shuffle=True, random_state=c.seed)
                if c.grouped
                else StratifiedKFold(n_splits=folds, shuffle=True, random_state=c.seed)
            )
            search = RandomizedSearchCV(
                _classifier(c.seed, pos_weight),
                search_space(),
                n_iter=c.n_iter,
                scoring=(
                    make_scorer(f1_score, zero_division=0) if c.scoring == "f1" else c.scoring
                ),
                cv=splitter,
                random_state=c.seed,
                n_jobs=1,
                refit=False,
            )
            search.fit(X, y, groups=groups if c.grouped else None)
            best = {
                k: (v.item() if isinstance(v, np.generic) else v)
                for k, v in search.best_params_.items()
            }
            cv_f1 = float(search.best_score_)
        n_hold = max(2, math.ceil(c.holdout * len(y))) if c.holdout > 0 else 0
        stop = bool(n_hold) and min(n_pos, n_neg) >= 2 and len(y) - n_hold >= 2
        if stop and c.grouped:
            tr_i, va_i = _grouped_holdout(y, groups, c.holdout, c.seed)
            n_hold = int(va_i.size)
            stop = len(set(y[va_i].tolist())) == 2 and len(set(y[tr_i].tolist())) == 2
            X_tr, X_va, y_tr, y_va = X[tr_i], X[va_i], y[tr_i], y[va_i]
        elif stop:
            X_tr, X_va, y_tr, y_va = train_test_split(
                X, y, test_size=n_hold, stratify=y, random_state=c.seed
            )
        if stop:
            clf = _classifier(
                c.seed,
                pos_weight,
                c.stop_metric,
                early_stopping_rounds=c.early_stopping_rounds,
                **best,
            )
            clf.fit(X_tr, y_tr, eval_set=[(X_va, y_va)], verbose=False)
            n_trees = int(clf.best_iteration) + 1
            booster = clf.get_booster()[:n_trees]
        else:
            clf = _classifier(c.seed, pos_weight, **best)
            clf.fit(X, y, verbose=False)
            booster = clf.get_booster()
            n_trees = booster.num_boosted_rounds()
        booster.feature_names = list(FEATURE_NAMES)
        booster.set_param({"nthread": 1})
        self.booster_ = booster
        self.model_key_ = features[0].model
        self.best_params_ = best
        self.train_info_ = {
            "n_train": len(y),
            "n_hallucinated": n_pos,
            "scale_pos_weight": pos_weight,
            "cv_folds": folds if c.n_iter and not c.params else 0,
            "cv_f1" if c.scoring == "f1" else f"cv_{c.scoring}": cv_f1,
            "n_iter": c.n_iter if folds >= 2 and not c.params else 0,
            "early_stopping": {"held_out": n_hold if stop else 0, "n_trees": n_trees},
        }
        return self

    # -- scoring ----------------------------------------------------------------

    def _design(self, rows: Sequence[np.ndarray]) -> np.ndarray:
        """``[n, 126]`` float32; with ``missing="nan"`` an absent tag's seven columns are NaN."""
        X = np.stack(rows).astype(np.float32)
        if self.config.missing == "nan":
            grid = X.reshape(len(X), len(SOURCES), -1)
            absent = np.all(grid == 0.0, axis=1)  # [n, tags]: a present tag sums to P_final > 0
            grid[np.broadcast_to(absent[:, None, :], grid.shape)] = np.nan
            X = grid.reshape(len(X), -1)
        return X

    def _matrix(self, features: Sequence[Features]) -> xgboost.DMatrix:
        import xgboost

        require_fitted(self, "booster_", self.name)
        for f in features:
            check_features(self.name, f, self.model_key_, self.names_)
        return xgboost.DMatrix(
            self._design([f.response for f in features]), feature_names=list(self.names_)
        )

    def contributions(self, features: Sequence[Features]) -> np.ndarray:
        """``[n, 127]`` exact per-feature contributions (log-odds); last column the bias.

        Each row sums to the example's raw margin (:meth:`margins`).
        """
        dm = self._matrix(features)
        assert self.booster_ is not None
        return np.asarray(self.booster_.predict(dm, pred_contribs=True), dtype=np.float64)

    def margins(self, features: Sequence[Features]) -> np.ndarray:
        """``[n]`` raw margins (log-odds of hallucination)."""
        dm = self._matrix(features)
        assert self.booster_ is not None
        return np.asarray(self.booster_.predict(dm, output_margin=True), dtype=np.float64)

    def predict(self, features: Features) -> Verdict:
        dm = self._matrix([features])
        assert self.booster_ is not None
        score = float(self.booster_.predict(dm)[0])
        contrib = self.booster_.predict(dm, pred_contribs=True)[0]
        expl = {n: float(v) for n, v in zip(self.names_, contrib[:-1], strict=True)}
        expl[BIAS] = float(contrib[-1])
        return thresholded_verdict(
            self,
            features,
            score,
            explanation=expl,
        )

    # -- artifacts --------------------------------------------------------------

    def fitted_state(self) -> tuple[dict[str, Any], Writers]:
        assert self.booster_ is not None
        booster = self.booster_
        weights = {
            "names": list(self.names_),
            "best_params": self.best_params_,
            "booster_file": BOOSTER_FILE,
        }
        return weights, {BOOSTER_FILE: lambda path: booster.save_model(str(path))}

    def fitted_models(self) -> Mapping[str, tuple[Any, int | None]]:
        return {BOOSTER_FILE: (self.booster_, len(FEATURE_NAMES))}

    @classmethod
    def damage_errors(cls) -> tuple[type[BaseException], ...]:
        """XGBoost's own error (XGBoost is imported only when needed)."""
        import xgboost

        return (xgboost.core.XGBoostError,)

    def restore_state(self, folder: Path, w: Mapping[str, Any], cfg: Mapping[str, Any]) -> None:
        import xgboost

        path = folder / BOOSTER_FILE
        names = tuple(str(n) for n in w["names"])
        if names != FEATURE_NAMES:
            raise ValueError("feature names are not the 126 POS x source features")
        if not path.is_file():
            raise FileNotFoundError(f"{BOOSTER_FILE} is missing")
        booster = xgboost.Booster()
        retrain = f"retrain it with `ragscope train --detectors {self.name}`"
        booster.load_model(read_booster_file(path, retrain))
        if booster.num_features() != len(names):
            raise ValueError(
                f"the booster reads {booster.num_features()} features, not {len(names)}"
            )
        booster.feature_names = list(names)
        booster.set_param({"nthread": 1})
        self.booster_ = booster
        self.names_ = names
        self.best_params_ = dict(w.get("best_params") or {})


def split_errors(features: Sequence[Features]) -> np.ndarray:
    """Per example, the largest ``|sum of the seven sources - P_final|`` over its tokens.

    Reads the token features (:data:`TOKEN_NAMES`) of ``spad`` :class:`Features`;
    an answer without tokens counts 0.
    """
    out = np.zeros(len(features), dtype=np.float64)
    for i, f in enumerate(features):
        if f.token_names != TOKEN_NAMES:
            raise DataError(
                f"features of {f.example_id!r} are not spad token features "
                f"(columns {f.token_names}); extract them with the spad detector"
            )
        t = np.asarray(f.tokens, dtype=np.float64)
        if t.size:
            out[i] = float(np.abs(t[:, : len(SOURCES)].sum(1) - t[:, len(SOURCES)]).max())
    return out
