"""The review tables: ``review_items`` (the queue of flagged spans), ``reviews`` (one
versioned decision per item and reviewer) and ``review_audit`` (append-only).

The rows come back as :class:`ReviewItem`, :class:`Review` and :class:`AuditEntry`;
:class:`core.review.ReviewBook` decides what to queue, refresh and accept, and runs its
checks inside these methods' transactions through the callbacks they take.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

from core.base.errors import StorageError
from core.base.examples import RAGExample, example_hash
from core.storage.db import Database, now_iso

Decision = Literal["accept", "reject"]


DECISIONS: tuple[str, ...] = ("accept", "reject")


KINDS: tuple[str, ...] = ("baseless", "conflict")
"""Hallucination types (RAGTruth): content the passages lack, or content they contradict."""


EVIDENCE: tuple[str, ...] = ("evident", "subtle")

KIND_OF_SPAN_TYPE: Mapping[str, str] = {"unsupported": "baseless", "contradicted": "conflict"}
"""A span's type (:class:`core.pipeline.evidence.SpanFinding`) as a review kind names it."""


LABEL_TYPES: Mapping[tuple[str, str], str] = {
    ("evident", "baseless"): "Evident Baseless Info",
    ("subtle", "baseless"): "Subtle Baseless Info",
    ("evident", "conflict"): "Evident Conflict",
    ("subtle", "conflict"): "Subtle Conflict",
}
"""RAGTruth's ``meta.label_type`` for each (evidence, kind)."""


STATUSES: tuple[str, ...] = ("open", "accepted", "rejected", "disputed")


def _now() -> str:
    return now_iso("milliseconds")  # reviews within one second still order by time


@dataclass(frozen=True, kw_only=True)
class Review:
    """One reviewer's decision on one item."""

    id: int
    item_id: int
    reviewer: str
    decision: Decision
    start: int
    end: int
    kind: str | None
    evidence: str | None
    note: str | None
    version: int
    created_at: str
    updated_at: str

    @property
    def label_type(self) -> str | None:
        """RAGTruth's label type, when both kind and evidence are set."""
        if self.kind is None or self.evidence is None:
            return None
        return LABEL_TYPES[(self.evidence, self.kind)]

    @property
    def type_text(self) -> str | None:
        """What the reviewer chose of the span's type, in words: RAGTruth's label type
        when both kind and evidence are set, else the one that is (``"conflict"``,
        ``"subtle"``), else ``None``."""
        return self.label_type or self.kind or self.evidence


@dataclass(frozen=True, kw_only=True)
class ReviewItem:
    """A flagged span in the queue, with its reviews."""

    id: int
    dataset: str
    example_id: str
    start: int
    end: int
    answer_len: int
    sources: Mapping[str, tuple[float, float]]
    score: float
    margin: float
    task: str | None
    generator: str | None
    position: int
    created_at: str
    reviews: tuple[Review, ...] = ()
    example_hash: str | None = None  # of the answer it was flagged on (None: before v4)

    def is_stale(self, example: RAGExample | None) -> bool:
        """Whether the item no longer belongs to ``example``'s text (the dataset was
        re-imported with another answer or passages, or the answer is gone): its span
        must not be shown on, exported with or accepted for the new text."""
        if example is None or len(example.response) != self.answer_len:
            return True
        return self.example_hash is not None and self.example_hash != example_hash(example)

    @property
    def detectors(self) -> tuple[str, ...]:
        return tuple(self.sources)

    @property
    def status(self) -> str:
        """``open`` (no review), ``accepted`` / ``rejected`` (all agree) or ``disputed``."""
        decisions = {r.decision for r in self.reviews}
        if not decisions:
            return "open"
        if len(decisions) > 1:
            return "disputed"
        return "accepted" if decisions == {"accept"} else "rejected"

    def review_by(self, reviewer: str) -> Review | None:
        return next((r for r in self.reviews if r.reviewer == reviewer), None)


@dataclass(frozen=True, kw_only=True)
class AuditEntry:
    """One change to a review: who, when, what it was before and after."""

    id: int
    item_id: int
    reviewer: str
    at: str
    action: str
    before: Mapping[str, Any] | None
    after: Mapping[str, Any]


@dataclass(frozen=True, kw_only=True)
class QueuedSpan:
    """What a flag says about one span of one answer: a ``review_items`` row to write.

    Attributes:
        sources: Detector name -> ``(max token score in the span, its threshold)``.
        example_hash: :func:`~core.base.examples.example_hash` of the flagged example.
    """

    example_id: str
    start: int
    end: int
    answer_len: int
    sources: Mapping[str, tuple[float, float]]
    score: float
    margin: float
    task: str | None
    generator: str | None
    example_hash: str


@dataclass(frozen=True, kw_only=True)
class ReviewChange:
    """The decision a reviewer's review is set to (checked by the caller)."""

    decision: str
    start: int
    end: int
    kind: str | None
    evidence: str | None
    note: str | None


_REVIEW_COLS = (
    "id, item_id, reviewer, decision, span_start, span_end, kind, evidence, note, version, "
    "created_at, updated_at"
)


_ITEM_COLS = (
    "id, dataset, example_id, span_start, span_end, answer_len, sources, score, margin, task, "
    "generator, position, created_at, example_hash"
)


def _review(r: Sequence[Any]) -> Review:
    return Review(
        id=r[0],
        item_id=r[1],
        reviewer=r[2],
        decision=r[3],
        start=r[4],
        end=r[5],
        kind=r[6],
        evidence=r[7],
        note=r[8],
        version=r[9],
        created_at=r[10],
        updated_at=r[11],
    )


def _item(r: Sequence[Any], reviews: Sequence[Review] = ()) -> ReviewItem:
    return ReviewItem(
        id=r[0],
        dataset=r[1],
        example_id=r[2],
        start=r[3],
        end=r[4],
        answer_len=r[5],
        sources={k: (float(v[0]), float(v[1])) for k, v in json.loads(r[6]).items()},
        score=r[7],
        margin=r[8],
        task=r[9],
        generator=r[10],
        position=r[11],
        created_at=r[12],
        reviews=tuple(reviews),
        example_hash=r[13],
    )


def _review_state(r: Review) -> dict[str, Any]:
    d = asdict(r)
    for k in ("id", "item_id", "reviewer", "created_at"):
        d.pop(k)
    return d


class ReviewsRepository(Database):
    """The review queue, the decisions and the audit trail; every write is one
    ``BEGIN IMMEDIATE`` transaction."""

    def insert_or_refresh_review_items(
        self,
        dataset: str,
        spans: Iterable[QueuedSpan],
        refresh: Callable[[QueuedSpan, str | None, bool], bool],
    ) -> int:
        """Queue ``spans`` at the end of ``dataset``'s queue, in one transaction; returns
        how many are new.

        Args:
            dataset: The dataset's name.
            spans: One per span (example and boundaries), in queue order.
            refresh: For a span already queued, ``refresh(span, stored example hash,
                whether anyone reviewed it)`` says whether its row is rewritten with
                ``span``'s facts (else it is left as it is). It runs inside the
                transaction; an exception it raises rolls everything back.
        """
        new = 0
        with self._tx() as c:
            (pos,) = c.execute(
                "SELECT COALESCE(MAX(position), -1) + 1 FROM review_items WHERE dataset = ?",
                (dataset,),
            ).fetchone()
            for span in spans:
                fresh = {  # the facts a refresh rewrites
                    "answer_len": span.answer_len,
                    "sources": json.dumps({k: list(v) for k, v in span.sources.items()}),
                    "score": span.score,
                    "margin": span.margin,
                    "task": span.task,
                    "generator": span.generator,
                    "example_hash": span.example_hash,
                }
                have = c.execute(
                    "SELECT id, example_hash, EXISTS (SELECT 1 FROM reviews WHERE item_id = "
                    "review_items.id) FROM review_items WHERE dataset = ? AND example_id = ? "
                    "AND span_start = ? AND span_end = ?",
                    (dataset, span.example_id, span.start, span.end),
                ).fetchone()
                if have is not None:
                    if refresh(span, have[1], bool(have[2])):
                        sets = ", ".join(f"{k} = ?" for k in fresh)
                        c.execute(
                            f"UPDATE review_items SET {sets} WHERE id = ?",
                            (*fresh.values(), have[0]),
                        )
                    continue
                row = {
                    "dataset": dataset,
                    "example_id": span.example_id,
                    "span_start": span.start,
                    "span_end": span.end,
                    **fresh,
                    "position": pos,
                    "created_at": _now(),
                }
                c.execute(
                    f"INSERT INTO review_items ({', '.join(row)}) "
                    f"VALUES ({', '.join('?' * len(row))})",
                    tuple(row.values()),
                )
                new += 1
                pos += 1
        return new

    def review_item(self, item_id: int) -> ReviewItem | None:
        """One item with its reviews (``None``: no item has that id)."""
        rows = self._query(f"SELECT {_ITEM_COLS} FROM review_items WHERE id = ?", (item_id,))
        return self._with_reviews(rows)[0] if rows else None

    def review_items(self, dataset: str) -> list[ReviewItem]:
        """The dataset's queue with the items' reviews, in queue order."""
        rows = self._query(
            f"SELECT {_ITEM_COLS} FROM review_items WHERE dataset = ? ORDER BY position",
            (dataset,),
        )
        return self._with_reviews(rows)

    def _with_reviews(self, rows: Sequence[Sequence[Any]]) -> list[ReviewItem]:
        ids = [r[0] for r in rows]
        reviews: dict[int, list[Review]] = {i: [] for i in ids}
        for chunk in range(0, len(ids), 500):
            part = ids[chunk : chunk + 500]
            marks = ", ".join("?" * len(part))
            for r in self._query(
                f"SELECT {_REVIEW_COLS} FROM reviews WHERE item_id IN ({marks}) ORDER BY reviewer",
                part,
            ):
                reviews[r[1]].append(_review(r))
        return [_item(r, reviews[r[0]]) for r in rows]

    def review_item_id(self, dataset: str, example_id: str, start: int, end: int) -> int:
        """The id of the queued span ``[start, end)`` of an example (it must be queued)."""
        (item_id,) = self._query(
            "SELECT id FROM review_items WHERE dataset = ? AND example_id = ? AND "
            "span_start = ? AND span_end = ?",
            (dataset, example_id, start, end),
        )[0]
        return int(item_id)

    def review_datasets(self) -> list[tuple[str, int]]:
        """Datasets with a queue, and their number of items."""
        return [
            (r[0], r[1])
            for r in self._query(
                "SELECT dataset, COUNT(*) FROM review_items GROUP BY dataset ORDER BY dataset"
            )
        ]

    def save_review_row(
        self,
        item_id: int,
        reviewer: str,
        decide: Callable[[ReviewItem, Review | None], ReviewChange],
    ) -> Review:
        """Set ``reviewer``'s review of an item, with its audit entry, in one transaction.

        Args:
            item_id: The item.
            reviewer: Who decides.
            decide: Called inside the transaction with the item (its reviews not
                loaded) and the reviewer's stored review (``None``: none yet); returns
                the review to store, or raises to refuse: nothing is written then.

        Returns:
            The stored review (version 1 when new, else one more than before).

        Raises:
            StorageError: No item has that id.
        """
        with self._tx() as c:
            row = c.execute(
                f"SELECT {_ITEM_COLS} FROM review_items WHERE id = ?", (item_id,)
            ).fetchone()
            if row is None:
                raise StorageError(f"no review item {item_id}; rebuild the queue or reload")
            old_row = c.execute(
                f"SELECT {_REVIEW_COLS} FROM reviews WHERE item_id = ? AND reviewer = ?",
                (item_id, reviewer),
            ).fetchone()
            old = _review(old_row) if old_row else None
            ch = decide(_item(row), old)
            now = _now()
            if old is None:
                c.execute(
                    "INSERT INTO reviews (item_id, reviewer, decision, span_start, span_end, "
                    "kind, evidence, note, version, created_at, updated_at) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, 1, ?, ?)",
                    (
                        item_id,
                        reviewer,
                        ch.decision,
                        ch.start,
                        ch.end,
                        ch.kind,
                        ch.evidence,
                        ch.note,
                        now,
                        now,
                    ),
                )
            else:
                c.execute(
                    "UPDATE reviews SET decision = ?, span_start = ?, span_end = ?, kind = ?, "
                    "evidence = ?, note = ?, version = version + 1, updated_at = ? "
                    "WHERE id = ?",
                    (ch.decision, ch.start, ch.end, ch.kind, ch.evidence, ch.note, now, old.id),
                )
            new = _review(
                c.execute(
                    f"SELECT {_REVIEW_COLS} FROM reviews WHERE item_id = ? AND reviewer = ?",
                    (item_id, reviewer),
                ).fetchone()
            )
            c.execute(
                "INSERT INTO review_audit (item_id, reviewer, at, action, before, after) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (
                    item_id,
                    reviewer,
                    now,
                    "create" if old is None else "update",
                    json.dumps(_review_state(old)) if old else None,
                    json.dumps(_review_state(new)),
                ),
            )
        return new

    def review_audit(
        self, item_id: int | None = None, dataset: str | None = None
    ) -> list[AuditEntry]:
        """The audit trail, oldest first (of one item, of a dataset's items, or all)."""
        sql = "SELECT a.id, a.item_id, a.reviewer, a.at, a.action, a.before, a.after FROM review_audit a"
        params: list[Any] = []
        if item_id is not None:
            sql += " WHERE a.item_id = ?"
            params.append(item_id)
        elif dataset is not None:
            sql += " JOIN review_items i ON i.id = a.item_id WHERE i.dataset = ?"
            params.append(dataset)
        sql += " ORDER BY a.id"
        return [
            AuditEntry(
                id=r[0],
                item_id=r[1],
                reviewer=r[2],
                at=r[3],
                action=r[4],
                before=json.loads(r[5]) if r[5] else None,
                after=json.loads(r[6]),
            )
            for r in self._query(sql, params)
        ]

    def reviewers(self, dataset: str) -> list[str]:
        """Who reviewed items of the dataset, by name."""
        return [
            r[0]
            for r in self._query(
                "SELECT DISTINCT r.reviewer FROM reviews r JOIN review_items i "
                "ON i.id = r.item_id WHERE i.dataset = ? ORDER BY r.reviewer",
                (dataset,),
            )
        ]
