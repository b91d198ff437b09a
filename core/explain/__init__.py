"""LLM-written explanations of SAE features (RAGLens feature cards).

The definition: ``specs/raglens.md``.

1. :func:`feature_examples`: one forward pass per example (stopped after the SAE's
   block, :func:`core.engine.trace.residuals_until`), the SAE's activations of one feature at every
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

from core.explain.activations import (
    PEAKS_CACHE_BYTES,
    TOKENS_CACHE_BYTES,
    CacheKey,
    EncodedAnswers,
    FeatureExample,
    FeatureExamples,
    Progress,
    active_features,
    clear_activation_cache,
    encode_answers,
    feature_examples,
    feature_key,
    read_estimate,
    time_reading,
    unread,
)
from core.explain.cards import (
    BatchResult,
    Explanation,
    Relation,
    ShouldStop,
    cached_explanation,
    explain_feature,
    explain_many,
)
from core.explain.prompt import (
    COUNT_MARGIN,
    DEFAULT_WINDOW,
    EXPLAIN_SCALE,
    EXPLAIN_SYSTEM,
    LAST_WINDOWS,
    MIN_SHOWN,
    PROMPT_VERSION,
    REPLY_RESERVE,
    SHRINK_WINDOWS,
    TEMPLATE_OVERHEAD,
    ExplainPrompt,
    PromptBudget,
    build_prompt,
    estimate_tokens,
    prompt_layouts,
    scaled,
)
from core.explain.scoring import (
    FIDELITY_MAX_TOKENS,
    FIDELITY_SCALE,
    FIDELITY_SHRINK,
    FIDELITY_SYSTEM,
    FidelityResult,
    fidelity,
    fidelity_prompt,
    parse_predictions,
    pearson,
)

__all__ = [
    "BatchResult",
    "COUNT_MARGIN",
    "CacheKey",
    "DEFAULT_WINDOW",
    "EXPLAIN_SCALE",
    "EXPLAIN_SYSTEM",
    "EncodedAnswers",
    "ExplainPrompt",
    "Explanation",
    "FIDELITY_MAX_TOKENS",
    "FIDELITY_SCALE",
    "FIDELITY_SHRINK",
    "FIDELITY_SYSTEM",
    "FeatureExample",
    "FeatureExamples",
    "FidelityResult",
    "LAST_WINDOWS",
    "MIN_SHOWN",
    "PEAKS_CACHE_BYTES",
    "PROMPT_VERSION",
    "Progress",
    "PromptBudget",
    "REPLY_RESERVE",
    "Relation",
    "SHRINK_WINDOWS",
    "ShouldStop",
    "TEMPLATE_OVERHEAD",
    "TOKENS_CACHE_BYTES",
    "active_features",
    "build_prompt",
    "cached_explanation",
    "clear_activation_cache",
    "encode_answers",
    "estimate_tokens",
    "explain_feature",
    "explain_many",
    "feature_examples",
    "feature_key",
    "fidelity",
    "fidelity_prompt",
    "parse_predictions",
    "pearson",
    "read_estimate",
    "unread",
    "prompt_layouts",
    "scaled",
    "time_reading",
]
