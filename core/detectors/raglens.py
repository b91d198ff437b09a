"""RAGLens (Xiong et al., ICLR 2026): SAE features of the answer -> MI selection -> EBM.

Features (``specs/raglens.md``): the residual stream after the SAE's block at
every response token's own position ``p_j``, encoded by the SAE
(:mod:`core.signals.sae`; ``activation="pre"`` pools the ReLU of the encoder
pre-activations before the top-k cut, as the RAGLens public code did;
``"post"`` the SAE's sparse TopK output), max-pooled over the answer:
``zbar_k = max_j z_jk``, one response feature ``F<k>`` per SAE feature
(zeros for an empty answer).

Learning: mutual information of every pooled feature with the label
(:func:`core.learning.mi.mutual_information`, 50 bins, quantile thresholds by default),
the top ``top_k`` features kept (the paper's K' = 1000 is scaled down for small
training sets), and an :class:`interpret.glassbox.ExplainableBoostingClassifier`
with the spec's parameters (no interactions, 32 bins, 10% validation, up to
1000 rounds, tolerance 1e-5, seed 0). Explanations are the EBM's exact
per-term contributions (log-odds; with ``intercept`` they sum to the margin).

The SAE is part of the feature-cache key (its weights' hash), so features
read with a retrained SAE are never mixed with older ones.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Self

import numpy as np

from core.base.errors import DataError, ModelError
from core.base.examples import RAGExample
from core.base.paths import assets_dir, shipped_sae_dir
from core.base.safeio import SkopsType, read_json_file
from core.detectors.common import FittedDetector, Writers
from core.engine.layout import render
from core.engine.model import LoadedModel, ModelInfo
from core.engine.trace import Needs, trace
from core.learning.artifact import read_skops
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
from core.learning.mi import BINNINGS, mutual_information, top_features
from core.signals.sae import ACTIVATIONS, META_FILE, SAE_JSON_LIMIT, LoadedSAE, load_sae

if TYPE_CHECKING:
    import torch

EBM_FILE = "ebm.skops"
INTERCEPT = "intercept"
SKOPS_TYPES: frozenset[SkopsType] = frozenset(
    {("ObjectNode", "interpret.glassbox._ebm._ebm", "ExplainableBoostingClassifier")}
)
"""The one class an EBM file holds (``(skops loader, module, class)``); anything else is
refused."""


def feature_name(k: int, raw: bool = False) -> str:
    """Name of SAE feature ``k`` among the response features: ``F<k>`` (``H<k>``: raw
    residual dimension ``k``)."""
    return f"H{k}" if raw else f"F{k}"


def feature_index(name: str) -> int:
    if not name.startswith("F") or not name[1:].isdigit():
        raise ValueError(f"not a RAGLens feature name: {name!r}")
    return int(name[1:])


@functools.lru_cache(maxsize=4)
def _load_sae_cached(folder: str, stamp: str) -> LoadedSAE:

    return load_sae(folder)


def sae_folder(spec: str) -> Path:
    """The SAE folder a config names (``""``: the shipped one for the embedded model)."""

    return Path(spec).expanduser() if spec else shipped_sae_dir()


def sae_stamp(folder: Path) -> str:
    """Identity of the SAE in ``folder`` for caches: its weights' hash, or its file stats."""

    meta = folder / META_FILE
    if meta.is_file():
        try:
            doc = read_json_file(meta, SAE_JSON_LIMIT, follow_symlinks=False)
        except DataError:
            doc = None  # load_sae names what is wrong with it; the stamp falls back
        digest = doc.get("weights_sha256") if isinstance(doc, dict) else None
        if isinstance(digest, str) and digest:
            return digest
    weights = folder / "sae_weights.safetensors"
    if not weights.is_file():
        raise DataError(
            "no SAE here; train one with `ragscope sae train` (or set raglens.sae to a folder)",
            source=str(folder),
        )
    st = weights.stat()
    return hashlib.sha256(f"{weights.resolve()}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()


def check_artifact_sae(spec: str, artifact: str | Path) -> None:
    """Refuse an artifact's ``raglens.sae`` that leads outside the artifact folder, the
    shipped assets and the SAE folder the operator set (``RAGSCOPE_SAE_DIR``):
    ``cfg.json`` is anyone's to edit, and must not make ragscope read any folder on the
    server. ``""`` (the shipped SAE) always passes.

    Raises:
        DataError: ``..`` in the path, or the path, with every link followed, outside.
    """
    if not spec:
        return
    roots = [Path(artifact).resolve(), assets_dir().resolve(), shipped_sae_dir().resolve()]
    real = sae_folder(spec).resolve()
    if ".." in Path(spec).parts or not any(real.is_relative_to(r) for r in roots):
        raise DataError(
            f"raglens.sae names {spec[:200]!r}, outside this artifact and the shipped assets "
            f"({assets_dir()}); an artifact may only name an SAE it holds, one ragscope "
            "ships or the one RAGSCOPE_SAE_DIR names: if you trust that folder, set "
            "RAGSCOPE_SAE_DIR to it; else retrain with `ragscope train --detectors raglens`",
            source=str(artifact),
            field="sae",
        )


def load_config_sae(spec: str) -> LoadedSAE:
    """The (cached) SAE a config names."""
    folder = sae_folder(spec)
    return _load_sae_cached(str(folder.resolve()), sae_stamp(folder))


@dataclass(frozen=True, kw_only=True, eq=False)
class RaglensAnswer:
    """One answer read by RAGLens (:meth:`RaglensDetector.explain_answer`).

    Attributes:
        verdict: The detector's verdict (explanation: per-feature log-odds contributions).
        tokens: The answer's tokens as text.
        token_offsets: ``[T, 2]`` character ranges of the tokens.
        features: The selected SAE features, in :attr:`activations` column order.
        activations: ``[T, K']`` each selected feature's activation at each answer token.
    """

    verdict: Verdict
    tokens: tuple[str, ...]
    token_offsets: np.ndarray
    features: tuple[int, ...]
    activations: np.ndarray

    def top_positive(self, n: int = 3) -> list[int]:
        """The ``n`` selected features pushing hardest towards "hallucinated" (positive only)."""
        contrib = [(k, self.verdict.explanation.get(feature_name(k), 0.0)) for k in self.features]
        pos = sorted((kv for kv in contrib if kv[1] > 0), key=lambda kv: -kv[1])
        return [k for k, _ in pos[:n]]

    def activations_of(self, feature: int) -> np.ndarray:
        """``[T]`` one selected feature's activation at each answer token."""
        return self.activations[:, self.features.index(feature)]


@dataclass(frozen=True, kw_only=True)
class RaglensConfig(DetectorConfig):
    """RAGLens options.

    Attributes:
        sae: SAE folder (``""``: the shipped SAE of the embedded model).
        activation: ``pre`` (encoder ReLU before the top-k cut; the public code) or
            ``post`` (the SAE's TopK output).
        top_k: Features kept by mutual information (K').
        bins: MI bins per feature.
        binning: ``quantile`` (paper) or ``uniform`` (public code).
        max_bins: EBM bins per feature.
        validation_size: EBM's internal validation share (early stopping).
        max_rounds: EBM boosting rounds.
        early_stopping_tolerance: EBM tolerance.
        seed: EBM random state.
        raw_layer: ``-1`` (default): SAE features. A block index: the raw residual
            stream after that block, max-pooled the same way (``H<d>`` features), with
            the same MI + EBM pipeline: the layer comparison of the spec, no SAE needed.
    """

    FIT_ONLY: ClassVar[frozenset[str]] = frozenset(
        {
            "top_k",
            "bins",
            "binning",
            "max_bins",
            "validation_size",
            "max_rounds",
            "early_stopping_tolerance",
            "seed",
        }
    )

    sae: str = ""
    activation: str = "pre"
    top_k: int = 256
    bins: int = 50
    binning: str = "quantile"
    max_bins: int = 32
    validation_size: float = 0.1
    max_rounds: int = 1000
    early_stopping_tolerance: float = 1e-5
    seed: int = 0
    raw_layer: int = -1

    def __post_init__(self) -> None:

        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {ACTIVATIONS}, got {self.activation!r}")
        if self.binning not in BINNINGS:
            raise ValueError(f"binning must be one of {BINNINGS}, got {self.binning!r}")
        if self.top_k < 1 or self.bins < 2 or self.max_bins < 2 or self.max_rounds < 1:
            raise ValueError("top_k >= 1, bins >= 2, max_bins >= 2 and max_rounds >= 1")
        if not 0.0 <= self.validation_size < 0.5:
            raise ValueError(f"validation_size must be in [0, 0.5), got {self.validation_size}")
        if self.raw_layer < -1:
            raise ValueError(f"raw_layer must be -1 (SAE) or a block index, got {self.raw_layer}")

    def feature_hash(self) -> str:
        """Options that shape the features plus the SAE's identity (its weights)."""
        base = super().feature_hash()
        if self.raw_layer >= 0:
            return base
        stamp = sae_stamp(sae_folder(self.sae))
        return hashlib.sha256(f"{base}|{stamp}".encode()).hexdigest()[:16]


class RaglensDetector(FittedDetector):
    """Max-pooled SAE features, mutual-information selection, EBM."""

    name: ClassVar[str] = "raglens"
    explained_on: ClassVar[frozenset[PageRole]] = frozenset({"sae-features"})
    explanation_kind: ClassVar[ExplanationKind] = "contributions"
    explains_sae_features: ClassVar[bool] = True
    needs_sae: ClassVar[bool] = True
    Config: ClassVar[type[RaglensConfig]] = RaglensConfig
    fitted_attr = "ebm_"

    def __init__(self, config: RaglensConfig | None = None) -> None:
        self.config: RaglensConfig = config or self.Config()
        self.ebm_: Any = None
        self.model_key_: str | None = None
        self.names_: tuple[str, ...] = ()
        self.selected_: tuple[int, ...] = ()
        self.mi_: np.ndarray | None = None
        self.threshold_: float = 0.5
        self.train_info_: dict[str, Any] = {}

    # -- features ---------------------------------------------------------------

    @property
    def sae(self) -> LoadedSAE:
        return load_config_sae(self.config.sae)

    @property
    def raw(self) -> bool:
        return self.config.raw_layer >= 0

    @property
    def layer(self) -> int:
        """The block whose residual stream is read (the SAE's, or ``raw_layer``)."""
        return self.config.raw_layer if self.config.raw_layer >= 0 else self.sae.layer

    def unavailable(self, model: ModelInfo) -> str | None:
        """Why this detector cannot read ``model`` (no SAE for it), or ``None``."""
        if self.raw:
            return None
        try:
            self.sae.check_model(model.key, model.d_model)
        except (DataError, ModelError) as e:
            return str(e)
        return None

    def needs(self, model: ModelInfo) -> Needs:

        if self.layer >= model.n_layers:
            raise ModelError(f"raglens: layer {self.layer} is outside 0..{model.n_layers - 1}")
        return Needs.of(["resid_post"], layers=[self.layer], positions="response")

    def token_activations(self, run: Run) -> torch.Tensor:
        """``[T, d_sae]`` SAE activations at the response tokens (the config's kind);
        with ``raw_layer``, the raw ``[T, d_model]`` residuals."""
        if run.trace is None:
            raise ModelError("raglens needs a trace (the residual stream at the SAE's layer)")
        if self.config.raw_layer >= 0:
            return run.trace.at("resid_post", self.layer, run.layout.response_positions)
        sae = self.sae
        sae.check_model(run.model.key, run.model.d_model)
        x = run.trace.at("resid_post", sae.layer, run.layout.response_positions)
        return sae.encode(x, self.config.activation)  # type: ignore[arg-type]  # the config checks it is one of the SAE's activations

    def features(self, run: Run) -> Features:
        z = self.token_activations(run)
        pooled = z.max(0).values.numpy() if z.shape[0] else np.zeros(z.shape[1], np.float32)
        return Features(
            detector=self.name,
            example_id=run.example.id,
            model=run.model.key,
            names=tuple(feature_name(k, self.raw) for k in range(z.shape[1])),
            response=pooled.astype(np.float32),
        )

    # -- learning ---------------------------------------------------------------

    def fit(self, features: Sequence[Features], examples: Sequence[RAGExample]) -> Self:
        """MI selection of the top ``top_k`` pooled features, then the EBM."""
        from interpret.glassbox import ExplainableBoostingClassifier

        check_fit_inputs(self.name, features, examples, same_columns=True)
        y = response_labels(examples)
        if len(set(y.tolist())) < 2:
            raise DataError(
                "raglens needs hallucinated and faithful responses in the training data"
            )
        c = self.config
        X = np.stack([f.response for f in features]).astype(np.float64)
        mi = mutual_information(X, y, bins=c.bins, binning=c.binning)  # type: ignore[arg-type]  # the config checks it is in BINNINGS
        sel = top_features(mi, c.top_k)
        names = [feature_name(int(k), self.raw) for k in sel]
        ebm = ExplainableBoostingClassifier(
            feature_names=names,
            interactions=0,
            max_bins=c.max_bins,
            validation_size=c.validation_size,
            max_rounds=c.max_rounds,
            early_stopping_tolerance=c.early_stopping_tolerance,
            random_state=c.seed,
            n_jobs=1,
        )
        ebm.fit(X[:, sel], y)
        self.ebm_ = ebm
        self.model_key_ = features[0].model
        self.names_ = features[0].names
        self.selected_ = tuple(int(k) for k in sel)
        self.mi_ = mi.astype(np.float32)
        self.train_info_ = {
            "n_train": len(y),
            "n_hallucinated": int(y.sum()),
            "n_sae_features": X.shape[1],
            "top_mi": [[feature_name(int(k), self.raw), float(mi[k])] for k in sel[:10]],
        }
        return self

    def fitted_models(self) -> Mapping[str, tuple[Any, int | None]]:
        return {EBM_FILE: (self.ebm_, len(self.selected_))}

    # -- scoring ----------------------------------------------------------------

    def _matrix(self, features: Sequence[Features]) -> np.ndarray:
        require_fitted(self, "ebm_", self.name)
        for f in features:
            check_features(self.name, f, self.model_key_, self.names_)
        X = np.stack([f.response for f in features]).astype(np.float64)
        return X[:, list(self.selected_)]

    def contributions(self, features: Sequence[Features]) -> np.ndarray:
        """``[n, K' + 1]`` per-feature log-odds contributions; last column the intercept."""
        Xs = self._matrix(features)
        terms = np.asarray(self.ebm_.eval_terms(Xs), dtype=np.float64)
        icpt = np.full((terms.shape[0], 1), float(np.ravel(self.ebm_.intercept_)[0]))
        return np.concatenate([terms, icpt], axis=1)

    def margins(self, features: Sequence[Features]) -> np.ndarray:
        return np.asarray(self.ebm_.decision_function(self._matrix(features)), dtype=np.float64)

    def predict(self, features: Features) -> Verdict:
        Xs = self._matrix([features])
        score = float(self.ebm_.predict_proba(Xs)[0, 1])
        contrib = self.contributions([features])[0]
        expl = {
            feature_name(k, self.raw): float(v)
            for k, v in zip(self.selected_, contrib[:-1], strict=True)
        }
        expl[INTERCEPT] = float(contrib[-1])
        return thresholded_verdict(
            self,
            features,
            score,
            explanation=expl,
        )

    # -- global view ------------------------------------------------------------

    def importances(self) -> list[tuple[int, float]]:
        """``(SAE feature, EBM importance)`` of the selected features, most important first."""
        require_fitted(self, "ebm_", self.name)
        imp = np.asarray(self.ebm_.term_importances(), dtype=np.float64)
        order = np.argsort(-imp, kind="stable")
        return [(self.selected_[i], float(imp[i])) for i in order]

    def shape_function(self, feature: int) -> dict[str, np.ndarray]:
        """The EBM shape function of a selected SAE feature.

        Returns:
            ``edges`` (``[b + 1]`` activation bin edges), ``scores`` (``[b]`` log-odds
            contribution per bin, zero-centred over the training data as the EBM stores
            them), ``density`` (training counts per density bin) and ``density_edges``.
        """
        require_fitted(self, "ebm_", self.name)
        if feature not in self.selected_:
            raise ValueError(f"feature {feature} is not among the selected ones")
        i = self.selected_.index(feature)
        data = self.ebm_.explain_global().data(i)
        dens = data.get("density", {})
        return {
            "edges": np.asarray(data["names"], dtype=np.float64),
            "scores": np.asarray(data["scores"], dtype=np.float64),
            "density": np.asarray(dens.get("scores", []), dtype=np.float64),
            "density_edges": np.asarray(dens.get("names", []), dtype=np.float64),
        }

    def explain_answer(self, model: LoadedModel, example: RAGExample) -> RaglensAnswer:
        """One traced pass over ``example``: its verdict and the selected features per token."""

        require_fitted(self, "ebm_", self.name)
        layout = render(example, model)
        tr = trace(model, layout, self.needs(model.info))
        run = Run(
            example=example, layout=layout, trace=tr, bare=None, model=model.info, loaded=model
        )
        z = self.token_activations(run)
        feats = self.features(run)
        return RaglensAnswer(
            verdict=self.predict(feats),
            tokens=layout.response_token_strings(),
            token_offsets=np.asarray(layout.response_offsets),
            features=self.selected_,
            activations=z[:, list(self.selected_)].numpy(),
        )

    # -- artifacts --------------------------------------------------------------

    def fitted_state(self) -> tuple[dict[str, Any], Writers]:
        import skops.io as sio

        assert self.mi_ is not None
        weights = {
            "n_features": len(self.names_),
            "selected": list(self.selected_),
            "mi": [float(v) for v in self.mi_[list(self.selected_)]],
            "sae": None if self.raw else sae_stamp(sae_folder(self.config.sae)),
            "ebm_file": EBM_FILE,
        }
        return weights, {EBM_FILE: lambda path: sio.dump(self.ebm_, path)}

    def restore_state(self, folder: Path, w: Mapping[str, Any], cfg: Mapping[str, Any]) -> None:
        if not self.raw:
            check_artifact_sae(self.config.sae, folder)
        self.ebm_ = read_skops(folder / EBM_FILE, SKOPS_TYPES, self.name)
        n = int(w["n_features"])
        self.names_ = tuple(feature_name(k, self.raw) for k in range(n))
        self.selected_ = tuple(int(k) for k in w["selected"])
        mi = np.zeros(n, dtype=np.float32)
        mi[list(self.selected_)] = np.asarray(w["mi"], dtype=np.float32)
        self.mi_ = mi

    def after_load(self, folder: Path, w: Mapping[str, Any]) -> None:
        """Refuse an artifact trained on another SAE than the one its config names."""
        stamp = w.get("sae")
        current = "" if self.raw else sae_stamp(sae_folder(self.config.sae))
        if stamp and stamp != current:
            raise ModelError(
                f"the raglens artifact in {folder} was trained on another SAE (weights "
                f"{str(stamp)[:12]}, now {current[:12]}); retrain it with "
                "`ragscope train --detectors raglens`"
            )
