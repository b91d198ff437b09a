"""A set's span rule: how its judge's token scores become the spans a person is shown.

The judge (a set's :data:`~core.pipeline.sets.ANSWER_JUDGE`, the ensemble) scores each
answer token and the whole answer. A :class:`SpanRule` turns those into flags, one rule
for every answer:

1. each token's score is moved by how suspect the whole answer is,
   ``combined = sigmoid(logit(token) + answer_weight * (logit(p) - logit(t)))`` with ``p``
   the answer's calibrated probability and ``t`` its threshold (an answer at its
   threshold leaves its tokens' scores as they are; a confidently faithful one lowers
   them, a confidently hallucinated one raises them);
2. with ``gate``, an answer the judge calls faithful gets no span at all;
3. tokens whose combined score reaches ``threshold`` are flagged, runs of them separated
   by at most ``gap_tokens`` unflagged tokens merge into one phrase, widened to whole
   words (:func:`core.pipeline.span_judge.rule_spans`);
4. with ``extend="sentence"``, each phrase is widened to the answer sentence (or list
   item, or line) it stands in: what an annotator marks is usually a whole claim.

The rule's five settings are chosen in cross-validation for span F1
(:func:`choose_span_rule`: on each fold's out-of-fold scores of the other folds, then
measured on that fold, so the measurement is of the choosing too) and recorded in the
judge's ``cfg.json`` as ``span_rule`` with what was measured. A ``cfg.json`` is outside
input: :meth:`SpanRule.from_json` reads it field by field, every number bounded.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from core.base.errors import DataError
from core.base.words import counted

_EPS = 1e-6
MAX_GAP_TOKENS = 16
"""Largest gap a rule may bridge (a phrase, not a paragraph)."""
MAX_ANSWER_WEIGHT = 8.0
"""Largest weight of the answer's logit a rule may give."""
MAX_MEASURED_KEYS = 64
"""Most entries a recorded measurement may hold (it is shown, never computed with)."""
Chosen = Literal["cross-validation", "default"]
Extend = Literal["words", "sentence"]
EXTENDS: tuple[str, ...] = ("words", "sentence")


def _logit(p: np.ndarray | float) -> np.ndarray:
    q = np.clip(np.asarray(p, dtype=np.float64), _EPS, 1.0 - _EPS)
    return np.log(q / (1.0 - q))


@dataclass(frozen=True, kw_only=True)
class SpanRule:
    """How token scores become spans (see the module docstring).

    Attributes:
        threshold: Combined token score at or above which a token is flagged, in [0, 1].
        answer_weight: Weight of the answer's logit (relative to its threshold) added to
            each token's logit; 0 leaves token scores as they are.
        gate: Only answers the judge flags get spans.
        gap_tokens: Flagged runs separated by at most this many unflagged tokens merge.
        extend: ``"words"`` (the phrase itself) or ``"sentence"`` (the answer sentences
            it stands in).
        chosen: ``"cross-validation"`` (chosen for span F1, :attr:`measured` says on
            what) or ``"default"`` (the judge's token threshold, not chosen for spans in
            a cross-validation).
        measured: What the choice was measured at (span precision / recall / F1, the
            share of faithful answers' characters flagged, the data): shown, not used.
    """

    threshold: float
    answer_weight: float = 0.0
    gate: bool = True
    gap_tokens: int = 2
    extend: Extend = "words"
    chosen: Chosen = "default"
    measured: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not (isinstance(self.threshold, float) and 0.0 <= self.threshold <= 1.0):
            raise DataError(f"span rule threshold must be in [0, 1], got {self.threshold!r}")
        if not (
            isinstance(self.answer_weight, float) and 0.0 <= self.answer_weight <= MAX_ANSWER_WEIGHT
        ):
            raise DataError(
                f"span rule answer_weight must be in [0, {MAX_ANSWER_WEIGHT}], got "
                f"{self.answer_weight!r}"
            )
        if type(self.gap_tokens) is not int or not 0 <= self.gap_tokens <= MAX_GAP_TOKENS:
            raise DataError(
                f"span rule gap_tokens must be an integer in [0, {MAX_GAP_TOKENS}], got "
                f"{self.gap_tokens!r}"
            )
        if type(self.gate) is not bool:
            raise DataError(f"span rule gate must be true or false, got {self.gate!r}")
        if self.chosen not in ("cross-validation", "default"):
            raise DataError("span rule chosen must be cross-validation or default")

    def combined(
        self, token_scores: np.ndarray, answer_p: float, answer_threshold: float | None
    ) -> np.ndarray:
        """``[T]`` each token's combined score (step 1 of the module docstring)."""
        tok = np.asarray(token_scores, dtype=np.float64).reshape(-1)
        if self.answer_weight == 0.0 or answer_threshold is None:
            return np.clip(tok, 0.0, 1.0)
        shift = self.answer_weight * float(_logit(answer_p) - _logit(answer_threshold))
        return 1.0 / (1.0 + np.exp(-(_logit(tok) + shift)))

    def origin(self) -> str:
        """Where the rule comes from, in words: chosen for spans in a cross-validation
        (the run and data :attr:`measured` records, when it does), or the judge's token
        threshold."""
        if self.chosen != "cross-validation":
            return "the judge's token threshold, not a rule chosen for spans in cross-validation"
        run, data = self.measured.get("run"), self.measured.get("datasets")
        where = " ".join(
            p
            for p in (
                f"run {run}" if isinstance(run, str) and run else "",
                f"on {data}" if isinstance(data, str) and data else "",
            )
            if p
        )
        return "a rule chosen for span F1 in cross-validation" + (f" ({where})" if where else "")

    def describe(self) -> str:
        """One line for a person: what flags a token, and where the rule comes from
        (:meth:`origin`)."""
        parts = [f"tokens scoring ≥ {self.threshold:.3f}"]
        if self.answer_weight:
            parts.append(f"after adding {self.answer_weight:g} × the answer's logit margin")
        if self.gate:
            parts.append("only in answers the set flags")
        unit = "the sentences they stand in" if self.extend == "sentence" else "whole words"
        return (
            f"{', '.join(parts)}; runs within {counted(self.gap_tokens, 'token')} merge, widened to "
            f"{unit}; {self.origin()}"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "threshold": self.threshold,
            "answer_weight": self.answer_weight,
            "gate": self.gate,
            "gap_tokens": self.gap_tokens,
            "extend": self.extend,
            "chosen": self.chosen,
            "measured": dict(self.measured),
        }

    @classmethod
    def from_json(cls, value: object) -> SpanRule:
        """A rule as ``cfg.json`` holds it (outside input: exact keys and types).

        Raises:
            DataError: Anything else, naming what.
        """
        keys = {
            "threshold",
            "answer_weight",
            "gate",
            "gap_tokens",
            "extend",
            "chosen",
            "measured",
        }
        if not isinstance(value, Mapping) or set(value) != keys:
            got = sorted(map(str, value))[:8] if isinstance(value, Mapping) else type(value)
            raise DataError(f"span_rule must be an object with keys {sorted(keys)}, got {got}")
        thr, w = value["threshold"], value["answer_weight"]
        for name, v in (("threshold", thr), ("answer_weight", w)):
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
                raise DataError(f"span_rule {name} must be a finite number")
        measured = value["measured"]
        if (
            not isinstance(measured, Mapping)
            or len(measured) > MAX_MEASURED_KEYS
            or not all(type(k) is str and len(k) <= 64 for k in measured)
            or not all(_plain(v) for v in measured.values())
        ):
            raise DataError(
                f"span_rule measured must map at most {MAX_MEASURED_KEYS} short names to "
                "numbers, strings, true/false or null"
            )
        chosen, extend = value["chosen"], value["extend"]
        if chosen not in ("cross-validation", "default"):
            raise DataError("span_rule chosen must be cross-validation or default")
        if extend not in ("words", "sentence"):
            raise DataError(f"span_rule extend must be one of {list(EXTENDS)}")
        return cls(
            threshold=float(thr),
            answer_weight=float(w),
            gate=value["gate"],
            gap_tokens=value["gap_tokens"],
            extend=extend,
            chosen=chosen,
            measured=dict(measured),
        )


def _plain(v: object) -> bool:
    if v is None or isinstance(v, bool):
        return True
    if isinstance(v, int | float):
        return math.isfinite(v) and abs(v) < 1e12
    return isinstance(v, str) and len(v) <= 200


def default_rule(token_threshold: float) -> SpanRule:
    """The rule of a judge without a cross-validated one: its own token threshold, gated
    by its answer verdict, runs within two tokens merged."""
    return SpanRule(threshold=float(min(max(token_threshold, 0.0), 1.0)))
