"""Explanation cards: the LLM's reply to the explanation prompt, cached per prompt.

:func:`explain_feature` / :func:`explain_many` take the explanation from the
:class:`~core.storage.Store` cache, else from an OpenAI-compatible chat endpoint
(:class:`~core.base.llm.LLMEndpoint`, through :func:`core.base.llm.chat`), then cache it;
:func:`cached_explanation` finds any cached layout with no request.
:class:`Explanation` reads the reply's hallucination verdict and description.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from core.base.errors import DataError, LLMError
from core.base.llm import CONFIG_HELP, LLMEndpoint, chat
from core.explain.activations import FeatureExamples, Progress, feature_key
from core.explain.prompt import (
    DEFAULT_WINDOW,
    ExplainPrompt,
    PromptBudget,
    _candidates,
    build_prompt,
)
from core.storage import Store

ShouldStop = Callable[[], bool]

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
        return m.group(1).lower() if m else None  # type: ignore[return-value]  # the pattern matches only Relation's words

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
        model_key: The SAE's host model (:attr:`~core.engine.model.ModelInfo.key`).
        sae_key: :attr:`~core.signals.sae.LoadedSAE.key`.
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
    :class:`~core.base.errors.LLMError` also ends it (the next requests would most likely
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
