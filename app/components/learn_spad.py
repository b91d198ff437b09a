"""Learn: the SPAD walkthrough (a token's probability taken apart block by block, the
attention's share among the seven sources, their means per part of speech, and the
classifier's SHAP reading of those 126 numbers)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import numpy as np
import streamlit as st

from app.components.exports import plot
from app.components.learn_common import Step, try_it
from app.components.shap_charts import pos_sources_figure, token_sources_figure, waterfall_figure
from app.state.learn import KEY_TOKEN
from app.state.spad_views import AnswerSources
from core.analysis.shap_values import shap_values
from core.base.examples import RAGExample
from core.detectors.spad import SpadDetector
from core.signals.attribution import SOURCES, TokenSources


@dataclass(frozen=True)
class SpadData:
    answer: AnswerSources
    detector: SpadDetector | None  # the shipped spad detector, when there is one


def spad_steps(data: SpadData, ex: RAGExample) -> list[Step]:

    return [
        ("A probability, taken apart", partial(_telescope, data)),
        ("Who the attention listened to", partial(_attention_split, data)),
        ("From tokens to features", partial(_pos_step, data)),
        ("The classifier's reading", partial(_shap_step, data)),
        ("Try it", try_it),
    ]


def _token_choice(src: TokenSources) -> int:
    tokens = list(src.tokens)
    return int(
        st.select_slider(
            "Token",
            options=list(range(len(tokens))),
            value=int(np.argmin(src.p_final)),
            format_func=lambda i: f"{i}: {tokens[i]!r}",
            key=KEY_TOKEN,
        )
    )


def _telescope(data: SpadData) -> None:
    import plotly.graph_objects as go

    src = data.answer.sources
    tokens = list(src.tokens)
    st.markdown(
        "SPAD asks where a token's probability comes from. Read the residual stream "
        "with the unembedding before the first block, then after each attention and "
        "each feed-forward part, then through the final norm: the changes add up, "
        "exactly, to the probability the model gives the token."
    )
    st.latex(
        r"P_{\text{final}}(y) = \Phi(h_0) + \sum_\ell \big(\Delta\text{Attn}_\ell + "
        r"\Delta\text{FFN}_\ell\big) + \Delta\text{LN}"
    )
    t = _token_choice(src)
    steps = [("Init", float(src.values[t, SOURCES.index("Init")]))]
    for ly in range(src.d_attn.shape[1]):
        steps += [
            (f"attn {ly}", float(src.d_attn[t, ly])),
            (f"FFN {ly}", float(src.d_ffn[t, ly])),
        ]
    steps.append(("final norm", float(src.values[t, SOURCES.index("LN")])))
    fig = go.Figure(
        go.Waterfall(
            x=[n for n, _ in steps] + ["P_final"],
            y=[v for _, v in steps] + [float(src.p_final[t])],
            measure=["relative"] * len(steps) + ["total"],
            hovertemplate="%{x}: %{y:+.4f}<extra></extra>",
        )
    )
    fig.update_layout(
        title=f"How p(“{tokens[t]}”) is built, part by part",
        height=360,
        margin={"l": 10, "r": 10, "t": 50, "b": 40},
        xaxis={
            "showticklabels": False,
            "title": "embedding, then each block's attention and FFN, then the final norm",
        },
        yaxis_title="change in probability",
    )
    plot(fig, key="learn.sources.steps")
    total = sum(v for _, v in steps)
    st.caption(
        f"The parts sum to {total:.6f}; the model gives {float(src.p_final[t]):.6f} "
        f"(difference {abs(total - float(src.p_final[t])):.1e})."
    )


def _attention_split(data: SpadData) -> None:

    src = data.answer.sources
    tokens = list(src.tokens)
    st.markdown(
        "Each block's attention change is shared among its heads (by how much each "
        "head's output pushes the token) and each head's share among what it attended "
        "to: the question and instructions (Query), the passages (RAG), the answer so "
        "far (Past) and the token itself (Self). With the FFN, the norm and the "
        "embedding, seven sources per token."
    )
    st.latex(
        r"\text{source}_s = \sum_\ell \sum_h w_{\ell h}\, a_{\ell h}(s)\, "
        r"\Delta\text{Attn}_\ell,\quad s \in \{\text{Query}, \text{RAG}, "
        r"\text{Past}, \text{Self}\}"
    )
    plot(
        token_sources_figure(
            src.values, tokens, data.answer.pos, title="Seven sources of every answer token"
        ),
        key="learn.sources.tokens",
    )


def _pos_step(data: SpadData) -> None:

    src = data.answer.sources
    st.markdown(
        "The detector does not read tokens one by one: it averages the seven sources "
        "over the tokens of each part of speech (nouns, numbers, proper names, ...), "
        "126 numbers per answer. A number that leans on the model's own FFN rather "
        "than on the passages is a warning sign."
    )
    st.latex(
        r"x_{s,\text{POS}} = \operatorname{mean}_{t:\ \text{pos}(t)=\text{POS}}\ \text{source}_s(t)"
    )
    plot(
        pos_sources_figure(src.values, data.answer.pos, title="Mean sources per part of speech"),
        key="learn.sources.pos",
    )


def _shap_step(data: SpadData) -> None:
    st.markdown(
        "A gradient-boosted classifier reads the 126 numbers. SHAP splits its output "
        "for this answer exactly into one contribution per number: the waterfall runs "
        "from the average answer to this one."
    )
    st.latex(r"f(x) = \mathbb{E}[f] + \sum_i \phi_i(x)")
    if data.detector is None:
        st.info("No trained spad detector for this model: `ragscope train --detectors spad`.")
        return

    res = shap_values(data.detector, [data.answer.features])
    plot(waterfall_figure(res, 0), key="learn.sources.waterfall")
