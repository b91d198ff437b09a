"""Trace engine: one forward pass, only the activations the detectors asked for.

Detectors declare :class:`Needs` (which hook kinds at which layers, at which
positions); the engine takes their union, runs ONE forward pass through the
TransformerLens bridge with hooks on exactly those names, and keeps only the
requested positions, as float32 on the CPU.

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
ln_final       ``ln_final.hook_out``             ``[pos, d_model]``
ln_final_scale ``ln_final.hook_scale``           ``[pos, 1]``
logits         (the forward's output)            ``[pos, d_vocab]``
=============  ================================  ===============================
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, get_args

import numpy as np

from core.errors import ModelError

if TYPE_CHECKING:
    import torch
    from jaxtyping import Float

    from core.layout import Layout
    from core.model import LoadedModel

HookKind = Literal[
    "resid_pre",
    "resid_mid",
    "resid_post",
    "attn_out",
    "mlp_out",
    "z",
    "pattern",
    "ln_final",
    "ln_final_scale",
    "logits",
]
HOOK_KINDS: tuple[str, ...] = get_args(HookKind)
LAYERLESS: frozenset[str] = frozenset({"ln_final", "ln_final_scale", "logits"})
_HOOK_NAMES: dict[str, str] = {
    "resid_pre": "blocks.{l}.hook_resid_pre",
    "resid_mid": "blocks.{l}.hook_resid_mid",
    "resid_post": "blocks.{l}.hook_resid_post",
    "attn_out": "blocks.{l}.hook_attn_out",
    "mlp_out": "blocks.{l}.hook_mlp_out",
    "z": "blocks.{l}.attn.hook_z",
    "pattern": "blocks.{l}.attn.hook_pattern",
    "ln_final": "ln_final.hook_out",
    "ln_final_scale": "ln_final.hook_scale",
}

PositionSet = Literal["all", "response", "generation", "context"]
POSITION_SETS: tuple[str, ...] = get_args(PositionSet)

HookKey = tuple[str, int | None]


@dataclass(frozen=True, kw_only=True)
class Needs:
    """What a detector needs from the forward pass.

    Attributes:
        hooks: ``(kind, layer)`` pairs; ``layer`` is ``None`` for layerless kinds.
        positions: Which positions to keep (``all``, ``response`` = p_j,
            ``generation`` = g_j = p_j - 1, ``context`` = passage tokens).
    """

    hooks: frozenset[HookKey] = frozenset()
    positions: frozenset[str] = frozenset({"all"})

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
        return Needs(hooks=self.hooks | other.hooks, positions=self.positions | other.positions)

    @staticmethod
    def union(needs: Iterable[Needs]) -> Needs:
        out: Needs | None = None
        for n in needs:
            out = n if out is None else out | n
        if out is None:
            raise ValueError("no needs to combine")
        return out

    def hook_names(self) -> dict[str, HookKey]:
        """TransformerLens hook name -> ``(kind, layer)`` for every hooked kind."""
        return {
            _HOOK_NAMES[kind].format(l=layer): (kind, layer)
            for kind, layer in sorted(
                self.hooks, key=lambda h: (h[0], -1 if h[1] is None else h[1])
            )
            if kind != "logits"
        }

    def resolve_positions(self, layout: Layout) -> np.ndarray:
        """Sorted absolute positions to keep for ``layout``."""
        if "all" in self.positions:
            return np.arange(len(layout))
        parts = []
        if "response" in self.positions:
            parts.append(layout.response_positions)
        if "generation" in self.positions:
            parts.append(layout.generation_positions)
        if "context" in self.positions:
            parts.append(layout.context_positions())
        return np.unique(np.concatenate(parts)).astype(np.int64)


@dataclass(frozen=True, kw_only=True, eq=False)
class Trace:
    """Activations of one forward pass, at the kept positions.

    Attributes:
        layout: The layout that was run.
        positions: Kept absolute positions, sorted, shape ``[pos]``.
        acts: ``(kind, layer)`` -> float32 CPU tensor (shapes in the module doc).
        seconds: Wall time of the forward pass with hooks.
    """

    layout: Layout
    positions: np.ndarray
    acts: Mapping[HookKey, torch.Tensor]
    seconds: float
    _row: dict[int, int] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self._row.update({int(p): i for i, p in enumerate(self.positions)})

    def get(self, kind: str, layer: int | None = None) -> torch.Tensor:
        key = (kind, layer)
        if key not in self.acts:
            have = sorted(f"{k}@{ly}" for k, ly in self.acts)
            raise KeyError(
                f"{kind}@{layer} was not traced; the trace holds {have}. Add it to Needs"
            )
        return self.acts[key]

    def rows(self, positions: Iterable[int] | np.ndarray) -> np.ndarray:
        """Row indices of absolute ``positions`` in the kept tensors."""
        try:
            return np.asarray(
                [self._row[int(p)] for p in np.asarray(positions).ravel()], dtype=np.int64
            )
        except KeyError as e:
            raise KeyError(
                f"position {e.args[0]} was not kept; ask for it in Needs.positions"
            ) from e

    def at(
        self, kind: str, layer: int | None, positions: Iterable[int] | np.ndarray
    ) -> torch.Tensor:
        """Activations at absolute ``positions`` (pattern: the query axis)."""
        t = self.get(kind, layer)
        idx = self.rows(positions)
        return t[:, idx] if kind == "pattern" else t[idx]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.acts.values())


def trace(model: LoadedModel, layout: Layout, needs: Needs | Iterable[Needs]) -> Trace:
    """Run one forward pass over ``layout`` and keep what ``needs`` asks for.

    Args:
        model: The loaded model (its lock is held during the pass).
        layout: Token ids and positions, from :func:`core.layout.render`.
        needs: One :class:`Needs` or several (their union is traced).

    Returns:
        A :class:`Trace` with float32 CPU tensors.
    """
    import torch

    want = needs if isinstance(needs, Needs) else Needs.union(needs)
    keep = want.resolve_positions(layout)
    if keep.size and (keep.min() < 0 or keep.max() >= len(layout)):
        raise ModelError(f"positions outside the layout of {len(layout)} tokens")
    names = want.hook_names()
    keep_t = torch.as_tensor(keep, device=model.device)
    store: dict[HookKey, torch.Tensor] = {}

    def saver(key: HookKey):  # noqa: ANN202
        # Bridge hook names are aliases (hook_z fires as attn.o.hook_in), so the
        # key is bound here rather than read back from the hook point.
        def save(act: torch.Tensor, hook: object) -> None:
            a = act[0]
            a = a.index_select(1, keep_t) if key[0] == "pattern" else a.index_select(0, keep_t)
            store[key] = a.detach().to("cpu", torch.float32)

        return save

    ids = torch.as_tensor(layout.token_ids, device=model.device).unsqueeze(0)
    t0 = time.perf_counter()
    with model.lock, torch.inference_mode():
        logits = model.bridge.run_with_hooks(
            ids, fwd_hooks=[(name, saver(key)) for name, key in names.items()], return_type="logits"
        )
        if ("logits", None) in want.hooks:
            store[("logits", None)] = logits[0].index_select(0, keep_t).to("cpu", torch.float32)
    seconds = time.perf_counter() - t0
    missing = [n for n, k in names.items() if k not in store]
    if missing:
        raise ModelError(f"hooks did not fire on {model.info.display_name}: {missing[:5]}")
    return Trace(layout=layout, positions=keep, acts=store, seconds=seconds)


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
