"""Review's scan and queue: flag spans of a dataset's answers (the set's spans, or chosen
detectors' own at their token thresholds: :func:`core.review.scan_flags`), queue them in
the review book, and the filter row and table over the queue."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd
import streamlit as st

from app.components.estimate import estimate_caption, progress_bar
from app.state.datasets import get_store
from app.state.detectors import detector_set
from app.state.estimates import paced_extraction, work_estimate
from app.state.model import get_model
from app.state.review import (
    DETECTOR_SPANS,
    KEY_BUILD,
    KEY_DETECTORS,
    KEY_F_DETECTORS,
    KEY_F_GENERATOR,
    KEY_F_STATUS,
    KEY_F_TASK,
    KEY_LIMIT,
    KEY_RESCAN,
    KEY_SMOOTH,
    KEY_SORT,
    KEY_SPAN_SOURCE,
    KEY_TABLE,
    SET_SPANS,
    ReviewState,
    threshold_key,
)
from app.text import md
from core.base.errors import RagscopeError
from core.base.examples import RAGExample
from core.base.words import plural
from core.engine.model import LoadedModel
from core.learning.contract import Detector, flag_threshold
from core.pipeline.extract import FeatureCache
from core.pipeline.judge import AnswerVerdict, time_judging
from core.pipeline.sets import DetectorSet
from core.pipeline.span_judge import rule_of, span_judge
from core.pipeline.word_spans import GAP_TOKENS
from core.review import (
    SORTS,
    STATUSES,
    AnswerBook,
    ReviewBook,
    ReviewItem,
    Scan,
    SetScan,
    filter_items,
    judge_dataset,
    next_to_scan,
    scan_flags,
    scan_verdict,
    set_flags,
    split_verdicts,
    to_rescan,
)
from core.signals.smoothing import P_STAY_TOKEN

# Answers a scan reads unless told otherwise: sized for a 2-core CPU, where the default
# set reads an answer in tens of seconds (the caption above the button says how long; the
# features stay cached, so a larger scan later costs only the new answers).
SCAN_DEFAULT = 3

SCAN_ACTION = "review-scan"
"""What a scan's paces are recorded as (:mod:`app.state.estimates`)."""


@dataclass(frozen=True, kw_only=True)
class ScanChoice:
    """What the Build-the-queue form asks a scan for.

    Attributes:
        by_set: The set's spans (else the chosen detectors' own).
        chosen: The detectors' names (every one of the set's, with ``by_set``).
        limit: How many answers to scan.
        smooth: Smooth token scores first (detectors' own spans only).
    """

    by_set: bool
    chosen: list[str]
    limit: int
    smooth: bool


def build_section(
    rs: ReviewState, book: ReviewBook, key: str, examples: list[RAGExample], n_items: int
) -> None:
    """Flag spans of the dataset's answers with chosen detectors and queue them."""
    model = get_model()
    asked = detector_set(model)
    shipped = asked.for_examples(examples)  # the dataset's expert, if the set has one
    names = [s.name for s in shipped.detectors]
    with st.expander("Build the queue", expanded=n_items == 0, icon=":material/playlist_add:"):
        if not names:
            st.info(
                "No trained detector is shipped for this model: train some with "
                "`ragscope train` to flag spans."
            )
            return
        by_name = {s.name: s.detector for s in shipped.detectors}
        choice = scan_form(rs, names, by_name, examples, shipped.name)
        slot = st.empty()
        scan = st.button(
            "Scan and queue", key=KEY_BUILD, type="primary", icon=":material/radar:",
            disabled=not choice.chosen,
        )  # fmt: skip
        answers = AnswerBook(get_store())
        todo, again = scan_todo(answers, key, examples, choice.limit)
        dets = [by_name[n] for n in choice.chosen]
        dset = asked if choice.by_set or not choice.chosen else asked.subset(choice.chosen)
        if choice.chosen and todo and not scan:
            estimate_caption(
                lambda: work_estimate(
                    model,
                    todo,
                    dets,
                    action=SCAN_ACTION,
                    # Before a scan has run here: one answer judged as a scan judges it.
                    time_one=lambda ex: time_judging(model, ex, dset, FeatureCache(get_store())),
                ),
                where=slot,
            )
        if scan and todo:
            judged = run_scan(model, dset, dets, todo)
            if judged is None:
                return
            queue_flags(
                rs, book, answers, key, todo, judged, choice, again=shipped.name if again else None
            )
            st.rerun()
    if rs.build_report:
        # Outside the expander: it closes once the queue has items, the report must show.
        kind, text = rs.build_report
        (st.success if kind == "success" else st.warning)(text)


def scan_form(
    rs: ReviewState,
    names: list[str],
    by_name: dict[str, Detector],
    examples: list[RAGExample],
    set_name: str,
) -> ScanChoice:
    """The form: the spans' source, the detectors, how many answers, their token
    thresholds (kept in ``rs``) and smoothing; ``set_name``: the set that judges these
    examples (its span rule is named)."""
    source = st.radio(
        "Flag spans by",
        [SET_SPANS, DETECTOR_SPANS],
        key=KEY_SPAN_SOURCE,
        horizontal=True,
        help="The set's spans: one decision per answer by the set, as every page and "
        "`ragscope judge` show them, each with its evidence and type. A researcher "
        "can instead queue chosen detectors' own spans at their own token thresholds.",
    )
    by_set = source == SET_SPANS
    judge = span_judge([by_name[n] for n in names if n in by_name])
    default = [judge.name] if judge is not None else names[:1]
    c_det, c_lim = st.columns([3, 1])
    chosen = names if by_set else c_det.multiselect(
        "Detectors that flag spans",
        names,
        default=default,
        key=KEY_DETECTORS,
        help="Detectors that score single tokens; a span is the whole words around "
        "tokens at or above the detector's token threshold, runs at most "
        f"{GAP_TOKENS} tokens apart joined, punctuation alone never",
    )  # fmt: skip
    if by_set and judge is not None:
        c_det.caption(
            f"The {md(set_name)} set decides each answer's spans once, from its "
            f"**{md(judge.name)}** token scores under {md(rule_of(judge).origin())}: the "
            "spans the Playground, Token heatmaps and `ragscope judge` show."
        )
    limit = int(
        c_lim.number_input(
            "Answers to scan",
            min_value=1,
            max_value=max(len(examples), 1),
            value=min(SCAN_DEFAULT, len(examples)),
            key=KEY_LIMIT,
        )
    )
    threshold_row(rs, [] if by_set else chosen, by_name, n_cols=max(len(chosen), 1))
    smooth = not by_set and st.toggle(
        f"Smooth token scores first (label persistence, p_stay {P_STAY_TOKEN}, "
        "CORTEX's token setting, as on Token heatmaps)",
        key=KEY_SMOOTH,
        help="Joins runs broken by a single low token (core.signals.smoothing)",
    )
    return ScanChoice(by_set=by_set, chosen=chosen, limit=limit, smooth=smooth)


def threshold_row(
    rs: ReviewState, chosen: list[str], by_name: dict[str, Detector], *, n_cols: int
) -> None:
    """One token-threshold input per chosen detector, in ``n_cols`` columns."""
    cols = st.columns(n_cols)
    for c, n in zip(cols, chosen, strict=False):
        default_thr = flag_threshold(by_name[n])
        rs.thresholds[n] = float(
            c.number_input(
                f"{n} token threshold",
                min_value=0.0,
                max_value=1.0,
                value=rs.thresholds.get(n, default_thr),
                step=0.01,
                format="%.3f",
                key=threshold_key(n),
            )
        )


def scan_todo(
    answers: AnswerBook, key: str, examples: list[RAGExample], limit: int
) -> tuple[list[RAGExample], bool]:
    """The answers the next scan reads: the next ``limit`` not scanned yet, or (scanning
    again) the first ``limit`` already scanned; a caption says which. Returns them and
    whether they are scanned again."""
    scanned = answers.scanned(key, examples)
    n = len(scanned)
    again = bool(scanned) and st.toggle(
        "Scan again the answer already scanned"
        if n == 1
        else f"Scan again the {n} answers already scanned",
        key=KEY_RESCAN,
        help="The same answers, first scanned first (e.g. at a lower threshold after a "
        "scan that flagged nothing); their features come from the cache, and spans "
        "already queued keep their reviews.",
    )
    pick = to_rescan if again else next_to_scan
    todo_ids = pick([e.id for e in examples], dataset=key, scanned=scanned, n=limit)
    todo = [e for e in examples if e.id in set(todo_ids)]
    if again:
        st.caption(
            f"Scans again the first {len(todo)} of the {n} {plural(n, 'answer')} already "
            "scanned, in the order they were first scanned; their verdicts replace the "
            "earlier scan's."
        )
    else:
        st.caption(
            f"Scans the next {len(todo)} {plural(len(todo), 'answer')} not scanned yet, in "
            "the dataset's random order: the scanned answers stay a random sample of the "
            "dataset."
            if todo
            else "Every answer of this dataset is scanned: turn on scanning again to rescan them."
        )
    return todo, again


def run_scan(
    model: LoadedModel,
    dset: DetectorSet,
    dets: Sequence[Detector],
    todo: list[RAGExample],
) -> list[AnswerVerdict] | None:
    """The set's verdicts on ``todo``, timed and with progress; ``None`` (the error
    shown) when the scan failed."""
    timed = paced_extraction(model, todo, dets, action=SCAN_ACTION)
    with progress_bar("Scanning:") as progress:
        try:
            with timed as pacer:
                return judge_dataset(
                    model,
                    todo,
                    dset,
                    cache=FeatureCache(get_store()),
                    progress=pacer.ticking(progress),
                )
        except RagscopeError as e:
            st.error(f"The scan failed: {md(e)}")
            return None


def queue_flags(
    rs: ReviewState,
    book: ReviewBook,
    answers: AnswerBook,
    key: str,
    todo: list[RAGExample],
    judged: list[AnswerVerdict],
    choice: ScanChoice,
    *,
    again: str | None = None,
) -> None:
    """Record the scan, queue its flags and keep its report in ``rs`` (``again``: the
    name of the set that judged answers scanned before: the report says they were
    scanned again)."""
    kept, verdicts = split_verdicts(todo, judged)
    answers.record_scan(key, kept, {v.example_id: scan_verdict(v) for v in judged})
    found: Scan | SetScan
    if choice.by_set:
        found = set_flags(judged)
    else:
        thresholds = {n: rs.thresholds[n] for n in choice.chosen}
        found = scan_flags(
            kept, verdicts, thresholds, p_stay=P_STAY_TOKEN if choice.smooth else None
        )
    new = book.add_flags(key, kept, found.flags)
    rs.build_report = (
        "success" if found.flags else "warning",
        found.summary(new=new, unread=len(todo) - len(kept), again=again),
    )


def queue_filters(everything: list[ReviewItem]) -> list[ReviewItem]:
    """The filter and sort row over the dataset's queue; the items it keeps."""
    detectors = sorted({d for i in everything for d in i.detectors})
    tasks = sorted({i.task for i in everything if i.task})
    generators = sorted({i.generator for i in everything if i.generator})
    c1, c2, c3, c4, c5 = st.columns(5)
    f_det = c1.multiselect("Detector", detectors, key=KEY_F_DETECTORS)
    f_status = c2.multiselect("Status", list(STATUSES), key=KEY_F_STATUS)
    f_task = c3.multiselect("Task", tasks, key=KEY_F_TASK)
    f_gen = c4.multiselect("Generator", generators, key=KEY_F_GENERATOR)
    sort = c5.selectbox(
        "Sort",
        list(SORTS),
        key=KEY_SORT,
        format_func={
            "uncertainty": "closest to threshold first",
            "score": "highest score first",
            "position": "queue order",
        }.__getitem__,
    )
    return filter_items(
        everything,
        detectors=f_det or None,
        statuses=f_status or None,
        tasks=f_task or None,
        generators=f_gen or None,
        sort=sort,
    )


def queue_table(
    rs: ReviewState, items: list[ReviewItem], stale: set[int], texts: dict[str, str]
) -> None:
    """The shown items as a table; a row picked makes its item the current one."""
    rows = [
        {
            "item": it.id,
            "answer": it.example_id,
            "flagged text": "(stale: the answer changed)"
            if it.id in stale
            else texts.get(it.example_id, "")[it.start : it.end],
            "detectors": ", ".join(it.detectors),
            "score": round(it.score, 3),
            "margin": round(it.margin, 3),
            "status": "stale" if it.id in stale else it.status,
            "mine": (r.decision if (r := it.review_by(rs.reviewer or "")) else ""),
        }
        for it in items
    ]
    event = st.dataframe(
        pd.DataFrame(rows),
        hide_index=True,
        on_select="rerun",
        selection_mode="single-row",
        key=KEY_TABLE,
        height=min(36 * (len(rows) + 1) + 2, 260),
        width="stretch",
    )
    picked = event.selection.rows if event is not None else []
    if picked:
        rs.current = items[picked[0]].id
