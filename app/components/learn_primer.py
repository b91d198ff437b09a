"""Learn: the shared primer, the residual stream read with the logit lens (the answer as
the model scores it, one token block by block, every token and every block)."""

from __future__ import annotations

from functools import partial

import numpy as np
import streamlit as st

from app.components.exports import plot
from app.components.heatmap import render_token_heatmap
from app.components.learn_common import PROB_CMAP, Step, try_it
from app.state.learn import KEY_TOKEN
from core.analysis.teach import LensCurve
from core.base.examples import RAGExample


def primer_steps(curve: LensCurve, ex: RAGExample) -> list[Step]:

    return [
        ("The answer, as the model scores it", partial(_answer, curve)),
        ("Reading the middle of the network", partial(_probe, curve)),
        ("Every token, every block", partial(_grid, curve)),
        ("Try it", try_it),
    ]


def _answer(curve: LensCurve) -> None:
    st.markdown(
        "A language model writes one token at a time. Fed the question, the passages "
        "and the answer so far, it gives every possible next token a probability. Here "
        "is the answer, each token coloured by the probability the model itself gave "
        "it (teacher-forced: the answer is fixed, we only read)."
    )
    st.latex(
        r"p(y_t \mid y_{<t}, \text{context}) = \mathrm{softmax}(W_U\,\mathrm{LN}_f(h_L))_{y_t}"
    )
    render_token_heatmap(
        curve.tokens, curve.final, value_name="p(token)", vmin=0.0, vmax=1.0, cmap=PROB_CMAP
    )
    low = int(np.argmin(curve.final))
    st.caption(
        f"Least expected token: “{curve.tokens[low]}” (p = {curve.final[low]:.3f}); "
        f"mean p = {curve.final.mean():.3f} over {len(curve.tokens)} tokens."
    )


def _probe(curve: LensCurve) -> None:
    import plotly.graph_objects as go

    n_layers = curve.n_layers
    st.markdown(
        f"The model is a stack of {n_layers} blocks, each adding its output to a running "
        "vector, the residual stream. The logit lens reads that vector after any block "
        "as if it were the last: through the final norm and the unembedding. So we can "
        "watch the probability of a token build up, block by block."
    )
    st.latex(r"p_\ell(y_t) = \mathrm{softmax}(W_U\,\mathrm{LN}_f(h_\ell))_{y_t}")
    t = st.select_slider(
        "Token",
        options=list(range(len(curve.tokens))),
        value=int(np.argmin(curve.final)),
        format_func=lambda i: f"{i}: {curve.tokens[i]!r}",
        key=KEY_TOKEN,
    )
    jump = curve.jump_layer(t)
    fig = go.Figure(
        go.Scatter(x=list(range(n_layers)), y=curve.probs[:, t], mode="lines+markers", name="lens")
    )
    fig.add_vline(x=jump, line={"dash": "dot", "color": "#c0392b"})
    fig.update_layout(
        title=f"Probability of “{curve.tokens[t]}”, block by block",
        xaxis_title="block",
        yaxis_title="p under the logit lens",
        yaxis_range=[0, 1],
        height=320,
        margin={"l": 10, "r": 10, "t": 50, "b": 40},
    )
    plot(fig, key="learn.lens.block")
    st.caption(
        f"It rises most at block {jump} (from {curve.probs[jump - 1, t] if jump else 0.0:.3f}"
        f" to {curve.probs[jump, t]:.3f}); after the last block the lens is the model "
        f"itself: {curve.probs[-1, t]:.3f} = {curve.final[t]:.3f}."
    )


def _grid(curve: LensCurve) -> None:
    import plotly.graph_objects as go

    n_layers = curve.n_layers
    st.markdown(
        "All tokens at once: each column is an answer token, each row a block. Copied "
        "words often become likely late, in the blocks that read the passages; tokens "
        "the passages do not support may never become likely at all."
    )
    fig = go.Figure(
        go.Heatmap(
            z=curve.probs,
            x=[f"{i}:{tok}" for i, tok in enumerate(curve.tokens)],
            y=[f"block {k}" for k in range(n_layers)],
            zmin=0,
            zmax=1,
            colorscale="Blues",
            hovertemplate="%{x} at %{y}: p = %{z:.3f}<extra></extra>",
        )
    )
    fig.update_layout(
        title="Logit-lens probability of each answer token, by block",
        height=max(300, 12 * n_layers + 120),
        margin={"l": 10, "r": 10, "t": 50, "b": 40},
        yaxis={"autorange": "reversed"},
        xaxis={"showticklabels": len(curve.tokens) <= 40},
    )
    plot(fig, key="learn.lens.answer")
    jumps = curve.jump_layers()
    st.caption(
        f"Median block where a token's probability jumps most: {int(np.median(jumps))} "
        f"of {n_layers}."
    )
