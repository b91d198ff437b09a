"""The explanation prompt: its token budget, its layouts and its text.

Each shown answer is a list of ``(token, activation)`` pairs (activations on a 0-10
scale, 10 = the strongest in the examples shown); the LLM is asked whether the strongly
activated tokens have to do with hallucination in retrieval-augmented answers, and for a
one-sentence description. :class:`PromptBudget` fits the prompt to the explainer's
context (:func:`prompt_layouts`: narrower windows, then fewer answers), and
:attr:`ExplainPrompt.hash` (template version + the examples shown) keys the cache.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from core.base.errors import DataError
from core.base.llm import ENV_CONTEXT, MIN_CONTEXT
from core.base.words import counted
from core.explain.activations import FeatureExamples

PROMPT_VERSION = "ragscope-explain-v1"
"""Version of the explanation prompt; part of every prompt hash (bump it when the text changes)."""
EXPLAIN_SCALE = 10
"""Activations in the explanation prompt are integers ``0..EXPLAIN_SCALE``."""
DEFAULT_WINDOW = 64
"""Tokens shown per answer in the explanation prompt (a window around its peak)."""

REPLY_RESERVE = 256
"""Tokens of the explainer's context kept free for its reply (:class:`PromptBudget`)."""
TEMPLATE_OVERHEAD = 64
"""Tokens a chat template adds around the two messages (:class:`PromptBudget`)."""
COUNT_MARGIN = 1.1
"""Counted tokens are scaled by this much: the explainer's tokenizer is not ours."""

EXPLAIN_SYSTEM = (
    "You help interpret the internals of a language model that answers questions and "
    "writes summaries from retrieved passages (retrieval-augmented generation). A sparse "
    "autoencoder splits the model's hidden state at each token into many features; you "
    "are shown where one of them fires and asked what it responds to. Answer briefly and "
    "concretely, and say so when the evidence is weak."
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
            f"feature F{examples.feature} fires on none of the "
            f"{counted(examples.n_examples, 'example')} read; read more (or other) examples "
            "to explain it"
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
