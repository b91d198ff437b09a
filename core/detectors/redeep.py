"""ReDeEP (Sun et al., ICLR 2025): copying heads that fail, FFNs that take over.

Two detectors (``specs/redeep.md``):

- ``redeep_token``: per response token, the External Context Score of each of
  the model's top copying heads (:mod:`core.signals.copying_heads`) and the Parametric
  Knowledge Score of every layer (:func:`core.signals.lens.pks_from_trace`).
- ``redeep_chunk``: the same per response chunk (recursive 512/20 split),
  ECS from sentence embeddings of the chunk and the context chunk the head
  attends to most, PKS averaged over the chunk's tokens.

Learning (on the training split only; the public code selected on test):
heads are ranked by ``AUC(1 - label, ECS)``, layers by ``AUC(label, PKS)``;
the top ``N`` heads and ``K`` layers are summed per unit (token or chunk),
each sum min-max scaled with the training units' range, and
``H = PKS_n - beta * ECS_n``; ``N``, ``K`` and ``beta`` maximise the AUROC of
the response score (mean ``H`` over units) on the validation split. Two
scorers turn ``H`` into a probability and are both fitted: ``rule`` (a
logistic calibration of ``H`` alone, the paper's rule) and ``logistic`` (a
logistic regression on the two scaled sums); the config's ``scorer`` picks
the one the verdict reports, the other stays in the explanation.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, ClassVar, Literal, Self

import numpy as np

from core.base.errors import DataError, ModelError
from core.base.examples import RAGExample, source_key
from core.detectors.common import (
    FittedDetector,
    Writers,
    head_name,
    layer_name,
    parse_head,
    shared_pks,
)
from core.engine.model import LoadedModel, ModelInfo
from core.engine.trace import Needs
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
from core.learning.learners import LogisticCalibrator, grouped_logistic
from core.signals.chunking import ChunkSet, chunk_example
from core.signals.copying_heads import CopyingConfig, copying_scores
from core.signals.ecs import chunk_ecs, chunk_means, ecs_needs, token_ecs
from core.signals.lens import pks_needs

Scorer = Literal["rule", "logistic", "probe"]

PROBE_C_GRID: tuple[float, ...] = (0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1.0)
"""Strengths of the ``probe`` scorer's logistic regression, chosen by grouped CV log loss."""


@dataclass(frozen=True, kw_only=True)
class RedeepConfig(DetectorConfig):
    """Options shared by both ReDeEP detectors.

    Attributes:
        n_copy_heads: Candidate heads: the top copying heads (default 32, or
            every head when the model has fewer).
        copying_mode: ``"exact"`` (OV eigenvalues) or ``"paper"`` (trace +
            Gershgorin outliers), see :mod:`core.signals.copying_heads`.
        topk_frac: Share of context positions averaged by token-level ECS.
        ecs_scope: ``"passages"`` (ragscope) or ``"prompt"`` (public code).
        pks_final_norm: Apply LN_f in the PKS lens (False: InterpDetect's code).
        heads_grid, layers_grid, beta_grid: Selection grids for N, K, beta.
        scorer: Which fitted scorer gives the verdict's score: ``rule`` (the paper's
            ``H``), ``logistic`` (the two selected sums) or ``probe`` (not in the paper:
            a standardised L2 logistic regression over every candidate head's ECS and
            every layer's PKS, strength by source-grouped cross-validated log loss;
            per unit, the same regression on the unit's row). ``probe`` is fitted only
            when chosen.
    """

    FIT_ONLY: ClassVar[frozenset[str]] = frozenset(
        {"heads_grid", "layers_grid", "beta_grid", "scorer"}
    )

    n_copy_heads: int = 32
    copying_mode: Literal["exact", "paper"] = "exact"
    topk_frac: float = 0.1
    ecs_scope: Literal["passages", "prompt"] = "passages"
    pks_final_norm: bool = True
    heads_grid: tuple[int, ...] = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)
    layers_grid: tuple[int, ...] = (1, 2, 3, 4, 6, 8, 10, 15, 20, 30)
    beta_grid: tuple[float, ...] = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8, 1.0, 1.5, 2.0)
    scorer: Scorer = "rule"

    def __post_init__(self) -> None:
        if self.n_copy_heads < 1:
            raise ValueError(f"n_copy_heads must be >= 1, got {self.n_copy_heads}")
        if self.scorer not in ("rule", "logistic", "probe"):
            raise ValueError(f"scorer must be rule, logistic or probe, got {self.scorer!r}")
        for name in ("heads_grid", "layers_grid", "beta_grid"):
            if not getattr(self, name):
                raise ValueError(f"{name} is empty")


@dataclass(frozen=True, kw_only=True)
class RedeepTokenConfig(RedeepConfig):
    """Token-level ReDeEP (no extra options)."""


@dataclass(frozen=True, kw_only=True)
class RedeepChunkConfig(RedeepConfig):
    """Chunk-level ReDeEP.

    Attributes:
        chunk_size, chunk_overlap: Recursive character splitter settings.
        pool: Attention pooling over a chunk pair (``mean``: paper, ``sum``: code).
        embedder: ``minilm`` (all-MiniLM-L6-v2) or ``model`` (mean final hidden state).
    """

    chunk_size: int = 512
    chunk_overlap: int = 20
    pool: Literal["mean", "sum"] = "mean"
    embedder: Literal["minilm", "model"] = "minilm"


def copying_heads(model: LoadedModel, n: int, mode: str) -> list[tuple[int, int]]:
    """The model's top ``n`` copying heads (cached per model and mode)."""

    return copying_scores(model, CopyingConfig(mode=mode)).top_heads(  # type: ignore[arg-type]  # the config checks the mode
        min(n, model.info.n_layers * model.info.n_heads)
    )


def _auc(y: np.ndarray, s: np.ndarray) -> float:
    from sklearn.metrics import roc_auc_score

    if len(set(y.tolist())) < 2 or not np.isfinite(s).all() or np.ptp(s) == 0:
        return 0.5
    return float(roc_auc_score(y, s))


@dataclass(frozen=True, kw_only=True)
class Selection:
    """What ReDeEP learned: the heads and layers it sums, their scaling and beta.

    Attributes:
        heads: Column indices of the selected ECS features, best first.
        layers: Column indices of the selected PKS features, best first.
        beta: Weight of the ECS term.
        ecs_range, pks_range: Training units' ``(min, max)`` of the two sums.
        auc: Validation AUROC of the chosen rule.
    """

    heads: tuple[int, ...]
    layers: tuple[int, ...]
    beta: float
    ecs_range: tuple[float, float]
    pks_range: tuple[float, float]
    auc: float

    def sums(self, ecs: np.ndarray, pks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Scaled ``(ECS_n, PKS_n)`` of ``[n, heads]`` / ``[n, layers]`` rows."""
        e = ecs[:, list(self.heads)].sum(1)
        p = pks[:, list(self.layers)].sum(1)
        return _scale(e, self.ecs_range), _scale(p, self.pks_range)

    def h(self, ecs: np.ndarray, pks: np.ndarray) -> np.ndarray:
        e, p = self.sums(ecs, pks)
        return p - self.beta * e


def _scale(v: np.ndarray, r: tuple[float, float]) -> np.ndarray:
    lo, hi = r
    return (v - lo) / (hi - lo) if hi > lo else v - lo


class RedeepDetector(FittedDetector):
    """Shared features / selection / scoring of the two ReDeEP detectors."""

    gives_token_scores: ClassVar[bool] = True

    name: ClassVar[str]
    reads_heads: ClassVar[bool] = True
    Config: ClassVar[type[RedeepConfig]]
    level: ClassVar[Literal["token", "chunk"]]
    fitted_attr = "selection_"

    def __init__(self, config: RedeepConfig | None = None) -> None:
        self.config: RedeepConfig = config or self.Config()
        self.model_key_: str | None = None
        self.names_: tuple[str, ...] | None = None
        self.selection_: Selection | None = None
        self.rule_: LogisticCalibrator | None = None
        self.logistic_: LogisticCalibrator | None = None
        self.probe_: LogisticCalibrator | None = None
        self.head_auc_: dict[str, float] = {}
        self.layer_auc_: dict[str, float] = {}
        self.threshold_: float = 0.5
        self.train_info_: dict[str, Any] = {}

    # -- features ---------------------------------------------------------------

    def needs(self, model: ModelInfo) -> Needs:

        c = self.config
        hidden = self.level == "chunk" and getattr(c, "embedder", "minilm") == "model"
        return ecs_needs(model.n_layers, scope=c.ecs_scope, hidden_at_response=hidden) | pks_needs(
            model.n_layers
        )

    def _names(self, heads: Sequence[tuple[int, int]], n_layers: int) -> tuple[str, ...]:
        return tuple(head_name(*h) for h in heads) + tuple(layer_name(i) for i in range(n_layers))

    def features(self, run: Run) -> Features:
        if run.trace is None:
            raise ModelError(f"{self.name} needs a trace (attention patterns, residual stream)")
        model = run.require_model(self.name)
        c = self.config
        heads = copying_heads(model, c.n_copy_heads, c.copying_mode)
        names = self._names(heads, model.info.n_layers)
        pks = shared_pks(run, model, final_norm=c.pks_final_norm)  # [L, T]
        common: dict[str, Any] = {
            "detector": self.name,
            "example_id": run.example.id,
            "model": model.info.key,
            "names": names,
        }
        if self.level == "token":
            ecs = token_ecs(run.trace, heads, topk_frac=c.topk_frac, scope=c.ecs_scope)
            tokens = np.concatenate([ecs, pks.T], axis=1)
            return Features(
                **common,
                response=tokens.mean(0),
                token_names=names,
                tokens=tokens,
                token_offsets=run.layout.response_offsets,
            )
        chunks = self._chunks(run)
        chunk_rows = self._chunk_rows(run, chunks, heads, pks)
        return Features(
            **common,
            response=chunk_rows.mean(0),
            token_offsets=run.layout.response_offsets,
            chunk_names=names,
            chunks=chunk_rows,
            chunk_offsets=chunks.response_offsets,
        )

    def _chunk_config(self) -> RedeepChunkConfig:
        """The chunk-level options (only the chunk detector reads chunks)."""
        if not isinstance(self.config, RedeepChunkConfig):
            raise TypeError(f"{self.name} has no chunk options")
        return self.config

    def _chunks(self, run: Run) -> ChunkSet:
        c = self._chunk_config()
        return chunk_example(
            run.layout, "recursive", chunk_size=c.chunk_size, chunk_overlap=c.chunk_overlap
        )

    def _chunk_rows(
        self, run: Run, chunks: ChunkSet, heads: Sequence[tuple[int, int]], pks: np.ndarray
    ) -> np.ndarray:

        assert run.trace is not None
        c = self._chunk_config()
        layers = sorted({h[0] for h in heads})
        ce = chunk_ecs(run.trace, chunks, layers, pool=c.pool, embedder=c.embedder)
        li = {ly: i for i, ly in enumerate(layers)}
        ecs = np.stack([ce.ecs[:, li[ly], h] for ly, h in heads], axis=1)  # [R, N]
        return np.concatenate([ecs, chunk_means(pks, chunks)], axis=1)

    # -- learning ---------------------------------------------------------------

    def _units(self, f: Features) -> np.ndarray:
        u = f.tokens if self.level == "token" else f.chunks
        if u is None or u.shape[0] == 0:
            return f.response[None, :]
        return u

    def _split(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        assert self.names_ is not None
        n_heads = sum(1 for n in self.names_ if n.startswith("ECS_"))
        return x[:, :n_heads], x[:, n_heads:]

    def _check(self, features: Sequence[Features]) -> None:
        if not features:
            raise DataError(f"{self.name}: no features to learn from")
        names = {f.names for f in features}
        models = {f.model for f in features}
        if len(names) != 1 or len(models) != 1:
            raise ModelError(
                f"{self.name}: features come from different models or configs; train on one"
            )

    def pinned(self) -> Mapping[str, Any]:
        """N, K and beta as chosen on validation (the heads and layers are re-ranked on
        each refit's own answers, as the paper ranks them on its training data)."""
        require_fitted(self, "selection_", self.name)
        assert self.selection_ is not None
        sel = self.selection_
        return {
            "heads_grid": (len(sel.heads),),
            "layers_grid": (len(sel.layers),),
            "beta_grid": (sel.beta,),
        }

    def fit(
        self,
        features: Sequence[Features],
        examples: Sequence[RAGExample],
        *,
        validation: tuple[Sequence[Features], Sequence[RAGExample]] | None = None,
    ) -> Self:
        """Rank heads and layers on ``features``, choose N, K, beta on ``validation``."""

        check_fit_inputs(self.name, features, examples)
        self._check(features)
        self.names_ = features[0].names
        self.model_key_ = features[0].model
        y = response_labels(examples)
        ecs, pks = self._split(np.stack([f.response for f in features]).astype(np.float64))
        units_e, units_p = self._split(
            np.concatenate([self._units(f) for f in features]).astype(np.float64)
        )
        head_auc = np.asarray([_auc(1 - y, ecs[:, i]) for i in range(ecs.shape[1])])
        layer_auc = np.asarray([_auc(y, pks[:, i]) for i in range(pks.shape[1])])
        head_order = np.argsort(-head_auc, kind="stable")
        layer_order = np.argsort(-layer_auc, kind="stable")
        hn, ln = self._split(np.asarray(self.names_)[None, :])
        self.head_auc_ = {str(n): float(a) for n, a in zip(hn[0], head_auc, strict=True)}
        self.layer_auc_ = {str(n): float(a) for n, a in zip(ln[0], layer_auc, strict=True)}

        if validation is not None and len(validation[0]):
            self._check([*features[:1], *validation[0]])
            v_ecs, v_pks = self._split(
                np.stack([f.response for f in validation[0]]).astype(np.float64)
            )
            v_y = response_labels(validation[1])
            on = "validation"
        else:
            v_ecs, v_pks, v_y, on = ecs, pks, y, "train"
        c = self.config
        best: Selection | None = None
        grid = itertools.product(
            sorted({min(n, ecs.shape[1]) for n in c.heads_grid}),
            sorted({min(k, pks.shape[1]) for k in c.layers_grid}),
            c.beta_grid,
        )
        # The unit sums depend on N (heads) or K (layers) alone: one pass over the units
        # per value, not per (N, K, beta) grid point.
        e_range: dict[int, tuple[float, float]] = {}
        p_range: dict[int, tuple[float, float]] = {}
        for n, k, beta in grid:
            if n not in e_range:
                e_range[n] = _range(units_e[:, head_order[:n]].sum(1))
            if k not in p_range:
                p_range[k] = _range(units_p[:, layer_order[:k]].sum(1))
            sel = Selection(
                heads=tuple(int(i) for i in head_order[:n]),
                layers=tuple(int(i) for i in layer_order[:k]),
                beta=float(beta),
                ecs_range=e_range[n],
                pks_range=p_range[k],
                auc=0.0,
            )
            auc = _auc(v_y, sel.h(v_ecs, v_pks))
            if best is None or auc > best.auc + 1e-12:
                best = replace(sel, auc=auc)
        assert best is not None
        self.selection_ = best
        e_n, p_n = best.sums(ecs, pks)
        self.rule_ = LogisticCalibrator().fit((p_n - best.beta * e_n)[:, None], y)
        self.logistic_ = LogisticCalibrator().fit(np.stack([e_n, p_n], 1), y)
        v_e, v_p = best.sums(v_ecs, v_pks)
        self.probe_ = None
        probe_info: dict[str, Any] = {}
        if c.scorer == "probe":
            X = np.concatenate([ecs, pks], axis=1)
            self.probe_, cv_score = grouped_logistic(
                X, y, PROBE_C_GRID, groups=np.asarray([source_key(e) for e in examples])
            )
            probe_info = {
                "probe_C": self.probe_.C,
                "probe_cv_log_loss": -cv_score,
                "auc_probe": _auc(
                    v_y, self.probe_.predict_proba(np.concatenate([v_ecs, v_pks], axis=1))
                ),
            }
        self.train_info_ = {
            "n_train": len(features),
            "n_hallucinated": int(y.sum()),
            "selected_on": on,
            "auc_rule": best.auc,
            "auc_logistic": _auc(v_y, self.logistic_.predict_proba(np.stack([v_e, v_p], 1))),
            **probe_info,
        }
        return self

    # -- scoring ----------------------------------------------------------------

    def unit_h(self, rows: np.ndarray) -> np.ndarray:
        """``H`` of ``[n, features]`` rows (tokens, chunks or responses)."""
        require_fitted(self, "selection_", self.name)
        assert self.selection_ is not None
        e, p = self._split(np.asarray(rows, dtype=np.float64))
        return self.selection_.h(e, p)

    def probability(
        self, h: np.ndarray, ecs_n: np.ndarray, pks_n: np.ndarray, rows: np.ndarray | None = None
    ) -> np.ndarray:
        """The configured scorer's probability for ``H`` (rule), the two sums (logistic)
        or the units' full rows (probe)."""
        assert self.rule_ is not None and self.logistic_ is not None
        if self.config.scorer == "probe":
            if self.probe_ is None or rows is None:
                raise ModelError(f"{self.name}: the probe scorer is not fitted; retrain")
            return self.probe_.predict_proba(rows)
        if self.config.scorer == "logistic":
            return self.logistic_.predict_proba(np.stack([ecs_n, pks_n], 1))
        return self.rule_.predict_proba(np.asarray(h)[:, None])

    @property
    def selected_heads(self) -> list[tuple[int, int]]:
        """The ``(layer, head)`` pairs the rule sums."""
        require_fitted(self, "selection_", self.name)
        assert self.selection_ is not None and self.names_ is not None
        return [parse_head(self.names_[i]) for i in self.selection_.heads]

    @property
    def selected_layers(self) -> list[int]:
        """The layers whose PKS the rule sums."""
        require_fitted(self, "selection_", self.name)
        assert self.selection_ is not None and self.names_ is not None
        n_heads = sum(1 for n in self.names_ if n.startswith("ECS_"))
        return [int(self.names_[n_heads + i].removeprefix("PKS_L")) for i in self.selection_.layers]

    def predict(self, features: Features) -> Verdict:
        require_fitted(self, "selection_", self.name)
        assert self.selection_ is not None and self.rule_ is not None and self.logistic_ is not None
        check_features(self.name, features, self.model_key_, self.names_)
        sel = self.selection_
        units = self._units(features).astype(np.float64)
        ue, up = self._split(units)
        u_e, u_p = sel.sums(ue, up)
        u_h = u_p - sel.beta * u_e
        resp_e, resp_p = float(u_e.mean()), float(u_p.mean())
        resp_h = resp_p - sel.beta * resp_e
        rule = float(self.rule_.predict_proba(np.asarray([[resp_h]]))[0])
        logistic = float(self.logistic_.predict_proba(np.asarray([[resp_e, resp_p]]))[0])
        score = logistic if self.config.scorer == "logistic" else rule
        probe = None
        if self.config.scorer == "probe":
            probe = float(self.probability(u_h, u_e, u_p, units.mean(0)[None, :])[0])
            score = probe
        unit_p = self.probability(u_h, u_e, u_p, units).astype(np.float32)
        token_scores = chunk_scores = None
        if self.level == "token":
            token_scores = unit_p
        elif features.chunks is not None and features.chunk_offsets is not None:
            chunk_scores = unit_p
            token_scores = tokens_from_chunks(
                unit_p, features.chunk_offsets, features.token_offsets
            )
        explanation = {
            "H": resp_h,
            "ECS_n": resp_e,
            "PKS_n": resp_p,
            "beta": sel.beta,
            "rule_score": rule,
            "logistic_score": logistic,
        }
        if probe is not None:
            explanation["probe_score"] = probe
        names = features.names
        means = units.mean(0)
        for i in sel.heads:
            explanation[names[i]] = float(means[i])
        n_heads = ue.shape[1]
        for i in sel.layers:
            explanation[names[n_heads + i]] = float(means[n_heads + i])
        return thresholded_verdict(
            self,
            features,
            score,
            token_scores=token_scores,
            chunk_scores=chunk_scores,
            explanation=explanation,
        )

    # -- artifacts --------------------------------------------------------------

    def fitted_state(self) -> tuple[dict[str, Any], Writers]:
        assert self.selection_ is not None and self.rule_ and self.logistic_
        sel = self.selection_
        return {
            "names": list(self.names_ or ()),
            "selection": {
                "heads": list(sel.heads),
                "layers": list(sel.layers),
                "beta": sel.beta,
                "ecs_range": list(sel.ecs_range),
                "pks_range": list(sel.pks_range),
                "auc": sel.auc,
            },
            "rule": self.rule_.to_json(),
            "logistic": self.logistic_.to_json(),
            **({"probe": self.probe_.to_json()} if self.probe_ is not None else {}),
            "head_auc": self.head_auc_,
            "layer_auc": self.layer_auc_,
        }, {}

    def restore_state(self, folder: Path, w: Mapping[str, Any], cfg: Mapping[str, Any]) -> None:
        s = w["selection"]
        self.selection_ = Selection(
            heads=tuple(int(i) for i in s["heads"]),
            layers=tuple(int(i) for i in s["layers"]),
            beta=float(s["beta"]),
            ecs_range=(float(s["ecs_range"][0]), float(s["ecs_range"][1])),
            pks_range=(float(s["pks_range"][0]), float(s["pks_range"][1])),
            auc=float(s["auc"]),
        )
        self.names_ = tuple(str(n) for n in w["names"])
        self.rule_ = LogisticCalibrator.from_json(w["rule"])
        self.logistic_ = LogisticCalibrator.from_json(w["logistic"])
        self.probe_ = LogisticCalibrator.from_json(w["probe"]) if "probe" in w else None
        if self.probe_ is not None and self.probe_.coef_ is not None:
            if self.probe_.coef_.shape[0] != len(w["names"]):
                raise ValueError("the probe's width differs from the feature names")
        self.head_auc_ = {str(k): float(v) for k, v in w.get("head_auc", {}).items()}
        self.layer_auc_ = {str(k): float(v) for k, v in w.get("layer_auc", {}).items()}
        n = len(self.names_)
        picked = (*self.selection_.heads, *self.selection_.layers)
        if max(picked, default=0) >= n or min(picked, default=0) < 0:
            raise ValueError("selected columns outside the feature names")


def _range(v: np.ndarray) -> tuple[float, float]:
    return (float(v.min()), float(v.max())) if v.size else (0.0, 1.0)


class RedeepTokenDetector(RedeepDetector):
    """ReDeEP, token level: ECS of the copying heads and PKS of every layer, per token."""

    name = "redeep_token"
    explained_on: ClassVar[frozenset[PageRole]] = frozenset({"head-tokens"})
    Config = RedeepTokenConfig
    level = "token"


class RedeepChunkDetector(RedeepDetector):
    """ReDeEP, chunk level: ECS~ from chunk embeddings and PKS~ per response chunk."""

    name = "redeep_chunk"
    explained_on: ClassVar[frozenset[PageRole]] = frozenset({"head-chunks"})
    Config = RedeepChunkConfig
    level = "chunk"
