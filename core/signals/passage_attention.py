"""Which passage text the model read for each answer token: context attribution from attention.

For the answer token ``y_j`` (read at its generation position ``g_j``, the position
that predicted it, ``specs/redeep.md``), the attention of head ``(l, h)`` on each
passage token ``c`` is ``A[l, h, g_j, c]``. A *head group* averages it over its heads:

- ``all``: every head of every layer;
- ``early`` / ``middle`` / ``late``: the heads of the first, second and last third of
  the layers;
- ``copying``: the copying heads given (ReDeEP's top heads by OV-circuit copying score,
  :mod:`core.signals.copying_heads`), when any are.

A span's attribution sums its tokens' rows; a passage *unit* (a sentence, given as
``(passage, start, end)`` characters) sums its tokens' columns. Attention is read as
it is (raw mass, not a gradient or an ablation): :attr:`ContextReading.mass` says how
much of the answer tokens' attention went to the passages at all, and
:meth:`ContextReading.unit_shares` normalises over the passages, so the shares of a span
sum to 1 whenever it attended to them. Whether the top unit matters to the model is a
separate, causal question, answered by ablation
(:mod:`core.evaluation.attribution_check`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from core.engine.layout import Layout
from core.engine.trace import Needs, Trace

GROUPS: tuple[str, ...] = ("all", "early", "middle", "late", "copying")
"""Head groups, in the order a view offers them (``copying`` only when heads are given)."""

GROUP_LABELS: Mapping[str, str] = {
    "all": "all heads",
    "early": "early layers' heads",
    "middle": "middle layers' heads",
    "late": "late layers' heads",
    "copying": "copying heads",
}


def reading_needs(n_layers: int) -> Needs:
    """What :func:`read_context` reads: every layer's attention at the generation positions."""
    return Needs.of(["pattern"], n_layers=n_layers, positions="generation")


def head_groups(
    n_layers: int, n_heads: int, copying: Sequence[tuple[int, int]] = ()
) -> dict[str, np.ndarray]:
    """Each group's heads as a ``[layer, head]`` boolean mask (``copying`` only when given).

    Raises:
        ValueError: A copying head is outside the model.
    """
    if n_layers < 1 or n_heads < 1:
        raise ValueError(f"a model has at least one layer and head, not {n_layers}x{n_heads}")
    masks: dict[str, np.ndarray] = {"all": np.ones((n_layers, n_heads), dtype=bool)}
    cuts = np.linspace(0, n_layers, 4).round().astype(int)
    for name, lo, hi in zip(("early", "middle", "late"), cuts[:-1], cuts[1:], strict=True):
        m = np.zeros((n_layers, n_heads), dtype=bool)
        m[lo:hi] = True
        if m.any():
            masks[name] = m
    if copying:
        m = np.zeros((n_layers, n_heads), dtype=bool)
        for layer, head in copying:
            if not (0 <= layer < n_layers and 0 <= head < n_heads):
                raise ValueError(
                    f"copying head L{layer}H{head} is outside a {n_layers}x{n_heads} model"
                )
            m[layer, head] = True
        masks["copying"] = m
    return masks


def group_layers(mask: np.ndarray) -> tuple[int, ...]:
    """The layers a group's mask touches."""
    return tuple(int(i) for i in np.nonzero(mask.any(axis=1))[0])


@dataclass(frozen=True, kw_only=True, eq=False)
class ContextReading:
    """Each answer token's attention on each passage token, per head group.

    Attributes:
        layout: The layout that was read.
        context: ``[ctx]`` absolute positions of the passage tokens, sorted.
        groups: Group names, in :data:`GROUPS` order.
        weights: ``[group, resp, ctx]`` mean attention of the group's heads from each
            answer token's generation position on each passage token (raw).
        units: ``(passage, start, end)`` character ranges of the passage units.
        unit_of: ``[ctx]`` the unit each passage token belongs to (the first unit it
            overlaps), ``-1`` for none.
        heads: Group name -> its ``[layer, head]`` mask.
    """

    layout: Layout
    context: np.ndarray
    groups: tuple[str, ...]
    weights: np.ndarray
    units: tuple[tuple[int, int, int], ...]
    unit_of: np.ndarray
    heads: Mapping[str, np.ndarray]

    def __post_init__(self) -> None:
        n_g, n_t, n_c = self.weights.shape
        assert n_g == len(self.groups), "one weight block per group"
        assert n_t == len(self.layout.generation_positions), "one row per answer token"
        assert self.context.shape == (n_c,) and self.unit_of.shape == (n_c,), "context shape"

    @property
    def n_tokens(self) -> int:
        return int(self.weights.shape[1])

    def _rows(self, group: str, tokens: slice | Sequence[int] | np.ndarray) -> np.ndarray:
        if group not in self.groups:
            raise KeyError(f"no head group {group!r}; this reading has {list(self.groups)}")
        w = self.weights[self.groups.index(group)]
        rows = w[tokens] if isinstance(tokens, slice) else w[np.asarray(tokens, dtype=np.int64)]
        return rows.reshape(-1, w.shape[1])

    def token_weights(self, group: str, tokens: slice | Sequence[int] | np.ndarray) -> np.ndarray:
        """``[ctx]`` the attention of ``tokens`` (answer token indices) on each passage token,
        summed over the tokens (raw)."""
        return self._rows(group, tokens).sum(axis=0, dtype=np.float64)

    def mass(self, group: str, tokens: slice | Sequence[int] | np.ndarray) -> float:
        """Mean share of the tokens' attention that went to the passages at all."""
        rows = self._rows(group, tokens)
        return float(rows.sum(axis=1).mean()) if rows.shape[0] else 0.0

    def token_shares(self, group: str, tokens: slice | Sequence[int] | np.ndarray) -> np.ndarray:
        """``[ctx]`` each passage token's share of the tokens' passage attention (sums to 1,
        or all zeros when they attended to no passage token)."""
        w = self.token_weights(group, tokens)
        total = w.sum()
        return w / total if total > 0 else np.zeros_like(w)

    def unit_shares(self, group: str, tokens: slice | Sequence[int] | np.ndarray) -> np.ndarray:
        """``[unit]`` each unit's share of the tokens' passage attention (tokens outside
        every unit count towards the total, so the shares may sum to less than 1)."""
        w = self.token_shares(group, tokens)
        out = np.zeros(len(self.units), dtype=np.float64)
        inside = self.unit_of >= 0
        np.add.at(out, self.unit_of[inside], w[inside])
        return out

    def unit_positions(self, unit: int) -> tuple[int, int]:
        """Absolute positions ``[a, b)`` of a unit's tokens."""
        p, s, e = self.units[unit]
        return self.layout.passage_chars_to_positions(p, s, e)


def _unit_index(
    layout: Layout, context: np.ndarray, units: Sequence[tuple[int, int, int]]
) -> np.ndarray:
    out = np.full(context.shape, -1, dtype=np.int64)
    for k, (p, s, e) in enumerate(units):
        a, b = layout.passage_chars_to_positions(p, s, e)
        lo, hi = np.searchsorted(context, [a, b])
        span = out[lo:hi]
        span[span < 0] = k
    return out


def context_reading(
    layout: Layout,
    attention: np.ndarray,
    context: np.ndarray,
    units: Sequence[tuple[int, int, int]],
    *,
    copying: Sequence[tuple[int, int]] = (),
) -> ContextReading:
    """A :class:`ContextReading` from attention already read off a trace.

    Args:
        layout: The layout traced.
        attention: ``[layer, head, resp, ctx]`` attention from each answer token's
            generation position on each position of ``context``.
        context: ``[ctx]`` the positions ``attention`` covers (sorted): the passage
            positions (:meth:`~core.engine.layout.Layout.context_positions`) or more
            (the whole prompt), of which only the passages' are kept.
        units: ``(passage, start, end)`` character ranges (e.g. passage sentences).
        copying: Copying heads ``(layer, head)`` for the ``copying`` group.

    Raises:
        ValueError: Shapes disagree, or a unit or copying head is outside the layout/model.
    """
    att = np.asarray(attention, dtype=np.float32)
    ctx = np.asarray(context, dtype=np.int64)
    if att.ndim != 4 or att.shape[3] != ctx.shape[0]:
        raise ValueError(
            f"attention has shape {att.shape}; expected [layer, head, resp, {ctx.shape[0]}]"
        )
    if att.shape[2] != len(layout.generation_positions):
        raise ValueError(
            f"attention has {att.shape[2]} answer rows; the layout has "
            f"{len(layout.generation_positions)} answer tokens"
        )
    if ctx.size and np.any(np.diff(ctx) <= 0):
        raise ValueError("context positions must be sorted and distinct")
    keep = np.isin(ctx, layout.context_positions())  # a prompt-wide context: its passages
    if not keep.all():
        att, ctx = att[..., keep], ctx[keep]
    masks = head_groups(att.shape[0], att.shape[1], copying)
    groups = tuple(g for g in GROUPS if g in masks)
    weights = np.stack([att[masks[g]].mean(axis=0) for g in groups]).astype(np.float32)
    try:
        unit_of = _unit_index(layout, ctx, units)
    except (IndexError, ValueError) as e:
        raise ValueError(f"a passage unit is outside the layout: {e}") from e
    return ContextReading(
        layout=layout,
        context=ctx,
        groups=groups,
        weights=weights,
        units=tuple((int(p), int(s), int(e)) for p, s, e in units),
        unit_of=unit_of,
        heads=masks,
    )


def read_context(
    tr: Trace,
    units: Sequence[tuple[int, int, int]],
    *,
    copying: Sequence[tuple[int, int]] = (),
) -> ContextReading:
    """Read :func:`context_reading` off a trace holding :func:`reading_needs`."""
    import torch

    layout = tr.layout
    ctx = layout.context_positions()
    g = layout.generation_positions
    layers = sorted(ly for kind, ly in tr.acts if kind == "pattern" and ly is not None)
    if not layers or layers != list(range(len(layers))):
        raise KeyError("the trace lacks every layer's attention pattern; trace reading_needs()")
    idx = torch.as_tensor(ctx)
    att = np.stack([tr.at("pattern", ly, g)[:, :, idx].float().numpy() for ly in layers])
    return context_reading(layout, att, ctx, units, copying=copying)
