"""Learn: the CORTEX walkthrough (two readings of one answer, what is new at each token,
the token scores, and their smoothing into flagged spans)."""

from __future__ import annotations

from functools import partial

import streamlit as st

from app.components.exports import plot
from app.components.heatmap import render_token_heatmap
from app.components.highlight import FLAG, Mark, marked_html
from app.components.learn_common import PROB_CMAP, SCORE_CMAP, Step, try_it
from app.state.learn import KEY_P_STAY
from core.analysis.teach import CortexWalk
from core.base.examples import RAGExample
from core.learning.labels import span_labels
from core.signals.smoothing import P_STAY_TOKEN


def cortex_steps(walk: CortexWalk, ex: RAGExample) -> list[Step]:

    return [
        ("Two readings of one answer", partial(_two_readings, walk)),
        ("What is new at each token", partial(_residual, walk)),
        ("Token scores", partial(_scores, walk, ex)),
        ("From scores to spans", partial(_smoothing, walk, ex)),
        ("Try it", try_it),
    ]


def _two_readings(walk: CortexWalk) -> None:
    st.markdown(
        "CORTEX reads the same answer twice: once with the passages in the prompt and "
        "once without, the answer tokens identical. At each answer token it takes the "
        "difference of the last block's output between the two readings. Where the "
        "passages matter, the difference is large."
    )
    st.latex(r"\Delta h_i = h_i(\text{with passages}) - h_i(\text{without})")
    render_token_heatmap(
        walk.tokens,
        walk.dh_norm,
        value_name="‖Δh‖",
        vmin=0.0,
        vmax=float(walk.dh_norm.max() or 1.0),
        cmap=PROB_CMAP,
    )


def _residual(walk: CortexWalk) -> None:
    import plotly.graph_objects as go

    st.markdown(
        "Some of a token's change is inherited: earlier answer tokens already carried "
        "the passages' influence, and attention passes it on. CORTEX subtracts the "
        "attention-weighted changes of the earlier tokens, keeping what is new at this "
        "token."
    )
    st.latex(r"c_i = \Delta h_i - \sum_{j<i} \alpha_{ij}\,\Delta h_j")
    x = [f"{i}:{t}" for i, t in enumerate(walk.tokens)]
    fig = go.Figure(
        [
            go.Bar(x=x, y=walk.dh_norm, name="‖Δh‖"),
            go.Bar(x=x, y=walk.c_norm, name="‖c‖ (new at this token)"),
        ]
    )
    fig.update_layout(
        title="Change from the passages, and the part earlier tokens do not explain",
        barmode="group",
        height=320,
        margin={"l": 10, "r": 10, "t": 50, "b": 40},
        xaxis={"showticklabels": len(x) <= 40},
    )
    plot(fig, key="learn.cortex.change")


def _scores(walk: CortexWalk, ex: RAGExample) -> None:
    st.markdown(
        "A small network trained on answers with marked hallucinations reads both "
        "vectors of each token and gives the probability that the token is part of a "
        "hallucination."
    )
    st.latex(r"s_i = \sigma\big(\mathrm{MLP}([\Delta h_i;\, c_i])\big)")
    render_token_heatmap(
        walk.tokens, walk.raw, value_name="raw score", vmin=0.0, vmax=1.0, cmap=SCORE_CMAP,
        labels=_gold_labels(walk, ex),
    )  # fmt: skip
    st.caption(f"Highest raw score {walk.raw.max():.3f}; gold tokens underlined.")


def _smoothing(walk: CortexWalk, ex: RAGExample) -> None:
    st.markdown(
        "Hallucinations come in runs of tokens, not single tokens. A two-state chain "
        "(faithful / hallucinated) that tends to stay in its state (p_stay) turns the "
        "scattered scores into the posterior of each token being in a hallucinated "
        "run (forward-backward); runs above the threshold become the flagged spans. "
        "The answer's score is the highest smoothed token."
    )
    st.latex(
        r"P(z_i = \text{hall} \mid s_{1..T}),\quad "
        r"P(z_{i+1} = z_i) = p_{\text{stay}}"
    )
    p_stay = st.slider(
        "p_stay", 0.5, 0.999, value=P_STAY_TOKEN, step=0.001, format="%.3f", key=KEY_P_STAY
    )
    sm = walk.smoothed(p_stay)
    render_token_heatmap(
        walk.tokens, sm, value_name="smoothed", vmin=0.0, vmax=1.0, cmap=SCORE_CMAP,
        labels=_gold_labels(walk, ex),
    )  # fmt: skip
    spans = walk.spans(p_stay)
    st.markdown("**Flagged spans** (orange) at the token threshold "
                f"{walk.threshold:.3f}:")  # fmt: skip
    st.html(marked_html(ex.response, [Mark(a, b, FLAG, "flagged") for a, b in spans]))
    st.caption(
        f"{len(spans)} span(s); answer score at p_stay {walk.answer_p_stay}: "
        f"{float(walk.smoothed(walk.answer_p_stay).max()):.3f}."
    )


def _gold_labels(walk: CortexWalk, ex: RAGExample) -> list[int] | None:

    lab = span_labels(walk.offsets, ex)
    return None if lab is None else lab.tolist()
