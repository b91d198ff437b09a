"""Answer-level review: a reviewer marks a whole answer faithful or hallucinated, and
every answer's label is derived from the marks and the span decisions by stated rules.

The rules (:data:`LABEL_RULES`, shown on the Review page and in docs/review.md):

1. A reviewer's **answer mark** is that reviewer's label of the answer.
2. Without an answer mark, a reviewer who **accepted a span** of the answer labels it
   hallucinated (an accepted span is a hallucination), and one who **rejected every span
   flagged on it** labels it faithful (they saw all the detectors flagged and found
   nothing). Rejecting only some of its spans gives no label.
3. Across reviewers, the **strict majority** of their labels is the answer's label; a tie
   (e.g. one faithful, one hallucinated) makes the answer **disputed**, which is no label
   until a reviewer changes their mind.
4. An answer **nobody reviewed** has no label: it is never counted as faithful.
5. A mark or a span decision made on another version of the answer (the dataset was
   re-imported with another text since) is **stale** and counts for nothing.

An answer's label counts for calibration only when it was **drawn at random**: some
answer mark behind it was made while reviewing in the dataset's random order
(:mod:`core.data.sampling`); the rest serve refits only.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from core.base.errors import DataError
from core.base.examples import RAGExample, example_hash
from core.pipeline.judge import VOTE, AnswerVerdict
from core.review.book import ReviewConflict, ReviewItem, check_note
from core.storage import (
    ANSWER_LABELS,
    ORDERINGS,
    AnswerAuditEntry,
    AnswerMark,
    AnswerReview,
    ScannedAnswer,
    Store,
    now_iso,
)

LABEL_RULES: tuple[str, ...] = (
    "A reviewer's answer mark (faithful or hallucinated) is their label of the answer.",
    "Without an answer mark, a span the reviewer accepted makes the answer hallucinated "
    "for them, and rejecting every span flagged on it makes it faithful; rejecting only "
    "some of its spans gives no label.",
    "The strict majority of the reviewers' labels is the answer's label; a tie leaves it "
    "disputed (no label).",
    "An answer nobody reviewed has no label (never counted as faithful).",
    "Marks and span decisions made on another version of the answer are stale and count "
    "for nothing.",
)
"""The derived-label rules, in words (what :func:`answer_labels` does)."""


STATUS_UNREVIEWED = "unreviewed"
STATUS_DISPUTED = "disputed"


@dataclass(frozen=True, kw_only=True)
class ReviewerLabel:
    """One reviewer's label of an answer and where it comes from.

    Attributes:
        label: ``faithful`` or ``hallucinated``.
        source: ``answer mark``, ``accepted span`` or ``every span rejected``.
        drawn_by: The ordering the mark was made under (``None`` for a span decision:
            the span queue holds flagged answers only, never a random sample).
    """

    reviewer: str
    label: str
    source: str
    drawn_by: str | None


@dataclass(frozen=True, kw_only=True)
class AnswerLabel:
    """An answer's derived label (:data:`LABEL_RULES`).

    Attributes:
        status: ``faithful``, ``hallucinated``, ``disputed`` or ``unreviewed``.
        reviewers: Each reviewer's label that counted.
        random: Whether some answer mark behind it was made in the random order (the
            label may calibrate).
    """

    example_id: str
    status: str
    reviewers: tuple[ReviewerLabel, ...] = ()
    random: bool = False

    @property
    def label(self) -> bool | None:
        """``True`` hallucinated, ``False`` faithful, ``None`` no label."""
        if self.status not in ANSWER_LABELS:
            return None
        return self.status == "hallucinated"

    @property
    def rule(self) -> str:
        """Which rule decided, in words."""
        if self.status == STATUS_UNREVIEWED:
            return "nobody reviewed it"
        if self.status == STATUS_DISPUTED:
            return "reviewers disagree (a tie)"
        sources = sorted({r.source for r in self.reviewers if r.label == self.status})
        n = sum(r.label == self.status for r in self.reviewers)
        return f"{n} of {len(self.reviewers)} reviewers ({', '.join(sources)})"


def reviewer_labels(
    example: RAGExample, marks: Iterable[AnswerReview], items: Iterable[ReviewItem]
) -> list[ReviewerLabel]:
    """Each reviewer's label of ``example`` (rules 1, 2 and 5; ``items``: the span
    queue's items, any answer's), by reviewer name."""
    digest = example_hash(example)
    out: dict[str, ReviewerLabel] = {}
    for m in marks:
        if m.example_id == example.id and m.example_hash == digest:
            out[m.reviewer] = ReviewerLabel(
                reviewer=m.reviewer, label=m.label, source="answer mark", drawn_by=m.drawn_by
            )
    live = [it for it in items if it.example_id == example.id and not it.is_stale(example)]
    decided: dict[str, list[str]] = {}
    for it in live:
        for r in it.reviews:
            decided.setdefault(r.reviewer, []).append(r.decision)
    for who, decisions in decided.items():
        if who in out:
            continue  # the answer mark decides
        if "accept" in decisions:
            out[who] = ReviewerLabel(
                reviewer=who, label="hallucinated", source="accepted span", drawn_by=None
            )
        elif len(decisions) == len(live):  # every flagged span seen, all rejected
            out[who] = ReviewerLabel(
                reviewer=who, label="faithful", source="every span rejected", drawn_by=None
            )
    return [out[k] for k in sorted(out)]


def derive_label(example_id: str, labels: Sequence[ReviewerLabel]) -> AnswerLabel:
    """The answer's label from its reviewers' (rules 3 and 4)."""
    if not labels:
        return AnswerLabel(example_id=example_id, status=STATUS_UNREVIEWED)
    counts = Counter(r.label for r in labels)
    (top, n), *rest = counts.most_common()
    status = STATUS_DISPUTED if rest and rest[0][1] == n else top
    return AnswerLabel(
        example_id=example_id,
        status=status,
        reviewers=tuple(labels),
        random=any(r.drawn_by == "random" for r in labels),
    )


def answer_labels(
    examples: Sequence[RAGExample],
    marks: Sequence[AnswerReview],
    items: Sequence[ReviewItem],
) -> dict[str, AnswerLabel]:
    """Every answer's derived label (:data:`LABEL_RULES`), by example id, in the
    examples' order."""
    by_answer: dict[str, list[AnswerReview]] = {}
    for m in marks:
        by_answer.setdefault(m.example_id, []).append(m)
    items_by: dict[str, list[ReviewItem]] = {}
    for it in items:
        items_by.setdefault(it.example_id, []).append(it)
    return {
        ex.id: derive_label(
            ex.id, reviewer_labels(ex, by_answer.get(ex.id, ()), items_by.get(ex.id, ()))
        )
        for ex in examples
    }


def label_counts(labels: Iterable[AnswerLabel], *, random_only: bool = False) -> dict[str, int]:
    """How many answers are faithful, hallucinated, disputed and unreviewed (with
    ``random_only``: of the labels drawn at random, the others not counted)."""
    out = dict.fromkeys((*ANSWER_LABELS, STATUS_DISPUTED, STATUS_UNREVIEWED), 0)
    for lab in labels:
        if random_only and not (lab.random and lab.label is not None):
            continue
        out[lab.status] += 1
    return out


@dataclass(frozen=True, kw_only=True)
class ScanVerdict:
    """What a scan keeps of the set's verdict on an answer (:func:`scan_verdict`)."""

    probability: float
    threshold: float
    judged_by: str


def scan_verdict(v: AnswerVerdict) -> ScanVerdict:
    """The set's overall verdict on an answer, with which set, judge and calibration
    gave it (:class:`~core.pipeline.judge.AnswerVerdict`; a vote's calibration is its
    detectors', when they share one)."""
    who = f"set {v.set_name}" + (f" (used by {v.deferred_from} here)" if v.deferred_from else "")
    cals = {d.calibrated_for for d in v.verdicts.values()}
    calibrated_for = v.calibrated_for or (next(iter(cals)) if len(cals) == 1 else None)
    cal = f"calibrated for {calibrated_for}" if calibrated_for else "pooled calibration"
    how = "share of its detectors that flag it" if v.judge == VOTE else v.judge
    return ScanVerdict(
        probability=float(v.probability),
        threshold=float(v.threshold),
        judged_by=f"{who}, {how}, {cal}",
    )


_JUDGED_SET = re.compile(r"set (\S+?)(?:,| \(|$)")


def judged_set(scanned: ScannedAnswer) -> str | None:
    """The name of the set a scanned verdict was judged by (the ``set NAME`` its
    :attr:`~ScannedAnswer.judged_by` starts with, as :func:`scan_verdict` writes it);
    ``None`` when it does not say."""
    m = _JUDGED_SET.match(scanned.judged_by)
    return m.group(1) if m else None


def scanned_with_another_set(scanned: ScannedAnswer, set_now: str) -> str | None:
    """The set's name a scanned verdict was judged by, when it is not ``set_now`` (the
    set that judges the answer's dataset now: the verdict is the previous set's);
    ``None`` when it is the same set, or the verdict does not say which."""
    was = judged_set(scanned)
    return was if was is not None and was != set_now else None


class AnswerBook:
    """Answer-level marks, their audit trail and the scanned answers' verdicts in a
    :class:`~core.storage.Store`."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def mark(
        self,
        dataset: str,
        example: RAGExample,
        reviewer: str,
        label: str,
        *,
        drawn_by: str,
        note: str | None = None,
        expected_version: int | None = None,
    ) -> AnswerReview:
        """Record (or change) ``reviewer``'s mark on a whole answer, with an audit entry.

        Args:
            dataset: The dataset's name (the review queue's key).
            example: The answer as the reviewer sees it (its hash is stored: a mark on
                another version of the answer is stale).
            reviewer: Who decides (non-empty).
            label: ``faithful`` or ``hallucinated``.
            drawn_by: The ordering the answer was reviewed under (:data:`ORDERINGS`).
            note: Free text.
            expected_version: The version of this reviewer's mark the change is based
                on (0: none yet); ``None`` skips the check.

        Raises:
            DataError: A blank reviewer, an unknown label or ordering (nothing written).
            ReviewConflict: The stored mark is not at ``expected_version``.
        """
        who = (reviewer or "").strip()
        if not who:
            raise DataError("a review needs the reviewer's name", field="reviewer")
        if label not in ANSWER_LABELS:
            raise DataError(f"an answer's label must be one of {ANSWER_LABELS}, got {label!r}")
        if drawn_by not in ORDERINGS:
            raise DataError(f"drawn_by must be one of {ORDERINGS}, got {drawn_by!r}")
        note = check_note(note)
        digest = example_hash(example)

        def decide(old: AnswerReview | None) -> AnswerMark:
            # Runs inside the store's transaction: raising here writes nothing.
            have = old.version if old else 0
            if expected_version is not None and expected_version != have:
                raise ReviewConflict(
                    f"{who}'s mark on {example.id!r} was changed elsewhere (version {have}, "
                    f"this edit was based on version {expected_version}); nothing was "
                    "overwritten: reload the answer and mark it again",
                    attempted={"label": label, "note": note},
                )
            return AnswerMark(label=label, drawn_by=drawn_by, note=note, example_hash=digest)

        return self.store.save_answer_review_row(dataset, example.id, who, decide)

    def marks(self, dataset: str) -> list[AnswerReview]:
        """Every mark on the dataset's answers."""
        return self.store.answer_reviews(dataset)

    def audit(self, dataset: str, example_id: str | None = None) -> list[AnswerAuditEntry]:
        """The marks' audit trail of a dataset (or one answer), oldest first."""
        return self.store.answer_review_audit(dataset, example_id)

    def labels(
        self, dataset: str, examples: Sequence[RAGExample], items: Sequence[ReviewItem]
    ) -> dict[str, AnswerLabel]:
        """Every answer's derived label (:func:`answer_labels`)."""
        return answer_labels(examples, self.marks(dataset), items)

    def record_scan(
        self, dataset: str, examples: Sequence[RAGExample], verdicts: Mapping[str, ScanVerdict]
    ) -> int:
        """Keep the set's verdict on scanned answers (the answer queue); returns how many.

        Raises:
            DataError: A probability or threshold outside [0, 1] or not finite, or a
                verdict on an answer not in ``examples``.
        """
        by_id = {e.id: e for e in examples}
        now = now_iso()
        rows = []
        for eid, v in verdicts.items():
            ex = by_id.get(eid)
            if ex is None:
                raise DataError(f"a verdict on {eid!r}, which is not an answer of {dataset!r}")
            for what, x in (("probability", v.probability), ("threshold", v.threshold)):
                if not 0.0 <= x <= 1.0:  # NaN fails too
                    raise DataError(f"{eid!r}'s {what} {x!r} is not in [0, 1]", source=eid)
            rows.append(
                ScannedAnswer(
                    dataset=dataset,
                    example_id=eid,
                    example_hash=example_hash(ex),
                    probability=float(v.probability),
                    threshold=float(v.threshold),
                    judged_by=v.judged_by,
                    scanned_at=now,
                )
            )
        self.store.put_scanned_answers(rows)
        return len(rows)

    def scanned(self, dataset: str, examples: Sequence[RAGExample]) -> dict[str, ScannedAnswer]:
        """The set's verdicts on the dataset's scanned answers that still match their
        answer's text (a re-imported answer must be scanned again), by id."""
        digest = {e.id: example_hash(e) for e in examples}
        return {
            s.example_id: s
            for s in self.store.scanned_answers(dataset)
            if digest.get(s.example_id) == s.example_hash
        }
