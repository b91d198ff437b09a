"""Heads & layers: where ReDeEP's and InterpDetect's signals live in the loaded model.

Three views, top to bottom:

- Copying heads: every head's copying score (its OV circuit's eigenvalues), with the
  top heads marked and listed.
- Faithful vs hallucinated: InterpDetect's features (ECS of every head, PKS of every
  layer) of a few labelled examples of the dataset chosen on Home (or of the built-in
  labelled corpus, by split), summarised as layer x head heatmaps (mean ECS of each
  class, their difference, Pearson r) and PKS per layer. Each example costs one traced
  pass the first time; features then come from the shared feature cache.
- One answer, one head: a head's attention from each answer token to the passage
  tokens, the context tokens token-level ECS averages, the ReDeEP token scores (from
  the shipped ``redeep_token`` artifact, else the head's ECS) and a chunk table.
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd
import streamlit as st

from app.components.artifacts import show_broken_artifacts
from app.components.charts import greyed
from app.components.context_view import context_section
from app.components.example_picker import (
    ExampleKeys,
    PickedExamples,
    compute_row,
    pick_answer_source,
    pick_example,
    pick_examples,
    playground_answer,
    publish_playground_answer,
    show_request_failures,
    split_label,
)
from app.components.exports import csv_button, plot
from app.components.head_charts import (
    attention_figure,
    beta_words,
    copying_figure,
    ecs_figure,
    pks_figure,
)
from app.components.heatmap import render_token_heatmap
from app.components.train_job import train_detectors_panel
from app.state.detectors import ShippedDetectors, shipped_detectors
from app.state.heads import (
    HEADS_EXAMPLE_DATASET,
    HEADS_EXAMPLE_PLAYGROUND,
    HEADS_UNITS,
    KEY_HEADS_COMPUTE,
    KEY_HEADS_EXAMPLE,
    KEY_HEADS_EXAMPLE_SOURCE,
    KEY_HEADS_HEAD,
    KEY_HEADS_LAYER,
    KEY_HEADS_LIMIT,
    KEY_HEADS_SOURCE,
    KEY_HEADS_SPLIT,
    KEY_HEADS_TOP,
    KEY_HEADS_UNIT,
    REDEEP_DETECTORS,
    FeatureRequest,
    answer_heads,
    head_stats,
    heads_examples,
    redeep_detectors,
)
from app.state.links import (
    P_HEAD,
    P_INPUT,
    P_TOP,
    P_UNIT,
    bind,
    follow,
    head_id,
    integer,
    one_of,
    parse_head,
    publish,
)
from app.state.model import get_model
from app.state.session import AppState, app_state, seed_widget
from app.state.spad_views import train_command as state_train_command
from app.state.verdicts import DetectorVerdicts, answer_verdicts
from app.text import code, md
from core.analysis.heads_layers import HeadStats, HeadView
from core.base.errors import RagscopeError
from core.base.examples import RAGExample
from core.engine.model import LoadedModel
from core.learning.contract import Verdict, align_token_scores
from core.signals.copying_heads import DEFAULT_TOP, CopyingScores, copying_scores

# Page scripts run with Streamlit's magic: a bare string would be drawn, so no
# attribute docstrings here.
MAX_STATS_EXAMPLES = 400  # each example costs a traced pass the first time
# White (context copy unlike the token's state) to green (alike): higher ECS, greener.
ECS_CMAP = ((0.0, "#ffffff"), (0.5, "#a6dba0"), (1.0, "#1b7837"))

UNIT_LABELS = {"response": "answers", "chunk": "answer sentences"}
EXAMPLE_KEYS = ExampleKeys(source=KEY_HEADS_SOURCE, split=KEY_HEADS_SPLIT, limit=KEY_HEADS_LIMIT)

Head = tuple[int, int]


def _fmt_head(head: Head) -> str:
    return head_id(head)


def train_command(model: LoadedModel, shipped: ShippedDetectors, detector: str) -> str:
    """The ``ragscope train`` command that makes ``detector``'s artifact for this model."""
    return state_train_command(detector, shipped.folder)


# --------------------------------------------------------------------------- copying heads


def copying_section(state: AppState, model: LoadedModel) -> CopyingScores | None:
    """The copying-score heatmap with the top heads marked, and their list."""
    st.subheader("Copying heads")
    try:
        with st.spinner("Scoring every head's OV circuit…"):
            scores = copying_scores(model)
    except RagscopeError as e:
        st.error(
            f"The copying scores could not be computed: {md(e)}  \nFix: check that the model "
            "loads with its weights (see Home), then reload this page."
        )
        return None
    total = scores.scores.size
    default = min(DEFAULT_TOP, total)
    if state.heads.top is None or not 1 <= state.heads.top <= total:
        state.heads.top = default
        st.session_state.pop(KEY_HEADS_TOP, None)
    height = int(min(max(320, 18 * scores.n_layers + 140), 760))
    left, right = st.columns([5, 2], gap="medium")
    state.heads.top = bind(
        P_TOP,
        KEY_HEADS_TOP,
        lambda: int(
            right.number_input(
                "Top copying heads",
                min_value=1,
                max_value=total,
                step=1,
                key=KEY_HEADS_TOP,
                help=f"ReDeEP keeps the top {default} as candidate heads",
            )
        ),
        parse=integer(1, total),
        seed=state.heads.top,
        default=str(default),
        what="number of top copying heads",
        where=f"a number from 1 to {total}",
    )
    with right:
        table = scores.to_frame().sort_values("rank").head(state.heads.top)
        st.dataframe(
            table[["rank", "layer", "head", "score"]],
            hide_index=True,
            width="stretch",
            height=min(38 + 35 * len(table), height - 90),
            column_config={"score": st.column_config.NumberColumn("score", format="%.3f")},
        )
    fig = copying_figure(scores, top=state.heads.top)
    fig.update_layout(height=height, margin={"l": 50, "r": 10, "t": 50, "b": 40})
    with left:
        plot(fig, key="heads.copying.figure")
    st.caption(
        "A head's OV circuit decides what it writes from the tokens it attends to. Its "
        "copying score, Σ Re λ / Σ |λ| over the eigenvalues of W_E·W_V·W_O·W_U, is near 1 "
        "when it maps each token onto itself (it copies) and negative when it suppresses "
        f"it. Circled: the top {state.heads.top} heads, ReDeEP's candidate copying heads."
    )
    return scores


# --------------------------------------------------------------------------- statistics


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
        detector="interpdetect",
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
            f"Showing the statistics of {len(req.ids)} examples of {md(req.dataset_label)} "
            f"({split_label(req.split)}); press **Compute statistics** for the choice above."
        )
    if not show_request_failures(req):
        return
    try:
        examples = (
            current_examples
            if req.dataset_key == current_key
            else heads_examples(req.source, state.dataset)[2]
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
        f"{unit} from {len(stats.example_ids)} examples"
        + (f" ({stats.n_unlabelled} unlabelled left out)" if stats.n_unlabelled else "")
        + f" · features: {req.computed} traced, {req.cache_hits} from the cache "
        f"({req.seconds:.1f} s)"
    )
    if not stats.n_units:
        st.warning(
            f"None of these {len(req.ids)} examples carries a gold label, so there is nothing "
            "to compare. Pick a labelled dataset (the built-in labelled corpus is one)."
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
    left, right = st.columns(2, gap="medium")
    for col, kind in (
        (left, "faithful"),
        (right, "hallucinated"),
        (left, "difference"),
        (right, "r"),
    ):
        with col:
            fig = ecs_figure(stats, kind, marked=marked)
            plot(greyed(fig) if thin and kind in ("difference", "r") else fig,
                 key=f"heads.stats.ecs.{kind}")  # fmt: skip
    best = [] if thin else stats.top_heads(5)
    strongest = ", ".join(f"{_fmt_head(h)} (r = {stats.ecs_r[h[0], h[1]]:.2f})" for h in best)
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


# --------------------------------------------------------------------------- one answer


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
                f"{_fmt_head((layer, h))}: copying score {copying.scores[layer, h]:.3f}, rank "
                f"{rank[(layer, h)]} of {n_layers * n_heads}. The top copying head is "
                f"{_fmt_head(best)}."
            )
    return layer, h


def example_section(
    state: AppState,
    model: LoadedModel,
    copying: CopyingScores | None,
    pool: list[RAGExample] | None,
) -> None:
    """One answer through one head: attention, token ECS, ReDeEP scores, chunk table."""
    st.subheader("One answer, one head")
    picked = pick_answer(state, pool)
    if picked is None:
        return
    example, response_ids, _ = picked
    head = pick_head(state, model, copying)
    shipped = shipped_detectors(model).for_example(example)  # its expert, if any
    show_broken_artifacts(shipped, REDEEP_DETECTORS)
    try:
        with st.spinner("Tracing the answer (every head at once)…"):
            view = answer_heads(model, example, shipped, response_ids=response_ids)
    except RagscopeError as e:
        st.error(
            f"This answer could not be analysed: {md(e)}  \nFix: pick another example, or "
            "correct it in the Playground."
        )
        return
    judged = None
    if redeep_detectors(shipped):
        try:
            with st.spinner("Reading the detector set's verdict on the answer…"):
                judged = answer_verdicts(model, example, shipped, response_ids=response_ids)
        except RagscopeError as e:
            st.error(f"The detector set could not judge this answer: {md(e)}")
    show_attention(view, head)
    show_token_scores(view, head, model, shipped, judged)
    show_chunks(view, head, model, shipped, judged)
    st.divider()
    marked = copying.top_heads(state.heads.top) if copying is not None else []
    context_section(state.heads, model, view, marked)


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
    with st.expander(f"Per answer token: {_fmt_head(head)}'s ECS and the context it averages"):
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
    flag = {True: "flagged", False: "not flagged", None: "no threshold"}[verdict.hallucinated]
    return f"probability **{verdict.score:.3f}** ({thr}{flag})"


def show_token_scores(
    view: HeadView,
    head: Head,
    model: LoadedModel,
    shipped: ShippedDetectors,
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
    verdict = judged.verdict("redeep_token") if judged is not None else None
    if (
        verdict is not None
        and verdict.token_scores is not None
        and verdict.token_offsets is not None
    ):
        values = align_token_scores(
            verdict.token_scores, verdict.token_offsets, view.layout.response_offsets
        )
        det = next(s.detector for s in shipped.detectors if s.name == "redeep_token")
        heads = ", ".join(_fmt_head(h) for h in det.selected_heads)
        layers = ", ".join(f"L{x}" for x in det.selected_layers)
        st.caption(
            f"The shipped redeep_token detector gives this answer a "
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
            value_name="redeep_token score",
            vmin=0.0,
            vmax=1.0,
        )
        return
    st.info(
        f"No trained redeep_token detector for {md(model.info.display_name)}. Make one with "
        f"{code(train_command(model, shipped, 'redeep_token'))} and reload this page. Meanwhile "
        f"the tokens are coloured by {_fmt_head(head)}'s token-level ECS."
    )
    st.caption(
        f"Colour: {_fmt_head(head)}'s ECS for each answer token; greener = the passage "
        f"tokens the head reads most look more like the token's own final state.{gold}"
    )
    render_token_heatmap(
        tokens,
        view.head_ecs(head),
        labels=labels,
        positions=positions,
        value_name=f"{_fmt_head(head)} ECS",
        cmap=ECS_CMAP,
    )


# The chunk table's column of each chunk's own ReDeEP score (before calibration).
CHUNK_RAW = "redeep_chunk raw score"


def show_chunks(
    view: HeadView,
    head: Head,
    model: LoadedModel,
    shipped: ShippedDetectors,
    judged: DetectorVerdicts | None,
) -> None:
    """Response chunks with the context chunk the head reads most, ECS, PKS, each
    chunk's raw redeep_chunk score, gold; the answer's redeep_chunk probability, threshold
    and flag are the set's verdict (``judged``), the chunk scores labelled raw."""
    st.markdown("##### Chunks")
    layers = view.selected_layers.get("redeep_chunk") or view.selected_layers.get("redeep_token")
    source = "redeep_chunk" if view.selected_layers.get("redeep_chunk") else "redeep_token"
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
    verdict = judged.verdict("redeep_chunk") if judged is not None else None
    note = (
        f" {CHUNK_RAW}: the detector's own score of each chunk, before calibration (it ranks "
        "the chunks; not compared with the threshold). The shipped redeep_chunk detector "
        f"gives this answer a {verdict_words(verdict)}, as the Playground shows."
        if verdict is not None
        else f" Train redeep_chunk ({code(train_command(model, shipped, 'redeep_chunk'))}) to "
        "add "
        "its probability for each chunk."
    )
    st.caption(
        f"Chunks: recursive split (512 characters, overlap 20). Attended context chunk: the "
        f"one {_fmt_head(head)} attends to most from the response chunk (mean attention); "
        "ECS: cosine of the two chunks' all-MiniLM-L6-v2 embeddings. PKS: mean over the "
        f"chunk's tokens of the mean PKS over {which}, in bits. Gold: the chunk overlaps a "
        f"gold hallucination span.{note}"
    )


# --------------------------------------------------------------------------- page


def main() -> None:
    state = app_state()
    model = get_model()
    st.title("Heads & layers")
    st.caption(
        "Where ReDeEP and InterpDetect look inside the model: attention heads that copy "
        "the passages into the answer (External Context Score, ECS) and FFN layers that "
        "inject the model's own knowledge (Parametric Knowledge Score, PKS)."
    )
    train_detectors_panel(model)
    copying = copying_section(state, model)
    marked = copying.top_heads(state.heads.top) if copying is not None else []
    st.divider()
    pool = stats_section(state, model, marked)
    st.divider()
    example_section(state, model, copying, pool)


main()
