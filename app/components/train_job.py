"""The "Train detectors for this model" panel: the form that starts a background
training job, and the job's live progress, on Home and every detector page.

The job runs in a worker process of its own (:mod:`core.services.jobs`), not in this script: it
goes on across reruns, page switches, browser reloads and app restarts, and every page
reads its state from the database. A running job's panel refreshes itself
(``st.fragment(run_every=...)``); when the job ends the whole page reruns, so the
artifacts it published load without restarting the app.
"""

from __future__ import annotations

from datetime import UTC, datetime

import streamlit as st

from app.components.estimate import describe_work, format_seconds
from app.state.detectors import DetectorSet, detector_set
from app.state.jobs import (
    DEFAULT_TRAIN_DATASET,
    KEY_TRAIN_CANCEL,
    KEY_TRAIN_CV,
    KEY_TRAIN_DATASET,
    KEY_TRAIN_DETECTORS,
    KEY_TRAIN_DISCARD,
    KEY_TRAIN_LIMIT,
    KEY_TRAIN_OPEN,
    KEY_TRAIN_RESUME,
    KEY_TRAIN_START,
    POLL_S,
    TRAIN_LIMIT,
    cancel_training,
    discard_training,
    job_log_db,
    may_control_job,
    model_job,
    read_job,
    resume_training,
    start_training,
    train_dataset_choices,
    train_detector_choices,
    train_estimate,
    train_folder,
    train_spec,
)
from app.state.session import seed_widget
from app.text import code, md
from core.base.errors import RagscopeError
from core.base.paths import TRAINED_SET
from core.base.words import plural
from core.engine.model import LoadedModel
from core.pipeline.extract import WorkEstimate
from core.services.jobs import JobView, TrainSpec, job_log_path
from core.storage import JobRowError

TITLE = "Train detectors for this model"
FINISHED = "train.finished"
"""Session key: the job a watching panel saw end (its outcome is shown once)."""
ACTION_ERROR = "train.action_error"
"""Session key: why the last Cancel/Resume/Discard click failed."""


def describe_estimate(est: WorkEstimate) -> str:
    """The training estimate in words (Markdown)."""
    return (
        describe_work(est, what="examples", extra="the worker's start and the model's load")
        + " Fitting comes on top: seconds for most detectors, longer for those that "
        "search hyper-parameters (spad, interpdetect) on many examples."
    )


def elapsed(iso: str | None) -> str | None:
    if not iso:
        return None
    try:
        start = datetime.fromisoformat(iso)
    except ValueError:
        return None
    if start.tzinfo is None:
        start = start.replace(tzinfo=UTC)
    return format_seconds((datetime.now(UTC) - start).total_seconds())


def _about(view: JobView) -> str:
    """Job #N: what it trains on which data (Markdown)."""
    spec = view.spec
    if spec is None:
        return f"Job #{view.id} (its options cannot be read: {md(view.spec_error)})"
    assert isinstance(spec, TrainSpec)  # this panel reads training jobs only
    r = spec.recipe
    limit = f", about {r.limit} {plural(r.limit, 'example')}" if r.limit else ""
    cv = f", {r.cv}-fold CV" if r.cv else ""
    names = ", ".join(code(d) for d in r.detectors)
    by = f" (started by {code(view.row.owner)})" if view.row.owner else ""
    return f"Job #{view.id}: {names} on {code(r.dataset)}{limit}{cv}{by}"


def not_yours(view: JobView) -> bool:
    """Whether this session may not control ``view``'s job (with logins: not its
    owner, not an admin); says so under the job."""
    if may_control_job(view):
        return False
    st.caption(
        "Only the user who started this job or an admin (`RAGSCOPE_ADMINS`) can cancel, "
        "resume or discard it."
    )
    return True


def act(action: str, job_id: int) -> None:
    """Button callback: cancel, resume or discard job ``job_id`` (errors kept to show)."""
    st.session_state.pop(ACTION_ERROR, None)
    try:
        if action == "resume":
            resume_training(job_id)
        elif action == "discard":
            discard_training(job_id)
        else:
            cancel_training(job_id)
    except RagscopeError as e:
        st.session_state[ACTION_ERROR] = f"Could not {action} job #{job_id}: {md(e)}"


def action_error() -> None:
    msg = st.session_state.pop(ACTION_ERROR, None)
    if isinstance(msg, str):
        st.error(msg)


@st.fragment(run_every=POLL_S)
def _live_job(job_id: int) -> None:
    """A queued or running job's progress and Cancel, refreshed every :data:`POLL_S`
    seconds; when the job ends, the whole page reruns (its artifacts then load)."""
    try:
        view = read_job(job_id)
    except RagscopeError as e:
        st.error(f"The training job cannot be read: {md(e)}")
        return
    if not view.active:
        st.session_state[FINISHED] = job_id
        st.rerun()
    st.markdown(_about(view))
    job_progress(view, KEY_TRAIN_CANCEL)


def job_progress(view: JobView, cancel_key: str, *, unit: str = "examples") -> None:
    """An active job's progress bar (what is done, the time since it started; its
    examples called ``unit``), its Cancel (the owner's or an admin's) and where its log
    is: what the training and the adaptation panels show while their job runs."""
    started = elapsed(view.row.started_at or view.row.created_at)
    text = view.progress_text.replace("examples", unit) + (f" · {started}" if started else "")
    if view.row.cancel_requested:
        text = "Cancelling… " + text
    st.progress(view.fraction, text=md(text))
    c1, c2 = st.columns([1, 3], vertical_alignment="center")
    c1.button(
        "Cancel", key=cancel_key, icon=":material/cancel:", on_click=act,
        args=("cancel", view.id), disabled=view.row.cancel_requested or not_yours(view),
    )  # fmt: skip
    c2.caption(
        "Runs in the background: switch pages, reload or close the tab, it goes on. "
        f"Log: {code(job_log_path(job_log_db(), view.row))}"
    )
    action_error()


def _interrupted(view: JobView) -> None:
    """A job whose worker is gone: resume it (features come from the cache) or discard it."""
    st.warning(
        f"{_about(view)} was interrupted at {md(view.progress_text)} (its worker stopped "
        "without finishing, e.g. the machine restarted). Resume it: the examples already "
        "traced come from the feature cache."
    )
    locked = not_yours(view)
    c1, c2, _ = st.columns([1, 1, 3])
    with c1:
        st.button(
            "Resume",
            key=KEY_TRAIN_RESUME,
            type="primary",
            icon=":material/play_arrow:",
            on_click=act,
            args=("resume", view.id),
            disabled=not view.resumable or locked,
        )
    with c2:
        st.button(
            "Discard",
            key=KEY_TRAIN_DISCARD,
            icon=":material/delete:",
            on_click=act,
            args=("discard", view.id),
            disabled=locked,
        )
    action_error()


def _outcome(view: JobView, *, fresh: bool) -> None:
    """How an ended job ended: ``fresh`` when this session watched it end."""
    r = view.row
    if view.state == "done":
        made = r.result.get("artifacts") if isinstance(r.result, dict) else None
        names = ", ".join(code(n) for n in made) if isinstance(made, dict) else "its detectors"
        text = f"{_about(view)} finished: trained {names} into {code(r.out)}."
        if fresh:
            st.success(text + " They are loaded now.", icon=":material/check_circle:")
        else:
            st.caption(text)
    elif view.state == "cancelled":
        (st.info if fresh else st.caption)(
            f"{_about(view)} was cancelled; nothing was written to {code(r.out)}."
        )
    elif view.state == "failed":
        st.error(f"{_about(view)} failed: {md(r.error or 'no reason recorded')}")
        locked = not_yours(view)
        st.button(
            "Resume",
            key=KEY_TRAIN_RESUME,
            icon=":material/replay:",
            on_click=act,
            args=("resume", view.id),
            disabled=not view.resumable or locked,
            help="Start its worker again; the examples already traced come from the cache.",
        )
        action_error()


def _seeded_choices(model: LoadedModel) -> tuple[list[str], dict[str, str]]:
    """The detectors and training sets offered, with the form's widgets seeded."""
    names = train_detector_choices(model)
    try:
        labels = train_dataset_choices()
    except RagscopeError as e:
        st.error(md(e))
        labels = {"demo": "Demo examples (12, hand-written)", "builtin": "Built-in corpus"}
    if st.session_state.get(KEY_TRAIN_DATASET) not in labels:
        st.session_state.pop(KEY_TRAIN_DATASET, None)
    seed_widget(KEY_TRAIN_DETECTORS, list(names))
    seed_widget(
        KEY_TRAIN_DATASET, DEFAULT_TRAIN_DATASET if DEFAULT_TRAIN_DATASET in labels else "demo"
    )
    seed_widget(KEY_TRAIN_LIMIT, TRAIN_LIMIT)
    seed_widget(KEY_TRAIN_CV, 0)
    return names, labels


def _form(model: LoadedModel) -> None:
    """Detectors, training data, limit, the estimate, the equivalent command and Start."""
    names, labels = _seeded_choices(model)
    st.caption(
        "Trains in a background job on this machine, with the loaded model; the artifacts "
        f"go to {code(train_folder(model))} and load here once all are trained."
    )
    detectors = st.multiselect(
        "Detectors", names, key=KEY_TRAIN_DETECTORS, help="Those that can read this model"
    )
    c1, c2, c3 = st.columns([3, 1, 1])
    with c1:
        dataset = st.selectbox(
            "Training data",
            list(labels),
            key=KEY_TRAIN_DATASET,
            format_func=lambda s: labels.get(s, s),
            help="Without CV: split by source into train / validation / test "
            "(70 / 15 / 15); thresholds are picked on validation, metrics reported on "
            "test. With CV: trained on every answer, metrics from K source-grouped folds.",
        )
    with c2:
        limit = int(
            st.number_input(
                "Example limit (0 = all)",
                min_value=0,
                step=50,
                key=KEY_TRAIN_LIMIT,
                help="About this many examples, whole sources kept together.",
            )
        )
    with c3:
        cv = int(
            st.number_input(
                "CV folds (0 = one split)",
                min_value=0,
                max_value=20,
                step=1,
                key=KEY_TRAIN_CV,
                help="K-fold source-grouped cross-validation (`ragscope train --cv K`): "
                "the artifacts learn from every answer, their calibration and thresholds "
                "from cross-fitted scores, and the metrics come with CIs from K folds. "
                "The fitting takes about K + 1 times as long; the tracing is the same.",
            )
        )
    spec = None
    if not detectors:
        st.caption("Pick at least one detector.")
    else:
        try:
            spec = train_spec(detectors, dataset, limit or None, cv or None)
            st.markdown(describe_estimate(train_estimate(model, spec)))
        except RagscopeError as e:
            st.error(f"This job cannot run: {md(e)}")
            spec = None
    if spec is not None:
        st.caption(
            f"The same from a terminal: {code(spec.command(train_folder(model)))} "
            "(identical artifacts)."
        )
    if st.button(
        "Train in the background",
        key=KEY_TRAIN_START,
        type="primary",
        icon=":material/model_training:",
        disabled=spec is None,
    ):
        assert spec is not None
        try:
            start_training(model, spec)
        except RagscopeError as e:
            st.error(f"The job could not start: {md(e)}")
            return
        st.rerun()


def train_detectors_panel(model: LoadedModel, *, home: bool = False) -> None:
    """Training detectors for ``model`` when it has none: the job form (in a lazily
    rendered expander), a queued or running job's live progress, an interrupted job's
    Resume/Discard, and how the last job ended.

    On a detector page (``home=False``) nothing shows once the model has detectors and
    no job is running; on Home the last job's outcome and a "train more" form stay
    while the loaded detectors are ones trained here.
    """
    shipped: DetectorSet = detector_set(model)
    try:
        view = model_job(model)
    except JobRowError as e:
        st.error(f"A training job in the database cannot be read: {md(e)}")
        st.button(
            "Discard it",
            key=KEY_TRAIN_DISCARD,
            on_click=act,
            args=("discard", e.job_id),
        )
        action_error()
        view = None
    except RagscopeError as e:
        st.error(f"Training jobs cannot be read: {md(e)}")
        return
    finished = st.session_state.pop(FINISHED, None)
    if view is not None and view.active:
        with st.container(border=True):
            st.markdown(f"**{TITLE}**")
            _live_job(view.id)
        return
    if view is not None and view.state == "interrupted":
        with st.container(border=True):
            st.markdown(f"**{TITLE}**")
            _interrupted(view)
        return
    trained_here = shipped.name == TRAINED_SET
    if shipped.detectors and not (home and trained_here):
        if view is not None and finished == view.id:
            _outcome(view, fresh=True)
        return
    if view is not None:
        _outcome(view, fresh=finished == view.id)
    label = "Train more detectors for this model" if shipped.detectors else TITLE
    if home and not shipped.detectors:
        st.info(
            "No detectors are trained for this model yet. Train some here: a background "
            "job, with progress on every page.",
            icon=":material/model_training:",
        )
    with st.expander(
        label, key=KEY_TRAIN_OPEN, on_change="rerun", icon=":material/model_training:"
    ) as box:
        if box.open:
            _form(model)
