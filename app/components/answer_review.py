"""Review's whole-answer mode: the dataset's answers in a chosen order (random,
uncertainty, stratified: :mod:`core.data.sampling`), each shown with its passages, the
spans the detectors flagged and the set's verdict when it was scanned; the reviewer marks
it faithful (``f``) or hallucinated (``h``). Labels follow :data:`core.review.LABEL_RULES`
and are computed in core (:class:`core.review.AnswerBook`); this module draws them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import streamlit as st

from app.components.highlight import FLAG, Mark, marked_html
from app.state.links import P_ANSWER, P_ORDER, bind, follow, one_of, publish
from app.state.review import (
    KEY_A_NEXT,
    KEY_A_NOTE,
    KEY_A_PREV,
    KEY_A_SKIP_MINE,
    KEY_FAITHFUL,
    KEY_HALLUCINATED,
    KEY_ORDER,
    AnswerQueueState,
)
from app.text import code, md
from core.base.errors import DataError, StorageError
from core.base.examples import RAGExample
from core.base.words import plural
from core.review import (
    LABEL_RULES,
    ORDERING_PURPOSE,
    ORDERINGS,
    AnswerBook,
    AnswerLabel,
    AnswerReview,
    ReviewConflict,
    ReviewItem,
    ScannedAnswer,
    label_counts,
    order_answers,
    scanned_with_another_set,
)
from core.review.book import MAX_NOTE

ORDER_LABELS = {
    "random": "random (calibrates)",
    "uncertainty": "nearest the threshold first",
    "stratified": "spread over the scores",
}


def pick_order(qs: AnswerQueueState) -> str:
    """The ordering selector, tied to the URL (``order=``) and remembered for the session,
    with what it is for."""
    how = qs.order = bind(
        P_ORDER,
        KEY_ORDER,
        lambda: st.radio(
            "Order of the answers",
            list(ORDERINGS),
            format_func=ORDER_LABELS.__getitem__,
            horizontal=True,
            key=KEY_ORDER,
        ),
        parse=one_of(ORDERINGS),
        seed=qs.order,
        default=ORDERINGS[0],
        what="answer order",
    )
    st.caption(f"**{ORDER_LABELS[how].capitalize()}:** {ORDERING_PURPOSE[how]}.")
    return how


def mark(
    answers: AnswerBook,
    qs: AnswerQueueState,
    dataset: str,
    example: RAGExample,
    reviewer: str,
    label: str,
    drawn_by: str,
    expected: int,
    next_id: str | None,
) -> None:
    """Faithful / Hallucinated: store the mark (a callback), then move on."""
    try:
        answers.mark(
            dataset,
            example,
            reviewer,
            label,
            drawn_by=drawn_by,
            note=st.session_state.get(f"{KEY_A_NOTE}.{example.id}"),
            expected_version=expected,
        )
    except (ReviewConflict, DataError, StorageError) as e:
        qs.outcome = ("error", f"Not saved: {md(e)}")
        return
    qs.outcome = ("success", f"{code(example.id)} marked {label}.")
    if next_id is not None:
        qs.current = next_id


def _go(qs: AnswerQueueState, answer_id: str | None) -> None:
    if answer_id is not None:
        qs.current = answer_id


def _verdict_line(scanned: ScannedAnswer | None, set_now: str | None = None) -> str:
    """The set's scanned verdict on the answer; when another set judges the dataset now
    (``set_now``), that the verdict is the previous set's and how to get this one's."""
    if scanned is None:
        return "Not scanned yet: scan it above to see the set's verdict and flagged spans."
    side = "≥" if scanned.hallucinated else "<"
    said = "hallucinated" if scanned.hallucinated else "faithful"
    line = (
        f"The set says **{said}**: probability {scanned.probability:.3f} {side} threshold "
        f"{scanned.threshold:.3f} ({md(scanned.judged_by)})."
    )
    was = scanned_with_another_set(scanned, set_now) if set_now is not None else None
    if was is not None:
        line += (
            f" Scanned with the previous set, **{md(was)}**; the **{md(set_now)}** set "
            "judges this dataset now: scan the answers again (*Build the queue*, *Scan "
            "again the answers already scanned*) to judge them with the set in use."
        )
    return line


def _label_line(lab: AnswerLabel) -> str:
    if lab.label is None:
        return f"Label: **{lab.status}** ({lab.rule})."
    drawn = "drawn at random, so it calibrates" if lab.random else "not drawn at random"
    return f"Label: **{lab.status}** ({lab.rule}; {drawn})."


def _queue_caption(
    order: Sequence[str],
    scanned: Mapping[str, ScannedAnswer],
    mine: Mapping[str, AnswerReview],
    labels: Mapping[str, AnswerLabel],
) -> None:
    """The queue's counts and the rules that decide an answer's label."""
    counts = label_counts(labels.values())
    random_counts = label_counts(labels.values(), random_only=True)
    st.caption(
        f"{len(order)} {plural(len(order), 'answer')} · {len(scanned)} scanned · "
        f"{len(mine)} marked by you · labels: "
        f"{counts['hallucinated']} hallucinated, {counts['faithful']} faithful, "
        f"{counts['disputed']} disputed ({random_counts['hallucinated']} and "
        f"{random_counts['faithful']} of them drawn at random)."
    )
    with st.expander("How an answer's label is decided", icon=":material/rule:"):
        st.markdown("\n".join(f"{k}. {md(r)}" for k, r in enumerate(LABEL_RULES, start=1)))


def _answer_texts(ex: RAGExample, items: Sequence[ReviewItem], own: AnswerReview | None) -> None:
    """The passages, the question, the answer with its flagged spans, and the note box."""
    flagged = [
        Mark(it.start, it.end, FLAG, ", ".join(it.detectors))
        for it in items
        if it.example_id == ex.id and not it.is_stale(ex)
    ]
    c_ctx, c_ans = st.columns(2)
    with c_ctx:
        st.markdown("**Passages**")
        for p in ex.passages:
            st.html(marked_html(p, []))
    with c_ans:
        if ex.question:
            st.markdown(f"**Question:** {md(ex.question)}")
        st.markdown("**Answer**" + (" (flagged spans in orange)" if flagged else ""))
        st.html(marked_html(ex.response, flagged))
        st.text_area(
            "Note",
            value=(own.note or "") if own else "",
            key=f"{KEY_A_NOTE}.{ex.id}",
            max_chars=MAX_NOTE,
            height=68,
        )


def _answer_buttons(
    args: tuple[AnswerBook, AnswerQueueState, str, RAGExample, str],
    *,
    how: str,
    own: AnswerReview | None,
    prev_id: str | None,
    next_id: str | None,
) -> None:
    """The Faithful / Hallucinated marks and the Previous / Next moves."""
    qs = args[1]
    expected = own.version if own else 0
    b1, b2, b3, b4 = st.columns([1.2, 1.5, 1.1, 1])  # no spacer: labels fit a laptop
    # Filled only for the label this reviewer gave the answer: a button that looks
    # chosen before anyone chose it reads as the answer's label.
    chosen = own.label if own else None
    b1.button(
        "Faithful", key=KEY_FAITHFUL, icon=":material/verified:", shortcut="f",
        type="primary" if chosen == "faithful" else "secondary",
        on_click=mark, args=(*args, "faithful", how, expected, next_id), width="stretch",
    )  # fmt: skip
    b2.button(
        "Hallucinated", key=KEY_HALLUCINATED, icon=":material/report:", shortcut="h",
        type="primary" if chosen == "hallucinated" else "secondary",
        on_click=mark, args=(*args, "hallucinated", how, expected, next_id),
        width="stretch",
    )  # fmt: skip
    b3.button(
        "Previous", key=KEY_A_PREV, icon=":material/arrow_back:", shortcut="p",
        on_click=_go, args=(qs, prev_id), disabled=prev_id is None, width="stretch",
    )  # fmt: skip
    b4.button(
        "Next", key=KEY_A_NEXT, icon=":material/arrow_forward:", shortcut="n",
        on_click=_go, args=(qs, next_id), disabled=next_id is None, width="stretch",
    )  # fmt: skip


def _answer_history(
    answers: AnswerBook, dataset: str, ex: RAGExample, labels: Mapping[str, AnswerLabel]
) -> None:
    """The answer's label with each reviewer's mark, and the audit trail of its marks."""
    lab = labels.get(ex.id)
    if lab is not None:
        st.markdown(_label_line(lab))
        for r in lab.reviewers:
            how_drawn = f", drawn {r.drawn_by}" if r.drawn_by else ""
            st.caption(f"{md(r.reviewer)}: **{r.label}** ({r.source}{how_drawn})")
    with st.expander("Audit trail of this answer's marks"):
        trail = answers.audit(dataset, ex.id)
        if not trail:
            st.caption("No mark yet.")
        for a in trail:
            was = f" (was {a.before.get('label')})" if a.before else ""
            st.caption(
                md(
                    f"{a.at} · {a.reviewer} · {a.action}: {a.after.get('label')}, drawn "
                    f"{a.after.get('drawn_by')}{was}"
                )
            )


def answer_section(
    answers: AnswerBook,
    qs: AnswerQueueState,
    *,
    dataset: str,
    reviewer: str,
    examples: Sequence[RAGExample],
    items: Sequence[ReviewItem],
    labels: Mapping[str, AnswerLabel],
    marks: Sequence[AnswerReview],
    set_now: str | None = None,
) -> None:
    """The whole-answer queue and the current answer's card (``marks``: the dataset's
    answer marks, read once by the page; ``set_now``: the name of the set that judges
    the dataset now, to tell a verdict scanned with the previous set)."""
    before = qs.order
    how = pick_order(qs)
    if how != before:
        qs.current = None  # another order starts at its own first answer
    scanned = answers.scanned(dataset, examples)
    by_id = {e.id: e for e in examples}
    order = order_answers([e.id for e in examples], how, dataset=dataset, scanned=scanned)
    mine = {m.example_id: m for m in marks if m.reviewer == reviewer}
    _queue_caption(order, scanned, mine, labels)
    skip = st.toggle("Skip answers I marked", value=True, key=KEY_A_SKIP_MINE)
    shown = [i for i in order if not (skip and i in mine)]
    link = follow(P_ANSWER, one_of(order))
    if link.value is not None:
        qs.current = link.value
        if link.value not in shown:
            shown = [link.value, *shown]
    if not shown:
        publish(P_ANSWER, None, missing=link.missing, what="answer", where="in this dataset")
        st.success("You marked every answer of this dataset.")
        return
    if qs.current not in shown:
        qs.current = shown[0]
    publish(P_ANSWER, qs.current, missing=link.missing, what="answer", where="in this dataset")
    idx = shown.index(qs.current)
    ex = by_id[qs.current]
    prev_id = shown[idx - 1] if idx > 0 else None
    next_id = shown[idx + 1] if idx + 1 < len(shown) else None
    own = mine.get(ex.id)
    with st.container(border=True):
        st.markdown(f"#### Answer {order.index(ex.id) + 1} of {len(order)} · {code(ex.id)}")
        st.caption(_verdict_line(scanned.get(ex.id), set_now))
        _answer_texts(ex, items, own)
        args = (answers, qs, dataset, ex, reviewer)
        _answer_buttons(args, how=how, own=own, prev_id=prev_id, next_id=next_id)
        if qs.outcome is not None:
            kind, text = qs.outcome
            (st.error if kind == "error" else st.success)(text)
            qs.outcome = None
        _answer_history(answers, dataset, ex, labels)
