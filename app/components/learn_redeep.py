"""Learn: the ReDeEP / InterpDetect walkthrough (a copying head's attention, the external
context score, the parametric knowledge score, every head and block, their combination),
and the data it reads: the answer's head view, the head and FFN block shown, that FFN's
lens, and InterpDetect's head statistics over the first corpus answers."""

from __future__ import annotations

from functools import partial

import numpy as np
import streamlit as st

from app.components.exports import plot
from app.components.head_charts import attention_figure, ecs_figure, mean_ecs_figure
from app.components.heatmap import render_token_heatmap
from app.components.learn_common import PROB_CMAP, SCORE_CMAP, Step, try_it
from app.state.datasets import get_store
from app.state.detectors import detector_set
from app.state.heads import HEAD_STATS, HEAD_TOKENS, answer_heads
from app.state.learn import DATASET_N, KEY_STATS, KEY_TOKEN, RedeepData
from app.state.model import get_model
from core.analysis.heads_layers import HeadStats
from core.analysis.teach import ffn_lens
from core.base.examples import RAGExample
from core.data import load_builtin
from core.detectors import make_detector
from core.detectors.redeep import RedeepTokenDetector
from core.engine.model import LoadedModel
from core.learning.contract import Detector
from core.pipeline.extract import FeatureCache, extract_features

HEADS_PAGE = "views/heads.py"


def dataset_head_stats() -> HeadStats:
    """InterpDetect's head statistics over the first corpus answers (cached features)."""

    examples = load_builtin()[:DATASET_N]
    det = make_detector(HEAD_STATS)
    ext = extract_features(
        get_model(), examples, [det], cache=FeatureCache(get_store()), on_error="skip"
    )
    return HeadStats.from_features(list(ext.features[HEAD_STATS]), list(ext.examples))


def redeep_data(model: LoadedModel, ex: RAGExample, shipped: dict[str, Detector]) -> RedeepData:
    """The answer's head view, the head and FFN block to show, and that FFN's lens."""

    view = answer_heads(model, ex, detector_set(model))
    det = shipped.get(HEAD_TOKENS)
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


def redeep_steps(data: RedeepData, ex: RAGExample) -> list[Step]:

    return [
        ("A head that copies", partial(_attention, data)),
        ("External context score", partial(_ecs, data)),
        ("Parametric knowledge score", partial(_pks, data)),
        ("Every head, every block", partial(_grid, data)),
        ("Putting them together", partial(_combine, data)),
        ("Try it", try_it),
    ]


def _token_choice(tokens: list[str]) -> int:
    return int(
        st.select_slider(
            "Answer token",
            options=list(range(len(tokens))),
            value=len(tokens) // 2,
            format_func=lambda i: f"{i}: {tokens[i]!r}",
            key=KEY_TOKEN,
        )
    )


def _attention(data: RedeepData) -> None:
    hv = data.view
    layer, head = data.head
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


def _ecs(data: RedeepData) -> None:
    hv = data.view
    layer, head = data.head
    tokens = list(hv.response_tokens)
    ctx = list(hv.context_tokens)
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
    t = _token_choice(tokens)
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


def _pks(data: RedeepData) -> None:
    import plotly.graph_objects as go

    layer = data.layer  # the block data.ffn was read at (the detector's, else the top PKS)
    tokens = list(data.view.response_tokens)
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
    t = _token_choice(tokens)
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


def _grid(data: RedeepData) -> None:
    hv = data.view
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
    st.page_link(HEADS_PAGE, label="Heads & layers: the full picture", icon=":material/grid_view:")


def _combine(data: RedeepData) -> None:
    hv = data.view
    tokens = list(hv.response_tokens)
    st.markdown(
        "ReDeEP combines the two: a token is suspect when the FFNs pushed hard (high "
        "PKS over the selected blocks) while the copying heads brought little from the "
        "passages (low ECS over the selected heads)."
    )
    st.latex(
        r"H(t) = \textstyle\sum_{\ell \in L^*}\text{PKS}_\ell(t) - \beta \sum_{(\ell,h) \in A^*}\text{ECS}_{\ell h}(t)"
    )
    verdict = hv.verdicts.get(HEAD_TOKENS)
    if verdict is None or verdict.token_scores is None:
        st.info(
            f"No trained {HEAD_TOKENS} detector for this model: "
            f"`ragscope train --detectors {HEAD_TOKENS}`."
        )
        return
    render_token_heatmap(
        tokens, verdict.token_scores, value_name=f"{HEAD_TOKENS} score", vmin=0.0, vmax=1.0,
        cmap=SCORE_CMAP,
    )  # fmt: skip
    st.caption(
        f"Answer score {verdict.score:.3f} (threshold {getattr(data.detector, 'threshold_', 0.5):.3f})."
    )
