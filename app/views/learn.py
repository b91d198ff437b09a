"""Learn: guided walkthroughs of how the detectors read the model, live on one answer.

Each walkthrough is a short sequence of steps (Back / Next, a progress bar), each a
live view of the current example (the Playground's analysed answer, a preset with a
clear hallucination, or the Counterfactual page's edited version), a few sentences
of plain language and the formula it computes. Every number shown comes from the model (:mod:`core.analysis.teach`), computed
once per example and kept for the session. Walkthroughs: the shared primer (the
residual stream read with the logit lens), ReDeEP / InterpDetect, SPAD, RAGLens and
CORTEX.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import streamlit as st

from app.components.example_picker import open_in_counterfactual, playground_answer
from app.components.exports import plot
from app.components.head_charts import attention_figure, ecs_figure, mean_ecs_figure
from app.components.heatmap import render_token_heatmap
from app.components.highlight import FLAG, Mark, marked_html
from app.components.shap_charts import pos_sources_figure, token_sources_figure, waterfall_figure
from app.state.datasets import BUILTIN, get_store
from app.state.detectors import shipped_detectors
from app.state.heads import HEADS_FROM_HOME, answer_heads
from app.state.learn import (
    KEY_BACK,
    KEY_NEXT,
    KEY_P_STAY,
    KEY_SOURCE,
    KEY_STATS,
    KEY_TOKEN,
    KEY_TRY,
    KEY_WALK,
)
from app.state.links import (
    P_INPUT,
    P_STEP,
    P_WALK,
    bind,
    example_input,
    follow,
    integer,
    linked,
    publish,
)
from app.state.model import get_model
from app.state.session import app_state
from app.state.spad_views import AnswerSources, answer_sources
from app.text import md
from core.analysis.heads_layers import HeadStats, HeadView
from core.analysis.shap_values import shap_values
from core.analysis.teach import (
    CortexWalk,
    FfnLens,
    LensCurve,
    RaglensWalk,
    cortex_walk,
    ffn_lens,
    lens_curve,
    raglens_walk,
)
from core.base.errors import RagscopeError
from core.base.examples import RAGExample, example_hash
from core.data import builtin_examples, load_builtin
from core.detectors import make_detector
from core.detectors.redeep import RedeepTokenDetector
from core.detectors.spad import SpadDetector
from core.engine.model import LoadedModel
from core.learning.contract import Detector
from core.learning.labels import span_labels
from core.pipeline.extract import FeatureCache, extract_features
from core.signals.attribution import SOURCES
from core.signals.smoothing import P_STAY_TOKEN

STATE_KEY = "ragscope.learn"
DATASET_N = 24
PRESET_ID = "demo-04-mount-kelsey"  # a hallucinated date in an otherwise supported answer
PRIMER = "Residual stream & logit lens"
REDEEP = "ReDeEP / InterpDetect"
SPAD = "SPAD"
RAGLENS = "RAGLens"
CORTEX = "CORTEX"
WALKS = (PRIMER, REDEEP, SPAD, RAGLENS, CORTEX)
WALK_IDS = {"primer": PRIMER, "redeep": REDEEP, "spad": SPAD, "raglens": RAGLENS, "cortex": CORTEX}
# A walkthrough's id in a link (``walk=spad``), and its step as a number from 1.
HEADS_PAGE = "views/heads.py"
PRESET = "Preset: a clear hallucination"
PLAYGROUND = "The Playground's analysed answer"
EDITED = "The Counterfactual page's edited answer"
LINKED = "The answer the link carries"
PROB_CMAP = ((0.0, "#ffffff"), (0.5, "#9ecae1"), (1.0, "#08519c"))
SCORE_CMAP = ((0.0, "#ffffff"), (0.5, "#f4b183"), (1.0, "#c0392b"))
COUNTERFACTUAL_PAGE = "views/counterfactual.py"


@dataclass
class LearnState:
    step: dict[str, int] = field(default_factory=dict)  # walkthrough -> step index
    cache: dict[str, object] = field(default_factory=dict)  # (walk, example sig) -> data


def page_state() -> LearnState:
    if STATE_KEY not in st.session_state:
        st.session_state[STATE_KEY] = LearnState()
    return st.session_state[STATE_KEY]


def current_example() -> RAGExample | None:
    """The example the walkthrough reads: the Playground's answer (or the one a link
    carries), the Counterfactual page's edited version (to watch a step change with the
    context), or the preset. An answer other than the preset travels in the URL as
    ``input``, so a copied link reopens it in a fresh browser."""

    state = app_state()
    carried = linked(P_INPUT) is not None
    answer = playground_answer(state)
    cf = state.cf.result
    options = (
        ([PLAYGROUND] if answer is not None else [])
        + ([EDITED] if cf is not None else [])
        + [PRESET]
    )
    if carried and answer is not None:
        st.session_state[KEY_SOURCE] = PLAYGROUND
    if st.session_state.get(KEY_SOURCE) not in options:
        st.session_state.pop(KEY_SOURCE, None)
    names = {
        PLAYGROUND: PLAYGROUND if state.linked_answer is None else LINKED,
        EDITED: EDITED,
        PRESET: PRESET,
    }
    source = st.radio(
        "Example", options, horizontal=True, key=KEY_SOURCE, format_func=names.__getitem__
    )
    ex: RAGExample | None
    if source == PLAYGROUND and answer is not None:
        ex = answer
    elif source == EDITED and cf is not None:
        st.caption(f"Edited on the Counterfactual context page: “{md(cf.name)}”.")
        ex = cf.edited
    else:
        ex = next((e for e in builtin_examples() if e.id == PRESET_ID), None)
        if ex is None:
            st.error(f"The preset example {PRESET_ID!r} is missing from the built-in examples.")
    shown = None if ex is None or source == PRESET else example_input(ex)
    publish(P_INPUT, shown, what="answer", where="readable")
    if ex is not None and source != PRESET and shown is None:
        st.caption("This answer cannot travel in a link (too long, or a verbatim prompt).")
    return ex


def signature(ex: RAGExample) -> str:

    return example_hash(ex)


# --------------------------------------------------------------------------- primer


def primer_steps(curve: LensCurve, ex: RAGExample) -> list[tuple[str, Callable[[], None]]]:
    n_layers = curve.n_layers

    def answer() -> None:
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

    def probe() -> None:
        import plotly.graph_objects as go

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
            go.Scatter(
                x=list(range(n_layers)), y=curve.probs[:, t], mode="lines+markers", name="lens"
            )
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

    def grid() -> None:
        import plotly.graph_objects as go

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

    return [
        ("The answer, as the model scores it", answer),
        ("Reading the middle of the network", probe),
        ("Every token, every block", grid),
        ("Try it", try_it),
    ]


# --------------------------------------------------------------------------- ReDeEP


@dataclass
class RedeepData:
    view: HeadView
    head: tuple[int, int]
    layer: int
    ffn: FfnLens
    detector: RedeepTokenDetector | None  # the shipped redeep_token detector, if any
    stats: HeadStats | None = None  # over the corpus, once computed


def dataset_head_stats() -> HeadStats:
    """InterpDetect's head statistics over the first corpus answers (cached features)."""

    examples = load_builtin()[:DATASET_N]
    det = make_detector("interpdetect")
    ext = extract_features(
        get_model(), examples, [det], cache=FeatureCache(get_store()), on_error="skip"
    )
    return HeadStats.from_features(list(ext.features["interpdetect"]), list(ext.examples))


def redeep_steps(data: RedeepData, ex: RAGExample) -> list[tuple[str, Callable[[], None]]]:
    import plotly.graph_objects as go

    hv = data.view
    layer, head = data.head
    tokens = list(hv.response_tokens)
    ctx = list(hv.context_tokens)

    def token_choice() -> int:
        return int(
            st.select_slider(
                "Answer token",
                options=list(range(len(tokens))),
                value=len(tokens) // 2,
                format_func=lambda i: f"{i}: {tokens[i]!r}",
                key=KEY_TOKEN,
            )
        )

    def attention() -> None:
        which = (
            "the first of the copying heads the shipped ReDeEP detector reads"
            if data.detector is not None
            else "the head with the highest mean ECS on this answer"
        )
        st.markdown(
            f"Some attention heads copy: they look back at the passages and carry what they "
            f"find into the answer. Head {head} of block {layer}, {which}, attends from "
            "each answer token (rows) to the passage tokens (columns); the squares mark the "
            "tokens it attends to most."
        )
        st.latex(r"a_{t,j} = \mathrm{softmax}_j\big(q_t \cdot k_j / \sqrt{d}\big)")
        plot(attention_figure(hv, (layer, head)), key="learn.attention")

    def ecs() -> None:
        st.markdown(
            "External context score: take the passage tokens this head attends to most "
            f"(the top {hv.k} = 10%), average their final hidden states, and compare with "
            "the answer token's own final hidden state. High: the token carries what it "
            "read."
        )
        st.latex(
            r"\text{ECS}_{\ell h}(t) = \cos\Big(\tfrac{1}{k}\sum_{j \in \text{top-}k} "
            r"x^{L}_j,\; x^{L}_t\Big)"
        )
        t = token_choice()
        top = [
            ctx[list(hv.context).index(int(p))] if int(p) in set(hv.context) else "?"
            for p in hv.top_positions[layer, head, t][:10]
        ]
        st.caption("Most attended passage tokens: " + " · ".join(repr(x) for x in top))
        vals = hv.token_ecs[:, layer, head]
        st.metric(f"ECS of “{tokens[t]}”", f"{float(vals[t]):.3f}")
        render_token_heatmap(
            tokens, vals, value_name=f"ECS L{layer}H{head}", vmin=-1.0, vmax=1.0, cmap=PROB_CMAP
        )

    def pks() -> None:
        f = data.ffn
        st.markdown(
            f"Feed-forward blocks hold what the model memorised. Read the residual stream "
            f"just before and just after block {layer}'s FFN with the logit lens: the "
            "Jensen-Shannon divergence between the two next-token distributions is the "
            "parametric knowledge score. High: the FFN changed the model's mind."
        )
        st.latex(
            r"\text{PKS}_\ell(t) = \mathrm{JSD}\big(p_\ell^{\text{mid}}(\cdot)\,\|\,"
            r"p_\ell^{\text{post}}(\cdot)\big)"
        )
        t = token_choice()
        c1, c2 = st.columns(2)
        for col, name, top in ((c1, "before the FFN", f.before), (c2, "after the FFN", f.after)):
            fig = go.Figure(
                go.Bar(x=list(top.probs[t]), y=[repr(x) for x in top.tokens[t]], orientation="h")
            )
            fig.update_layout(
                title=f"Top next tokens {name}", height=260,
                margin={"l": 10, "r": 10, "t": 50, "b": 30}, yaxis={"autorange": "reversed"},
            )  # fmt: skip
            plot(fig, key=f"learn.pks.top.{name}", where=col)
        st.metric(f"PKS at block {layer}, token “{tokens[t]}”", f"{float(f.jsd[t]):.4f} bits")

    def grid() -> None:
        st.markdown(
            "Every head and every block at once, averaged over this answer's tokens: "
            "where the copying happens (ECS, heads) and where the FFNs rewrite (PKS, "
            "blocks). The Heads & layers page draws the same picture over a dataset, "
            "hallucinated answers against faithful ones."
        )

        plot(
            mean_ecs_figure(
                hv.token_ecs.mean(0),
                title="Mean ECS of every head on this answer",
            ),
            key="learn.ecs.mean",
        )
        st.markdown(
            f"Over a dataset: mean ECS of each head on faithful answers minus on "
            f"hallucinated ones, over the first {DATASET_N} answers of the built-in "
            "corpus (features cached, so a second look is instant)."
        )
        stats = data.stats
        if stats is None and st.button(
            f"Compute over {DATASET_N} corpus answers", key=KEY_STATS, icon=":material/grid_view:"
        ):
            with st.spinner(f"Reading {DATASET_N} answers…"):
                stats = dataset_head_stats()
            data.stats = stats
        if stats is not None:
            plot(ecs_figure(stats, "difference", marked=[data.head]), key="learn.ecs.difference")
        st.page_link(
            HEADS_PAGE, label="Heads & layers: the full picture", icon=":material/grid_view:"
        )

    def combine() -> None:
        st.markdown(
            "ReDeEP combines the two: a token is suspect when the FFNs pushed hard (high "
            "PKS over the selected blocks) while the copying heads brought little from the "
            "passages (low ECS over the selected heads)."
        )
        st.latex(
            r"H(t) = \textstyle\sum_{\ell \in L^*}\text{PKS}_\ell(t) - \beta \sum_{(\ell,h) \in A^*}\text{ECS}_{\ell h}(t)"
        )
        verdict = hv.verdicts.get("redeep_token")
        if verdict is None or verdict.token_scores is None:
            st.info(
                "No trained redeep_token detector for this model: `ragscope train --detectors redeep_token`."
            )
            return
        render_token_heatmap(
            tokens, verdict.token_scores, value_name="redeep_token score", vmin=0.0, vmax=1.0,
            cmap=SCORE_CMAP,
        )  # fmt: skip
        st.caption(
            f"Answer score {verdict.score:.3f} (threshold {getattr(data.detector, 'threshold_', 0.5):.3f})."
        )

    return [
        ("A head that copies", attention),
        ("External context score", ecs),
        ("Parametric knowledge score", pks),
        ("Every head, every block", grid),
        ("Putting them together", combine),
        ("Try it", try_it),
    ]


# --------------------------------------------------------------------------- SPAD


@dataclass(frozen=True)
class SpadData:
    answer: AnswerSources
    detector: SpadDetector | None  # the shipped spad detector, when there is one


def spad_steps(data: SpadData, ex: RAGExample) -> list[tuple[str, Callable[[], None]]]:

    src = data.answer.sources
    tokens = list(src.tokens)

    def token_choice() -> int:
        return int(
            st.select_slider(
                "Token",
                options=list(range(len(tokens))),
                value=int(np.argmin(src.p_final)),
                format_func=lambda i: f"{i}: {tokens[i]!r}",
                key=KEY_TOKEN,
            )
        )

    def telescope() -> None:
        import plotly.graph_objects as go

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
        t = token_choice()
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

    def attention_split() -> None:

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

    def pos_step() -> None:

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
            pos_sources_figure(
                src.values, data.answer.pos, title="Mean sources per part of speech"
            ),
            key="learn.sources.pos",
        )

    def shap_step() -> None:
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

    return [
        ("A probability, taken apart", telescope),
        ("Who the attention listened to", attention_split),
        ("From tokens to features", pos_step),
        ("The classifier's reading", shap_step),
        ("Try it", try_it),
    ]


# --------------------------------------------------------------------------- RAGLens


def raglens_steps(walk: RaglensWalk, ex: RAGExample) -> list[tuple[str, Callable[[], None]]]:
    def dictionary() -> None:
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
            c3.metric(
                "Variance kept on held-out text", f"{walk.held_out.get('fve', float('nan')):.1%}"
            )
        render_token_heatmap(
            walk.tokens, walk.token_error, value_name="reconstruction error", vmin=0.0,
            vmax=max(1.0, float(walk.token_error.max())), cmap=SCORE_CMAP,
        )  # fmt: skip

    def one_feature() -> None:
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

    def pooling() -> None:
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

    def gam() -> None:
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

    return [
        ("A dictionary of directions", dictionary),
        ("One feature over the answer", one_feature),
        ("Max pooling", pooling),
        ("A sum of shape values", gam),
        ("Try it", try_it),
    ]


# --------------------------------------------------------------------------- CORTEX


def cortex_steps(walk: CortexWalk, ex: RAGExample) -> list[tuple[str, Callable[[], None]]]:
    def two_readings() -> None:
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

    def residual() -> None:
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

    def scores() -> None:
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

    def smoothing() -> None:
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
                    f"{walk.threshold:.4f}:")  # fmt: skip
        st.html(marked_html(ex.response, [Mark(a, b, FLAG, "flagged") for a, b in spans]))
        st.caption(
            f"{len(spans)} span(s); answer score at p_stay {walk.answer_p_stay}: "
            f"{float(walk.smoothed(walk.answer_p_stay).max()):.3f}."
        )

    return [
        ("Two readings of one answer", two_readings),
        ("What is new at each token", residual),
        ("Token scores", scores),
        ("From scores to spans", smoothing),
        ("Try it", try_it),
    ]


def _gold_labels(walk: CortexWalk, ex: RAGExample) -> list[int] | None:

    lab = span_labels(walk.offsets, ex)
    return None if lab is None else lab.tolist()


def try_it() -> None:

    st.markdown(
        "Change the passages and watch these numbers move: support the flagged claim in "
        "a passage (the flags should fade) or state it differently (they should stay). The "
        "Counterfactual context page does the edit and re-reads the answer with every "
        "detector."
    )
    state = app_state()
    source = st.session_state.get(KEY_SOURCE)
    if source == PLAYGROUND and (state.linked_answer or state.analysis) is not None:
        target: dict[str, str] | None = {}
    elif state.dataset == BUILTIN:  # the preset is one of the Home dataset's examples
        target = {"dataset": HEADS_FROM_HOME, "example_id": PRESET_ID}
    else:
        target = None
    if target is None:
        st.page_link(COUNTERFACTUAL_PAGE, label="Edit the context", icon=":material/edit_note:")
    elif st.button("Edit this answer's context", key=KEY_TRY, icon=":material/edit_note:"):
        open_in_counterfactual(state, **target)


# --------------------------------------------------------------------------- page


def walk_data(ls: LearnState, walk: str, ex: RAGExample) -> object | None:
    """The example's data for a walkthrough, computed once per session."""
    key = f"{walk}|{signature(ex)}"
    if key in ls.cache:
        return ls.cache[key]
    model = get_model()
    shipped = {s.name: s.detector for s in shipped_detectors(model).detectors}
    if walk == PRIMER:
        with st.spinner("Reading every block with the logit lens…"):
            data: object = lens_curve(model, ex)
    elif walk == SPAD:
        with st.spinner("Splitting every token's probability into its sources…"):
            spad = shipped.get("spad")
            data = SpadData(
                answer=answer_sources(model, ex),
                detector=spad if isinstance(spad, SpadDetector) else None,
            )
    elif walk == REDEEP:
        with st.spinner("Reading every head and every FFN on the answer…"):
            data = redeep_data(model, ex, shipped)
    else:
        name = "raglens" if walk == RAGLENS else "cortex"
        det = shipped.get(name)
        if det is None:
            st.info(
                f"No trained {walk} detector for this model: train one with "
                f"`ragscope train --detectors {name}` to step through it."
            )
            return None
        with st.spinner(f"Reading the answer as {walk} does…"):
            data = raglens_walk(model, det, ex) if walk == RAGLENS else cortex_walk(model, det, ex)
    ls.cache[key] = data
    return data


def redeep_data(model: LoadedModel, ex: RAGExample, shipped: dict[str, Detector]) -> RedeepData:
    """The answer's head view, the head and FFN block to show, and that FFN's lens."""

    view = answer_heads(model, ex, shipped_detectors(model))
    det = shipped.get("redeep_token")
    if not isinstance(det, RedeepTokenDetector):
        det = None
    mean_ecs = view.token_ecs.mean(0)
    if det is not None and det.selected_heads:
        head = tuple(det.selected_heads[0])
    else:
        head = tuple(int(i) for i in np.unravel_index(int(np.argmax(mean_ecs)), mean_ecs.shape))
    if det is not None and det.selected_layers:
        layer = int(det.selected_layers[0])
    else:
        layer = int(np.argmax(view.pks.mean(1)))
    return RedeepData(
        view=view,
        head=(int(head[0]), int(head[1])),
        layer=layer,
        ffn=ffn_lens(model, ex, layer),
        detector=det,
    )


def move(ls: LearnState, walk: str, delta: int, n: int) -> None:
    ls.step[walk] = min(max(ls.step.get(walk, 0) + delta, 0), n - 1)


def main() -> None:
    st.title("Learn")
    st.caption(
        "How the detectors read the model, step by step, on a live answer: every number "
        "is computed from the model, here and now."
    )
    ls = page_state()
    walk = bind(
        P_WALK,
        KEY_WALK,
        lambda: st.radio("Walkthrough", list(WALKS), horizontal=True, key=KEY_WALK),
        parse=WALK_IDS.get,
        to_id=lambda w: next(k for k, v in WALK_IDS.items() if v == w),
        default=next(iter(WALK_IDS)),
        what="walkthrough",
        where=" or ".join(WALK_IDS),
    )
    ex = current_example()
    if ex is None:
        return
    try:
        data = walk_data(ls, walk, ex)
    except RagscopeError as e:
        st.error(f"This answer cannot be read: {md(e)}")
        return
    if data is None:
        return
    build = {
        PRIMER: primer_steps,
        REDEEP: redeep_steps,
        SPAD: spad_steps,
        RAGLENS: raglens_steps,
        CORTEX: cortex_steps,
    }
    steps = build[walk](data, ex)  # type: ignore[operator]
    n = len(steps)
    step_link = follow(P_STEP, integer(1, n))
    if step_link.value is not None:
        ls.step[walk] = step_link.value - 1
    k = min(ls.step.get(walk, 0), n - 1)
    publish(
        P_STEP,
        str(k + 1),
        default="1",
        missing=step_link.missing,
        what="step",
        where=f"a step from 1 to {n}",
    )
    title, show = steps[k]
    st.progress((k + 1) / n, text=f"Step {k + 1} of {n}: {title}")
    st.subheader(title)
    # One block for the step's content, so Back/Next keep their place in the page
    # from step to step: a rerun replaces them instead of showing a stale pair beside new ones.
    with st.container():
        show()
    c_back, c_next, _ = st.columns([1, 1, 4])
    c_back.button(
        "Back", key=KEY_BACK, icon=":material/arrow_back:", disabled=k == 0,
        on_click=move, args=(ls, walk, -1, n), width="stretch",
    )  # fmt: skip
    c_next.button(
        "Next", key=KEY_NEXT, icon=":material/arrow_forward:", type="primary",
        disabled=k == n - 1, on_click=move, args=(ls, walk, 1, n), width="stretch",
    )  # fmt: skip


main()
