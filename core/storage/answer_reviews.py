"""The answer-level review tables: ``answer_reviews`` (one versioned faithful /
hallucinated mark per answer and reviewer), ``answer_review_audit`` (append-only) and
``review_answers`` (the set's verdict on each scanned answer: the answer queue).

Rows come back as :class:`AnswerReview`, :class:`AnswerAuditEntry` and
:class:`ScannedAnswer`; :mod:`core.review.answers` checks what is written, inside the
transaction, through the callback :meth:`AnswerReviewsRepository.save_answer_review_row`
takes.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from core.storage.db import Database, now_iso

ANSWER_LABELS: tuple[str, ...] = ("faithful", "hallucinated")
"""What a reviewer may say of a whole answer."""


ORDERINGS: tuple[str, ...] = ("random", "uncertainty", "stratified")
"""How the answers of a dataset are ordered for review (:mod:`core.data.sampling`);
each mark records the one its answer was drawn under."""


@dataclass(frozen=True, kw_only=True)
class AnswerReview:
    """One reviewer's mark on one whole answer.

    Attributes:
        label: ``faithful`` or ``hallucinated``.
        drawn_by: The ordering the answer was reviewed under (:data:`ORDERINGS`).
        example_hash: :func:`~core.base.examples.example_hash` of the answer marked: a
            mark on another version of the answer is stale and counts for nothing.
    """

    id: int
    dataset: str
    example_id: str
    reviewer: str
    label: str
    drawn_by: str
    note: str | None
    example_hash: str
    version: int
    created_at: str
    updated_at: str

    @property
    def hallucinated(self) -> bool:
        return self.label == "hallucinated"


@dataclass(frozen=True, kw_only=True)
class AnswerAuditEntry:
    """One change to an answer's mark: who, when, before and after."""

    id: int
    dataset: str
    example_id: str
    reviewer: str
    at: str
    action: str
    before: Mapping[str, Any] | None
    after: Mapping[str, Any]


@dataclass(frozen=True, kw_only=True)
class AnswerMark:
    """The mark a reviewer's answer review is set to (checked by the caller)."""

    label: str
    drawn_by: str
    note: str | None
    example_hash: str


@dataclass(frozen=True, kw_only=True)
class ScannedAnswer:
    """The set's verdict on one scanned answer of a dataset (the answer queue's row).

    Attributes:
        probability: The judging detector's probability that the answer is hallucinated.
        threshold: Its decision threshold.
        judged_by: Which set, detector and calibration judged it, in words.
    """

    dataset: str
    example_id: str
    example_hash: str
    probability: float
    threshold: float
    judged_by: str
    scanned_at: str

    @property
    def hallucinated(self) -> bool:
        """The set's verdict: probability at or above its threshold."""
        return self.probability >= self.threshold

    @property
    def margin(self) -> float:
        """Distance of the probability from the threshold (small: uncertain)."""
        return abs(self.probability - self.threshold)


_COLS = (
    "id, dataset, example_id, reviewer, label, drawn_by, note, example_hash, version, "
    "created_at, updated_at"
)


def _answer_review(r: Sequence[Any]) -> AnswerReview:
    return AnswerReview(
        id=r[0],
        dataset=r[1],
        example_id=r[2],
        reviewer=r[3],
        label=r[4],
        drawn_by=r[5],
        note=r[6],
        example_hash=r[7],
        version=r[8],
        created_at=r[9],
        updated_at=r[10],
    )


def _state(r: AnswerReview) -> dict[str, Any]:
    d = asdict(r)
    for k in ("id", "dataset", "example_id", "reviewer", "created_at"):
        d.pop(k)
    return d


class AnswerReviewsRepository(Database):
    """Answer-level marks, their audit trail and the scanned answers' verdicts; every
    write is one ``BEGIN IMMEDIATE`` transaction."""

    def save_answer_review_row(
        self,
        dataset: str,
        example_id: str,
        reviewer: str,
        decide: Callable[[AnswerReview | None], AnswerMark],
    ) -> AnswerReview:
        """Set ``reviewer``'s mark on an answer, with its audit entry, in one transaction.

        Args:
            decide: Called inside the transaction with the reviewer's stored mark
                (``None``: none yet); returns the mark to store, or raises to refuse:
                nothing is written then.

        Returns:
            The stored mark (version 1 when new, else one more than before).
        """
        with self._tx() as c:
            row = c.execute(
                f"SELECT {_COLS} FROM answer_reviews WHERE dataset = ? AND example_id = ? "
                "AND reviewer = ?",
                (dataset, example_id, reviewer),
            ).fetchone()
            old = _answer_review(row) if row else None
            mark = decide(old)
            now = now_iso("milliseconds")
            if old is None:
                c.execute(
                    "INSERT INTO answer_reviews (dataset, example_id, reviewer, label, drawn_by, "
                    "note, example_hash, version, created_at, updated_at) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, 1, ?, ?)",
                    (
                        dataset,
                        example_id,
                        reviewer,
                        mark.label,
                        mark.drawn_by,
                        mark.note,
                        mark.example_hash,
                        now,
                        now,
                    ),
                )
            else:
                c.execute(
                    "UPDATE answer_reviews SET label = ?, drawn_by = ?, note = ?, "
                    "example_hash = ?, version = version + 1, updated_at = ? WHERE id = ?",
                    (mark.label, mark.drawn_by, mark.note, mark.example_hash, now, old.id),
                )
            new = _answer_review(
                c.execute(
                    f"SELECT {_COLS} FROM answer_reviews WHERE dataset = ? AND example_id = ? "
                    "AND reviewer = ?",
                    (dataset, example_id, reviewer),
                ).fetchone()
            )
            c.execute(
                "INSERT INTO answer_review_audit (dataset, example_id, reviewer, at, action, "
                "before, after) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    dataset,
                    example_id,
                    reviewer,
                    now,
                    "create" if old is None else "update",
                    json.dumps(_state(old)) if old else None,
                    json.dumps(_state(new)),
                ),
            )
        return new

    def answer_reviews(self, dataset: str) -> list[AnswerReview]:
        """Every mark on the dataset's answers, by answer then reviewer."""
        return [
            _answer_review(r)
            for r in self._query(
                f"SELECT {_COLS} FROM answer_reviews WHERE dataset = ? "
                "ORDER BY example_id, reviewer",
                (dataset,),
            )
        ]

    def answer_review_audit(
        self, dataset: str, example_id: str | None = None
    ) -> list[AnswerAuditEntry]:
        """The answer marks' audit trail of a dataset (or of one answer), oldest first."""
        sql = (
            "SELECT id, dataset, example_id, reviewer, at, action, before, after "
            "FROM answer_review_audit WHERE dataset = ?"
        )
        params: list[Any] = [dataset]
        if example_id is not None:
            sql += " AND example_id = ?"
            params.append(example_id)
        return [
            AnswerAuditEntry(
                id=r[0],
                dataset=r[1],
                example_id=r[2],
                reviewer=r[3],
                at=r[4],
                action=r[5],
                before=json.loads(r[6]) if r[6] else None,
                after=json.loads(r[7]),
            )
            for r in self._query(sql + " ORDER BY id", params)
        ]

    def put_scanned_answers(self, rows: Iterable[ScannedAnswer]) -> None:
        """Record (or replace) the set's verdicts on scanned answers, in one transaction."""
        with self._tx() as c:
            c.executemany(
                "INSERT INTO review_answers (dataset, example_id, example_hash, probability, "
                "threshold, judged_by, scanned_at) VALUES (?, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (dataset, example_id) DO UPDATE SET "
                "example_hash = excluded.example_hash, probability = excluded.probability, "
                "threshold = excluded.threshold, judged_by = excluded.judged_by, "
                "scanned_at = excluded.scanned_at",
                [
                    (
                        r.dataset,
                        r.example_id,
                        r.example_hash,
                        float(r.probability),
                        float(r.threshold),
                        r.judged_by,
                        r.scanned_at,
                    )
                    for r in rows
                ],
            )

    def scanned_answers(self, dataset: str) -> list[ScannedAnswer]:
        """The set's verdicts on the dataset's scanned answers, by example id."""
        return [
            ScannedAnswer(
                dataset=r[0],
                example_id=r[1],
                example_hash=r[2],
                probability=r[3],
                threshold=r[4],
                judged_by=r[5],
                scanned_at=r[6],
            )
            for r in self._query(
                "SELECT dataset, example_id, example_hash, probability, threshold, judged_by, "
                "scanned_at FROM review_answers WHERE dataset = ? ORDER BY example_id",
                (dataset,),
            )
        ]
