"""Example pickers the analysis pages share (Heads & layers, SHAP summary, Token sources,
Feature explanations).

- :func:`pick_examples`: the "Examples" dataset (Home's or the built-in labelled
  corpus), its "Split" and "At most", remembered in an :class:`~app.state.heads.ExampleSelection`.
- :func:`pick_page_dataset`: a page's "Dataset" select box, its dataset in the URL.
- :func:`compute_row` and :func:`show_request_failures`: the
  picked examples' features, extracted with progress, and the examples that failed.

One answer to look at (the Playground's or an example of a dataset) is picked with
:mod:`app.components.answer_picker`. Each page passes its own widget keys (the ``KEY_*``
constants of :mod:`app.state`) and keeps its choices in its own fields of the session's
:class:`~app.state.AppState`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import streamlit as st

from app.components.estimate import estimate_caption, progress_bar
from app.state.datasets import DatasetRef
from app.state.estimates import paced_extraction, work_estimate
from app.state.heads import (
    ALL_SPLITS,
    HEADS_FROM_CORPUS,
    HEADS_FROM_HOME,
    ExampleSelection,
    FeatureRequest,
    example_splits,
    extract_request,
    heads_examples,
    stats_examples,
)
from app.state.links import (
    DATASETS_HERE,
    P_DATASET,
    P_LIMIT,
    P_SPLIT,
    Followed,
    bind,
    follow_widget,
    integer,
    one_of,
    page_dataset,
    page_dataset_spec,
    publish,
)
from app.state.session import AppState, app_state, seed_widget
from app.text import md
from core.base.errors import RagscopeError
from core.base.words import plural
from core.detectors import make_detector

if TYPE_CHECKING:
    from streamlit.delta_generator import DeltaGenerator

    from core.base.examples import RAGExample
    from core.engine.model import LoadedModel

SPLIT_LABELS = {ALL_SPLITS: "all splits"}


def split_label(split: str | None) -> str:
    """How a split choice is named on the page (``None``: every split)."""
    return SPLIT_LABELS.get(split or ALL_SPLITS, split or ALL_SPLITS)


def first_words(text: str | None, n: int = 9) -> str:
    """The first ``n`` words of ``text``, with an ellipsis when there are more."""
    words = (text or "").split()
    return " ".join(words[:n]) + (" …" if len(words) > n else "")


def dataset_labels(home: DatasetRef) -> dict[str, str]:
    """The dataset choices (:data:`HEADS_FROM_HOME`, :data:`HEADS_FROM_CORPUS`) by label."""
    return {
        HEADS_FROM_HOME: f"The Home dataset ({home.label})",
        HEADS_FROM_CORPUS: "Built-in labelled corpus",
    }


def follow_page_dataset(key: str) -> Followed[str]:
    """Before a page's dataset select box (widget ``key``): a link's dataset, as
    :data:`HEADS_FROM_CORPUS` or :data:`HEADS_FROM_HOME` (a Home dataset the link names
    becomes the session's Home dataset)."""
    return follow_widget(P_DATASET, key, page_dataset)


def publish_page_dataset(source: str, home: DatasetRef, link: Followed[str]) -> None:
    """After a page's dataset select box: its dataset spec into the URL, and a link's
    missing dataset reported."""
    publish(
        P_DATASET,
        page_dataset_spec(source, home),
        missing=link.missing,
        what="dataset",
        where=DATASETS_HERE,
        instead=md(dataset_labels(home)[source]),
    )


def pick_page_dataset(
    state: AppState, key: str, column: DeltaGenerator, *, seed: str | None = None
) -> str:
    """A page's "Dataset" select box (widget ``key``, in ``column``), its dataset spec in
    the URL: :data:`HEADS_FROM_HOME` or :data:`HEADS_FROM_CORPUS`, returned (a Home
    dataset a link names becomes the session's Home dataset); ``seed``: the page's
    remembered choice."""

    def labels() -> dict[str, str]:  # read when drawn: a link may change Home's dataset
        return dataset_labels(state.dataset)

    return bind(
        P_DATASET,
        key,
        lambda: column.selectbox(
            "Dataset", list(labels()), key=key, format_func=labels().__getitem__
        ),
        parse=page_dataset,
        to_id=lambda source: page_dataset_spec(source, state.dataset),
        seed=seed,
        what="dataset",
        where=DATASETS_HERE,
        instead=lambda source: md(labels()[source]),
    )


# --------------------------------------------------------------------------- examples


@dataclass(frozen=True, kw_only=True)
class ExampleKeys:
    """The widget keys of one page's :func:`pick_examples`.

    Attributes:
        source: The "Examples" select box (the dataset).
        split: The "Split" select box.
        limit: The "At most" number input.
    """

    source: str
    split: str
    limit: str


@dataclass(frozen=True, kw_only=True)
class PickedExamples:
    """What :func:`pick_examples` picked.

    Attributes:
        key: Identifies the dataset (cache key).
        label: How the dataset is named on the page.
        examples: Every example of the dataset.
        pool: The examples of the chosen split.
        chosen: At most ``limit`` of them, labelled ones first, whole sources together
            (:func:`app.state.stats_examples`).
    """

    key: str
    label: str
    examples: list[RAGExample]
    pool: list[RAGExample]
    chosen: list[RAGExample]


def _pick_source(
    selection: ExampleSelection, home: DatasetRef, keys: ExampleKeys, column: DeltaGenerator
) -> DatasetRef:
    """The "Examples" select box (in ``column``), its dataset in the URL; a newly picked
    dataset starts from its default split. Returns the Home dataset (a link may change it)."""
    link = follow_page_dataset(keys.source)
    if link.value is not None:
        selection.source = link.value
        home = app_state().dataset
    labels = dataset_labels(home)
    if selection.source not in labels:
        selection.source = HEADS_FROM_HOME
    seed_widget(keys.source, selection.source)
    before = selection.source
    with column:
        selection.source = st.selectbox(
            "Examples", list(labels), key=keys.source, format_func=labels.__getitem__
        )
    publish_page_dataset(selection.source, home, link)
    if selection.source != before:  # another dataset: start from its default split
        selection.split = None
        st.session_state.pop(keys.split, None)
    return home


def _pick_split(
    selection: ExampleSelection,
    keys: ExampleKeys,
    column: DeltaGenerator,
    splits: list[str],
    label: str,
) -> str:
    """The "Split" select box (in ``column``) over ``splits`` of dataset ``label``, its
    choice in the URL."""
    return bind(
        P_SPLIT,
        keys.split,
        lambda: column.selectbox(
            "Split",
            splits,
            key=keys.split,
            format_func=split_label,
            disabled=len(splits) == 1,
            help="The split the dataset declares for each example (the corpus has three)",
        ),
        parse=one_of(splits),
        seed=selection.split,
        what="split",
        where=f"a split of {md(label)} ({', '.join(splits)})",
        instead=split_label,
    )


def _pick_limit(
    selection: ExampleSelection,
    keys: ExampleKeys,
    column: DeltaGenerator,
    *,
    max_limit: int,
    limit_help: str,
) -> int:
    """The "At most" number input (in ``column``), its number in the URL."""
    return bind(
        P_LIMIT,
        keys.limit,
        lambda: int(
            column.number_input(
                "At most",
                min_value=2,
                max_value=max_limit,
                step=4,
                key=keys.limit,
                help=limit_help,
            )
        ),
        parse=integer(2, max_limit),
        seed=selection.limit,
        what="number of examples",
        where=f"a number from 2 to {max_limit}",
    )


def pick_examples(
    selection: ExampleSelection,
    home: DatasetRef,
    keys: ExampleKeys,
    columns: Sequence[DeltaGenerator],
    *,
    default_split: str,
    max_limit: int,
    limit_help: str,
) -> PickedExamples | None:
    """The "Examples", "Split" and "At most" widgets, one in each of three ``columns``.

    Args:
        selection: The page's choice, updated in place.
        home: The dataset picked on Home.
        keys: The page's widget keys.
        columns: Where the three widgets go.
        default_split: The split a newly picked dataset starts from when it has one
            (else every split).
        max_limit: The most examples "At most" allows.
        limit_help: The help of "At most".

    Returns:
        The picked examples, or ``None`` when the dataset cannot be read (the error is
        shown).
    """
    source_col, split_col, limit_col = columns
    home = _pick_source(selection, home, keys, source_col)
    labels = dataset_labels(home)
    try:
        key, label, examples = heads_examples(selection.source, home)
    except RagscopeError as e:
        st.error(f"{md(labels[selection.source])} cannot be read: {md(e)}")
        return None
    splits = example_splits(examples)
    if selection.split not in splits:
        selection.split = default_split if default_split in splits else ALL_SPLITS
        st.session_state.pop(keys.split, None)
    selection.split = _pick_split(selection, keys, split_col, splits, label)
    selection.limit = _pick_limit(
        selection, keys, limit_col, max_limit=max_limit, limit_help=limit_help
    )
    split = selection.split or ALL_SPLITS
    return PickedExamples(
        key=key,
        label=label,
        examples=examples,
        pool=[e for e in examples if split in (ALL_SPLITS, e.provenance.split)],
        chosen=stats_examples(examples, split, selection.limit),
    )


# --------------------------------------------------------------------------- extraction


def compute_row(
    model: LoadedModel,
    picked: PickedExamples,
    selection: ExampleSelection,
    *,
    detector: str,
    button: str,
    key: str,
    progress_text: str,
    progress_step: str | None = None,
) -> FeatureRequest | None:
    """What the picked examples are, beside a button that extracts ``detector``'s features.

    Args:
        model: The loaded model.
        picked: The examples (:func:`pick_examples`); their ``chosen`` ones are read.
        selection: The choice they were picked by.
        detector: Whose features to extract.
        button: The button's label.
        key: The button's widget key.
        progress_text: The progress bar's first text (see :func:`progress_bar`).
        progress_step: What it says before ``done / total examples``.

    Returns:
        The extracted features' request when the button was pressed and the extraction
        worked (a failure is shown as an error), else ``None``.
    """
    chosen = picked.chosen
    n_hal = sum(1 for e in chosen if e.label is True)
    n_fai = sum(1 for e in chosen if e.label is False)
    c_note, c_button = st.columns([4, 1], vertical_alignment="center")
    with c_note:
        st.caption(
            f"{len(chosen)} of the {len(picked.pool)} {plural(len(picked.pool), 'example')} "
            f"({split_label(selection.split)}) "
            f"of {md(picked.label)}: {n_hal} hallucinated, {n_fai} faithful. Each is traced "
            f"once with {md(model.info.display_name)}; later runs read its features from the "
            "feature cache."
        )
        slot = st.empty()
    with c_button:
        compute = st.button(
            button,
            key=key,
            type="primary",
            icon=":material/query_stats:",
            disabled=not chosen,
            width="stretch",
        )
    if chosen and not compute:
        estimate_caption(
            lambda: work_estimate(model, chosen, [make_detector(detector)], action=key),
            what="examples",
            where=slot,
        )
    if not compute:
        return None
    timed = paced_extraction(model, chosen, [make_detector(detector)], action=key)
    with progress_bar(progress_text, progress_step) as progress:
        try:
            with timed as pacer:
                return extract_request(
                    model,
                    chosen,
                    detector,
                    source=selection.source,
                    dataset_key=picked.key,
                    dataset_label=picked.label,
                    split=selection.split or ALL_SPLITS,
                    limit=selection.limit,
                    progress=pacer.ticking(progress),
                )
        except RagscopeError as e:
            st.error(f"The features could not be extracted: {md(e)}")
    return None


def show_request_failures(req: FeatureRequest) -> bool:
    """Warn about the examples ``req`` could not analyse; ``False`` when that was all of them."""
    if req.n_failed:
        st.warning(
            f"{req.n_failed} example(s) could not be analysed and were left out: "
            + " · ".join(md(e) for e in req.errors)
        )
    if not req.ids:
        st.error("None of the examples could be analysed; pick other examples.")
        return False
    return True
