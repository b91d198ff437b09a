"""The ``interpdetect`` format: InterpDetect's generated-response JSONL files.

Records hold ``documents``, ``prompt_spans``, ``response``, ``labels``, ``labels_gpt``,
...; see :class:`_InterpDetect` for how passages, labels and ids are read.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from core.base.errors import DataError, quoted
from core.base.examples import Provenance, RAGExample, Span, parse_label
from core.data.records import _get, _obj, _short
from core.data.spans import _spans

INTERPDETECT_GENERATOR = "Qwen3-0.6B"


class _InterpDetect:
    """InterpDetect JSONL records (e.g. FinQA answered by Qwen3-0.6B).

    Rules:
        * Passages: the prompt is kept verbatim. Its documents are cleaned versions of
          ``documents`` (capitalised, spaces before punctuation removed), so the
          ``documents`` strings usually do not occur in it; the passages are then the
          prompt's own document substrings, located with ``prompt_spans`` (INCLUSIVE
          ends, converted to exclusive): the ``len(documents)`` spans between the
          ``Context:`` and ``Question:`` header spans. If that layout is not found,
          ``prompt`` is dropped (``None``) and ``documents`` are used as passages,
          with a warning.
        * ``labels`` spans already use exclusive ends (their ``text`` equals
          ``response[start:end]``); an inclusive end matching ``text`` is accepted too.
          Each span's note records the span detector's confidence.
        * Response label: ``labels_gpt`` (1 = hallucinated) when present, else
          ``labels_llama``, else ``bool(labels)``. Spans are kept only when the
          response label is hallucinated (they are a separate, noisy detector's
          output); dropped spans are reported as warnings.
        * Ids: the file's ``id``. Some ids repeat with a different response to the same
          question (resamples); later ones become ``<id>-r2``, ``<id>-r3``, ... with a
          warning. A repeated id with an identical response stays a duplicate error.
    """

    def __init__(self, dataset: str, warnings: list[str]) -> None:
        self.dataset = dataset
        self.warnings = warnings
        self._responses: dict[str, list[str]] = {}

    def __call__(self, obj: Any, src: str) -> RAGExample:
        d = _obj(obj, src)
        rid = _get(d, "id", src, (str, int), "a string id")
        rid = str(rid)
        question = _get(d, "question", src, str, "the question string")
        docs = _get(d, "documents", src, list, "a list of document strings")
        if not docs or not all(isinstance(x, str) and x.strip() for x in docs):
            raise DataError(
                "expected a non-empty list of non-empty strings", source=src, field="documents"
            )
        response = _get(d, "response", src, str, "the response string")
        prompt = d.get("prompt")
        if prompt is not None and not isinstance(prompt, str):
            raise DataError("expected a string", source=src, field="prompt")

        passages: list[str] = list(docs)
        if prompt is not None and not (question in prompt and all(x in prompt for x in docs)):
            located = self._passages_from_spans(d, prompt, len(docs), src)
            if located is not None and question in prompt:
                passages = located
            else:
                self.warnings.append(
                    f"{src}: documents not located in the prompt; using them without "
                    "the verbatim prompt"
                )
                prompt = None

        label: bool | None = None
        for key in ("labels_gpt", "labels_llama"):
            if d.get(key) is not None:
                try:
                    label = parse_label(d[key], src)
                except DataError as e:
                    raise DataError(e.reason, source=src, field=key) from e
                break
        spans = _spans(d.get("labels"), response, src, "labels", allow_inclusive=True)
        spans = tuple(
            Span(start=s.start, end=s.end, type=None, note=_confidence_note(d, k))
            for k, s in enumerate(spans)
        )
        if label is None and "labels" in d:
            label = bool(spans)
        if label is False and spans:
            self.warnings.append(
                f"{src}: judged faithful but the span detector marked {len(spans)} "
                "span(s); spans dropped"
            )
            spans = ()

        prev = self._responses.setdefault(rid, [])
        ex_id = rid
        if prev and response not in prev:
            ex_id = f"{rid}-r{len(prev) + 1}"
            self.warnings.append(
                f"{src}: id {quoted(rid)} repeats with another response; using {quoted(ex_id)}"
            )
        prev.append(response)

        return RAGExample(
            id=ex_id,
            task="qa",
            question=question,
            passages=tuple(passages),
            response=response,
            label=label,
            spans=spans,
            prompt=prompt,
            provenance=Provenance(
                dataset=self.dataset, generator=INTERPDETECT_GENERATOR, source=src
            ),
        )

    @staticmethod
    def _passages_from_spans(
        d: Mapping[str, Any], prompt: str, n_docs: int, src: str
    ) -> list[str] | None:
        raw = d.get("prompt_spans")
        if not isinstance(raw, list):
            return None
        pieces: list[str] = []
        for it in raw:
            if not (
                isinstance(it, list | tuple)
                and len(it) == 2
                and all(isinstance(x, int) and not isinstance(x, bool) for x in it)
                and 0 <= it[0] <= it[1] < len(prompt)
            ):
                raise DataError(
                    f"prompt span {_short(it)} is not [start, end] (inclusive) inside the "
                    f"prompt ({len(prompt)} characters)",
                    source=src,
                    field="prompt_spans",
                )
            pieces.append(prompt[it[0] : it[1] + 1])
        heads = [i for i, s in enumerate(pieces) if s.strip().rstrip(":").lower() == "context"]
        tails = [i for i, s in enumerate(pieces) if s.strip().rstrip(":").lower() == "question"]
        if len(heads) != 1 or len(tails) != 1 or tails[0] - heads[0] - 1 != n_docs:
            return None
        docs = [s.strip() for s in pieces[heads[0] + 1 : tails[0]]]
        return docs if all(docs) else None


def _confidence_note(d: Mapping[str, Any], k: int) -> str | None:
    try:
        conf = d["labels"][k].get("confidence")
    except (KeyError, IndexError, TypeError, AttributeError):
        return None
    if isinstance(conf, int | float) and not isinstance(conf, bool):
        return f"span detector confidence {conf:.3f} (model-made label)"
    return None
