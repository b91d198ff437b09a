"""SPAD (Lu et al., 2025): each answer token's probability split exactly into seven sources.

For the response token ``y = y_j`` produced at generation position ``g = g_j``
(``specs/spad.md``), with the probe ``Phi(x, y) = softmax(x W_U + b_U)_y``
(no final norm: the norm's effect is its own source):

- ``Init = Phi(resid_pre[0]_g)``;
- ``dAttn[l] = Phi(resid_mid[l]_g) - Phi(resid_pre[l]_g)`` and
  ``dFFN[l] = Phi(resid_post[l]_g) - Phi(resid_mid[l]_g)``
  (``resid_pre[l]`` is ``resid_post[l-1]``, the same tensor);
- ``LN = P_final(y) - Phi(resid_post[L-1]_g)``, ``P_final`` from the model's logits.

These telescope to ``P_final``. Each layer's ``dAttn[l]`` is shared among its
heads by ``w[l, h] = softmax_h((z[l,h]_g W_O[h]) . W_U[:, y])`` (the head's
direct logit for ``y``; ``z`` is per query head, so grouped-query attention
needs nothing special), and each head's share among four sources by its
attention row at ``g``: ``RAG`` (passage tokens), ``Past`` (response tokens
before ``g``), ``Self`` (``g``) and ``Query`` (every other position before
``g``: BOS, template, instruction, question). Seven numbers per token —
Query, RAG, Past, Self, FFN, LN, Init — that sum to ``P_final(y)``.

Part-of-speech aggregation (:func:`pos_features`): spaCy tags the response,
each token takes the tag of the word its characters overlap most
(whitespace-only tokens take ``SPACE``), and the 126 features are the mean
seven-vector of the tokens of each of 18 tags (zeros for absent tags), named
source first: ``RAG_NOUN``, ``LN_NUM``, ...

Cost: ``2L + 1`` vocabulary-size probes per response token (the last is the
model's own logits), computed batched over tokens in row chunks, only at the
generation positions.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from core.base.errors import ModelError
from core.engine.layout import Layout
from core.engine.model import LoadedModel
from core.engine.trace import Needs, Trace
from core.signals.lens import (
    _chunks,
    _logits_buffer,
    _logits_chunk,
    _unembed,
    row_step,
    unembed_columns,
)
from core.signals.pos import spacy_pipeline

if TYPE_CHECKING:
    import pandas as pd
    import torch
    from jaxtyping import Float, Int

SOURCES: tuple[str, ...] = ("Query", "RAG", "Past", "Self", "FFN", "LN", "Init")
"""The seven sources, in the column order of :attr:`TokenSources.values`."""
ATTENTION_SOURCES: tuple[str, ...] = SOURCES[:4]
POS_TAGS: tuple[str, ...] = (
    "ADJ",
    "ADP",
    "ADV",
    "AUX",
    "CCONJ",
    "DET",
    "INTJ",
    "NOUN",
    "NUM",
    "PART",
    "PRON",
    "PROPN",
    "PUNCT",
    "SCONJ",
    "SYM",
    "VERB",
    "X",
    "SPACE",
)
"""The 17 Universal Dependencies tags plus spaCy's ``SPACE``."""
PROBE_CHUNK = 256
"""Rows per vocabulary-size probe (a 256 x vocab float32 block: 50 MB for 49k tokens)."""
SPLIT_TOLERANCE = 1e-4
"""Largest allowed ``|sum of the seven sources - P_final|`` (float32, ``specs/spad.md``)."""
FEATURE_NAMES: tuple[str, ...] = tuple(f"{s}_{t}" for s in SOURCES for t in POS_TAGS)
"""The 126 response features, source first: ``Query_ADJ``, ..., ``Init_SPACE``."""


# --------------------------------------------------------------------------- result


@dataclass(frozen=True, kw_only=True, eq=False)
class TokenSources:
    """The seven-source split of every response token's final probability.

    Attributes:
        values: ``[T, 7]`` float32, columns :data:`SOURCES`; rows sum to ``p_final``.
        p_final: ``[T]`` probability the model gave each response token.
        token_ids: ``[T]`` the response token ids ``y_j``.
        token_offsets: ``[T, 2]`` character range of each token in the response.
        generation_positions: ``[T]`` absolute positions ``g_j`` the split was read at.
        d_attn: ``[T, layer]`` per-layer attention change ``dAttn[l]``.
        d_ffn: ``[T, layer]`` per-layer FFN change ``dFFN[l]``.
        tokens: The response tokens as text (for tables and hover labels).
    """

    values: Float[np.ndarray, "resp 7"]
    p_final: Float[np.ndarray, " resp"]
    token_ids: Int[np.ndarray, " resp"]
    token_offsets: Int[np.ndarray, "resp 2"]
    generation_positions: Int[np.ndarray, " resp"]
    d_attn: Float[np.ndarray, "resp layer"]
    d_ffn: Float[np.ndarray, "resp layer"]
    tokens: tuple[str, ...] = ()
    names: tuple[str, ...] = SOURCES

    def __post_init__(self) -> None:
        t = self.values.shape[0]
        if self.values.shape != (t, len(self.names)) or self.p_final.shape != (t,):
            raise ValueError(
                f"values must be [T, {len(self.names)}] and p_final [T]; got "
                f"{self.values.shape} and {self.p_final.shape}"
            )

    def __len__(self) -> int:
        return int(self.values.shape[0])

    @property
    def max_error(self) -> float:
        """Largest ``|sum of the seven sources - P_final|`` over the tokens."""
        if not len(self):
            return 0.0
        total = self.values.astype(np.float64).sum(1)
        return float(np.abs(total - self.p_final.astype(np.float64)).max())

    def to_frame(self, pos: Sequence[str] | None = None) -> pd.DataFrame:
        """One row per token: index, text, offsets, the seven sources, ``P_final`` (and POS)."""
        import pandas as pd

        df = pd.DataFrame(self.values, columns=list(self.names))
        df.insert(0, "token", list(self.tokens) if self.tokens else [""] * len(self))
        df.insert(0, "end", self.token_offsets[:, 1])
        df.insert(0, "start", self.token_offsets[:, 0])
        df.insert(0, "j", np.arange(len(self)))
        df["P_final"] = self.p_final
        if pos is not None:
            df["pos"] = list(pos)
        return df


# --------------------------------------------------------------------------- needs


def spad_needs(n_layers: int) -> Needs:
    """What :func:`token_sources` reads, all at the generation positions."""
    return (
        Needs.of(["resid_pre"], layers=[0], positions="generation")
        | Needs.of(
            ["resid_mid", "resid_post", "z", "pattern"], n_layers=n_layers, positions="generation"
        )
        | Needs.of(["logits"], positions="generation")
    )


# --------------------------------------------------------------------------- engine


def _probe_probs(
    model: LoadedModel, x: torch.Tensor, y: torch.Tensor, chunk_size: int
) -> torch.Tensor:
    """``softmax(x W_U + b_U)[y]`` row by row, no final norm; float32 CPU ``[T]``."""
    import torch

    u = _unembed(model)
    out = torch.empty(x.shape[0], dtype=torch.float32)
    buf = _logits_buffer(u, min(chunk_size, x.shape[0]))
    for s in _chunks(x.shape[0], chunk_size):
        logits = _logits_chunk(u, x[s], final_norm=False, out=buf)
        yy = y[s].to(logits.device)[:, None]
        # log_softmax, not gathered logit - logsumexp: the same numbers, and on CPU its
        # vectorized kernel is ~4x faster on these unnormalised lenses, whose logits span
        # hundreds of nats (logsumexp's exp of far-below-max entries takes a slow path);
        # a few rows at a time so its output stays in the cache.
        step = row_step(logits)
        for r in _chunks(logits.shape[0], step):
            lp = torch.log_softmax(logits[r], dim=-1).gather(1, yy[r]).squeeze(1)
            out[s.start + r.start : s.start + r.stop] = lp.exp().cpu()
    return out


_W_O: weakref.WeakKeyDictionary[LoadedModel, torch.Tensor] = weakref.WeakKeyDictionary()


def _head_out_weights(model: LoadedModel) -> Float[torch.Tensor, "layer head d_head d_model"]:
    """``W_O`` per query head, float32 on the CPU (cached per model)."""
    import torch

    hit = _W_O.get(model)
    if hit is not None:
        return hit
    info = model.info
    with model.lock:
        W_O = model.bridge.W_O.detach()
    want = (info.n_layers, info.n_heads, info.d_head, info.d_model)
    if tuple(W_O.shape) != want:
        raise ModelError(
            f"W_O of {info.display_name} has shape {tuple(W_O.shape)}; SPAD needs one "
            f"[d_head, d_model] block per query head {want}"
        )
    out = W_O.to("cpu", torch.float32)
    _W_O[model] = out
    return out


def source_masks(layout: Layout) -> Float[np.ndarray, "resp 4 key"]:
    """Per response token, which key positions belong to Query, RAG, Past and Self.

    Row ``j`` covers keys ``0..len(layout)-1``; positions after ``g_j`` belong
    to no source (causal attention gives them no weight).
    """
    n = len(layout)
    g = layout.generation_positions
    p1 = int(layout.response.start)
    keys = np.arange(n)
    rag = np.zeros(n, dtype=bool)
    rag[layout.context_positions()] = True
    before = keys[None, :] < g[:, None]
    m = np.zeros((g.shape[0], 4, n), dtype=np.float32)
    m[:, 1] = before & rag[None, :]
    m[:, 2] = before & (keys[None, :] >= p1)
    m[:, 3] = keys[None, :] == g[:, None]
    m[:, 0] = before & ~rag[None, :] & (keys[None, :] < p1)
    return m


def head_weights(model: LoadedModel, tr: Trace) -> Float[np.ndarray, "layer resp head"]:
    """Each head's share ``w[l, h]`` of its layer's ``dAttn[l]``, per response token.

    ``w[l, :, h] = softmax_h((z[l,h]_g W_O[h]) . W_U[:, y])``: the softmax over
    the layer's (query) heads of their direct logits for the produced token.

    Returns:
        ``[layer, T, head]`` float64; each ``[l, j, :]`` sums to 1.
    """
    import torch

    g = tr.layout.generation_positions
    y = torch.as_tensor(tr.layout.response_ids, dtype=torch.long)
    W_O = _head_out_weights(model)
    W_Uy = unembed_columns(model, y)  # [d_model, T]
    out = []
    with torch.inference_mode():
        for ly in range(model.info.n_layers):
            z = tr.at("z", ly, g)  # [T, head, d_head]
            head_out = torch.einsum("thd,hdm->thm", z, W_O[ly])
            dz = torch.einsum("thm,mt->th", head_out, W_Uy).double()
            out.append(torch.softmax(dz, dim=-1))
    return torch.stack(out).numpy()


def source_fractions(tr: Trace, n_layers: int) -> Float[np.ndarray, "layer resp head 4"]:
    """Each head's attention at ``g_j`` split over Query, RAG, Past and Self.

    Args:
        tr: A trace with ``pattern`` at layers ``0..n_layers-1`` (generation positions).
        n_layers: The model's layer count.

    Returns:
        ``[layer, T, head, 4]`` float64 fractions of the attention row (sum 1),
        columns :data:`ATTENTION_SOURCES`.
    """
    import torch

    g = tr.layout.generation_positions
    masks = torch.as_tensor(source_masks(tr.layout)).double()
    out = []
    with torch.inference_mode():
        for ly in range(n_layers):
            A = tr.at("pattern", ly, g).double()  # [head, T, key]
            mass = torch.einsum("htk,tsk->ths", A, masks)  # [T, head, 4]
            out.append(mass / mass.sum(-1, keepdim=True).clamp_min(1e-30))
    return torch.stack(out).numpy()


def token_sources(model: LoadedModel, tr: Trace, *, chunk_size: int = PROBE_CHUNK) -> TokenSources:
    """The seven-source split of every response token (see the module docstring).

    Args:
        model: The model the trace was taken with (its W_U, b_U and W_O are read).
        tr: A trace holding :func:`spad_needs` at the generation positions.
        chunk_size: Rows per vocabulary-size probe.

    Returns:
        :class:`TokenSources`, float32, computed in float64 after the probes.
    """
    import torch

    info = model.info
    n_layers = info.n_layers
    layout = tr.layout
    g = layout.generation_positions
    y = torch.as_tensor(layout.response_ids, dtype=torch.long)

    with torch.inference_mode():
        # All 2L + 1 probes of all tokens in one batch of rows (chunked inside):
        # [resid_pre[0]; resid_mid[0..L-1]; resid_post[0..L-1]], each block T rows.
        rows = torch.cat(
            [tr.at("resid_pre", 0, g)]
            + [tr.at("resid_mid", ly, g) for ly in range(n_layers)]
            + [tr.at("resid_post", ly, g) for ly in range(n_layers)]
        )
        phi = _probe_probs(model, rows, y.repeat(2 * n_layers + 1), chunk_size)
        phi = phi.double().reshape(2 * n_layers + 1, -1)
        phi_pre0, phi_mid, phi_post = phi[0], phi[1 : n_layers + 1], phi[n_layers + 1 :]
        logits = tr.at("logits", None, g).double()
        p_final = (logits.gather(1, y[:, None]).squeeze(1) - torch.logsumexp(logits, -1)).exp()

        phi_pre = torch.cat([phi_pre0[None], phi_post[:-1]])  # resid_pre[l] = resid_post[l-1]
        d_attn = phi_mid - phi_pre  # [layer, T]
        d_ffn = phi_post - phi_mid
        d_ln = p_final - phi_post[-1]

        w_all = head_weights(model, tr)
        frac_all = source_fractions(tr, n_layers)
        attn_split = torch.einsum(
            "lt,lth,lths->ts", d_attn, torch.as_tensor(w_all), torch.as_tensor(frac_all)
        )

        values = torch.cat(
            [
                attn_split,
                d_ffn.sum(0)[:, None],
                d_ln[:, None],
                phi_pre0[:, None],
            ],
            dim=1,
        )
    vals = values.numpy().astype(np.float32)
    out = TokenSources(
        values=vals,
        p_final=p_final.numpy().astype(np.float32),
        token_ids=layout.response_ids.astype(np.int64),
        token_offsets=np.asarray(layout.response_offsets),
        generation_positions=np.asarray(g, dtype=np.int64),
        d_attn=d_attn.T.numpy().astype(np.float32),
        d_ffn=d_ffn.T.numpy().astype(np.float32),
        tokens=layout.response_token_strings(),
    )
    if out.max_error > SPLIT_TOLERANCE:
        raise ModelError(
            f"the SPAD split of {layout.example_id!r} misses P_final by {out.max_error:.2e} "
            f"(> {SPLIT_TOLERANCE:g}): a head's attention row put no mass on Query, RAG, Past "
            "or Self, or a probe overflowed; report this with the example"
        )
    return out


# --------------------------------------------------------------------------- POS


def token_pos(
    text: str, offsets: Int[np.ndarray, "resp 2"], words: Sequence[tuple[int, int, str]]
) -> tuple[str, ...]:
    """The POS tag of each response token, by character overlap with tagged words.

    Args:
        text: The response text.
        offsets: ``[T, 2]`` character range of each token.
        words: ``(start, end, tag)`` of each tagged word (e.g. spaCy tokens).

    Returns:
        ``T`` tags from :data:`POS_TAGS`: whitespace-only tokens take ``SPACE``;
        others the tag of the word they overlap most (the first on ties; ``X``
        when they overlap none); tags outside :data:`POS_TAGS` become ``X``.
    """
    offs = np.asarray(offsets, dtype=np.int64).reshape(-1, 2)
    tags: list[str] = []
    if words:
        ws = np.asarray([w[0] for w in words], dtype=np.int64)
        we = np.asarray([w[1] for w in words], dtype=np.int64)
        overlap = np.minimum(offs[:, 1:2], we[None, :]) - np.maximum(offs[:, 0:1], ws[None, :])
    else:
        overlap = np.zeros((offs.shape[0], 0), dtype=np.int64)
    known = set(POS_TAGS)
    for j, (a, b) in enumerate(offs):
        if not text[a:b].strip():
            tags.append("SPACE")
            continue
        if overlap.shape[1] == 0 or overlap[j].max() <= 0:
            tags.append("X")
            continue
        tag = words[int(overlap[j].argmax())][2]
        tags.append(tag if tag in known else "X")
    return tuple(tags)


def spacy_words(text: str) -> list[tuple[int, int, str]]:
    """``(start, end, coarse POS)`` of each spaCy token of ``text``."""

    doc = spacy_pipeline()(text)
    return [(t.idx, t.idx + len(t.text), t.pos_) for t in doc]


def response_pos(layout: Layout) -> tuple[str, ...]:
    """The POS tag of each response token of ``layout`` (spaCy on the response text)."""
    text = layout.response_text
    return token_pos(text, layout.response_offsets, spacy_words(text))


def pos_features(values: Float[np.ndarray, "resp 7"], tags: Sequence[str]) -> np.ndarray:
    """The 126 features: per tag, the mean seven-vector of its tokens (zeros if none).

    Returns:
        ``[126]`` float32 in the order of :data:`FEATURE_NAMES` (source-major).
    """
    v = np.asarray(values, dtype=np.float64)
    if v.ndim != 2 or v.shape[1] != len(SOURCES) or v.shape[0] != len(tags):
        raise ValueError(
            f"values must be [{len(tags)}, {len(SOURCES)}] for {len(tags)} tags, got {v.shape}"
        )
    col = {t: i for i, t in enumerate(POS_TAGS)}
    grid = np.zeros((len(SOURCES), len(POS_TAGS)), dtype=np.float64)
    idx = np.asarray([col.get(t, col["X"]) for t in tags], dtype=np.int64)
    for k in np.unique(idx):
        grid[:, k] = v[idx == k].mean(0)
    return grid.reshape(-1).astype(np.float32)
