"""Training jobs for the loaded model (:mod:`core.services.jobs`): starting, watching, cancelling
and resuming them, the time estimate, and the "Train detectors" widget keys.

Nothing about a job lives in the session: its row in the database is read on every run,
so any session, page or reload sees the same job.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import streamlit as st

from app.state.datasets import get_store
from app.state.estimates import work_estimate
from app.state.identity import current_identity, job_actor
from app.state.model import model_device, model_spec
from app.state.runs import CORPUS, eval_dataset_choices
from core.base.errors import DataError
from core.base.paths import model_detectors_dir
from core.data import make_splits
from core.detectors import make_detector, runnable_detectors
from core.pipeline.extract import WorkEstimate
from core.services.jobs import (
    AdaptSpec,
    JobView,
    TrainSpec,
    cancel_job,
    discard_job,
    job_view,
    may_control,
    resume_job,
    start_adapt_job,
    start_train_job,
)

if TYPE_CHECKING:
    from core.base.examples import RAGExample
    from core.engine.model import LoadedModel
    from core.learning.contract import Detector

KEY_TRAIN_OPEN = "train.open"
"""The "Train detectors for this model" expander (its form renders only while open)."""


KEY_TRAIN_DETECTORS = "train.detectors"


KEY_TRAIN_DATASET = "train.dataset"


KEY_TRAIN_LIMIT = "train.limit"


KEY_TRAIN_CV = "train.cv"


KEY_TRAIN_START = "train.start"


KEY_TRAIN_CANCEL = "train.cancel"


KEY_TRAIN_RESUME = "train.resume"


KEY_TRAIN_DISCARD = "train.discard"


TRAIN_LIMIT = 300
"""The form's default example limit (the built-in corpus has 1,800)."""


WORKER_START_S = 10.0
"""A worker's start before its model loads (Python and its libraries), for the estimate."""


POLL_S = 1.5
"""How often a page watching a running job refreshes its progress."""


def train_folder(model: LoadedModel) -> Path:
    """Where a job publishes the detectors it trains for ``model``."""
    return model_detectors_dir(model.info.key)


def train_detector_choices(model: LoadedModel) -> list[str]:
    """The detectors a job can train for ``model`` (those that can read it)."""
    return runnable_detectors(model)


def train_dataset_choices() -> dict[str, str]:
    """Dataset spec -> label: the demo examples, the built-in corpus, the shared dev sets
    and the imported datasets (as the Benchmark offers them).

    Raises:
        StorageError: The database cannot be opened.
    """
    return eval_dataset_choices()


def train_spec(
    detectors: Sequence[str], dataset: str, limit: int | None, cv: int | None = None
) -> TrainSpec:
    """The job for the loaded model (``RAGSCOPE_MODEL``, ``RAGSCOPE_DEVICE``); ``cv``: K-fold
    cross-validation (``ragscope train --cv K``) instead of one split.

    Raises:
        DataError: An option a job refuses (no detectors, an unknown one).
    """
    return TrainSpec.of(
        model=model_spec(),
        device=model_device(),
        detectors=tuple(detectors),
        dataset=dataset,
        limit=limit or None,
        cv=cv or None,
    )


def job_log_db() -> str:
    """The database whose jobs' logs the pages point at (:func:`core.services.jobs.job_log_path`)."""
    return get_store().path


def model_job(model: LoadedModel) -> JobView | None:
    """The loaded model's job: its active one, else its newest (never cached).

    Raises:
        JobRowError: That job's row cannot be read.
        StorageError: The database cannot be opened.
    """
    row = get_store().latest_job(model.info.key, kind="train")
    return job_view(row) if row is not None else None


def read_job(job_id: int) -> JobView:
    """Job ``job_id`` as it stands now.

    Raises:
        DataError: No such job, or its row cannot be read.
    """
    return job_view(get_store().get_job(job_id))


def start_training(model: LoadedModel, spec: TrainSpec) -> int:
    """Queue ``spec`` for ``model``, owned by the signed-in user (with logins), and start
    its worker; returns the job id.

    Raises:
        JobBusyError: A job for this model is already queued or running.
        DataError: The worker could not be started.
    """
    who = current_identity()
    owner = who.id if who is not None else None
    return start_train_job(get_store(), spec, model_key=model.info.key, owner=owner)


def adapt_spec(dataset: str, queue: str, *, refit: bool = False) -> AdaptSpec:
    """The adaptation job of review queue ``queue`` over ``dataset`` (a named spec) for
    the loaded model and the set that applies (``refit``: the ensemble's stacker too).

    Raises:
        DataError: A dataset named by path (never from the app).
    """
    return AdaptSpec(
        model=model_spec(), device=model_device(), dataset=dataset, queue=queue, refit=refit
    )


def adapt_estimate(
    model: LoadedModel, examples: Sequence[RAGExample], detectors: Sequence[Detector]
) -> WorkEstimate:
    """How long an adaptation job judging ``examples`` with ``detectors`` takes here:
    the answers not in the feature cache at the measured pace, plus the worker's start
    and the model's load (:attr:`WorkEstimate.fixed_seconds`), as for training.

    Raises:
        DataError: The answer timed cannot be laid out.
        ModelError: A detector cannot run on this model.
    """
    return work_estimate(
        model, examples, detectors, fixed_seconds=WORKER_START_S + model.load_seconds
    )


def model_adapt_job(model: LoadedModel) -> JobView | None:
    """The loaded model's adaptation job: its active one, else its newest (never cached).

    Raises:
        JobRowError: That job's row cannot be read.
    """
    row = get_store().latest_job(model.info.key, kind="adapt")
    return job_view(row) if row is not None else None


def start_adapting(model: LoadedModel, spec: AdaptSpec) -> int:
    """Queue ``spec`` for ``model``, owned by the signed-in user, and start its worker.

    Raises:
        JobBusyError: A job for this model is already queued or running.
        DataError: The worker could not be started.
    """
    who = current_identity()
    owner = who.id if who is not None else None
    return start_adapt_job(get_store(), spec, model_key=model.info.key, owner=owner)


def may_control_job(view: JobView) -> bool:
    """Whether this session may cancel, resume or discard ``view``'s job: anyone without
    logins; with logins, the user who started it or an admin (``RAGSCOPE_ADMINS``)."""
    return may_control(view.row.owner, job_actor())


def cancel_training(job_id: int) -> None:
    """Ask job ``job_id`` to stop (an interrupted one is marked cancelled at once).

    Raises:
        JobPermissionError: With logins, it is neither this user's job nor are they an
            admin.
    """
    cancel_job(get_store(), job_id, actor=job_actor())


def discard_training(job_id: int) -> None:
    """Give up interrupted job ``job_id``, or an active one whose row cannot be read.

    Raises:
        JobPermissionError: With logins, not this user's job (and not an admin).
        DataError: It is running (cancel it instead).
    """
    discard_job(get_store(), job_id, actor=job_actor())


def resume_training(job_id: int) -> None:
    """Start interrupted or failed job ``job_id`` again.

    Raises:
        JobPermissionError: With logins, not this user's job (and not an admin).
        DataError: It is not interrupted or failed.
        JobBusyError: Another job for its model is active.
    """
    resume_job(get_store(), job_id, actor=job_actor())


@st.cache_data(show_spinner="Reading the training data…", ttl=60, max_entries=8)
def _job_examples(dataset: str, limit: int | None, seed: int) -> list[RAGExample]:
    """Every example (all splits) a job on ``dataset`` reads."""
    _, _, splits = make_splits(dataset, None, limit=limit, seed=seed)
    return [e for part in ("train", "validation", "test") for e in splits[part]]


@st.cache_data(show_spinner=False, ttl=10, max_entries=16)
def _train_work(
    _model: LoadedModel,
    instance_key: str,
    dataset: str,
    limit: int | None,
    seed: int,
    detectors: tuple[str, ...],
    db_path: str,
) -> WorkEstimate:
    """:func:`train_estimate`'s reading, kept for seconds (``db_path`` keys the cache:
    the database)."""
    examples = _job_examples(dataset, limit, seed)
    if not examples:
        raise DataError("the dataset has no examples to train on", source=dataset)
    return work_estimate(
        _model,
        examples,
        [make_detector(n) for n in detectors],
        fixed_seconds=WORKER_START_S + _model.load_seconds,
    )


def train_estimate(model: LoadedModel, spec: TrainSpec) -> WorkEstimate:
    """How long ``spec`` will take on ``model``: the examples not yet in the feature
    cache at the pace of one traced here (once per detector choice), plus the worker's
    start and model load (:attr:`WorkEstimate.fixed_seconds`).

    Raises:
        DataError: The dataset cannot be read or is empty, or the example timed cannot
            be laid out.
        ModelError: A detector cannot run on this model.
    """
    return _train_work(
        model,
        model.instance_key,
        spec.recipe.dataset,
        spec.recipe.limit,
        spec.recipe.seed,
        spec.recipe.detectors,
        get_store().path,
    )


DEFAULT_TRAIN_DATASET = CORPUS
"""The form's default training data: the built-in labelled corpus."""
