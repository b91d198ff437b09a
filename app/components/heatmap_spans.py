"""Token heatmaps: one row's predicted spans against the gold spans (overlap F1, token F1),
stepping through them, and what to say when nothing is flagged."""

from __future__ import annotations

import numpy as np
import pandas as pd
import streamlit as st

from app.state.heatmaps import KEY_NEXT, KEY_PREV, AnswerRows
from app.state.session import AppState
from app.text import md
from core.learning.metrics import token_prf
from core.signals.smoothing import flagged_spans, span_overlap_f1, token_flags

Span = tuple[int, int]


def nothing_flagged(vals: np.ndarray, offsets: np.ndarray, text: str, threshold: float) -> str:
    """What to say when no token of the answer reaches ``threshold``: its highest score,
    where, and that a threshold at or below it would flag it."""
    if not vals.size:
        return "This answer has no scored token."
    top = int(np.argmax(vals))
    a0, a1 = (int(v) for v in offsets[top])
    return (
        f"No token reaches the threshold {threshold:.3f}. The highest score here is "
        f"{float(vals[top]):.3f}, at \u201c{md(text[a0:a1].strip())}\u201d (characters "
        f"{a0}\u2013{a1}): a threshold at or below {float(vals[top]):.3f} would flag it."
    )


def span_metrics(
    a: AnswerRows, vals: np.ndarray, pred: list[Span], gold: list[Span], threshold: float
) -> None:
    """Predicted and gold span counts, span F1 (overlap) and token F1."""
    labels = a.analysis.labels
    cols = st.columns(4)
    cols[0].metric("Predicted spans", len(pred))
    cols[1].metric("Gold spans", len(gold))
    if a.analysis.example.label is None and not gold:
        cols[2].metric("Span F1 (overlap)", "n/a", help="the answer has no gold labels")
    else:
        m = span_overlap_f1(pred, gold)
        cols[2].metric(
            "Span F1 (overlap)",
            f"{m['f1']:.2f}",
            help=f"precision {m['precision']:.2f} (predicted spans touching a gold span), "
            f"recall {m['recall']:.2f} (gold spans touched by a predicted span)",
        )
    if labels is not None:
        t = token_prf(token_flags(vals, threshold), labels)
        cols[3].metric(
            "Token F1",
            f"{t['f1']:.2f}",
            help=f"precision {t['precision']:.2f}, recall {t['recall']:.2f}",
        )


def step_spans(
    state: AppState,
    a: AnswerRows,
    vals: np.ndarray,
    pred: list[Span],
    gold: list[Span],
    threshold: float,
    signature: str,
) -> Span | None:
    """Previous / Next through the predicted spans; the focused span's token indices."""
    offsets = a.analysis.layout.response_offsets
    text = a.analysis.example.response
    if state.heatmap.focus_for != signature:
        state.heatmap.focus, state.heatmap.focus_for = -1, signature
    b1, b2, b3 = st.columns([1, 1, 4], vertical_alignment="center")
    if b1.button("Previous", key=KEY_PREV, icon=":material/arrow_back:", disabled=not pred):
        state.heatmap.focus = (state.heatmap.focus - 1) % len(pred)
    if b2.button("Next", key=KEY_NEXT, icon=":material/arrow_forward:", disabled=not pred):
        state.heatmap.focus = (state.heatmap.focus + 1) % len(pred)
    focus = None
    if pred and 0 <= state.heatmap.focus < len(pred):
        s0, s1 = pred[state.heatmap.focus]
        hit = np.nonzero((offsets[:, 0] < s1) & (s0 < offsets[:, 1]))[0]
        focus = (int(hit.min()), int(hit.max()))
        touches = any(g0 < s1 and s0 < g1 for g0, g1 in gold)
        b3.markdown(
            f"Span {state.heatmap.focus + 1} of {len(pred)}: "
            f"**\u201c{md(text[s0:s1].strip())}\u201d** "
            f"(characters {s0}\u2013{s1}; max score {vals[focus[0] : focus[1] + 1].max():.3f}; "
            f"{'overlaps a gold span' if touches else 'no gold span here'})"
        )
    elif pred:
        b3.caption("Step through the predicted spans with Previous / Next.")
    else:
        b3.caption(nothing_flagged(vals, offsets, text, threshold))
    return focus


def span_readout(
    state: AppState, a: AnswerRows, values: np.ndarray | None, signature: str
) -> Span | None:
    """Predicted vs gold spans, overlap F1, and stepping through the predicted spans.

    Returns the focused span's first and last token indices (or ``None``).
    """
    st.subheader("Predicted spans of one row")
    if values is None:
        st.info("No detector here scores single tokens; train CORTEX to flag spans.")
        return None
    threshold = state.heatmap.threshold if state.heatmap.threshold is not None else 0.5
    offsets = a.analysis.layout.response_offsets
    text = a.analysis.example.response
    vals = np.nan_to_num(values, nan=0.0)
    pred = flagged_spans(vals, offsets, threshold)
    gold = [(s.start, s.end) for s in a.analysis.example.spans]
    span_metrics(a, vals, pred, gold, threshold)
    focus = step_spans(state, a, vals, pred, gold, threshold, signature)
    if pred or gold:
        rows = [
            {"kind": "predicted", "start": s0, "end": s1, "text": text[s0:s1]} for s0, s1 in pred
        ] + [{"kind": "gold", "start": s0, "end": s1, "text": text[s0:s1]} for s0, s1 in gold]
        st.dataframe(pd.DataFrame(rows), hide_index=True, width="stretch")
    return focus
