"""The review book: the queue of flagged spans, one decision per item and reviewer (versioned: a stale save raises ReviewConflict), and the append-only audit trail, in the ragscope database."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Literal

from core.errors import DataError, StorageError
from core.examples import RAGExample, example_hash
from core.storage import Store, now_iso

if TYPE_CHECKING:
    pass
from core.review.flags import Flag

Decision = Literal["accept", "reject"]


DECISIONS: tuple[str, ...] = ("accept", "reject")


KINDS: tuple[str, ...] = ("baseless", "conflict")
"""Hallucination types (RAGTruth): content the passages lack, or content they contradict."""


EVIDENCE: tuple[str, ...] = ("evident", "subtle")


LABEL_TYPES: Mapping[tuple[str, str], str] = {
    ("evident", "baseless"): "Evident Baseless Info",
    ("subtle", "baseless"): "Subtle Baseless Info",
    ("evident", "conflict"): "Evident Conflict",
    ("subtle", "conflict"): "Subtle Conflict",
}
"""RAGTruth's ``meta.label_type`` for each (evidence, kind)."""


STATUSES: tuple[str, ...] = ("open", "accepted", "rejected", "disputed")


SORTS: tuple[str, ...] = ("uncertainty", "score", "position")


def _now() -> str:

    return now_iso("milliseconds")  # reviews within one second still order by time


class ReviewConflict(StorageError):
    """A save based on a review that someone (or another tab) changed meanwhile.

    Nothing is lost: the stored review stays as the other save left it, and the
    attempted one is in :attr:`attempted` to re-apply after a reload.
    """

    def __init__(self, message: str, *, attempted: Mapping[str, Any]) -> None:
        super().__init__(message)
        self.attempted = dict(attempted)


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


def _check_review(reviewer: str | None, kind: str | None, evidence: str | None) -> str:
    """The reviewer's name, stripped, after checking it and the type fields.

    Raises:
        DataError: A blank name, or a kind / evidence outside :data:`KINDS` / :data:`EVIDENCE`.
    """
    who = (reviewer or "").strip()
    if not who:
        raise DataError("a review needs the reviewer's name", field="reviewer")
    if kind is not None and kind not in KINDS:
        raise DataError(f"kind must be one of {KINDS}, got {kind!r}", field="kind")
    if evidence is not None and evidence not in EVIDENCE:
        raise DataError(f"evidence must be one of {EVIDENCE}, got {evidence!r}", field="evidence")
    return who


def _review_state(r: Review) -> dict[str, Any]:
    d = asdict(r)
    for k in ("id", "item_id", "reviewer", "created_at"):
        d.pop(k)
    return d


def filter_items(
    items: Iterable[ReviewItem],
    *,
    detectors: Iterable[str] | None = None,
    tasks: Iterable[str] | None = None,
    generators: Iterable[str] | None = None,
    statuses: Iterable[str] | None = None,
    sort: str = "uncertainty",
) -> list[ReviewItem]:
    """The items kept by every given filter (``None``: no filter), sorted
    (:meth:`ReviewBook.items` documents the options)."""
    if sort not in SORTS:
        raise ValueError(f"sort must be one of {SORTS}, got {sort!r}")
    out = list(items)
    if detectors is not None:
        keep = set(detectors)
        out = [i for i in out if keep & set(i.sources)]
    if tasks is not None:
        keep = set(tasks)
        out = [i for i in out if i.task in keep]
    if generators is not None:
        keep = set(generators)
        out = [i for i in out if i.generator in keep]
    if statuses is not None:
        keep = set(statuses)
        out = [i for i in out if i.status in keep]
    if sort == "uncertainty":
        out.sort(key=lambda i: (abs(i.margin), i.position))
    elif sort == "score":
        out.sort(key=lambda i: (-i.score, i.position))
    else:
        out.sort(key=lambda i: i.position)
    return out


class ReviewBook:
    """The review queue, decisions and audit trail in a :class:`~core.storage.Store`."""

    def __init__(self, store: Store) -> None:
        self.store = store

    # -- queue ---------------------------------------------------------------------

    def add_flags(self, dataset: str, examples: Sequence[RAGExample], flags: Iterable[Flag]) -> int:
        """Queue the flags (one item per span). A span already queued is left as it is
        (with its reviews), unless its answer changed since and nobody reviewed it yet:
        then it is refreshed for the new text. Returns how many items are new."""
        by_id = {e.id: e for e in examples}
        rows = []
        for f in flags:
            ex = by_id.get(f.example_id)
            if ex is None:
                raise DataError(f"flag for unknown example {f.example_id!r} of {dataset!r}")
            if not 0 <= f.start < f.end <= len(ex.response):
                raise DataError(
                    f"flag [{f.start}, {f.end}) is outside the answer of {f.example_id!r} "
                    f"({len(ex.response)} characters)"
                )
            rows.append((ex, f))
        new = 0
        with self.store.transaction() as c:
            (pos,) = c.execute(
                "SELECT COALESCE(MAX(position), -1) + 1 FROM review_items WHERE dataset = ?",
                (dataset,),
            ).fetchone()
            for ex, f in rows:
                digest = example_hash(ex)
                fresh = {  # what a flag says about its span on this answer
                    "answer_len": len(ex.response),
                    "sources": json.dumps({k: list(v) for k, v in f.sources.items()}),
                    "score": f.score,
                    "margin": f.margin,
                    "task": ex.task,
                    "generator": ex.provenance.generator,
                    "example_hash": digest,
                }
                have = c.execute(
                    "SELECT id, example_hash, EXISTS (SELECT 1 FROM reviews WHERE item_id = "
                    "review_items.id) FROM review_items WHERE dataset = ? AND example_id = ? "
                    "AND span_start = ? AND span_end = ?",
                    (dataset, ex.id, f.start, f.end),
                ).fetchone()
                if have is not None:
                    # The same span again: left alone, unless its answer changed and nobody
                    # reviewed it yet (then it is refreshed for the new text; a reviewed one
                    # stays, stale, with its reviews).
                    if have[1] != digest and not have[2]:
                        sets = ", ".join(f"{k} = ?" for k in fresh)
                        c.execute(
                            f"UPDATE review_items SET {sets} WHERE id = ?",
                            (*fresh.values(), have[0]),
                        )
                    continue
                row = {
                    "dataset": dataset,
                    "example_id": ex.id,
                    "span_start": f.start,
                    "span_end": f.end,
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

    def item(self, item_id: int) -> ReviewItem:
        """One item with its reviews.

        Raises:
            StorageError: No item has that id.
        """
        rows = self.store.query(f"SELECT {_ITEM_COLS} FROM review_items WHERE id = ?", (item_id,))
        if not rows:
            raise StorageError(f"no review item {item_id}; rebuild the queue or reload the page")
        return self._items(rows)[0]

    def _items(self, rows: Sequence[Sequence[Any]]) -> list[ReviewItem]:
        ids = [r[0] for r in rows]
        reviews: dict[int, list[Review]] = {i: [] for i in ids}
        for chunk in range(0, len(ids), 500):
            part = ids[chunk : chunk + 500]
            marks = ", ".join("?" * len(part))
            for r in self.store.query(
                f"SELECT {_REVIEW_COLS} FROM reviews WHERE item_id IN ({marks}) ORDER BY reviewer",
                part,
            ):
                reviews[r[1]].append(_review(r))
        return [
            ReviewItem(
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
                reviews=tuple(reviews[r[0]]),
                example_hash=r[13],
            )
            for r in rows
        ]

    def items(
        self,
        dataset: str,
        *,
        detectors: Iterable[str] | None = None,
        tasks: Iterable[str] | None = None,
        generators: Iterable[str] | None = None,
        statuses: Iterable[str] | None = None,
        sort: str = "uncertainty",
    ) -> list[ReviewItem]:
        """The dataset's queue, filtered and sorted.

        Args:
            dataset: The dataset's name.
            detectors: Keep items flagged by any of these (``None``: all).
            tasks, generators: Keep items of these tasks / generators.
            statuses: Keep items in these :data:`STATUSES`.
            sort: ``uncertainty`` (closest to a threshold first), ``score`` (highest
                first) or ``position`` (queue order).
        """
        rows = self.store.query(
            f"SELECT {_ITEM_COLS} FROM review_items WHERE dataset = ? ORDER BY position",
            (dataset,),
        )
        return filter_items(
            self._items(rows),
            detectors=detectors,
            tasks=tasks,
            generators=generators,
            statuses=statuses,
            sort=sort,
        )

    def datasets(self) -> list[tuple[str, int]]:
        """Datasets with a queue, and their number of items."""
        return [
            (r[0], r[1])
            for r in self.store.query(
                "SELECT dataset, COUNT(*) FROM review_items GROUP BY dataset ORDER BY dataset"
            )
        ]

    # -- decisions -----------------------------------------------------------------

    def save_review(
        self,
        item_id: int,
        reviewer: str,
        decision: str,
        *,
        start: int | None = None,
        end: int | None = None,
        kind: str | None = None,
        evidence: str | None = None,
        note: str | None = None,
        expected_version: int | None = None,
        example: RAGExample | None = None,
    ) -> Review:
        """Record (or change) ``reviewer``'s decision on an item, with an audit entry.

        Args:
            item_id: The item.
            reviewer: Who decides (non-empty).
            decision: ``accept`` or ``reject``.
            start, end: The span's adjusted boundaries (default: the item's).
            kind, evidence: The hallucination type (:data:`KINDS`, :data:`EVIDENCE`).
            note: Free text.
            expected_version: The version of this reviewer's review the change is based
                on (0: none yet); ``None`` skips the check.
            example: The answer as the reviewer sees it now; a decision on an item that
                no longer belongs to it (:meth:`ReviewItem.is_stale`) is refused.

        Raises:
            DataError: Bad reviewer, decision, type or span, or a stale item (nothing
                is written).
            ReviewConflict: The stored review is not at ``expected_version``.
            StorageError: No such item.
        """
        reviewer = _check_review(reviewer, kind, evidence)
        if decision not in DECISIONS:
            raise DataError(f"decision must be one of {DECISIONS}, got {decision!r}")
        note = (note or "").strip() or None
        attempted = {
            "decision": decision,
            "start": start,
            "end": end,
            "kind": kind,
            "evidence": evidence,
            "note": note,
        }
        with self.store.transaction() as c:
            row = c.execute(
                "SELECT example_id, span_start, span_end, answer_len, example_hash "
                "FROM review_items WHERE id = ?",
                (item_id,),
            ).fetchone()
            if row is None:
                raise StorageError(f"no review item {item_id}; rebuild the queue or reload")
            example_id, i_start, i_end, n, digest = row
            if example is not None and (
                example.id != example_id
                or len(example.response) != n
                or (digest is not None and digest != example_hash(example))
            ):
                raise DataError(
                    f"item {item_id} was flagged on another version of {example_id!r} (the "
                    "dataset was re-imported since); it is stale and cannot be reviewed "
                    "against the new text: rebuild the queue",
                    source=example_id,
                )
            s = i_start if start is None else int(start)
            e = i_end if end is None else int(end)
            if not 0 <= s < e <= n:
                raise DataError(
                    f"span [{s}, {e}) is not inside the answer of {example_id!r} ({n} "
                    "characters); pick boundaries within the answer",
                    source=example_id,
                    field="span",
                )
            old_row = c.execute(
                f"SELECT {_REVIEW_COLS} FROM reviews WHERE item_id = ? AND reviewer = ?",
                (item_id, reviewer),
            ).fetchone()
            old = _review(old_row) if old_row else None
            have = old.version if old else 0
            if expected_version is not None and expected_version != have:
                raise ReviewConflict(
                    f"item {item_id} ({example_id!r}) was changed by {reviewer} elsewhere "
                    f"(version {have}, this edit was based on version {expected_version}); "
                    "nothing was overwritten: reload the item and apply the change again",
                    attempted=attempted,
                )
            now = _now()
            if old is None:
                c.execute(
                    "INSERT INTO reviews (item_id, reviewer, decision, span_start, span_end, "
                    "kind, evidence, note, version, created_at, updated_at) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, 1, ?, ?)",
                    (item_id, reviewer, decision, s, e, kind, evidence, note, now, now),
                )
            else:
                c.execute(
                    "UPDATE reviews SET decision = ?, span_start = ?, span_end = ?, kind = ?, "
                    "evidence = ?, note = ?, version = version + 1, updated_at = ? "
                    "WHERE id = ?",
                    (decision, s, e, kind, evidence, note, now, old.id),
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

    def add_missed_span(
        self,
        dataset: str,
        example: RAGExample,
        reviewer: str,
        start: int,
        end: int,
        *,
        kind: str | None = None,
        evidence: str | None = None,
        note: str | None = None,
    ) -> Review:
        """A span no detector flagged, queued as the reviewer's own item and accepted.

        The item's source is ``added by <reviewer>`` (score 1, threshold 1); adding the
        same span again reuses the item and updates the reviewer's decision.

        Raises:
            DataError: Blank reviewer, a span outside the answer, or a bad type
                (nothing is written).
        """
        who = _check_review(reviewer, kind, evidence)
        if not 0 <= start < end <= len(example.response):
            raise DataError(
                f"span [{start}, {end}) is not inside the answer of {example.id!r} "
                f"({len(example.response)} characters); pick boundaries within the answer",
                source=example.id,
                field="span",
            )
        flag = Flag(
            example_id=example.id, start=start, end=end, sources={f"added by {who}": (1.0, 1.0)}
        )
        self.add_flags(dataset, [example], [flag])
        (item_id,) = self.store.query(
            "SELECT id FROM review_items WHERE dataset = ? AND example_id = ? AND "
            "span_start = ? AND span_end = ?",
            (dataset, example.id, start, end),
        )[0]
        return self.save_review(item_id, who, "accept", kind=kind, evidence=evidence, note=note)

    def audit(self, item_id: int | None = None, dataset: str | None = None) -> list[AuditEntry]:
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
            for r in self.store.query(sql, params)
        ]

    def reviewers(self, dataset: str) -> list[str]:
        return [
            r[0]
            for r in self.store.query(
                "SELECT DISTINCT r.reviewer FROM reviews r JOIN review_items i "
                "ON i.id = r.item_id WHERE i.dataset = ? ORDER BY r.reviewer",
                (dataset,),
            )
        ]
