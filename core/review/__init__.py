"""Annotation review: a queue of flagged spans, reviewers' decisions, an audit trail.

- :func:`set_flags` queues the spans the set decides on each answer (the spans every page
  and ``ragscope judge`` show, with their evidence and type) and says why an answer the
  set calls hallucinated has none; the default of the Review page.
- :func:`propose_flags` turns detectors' token scores on one answer into flagged
  whole-word spans (:func:`core.pipeline.word_spans.answer_spans`: runs of tokens at or above each
  detector's token threshold merged across short gaps, optionally after
  label-persistence smoothing; never punctuation alone); overlapping spans of several
  detectors merge into one item that names them all. :func:`scan_flags` does it for a
  dataset and says, per detector, why it flagged nothing.
- :class:`ReviewBook` keeps the queue and the decisions in the ragscope database:
  ``review_items`` (one per flagged span; re-building the queue never touches
  reviews), ``reviews`` (one row per item and reviewer, so two reviewers never
  overwrite each other; a version number per row makes a stale save from a second
  tab of the same reviewer fail with :class:`ReviewConflict` instead of silently
  overwriting) and ``review_audit`` (append-only: triggers refuse updates and
  deletes; one row per change with who, when, before and after). Every change is
  one ``BEGIN IMMEDIATE`` transaction.
- :class:`AnswerBook` (:mod:`core.review.answers`): a reviewer marks a whole answer
  faithful or hallucinated (one versioned mark per answer and reviewer, with the
  ordering it was drawn under, and an append-only audit trail), and every answer's
  label is derived by :data:`LABEL_RULES` from the marks and span decisions
  (:func:`answer_labels`); the set's verdicts on scanned answers form the answer queue.
- :func:`order_answers` (:mod:`core.data.sampling`): the answer queue in random,
  uncertainty or stratified order (:data:`ORDERING_PURPOSE` says what each is for).
- :func:`agreement`: Cohen's kappa of two reviewers' accept / reject decisions on
  the items both reviewed, and the span-overlap F1 of their accepted spans;
  :func:`answer_agreement`: Cohen's kappa of two reviewers' answer labels.
- :func:`reviewed_examples`, :func:`write_ragtruth_jsonl` and :func:`reviews_frame`:
  the reviewed dataset as RAGTruth-style JSONL (the format of
  ``../shared/data/ragtruth_qa_dev.jsonl``, read back by
  :func:`core.data.load_dataset`) and a CSV of every decision.
"""

from __future__ import annotations

from core.data.sampling import (
    ORDERING_PURPOSE,
    STRATA,
    next_to_scan,
    order_answers,
    random_order,
    to_rescan,
)
from core.review.agreement import (
    Agreement,
    AnswerAgreement,
    agreement,
    answer_agreement,
)
from core.review.answers import (
    LABEL_RULES,
    AnswerBook,
    AnswerLabel,
    ReviewerLabel,
    ScanVerdict,
    answer_labels,
    derive_label,
    judged_set,
    label_counts,
    reviewer_labels,
    scan_verdict,
    scanned_with_another_set,
)
from core.review.book import (
    SORTS,
    ReviewBook,
    ReviewConflict,
    filter_items,
)
from core.review.export import (
    FORMULA_START,
    RAGTRUTH_TEMPLATE,
    formula_like,
    neutralise_cell,
    ragtruth_jsonl,
    ragtruth_record,
    resolved_review,
    reviewed_examples,
    reviews_frame,
    safe_csv,
    write_ragtruth_jsonl,
)
from core.review.flags import (
    DetectorScan,
    Flag,
    Scan,
    SetScan,
    dataset_verdicts,
    judge_dataset,
    propose_flags,
    scan_flags,
    set_flags,
    split_verdicts,
)
from core.storage import (
    ANSWER_LABELS,
    DECISIONS,
    EVIDENCE,
    KIND_OF_SPAN_TYPE,
    KINDS,
    LABEL_TYPES,
    ORDERINGS,
    STATUSES,
    AnswerReview,
    AuditEntry,
    Decision,
    Review,
    ReviewItem,
    ScannedAnswer,
)

__all__ = [
    "ANSWER_LABELS",
    "LABEL_RULES",
    "ORDERINGS",
    "ORDERING_PURPOSE",
    "STRATA",
    "Agreement",
    "AnswerAgreement",
    "AnswerBook",
    "AnswerLabel",
    "AnswerReview",
    "ReviewerLabel",
    "ScanVerdict",
    "ScannedAnswer",
    "answer_agreement",
    "answer_labels",
    "derive_label",
    "judge_dataset",
    "label_counts",
    "next_to_scan",
    "to_rescan",
    "order_answers",
    "random_order",
    "reviewer_labels",
    "scan_verdict",
    "scanned_with_another_set",
    "judged_set",
    "split_verdicts",
    "AuditEntry",
    "DECISIONS",
    "Decision",
    "DetectorScan",
    "EVIDENCE",
    "FORMULA_START",
    "Flag",
    "KIND_OF_SPAN_TYPE",
    "KINDS",
    "LABEL_TYPES",
    "RAGTRUTH_TEMPLATE",
    "Review",
    "ReviewBook",
    "ReviewConflict",
    "ReviewItem",
    "SORTS",
    "Scan",
    "STATUSES",
    "agreement",
    "dataset_verdicts",
    "filter_items",
    "formula_like",
    "neutralise_cell",
    "propose_flags",
    "set_flags",
    "SetScan",
    "ragtruth_jsonl",
    "ragtruth_record",
    "resolved_review",
    "reviewed_examples",
    "reviews_frame",
    "safe_csv",
    "scan_flags",
    "write_ragtruth_jsonl",
]
