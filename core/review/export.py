"""The reviewed dataset as RAGTruth-style JSONL (read back by core.data.load_dataset) and every decision as CSV (formula cells neutralised)."""

from __future__ import annotations

import dataclasses
import json
import numbers
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from core.base.examples import RAGExample, Span
from core.pipeline.evidence import NO_SUPPORT, SpanFinding, find_all
from core.review.answers import answer_labels
from core.review.book import Review, ReviewItem
from core.storage import AnswerReview

if TYPE_CHECKING:
    import pandas as pd


def resolved_review(item: ReviewItem, reviewer: str | None = None) -> Review | None:
    """The review that decides an item: ``reviewer``'s, else the latest of any reviewer."""
    if reviewer is not None:
        return item.review_by(reviewer)
    if not item.reviews:
        return None
    return max(item.reviews, key=lambda r: (r.updated_at, r.id))


def reviewed_examples(
    examples: Sequence[RAGExample],
    items: Sequence[ReviewItem],
    *,
    reviewer: str | None = None,
    include_unreviewed: bool = False,
    marks: Sequence[AnswerReview] = (),
) -> list[RAGExample]:
    """The dataset as the reviews say: per answer with a label
    (:data:`~core.review.answers.LABEL_RULES`: answer marks, accepted spans, every span
    rejected), that label and, when hallucinated, the accepted spans (adjusted
    boundaries, RAGTruth label type, note).

    Args:
        examples: The dataset's examples.
        items: Its review items (:meth:`ReviewBook.items`).
        reviewer: Whose reviews count (default: every reviewer's, by the rules; the
            spans from the latest decision on each item).
        include_unreviewed: Also keep answers with no label (never reviewed, or
            disputed), as they were.
        marks: Its answer-level marks (:meth:`~core.review.answers.AnswerBook.marks`).

    Stale items and marks (made on another version of the answer) are left out.
    """
    by_id = {e.id: e for e in examples}
    if reviewer is not None:
        marks = [m for m in marks if m.reviewer == reviewer]
        items = [dataclasses.replace(it, reviews=_only(it, reviewer)) for it in items]
    labels = answer_labels(examples, marks, items)
    decided: dict[str, list[Review]] = {}
    for it in items:
        if it.is_stale(by_id.get(it.example_id)):
            continue  # flagged on another text: never exported against this one
        r = resolved_review(it, reviewer)
        if r is not None:
            decided.setdefault(it.example_id, []).append(r)
    out = []
    for ex in examples:
        label = labels[ex.id].label
        if label is None:
            if include_unreviewed:
                out.append(ex)
            continue
        spans = tuple(
            sorted(
                (
                    Span(start=r.start, end=r.end, type=r.label_type, note=r.note)
                    for r in decided.get(ex.id, ())
                    if r.decision == "accept"
                ),
                key=lambda s: (s.start, s.end),
            )
        )
        out.append(dataclasses.replace(ex, spans=spans if label else (), label=label))
    return out


def _only(item: ReviewItem, reviewer: str) -> tuple[Review, ...]:
    return tuple(r for r in item.reviews if r.reviewer == reviewer)


RAGTRUTH_TEMPLATE = (
    "Briefly answer the following question:\n{question}\nBear in mind that your response "
    "should be strictly based on the following {n} passages:\n{passages}\nIn case the "
    "passages do not contain the necessary information to answer the question, please "
    'reply with: "Unable to answer based on given passages."\noutput:'
)
"""RAGTruth's QA prompt, for answers whose own prompt is not recorded."""


def ragtruth_record(ex: RAGExample) -> dict[str, Any]:
    """One example as a RAGTruth-style record (``input``, ``output``, ``hall_info``,
    ``model``, ``context``), plus a ``ragscope`` object (id, task, split, whether the
    prompt is the example's own) that :func:`core.data.load_dataset` reads back."""
    passages = "".join(f"passage {i}:{p}\n\n" for i, p in enumerate(ex.passages, start=1))
    prompt = ex.prompt
    if prompt is None:
        words = {1: "one", 2: "two", 3: "three", 4: "four", 5: "five"}
        prompt = RAGTRUTH_TEMPLATE.format(
            question=ex.question or "",
            n=words.get(len(ex.passages), str(len(ex.passages))),
            passages=passages,
        )
    rec: dict[str, Any] = {
        "input": prompt,
        "output": ex.response,
        "hall_info": [
            {
                "start": s.start,
                "end": s.end,
                "text": ex.response[s.start : s.end],
                "meta": {"label_type": s.type, "exp": s.note},
            }
            for s in ex.spans
        ],
        "model": ex.provenance.generator,
        "context": {"question": ex.question, "passages": passages},
        "ragscope": {
            "id": ex.id,
            "task": ex.task,
            "label": ex.label,
            "split": ex.provenance.split,
            "group": ex.provenance.group,
            "own_prompt": ex.prompt is not None,
        },
    }
    if ex.provenance.split is not None:
        rec["split"] = ex.provenance.split
    return rec


def write_ragtruth_jsonl(examples: Iterable[RAGExample], path: str | Path) -> Path:
    """Write examples as RAGTruth-style JSONL (:func:`ragtruth_record`); returns the path."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", encoding="utf-8") as fh:
        for ex in examples:
            fh.write(json.dumps(ragtruth_record(ex), ensure_ascii=False) + "\n")
    return out


def ragtruth_jsonl(examples: Iterable[RAGExample]) -> str:
    """The same as :func:`write_ragtruth_jsonl`, as text (for a download button)."""
    return "".join(json.dumps(ragtruth_record(e), ensure_ascii=False) + "\n" for e in examples)


def reviews_frame(items: Sequence[ReviewItem], examples: Sequence[RAGExample]) -> pd.DataFrame:
    """One row per decision (and one per undecided item): the CSV export (stale items
    left out). Write it with :func:`safe_csv`."""
    import pandas as pd

    by_id = {e.id: e for e in examples}
    live = [it for it in items if not it.is_stale(by_id.get(it.example_id))]
    found = _findings(live, by_id)
    rows = []
    for it in live:  # stale items left out: their spans would cut the wrong text
        text = by_id[it.example_id].response
        f = found[it.id]
        ev = f.evidence
        base = {
            "dataset": it.dataset,
            "example_id": it.example_id,
            "item": it.id,
            "flag_start": it.start,
            "flag_end": it.end,
            "flag_text": text[it.start : it.end],
            "detectors": ",".join(it.detectors),
            "score": it.score,
            "task": it.task,
            "generator": it.generator,
            "status": it.status,
            "span_type": f.type,
            "span_reason": f.reason,
            "source_passage": None if ev is None else ev.passage,
            "source_text": NO_SUPPORT if ev is None else ev.text,
        }
        if not it.reviews:
            rows.append(base)
        for r in it.reviews:
            rows.append(
                {
                    **base,
                    "reviewer": r.reviewer,
                    "decision": r.decision,
                    "start": r.start,
                    "end": r.end,
                    "text": text[r.start : r.end],
                    "label_type": r.label_type,
                    "kind": r.kind,
                    "evidence": r.evidence,
                    "note": r.note,
                    "updated_at": r.updated_at,
                }
            )
    cols = [
        "dataset", "example_id", "item", "flag_start", "flag_end", "flag_text", "detectors",
        "score", "task", "generator", "status", "span_type", "span_reason", "source_passage",
        "source_text", "reviewer", "decision", "start", "end", "text", "label_type", "kind",
        "evidence", "note", "updated_at",
    ]  # fmt: skip
    return pd.DataFrame(rows, columns=cols)


def _findings(
    items: Sequence[ReviewItem], by_id: Mapping[str, RAGExample]
) -> dict[int, SpanFinding]:
    """Each flagged item's evidence, type and reason (:func:`core.pipeline.evidence.find_all`,
    one answer's spans at a time)."""
    per: dict[str, list[ReviewItem]] = {}
    for it in items:
        per.setdefault(it.example_id, []).append(it)
    out: dict[int, SpanFinding] = {}
    for eid, its in per.items():
        ex = by_id[eid]
        for it, f in zip(
            its, find_all(ex.passages, ex.response, [(i.start, i.end) for i in its]), strict=True
        ):
            out[it.id] = f
    return out


FORMULA_START = ("=", "+", "-", "@", "\t", "\r", "\n")
"""What a spreadsheet reads as the start of a formula (OWASP's CSV injection list, with
the line feed): checked after leading blanks and NFKC normalisation, so ``" =1"``,
``"\n=1"`` and the full-width ``"＝1"`` (U+FF1D) count too (:func:`formula_like`)."""


def _lead_in(ch: str) -> bool:
    """A character a spreadsheet may skip before a formula: a blank, a control or an
    invisible format character (a zero-width space, a byte-order mark)."""
    return ch.isspace() or unicodedata.category(ch) in ("Cc", "Cf", "Zs", "Zl", "Zp")


def formula_like(text: str) -> bool:
    """Whether a spreadsheet could read ``text`` as a formula: it starts with a tab, CR
    or LF, or its first character after leading blanks (:func:`_lead_in`), before or
    after NFKC normalisation (``＝`` is ``=``, ``﹢`` is ``+``), is ``=``, ``+``, ``-`` or
    ``@``."""
    if text.startswith(("\t", "\r", "\n")):
        return True
    for t in (text, unicodedata.normalize("NFKC", text)):
        k = 0
        while k < len(t) and _lead_in(t[k]):
            k += 1
        rest = unicodedata.normalize("NFKC", t[k : k + 8])  # a decomposed first character
        if rest[:1] in FORMULA_START:
            return True
    return False


def neutralise_cell(value: Any) -> Any:
    """``value`` with a leading ``'`` when a spreadsheet would run it as a formula
    (:func:`formula_like` of its text: ``=HYPERLINK(...)``, ``+cmd|...``, ``@SUM(...)``,
    `` =1``, ``＝1``); numbers (a negative one is a number, not a formula), ``None``
    and other values as they are."""
    if value is None or isinstance(value, numbers.Number):
        return value
    text = value if isinstance(value, str) else str(value)  # as the CSV writes it
    return "'" + text if formula_like(text) else value


def safe_csv(frame: pd.DataFrame, *, index: bool = False) -> str:
    """``frame`` as CSV text with every formula-like text cell neutralised
    (:func:`neutralise_cell`), headers (and, with ``index``, the index) included;
    numbers stay numbers. Every CSV export goes through here."""
    import pandas as pd  # lazily, as the rest of core: importing core stays light

    out = frame.reset_index(allow_duplicates=True) if index else frame.copy()
    out.columns = [neutralise_cell(str(c)) for c in out.columns]
    for k in range(out.shape[1]):
        col = out.iloc[:, k]
        if not (
            pd.api.types.is_bool_dtype(col)
            or pd.api.types.is_numeric_dtype(col)
            or pd.api.types.is_datetime64_any_dtype(col)
        ):  # text, objects, categories, time deltas ("-1 days"): as the CSV will write them
            out.isetitem(k, col.astype(object).map(neutralise_cell))
    # CRLF rows (RFC 4180): the writer then quotes a cell holding a lone CR too, which a
    # spreadsheet would otherwise take as a new row starting mid-cell ("x\r=1+1").
    return out.to_csv(index=False, lineterminator="\r\n")
