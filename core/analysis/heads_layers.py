"""Heads and layers: where ReDeEP's and InterpDetect's signals live in the model.

Two views (``specs/redeep.md``, ``specs/interpdetect.md``):

- :class:`HeadStats`, over many labelled answers: from InterpDetect features
  (``ECS_L{l}H{h}`` for every head, ``PKS_L{l}`` for every layer), per head the
  mean ECS on faithful and on hallucinated answers, their difference
  (faithful - hallucinated) and the Pearson correlation of ECS with the
  inverted label ``1 - y``; per layer the mean PKS of each class, their
  difference (hallucinated - faithful) and the Pearson correlation of PKS with
  the label ``y``. Both signs are chosen so that *positive = behaves as ReDeEP
  predicts* (copying heads carry more context into faithful answers; late FFNs
  inject more parametric knowledge into hallucinated ones). Units are answers
  (the response vectors, each the mean over the answer's sentences) or
  sentences (InterpDetect's own unit, labelled by overlap with a gold span).
- :class:`HeadView`, for one answer: one traced pass gives, for every head,
  the attention from each answer token to the context tokens, the top-k
  context positions token-level ECS averages, token ECS, PKS per layer, and
  chunk ECS on recursive chunks; ReDeEP detectors passed in judge the same
  trace. Picking another head reads the stored arrays, it traces nothing.

A correlation is undefined (NaN) when a class is missing or a column is
constant; nothing here warns or raises for it. Numbers only: the figures of these
statistics and of one answer's attention are built above the engine, in
``app/components/head_charts.py`` (which draws NaN cells blank).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import numpy as np

from core.base.errors import DataError, ModelError
from core.base.examples import RAGExample
from core.detectors.common import parse_head, shared_pks
from core.detectors.interpdetect import chunk_targets
from core.detectors.redeep import (
    RedeepChunkConfig,
    RedeepChunkDetector,
    RedeepDetector,
    RedeepTokenConfig,
    RedeepTokenDetector,
)
from core.engine.layout import Layout, render
from core.engine.model import LoadedModel
from core.engine.trace import Needs, trace
from core.learning.contract import (
    Detector,
    DetectorConfig,
    Features,
    Run,
    Verdict,
    judge_features,
)
from core.learning.metrics import evidence_warning
from core.signals.chunking import ChunkSet, chunk_example, chunk_labels
from core.signals.ecs import (
    ChunkECS,
    all_heads,
    chunk_ecs,
    chunk_means,
    context_positions,
    ecs_needs,
    token_ecs,
)
from core.signals.ecs import top_k as ecs_top_k
from core.signals.lens import pks_needs

if TYPE_CHECKING:
    import pandas as pd
    from jaxtyping import Float, Int

StatsLevel = Literal["response", "chunk"]
STATS_LEVELS: tuple[StatsLevel, ...] = ("response", "chunk")
EcsKind = Literal["faithful", "hallucinated", "difference", "r"]
ECS_KINDS: tuple[EcsKind, ...] = ("faithful", "hallucinated", "difference", "r")
Head = tuple[int, int]


# --------------------------------------------------------------------------- statistics


def pearson_columns(
    x: Float[np.ndarray, "n k"], y: Float[np.ndarray, " n"]
) -> Float[np.ndarray, " k"]:
    """Pearson correlation of each column of ``x`` with ``y``.

    NaN where it is undefined: fewer than two rows, ``y`` constant, the column
    constant (exactly: its values are all equal), or the column not finite.
    """
    xs = np.asarray(x, dtype=np.float64)
    ys = np.asarray(y, dtype=np.float64).reshape(-1)
    if xs.ndim != 2 or xs.shape[0] != ys.shape[0]:
        raise ValueError(f"x must be [n, k] with n = {ys.shape[0]}, got {xs.shape}")
    out = np.full(xs.shape[1], np.nan)
    if xs.shape[0] < 2 or not np.isfinite(ys).all() or np.ptp(ys) == 0:
        return out
    finite = np.isfinite(xs).all(0)
    # ptp, not the standard deviation: the mean of equal floats need not equal them,
    # which would turn a constant column into a correlation of +-1.
    ok = finite & (np.ptp(np.where(finite, xs, 0.0), axis=0) > 0)
    if not ok.any():
        return out
    xc = xs[:, ok] - xs[:, ok].mean(0)
    yc = ys - ys.mean()
    r = (xc * yc[:, None]).sum(0) / (np.sqrt((xc**2).sum(0)) * np.sqrt((yc**2).sum()))
    out[ok] = np.clip(r, -1.0, 1.0)
    return out


def _class_mean(x: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Column means over the rows in ``mask``; NaN when there are none (no warning)."""
    if not mask.any():
        return np.full(x.shape[1:], np.nan)
    return x[mask].mean(0)


def feature_grid(names: Sequence[str]) -> tuple[int, int, np.ndarray, np.ndarray]:
    """Where InterpDetect's columns sit: ``(n_layers, n_heads, ecs_cols, pks_cols)``.

    ``ecs_cols`` is ``[layer, head]`` column indices of ``ECS_L{l}H{h}``; ``pks_cols``
    is ``[layer]`` of ``PKS_L{l}``.

    Raises:
        DataError: The names are not one ECS column per head of a full layer x head grid
            and one PKS column per layer (e.g. ReDeEP's copying-head subset).
    """

    heads: dict[Head, int] = {}
    layers: dict[int, int] = {}
    for i, n in enumerate(names):
        try:
            if n.startswith("ECS_L"):
                heads[parse_head(n)] = i
            elif n.startswith("PKS_L"):
                layers[int(n.removeprefix("PKS_L"))] = i
        except ValueError as e:
            raise DataError(f"cannot read the feature name {n!r} ({e})") from e
    n_layers = 1 + max((ly for ly, _ in heads), default=-1)
    n_heads = 1 + max((h for _, h in heads), default=-1)
    full = {(ly, h) for ly in range(n_layers) for h in range(n_heads)}
    if not heads or set(heads) != full or set(layers) != set(range(n_layers)):
        raise DataError(
            f"expected ECS_L{{l}}H{{h}} for every head and PKS_L{{l}} for every layer "
            f"(InterpDetect's features); got {len(heads)} ECS and {len(layers)} PKS columns "
            f"for {n_layers} layers x {n_heads} heads"
        )
    ecs = np.asarray(
        [[heads[(ly, h)] for h in range(n_heads)] for ly in range(n_layers)], dtype=np.int64
    )
    pks = np.asarray([layers[ly] for ly in range(n_layers)], dtype=np.int64)
    return n_layers, n_heads, ecs, pks


@dataclass(frozen=True, kw_only=True, eq=False)
class HeadStats:
    """How each head's ECS and each layer's PKS differ between faithful and hallucinated units.

    Attributes:
        level: ``"response"`` (one unit per answer) or ``"chunk"`` (one per answer sentence).
        model: :attr:`ModelInfo.key` of the model the features were read with.
        ecs_faithful: ``[layer, head]`` mean ECS over faithful units (NaN without any).
        ecs_hallucinated: ``[layer, head]`` mean ECS over hallucinated units.
        ecs_r: ``[layer, head]`` Pearson r of ECS with ``1 - y`` (NaN: undefined).
        pks_faithful: ``[layer]`` mean PKS over faithful units.
        pks_hallucinated: ``[layer]`` mean PKS over hallucinated units.
        pks_r: ``[layer]`` Pearson r of PKS with ``y``.
        n_faithful: Faithful units.
        n_hallucinated: Hallucinated units.
        example_ids: The examples whose units were counted.
        n_unlabelled: Examples left out for want of a label.
        n_invalid: Units left out because some feature was not finite.
    """

    level: StatsLevel
    model: str
    ecs_faithful: Float[np.ndarray, "layer head"]
    ecs_hallucinated: Float[np.ndarray, "layer head"]
    ecs_r: Float[np.ndarray, "layer head"]
    pks_faithful: Float[np.ndarray, " layer"]
    pks_hallucinated: Float[np.ndarray, " layer"]
    pks_r: Float[np.ndarray, " layer"]
    n_faithful: int
    n_hallucinated: int
    example_ids: tuple[str, ...] = ()
    n_unlabelled: int = 0
    n_invalid: int = 0

    def __post_init__(self) -> None:
        if self.level not in STATS_LEVELS:
            raise ValueError(f"level must be one of {STATS_LEVELS}, got {self.level!r}")
        grid = np.asarray(self.ecs_faithful, dtype=np.float64)
        if grid.ndim != 2:
            raise ValueError(f"ecs_faithful must be [layer, head], got shape {grid.shape}")
        for name in ("ecs_faithful", "ecs_hallucinated", "ecs_r"):
            v = np.asarray(getattr(self, name), dtype=np.float64)
            if v.shape != grid.shape:
                raise ValueError(f"{name} must be {grid.shape}, got {v.shape}")
            object.__setattr__(self, name, v)
        for name in ("pks_faithful", "pks_hallucinated", "pks_r"):
            v = np.asarray(getattr(self, name), dtype=np.float64).reshape(-1)
            if v.shape != (grid.shape[0],):
                raise ValueError(f"{name} must be [{grid.shape[0]}], got {v.shape}")
            object.__setattr__(self, name, v)

    @property
    def evidence(self) -> str | None:
        """Why these statistics are not to be read as facts (one class missing, or fewer
        than :data:`core.learning.metrics.MIN_CLASS_ANSWERS` units of a class), with what would
        fix it; ``None`` when there is enough of both (:func:`core.learning.metrics.evidence_warning`)."""
        labels = [1] * self.n_hallucinated + [0] * self.n_faithful
        unit = "answers" if self.level == "response" else "answer sentences"
        return evidence_warning(labels, f"These {unit}")

    # -- building ----------------------------------------------------------------

    @classmethod
    def from_features(
        cls,
        features: Sequence[Features],
        examples: Sequence[RAGExample],
        *,
        level: StatsLevel = "response",
    ) -> HeadStats:
        """Statistics of InterpDetect features against the examples' gold labels.

        Args:
            features: One InterpDetect :class:`Features` per example.
            examples: The examples, aligned with ``features``. ``response`` level uses
                ``label``; ``chunk`` level labels each sentence by overlap with a gold
                span (a hallucinated answer without spans: every sentence). Unlabelled
                examples are left out and counted.
            level: ``"response"`` or ``"chunk"``.

        Raises:
            DataError: No features, misaligned inputs, or names that are not every head's
                ECS and every layer's PKS.
            ModelError: The features come from several models or feature sets.
        """

        if level not in STATS_LEVELS:
            raise ValueError(f"level must be one of {STATS_LEVELS}, got {level!r}")
        if len(features) != len(examples):
            raise DataError(
                f"one Features per example is needed; got {len(features)} and {len(examples)}"
            )
        if not features:
            raise DataError("no features to summarise; extract some examples first")
        if len({f.model for f in features}) != 1 or len({f.names for f in features}) != 1:
            raise ModelError(
                "these features come from several models or feature sets; use one model's "
                "InterpDetect features"
            )
        names = features[0].names
        n_layers, n_heads, ecs_cols, pks_cols = feature_grid(names)
        rows: list[np.ndarray] = []
        labels: list[np.ndarray] = []
        ids: list[str] = []
        unlabelled = 0
        for f, ex in zip(features, examples, strict=True):
            if level == "response":
                if ex.label is None:
                    unlabelled += 1
                    continue
                x, y = f.response[None, :], np.asarray([int(bool(ex.label))])
            else:
                if ex.label is None and not ex.spans:
                    unlabelled += 1
                    continue
                if f.chunks is None or f.chunks.shape[0] == 0:
                    continue
                x, y = f.chunks, chunk_targets(f, ex)
            rows.append(np.asarray(x, dtype=np.float64))
            labels.append(np.asarray(y, dtype=np.int64))
            ids.append(ex.id)
        X = np.concatenate(rows) if rows else np.zeros((0, len(names)))
        y = np.concatenate(labels) if labels else np.zeros(0, dtype=np.int64)
        finite = np.isfinite(X).all(1)
        X, y = X[finite], y[finite]
        hal, fai = y == 1, y == 0
        ecs = X[:, ecs_cols.ravel()]  # [n, layer * head], layer-major
        pks = X[:, pks_cols]
        shape = (n_layers, n_heads)
        return cls(
            level=level,
            model=features[0].model,
            ecs_faithful=_class_mean(ecs, fai).reshape(shape),
            ecs_hallucinated=_class_mean(ecs, hal).reshape(shape),
            ecs_r=pearson_columns(ecs, 1 - y).reshape(shape),
            pks_faithful=_class_mean(pks, fai),
            pks_hallucinated=_class_mean(pks, hal),
            pks_r=pearson_columns(pks, y),
            n_faithful=int(fai.sum()),
            n_hallucinated=int(hal.sum()),
            example_ids=tuple(ids),
            n_unlabelled=unlabelled,
            n_invalid=int((~finite).sum()),
        )

    # -- facts ---------------------------------------------------------------------

    @property
    def n_layers(self) -> int:
        return int(self.ecs_faithful.shape[0])

    @property
    def n_heads(self) -> int:
        return int(self.ecs_faithful.shape[1])

    @property
    def n_units(self) -> int:
        return self.n_faithful + self.n_hallucinated

    @property
    def unit(self) -> str:
        """``"answers"`` or ``"sentences"``: what :attr:`n_faithful` and friends count."""
        return "answers" if self.level == "response" else "sentences"

    @property
    def ecs_difference(self) -> Float[np.ndarray, "layer head"]:
        """``[layer, head]`` mean ECS faithful minus hallucinated (> 0: ReDeEP's direction)."""
        return self.ecs_faithful - self.ecs_hallucinated

    @property
    def pks_difference(self) -> Float[np.ndarray, " layer"]:
        """``[layer]`` mean PKS hallucinated minus faithful (> 0: ReDeEP's direction)."""
        return self.pks_hallucinated - self.pks_faithful

    def ecs(self, kind: EcsKind) -> Float[np.ndarray, "layer head"]:
        """One of the four ``[layer, head]`` grids (see :data:`ECS_KINDS`)."""
        grids = {
            "faithful": self.ecs_faithful,
            "hallucinated": self.ecs_hallucinated,
            "difference": self.ecs_difference,
            "r": self.ecs_r,
        }
        if kind not in grids:
            raise ValueError(f"kind must be one of {ECS_KINDS}, got {kind!r}")
        return grids[kind]

    def top_heads(self, n: int = 5) -> list[Head]:
        """The ``n`` heads whose ECS correlates most with faithfulness (largest r; NaN last)."""
        flat = np.nan_to_num(self.ecs_r.ravel(), nan=-np.inf)
        order = np.argsort(-flat, kind="stable")
        keep = [int(i) for i in order[: max(n, 0)] if np.isfinite(flat[i])]
        return [(i // self.n_heads, i % self.n_heads) for i in keep]

    # -- tables ----------------------------------------------------------------------

    def to_frame(self) -> pd.DataFrame:
        """One row per head: ``layer``, ``head``, ``ecs_faithful``, ``ecs_hallucinated``,
        ``ecs_difference``, ``ecs_r`` (NaN where undefined)."""
        import pandas as pd

        layer, head = np.divmod(np.arange(self.n_layers * self.n_heads), self.n_heads)
        df = pd.DataFrame(
            {
                "layer": layer,
                "head": head,
                "ecs_faithful": self.ecs_faithful.ravel(),
                "ecs_hallucinated": self.ecs_hallucinated.ravel(),
                "ecs_difference": self.ecs_difference.ravel(),
                "ecs_r": self.ecs_r.ravel(),
            }
        )
        df.attrs.update(self._attrs())
        return df

    def layer_frame(self) -> pd.DataFrame:
        """One row per layer: ``layer``, ``pks_faithful``, ``pks_hallucinated``,
        ``pks_difference``, ``pks_r``."""
        import pandas as pd

        df = pd.DataFrame(
            {
                "layer": np.arange(self.n_layers),
                "pks_faithful": self.pks_faithful,
                "pks_hallucinated": self.pks_hallucinated,
                "pks_difference": self.pks_difference,
                "pks_r": self.pks_r,
            }
        )
        df.attrs.update(self._attrs())
        return df

    def _attrs(self) -> dict[str, Any]:
        return {
            "level": self.level,
            "model": self.model,
            "n_faithful": self.n_faithful,
            "n_hallucinated": self.n_hallucinated,
        }


# --------------------------------------------------------------------------- one answer


def visible_text(token: str) -> str:
    """A token's text for axis labels and tables: whitespace made visible."""
    return token.replace("\n", "↵").replace("\t", "⇥").replace(" ", "␣") or "∅"


def align_chunk_scores(
    scores: np.ndarray, offsets: np.ndarray, target_offsets: np.ndarray
) -> Float[np.ndarray, " n"]:
    """Carry chunk scores onto other chunks of the same text: each target chunk takes the
    highest score of the source chunks it overlaps (NaN when none)."""
    s = np.asarray(scores, dtype=np.float64).reshape(-1)
    src = np.asarray(offsets, dtype=np.int64).reshape(-1, 2)
    tgt = np.asarray(target_offsets, dtype=np.int64).reshape(-1, 2)
    if src.shape[0] != s.shape[0]:
        raise ValueError(f"{s.shape[0]} scores for {src.shape[0]} chunk offsets")
    if src.shape == tgt.shape and np.array_equal(src, tgt):
        return s.copy()
    hit = (src[None, :, 0] < tgt[:, None, 1]) & (tgt[:, None, 0] < src[None, :, 1])
    out = np.where(hit, s[None, :], -np.inf).max(axis=1, initial=-np.inf)
    return np.where(np.isfinite(out), out, np.nan)


@dataclass(frozen=True, kw_only=True, eq=False)
class HeadView:
    """Every head's view of one answer, from one traced pass.

    Attributes:
        example: The example as analysed.
        layout: Its token layout.
        chunks: Recursive chunks (ReDeEP chunk level) of the response and passages.
        context: ``[ctx]`` absolute positions ECS ranks (passage tokens, or the prompt).
        attention: ``[layer, head, resp, ctx]`` attention from each answer token's
            generation position to each context position.
        top_positions: ``[layer, head, resp, k]`` the context positions token-level ECS
            averages, most attended first.
        token_ecs: ``[resp, layer, head]`` token-level ECS.
        pks: ``[layer, resp]`` PKS in bits.
        chunk_ecs: Chunk-level ECS of every head (all layers).
        chunk_pks: ``[resp_chunk, layer]`` PKS averaged over each response chunk.
        verdicts: Detector name -> verdict on this answer (the detectors passed in).
        chunk_scores: Detector name -> ``[resp_chunk]`` chunk probabilities carried
            onto :attr:`chunks` (chunk-level detectors only).
        selected_layers: Detector name -> the layers whose PKS it sums.
        topk_frac: Share of context positions averaged by token ECS.
        scope: ``"passages"`` or ``"prompt"``.
        seconds: Wall time of the trace and everything computed from it.
    """

    example: RAGExample
    layout: Layout
    chunks: ChunkSet
    context: Int[np.ndarray, " ctx"]
    attention: Float[np.ndarray, "layer head resp ctx"]
    top_positions: Int[np.ndarray, "layer head resp k"]
    token_ecs: Float[np.ndarray, "resp layer head"]
    pks: Float[np.ndarray, "layer resp"]
    chunk_ecs: ChunkECS
    chunk_pks: Float[np.ndarray, "resp_chunk layer"]
    verdicts: Mapping[str, Verdict] = field(default_factory=dict)
    chunk_scores: Mapping[str, np.ndarray] = field(default_factory=dict)
    selected_layers: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    topk_frac: float = 0.1
    scope: str = "passages"
    seconds: float = 0.0

    def __post_init__(self) -> None:
        n_l, n_h, n_t, n_c = self.attention.shape
        assert self.top_positions.shape[:3] == (n_l, n_h, n_t), "top positions shape"
        assert self.token_ecs.shape == (n_t, n_l, n_h), "token ECS shape"
        assert self.pks.shape == (n_l, n_t), "PKS shape"
        assert self.context.shape == (n_c,), "context shape"

    @property
    def n_layers(self) -> int:
        return int(self.attention.shape[0])

    @property
    def n_heads(self) -> int:
        return int(self.attention.shape[1])

    @property
    def k(self) -> int:
        """How many context positions token ECS averages."""
        return int(self.top_positions.shape[-1])

    @property
    def response_tokens(self) -> tuple[str, ...]:
        return self.layout.response_token_strings()

    @property
    def context_tokens(self) -> tuple[str, ...]:
        toks = self.layout.token_strings()
        return tuple(toks[int(p)] for p in self.context)

    def check_head(self, head: Head) -> Head:
        """``head`` as ints, or ValueError naming the valid range."""
        layer, h = int(head[0]), int(head[1])
        if not (0 <= layer < self.n_layers and 0 <= h < self.n_heads):
            raise ValueError(
                f"head L{layer}H{h} is outside the model's {self.n_layers} layers x "
                f"{self.n_heads} heads"
            )
        return layer, h

    def head_ecs(self, head: Head) -> Float[np.ndarray, " resp"]:
        """Token-level ECS of ``head`` for every answer token."""
        layer, h = self.check_head(head)
        return self.token_ecs[:, layer, h]

    def mean_pks(self, layers: Sequence[int] | None = None) -> Float[np.ndarray, " resp"]:
        """PKS per answer token averaged over ``layers`` (default every layer)."""
        ls = list(range(self.n_layers)) if layers is None else [int(x) for x in layers]
        return self.pks[ls].mean(0)

    def chunk_labels(self) -> Int[np.ndarray, " resp_chunk"] | None:
        """Gold label per response chunk: 1 when it overlaps a gold span; without spans 0 for
        a faithful answer and ``None`` when the answer is hallucinated or unlabelled."""

        if self.example.spans:
            return chunk_labels(self.example.spans, self.chunks.response_offsets)
        if self.example.label is False:
            return np.zeros(len(self.chunks.response), dtype=np.int8)
        return None

    # -- tables ----------------------------------------------------------------------

    def token_frame(self, head: Head, *, show: int | None = 8) -> pd.DataFrame:
        """One row per answer token for ``head``: its ECS and the context tokens ECS averages.

        Columns: ``position``, ``token``, ``ECS``, ``attention on top-k`` (the head's
        attention mass on those positions), ``gold``, ``top-k context tokens`` (most
        attended first, at most ``show`` of them with the rest counted).
        """
        import pandas as pd

        layer, h = self.check_head(head)
        toks = self.layout.token_strings()
        index = {int(p): i for i, p in enumerate(self.context)}
        rows = []
        labels = self.layout.token_labels()
        for j, tok in enumerate(self.response_tokens):
            top = self.top_positions[layer, h, j]
            cols = [index[int(p)] for p in top]
            mass = float(self.attention[layer, h, j, cols].sum())
            listed = top if show is None else top[:show]
            words = " · ".join(visible_text(toks[int(p)]) for p in listed)
            if len(listed) < len(top):
                words += f" · (+{len(top) - len(listed)} more)"
            rows.append(
                {
                    "position": int(self.layout.response_positions[j]),
                    "token": visible_text(tok),
                    "ECS": float(self.token_ecs[j, layer, h]),
                    "attention on top-k": mass,
                    "gold": (
                        "" if labels is None else ("hallucinated" if labels[j] else "faithful")
                    ),
                    "top-k context tokens": words,
                }
            )
        return pd.DataFrame(rows)

    def chunk_frame(
        self,
        head: Head,
        *,
        pks_layers: Sequence[int] | None = None,
        detector: str = RedeepChunkDetector.name,
    ) -> pd.DataFrame:
        """One row per response chunk for ``head``.

        Columns: ``response chunk``, ``attended context chunk`` (the context chunk the
        head attends to most from it, with its passage), ``ECS`` (embedding cosine of the
        two), ``PKS`` (mean over the chunk of the mean over ``pks_layers``, default every
        layer), ``<detector> probability`` (when that detector judged the answer) and
        ``gold`` (``hallucinated`` / ``faithful``; blank when unknown).
        """
        import pandas as pd

        layer, h = self.check_head(head)
        li = self.chunk_ecs.layers.index(layer)
        ls = list(range(self.n_layers)) if pks_layers is None else [int(x) for x in pks_layers]
        pks = self.chunk_pks[:, ls].mean(1) if len(self.chunks.response) else np.zeros(0)
        labels = self.chunk_labels()
        probs = self.chunk_scores.get(detector)
        rows = []
        for r, c in enumerate(self.chunks.response):
            star = int(self.chunk_ecs.attended[r, li, h])
            ctx = self.chunks.context[star] if star >= 0 else None
            row: dict[str, Any] = {
                "response chunk": c.text,
                "attended context chunk": f"[{ctx.label}] {ctx.text}" if ctx else "",
                "ECS": float(self.chunk_ecs.ecs[r, li, h]),
                "PKS": float(pks[r]),
            }
            if probs is not None:
                row[f"{detector} probability"] = float(probs[r])
            row["gold"] = "" if labels is None else ("hallucinated" if labels[r] else "faithful")
            rows.append(row)
        columns = ["response chunk", "attended context chunk", "ECS", "PKS"]
        if probs is not None:
            columns.append(f"{detector} probability")
        return pd.DataFrame(rows, columns=[*columns, "gold"])

    def context_bounds(self) -> list[tuple[int, str]]:
        """``(index into context, label)`` where each passage (or segment) starts."""
        out: list[tuple[int, str]] = []
        seen: set[str] = set()
        for i, p in enumerate(self.context):
            label = self.layout.segment_at(int(p)).label
            if label not in seen:
                seen.add(label)
                out.append((i, label))
        return out


_C = TypeVar("_C", bound=DetectorConfig)


def _config_of(by_name: Mapping[str, Detector], name: str, kind: type[_C]) -> _C:
    """The config of detector ``name`` when it is given, else ``kind``'s defaults."""
    config = by_name[name].config if name in by_name else kind()
    if not isinstance(config, kind):
        raise TypeError(f"{name}'s config is a {type(config).__name__}, not a {kind.__name__}")
    return config


def head_view(
    model: LoadedModel,
    example: RAGExample,
    *,
    response_ids: Sequence[int] | None = None,
    detectors: Sequence[Detector] = (),
) -> HeadView:
    """Trace ``example`` once and read every head's view of its answer.

    Token ECS, PKS and chunk ECS follow the ReDeEP detectors' configs: those of the
    ``redeep_token`` / ``redeep_chunk`` detectors in ``detectors`` when given (fitted
    artifacts), else the defaults. Every detector in ``detectors`` reads the same trace
    and its verdict is kept.

    Args:
        model: The loaded model.
        example: The example whose response is analysed.
        response_ids: The response's own token ids when the model generated it.
        detectors: Fitted detectors to judge the answer (typically ReDeEP's); each
            verdict is calibrated as :func:`core.learning.contract.for_dataset` gives it for the
            example's dataset, as every other path judges it.

    Raises:
        DataError: The example cannot be laid out.
        ModelError: The trace or a detector failed.
    """
    import torch

    t0 = time.perf_counter()
    by_name = {d.name: d for d in detectors}
    tc = _config_of(by_name, RedeepTokenDetector.name, RedeepTokenConfig)
    cc = _config_of(by_name, RedeepChunkDetector.name, RedeepChunkConfig)
    info = model.info
    n_layers, n_heads = info.n_layers, info.n_heads
    layout = render(example, model, response_ids=response_ids)
    needs = [
        ecs_needs(n_layers, scope=tc.ecs_scope, hidden_at_response=cc.embedder == "model"),
        pks_needs(n_layers),
    ]
    needs += [n for n in (d.needs(info) for d in detectors) if n is not None]
    tr = trace(model, layout, Needs.union(needs))
    bare = None
    bare_needs = [n for d in detectors if d.needs_bare and (n := d.needs(info)) is not None]
    if bare_needs:
        bare = trace(model, render(example, model, with_context=False), Needs.union(bare_needs))
    run = Run(example=example, layout=layout, trace=tr, bare=bare, model=info, loaded=model)

    g = layout.generation_positions
    ctx = context_positions(layout, tc.ecs_scope)
    n_t = len(g)
    tok = token_ecs(
        tr, all_heads(range(n_layers), n_heads), topk_frac=tc.topk_frac, scope=tc.ecs_scope
    )
    if ctx.size:
        k = ecs_top_k(ctx.size, tc.topk_frac)
        ctx_t = torch.as_tensor(ctx)
        att, tops = [], []
        for layer in range(n_layers):
            a = tr.at("pattern", layer, g)[:, :, ctx_t].float()  # [head, resp, ctx]
            att.append(a.numpy())
            tops.append(ctx[a.topk(k, dim=-1).indices.numpy()])
        attention = np.stack(att).astype(np.float32)
        top_positions = np.stack(tops).astype(np.int64)
    else:
        attention = np.zeros((n_layers, n_heads, n_t, 0), dtype=np.float32)
        top_positions = np.zeros((n_layers, n_heads, n_t, 0), dtype=np.int64)
    pks = shared_pks(run, model, final_norm=tc.pks_final_norm)
    chunks = chunk_example(
        layout, "recursive", chunk_size=cc.chunk_size, chunk_overlap=cc.chunk_overlap
    )
    ce = chunk_ecs(tr, chunks, list(range(n_layers)), pool=cc.pool, embedder=cc.embedder)

    verdicts: dict[str, Verdict] = {}
    chunk_scores: dict[str, np.ndarray] = {}
    selected: dict[str, tuple[int, ...]] = {}
    for d in detectors:
        f = d.features(run)
        v = judge_features(d, f, example.provenance.dataset)
        verdicts[d.name] = v
        if v.chunk_scores is not None and f.chunk_offsets is not None:
            chunk_scores[d.name] = align_chunk_scores(
                v.chunk_scores, f.chunk_offsets, chunks.response_offsets
            )
        if isinstance(d, RedeepDetector):  # ReDeEP: the layers its rule sums
            selected[d.name] = tuple(int(x) for x in d.selected_layers)
    return HeadView(
        example=example,
        layout=layout,
        chunks=chunks,
        context=np.asarray(ctx, dtype=np.int64),
        attention=attention,
        top_positions=top_positions,
        token_ecs=tok.reshape(n_t, n_layers, n_heads),
        pks=np.asarray(pks, dtype=np.float32),
        chunk_ecs=ce,
        chunk_pks=chunk_means(pks, chunks),
        verdicts=verdicts,
        chunk_scores=chunk_scores,
        selected_layers=selected,
        topk_frac=tc.topk_frac,
        scope=tc.ecs_scope,
        seconds=time.perf_counter() - t0,
    )
