"""The review book: the queue of flagged spans, one decision per item and reviewer (versioned: a stale save raises ReviewConflict), and the append-only audit trail, in the ragscope database.

Its SQL (and the row types :class:`Review`, :class:`ReviewItem`, :class:`AuditEntry`)
is in :mod:`core.storage.reviews`; here are the checks, what to queue and refresh, and
conflict detection.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from core.base.errors import DataError, StorageError
from core.base.examples import RAGExample, example_hash
from core.review.flags import Flag
from core.storage import (
    DECISIONS,
    EVIDENCE,
    KINDS,
    AuditEntry,
    QueuedSpan,
    Review,
    ReviewChange,
    ReviewItem,
    Store,
)

SORTS: tuple[str, ...] = ("uncertainty", "score", "position")

MAX_NOTE = 5_000
"""The longest note a review keeps (characters): a reviewer's note, not a document."""


def check_note(note: str | None) -> str | None:
    """A review's note, stripped (``None`` when blank).

    Raises:
        DataError: Longer than :data:`MAX_NOTE` (nothing is written).
    """
    text = (note or "").strip()
    if len(text) > MAX_NOTE:
        raise DataError(
            f"a note holds at most {MAX_NOTE:,} characters, this one {len(text):,}: shorten it",
            field="note",
        )
    return text or None


class ReviewConflict(StorageError):
    """A save based on a review that someone (or another tab) changed meanwhile.

    Nothing is lost: the stored review stays as the other save left it, and the
    attempted one is in :attr:`attempted` to re-apply after a reload.
    """

    def __init__(self, message: str, *, attempted: Mapping[str, Any]) -> None:
        super().__init__(message)
        self.attempted = dict(attempted)


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


def _refresh(span: QueuedSpan, stored_hash: str | None, reviewed: bool) -> bool:
    """Whether a span queued again is rewritten for the new text: only when its answer
    changed and nobody reviewed it yet (a reviewed one stays, stale, with its reviews)."""
    return stored_hash != span.example_hash and not reviewed


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
        spans = []
        for f in flags:
            ex = by_id.get(f.example_id)
            if ex is None:
                raise DataError(f"flag for unknown example {f.example_id!r} of {dataset!r}")
            if not 0 <= f.start < f.end <= len(ex.response):
                raise DataError(
                    f"flag [{f.start}, {f.end}) is outside the answer of {f.example_id!r} "
                    f"({len(ex.response)} characters)"
                )
            spans.append(
                QueuedSpan(  # what a flag says about its span on this answer
                    example_id=ex.id,
                    start=f.start,
                    end=f.end,
                    answer_len=len(ex.response),
                    sources=f.sources,
                    score=f.score,
                    margin=f.margin,
                    task=ex.task,
                    generator=ex.provenance.generator,
                    example_hash=example_hash(ex),
                )
            )
        return self.store.insert_or_refresh_review_items(dataset, spans, _refresh)

    def item(self, item_id: int) -> ReviewItem:
        """One item with its reviews.

        Raises:
            StorageError: No item has that id.
        """
        item = self.store.review_item(item_id)
        if item is None:
            raise StorageError(f"no review item {item_id}; rebuild the queue or reload the page")
        return item

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
        return filter_items(
            self.store.review_items(dataset),
            detectors=detectors,
            tasks=tasks,
            generators=generators,
            statuses=statuses,
            sort=sort,
        )

    def datasets(self) -> list[tuple[str, int]]:
        """Datasets with a queue, and their number of items."""
        return self.store.review_datasets()

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
        note = check_note(note)
        attempted = {
            "decision": decision,
            "start": start,
            "end": end,
            "kind": kind,
            "evidence": evidence,
            "note": note,
        }

        def decide(item: ReviewItem, old: Review | None) -> ReviewChange:
            # Runs inside the store's transaction: raising here writes nothing.
            example_id, n, digest = item.example_id, item.answer_len, item.example_hash
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
            s = item.start if start is None else int(start)
            e = item.end if end is None else int(end)
            if not 0 <= s < e <= n:
                raise DataError(
                    f"span [{s}, {e}) is not inside the answer of {example_id!r} ({n} "
                    "characters); pick boundaries within the answer",
                    source=example_id,
                    field="span",
                )
            have = old.version if old else 0
            if expected_version is not None and expected_version != have:
                raise ReviewConflict(
                    f"item {item_id} ({example_id!r}) was changed by {reviewer} elsewhere "
                    f"(version {have}, this edit was based on version {expected_version}); "
                    "nothing was overwritten: reload the item and apply the change again",
                    attempted=attempted,
                )
            return ReviewChange(
                decision=decision, start=s, end=e, kind=kind, evidence=evidence, note=note
            )

        return self.store.save_review_row(item_id, reviewer, decide)

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
        check_note(note)
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
        item_id = self.store.review_item_id(dataset, example.id, start, end)
        return self.save_review(item_id, who, "accept", kind=kind, evidence=evidence, note=note)

    def audit(self, item_id: int | None = None, dataset: str | None = None) -> list[AuditEntry]:
        """The audit trail, oldest first (of one item, of a dataset's items, or all)."""
        return self.store.review_audit(item_id, dataset)

    def reviewers(self, dataset: str) -> list[str]:
        return self.store.reviewers(dataset)
