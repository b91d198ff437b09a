"""The numbers behind the teaching walkthroughs (the Learn page): computed, never drawn
from illustration.

- :func:`lens_curve`: the residual stream read layer by layer with the logit lens: for
  every answer token, the probability each block's output already gives it
  (``softmax(W_U LN_f(h_l))`` at the position that predicts it), next to the model's
  own final probability, and the layer where it jumps most.
- :func:`cortex_walk`: CORTEX's reading of one answer, step by step: the change the
  passages make to the last block's output at each token (``dh``), what is left after
  the attention-weighted changes of earlier tokens (``c``), the classifier's raw token
  scores, and the smoothing that turns them into spans.
- :func:`ffn_lens`: one block's FFN read with the lens before and after it, and
  the divergence between the two (ReDeEP's PKS).
- :func:`raglens_walk`: the SAE as a dictionary on this answer (reconstruction,
  sparsity), the selected features' activations over the answer, their max-pooled
  values and the GAM's sum of shape values that makes the score.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from core.base.examples import RAGExample
from core.detectors.cortex import CortexDetector
from core.detectors.raglens import INTERCEPT, RaglensDetector
from core.engine.layout import render
from core.engine.model import LoadedModel, decode
from core.engine.trace import Needs, trace
from core.learning.contract import flag_threshold
from core.pipeline.extract import run_example
from core.signals.lens import LensTopK, layer_jsd, lens_logprobs, lens_top_k
from core.signals.smoothing import flagged_spans, smooth_tokens


@dataclass(frozen=True, kw_only=True, eq=False)
class LensCurve:
    """The logit lens over one teacher-forced answer.

    Attributes:
        tokens: The answer's tokens, decoded one by one, ``[T]``.
        offsets: ``[T, 2]`` their character ranges in the answer.
        probs: ``[L, T]`` the probability block ``l``'s output gives token ``t`` (lens
            with the final norm, at the position that predicts it).
        final: ``[T]`` the model's own probability of each token (its logits).
    """

    tokens: tuple[str, ...]
    offsets: np.ndarray
    probs: np.ndarray
    final: np.ndarray

    @property
    def n_layers(self) -> int:
        return int(self.probs.shape[0])

    def jump_layer(self, t: int) -> int:
        """The block whose output raises token ``t``'s probability the most (0 counts the
        rise from nothing, i.e. block 0's own probability)."""
        p = self.probs[:, t]
        rise = np.diff(np.concatenate([[0.0], p]))
        return int(np.argmax(rise))

    def jump_layers(self) -> np.ndarray:
        return np.asarray([self.jump_layer(t) for t in range(len(self.tokens))], dtype=np.int64)


def lens_curve(model: LoadedModel, example: RAGExample) -> LensCurve:
    """Trace the answer once (``resid_post`` of every block and the logits, at the
    positions that predict the answer's tokens) and read it with the logit lens."""
    import torch

    layout = render(example, model)
    n_layers = model.info.n_layers
    needs = Needs.of(["resid_post"], n_layers=n_layers, positions="generation") | Needs(
        hooks=frozenset({("logits", None)}), positions=frozenset({"generation"})
    )
    tr = trace(model, layout, needs)
    gen = layout.generation_positions
    ids = torch.as_tensor(np.asarray(layout.response_ids, dtype=np.int64))
    rows = torch.arange(ids.shape[0])
    probs = np.zeros((n_layers, ids.shape[0]), dtype=np.float64)
    for layer in range(n_layers):
        lp = lens_logprobs(model, tr.at("resid_post", layer, gen))
        probs[layer] = lp[rows, ids].exp().double().numpy()
    logits = tr.at("logits", None, gen).float()
    final = torch.log_softmax(logits, dim=-1)[rows, ids].exp().double().numpy()
    tok = model.tokenizer
    tokens = tuple(
        decode(tok, [i], skip_special_tokens=False, clean_up_tokenization_spaces=False)
        for i in layout.response_ids
    )
    return LensCurve(
        tokens=tokens, offsets=np.asarray(layout.response_offsets), probs=probs, final=final
    )


@dataclass(frozen=True, kw_only=True, eq=False)
class CortexWalk:
    """CORTEX's reading of one answer (see :func:`cortex_walk`).

    Attributes:
        tokens: The answer's tokens (text of each token's character range), ``[T]``.
        offsets: ``[T, 2]`` character ranges.
        dh_norm: ``[T]`` ``||dh_i||``: how much the passages change the last block's
            output at token ``i``.
        c_norm: ``[T]`` ``||c_i||``: what is left of that change after subtracting the
            attention-weighted changes of earlier answer tokens.
        raw: ``[T]`` the classifier's probability that token ``i`` is hallucinated.
        threshold: The token threshold spans are flagged at.
        answer_p_stay: The smoothing of the answer score (its max).
    """

    tokens: tuple[str, ...]
    offsets: np.ndarray
    dh_norm: np.ndarray
    c_norm: np.ndarray
    raw: np.ndarray
    threshold: float
    answer_p_stay: float

    def smoothed(self, p_stay: float) -> np.ndarray:
        """The token scores after label-persistence smoothing with ``p_stay``."""

        return np.asarray(smooth_tokens(self.raw, p_stay), dtype=np.float64)

    def spans(self, p_stay: float, threshold: float | None = None) -> list[tuple[int, int]]:
        """Character spans of the runs of smoothed scores at or above the threshold."""

        t = self.threshold if threshold is None else threshold
        return flagged_spans(self.smoothed(p_stay), self.offsets, t)


def cortex_walk(model: LoadedModel, detector: CortexDetector, example: RAGExample) -> CortexWalk:
    """Read one answer with a fitted CORTEX detector (two traced passes)."""

    feats = run_example(model, example, [detector])[detector.name]
    assert feats.tokens is not None and feats.token_offsets is not None
    d = feats.tokens.shape[1] // 2
    dh, c = feats.tokens[:, :d], feats.tokens[:, d:]
    offs = np.asarray(feats.token_offsets)
    return CortexWalk(
        tokens=tuple(example.response[a:b] for a, b in offs),
        offsets=offs,
        dh_norm=np.linalg.norm(dh.astype(np.float64), axis=1),
        c_norm=np.linalg.norm(c.astype(np.float64), axis=1),
        raw=np.asarray(detector.raw_token_scores(feats), dtype=np.float64),
        threshold=flag_threshold(detector),
        answer_p_stay=float(detector.config.p_stay_answer),
    )


@dataclass(frozen=True, kw_only=True, eq=False)
class RaglensWalk:
    """RAGLens's reading of one answer (see :func:`raglens_walk`).

    Attributes:
        tokens: The answer's tokens, ``[T]``.
        offsets: ``[T, 2]`` character ranges.
        fve: Fraction of the answer's residual variance the SAE reconstruction keeps
            (``1 - SSE / SST`` over its tokens, SST about their mean).
        token_error: ``[T]`` each token's relative reconstruction error
            ``||x - x_hat||^2 / ||x - mean||^2``.
        l0: ``[T]`` features active at each token.
        d_sae: The dictionary's size.
        held_out: The SAE's held-out quality as recorded when it was trained (or empty).
        features: The detector's selected features, most important first.
        activations: ``[T, K]`` their activations at each token (the detector's kind).
        pooled: ``[K]`` their max over the answer (what the classifier reads).
        contributions: Feature name -> log-odds contribution to this answer's score.
        intercept: The classifier's intercept.
        score: The answer's score.
    """

    tokens: tuple[str, ...]
    offsets: np.ndarray
    fve: float
    token_error: np.ndarray
    l0: np.ndarray
    d_sae: int
    held_out: dict[str, float]
    features: tuple[int, ...]
    activations: np.ndarray
    pooled: np.ndarray
    contributions: dict[str, float]
    intercept: float
    score: float


def raglens_walk(model: LoadedModel, detector: RaglensDetector, example: RAGExample) -> RaglensWalk:
    """Read one answer with a fitted RAGLens detector and its SAE (two cheap passes)."""

    ans = detector.explain_answer(model, example)
    sae = detector.sae
    layout = render(example, model)
    tr = trace(model, layout, Needs.of(["resid_post"], layers=[sae.layer], positions="response"))
    x = tr.at("resid_post", sae.layer, layout.response_positions).double()
    z = sae.encode(x.float(), "post")
    x_hat = sae.decode(z).double()
    err = ((x - x_hat) ** 2).sum(1).numpy()
    centred = ((x - x.mean(0, keepdim=True)) ** 2).sum(1).numpy()
    fve = float(1.0 - err.sum() / centred.sum()) if centred.sum() > 0 else float("nan")
    ranked = [k for k, _ in detector.importances() if k in ans.features]
    cols = [ans.features.index(k) for k in ranked]
    acts = np.asarray(ans.activations, dtype=np.float64)[:, cols]
    expl = dict(ans.verdict.explanation)
    quality = (sae.meta or {}).get("quality") or {}
    return RaglensWalk(
        tokens=tuple(ans.tokens),
        offsets=np.asarray(ans.token_offsets),
        fve=fve,
        token_error=err / np.where(centred > 0, centred, 1.0),
        l0=(z > 0).sum(1).numpy(),
        d_sae=int(sae.d_sae),
        held_out={k: float(v) for k, v in quality.items() if isinstance(v, int | float)},
        features=tuple(ranked),
        activations=acts,
        pooled=acts.max(0) if acts.size else np.zeros(len(cols)),
        contributions={k: float(v) for k, v in expl.items() if k != INTERCEPT},
        intercept=float(expl.get(INTERCEPT, 0.0)),
        score=float(ans.verdict.score),
    )


@dataclass(frozen=True, kw_only=True, eq=False)
class FfnLens:
    """One block's FFN read with the logit lens at every answer token.

    Attributes:
        layer: The block.
        before: Top next tokens of ``resid_mid`` (before the FFN), per token.
        after: Top next tokens of ``resid_post`` (after it), per token.
        jsd: ``[T]`` Jensen-Shannon divergence (bits) of the two full distributions:
            the block's parametric knowledge score.
    """

    layer: int
    before: LensTopK
    after: LensTopK
    jsd: np.ndarray


def ffn_lens(model: LoadedModel, example: RAGExample, layer: int, *, k: int = 5) -> FfnLens:
    """Read block ``layer``'s FFN (before / after) at the positions that predict the answer."""

    layout = render(example, model)
    tr = trace(
        model,
        layout,
        Needs.of(["resid_mid", "resid_post"], layers=[layer], positions="generation"),
    )
    gen = layout.generation_positions
    mid, post = tr.at("resid_mid", layer, gen), tr.at("resid_post", layer, gen)
    return FfnLens(
        layer=layer,
        before=lens_top_k(model, mid, k=k),
        after=lens_top_k(model, post, k=k),
        jsd=np.asarray(layer_jsd(model, [mid], [post])[0], dtype=np.float64),
    )
