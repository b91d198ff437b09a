"""Heads & layers: one answer through one head (the answer and head pickers, its
attention, the token-level ReDeEP scores and the chunk table)."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from app.components.answer_picker import (
    pick_answer_source,
    pick_example,
    playground_answer,
    publish_playground_answer,
)
from app.components.example_picker import split_label
from app.components.exports import csv_button, plot
from app.components.head_charts import attention_figure, beta_words
from app.components.heatmap import render_token_heatmap
from app.state.detectors import DetectorSet
from app.state.heads import (
    HEAD_CHUNKS,
    HEAD_TOKENS,
    HEADS_EXAMPLE_DATASET,
    HEADS_EXAMPLE_PLAYGROUND,
    KEY_HEADS_EXAMPLE,
    KEY_HEADS_EXAMPLE_SOURCE,
    KEY_HEADS_HEAD,
    KEY_HEADS_LAYER,
)
from app.state.links import P_HEAD, P_INPUT, follow, head_id, parse_head, publish
from app.state.session import AppState, seed_widget
from app.state.spad_views import train_command as state_train_command
from app.state.verdicts import DetectorVerdicts
from app.text import code, md
from core.analysis.heads_layers import Head, HeadView
from core.base.examples import RAGExample
from core.detectors.redeep import RedeepTokenDetector
from core.engine.model import LoadedModel
from core.learning.contract import Verdict, align_token_scores
from core.signals.copying_heads import CopyingScores

# White (context copy unlike the token's state) to green (alike): higher ECS, greener.
ECS_CMAP = ((0.0, "#ffffff"), (0.5, "#a6dba0"), (1.0, "#1b7837"))
# The chunk table's column of each chunk's own ReDeEP score (before calibration).
CHUNK_RAW = "redeep_chunk raw score"


def train_command(model: LoadedModel, shipped: DetectorSet, detector: str) -> str:
    """The ``ragscope train`` command that makes ``detector``'s artifact for this model."""
    return state_train_command(detector, shipped.folder)


def pick_answer(
    state: AppState, pool: list[RAGExample] | None
) -> tuple[RAGExample, tuple[int, ...] | None, str] | None:
    """The one-answer view's input: ``(example, response ids, where it came from)``."""
    there = playground_answer(state) is not None
    options = ([HEADS_EXAMPLE_PLAYGROUND] if there else []) + (
        [HEADS_EXAMPLE_DATASET] if pool else []
    )
    if not options:
        st.info(
            "No examples to show: pick a readable dataset above, or analyse an answer in "
            "the Playground."
        )
        return None
    state.heads.example_source = pick_answer_source(
        state.heads.example_source,
        options,
        key=KEY_HEADS_EXAMPLE_SOURCE,
        dataset_name="An example from the examples above",
    )
    if state.heads.example_source == HEADS_EXAMPLE_PLAYGROUND and there:
        ex, ids = publish_playground_answer(state, pool=pool or ())
        return ex, ids, "playground"
    publish(P_INPUT, None)
    assert pool
    key = f"{state.heads.selection.source}/{state.heads.selection.split}"
    example = pick_example(
        pool,
        state.heads.example_id.get(key),
        key=KEY_HEADS_EXAMPLE,
        dataset_label=f"the examples above ({split_label(state.heads.selection.split)})",
    )
    state.heads.example_id[key] = example.id
    return example, None, "dataset"


def pick_head(state: AppState, model: LoadedModel, copying: CopyingScores | None) -> Head:
    """Layer and head select boxes (default: the top copying head)."""
    n_layers, n_heads = model.info.n_layers, model.info.n_heads
    head = state.heads.head
    if head is None or not (0 <= head[0] < n_layers and 0 <= head[1] < n_heads):
        head = copying.top_heads(1)[0] if copying is not None else (0, 0)
        st.session_state.pop(KEY_HEADS_LAYER, None)
        st.session_state.pop(KEY_HEADS_HEAD, None)
    link = follow(P_HEAD, parse_head(n_layers, n_heads))
    if link.value is not None:
        head = link.value
        st.session_state[KEY_HEADS_LAYER], st.session_state[KEY_HEADS_HEAD] = head
    seed_widget(KEY_HEADS_LAYER, head[0])
    seed_widget(KEY_HEADS_HEAD, head[1])
    rank: dict[Head, int] = {}
    if copying is not None:
        rank = {h: i + 1 for i, h in enumerate(copying.top_heads(n_layers * n_heads))}
    c1, c2, c3 = st.columns([1, 1, 3], vertical_alignment="bottom")
    with c1:
        layer = int(
            st.selectbox(
                "Layer", list(range(n_layers)), key=KEY_HEADS_LAYER, format_func=lambda x: f"L{x}"
            )
        )

    with c2:
        h = int(
            st.selectbox(
                "Head", list(range(n_heads)), key=KEY_HEADS_HEAD, format_func=lambda x: f"H{x}"
            )
        )
    state.heads.head = (layer, h)
    publish(
        P_HEAD,
        head_id((layer, h)),
        missing=link.missing,
        what="head",
        where=f"one of the {n_layers} x {n_heads} heads (L0H0 to "
        f"{head_id((n_layers - 1, n_heads - 1))}) of {md(model.info.display_name)}",
    )
    with c3:
        if copying is not None:
            best = copying.top_heads(1)[0]
            st.caption(
                f"{head_id((layer, h))}: copying score {copying.scores[layer, h]:.3f}, rank "
                f"{rank[(layer, h)]} of {n_layers * n_heads}. The top copying head is "
                f"{head_id(best)}."
            )
    return layer, h


def show_attention(view: HeadView, head: Head) -> None:
    plot(attention_figure(view, head), key="heads.attention")
    where = "passage tokens" if view.scope == "passages" else "prompt tokens"
    st.caption(
        f"Each row is an answer token, read at the position that predicted it; each column "
        f"one of the {len(view.context)} {where}. Red squares: the top {view.k} "
        f"({view.topk_frac:.0%}) positions by attention, whose final hidden states token-level "
        "ECS averages and compares with the answer token's (cosine). "
        f"Traced in {view.seconds:.1f} s."
    )
    with st.expander(f"Per answer token: {head_id(head)}'s ECS and the context it averages"):
        st.dataframe(
            view.token_frame(head),
            hide_index=True,
            width="stretch",
            height=320,
            column_config={
                "ECS": st.column_config.NumberColumn("ECS", format="%.3f"),
                "attention on top-k": st.column_config.NumberColumn(
                    "attention on top-k", format="%.3f"
                ),
            },
        )


def verdict_words(verdict: Verdict) -> str:
    """``probability **0.444** (threshold 0.426: not flagged)``: a verdict of the set, as
    the Playground shows it."""
    thr = f"threshold {verdict.threshold:.3f}: " if verdict.threshold is not None else ""
    return f"probability **{verdict.score:.3f}** ({thr}{verdict.call})"


def show_token_scores(
    view: HeadView,
    head: Head,
    model: LoadedModel,
    shipped: DetectorSet,
    judged: DetectorVerdicts | None,
) -> None:
    """The ReDeEP token heatmap, or the head's ECS when no redeep_token artifact exists.
    The answer's probability, threshold and flag are the set's verdict (``judged``)."""
    st.markdown("##### Token-level ReDeEP")
    tokens = view.response_tokens
    labels = view.layout.token_labels()
    positions = view.layout.response_positions.tolist()
    gold = (
        " Tokens underlined in blue lie inside a gold hallucination span."
        if labels is not None
        else ""
    )
    verdict = judged.verdict(HEAD_TOKENS) if judged is not None else None
    det = next((s.detector for s in shipped.detectors if s.name == HEAD_TOKENS), None)
    if (
        verdict is not None
        and verdict.token_scores is not None
        and verdict.token_offsets is not None
        and isinstance(det, RedeepTokenDetector)
    ):
        values = align_token_scores(
            verdict.token_scores, verdict.token_offsets, view.layout.response_offsets
        )
        heads = ", ".join(head_id(h) for h in det.selected_heads)
        layers = ", ".join(f"L{x}" for x in det.selected_layers)
        st.caption(
            f"The shipped {HEAD_TOKENS} detector gives this answer a "
            f"{verdict_words(verdict)}, as the Playground shows. "
            f"Per token it combines H = PKS_n − β·ECS_n over its heads ({heads}) and layers "
            f"({layers}); {beta_words(float(verdict.explanation.get('beta', float('nan'))))}. "
            f"Darker = more likely hallucinated.{gold}"
        )
        render_token_heatmap(
            tokens,
            values,
            labels=labels,
            positions=positions,
            value_name=f"{HEAD_TOKENS} score",
            vmin=0.0,
            vmax=1.0,
        )
        return
    st.info(
        f"No trained {HEAD_TOKENS} detector for {md(model.info.display_name)}. Make one with "
        f"{code(train_command(model, shipped, HEAD_TOKENS))} and reload this page. Meanwhile "
        f"the tokens are coloured by {head_id(head)}'s token-level ECS."
    )
    st.caption(
        f"Colour: {head_id(head)}'s ECS for each answer token; greener = the passage "
        f"tokens the head reads most look more like the token's own final state.{gold}"
    )
    render_token_heatmap(
        tokens,
        view.head_ecs(head),
        labels=labels,
        positions=positions,
        value_name=f"{head_id(head)} ECS",
        cmap=ECS_CMAP,
    )


def show_chunks(
    view: HeadView,
    head: Head,
    model: LoadedModel,
    shipped: DetectorSet,
    judged: DetectorVerdicts | None,
) -> None:
    """Response chunks with the context chunk the head reads most, ECS, PKS, each
    chunk's raw redeep_chunk score, gold; the answer's redeep_chunk probability, threshold
    and flag are the set's verdict (``judged``), the chunk scores labelled raw."""
    st.markdown("##### Chunks")
    layers = view.selected_layers.get(HEAD_CHUNKS) or view.selected_layers.get(HEAD_TOKENS)
    source = HEAD_CHUNKS if view.selected_layers.get(HEAD_CHUNKS) else HEAD_TOKENS
    # The detector's per-chunk scores are uncalibrated: they rank chunks, and are never
    # compared with the answer's (calibrated) threshold.
    frame = view.chunk_frame(head, pks_layers=layers).rename(
        columns={"redeep_chunk probability": CHUNK_RAW}
    )
    number_format = {"ECS": "{:.3f}", "PKS": "{:.4f}", CHUNK_RAW: "{:.3f}"}
    # A static table: chunks are long texts, which it wraps, so every column stays in view.
    frame.index = pd.RangeIndex(1, len(frame) + 1, name="chunk")
    st.table(frame.style.format({c: f for c, f in number_format.items() if c in frame.columns}))
    csv_button(frame, key="heads.chunks")
    which = (
        f"its {source} detector's selected layers ({', '.join(f'L{x}' for x in layers)})"
        if layers
        else "every layer"
    )
    verdict = judged.verdict(HEAD_CHUNKS) if judged is not None else None
    note = (
        f" {CHUNK_RAW}: the detector's own score of each chunk, before calibration (it ranks "
        f"the chunks; not compared with the threshold). The shipped {HEAD_CHUNKS} detector "
        f"gives this answer a {verdict_words(verdict)}, as the Playground shows."
        if verdict is not None
        else f" Train {HEAD_CHUNKS} ({code(train_command(model, shipped, HEAD_CHUNKS))}) to "
        "add "
        "its probability for each chunk."
    )
    st.caption(
        f"Chunks: recursive split (512 characters, overlap 20). Attended context chunk: the "
        f"one {head_id(head)} attends to most from the response chunk (mean attention); "
        "ECS: cosine of the two chunks' all-MiniLM-L6-v2 embeddings. PKS: mean over the "
        f"chunk's tokens of the mean PKS over {which}, in bits. Gold: the chunk overlaps a "
        f"gold hallucination span.{note}"
    )
