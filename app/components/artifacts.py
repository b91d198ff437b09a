"""Shipped detector artifacts on the pages: load errors with their fix, and the quick
spad fit that stands in (SHAP summary, Token sources) while none is trained.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import TYPE_CHECKING

import streamlit as st

from app.components.answer_picker import AnswerKeys, pick_page_answer
from app.components.estimate import progress_bar
from app.state.detectors import DetectorSet, detector_set
from app.state.heads import AnswerChoice
from app.state.model import get_model
from app.state.session import AppState, app_state
from app.state.spad_views import fit_quick_spad, train_command
from app.text import code, md
from core.base.errors import RagscopeError

if TYPE_CHECKING:
    from core.base.examples import RAGExample
    from core.engine.model import LoadedModel

QUICK_FIT_MIN_EXAMPLES = 4  # fewer labelled examples cannot give two of each class


def show_broken_artifacts(shipped: DetectorSet, names: Collection[str]) -> None:
    """An error, with the command that remakes it, per artifact of ``names`` that failed to load."""
    for b in shipped.broken:
        if b.name in names:
            st.error(
                f"The **{md(b.name)}** artifact in {code(b.folder)} could not be loaded: "
                f"{md(b.reason)}  \nFix: retrain it with "
                f"{code(train_command(b.name, shipped.folder))}, or remove the folder."
            )


def open_answer_page(
    title: str, caption: str, choice: Callable[[AppState], AnswerChoice], keys: AnswerKeys
) -> tuple[AppState, LoadedModel, DetectorSet, RAGExample] | None:
    """The opening of a page that works on one answer with the shipped detectors: title,
    caption, notices of broken artifacts, the answer picker (:func:`pick_page_answer`).

    Returns:
        ``(state, model, the set that judges the answer (its expert, if any), answer)``; ``None`` while no answer is picked.
    """
    state = app_state()
    model = get_model()
    st.title(title)
    st.caption(caption)
    shipped = detector_set(model)
    show_broken_artifacts(shipped, {b.name for b in shipped.broken})
    picked = pick_page_answer(state, choice(state), keys)
    if picked is None:
        return None
    return state, model, shipped.for_example(picked[0]), picked[0]


def quick_fit_row(
    state: AppState,
    model: LoadedModel,
    train: Sequence[RAGExample],
    *,
    split: str,
    dataset_label: str,
    note: str,
    key: str,
) -> None:
    """``note`` beside a "Quick fit" button that fits spad on ``train`` with progress.

    The fit goes to ``state.spad_quick``; a failure is shown as an error.

    Args:
        state: The session's state.
        model: The loaded model.
        train: The labelled examples to fit on.
        split: The split they came from (recorded with the fit).
        dataset_label: Their dataset, as the page names it.
        note: What the fit will read (markdown).
        key: The button's widget key.
    """
    c_note, c_button = st.columns([4, 1], vertical_alignment="center")
    with c_note:
        st.caption(note)
    with c_button:
        fit = st.button(
            "Quick fit",
            key=key,
            icon=":material/bolt:",
            disabled=len(train) < QUICK_FIT_MIN_EXAMPLES,
            width="stretch",
        )
    if not fit:
        return
    with progress_bar("Quick fit: spad features,") as progress:
        try:
            state.spad_quick = fit_quick_spad(
                model, train, dataset_label=dataset_label, split=split, progress=progress
            )
        except RagscopeError as e:
            st.error(f"The quick fit failed: {md(e)}")
