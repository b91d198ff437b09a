"""Token heatmaps: the rows of one answer (gold spans, CORTEX raw and smoothed, the other
detectors that score tokens, the top RAGLens features, surprisal) and their names."""

from __future__ import annotations

import numpy as np

from app.components.multirow import ACTIVATION_CMAP, HeatRow, gold_row
from app.state.heatmaps import CORTEX, AnswerRows
from core.learning.contract import align_token_scores
from core.signals.smoothing import smooth_tokens

ROW_GOLD = "gold span"
ROW_RAW = "CORTEX raw"
ROW_SMOOTH = "CORTEX smoothed"
ROW_SURPRISAL = "surprisal (bits)"
RAGLENS_ROWS = 2
ROW_IDS = {ROW_RAW: "cortex-raw", ROW_SMOOTH: CORTEX}  # other rows: the detector's name
HIDE_IDS = {**ROW_IDS, ROW_GOLD: "gold", ROW_SURPRISAL: "surprisal"}


def row_id(name: str) -> str:
    """A row as the URL names it: ``gold``, ``surprisal``, ``cortex-raw``, ``cortex``,
    ``F12`` for a RAGLens feature's row, else the detector's name."""
    return HIDE_IDS.get(name) or name.removeprefix("RAGLens ")


def default_flag_row(scored: list[str]) -> str:
    """The row flags come from in a fresh session: CORTEX smoothed, else the first scored."""
    return ROW_SMOOTH if ROW_SMOOTH in scored else scored[0]


def build_rows(a: AnswerRows, p_stay: float, smooth_all: bool) -> dict[str, HeatRow]:
    """Every available row by name, in display order."""
    rows: dict[str, HeatRow] = {}
    labels = a.analysis.labels
    offsets = a.analysis.layout.response_offsets
    if labels is not None:
        rows[ROW_GOLD] = gold_row(labels, ROW_GOLD)
    if a.cortex_raw is not None:
        rows[ROW_RAW] = HeatRow(name=ROW_RAW, values=a.cortex_raw)
        finite = np.nan_to_num(a.cortex_raw, nan=0.0)
        rows[ROW_SMOOTH] = HeatRow(
            name=f"{ROW_SMOOTH}", values=np.asarray(smooth_tokens(finite, p_stay), dtype=float)
        )
    for v in a.verdicts.verdicts:
        if v.detector == CORTEX or v.token_scores is None or v.token_offsets is None:
            continue
        vals = align_token_scores(v.token_scores, v.token_offsets, offsets)
        if smooth_all:
            vals = np.asarray(smooth_tokens(np.nan_to_num(vals, nan=0.0), p_stay), dtype=float)
        rows[v.detector] = HeatRow(name=v.detector, values=vals)
    if a.raglens is not None:
        for k in a.raglens.top_positive(RAGLENS_ROWS):
            act = align_token_scores(a.raglens.activations_of(k), a.raglens.token_offsets, offsets)
            top = float(np.nanmax(act)) if np.isfinite(act).any() else 0.0
            name = f"RAGLens F{k}"
            rows[name] = HeatRow(
                name=name,
                values=act / top if top > 0 else np.zeros_like(act),
                cmap=ACTIVATION_CMAP,
                shown=["n/a" if np.isnan(x) else f"{x:.3f}" for x in act],
            )
    s = a.analysis.surprisal
    rows[ROW_SURPRISAL] = HeatRow(
        name=ROW_SURPRISAL, values=s, vmin=0.0, vmax=max(float(s.max()), 1.0), fmt=".2f"
    )
    return rows
