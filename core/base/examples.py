"""RAG examples: the question, the retrieved passages, the response and its labels.

A :class:`RAGExample` is validated when it is built; a bad record raises
:class:`~core.base.errors.DataError` naming the record and what to fix.
"""

from __future__ import annotations

import hashlib
import json
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, get_args

from core.base.errors import DataError, quoted

Task = Literal["qa", "summary", "data2txt", "other"]
TASKS: tuple[str, ...] = get_args(Task)


@dataclass(frozen=True, kw_only=True)
class Span:
    """A labelled character range ``[start, end)`` of the response.

    Attributes:
        start: First character (inclusive).
        end: Last character (exclusive).
        type: Label type, e.g. ``"Evident Conflict"``; ``None`` when unknown.
        note: Free text from the annotator (an explanation), if any.
    """

    start: int
    end: int
    type: str | None = None
    note: str | None = None

    def __post_init__(self) -> None:
        for name in ("type", "note"):
            v = getattr(self, name)
            if v is not None and not isinstance(v, str):
                raise DataError(f"span {name} must be a string or null, got {type(v).__name__}")
        if not isinstance(self.start, int) or not isinstance(self.end, int):
            raise DataError(
                f"span offsets must be integers, got [{quoted(self.start)}, {quoted(self.end)})"
            )
        if self.start < 0 or self.end <= self.start:
            raise DataError(
                f"span [{self.start}, {self.end}) is empty or negative; "
                "offsets are [start, end) with 0 <= start < end"
            )

    def overlaps(self, start: int, end: int) -> bool:
        """Whether this span shares at least one character with ``[start, end)``."""
        return self.start < end and start < self.end

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"start": self.start, "end": self.end}
        if self.type is not None:
            out["type"] = self.type
        if self.note is not None:
            out["note"] = self.note
        return out


@dataclass(frozen=True, kw_only=True)
class Provenance:
    """Where an example came from."""

    dataset: str | None = None
    generator: str | None = None
    source: str | None = None  # file:line or URL of the original record
    split: str | None = None  # train / validation / test when the dataset fixes one
    group: str | None = None  # examples sharing a source document (never split apart)

    def __post_init__(self) -> None:
        for name, v in vars(self).items():
            if v is not None and not isinstance(v, str):
                raise DataError(
                    f"provenance {name} must be a string or null, got {type(v).__name__}",
                    field=f"provenance.{name}",
                )

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in vars(self).items() if v is not None}


def lone_surrogate_at(text: str) -> int | None:
    """Index of the first lone UTF-16 surrogate in ``text`` (``None`` when there is none).

    JSON escapes such as ``"\\ud800"`` decode to one; such a string cannot be written as
    UTF-8, so SQLite, files and the browser would all fail on it later.
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        return e.start
    return None


CONTROL_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Zl", "Zp"})
"""Unicode categories no name or id may hold: control (a NUL, a newline), format (a bidi
override), surrogate, private-use characters and line or paragraph separators; each breaks a command line, a log, a
file name or what a page shows."""


def control_character(text: str) -> tuple[int, str] | None:
    """The position and character of the first of :data:`CONTROL_CATEGORIES` in
    ``text``, or ``None``."""
    for i, ch in enumerate(text):
        if unicodedata.category(ch) in CONTROL_CATEGORIES:
            return i, ch
    return None


@dataclass(frozen=True, kw_only=True)
class RAGExample:
    """One retrieval-augmented response to analyse.

    Attributes:
        id: Unique id within its dataset.
        task: ``qa``, ``summary``, ``data2txt`` or ``other``; selects the prompt wording.
        passages: The retrieved passages, in prompt order (at least one).
        response: The answer to analyse (any generator; non-empty).
        question: The user question (optional for summary / data2txt).
        label: ``True`` when the response is hallucinated, ``False`` when it is
            faithful, ``None`` when unlabelled. Spans imply ``True``.
        spans: Hallucinated character ranges of the response.
        prompt: A verbatim prompt string that the record carries (RAGTruth's
            ``input``); when set it is used instead of ragscope's own wording,
            and the question and passages must occur inside it.
        provenance: Dataset, generator and source location.
    """

    id: str
    task: Task = "qa"
    passages: tuple[str, ...]
    response: str
    question: str | None = None
    label: bool | None = None
    spans: tuple[Span, ...] = ()
    prompt: str | None = None
    provenance: Provenance = field(default_factory=Provenance)

    def __post_init__(self) -> None:
        src = self.provenance.source or f"record {quoted(self.id)}"

        def fail(msg: str, fld: str) -> DataError:
            return DataError(msg, source=src, field=fld)

        if not isinstance(self.id, str) or not self.id.strip():
            raise fail("every example needs a non-empty string id", "id")
        if (bad := control_character(self.id)) is not None:
            raise fail(
                f"the id {quoted(self.id)} holds the control character U+{ord(bad[1]):04X} at "
                f"position {bad[0]}; give ids of visible characters",
                "id",
            )
        if self.task not in TASKS:
            raise fail(f"unknown task {quoted(self.task)}; use one of {', '.join(TASKS)}", "task")
        if isinstance(self.passages, str) or not isinstance(self.passages, Sequence):
            raise fail("passages must be a list of strings", "passages")
        object.__setattr__(self, "passages", tuple(self.passages))
        if not self.passages:
            raise fail("at least one passage is needed (the retrieved context)", "passages")
        for k, p in enumerate(self.passages):
            if not isinstance(p, str) or not p.strip():
                raise fail(f"passage {k} is empty or not a string", "passages")
        if not isinstance(self.response, str) or not self.response.strip():
            raise fail("the response is empty; give the answer text to analyse", "response")
        if self.question is not None and not isinstance(self.question, str):
            raise fail("question must be a string or null", "question")
        if self.question is not None and not self.question.strip():
            object.__setattr__(self, "question", None)
        if self.task == "qa" and self.question is None and self.prompt is None:
            raise fail("a qa example needs a question (or a verbatim prompt)", "question")
        for s in self.spans:
            if not isinstance(s, Span):
                raise fail(f"spans must be Span objects, got {type(s).__name__}", "spans")
        object.__setattr__(self, "spans", tuple(sorted(self.spans, key=lambda s: (s.start, s.end))))
        n = len(self.response)
        for s in self.spans:
            if s.end > n:
                raise fail(
                    f"span [{s.start}, {s.end}) runs past the response ({n} characters); "
                    "offsets are character offsets into the response",
                    "spans",
                )
        if self.label is False and self.spans:
            raise fail("label says faithful but hallucinated spans are given; fix one", "label")
        if self.spans and self.label is None:
            object.__setattr__(self, "label", True)
        self._refuse_lone_surrogates(fail)
        if self.prompt is not None:
            if not isinstance(self.prompt, str) or not self.prompt.strip():
                raise fail("prompt must be a non-empty string or null", "prompt")
            if self.question is not None and self.question not in self.prompt:
                raise fail("the question does not occur verbatim in the prompt", "question")
            for k, p in enumerate(self.passages):
                if p not in self.prompt:
                    raise fail(f"passage {k} does not occur verbatim in the prompt", "passages")

    def _refuse_lone_surrogates(self, fail: Any) -> None:
        texts: list[tuple[str, str | None]] = [
            ("id", self.id),
            ("question", self.question),
            ("response", self.response),
            ("prompt", self.prompt),
        ]
        texts += [("passages", p) for p in self.passages]
        texts += [("spans", s.type) for s in self.spans] + [("spans", s.note) for s in self.spans]
        texts += [(f"provenance.{k}", v) for k, v in vars(self.provenance).items()]
        for fld, text in texts:
            at = lone_surrogate_at(text) if text is not None else None
            if text is not None and at is not None:
                raise fail(
                    f"holds a lone UTF-16 surrogate ({text[at]!a} at character {at}), which "
                    "no file or database can store; fix the text's encoding",
                    fld,
                )

    @property
    def hallucinated_chars(self) -> list[tuple[int, int]]:
        """Merged hallucinated character ranges of the response."""
        merged: list[tuple[int, int]] = []
        for s in self.spans:
            if merged and s.start <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(merged[-1][1], s.end))
            else:
                merged.append((s.start, s.end))
        return merged

    def with_response(self, response: str, *, keep_labels: bool = False) -> RAGExample:
        """A copy with another response (labels dropped unless ``keep_labels``)."""
        if keep_labels:
            return replace(self, response=response)
        return replace(self, response=response, label=None, spans=())

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict that :meth:`from_dict` reads back."""
        out: dict[str, Any] = {
            "id": self.id,
            "task": self.task,
            "question": self.question,
            "passages": list(self.passages),
            "response": self.response,
            "label": self.label,
            "spans": [s.to_dict() for s in self.spans],
        }
        if self.prompt is not None:
            out["prompt"] = self.prompt
        prov = self.provenance.to_dict()
        if prov:
            out["provenance"] = prov
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), ensure_ascii=False)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], *, source: str | None = None) -> RAGExample:
        """Build an example from :meth:`to_dict`'s format.

        Raises:
            DataError: naming ``source`` (or the id) and the field to fix.
        """
        if not isinstance(d, Mapping):
            raise DataError(
                f"expected a JSON object, got {type(d).__name__}", source=source or "record"
            )
        src = source or f"record {quoted(d.get('id'))}"
        missing = [k for k in ("id", "passages", "response") if k not in d]
        if missing:
            raise DataError(f"missing required field(s) {missing}", source=src, field=missing[0])
        raw_spans = d.get("spans") or []
        if not isinstance(raw_spans, list):
            raise DataError("spans must be a list of {start, end}", source=src, field="spans")
        spans = []
        for k, s in enumerate(raw_spans):
            try:
                spans.append(
                    Span(start=s["start"], end=s["end"], type=s.get("type"), note=s.get("note"))
                )
            except (KeyError, TypeError) as e:
                raise DataError(
                    f"span {k} needs integer start and end ({e})", source=src, field="spans"
                ) from e
            except DataError as e:
                raise DataError(f"span {k}: {e.reason}", source=src, field="spans") from e
        raw_prov = d.get("provenance") or {}
        if not isinstance(raw_prov, Mapping):
            raise DataError(
                "provenance must be an object of strings", source=src, field="provenance"
            )
        prov = dict(raw_prov)
        prov.setdefault("source", source)
        passages = d["passages"]
        return cls(
            id=str(d["id"]),
            task=d.get("task", "qa"),
            question=d.get("question"),
            passages=tuple(passages) if isinstance(passages, list | tuple) else passages,
            response=d["response"],
            label=parse_label(d.get("label"), src),
            spans=tuple(spans),
            prompt=d.get("prompt"),
            provenance=Provenance(
                **{k: prov.get(k) for k in ("dataset", "generator", "source", "split", "group")}
            ),
        )


def parse_label(v: Any, src: str) -> bool | None:
    """Read a response label written as bool, 0/1 or yes/no."""
    if v is None or isinstance(v, bool):
        return v
    if isinstance(v, int | float) and v in (0, 1):
        return bool(v)
    if isinstance(v, str) and v.strip().lower() in {"0", "1", "true", "false", "yes", "no"}:
        return v.strip().lower() in {"1", "true", "yes"}
    raise DataError(
        f"label must be true/false/0/1 or null, got {quoted(v)}", source=src, field="label"
    )


def dedupe_ids(examples: Iterable[RAGExample]) -> list[RAGExample]:
    """Raise when two examples share an id (ids key stored analyses)."""
    seen: dict[str, str | None] = {}
    out = []
    for ex in examples:
        if ex.id in seen:
            raise DataError(
                f"duplicate id {quoted(ex.id)} (first at {seen[ex.id]}); ids must be unique in a dataset",
                source=ex.provenance.source,
                field="id",
            )
        seen[ex.id] = ex.provenance.source
        out.append(ex)
    return out


def example_hash(example: RAGExample) -> str:
    """A content hash of what a model reads: task, question, passages, prompt, response.

    Ids, labels and provenance are left out, so the same input analysed under another
    dataset name or with other labels reuses cached analyses.
    """
    payload = json.dumps(
        [example.task, example.question, list(example.passages), example.prompt, example.response],
        ensure_ascii=False,
        separators=(",", ":"),
    )
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()


def source_key(example: RAGExample) -> str:
    """The source an example belongs to: its declared group, else question + passages."""
    if example.provenance.group:
        return example.provenance.group
    payload = json.dumps([example.question, list(example.passages)], ensure_ascii=False)
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()[:16]
