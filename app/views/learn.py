"""Learn: guided walkthroughs of how the detectors read the model, live on one answer.

Each walkthrough is a short sequence of steps (Back / Next, a progress bar), each a
live view of the current example (the Playground's analysed answer, or a preset with
a clear hallucination), a few sentences of plain language and the formula it
computes. Every number shown comes from the model (:mod:`core.teach`), computed
once per example and kept for the session. This first part holds the shared primer
(the residual stream read with the logit lens) and CORTEX; the other detectors'
walkthroughs come next.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import streamlit as st

from app.components.heatmap import render_token_heatmap
from app.components.highlight import FLAG, Mark, marked_html
from app.state import app_state, get_model, shipped_detectors
from core.errors import RagscopeError
from core.examples import RAGExample
from core.teach import CortexWalk, LensCurve, cortex_walk, lens_curve

STATE_KEY = "ragscope.learn"
KEY_WALK = "learn.walk"
KEY_SOURCE = "learn.source"
KEY_BACK = "learn.back"
KEY_NEXT = "learn.next"
KEY_TOKEN = "learn.token"
KEY_P_STAY = "learn.p_stay"
PRESET_ID = "demo-04-mount-kelsey"  # a hallucinated date in an otherwise supported answer
PRIMER = "Residual stream & logit lens"
CORTEX = "CORTEX"
WALKS = (PRIMER, CORTEX)
PRESET = "Preset: a clear hallucination"
PLAYGROUND = "The Playground's analysed answer"
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
    """The Playground's answer when there is one (the user picks), else the preset."""
    from core.datasets import builtin_examples

    a = app_state().analysis
    options = ([PLAYGROUND] if a is not None else []) + [PRESET]
    source = st.radio("Example", options, horizontal=True, key=KEY_SOURCE)
    if source == PLAYGROUND and a is not None:
        return a.example
    preset = next((e for e in builtin_examples() if e.id == PRESET_ID), None)
    if preset is None:
        st.error(f"The preset example {PRESET_ID!r} is missing from the built-in examples.")
    return preset


def signature(ex: RAGExample) -> str:
    from core.storage import example_hash

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
        st.plotly_chart(fig, width="stretch")
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
        st.plotly_chart(fig, width="stretch")
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
        st.plotly_chart(fig, width="stretch")

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
            "p_stay", 0.5, 0.999, value=0.993, step=0.001, format="%.3f", key=KEY_P_STAY
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
    from core.detectors.base import span_labels

    lab = span_labels(walk.offsets, ex)
    return None if lab is None else lab.tolist()


def try_it() -> None:
    st.markdown(
        "Change the passages and watch these numbers move: support the flagged claim in "
        "a passage (the flags should fade) or state it differently (they should stay). The "
        "Counterfactual context page does the edit and re-reads the answer with every "
        "detector."
    )
    st.page_link(COUNTERFACTUAL_PAGE, label="Edit the context", icon=":material/edit_note:")


# --------------------------------------------------------------------------- page


def walk_data(ls: LearnState, walk: str, ex: RAGExample) -> object | None:
    """The example's data for a walkthrough, computed once per session."""
    key = f"{walk}|{signature(ex)}"
    if key in ls.cache:
        return ls.cache[key]
    model = get_model()
    if walk == PRIMER:
        with st.spinner("Reading every block with the logit lens…"):
            data: object = lens_curve(model, ex)
    else:
        shipped = {s.name: s.detector for s in shipped_detectors(model).detectors}
        det = shipped.get("cortex")
        if det is None:
            st.info(
                "No trained CORTEX detector for this model: train one with "
                "`ragscope train --detectors cortex` to step through it."
            )
            return None
        with st.spinner("Reading the answer with and without the passages…"):
            data = cortex_walk(model, det, ex)
    ls.cache[key] = data
    return data


def move(ls: LearnState, walk: str, delta: int, n: int) -> None:
    ls.step[walk] = min(max(ls.step.get(walk, 0) + delta, 0), n - 1)


def main() -> None:
    st.title("Learn")
    st.caption(
        "How the detectors read the model, step by step, on a live answer: every number "
        "is computed from the model, here and now."
    )
    ls = page_state()
    walk = st.radio("Walkthrough", list(WALKS), horizontal=True, key=KEY_WALK)
    ex = current_example()
    if ex is None:
        return
    try:
        data = walk_data(ls, walk, ex)
    except RagscopeError as e:
        st.error(f"This answer cannot be read: {e}")
        return
    if data is None:
        return
    steps = (
        primer_steps(data, ex)  # type: ignore[arg-type]
        if walk == PRIMER
        else cortex_steps(data, ex)  # type: ignore[arg-type]
    )
    n = len(steps)
    k = min(ls.step.get(walk, 0), n - 1)
    title, show = steps[k]
    st.progress((k + 1) / n, text=f"Step {k + 1} of {n}: {title}")
    st.subheader(title)
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
