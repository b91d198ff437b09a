"""The ``ragtruth_pair`` format: the original RAGTruth release.

A directory holding ``response.jsonl`` (the answers and their labelled spans) and
``source_info.jsonl`` (the prompts, questions and passages they answer), joined on
``source_id``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from core.base.errors import DataError, quoted
from core.base.examples import Provenance, RAGExample, Task
from core.data.records import _Collector, _get, _obj, _read_jsonl
from core.data.spans import _place_passages, _spans, split_passages

PAIR_RESPONSES = "response.jsonl"
PAIR_SOURCES = "source_info.jsonl"
_PAIR_TASKS: dict[str, Task] = {"qa": "qa", "summary": "summary", "data2txt": "data2txt"}


def _load_ragtruth_pair(p: Path, col: _Collector, dataset: str | None) -> None:
    """Read RAGTruth's ``response.jsonl`` + ``source_info.jsonl`` (see :class:`_PairSources`)."""
    folder = p if p.is_dir() else p.parent
    resp, srcs = folder / PAIR_RESPONSES, folder / PAIR_SOURCES
    for f in (resp, srcs):
        if not f.is_file():
            raise DataError(
                f"the RAGTruth layout needs {PAIR_RESPONSES} and {PAIR_SOURCES} side by side; "
                f"{f.name} is missing",
                source=str(folder),
            )
    sources = _PairSources(srcs, col)
    col.run(_read_jsonl(resp), _PairResponse(dataset or folder.name, sources))


class _PairSources:
    """RAGTruth ``source_info.jsonl``: ``source_id`` -> (task, question, passages, prompt).

    Rules per ``task_type``:
        * ``QA``: ``source_info`` is ``{question, passages}``; passages are split on
          their ``passage N:`` markers and must occur in ``prompt`` (as in
          ``ragtruth_jsonl``).
        * ``Summary``: ``source_info`` is the text to summarise; it (stripped) is the
          one passage and must occur in ``prompt``.
        * ``Data2txt``: ``source_info`` is a JSON object. The passage is the substring of
          ``prompt`` that holds it: ``json.dumps(source_info, ensure_ascii=False)``
          when that occurs verbatim; else the ASCII-escaped, indented (2/4) or
          Python-repr rendering when one occurs; else the first JSON value in the
          prompt that decodes to exactly ``source_info`` (whatever its spacing or
          escaping). If none is found the record is a DataError.

    The prompt is always kept verbatim. Sources are converted on first use and cached;
    unreadable lines are reported (or raised) once, where they are.
    """

    def __init__(self, path: Path, col: _Collector) -> None:
        self.path = path
        self._raw: dict[str, tuple[str, Mapping[str, Any]]] = {}
        self._done: dict[str, tuple[Task, str | None, tuple[str, ...], str] | DataError] = {}
        self.warnings = col.warnings
        for src, obj in _read_jsonl(path):
            try:
                if isinstance(obj, DataError):
                    raise obj
                d = _obj(obj, src)
                sid = str(_get(d, "source_id", src, (str, int), "a source id"))
                if sid in self._raw:
                    raise DataError(
                        f"duplicate source_id {quoted(sid)} (first at {self._raw[sid][0]})",
                        source=src,
                        field="source_id",
                    )
                self._raw[sid] = (src, d)
            except DataError as e:
                col.fail(e)

    def get(self, sid: str, resp_src: str) -> tuple[Task, str | None, tuple[str, ...], str]:
        if sid not in self._done:
            if sid not in self._raw:
                raise DataError(
                    f"source_id {quoted(sid)} is not in {self.path}",
                    source=resp_src,
                    field="source_id",
                )
            src, d = self._raw[sid]
            try:
                self._done[sid] = self._convert(d, src)
            except DataError as e:
                self._done[sid] = e
        got = self._done[sid]
        if isinstance(got, DataError):
            raise DataError(
                f"its source record is unusable: {got}", source=resp_src, field="source_id"
            )
        return got

    def _convert(
        self, d: Mapping[str, Any], src: str
    ) -> tuple[Task, str | None, tuple[str, ...], str]:
        tt = _get(d, "task_type", src, str, "QA, Summary or Data2txt")
        task = _PAIR_TASKS.get(tt.strip().lower())
        if task is None:
            raise DataError(
                f"unknown task_type {quoted(tt)}; expected QA, Summary or Data2txt",
                source=src,
                field="task_type",
            )
        prompt = _get(d, "prompt", src, str, "the prompt string")
        if "source_info" not in d or d["source_info"] is None:
            raise DataError("missing required field", source=src, field="source_info")
        si = d["source_info"]
        question: str | None = None
        if task == "qa":
            if not isinstance(si, Mapping):
                raise DataError(
                    "a QA source_info must be {question, passages}", source=src, field="source_info"
                )
            question = si.get("question")
            if not isinstance(question, str):
                raise DataError("expected a string", source=src, field="source_info.question")
            if question.strip() and question not in prompt:
                raise DataError(
                    "the question does not occur in the prompt",
                    source=src,
                    field="source_info.question",
                )
            raw = si.get("passages")
            if not isinstance(raw, str):
                raise DataError(
                    "expected the passages as one string", source=src, field="source_info.passages"
                )
            passages = _place_passages(
                split_passages(raw), prompt, src, "source_info.passages", self.warnings
            )
        elif isinstance(si, str):
            passages = _place_passages([si.strip()], prompt, src, "source_info", self.warnings)
        elif task == "data2txt" and isinstance(si, Mapping | list):
            found = _locate_record(si, prompt)
            if found is None:
                raise DataError(
                    "the structured data is not in the prompt (neither as JSON text nor as "
                    "a JSON object equal to source_info)",
                    source=src,
                    field="source_info",
                )
            passages = [found]
        else:
            raise DataError(
                f"unexpected {type(si).__name__} for task_type {quoted(tt)}",
                source=src,
                field="source_info",
            )
        return task, question, tuple(passages), prompt


def _locate_record(si: Any, prompt: str) -> str | None:
    """The substring of ``prompt`` holding the structured record ``si`` (see _PairSources)."""
    renders = [
        json.dumps(si, ensure_ascii=False),
        json.dumps(si),
        json.dumps(si, ensure_ascii=False, indent=2),
        json.dumps(si, ensure_ascii=False, indent=4),
        str(si),
    ]
    for r in renders:
        if r in prompt:
            return r
    dec = json.JSONDecoder()
    opener = "{" if isinstance(si, Mapping) else "["
    i = prompt.find(opener)
    while i >= 0:
        try:
            val, end = dec.raw_decode(prompt, i)
        except json.JSONDecodeError:
            pass
        else:
            if val == si:
                return prompt[i:end]
        i = prompt.find(opener, i + 1)
    return None


class _PairResponse:
    def __init__(self, dataset: str, sources: _PairSources) -> None:
        self.dataset = dataset
        self.sources = sources

    def __call__(self, obj: Any, src: str) -> RAGExample:
        d = _obj(obj, src)
        rid = str(_get(d, "id", src, (str, int), "a string id"))
        sid = str(_get(d, "source_id", src, (str, int), "a source id"))
        response = _get(d, "response", src, str, "the response string")
        spans = _spans(d.get("labels", []), response, src, "labels")
        task, question, passages, prompt = self.sources.get(sid, src)
        model = d.get("model")
        return RAGExample(
            id=rid,
            task=task,
            question=question,
            passages=passages,
            response=response,
            label=bool(spans),
            spans=spans,
            prompt=prompt,
            provenance=Provenance(
                dataset=self.dataset,
                generator=str(model) if model is not None else None,
                source=src,
            ),
        )
