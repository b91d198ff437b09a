"""SQLite: all of ragscope's SQL, one repository per table family.

SQLite storage for datasets, analyses, annotations, cached explanations,
counterfactual sessions, reviews, background jobs and measured paces: all of ragscope's SQL lives in this package.

One file (WAL mode, foreign keys on) with a versioned schema: ``schema_version`` records
which entries of :data:`MIGRATIONS` have been applied; opening a database applies the
missing ones in order, each in its own transaction. A database written by a newer
ragscope (a higher version than this code knows) is refused with a
:class:`~core.base.errors.StorageError` that says what to do.

A :class:`Store` holds one connection shared by all threads behind a lock, which is what
a Streamlit server (one thread per session) needs.

- ``migrations``: :data:`MIGRATIONS` and :data:`SCHEMA_VERSION`.
- ``db``: the connection (:class:`~core.storage.db.Database`), transactions, applying
  migrations, :func:`default_db_path` and :func:`now_iso`.
- one repository per table family, each with its rows' dataclasses: ``datasets``
  (datasets and examples), ``analyses`` (the feature cache), ``annotations``,
  ``explanations``, ``counterfactuals`` and ``reviews`` (the review queue, decisions
  and audit trail that :mod:`core.review` keeps), ``answer_reviews`` (answer-level marks,
  their audit trail and the scanned answers' verdicts) and ``jobs`` (background jobs and their
  progress, :mod:`core.services.jobs`) ``logins`` (logins revoked by logging out) and ``paces`` (how fast feature
  extraction ran here, for the pages' time estimates).
- ``store``: :class:`Store`, the database with all of them.
"""

from __future__ import annotations

from core.storage.analyses import AnalysisRecord
from core.storage.annotations import Annotation
from core.storage.answer_reviews import (
    ANSWER_LABELS,
    ORDERINGS,
    AnswerAuditEntry,
    AnswerMark,
    AnswerReview,
    ScannedAnswer,
)
from core.storage.counterfactuals import SavedSession
from core.storage.datasets import DatasetInfo, check_dataset_name
from core.storage.db import DB_FILENAME, default_db_path, now_iso
from core.storage.jobs import (
    ACTIVE_STATUSES,
    JOB_STATUSES,
    JobBusyError,
    JobRow,
    JobRowError,
    JobStatus,
)
from core.storage.migrations import MIGRATIONS, SCHEMA_VERSION
from core.storage.reviews import (
    DECISIONS,
    EVIDENCE,
    KIND_OF_SPAN_TYPE,
    KINDS,
    LABEL_TYPES,
    STATUSES,
    AuditEntry,
    Decision,
    QueuedSpan,
    Review,
    ReviewChange,
    ReviewItem,
)
from core.storage.store import Store

__all__ = [
    "ACTIVE_STATUSES",
    "ANSWER_LABELS",
    "ORDERINGS",
    "AnswerAuditEntry",
    "AnswerMark",
    "AnswerReview",
    "ScannedAnswer",
    "DB_FILENAME",
    "DECISIONS",
    "EVIDENCE",
    "JOB_STATUSES",
    "KIND_OF_SPAN_TYPE",
    "KINDS",
    "LABEL_TYPES",
    "MIGRATIONS",
    "SCHEMA_VERSION",
    "STATUSES",
    "AnalysisRecord",
    "Annotation",
    "AuditEntry",
    "DatasetInfo",
    "Decision",
    "JobBusyError",
    "JobRow",
    "JobRowError",
    "JobStatus",
    "QueuedSpan",
    "Review",
    "ReviewChange",
    "ReviewItem",
    "SavedSession",
    "Store",
    "check_dataset_name",
    "default_db_path",
    "now_iso",
]
