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
        judged_with: :attr:`~core.pipeline.sets.DetectorSet.set_id` of the set that
            judged the run's scores (the page marks them when another set judges now).
    """

    method: str = "feedback"
    guide: str | None = None
    result: tuple[Any, ...] | None = None
    judged_with: str = ""


# The mitigation page's widgets
KEY_SOURCE = "mit.example.source"
KEY_DATASET = "mit.dataset"
KEY_EXAMPLE = "mit.example.id"
KEY_METHOD = "mit.method"
KEY_GUIDE = "mit.guide"
KEY_MAX_TOKENS = "mit.max_tokens"
KEY_TEMPERATURE = "mit.temperature"
KEY_FEEDBACK = "mit.feedback.run"
KEY_ALPHA2 = "mit.aarf.alpha2"
KEY_BETA2 = "mit.aarf.beta2"
KEY_TAU = "mit.aarf.tau"
KEY_HEADS_ONLY = "mit.aarf.heads_only"
KEY_AARF = "mit.aarf.run"
KEY_FEATURE = "mit.steer.feature"
KEY_POSITION = "mit.steer.position"
KEY_VALUES = "mit.steer.values"
KEY_STEER = "mit.steer.run"
KEY_REJUDGE = "mit.rejudge"
