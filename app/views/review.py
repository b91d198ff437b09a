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

import streamlit as st

from app.auth import auth_configured, current_identity
from app.components.adapt_job import adapt_panel
from app.components.answer_review import answer_section
from app.components.review_card import item_card
from app.components.review_scan import build_section, queue_filters, queue_table
from app.state.datasets import get_store, load_examples
from app.state.detectors import detector_set
from app.state.heads import HEADS_FROM_CORPUS, heads_examples, review_key
from app.state.links import (
    DATASETS_HERE,
    P_DATASET,
    P_ITEM,
    P_MODE,
    bind,
    dataset_spec,
    linked,
    one_of,
    publish,
)
from app.state.model import get_model
from app.state.review import (
    KEY_CHANGE,
    KEY_DATASET,
    KEY_EXPORT_ALL,
    KEY_EXPORT_NAME,
    KEY_EXPORT_REPLACE,
    KEY_EXPORT_SAVE,
    KEY_EXPORT_WHO,
    KEY_MODE,
    KEY_NAME,
    KEY_START,
    ReviewState,
    dataset_options,
    page_state,
    review_seed,
)
from app.state.runs import CORPUS
from app.state.session import app_state
from app.text import code, md
from core.base.errors import RagscopeError
from core.base.examples import RAGExample
from core.base.words import plural
from core.data import is_named_spec, stored_spec
from core.review import (
    AnswerBook,
    AnswerLabel,
    AnswerReview,
    ReviewBook,
    ReviewItem,
    agreement,
    answer_agreement,
    answer_labels,
    ragtruth_jsonl,
    reviewed_examples,
    reviews_frame,
    safe_csv,
)

# Page scripts run with Streamlit's magic: no bare strings (they would be drawn).
LATEST = "every reviewer's, by the label rules"
MODES = {"spans": "Flagged spans", "answers": "Whole answers"}


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


def pick_dataset(rs: ReviewState) -> tuple[str, list[RAGExample]] | None:
    """The dataset reviewed: a fresh session opens on Home's, a pick here is kept."""
    options = dataset_options()
    specs = {k: CORPUS if ref is None else dataset_spec(ref) for k, (_, ref) in options.items()}
    home = review_key(app_state().dataset)
    key = bind(
        P_DATASET,
        KEY_DATASET,
        lambda: st.selectbox(
            "Dataset", list(options), format_func=lambda k: options[k][0], key=KEY_DATASET
        ),
        parse={s: k for k, s in specs.items()}.get,
        to_id=specs.__getitem__,
        seed=review_seed(options, home, rs.dataset),
        what="dataset",
        where=DATASETS_HERE,
        instead=lambda k: md(options[k][0]),
    )
    rs.dataset = None if key == home else key
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
        f"{len(reviewed)} {plural(len(reviewed), 'answer')} with a label ({n_h} "
        "hallucinated), by the label rules. "
        "RAGTruth-style JSONL, the "
        "format of the shared dev sets: retrain on it with "
        "`ragscope train --dataset reviewed.jsonl`."
        + (
            f" {n_stale} stale {plural(n_stale, 'item')} (flagged on an earlier version "
            f"of {plural(n_stale, 'its answer', 'their answers')}) "
            f"{plural(n_stale, 'is', 'are')} left out of every export."
            if n_stale
            else ""
        )
    )
    stem = key.replace(":", "-").replace("/", "-")
    download_row(stem, reviewed, items, examples)
    store_row(stem, label, reviewed)


def download_row(
    stem: str, reviewed: list[RAGExample], items: list[ReviewItem], examples: list[RAGExample]
) -> None:
    """The reviewed dataset as JSONL and every decision as CSV."""
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


def store_row(stem: str, label: str, reviewed: list[RAGExample]) -> None:
    """Store the reviewed dataset under a name (replacing one only when asked)."""
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
            st.success(
                f"Stored {n} {plural(n, 'answer')} as **{md(name)}**: pick it on Home or here."
            )


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
    picked = pick_dataset(rs)
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
        model = get_model()
        asked = detector_set(model)
        answer_section(
            answers,
            rs.answers,
            dataset=key,
            reviewer=rs.reviewer or "",
            examples=examples,
            items=everything,
            labels=labels,
            marks=marks,
            set_now=asked.for_examples(examples).name,
        )
        st.divider()
        adapt_panel(
            model,
            asked,
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
