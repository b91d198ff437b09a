"""The Playground's analysis of one answer: its metrics, the token heatmap (coloured by
surprisal or a detector's token scores), the detectors' verdicts, the prompt's segment
strip and the token table."""

from __future__ import annotations

import numpy as np
import streamlit as st

from app.components.exports import plot
from app.components.heatmap import ADAPT_BELOW, detector_scale, render_token_heatmap
from app.components.playground_verdicts import DetectorPanel, show_detector_verdicts
from app.components.segments import segment_figure, segment_rows
from app.state.analysis import Analysis
from app.state.links import P_DETECTOR, bind, follow_widget, one_of, publish
from app.state.playground import COLOR_SURPRISAL, KEY_COLOR_BY, KEY_FIXED_SCALE
from app.state.session import AppState
from app.text import md
from core.learning.contract import Verdict, align_token_scores, flag_threshold


def _colour_label(choice: str) -> str:
    return "surprisal (bits)" if choice == COLOR_SURPRISAL else f"{choice} token score"


def pick_colouring(state: AppState, panel: DetectorPanel) -> Verdict | None:
    """The "Colour tokens by" control; the chosen detector's verdict (``None``: surprisal).

    Shown only when some shipped detector gives token scores.
    """
    by_name = panel.token_verdicts
    options = [COLOR_SURPRISAL, *by_name]
    where = (
        f"a detector shipped for {md(panel.model_name)} that scores tokens "
        f"({', '.join(md(n) for n in by_name) or 'none does'})"
    )
    if not by_name:
        link = follow_widget(P_DETECTOR, KEY_COLOR_BY, one_of(options))
        publish(P_DETECTOR, None, missing=link.missing, what="detector", where=where)
        return None
    if st.session_state.get(KEY_COLOR_BY) not in options:
        st.session_state.pop(KEY_COLOR_BY, None)
    state.color_by = bind(
        P_DETECTOR,
        KEY_COLOR_BY,
        lambda: st.radio(
            "Colour tokens by",
            options,
            key=KEY_COLOR_BY,
            horizontal=True,
            format_func=_colour_label,
            help="The model's own surprisal, or a trained detector's score for each token",
        ),
        parse=one_of(options),
        seed=state.color_by if state.color_by in options else COLOR_SURPRISAL,
        default=COLOR_SURPRISAL,
        what="detector",
        where=where,
        instead=lambda c: md(_colour_label(c)),
    )
    return by_name.get(state.color_by)


def detector_token_scores(a: Analysis, verdict: Verdict) -> np.ndarray:
    """``verdict``'s token scores on the analysed answer's tokens, shape ``[resp]``."""
    assert verdict.token_scores is not None and verdict.token_offsets is not None
    return align_token_scores(
        verdict.token_scores, verdict.token_offsets, a.layout.response_offsets
    )


def show_analysis(
    a: Analysis, current_signature: str | None, panel: DetectorPanel, state: AppState
) -> None:
    """Metrics, token heatmap, detector verdicts, segment strip and token table."""
    st.subheader("The answer, token by token")
    if current_signature != a.signature:
        st.info("The input changed since this analysis; press **Analyse** to update it.")
    s = a.surprisal
    tokens = a.layout.response_token_strings()
    worst = int(np.argmax(s))
    c1, c2, c3, c4 = st.columns(4)
    c1.metric("Mean surprisal", f"{float(s.mean()):.2f} bits")
    c2.metric(
        "Max surprisal", f"{float(s.max()):.2f} bits", help=f"token {md(repr(tokens[worst]))}"
    )
    c3.metric("Answer tokens", len(tokens), help=f"{len(a.layout)} tokens with the prompt")
    c4.metric("Trace", f"{a.trace_seconds * 1000:.0f} ms", help="one forward pass, CPU/GPU time")
    colour = pick_colouring(state, panel)
    source = {
        "generated": "written by the model",
        "pasted": "pasted",
        "dataset": "from the dataset",
    }
    scale = None
    if colour is not None:
        fixed = st.toggle(
            "Fixed 0–1 scale",
            key=KEY_FIXED_SCALE,
            help="Token scores are probabilities. By default an answer whose scores are all "
            f"below {ADAPT_BELOW} is coloured from 0 to its own highest score",
        )
        values = detector_token_scores(a, colour)
        judged = panel.result.judged_by if panel.result is not None else None
        det = (judged or panel.shipped).card(colour.detector).detector
        scale = detector_scale(values, flag_threshold(det), fixed=fixed)
    meaning = (
        "Colour: surprisal, −log₂ p(token | prompt, earlier answer tokens); darker = the model "
        "expected it less."
        if scale is None or colour is None
        else f"Colour: the {colour.detector} detector's score for each token; darker = more "
        f"likely part of a hallucination by its reckoning. {scale.note}"
    )
    st.caption(
        f"{md(a.model_name)} read the answer "
        f"({md(source.get(a.answer_source, a.answer_source))}). "
        f"{meaning} Hover a token for details."
        + (
            " Tokens underlined in blue lie inside a gold hallucination span."
            if a.labels is not None
            else ""
        )
    )
    render_token_heatmap(
        tokens,
        s if colour is None else detector_token_scores(a, colour),
        labels=a.labels,
        positions=a.layout.response_positions.tolist(),
        value_name=_colour_label(COLOR_SURPRISAL if colour is None else colour.detector),
        vmin=None if scale is None else scale.vmin,
        vmax=None if scale is None else scale.vmax,
    )

    show_detector_verdicts(panel, state)

    st.subheader("What the model read")
    rows = segment_rows(a.layout.segments)
    plot(segment_figure(a.layout.segments), key="playground.segments")
    st.caption(
        " · ".join(f"{md(r.label)}: {r.n_tokens}" for r in rows) + f" — {len(a.layout)} tokens"
    )
    with st.expander("Token table"):
        st.dataframe(a.token_frame(), hide_index=True, width="stretch", height=360)
