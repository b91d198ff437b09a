"""CORTEX (Furumai et al.): token-level, comparative; ``specs/cortex.md``.

Features, per answer token ``i`` at its own position: two forward passes of
the SAME answer tokens, with the passages (question || passages || answer)
and without them (question || answer), same template otherwise;

- ``h_i``: output of the last block (``resid_post[L-1]``; option: after LN_f);
- ``dh_i = h_i(ref) - h_i(no-ref)``;
- contextual residual ``c_i = dh_i - sum_{j<i, j in answer} alpha_ij dh_j``,
  ``alpha_ij`` the reference pass's attention from answer token ``i`` to answer
  token ``j`` (last layer, mean over heads by default; not renormalised);
- the classifier reads ``[dh_i ; c_i]`` (``inputs="delta_residual"``) or ``dh_i``
  alone (``inputs="delta"``, the first ablation), standardised with the
  training statistics.

Both halves are always cached, so the ablations (``inputs``, ``smooth``) reuse
the same features.

Classifier: MLP ``in -> 256 -> 128 -> 1``, ReLU, dropout 0.1, AdamW (lr 1e-3,
weight decay 1e-4), batch 4096, 10 epochs, BCE with ``pos_weight`` = negative
/ positive token counts, seeded; trained on token labels from the gold spans
(faithful answers without spans count as all-faithful tokens; hallucinated
answers without spans are left out of training). The loss curve is kept in
the artifact.

Scores: raw token probabilities; with ``smooth`` (default) the token output is
label-persistence smoothed (:mod:`core.signals.smoothing`, ``p_stay`` 0.993) and the
answer score is the highest token score smoothed with ``p_stay`` 0.93;
without, the token output is raw and the answer score their maximum. With
``token_window`` > 1 (not in the spec; default 1) the token output is then averaged
over centred windows of that many tokens in logit space
(:func:`core.signals.smoothing.window_probs`); the answer score is unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Self

import numpy as np
from safetensors import SafetensorError

from core.base.errors import DataError, ModelError
from core.base.examples import RAGExample
from core.detectors.common import FittedDetector, Writers, token_training_set
from core.engine.model import ModelInfo
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
)
from core.signals.smoothing import (
    P_STAY_ANSWER,
    P_STAY_TOKEN,
    answer_score,
    check_window,
    smooth_tokens,
    window_probs,
)

if TYPE_CHECKING:
    import torch

MLP_FILE = "mlp.safetensors"
Inputs = Literal["delta", "delta_residual"]
INPUTS: tuple[Inputs, ...] = ("delta", "delta_residual")
RESPONSE_NAMES = ("dh_norm_mean", "dh_norm_max", "c_norm_mean", "c_norm_max")
MAX_HIDDEN_WIDTH = 4096
"""Widest hidden layer of the MLP (the spec's are 256 and 128)."""
MAX_HIDDEN_LAYERS = 8
MAX_MLP_PARAMS = 1 << 26
"""Most weights the MLP may hold (256 MiB as float32), checked before it is built."""


@dataclass(frozen=True, kw_only=True)
class CortexConfig(DetectorConfig):
    """CORTEX options (defaults: the spec).

    Attributes:
        layer: Block whose output is ``h`` (-1: the last).
        after_ln_final: Read ``h`` after the final norm (only with the last block).
        attn_layer: Layer of the attention weights ``alpha`` (-1: the last).
        attn_heads: Heads averaged into ``alpha`` (empty: all).
        inputs: ``delta_residual`` (``[dh; c]``) or ``delta`` (``dh`` only; ablation).
        smooth: Label-persistence smoothing of the output (ablation when off).
        p_stay_token: Smoothing of the token scores.
        p_stay_answer: Smoothing behind the answer score (max over tokens).
        token_window: Width (odd, tokens) of the centred window the token output is
            averaged over in logit space after the smoothing (1, the spec: none).
        hidden: Hidden widths of the MLP.
        dropout: Dropout after each hidden layer.
        lr: AdamW learning rate.
        weight_decay: AdamW weight decay.
        batch_size: Tokens per step.
        epochs: Passes over the training tokens.
        seed: Seed of the initialisation, dropout and shuffling.
    """

    layer: int = -1
    after_ln_final: bool = False
    attn_layer: int = -1
    attn_heads: tuple[int, ...] = ()
    inputs: Inputs = "delta_residual"
    smooth: bool = True
    p_stay_token: float = P_STAY_TOKEN
    p_stay_answer: float = P_STAY_ANSWER
    token_window: int = 1
    hidden: tuple[int, ...] = (256, 128)
    dropout: float = 0.1
    lr: float = 1e-3
    weight_decay: float = 1e-4
    batch_size: int = 4096
    epochs: int = 10
    seed: int = 0

    FIT_ONLY: ClassVar[frozenset[str]] = frozenset(
        {
            "inputs",
            "smooth",
            "p_stay_token",
            "p_stay_answer",
            "token_window",
            "hidden",
            "dropout",
            "lr",
            "weight_decay",
            "batch_size",
            "epochs",
            "seed",
        }
    )

    def __post_init__(self) -> None:
        if self.inputs not in INPUTS:
            raise DataError(f"cortex: inputs must be one of {INPUTS}, got {self.inputs!r}")
        for name in ("p_stay_token", "p_stay_answer"):
            v = getattr(self, name)
            if not 0.0 <= float(v) <= 1.0:
                raise DataError(f"cortex: {name} must be in [0, 1], got {v!r}")
        check_window(self.token_window, "cortex.token_window")
        if self.epochs < 1 or self.batch_size < 1 or not self.hidden:
            raise DataError("cortex: epochs, batch_size and hidden must be positive / non-empty")
        if len(self.hidden) > MAX_HIDDEN_LAYERS or not all(
            isinstance(h, int) and 1 <= h <= MAX_HIDDEN_WIDTH for h in self.hidden
        ):
            raise DataError(
                f"cortex: hidden must be 1 to {MAX_HIDDEN_LAYERS} widths of 1 to "
                f"{MAX_HIDDEN_WIDTH}, got {list(self.hidden)[:10]}",
                field="hidden",
            )
        if not 0.0 <= self.dropout < 1.0:
            raise DataError(f"cortex: dropout must be in [0, 1), got {self.dropout!r}")


@dataclass(frozen=True, kw_only=True, eq=False)
class CortexTokens:
    """CORTEX's token scores of one answer, every stage (for the heatmap page).

    Attributes:
        raw: ``[T]`` classifier probabilities.
        smoothed: ``[T]`` smoothed with ``p_stay_token``.
        answer_smoothed: ``[T]`` smoothed with ``p_stay_answer`` (its max is the answer score).
    """

    raw: np.ndarray
    smoothed: np.ndarray
    answer_smoothed: np.ndarray


def _resolve(layer: int, n_layers: int, what: str) -> int:
    out = layer + n_layers if layer < 0 else layer
    if not 0 <= out < n_layers:
        raise ModelError(
            f"cortex: {what} {layer} is outside 0..{n_layers - 1} (or -1 for the last)"
        )
    return out


def contextual_residual(dh: np.ndarray, alpha: np.ndarray) -> np.ndarray:
    """``c_i = dh_i - sum_{j<i} alpha_ij dh_j`` (strictly earlier answer tokens, not renormalised).

    Args:
        dh: ``[T, d]`` hidden-state differences.
        alpha: ``[T, T]`` attention weights among the answer tokens (query, key).
    """
    a = np.tril(np.asarray(alpha, dtype=np.float64), k=-1)
    d = np.asarray(dh, dtype=np.float64)
    return (d - a @ d).astype(np.float32)


def mlp_shapes(n_in: int, hidden: Sequence[int]) -> dict[str, tuple[int, ...]]:
    """The state-dict shapes of :func:`build_mlp`'s MLP (what its safetensors file holds).

    Raises:
        DataError: More than :data:`MAX_MLP_PARAMS` weights.
    """
    out: dict[str, tuple[int, ...]] = {}
    width = n_in
    for i, h in enumerate([*hidden, 1]):
        out[f"{3 * i}.weight"], out[f"{3 * i}.bias"] = (int(h), width), (int(h),)
        width = int(h)
    params = sum(int(np.prod(s)) for s in out.values())
    if params > MAX_MLP_PARAMS:
        raise DataError(
            f"cortex: an MLP of {n_in} inputs and hidden widths {list(hidden)} holds "
            f"{params:,} weights, over the {MAX_MLP_PARAMS:,} limit"
        )
    return out


def build_mlp(n_in: int, hidden: Sequence[int], dropout: float) -> torch.nn.Sequential:
    """The classifier: ``n_in -> hidden... -> 1`` with ReLU and dropout."""
    import torch

    layers: list[torch.nn.Module] = []
    width = n_in
    for h in hidden:
        layers += [torch.nn.Linear(width, int(h)), torch.nn.ReLU(), torch.nn.Dropout(dropout)]
        width = int(h)
    layers.append(torch.nn.Linear(width, 1))
    return torch.nn.Sequential(*layers)


class CortexDetector(FittedDetector):
    """Token classifier on with-vs-without-passages hidden-state differences."""

    gives_token_scores: ClassVar[bool] = True

    name: ClassVar[str] = "cortex"
    explained_on: ClassVar[frozenset[PageRole]] = frozenset({"token-heatmaps"})
    Config = CortexConfig
    needs_bare = True
    fitted_attr = "mlp_"
    load_errors = (SafetensorError,)

    def __init__(self, config: CortexConfig | None = None) -> None:
        self.config: CortexConfig = config or CortexConfig()
        self.mlp_: torch.nn.Sequential | None = None
        self.mean_: np.ndarray | None = None
        self.std_: np.ndarray | None = None
        self.model_key_: str | None = None
        self.threshold_: float = 0.5
        self.train_info_: dict[str, Any] = {}

    # -- features ------------------------------------------------------------------

    def _hidden_slot(self, model: ModelInfo) -> tuple[str, int | None]:
        layer = _resolve(self.config.layer, model.n_layers, "layer")
        if self.config.after_ln_final:
            if layer != model.n_layers - 1:
                raise ModelError(
                    "cortex: after_ln_final reads the last block through the final norm; "
                    f"set layer=-1 (got {self.config.layer})"
                )
            return ("ln_final", None)
        return ("resid_post", layer)

    def needs(self, model: ModelInfo) -> Needs:

        kind, layer = self._hidden_slot(model)
        attn = _resolve(self.config.attn_layer, model.n_layers, "attn_layer")
        bad = [h for h in self.config.attn_heads if not 0 <= h < model.n_heads]
        if bad:
            raise ModelError(f"cortex: attn_heads {bad} outside 0..{model.n_heads - 1}")
        return Needs.from_slots({(kind, layer, "response"), ("pattern", attn, "response")})

    def bare_needs(self, model: ModelInfo) -> Needs:
        """The no-passages pass needs only the hidden states."""

        kind, layer = self._hidden_slot(model)
        return Needs.from_slots({(kind, layer, "response")})

    def features(self, run: Run) -> Features:
        if run.trace is None or run.bare is None:
            raise ModelError("cortex needs two traces: with and without the passages")
        full, bare = run.layout, run.bare.layout
        if not np.array_equal(full.response_ids, bare.response_ids):
            raise DataError(
                "the answer tokenizes differently with and without the passages, so CORTEX "
                "cannot pair its tokens; the layout must encode the answer on its own "
                "(core.engine.layout.render)",
                source=run.example.provenance.source or f"record {run.example.id!r}",
            )
        kind, layer = self._hidden_slot(run.model)
        h_ref = run.trace.at(kind, layer, full.response_positions).numpy()
        h_bare = run.bare.at(kind, layer, bare.response_positions).numpy()
        dh = (h_ref.astype(np.float64) - h_bare).astype(np.float32)
        attn = _resolve(self.config.attn_layer, run.model.n_layers, "attn_layer")
        pat = run.trace.at("pattern", attn, full.response_positions).numpy()  # [H, T, seq]
        pat = pat[:, :, full.response_positions]  # [H, T, T]
        heads = list(self.config.attn_heads) or list(range(pat.shape[0]))
        alpha = pat[heads].mean(0)
        c = contextual_residual(dh, alpha)
        d = dh.shape[1]
        n_dh, n_c = np.linalg.norm(dh, axis=1), np.linalg.norm(c, axis=1)

        def stats(v: np.ndarray) -> list[float]:
            return [float(v.mean()), float(v.max())] if v.size else [0.0, 0.0]

        return Features(
            detector=self.name,
            example_id=run.example.id,
            model=run.model.key,
            names=RESPONSE_NAMES,
            response=np.asarray([*stats(n_dh), *stats(n_c)], dtype=np.float32),
            token_names=tuple(f"dh{k}" for k in range(d)) + tuple(f"c{k}" for k in range(d)),
            tokens=np.concatenate([dh, c], axis=1),
            token_offsets=full.response_offsets,
        )

    # -- learning --------------------------------------------------------------------

    def _columns(self, tokens: np.ndarray) -> np.ndarray:
        d = tokens.shape[1] // 2
        return tokens[:, :d] if self.config.inputs == "delta" else tokens

    def _device(self) -> str:
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"

    def fit(
        self,
        features: Sequence[Features],
        examples: Sequence[RAGExample],
        *,
        validation: tuple[Sequence[Features], Sequence[RAGExample]] | None = None,
    ) -> Self:
        """Train the MLP on token labels (see the module docstring); ``validation``
        only adds its loss to the recorded curve (nothing is selected on it)."""
        import torch

        model_key = check_fit_inputs(self.name, features, examples)
        _, xs, ys = token_training_set(features, examples)
        y = np.concatenate(ys) if ys else np.zeros(0, dtype=np.int8)
        n_pos = int(y.sum())
        if not ys or n_pos == 0 or n_pos == y.size:
            raise DataError(
                "cortex learns from token labels: the training split needs answers with gold "
                f"hallucination spans and faithful tokens (got {len(ys)} labelled answers, "
                f"{n_pos} hallucinated of {y.size} tokens); use a dataset with span labels"
            )
        x = self._columns(np.concatenate(xs)).astype(np.float32)
        mean = x.mean(0)
        std = x.std(0)
        std[std < 1e-6] = 1.0
        cfg = self.config
        dev = self._device()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(cfg.seed)
            gen = torch.Generator().manual_seed(cfg.seed)
            mlp = build_mlp(x.shape[1], cfg.hidden, cfg.dropout).to(dev)
            xt = torch.as_tensor((x - mean) / std).to(dev)
            yt = torch.as_tensor(y, dtype=torch.float32).to(dev)
            pos_weight = torch.tensor([(y.size - n_pos) / n_pos], device=dev)
            loss_fn = torch.nn.BCEWithLogitsLoss(pos_weight=pos_weight)
            opt = torch.optim.AdamW(mlp.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
            val = None
            if validation is not None:
                _, vx, vy = token_training_set(*validation)
                if vy and 0 < int(np.concatenate(vy).sum()) < sum(v.size for v in vy):
                    vxa = self._columns(np.concatenate(vx)).astype(np.float32)
                    val = (
                        torch.as_tensor((vxa - mean) / std).to(dev),
                        torch.as_tensor(np.concatenate(vy), dtype=torch.float32).to(dev),
                    )
            curve: list[float] = []
            val_curve: list[float] = []
            for _ in range(cfg.epochs):
                mlp.train()
                order = torch.randperm(xt.shape[0], generator=gen).to(dev)
                total = 0.0
                for k in range(0, xt.shape[0], cfg.batch_size):
                    idx = order[k : k + cfg.batch_size]
                    opt.zero_grad()
                    loss = loss_fn(mlp(xt[idx]).squeeze(1), yt[idx])
                    loss.backward()
                    opt.step()
                    total += float(loss.detach()) * idx.shape[0]
                curve.append(total / xt.shape[0])
                if val is not None:
                    mlp.eval()
                    with torch.no_grad():
                        val_curve.append(float(loss_fn(mlp(val[0]).squeeze(1), val[1])))
        self.mlp_ = mlp.cpu().eval()
        self.mean_, self.std_ = mean, std
        self.model_key_ = model_key
        self.train_info_ = {
            "n_train": len(features),
            "n_hallucinated": int(sum(bool(e.label) for e in examples)),
            "n_token_answers": len(ys),
            "n_tokens": int(y.size),
            "n_positive_tokens": n_pos,
            "pos_weight": float((y.size - n_pos) / n_pos),
            "loss_curve": curve,
            "validation_loss_curve": val_curve,
        }
        return self

    def raw_token_scores(self, features: Features) -> np.ndarray:
        """``[T]`` the classifier's probability for each token (before smoothing)."""
        import torch

        require_fitted(self, "mlp_", self.name)
        assert self.mlp_ is not None and self.mean_ is not None and self.std_ is not None
        check_features(self.name, features, self.model_key_)
        if features.tokens is None or features.tokens.shape[0] == 0:
            return np.zeros(0, dtype=np.float32)
        x = self._columns(features.tokens)
        if x.shape[1] != self.mean_.shape[0]:
            raise ModelError(
                f"cortex: these features have {x.shape[1]} inputs per token but the detector "
                f"was trained on {self.mean_.shape[0]} (another model width?); retrain it"
            )
        with torch.no_grad():
            logits = self.mlp_(torch.as_tensor((x - self.mean_) / self.std_, dtype=torch.float32))
        return torch.sigmoid(logits.squeeze(1)).numpy().astype(np.float32)

    def token_views(self, features: Features) -> CortexTokens:
        """Raw, token-smoothed and answer-smoothed scores of one answer."""
        raw = self.raw_token_scores(features)
        return CortexTokens(
            raw=raw,
            smoothed=np.asarray(smooth_tokens(raw, self.config.p_stay_token)),
            answer_smoothed=np.asarray(smooth_tokens(raw, self.config.p_stay_answer)),
        )

    def predict(self, features: Features) -> Verdict:
        raw = self.raw_token_scores(features)
        if self.config.smooth and raw.size:
            tokens = np.asarray(smooth_tokens(raw, self.config.p_stay_token), dtype=np.float32)
            score = answer_score(raw, self.config.p_stay_answer)
        else:
            tokens = raw
            score = float(raw.max()) if raw.size else 0.0
        tokens = window_probs(tokens, self.config.token_window)
        return thresholded_verdict(
            self,
            features,
            score,
            token_scores=tokens,
            token_offsets=features.token_offsets,
            explanation={
                "max raw token score": float(raw.max()) if raw.size else 0.0,
                "mean raw token score": float(raw.mean()) if raw.size else 0.0,
                **dict(zip(features.names, map(float, features.response), strict=True)),
            },
        )

    # -- artifacts -----------------------------------------------------------------

    def fitted_state(self) -> tuple[dict[str, Any], Writers]:
        from safetensors.torch import save_file

        assert self.mlp_ is not None and self.mean_ is not None and self.std_ is not None
        state = {k: v.detach().contiguous() for k, v in self.mlp_.state_dict().items()}
        weights = {
            "n_inputs": int(self.mean_.shape[0]),
            "mean": self.mean_.tolist(),
            "std": self.std_.tolist(),
            "mlp_file": MLP_FILE,
        }
        return weights, {MLP_FILE: lambda path: save_file(state, str(path))}

    def restore_state(self, folder: Path, w: Mapping[str, Any], cfg: Mapping[str, Any]) -> None:
        from safetensors import safe_open
        from safetensors.torch import load_file

        n_in = w["n_inputs"]
        if type(n_in) is not int or n_in < 1:
            raise ValueError(f"n_inputs must be a positive integer, not {n_in!r}")
        self.mean_ = np.asarray(w["mean"], dtype=np.float32)
        self.std_ = np.asarray(w["std"], dtype=np.float32)
        if self.mean_.shape != (n_in,) or self.std_.shape != (n_in,):
            raise ValueError(f"mean/std do not have {n_in} values")
        if not (np.isfinite(self.mean_).all() and (self.std_ > 0).all()):
            raise ValueError("mean/std hold non-finite values or std <= 0")
        # The file's shapes (its header only) must be the config's before anything
        # is allocated: the widths come from cfg.json, which anyone may edit.
        want = mlp_shapes(n_in, self.config.hidden)
        path = str(folder / MLP_FILE)
        with safe_open(path, framework="np") as f:
            have = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
        if have != want:
            raise DataError(
                f"{MLP_FILE} holds {len(have)} arrays whose shapes are not those of the "
                f"MLP of {n_in} inputs and hidden widths {list(self.config.hidden)} in "
                "cfg.json; retrain it with `ragscope train --detectors cortex`",
                source=str(folder),
            )
        mlp = build_mlp(n_in, self.config.hidden, self.config.dropout)
        state = load_file(path)
        if not all(bool(v.isfinite().all()) for v in state.values()):
            raise ValueError(f"{MLP_FILE} holds non-finite weights")
        mlp.load_state_dict(state)
        self.mlp_ = mlp.eval()
