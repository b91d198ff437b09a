"""Baseline detectors: the floor every interpretability detector must beat.

- ``nll``: surprisal of the answer's tokens given the context (mean, max, p90).
- ``context_gain``: per token, surprisal without the passages minus with them;
  a token the context does not make more likely is ungrounded.
- ``lexical``: share of the answer's content words (NOUN / PROPN / NUM, by
  spaCy) that appear nowhere in the passages.

Each calibrates its response features with a class-balanced logistic
regression; token scores come from a token-level logistic fit when training
data has span labels, otherwise from a standardised sigmoid of the token signal.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Self

import numpy as np

from core.base.errors import ModelError
from core.base.examples import RAGExample
from core.detectors.common import FittedDetector, Writers, token_training_set
from core.engine.model import ModelInfo
from core.engine.trace import Needs, token_surprisal
from core.learning.contract import (
    DetectorConfig,
    ExplanationKind,
    Features,
    Run,
    Verdict,
    check_features,
    check_fit_inputs,
    require_fitted,
    thresholded_verdict,
)
from core.learning.labels import response_labels
from core.learning.learners import LogisticCalibrator
from core.signals.pos import spacy_pipeline


class CalibratedDetector(FittedDetector):
    """Shared fit / predict / save / load for detectors with a logistic head.

    Subclasses set ``name``, ``Config``, ``token_direction`` (+1 when a larger
    token value means more likely hallucinated) and implement ``needs`` and
    ``features``.
    """

    name: ClassVar[str]
    Config: ClassVar[type[DetectorConfig]]
    token_direction: ClassVar[int] = 1
    fitted_attr = "response_model_"

    def __init__(self, config: DetectorConfig | None = None) -> None:
        self.config = config or self.Config()
        self.response_model_: LogisticCalibrator | None = None
        self.token_model_: LogisticCalibrator | None = None
        self.token_stats_: tuple[float, float] | None = None
        self.model_key_: str | None = None
        self.threshold_: float = 0.5
        self.train_info_: dict[str, Any] = {}

    # -- learning ---------------------------------------------------------------

    def fit(self, features: Sequence[Features], examples: Sequence[RAGExample]) -> Self:
        model_key = check_fit_inputs(self.name, features, examples)
        y = response_labels(examples)
        X = np.stack([f.response for f in features])
        self.response_model_ = LogisticCalibrator().fit(X, y)
        self.model_key_ = model_key
        _, tok_X, tok_y = token_training_set(features, examples)
        if tok_y and len(set(np.concatenate(tok_y).tolist())) == 2:
            self.token_model_ = LogisticCalibrator().fit(
                np.concatenate(tok_X), np.concatenate(tok_y)
            )
        all_tok = [f.tokens[:, 0] for f in features if f.tokens is not None and f.tokens.size]
        if all_tok:
            v = np.concatenate(all_tok)
            self.token_stats_ = (float(v.mean()), float(v.std() or 1.0))
        self.train_info_ = {"n_train": len(features), "n_hallucinated": int(y.sum())}
        return self

    def predict(self, features: Features) -> Verdict:
        require_fitted(self, "response_model_", self.name)
        assert self.response_model_ is not None
        check_features(self.name, features, self.model_key_)
        x = features.response[None, :]
        score = float(self.response_model_.predict_proba(x)[0])
        contrib = self.response_model_.contributions(features.response)
        token_scores = None
        if features.tokens is not None:
            if self.token_model_ is not None:
                token_scores = self.token_model_.predict_proba(features.tokens)
            elif self.token_stats_ is not None:
                mu, sd = self.token_stats_
                z = self.token_direction * (features.tokens[:, 0] - mu) / sd
                token_scores = 1.0 / (1.0 + np.exp(-z))
        return thresholded_verdict(
            self,
            features,
            score,
            token_scores=None if token_scores is None else token_scores.astype(np.float32),
            token_offsets=features.token_offsets,
            explanation={n: float(c) for n, c in zip(features.names, contrib, strict=True)},
        )

    # -- artifacts --------------------------------------------------------------

    def fitted_state(self) -> tuple[dict[str, Any], Writers]:
        assert self.response_model_ is not None
        return {
            "response": self.response_model_.to_json(),
            "token": self.token_model_.to_json() if self.token_model_ else None,
            "token_stats": list(self.token_stats_) if self.token_stats_ else None,
        }, {}

    def restore_state(self, folder: Path, w: Mapping[str, Any], cfg: Mapping[str, Any]) -> None:
        self.response_model_ = LogisticCalibrator.from_json(w["response"])
        self.token_model_ = LogisticCalibrator.from_json(w["token"]) if w.get("token") else None
        self.token_stats_ = tuple(w["token_stats"]) if w.get("token_stats") else None


def _surprisal_features(s: np.ndarray) -> np.ndarray:
    return np.asarray([s.mean(), s.max(), np.percentile(s, 90)], dtype=np.float32)


# ----------------------------------------------------------------------------- nll


@dataclass(frozen=True, kw_only=True)
class NLLConfig(DetectorConfig):
    """No options: surprisal in bits of each answer token given the context."""


class NLLDetector(CalibratedDetector):
    """Mean / max / p90 surprisal of the answer given the context."""

    gives_token_scores: ClassVar[bool] = True

    name = "nll"
    trained_by_default: ClassVar[bool] = True
    explanation_kind: ClassVar[ExplanationKind] = "contributions"
    Config = NLLConfig
    token_direction = 1

    def needs(self, model: ModelInfo) -> Needs:
        return Needs.of(["logits"], positions="generation")

    def features(self, run: Run) -> Features:
        if run.trace is None:
            raise ModelError("nll needs a trace with logits at the generation positions")
        s = token_surprisal(run.trace)
        return Features(
            detector=self.name,
            example_id=run.example.id,
            model=run.model.key,
            names=("surprisal_mean", "surprisal_max", "surprisal_p90"),
            response=_surprisal_features(s),
            token_names=("surprisal",),
            tokens=s[:, None],
            token_offsets=run.layout.response_offsets,
        )


# ----------------------------------------------------------------------------- context gain


@dataclass(frozen=True, kw_only=True)
class ContextGainConfig(DetectorConfig):
    """No options: gain = surprisal without passages - surprisal with them (bits)."""


class ContextGainDetector(CalibratedDetector):
    """How much the passages make each answer token more likely; low gain = ungrounded."""

    gives_token_scores: ClassVar[bool] = True

    name = "context_gain"
    trained_by_default: ClassVar[bool] = True
    explanation_kind: ClassVar[ExplanationKind] = "contributions"
    Config = ContextGainConfig
    needs_bare = True
    token_direction = -1

    def needs(self, model: ModelInfo) -> Needs:
        return Needs.of(["logits"], positions="generation")

    def features(self, run: Run) -> Features:
        if run.trace is None or run.bare is None:
            raise ModelError("context_gain needs traces with and without the passages")
        gain = token_surprisal(run.bare) - token_surprisal(run.trace)
        return Features(
            detector=self.name,
            example_id=run.example.id,
            model=run.model.key,
            names=("gain_mean", "gain_min", "gain_p10", "share_negative_gain"),
            response=np.asarray(
                [gain.mean(), gain.min(), np.percentile(gain, 10), (gain < 0).mean()],
                dtype=np.float32,
            ),
            token_names=("gain",),
            tokens=gain[:, None],
            token_offsets=run.layout.response_offsets,
        )


# ----------------------------------------------------------------------------- lexical

CONTENT_POS = frozenset({"NOUN", "PROPN", "NUM"})


def _norm(word: str) -> str:
    w = word.lower().strip()
    return re.sub(r"(?<=\d)[,\u202f](?=\d{3})", "", w)


@dataclass(frozen=True, kw_only=True)
class LexicalConfig(DetectorConfig):
    """Which parts of speech count as content words."""

    pos: tuple[str, ...] = ("NOUN", "PROPN", "NUM")


class LexicalDetector(CalibratedDetector):
    """Share of the answer's content words that the passages never mention."""

    gives_token_scores: ClassVar[bool] = True

    name = "lexical"
    trained_by_default: ClassVar[bool] = True
    explanation_kind: ClassVar[ExplanationKind] = "contributions"
    reads_text_only: ClassVar[bool] = True
    Config = LexicalConfig
    config: LexicalConfig
    token_direction = 1

    def needs(self, model: ModelInfo) -> Needs | None:
        return None

    def features(self, run: Run) -> Features:
        nlp = spacy_pipeline()
        pos = set(self.config.pos)
        known: set[str] = set()
        for doc in nlp.pipe(run.example.passages):
            for t in doc:
                known.add(_norm(t.text))
                known.add(_norm(t.lemma_))
        resp = nlp(run.example.response)
        content = [t for t in resp if t.pos_ in pos and not t.is_punct and t.text.strip()]
        absent = [t for t in content if _norm(t.text) not in known and _norm(t.lemma_) not in known]
        offsets = run.layout.response_offsets
        flag = np.zeros(offsets.shape[0], dtype=np.float32)
        for t in absent:
            a, b = t.idx, t.idx + len(t.text)
            flag[(offsets[:, 0] < b) & (a < offsets[:, 1])] = 1.0
        n_content = len(content)
        return Features(
            detector=self.name,
            example_id=run.example.id,
            model=run.model.key,
            names=("share_absent", "n_absent", "n_content"),
            response=np.asarray(
                [len(absent) / n_content if n_content else 0.0, len(absent), n_content],
                dtype=np.float32,
            ),
            token_names=("absent_content_word",),
            tokens=flag[:, None],
            token_offsets=offsets,
        )
