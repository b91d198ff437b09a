"""Token heatmaps: the page's state, the widget keys of its answer choice, one answer's
raw rows and the session-state helpers of its controls."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import streamlit as st

from app.state.analysis import Analysis, analyse
from app.state.detectors import DetectorSet
from app.state.heads import AnswerChoice
from app.state.verdicts import DetectorVerdicts, detector_verdicts
from core.detectors import DETECTORS
from core.learning.contract import align_token_scores
from core.signals.smoothing import P_STAY_TOKEN

if TYPE_CHECKING:
    from core.base.examples import RAGExample
    from core.detectors.cortex import CortexDetector
    from core.detectors.raglens import RaglensAnswer, RaglensDetector
    from core.engine.model import LoadedModel

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


CORTEX = DETECTORS.explained("token-heatmaps")
RAGLENS = DETECTORS.explained("sae-features")


@dataclass(frozen=True, kw_only=True, eq=False)
class AnswerRows:
    """Everything the heatmap shows for one answer (before the sliders)."""

    analysis: Analysis
    verdicts: DetectorVerdicts
    cortex_raw: np.ndarray | None
    raglens: RaglensAnswer | None


@st.cache_data(show_spinner=False, max_entries=32)
def _raglens_cached(
    key: str,
    signature: str,
    stamp: str,
    _model: LoadedModel,
    _det: RaglensDetector,
    _ex: RAGExample,
) -> RaglensAnswer:
    return _det.explain_answer(_model, _ex)


def read_answer(
    model: LoadedModel, example: RAGExample, ids: tuple[int, ...] | None, shipped: DetectorSet
) -> AnswerRows:
    """Trace the answer once per detector family and collect every row's raw values."""
    analysis = analyse(model, example, response_ids=ids, answer_source="dataset")
    verdicts = detector_verdicts(model, analysis, shipped)
    shipped = shipped.for_example(example)  # the set that judged it (its expert, if any)
    by_name = {d.name: d for d in shipped.detectors}
    raw = None
    if CORTEX in verdicts.features:
        cortex: CortexDetector = by_name[CORTEX].detector  # type: ignore[assignment]
        f = verdicts.features[CORTEX]
        raw = align_token_scores(
            cortex.raw_token_scores(f),
            np.asarray(f.token_offsets),
            analysis.layout.response_offsets,
        )
    rl = None
    if RAGLENS in by_name:
        rl = _raglens_cached(
            model.instance_key,
            analysis.signature,
            shipped.cache_id,
            model,
            by_name[RAGLENS].detector,  # type: ignore[arg-type]
            example,
        )
    return AnswerRows(analysis=analysis, verdicts=verdicts, cortex_raw=raw, raglens=rl)


def sync_widget_values(heatmap: HeatmapState) -> None:
    """Take the sliders' and the smoothing toggle's new values from the session (they are
    drawn after the rows that read them)."""
    if KEY_P_STAY in st.session_state:
        heatmap.p_stay = float(st.session_state[KEY_P_STAY])
    if KEY_THRESHOLD in st.session_state:
        heatmap.threshold = float(st.session_state[KEY_THRESHOLD])
    if KEY_SMOOTH_ALL in st.session_state:
        heatmap.smooth_all = bool(st.session_state[KEY_SMOOTH_ALL])


def sync_rows_widget(heatmap: HeatmapState, names: list[str], linked: list[str] | None) -> None:
    """Reset the "Rows" widget to every row but the hidden ones whenever the available rows
    change (they come and go with the answer) or a link names the hidden rows."""
    if linked is not None:  # a link's hidden rows (every other row shown)
        heatmap.hidden = set(linked)
        st.session_state[KEY_ROWS_OPTIONS] = None
    if st.session_state.get(KEY_ROWS_OPTIONS) != names:
        st.session_state[KEY_ROWS_OPTIONS] = names
        st.session_state[KEY_ROWS] = [n for n in names if n not in heatmap.hidden]
