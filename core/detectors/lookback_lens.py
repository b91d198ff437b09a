"""``lookback_lens``: Lookback Lens (Chuang et al., "Lookback Lens: Detecting and Mitigating
Contextual Hallucinations in Large Language Models Using Only Attention Maps", EMNLP 2024).

Features: for every head ``(l, h)`` and answer token ``y_j`` (read where it is produced,
at ``g_j = p_j - 1``), the lookback ratio

    LR[l,h](j) = A_ctx / (A_ctx + A_new),

``A_ctx`` the mean attention of that query on the context tokens and ``A_new`` its mean
attention on the answer tokens written so far (``y_1..y_{j-1}``; none for the first
token, so its ratio is 1 when it attends to the context at all). The context is the
passages (default, as ragscope's issue defines it) or, as in the paper, the whole prompt
(``context="prompt"``). Stored per token (``[T, L*H]``); the answer-level row is the mean.

Learning (logistic regressions, class-balanced, strength chosen by grouped
cross-validated log loss):

- windows: the ratios averaged over a sliding window of ``window`` answer tokens (the
  paper's 8); a window is hallucinated when any of its tokens is. Trained on answers
  whose token labels are known (gold spans; faithful answers count as all faithful).
- answer: the mean ratios over the whole answer, on the answer labels.

Scores: each token's score is the mean probability of the windows (stride 1) that
cover it (from the window model, or the answer model when no token labels were there
to learn windows from); the answer's score is the answer model's probability or the
highest window probability (``response``; ``auto`` picks by validation AUROC).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal, Self

import numpy as np

from core.base.errors import DataError, ModelError
from core.base.examples import RAGExample, source_key
from core.detectors.common import FittedDetector, Writers, token_training_set
from core.engine.model import ModelInfo
from core.engine.trace import KEY_GROUPS, Needs, key_groups
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
from core.learning.learners import LogisticCalibrator, grouped_logistic
from core.learning.metrics import auroc_or_none
from core.signals.smoothing import check_window, window_probs

Context = Literal["passages", "prompt"]
ResponseMode = Literal["auto", "answer", "windows"]


def lookback_name(layer: int, head: int) -> str:
    return f"LR_L{layer}H{head}"


def lookback_ratios(pattern: np.ndarray, context: np.ndarray, answer: np.ndarray) -> np.ndarray:
    """Lookback ratios of one layer.

    Args:
        pattern: ``[head, T, seq]`` attention of the answer's generation positions
            ``g_j = p_j - 1`` (queries) on every position (keys).
        context: Absolute positions of the context tokens.
        answer: ``[T]`` absolute positions ``p_j`` of the answer tokens.

    Returns:
        ``[T, head]`` ratios in [0, 1]; 0.5 where a query attends to neither part.
    """
    p = np.asarray(pattern, dtype=np.float64)
    n_heads, t, _ = p.shape
    a_ctx = p[:, :, context].mean(-1) if context.size else np.zeros((n_heads, t))
    # Query j (at g_j) sees the answer tokens before y_j: keys p_1..p_{j-1}.
    earlier = np.tril(p[:, :, answer], k=-1).sum(-1)
    a_new = earlier / np.maximum(np.arange(t), 1)[None, :]
    denom = a_ctx + a_new
    ratio = np.divide(a_ctx, denom, out=np.full_like(denom, 0.5), where=denom > 0)
    return ratio.T.astype(np.float32)


def lookback_from_mass(mass: np.ndarray, n_context: int, group: int) -> np.ndarray:
    """:func:`lookback_ratios` from the attention's sums over the key groups (the trace's
    ``key_mass``, reduced as the pass runs): ``[head, T, len(KEY_GROUPS)]`` ->
    ``[T, head]``. ``group`` is the context's group in :data:`KEY_GROUPS`; the answer's
    sum counts only earlier answer tokens (a later one is a future key, never attended).
    """
    m = np.asarray(mass, dtype=np.float64)
    n_heads, t, _ = m.shape
    a_ctx = m[:, :, group] / n_context if n_context else np.zeros((n_heads, t))
    a_new = m[:, :, KEY_GROUPS.index("response")] / np.maximum(np.arange(t), 1)[None, :]
    denom = a_ctx + a_new
    ratio = np.divide(a_ctx, denom, out=np.full_like(denom, 0.5), where=denom > 0)
    return ratio.T.astype(np.float32)


def window_means(tokens: np.ndarray, window: int, stride: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Means of ``tokens`` rows over sliding windows, and each window's ``[start, end)``.

    Answers shorter than ``window`` give one window over all their tokens.
    """
    t = tokens.shape[0]
    if t == 0:
        return np.zeros((0, tokens.shape[1]), np.float32), np.zeros((0, 2), np.int64)
    w = min(window, t)
    starts = np.arange(0, t - w + 1, stride)
    if starts[-1] != t - w:
        starts = np.append(starts, t - w)  # the last tokens are always covered
    csum = np.concatenate([np.zeros((1, tokens.shape[1])), np.cumsum(tokens, axis=0)])
    means = (csum[starts + w] - csum[starts]) / w
    return means.astype(np.float32), np.stack([starts, starts + w], axis=1)


@dataclass(frozen=True, kw_only=True)
class LookbackLensConfig(DetectorConfig):
    """Lookback Lens options.

    Attributes:
        context: What counts as context: the ``passages`` or the whole ``prompt`` (paper).
        window: Answer tokens per window (paper: 8).
        stride: Step between training windows (prediction always uses 1).
        response: How the answer score is made: the ``answer`` model, the highest
            window probability (``windows``), or ``auto`` (the better on validation).
        c_grid: Logistic regression strengths chosen among by grouped cross-validation.
        seed: Seed of the cross-validation folds.
        token_window: Width (odd, tokens) of a centred window the token scores are then
            averaged over in logit space (:func:`core.signals.smoothing.window_probs`; 1, the
            paper: none).
    """

    FIT_ONLY: ClassVar[frozenset[str]] = frozenset(
        {"window", "stride", "response", "c_grid", "seed", "token_window"}
    )

    context: Context = "passages"
    window: int = 8
    stride: int = 4
    response: ResponseMode = "auto"
    c_grid: tuple[float, ...] = (0.001, 0.01, 0.1, 1.0, 10.0)
    seed: int = 0
    token_window: int = 1

    def __post_init__(self) -> None:
        check_window(self.token_window, "lookback_lens.token_window")
        if self.context not in ("passages", "prompt"):
            raise DataError(
                f"lookback_lens: context must be passages or prompt, got {self.context!r}"
            )
        if self.response not in ("auto", "answer", "windows"):
            raise DataError("lookback_lens: response must be auto, answer or windows")
        if self.window < 1 or self.stride < 1:
            raise DataError("lookback_lens: window and stride must be >= 1")
        if not self.c_grid or min(self.c_grid) <= 0:
            raise DataError("lookback_lens: c_grid needs positive values", field="c_grid")


class LookbackLensDetector(FittedDetector):
    """Logistic regressions on per-head lookback ratios (see the module docstring)."""

    gives_token_scores: ClassVar[bool] = True

    name: ClassVar[str] = "lookback_lens"
    Config = LookbackLensConfig
    fitted_attr = "answer_model_"

    def __init__(self, config: LookbackLensConfig | None = None) -> None:
        self.config: LookbackLensConfig = config or LookbackLensConfig()
        self.answer_model_: LogisticCalibrator | None = None
        self.window_model_: LogisticCalibrator | None = None
        self.response_mode_: Literal["answer", "windows"] = "answer"
        self.names_: tuple[str, ...] = ()
        self.model_key_: str | None = None
        self.threshold_: float = 0.5
        self.train_info_: dict[str, Any] = {}

    # -- features ------------------------------------------------------------------

    def needs(self, model: ModelInfo) -> Needs:
        # The attention's sums over the context and the answer, reduced in the pass: a
        # long prompt's rows are never kept (issue 68).
        return Needs.of(["key_mass"], n_layers=model.n_layers, positions="generation")

    def features(self, run: Run) -> Features:
        if run.trace is None:
            raise ModelError("lookback_lens needs the traced forward pass")
        lay = run.layout
        group = KEY_GROUPS.index("context" if self.config.context == "passages" else "prompt")
        n_context = len(key_groups(lay)[group])
        cols, names = [], []
        for layer in range(run.model.n_layers):
            mass = run.trace.at("key_mass", layer, lay.generation_positions).numpy()
            cols.append(lookback_from_mass(mass, n_context, group))
            names += [lookback_name(layer, h) for h in range(mass.shape[0])]
        tokens = np.concatenate(cols, axis=1)
        return Features(
            detector=self.name,
            example_id=run.example.id,
            model=run.model.key,
            names=tuple(names),
            response=tokens.mean(axis=0),
            token_names=tuple(names),
            tokens=tokens,
            token_offsets=lay.response_offsets,
        )

    # -- learning --------------------------------------------------------------------

    def pinned(self) -> Mapping[str, Any]:
        """With ``response="auto"``, the answer score chosen on validation (the answer
        model's probability and the windows' peak spread differently)."""
        require_fitted(self, "answer_model_", self.name)
        return {"response": self.response_mode_} if self.config.response == "auto" else {}

    def _windows(
        self, features: Sequence[Features], examples: Sequence[RAGExample]
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """Training windows, their labels and the answer each comes from; ``None``
        when no answer has known token labels of both kinds."""
        idx, xs, ys = token_training_set(features, examples)
        X, y, g = [], [], []
        for i, x, lab in zip(idx, xs, ys, strict=True):
            means, bounds = window_means(x, self.config.window, self.config.stride)
            X.append(means)
            y.append(np.asarray([lab[a:b].max() for a, b in bounds], dtype=np.int64))
            g.append(np.full(len(means), i))
        if not y or len(set(np.concatenate(y).tolist())) < 2:
            return None
        return np.concatenate(X), np.concatenate(y), np.concatenate(g)

    def _logistic(self, X: np.ndarray, y: np.ndarray, groups: np.ndarray) -> LogisticCalibrator:
        return grouped_logistic(X, y, self.config.c_grid, groups=groups, seed=self.config.seed)[0]

    def fit(
        self,
        features: Sequence[Features],
        examples: Sequence[RAGExample],
        *,
        validation: tuple[Sequence[Features], Sequence[RAGExample]] | None = None,
    ) -> Self:
        """Fit the answer and window models (see the module docstring)."""
        model_key, y = self.labelled_inputs(features, examples)
        X = np.stack([f.response for f in features])
        self.answer_model_ = self._logistic(X, y, np.asarray([source_key(e) for e in examples]))
        win = self._windows(features, examples)
        self.window_model_ = None if win is None else self._logistic(*win)
        self.names_ = tuple(features[0].names)
        self.model_key_ = model_key
        mode = self.config.response
        aurocs: dict[str, float | None] = {}
        if mode == "auto":
            mode = "answer"
            if self.window_model_ is not None and validation is not None and validation[0]:
                y_val = response_labels(validation[1])
                for m in ("answer", "windows"):
                    self.response_mode_ = m
                    s = [self._scores(f)[0] for f in validation[0]]
                    aurocs[m] = auroc_or_none(y_val, np.asarray(s))
                a, w = aurocs["answer"], aurocs["windows"]
                if a is not None and w is not None and w > a:
                    mode = "windows"
        elif mode == "windows" and self.window_model_ is None:
            raise DataError(
                "lookback_lens: response='windows' needs answers with token labels (gold "
                "spans) to learn the window model from"
            )
        self.response_mode_ = mode
        self.train_info_ = {
            "n_train": len(features),
            "n_hallucinated": int(y.sum()),
            "n_windows": 0 if win is None else int(len(win[1])),
            "n_positive_windows": 0 if win is None else int(win[1].sum()),
            "response": mode,
            "validation_auroc": aurocs,
        }
        return self

    def _scores(self, features: Features) -> tuple[float, np.ndarray]:
        """The answer score and the token scores of one answer."""
        assert self.answer_model_ is not None
        tokens = features.tokens if features.tokens is not None else np.zeros((0, 0))
        per_window = self.window_model_ or self.answer_model_
        means, bounds = window_means(tokens, self.config.window, 1)
        t = tokens.shape[0]
        token_scores = np.zeros(t, dtype=np.float32)
        if len(means):
            probs = per_window.predict_proba(means)
            total, count = np.zeros(t), np.zeros(t)
            for p, (a, b) in zip(probs, bounds, strict=True):
                total[a:b] += p
                count[a:b] += 1
            token_scores = (total / np.maximum(count, 1)).astype(np.float32)
            token_scores = window_probs(token_scores, self.config.token_window)
        if self.response_mode_ == "windows" and len(means):
            score = float(per_window.predict_proba(means).max())
        else:
            score = float(self.answer_model_.predict_proba(features.response[None, :])[0])
        return score, token_scores

    def predict(self, features: Features) -> Verdict:
        require_fitted(self, "answer_model_", self.name)
        assert self.answer_model_ is not None
        check_features(self.name, features, self.model_key_, self.names_)
        score, token_scores = self._scores(features)
        contrib = self.answer_model_.contributions(features.response)
        top = np.argsort(-np.abs(contrib))[:10]
        return thresholded_verdict(
            self,
            features,
            score,
            token_scores=token_scores,
            explanation={features.names[i]: float(contrib[i]) for i in top},
        )

    # -- artifacts -----------------------------------------------------------------

    def fitted_state(self) -> tuple[dict[str, Any], Writers]:
        assert self.answer_model_ is not None
        return {
            "names": list(self.names_),
            "answer": self.answer_model_.to_json(),
            "window": self.window_model_.to_json() if self.window_model_ else None,
            "response": self.response_mode_,
        }, {}

    def restore_state(self, folder: Path, w: Mapping[str, Any], cfg: Mapping[str, Any]) -> None:
        self.names_ = tuple(str(n) for n in w["names"])
        self.answer_model_ = LogisticCalibrator.from_json(w["answer"])
        self.window_model_ = LogisticCalibrator.from_json(w["window"]) if w.get("window") else None
        if w["response"] not in ("answer", "windows"):
            raise ValueError(f"response mode {w['response']!r} is not answer or windows")
        self.response_mode_ = w["response"]
        width = len(self.names_)
        for m in (self.answer_model_, self.window_model_):
            if m is not None:
                assert m.coef_ is not None  # from_json sets it
                if m.coef_.shape != (width,):
                    raise ValueError(f"a model reads {m.coef_.shape} inputs, not {width}")
