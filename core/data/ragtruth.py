"""The ``ragtruth_jsonl`` format: RAGTruth JSONL as published with RAGLens, Dolly included.

One record per line (``input``, ``output``, ``hall_info``, ``model``, ``context``), with
the optional ``ragscope`` object that :mod:`core.review` writes to keep ids, labels and
splits through an export.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from core.base.errors import DataError, quoted
from core.base.examples import TASKS, Provenance, RAGExample, Span
from core.data.records import _get, _obj, _stable_hash
from core.data.spans import _place_passages, _spans, split_passages


def _ragscope_extension(d: Mapping[str, Any], src: str, spans: Sequence[Span]) -> dict[str, Any]:
    """The optional ``ragscope`` object of a RAGTruth-style record (written by
    :func:`core.review.ragtruth_record`): id, task, label, split, group, own_prompt."""
    raw = d.get("ragscope")
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise DataError("expected an object", source=src, field="ragscope")
    out: dict[str, Any] = {}
    checks: dict[str, tuple[type | tuple[type, ...], str]] = {
        "id": (str, "a non-empty string"),
        "task": (str, f"one of {', '.join(TASKS)}"),
        "label": (bool, "true or false"),
        "split": (str, "train, validation or test"),
        "group": (str, "a string"),
        "own_prompt": (bool, "true or false"),
    }
    for key, (typ, what) in checks.items():
        v = raw.get(key)
        if v is None:
            continue
        if not isinstance(v, typ) or (key == "id" and not str(v).strip()):
            raise DataError(
                f"expected {what}, got {quoted(v)}", source=src, field=f"ragscope.{key}"
            )
        out[key] = v
    if out.get("task") is not None and out["task"] not in TASKS:
        raise DataError(
            f"expected one of {', '.join(TASKS)}, got {quoted(out['task'])}",
            source=src,
            field="ragscope.task",
        )
    if out.get("label") is False and spans:
        raise DataError(
            "label is false but hall_info has spans; fix one of them",
            source=src,
            field="ragscope.label",
        )
    return out


class _RagtruthJsonl:
    """RAGTruth/RAGLens JSONL records.

    Rules: ``prompt`` is ``input`` verbatim; ``context.passages`` is split on its
    ``passage N:`` markers (:func:`split_passages`) and each passage must occur in the
    prompt. When the prompt was cut short inside a passage (6 Dolly records), the
    passage is cut to the part the prompt holds -- what the generator actually saw --
    and a warning is reported. ``label = bool(hall_info)``; spans take ``meta.label_type``
    as type and ``meta.exp`` as note and must match their ``text``. Records have no id:
    ``<dataset>-<line:05d>-<hash6>`` where the hash covers prompt and response.
    """

    def __init__(self, dataset: str, warnings: list[str]) -> None:
        self.dataset = dataset
        self.warnings = warnings

    def __call__(self, obj: Any, src: str) -> RAGExample:
        d = _obj(obj, src)
        prompt = _get(d, "input", src, str, "the prompt string")
        response = _get(d, "output", src, str, "the response string")
        ctx = _get(d, "context", src, Mapping, "an object {question, passages}")
        question = ctx.get("question")
        if question is not None and not isinstance(question, str):
            raise DataError("expected a string", source=src, field="context.question")
        raw = ctx.get("passages")
        if not isinstance(raw, str):
            raise DataError(
                "expected the passages as one string", source=src, field="context.passages"
            )
        passages = _place_passages(
            split_passages(raw), prompt, src, "context.passages", self.warnings
        )
        hall = d.get("hall_info", [])
        spans = _spans(hall, response, src, "hall_info")
        model = d.get("model")
        line = int(src.rsplit(":", 1)[1])
        ours = _ragscope_extension(d, src, spans)
        return RAGExample(
            id=ours.get("id") or f"{self.dataset}-{line:05d}-{_stable_hash(prompt, response)}",
            task=ours.get("task", "qa"),
            question=question,
            passages=tuple(passages),
            response=response,
            label=ours.get("label", bool(spans)),
            spans=spans,
            prompt=prompt if ours.get("own_prompt", True) else None,
            provenance=Provenance(
                dataset=self.dataset,
                generator=str(model) if model is not None else None,
                source=src,
                split=ours.get("split"),
                group=ours.get("group"),
            ),
        )
