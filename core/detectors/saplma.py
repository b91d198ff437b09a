"""``saplma``: a probe on the residual stream (SAPLMA; Azaria & Mitchell, "The Internal
State of an LLM Knows When It's Lying", Findings of EMNLP 2023).

Features: the residual stream after a few blocks (``resid_post``; by default at a third,
a half, two thirds and five sixths of the depth), at every answer token's own position
``p_j``. Only the token rows are stored; the answer-level inputs are pooled from them
when learning: the mean over the answer's tokens, or the last token's row.

Learning: one probe per candidate (layer, pooling); the candidate with the best
validation AUROC wins (``ragscope evaluate`` / ``train`` pass a validation split; without
one, the best source-grouped cross-validated log loss on the training split). The probe is
a standardised, class-balanced L2 logistic regression whose strength is chosen by grouped
cross-validated log loss (default), or SAPLMA's own small MLP (256-128-64, ReLU; ``learner="mlp"``).

Scores: the answer's probability from the chosen probe on its pooled row; token scores
from the SAME probe applied to each token's row at the chosen layer, or (``token_probe``)
from a second probe trained on the gold token labels at the layer that ranks the
validation tokens best, its logits averaged over a window of neighbouring tokens whose
width (1, no smoothing, to 25) is chosen on the same validation tokens (hallucinated
spans run over several tokens). With ``answer="token_peak"`` (and the token probe) the
answer's score comes from the token probe instead: the highest of its token logits
averaged over windows of ``peak_window`` tokens, so an answer is as suspect as its most
suspect stretch and the answer score learns from the span labels too (the procedure's
calibration turns it into a probability).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal, Self

import numpy as np
from safetensors import SafetensorError
from sklearn.metrics import average_precision_score

from core.base.errors import DataError, ModelError
from core.base.examples import RAGExample, source_key
from core.detectors.common import FittedDetector, Writers, token_training_set
from core.engine.model import ModelInfo
from core.engine.trace import Needs
from core.learning.contract import (
    DetectorConfig,
    Features,
    Run,
    Verdict,
    check_features,
    require_fitted,
    thresholded_verdict,
)
from core.learning.labels import response_labels
from core.learning.learners import LogisticCalibrator, MLPHead, grouped_folds, grouped_logistic
from core.learning.metrics import auroc_or_none
from core.signals.smoothing import TOKEN_WINDOWS, check_window, window_mean, window_peak

Pool = Literal["mean", "last"]
POOLS: tuple[Pool, ...] = ("mean", "last")
Learner = Literal["logistic", "mlp"]
AnswerSource = Literal["probe", "token_peak"]
ANSWER_SOURCES: tuple[AnswerSource, ...] = ("probe", "token_peak")
DEFAULT_DEPTHS: tuple[float, ...] = (1 / 3, 1 / 2, 2 / 3, 5 / 6)
"""Where the default layers sit, as fractions of the depth (SAPLMA probed middle and
upper layers of 32-layer models; the middle ones did best)."""
MLP_FILE = "mlp.safetensors"


TOKEN_HOLDOUT_FOLDS = 5
"""Without validation tokens the token probe's layer and window are chosen on one of
this many source-grouped folds of its training answers (a fifth)."""


def _stratified_pick(y: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    """At most ``n`` positions of ``y``, sorted, keeping its share of 1s (at least one)."""
    if y.size <= n:
        return np.arange(y.size)
    pos, neg = np.flatnonzero(y == 1), np.flatnonzero(y == 0)
    n_pos = min(pos.size, max(1, round(n * pos.size / y.size)))
    return np.sort(
        np.concatenate(
            [rng.choice(pos, n_pos, replace=False), rng.choice(neg, n - n_pos, replace=False)]
        )
    )


def default_layers(n_layers: int) -> tuple[int, ...]:
    """The blocks at :data:`DEFAULT_DEPTHS` of an ``n_layers``-block model."""
    return tuple(sorted({round(f * (n_layers - 1)) for f in DEFAULT_DEPTHS}))


@dataclass(frozen=True, kw_only=True)
class SaplmaConfig(DetectorConfig):
    """SAPLMA options.

    Attributes:
        layers: Blocks whose output is read (empty: :func:`default_layers`).
        pools: Candidate answer poolings (``mean`` over tokens, ``last`` token).
        learner: ``logistic`` (L2, class-balanced) or ``mlp`` (SAPLMA's 256-128-64 MLP).
        c_grid: Logistic regression strengths chosen among by grouped cross-validation.
        hidden: MLP hidden widths.
        alpha: MLP L2 penalty.
        seed: Seed of the cross-validation folds and the MLP.
        concat: Also try, per pooling, one probe on all the layers' rows side by side
            (a multi-layer probe; its token scores read each token's rows the same way).
        token_probe: Token scores from a second probe trained on the gold TOKEN labels
            (spans) at the layer whose probe ranks the validation answers' tokens best,
            instead of the answer probe applied to each token (answers whose token
            labels are unknown are left out of it).
        token_c: Strength of the token probe's L2 logistic regression.
        token_sample: Training tokens each candidate layer's token probe is fitted on
            while the layer is chosen (a label-stratified sample; the chosen layer's
            probe is then refitted on all of them).
        answer: Where the answer score comes from: the answer ``probe`` (SAPLMA), or
            ``token_peak``, the token probe's highest logit averaged over windows of
            ``peak_window`` tokens (needs ``token_probe``; where the token probe could
            not be fitted, for want of span labels, the answer probe is used and
            ``train_info["answer"]`` says so).
        peak_window: Width (odd, tokens) of the windows ``token_peak`` averages over.
    """

    FIT_ONLY: ClassVar[frozenset[str]] = frozenset(
        {
            "pools",
            "learner",
            "c_grid",
            "hidden",
            "alpha",
            "seed",
            "concat",
            "token_probe",
            "token_c",
            "token_sample",
            "answer",
            "peak_window",
        }
    )

    layers: tuple[int, ...] = ()
    pools: tuple[Pool, ...] = POOLS
    learner: Learner = "logistic"
    c_grid: tuple[float, ...] = (0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1.0)
    hidden: tuple[int, ...] = (256, 128, 64)
    alpha: float = 1e-3
    seed: int = 0
    concat: bool = False
    token_probe: bool = False
    token_c: float = 0.01
    token_sample: int = 20000
    answer: AnswerSource = "probe"
    peak_window: int = 25

    def __post_init__(self) -> None:
        if self.answer not in ANSWER_SOURCES:
            raise DataError(
                f"saplma: answer must be one of {list(ANSWER_SOURCES)}, got {self.answer!r}",
                field="answer",
            )
        if self.answer == "token_peak" and not self.token_probe:
            raise DataError(
                "saplma: answer=token_peak reads the token probe; add "
                "`--set saplma.token_probe=true`",
                field="answer",
            )
        check_window(self.peak_window, "saplma.peak_window")
        if self.token_c <= 0:
            raise DataError("saplma: token_c must be > 0 and token_sample >= 100", field="token_c")
        if self.token_sample < 100:
            raise DataError(
                "saplma: token_c must be > 0 and token_sample >= 100", field="token_sample"
            )
        if not self.pools or any(p not in POOLS for p in self.pools):
            raise DataError(f"saplma: pools must be a non-empty subset of {POOLS}", field="pools")
        if self.learner not in ("logistic", "mlp"):
            raise DataError(f"saplma: learner must be logistic or mlp, got {self.learner!r}")
        if not self.c_grid or min(self.c_grid) <= 0:
            raise DataError("saplma: c_grid needs positive values", field="c_grid")
        if (
            not self.hidden
            or len(self.hidden) > 8
            or any(not isinstance(h, int) or not 1 <= h <= 4096 for h in self.hidden)
        ):
            raise DataError(
                f"saplma: hidden needs 1 to 8 widths of 1 to 4096, got {list(self.hidden)[:10]}",
                field="hidden",
            )
        if len(set(self.layers)) != len(self.layers):
            raise DataError(f"saplma: layers repeat: {list(self.layers)}", field="layers")


Probe = LogisticCalibrator | MLPHead


class SaplmaDetector(FittedDetector):
    """A probe on pooled residual-stream states (see the module docstring)."""

    gives_token_scores: ClassVar[bool] = True

    name: ClassVar[str] = "saplma"
    Config = SaplmaConfig
    fitted_attr = "probe_"
    load_errors = (SafetensorError,)

    def __init__(self, config: SaplmaConfig | None = None) -> None:
        self.config: SaplmaConfig = config or SaplmaConfig()
        self.probe_: Probe | None = None
        self.layers_: tuple[int, ...] = ()
        self.layer_: int | None = None
        self.concat_: bool = False
        self.token_probe_: LogisticCalibrator | None = None
        self.token_layer_: int | None = None
        self.token_window_: int = 1
        self.answer_: AnswerSource = "probe"
        self.pool_: Pool | None = None
        self.d_model_: int | None = None
        self.model_key_: str | None = None
        self.threshold_: float = 0.5
        self.train_info_: dict[str, Any] = {}

    # -- features ------------------------------------------------------------------

    def layers(self, model: ModelInfo) -> tuple[int, ...]:
        """The blocks read on ``model`` (checked against its depth)."""
        layers = self.config.layers or default_layers(model.n_layers)
        bad = [ly for ly in layers if not 0 <= ly < model.n_layers]
        if bad:
            raise ModelError(f"saplma: layers {bad} are outside 0..{model.n_layers - 1}")
        return tuple(layers)

    def needs(self, model: ModelInfo) -> Needs:
        return Needs.of(["resid_post"], layers=self.layers(model), positions="response")

    def features(self, run: Run) -> Features:
        if run.trace is None:
            raise ModelError("saplma needs the traced forward pass")
        layers = self.layers(run.model)
        pos = run.layout.response_positions
        rows = [run.trace.at("resid_post", ly, pos).numpy() for ly in layers]  # [T, d] each
        d = rows[0].shape[1]
        return Features(
            detector=self.name,
            example_id=run.example.id,
            model=run.model.key,
            names=tuple(f"L{ly}.norm_mean" for ly in layers),
            response=np.asarray([np.linalg.norm(r, axis=1).mean() for r in rows], np.float32),
            token_names=tuple(f"L{ly}.{k}" for ly in layers for k in range(d)),
            tokens=np.concatenate(rows, axis=1),
            token_offsets=run.layout.response_offsets,
        )

    # -- learning --------------------------------------------------------------------

    @staticmethod
    def _layers_of(features: Features) -> tuple[int, ...]:
        return tuple(int(n.split(".")[0][1:]) for n in features.names)

    def _block(self, features: Features, layer: int | None) -> np.ndarray:
        """``[T, d]``: the token rows of one layer (``None``: every layer's rows side by
        side, ``[T, layers * d]``)."""
        layers = self._layers_of(features)
        if layer is None:
            if features.tokens is None:
                raise ModelError("saplma: these features hold no token rows; re-extract them")
            return features.tokens
        if features.tokens is None or layer not in layers:
            raise ModelError(
                f"saplma: these features hold layers {list(layers)}, not {layer}; re-extract "
                "them with the detector's config"
            )
        d = features.tokens.shape[1] // len(layers)
        i = layers.index(layer)
        return features.tokens[:, i * d : (i + 1) * d]

    def _pooled(self, features: Features, layer: int | None, pool: Pool) -> np.ndarray:
        block = self._block(features, layer)
        return block.mean(axis=0) if pool == "mean" else block[-1]

    def _make_probe(self, X: np.ndarray, y: np.ndarray, groups: np.ndarray) -> tuple[Probe, float]:
        """A probe fitted on ``X``, and its grouped cross-validated log loss, negated
        (logistic: of the chosen strength; MLP: NaN, it is selected on validation only)."""
        c = self.config
        if c.learner == "mlp":
            return MLPHead(c.hidden, alpha=c.alpha, seed=c.seed).fit(X, y), float("nan")
        return grouped_logistic(X, y, c.c_grid, groups=groups, seed=c.seed)

    def fit(
        self,
        features: Sequence[Features],
        examples: Sequence[RAGExample],
        *,
        validation: tuple[Sequence[Features], Sequence[RAGExample]] | None = None,
    ) -> Self:
        """Fit a probe per (layer, pooling) and keep the best (see the module docstring)."""
        model_key, y = self.labelled_inputs(features, examples)
        groups = np.asarray([source_key(e) for e in examples])
        layers = self._layers_of(features[0])
        first = features[0].tokens
        if first is None or first.shape[1] % len(layers):
            raise ModelError("saplma: these features hold no token rows; re-extract them")
        use_val = validation is not None and len(validation[0]) > 0
        y_val = response_labels(validation[1]) if use_val and validation else None
        tried: list[dict[str, Any]] = []
        best: tuple[float, int | None, Pool, Probe] | None = None
        candidates: list[int | None] = [*layers, *([None] if self.config.concat else [])]
        for layer in candidates:
            for pool in self.config.pools:
                X = np.stack([self._pooled(f, layer, pool) for f in features])
                probe, cv_auc = self._make_probe(X, y, groups)
                score = cv_auc
                if use_val and validation is not None and y_val is not None:
                    Xv = np.stack([self._pooled(f, layer, pool) for f in validation[0]])
                    auc = auroc_or_none(y_val, probe.predict_proba(Xv))
                    score = float("nan") if auc is None else auc
                tried.append(
                    {"layer": "all" if layer is None else layer, "pool": pool, "score": score}
                )
                key = -np.inf if np.isnan(score) else score
                if best is None or key > best[0]:
                    best = (key, layer, pool, probe)
        assert best is not None
        _, self.layer_, self.pool_, self.probe_ = best
        self.concat_ = self.layer_ is None
        self.layers_ = layers
        self.d_model_ = int(first.shape[1] // len(layers))
        self.model_key_ = model_key
        self.token_probe_, self.token_layer_, token_info = None, None, {}
        if self.config.token_probe:
            token_info = self._fit_token_probe(features, examples, layers, validation)
        self.answer_ = self.config.answer if self.token_probe_ is not None else "probe"
        self.train_info_ = {
            **token_info,
            "answer": self.answer_
            + (" (no token probe to read)" if self.answer_ != self.config.answer else ""),
            "n_train": len(features),
            "n_hallucinated": int(y.sum()),
            "layer": "all" if self.concat_ else self.layer_,
            "pool": self.pool_,
            "selected_on": "validation AUROC" if use_val else "grouped cross-validated log loss",
            "candidates": tried,
        }
        return self

    def _fit_token_probe(
        self,
        features: Sequence[Features],
        examples: Sequence[RAGExample],
        layers: tuple[int, ...],
        validation: tuple[Sequence[Features], Sequence[RAGExample]] | None,
    ) -> dict[str, Any]:
        """The token probe (see :class:`SaplmaConfig`): per candidate layer a probe on a
        sample of the training tokens, scored by the token AP of the validation answers'
        known tokens with its logits smoothed by each window of :data:`TOKEN_WINDOWS`
        (:func:`core.signals.smoothing.window_mean`; without validation tokens, on a fifth of the
        training answers held out by source, :meth:`_token_holdout`; with too few sources
        for that, the answer probe's layer and no smoothing), then the chosen layer's
        probe on every training token, smoothed by the chosen window."""
        c = self.config
        idx, _, labels = token_training_set(features, examples)
        y = np.concatenate(labels) if labels else np.zeros(0, np.int8)
        if len(set(y.tolist())) < 2:
            return {"token_probe": "no tokens of both labels to learn from"}

        def layer_rows(ly: int) -> np.ndarray:  # one layer at a time: ~d_model x 4 B per token
            return np.concatenate([self._block(features[i], ly) for i in idx])

        rng = np.random.default_rng(c.seed)
        v_idx, _, v_labels = (
            token_training_set(validation[0], validation[1]) if validation else ([], [], [])
        )
        v_y = np.concatenate(v_labels) if v_labels else np.zeros(0, np.int8)
        if len(set(v_y.tolist())) == 2 and validation is not None:
            fit_pos, held, held_y = np.arange(len(idx)), [validation[0][i] for i in v_idx], v_y
        else:
            fit_pos, held_idx, held_y = self._token_holdout(examples, idx, labels)
            held = [features[i] for i in held_idx]
        scores: dict[tuple[int, int], float] = {}
        if held:
            y_fit = np.concatenate([labels[p] for p in fit_pos])
            pick = _stratified_pick(y_fit, c.token_sample, rng)
            for ly in layers:
                rows = np.concatenate([self._block(features[idx[p]], ly) for p in fit_pos])
                probe = LogisticCalibrator(C=c.token_c, max_iter=300).fit(rows[pick], y_fit[pick])
                v_z = [probe.decision_function(self._block(f, ly)) for f in held]
                for w in TOKEN_WINDOWS:
                    s = np.concatenate([window_mean(z, w) for z in v_z])
                    scores[ly, w] = float(average_precision_score(held_y, s))
            layer, window = max(scores, key=lambda k: scores[k])
        else:
            layer = self.layer_ if self.layer_ is not None else layers[len(layers) // 2]
            window = 1
        self.token_layer_, self.token_window_ = int(layer), int(window)
        self.token_probe_ = LogisticCalibrator(C=c.token_c, max_iter=300).fit(layer_rows(layer), y)
        return {
            "token_layer": self.token_layer_,
            "token_window": self.token_window_,
            "token_layer_ap": {
                str(ly): max(v for (k, _), v in scores.items() if k == ly)
                for ly in dict.fromkeys(k for k, _ in scores)
            },
            "token_window_ap": {str(w): v for (k, w), v in scores.items() if k == layer},
            "n_token_answers": len(idx),
            "n_tokens": int(y.size),
        }

    def _token_holdout(
        self, examples: Sequence[RAGExample], idx: Sequence[int], labels: Sequence[np.ndarray]
    ) -> tuple[np.ndarray, list[int], np.ndarray]:
        """Without validation tokens (e.g. inside an ensemble): the token-labelled training
        answers split by source (stratified by whether an answer has hallucinated tokens)
        into the part the candidate probes learn from (positions into ``idx``) and a fifth
        held out to rank them (its answers' indices and token labels); nothing to hold out
        when the sources are too few."""
        has = np.asarray([int(lab.any()) for lab in labels])
        groups = np.asarray([source_key(examples[i]) for i in idx])
        folds = grouped_folds(has, groups, TOKEN_HOLDOUT_FOLDS, self.config.seed)
        if not folds:
            return np.arange(len(idx)), [], np.zeros(0, np.int8)
        fit, held = folds[0]
        return fit, [idx[p] for p in held], np.concatenate([labels[p] for p in held])

    def predict(self, features: Features) -> Verdict:
        require_fitted(self, "probe_", self.name)
        assert self.probe_ is not None and self.pool_ is not None and self.d_model_ is not None
        check_features(self.name, features, self.model_key_)
        if self.concat_ and self._layers_of(features) != self.layers_:
            raise ModelError(
                f"saplma: the probe reads layers {list(self.layers_)} side by side, these "
                f"features hold {list(self._layers_of(features))}; re-extract them"
            )
        block = self._block(features, None if self.concat_ else self.layer_)
        width = self.d_model_ * (len(self.layers_) if self.concat_ else 1)
        if block.shape[1] != width:
            raise ModelError(
                f"saplma: these features are {block.shape[1]} wide, the probe was trained on "
                f"{width} (another model?); retrain it"
            )
        pooled = block.mean(axis=0) if self.pool_ == "mean" else block[-1]
        z = float(self.probe_.decision_function(pooled[None, :])[0])
        explanation = {f"probe logit ({self._where()}, {self.pool_} pooling)": z}
        if self.token_probe_ is not None and self.token_layer_ is not None:
            z_tok = self.token_probe_.decision_function(self._block(features, self.token_layer_))
            tokens = 1.0 / (1.0 + np.exp(-window_mean(z_tok, self.token_window_)))
            if self.answer_ == "token_peak":
                z = window_peak(z_tok, self.config.peak_window)
                explanation = {
                    f"token probe peak (layer {self.token_layer_}, "
                    f"{self.config.peak_window}-token windows)": z,
                    **{f"{k}, not used for the score": v for k, v in explanation.items()},
                }
        else:
            tokens = self.probe_.predict_proba(block)
        tokens = tokens.astype(np.float32)
        return thresholded_verdict(
            self,
            features,
            1.0 / (1.0 + np.exp(-z)),
            token_scores=tokens,
            explanation={
                **explanation,
                **dict(zip(features.names, map(float, features.response), strict=True)),
            },
        )

    def _where(self) -> str:
        return (
            f"layers {', '.join(map(str, self.layers_))}"
            if self.concat_
            else f"layer {self.layer_}"
        )

    # -- artifacts -----------------------------------------------------------------

    def fitted_state(self) -> tuple[dict[str, Any], Writers]:
        from safetensors.numpy import save_file

        probe = self.probe_
        weights: dict[str, Any] = {
            "layers": list(self.layers_),
            "layer": self.layer_,
            "concat": self.concat_,
            "token_probe": self.token_probe_.to_json() if self.token_probe_ else None,
            "token_layer": self.token_layer_,
            "token_window": self.token_window_,
            "answer": self.answer_,
            "pool": self.pool_,
            "d_model": self.d_model_,
            "logistic": probe.to_json() if isinstance(probe, LogisticCalibrator) else None,
            "mlp_file": MLP_FILE if isinstance(probe, MLPHead) else None,
        }
        files: Writers = {}
        if isinstance(probe, MLPHead):
            arrays = probe.arrays()
            files[MLP_FILE] = lambda path: save_file(arrays, str(path))
        return weights, files

    def restore_state(self, folder: Path, w: Mapping[str, Any], cfg: Mapping[str, Any]) -> None:
        from safetensors.numpy import load_file

        self.layers_ = tuple(int(x) for x in w["layers"])
        self.concat_ = w.get("concat", False)
        if not isinstance(self.concat_, bool):
            raise ValueError(f"concat must be true or false, not {self.concat_!r}")
        self.layer_ = None if self.concat_ else int(w["layer"])
        if not self.concat_ and self.layer_ not in self.layers_:
            raise ValueError(f"layer {self.layer_} is not among {list(self.layers_)}")
        if w["pool"] not in POOLS:
            raise ValueError(f"pool {w['pool']!r} is not one of {POOLS}")
        self.pool_ = w["pool"]
        self.d_model_ = int(w["d_model"])
        self.token_probe_, self.token_layer_ = None, None
        self.token_window_ = check_window(w.get("token_window", 1))
        if w.get("token_probe") is not None:
            self.token_layer_ = int(w["token_layer"])
            if self.token_layer_ not in self.layers_:
                raise ValueError(
                    f"token layer {self.token_layer_} is not among {list(self.layers_)}"
                )
            self.token_probe_ = LogisticCalibrator.from_json(w["token_probe"])
            assert self.token_probe_.coef_ is not None  # from_json sets it
            if self.token_probe_.coef_.shape[0] != self.d_model_:
                raise ValueError("the token probe does not read d_model inputs")
        self.answer_ = w.get("answer", "probe")
        if self.answer_ not in ANSWER_SOURCES or (
            self.answer_ == "token_peak" and self.token_probe_ is None
        ):
            raise ValueError(
                f"answer {self.answer_!r} is not one of {list(ANSWER_SOURCES)} with the "
                "token probe it reads"
            )
        if w.get("logistic") is not None:
            self.probe_ = LogisticCalibrator.from_json(w["logistic"])
            assert self.probe_.coef_ is not None
            width = self.probe_.coef_.shape[0]
        else:
            if w.get("mlp_file") != MLP_FILE:
                raise ValueError("neither a logistic probe nor the MLP file is recorded")
            self.probe_ = MLPHead.from_arrays(load_file(str(folder / MLP_FILE)), self.config.hidden)
            assert self.probe_.mean_ is not None  # from_arrays sets it
            width = self.probe_.mean_.shape[0]
        want = self.d_model_ * (len(self.layers_) if self.concat_ else 1)
        if width != want:
            raise ValueError(f"the probe reads {width} inputs, not {want}")
