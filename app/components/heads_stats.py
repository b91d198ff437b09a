"""Heads & layers: faithful vs hallucinated answers, InterpDetect's ECS of every head and
PKS of every layer over a few labelled examples, as layer x head heatmaps and tables."""

from __future__ import annotations

from collections.abc import Sequence

import streamlit as st

import app.state.heads as heads_state
from app.components.charts import greyed
from app.components.example_picker import (
    ExampleKeys,
    PickedExamples,
    compute_row,
    pick_examples,
    show_request_failures,
    split_label,
)
from app.components.exports import plot
from app.components.head_charts import ecs_figure, pks_figure
from app.state.heads import (
    HEAD_STATS,
    HEADS_UNITS,
    KEY_HEADS_COMPUTE,
    KEY_HEADS_LIMIT,
    KEY_HEADS_SOURCE,
    KEY_HEADS_SPLIT,
    KEY_HEADS_UNIT,
    FeatureRequest,
    head_stats,
)
from app.state.links import P_UNIT, bind, head_id, one_of
from app.state.session import AppState
from app.text import md
from core.analysis.heads_layers import ECS_KINDS, Head, HeadStats
from core.base.errors import RagscopeError
from core.base.examples import RAGExample
from core.base.words import plural
from core.engine.model import LoadedModel

MAX_STATS_EXAMPLES = 400  # each example costs a traced pass the first time
UNIT_LABELS = {"response": "answers", "chunk": "answer sentences"}
EXAMPLE_KEYS = ExampleKeys(source=KEY_HEADS_SOURCE, split=KEY_HEADS_SPLIT, limit=KEY_HEADS_LIMIT)


def stats_controls(state: AppState) -> PickedExamples | None:
    """Examples source, split and number (:func:`pick_examples`), and the unit counted.

    Returns:
        The picked examples, or ``None`` when the dataset cannot be read (the error is
        shown).
    """
    *picker_columns, unit_column = st.columns([2.5, 1.1, 1, 2.2], vertical_alignment="bottom")
    picked = pick_examples(
        state.heads.selection,
        state.dataset,
        EXAMPLE_KEYS,
        picker_columns,
        default_split="train",
        max_limit=MAX_STATS_EXAMPLES,
        limit_help="Examples to read; each costs one traced pass the first time",
    )
    if picked is None:
        return None
    state.heads.unit = bind(
        P_UNIT,
        KEY_HEADS_UNIT,
        lambda: unit_column.radio(
            "Count",
            HEADS_UNITS,
            key=KEY_HEADS_UNIT,
            format_func=UNIT_LABELS.__getitem__,
            horizontal=True,
            help="Answers (the mean over each answer's sentences, labelled by the answer) "
            "or InterpDetect's unit, sentences (labelled by overlap with a gold span)",
        ),
        parse=one_of(HEADS_UNITS),
        seed=state.heads.unit,
        default=HEADS_UNITS[0],
        what="unit",
        where=" or ".join(HEADS_UNITS),
    )
    return picked


def stats_section(
    state: AppState, model: LoadedModel, marked: Sequence[Head]
) -> list[RAGExample] | None:
    """Pick examples, extract InterpDetect features with progress, show the statistics.

    Returns the examples of the chosen source and split (for the one-answer view).
    """
    st.subheader("Faithful vs hallucinated answers")
    st.caption(
        "InterpDetect's features of labelled examples: for every head, ECS (how close the "
        "answer sentence is to the passage sentence the head reads most), and for every "
        "layer, PKS (how much its FFN changes the next-token prediction, in bits)."
    )
    picked = stats_controls(state)
    if picked is None:
        return None
    request = compute_row(
        model,
        picked,
        state.heads.selection,
        detector=HEAD_STATS,
        button="Compute statistics",
        key=KEY_HEADS_COMPUTE,
        progress_text="Extracting InterpDetect features…",
        progress_step="Features:",
    )
    if request is not None:
        state.heads.request = request
    req = state.heads.request
    if req is None:
        st.info("Press **Compute statistics** to read these examples' heads and layers.")
        return picked.pool
    show_request_stats(state, model, req, picked.key, picked.examples, marked)
    return picked.pool


def show_request_stats(
    state: AppState,
    model: LoadedModel,
    req: FeatureRequest,
    current_key: str,
    current_examples: list[RAGExample],
    marked: Sequence[Head],
) -> None:
    """The statistics of the last computed examples (with a note when the choice changed)."""
    if req.model != model.instance_key:
        st.info(
            "These statistics were computed with another model; press **Compute statistics** again."
        )
        return
    selection = state.heads.selection
    if (req.dataset_key, req.split, req.limit) != (current_key, selection.split, selection.limit):
        st.info(
            f"Showing the statistics of {len(req.ids)} {plural(len(req.ids), 'example')} of "
            f"{md(req.dataset_label)} "
            f"({split_label(req.split)}); press **Compute statistics** for the choice above."
        )
    if not show_request_failures(req):
        return
    try:
        examples = (
            current_examples
            if req.dataset_key == current_key
            else heads_state.heads_examples(req.source, state.dataset)[2]
        )
        stats = head_stats(model, req, examples, state.heads.unit)
    except RagscopeError as e:
        st.error(f"The statistics could not be computed: {md(e)}")
        return
    show_stats(stats, req, marked)


def show_stats(stats: HeadStats, req: FeatureRequest, marked: Sequence[Head]) -> None:
    """Four layer x head heatmaps, PKS per layer, and the tables behind them."""
    unit = stats.unit
    st.markdown(
        f"**{stats.n_faithful}** faithful and **{stats.n_hallucinated}** hallucinated "
        f"{unit} from {len(stats.example_ids)} {plural(len(stats.example_ids), 'example')}"
        + (f" ({stats.n_unlabelled} unlabelled left out)" if stats.n_unlabelled else "")
        + f" · features: {req.computed} traced, {req.cache_hits} from the cache "
        f"({req.seconds:.1f} s)"
    )
    if not stats.n_units:
        st.warning(
            f"None of these {len(req.ids)} {plural(len(req.ids), 'example')} carries a gold "
            "label, so there is nothing to compare. Pick a labelled dataset (the built-in labelled corpus is one)."
        )
        return
    if not stats.n_faithful or not stats.n_hallucinated:
        missing = "faithful" if not stats.n_faithful else "hallucinated"
        st.warning(
            f"No {missing} {unit} among these examples: that class's means, the differences "
            "and the correlations are undefined and left blank. Read more examples, or pick "
            "a dataset with both labels (the built-in labelled corpus has both)."
        )
    thin = stats.evidence if stats.n_faithful and stats.n_hallucinated else None
    if thin:
        st.warning(
            f"{md(thin)} The differences, correlations and PKS are greyed and no head is "
            "ranked: raise **At most** (the estimate above says how long it takes)."
        )
    ecs_grids(stats, marked, thin)
    stats_tables(stats)


def ecs_grids(stats: HeadStats, marked: Sequence[Head], thin: str | None) -> None:
    """The four ECS layer x head heatmaps and PKS per layer (greyed when the evidence is thin)."""
    left, right = st.columns(2, gap="medium")
    for col, kind in zip((left, right, left, right), ECS_KINDS, strict=True):
        with col:
            fig = ecs_figure(stats, kind, marked=marked)
            plot(greyed(fig) if thin and kind in ("difference", "r") else fig,
                 key=f"heads.stats.ecs.{kind}")  # fmt: skip
    best = [] if thin else stats.top_heads(5)
    strongest = ", ".join(f"{head_id(h)} (r = {stats.ecs_r[h[0], h[1]]:.2f})" for h in best)
    st.caption(
        "ECS is a cosine in [-1, 1]. Difference = faithful − hallucinated and r is the "
        "correlation with 1 − label, so positive (blue) marks heads that carry more of the "
        "passages into faithful answers, as ReDeEP expects of copying heads. Circled: the "
        "top copying heads. Blank cells: undefined (one class missing or a constant value)."
        + (f" Strongest heads by r: {strongest}." if strongest else "")
    )
    plot(greyed(pks_figure(stats)) if thin else pks_figure(stats), key="heads.stats.pks")
    st.caption(
        "PKS is the Jensen-Shannon divergence (bits) between the logit-lens predictions "
        "before and after a layer's FFN, averaged over the answer's tokens. ReDeEP expects "
        "higher PKS in hallucinated answers (r > 0, red bars) in the later layers."
    )


def stats_tables(stats: HeadStats) -> None:
    """The tables behind the heatmaps, in an expander."""
    with st.expander("Tables"):
        t1, t2 = st.columns([3, 2])
        fmt = {
            c: st.column_config.NumberColumn(c, format="%.4f")
            for c in ("ecs_faithful", "ecs_hallucinated", "ecs_difference", "ecs_r")
        }
        t1.dataframe(stats.to_frame(), hide_index=True, width="stretch", column_config=fmt)
        fmt_l = {
            c: st.column_config.NumberColumn(c, format="%.4f")
            for c in ("pks_faithful", "pks_hallucinated", "pks_difference", "pks_r")
        }
        t2.dataframe(stats.layer_frame(), hide_index=True, width="stretch", column_config=fmt_l)
