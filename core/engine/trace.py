"""Trace engine: one forward pass, only the activations the detectors asked for.

Detectors declare :class:`Needs` (which hook kinds at which layers, at which
positions); the engine takes their union, runs ONE forward pass through the
TransformerLens bridge with hooks on exactly those names, and keeps only the
requested positions, as float32 on the CPU.

This module is the only one that sets TransformerLens hooks. Besides :func:`trace`,
interventions and readers use :func:`patched` (hooks held for a ``with`` block:
AARF's head scaling, SAE steering), :func:`hooked_logits` (one pass with hooks, e.g.
the SAE's spliced-in reconstruction) and :func:`residuals_until` (one layer's
residual stream, the pass stopped right after it).

Hook kinds and their TransformerLens names (layer ``l``):

=============  ================================  ===============================
kind           hook                              kept shape
=============  ================================  ===============================
resid_pre      ``blocks.l.hook_resid_pre``       ``[pos, d_model]``
resid_mid      ``blocks.l.hook_resid_mid``       ``[pos, d_model]``
resid_post     ``blocks.l.hook_resid_post``      ``[pos, d_model]``
attn_out       ``blocks.l.hook_attn_out``        ``[pos, d_model]``
mlp_out        ``blocks.l.hook_mlp_out``         ``[pos, d_model]``
z              ``blocks.l.attn.hook_z``          ``[pos, head, d_head]``
pattern        ``blocks.l.attn.hook_pattern``    ``[head, pos, key_pos]`` (all keys)
key_mass       ``blocks.l.attn.hook_pattern``    ``[head, pos, 3]`` (float64)
ln_final       ``ln_final.hook_out``             ``[pos, d_model]``
ln_final_scale ``ln_final.hook_scale``           ``[pos, 1]``
logits         (the forward's output)            ``[pos, d_vocab]``
=============  ================================  ===============================

``key_mass`` is reduced inside the hook, as each layer's attention is produced: each kept
query row's attention summed over the keys of the passages, of the prompt before the
answer, and of the answer (:data:`KEY_GROUPS`), so a signal that reads only those sums
(Lookback Lens) never keeps the rows themselves (issue 68).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import inspect
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, get_args

import numpy as np

from core.base.errors import ModelError
from core.engine.layout import Layout
from core.engine.memory import (
    ATTENTION_COPIES,
    FEATURE_COPIES,
    LENS_BLOCK,
    LONG_INPUT,
    TraceCost,
    check_budget,
    memory_budget,
    process_bytes,
)
from core.engine.model import LoadedModel, ModelInfo

if TYPE_CHECKING:
    import torch
    from jaxtyping import Float

HookKind = Literal[
    "resid_pre",
    "resid_mid",
    "resid_post",
    "attn_out",
    "mlp_out",
    "z",
    "pattern",
    "key_mass",
    "ln_final",
    "ln_final_scale",
    "logits",
]
HOOK_KINDS: tuple[str, ...] = get_args(HookKind)
LAYERLESS: frozenset[str] = frozenset({"ln_final", "ln_final_scale", "logits"})
DERIVED: dict[str, str] = {"key_mass": "pattern"}
"""Kinds reduced inside the hook of another kind: kind -> the hook it is computed from."""
HEAD_FIRST: frozenset[str] = frozenset({"pattern", "key_mass"})
"""Kinds kept ``[head, pos, ...]``: their positions are the second axis."""
KEY_GROUPS: tuple[str, ...] = ("context", "prompt", "response")
"""The key groups of ``key_mass``, in its last axis: the passage tokens, every position
before the answer's first token (the whole layout when it has no answer), the answer's
tokens."""
LN_FINAL_OUT = "ln_final.hook_out"
"""The final norm's output (weight applied): the bridge's ``hook_out``, which
TransformerLens's shorthand has no word for (its ``normalized`` is before the weight)."""


def hook_name(kind: str, layer: int | None = None) -> str:
    """The TransformerLens hook point of a hooked kind (``"resid_post"``, layer 3 ->
    ``blocks.3.hook_resid_post``), named by TransformerLens's own ``get_act_name``
    (imported here: loading TransformerLens takes seconds that commands which never
    trace must not pay; tracing has loaded it already)."""
    from transformer_lens.utilities import get_act_name

    if kind in DERIVED:
        return hook_name(DERIVED[kind], layer)
    if kind == "ln_final":
        return LN_FINAL_OUT
    if kind == "ln_final_scale":
        return get_act_name("scale")
    if kind not in HOOK_KINDS or kind == "logits" or layer is None:
        raise ValueError(f"no hook point for {kind!r} at layer {layer!r}")
    return get_act_name(kind, layer)


PositionSet = Literal["all", "response", "generation", "context"]
POSITION_SETS: tuple[str, ...] = get_args(PositionSet)

HookKey = tuple[str, int | None]


Slot = tuple[str, int | None, str]
"""``(kind, layer, position set)``: one hook kept at one set of positions."""


@dataclass(frozen=True, kw_only=True)
class Needs:
    """What a detector needs from the forward pass.

    A ``Needs`` built from ``hooks`` and ``positions`` keeps every hook at every
    one of the positions. Combining needs (``a | b``) keeps each hook at the
    positions its own needs asked for, not at everyone's: ReDeEP's attention
    patterns at the generation positions and its final hidden states at the
    passage positions stay ``[head, answer, key]`` and ``[passage, d_model]``
    instead of both growing to the whole prompt.

    Attributes:
        hooks: ``(kind, layer)`` pairs; ``layer`` is ``None`` for layerless kinds.
        positions: Which positions to keep (``all``, ``response`` = p_j,
            ``generation`` = g_j = p_j - 1, ``context`` = passage tokens); for
            combined needs, every position set some hook asked for.
        slots: ``(kind, layer, position set)`` triples, the exact plan (derived
            from ``hooks`` x ``positions`` unless given through :meth:`from_slots`).
    """

    hooks: frozenset[HookKey] = frozenset()
    positions: frozenset[str] = frozenset({"all"})
    slots: frozenset[Slot] = frozenset()

    def __post_init__(self) -> None:
        for kind, layer in self.hooks:
            if kind not in HOOK_KINDS:
                raise ValueError(f"unknown hook kind {kind!r}; use one of {HOOK_KINDS}")
            if (kind in LAYERLESS) != (layer is None):
                raise ValueError(
                    f"hook kind {kind!r} {'takes no' if kind in LAYERLESS else 'needs a'} layer"
                )
        for p in self.positions:
            if p not in POSITION_SETS:
                raise ValueError(f"unknown position set {p!r}; use one of {POSITION_SETS}")
        if not self.positions:
            raise ValueError("Needs.positions is empty; ask for at least one position set")
        full = frozenset((k, ly, p) for k, ly in self.hooks for p in self.positions)
        if not self.slots:
            object.__setattr__(self, "slots", full)
        elif not self.slots <= full or {(k, ly) for k, ly, _ in self.slots} != self.hooks:
            raise ValueError("Needs.slots must pair the given hooks with the given positions")

    @classmethod
    def from_slots(cls, slots: Iterable[Slot]) -> Needs:
        """Needs that keep each ``(kind, layer)`` at exactly its slots' position sets."""
        s = frozenset((str(k), None if ly is None else int(ly), str(p)) for k, ly, p in slots)
        if not s:
            raise ValueError("no slots: ask for at least one hook")
        return cls(
            hooks=frozenset((k, ly) for k, ly, _ in s),
            positions=frozenset(p for _, _, p in s),
            slots=s,
        )

    @classmethod
    def of(
        cls,
        kinds: Iterable[str],
        *,
        layers: Iterable[int] | None = None,
        n_layers: int | None = None,
        positions: Iterable[str] | str = "all",
    ) -> Needs:
        """Build needs for several kinds at the same layers.

        Args:
            kinds: Hook kinds.
            layers: Layers for per-layer kinds; ``None`` means all ``n_layers``.
            n_layers: Needed when ``layers`` is ``None`` and a per-layer kind is asked.
            positions: A position set name or several.
        """
        pos = frozenset({positions} if isinstance(positions, str) else positions)
        hooks: set[HookKey] = set()
        for kind in kinds:
            if kind in LAYERLESS:
                hooks.add((kind, None))
                continue
            if layers is None:
                if n_layers is None:
                    raise ValueError(f"{kind!r} at all layers needs n_layers")
                ls: Iterable[int] = range(n_layers)
            else:
                ls = layers
            hooks.update((kind, int(layer)) for layer in ls)
        return cls(hooks=frozenset(hooks), positions=pos)

    def __or__(self, other: Needs) -> Needs:
        if not self.hooks and not other.hooks:
            return Needs(positions=self.positions | other.positions)
        if not self.hooks or not other.hooks:
            return other if not self.hooks else self
        return Needs.from_slots(self.slots | other.slots)

    @staticmethod
    def union(needs: Iterable[Needs]) -> Needs:
        out: Needs | None = None
        for n in needs:
            out = n if out is None else out | n
        if out is None:
            raise ValueError("no needs to combine")
        return out

    def plan(self) -> dict[HookKey, frozenset[str]]:
        """``(kind, layer)`` -> the position sets it is kept at."""
        out: dict[HookKey, set[str]] = {}
        for k, ly, p in self.slots:
            out.setdefault((k, ly), set()).add(p)
        return {key: frozenset(v) for key, v in out.items()}

    def hook_names(self) -> dict[str, HookKey]:
        """TransformerLens hook name -> ``(kind, layer)`` for every hooked kind (the kinds
        reduced from another's hook, :data:`DERIVED`, are in :meth:`hook_pairs`)."""
        return {name: key for name, key in self.hook_pairs() if key[0] not in DERIVED}

    def hook_pairs(self) -> list[tuple[str, HookKey]]:
        """``(TransformerLens hook name, (kind, layer))`` for every hooked kind, derived
        ones included (a hook point can carry several)."""
        return [
            (hook_name(kind, layer), (kind, layer))
            for kind, layer in sorted(
                self.hooks, key=lambda h: (h[0], -1 if h[1] is None else h[1])
            )
            if kind != "logits"
        ]

    def resolve_positions(self, layout: Layout, sets: Iterable[str] | None = None) -> np.ndarray:
        """Sorted absolute positions of ``sets`` (default: all of :attr:`positions`)."""
        names = self.positions if sets is None else frozenset(sets)
        if "all" in names:
            return np.arange(len(layout))
        parts = [np.zeros(0, dtype=np.int64)]
        if "response" in names:
            parts.append(layout.response_positions)
        if "generation" in names:
            parts.append(layout.generation_positions)
        if "context" in names:
            parts.append(layout.context_positions())
        return np.unique(np.concatenate(parts)).astype(np.int64)


@dataclass(frozen=True, kw_only=True, eq=False)
class Trace:
    """Activations of one forward pass, each hook at the positions asked for it.

    Attributes:
        layout: The layout that was run.
        positions: Every kept absolute position (the union over hooks), sorted.
        acts: ``(kind, layer)`` -> float32 CPU tensor (shapes in the module doc).
        kept: ``(kind, layer)`` -> the sorted absolute positions its rows hold
            (default: :attr:`positions` for every hook).
        seconds: Wall time of the forward pass with hooks.
    """

    layout: Layout
    positions: np.ndarray
    acts: Mapping[HookKey, torch.Tensor]
    seconds: float
    kept: Mapping[HookKey, np.ndarray] = field(default_factory=dict)
    _rows: dict[HookKey | None, dict[int, int]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self._rows[None] = {int(p): i for i, p in enumerate(self.positions)}
        for key, pos in self.kept.items():
            self._rows[key] = {int(p): i for i, p in enumerate(pos)}

    def get(self, kind: str, layer: int | None = None) -> torch.Tensor:
        key = (kind, layer)
        if key not in self.acts:
            have = sorted(f"{k}@{ly}" for k, ly in self.acts)
            raise KeyError(
                f"{kind}@{layer} was not traced; the trace holds {have}. Add it to Needs"
            )
        return self.acts[key]

    def positions_of(self, kind: str, layer: int | None = None) -> np.ndarray:
        """Absolute positions held by the rows of ``kind@layer``."""
        self.get(kind, layer)
        return np.asarray(self.kept.get((kind, layer), self.positions))

    def rows(self, positions: Iterable[int] | np.ndarray, key: HookKey | None = None) -> np.ndarray:
        """Row indices of absolute ``positions`` in the kept tensors (of ``key``, if given)."""
        table = self._rows.get(key, self._rows[None]) if key is not None else self._rows[None]
        try:
            return np.asarray(
                [table[int(p)] for p in np.asarray(positions).ravel()], dtype=np.int64
            )
        except KeyError as e:
            where = "" if key is None else f" for {key[0]}@{key[1]}"
            raise KeyError(
                f"position {e.args[0]} was not kept{where}; ask for it in Needs.positions"
            ) from e

    def at(
        self, kind: str, layer: int | None, positions: Iterable[int] | np.ndarray
    ) -> torch.Tensor:
        """Activations at absolute ``positions`` (pattern: the query axis)."""
        t = self.get(kind, layer)
        idx = self.rows(positions, (kind, layer))
        return t[:, idx] if kind in HEAD_FIRST else t[idx]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.acts.values())


def row_bytes(info: ModelInfo, kind: str, n_keys: int) -> int:
    """Bytes of one kept position of ``kind`` (``n_keys``: its layout's length)."""
    if kind == "pattern":
        return info.n_heads * n_keys * 4
    if kind == "key_mass":
        return info.n_heads * len(KEY_GROUPS) * 8
    if kind == "z":
        return info.n_heads * info.d_head * 4
    if kind == "ln_final_scale":
        return 4
    if kind == "logits":
        return info.d_vocab * 4
    return info.d_model * 4


def chunked(layouts: Sequence[Layout], chunk_tokens: int | None = None) -> bool:
    """Whether :func:`trace_batch` runs ``layouts`` in chunks of queries."""
    return len(layouts) == 1 and (chunk_tokens is not None or len(layouts[0]) > CHUNK_ABOVE)


def trace_cost(
    model: LoadedModel,
    layouts: Sequence[Layout],
    needs: Needs | Iterable[Needs],
    *,
    chunk_tokens: int | None = None,
) -> TraceCost:
    """What tracing ``layouts`` for ``needs`` adds to the process's memory
    (:mod:`core.engine.memory`), from the same plan :func:`trace_batch` follows: each
    hook's kept rows exactly, the attention of one layer (a chunk's queries for a long
    prompt), the keys and values cached between chunks, and the detectors' copies. On
    an accelerator the attention and the cache live in its memory, not the process's."""
    want = needs if isinstance(needs, Needs) else Needs.union(needs)
    keeps = [
        {key: want.resolve_positions(layout, sets) for key, sets in want.plan().items()}
        for layout in layouts
    ]
    return _planned_cost(model, layouts, keeps, chunk_tokens)


def _planned_cost(
    model: LoadedModel,
    layouts: Sequence[Layout],
    keeps: Sequence[Mapping[HookKey, np.ndarray]],
    chunk_tokens: int | None,
) -> TraceCost:
    """:func:`trace_cost` from each layout's kept positions per hook (the plan
    :func:`trace_batch` has resolved already)."""
    info = model.info
    kept = sum(
        len(pos) * row_bytes(info, kind, len(layout))
        for layout, keep in zip(layouts, keeps, strict=True)
        for (kind, _layer), pos in keep.items()
    )
    width = max((len(lay) for lay in layouts), default=0)
    on_host = not str(model.device).startswith("cuda")
    if chunked(layouts, chunk_tokens):
        queries = min(width, CHUNK_TOKENS if chunk_tokens is None else max(1, chunk_tokens))
        cache = 2 * info.n_layers * info.n_kv_heads * info.d_head * width * 4
        batch = 1
    else:
        queries, cache, batch = width, 0, len(layouts)
    attention = batch * (
        ATTENTION_COPIES * info.n_heads * queries * width * 4
        + queries * (info.d_vocab + 4 * info.d_mlp) * 4  # a chunk's logits and MLP
    )
    return TraceCost(
        tokens=width,
        kept=kept,
        attention=attention if on_host else 0,
        cache=cache if on_host else 0,
        features=int(FEATURE_COPIES * kept) + (LENS_BLOCK * info.d_vocab * 4 if kept else 0),
    )


def key_groups(layout: Layout) -> tuple[np.ndarray, ...]:
    """The absolute key positions of each of :data:`KEY_GROUPS` in ``layout``."""
    answer = np.asarray(layout.response_positions, dtype=np.int64)
    before = int(answer[0]) if answer.size else len(layout)
    return (
        np.asarray(layout.context_positions(), dtype=np.int64),
        np.arange(before, dtype=np.int64),
        answer,
    )


def key_mass(rows: torch.Tensor, groups: Sequence[torch.Tensor]) -> torch.Tensor:
    """``[head, query, key]`` attention rows -> ``[head, query, len(groups)]`` float64
    sums over each group's key positions (those among the rows' keys: a key past them is
    one the queries cannot attend to yet). Summed one head at a time, so the float64 copy
    is one head's rows."""
    import torch

    n_keys = rows.shape[-1]
    inside = [g[g < n_keys] for g in groups]
    out = torch.empty((rows.shape[0], rows.shape[1], len(groups)), dtype=torch.float64)
    for h in range(rows.shape[0]):
        r = rows[h].to("cpu", torch.float64)
        for i, g in enumerate(inside):
            out[h, :, i] = r.index_select(-1, g).sum(-1)
    return out


_KEEPS_LOGITS: weakref.WeakKeyDictionary[LoadedModel, bool] = weakref.WeakKeyDictionary()


def _keeps_logits(model: LoadedModel) -> bool:
    """Whether the model's forward takes ``logits_to_keep`` (most Hugging Face causal
    LMs do): then a trace unembeds only the positions it keeps."""
    hit = _KEEPS_LOGITS.get(model)
    if hit is None:
        try:
            hit = "logits_to_keep" in inspect.signature(model.hf_model.forward).parameters
        except (TypeError, ValueError):
            hit = False
        _KEEPS_LOGITS[model] = hit
    return hit


def trace(
    model: LoadedModel,
    layout: Layout,
    needs: Needs | Iterable[Needs],
    *,
    chunk_tokens: int | None = None,
) -> Trace:
    """Run one forward pass over ``layout`` and keep what ``needs`` asks for.

    Args:
        model: The loaded model (its lock is held during the pass).
        layout: Token ids and positions, from :func:`core.engine.layout.render`.
        needs: One :class:`Needs` or several (their union is traced; each hook
            is kept at the positions asked for it).
        chunk_tokens: Queries per pass of a prompt longer than :data:`CHUNK_ABOVE`
            (default :data:`CHUNK_TOKENS`), see :func:`trace_batch`.

    Returns:
        A :class:`Trace` with float32 CPU tensors.
    """
    return trace_batch(model, [layout], needs, chunk_tokens=chunk_tokens)[0]


def trace_batch(
    model: LoadedModel,
    layouts: Sequence[Layout],
    needs: Needs | Iterable[Needs],
    *,
    chunk_tokens: int | None = None,
) -> list[Trace]:
    """:func:`trace` of several layouts in ONE forward pass.

    The token ids are right-padded to the longest layout, with an attention mask: under
    causal attention a real token never attends to the padding after it, so every
    example keeps its own absolute positions and each hook keeps, per example, only
    that example's positions (an attention pattern only its own keys). The activations
    equal one-at-a-time traces up to float rounding (batched matrix products may sum in
    another order); a batch of one is exactly :func:`trace`.

    One layout longer than :data:`CHUNK_ABOVE` tokens is run in chunks of
    ``chunk_tokens`` queries (:func:`_chunked_pass`): each chunk attends to the keys and
    values cached from the chunks before it, so no layer ever holds the prompt's whole
    ``[head, pos, pos]`` attention, and the memory of a pass grows with the prompt's
    length instead of its square (issue 68). The activations equal one pass's up to
    float rounding.

    Returns:
        One :class:`Trace` per layout, in order; each one's ``seconds`` is the batch's
        forward time divided by the batch size.
    """
    import torch

    if not layouts:
        return []
    want = needs if isinstance(needs, Needs) else Needs.union(needs)
    plans = want.plan()
    keeps: list[dict[HookKey, np.ndarray]] = []
    everys: list[np.ndarray] = []
    for layout in layouts:
        keep_by_key = {key: want.resolve_positions(layout, sets) for key, sets in plans.items()}
        every = want.resolve_positions(layout)
        if every.size and (every.min() < 0 or every.max() >= len(layout)):
            raise ModelError(f"positions outside the layout of {len(layout)} tokens")
        keeps.append(keep_by_key)
        everys.append(every)
    names = want.hook_pairs()
    keep_t = [
        {key: torch.as_tensor(pos, device=model.device) for key, pos in k.items()} for k in keeps
    ]
    lengths = [len(layout) for layout in layouts]
    stores: list[dict[HookKey, torch.Tensor]] = [{} for _ in layouts]
    groups = [
        [torch.as_tensor(g, device=model.device) for g in key_groups(layout)] for layout in layouts
    ]

    def saver(key: HookKey):  # noqa: ANN202
        # Bridge hook names are aliases (hook_z fires as attn.o.hook_in), so the
        # key is bound here rather than read back from the hook point.
        def save(act: torch.Tensor, hook: object) -> None:
            for b, n in enumerate(lengths):
                idx = keep_t[b][key]
                if key[0] == "key_mass":  # its queries' sums over each key group
                    stores[b][key] = key_mass(act[b, :, :, :n].index_select(1, idx), groups[b])
                    continue
                if key[0] == "pattern":  # [head, query, key]: its queries, its keys
                    a = act[b, :, :, :n].index_select(1, idx)
                else:
                    a = act[b].index_select(0, idx)
                stores[b][key] = a.detach().to("cpu", torch.float32)

        return save

    wants_logits = ("logits", None) in want.hooks
    cost = _planned_cost(model, layouts, keeps, chunk_tokens)
    budget, held = memory_budget(), process_bytes()
    ids = [lay.example_id for lay in layouts]
    check_budget(
        cost,
        source=", ".join(ids[:3]) + ("…" if len(ids) > 3 else ""),
        # a long prompt's cost grows about linearly with its length (chunked)
        fits=int(cost.tokens * min(1.0, max(budget - held, 0) / max(cost.total, 1))),
        budget=budget,
        held=held,
    )
    t0 = time.perf_counter()
    if chunked(layouts, chunk_tokens):
        chunk = CHUNK_TOKENS if chunk_tokens is None else int(chunk_tokens)
        if chunk < 1:
            raise ValueError(f"chunk_tokens must be at least 1, not {chunk}")
        stores[0] = _chunked_pass(model, layouts[0], keeps[0], names, wants_logits, chunk)
    else:
        hooks = [(name, saver(key)) for name, key in names]
        _padded_pass(model, layouts, keeps, keep_t, hooks, wants_logits, stores)
    seconds = (time.perf_counter() - t0) / len(layouts)
    missing = [n for n, k in names if k not in stores[0]]
    if missing:
        raise ModelError(f"hooks did not fire on {model.info.display_name}: {missing[:5]}")
    return [
        Trace(layout=layout, positions=every, acts=store, seconds=seconds, kept=keep)
        for layout, every, store, keep in zip(layouts, everys, stores, keeps, strict=True)
    ]


def _padded_pass(
    model: LoadedModel,
    layouts: Sequence[Layout],
    keeps: Sequence[Mapping[HookKey, np.ndarray]],
    keep_t: Sequence[Mapping[HookKey, torch.Tensor]],
    hooks: Sequence[tuple[str, Hook]],
    wants_logits: bool,
    stores: Sequence[dict[HookKey, torch.Tensor]],
) -> None:
    """One forward pass over ``layouts`` right-padded to the longest, ``hooks`` filling
    ``stores``; the kept logits rows are added to each example's store."""
    import torch

    lengths = [len(layout) for layout in layouts]
    width = max(lengths)
    kwargs: dict[str, Any] = {}
    if len(layouts) == 1:
        ids = torch.as_tensor(layouts[0].token_ids, device=model.device).unsqueeze(0)
    else:
        pad = model.tokenizer.pad_token_id
        pad = int(pad if pad is not None else model.tokenizer.eos_token_id or 0)
        ids = torch.full((len(layouts), width), pad, dtype=torch.long)
        mask = torch.zeros((len(layouts), width), dtype=torch.long)
        for b, layout in enumerate(layouts):
            ids[b, : lengths[b]] = torch.as_tensor(layout.token_ids)
            mask[b, : lengths[b]] = 1
        ids = ids.to(model.device)
        kwargs["attention_mask"] = mask.to(model.device)
    rows: dict[int, torch.Tensor] = {}  # per example, its logit positions' rows in the output
    if _keeps_logits(model):
        # Unembed only the positions some example keeps (the lm_head over every position
        # of a long prompt is ~15% of a pass on CPU); none kept: just the last one.
        kept = (
            np.unique(np.concatenate([k[("logits", None)] for k in keeps]))
            if wants_logits
            else np.zeros(0, dtype=np.int64)
        )
        if kept.size:
            kwargs["logits_to_keep"] = torch.as_tensor(kept, device=model.device)
            for b, k in enumerate(keeps):
                at = np.searchsorted(kept, k[("logits", None)])
                rows[b] = torch.as_tensor(at, device=model.device)
        elif not wants_logits:
            kwargs["logits_to_keep"] = 1
    with model.lock, torch.inference_mode():
        logits = model.bridge.run_with_hooks(
            ids,
            fwd_hooks=list(hooks),
            return_type="logits",
            **kwargs,
        )
        if wants_logits:
            for b in range(len(layouts)):
                idx = rows.get(b, keep_t[b][("logits", None)])
                stores[b][("logits", None)] = (
                    logits[b].index_select(0, idx).to("cpu", torch.float32)
                )


CHUNK_TOKENS = 256
"""Queries per pass when a long prompt is traced in chunks: the attention of a chunk is
``[head, CHUNK_TOKENS, keys so far]``, at 8k tokens about 75 MB a layer in float32
against 2 GB for the whole prompt's."""

CHUNK_ABOVE = LONG_INPUT
"""Prompts longer than this many tokens are traced in chunks (:func:`_chunked_pass`);
shorter ones in one pass, as they always were (their numbers stay bit for bit)."""


MMAP_THRESHOLD = 4 * 2**20
"""Buffers of at least this many bytes are mapped from the system and given back when
freed (glibc's ``M_MMAP_THRESHOLD``), see :func:`_large_buffers_unmapped`."""

_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter number


@functools.cache
def _large_buffers_unmapped() -> bool:
    """Have glibc map every buffer of :data:`MMAP_THRESHOLD` bytes or more and unmap it
    when freed, once per process (the first long prompt). By default glibc raises that
    threshold as large buffers are freed and then serves the chunked pass's buffers of a
    few MB (a layer's keys, a head's rows) from its heap, whose freed holes a growing
    prompt cannot reuse: at 8k tokens the process grew by hundreds of MB a chunk and
    peaked at 4-14 GB instead of 2. Elsewhere (another C library) nothing changes.
    Returns whether the setting took."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return bool(libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD))
    except (OSError, AttributeError):
        return False


def _chunked_pass(
    model: LoadedModel,
    layout: Layout,
    keep: Mapping[HookKey, np.ndarray],
    names: Sequence[tuple[str, HookKey]],
    wants_logits: bool,
    chunk: int,
) -> dict[HookKey, torch.Tensor]:
    """Trace one long ``layout`` in chunks of ``chunk`` queries, each chunk reading the
    keys and values the model cached for the chunks before it (the causal mask makes
    that the same computation as one pass). Each hook keeps its positions that fall in
    the chunk; an attention pattern's rows are padded with zeros to every key of the
    prompt (a query never attends to a later key), so the kept tensors are the shapes
    one pass keeps.

    Raises:
        ModelError: The model returned no KV cache to continue from.
    """
    import torch

    n = len(layout)
    pieces: dict[HookKey, list[torch.Tensor]] = {key: [] for key in keep}
    span = [0, 0]  # the chunk under way: [start, end)
    groups = [torch.as_tensor(g, device=model.device) for g in key_groups(layout)]

    def local(key: HookKey) -> np.ndarray:
        pos = keep[key]
        lo, hi = np.searchsorted(pos, span)
        return pos[lo:hi] - span[0]

    def saver(key: HookKey) -> Hook:
        def save(act: torch.Tensor, hook: object) -> None:
            idx = torch.as_tensor(local(key), device=act.device)
            if key[0] == "key_mass":
                pieces[key].append(key_mass(act[0].index_select(1, idx), groups))
            elif key[0] == "pattern":  # [head, query, keys so far] -> every key of the prompt
                a = act[0].index_select(1, idx)
                rows = torch.zeros((a.shape[0], a.shape[1], n), dtype=torch.float32)
                rows[:, :, : a.shape[2]] = a.detach().to("cpu", torch.float32)
                pieces[key].append(rows)
            else:
                pieces[key].append(act[0].index_select(0, idx).detach().to("cpu", torch.float32))

        return save

    hooks: list[tuple[str | Callable[..., Any], Callable[..., Any]]] = [
        (name, saver(key)) for name, key in names
    ]
    trims = _keeps_logits(model)
    past: Any = None
    _large_buffers_unmapped()
    with model.lock, torch.inference_mode():
        for start in range(0, n, chunk):
            span[:] = [start, min(n, start + chunk)]
            ids = torch.as_tensor(layout.token_ids[span[0] : span[1]], device=model.device)
            at = local(("logits", None)) if wants_logits else np.zeros(0, dtype=np.int64)
            kwargs: dict[str, Any] = {}
            if trims:
                kwargs["logits_to_keep"] = (
                    torch.as_tensor(at, device=model.device) if at.size else 1
                )
            logits, past = model.bridge.run_with_hooks(
                ids.unsqueeze(0),
                fwd_hooks=hooks,
                return_type="logits_and_cache",
                past_key_values=past,
                use_cache=True,
                **kwargs,
            )
            if past is None:
                raise ModelError(
                    f"{model.info.display_name} returned no KV cache to trace a long prompt in "
                    "chunks"
                )
            if wants_logits:
                rows = torch.arange(at.size) if trims else torch.as_tensor(at)
                pieces[("logits", None)].append(
                    logits[0].index_select(0, rows.to(logits.device)).to("cpu", torch.float32)
                )
    return {
        key: torch.cat(parts, dim=1 if key[0] in HEAD_FIRST else 0)
        for key, parts in pieces.items()
        if parts
    }


def response_needs() -> Needs:
    """Needs of :func:`token_surprisal`: logits at the generation positions."""
    return Needs(hooks=frozenset({("logits", None)}), positions=frozenset({"generation"}))


def token_surprisal(tr: Trace) -> Float[np.ndarray, " resp"]:
    """Surprisal ``-log2 p(y_j | y_<j, prompt)`` of each response token, in bits."""
    import torch

    logits = tr.at("logits", None, tr.layout.generation_positions)
    logp = torch.log_softmax(logits.double(), dim=-1)
    ids = torch.as_tensor(tr.layout.response_ids)
    nats = -logp.gather(1, ids.unsqueeze(1)).squeeze(1)
    return (nats / np.log(2.0)).numpy().astype(np.float32)


# --------------------------------------------------------------------------- interventions

Hook = Callable[["torch.Tensor", Any], "torch.Tensor | None"]
"""A TransformerLens forward hook: ``(activation, hook point) -> replacement or None``."""


def resid_post_name(layer: int) -> str:
    """The hook of the residual stream after block ``layer``."""
    return hook_name("resid_post", layer)


@contextmanager
def patched(model: LoadedModel, hooks: Sequence[tuple[str, Hook]]) -> Iterator[None]:
    """Every forward pass inside the ``with`` block runs with ``hooks`` (name, hook);
    the model's lock is held throughout and the hooks are removed on exit."""
    with model.lock, model.bridge.hooks(fwd_hooks=list(hooks)):
        yield


def hooked_logits(
    model: LoadedModel, token_ids: torch.Tensor, hooks: Sequence[tuple[str, Hook]]
) -> torch.Tensor:
    """The logits (``[batch, pos, d_vocab]``) of one pass over ``token_ids`` with ``hooks``."""
    import torch

    with model.lock, torch.inference_mode():
        return model.bridge.run_with_hooks(token_ids, fwd_hooks=list(hooks), return_type="logits")


def hooked_step(
    model: LoadedModel,
    token_ids: torch.Tensor,
    hooks: Sequence[tuple[str, Hook]],
    past: Any = None,
) -> tuple[torch.Tensor, Any]:
    """Incremental decoding with hooks: the logits (``[batch, new, d_vocab]``) of
    ``token_ids`` continuing the sequence whose keys and values ``past`` holds (a
    HuggingFace KV cache from an earlier call; ``None`` starts a sequence), and the cache
    extended by them. The hooks fire on the new positions only (an attention pattern's
    rows are the new queries, over every key so far); the cache is extended in place."""
    import torch

    with model.lock, torch.inference_mode():
        logits, cache = model.bridge.run_with_hooks(
            token_ids,
            fwd_hooks=list(hooks),
            return_type="logits_and_cache",
            past_key_values=past,
        )
    if cache is None:
        raise ModelError(f"{model.info.display_name} returned no KV cache; use kv_cache=False")
    return logits, cache


class _Stop(Exception):  # noqa: N818 (control flow, not an error)
    """Raised by the capture hook to end a forward pass after the layer read."""


def residuals_until(
    model: LoadedModel, token_ids: Sequence[int] | np.ndarray, layer: int
) -> Float[torch.Tensor, "pos d_model"]:
    """``resid_post`` of ``layer`` at every position, float32 CPU; the forward pass stops
    right after that block (later blocks never run)."""
    import torch

    got: list[torch.Tensor] = []

    def grab(act: torch.Tensor, hook: object) -> None:
        got.append(act[0].detach().to("cpu", torch.float32))
        raise _Stop

    name = resid_post_name(layer)
    ids = torch.as_tensor(np.asarray(token_ids), device=model.device).unsqueeze(0)
    with model.lock, torch.inference_mode():
        try:
            model.bridge.run_with_hooks(ids, fwd_hooks=[(name, grab)])
        except _Stop:
            pass
        finally:
            model.bridge.reset_hooks()
    if not got:
        raise ModelError(f"{name} did not fire on {model.info.display_name}")
    return got[0]
