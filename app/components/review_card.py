"""Review's item card: one flagged span with the passages' evidence highlighted, its type
and reason (:func:`core.pipeline.evidence.find_evidence`), the reviewer's controls
(boundaries, type, how evident, note; Accept / Reject / Previous / Next), its reviews, a
span the detectors missed, the answer's audit report and the item's audit trail."""

from __future__ import annotations

from typing import Any

import streamlit as st

from app.components.highlight import FLAG, RELATED, Mark, marked_html
from app.components.report import answer_report_html
from app.state.datasets import get_store
from app.state.detectors import detector_set
from app.state.links import P_ITEM, follow, one_of, publish
from app.state.model import get_model
from app.state.review import (
    KEY_ACCEPT,
    KEY_ADD_SPAN,
    KEY_NEXT,
    KEY_PREV,
    KEY_REJECT,
    KEY_REPORT,
    KEY_REPORT_GET,
    UNSET,
    ReviewState,
    dataset_options,
    item_key,
)
from app.text import code, md
from core.base.errors import DataError, RagscopeError, StorageError
from core.base.examples import RAGExample
from core.explain import feature_key
from core.pipeline.evidence import Evidence, SpanFinding, find_evidence
from core.pipeline.extract import run_example
from core.pipeline.judge import judgement_from
from core.review import (
    EVIDENCE,
    KIND_OF_SPAN_TYPE,
    KINDS,
    Review,
    ReviewBook,
    ReviewConflict,
    ReviewItem,
)
from core.review.book import MAX_NOTE

HOW_EVIDENT = "How evident"
"""The label of the radio of how plain the hallucination is (the stored field is
``evidence``; "evidence" on the card is the passage text a span departs from)."""
HOW_EVIDENT_HELP = (
    "As RAGTruth's types: evident, the departure from the passages is plain; subtle, it "
    "takes a close reading to see (a shifted meaning, an inference they do not allow)"
)


def item_heading(item: ReviewItem, position: int, shown: int) -> str:
    """The card's heading: the item's id (the table's *item* column, the success
    message's) and its place among the items shown."""
    return f"#### Item {item.id} ({position} of {shown} in this queue) · {code(item.example_id)}"


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


def current_index(rs: ReviewState, items: list[ReviewItem]) -> int:
    """The current item's index among ``items``: the one the link names, else the one
    kept in ``rs``, else the reviewer's first undecided one; published to the URL."""
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
    return ids.index(rs.current)


def item_card(
    book: ReviewBook, rs: ReviewState, items: list[ReviewItem], examples: dict[str, RAGExample]
) -> None:
    """The current item: its passages and answer, controls, reviews and audit trail."""
    ids = [i.id for i in items]
    idx = current_index(rs, items)
    item = items[idx]
    prev_id = ids[idx - 1] if idx > 0 else None
    next_id = ids[idx + 1] if idx + 1 < len(ids) else None
    ex = examples.get(item.example_id)
    with st.container(border=True):
        st.markdown(item_heading(item, idx + 1, len(items)))
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
            stale_warning(item)
            move_buttons(rs, prev_id, next_id, *st.columns([1, 1, 4])[:2])
            return
        mine = item.review_by(rs.reviewer or "")
        c_ctx, c_ans = st.columns(2)
        finding = cached_finding(tuple(ex.passages), ex.response, item.start, item.end)
        with c_ctx:
            passages_column(ex, finding.evidence)
        with c_ans:
            answer_column(item, ex, finding, mine)
        decision_row(book, rs, item, ex, mine, prev_id, next_id)
        if rs.outcome is not None:
            kind, text = rs.outcome
            (st.error if kind == "error" else st.success)(text)
            rs.outcome = None
        reviews_list(item, ex)
        missed_span_row(book, rs, item, ex)
        report_row(book, rs, item, ex)
        audit_trail(book, item)


def stale_warning(item: ReviewItem) -> None:
    st.warning(
        f"Stale: this span was flagged on another version of {code(item.example_id)} "
        "(the dataset was re-imported with a changed answer or passages since). It "
        "is not shown on the new text, cannot be decided and is left out of exports; "
        "its reviews stay in the audit trail. Scan the dataset again to flag the new "
        "answer.",
        icon=":material/history:",
    )


def passages_column(ex: RAGExample, ev: Evidence | None) -> None:
    """The passages, the span's evidence highlighted where one supports it."""
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


def answer_column(
    item: ReviewItem, ex: RAGExample, finding: SpanFinding, mine: Review | None
) -> None:
    """The question, the answer with the flagged span, its type and reason, and the
    controls: boundaries, type, how evident, note (the reviewer's own where decided)."""
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
        HOW_EVIDENT,
        evs,
        index=evs.index(mine.evidence) if mine and mine.evidence else 0,
        key=item_key("evidence", item.id),
        horizontal=True,
        help=HOW_EVIDENT_HELP,
    )
    st.text_area(
        "Note",
        value=(mine.note or "") if mine else finding.reason[:MAX_NOTE],
        key=item_key("note", item.id),
        height=68,
        max_chars=MAX_NOTE,
    )


def decision_row(
    book: ReviewBook,
    rs: ReviewState,
    item: ReviewItem,
    ex: RAGExample,
    mine: Review | None,
    prev_id: int | None,
    next_id: int | None,
) -> None:
    """Accept / Reject (keys ``a`` / ``x``) over the reviewer's own version, then
    Previous / Next."""
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


def reviews_list(item: ReviewItem, ex: RAGExample) -> None:
    if item.reviews:
        st.markdown("**Reviews**")
        for r in item.reviews:
            typ = f" · {r.type_text}" if r.type_text else ""
            note = f" · “{md(r.note)}”" if r.note else ""
            st.caption(
                f"{md(r.reviewer)}: **{r.decision}** “{md(ex.response[r.start : r.end])}”"
                f"{typ}{note} (version {r.version}, {md(r.updated_at)})"
            )


def audit_trail(book: ReviewBook, item: ReviewItem) -> None:
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
            HOW_EVIDENT,
            [UNSET, *EVIDENCE],
            horizontal=True,
            key=f"{item_key('missed', item.id)}.ev",
            help=HOW_EVIDENT_HELP,
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
    asked = detector_set(model)
    shipped = asked.for_example(ex)  # its expert for ex's dataset, if any
    dets = {s.name: s.detector for s in shipped.detectors}
    features = run_example(model, ex, list(dets.values())) if dets else {}
    judged = judgement_from(ex, asked, features, by=shipped) if dets else None
    verdicts = dict(judged.verdicts) if judged is not None else {}
    explanations: dict[str, str] = {}
    store = get_store()
    for det_name, det in dets.items():
        if not det.explains_sae_features or det_name not in verdicts:
            continue
        for name in verdicts[det_name].explanation:
            if name.startswith("F") and name[1:].isdigit():
                text = store.latest_explanation(
                    model=model.info.key,
                    feature_key=feature_key(det.sae.key, int(name[1:])),  # type: ignore[attr-defined]
                )
                if text:
                    explanations[name] = text
    reviews = [i for i in book.items(dataset, sort="position") if i.example_id == ex.id]
    answer = judged.answer if judged is not None else None
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
