"""LLM-written explanations of SAE features (RAGLens feature cards, ``specs/raglens.md``).

1. :func:`feature_examples`: one forward pass per example (stopped after the SAE's
   block, :func:`core.trace.residuals_until`), the SAE's activations of one feature at every
   answer token, and from them the examples a reader (or an LLM) is shown: the
   top-activating answers and a quantile-spread sample of the others where the
   feature fires (12 + 12 in the paper), plus a few held-out answers for the
   fidelity check. Encoded answers stay in a bounded in-process cache (every
   feature's max per answer, and token-level activations within a byte budget), so
   reading several features costs one pass per example.
2. :func:`build_prompt`: our own prompt. Each shown answer is a list of
   ``(token, activation)`` pairs (activations on a 0-10 scale, 10 = the strongest in
   the examples shown); the LLM is asked whether the strongly activated tokens have
   to do with hallucination in retrieval-augmented answers, and for a one-sentence
   description. Its :attr:`ExplainPrompt.hash` (template version + the examples
   shown) keys the cache.
3. :func:`explain_feature` / :func:`explain_many`: the explanation from the
   :class:`~core.storage.Store` cache, else from an OpenAI-compatible chat endpoint
   (:class:`LLMEndpoint`, resolved from ``RAGSCOPE_LLM_*`` settings), then cached.
4. :func:`fidelity`: the LLM predicts, from the explanation alone, a 0-5 activation
   for every token of held-out answers; the score is the Pearson correlation of those
   predictions with the real activations over all their tokens.

The API key is only ever handed to the ``openai`` client: it is not in any repr,
message, cached text or database row.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from core.errors import DataError, LLMError, RagscopeError
from core.examples import RAGExample, example_hash
from core.layout import render
from core.llm import (
    CONFIG_HELP,
    ENV_CONTEXT,
    MIN_CONTEXT,
    LLMEndpoint,
    chat,
)
from core.model import LoadedModel
from core.sae import Activation, LoadedSAE
from core.storage import Store
from core.trace import residuals_until

if TYPE_CHECKING:
    import pandas as pd
    from scipy import sparse

Progress = Callable[[int, int], None]
ShouldStop = Callable[[], bool]

PROMPT_VERSION = "ragscope-explain-v1"
"""Version of the explanation prompt; part of every prompt hash (bump it when the text changes)."""
EXPLAIN_SCALE = 10
"""Activations in the explanation prompt are integers ``0..EXPLAIN_SCALE``."""
FIDELITY_SCALE = 5
"""The fidelity check asks for integer predictions ``0..FIDELITY_SCALE``."""
DEFAULT_WINDOW = 64
"""Tokens shown per answer in the explanation prompt (a window around its peak)."""
FIDELITY_MAX_TOKENS = 96
"""Tokens of each held-out answer the fidelity check predicts (its first ones)."""


REPLY_RESERVE = 256
"""Tokens of the explainer's context kept free for its reply (:class:`PromptBudget`)."""
TEMPLATE_OVERHEAD = 64
"""Tokens a chat template adds around the two messages (:class:`PromptBudget`)."""
COUNT_MARGIN = 1.1
"""Counted tokens are scaled by this much: the explainer's tokenizer is not ours."""


# --------------------------------------------------------------------------- endpoint


# --------------------------------------------------------------------------- activations


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
        sae_key: :attr:`~core.sae.LoadedSAE.key` of its SAE.
        activation: ``post`` or ``pre`` (:meth:`~core.sae.LoadedSAE.encode`).
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


# --------------------------------------------------------------------------- prompt

EXPLAIN_SYSTEM = (
    "You help interpret the internals of a language model that answers questions and "
    "writes summaries from retrieved passages (retrieval-augmented generation). A sparse "
    "autoencoder splits the model's hidden state at each token into many features; you "
    "are shown where one of them fires and asked what it responds to. Answer briefly and "
    "concretely, and say so when the evidence is weak."
)

FIDELITY_SYSTEM = (
    "You predict where one internal feature of a language model fires, from a short "
    "description of that feature alone. Follow the requested reply format exactly."
)


def estimate_tokens(text: str) -> int:
    """A tokenizer-free estimate of ``text``'s tokens: one per 2.2 characters.

    The explanation prompt is mostly short quoted tokens, digits and punctuation, which
    BPE tokenizers split finely (SmolLM2's counts one token per 2.4 characters of it).
    """
    return math.ceil(len(text) / 2.2)


@dataclass(frozen=True, kw_only=True)
class PromptBudget:
    """How many tokens a prompt to the explainer may take.

    A prompt fits when ``margin * (count(system) + count(user))`` plus ``overhead``
    (the chat template) plus ``reserve`` (the reply) is at most ``context``.

    Attributes:
        context: The explainer's context in tokens.
        count: Counts a message's tokens (the app passes the loaded model's tokenizer;
            default :func:`estimate_tokens`).
        reserve: Tokens kept for the reply.
        overhead: Tokens the chat template adds.
        margin: Scale on counted tokens (the explainer's tokenizer may split finer).
    """

    context: int
    count: Callable[[str], int] = estimate_tokens
    reserve: int = REPLY_RESERVE
    overhead: int = TEMPLATE_OVERHEAD
    margin: float = COUNT_MARGIN

    def __post_init__(self) -> None:
        if self.context < MIN_CONTEXT:
            raise DataError(
                f"the explainer's context must be at least {MIN_CONTEXT} tokens, got "
                f"{self.context}; set {ENV_CONTEXT} to the model's real context",
                field="context",
            )
        if self.reserve < 0 or self.overhead < 0 or not self.margin >= 1.0:
            raise ValueError(
                f"reserve and overhead must be >= 0 and margin >= 1, got {self.reserve}, "
                f"{self.overhead}, {self.margin}"
            )

    @property
    def limit(self) -> int:
        """Tokens both messages may take, before the margin."""
        return self.context - self.reserve - self.overhead

    def size(self, system: str, user: str) -> int:
        """The tokens both messages are budgeted at (counted, times the margin)."""
        return math.ceil(self.margin * (self.count(system) + self.count(user)))

    def fits(self, system: str, user: str) -> bool:
        return self.size(system, user) <= self.limit


@dataclass(frozen=True, kw_only=True)
class ExplainPrompt:
    """A prompt for the explainer and its cache identity.

    Attributes:
        system: The system message.
        user: The user message (the examples and the questions).
        hash: sha256 of :data:`PROMPT_VERSION` and both messages (so of the examples shown).
        n_top: Strongest answers shown (the first of :attr:`FeatureExamples.top`).
        n_spread: Quantile-spread answers shown (the first of
            :attr:`FeatureExamples.quantile`).
        window: Tokens shown per answer at most (``None``: all).
        n_tokens: Its size by the budget it was fitted to (``None``: not fitted).
    """

    system: str
    user: str
    hash: str
    n_top: int
    n_spread: int
    window: int | None
    n_tokens: int | None = None

    @property
    def n_shown(self) -> int:
        return self.n_top + self.n_spread


def scaled(values: np.ndarray, top: float, scale: int = EXPLAIN_SCALE) -> np.ndarray:
    """``round(scale * values / top)`` as integers clipped to ``0..scale`` (``top`` > 0)."""
    if not top > 0:
        raise ValueError(f"the scale's top must be > 0, got {top}")
    return np.clip(np.rint(scale * np.asarray(values, dtype=np.float64) / top), 0, scale).astype(
        int
    )


def _window(n: int, center: int, size: int | None) -> tuple[int, int]:
    if size is None or n <= size:
        return 0, n
    start = min(max(center - size // 2, 0), n - size)
    return start, start + size


def _prompt_hash(version: str, system: str, user: str) -> str:
    payload = json.dumps([version, system, user], ensure_ascii=False)
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()


SHRINK_WINDOWS: tuple[int, ...] = (48, 32, 24)
"""Windows a fitted prompt tries, in order, before it drops answers."""
LAST_WINDOWS: tuple[int, ...] = (16, 8)
"""Windows tried with the fewest answers, when nothing larger fits."""
MIN_SHOWN = 2
"""Answers a fitted prompt keeps at least."""


def prompt_layouts(
    n_top: int, n_spread: int, window: int | None = DEFAULT_WINDOW
) -> list[tuple[int, int, int | None]]:
    """The ``(n_top, n_spread, window)`` a fitted prompt tries, largest first.

    First every answer with narrower windows (``window``, then each of
    :data:`SHRINK_WINDOWS` below it), then one answer fewer at a time at the narrowest
    of those (strongest and spread answers dropped in proportion, at least one
    strongest kept) down to :data:`MIN_SHOWN`, then :data:`LAST_WINDOWS`.
    """
    total = n_top + n_spread
    windows: list[int | None] = [window]
    windows += [w for w in SHRINK_WINDOWS if window is None or w < window]
    out: list[tuple[int, int, int | None]] = [(n_top, n_spread, w) for w in windows]
    w_min = windows[-1]
    k = (n_top, n_spread)
    for shown in range(total - 1, min(MIN_SHOWN, total) - 1, -1):
        kt = min(n_top, max(1, round(shown * n_top / total)))
        k = (kt, min(n_spread, shown - kt))
        out.append((*k, w_min))
    out += [(*k, w) for w in LAST_WINDOWS if w_min is None or w < w_min]
    return list(dict.fromkeys(out))  # without repeats, in order


def _render_prompt(
    examples: FeatureExamples, n_top: int, n_spread: int, window: int | None
) -> ExplainPrompt:
    shown = examples.top[:n_top] + examples.quantile[:n_spread]
    top = max((e.max_activation for e in shown), default=0.0)
    if not top > 0:
        raise DataError(
            f"feature F{examples.feature} fires on none of the {examples.n_examples} examples "
            "read; read more (or other) examples to explain it"
        )
    blocks = []
    for i, ex in enumerate(shown, start=1):
        q = scaled(ex.activations, top)
        start, end = _window(len(ex.tokens), ex.peak or 0, window)
        pairs = ", ".join(
            f"({json.dumps(ex.tokens[j], ensure_ascii=False)}, {q[j]})" for j in range(start, end)
        )
        cut = ""
        if (start, end) != (0, len(ex.tokens)):
            cut = f" (tokens {start + 1}-{end} of {len(ex.tokens)})"
        strongest = ", ".join(
            f"{json.dumps(t, ensure_ascii=False)} ({int(scaled(np.array([v]), top)[0])})"
            for t, v in ex.top_tokens(3)
        )
        group = "strongest" if i <= n_top else "spread"
        blocks.append(
            f"Answer {i} [{group}; peak {q.max() if q.size else 0}]{cut}:\n[{pairs}]\n"
            f"Most active tokens: {strongest or 'none'}"
        )
    user = (
        "Below are answers a language model wrote from retrieved passages. Each is given as "
        "a list of (token, activation) pairs: how strongly one internal feature fires on "
        f"each token, from 0 (not at all) to {EXPLAIN_SCALE} (the strongest activation "
        f"among these answers). Answers marked 'strongest' ({n_top}) are those where the "
        f"feature fires hardest; those marked 'spread' ({n_spread}) are drawn from across the "
        "range of its activations.\n\n"
        + "\n\n".join(blocks)
        + "\n\nLook at the tokens with high activations and at what surrounds them.\n"
        "1. Do they have to do with hallucination in retrieval-augmented answers, that is "
        "content the passages do not support (invented names, numbers, dates or claims), "
        "as opposed to faithful use of the passages or plain wording?\n"
        "2. In one sentence, what does this feature respond to?\n\n"
        "Reply in exactly two lines:\n"
        "Hallucination: <yes | no | unclear> - <a few words why>\n"
        "Description: <one sentence>"
    )
    return ExplainPrompt(
        system=EXPLAIN_SYSTEM,
        user=user,
        hash=_prompt_hash(PROMPT_VERSION, EXPLAIN_SYSTEM, user),
        n_top=n_top,
        n_spread=n_spread,
        window=window,
    )


def _candidates(examples: FeatureExamples, window: int | None) -> list[ExplainPrompt]:
    """Every layout's prompt, largest first, skipping layouts whose answers never fire."""
    out = []
    for kt, ks, w in prompt_layouts(len(examples.top), len(examples.quantile), window):
        try:
            out.append(_render_prompt(examples, kt, ks, w))
        except DataError:
            continue
    return out


def build_prompt(
    examples: FeatureExamples,
    *,
    window: int | None = DEFAULT_WINDOW,
    budget: PromptBudget | None = None,
) -> ExplainPrompt:
    """Our explanation prompt for the feature's examples.

    Each answer is written as a list of ``(token, activation)`` pairs, tokens as JSON
    strings, activations as :func:`scaled` integers (10 = the strongest activation among
    the answers shown), followed by its strongest tokens. Without a budget every shown
    answer (:attr:`FeatureExamples.shown`) is in it; with one, the largest of
    :func:`prompt_layouts` that fits (narrower windows first, then fewer answers), so a
    small explainer such as ``ragscope serve-llm``'s 8k-context model gets a prompt it
    can read.

    Args:
        examples: The feature's examples.
        window: At most this many tokens per answer, centred on its peak (``None``: all).
        budget: The explainer's context (``None``: no limit).

    Raises:
        DataError: The feature fires on none of the examples (nothing to explain), or
            not even the smallest layout fits the budget.
    """
    if budget is None:
        return _render_prompt(examples, len(examples.top), len(examples.quantile), window)
    candidates = _candidates(examples, window)
    if not candidates:  # none fires: the full prompt's error names the feature
        _render_prompt(examples, len(examples.top), len(examples.quantile), window)
    for p in candidates:
        size = budget.size(p.system, p.user)
        if size <= budget.limit:
            return replace(p, n_tokens=size)
    smallest = candidates[-1]
    raise DataError(
        f"even {smallest.n_shown} answers of {smallest.window} tokens (about "
        f"{budget.size(smallest.system, smallest.user)} tokens) do not fit the explainer's "
        f"context of {budget.context} tokens ({budget.reserve} kept for the reply); use a "
        f"model with a larger context (and set {ENV_CONTEXT})",
        field="context",
    )


# --------------------------------------------------------------------------- explanations

Relation = Literal["yes", "no", "unclear"]
_RELATION = re.compile(r"^hallucination\W*\s*(yes|no|unclear)\b\W*(.*)", re.IGNORECASE)
_DESCRIPTION = re.compile(r"^description\W*\s*(.+)", re.IGNORECASE)


@dataclass(frozen=True, kw_only=True)
class Explanation:
    """An LLM-written explanation of one SAE feature.

    Attributes:
        feature: The SAE feature.
        feature_key: Its key in the cache (:func:`feature_key`).
        prompt_hash: :attr:`ExplainPrompt.hash` of the prompt it answers.
        text: The explainer's reply, as cached.
        cached: Whether it came from the cache (no request was made).
        prompt: The prompt it answers (its layout: answers and window shown).
    """

    feature: int
    feature_key: str
    prompt_hash: str
    text: str
    cached: bool
    prompt: ExplainPrompt | None = None

    def _line(self, pattern: re.Pattern[str]) -> re.Match[str] | None:
        for line in self.text.splitlines():
            m = pattern.search(line.strip().strip("*_#>- ").replace("**", ""))
            if m:
                return m
        return None

    @property
    def description(self) -> str:
        """The one-sentence description (the whole reply when it is not in the asked form)."""
        m = self._line(_DESCRIPTION)
        return m.group(1).strip() if m else self.text.strip()

    @property
    def hallucination(self) -> Relation | None:
        """Whether the explainer relates the feature to hallucination (``None``: it did not say)."""
        m = self._line(_RELATION)
        return m.group(1).lower() if m else None  # type: ignore[return-value]

    @property
    def reason(self) -> str | None:
        """The explainer's few words on why (or why not) it relates to hallucination."""
        m = self._line(_RELATION)
        return (m.group(2).strip(" -:–—") or None) if m else None


def cached_explanation(
    model_key: str,
    examples: FeatureExamples,
    *,
    store: Store,
    window: int | None = DEFAULT_WINDOW,
) -> Explanation | None:
    """The cached explanation of these examples, if any (no request).

    Any of the feature's prompt layouts (:func:`prompt_layouts`) counts, the largest
    cached one first: an explanation written through a small explainer's fitted prompt
    still shows once that explainer is gone (and with no explainer at all).
    """
    candidates = _candidates(examples, window)
    if not candidates:
        return None
    hit = store.find_explanation(
        model=model_key,
        feature_key=examples.feature_key,
        prompt_hashes=[p.hash for p in candidates],
    )
    if hit is None:
        return None
    prompt = next(p for p in candidates if p.hash == hit[0])
    return Explanation(
        feature=examples.feature,
        feature_key=examples.feature_key,
        prompt_hash=prompt.hash,
        text=hit[1],
        cached=True,
        prompt=prompt,
    )


def explain_feature(
    endpoint: LLMEndpoint | None,
    model_key: str,
    sae_key: str,
    feature: int,
    examples: FeatureExamples,
    *,
    store: Store,
    window: int | None = DEFAULT_WINDOW,
    budget: PromptBudget | None = None,
) -> Explanation:
    """The explanation of SAE feature ``feature``: cached, else asked of ``endpoint`` and cached.

    Cached under ``(model_key, "<sae_key>:F<feature>", prompt hash)``. The prompt is
    fitted to ``budget`` (:func:`build_prompt`); when it is cached, no request is made.
    With no endpoint, any cached layout of these examples answers
    (:func:`cached_explanation`).

    Args:
        endpoint: The explainer (``None``: only the cache can answer).
        model_key: The SAE's host model (:attr:`~core.model.ModelInfo.key`).
        sae_key: :attr:`~core.sae.LoadedSAE.key`.
        feature: The SAE feature.
        examples: Its examples (:func:`feature_examples`).
        store: The cache.
        window: Tokens shown per answer (:func:`build_prompt`).
        budget: The explainer's context (``None``: no limit).

    Raises:
        ValueError: ``examples`` are another feature's or another SAE's.
        DataError: The feature fires on none of the examples, or no prompt fits the budget.
        LLMError: Not cached and no endpoint is configured, or the request failed.
    """
    if examples.feature != feature or examples.sae_key != sae_key:
        raise ValueError(
            f"the examples are of {examples.feature_key}, not {feature_key(sae_key, feature)}"
        )
    key = feature_key(sae_key, feature)
    if endpoint is None:
        hit = cached_explanation(model_key, examples, store=store, window=window)
        if hit is not None:
            return hit
        raise LLMError(f"no LLM endpoint is configured to explain F{feature}. {CONFIG_HELP}")
    prompt = build_prompt(examples, window=window, budget=budget)
    text = store.get_explanation(model=model_key, feature_key=key, prompt_hash=prompt.hash)
    if text is not None:
        return Explanation(
            feature=feature,
            feature_key=key,
            prompt_hash=prompt.hash,
            text=text,
            cached=True,
            prompt=prompt,
        )
    text = chat(endpoint, prompt.system, prompt.user)
    store.put_explanation(model=model_key, feature_key=key, prompt_hash=prompt.hash, text=text)
    return Explanation(
        feature=feature,
        feature_key=key,
        prompt_hash=prompt.hash,
        text=text,
        cached=False,
        prompt=prompt,
    )


@dataclass(frozen=True, kw_only=True)
class BatchResult:
    """What :func:`explain_many` did.

    Attributes:
        done: The explanations got (cached or new), in the order asked.
        skipped: Features that fire on none of their examples (nothing to explain).
        total: Features asked for.
        cancelled: Whether ``should_stop`` ended the batch early.
        error: Why the batch stopped early on an error (``None``: it did not).
    """

    done: tuple[Explanation, ...]
    skipped: tuple[int, ...]
    total: int
    cancelled: bool
    error: str | None = None

    @property
    def n_requested(self) -> int:
        """Explanations that needed a request (not from the cache)."""
        return sum(1 for e in self.done if not e.cached)

    @property
    def complete(self) -> bool:
        return len(self.done) + len(self.skipped) == self.total


def explain_many(
    endpoint: LLMEndpoint | None,
    model_key: str,
    items: Sequence[FeatureExamples],
    *,
    store: Store,
    progress: Progress | None = None,
    should_stop: ShouldStop | None = None,
    window: int | None = DEFAULT_WINDOW,
    budget: PromptBudget | None = None,
) -> BatchResult:
    """Explain several features in order ("explain top N"), cached ones without a request.

    ``should_stop()`` is asked before each feature; when it returns True the batch ends
    there (what is done stays cached, so a later batch resumes). The first
    :class:`~core.errors.LLMError` also ends it (the next requests would most likely
    fail the same way); it is returned in :attr:`BatchResult.error`.

    Args:
        endpoint: The explainer (``None``: only cached explanations are returned; the
            first feature not cached ends the batch with the configuration help).
        model_key: The SAE's host model.
        items: Each feature's examples (:func:`feature_examples`), in the order to explain.
        store: The cache.
        progress: ``progress(done, total)`` after each feature.
        should_stop: Cancellation check.
        window: Tokens shown per answer.
        budget: The explainer's context (``None``: no limit).
    """
    done: list[Explanation] = []
    skipped: list[int] = []
    total = len(items)
    for i, fx in enumerate(items):
        if should_stop is not None and should_stop():
            return BatchResult(
                done=tuple(done), skipped=tuple(skipped), total=total, cancelled=True
            )
        if fx.n_firing == 0:
            skipped.append(fx.feature)
        else:
            try:
                done.append(
                    explain_feature(
                        endpoint,
                        model_key,
                        fx.sae_key,
                        fx.feature,
                        fx,
                        store=store,
                        window=window,
                        budget=budget,
                    )
                )
            except (LLMError, DataError) as e:
                return BatchResult(
                    done=tuple(done),
                    skipped=tuple(skipped),
                    total=total,
                    cancelled=False,
                    error=str(e),
                )
        if progress is not None:
            progress(i + 1, total)
    return BatchResult(done=tuple(done), skipped=tuple(skipped), total=total, cancelled=False)


# --------------------------------------------------------------------------- fidelity


@dataclass(frozen=True, kw_only=True, eq=False)
class FidelityResult:
    """How well an explanation predicts a feature's activations on held-out answers.

    Attributes:
        r: Pearson correlation of predicted (0-5) and real activations over every token
            of the answers whose predictions could be read (NaN when either side is
            constant).
        example_ids: The answers read, shape ``[m]``.
        predicted: Per answer read, the predictions of its first tokens.
        actual: Per answer read, the real activations of the same tokens.
        n_unread: Held-out answers the reply gave no line for (left out of ``r``).
    """

    r: float
    example_ids: tuple[str, ...]
    predicted: tuple[np.ndarray, ...]
    actual: tuple[np.ndarray, ...]
    n_unread: int

    @property
    def n_tokens(self) -> int:
        return int(sum(p.size for p in self.predicted))


def fidelity_prompt(
    explanation: str, held_out: Sequence[FeatureExample], *, max_tokens: int = FIDELITY_MAX_TOKENS
) -> tuple[str, str]:
    """``(system, user)`` messages asking for 0-5 per-token predictions from ``explanation``.

    Each answer's first ``max_tokens`` tokens are numbered from 0; the reply lists only
    the tokens predicted above 0, one line per answer (``Answer 2: 3=4, 7=1`` or
    ``Answer 2: none``).
    """
    blocks = []
    for i, ex in enumerate(held_out, start=1):
        toks = ex.tokens[:max_tokens]
        listed = " | ".join(f"{j} {json.dumps(t, ensure_ascii=False)}" for j, t in enumerate(toks))
        blocks.append(f"Answer {i}:\n{listed}")
    user = (
        "An internal feature of a language model has been described as follows:\n"
        f"{explanation.strip()}\n\n"
        "Below are answers the model wrote from retrieved passages, split into numbered "
        "tokens. For every answer, predict how strongly the feature fires on each token, "
        f"from 0 (not at all) to {FIDELITY_SCALE} (as strongly as it ever does). List only "
        "the tokens you predict above 0, as number=prediction; every token you leave out "
        "counts as 0.\n\n"
        + "\n\n".join(blocks)
        + "\n\nReply with one line per answer and nothing else, like:\n"
        "Answer 1: 4=3, 9=5\nAnswer 2: none"
    )
    return FIDELITY_SYSTEM, user


_ANSWER_LINE = re.compile(r"^\W*answer\s*(\d+)\s*\W*?[:\-–—]\s*(.*)$", re.IGNORECASE)
_PAIR = re.compile(r"(\d+)\s*[=:]\s*(\d+(?:\.\d+)?)")


def parse_predictions(reply: str, lengths: Sequence[int]) -> list[np.ndarray | None]:
    """Per answer, the 0-5 predictions a fidelity reply gives (``None``: no line for it).

    Lenient: markdown emphasis and bullets are ignored, ``=`` or ``:`` separate a token
    number from its prediction, predictions are clipped to ``0..5``, token numbers out of
    range and repeated answer lines (after the first) are ignored.
    """
    out: list[np.ndarray | None] = [None] * len(lengths)
    for raw in reply.splitlines():
        m = _ANSWER_LINE.match(raw.replace("*", "").replace("`", "").strip())
        if not m:
            continue
        i = int(m.group(1)) - 1
        if not 0 <= i < len(lengths) or out[i] is not None:
            continue
        pred = np.zeros(lengths[i], dtype=np.float64)
        for tok, val in _PAIR.findall(m.group(2)):
            j = int(tok)
            if 0 <= j < lengths[i]:
                pred[j] = min(max(float(val), 0.0), float(FIDELITY_SCALE))
        out[i] = pred
    return out


def pearson(a: np.ndarray, b: np.ndarray) -> float:
    """Pearson correlation of two equal-length vectors (NaN when either is constant)."""
    x = np.asarray(a, dtype=np.float64).reshape(-1)
    y = np.asarray(b, dtype=np.float64).reshape(-1)
    if x.shape != y.shape:
        raise ValueError(f"shapes differ: {x.shape} and {y.shape}")
    if x.size < 2:
        return float("nan")
    dx, dy = x - x.mean(), y - y.mean()
    denom = math.sqrt(float(dx @ dx) * float(dy @ dy))
    return float(dx @ dy / denom) if denom > 0 else float("nan")


FIDELITY_SHRINK: tuple[int, ...] = (64, 48, 32, 24)
"""Tokens per held-out answer a fitted fidelity prompt tries before it drops answers."""


def _alternate(answers: Sequence[FeatureExample]) -> list[FeatureExample]:
    """Answers where the feature fires and where it does not, alternately (firing first)."""
    firing = [e for e in answers if e.max_activation > 0]
    silent = [e for e in answers if not e.max_activation > 0]
    out: list[FeatureExample] = []
    for i in range(max(len(firing), len(silent))):
        out += firing[i : i + 1] + silent[i : i + 1]
    return out


def _fit_fidelity(
    text: str,
    answers: Sequence[FeatureExample],
    max_tokens: int,
    budget: PromptBudget | None,
) -> tuple[str, str, list[FeatureExample], int]:
    """The fidelity prompt's messages, the answers in it and their token cap, fitted."""
    if budget is None:
        return (*fidelity_prompt(text, answers, max_tokens=max_tokens), list(answers), max_tokens)
    answers = _alternate(answers)
    caps = [max_tokens] + [c for c in FIDELITY_SHRINK if c < max_tokens]
    layouts = [(len(answers), c) for c in caps]
    layouts += [
        (n, caps[-1]) for n in range(len(answers) - 1, min(MIN_SHOWN, len(answers)) - 1, -1)
    ]
    for n, cap in layouts:
        system, user = fidelity_prompt(text, answers[:n], max_tokens=cap)
        if budget.fits(system, user):
            return system, user, list(answers[:n]), cap
    raise DataError(
        f"even {min(MIN_SHOWN, len(answers))} held-out answers of {caps[-1]} tokens do not fit "
        f"the explainer's context of {budget.context} tokens; use a model with a larger "
        f"context (and set {ENV_CONTEXT})",
        field="context",
    )


def fidelity(
    endpoint: LLMEndpoint,
    explanation: str | Explanation,
    held_out: Sequence[FeatureExample],
    *,
    max_tokens: int = FIDELITY_MAX_TOKENS,
    budget: PromptBudget | None = None,
) -> FidelityResult:
    """Ask the LLM to predict the feature on ``held_out`` from ``explanation``; score it.

    Per token: the LLM gives a 0-5 prediction for each of the first ``max_tokens`` tokens
    of every held-out answer (listing only those above 0); the score is the Pearson r of
    those predictions with the real activations, over all tokens of the answers it
    answered for. Not cached (each call is a request). With a ``budget``, fewer tokens
    per answer and then fewer answers (firing and silent ones alternately) until the
    prompt fits.

    Raises:
        DataError: No held-out answer has tokens, or no prompt fits the budget.
        LLMError: The request failed, or no prediction could be read from the reply.
    """
    text = explanation.description if isinstance(explanation, Explanation) else explanation
    usable = [e for e in held_out if e.tokens]
    if not usable:
        raise DataError("the fidelity check needs held-out answers with at least one token")
    system, user, usable, max_tokens = _fit_fidelity(text, usable, max_tokens, budget)
    reply = chat(endpoint, system, user)
    lengths = [min(len(e.tokens), max_tokens) for e in usable]
    preds = parse_predictions(reply, lengths)
    read = [(e, p) for e, p in zip(usable, preds, strict=True) if p is not None]
    if not read:
        raise LLMError(
            f"could not read any prediction from the reply of {endpoint.where} "
            f"(it began {reply[:120]!r}); try another model"
        )
    actual = tuple(e.activations[: p.size].astype(np.float64) for e, p in read)
    predicted = tuple(p for _, p in read)
    r = pearson(np.concatenate(predicted), np.concatenate(actual))
    return FidelityResult(
        r=r,
        example_ids=tuple(e.example_id for e, _ in read),
        predicted=predicted,
        actual=actual,
        n_unread=len(usable) - len(read),
    )
