"""Mitigation by feedback (RAGLens section 4.6): tell the model what a detector flagged
and let it answer again.

- :func:`feedback_turn` (:func:`feedback_message`: its text): the follow-up turn.
  ``instance`` level says only that the answer may not be supported by the passages;
  ``token`` level quotes the flagged spans (and falls back to ``instance`` when there
  are none, which the turn records).
- :func:`answer_change`: whether, and by how many words, the new answer differs.
- :func:`feedback_regenerate`: the conversation (the RAG prompt, the first answer, the
  feedback) through the model's chat template, and a greedy new answer.
- :func:`mitigate_batch`: for many examples, regenerate with a method (``feedback``
  at either level, or ``aarf``), re-score the answers before and after with every
  detector, and report each detector's flagged rate before and after
  (:class:`MitigationReport`).
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from core.base.errors import DataError, LLMError
from core.base.examples import RAGExample
from core.base.llm import LLMEndpoint, chat
from core.base.words import counted
from core.detectors import DETECTORS
from core.engine.chat_template import render_chat, template_of
from core.engine.generate import AnswerStream, Generation, GenerationConfig
from core.engine.layout import prompt_pieces
from core.engine.model import LoadedModel
from core.interventions.aarf import AARFOptions, aarf_generate
from core.interventions.counterfactual import on_template, score_one
from core.learning.contract import Detector, flag_threshold
from core.pipeline.span_judge import span_judge
from core.signals.smoothing import flagged_spans

FeedbackLevel = Literal["instance", "token"]
FEEDBACK_LEVELS: tuple[FeedbackLevel, ...] = ("instance", "token")
METHODS: tuple[str, ...] = ("feedback-instance", "feedback-token", "aarf")

INSTANCE_FEEDBACK = (
    "Your answer may contain information that is not supported by the passages. "
    "Answer the question again, using only what the passages say."
)
TOKEN_FEEDBACK = (
    "These parts of your answer are not supported by the passages: {spans}. "
    "Answer the question again: correct or leave out those parts, using only what the "
    "passages say."
)


@dataclass(frozen=True)
class FeedbackTurn:
    """The follow-up turn and what it is.

    Attributes:
        message: The text sent to the model.
        asked: The level asked for.
        sent: The level sent: ``instance`` when ``token`` was asked for and no flagged
            span has any text to quote (see :attr:`fell_back`).
        quotes: The answer's passages the message quotes (token level).
    """

    message: str
    asked: FeedbackLevel
    sent: FeedbackLevel
    quotes: tuple[str, ...] = ()

    @property
    def fell_back(self) -> bool:
        """Token-level feedback was asked for, but nothing was flagged to quote, so the
        instance-level message went instead."""
        return self.asked != self.sent


def feedback_turn(
    example: RAGExample, spans: Sequence[tuple[int, int]] = (), level: FeedbackLevel = "token"
) -> FeedbackTurn:
    """The follow-up turn for ``example``'s answer.

    Args:
        example: The example whose answer is criticised.
        spans: Flagged character ranges of the answer (token level).
        level: ``instance`` (no detail) or ``token`` (quotes the spans; falls back to
            the instance message when there are none: :attr:`FeedbackTurn.fell_back`).

    Raises:
        DataError: Unknown level, or a span outside the answer.
    """
    if level not in FEEDBACK_LEVELS:
        raise DataError(f"feedback level must be one of {FEEDBACK_LEVELS}, got {level!r}")
    n = len(example.response)
    bad = [(a, b) for a, b in spans if not 0 <= a < b <= n]
    if bad:
        raise DataError(
            f"flagged spans {bad} lie outside the answer of {n} characters", field="spans"
        )
    quotes = tuple(q for a, b in spans if (q := example.response[a:b].strip()))
    if level == "instance" or not quotes:
        return FeedbackTurn(INSTANCE_FEEDBACK, level, "instance")
    message = TOKEN_FEEDBACK.format(spans="; ".join(f"\u201c{q}\u201d" for q in quotes))
    return FeedbackTurn(message, level, "token", quotes)


def feedback_message(
    example: RAGExample, spans: Sequence[tuple[int, int]] = (), level: FeedbackLevel = "token"
) -> str:
    """:func:`feedback_turn`'s message.

    Raises:
        DataError: Unknown level, or a span outside the answer.
    """
    return feedback_turn(example, spans, level).message


@dataclass(frozen=True)
class AnswerChange:
    """How a new answer differs from the first, word by word (whitespace-split).

    Attributes:
        removed: Words of the first answer left out.
        added: Words of the new answer that are new.
    """

    removed: int
    added: int

    @property
    def identical(self) -> bool:
        return self.removed == 0 and self.added == 0

    def describe(self) -> str:
        """ "identical to the first" or "N words left out, M new"."""
        if self.identical:
            return "identical to the first, word for word"
        return f"{self.removed} word(s) left out, {self.added} new"


def answer_change(before: str, after: str) -> AnswerChange:
    """:class:`AnswerChange` of ``after`` against ``before`` (the diff the Mitigation
    page draws)."""
    a, b = before.split(), after.split()
    removed = added = 0
    for tag, i0, i1, j0, j1 in difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes():
        if tag != "equal":
            removed += i1 - i0
            added += j1 - j0
    return AnswerChange(removed, added)


def conversation_ids(model: LoadedModel, example: RAGExample, feedback: str) -> list[int]:
    """Token ids of: the RAG prompt (user), the first answer (assistant), the feedback
    (user), and the assistant header; plain text turns for models without a chat template."""

    tok = model.tokenizer
    user = "".join(
        p.text
        for p in prompt_pieces(
            task=example.task,
            question=example.question,
            passages=example.passages,
            prompt=example.prompt,
        )
    )
    if template_of(tok) is not None:
        messages = [
            {"role": "user", "content": user},
            {"role": "assistant", "content": example.response},
            {"role": "user", "content": feedback},
        ]
        text = render_chat(tok, messages, source=model.info.name)
    else:
        text = f"{user}\n\nAnswer: {example.response}\n\n{feedback}\n\nAnswer: "
    return list(tok(text, add_special_tokens=False)["input_ids"])


def feedback_regenerate(
    model: LoadedModel,
    example: RAGExample,
    *,
    spans: Sequence[tuple[int, int]] = (),
    level: FeedbackLevel = "token",
    max_new_tokens: int = 128,
    temperature: float = 0.0,
    seed: int | None = 0,
) -> Generation:
    """A new answer after the feedback turn (greedy unless ``temperature`` > 0)."""

    ids = conversation_ids(model, example, feedback_message(example, spans, level))
    cfg = GenerationConfig(max_new_tokens=max_new_tokens, temperature=temperature, seed=seed)
    stream = AnswerStream.from_ids(model, ids, cfg)
    for _ in stream:
        pass
    return stream.result()


# --------------------------------------------------------------------------- judge

JUDGE_SYSTEM = (
    "You check answers against retrieved passages. Reply with one word: yes if every "
    "claim in the answer is supported by the passages, no otherwise."
)


def judge_answer(endpoint: LLMEndpoint, example: RAGExample, answer: str) -> bool | None:
    """An LLM judge's verdict: ``True`` = hallucinated (some claim unsupported), ``False`` =
    supported, ``None`` = the reply said neither.

    Raises:
        LLMError: The endpoint failed.
    """
    import re

    passages = "\n\n".join(f"Passage {k + 1}: {p}" for k, p in enumerate(example.passages))
    question = f"\n\nQuestion: {example.question}" if example.question else ""
    reply = chat(
        endpoint,
        JUDGE_SYSTEM,
        f"{passages}{question}\n\nAnswer: {answer}\n\nIs every claim in the answer supported "
        "by the passages? Reply yes or no.",
    )
    m = re.search(r"\b(yes|no)\b", reply.lower())
    return None if m is None else m.group(1) == "no"


# --------------------------------------------------------------------------- batch


@dataclass(frozen=True, kw_only=True)
class MitigationReport:
    """Before/after flagged rates of a mitigation method over many examples.

    Attributes:
        method: ``feedback-instance``, ``feedback-token`` or ``aarf``.
        guide: The detector whose flags guided the method (token feedback, AARF).
        example_ids: The examples, in order.
        before: Detector -> its score of each original answer.
        after: Detector -> its score of each new answer.
        thresholds: Detector -> its threshold.
        answers: ``(original, new)`` answer per example.
        judge: An LLM judge's verdicts ``(before, after)`` per example, when one ran.
        errors: ``example id: reason`` for the examples that failed.
    """

    method: str
    guide: str | None
    example_ids: tuple[str, ...]
    before: dict[str, list[float]]
    after: dict[str, list[float]]
    thresholds: dict[str, float]
    answers: tuple[tuple[str, str], ...]
    judge: tuple[tuple[bool | None, bool | None], ...] = ()
    errors: tuple[str, ...] = field(default_factory=tuple)

    def rates(self) -> dict[str, tuple[float, float]]:
        """Detector -> (share flagged before, share flagged after)."""
        out = {}
        for name, t in self.thresholds.items():
            b = np.asarray(self.before[name]) >= t
            a = np.asarray(self.after[name]) >= t
            out[name] = (
                float(b.mean()) if b.size else float("nan"),
                float(a.mean()) if a.size else float("nan"),
            )
        return out

    def to_markdown(self) -> str:
        lines = [
            f"# mitigation: {self.method}" + (f" (guided by {self.guide})" if self.guide else ""),
            "",
            f"{counted(len(self.example_ids), 'answer')} re-scored; {len(self.errors)} failed.",
            "",
            "| detector | flagged before | flagged after | change |",
            "|---|---|---|---|",
        ]
        for name, (b, a) in self.rates().items():
            lines.append(f"| {name} | {b:.3f} | {a:.3f} | {a - b:+.3f} |")
        if self.judge:
            jb = [x for x, _ in self.judge if x is not None]
            ja = [y for _, y in self.judge if y is not None]
            if jb and ja:
                lines.append(
                    f"| LLM judge | {np.mean(jb):.3f} | {np.mean(ja):.3f} | {np.mean(ja) - np.mean(jb):+.3f} |"
                )
        return "\n".join(lines)


def mitigate_batch(
    model: LoadedModel,
    examples: Sequence[RAGExample],
    detectors: Sequence[Detector],
    *,
    method: str,
    guide: str | None = None,
    max_new_tokens: int = 96,
    progress: Callable[[int, int], None] | None = None,
    aarf_options: dict[str, Any] | None = None,
    temperature: float = 0.0,
    judge: LLMEndpoint | None = None,
) -> MitigationReport:
    """Regenerate every example's answer with ``method`` and re-score before/after.

    Args:
        model: The analysing (and regenerating) model.
        examples: Examples whose answers to mitigate (their responses are the "before";
            for ``aarf``, the model's plain greedy answer to the same prompt is).
        detectors: Fitted detectors; all of them re-score both answers.
        method: One of :data:`METHODS`.
        guide: The detector whose token flags (at its :func:`flag_threshold`) the token
            feedback quotes (default: ``ensemble``, else ``cortex`` when given, else the
            first detector with token scores); for
            ``aarf``, a fitted ``redeep_token`` detector's name.
        max_new_tokens: Length limit of the new answers.
        progress: ``(done, total)`` callback.
        aarf_options: Fields of :class:`core.interventions.aarf.AARFOptions` for
            :func:`core.interventions.aarf.aarf_generate` (alpha2, beta2, ...).
        temperature: Sampling temperature of the feedback answers (0: greedy; seeded).
        judge: An OpenAI-compatible endpoint that also judges both answers
            (:func:`judge_answer`); a failed request leaves that verdict ``None``.

    Raises:
        DataError: Unknown method, or no usable guide detector.
    """
    import dataclasses

    if method not in METHODS:
        raise DataError(f"method must be one of {METHODS}, got {method!r}")
    by_name = {d.name: d for d in detectors}
    if not by_name:
        raise DataError("give at least one fitted detector to re-score the answers")
    if method == "aarf":
        heads = DETECTORS.explained("head-tokens")
        guide = guide or heads
        if guide not in by_name:
            raise DataError(f"aarf needs a fitted {heads} detector among the detectors")
    elif method == "feedback-token" and guide is None:
        spans_by = span_judge(list(by_name.values()))
        guide = spans_by.name if spans_by is not None else None
    before: dict[str, list[float]] = {n: [] for n in by_name}
    after: dict[str, list[float]] = {n: [] for n in by_name}
    ids, answers, errors = [], [], []
    verdicts: list[tuple[bool | None, bool | None]] = []
    generated: dict[tuple[Any, ...], Any] = {}  # aarf: prompt -> its two answers
    for i, original in enumerate(examples):
        # Both answers are read on ragscope's template (a verbatim prompt is dropped).
        ex = on_template(original)
        try:
            if method == "aarf":
                # AARF changes decoding: its baseline is the same model's plain greedy
                # answer to the same prompt (same length limit), not the dataset's answer.
                # Both depend on the prompt alone: generated once per distinct prompt.
                prompt_key = (ex.task, ex.question, ex.passages, ex.prompt)
                if prompt_key not in generated:
                    options = AARFOptions(
                        max_new_tokens=max_new_tokens, plain=True, **(aarf_options or {})
                    )
                    generated[prompt_key] = aarf_generate(
                        model,
                        ex,
                        by_name[guide],  # type: ignore[index]  # guide is set whenever AARF runs
                        options,
                    )
                res = generated[prompt_key]
                assert res.plain is not None
                if not res.plain.text.strip():
                    raise DataError("the model wrote an empty plain answer")
                ex = dataclasses.replace(ex, response=res.plain.text, spans=(), label=None)
                old = score_one(model, detectors, ex)
                text = res.text
            else:
                old = score_one(model, detectors, ex)
                spans: list[tuple[int, int]] = []
                level: FeedbackLevel = "instance" if method == "feedback-instance" else "token"
                if level == "token":
                    g = guide or next(
                        (n for n, s in old.items() if s.token_scores is not None), None
                    )
                    s = old.get(g) if g else None
                    if s is not None and s.token_scores is not None:
                        t = flag_threshold(by_name[g])  # type: ignore[index]  # g names a detector in by_name
                        spans = flagged_spans(
                            np.asarray(s.token_scores), np.asarray(s.token_offsets), t
                        )
                text = feedback_regenerate(
                    model,
                    ex,
                    spans=spans,
                    level=level,
                    max_new_tokens=max_new_tokens,
                    temperature=temperature,
                ).text
            if not text.strip():
                raise DataError("the model wrote an empty answer")
            new_ex = dataclasses.replace(ex, response=text, spans=(), label=None)
            new = score_one(model, detectors, new_ex)
        except DataError as e:
            errors.append(f"{ex.id}: {e}")
        else:
            ids.append(ex.id)
            answers.append((ex.response, text))
            if judge is not None:
                verdicts.append((_judge(judge, ex, ex.response), _judge(judge, ex, text)))
            for n in by_name:
                before[n].append(old[n].score)
                after[n].append(new[n].score)
        if progress:
            progress(i + 1, len(examples))
    return MitigationReport(
        method=method,
        guide=guide,
        example_ids=tuple(ids),
        before=before,
        after=after,
        thresholds={n: float(getattr(d, "threshold_", 0.5)) for n, d in by_name.items()},
        answers=tuple(answers),
        judge=tuple(verdicts),
        errors=tuple(errors),
    )


def _judge(endpoint: LLMEndpoint, example: RAGExample, answer: str) -> bool | None:

    try:
        return judge_answer(endpoint, example, answer)
    except LLMError:
        return None
