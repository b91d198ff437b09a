"""Token heatmaps: scan a dataset with CORTEX and keep only the answers that get flagged."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
import streamlit as st

from app.components.estimate import estimate_caption, progress_bar
from app.state.datasets import get_store
from app.state.estimates import paced_extraction, work_estimate
from app.state.heatmaps import CORTEX, KEY_ONLY_FLAGGED, KEY_SCAN, KEY_SCAN_LIMIT
from app.state.links import P_ONLY_FLAGGED, bind, flag, flag_id
from app.state.session import AppState, seed_widget
from app.text import md
from core.base.errors import RagscopeError
from core.learning.contract import flag_threshold
from core.pipeline.extract import FeatureCache, extract_features
from core.signals.smoothing import smooth_tokens, token_flags

SCAN_ACTION = "heatmap-scan"
"""What a CORTEX scan's paces are recorded as (:mod:`app.state.estimates`)."""

if TYPE_CHECKING:
    from core.base.examples import RAGExample
    from core.detectors.cortex import CortexDetector
    from core.engine.model import LoadedModel


def scan_dataset(
    model: LoadedModel, cortex: CortexDetector, examples: list[RAGExample]
) -> dict[str, np.ndarray]:
    """CORTEX's raw token scores for ``examples`` (features from the cache when there)."""

    timed = paced_extraction(model, examples, [cortex], action=SCAN_ACTION)
    with progress_bar("Scanning with CORTEX:") as progress, timed as pacer:
        ext = extract_features(
            model,
            examples,
            [cortex],
            cache=FeatureCache(get_store()),
            progress=pacer.ticking(progress),
            on_error="skip",
        )
    return {f.example_id: cortex.raw_token_scores(f) for f in ext.features[CORTEX]}


def has_flags(raw: np.ndarray, p_stay: float, threshold: float) -> bool:
    """Whether any smoothed token of an answer reaches the threshold."""
    return bool(raw.size) and bool(
        token_flags(np.asarray(smooth_tokens(raw, p_stay)), threshold).any()
    )


def flagged_only(
    state: AppState, model: LoadedModel, cortex: CortexDetector | None
) -> Callable[[str, list[RAGExample]], list[RAGExample] | None]:
    """The scan row under the dataset choice, and the "only flagged answers" filter."""

    def narrow(key: str, examples: list[RAGExample]) -> list[RAGExample] | None:
        scan_key = f"{model.instance_key}|{key}"
        if cortex is not None:
            scan_row(state, model, cortex, examples, scan_key)
        scanned = state.heatmap.scan.get(scan_key, {})
        if not (state.heatmap.only_flagged and scanned):
            return examples
        threshold = current_threshold(state, cortex)
        flagged = {
            i for i, raw in scanned.items() if has_flags(raw, state.heatmap.p_stay, threshold)
        }
        kept = [e for e in examples if e.id in flagged]
        st.caption(
            f"{len(kept)} of the {len(scanned)} scanned answers have a token at or above "
            f"{threshold:.3f} (smoothed with p_stay {state.heatmap.p_stay:.3f})."
        )
        if not kept:
            st.info("No scanned answer is flagged at this threshold; lower it or scan more.")
            return None
        return kept

    return narrow


def scan_row(
    state: AppState,
    model: LoadedModel,
    cortex: CortexDetector,
    examples: list[RAGExample],
    scan_key: str,
) -> None:
    """ "Only flagged answers" + how many to scan + the Scan button."""
    c1, c2, c3 = st.columns([2, 1, 1], vertical_alignment="bottom")
    state.heatmap.only_flagged = bind(
        P_ONLY_FLAGGED,
        KEY_ONLY_FLAGGED,
        lambda: c1.toggle(
            "Only answers with flags",
            key=KEY_ONLY_FLAGGED,
            help="Keep the answers where some token's smoothed CORTEX score reaches the "
            "threshold (needs a scan of the dataset)",
        ),
        parse=flag,
        to_id=flag_id,
        seed=state.heatmap.only_flagged,
        default=flag_id(False),
        where="1 or 0",
    )
    with c2:
        seed_widget(KEY_SCAN_LIMIT, min(state.heatmap.scan_limit, len(examples)))
        state.heatmap.scan_limit = int(
            st.number_input(
                "Scan at most",
                min_value=1,
                max_value=len(examples),
                step=10,
                key=KEY_SCAN_LIMIT,
            )
        )
    with c3:
        scan = st.button("Scan", key=KEY_SCAN, icon=":material/radar:", width="stretch")
    if not scan:
        estimate_caption(
            lambda: work_estimate(
                model, examples[: state.heatmap.scan_limit], [cortex], action=SCAN_ACTION
            )
        )
    if scan:
        try:
            found = scan_dataset(model, cortex, examples[: state.heatmap.scan_limit])
        except RagscopeError as e:
            st.error(f"The scan failed: {md(e)}")
            return
        state.heatmap.scan.setdefault(scan_key, {}).update(found)


def current_threshold(state: AppState, cortex: CortexDetector | None) -> float:
    if state.heatmap.threshold is not None:
        return state.heatmap.threshold
    return flag_threshold(cortex) if cortex is not None else 0.5
