"""Token heatmaps: the controls under the answer (p_stay and threshold sliders, the row the
threshold reads, the rows shown, smoothing of the others) and their values in the URL."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import streamlit as st

from app.components.heatmap_rows import ROW_GOLD, ROW_IDS, ROW_SURPRISAL, default_flag_row, row_id
from app.components.heatmap_scan import current_threshold
from app.state.heatmaps import (
    KEY_FLAG_ROW,
    KEY_P_STAY,
    KEY_ROWS,
    KEY_SMOOTH_ALL,
    KEY_THRESHOLD,
    sync_rows_widget,
    sync_widget_values,
)
from app.state.links import (
    P_DETECTOR,
    P_HIDE,
    P_P_STAY,
    P_SMOOTH_ALL,
    P_THRESHOLD,
    Followed,
    flag,
    flag_id,
    follow,
    follow_list,
    follow_widget,
    number,
    number_id,
    publish,
)
from app.state.session import AppState, seed_widget
from app.text import md
from core.learning.contract import flag_threshold
from core.signals.smoothing import P_STAY_ANSWER, P_STAY_TOKEN

if TYPE_CHECKING:
    from app.components.multirow import HeatRow
    from core.detectors.cortex import CortexDetector

P_STAY_MIN, P_STAY_MAX = 0.5, 0.999


@dataclass(frozen=True, kw_only=True)
class Links:
    """What an opened link set for the controls (they are drawn below the answer)."""

    p_stay: Followed[float]
    threshold: Followed[float]
    smooth_all: Followed[bool]


def sync_sliders(state: AppState) -> Links:
    """Take the controls' new values (or an opened link's) before the example list and the
    rows read them (they are drawn after both, and a moved control reruns the page from the
    top)."""
    links = Links(
        p_stay=follow_widget(P_P_STAY, KEY_P_STAY, number(P_STAY_MIN, P_STAY_MAX)),
        threshold=follow_widget(P_THRESHOLD, KEY_THRESHOLD, number(0.0, 1.0)),
        smooth_all=follow_widget(P_SMOOTH_ALL, KEY_SMOOTH_ALL, flag),
    )
    sync_widget_values(state.heatmap)
    return links


def flag_row(state: AppState, scored: list[str]) -> Followed[str]:
    """The "Flag tokens by" select box (when some row scores tokens); the link's detector."""
    by_id = {ROW_IDS.get(n, n): n for n in scored}
    link = follow(P_DETECTOR, by_id.get)
    if not scored:
        return link
    if link.value is not None:
        state.heatmap.flag_row = link.value
        st.session_state[KEY_FLAG_ROW] = link.value
    if state.heatmap.flag_row not in scored:
        state.heatmap.flag_row = default_flag_row(scored)
        st.session_state.pop(KEY_FLAG_ROW, None)
    seed_widget(KEY_FLAG_ROW, state.heatmap.flag_row)
    state.heatmap.flag_row = st.selectbox("Flag tokens by", scored, key=KEY_FLAG_ROW)
    return link


def sliders(state: AppState, cortex: CortexDetector | None) -> float:
    """The p_stay and threshold sliders, side by side; returns the default threshold."""
    c1, c2 = st.columns(2)
    with c1:
        seed_widget(KEY_P_STAY, state.heatmap.p_stay)
        state.heatmap.p_stay = st.slider(
            "p_stay (label persistence)",
            min_value=P_STAY_MIN,
            max_value=P_STAY_MAX,
            step=0.001,
            format="%.3f",
            key=KEY_P_STAY,
            help="Chance that the next token keeps this token's label; 0.5 = no smoothing. "
            f"CORTEX uses {P_STAY_TOKEN} for tokens and {P_STAY_ANSWER} for its answer score.",
        )
    with c2:
        default_threshold = round(flag_threshold(cortex) if cortex is not None else 0.5, 2)
        seed_widget(KEY_THRESHOLD, round(current_threshold(state, cortex), 2))
        state.heatmap.threshold = st.slider(
            "Threshold",
            min_value=0.0,
            max_value=1.0,
            step=0.01,
            key=KEY_THRESHOLD,
            help="Tokens whose score (in the row below) reaches it are flagged",
        )
    return default_threshold


def publish_sliders(state: AppState, links: Links, default_threshold: float) -> None:
    """The sliders' values in the URL."""
    publish(
        P_P_STAY,
        number_id(state.heatmap.p_stay, 3),
        default=number_id(P_STAY_TOKEN, 3),
        missing=links.p_stay.missing,
        what="p_stay",
        where=f"a number from {P_STAY_MIN} to {P_STAY_MAX}",
    )
    publish(
        P_THRESHOLD,
        number_id(state.heatmap.threshold or 0.0, 2),
        default=number_id(default_threshold, 2),
        missing=links.threshold.missing,
        what="threshold",
        where="a number from 0 to 1",
    )


def smooth_all_toggle(state: AppState) -> None:
    """The "Smooth the other detectors too" toggle."""
    seed_widget(KEY_SMOOTH_ALL, state.heatmap.smooth_all)
    state.heatmap.smooth_all = st.toggle(
        "Smooth the other detectors too",
        key=KEY_SMOOTH_ALL,
        help="Apply the same label-persistence smoothing to every detector's token scores",
    )


def publish_flag_row(
    state: AppState, scored: list[str], row_link: Followed[str], links: Links
) -> None:
    """The row the threshold reads and the smoothing of the others, in the URL."""
    default_row = default_flag_row(scored) if scored else None
    row = state.heatmap.flag_row
    publish(
        P_DETECTOR,
        ROW_IDS.get(row, row) if scored and row is not None else None,
        default=ROW_IDS.get(default_row, default_row) if default_row else None,
        missing=row_link.missing,
        what="detector",
        where="one whose token scores this answer shows ("
        + (", ".join(ROW_IDS.get(n, n) for n in scored) or "none")
        + ")",
        instead=md(state.heatmap.flag_row) if scored else "no flags",
    )
    publish(
        P_SMOOTH_ALL,
        flag_id(state.heatmap.smooth_all),
        default=flag_id(False),
        missing=links.smooth_all.missing,
        where="1 or 0",
    )


def rows_picker(
    state: AppState, rows: dict[str, HeatRow]
) -> tuple[list[str], dict[str, str], Followed[list[str]]]:
    """The "Rows" multiselect; returns the rows, their URL names and the link's hidden rows."""
    # Rows come and go with the answer (gold spans, detectors): the widget is reset
    # to "every row but the ones hidden" whenever the available rows change.
    names = list(rows)
    by_id = {row_id(n): n for n in names}
    hide_link = follow_list(P_HIDE, by_id.get)
    sync_rows_widget(state.heatmap, names, hide_link.value)
    picked = st.multiselect("Rows", names, key=KEY_ROWS)
    state.heatmap.hidden = {n for n in state.heatmap.hidden if n not in names} | {
        n for n in names if n not in picked
    }
    return names, by_id, hide_link


def controls(
    state: AppState, rows: dict[str, HeatRow], cortex: CortexDetector | None, links: Links
) -> None:
    """The p_stay and threshold sliders, the row to threshold, rows shown, smoothing of others
    (their values in the URL)."""
    default_threshold = sliders(state, cortex)
    publish_sliders(state, links, default_threshold)
    scored = [n for n in rows if n not in (ROW_GOLD, ROW_SURPRISAL) and not n.startswith("RAGLens")]
    c3, c4 = st.columns([1, 2], vertical_alignment="bottom")
    with c3:
        row_link = flag_row(state, scored)
        smooth_all_toggle(state)
    publish_flag_row(state, scored, row_link, links)
    with c4:
        names, by_id, hide_link = rows_picker(state, rows)
    publish(
        P_HIDE,
        ",".join(row_id(n) for n in names if n in state.heatmap.hidden) or None,
        missing=hide_link.missing,
        what="hidden rows",
        where="among the rows of this answer (" + ", ".join(by_id) + ")",
        instead="the rows picked below",
    )
