"""The Playground's own widget keys and choices, and the answer it generated."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    pass


# Playground: the input
KEY_INPUT_MODE = "playground.input_mode"


KEY_EXAMPLE = "playground.example"


KEY_OWN_TASK = "playground.own.task"


KEY_OWN_QUESTION = "playground.own.question"


KEY_ADD_PASSAGE = "playground.own.add_passage"


# Playground: the answer
KEY_ANSWER_SOURCE = "playground.answer_source"


KEY_MAX_TOKENS = "playground.max_tokens"


KEY_TEMPERATURE = "playground.temperature"


KEY_GENERATE = "playground.generate"


KEY_PASTED = "playground.pasted"


KEY_ANALYSE = "playground.analyse"


# Playground: the results
KEY_COLOR_BY = "playground.color_by"


KEY_FIXED_SCALE = "playground.fixed_scale"
"""The "Fixed 0-1 scale" toggle of a detector's token colours."""


COLOR_SURPRISAL = "surprisal"
"""The "Colour tokens by" choice meaning the model's own surprisal (else a detector name)."""


KEY_CALIBRATE_AS = "playground.calibrate_as"


CALIBRATE_AUTO = "auto"
"""The verdicts' calibration choice meaning: the answer's own dataset's when the
detectors keep one for it, else all their training data's (else a dataset name)."""
CALIBRATE_POOLED = "pooled"
"""The choice meaning: all the detectors' training data's calibration and threshold."""


INPUT_DATASET = "An example from the dataset"


INPUT_OWN = "Write your own"


INPUT_MODES: tuple[str, ...] = (INPUT_DATASET, INPUT_OWN)


ANSWER_GENERATE = "Let the model write the answer"


ANSWER_PASTE = "Paste an answer"


ANSWER_SOURCES: tuple[str, ...] = (ANSWER_GENERATE, ANSWER_PASTE)


def passage_key(pid: int) -> str:
    """Widget key of the text area of own-example passage ``pid``."""
    return f"playground.own.passage.{pid}"


def remove_passage_key(pid: int) -> str:
    """Widget key of the remove button of own-example passage ``pid``."""
    return f"playground.own.remove.{pid}"


@dataclass(frozen=True, kw_only=True)
class GeneratedAnswer:
    """An answer the model wrote in this session.

    Attributes:
        for_input: :func:`question_signature` of the question and passages it answers.
        text: The answer.
        token_ids: The model's own tokens (analysed exactly, no re-tokenizing).
        stop: Why generation stopped (``eos`` or ``max_tokens``).
        seconds: Generation wall time.
    """

    for_input: str
    text: str
    token_ids: tuple[int, ...]
    stop: str
    seconds: float


def question_signature(
    task: str, question: str | None, passages: Sequence[str], prompt: str | None = None
) -> str:
    """A content hash of what a generated answer answers."""
    payload = json.dumps([task, question, list(passages), prompt], ensure_ascii=False)
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()[:16]
