"""Playground: pick or write a RAG example, get an answer, and read it token by token.

The answer is either written by the model here (streamed) or pasted. "Analyse" runs
one forward pass over prompt + answer and shows each answer token's surprisal (bits)
as a heatmap with the gold hallucination spans underlined, the prompt's segment strip,
and the full token table.

The detectors shipped for the loaded model (``assets/detectors``, or
``RAGSCOPE_DETECTORS_DIR``) judge the same answer from one shared trace: a verdict
table, and their token scores as an alternative colouring of the heatmap. "Analyse"
traces the answer ONCE for the surprisal and every detector and shows each verdict as
soon as its detector is done (:func:`app.state.stream_verdicts`); a display control
afterwards recomputes nothing.
"""

from __future__ import annotations

from dataclasses import replace

import streamlit as st

from app.components.playground_answer import generate_answer, paste_answer
from app.components.playground_input import (
    fill_own_input,
    own_input,
    pick_example,
    publish_own_input,
)
from app.components.playground_tokens import show_analysis
from app.components.playground_verdicts import (
    analyse_estimate,
    analyse_streamed,
    run_detectors,
    warming_note,
)
from app.state.analysis import input_signature
from app.state.detectors import detector_set
from app.state.links import (
    P_DATASET,
    P_EXAMPLE,
    P_INPUT,
    dataset_spec,
    follow,
    linked,
    parse_input,
    publish,
)
from app.state.model import get_model
from app.state.playground import (
    ANSWER_GENERATE,
    ANSWER_SOURCES,
    INPUT_DATASET,
    INPUT_MODES,
    KEY_ANALYSE,
    KEY_ANSWER_SOURCE,
    KEY_INPUT_MODE,
)
from app.state.session import app_state, seed_widget
from app.state.verdicts import warm_detectors
from app.text import md
from core.base.errors import DataError, RagscopeError
from core.base.examples import RAGExample


def main() -> None:
    state = app_state()
    model = get_model()
    st.title("Playground")
    st.caption(
        "Pick an example (the dataset is chosen on Home) or write your own, give an answer, "
        "and see how the model reads it."
    )

    own_link = follow(P_INPUT, parse_input)
    if own_link.value is not None:  # a link to an input written here: reopen its analysis
        fill_own_input(state, own_link.value)
    elif linked(P_DATASET) or linked(P_EXAMPLE):  # a link to an example of a dataset
        state.input_mode = st.session_state[KEY_INPUT_MODE] = INPUT_DATASET
    seed_widget(KEY_INPUT_MODE, state.input_mode)
    state.input_mode = st.radio("Input", INPUT_MODES, key=KEY_INPUT_MODE, horizontal=True)
    if state.input_mode != INPUT_DATASET:  # the view shows no dataset's example
        publish(P_DATASET, None)
        publish(P_EXAMPLE, None)
    draft = pick_example(state) if state.input_mode == INPUT_DATASET else own_input(state)
    if draft is None:
        publish_own_input(state, None, own_link.missing)
        return

    st.divider()
    seed_widget(KEY_ANSWER_SOURCE, state.answer_source)
    state.answer_source = st.radio("Answer", ANSWER_SOURCES, key=KEY_ANSWER_SOURCE, horizontal=True)
    response_ids: tuple[int, ...] | None = None
    if state.answer_source == ANSWER_GENERATE:
        gen = generate_answer(state, model, draft)
        answer = gen.text if gen is not None else None
        response_ids = gen.token_ids if gen is not None else None
        answer_source = "generated"
    else:
        answer = paste_answer(state, draft)
        same = draft.example is not None and answer == draft.example.response
        answer_source = "dataset" if same else "pasted"

    # The current input's signature tells whether a shown analysis is stale.
    current: RAGExample | None = None
    if answer is not None:
        try:
            current = draft.with_answer(answer)
        except DataError:
            current = None
    signature = input_signature(current, response_ids) if current is not None else None

    clicked = st.button("Analyse", key=KEY_ANALYSE, type="primary", icon=":material/troubleshoot:")
    if not clicked and (state.analysis is None or state.analysis.signature != signature):
        analyse_estimate(model, current)
    warming_note(warm_detectors(model, detector_set(model)))
    if clicked or own_link.value is not None:
        try:
            if answer is None:
                raise DataError("there is no answer yet: let the model write one, or paste one")
            state.linked_answer = None  # pages show this analysis from now on
            analysed = analyse_streamed(
                model,
                draft.with_answer(answer),
                response_ids=response_ids,
                answer_source=answer_source,
            )
            own = answer_source == "dataset"  # the Home dataset's own answer, unchanged
            state.analysis = replace(analysed, dataset=dataset_spec(state.dataset) if own else None)
        except RagscopeError as e:
            state.analysis = None
            st.error(md(e))
    publish_own_input(state, signature, own_link.missing)
    if state.analysis is not None:
        st.divider()
        panel = run_detectors(model, state.analysis)
        show_analysis(state.analysis, signature, panel, state)


main()
