"""Fidelity: how well an explanation predicts a feature's activations on held-out answers.

The LLM predicts, from the explanation alone, a 0-5 activation for every token of
held-out answers (:func:`fidelity_prompt`, read back by :func:`parse_predictions`); the
score is the Pearson correlation (:func:`pearson`) of those predictions with the real
activations over all their tokens (:func:`fidelity`).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from core.base.errors import DataError, LLMError
from core.base.llm import ENV_CONTEXT, LLMEndpoint, chat
from core.explain.activations import FeatureExample
from core.explain.cards import Explanation
from core.explain.prompt import MIN_SHOWN, PromptBudget

FIDELITY_SCALE = 5
"""The fidelity check asks for integer predictions ``0..FIDELITY_SCALE``."""
FIDELITY_MAX_TOKENS = 96
"""Tokens of each held-out answer the fidelity check predicts (its first ones)."""

FIDELITY_SYSTEM = (
    "You predict where one internal feature of a language model fires, from a short "
    "description of that feature alone. Follow the requested reply format exactly."
)


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
