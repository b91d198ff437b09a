"""Review's "Adapt the detectors to this dataset" panel: what the reviews gathered so
far (:func:`core.services.adapting.adapt_status`), the set adapted from them now, and
the background job that adapts it again (:mod:`core.services.jobs`: it goes on across
reruns, reloads and restarts; its progress refreshes itself). Every number comes from
core; this module draws it."""

from __future__ import annotations

from collections.abc import Sequence

import streamlit as st

from app.components.estimate import estimate_caption
from app.components.train_job import act, action_error, job_progress, not_yours
from app.state.datasets import get_store
from app.state.jobs import (
    POLL_S,
    adapt_estimate,
    adapt_spec,
    model_adapt_job,
    read_job,
    start_adapting,
)
from app.state.review import (
    KEY_ADAPT_CANCEL,
    KEY_ADAPT_DISCARD,
    KEY_ADAPT_REFIT,
    KEY_ADAPT_RESUME,
    KEY_ADAPT_START,
)
from app.text import code, md
from core.base.errors import RagscopeError
from core.base.examples import RAGExample
from core.engine.model import LoadedModel
from core.evaluation.adapt import MIN_ADAPT_ANSWERS, MIN_ADAPT_CLASS, PROCEDURE, REFIT_PROCEDURE
from core.pipeline.sets import DetectorSet
from core.services.adapting import AdaptStatus, adapt_status
from core.services.jobs import JobView

TITLE = "Adapt the detectors to this dataset"
WATCHED = "review.adapt.watched"
"""Session key: the adaptation job this session saw end (its outcome is shown once)."""


def _current(status: AdaptStatus) -> None:
    cur = status.current
    if cur is None or cur.adapted is None:
        st.caption(
            f"No set is adapted to {code(status.dataset or '?')} yet: its answers are judged "
            "with the set's pooled calibration and thresholds."
        )
        return
    a = cur.adapted
    text = (
        f"The **{md(cur.name)}** set judges {code(a.dataset)}'s answers: the "
        f"{md(cur.deferred_from or a.base_set)} set adapted from {a.n_reviews} reviewed "
        f"answers ({a.n_random} in the random order) on {md(a.created_at)} "
        f"(reviews {code(a.reviews_hash[:12])}), "
        + ("its ensemble refitted on them." if a.refit else "calibration only, no refit.")
    )
    if status.stale:
        st.info(text + " The reviews changed since: adapt again to use them.")
    else:
        st.success(text, icon=":material/tune:")


@st.fragment(run_every=POLL_S)
def _live(job_id: int) -> None:
    """A running adaptation's progress and Cancel; the page reruns when it ends."""
    try:
        view = read_job(job_id)
    except RagscopeError as e:
        st.error(f"The adaptation job cannot be read: {md(e)}")
        return
    if not view.active:
        st.session_state[WATCHED] = job_id
        st.rerun()
    job_progress(view, KEY_ADAPT_CANCEL, unit="answers")


def _ended(view: JobView) -> None:
    fresh = st.session_state.get(WATCHED) == view.id
    r = view.row
    if view.state == "done" and fresh:
        result = r.result if isinstance(r.result, dict) else {}
        refit = result.get("refit")
        note = f" {md(refit[:1].upper() + refit[1:600])}." if isinstance(refit, str) else ""
        kept = result.get("not_calibrated")
        if isinstance(kept, dict) and kept:
            why = "; ".join(
                f"**{md(str(n))}**: {md(str(w)[:300])}" for n, w in list(kept.items())[:20]
            )
            note += f" Not calibrated for this dataset: {why}."
        st.success(
            f"Adaptation job #{view.id} finished: the adapted set judges this dataset's "
            f"answers now.{note}",
            icon=":material/check_circle:",
        )
    elif view.state == "cancelled" and fresh:
        st.info(f"Adaptation job #{view.id} was cancelled; nothing was written.")
    elif view.state == "failed":
        st.error(f"Adaptation job #{view.id} failed: {md(r.error or 'no reason recorded')}")
    elif view.state == "interrupted":
        st.warning(
            f"Adaptation job #{view.id} was interrupted at {md(view.progress_text)}: resume "
            "it (the answers already traced come from the feature cache) or discard it."
        )
        locked = not_yours(view)
        c1, c2, _ = st.columns([1, 1, 3])
        c1.button(
            "Resume", key=KEY_ADAPT_RESUME, icon=":material/play_arrow:", on_click=act,
            args=("resume", view.id), disabled=not view.resumable or locked,
        )  # fmt: skip
        c2.button(
            "Discard", key=KEY_ADAPT_DISCARD, icon=":material/delete:", on_click=act,
            args=("discard", view.id), disabled=locked,
        )  # fmt: skip
        action_error()


def adapt_panel(
    model: LoadedModel,
    dset: DetectorSet,
    *,
    queue: str,
    dataset_spec: str | None,
    examples: Sequence[RAGExample],
) -> None:
    """The panel: the reviews gathered, the adapted set, the job (``dataset_spec``: the
    dataset's name for a job; ``None`` when it has none, e.g. a file)."""
    st.subheader(TITLE)
    try:
        status = adapt_status(get_store(), dset, queue, examples)
    except RagscopeError as e:
        st.error(f"The reviews of this dataset cannot be read: {md(e)}")
        return
    st.caption(
        f"From the answers marked in the **random** order: {md(PROCEDURE)}. The adapted set "
        "is written beside the base set (which is never changed) and judges this dataset's "
        "answers on every page, in `ragscope judge` and `evaluate --as-trained`."
    )
    c1, c2, c3 = st.columns(3)
    c1.metric("Hallucinated, drawn at random", status.n_random_hallucinated)
    c2.metric("Faithful, drawn at random", status.n_random_faithful)
    c3.metric("Answers labelled (any order)", status.n_labelled)
    if status.problem is not None:
        st.warning(md(status.problem))
        return
    _current(status)
    view = None
    try:
        view = model_adapt_job(model)
    except RagscopeError as e:
        st.error(f"The adaptation job cannot be read: {md(e)}")
    if view is not None and view.active:
        _live(view.id)
        return
    if view is not None:
        _ended(view)
    if status.missing is not None:
        st.caption(
            f"Not yet: {md(status.missing)} (at least {MIN_ADAPT_ANSWERS} with "
            f"{MIN_ADAPT_CLASS} of each class)."
        )
    if dataset_spec is None:
        st.caption("Only a named dataset (built-in, shared or imported) can be adapted here.")
        return
    judging = status.judging
    has_ensemble = judging is not None and any(c.detector.composite for c in judging.detectors)
    refit = st.toggle(
        "Also refit the ensemble's stacker on the reviewed answers",
        value=has_ensemble,
        key=KEY_ADAPT_REFIT,
        disabled=not has_ensemble,
        help=md(REFIT_PROCEDURE) + ". The members are not refitted.",
    )
    slot = st.empty()
    if status.missing is None and judging is not None:
        # the job judges every labelled answer (features from the cache where there)
        estimate_caption(
            lambda: adapt_estimate(model, status.reviewed, judging.fitted),
            extra="the worker's start and the model's load",
            where=slot,
        )
    if st.button(
        "Adapt in the background", key=KEY_ADAPT_START, type="primary", icon=":material/tune:",
        disabled=status.missing is not None,
    ):  # fmt: skip
        try:
            start_adapting(model, adapt_spec(dataset_spec, queue, refit=refit))
        except RagscopeError as e:
            st.error(f"The adaptation could not start: {md(e)}")
            return
        st.rerun()
