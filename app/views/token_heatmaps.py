"""Token heatmaps: every detector's reading of one answer, token by token, aligned.

One answer, several rows of cells under the same tokens: the gold spans, CORTEX's
raw token probabilities and their label-persistence smoothing (the ``p_stay`` slider
re-smooths live), every other shipped detector that scores single tokens, the
strongest RAGLens SAE features' activations and the model's own surprisal. A
threshold on one row marks the predicted spans; the page compares them with the gold
spans (overlap F1), steps through them, and can scan a dataset to list only the
answers that get flagged.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import streamlit as st

from app.components.artifacts import show_broken_artifacts
from app.components.estimate import estimate_caption, progress_bar
from app.components.example_picker import AnswerKeys, pick_page_answer
from app.components.exports import plot
from app.components.multirow import ACTIVATION_CMAP, HeatRow, gold_row, multirow_html
from app.components.set_spans import set_spans_section
from app.state.analysis import Analysis, analyse
from app.state.datasets import get_store
from app.state.detectors import ShippedDetectors, shipped_detectors
from app.state.estimates import paced_extraction, work_estimate
from app.state.heatmaps import (
    KEY_FLAG_ROW,
    KEY_HEATMAP_DATASET,
    KEY_HEATMAP_EXAMPLE,
    KEY_HEATMAP_SOURCE,
    KEY_NEXT,
    KEY_ONLY_FLAGGED,
    KEY_P_STAY,
    KEY_PREV,
    KEY_ROWS,
    KEY_ROWS_OPTIONS,
    KEY_SCAN,
    KEY_SCAN_LIMIT,
    KEY_SMOOTH_ALL,
    KEY_THRESHOLD,
)
from app.state.links import (
    P_DETECTOR,
    P_HIDE,
    P_ONLY_FLAGGED,
    P_P_STAY,
    P_SMOOTH_ALL,
    P_THRESHOLD,
    Followed,
    bind,
    flag,
    flag_id,
    follow,
    follow_list,
    follow_widget,
    number,
    number_id,
    publish,
)
from app.state.model import get_model
from app.state.session import AppState, app_state, seed_widget
from app.state.spad_views import train_command
from app.state.verdicts import DetectorVerdicts, detector_verdicts
from app.text import code, md
from core.base.errors import RagscopeError
from core.learning.contract import align_token_scores, flag_threshold
from core.learning.metrics import token_prf
from core.pipeline.extract import FeatureCache, extract_features
from core.signals.smoothing import (
    P_STAY_ANSWER,
    P_STAY_TOKEN,
    flagged_spans,
    smooth_tokens,
    span_overlap_f1,
    token_flags,
)

if TYPE_CHECKING:
    from core.base.examples import RAGExample
    from core.detectors.cortex import CortexDetector
    from core.detectors.raglens import RaglensAnswer, RaglensDetector
    from core.engine.model import LoadedModel

# Page scripts run with Streamlit's magic: a bare string would be drawn, so no
# attribute docstrings here.
CORTEX = "cortex"
RAGLENS = "raglens"
ROW_GOLD = "gold span"
ROW_RAW = "CORTEX raw"
ROW_SMOOTH = "CORTEX smoothed"
ROW_SURPRISAL = "surprisal (bits)"
RAGLENS_ROWS = 2
ANSWER_KEYS = AnswerKeys(
    source=KEY_HEATMAP_SOURCE, dataset=KEY_HEATMAP_DATASET, example=KEY_HEATMAP_EXAMPLE
)
P_STAY_MIN, P_STAY_MAX = 0.5, 0.999
ROW_IDS = {ROW_RAW: "cortex-raw", ROW_SMOOTH: CORTEX}  # other rows: the detector's name
HIDE_IDS = {**ROW_IDS, ROW_GOLD: "gold", ROW_SURPRISAL: "surprisal"}


def row_id(name: str) -> str:
    """A row as the URL names it: ``gold``, ``surprisal``, ``cortex-raw``, ``cortex``,
    ``F12`` for a RAGLens feature's row, else the detector's name."""
    return HIDE_IDS.get(name) or name.removeprefix("RAGLens ")


@dataclass(frozen=True, kw_only=True)
class Links:
    """What an opened link set for the controls (they are drawn below the answer)."""

    p_stay: Followed[float]
    threshold: Followed[float]
    smooth_all: Followed[bool]


@dataclass(frozen=True, kw_only=True, eq=False)
class AnswerRows:
    """Everything the heatmap shows for one answer (before the sliders)."""

    analysis: Analysis
    verdicts: DetectorVerdicts
    cortex_raw: np.ndarray | None
    raglens: RaglensAnswer | None


# --------------------------------------------------------------------------- data


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
    model: LoadedModel, example: RAGExample, ids: tuple[int, ...] | None, shipped: ShippedDetectors
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
            cortex.raw_token_scores(f), f.token_offsets, analysis.layout.response_offsets
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


def scan_dataset(
    model: LoadedModel, cortex: CortexDetector, examples: list[RAGExample]
) -> dict[str, np.ndarray]:
    """CORTEX's raw token scores for ``examples`` (features from the cache when there)."""

    timed = paced_extraction(model, examples, [cortex])
    with progress_bar("Scanning with CORTEX:") as progress, timed:
        ext = extract_features(
            model,
            examples,
            [cortex],
            cache=FeatureCache(get_store()),
            progress=progress,
            on_error="skip",
        )
    return {f.example_id: cortex.raw_token_scores(f) for f in ext.features[CORTEX]}


def has_flags(raw: np.ndarray, p_stay: float, threshold: float) -> bool:
    """Whether any smoothed token of an answer reaches the threshold."""
    return bool(raw.size) and bool(token_flags(smooth_tokens(raw, p_stay), threshold).any())


# --------------------------------------------------------------------------- input


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
            lambda: work_estimate(model, examples[: state.heatmap.scan_limit], [cortex])
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


# --------------------------------------------------------------------------- view


def default_flag_row(scored: list[str]) -> str:
    """The row flags come from in a fresh session: CORTEX smoothed, else the first scored."""
    return ROW_SMOOTH if ROW_SMOOTH in scored else scored[0]


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


def controls(
    state: AppState, rows: dict[str, HeatRow], cortex: CortexDetector | None, links: Links
) -> None:
    """The p_stay and threshold sliders, the row to threshold, rows shown, smoothing of others
    (their values in the URL)."""
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
    scored = [n for n in rows if n not in (ROW_GOLD, ROW_SURPRISAL) and not n.startswith("RAGLens")]
    c3, c4 = st.columns([1, 2], vertical_alignment="bottom")
    with c3:
        row_link = flag_row(state, scored)
        seed_widget(KEY_SMOOTH_ALL, state.heatmap.smooth_all)
        state.heatmap.smooth_all = st.toggle(
            "Smooth the other detectors too",
            key=KEY_SMOOTH_ALL,
            help="Apply the same label-persistence smoothing to every detector's token scores",
        )
    default_row = default_flag_row(scored) if scored else None
    publish(
        P_DETECTOR,
        ROW_IDS.get(state.heatmap.flag_row, state.heatmap.flag_row) if scored else None,
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
    with c4:
        # Rows come and go with the answer (gold spans, detectors): the widget is reset
        # to "every row but the ones hidden" whenever the available rows change.
        names = list(rows)
        by_id = {row_id(n): n for n in names}
        hide_link = follow_list(P_HIDE, by_id.get)
        if hide_link.value is not None:  # a link's hidden rows (every other row shown)
            state.heatmap.hidden = set(hide_link.value)
            st.session_state[KEY_ROWS_OPTIONS] = None
        if st.session_state.get(KEY_ROWS_OPTIONS) != names:
            st.session_state[KEY_ROWS_OPTIONS] = names
            st.session_state[KEY_ROWS] = [n for n in names if n not in state.heatmap.hidden]
        picked = st.multiselect("Rows", names, key=KEY_ROWS)
        state.heatmap.hidden = {n for n in state.heatmap.hidden if n not in names} | {
            n for n in names if n not in picked
        }
    publish(
        P_HIDE,
        ",".join(row_id(n) for n in names if n in state.heatmap.hidden) or None,
        missing=hide_link.missing,
        what="hidden rows",
        where="among the rows of this answer (" + ", ".join(by_id) + ")",
        instead="the rows picked below",
    )


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


def span_readout(
    state: AppState, a: AnswerRows, values: np.ndarray | None, signature: str
) -> tuple[int, int] | None:
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
    if pred or gold:
        rows = [
            {"kind": "predicted", "start": s0, "end": s1, "text": text[s0:s1]} for s0, s1 in pred
        ] + [{"kind": "gold", "start": s0, "end": s1, "text": text[s0:s1]} for s0, s1 in gold]
        st.dataframe(pd.DataFrame(rows), hide_index=True, width="stretch")
    return focus


def loss_curve(cortex: CortexDetector) -> None:
    """The shipped CORTEX's training (and validation) loss per epoch, in an expander."""
    import plotly.graph_objects as go

    info = cortex.train_info_
    train = info.get("loss_curve") or []
    if not train:
        return
    val = info.get("validation_loss_curve") or []
    with st.expander(
        md(
            f"CORTEX training: {info.get('n_tokens', '?')} tokens of "
            f"{info.get('n_token_answers', '?')} answers, "
            f"{info.get('n_positive_tokens', '?')} in gold spans"
        )
    ):
        fig = go.Figure()
        epochs = list(range(1, len(train) + 1))
        fig.add_scatter(x=epochs, y=train, mode="lines+markers", name="training")
        if val:
            fig.add_scatter(x=epochs, y=val, mode="lines+markers", name="validation")
        fig.update_layout(
            title="CORTEX loss per epoch (class-weighted BCE)",
            xaxis_title="epoch",
            yaxis_title="loss",
            height=300,
            margin={"t": 40, "b": 40},
        )
        plot(fig, key="heatmaps.loss")
        st.caption(
            "A validation loss that rises while the training loss falls means the MLP "
            "memorises the training tokens; the spec fixes 10 epochs, the curve shows the cost."
        )


def sync_sliders(state: AppState) -> Links:
    """Take the controls' new values (or an opened link's) before the example list and the
    rows read them (they are drawn after both, and a moved control reruns the page from the
    top)."""
    links = Links(
        p_stay=follow_widget(P_P_STAY, KEY_P_STAY, number(P_STAY_MIN, P_STAY_MAX)),
        threshold=follow_widget(P_THRESHOLD, KEY_THRESHOLD, number(0.0, 1.0)),
        smooth_all=follow_widget(P_SMOOTH_ALL, KEY_SMOOTH_ALL, flag),
    )
    if KEY_P_STAY in st.session_state:
        state.heatmap.p_stay = float(st.session_state[KEY_P_STAY])
    if KEY_THRESHOLD in st.session_state:
        state.heatmap.threshold = float(st.session_state[KEY_THRESHOLD])
    if KEY_SMOOTH_ALL in st.session_state:
        state.heatmap.smooth_all = bool(st.session_state[KEY_SMOOTH_ALL])
    return links


def main() -> None:
    state = app_state()
    model = get_model()
    links = sync_sliders(state)
    st.title("Token heatmaps")
    st.caption(
        "One answer, every detector's token scores aligned under the same tokens: the gold "
        "spans, CORTEX's raw and smoothed scores, the other detectors that score tokens, "
        "the top RAGLens features and the model's surprisal. Hover a cell for all values "
        "of its token."
    )
    shipped = shipped_detectors(model)
    show_broken_artifacts(shipped, {b.name for b in shipped.broken})
    by_name = {d.name: d for d in shipped.detectors}
    cortex: CortexDetector | None = (
        by_name[CORTEX].detector if CORTEX in by_name else None  # type: ignore[assignment]
    )
    if cortex is not None:
        loss_curve(cortex)
    if cortex is None:
        st.info(
            f"No CORTEX detector is trained for {md(model.info.display_name)} yet; the other "
            f"rows still show. Train it with {code(train_command(CORTEX, shipped.folder))}."
        )
    picked = pick_page_answer(
        state, state.heatmap, ANSWER_KEYS, narrow=flagged_only(state, model, cortex)
    )
    if picked is None:
        return
    example, ids = picked
    try:
        with st.spinner("Tracing the answer (with and without the passages)…"):
            a = read_answer(model, example, ids, shipped)
    except RagscopeError as e:
        st.error(f"This answer could not be analysed: {md(e)}  \nFix: pick another example.")
        return
    st.divider()
    judged_by = shipped.for_example(example)  # its expert for the answer's dataset, if any
    if cortex is not None and judged_by is not shipped and CORTEX in judged_by.names:
        cortex = judged_by.card(CORTEX).detector  # type: ignore[assignment]
    # The sliders' values were synced at the top, so the rows are built once.
    rows = build_rows(a, state.heatmap.p_stay, state.heatmap.smooth_all)
    controls(state, rows, cortex, links)
    answer = a.verdicts.verdict(CORTEX)
    if cortex is not None and answer is not None:
        # The set's verdict, as the Playground shows it: the probability with the
        # threshold of the same calibration, never re-thresholded here.
        flag = {True: "hallucinated", False: "not flagged", None: "no threshold"}
        thr = f"flagged at {answer.threshold:.3f}: " if answer.threshold is not None else ""
        st.caption(
            f"CORTEX answer probability {answer.score:.3f} (calibrated; from the highest "
            f"token score smoothed with CORTEX's own answer-level p_stay "
            f"{cortex.config.p_stay_answer:.3f}, fixed in training, not the p_stay slider "
            f"above, which smooths the rows below); {thr}"
            f"**{flag[answer.hallucinated]}**, as the Playground shows."
        )
    if a.verdicts.answer is not None:
        # The spans the set shows everywhere; the rows below are each detector's own.
        set_spans_section(a.verdicts.answer, a.analysis.example.response)
    flag_values = rows[state.heatmap.flag_row].values if state.heatmap.flag_row in rows else None
    focus = span_readout(state, a, flag_values, a.analysis.signature)
    threshold = state.heatmap.threshold if state.heatmap.threshold is not None else 0.5
    shown = [r for n, r in rows.items() if n not in state.heatmap.hidden]
    st.subheader("The answer, row by row")
    st.html(
        multirow_html(
            a.analysis.layout.response_token_strings(),
            shown,
            flagged=None if flag_values is None else token_flags(flag_values, threshold),
            focus=focus,
            positions=a.analysis.layout.response_positions.tolist(),
        )
    )
    st.caption(
        "Scores run white (0) to red (1); gold cells are blue inside a hallucinated span; "
        "RAGLens rows show each SAE feature's activation relative to its peak in this answer; "
        f"the threshold reads **{md(state.heatmap.flag_row or 'no row')}**."
    )


main()
