"""External Context Score (ECS): how much an attention head carries the passages into the answer.

Token level (ReDeEP, ``specs/redeep.md``): for response token ``j`` read at its
generation position ``g = p_j - 1`` and head ``(l, h)``::

    ECS[l, h](j) = cos(e, x_g),  e = mean of x over the top-k context positions
                                     by the attention weight A[l, h][g, context]

with ``x = LN_f(resid_post[L-1])`` (the final normed hidden state) and
``k = max(1, ceil(topk_frac * n_context))``. The context is the passage tokens
(``scope="passages"``, ragscope's default) or every prompt position before the
response (``scope="prompt"``, what the public ReDeEP code ranked).

Chunk level (ReDeEP chunk mode and InterpDetect): for response chunk ``r`` and
head ``(l, h)`` the attention mass ``W[r, c]`` from ``r``'s generation
positions to context chunk ``c``'s positions is pooled (``mean``: the paper;
``sum``: the public code), ``c* = argmax_c W[r, c]`` and
``ECS~[l, h](r) = cos(emb(r), emb(c*))`` with a sentence embedder
(all-MiniLM-L6-v2 by default, or the analysed model's mean final hidden state).

Everything here reads a :class:`~core.engine.trace.Trace`; :func:`ecs_needs` says
what to trace (attention patterns at the generation positions only, final
hidden states at the context and generation positions).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np

from core.engine.layout import Layout
from core.engine.trace import Needs, Trace
from core.signals.chunking import Chunk, ChunkSet
from core.signals.embed import SentenceEmbedder, cosine, default_embedder

if TYPE_CHECKING:
    import torch
    from jaxtyping import Float, Int

EcsScope = Literal["passages", "prompt"]
Pool = Literal["mean", "sum"]
ChunkEmbedder = Literal["minilm", "model"]
Head = tuple[int, int]


def ecs_needs(
    n_layers: int,
    *,
    layers: Iterable[int] | None = None,
    scope: EcsScope = "passages",
    hidden_at_response: bool = False,
) -> Needs:
    """What the ECS functions read.

    Args:
        n_layers: Layers of the model.
        layers: Layers whose attention patterns are needed (default all).
        scope: ``"passages"`` (context = passage tokens) or ``"prompt"`` (every
            position before the response).
        hidden_at_response: Also keep the final hidden state at the response
            positions (chunk ECS with ``embedder="model"``).
    """
    pattern = Needs.of(["pattern"], layers=layers, n_layers=n_layers, positions="generation")
    where = ["generation", "context" if scope == "passages" else "all"]
    if hidden_at_response:
        where.append("response")
    return pattern | Needs.of(["ln_final"], positions=where)


def context_positions(layout: Layout, scope: EcsScope = "passages") -> Int[np.ndarray, " ctx"]:
    """The positions ECS ranks: passage tokens, or the whole prompt before the response."""
    if scope == "passages":
        return layout.context_positions()
    if scope == "prompt":
        return np.arange(layout.response.start, dtype=np.int64)
    raise ValueError(f"unknown ECS scope {scope!r}; use 'passages' or 'prompt'")


def top_k(n_context: int, frac: float) -> int:
    """``max(1, ceil(frac * n_context))``."""
    if not 0 < frac <= 1:
        raise ValueError(f"topk_frac must be in (0, 1], got {frac}")
    return max(1, math.ceil(frac * n_context))


def _unit(x: torch.Tensor) -> torch.Tensor:
    import torch

    return x / x.norm(dim=-1, keepdim=True).clamp_min(torch.finfo(x.dtype).tiny)


def all_heads(layers: Iterable[int], n_heads: int) -> list[Head]:
    """Every ``(layer, head)`` of ``layers``, layer-major."""
    return [(int(ly), h) for ly in layers for h in range(n_heads)]


def token_ecs(
    tr: Trace,
    heads: Sequence[Head],
    *,
    topk_frac: float = 0.1,
    scope: EcsScope = "passages",
) -> Float[np.ndarray, "resp head"]:
    """ECS of every response token for each of ``heads`` (columns in ``heads`` order).

    A layout without context gives zeros (nothing to copy from).

    Args:
        tr: A trace holding ``pattern`` at the heads' layers (generation
            positions) and ``ln_final`` at the generation and context positions.
        heads: ``(layer, head)`` pairs.
        topk_frac: Share of the context positions averaged into ``e``.
        scope: Which positions count as context (see the module docstring).
    """
    import torch

    layout = tr.layout
    g = layout.generation_positions
    ctx = context_positions(layout, scope)
    out = np.zeros((len(g), len(heads)), dtype=np.float32)
    if ctx.size == 0 or not heads:
        return out
    k = top_k(ctx.size, topk_frac)
    x_ctx = tr.at("ln_final", None, ctx).double()  # [ctx, d]
    x_g = tr.at("ln_final", None, g).double()  # [T, d]
    ctx_t = torch.as_tensor(ctx)
    by_layer: dict[int, list[int]] = {}
    for col, (layer, _) in enumerate(heads):
        by_layer.setdefault(int(layer), []).append(col)
    for layer, cols in by_layer.items():
        hs = torch.as_tensor([heads[c][1] for c in cols])
        a = tr.at("pattern", layer, g)[hs][:, :, ctx_t]  # [h, T, ctx]
        cos = ecs_rows(a, x_ctx, x_g, k)  # [h, T]
        out[:, cols] = cos.T.numpy().astype(np.float32)
    return out


def ecs_rows(
    pattern: Float[torch.Tensor, "head query ctx"],
    x_ctx: Float[torch.Tensor, "ctx d_model"],
    x_g: Float[torch.Tensor, "query d_model"],
    k: int,
) -> Float[torch.Tensor, "head query"]:
    """Token-level ECS from attention rows, without a Layout (the math of :func:`token_ecs`).

    Used as is by :func:`token_ecs` and by generation-time scoring
    (:mod:`core.interventions.aarf`), which sees one new query position at a time.

    Args:
        pattern: Attention weights of some heads from the query positions to
            the context positions only (columns in ``x_ctx`` order).
        x_ctx: Final normed hidden states at the context positions.
        x_g: Final normed hidden states at the query positions (any norm: only
            their direction counts).
        k: How many top-attended context positions are averaged (see :func:`top_k`).

    Returns:
        ``[head, query]`` float64 cosines.
    """
    import torch

    n_heads, n_query, n_ctx = pattern.shape
    if not 1 <= k <= n_ctx:
        raise ValueError(f"k must be in [1, {n_ctx}] (the context positions), got {k}")
    idx = pattern.topk(k, dim=-1).indices.reshape(-1, k)  # [h*T, k]
    mask = torch.zeros(idx.shape[0], n_ctx, dtype=torch.float64)
    mask.scatter_(1, idx, 1.0 / k)
    e = _unit(mask @ x_ctx.double()).reshape(n_heads, n_query, -1)  # [h, T, d]
    return (e * _unit(x_g.double()).unsqueeze(0)).sum(-1)


def top_context_positions(
    tr: Trace, head: Head, *, topk_frac: float = 0.1, scope: EcsScope = "passages"
) -> Int[np.ndarray, "resp k"]:
    """For each response token, the context positions that token-level ECS averages (head ``head``)."""
    layout = tr.layout
    g = layout.generation_positions
    ctx = context_positions(layout, scope)
    if ctx.size == 0:
        return np.zeros((len(g), 0), dtype=np.int64)
    k = top_k(ctx.size, topk_frac)
    a = tr.at("pattern", head[0], g)[head[1]][:, ctx]  # [T, ctx]
    return ctx[a.topk(k, dim=-1).indices.numpy()]


# --------------------------------------------------------------------------- chunks


def _response_pool(chunks: ChunkSet, pool: Pool) -> np.ndarray:
    """``[R, T]`` weights over response tokens (rows sum to 1 for mean pooling)."""
    layout = chunks.layout
    start, n = layout.response.start, len(layout.response_positions)
    m = np.zeros((len(chunks.response), n), dtype=np.float64)
    for i, c in enumerate(chunks.response):
        m[i, c.tok_start - start : c.tok_end - start] = 1.0
    if pool == "mean":
        m /= np.maximum(m.sum(1, keepdims=True), 1.0)
    return m


def _context_pool(chunks: ChunkSet, n_keys: int, pool: Pool) -> np.ndarray:
    """``[S, C]`` weights over key positions (columns sum to 1 for mean pooling)."""
    m = np.zeros((n_keys, len(chunks.context)), dtype=np.float64)
    for i, c in enumerate(chunks.context):
        m[c.tok_start : c.tok_end, i] = 1.0
    if pool == "mean":
        m /= np.maximum(m.sum(0, keepdims=True), 1.0)
    return m


def chunk_attention(
    tr: Trace, chunks: ChunkSet, layers: Sequence[int], *, pool: Pool = "mean"
) -> Float[np.ndarray, "layer head resp_chunk ctx_chunk"]:
    """Attention mass ``W[l, h, r, c]`` from response chunk ``r`` to context chunk ``c``.

    ``mean``: the mean of ``A[l, h][g, k]`` over ``r``'s generation positions
    ``g`` and ``c``'s positions ``k`` (the paper); ``sum``: their sum (the
    public code).
    """
    import torch

    if pool not in ("mean", "sum"):
        raise ValueError(f"unknown pool {pool!r}; use 'mean' or 'sum'")
    g = tr.layout.generation_positions
    rm = torch.as_tensor(_response_pool(chunks, pool))
    cm = torch.as_tensor(_context_pool(chunks, len(tr.layout), pool))
    out = []
    for layer in layers:
        a = tr.at("pattern", int(layer), g).double()  # [H, T, S]
        out.append(torch.einsum("rt,hts,sc->hrc", rm, a, cm).numpy())
    return np.stack(out).astype(np.float32)


@dataclass(frozen=True, kw_only=True, eq=False)
class ChunkECS:
    """Chunk-level ECS of one example.

    Attributes:
        ecs: ``[resp_chunk, layer, head]`` cosine of each response chunk with
            the context chunk the head attends to most.
        attended: ``[resp_chunk, layer, head]`` index of that context chunk
            (into ``ChunkSet.context``; -1 without context chunks).
        similarity: ``[resp_chunk, ctx_chunk]`` embedding cosines.
        layers: The layers of axis 1.
    """

    ecs: Float[np.ndarray, "resp layer head"]
    attended: Int[np.ndarray, "resp layer head"]
    similarity: Float[np.ndarray, "resp ctx"]
    layers: tuple[int, ...]


def chunk_embeddings(
    tr: Trace,
    chunks: ChunkSet,
    *,
    embedder: ChunkEmbedder = "minilm",
    sentence_embedder: SentenceEmbedder | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Embeddings of the response chunks and of the context chunks.

    ``minilm``: all-MiniLM-L6-v2 on the chunk texts; ``model``: the analysed
    model's final hidden state averaged over the chunk's positions (needs
    ``ln_final`` at the response and context positions).
    """
    if embedder == "minilm":
        emb = sentence_embedder or default_embedder()
        texts = [c.text for c in chunks.response] + [c.text for c in chunks.context]
        e = emb.embed(texts) if texts else np.zeros((0, emb.dim), dtype=np.float32)
        n = len(chunks.response)
        return e[:n], e[n:]
    if embedder == "model":

        def mean_hidden(cs: Sequence[Chunk]) -> np.ndarray:
            rows = [tr.at("ln_final", None, c.positions).double().mean(0).numpy() for c in cs]
            return np.stack(rows) if rows else np.zeros((0, 1))

        return mean_hidden(chunks.response), mean_hidden(chunks.context)
    raise ValueError(f"unknown chunk embedder {embedder!r}; use 'minilm' or 'model'")


def chunk_ecs(
    tr: Trace,
    chunks: ChunkSet,
    layers: Sequence[int],
    *,
    pool: Pool = "mean",
    embedder: ChunkEmbedder = "minilm",
    sentence_embedder: SentenceEmbedder | None = None,
) -> ChunkECS:
    """ECS~ of every response chunk for every head of ``layers`` (see the module docstring)."""

    n_heads = int(tr.get("pattern", int(layers[0])).shape[0]) if layers else 0
    n_r, n_c = len(chunks.response), len(chunks.context)
    if n_c == 0 or n_r == 0 or not layers:
        shape = (n_r, len(layers), n_heads)
        return ChunkECS(
            ecs=np.zeros(shape, dtype=np.float32),
            attended=np.full(shape, -1, dtype=np.int64),
            similarity=np.zeros((n_r, n_c), dtype=np.float32),
            layers=tuple(int(x) for x in layers),
        )
    er, ec = chunk_embeddings(tr, chunks, embedder=embedder, sentence_embedder=sentence_embedder)
    sim = np.asarray(cosine(er[:, None, :], ec[None, :, :]), dtype=np.float32)  # [R, C]
    w = chunk_attention(tr, chunks, layers, pool=pool)  # [L, H, R, C]
    star = w.argmax(-1).transpose(2, 0, 1)  # [R, L, H]
    ecs = np.take_along_axis(sim[:, None, None, :], star[..., None], axis=-1)[..., 0]
    return ChunkECS(
        ecs=ecs.astype(np.float32),
        attended=star.astype(np.int64),
        similarity=sim,
        layers=tuple(int(x) for x in layers),
    )


def chunk_means(
    values: Float[np.ndarray, "row resp"], chunks: ChunkSet
) -> Float[np.ndarray, "resp_chunk row"]:
    """Mean of per-response-token ``values`` over each response chunk's tokens (e.g. PKS)."""
    m = _response_pool(chunks, "mean")  # [R, T]
    return (m @ np.asarray(values, dtype=np.float64).T).astype(np.float32)
