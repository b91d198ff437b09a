"""One answer to look at, for the pages that show one (Token heatmaps, Counterfactual
context, Mitigation, Heads & layers, Token sources, GAM shape functions).

- :func:`pick_answer_source`, :func:`show_playground_answer` and :func:`pick_example`:
  one answer to look at, the Playground's analysed answer or an example of a dataset;
  :func:`pick_page_answer` puts them together for the one-answer pages (Token
  heatmaps, Counterfactual context, Mitigation).
- :func:`open_answer_in`, :func:`open_in_token_heatmaps` and
  :func:`open_in_counterfactual`: the click-through to a one-answer page.

Each page passes its own widget keys (the ``KEY_*`` constants of :mod:`app.state`) and
keeps its choices in its own fields of the session's :class:`~app.state.AppState`; the
dataset pickers these share are in :mod:`app.components.example_picker`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import streamlit as st

from app.components.example_picker import dataset_labels, first_words, pick_page_dataset
from app.state.analysis import Analysis
from app.state.counterfactual import KEY_CF_DATASET, KEY_CF_EXAMPLE, KEY_CF_SOURCE
from app.state.heads import (
    HEADS_EXAMPLE_DATASET,
    HEADS_EXAMPLE_PLAYGROUND,
    HEADS_FROM_HOME,
    AnswerChoice,
    heads_examples,
)
from app.state.heatmaps import KEY_HEATMAP_DATASET, KEY_HEATMAP_EXAMPLE, KEY_HEATMAP_SOURCE
from app.state.links import (
    P_ANSWER,
    P_DATASET,
    P_EXAMPLE,
    P_INPUT,
    Followed,
    bind,
    example_input,
    follow,
    input_problem,
    linked,
    one_of,
    own_example,
    parse_input,
    publish,
)
from app.state.session import AppState, seed_widget
from app.text import code, md
from core.base.errors import RagscopeError

if TYPE_CHECKING:
    from core.base.examples import RAGExample


# --------------------------------------------------------------------------- one answer


def pick_answer_source(
    current: str | None, options: Sequence[str], *, key: str, dataset_name: str
) -> str:
    """The "Answer" radio (shown when there are two ``options``); returns the choice.

    Args:
        current: The page's last choice (``None``: the first option).
        options: :data:`HEADS_EXAMPLE_PLAYGROUND` and/or :data:`HEADS_EXAMPLE_DATASET`.
        key: The radio's widget key.
        dataset_name: How the dataset option is named.
    """
    assert options, "no answer to pick from"
    link = follow(P_ANSWER, one_of(options))
    if link == Followed() and HEADS_EXAMPLE_DATASET in options and linked(P_EXAMPLE):
        link = Followed(value=HEADS_EXAMPLE_DATASET)  # a link to an example of a dataset
    if link.value is not None:
        current = link.value
        st.session_state[key] = current
    if current is None or current not in options:
        current = options[0]
        st.session_state.pop(key, None)
    if len(options) > 1:
        seed_widget(key, current)
        names = {
            HEADS_EXAMPLE_PLAYGROUND: "The Playground's analysed answer",
            HEADS_EXAMPLE_DATASET: md(dataset_name),  # radio options render Markdown
        }
        current = st.radio(
            "Answer", options, key=key, format_func=names.__getitem__, horizontal=True
        )
    publish(
        P_ANSWER,
        current,
        default=HEADS_EXAMPLE_DATASET,
        missing=link.missing,
        what="answer",
        where="here: this session has analysed no answer in the Playground"
        if link.missing == HEADS_EXAMPLE_PLAYGROUND
        else f"{HEADS_EXAMPLE_PLAYGROUND} or {HEADS_EXAMPLE_DATASET}",
        instead="an example of a dataset",
    )
    return current


def playground_answer(state: AppState) -> RAGExample | None:
    """The answer a page's "Playground" option shows: the one a freshly opened link's
    ``input`` carries (kept in the session until the Playground analyses another), else
    the Playground's analysed answer; ``None`` when there is neither. A link's input that
    cannot be read is said on the page (by :func:`publish_playground_answer`)."""
    carried = follow(P_INPUT, parse_input)
    if carried.missing is not None:
        st.warning(
            f"The link's answer cannot be read ({md(input_problem(carried.missing))}); "
            "showing another answer instead."
        )
    if carried.value is not None:
        try:
            state.linked_answer = own_example(carried.value)
        except RagscopeError as e:
            st.warning(f"The link's answer cannot be read: {md(e)}")
    if state.linked_answer is not None:
        return state.linked_answer
    return state.analysis.example if state.analysis is not None else None


def publish_playground_answer(
    state: AppState, *, pool: Sequence[RAGExample] | None = None
) -> tuple[RAGExample, tuple[int, ...] | None]:
    """Name the "Playground" answer (:func:`playground_answer`, which must be there) and
    put it in the page's URL, so a copied link reopens this view in a fresh browser;
    returns it with its token ids when the model wrote it.

    A dataset's own answer, unchanged, is linked as that dataset's example (``dataset``
    and ``example``: its id and gold labels travel); any other answer as ``input``. A page
    whose ``dataset`` parameter names something else (Heads' statistics) passes that
    dataset's examples as ``pool``: the answer is linked as an example only when it is
    one of them.
    """
    ex = playground_answer(state)
    assert ex is not None, "no Playground answer"
    a = state.analysis if state.linked_answer is None else None
    if a is not None and a.dataset is not None:
        in_pool = pool is None or any(e.id == ex.id and e.response == ex.response for e in pool)
        if in_pool:  # a fresh session opens it as "an example of a dataset"
            publish(P_ANSWER, HEADS_EXAMPLE_DATASET, default=HEADS_EXAMPLE_DATASET)
            if pool is None:
                publish(P_DATASET, a.dataset)
            publish(P_EXAMPLE, ex.id)
            publish(P_INPUT, None)
            return ex, show_playground_answer(a)
    if pool is None:
        publish(P_DATASET, None)  # the view shows no dataset's example
    publish(P_EXAMPLE, None)
    if state.linked_answer is not None:
        st.caption(
            f"The answer the link carries (written in the Playground): "
            f"“{md(first_words(ex.response, 14))}”"
        )
        ids = None
    else:
        assert state.analysis is not None
        ids = show_playground_answer(state.analysis)
    shown = example_input(ex)
    publish(P_INPUT, shown, what="Playground answer", where="readable")
    if shown is None:
        st.caption("This answer cannot travel in a link (too long, or a verbatim prompt).")
    return ex, ids


def show_playground_answer(analysis: Analysis) -> tuple[int, ...] | None:
    """Name the Playground's analysed answer; returns its token ids when the model wrote it.

    A generated answer is analysed with the model's own tokens (no re-tokenizing).
    """
    ids = (
        tuple(int(i) for i in analysis.layout.response_ids)
        if analysis.answer_source == "generated"
        else None
    )
    st.caption(
        f"Example {code(analysis.example.id)}, answer {md(analysis.answer_source)}: "
        f"“{md(first_words(analysis.example.response, 14))}”"
    )
    return ids


def pick_example(
    examples: Sequence[RAGExample],
    remembered: str | None,
    *,
    key: str,
    dataset_label: str = "this dataset",
) -> RAGExample:
    """The "Example" select box over ``examples`` (not empty), its id in the URL.

    Starts from the example an opened link names, else from ``remembered`` when it is one
    of them, else from the first example with a gold span (else the first). A link's
    example that is not among them is reported (in ``dataset_label``).
    """
    by_id = {e.id: e for e in examples}
    if remembered not in by_id:
        remembered = next((e.id for e in examples if e.spans), examples[0].id)
    if st.session_state.get(key) not in by_id:
        st.session_state.pop(key, None)

    def label(ex_id: str) -> str:
        ex = by_id[ex_id]
        gold = {True: " · hallucinated", False: " · faithful", None: ""}[ex.label]
        return f"{ex_id} — {first_words(ex.question or ex.response)}{gold}"

    ex_id = bind(
        P_EXAMPLE,
        key,
        lambda: st.selectbox("Example", list(by_id), key=key, format_func=label),
        parse=one_of(by_id),
        seed=remembered,
        what="example",
        where=f"in {md(dataset_label)}",
        instead=code,
    )
    return by_id[ex_id]


# --------------------------------------------------------------------------- one page's answer


@dataclass(frozen=True, kw_only=True)
class AnswerKeys:
    """The widget keys of :func:`pick_page_answer`.

    Attributes:
        source: The "Answer" radio (Playground's answer or a dataset example).
        dataset: The "Dataset" select box.
        example: The "Example" select box.
    """

    source: str
    dataset: str
    example: str


Narrow = Callable[[str, list["RAGExample"]], "list[RAGExample] | None"]
"""``(dataset key, examples) -> the examples to offer`` (``None``: stop, a notice was shown)."""


def pick_page_answer(
    state: AppState, choice: AnswerChoice, keys: AnswerKeys, *, narrow: Narrow | None = None
) -> tuple[RAGExample, tuple[int, ...] | None] | None:
    """One answer for a page: the Playground's analysed answer, or an example of the Home
    dataset or of the built-in corpus.

    The page's choices live in its :class:`~app.state.heads.AnswerChoice` (``choice``):
    the source, the dataset and the example per dataset key.

    Args:
        state: The session's state.
        choice: The page's answer choice (``state.heatmap``, ``state.cf``, ``state.mit``).
        keys: Its widget keys.
        narrow: Drawn under the dataset choice; may shorten the example list.

    Returns:
        ``(example, response ids)`` (ids when the model wrote the Playground's answer),
        or ``None`` when there is nothing to pick (a notice is shown).
    """
    there = playground_answer(state) is not None
    options = ([HEADS_EXAMPLE_PLAYGROUND] if there else []) + [HEADS_EXAMPLE_DATASET]
    source = pick_answer_source(
        choice.example_source,
        options,
        key=keys.source,
        dataset_name="An example from a dataset",
    )
    choice.example_source = source
    if source == HEADS_EXAMPLE_PLAYGROUND and there:
        return publish_playground_answer(state)
    publish(P_INPUT, None)
    if choice.dataset not in dataset_labels(state.dataset):
        choice.dataset = HEADS_FROM_HOME
    c1, c2 = st.columns([2, 3], vertical_alignment="bottom")
    picked = pick_page_dataset(state, keys.dataset, c1, seed=choice.dataset)
    choice.dataset = picked
    labels = dataset_labels(state.dataset)
    try:
        key, label, examples = heads_examples(picked, state.dataset)
    except RagscopeError as e:
        st.error(f"{md(labels[picked])} cannot be read: {md(e)}")
        return None
    if not examples:
        st.info("This dataset holds no examples; pick another one.")
        return None
    if narrow is not None:
        narrowed = narrow(key, examples)
        if narrowed is None:
            return None
        examples = narrowed
    remembered: dict[str, str] = choice.example_id
    with c2:
        ex = pick_example(examples, remembered.get(key), key=keys.example, dataset_label=label)
    remembered[key] = ex.id
    st.caption(f"From {md(label)}. Answer: \u201c{md(first_words(ex.response, 40))}\u201d")
    return ex, None


TOKEN_HEATMAPS_PAGE = "views/token_heatmaps.py"
COUNTERFACTUAL_PAGE = "views/counterfactual.py"


def open_answer_in(
    state: AppState,
    choice: AnswerChoice,
    keys: AnswerKeys,
    page: str,
    *,
    dataset: str | None = None,
    example_id: str | None = None,
) -> None:
    """Switch to a one-answer page (its ``choice``: ``state.heatmap``, ``state.cf``, ``state.mit``) showing an
    example of ``dataset`` (:data:`HEADS_FROM_HOME` or :data:`HEADS_FROM_CORPUS`), or the
    Playground's answer when no dataset is given: the click-through of the pages that
    list or teach with answers."""
    if dataset is None:
        choice.example_source = HEADS_EXAMPLE_PLAYGROUND
        st.session_state[keys.source] = HEADS_EXAMPLE_PLAYGROUND
    else:
        assert example_id is not None, "an example of a dataset needs its id"
        key = heads_examples(dataset, state.dataset)[0]
        choice.example_source = HEADS_EXAMPLE_DATASET
        choice.dataset = dataset
        choice.example_id[key] = example_id
        st.session_state[keys.source] = HEADS_EXAMPLE_DATASET
        st.session_state[keys.dataset] = dataset
        st.session_state[keys.example] = example_id
    st.switch_page(page)


def open_in_token_heatmaps(state: AppState, dataset: str, example_id: str) -> None:
    """Token heatmaps on ``example_id`` of ``dataset`` (the Agreement page's click-through)."""
    state.heatmap.only_flagged = False
    keys = AnswerKeys(
        source=KEY_HEATMAP_SOURCE, dataset=KEY_HEATMAP_DATASET, example=KEY_HEATMAP_EXAMPLE
    )
    open_answer_in(
        state, state.heatmap, keys, TOKEN_HEATMAPS_PAGE, dataset=dataset, example_id=example_id
    )


def open_in_counterfactual(
    state: AppState, *, dataset: str | None = None, example_id: str | None = None
) -> None:
    """Counterfactual context on an example (or the Playground's answer)."""
    keys = AnswerKeys(source=KEY_CF_SOURCE, dataset=KEY_CF_DATASET, example=KEY_CF_EXAMPLE)
    open_answer_in(
        state, state.cf, keys, COUNTERFACTUAL_PAGE, dataset=dataset, example_id=example_id
    )
