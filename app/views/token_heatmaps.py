"""Token heatmaps: every detector's reading of one answer, token by token, aligned.

One answer, several rows of cells under the same tokens: the gold spans, CORTEX's
raw token probabilities and their label-persistence smoothing (the ``p_stay`` slider
re-smooths live), every other shipped detector that scores single tokens, the
strongest RAGLens SAE features' activations and the model's own surprisal. A
threshold on one row marks the predicted spans; the page compares them with the gold
spans (overlap F1), steps through them, and can scan a dataset to list only the
answers that get flagged.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import streamlit as st

from app.components.answer_picker import AnswerKeys, pick_page_answer
from app.components.artifacts import show_broken_artifacts
from app.components.exports import plot
from app.components.heatmap_controls import controls, sync_sliders
from app.components.heatmap_rows import build_rows
from app.components.heatmap_scan import flagged_only
from app.components.heatmap_spans import span_readout
from app.components.multirow import multirow_html
from app.components.set_spans import set_spans_section
from app.state.detectors import detector_set
from app.state.heatmaps import (
    CORTEX,
    KEY_HEATMAP_DATASET,
    KEY_HEATMAP_EXAMPLE,
    KEY_HEATMAP_SOURCE,
    AnswerRows,
    read_answer,
)
from app.state.model import get_model
from app.state.session import AppState, app_state
from app.state.spad_views import train_command
from app.text import code, md
from core.base.errors import RagscopeError
from core.signals.smoothing import token_flags

if TYPE_CHECKING:
    from app.components.multirow import HeatRow
    from core.detectors.cortex import CortexDetector

# Page scripts run with Streamlit's magic: a bare string would be drawn, so no
# attribute docstrings here.
ANSWER_KEYS = AnswerKeys(
    source=KEY_HEATMAP_SOURCE, dataset=KEY_HEATMAP_DATASET, example=KEY_HEATMAP_EXAMPLE
)


def loss_curve(cortex: CortexDetector) -> None:
    """The shipped CORTEX's training (and validation) loss per epoch, in an expander."""
    import plotly.graph_objects as go

    info = cortex.train_info_
    train = info.get("loss_curve") or []
    if not train:
        return
    val = info.get("validation_loss_curve") or []
    with st.expander(
        md(
            f"CORTEX training: {info.get('n_tokens', '?')} tokens of "
            f"{info.get('n_token_answers', '?')} answers, "
            f"{info.get('n_positive_tokens', '?')} in gold spans"
        )
    ):
        fig = go.Figure()
        epochs = list(range(1, len(train) + 1))
        fig.add_scatter(x=epochs, y=train, mode="lines+markers", name="training")
        if val:
            fig.add_scatter(x=epochs, y=val, mode="lines+markers", name="validation")
        fig.update_layout(
            title="CORTEX loss per epoch (class-weighted BCE)",
            xaxis_title="epoch",
            yaxis_title="loss",
            height=300,
            margin={"t": 40, "b": 40},
        )
        plot(fig, key="heatmaps.loss")
        st.caption(
            "A validation loss that rises while the training loss falls means the MLP "
            "memorises the training tokens; the spec fixes 10 epochs, the curve shows the cost."
        )


def cortex_caption(a: AnswerRows, cortex: CortexDetector | None) -> None:
    """CORTEX's verdict on the answer, as the detector set gives it."""
    answer = a.verdicts.verdict(CORTEX)
    if cortex is not None and answer is not None:
        # The set's verdict, as the Playground shows it: the probability with the
        # threshold of the same calibration, never re-thresholded here.
        call = "hallucinated" if answer.hallucinated else answer.call
        why = f" ({answer.no_signal})" if answer.no_signal else ""
        thr = f"flagged at {answer.threshold:.3f}: " if answer.threshold is not None else ""
        st.caption(
            f"CORTEX answer probability {answer.score:.3f} (calibrated; from the highest "
            f"token score smoothed with CORTEX's own answer-level p_stay "
            f"{cortex.config.p_stay_answer:.3f}, fixed in training, not the p_stay slider "
            f"above, which smooths the rows below); {thr}"
            f"**{call}**{md(why)}, as the Playground shows."
        )


def answer_section(state: AppState, a: AnswerRows, rows: dict[str, HeatRow]) -> None:
    """The set's spans, the flag row's predicted spans and the answer, row by row."""
    if a.verdicts.answer is not None:
        # The spans the set shows everywhere; the rows below are each detector's own.
        set_spans_section(a.verdicts.answer, a.analysis.example.response)
    flag_values = rows[state.heatmap.flag_row].values if state.heatmap.flag_row in rows else None
    focus = span_readout(state, a, flag_values, a.analysis.signature)
    threshold = state.heatmap.threshold if state.heatmap.threshold is not None else 0.5
    shown = [r for n, r in rows.items() if n not in state.heatmap.hidden]
    st.subheader("The answer, row by row")
    st.html(
        multirow_html(
            a.analysis.layout.response_token_strings(),
            shown,
            flagged=None if flag_values is None else token_flags(flag_values, threshold),
            focus=focus,
            positions=a.analysis.layout.response_positions.tolist(),
        )
    )
    st.caption(
        "Scores run white (0) to red (1); gold cells are blue inside a hallucinated span; "
        "RAGLens rows show each SAE feature's activation relative to its peak in this answer; "
        f"the threshold reads **{md(state.heatmap.flag_row or 'no row')}**."
    )


def main() -> None:
    state = app_state()
    model = get_model()
    links = sync_sliders(state)
    st.title("Token heatmaps")
    st.caption(
        "One answer, every detector's token scores aligned under the same tokens: the gold "
        "spans, CORTEX's raw and smoothed scores, the other detectors that score tokens, "
        "the top RAGLens features and the model's surprisal. Hover a cell for all values "
        "of its token."
    )
    shipped = detector_set(model)
    show_broken_artifacts(shipped, {b.name for b in shipped.broken})
    by_name = {d.name: d for d in shipped.detectors}
    cortex: CortexDetector | None = (
        by_name[CORTEX].detector if CORTEX in by_name else None  # type: ignore[assignment]
    )
    if cortex is not None:
        loss_curve(cortex)
    if cortex is None:
        st.info(
            f"No CORTEX detector is trained for {md(model.info.display_name)} yet; the other "
            f"rows still show. Train it with {code(train_command(CORTEX, shipped.folder))}."
        )
    picked = pick_page_answer(
        state, state.heatmap, ANSWER_KEYS, narrow=flagged_only(state, model, cortex)
    )
    if picked is None:
        return
    example, ids = picked
    try:
        with st.spinner("Tracing the answer (with and without the passages)…"):
            a = read_answer(model, example, ids, shipped)
    except RagscopeError as e:
        st.error(f"This answer could not be analysed: {md(e)}  \nFix: pick another example.")
        return
    st.divider()
    judged_by = shipped.for_example(example)  # its expert for the answer's dataset, if any
    if cortex is not None and judged_by is not shipped and CORTEX in judged_by.names:
        cortex = judged_by.card(CORTEX).detector  # type: ignore[assignment]
    # The sliders' values were synced at the top, so the rows are built once.
    rows = build_rows(a, state.heatmap.p_stay, state.heatmap.smooth_all)
    controls(state, rows, cortex, links)
    cortex_caption(a, cortex)
    answer_section(state, a, rows)


main()
