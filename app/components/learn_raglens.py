"""Learn: the RAGLens walkthrough (a sparse autoencoder's dictionary, the most informative
feature over the answer, max pooling, and the additive model's shape values)."""

from __future__ import annotations

from functools import partial

import numpy as np
import streamlit as st

from app.components.exports import plot
from app.components.heatmap import render_token_heatmap
from app.components.learn_common import PROB_CMAP, SCORE_CMAP, Step, try_it
from core.analysis.teach import RaglensWalk
from core.base.examples import RAGExample


def raglens_steps(walk: RaglensWalk, ex: RAGExample) -> list[Step]:

    return [
        ("A dictionary of directions", partial(_dictionary, walk)),
        ("One feature over the answer", partial(_one_feature, walk)),
        ("Max pooling", partial(_pooling, walk)),
        ("A sum of shape values", partial(_gam, walk)),
        ("Try it", try_it),
    ]


def _dictionary(walk: RaglensWalk) -> None:
    st.markdown(
        f"A sparse autoencoder rewrites the residual stream at one block as a short sum "
        f"of directions taken from a dictionary of {walk.d_sae:,}: at each token only a "
        "few are active. Each direction is a candidate concept the model uses."
    )
    st.latex(
        r"x \approx b_{\text{dec}} + \sum_k f_k(x)\, W_{\text{dec}}[k],\quad f = \mathrm{TopK}(W_{\text{enc}} x + b_{\text{enc}})"
    )
    c1, c2, c3 = st.columns(3)
    c1.metric("Variance kept on this answer", f"{walk.fve:.1%}")
    c2.metric("Active features per token", f"{walk.l0.mean():.0f}")
    if walk.held_out:
        c3.metric("Variance kept on held-out text", f"{walk.held_out.get('fve', float('nan')):.1%}")
    render_token_heatmap(
        walk.tokens, walk.token_error, value_name="reconstruction error", vmin=0.0,
        vmax=max(1.0, float(walk.token_error.max())), cmap=SCORE_CMAP,
    )  # fmt: skip


def _one_feature(walk: RaglensWalk) -> None:
    st.markdown(
        "The detector picked, from the whole dictionary, the few features that carry "
        "the most information about hallucination. Here is the most important one, "
        "token by token on this answer."
    )
    if not walk.features:
        st.info("The detector selected no feature.")
        return
    k = walk.features[0]
    a = walk.activations[:, 0]
    st.latex(rf"f_{{{k}}}(x_t),\ t = 1..T")
    render_token_heatmap(
        walk.tokens, a, value_name=f"F{k} activation", vmin=0.0,
        vmax=max(float(a.max()), 1e-6), cmap=PROB_CMAP,
    )  # fmt: skip


def _pooling(walk: RaglensWalk) -> None:
    import pandas as pd

    st.markdown(
        "The classifier does not read positions: each feature counts once per answer, "
        "at its strongest token (max pooling)."
    )
    st.latex(r"z_k = \max_t f_k(x_t)")
    rows = [
        {"feature": f"F{k}", "max over the answer": float(walk.pooled[i]),
         "at token": walk.tokens[int(np.argmax(walk.activations[:, i]))] if walk.activations.size else ""}
        for i, k in enumerate(walk.features[:10])
    ]  # fmt: skip
    st.dataframe(pd.DataFrame(rows), hide_index=True, width="stretch")


def _gam(walk: RaglensWalk) -> None:
    import plotly.graph_objects as go

    st.markdown(
        "An explainable boosting machine, a generalised additive model: one learned "
        "curve per feature, mapping its pooled value to a push towards (red) or away "
        "from (blue) hallucination. The score is the sum of the pushes, through a "
        "sigmoid."
    )
    st.latex(r"\text{score} = \sigma\Big(\beta_0 + \sum_k g_k(z_k)\Big)")
    items = sorted(walk.contributions.items(), key=lambda kv: -abs(kv[1]))[:12][::-1]
    fig = go.Figure(
        go.Bar(
            x=[v for _, v in items], y=[n for n, _ in items], orientation="h",
            marker_color=["#c0392b" if v > 0 else "#2c7fb8" for _, v in items],
        )
    )  # fmt: skip
    fig.update_layout(
        title="This answer's largest shape values g_k(z_k)",
        height=max(260, 24 * len(items) + 90),
        margin={"l": 10, "r": 10, "t": 50, "b": 40},
        xaxis_title="log-odds",
    )
    plot(fig, key="learn.gam.shapes")
    logit = walk.intercept + sum(walk.contributions.values())
    st.caption(
        f"β0 {walk.intercept:+.3f} + Σ g = {logit:+.3f}; σ({logit:+.3f}) = "
        f"{1 / (1 + np.exp(-logit)):.3f}, the detector's score {walk.score:.3f}."
    )
