"""The ``generic`` format: any JSONL or CSV file read through a :class:`ColumnMapping`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from core.base.errors import DataError, listed, quoted
from core.base.examples import TASKS, Provenance, RAGExample, Span, parse_label
from core.base.safeio import parse_json
from core.data.records import ColumnMapping, _obj, _short
from core.data.spans import _spans


class _Generic:
    """Records read through a :class:`ColumnMapping` (JSONL objects or CSV rows)."""

    def __init__(self, dataset: str, m: ColumnMapping, *, csv_values: bool) -> None:
        self.dataset = dataset
        self.m = m
        self.csv_values = csv_values

    def _value(self, d: Mapping[str, Any], col: str | None, src: str, *, required: bool) -> Any:
        if col is None:
            return None
        if col not in d:
            raise DataError(
                f"column {quoted(col)} is missing; available: {listed(d)}; "
                "pass a ColumnMapping that names the right columns",
                source=src,
                field=col,
            )
        v = d[col]
        if self.csv_values and isinstance(v, str) and not v.strip():
            v = None
        if v is None and required:
            raise DataError("empty value", source=src, field=col)
        return v

    def _json_cell(self, v: Any) -> Any:
        if self.csv_values and isinstance(v, str) and v.lstrip().startswith(("[", "{")):
            try:
                return parse_json(v, source="cell")
            except DataError:
                return v
        return v

    def __call__(self, obj: Any, src: str) -> RAGExample:
        m = self.m
        d = _obj(obj, src)
        response = self._value(d, m.response, src, required=True)
        if not isinstance(response, str):
            raise DataError(
                f"expected a string, got {type(response).__name__}", source=src, field=m.response
            )
        raw_p = self._value(d, m.passages, src, required=True)
        if isinstance(raw_p, str) and m.passage_sep is None:
            raw_p = self._json_cell(raw_p)
        if isinstance(raw_p, str):
            parts = raw_p.split(m.passage_sep) if m.passage_sep else [raw_p]
            passages = [x.strip() for x in parts if x.strip()]
        elif isinstance(raw_p, list) and all(isinstance(x, str) for x in raw_p):
            passages = list(raw_p)
        else:
            raise DataError(
                f"expected a list of strings or one string, got {_short(raw_p)}",
                source=src,
                field=m.passages,
            )
        question = self._value(d, m.question, src, required=False)
        if question is not None and not isinstance(question, str):
            raise DataError(
                f"expected a string, got {type(question).__name__}", source=src, field=m.question
            )
        label = None
        if m.label is not None:
            try:
                label = parse_label(self._value(d, m.label, src, required=False), src)
            except DataError as e:
                raise DataError(e.reason, source=src, field=m.label) from e
        spans: tuple[Span, ...] = ()
        if m.spans is not None:
            raw_s = self._value(d, m.spans, src, required=False)
            if isinstance(raw_s, str):
                try:
                    raw_s = parse_json(raw_s, source="spans")
                except DataError as e:
                    raise DataError(
                        f"spans are not valid JSON ({e.reason})", source=src, field=m.spans
                    ) from e
            spans = _spans(raw_s, response, src, m.spans)
        task = self._value(d, m.task, src, required=False) if m.task else None
        task = str(task).strip().lower() if task is not None else m.default_task
        if task not in TASKS:
            raise DataError(
                f"unknown task {quoted(task)}; use one of {', '.join(TASKS)}",
                source=src,
                field=m.task or "task",
            )
        if m.id is None:
            ex_id = f"{self.dataset}-{int(src.rsplit(':', 1)[1]):05d}"
        else:
            raw_id = self._value(d, m.id, src, required=True)
            if isinstance(raw_id, bool) or not isinstance(raw_id, str | int):
                raise DataError(
                    f"expected a string id, got {_short(raw_id)}", source=src, field=m.id
                )
            ex_id = str(raw_id).strip()
        gen = self._value(d, m.generator, src, required=False)
        return RAGExample(
            id=ex_id,
            task=task,  # type: ignore[arg-type]  # RAGExample checks the task
            question=question,
            passages=tuple(passages),
            response=response,
            label=label,
            spans=spans,
            provenance=Provenance(
                dataset=self.dataset, generator=str(gen) if gen is not None else None, source=src
            ),
        )
