"""Logit lens: read residual-stream vectors as next-token distributions.

A probe maps a residual vector ``x`` to ``softmax(LN_f(x) W_U + b_U)`` (or,
with ``final_norm=False``, ``softmax(x W_U + b_U)``), where ``LN_f`` is the
model's own final norm (RMSNorm or LayerNorm, whatever class the model uses,
run in float32) and ``W_U``/``b_U`` its unembedding (tied to the embeddings
or not). Applied to the last layer's ``resid_post`` with the final norm, the
lens gives back the model's logits.

Probes run in row chunks (``chunk_size`` rows at a time, default 64) in
float32 on the model's device, so memory stays bounded for large vocabularies
(49,152 for SmolLM2): callers that only need a divergence or the top tokens
(:func:`layer_jsd`, :func:`pks_from_trace`, :func:`lens_top_k`) never hold
more than one chunk of ``[chunk, d_vocab]`` logits.

Also here: :func:`jsd_bits`, the Jensen-Shannon divergence in bits (in
[0, 1]), and the Parametric Knowledge Score of ReDeEP / InterpDetect:
``PKS[l] = JSD(lens(resid_mid[l]), lens(resid_post[l]))`` with the final
norm applied exactly once per layer, the last layer included
(``final_norm=False`` reproduces InterpDetect's public code, which skipped it).
"""

from __future__ import annotations

import copy
import math
import weakref
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, TypeVar, cast

import numpy as np

from core.base.errors import ModelError
from core.engine.model import LoadedModel, decode
from core.engine.trace import Needs, Trace

if TYPE_CHECKING:
    import pandas as pd
    import torch
    from jaxtyping import Float, Int

DEFAULT_CHUNK = 256
_LN2 = math.log(2.0)
_CPU_STEP_ELEMENTS = 400_000
"""Elements per step of a chain of element-wise vocabulary ops on CPU (see :func:`row_step`)."""


# --------------------------------------------------------------------------- unembedding


@dataclass(frozen=True, eq=False)
class _Unembed:
    """Float32 copies (views when the model is float32) of LN_f, W_U, b_U on the model's device."""

    norm: torch.nn.Module
    W_U: Float[torch.Tensor, "d_model d_vocab"]
    b_U: Float[torch.Tensor, " d_vocab"] | None
    softcap: float | None
    device: str


_UNEMBED: weakref.WeakKeyDictionary[LoadedModel, _Unembed] = weakref.WeakKeyDictionary()


def _unembed(model: LoadedModel) -> _Unembed:
    import torch

    hit = _UNEMBED.get(model)
    if hit is not None:
        return hit
    bridge = model.bridge
    ln = getattr(bridge, "ln_final", None)
    if ln is None:
        raise ModelError(f"{model.info.display_name} exposes no final norm (ln_final) to the lens")
    # The HF module itself, not the bridge wrapper: calling the wrapper would fire
    # its hook points (and so any hook a concurrent trace has on ln_final).
    original = getattr(ln, "original_component", None) or ln
    with model.lock:
        norm = copy.deepcopy(original).to(device=model.device, dtype=torch.float32).eval()
        for p in norm.parameters():
            p.requires_grad_(False)
        W_U = bridge.W_U.detach().to(model.device, torch.float32)
        b_U = getattr(bridge, "b_U", None)
    if b_U is not None:
        b_U = b_U.detach().to(model.device, torch.float32)
        if not bool(b_U.any()):
            b_U = None  # the bridge reports a zero bias for bias-free heads; skip the add
    cap = getattr(model.hf_model.config, "final_logit_softcapping", None)
    out = _Unembed(
        norm=norm, W_U=W_U, b_U=b_U, softcap=float(cap) if cap else None, device=model.device
    )
    _UNEMBED[model] = out
    return out


def unembed_columns(model: LoadedModel, ids: torch.Tensor) -> Float[torch.Tensor, "d_model n"]:
    """``W_U[:, ids]`` as float32 on the CPU (the unembedding directions of ``ids``).

    Gathers along W_U's contiguous axis: with tied embeddings W_U is a transposed view
    of W_E, and ``index_select`` along its strided axis first copies the whole matrix.
    """
    import torch

    u = _unembed(model)
    W = u.W_U
    idx = ids.to(W.device)
    cols = W.t().index_select(0, idx).t() if W.stride(0) == 1 else W.index_select(1, idx)
    return cols.to("cpu", torch.float32)


def row_step(x: torch.Tensor) -> int:
    """Rows of ``x`` (``[rows, d_vocab]``) per step of a chain of element-wise ops.

    On CPU a few vocabulary rows at a time (~1.5 MB of float32: 8 rows of a 49k
    vocabulary) keep the chain's temporaries in a core's cache; measured on a 2-core
    EPYC, JSD over 630 row pairs took 0.11 s in steps of 8 rows, 0.28 s in steps of 16
    and more in one step. On an accelerator: all rows at once.
    """
    if x.device.type != "cpu":
        return max(1, x.shape[0])
    return max(1, _CPU_STEP_ELEMENTS // max(1, x.shape[-1]))


def _chunks(n: int, size: int) -> Iterator[slice]:
    if size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {size}")
    for start in range(0, n, size):
        yield slice(start, min(n, start + size))


def _as_rows(x: torch.Tensor | np.ndarray, d_model: int) -> torch.Tensor:
    import torch

    t = torch.as_tensor(x)
    if t.shape[-1] != d_model:
        raise ValueError(
            f"residual vectors must end in d_model={d_model}, got shape {tuple(t.shape)}"
        )
    return t.reshape(-1, d_model)


def _logits_chunk(
    u: _Unembed, x: torch.Tensor, final_norm: bool, out: torch.Tensor | None = None
) -> torch.Tensor:
    """Lens logits of one chunk of rows already on the device, float32.

    Args:
        out: A float32 ``[>= rows, d_vocab]`` buffer on the device to write into (its
            first rows are returned): a caller probing many chunks reuses one buffer
            instead of a fresh ``d_vocab``-wide allocation per chunk (on CPU each
            fresh one is page-faulted in again).
    """
    import torch

    x = x.to(u.device, torch.float32)
    if final_norm:
        x = u.norm(x)
    if out is None:
        out = x @ u.W_U
    else:
        out = torch.matmul(x, u.W_U, out=out[: x.shape[0]])
    if u.b_U is not None:
        out.add_(u.b_U)
    if u.softcap is not None:
        out.div_(u.softcap).tanh_().mul_(u.softcap)
    return out


def _logits_buffer(u: _Unembed, rows: int) -> torch.Tensor:
    """A float32 ``[rows, d_vocab]`` buffer for :func:`_logits_chunk`'s ``out``."""
    import torch

    return torch.empty((rows, u.W_U.shape[1]), dtype=torch.float32, device=u.device)


def lens_logits(
    model: LoadedModel,
    x: Float[torch.Tensor, "... d_model"] | np.ndarray,
    *,
    final_norm: bool = True,
    chunk_size: int = DEFAULT_CHUNK,
) -> Float[torch.Tensor, "... d_vocab"]:
    """Logit-lens logits ``LN_f(x) W_U + b_U`` of residual vectors.

    Holds ``[..., d_vocab]`` float32 on the CPU: prefer :func:`lens_top_k`,
    :func:`layer_jsd` or :func:`jsd_bits` on chunks when many rows are probed.

    Args:
        model: The loaded model.
        x: ``[..., d_model]`` residual vectors (e.g. a Trace's ``resid_post`` rows).
        final_norm: Apply the model's final norm first (the standard lens).
        chunk_size: Rows per device pass.

    Returns:
        ``[..., d_vocab]`` float32 CPU logits.
    """
    import torch

    u = _unembed(model)
    lead = tuple(torch.as_tensor(x).shape[:-1])
    rows = _as_rows(x, model.info.d_model)
    out = torch.empty((rows.shape[0], u.W_U.shape[1]), dtype=torch.float32)
    with torch.inference_mode():
        for s in _chunks(rows.shape[0], chunk_size):
            out[s] = _logits_chunk(u, rows[s], final_norm).cpu()
    return out.reshape(*lead, -1)


def lens_logprobs(
    model: LoadedModel,
    x: Float[torch.Tensor, "... d_model"] | np.ndarray,
    *,
    final_norm: bool = True,
    chunk_size: int = DEFAULT_CHUNK,
) -> Float[torch.Tensor, "... d_vocab"]:
    """Log-probabilities of the lens (see :func:`lens_logits`), float32 CPU."""
    import torch

    u = _unembed(model)
    lead = tuple(torch.as_tensor(x).shape[:-1])
    rows = _as_rows(x, model.info.d_model)
    out = torch.empty((rows.shape[0], u.W_U.shape[1]), dtype=torch.float32)
    with torch.inference_mode():
        for s in _chunks(rows.shape[0], chunk_size):
            out[s] = torch.log_softmax(_logits_chunk(u, rows[s], final_norm), dim=-1).cpu()
    return out.reshape(*lead, -1)


def lens_probs(
    model: LoadedModel,
    x: Float[torch.Tensor, "... d_model"] | np.ndarray,
    *,
    final_norm: bool = True,
    chunk_size: int = DEFAULT_CHUNK,
) -> Float[torch.Tensor, "... d_vocab"]:
    """Probabilities ``softmax(LN_f(x) W_U + b_U)`` of the lens, float32 CPU."""
    return lens_logprobs(model, x, final_norm=final_norm, chunk_size=chunk_size).exp()


# --------------------------------------------------------------------------- JSD

_A = TypeVar("_A", "torch.Tensor", np.ndarray)
Precision = Literal["float64", "float32"]


def jsd_bits(p: _A, q: _A, *, precision: Precision = "float64") -> _A:
    """Jensen-Shannon divergence in bits, row by row, in [0, 1].

    ``JSD(P, Q) = 1/2 KL(P || M) + 1/2 KL(Q || M)`` with ``M = (P + Q) / 2``,
    from log-probabilities: ``log P - log M = log 2 - softplus(log Q - log P)``,
    so each term depends on the *difference* of the two log-probabilities and
    near-equal distributions keep their small divergence (equal rows give
    exactly 0) instead of losing it to rounding of large log-probabilities.
    Computed in float64 (the first-order terms of P and Q cancel, which float32
    cannot resolve for tiny divergences), returned in the input's dtype.
    Zero-probability entries contribute 0. Symmetric in ``p`` and ``q``. Equals
    ``scipy.spatial.distance.jensenshannon(P, Q, base=2) ** 2``.

    Args:
        p: ``[..., d_vocab]`` logits or log-probabilities (each row is normalised
            with log-softmax, which leaves log-probabilities unchanged); torch or numpy.
        q: Same shape as ``p``.
        precision: ``"float64"`` (default, exact to rounding) or ``"float32"``
            (about 3x faster on CPU; absolute error below 1e-6 bits, so only
            divergences under ~1e-5 lose relative accuracy; what the detectors'
            PKS uses).

    Returns:
        ``[...]`` divergences, in the dtype and array type of ``p`` (torch stays on its device).
    """
    import torch

    as_numpy = isinstance(p, np.ndarray)
    tp, tq = torch.as_tensor(p), torch.as_tensor(q)
    if tp.shape != tq.shape:
        raise ValueError(
            f"jsd_bits needs equal shapes, got {tuple(tp.shape)} and {tuple(tq.shape)}"
        )
    if precision not in ("float64", "float32"):
        raise ValueError(f"precision must be 'float64' or 'float32', got {precision!r}")
    work = torch.float64 if precision == "float64" else torch.float32
    out_dtype = tp.dtype if tp.is_floating_point() else torch.float64
    lead = tp.shape[:-1]
    rows_p = tp.reshape(-1, tp.shape[-1]) if tp.dim() else tp.reshape(1, 1)
    rows_q = tq.reshape(-1, tq.shape[-1]).to(tp.device) if tq.dim() else tq.reshape(1, 1)
    out = torch.empty(rows_p.shape[0], dtype=work, device=tp.device)
    step = row_step(rows_p)
    with torch.inference_mode():
        for s in _chunks(rows_p.shape[0], step):
            out[s] = _jsd_rows(rows_p[s].to(work), rows_q[s].to(work))
        out = out.reshape(lead).to(out_dtype)
    return cast(_A, out.cpu().numpy() if as_numpy else out)


def _jsd_rows(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """:func:`jsd_bits` of ``[rows, d_vocab]`` logits in their own dtype (in place)."""
    import torch
    import torch.nn.functional as F

    lp = torch.log_softmax(p, dim=-1)
    lq = torch.log_softmax(q, dim=-1)
    d = lq - lp
    if bool(torch.isinf(d).any()):
        # A zero probability contributes 0 (its inf log-ratio would give nan).
        sp = F.softplus(d)  # softplus(-d) = softplus(d) - d
        zero = d.new_zeros(())
        kl_p = torch.where(lp > -math.inf, lp.exp() * (_LN2 - sp), zero)
        kl_q = torch.where(lq > -math.inf, lq.exp() * (_LN2 - F.softplus(-d)), zero)
        terms = kl_p + kl_q
    else:
        # P (log P - log M) + Q (log Q - log M) per entry, with
        # log P - log M = ln 2 - softplus(d) and log Q - log M = ln 2 - softplus(d) + d.
        terms = F.softplus(d).neg_().add_(_LN2)
        d.add_(terms).mul_(lq.exp_())
        terms.mul_(lp.exp_()).add_(d)
    return (0.5 * terms.sum(-1) / _LN2).clamp_(0.0, 1.0)


# --------------------------------------------------------------------------- PKS


def layer_jsd(
    model: LoadedModel,
    mid: Sequence[Float[torch.Tensor, "pos d_model"]] | Float[torch.Tensor, "layer pos d_model"],
    post: Sequence[Float[torch.Tensor, "pos d_model"]] | Float[torch.Tensor, "layer pos d_model"],
    *,
    final_norm: bool = True,
    chunk_size: int = DEFAULT_CHUNK,
    precision: Precision = "float64",
) -> Float[np.ndarray, "layer pos"]:
    """JSD (bits) between the lens of ``mid[i]`` and of ``post[i]``, row by row.

    With ``mid = resid_mid[l]`` and ``post = resid_post[l]`` this is ReDeEP's
    Parametric Knowledge Score of layer ``l`` (what its FFN changed in the
    next-token distribution). The final norm is applied exactly once to every
    vector, the last layer's included.

    Args:
        model: The loaded model.
        mid: Per layer ``[pos, d_model]`` rows (e.g. a Trace's ``resid_mid``).
        post: Per layer ``[pos, d_model]`` rows at the same positions.
        final_norm: Apply LN_f before W_U (``False``: InterpDetect's public code).
        chunk_size: Rows per device pass (each pass probes ``2 * chunk_size`` vectors).
        precision: Arithmetic of the divergence (see :func:`jsd_bits`).

    Returns:
        ``[layer, pos]`` float32 JSD in bits, in [0, 1].
    """
    import torch

    if len(mid) != len(post):
        raise ValueError(f"{len(mid)} mid layers but {len(post)} post layers")
    u = _unembed(model)
    d = model.info.d_model
    n_rows = {int(torch.as_tensor(m).reshape(-1, d).shape[0]) for m in mid}
    n_rows |= {int(torch.as_tensor(m).reshape(-1, d).shape[0]) for m in post}
    if len(n_rows) > 1:
        raise ValueError(f"layers hold different numbers of rows: {sorted(n_rows)}")
    n = n_rows.pop() if n_rows else 0
    out = np.zeros(len(mid) * n, dtype=np.float32)
    if not out.size:
        return out.reshape(len(mid), n)
    with torch.inference_mode():
        # Every layer's rows in one (layer, position) sequence, chunked across layers:
        # a few positions over many layers (one decoding step) make one pass, not one
        # per layer.
        m_rows = torch.cat([_as_rows(m, d) for m in mid])
        p_rows = torch.cat([_as_rows(p, d) for p in post])
        buf = _logits_buffer(u, 2 * min(chunk_size, len(out)))
        for s in _chunks(len(out), chunk_size):
            both = torch.cat([m_rows[s], p_rows[s]], dim=0)
            logits = _logits_chunk(u, both, final_norm, out=buf)
            k = s.stop - s.start
            out[s] = jsd_bits(logits[:k], logits[k:], precision=precision).cpu().numpy()
    return out.reshape(len(mid), n)


def pks_needs(
    n_layers: int,
    *,
    layers: Iterable[int] | None = None,
    positions: Iterable[str] | str = "generation",
) -> Needs:
    """What :func:`pks_from_trace` reads: ``resid_mid`` and ``resid_post`` at ``layers``."""
    return Needs.of(
        ["resid_mid", "resid_post"], layers=layers, n_layers=n_layers, positions=positions
    )


def pks_from_trace(
    model: LoadedModel,
    tr: Trace,
    *,
    layers: Iterable[int] | None = None,
    positions: Iterable[int] | np.ndarray | None = None,
    final_norm: bool = True,
    chunk_size: int = DEFAULT_CHUNK,
    precision: Precision = "float64",
) -> Float[np.ndarray, "layer pos"]:
    """PKS per (layer, position) from a Trace that holds resid_mid and resid_post.

    Args:
        model: The model the trace was taken with.
        tr: A trace with ``resid_mid``/``resid_post`` at ``layers`` (see :func:`pks_needs`).
        layers: Layers to score, in the order of the output rows; default all.
        positions: Absolute positions (default: the layout's generation positions g_j).
        final_norm: Apply LN_f (default) or not (InterpDetect's public code).
        chunk_size: Rows per device pass.
        precision: Arithmetic of the divergence (see :func:`jsd_bits`).

    Returns:
        ``[layer, pos]`` float32 JSD in bits.
    """
    ls = list(range(model.info.n_layers)) if layers is None else [int(x) for x in layers]
    pos = tr.layout.generation_positions if positions is None else np.asarray(positions)
    mid = [tr.at("resid_mid", layer, pos) for layer in ls]
    post = [tr.at("resid_post", layer, pos) for layer in ls]
    return layer_jsd(
        model, mid, post, final_norm=final_norm, chunk_size=chunk_size, precision=precision
    )


# --------------------------------------------------------------------------- top-k


@dataclass(frozen=True, kw_only=True, eq=False)
class LensTopK:
    """The k most likely next tokens of each probed vector.

    Attributes:
        token_ids: ``[n, k]`` token ids, most likely first.
        probs: ``[n, k]`` their probabilities under the lens.
        tokens: ``n`` tuples of ``k`` token strings, each decoded on its own.
        entropy: ``[n]`` entropy of each lens distribution, in bits.
    """

    token_ids: Int[np.ndarray, "n k"]
    probs: Float[np.ndarray, "n k"]
    tokens: tuple[tuple[str, ...], ...]
    entropy: Float[np.ndarray, " n"]

    def to_frame(self) -> pd.DataFrame:
        """Long table: one row per (probe row, rank)."""
        import pandas as pd

        n, k = self.token_ids.shape
        return pd.DataFrame(
            {
                "row": np.repeat(np.arange(n), k),
                "rank": np.tile(np.arange(1, k + 1), n),
                "token_id": self.token_ids.reshape(-1),
                "token": [t for row in self.tokens for t in row],
                "prob": self.probs.reshape(-1),
            }
        )


def lens_top_k(
    model: LoadedModel,
    x: Float[torch.Tensor, "n d_model"] | np.ndarray,
    *,
    k: int = 10,
    final_norm: bool = True,
    chunk_size: int = DEFAULT_CHUNK,
) -> LensTopK:
    """Top-``k`` tokens and probabilities of the lens at each row of ``x``.

    Args:
        model: The loaded model (its tokenizer decodes the tokens).
        x: ``[n, d_model]`` residual vectors.
        k: Tokens per row.
        final_norm: Apply LN_f first.
        chunk_size: Rows per device pass.
    """
    import torch

    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    u = _unembed(model)
    rows = _as_rows(x, model.info.d_model)
    k = min(k, int(u.W_U.shape[1]))
    ids = np.zeros((rows.shape[0], k), dtype=np.int64)
    probs = np.zeros((rows.shape[0], k), dtype=np.float32)
    ent = np.zeros(rows.shape[0], dtype=np.float32)
    with torch.inference_mode():
        for s in _chunks(rows.shape[0], chunk_size):
            lp = torch.log_softmax(_logits_chunk(u, rows[s], final_norm), dim=-1)
            top = lp.topk(k, dim=-1)
            ids[s] = top.indices.cpu().numpy()
            probs[s] = top.values.exp().cpu().numpy()
            h = -torch.where(lp > -math.inf, lp.exp() * lp, lp.new_zeros(())).sum(-1)
            ent[s] = (h / _LN2).cpu().numpy()
    tok = model.tokenizer
    tokens = tuple(tuple(decode(tok, [i]) for i in row) for row in ids)
    return LensTopK(token_ids=ids, probs=probs, tokens=tokens, entropy=ent)
