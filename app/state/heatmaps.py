"""Token heatmaps: the page's state and the widget keys of its answer choice."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from app.state.heads import AnswerChoice
from core.signals.smoothing import P_STAY_TOKEN

KEY_HEATMAP_SOURCE = "heatmaps.example.source"
KEY_HEATMAP_DATASET = "heatmaps.dataset"
KEY_HEATMAP_EXAMPLE = "heatmaps.example.id"


@dataclass(kw_only=True)
class HeatmapState(AnswerChoice):
    """The Token heatmaps page's choices (its answer as every one-answer page picks it).

    The answer it shows: :class:`~app.state.heads.AnswerChoice`.

    Attributes:
        p_stay: The smoothing slider's ``p_stay``.
        threshold: The flagging threshold (``None``: the CORTEX artifact's).
        flag_row: The row whose scores the threshold reads (``None``: CORTEX smoothed).
        smooth_all: Whether the other detectors' rows are smoothed too.
        hidden: The rows the user took off the heatmap.
        focus: Index of the predicted span "Previous"/"Next" jumped to (-1: none).
        focus_for: The answer (signature) that focus belongs to.
        only_flagged: Whether the example list keeps only answers with flags.
        scan_limit: How many answers of the dataset a scan reads.
        scan: Dataset key -> example id -> CORTEX raw token scores, from scans.
    """

    p_stay: float = P_STAY_TOKEN
    threshold: float | None = None
    flag_row: str | None = None
    smooth_all: bool = False
    hidden: set[str] = field(default_factory=set)
    focus: int = -1
    focus_for: str | None = None
    only_flagged: bool = False
    scan_limit: int = 16
    scan: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)


# The token heatmaps page's widgets
KEY_ONLY_FLAGGED = "heatmaps.only_flagged"
KEY_SCAN_LIMIT = "heatmaps.scan.limit"
KEY_SCAN = "heatmaps.scan"
KEY_P_STAY = "heatmaps.p_stay"
KEY_THRESHOLD = "heatmaps.threshold"
KEY_FLAG_ROW = "heatmaps.flag_row"
KEY_SMOOTH_ALL = "heatmaps.smooth_all"
KEY_ROWS = "heatmaps.rows"
KEY_ROWS_OPTIONS = "heatmaps.rows.options"
KEY_PREV = "heatmaps.prev"
KEY_NEXT = "heatmaps.next"
