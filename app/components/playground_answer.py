"""The Playground's answer: written by the model here (streamed) or pasted (prefilled
with a dataset example's own response)."""

from __future__ import annotations

import streamlit as st

from app.components.playground_input import Draft
from app.state.playground import (
    KEY_GENERATE,
    KEY_MAX_TOKENS,
    KEY_PASTED,
    KEY_TEMPERATURE,
    GeneratedAnswer,
)
from app.state.session import AppState, seed_widget
from app.text import md, md_lines
from core.base.errors import RagscopeError
from core.engine.generate import AnswerStream, GenerationConfig
from core.engine.model import LoadedModel


def generate_answer(state: AppState, model: LoadedModel, draft: Draft) -> GeneratedAnswer | None:
    """Controls to let the model write the answer (streamed); the current answer if any."""
    c1, c2, c3 = st.columns([1, 1, 1], vertical_alignment="bottom")
    seed_widget(KEY_MAX_TOKENS, state.max_tokens)
    seed_widget(KEY_TEMPERATURE, state.temperature)
    with c1:
        state.max_tokens = int(
            st.number_input("Max new tokens", 1, 1024, step=16, key=KEY_MAX_TOKENS)
        )
    with c2:
        state.temperature = float(
            st.slider(
                "Temperature",
                0.0,
                1.5,
                step=0.05,
                key=KEY_TEMPERATURE,
                help="0 = greedy (the model's most likely token each step)",
            )
        )
    with c3:
        clicked = st.button("Write the answer", key=KEY_GENERATE, icon=":material/edit_note:")
    if clicked:
        try:
            stream = AnswerStream(
                model,
                task=draft.task,
                question=draft.question,
                passages=draft.passages,
                prompt=draft.prompt,
                config=GenerationConfig(
                    max_new_tokens=state.max_tokens, temperature=state.temperature
                ),
            )
            with st.container(border=True):
                st.write_stream(stream)
            gen = stream.result()
        except (RagscopeError, ValueError) as e:
            st.error(md(e))
            return None
        written = state.generation = GeneratedAnswer(
            for_input=draft.signature,
            text=gen.text,
            token_ids=gen.token_ids,
            stop=gen.stop,
            seconds=gen.seconds,
        )
        state.analysis = None
        st.caption(_generation_note(written))
        return written
    g = state.generation
    if g is None or g.for_input != draft.signature:
        st.info("Press **Write the answer** to let the model answer this question.")
        return None
    with st.container(border=True):
        st.markdown(md_lines(g.text) if g.text.strip() else "*(empty answer)*")
    st.caption(_generation_note(g))
    return g


def _generation_note(g: GeneratedAnswer) -> str:
    why = "end of answer" if g.stop == "eos" else "max tokens reached"
    return f"{len(g.token_ids)} tokens in {g.seconds:.1f} s ({why})."


def paste_answer(state: AppState, draft: Draft) -> str:
    """The paste box, prefilled with the dataset example's own response."""
    if state.prefilled_for != draft.key:
        if draft.example is not None:
            state.pasted = draft.example.response
            st.session_state[KEY_PASTED] = state.pasted
        state.prefilled_for = draft.key
    seed_widget(KEY_PASTED, state.pasted)
    state.pasted = st.text_area(
        "Answer to analyse",
        key=KEY_PASTED,
        height=120,
        placeholder="Paste the answer any model (or person) gave",
    )
    if draft.example is not None and state.pasted != draft.example.response:
        st.caption("Edited answer: the dataset's gold spans no longer apply and are not shown.")
    return state.pasted
