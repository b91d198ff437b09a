"""Copying-head scores for every (layer, head): how much a head's OV circuit copies tokens.

Head ``h`` of layer ``l`` moves ``x W_V[kv(h)] W_O[h]`` from the positions it
attends to, where ``kv(h) = h // (n_heads / n_kv_heads)`` is the key/value
head it reads under grouped-query attention (HF ``repeat_kv``). Its full OV
circuit over tokens is ``M = W_E W_V[kv(h)] W_O[h] W_U`` (``d_vocab x
d_vocab``; norms and biases ignored, as in the spec). A head that copies
maps each token to itself: ``M`` has large positive eigenvalues.

Two modes (``CopyingConfig.mode``):

- ``"exact"`` (default): the non-zero eigenvalues of ``M`` are those of the
  ``d_head x d_head`` matrix ``W_O[h] (W_U W_E) W_V[kv(h)]``; ``W_U W_E``
  (``d_model x d_model``) is computed once per model. Score
  ``sum(Re lambda) / sum(|lambda|)`` in [-1, 1] (Elhage et al.). The vocab x vocab
  matrix is never built.
- ``"paper"`` (ReDeEP's procedure): ``M`` restricted to a token subset ``S``,
  ``M_S = W_E[S] W_V W_O W_U[:, S]`` (``|S| x |S|``, built in row chunks);
  its trace, and the Gershgorin-disk boundary points ``a_ii +- sum_{j != i}
  |a_ij|`` of every row, of which the IQR outliers (outside ``[Q1 - 1.5 IQR,
  Q3 + 1.5 IQR]``) are counted. Heads are ranked by outlier count ascending
  (fewest = 1) and by ``|trace|`` descending (largest = 1); the smaller the
  rank sum, the more copying. The stored score maps the rank sum linearly
  onto [0, 1] (1 = ranked first on both), so that, in both modes, higher
  means more copying. Default subset: the first 4096 token ids that are not
  special tokens; for byte-level BPE vocabularies (SmolLM2, Llama, GPT-2) ids
  follow merge order, so these are the earliest, most frequent merges.
  ``token_ids`` picks any other subset.

Scores are cached per model in the process and on disk under
``cache_dir()/heads/<hash>-<mode>.npz`` (hash of the model key, a fingerprint
of the attention weights and the config), so they are computed once.
"""

from __future__ import annotations

import hashlib
import io
import json
import threading
import time
import weakref
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from core.base.errors import ModelError
from core.base.paths import cache_dir
from core.base.safeio import replace_file
from core.engine.model import LoadedModel, Progress

if TYPE_CHECKING:
    import pandas as pd
    import torch
    from jaxtyping import Complex, Float, Int

CopyingMode = Literal["exact", "paper"]
_MODES: tuple[str, ...] = ("exact", "paper")
DEFAULT_TOP = 32
CACHE_VERSION = 1


# --------------------------------------------------------------------------- config


@dataclass(frozen=True, kw_only=True)
class CopyingConfig:
    """How copying scores are computed.

    Attributes:
        mode: ``"exact"`` (eigenvalues of the full OV circuit) or ``"paper"``
            (trace + Gershgorin outliers on a token subset, rank-combined).
        n_tokens: Paper mode: size of the default token subset (the first
            ``n_tokens`` non-special token ids).
        token_ids: Paper mode: an explicit token subset instead (sorted, unique).
        iqr_factor: Paper mode: a boundary point is an outlier outside
            ``[Q1 - iqr_factor * IQR, Q3 + iqr_factor * IQR]``.
    """

    mode: CopyingMode = "exact"
    n_tokens: int = 4096
    token_ids: tuple[int, ...] | None = None
    iqr_factor: float = 1.5

    def __post_init__(self) -> None:
        if self.mode not in _MODES:
            raise ValueError(f"unknown copying-score mode {self.mode!r}; use one of {_MODES}")
        if self.n_tokens < 2:
            raise ValueError(f"n_tokens must be >= 2, got {self.n_tokens}")
        if self.iqr_factor <= 0:
            raise ValueError(f"iqr_factor must be > 0, got {self.iqr_factor}")
        if self.token_ids is not None:
            ids = tuple(sorted({int(i) for i in self.token_ids}))
            if len(ids) < 2 or ids[0] < 0:
                raise ValueError(f"token_ids must hold >= 2 non-negative ids, got {ids[:5]}...")
            object.__setattr__(self, "token_ids", ids)

    def cache_fields(self) -> dict[str, Any]:
        """The fields the result depends on (exact mode ignores the paper-mode ones)."""
        if self.mode == "exact":
            return {"mode": "exact"}
        return asdict(self)


# --------------------------------------------------------------------------- weights


@dataclass(frozen=True, kw_only=True, eq=False)
class OVWeights:
    """The matrices of every head's OV circuit, as the model computes with them.

    Attributes:
        W_E: ``[d_vocab, d_model]`` token embedding.
        W_U: ``[d_model, d_vocab]`` unembedding.
        W_V: ``[layer, kv_head, d_model, d_head]`` value maps (``v = x W_V``).
        W_O: ``[layer, head, d_head, d_model]`` output maps (``out = z W_O``).
        kv_index: ``[head]`` the kv head each query head reads.
    """

    W_E: Float[torch.Tensor, "d_vocab d_model"]
    W_U: Float[torch.Tensor, "d_model d_vocab"]
    W_V: Float[torch.Tensor, "layer kv_head d_model d_head"]
    W_O: Float[torch.Tensor, "layer head d_head d_model"]
    kv_index: Int[np.ndarray, " head"]

    def __post_init__(self) -> None:
        n_layers, n_kv, d_model, d_head = self.W_V.shape
        n_l, n_heads, d_head_o, d_model_o = self.W_O.shape
        assert (n_l, d_head_o, d_model_o) == (n_layers, d_head, d_model), "W_V/W_O shapes"
        assert self.W_E.shape[1] == d_model and self.W_U.shape[0] == d_model, "W_E/W_U shapes"
        assert self.kv_index.shape == (n_heads,) and int(self.kv_index.max()) < n_kv, "kv map"


def kv_head_index(n_heads: int, n_kv_heads: int) -> Int[np.ndarray, " head"]:
    """Kv head read by each query head: ``h // (n_heads / n_kv_heads)`` (HF ``repeat_kv``)."""
    if n_kv_heads < 1 or n_heads % n_kv_heads:
        raise ModelError(
            f"{n_heads} query heads cannot share {n_kv_heads} kv heads evenly; "
            "grouped-query attention needs n_heads to be a multiple of n_kv_heads"
        )
    return np.arange(n_heads) // (n_heads // n_kv_heads)


def ov_weights(model: LoadedModel) -> OVWeights:
    """Read W_E, W_U and the per-head W_V/W_O through the TransformerLens bridge.

    The bridge stacks the HF projections per head (``W_V[l, k] = v_proj.weight[k
    d_head : (k+1) d_head].T``, ``W_O[l, h] = o_proj.weight[:, h d_head : (h+1)
    d_head].T`` for Llama), whatever the architecture; W_V keeps one block per kv head.
    """
    info = model.info
    b = model.bridge
    with model.lock:
        W_V = b.W_V.detach()
        W_O = b.W_O.detach()
        W_E = b.W_E.detach()
        W_U = b.W_U.detach()
    if W_O.shape[:2] != (info.n_layers, info.n_heads):
        raise ModelError(
            f"W_O has shape {tuple(W_O.shape)}; expected [{info.n_layers}, {info.n_heads}, ...]"
        )
    n_v = int(W_V.shape[1])
    if n_v == info.n_heads:  # kv heads already expanded (or no GQA)
        kv = np.arange(info.n_heads)
    elif n_v == info.n_kv_heads:
        kv = kv_head_index(info.n_heads, info.n_kv_heads)
    else:
        raise ModelError(
            f"W_V has {n_v} heads per layer; expected {info.n_kv_heads} kv heads "
            f"or {info.n_heads} query heads"
        )
    return OVWeights(W_E=W_E, W_U=W_U, W_V=W_V, W_O=W_O, kv_index=kv)


# --------------------------------------------------------------------------- exact


def ov_eigenvalues(
    w: OVWeights, *, device: str | None = None
) -> Complex[np.ndarray, "layer head d_head"]:
    """Eigenvalues of ``W_O[h] (W_U W_E) W_V[kv(h)]`` for every head.

    These are the non-zero eigenvalues of the full circuit ``M = W_E W_V W_O
    W_U`` (plus ``d_head - rank`` zeros), since ``AB`` and ``BA`` share their
    non-zero spectrum. ``W_U W_E`` is computed once in float32 on ``device``;
    the small products and eigenvalues in float64 on the CPU.
    """
    import torch

    dev = device or str(w.W_E.device)
    with torch.inference_mode():
        G = (w.W_U.to(dev, torch.float32) @ w.W_E.to(dev, torch.float32)).to("cpu", torch.float64)
        kv = torch.as_tensor(w.kv_index)
        W_V = w.W_V.to("cpu", torch.float64)[:, kv]  # [layer, head, d_model, d_head]
        W_O = w.W_O.to("cpu", torch.float64)
        small = W_O @ G @ W_V  # [layer, head, d_head, d_head]
        eig = torch.linalg.eigvals(small)
    return eig.numpy()


def eigen_copying_score(
    eigenvalues: Complex[np.ndarray, "... n"],
) -> Float[np.ndarray, ...]:
    """``sum(Re lambda) / sum(|lambda|)`` over the last axis, in [-1, 1] (0 when all vanish)."""
    ev = np.asarray(eigenvalues)
    num = ev.real.sum(-1)
    den = np.abs(ev).sum(-1)
    safe = np.where(den > 0, den, 1.0)
    return np.where(den > 0, num / safe, 0.0)


# --------------------------------------------------------------------------- paper


def default_token_subset(model: LoadedModel, n_tokens: int) -> Int[np.ndarray, " tokens"]:
    """The first ``n_tokens`` token ids that are not special tokens."""
    special = set(getattr(model.tokenizer, "all_special_ids", []) or [])
    vocab = min(model.info.d_vocab, len(model.tokenizer))
    ids = [i for i in range(vocab) if i not in special][:n_tokens]
    return np.asarray(ids, dtype=np.int64)


def iqr_outliers(points: Float[np.ndarray, "... n"], factor: float = 1.5) -> Int[np.ndarray, ...]:
    """Count of values outside ``[Q1 - factor IQR, Q3 + factor IQR]`` along the last axis."""
    x = np.asarray(points, dtype=np.float64)
    q1, q3 = np.percentile(x, [25, 75], axis=-1, keepdims=True)
    iqr = q3 - q1
    return ((x < q1 - factor * iqr) | (x > q3 + factor * iqr)).sum(-1)


def gershgorin_stats(
    w: OVWeights,
    token_ids: Int[np.ndarray, " tokens"],
    *,
    iqr_factor: float = 1.5,
    device: str | None = None,
    chunk_rows: int = 1024,
    progress: Progress | None = None,
) -> tuple[Float[np.ndarray, "layer head"], Int[np.ndarray, "layer head"]]:
    """Trace of ``M_S`` and the IQR-outlier count of its Gershgorin boundary points.

    ``M_S = W_E[S] W_V[kv(h)] W_O[h] W_U[:, S]`` is built ``chunk_rows`` rows at a
    time in float32 on ``device`` (never more than ``chunk_rows x |S|`` at once).

    Returns:
        ``(trace, n_outliers)``, each ``[layer, head]``.
    """
    import torch

    dev = device or str(w.W_E.device)
    S = torch.as_tensor(np.asarray(token_ids, dtype=np.int64), device=w.W_E.device)
    n = int(S.shape[0])
    n_layers, n_heads = w.W_O.shape[:2]
    trace = np.zeros((n_layers, n_heads))
    outliers = np.zeros((n_layers, n_heads), dtype=np.int64)
    with torch.inference_mode():
        E_S = w.W_E.index_select(0, S).to(dev, torch.float32)  # [S, d_model]
        U_S = w.W_U.index_select(1, S).to(dev, torch.float32)  # [d_model, S]
        for layer in range(n_layers):
            left = E_S @ w.W_V[layer].to(dev, torch.float32)  # [kv_head, S, d_head]
            right = w.W_O[layer].to(dev, torch.float32) @ U_S  # [head, d_head, S]
            for h in range(n_heads):
                lft, rgt = left[int(w.kv_index[h])], right[h]
                diag = torch.empty(n, dtype=torch.float32, device=dev)
                radius = torch.empty(n, dtype=torch.float32, device=dev)
                for start in range(0, n, chunk_rows):
                    stop = min(n, start + chunk_rows)
                    block = lft[start:stop] @ rgt  # [chunk, S]
                    rows = torch.arange(stop - start, device=dev)
                    d = block[rows, rows + start]
                    diag[start:stop] = d
                    radius[start:stop] = block.abs().sum(1) - d.abs()
                d64 = diag.double().cpu().numpy()
                r64 = radius.double().cpu().numpy()
                trace[layer, h] = d64.sum()
                points = np.concatenate([d64 - r64, d64 + r64])
                outliers[layer, h] = int(iqr_outliers(points, iqr_factor))
            if progress:
                progress(f"Copying heads: layer {layer + 1}/{n_layers}", (layer + 1) / n_layers)
    return trace, outliers


def rank_combined_score(
    trace: Float[np.ndarray, "layer head"], n_outliers: Int[np.ndarray, "layer head"]
) -> Float[np.ndarray, "layer head"]:
    """``rank(outliers asc) + rank(|trace| desc)`` (average ranks, 1 = best), mapped to [0, 1].

    The best possible rank sum (2) maps to 1, the worst (``2N``) to 0, so a
    higher score means more copying, as in exact mode.
    """
    from scipy.stats import rankdata

    shape = np.shape(trace)
    n = int(np.prod(shape))
    r_out = rankdata(np.asarray(n_outliers, dtype=np.float64).ravel(), method="average")
    r_tr = rankdata(-np.abs(np.asarray(trace, dtype=np.float64)).ravel(), method="average")
    rank_sum = r_out + r_tr
    score = np.ones(n) if n < 2 else 1.0 - (rank_sum - 2.0) / (2.0 * n - 2.0)
    return score.reshape(shape)


# --------------------------------------------------------------------------- result


@dataclass(frozen=True, kw_only=True, eq=False)
class CopyingScores:
    """Copying score of every (layer, head) of one model.

    Attributes:
        scores: ``[layer, head]``; higher = more copying (exact: in [-1, 1];
            paper: rank-combined, in [0, 1]).
        mode: ``"exact"`` or ``"paper"``.
        model_key: :attr:`ModelInfo.key` of the model.
        kv_index: ``[head]`` kv head read by each query head.
        config: The config they were computed with.
        eigenvalues: Exact mode: ``[layer, head, d_head]`` complex eigenvalues.
        trace: Paper mode: ``[layer, head]`` trace of ``M_S``.
        n_outliers: Paper mode: ``[layer, head]`` Gershgorin IQR outlier counts.
        seconds: Compute time (of the run that filled the cache, when loaded from it).
    """

    scores: Float[np.ndarray, "layer head"]
    mode: CopyingMode
    model_key: str
    kv_index: Int[np.ndarray, " head"]
    config: CopyingConfig
    eigenvalues: Complex[np.ndarray, "layer head d_head"] | None = None
    trace: Float[np.ndarray, "layer head"] | None = None
    n_outliers: Int[np.ndarray, "layer head"] | None = None
    seconds: float = 0.0

    def __post_init__(self) -> None:
        s = np.asarray(self.scores, dtype=np.float64)
        if s.ndim != 2:
            raise ValueError(f"scores must be [layer, head], got shape {s.shape}")
        if self.mode != self.config.mode:
            raise ValueError(f"mode {self.mode!r} differs from config mode {self.config.mode!r}")
        object.__setattr__(self, "scores", s)
        object.__setattr__(self, "kv_index", np.asarray(self.kv_index, dtype=np.int64))
        for name in ("trace", "n_outliers"):
            v = getattr(self, name)
            if v is not None and np.shape(v) != s.shape:
                raise ValueError(f"{name} must be {s.shape}, got {np.shape(v)}")

    @property
    def n_layers(self) -> int:
        return int(self.scores.shape[0])

    @property
    def n_heads(self) -> int:
        return int(self.scores.shape[1])

    def top_heads(self, n: int | None = None) -> list[tuple[int, int]]:
        """The ``n`` highest-scoring heads as ``(layer, head)``, best first.

        Args:
            n: How many (default 32, or every head when the model has fewer).
                Ties go to the lower layer, then the lower head.
        """
        total = self.scores.size
        k = min(DEFAULT_TOP, total) if n is None else n
        if k < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        flat = np.nan_to_num(self.scores.ravel(), nan=-np.inf)
        order = np.argsort(-flat, kind="stable")[: min(k, total)]
        return [(int(i // self.n_heads), int(i % self.n_heads)) for i in order]

    def to_frame(self) -> pd.DataFrame:
        """One row per head: layer, head, kv_head, score, rank (1 = most copying), extras."""
        import pandas as pd

        n_l, n_h = self.scores.shape
        layer, head = np.divmod(np.arange(n_l * n_h), n_h)
        rank = np.empty(n_l * n_h, dtype=np.int64)
        rank[[li * n_h + h for li, h in self.top_heads(n_l * n_h)]] = np.arange(1, n_l * n_h + 1)
        df = pd.DataFrame(
            {
                "layer": layer,
                "head": head,
                "kv_head": self.kv_index[head],
                "score": self.scores.ravel(),
                "rank": rank,
            }
        )
        if self.trace is not None:
            df["trace"] = np.asarray(self.trace).ravel()
        if self.n_outliers is not None:
            df["n_outliers"] = np.asarray(self.n_outliers).ravel()
        df.attrs.update({"mode": self.mode, "model_key": self.model_key})
        return df

    @classmethod
    def from_frame(
        cls, df: pd.DataFrame, *, mode: CopyingMode | None = None, model_key: str | None = None
    ) -> CopyingScores:
        """Rebuild from :meth:`to_frame`'s table (mode and model key from ``df.attrs`` unless given).

        The table does not carry paper-mode options: ``config`` comes back as the
        mode's defaults, and exact-mode eigenvalues are not restored.
        """
        mode = mode or df.attrs.get("mode")
        model_key = model_key or df.attrs.get("model_key")
        if mode is None or model_key is None:
            raise ValueError("from_frame needs mode and model_key (in df.attrs or as arguments)")
        missing = {"layer", "head", "kv_head", "score"} - set(df.columns)
        if missing:
            raise ValueError(f"copying-score table lacks columns {sorted(missing)}")
        n_l, n_h = int(df["layer"].max()) + 1, int(df["head"].max()) + 1
        if len(df) != n_l * n_h:
            raise ValueError(f"table has {len(df)} rows, expected {n_l} layers x {n_h} heads")
        d = df.sort_values(["layer", "head"])

        def grid(col: str) -> np.ndarray | None:
            return d[col].to_numpy().reshape(n_l, n_h) if col in d.columns else None

        return cls(
            scores=grid("score"),  # type: ignore[arg-type]  # the score column was checked present above
            mode=mode,
            model_key=model_key,
            kv_index=d["kv_head"].to_numpy()[:n_h],
            config=CopyingConfig(mode=mode),
            trace=grid("trace"),
            n_outliers=grid("n_outliers"),
        )


# --------------------------------------------------------------------------- compute + cache

_MEMORY: dict[str, CopyingScores] = {}
_MEMORY_LOCK = threading.Lock()
# Weight fingerprint per loaded model object: a cache hit then reads no weights.
_FINGERPRINTS: weakref.WeakKeyDictionary[LoadedModel, str] = weakref.WeakKeyDictionary()


def clear_cache() -> None:
    """Forget the in-process cache (the disk cache stays)."""
    with _MEMORY_LOCK:
        _MEMORY.clear()


def _fingerprint(w: OVWeights) -> str:
    """A cheap hash of a corner of every layer's weights: a changed checkpoint gets a new key."""
    h = hashlib.sha256()
    for t in (w.W_V[:, :, :8, :8], w.W_O[:, :, :8, :8], w.W_E[:64, :8], w.W_U[:8, -64:]):
        h.update(t.detach().to("cpu").float().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def _cache_key(model_key: str, fingerprint: str, config: CopyingConfig) -> str:
    payload = json.dumps(
        {
            "model": model_key,
            "weights": fingerprint,
            "config": config.cache_fields(),
            "version": CACHE_VERSION,
        },
        sort_keys=True,
    )
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()[:20]


def cache_path(key: str, mode: str) -> Path:

    return cache_dir() / "heads" / f"{key}-{mode}.npz"


def _save(path: Path, res: CopyingScores) -> None:
    arrays: dict[str, np.ndarray] = {"scores": res.scores, "kv_index": res.kv_index}
    for name in ("eigenvalues", "trace", "n_outliers"):
        v = getattr(res, name)
        if v is not None:
            arrays[name] = np.asarray(v)
    meta = {
        "mode": res.mode,
        "model_key": res.model_key,
        "config": asdict(res.config),
        "seconds": res.seconds,
        "version": CACHE_VERSION,
    }
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode("utf-8"), dtype=np.uint8)
    buf = io.BytesIO()
    np.savez(buf, **arrays)  # type: ignore[arg-type]  # numpy's stub reads **arrays as maybe allow_pickle
    replace_file(path, buf.getvalue())


def _load(path: Path, model_key: str, config: CopyingConfig) -> CopyingScores | None:
    """The cached result, or ``None`` when missing, unreadable or for something else."""
    if not path.is_file():
        return None
    try:
        with np.load(path) as z:
            meta = json.loads(z["meta"].tobytes().decode("utf-8"))
            arrays = {k: z[k] for k in z.files if k != "meta"}
    except (OSError, ValueError, KeyError):
        return None
    if meta.get("version") != CACHE_VERSION or meta.get("model_key") != model_key:
        return None
    cfg_dict = dict(meta.get("config") or {})
    if cfg_dict.get("token_ids") is not None:
        cfg_dict["token_ids"] = tuple(cfg_dict["token_ids"])
    try:
        cached_cfg = CopyingConfig(**cfg_dict)
    except (TypeError, ValueError):
        return None
    if cached_cfg.cache_fields() != config.cache_fields():
        return None
    return CopyingScores(
        scores=arrays["scores"],
        mode=config.mode,
        model_key=model_key,
        kv_index=arrays["kv_index"],
        config=config,
        eigenvalues=arrays.get("eigenvalues"),
        trace=arrays.get("trace"),
        n_outliers=arrays.get("n_outliers"),
        seconds=float(meta.get("seconds", 0.0)),
    )


def _compute(
    model: LoadedModel,
    w: OVWeights,
    config: CopyingConfig,
    *,
    chunk_rows: int,
    progress: Progress | None,
) -> CopyingScores:
    t0 = time.perf_counter()
    if config.mode == "exact":
        if progress:
            progress("Copying heads: eigenvalues of every OV circuit", 0.0)
        eig = ov_eigenvalues(w, device=model.device)
        res = CopyingScores(
            scores=eigen_copying_score(eig),
            mode="exact",
            model_key=model.info.key,
            kv_index=w.kv_index,
            config=config,
            eigenvalues=eig,
        )
    else:
        if config.token_ids is not None:
            ids = np.asarray(config.token_ids, dtype=np.int64)
            if int(ids.max()) >= w.W_E.shape[0]:
                raise ValueError(
                    f"token id {int(ids.max())} is outside the vocabulary of {w.W_E.shape[0]}"
                )
        else:
            ids = default_token_subset(model, config.n_tokens)
        trace, n_out = gershgorin_stats(
            w,
            ids,
            iqr_factor=config.iqr_factor,
            device=model.device,
            chunk_rows=chunk_rows,
            progress=progress,
        )
        res = CopyingScores(
            scores=rank_combined_score(trace, n_out),
            mode="paper",
            model_key=model.info.key,
            kv_index=w.kv_index,
            config=config,
            trace=trace,
            n_outliers=n_out,
        )
    if progress:
        progress("Copying heads: done", 1.0)
    return replace(res, seconds=time.perf_counter() - t0)


def copying_scores(
    model: LoadedModel,
    config: CopyingConfig | None = None,
    *,
    cache: bool = True,
    chunk_rows: int = 1024,
    progress: Progress | None = None,
) -> CopyingScores:
    """Copying score of every (layer, head), computed once per model and config.

    Args:
        model: The loaded model.
        config: Mode and paper-mode options (default: exact mode).
        cache: Read and write the in-process and on-disk caches.
        chunk_rows: Paper mode: rows of ``M_S`` built at once.
        progress: Optional ``(message, fraction)`` callback.

    Returns:
        A :class:`CopyingScores`.
    """
    cfg = config or CopyingConfig()
    if chunk_rows < 1:
        raise ValueError(f"chunk_rows must be >= 1, got {chunk_rows}")
    w: OVWeights | None = None
    fingerprint = _FINGERPRINTS.get(model)
    if fingerprint is None:
        w = ov_weights(model)
        fingerprint = _FINGERPRINTS[model] = _fingerprint(w)
    key = _cache_key(model.info.key, fingerprint, cfg)
    if cache:
        with _MEMORY_LOCK:
            hit = _MEMORY.get(key)
        if hit is not None:
            return hit
        path = cache_path(key, cfg.mode)
        hit = _load(path, model.info.key, cfg)
        if hit is not None:
            with _MEMORY_LOCK:
                _MEMORY[key] = hit
            return hit
    res = _compute(model, w or ov_weights(model), cfg, chunk_rows=chunk_rows, progress=progress)
    if cache:
        _save(cache_path(key, cfg.mode), res)
        with _MEMORY_LOCK:
            _MEMORY[key] = res
    return res
