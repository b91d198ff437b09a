"""Heads & layers: where ReDeEP's and InterpDetect's signals live in the loaded model.

Four views, top to bottom:

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
- Context attribution: which passage sentences a span of the answer drew on (the first
  span the detector set flags, by default), per head group, and an ablation check.
"""

from __future__ import annotations

import streamlit as st

from app.components.artifacts import show_broken_artifacts
from app.components.context_view import context_section
from app.components.exports import plot
from app.components.head_charts import copying_figure
from app.components.heads_answer import (
    pick_answer,
    pick_head,
    show_attention,
    show_chunks,
    show_token_scores,
)
from app.components.heads_stats import stats_section
from app.components.train_job import train_detectors_panel
from app.state.detectors import detector_set
from app.state.heads import KEY_HEADS_TOP, REDEEP_DETECTORS, answer_heads
from app.state.links import P_TOP, bind, integer
from app.state.model import get_model
from app.state.session import AppState, app_state
from app.state.verdicts import answer_verdicts
from app.text import md
from core.base.errors import RagscopeError
from core.base.examples import RAGExample
from core.engine.model import LoadedModel
from core.signals.copying_heads import DEFAULT_TOP, CopyingScores, copying_scores

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


# --------------------------------------------------------------------------- one answer


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
    shipped = detector_set(model).for_example(example)  # its expert, if any
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
    # Any set's verdict: its spans aim the context attribution below (memoised, so free
    # when the Playground already judged this answer).
    if shipped.detectors:
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
    answer = judged.answer if judged is not None else None
    context_section(state.heads, model, view, marked, answer)


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
