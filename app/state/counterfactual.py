"""Counterfactual: the page's state and the widget keys of its answer choice."""

from __future__ import annotations

from dataclasses import dataclass

from app.state.heads import AnswerChoice
from core.interventions.counterfactual import Counterfactual, ScoredOriginal

KEY_CF_SOURCE = "cf.example.source"
KEY_CF_DATASET = "cf.dataset"
KEY_CF_EXAMPLE = "cf.example.id"


@dataclass(kw_only=True)
class CounterfactualState(AnswerChoice):
    """The Counterfactual page's choices and its last comparison.

    The answer it shows: :class:`~app.state.heads.AnswerChoice`.

    Attributes:
        answer_mode: ``fixed`` (teacher-forced) or ``regenerate``.
        result: The last comparison (or the loaded session).
        scored: The original's side scored to time the first estimate, kept for the
            Compare that follows (the set's ``cache_id`` and the side).
    """

    answer_mode: str = "fixed"
    result: Counterfactual | None = None
    scored: tuple[str, ScoredOriginal] | None = None


# The counterfactual page's widgets
KEY_SPAN = "cf.span"
KEY_SUPPORT = "cf.preset.support"
KEY_CONTRADICT = "cf.preset.contradict"
KEY_RESET = "cf.reset"
KEY_NO_CONTEXT = "cf.no_context"
KEY_MODE = "cf.answer_mode"
KEY_MAX_TOKENS = "cf.max_tokens"
KEY_COMPARE = "cf.compare"
KEY_NAME = "cf.name"
KEY_SAVE = "cf.save"
KEY_SAVED = "cf.saved"
KEY_LOAD = "cf.load"
KEY_PRESET = "cf.preset.applied"
