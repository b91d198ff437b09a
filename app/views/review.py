"""Review: annotators accept, reject, re-bound and type the spans the detectors flag, and
mark whole answers faithful or hallucinated (in random, uncertainty or stratified order:
:mod:`app.components.answer_review`).

The queue is built from a dataset and some shipped detectors' token scores
(:func:`core.review.scan_flags`: whole-word spans of tokens at or above each
detector's token threshold, merged across short gaps and across detectors; the scan
says why a detector flagged nothing) and kept in the database with every decision
and an append-only audit trail (:class:`core.review.ReviewBook`). Each item shows
the passages with the sentences closest in meaning to the flagged claim
highlighted, and the answer with the flagged span. Decisions are per reviewer (the
name is asked once per session, or, with logins configured, the signed-in identity);
a save based on a stale view is refused, never applied over someone's newer one, and
an item flagged on an answer that has changed since (the dataset was re-imported) is
shown as stale: not drawn on the new text, not decidable, left out of exports. Keyboard: ``a`` accept, ``x`` reject, ``n`` next,
``p`` previous. When items have two reviews, Cohen's kappa and the span-overlap F1
show. The reviewed dataset exports as RAGTruth-style JSONL (``ragscope train
--dataset reviewed.jsonl`` retrains on it) or CSV, or is stored as a dataset.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import streamlit as st

from app.auth import auth_configured, current_identity
from app.components.adapt_job import adapt_panel
from app.components.answer_review import answer_section
from app.components.estimate import estimate_caption, progress_bar
from app.components.highlight import FLAG, RELATED, Mark, marked_html
from app.components.report import answer_report_html
from app.state.datasets import DatasetRef, dataset_choices, get_store, load_examples
from app.state.detectors import shipped_detectors
from app.state.estimates import paced_extraction, work_estimate
from app.state.heads import HEADS_FROM_CORPUS, heads_examples, review_key
from app.state.links import (
    DATASETS_HERE,
    P_DATASET,
    P_ITEM,
    P_MODE,
    bind,
    dataset_spec,
    follow,
    linked,
    one_of,
    publish,
)
from app.state.model import get_model
from app.state.review import (
    DETECTOR_SPANS,
    KEY_ACCEPT,
    KEY_ADD_SPAN,
    KEY_BUILD,
    KEY_CHANGE,
    KEY_DATASET,
    KEY_DETECTORS,
    KEY_EXPORT_ALL,
    KEY_EXPORT_NAME,
    KEY_EXPORT_REPLACE,
    KEY_EXPORT_SAVE,
    KEY_EXPORT_WHO,
    KEY_F_DETECTORS,
    KEY_F_GENERATOR,
    KEY_F_STATUS,
    KEY_F_TASK,
    KEY_LIMIT,
    KEY_MODE,
    KEY_NAME,
    KEY_NEXT,
    KEY_PREV,
    KEY_REJECT,
    KEY_REPORT,
    KEY_REPORT_GET,
    KEY_RESCAN,
    KEY_SMOOTH,
    KEY_SORT,
    KEY_SPAN_SOURCE,
    KEY_START,
    KEY_TABLE,
    SET_SPANS,
    AnswerQueueState,
)
from app.state.runs import CORPUS
from app.state.session import app_state
from app.text import code, md
from core.base.errors import DataError, RagscopeError, StorageError
from core.base.examples import RAGExample
from core.data import is_named_spec, stored_spec
from core.explain import feature_key
from core.learning.contract import flag_threshold, judge_features
from core.pipeline.evidence import SpanFinding, find_evidence
from core.pipeline.extract import FeatureCache, run_example
from core.pipeline.judge import answer_verdict
from core.pipeline.word_spans import GAP_TOKENS
from core.review import (
    EVIDENCE,
    KIND_OF_SPAN_TYPE,
    KINDS,
    SORTS,
    STATUSES,
    AnswerBook,
    AnswerLabel,
    AnswerReview,
    ReviewBook,
    ReviewConflict,
    ReviewItem,
    Scan,
    SetScan,
    agreement,
    answer_agreement,
    answer_labels,
    filter_items,
    judge_dataset,
    next_to_scan,
    ragtruth_jsonl,
    reviewed_examples,
    reviews_frame,
    safe_csv,
    scan_flags,
    scan_verdict,
    set_flags,
    split_verdicts,
    to_rescan,
)
from core.review.book import MAX_NOTE

# Page scripts run with Streamlit's magic: no bare strings (they would be drawn).
STATE_KEY = "ragscope.review"
CORPUS_LABEL = "Built-in labelled corpus"
UNSET = "unset"
LATEST = "every reviewer's, by the label rules"
DEFAULT_SMOOTH = 0.9
MODES = {"spans": "Flagged spans", "answers": "Whole answers"}


# Answers a scan reads unless told otherwise: sized for a 2-core CPU, where the default
# set reads an answer in tens of seconds (the caption above the button says how long; the
# features stay cached, so a larger scan later costs only the new answers).
SCAN_DEFAULT = 3


def item_key(control: str, item_id: int) -> str:
    """The widget key of one item's control (span, kind, evidence, note, missed)."""
    return f"review.{control}.{item_id}"


def threshold_key(name: str) -> str:
    return f"review.threshold.{name}"


@dataclass
class ReviewState:
    reviewer: str | None = None
    current: int | None = None  # item id
    outcome: tuple[str, str] | None = None  # (kind, text), shown once
    build_report: tuple[str, str] | None = None  # (kind, text) of the last scan
    thresholds: dict[str, float] = field(default_factory=dict)
    report: tuple[str, str] | None = None  # (example id, HTML)
    answers: AnswerQueueState = field(default_factory=AnswerQueueState)
    mode: str = "spans"


def page_state() -> ReviewState:
    if STATE_KEY not in st.session_state:
        st.session_state[STATE_KEY] = ReviewState()
    return st.session_state[STATE_KEY]


# --------------------------------------------------------------------------- reviewer


def reviewer_gate(rs: ReviewState) -> bool:
    """Who is reviewing: with logins configured, the signed-in identity (no typed
    names, so nobody can review as someone else); otherwise a name asked once per
    session. False until there is one."""
    if auth_configured():
        who = current_identity()
        if who is None:  # the login gate in app/main.py comes first; never reached
            st.error("Sign in to review.")
            return False
        rs.reviewer = who.id
        st.caption(f"Reviewing as **{md(who.name)}** ({code(who.id)}), signed in.")
        return True
    if rs.reviewer:
        c_who, c_change = st.columns([4, 1], vertical_alignment="center")
        c_who.caption(f"Reviewing as **{md(rs.reviewer)}**.")
        if c_change.button("Change name", key=KEY_CHANGE, width="content"):
            rs.reviewer = None
            rs.answers.current = None  # the next reviewer starts at their first answer
            st.rerun()
        return True
    c_name, c_go = st.columns([3, 1], vertical_alignment="bottom")
    name = c_name.text_input("Your name", key=KEY_NAME, help="Recorded with each decision")
    if c_go.button("Start reviewing", key=KEY_START, type="primary", width="stretch"):
        if name.strip():
            rs.reviewer = name.strip()
            st.rerun()
        st.error("Type your name first: every decision is recorded with it.")
    return False


# --------------------------------------------------------------------------- dataset


def dataset_options() -> dict[str, tuple[str, DatasetRef | None]]:
    """Dataset key -> (label, reference); the built-in corpus has no reference."""
    out: dict[str, tuple[str, DatasetRef | None]] = {review_key(None): (CORPUS_LABEL, None)}
    for ref in dataset_choices():
        out[review_key(ref)] = (ref.label, ref)
    return out


def pick_dataset() -> tuple[str, list[RAGExample]] | None:
    options = dataset_options()
    specs = {k: CORPUS if ref is None else dataset_spec(ref) for k, (_, ref) in options.items()}
    key = bind(
        P_DATASET,
        KEY_DATASET,
        lambda: st.selectbox(
            "Dataset", list(options), format_func=lambda k: options[k][0], key=KEY_DATASET
        ),
        parse={s: k for k, s in specs.items()}.get,
        to_id=specs.__getitem__,
        what="dataset",
        where=DATASETS_HERE,
        instead=lambda k: md(options[k][0]),
    )
    label, ref = options[key]
    try:
        if ref is None:
            examples = heads_examples(HEADS_FROM_CORPUS, app_state().dataset)[2]
        else:
            examples = load_examples(ref)
    except RagscopeError as e:
        st.error(f"{md(label)} cannot be read: {md(e)}")
        return None
    return key, examples


# --------------------------------------------------------------------------- queue


def build_section(
    rs: ReviewState, book: ReviewBook, key: str, examples: list[RAGExample], n_items: int
) -> None:
    """Flag spans of the dataset's answers with chosen detectors and queue them."""
    model = get_model()
    asked = shipped_detectors(model)
    shipped = asked.for_examples(examples)  # the dataset's expert, if the set has one
    names = [s.name for s in shipped.detectors]
    with st.expander("Build the queue", expanded=n_items == 0, icon=":material/playlist_add:"):
        if not names:
            st.info(
                "No trained detector is shipped for this model: train some with "
                "`ragscope train` to flag spans."
            )
            return
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
        default = [n for n in ("ensemble", "cortex") if n in names][:1] or names[:1]
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
        if by_set:
            c_det.caption(
                "The set decides each answer's spans once, from its judge's token scores "
                "(a rule chosen for span F1 in cross-validation where the set has one): "
                "the spans the Playground, Token heatmaps and `ragscope judge` show."
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
        by_name = {s.name: s.detector for s in shipped.detectors}
        cols = st.columns(max(len(chosen), 1))
        for c, n in zip(cols, [] if by_set else chosen, strict=False):
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
        smooth = not by_set and st.toggle(
            f"Smooth token scores first (label persistence, p_stay {DEFAULT_SMOOTH})",
            key=KEY_SMOOTH,
            help="Joins runs broken by a single low token (core.signals.smoothing)",
        )
        slot = st.empty()
        scan = st.button(
            "Scan and queue", key=KEY_BUILD, type="primary", icon=":material/radar:",
            disabled=not chosen,
        )  # fmt: skip
        answers = AnswerBook(get_store())
        scanned = answers.scanned(key, examples)
        again = bool(scanned) and st.toggle(
            f"Scan again the {len(scanned)} answers already scanned",
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
                f"Scans again the first {len(todo)} of the {len(scanned)} answers already "
                "scanned, in the order they were first scanned."
            )
        else:
            st.caption(
                f"Scans the next {len(todo)} answers not scanned yet, in the dataset's random "
                "order: the scanned answers stay a random sample of the dataset."
                if todo
                else "Every answer of this dataset is scanned: turn on scanning again to "
                "rescan them."
            )
        if chosen and todo and not scan:
            estimate_caption(
                lambda: work_estimate(model, todo, [by_name[n] for n in chosen]),
                where=slot,
            )
        if scan and todo:
            dets = [by_name[n] for n in chosen]
            timed = paced_extraction(model, todo, dets)
            with progress_bar("Scanning:") as progress:
                try:
                    with timed:
                        judged = judge_dataset(
                            model,
                            todo,
                            asked if by_set else asked.subset(chosen),
                            cache=FeatureCache(get_store()),
                            progress=progress,
                        )
                except RagscopeError as e:
                    st.error(f"The scan failed: {md(e)}")
                    return
            kept, verdicts = split_verdicts(todo, judged)
            answers.record_scan(key, kept, {v.example_id: scan_verdict(v) for v in judged})
            found: Scan | SetScan
            if by_set:
                found = set_flags(judged)
            else:
                thresholds = {n: rs.thresholds[n] for n in chosen}
                found = scan_flags(
                    kept, verdicts, thresholds, p_stay=DEFAULT_SMOOTH if smooth else None
                )
            new = book.add_flags(key, kept, found.flags)
            rs.build_report = (
                "success" if found.flags else "warning",
                found.summary(new=new, unread=len(todo) - len(kept)),
            )
            st.rerun()
    if rs.build_report:
        # Outside the expander: it closes once the queue has items, the report must show.
        kind, text = rs.build_report
        (st.success if kind == "success" else st.warning)(text)


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
        }.get,
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
    import pandas as pd

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


# --------------------------------------------------------------------------- item


def answer_bounds(text: str) -> list[int]:
    """Positions a span may start or end at: word starts and ends (and the text's ends)."""
    out = {0, len(text)}
    for i, ch in enumerate(text):
        prev = text[i - 1] if i else " "
        if ch.isspace() != prev.isspace():
            out.add(i)
    return sorted(out)


@st.cache_data(show_spinner="Finding what the span departs from…", max_entries=256)
def cached_finding(passages: tuple[str, ...], answer: str, start: int, end: int) -> SpanFinding:
    """The span's evidence, type and reason (:func:`core.pipeline.evidence.find_evidence`,
    the finding ``ragscope judge`` records for the same span)."""
    return find_evidence(passages, answer, start, end)


def save(
    book: ReviewBook, rs: ReviewState, item: ReviewItem, decision: str, expected: int,
    next_id: int | None, example: RAGExample,
) -> None:  # fmt: skip
    """Accept / Reject: store the decision with the item's controls (a callback)."""
    start, end = st.session_state.get(item_key("span", item.id), (item.start, item.end))
    kind = st.session_state.get(item_key("kind", item.id), UNSET)
    evidence = st.session_state.get(item_key("evidence", item.id), UNSET)
    try:
        book.save_review(
            item.id,
            rs.reviewer or "",
            decision,
            start=int(start),
            end=int(end),
            kind=None if kind == UNSET else kind,
            evidence=None if evidence == UNSET else evidence,
            note=st.session_state.get(item_key("note", item.id)),
            expected_version=expected,
            example=example,
        )
    except ReviewConflict as e:
        rs.outcome = ("error", f"Not saved: {md(e)}")
        return
    except (DataError, StorageError) as e:
        rs.outcome = ("error", f"Not saved: {md(e)}")
        return
    rs.outcome = ("success", f"Item {item.id} {decision}ed.")
    if next_id is not None:
        rs.current = next_id


def move(rs: ReviewState, item_id: int | None) -> None:
    if item_id is not None:
        rs.current = item_id


def move_buttons(
    rs: ReviewState, prev_id: int | None, next_id: int | None, left: Any, right: Any
) -> None:
    """Previous / Next (keys ``p`` / ``n``) in two columns."""
    left.button(
        "Previous", key=KEY_PREV, icon=":material/arrow_back:", shortcut="p",
        on_click=move, args=(rs, prev_id), disabled=prev_id is None, width="stretch",
    )  # fmt: skip
    right.button(
        "Next", key=KEY_NEXT, icon=":material/arrow_forward:", shortcut="n",
        on_click=move, args=(rs, next_id), disabled=next_id is None, width="stretch",
    )  # fmt: skip


def item_card(
    book: ReviewBook, rs: ReviewState, items: list[ReviewItem], examples: dict[str, RAGExample]
) -> None:
    ids = [i.id for i in items]
    link = follow(P_ITEM, one_of([str(i) for i in ids]))
    if link.value is not None:
        rs.current = int(link.value)
    if rs.current not in ids:
        mine = [i for i in items if i.review_by(rs.reviewer or "") is None]
        rs.current = (mine or items)[0].id
    publish(
        P_ITEM,
        str(rs.current),
        missing=link.missing,
        what="queue item",
        where="among the items shown (this dataset's queue, these filters)",
    )
    idx = ids.index(rs.current)
    item = items[idx]
    prev_id = ids[idx - 1] if idx > 0 else None
    next_id = ids[idx + 1] if idx + 1 < len(ids) else None
    ex = examples.get(item.example_id)
    with st.container(border=True):
        st.markdown(f"#### Item {idx + 1} of {len(items)} · {code(item.example_id)}")
        facts = [
            f"{md(n)} token score {s:.3f} (token threshold {t:.3f})"
            for n, (s, t) in item.sources.items()
        ]
        meta = " · ".join(md(x) for x in (item.task, item.generator) if x)
        st.caption(" · ".join(facts) + (f" · {meta}" if meta else "") + f" · {item.status}")
        if ex is None:
            st.warning(
                f"{code(item.example_id)} is not in this dataset any more; the item stays in "
                "the queue with its reviews."
            )
            return
        if item.is_stale(ex):
            st.warning(
                f"Stale: this span was flagged on another version of {code(item.example_id)} "
                "(the dataset was re-imported with a changed answer or passages since). It "
                "is not shown on the new text, cannot be decided and is left out of exports; "
                "its reviews stay in the audit trail. Scan the dataset again to flag the new "
                "answer.",
                icon=":material/history:",
            )
            move_buttons(rs, prev_id, next_id, *st.columns([1, 1, 4])[:2])
            return
        mine = item.review_by(rs.reviewer or "")
        c_ctx, c_ans = st.columns(2)
        finding = cached_finding(tuple(ex.passages), ex.response, item.start, item.end)
        ev = finding.evidence
        with c_ctx:
            st.markdown(
                "**Passages** (the evidence in blue)"
                if ev is not None
                else "**Passages** (no passage supports the span)"
            )
            for k, p in enumerate(ex.passages):
                marks = (
                    [Mark(ev.start, ev.end, RELATED, f"evidence ({ev.how}, score {ev.score:.2f})")]
                    if ev is not None and ev.passage == k
                    else []
                )
                st.html(marked_html(p, marks))
        with c_ans:
            if ex.question:
                st.markdown(f"**Question:** {md(ex.question)}")
            st.markdown("**Answer** (flagged span in orange)")
            st.html(marked_html(ex.response, [Mark(item.start, item.end, FLAG, "flagged")]))
            st.markdown(f"**{finding.type.capitalize()}:** {md(finding.reason)}")
            bounds = answer_bounds(ex.response)
            start = mine.start if mine else item.start
            end = mine.end if mine else item.end
            for b in (start, end):
                if b not in bounds:
                    bounds = sorted({*bounds, b})
            span = st.select_slider(
                "Span boundaries (characters)",
                options=bounds,
                value=(start, end),
                key=item_key("span", item.id),
                format_func=lambda b: str(b),
            )
            st.caption(f"Span: “{md(ex.response[span[0] : span[1]])}”")
            c_kind, c_ev = st.columns(2)
            kinds = [UNSET, *KINDS]
            evs = [UNSET, *EVIDENCE]
            found_kind = KIND_OF_SPAN_TYPE[finding.type]
            c_kind.radio(
                "Type",
                kinds,
                index=kinds.index(mine.kind if mine and mine.kind else found_kind),
                key=item_key("kind", item.id),
                horizontal=True,
                help="baseless: the passages do not say it; conflict: they say otherwise",
            )
            c_ev.radio(
                "Evidence",
                evs,
                index=evs.index(mine.evidence) if mine and mine.evidence else 0,
                key=item_key("evidence", item.id),
                horizontal=True,
            )
            st.text_area(
                "Note",
                value=(mine.note or "") if mine else finding.reason[:MAX_NOTE],
                key=item_key("note", item.id),
                height=68,
                max_chars=MAX_NOTE,
            )
        expected = mine.version if mine else 0
        b1, b2, b3, b4, _ = st.columns([1, 1, 1, 1, 2])
        b1.button(
            "Accept", key=KEY_ACCEPT, type="primary", icon=":material/check:", shortcut="a",
            on_click=save, args=(book, rs, item, "accept", expected, next_id, ex),
            width="stretch",
        )  # fmt: skip
        b2.button(
            "Reject", key=KEY_REJECT, icon=":material/close:", shortcut="x",
            on_click=save, args=(book, rs, item, "reject", expected, next_id, ex),
            width="stretch",
        )  # fmt: skip
        move_buttons(rs, prev_id, next_id, b3, b4)
        if rs.outcome is not None:
            kind, text = rs.outcome
            (st.error if kind == "error" else st.success)(text)
            rs.outcome = None
        if item.reviews:
            st.markdown("**Reviews**")
            for r in item.reviews:
                typ = f" · {r.type_text}" if r.type_text else ""
                note = f" · “{md(r.note)}”" if r.note else ""
                st.caption(
                    f"{md(r.reviewer)}: **{r.decision}** “{md(ex.response[r.start : r.end])}”"
                    f"{typ}{note} (version {r.version}, {md(r.updated_at)})"
                )
        missed_span_row(book, rs, item, ex)
        report_row(book, rs, item, ex)
        with st.expander("Audit trail of this item"):
            trail = book.audit(item.id)
            if not trail:
                st.caption("No change yet.")
            for a in trail:
                st.caption(
                    md(
                        f"{a.at} · {a.reviewer} · {a.action}: {a.after.get('decision')} "
                        f"[{a.after.get('start')}, {a.after.get('end')})"
                        + (f" (was {a.before.get('decision')})" if a.before else "")
                    )
                )


def missed_span_row(book: ReviewBook, rs: ReviewState, item: ReviewItem, ex: RAGExample) -> None:
    """Mark a hallucinated span of this answer that no detector flagged (accepted as yours)."""
    with st.expander("Add a span the detectors missed", icon=":material/add_box:"):
        bounds = answer_bounds(ex.response)
        span = st.select_slider(
            "Span (characters)",
            options=bounds,
            value=(bounds[0], bounds[min(2, len(bounds) - 1)]),
            key=item_key("missed", item.id),
        )
        st.caption(f"Span: “{md(ex.response[span[0] : span[1]])}”")
        c_kind, c_ev = st.columns(2)
        kind = c_kind.radio(
            "Type", [UNSET, *KINDS], horizontal=True, key=f"{item_key('missed', item.id)}.kind"
        )
        evidence = c_ev.radio(
            "Evidence", [UNSET, *EVIDENCE], horizontal=True, key=f"{item_key('missed', item.id)}.ev"
        )
        note = st.text_input("Note", key=f"{item_key('missed', item.id)}.note", max_chars=MAX_NOTE)
        if st.button("Add and accept", key=KEY_ADD_SPAN, icon=":material/add:"):
            try:
                book.add_missed_span(
                    item.dataset, ex, rs.reviewer or "", int(span[0]), int(span[1]),
                    kind=None if kind == UNSET else kind,
                    evidence=None if evidence == UNSET else evidence,
                    note=note,
                )  # fmt: skip
            except (DataError, StorageError) as e:
                st.error(f"Not added: {md(e)}")
            else:
                added = md(ex.response[span[0] : span[1]])
                rs.outcome = ("success", f"Added “{added}” as accepted.")
                st.rerun()


def build_answer_report(book: ReviewBook, dataset: str, ex: RAGExample, label: str) -> str:
    """The audit report of one answer: every shipped detector's verdict and view, and
    the reviews of its flagged spans in this dataset's queue."""

    model = get_model()
    shipped = shipped_detectors(model).for_example(ex)  # its expert for ex's dataset, if any
    dets = {s.name: s.detector for s in shipped.detectors}
    features = run_example(model, ex, list(dets.values())) if dets else {}
    verdicts = {n: judge_features(d, features[n], ex.provenance.dataset) for n, d in dets.items()}
    explanations: dict[str, str] = {}
    raglens = dets.get("raglens")
    if raglens is not None and "raglens" in verdicts:
        store = get_store()
        for name in verdicts["raglens"].explanation:
            if name.startswith("F") and name[1:].isdigit():
                text = store.latest_explanation(
                    model=model.info.key, feature_key=feature_key(raglens.sae.key, int(name[1:]))
                )
                if text:
                    explanations[name] = text
    reviews = [i for i in book.items(dataset, sort="position") if i.example_id == ex.id]
    answer = answer_verdict(
        ex, list(dets.values()), verdicts, set_name=shipped.name,
        deferred_from=shipped.deferred_from,
    ) if verdicts else None  # fmt: skip
    return answer_report_html(
        example=ex,
        model_name=model.info.display_name,
        answer=answer,
        verdicts=verdicts,
        detectors=dets,
        features=features,
        explanations=explanations,
        reviews=reviews,
        dataset=label,
    )


def report_row(book: ReviewBook, rs: ReviewState, item: ReviewItem, ex: RAGExample) -> None:
    """Build (on request) and download the answer's self-contained audit report."""
    c_build, c_get, _ = st.columns([1.4, 1.4, 2])
    if c_build.button("Build audit report", key=KEY_REPORT, icon=":material/description:"):
        with st.spinner("Running every detector on the answer…"):
            try:
                rs.report = (
                    ex.id,
                    build_answer_report(book, item.dataset, ex, dataset_options()[item.dataset][0]),
                )
            except RagscopeError as e:
                st.error(f"The report could not be built: {md(e)}")
    if rs.report is not None and rs.report[0] == ex.id:
        c_get.download_button(
            "Download report (HTML)",
            rs.report[1],
            file_name=f"audit-{ex.id}.html",
            mime="text/html",
            key=KEY_REPORT_GET,
            icon=":material/download:",
        )


# --------------------------------------------------------------------------- agreement, export


def agreement_section(items: list[ReviewItem], labels: Mapping[str, AnswerLabel]) -> None:
    st.subheader("Agreement between reviewers")
    got = agreement(items)
    on_answers = answer_agreement(labels.values())
    if got is None and on_answers is None:
        st.caption("Shown once some items or answers have two reviewers' decisions.")
        return
    if got is not None:
        c1, c2, c3 = st.columns(3)
        kappa = "n/a" if got.kappa is None or got.kappa != got.kappa else f"{got.kappa:.2f}"
        c1.metric("Cohen's kappa (accept / reject)", kappa)
        c2.metric(
            "Span-overlap F1 of accepted spans",
            "n/a" if got.span_f1 is None else f"{got.span_f1:.2f}",
        )
        c3.metric("Items both reviewed", got.n_items)
        st.caption(f"Reviewers {md(got.reviewers[0])} and {md(got.reviewers[1])}.")
    if on_answers is not None:
        a = on_answers
        c1, c2, c3 = st.columns(3)
        kappa = "n/a" if a.kappa is None or a.kappa != a.kappa else f"{a.kappa:.2f}"
        c1.metric("Cohen's kappa (answer labels)", kappa)
        c2.metric("Answers labelled alike", f"{a.agree:.0%}")
        c3.metric("Answers both labelled", a.n_answers)
        st.caption(
            f"Answer labels of {md(a.reviewers[0])} and {md(a.reviewers[1])} (their marks, "
            "else their span decisions, by the label rules)."
        )


def export_section(
    key: str,
    label: str,
    items: list[ReviewItem],
    examples: list[RAGExample],
    marks: Sequence[AnswerReview],
) -> None:
    st.subheader("Export the reviewed dataset")
    who_options = [
        LATEST,
        *sorted({r.reviewer for i in items for r in i.reviews} | {m.reviewer for m in marks}),
    ]
    c_who, c_all = st.columns([2, 2], vertical_alignment="bottom")
    who = c_who.selectbox("Decisions that count", who_options, key=KEY_EXPORT_WHO)
    keep_all = c_all.toggle("Also keep answers nobody reviewed", key=KEY_EXPORT_ALL)
    reviewed = reviewed_examples(
        examples,
        items,
        reviewer=None if who == LATEST else who,
        include_unreviewed=keep_all,
        marks=marks,
    )
    n_h = sum(1 for e in reviewed if e.label)
    by_id = {e.id: e for e in examples}
    n_stale = sum(1 for i in items if i.is_stale(by_id.get(i.example_id)))
    st.caption(
        f"{len(reviewed)} answers with a label ({n_h} hallucinated), by the label rules. "
        "RAGTruth-style JSONL, the "
        "format of the shared dev sets: retrain on it with "
        "`ragscope train --dataset reviewed.jsonl`."
        + (
            f" {n_stale} stale items (flagged on an earlier version of their answer) are "
            "left out of every export."
            if n_stale
            else ""
        )
    )
    stem = key.replace(":", "-").replace("/", "-")
    c1, c2 = st.columns(2)
    c1.download_button(
        "Download JSONL",
        ragtruth_jsonl(reviewed),
        file_name=f"reviewed-{stem}.jsonl",
        mime="application/jsonl",
        icon=":material/download:",
        disabled=not reviewed,
        width="stretch",
    )
    c2.download_button(
        "Download CSV (every decision)",
        safe_csv(reviews_frame(items, examples)),  # spreadsheet formulas neutralised
        file_name=f"reviews-{stem}.csv",
        mime="text/csv",
        icon=":material/table:",
        disabled=not items,
        width="stretch",
    )
    c_name, c_save = st.columns([3, 1], vertical_alignment="bottom")
    name = c_name.text_input(
        "Store as a dataset named", value=f"reviewed-{stem}", key=KEY_EXPORT_NAME
    ).strip()
    store = get_store()
    exists = name in {d.name for d in store.list_datasets()}
    replace = False
    if exists:
        replace = st.checkbox(
            f"Replace the stored dataset {code(name)} (its examples are overwritten; reviews stay)",
            key=KEY_EXPORT_REPLACE,
        )
    if c_save.button(
        "Store", key=KEY_EXPORT_SAVE, disabled=not reviewed or (exists and not replace),
        width="stretch",
    ):  # fmt: skip
        try:
            n = store.import_dataset(
                name, reviewed, source=f"review of {label}", fmt="ragtruth_jsonl", replace=replace
            )
        except RagscopeError as e:
            st.error(f"Not stored: {md(e)}")
        else:
            st.success(f"Stored {n} answers as **{md(name)}**: pick it on Home or here.")


# --------------------------------------------------------------------------- page


def main() -> None:
    st.title("Review flagged spans and answers")
    st.caption(
        "Accept, reject, re-bound and type the spans the detectors flag, or mark whole "
        "answers faithful or hallucinated. Decisions are saved per reviewer with an audit "
        "trail; keyboard: **a** accept, **x** reject (spans), **f** faithful, "
        "**h** hallucinated (answers), **n** next, **p** previous."
    )
    rs = page_state()
    if not reviewer_gate(rs):
        return
    picked = pick_dataset()
    if picked is None:
        return
    key, examples = picked
    book = ReviewBook(get_store())
    everything = book.items(key, sort="position")  # one read of the queue per rerun
    build_section(rs, book, key, examples, len(everything))
    answers = AnswerBook(get_store())
    marks = answers.marks(key)  # one read of the answer marks per rerun
    labels = answer_labels(examples, marks, everything)
    if pick_mode(rs) == "answers":
        answer_section(
            answers,
            rs.answers,
            dataset=key,
            reviewer=rs.reviewer or "",
            examples=examples,
            items=everything,
            labels=labels,
            marks=marks,
        )
        st.divider()
        model = get_model()
        adapt_panel(
            model,
            shipped_detectors(model),
            queue=key,
            dataset_spec=job_dataset(key),
            examples=examples,
        )
    elif not everything:
        publish(P_ITEM, None, missing=linked(P_ITEM), what="queue item", where="queued")
        st.info(
            "The queue of flagged spans of this dataset is empty: scan it above, or review "
            "whole answers."
        )
    else:
        span_queue(book, rs, examples, everything)
    st.divider()
    agreement_section(everything, labels)
    st.divider()
    export_section(key, dataset_options()[key][0], everything, examples, marks)


def job_dataset(key: str) -> str | None:
    """The named spec a background job reads the queue ``key``'s dataset by (never a
    path: built-in, shared or imported datasets only)."""
    ref = dataset_options()[key][1]
    if ref is None:
        return CORPUS
    if ref.kind == "store":
        return stored_spec(ref.name)
    spec = dataset_spec(ref)
    return spec if is_named_spec(spec) else None


def pick_mode(rs: ReviewState) -> str:
    """Flagged spans or whole answers, tied to the URL (``mode=``); remembered for the
    session (a change of reviewer name keeps it)."""
    rs.mode = bind(
        P_MODE,
        KEY_MODE,
        lambda: st.radio(
            "Review",
            list(MODES),
            format_func=MODES.__getitem__,
            horizontal=True,
            key=KEY_MODE,
            help="Flagged spans: accept, reject, re-bound and type what the detectors flag. "
            "Whole answers: mark each answer faithful (f) or hallucinated (h), the labels "
            "that calibrate and adapt the detectors to this dataset.",
        ),
        parse=one_of(MODES),
        seed=rs.mode,
        default=next(iter(MODES)),
        what="review mode",
    )
    return rs.mode


def span_queue(
    book: ReviewBook, rs: ReviewState, examples: list[RAGExample], everything: list[ReviewItem]
) -> None:
    """The flagged-span queue: filters, the table and the current item's card."""
    items = queue_filters(everything)
    texts = {e.id: e.response for e in examples}
    by_id = {e.id: e for e in examples}
    stale = {i.id for i in everything if i.is_stale(by_id.get(i.example_id))}
    done = sum(1 for i in items if i.review_by(rs.reviewer or "") is not None)
    st.caption(f"{len(items)} item{'' if len(items) == 1 else 's'} shown · {done} reviewed by you.")
    if not items:
        publish(P_ITEM, None, missing=linked(P_ITEM), what="queue item", where="shown")
        st.info("No item matches these filters.")
    else:
        queue_table(rs, items, stale, texts)
        item_card(book, rs, items, by_id)


main()
