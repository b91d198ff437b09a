"""SAE feature activations over answers: encoding, the in-process caches, feature examples.

One forward pass per example (stopped after the SAE's block,
:func:`core.engine.trace.residuals_until`) gives the SAE's activations at every answer token.
Encoded answers stay in a bounded in-process cache (every feature's max per answer, and
token-level activations within a byte budget), so reading several features costs one
pass per example. :func:`feature_examples` selects a feature's top-activating answers, a
quantile-spread sample of the others where it fires, and held-out answers for the
fidelity check; :func:`active_features` ranks features by how many answers they fire on.
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from core.base.errors import DataError, RagscopeError
from core.base.examples import RAGExample, example_hash
from core.engine.layout import render
from core.engine.model import LoadedModel
from core.engine.trace import residuals_until
from core.pipeline.extract import WARM_UP, WorkEstimate, estimate_work, example_chars
from core.signals.sae import Activation, LoadedSAE

if TYPE_CHECKING:
    import pandas as pd
    from scipy import sparse

Progress = Callable[[int, int], None]


@dataclass(frozen=True, kw_only=True, eq=False)
class FeatureExample:
    """One answer with one SAE feature's activation at each of its tokens.

    Attributes:
        example_id: The example's id.
        tokens: The answer's tokens as decoded one by one, shape ``[n]``.
        activations: The feature's activation at each token, shape ``[n]``.
        max_activation: The largest of them (0 for an empty answer).
    """

    example_id: str
    tokens: tuple[str, ...]
    activations: np.ndarray
    max_activation: float

    def __post_init__(self) -> None:
        if self.activations.shape != (len(self.tokens),):
            raise DataError(
                f"got {len(self.tokens)} tokens but activations of shape {self.activations.shape}",
                source=self.example_id,
            )

    @property
    def peak(self) -> int | None:
        """Index of the most strongly activated token (``None`` for an empty answer)."""
        return int(np.argmax(self.activations)) if len(self.tokens) else None

    def top_tokens(self, n: int = 3) -> list[tuple[str, float]]:
        """The ``n`` most strongly activated tokens that fire, strongest first."""
        order = np.argsort(-self.activations, kind="stable")[:n]
        return [
            (self.tokens[i], float(self.activations[i])) for i in order if self.activations[i] > 0
        ]


@dataclass(frozen=True, kw_only=True, eq=False)
class FeatureExamples:
    """The examples of one SAE feature (:func:`feature_examples`).

    Attributes:
        feature: The SAE feature.
        sae_key: :attr:`~core.signals.sae.LoadedSAE.key` of its SAE.
        activation: ``post`` or ``pre`` (:meth:`~core.signals.sae.LoadedSAE.encode`).
        top: The answers where it fires hardest, strongest first.
        quantile: One answer from each quantile bin of the other answers where it fires,
            strongest first.
        held_out: Answers shown to no one, for :func:`fidelity` (about half where it
            fires, half where it does not).
        example_ids: Every example read, shape ``[n]``.
        max_activations: The feature's max over each example's answer, shape ``[n]``.
    """

    feature: int
    sae_key: str
    activation: str
    top: tuple[FeatureExample, ...]
    quantile: tuple[FeatureExample, ...]
    held_out: tuple[FeatureExample, ...]
    example_ids: tuple[str, ...]
    max_activations: np.ndarray

    @property
    def shown(self) -> tuple[FeatureExample, ...]:
        """The examples an explanation is written from: ``top`` then ``quantile``."""
        return self.top + self.quantile

    @property
    def n_examples(self) -> int:
        return len(self.example_ids)

    @property
    def n_firing(self) -> int:
        """Examples where the feature fires on at least one answer token."""
        return int((self.max_activations > 0).sum())

    @property
    def feature_key(self) -> str:
        """The explanation cache's ``feature_key``: ``"<sae key>:F<k>"``."""
        return feature_key(self.sae_key, self.feature)

    def to_frame(self) -> pd.DataFrame:
        """One row per shown or held-out example: group, id, max activation, top tokens."""
        import pandas as pd

        rows = []
        for group, exs in (
            ("top", self.top),
            ("quantile", self.quantile),
            ("held out", self.held_out),
        ):
            for e in exs:
                rows.append(
                    {
                        "group": group,
                        "example": e.example_id,
                        "max activation": e.max_activation,
                        "top tokens": ", ".join(f"{t!r} {v:.2f}" for t, v in e.top_tokens()),
                    }
                )
        return pd.DataFrame(rows, columns=["group", "example", "max activation", "top tokens"])


def feature_key(sae_key: str, feature: int) -> str:
    """How a feature is named in the explanation cache: ``"<sae key>:F<k>"``."""
    return f"{sae_key}:F{feature}"


CacheKey = tuple[str, str, str, str]  # model key, SAE key, activation kind, example hash


class _LRU:
    """A thread-safe least-recently-used dict bounded by the bytes of its values."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._items: OrderedDict[CacheKey, tuple[Any, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, key: CacheKey) -> Any:
        with self._lock:
            hit = self._items.get(key)
            if hit is None:
                return None
            self._items.move_to_end(key)
            return hit[0]

    def put(self, key: CacheKey, value: Any, nbytes: int) -> None:
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self._bytes -= old[1]
            self._items[key] = (value, nbytes)
            self._bytes += nbytes
            while self._bytes > self.max_bytes and len(self._items) > 1:
                _, (_, dropped) = self._items.popitem(last=False)
                self._bytes -= dropped

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self._bytes = 0


@dataclass(frozen=True, kw_only=True, eq=False)
class _Answer:
    """One encoded answer: its tokens and every feature's max over them."""

    tokens: tuple[str, ...]
    peaks: np.ndarray  # [d_sae]; zeros for an empty answer


PEAKS_CACHE_BYTES = 64 * 2**20
"""Bound of the cache of answers' per-feature maxima (about 3,500 answers of a 4,608-feature
SAE): all that selecting a feature's examples reads."""
TOKENS_CACHE_BYTES = 256 * 2**20
"""Bound of the cache of answers' token-level activations (read for the examples shown;
an answer dropped from it costs one forward pass when shown again)."""
_peaks_cache = _LRU(PEAKS_CACHE_BYTES)
_tokens_cache = _LRU(TOKENS_CACHE_BYTES)


def clear_activation_cache() -> None:
    """Forget every cached encoded answer."""
    _peaks_cache.clear()
    _tokens_cache.clear()


def _cache_key(
    model: LoadedModel, sae: LoadedSAE, example: RAGExample, activation: Activation
) -> CacheKey:

    return (model.info.key, sae.key, str(activation), example_hash(example))


def _read(
    model: LoadedModel, sae: LoadedSAE, example: RAGExample, activation: Activation
) -> tuple[_Answer, np.ndarray | sparse.csc_array]:
    """One forward pass: the answer's ``[T, d_sae]`` activations, cached in both tiers.

    Token-level activations are kept sparse (CSC: a feature's column is a cheap slice)
    unless more than half of them are non-zero (``pre`` activations), then dense.
    """
    from scipy import sparse

    layout = render(example, model)
    positions = layout.response_positions
    if positions.size:
        x = residuals_until(model, layout.token_ids, sae.layer)[positions]
        z = sae.encode(x, activation).numpy().astype(np.float32, copy=False)
    else:
        z = np.zeros((0, sae.d_sae), dtype=np.float32)
    answer = _Answer(
        tokens=tuple(layout.response_token_strings()),
        peaks=z.max(0) if z.shape[0] else np.zeros(sae.d_sae, dtype=np.float32),
    )
    acts: np.ndarray | sparse.csc_array
    if np.count_nonzero(z) * 2 > z.size:
        acts, nbytes = z, z.nbytes
    else:
        acts = sparse.csc_array(z)
        nbytes = acts.data.nbytes + acts.indices.nbytes + acts.indptr.nbytes
    key = _cache_key(model, sae, example, activation)
    _peaks_cache.put(key, answer, answer.peaks.nbytes + 64 * len(answer.tokens))
    _tokens_cache.put(key, acts, int(nbytes))
    return answer, acts


def _answer(
    model: LoadedModel, sae: LoadedSAE, example: RAGExample, activation: Activation
) -> tuple[_Answer, bool]:
    """The answer's tokens and per-feature maxima, and whether they were cached."""
    hit = _peaks_cache.get(_cache_key(model, sae, example, activation))
    if hit is not None:
        return hit, True
    return _read(model, sae, example, activation)[0], False


def _token_activations(
    model: LoadedModel, sae: LoadedSAE, example: RAGExample, activation: Activation, feature: int
) -> np.ndarray:
    """``[T]`` one feature's activation at each answer token (cached, else one pass)."""
    acts = _tokens_cache.get(_cache_key(model, sae, example, activation))
    if acts is None:
        acts = _read(model, sae, example, activation)[1]
    col = acts[:, [feature]]
    col = col.toarray() if hasattr(col, "toarray") else col
    return np.asarray(col, dtype=np.float32).reshape(-1)


def time_reading(
    model: LoadedModel, sae: LoadedSAE, example: RAGExample, activation: Activation
) -> float:
    """Seconds per character (:func:`core.pipeline.extract.example_chars`) to read ``example``'s SAE
    activations, measured by reading them here (they stay cached, so the time counts
    towards the read it estimates), warm: a tiny answer (:data:`core.pipeline.extract.WARM_UP`)
    is read first, so what the first read loads (the SAE on the device, the hooks' first
    pass) is not in the pace.

    Raises:
        RagscopeError: The example cannot be laid out or run.
    """
    _read(model, sae, WARM_UP, activation)
    t0 = time.perf_counter()
    _read(model, sae, example, activation)
    return (time.perf_counter() - t0) / example_chars(example)


def read_estimate(
    model: LoadedModel,
    sae: LoadedSAE,
    examples: Sequence[RAGExample],
    *,
    activation: Activation,
    pace: Callable[[RAGExample], float | None],
    kept_pace: float = 0.0,
) -> WorkEstimate:
    """How long :func:`encode_answers` of ``examples`` will take: the answers not in the
    in-process cache at ``pace(first of them)`` seconds per character (``pace`` is called
    only when something is left to read; it may read that answer, see
    :func:`time_reading`: the count is taken after), those in it at ``kept_pace`` seconds
    each."""

    return estimate_work(
        examples, lambda exs: unread(model, sae, exs, activation), pace, kept_pace=kept_pace
    )


def unread(
    model: LoadedModel, sae: LoadedSAE, examples: Sequence[RAGExample], activation: Activation
) -> list[RAGExample]:
    """Those of ``examples`` whose ``activation`` is not in the in-process cache yet (the
    ones :func:`encode_answers` will run the model on)."""
    return [e for e in examples if _peaks_cache.get(_cache_key(model, sae, e, activation)) is None]


@dataclass(frozen=True, kw_only=True, eq=False)
class EncodedAnswers:
    """What :func:`encode_answers` read.

    Attributes:
        examples: The examples whose answers were encoded, in order.
        errors: ``"<id>: <why>"`` of each example that could not be read (skipped).
        computed: Examples that needed a forward pass.
        cache_hits: Examples found in the in-process cache.
        seconds: Wall time.
    """

    examples: tuple[RAGExample, ...]
    errors: tuple[str, ...]
    computed: int
    cache_hits: int
    seconds: float


def encode_answers(
    model: LoadedModel,
    sae: LoadedSAE,
    examples: Sequence[RAGExample],
    *,
    activation: Activation = "post",
    progress: Progress | None = None,
    on_error: Literal["raise", "skip"] = "raise",
) -> EncodedAnswers:
    """Encode every example's answer with the SAE into the in-process cache.

    Later :func:`feature_examples` and :func:`active_features` calls on these examples
    need no forward pass (while they stay cached).

    Args:
        model: The model the SAE reads.
        sae: The SAE.
        examples: The examples.
        activation: ``post`` or ``pre``.
        progress: ``progress(done, total)`` after each example.
        on_error: ``skip`` leaves out (and lists) examples that cannot be laid out or
            run; ``raise`` raises the first such error.

    Raises:
        ModelError: The SAE was trained on another model.
        RagscopeError: An example failed and ``on_error`` is ``raise``.
    """
    import time

    sae.check_model(model.info.key, model.info.d_model)
    t0 = time.perf_counter()
    ok: list[RAGExample] = []
    errors: list[str] = []
    computed = hits = 0
    for i, ex in enumerate(examples):
        try:
            _, hit = _answer(model, sae, ex, activation)
        except RagscopeError as e:
            if on_error == "raise":
                raise
            errors.append(f"{ex.id}: {e}")
        else:
            ok.append(ex)
            hits += hit
            computed += not hit
        if progress is not None:
            progress(i + 1, len(examples))
    return EncodedAnswers(
        examples=tuple(ok),
        errors=tuple(errors),
        computed=computed,
        cache_hits=hits,
        seconds=time.perf_counter() - t0,
    )


def active_features(
    model: LoadedModel,
    sae: LoadedSAE,
    examples: Sequence[RAGExample],
    *,
    activation: Activation = "post",
    n: int = 8,
) -> list[int]:
    """The ``n`` features that fire on the most answers of ``examples`` (ties: the higher
    mean max activation first); features that never fire are left out."""
    count = np.zeros(sae.d_sae, dtype=np.int64)
    total = np.zeros(sae.d_sae, dtype=np.float64)
    for ex in examples:
        peaks = _answer(model, sae, ex, activation)[0].peaks
        count += peaks > 0
        total += peaks
    order = np.lexsort((-total, -count))
    return [int(k) for k in order[:n] if count[k] > 0]


def _bins(order: np.ndarray, n: int) -> list[np.ndarray]:
    return [b for b in np.array_split(order, min(n, order.size)) if b.size] if order.size else []


def feature_examples(
    model: LoadedModel,
    sae: LoadedSAE,
    examples: Sequence[RAGExample],
    feature: int,
    *,
    activation: Activation = "post",
    n_top: int = 12,
    n_quantile: int = 12,
    n_held_out: int = 8,
    seed: int = 0,
    progress: Progress | None = None,
) -> FeatureExamples:
    """The examples of SAE feature ``feature`` among ``examples``' answers.

    Every example is read once per process (one forward pass that stops after the SAE's
    block). Its per-feature maxima, all the selection reads, stay cached for thousands of
    answers; its token-level activations, read for the examples kept, are cached within
    :data:`TOKENS_CACHE_BYTES` (an answer dropped from there costs one pass again).

    Selection, by each answer's max activation of the feature:

    - ``top``: the ``n_top`` highest (ties: dataset order), among answers where it fires.
    - ``quantile``: the other answers where it fires, sorted by max activation and cut
      into ``n_quantile`` equal-count bins (its quantiles), one drawn at random from each.
    - ``held_out``: up to ``n_held_out`` of the rest, half where it fires and half where
      it does not (when there are enough of each), drawn at random.

    Args:
        model: The model the SAE reads.
        sae: The SAE.
        examples: The examples to read (their answers only).
        feature: The SAE feature, ``0 <= feature < sae.d_sae``.
        activation: ``post`` (the SAE's TopK output) or ``pre`` (before the top-k cut).
        n_top: Top-activating answers to keep.
        n_quantile: Quantile bins to draw one answer from.
        n_held_out: Answers to keep for :func:`fidelity`.
        seed: Seed of the random draws.
        progress: ``progress(done, total)`` after each example that needed a forward pass.

    Raises:
        ValueError: ``feature`` is outside the SAE.
        ModelError: The SAE was trained on another model.
        DataError: An example cannot be laid out.
    """
    if not 0 <= feature < sae.d_sae:
        raise ValueError(f"feature {feature} is outside 0..{sae.d_sae - 1} of {sae.name!r}")
    if min(n_top, n_quantile, n_held_out) < 0:
        raise ValueError(
            f"n_top, n_quantile and n_held_out must be >= 0, got {n_top}, {n_quantile}, {n_held_out}"
        )
    sae.check_model(model.info.key, model.info.d_model)
    answers: list[_Answer] = []
    for i, ex in enumerate(examples):
        answer, hit = _answer(model, sae, ex, activation)
        answers.append(answer)
        if progress is not None and not hit:
            progress(i + 1, len(examples))
    maxes = np.array([a.peaks[feature] for a in answers], dtype=np.float64)

    def example(i: int) -> FeatureExample:
        acts = _token_activations(model, sae, examples[i], activation, feature)
        return FeatureExample(
            example_id=examples[i].id,
            tokens=answers[i].tokens,
            activations=acts,
            max_activation=float(maxes[i]),
        )

    firing = np.flatnonzero(maxes > 0)
    by_strength = firing[np.argsort(-maxes[firing], kind="stable")]
    top = by_strength[:n_top]
    rest = by_strength[n_top:][::-1]  # ascending
    rng = np.random.default_rng(seed)
    quantile = np.array([rng.choice(b) for b in _bins(rest, n_quantile)], dtype=np.int64)
    quantile = quantile[np.argsort(-maxes[quantile], kind="stable")]
    used = set(top.tolist()) | set(quantile.tolist())
    fire_left = np.array([i for i in firing if i not in used], dtype=np.int64)
    silent = np.flatnonzero(maxes <= 0)
    n_fire = min(fire_left.size, max(n_held_out - silent.size, math.ceil(n_held_out / 2)))
    n_silent = min(silent.size, n_held_out - n_fire)
    held = np.concatenate(
        [
            rng.choice(fire_left, n_fire, replace=False) if n_fire else np.zeros(0, np.int64),
            rng.choice(silent, n_silent, replace=False) if n_silent else np.zeros(0, np.int64),
        ]
    ).astype(np.int64)
    held.sort()
    return FeatureExamples(
        feature=int(feature),
        sae_key=sae.key,
        activation=str(activation),
        top=tuple(example(i) for i in top),
        quantile=tuple(example(i) for i in quantile),
        held_out=tuple(example(i) for i in held),
        example_ids=tuple(e.id for e in examples),
        max_activations=maxes.astype(np.float32),
    )
