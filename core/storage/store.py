"""The :class:`Store`: one ragscope database with every table's repository."""

from __future__ import annotations

from core.storage.analyses import AnalysesRepository
from core.storage.annotations import AnnotationsRepository
from core.storage.answer_reviews import AnswerReviewsRepository
from core.storage.counterfactuals import CounterfactualsRepository
from core.storage.datasets import DatasetsRepository
from core.storage.explanations import ExplanationsRepository
from core.storage.jobs import JobsRepository
from core.storage.logins import LoginsRepository
from core.storage.paces import PacesRepository
from core.storage.reviews import ReviewsRepository


class Store(
    DatasetsRepository,
    AnalysesRepository,
    AnnotationsRepository,
    ExplanationsRepository,
    CounterfactualsRepository,
    ReviewsRepository,
    AnswerReviewsRepository,
    JobsRepository,
    LoginsRepository,
    PacesRepository,
):
    """The ragscope database.

    Use as a context manager (``with Store() as db: ...``) or call :meth:`close`.
    Every method is safe to call from several threads: one connection is shared
    behind a re-entrant lock.

    Args:
        path: Database file (created with its folder when missing); ``":memory:"``
            for a throw-away database. Default: :func:`default_db_path`.

    Raises:
        StorageError: The file cannot be opened, is not a ragscope database, or was
            written by a newer ragscope.
    """
