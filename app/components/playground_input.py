"""The Playground's input: a dataset example (picked, and shown with its passages and
gold spans) or the user's own task, question and passages, and the URL parameter that
reopens an analysed own input."""

from __future__ import annotations

from dataclasses import dataclass

import streamlit as st

from app.state.datasets import load_examples
from app.state.links import (
    HOME_DATASETS_HERE,
    OWN_ID,
    P_DATASET,
    P_EXAMPLE,
    P_INPUT,
    OwnInput,
    bind,
    dataset_spec,
    follow_home_dataset,
    input_id,
    input_problem,
    one_of,
    publish,
)
from app.state.playground import (
    ANSWER_PASTE,
    INPUT_OWN,
    KEY_ADD_PASSAGE,
    KEY_ANSWER_SOURCE,
    KEY_EXAMPLE,
    KEY_INPUT_MODE,
    KEY_OWN_QUESTION,
    KEY_OWN_TASK,
    KEY_PASTED,
    passage_key,
    question_signature,
    remove_passage_key,
)
from app.state.session import AppState, seed_widget
from app.text import md
from core.base.errors import RagscopeError
from core.base.examples import TASKS, RAGExample


@dataclass(frozen=True, kw_only=True)
class Draft:
    """The question side of the input (everything but the answer).

    Attributes:
        key: Identifies the input for prefilling (dataset + example id, or ``own``).
        task: The task.
        question: The question (``None`` when there is none).
        passages: The passages.
        prompt: A dataset example's verbatim prompt, if it carries one.
        example: The dataset example (with its own response and gold labels).
    """

    key: str
    task: str
    question: str | None
    passages: tuple[str, ...]
    prompt: str | None = None
    example: RAGExample | None = None

    @property
    def signature(self) -> str:
        return question_signature(self.task, self.question, self.passages, self.prompt)

    def with_answer(self, answer: str) -> RAGExample:
        """The example to analyse; gold labels are kept only for the dataset's own answer.

        Raises:
            DataError: The answer is empty, or the own example is incomplete.
        """
        if self.example is not None:
            if answer == self.example.response:
                return self.example
            return self.example.with_response(answer)
        return RAGExample(
            id=OWN_ID,
            task=self.task,  # type: ignore[arg-type]
            question=self.question,
            passages=self.passages,
            response=answer,
        )


def _first_words(text: str | None, n: int = 9) -> str:
    words = (text or "").split()
    return " ".join(words[:n]) + (" …" if len(words) > n else "")


def pick_example(state: AppState) -> Draft | None:
    """The dataset example selectbox and the example's question, passages and labels."""
    link = follow_home_dataset()
    ref = state.dataset
    publish(
        P_DATASET,
        dataset_spec(ref),
        missing=link.missing,
        what="dataset",
        where=HOME_DATASETS_HERE,
        instead=f"the dataset picked on Home, {md(ref.label)}",
    )
    try:
        examples = load_examples(ref)
    except RagscopeError as e:
        st.error(md(e))
        return None
    if not examples:
        st.warning(f"{md(ref.label)} holds no examples; pick another dataset on Home.")
        return None
    by_id = {e.id: e for e in examples}
    remembered = state.example_id.get(ref.key)
    if st.session_state.get(KEY_EXAMPLE) not in by_id:
        st.session_state.pop(KEY_EXAMPLE, None)

    def label(ex_id: str) -> str:
        ex = by_id[ex_id]
        gold = {True: " · hallucinated", False: " · faithful", None: ""}[ex.label]
        return f"{ex_id} — {_first_words(ex.question or ex.response)}{gold}"

    ex_id = bind(
        P_EXAMPLE,
        KEY_EXAMPLE,
        lambda: st.selectbox(
            f"Example from {md(ref.label)}", list(by_id), key=KEY_EXAMPLE, format_func=label
        ),
        parse=one_of(by_id),
        seed=remembered if remembered in by_id else examples[0].id,
        what="example",
        where=f"in {md(ref.label)}",
    )
    state.example_id[ref.key] = ex_id
    ex = by_id[ex_id]
    show_example(ex)
    return Draft(
        key=f"{ref.key}/{ex.id}",
        task=ex.task,
        question=ex.question,
        passages=ex.passages,
        prompt=ex.prompt,
        example=ex,
    )


def show_example(ex: RAGExample) -> None:
    """The example's question, passages and gold labels, compactly."""
    meta = [f"task **{ex.task}**"]
    if ex.label is not None:
        meta.append("gold: **hallucinated**" if ex.label else "gold: **faithful**")
    if ex.spans:
        meta.append(f"{len(ex.spans)} gold span{'s' if len(ex.spans) > 1 else ''}")
    if ex.provenance.generator:
        meta.append(f"answer by {md(ex.provenance.generator)}")
    st.caption(" · ".join(meta))
    if ex.question:
        st.markdown(f"**Question:** {md(ex.question)}")
    with st.expander(f"Passages ({len(ex.passages)})", expanded=len(ex.passages) <= 2):
        for k, p in enumerate(ex.passages):
            st.markdown(f"**Passage {k + 1}**")
            st.text(p)
    if ex.spans:
        with st.expander("Gold hallucination spans"):
            for s in ex.spans:
                kind = f" ({md(s.type)})" if s.type else ""
                note = f" — {md(s.note)}" if s.note else ""
                st.markdown(f"- “{md(ex.response[s.start : s.end])}”{kind}{note}")


def fill_own_input(state: AppState, x: OwnInput) -> None:
    """Put a link's own input into the Playground's widgets: task, question, passages
    and the pasted answer (the passages written before are replaced)."""
    state.input_mode = st.session_state[KEY_INPUT_MODE] = INPUT_OWN
    state.own_task = st.session_state[KEY_OWN_TASK] = x.task
    state.own_question = st.session_state[KEY_OWN_QUESTION] = x.question
    for pid in state.own_passages:
        st.session_state.pop(passage_key(pid), None)
    first = state.next_passage_id
    state.own_passages = {first + k: p for k, p in enumerate(x.passages)}
    state.next_passage_id = first + len(x.passages)
    for pid, text in state.own_passages.items():
        st.session_state[passage_key(pid)] = text
    state.answer_source = st.session_state[KEY_ANSWER_SOURCE] = ANSWER_PASTE
    state.pasted = st.session_state[KEY_PASTED] = x.answer
    state.prefilled_for = "own"


def publish_own_input(state: AppState, signature: str | None, missing: str | None) -> None:
    """The analysed own input into the URL (``input``), so a copied link reopens the same
    analysis; dropped when the view shows no analysis of the current own input."""
    a = state.analysis
    shown = None
    too_long = False
    if (
        state.input_mode == INPUT_OWN
        and a is not None
        and a.example.id == OWN_ID
        and a.signature == signature
    ):
        ex = a.example
        shown = input_id(
            OwnInput(
                task=ex.task, question=ex.question or "", passages=ex.passages, answer=ex.response
            )
        )
        too_long = shown is None
    problem = input_problem(missing) if missing is not None else None
    publish(
        P_INPUT,
        shown,
        missing=missing,
        what="Playground input",
        where=f"readable ({problem}; links to an input are made by this page)"
        if problem
        else "readable (links to an input are made by this page)",
        instead="the input below" if state.input_mode == INPUT_OWN else "a dataset example",
    )
    if too_long:
        st.caption("This input is too long to travel in a link; the page's URL does not reopen it.")


def own_input(state: AppState) -> Draft:
    """The user's own task, question and passages (add/remove passages)."""
    seed_widget(KEY_OWN_TASK, state.own_task)
    seed_widget(KEY_OWN_QUESTION, state.own_question)
    c1, c2 = st.columns([1, 4])
    with c1:
        state.own_task = st.selectbox("Task", TASKS, key=KEY_OWN_TASK)
    with c2:
        state.own_question = st.text_input(
            "Question", key=KEY_OWN_QUESTION, placeholder="What do you want to ask?"
        )
    only_one = len(state.own_passages) == 1
    for k, pid in enumerate(list(state.own_passages)):
        seed_widget(passage_key(pid), state.own_passages[pid])
        c_text, c_remove = st.columns([20, 1], vertical_alignment="center")
        with c_text:
            state.own_passages[pid] = st.text_area(
                f"Passage {k + 1}",
                key=passage_key(pid),
                height=100,
                placeholder="A retrieved passage the answer should rely on",
            )
        with c_remove:
            st.button(
                "",
                icon=":material/delete:",
                key=remove_passage_key(pid),
                help="Remove this passage",
                disabled=only_one,
                on_click=state.remove_passage,
                args=(pid,),
            )
    st.button(
        "Add a passage", icon=":material/add:", key=KEY_ADD_PASSAGE, on_click=state.add_passage
    )
    question = state.own_question.strip() or None
    passages = tuple(p for p in state.own_passages.values() if p.strip())
    return Draft(key="own", task=state.own_task, question=question, passages=passages)
