"""Counterfactual: the page's state and the widget keys of its answer choice."""

from __future__ import annotations

from dataclasses import dataclass

from app.state.heads import AnswerChoice
from core.interventions.counterfactual import Counterfactual

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
    """

    answer_mode: str = "fixed"
    result: Counterfactual | None = None
