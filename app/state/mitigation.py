"""Mitigation: the page's state."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from app.state.heads import AnswerChoice


@dataclass(kw_only=True)
class MitigationState(AnswerChoice):
    """The Mitigation page's choices and its last run.

    The answer it shows: :class:`~app.state.heads.AnswerChoice`.

    Attributes:
        method: ``feedback``, ``aarf`` or ``steer``.
        guide: The detector whose flags the feedback quotes (or instance level).
        result: ``(method, example id, result, scores[, the feedback turn sent])`` of the last run.
    """

    method: str = "feedback"
    guide: str | None = None
    result: tuple[Any, ...] | None = None
