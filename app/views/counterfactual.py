"""Counterfactual context editing: change the passages, keep or regenerate the answer,
and see how every detector's reading moves.

Start from an example (the Home dataset, the built-in corpus, or the Playground's
analysed answer, which may be typed by hand); edit its passages in place (change a
number or a name, delete or insert a sentence, drop a passage, or drop them all), or
apply a preset built from a hallucination span (state its claim in the passage, or
state it differently); keep the answer fixed (teacher-forced) or let the model
regenerate it; then **Compare**. Every shipped detector scores both versions; the
page shows the scores side by side, the context diff, and token rows of the original,
the edited version and their difference aligned on the answer's tokens. Sessions are
saved in SQLite, reloaded, and exported as JSON.
"""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import streamlit as st

from app.components.answer_picker import AnswerKeys
from app.components.artifacts import open_answer_page
from app.components.diff import word_diff_html
from app.components.estimate import estimate_caption
from app.components.exports import whole_table
from app.components.multirow import DIFF_CMAP, HeatRow, gold_row, multirow_html
from app.state.analysis import input_signature
from app.state.counterfactual import (
    KEY_CF_DATASET,
    KEY_CF_EXAMPLE,
    KEY_CF_SOURCE,
    KEY_COMPARE,
    KEY_CONTRADICT,
    KEY_LOAD,
    KEY_MAX_TOKENS,
    KEY_MODE,
    KEY_NAME,
    KEY_NO_CONTEXT,
    KEY_PRESET,
    KEY_RESET,
    KEY_SAVE,
    KEY_SAVED,
    KEY_SPAN,
    KEY_SUPPORT,
)
from app.state.datasets import get_store
from app.state.detectors import DetectorSet, detector_set
from app.state.estimates import (
    answer_estimate,
    generation_seconds,
    record_answers,
)
from app.state.links import P_MODE, bind, one_of
from app.state.session import AppState, seed_widget
from app.state.verdicts import keep_judgement, known_verdicts
from app.text import md
from core.base.errors import RagscopeError
from core.base.words import plural
from core.engine.layout import render
from core.interventions.counterfactual import (
    Counterfactual,
    SideScore,
    contradict_span,
    edit_example,
    judge_pair,
    load_session,
    on_template,
    regenerate,
    score_original,
    support_span,
    warm_scoring,
)
from core.learning.contract import align_token_scores
from core.pipeline.extract import answer_tokens

if TYPE_CHECKING:
    from core.base.examples import RAGExample
    from core.engine.model import LoadedModel
    from core.pipeline.extract import WorkEstimate

# Page scripts run with Streamlit's magic: a bare string would be drawn, so no
# attribute docstrings here.
ANSWER_KEYS = AnswerKeys(source=KEY_CF_SOURCE, dataset=KEY_CF_DATASET, example=KEY_CF_EXAMPLE)
ACTION = "counterfactual"  # what Compare's scoring pace is recorded as (app.state.estimates)
PRESET_SUPPORT = "support the span"
PRESET_DIFFERENT = "state the span differently"
EXPECT = {PRESET_SUPPORT: "fewer", PRESET_DIFFERENT: "as many"}
MODES = {"fixed": "Keep the answer (teacher-forced)", "regenerate": "Regenerate it"}


def passage_key(sig: str, k: int) -> str:
    return f"cf.passage.{sig}.{k}"


def keep_key(sig: str, k: int) -> str:
    return f"cf.keep.{sig}.{k}"


# --------------------------------------------------------------------------- input


def _set_passages(sig: str, passages: tuple[str, ...], preset: str | None = None) -> None:
    st.session_state[KEY_PRESET] = (preset, tuple(passages)) if preset else None
    for k, text in enumerate(passages):
        st.session_state[passage_key(sig, k)] = text
        st.session_state[keep_key(sig, k)] = True


def edit_name(passages: tuple[str, ...], original: tuple[str, ...]) -> str:
    """The preset that made ``passages`` (when they are still exactly its output)."""
    if tuple(passages) == tuple(original):
        return "context unchanged"
    applied = st.session_state.get(KEY_PRESET)
    if applied and tuple(passages) == applied[1]:
        return str(applied[0])
    return "context edited by hand"


def _drop_all(sig: str, n: int) -> None:
    for k in range(n):
        st.session_state[keep_key(sig, k)] = False


def edit_passages(example: RAGExample, sig: str) -> tuple[str, ...]:
    """The passage editors (with presets); returns the edited passages (dropped ones left out)."""
    st.subheader("Edit the context")
    if example.spans:
        spans = {
            i: f"“{example.response[s.start : s.end]}” ({s.start}\u2013{s.end})"
            for i, s in enumerate(example.spans)
        }
        c1, c2, c3, c4 = st.columns([2, 1.2, 1.2, 0.8], vertical_alignment="bottom")
        with c1:
            span = st.selectbox(
                "Hallucination span", list(spans), key=KEY_SPAN, format_func=spans.__getitem__
            )
        c2.button(
            "Support it",
            key=KEY_SUPPORT,
            on_click=_set_passages,
            args=(sig, support_span(example, span), PRESET_SUPPORT),
            help="Copy the span's claim (its answer sentence) into the passage it is about: "
            "the flags should go",
            width="stretch",
        )
        c3.button(
            "State it differently",
            key=KEY_CONTRADICT,
            on_click=_set_passages,
            args=(sig, contradict_span(example, span), PRESET_DIFFERENT),
            help="Put the claim in the passage with its numbers or names changed: still "
            "unsupported, so the flags should stay",
            width="stretch",
        )
        c4.button(
            "Reset",
            key=KEY_RESET,
            on_click=_set_passages,
            args=(sig, example.passages),
            width="stretch",
        )
    else:
        st.button("Reset", key=KEY_RESET, on_click=_set_passages, args=(sig, example.passages))
        st.caption("This answer has no hallucination span, so the span presets are off.")
    out = []
    for k, text in enumerate(example.passages):
        seed_widget(passage_key(sig, k), text)
        seed_widget(keep_key(sig, k), True)
        c_text, c_keep = st.columns([6, 1], vertical_alignment="top")
        with c_text:
            edited = st.text_area(f"Passage {k + 1}", key=passage_key(sig, k), height=110)
        with c_keep:
            keep = st.checkbox("Keep", key=keep_key(sig, k), help="Untick to remove the passage")
        if keep:
            out.append(edited)
    st.button(
        "Remove all context",
        key=KEY_NO_CONTEXT,
        on_click=_drop_all,
        args=(sig, len(example.passages)),
        icon=":material/block:",
    )
    return tuple(out)


# --------------------------------------------------------------------------- results


def scores_frame(cf: Counterfactual) -> pd.DataFrame:
    """One row per detector: original and edited score and verdict, and the change."""

    def verdict(s: SideScore) -> str:
        return s.call or {True: "flagged", False: "not flagged", None: "-"}[s.flagged]

    rows = []
    for name, o in cf.original_scores.items():
        e = cf.edited_scores.get(name)
        if e is None:
            continue
        rows.append(
            {
                "detector": name,
                "original": o.score,
                "edited": e.score,
                "change": e.score - o.score,
                "original verdict": verdict(o),
                "edited verdict": verdict(e),
            }
        )
    return pd.DataFrame(rows)


def token_rows(cf: Counterfactual, model: LoadedModel) -> tuple[list[str], list[HeatRow]] | None:
    """Answer tokens and, per token-scoring detector, original / edited / difference rows
    (fixed answers only: a regenerated answer has other tokens)."""

    if cf.answer_mode != "fixed":
        return None
    layout = render(cf.original, model)
    offsets = layout.response_offsets
    rows: list[HeatRow] = []
    labels = layout.token_labels()
    if labels is not None:
        rows.append(gold_row(labels))
    for name, o in cf.original_scores.items():
        e = cf.edited_scores.get(name)
        if e is None or o.token_scores is None or e.token_scores is None:
            continue
        vo = align_token_scores(np.asarray(o.token_scores), np.asarray(o.token_offsets), offsets)
        ve = align_token_scores(np.asarray(e.token_scores), np.asarray(e.token_offsets), offsets)
        rows += _triple(name, vo, ve, 1.0)
    for name, o in cf.original_scores.items():
        e = cf.edited_scores.get(name)
        if e is None or o.token_offsets is None or e.token_offsets is None:
            continue
        for row, vals in o.token_rows.items():
            if row not in e.token_rows:
                continue
            vo = _on(vals, o.token_offsets, offsets)
            ve = _on(e.token_rows[row], e.token_offsets, offsets)
            top = float(np.nanmax(np.abs(np.concatenate([vo, ve])))) or 1.0
            rows += _triple(row if row.startswith("SAE") else f"{name} {row}", vo, ve, top)
    return list(layout.response_token_strings()), rows


def _on(values: tuple[float, ...], offsets: object, target: np.ndarray) -> np.ndarray:
    return align_token_scores(np.asarray(values), np.asarray(offsets), target)


def _triple(name: str, vo: np.ndarray, ve: np.ndarray, top: float) -> list[HeatRow]:
    """Original, edited and difference rows of one signal (``top``: its scale)."""
    return [
        HeatRow(name=f"{name}: orig", values=vo, vmax=top),
        HeatRow(name=f"{name}: edited", values=ve, vmax=top),
        HeatRow(
            name=f"{name}: Δ",
            values=ve - vo,
            vmin=-top,
            vmax=top,
            cmap=DIFF_CMAP,
            fmt="+.3f",
        ),
    ]


def summary_frame(cf: Counterfactual) -> pd.DataFrame:
    """The detectors' summary values (e.g. SPAD's mean sources), original vs edited."""
    rows = []
    for name, o in cf.original_scores.items():
        e = cf.edited_scores.get(name)
        for key, v in o.summary.items():
            if e is not None and key in e.summary:
                rows.append(
                    {
                        "detector": name,
                        "value": key,
                        "original": v,
                        "edited": e.summary[key],
                        "change": e.summary[key] - v,
                    }
                )
    return pd.DataFrame(rows)


def verdict_lines(model: LoadedModel, shipped: DetectorSet, cf: Counterfactual) -> str:
    """The set's overall verdict on each side, when known and of the set that scored the
    comparison (a fresh comparison; a loaded session keeps only the detectors' scores)."""
    lines = []
    for side, ex in (("Original", cf.original), ("Edited", cf.edited)):
        known = known_verdicts(model, ex, input_signature(ex, None), shipped)
        if known is not None and known.answer is not None and known.answer.set_id == cf.set_id:
            colour = "red" if known.answer.hallucinated else "green"
            lines.append(f"**{side}:** :{colour}[{md(known.answer.summary)}]")
    return "  \n".join(lines)


def show_result(cf: Counterfactual, model: LoadedModel, shipped: DetectorSet) -> None:
    st.subheader(f"Original vs edited: {md(cf.name)}")
    if (stale := detector_set(model).stale(cf.set_id, cf.original)) is not None:
        st.warning(
            f"These scores were {md(stale)}: press **Compare** to judge both versions with it.",
            icon=":material/history:",
        )
    changes = cf.changes
    if not changes:
        st.info("The context is unchanged: both sides read the same prompt.")
    else:
        st.markdown("**Context changes:** " + "; ".join(md(c.describe()) for c in changes[:12]))
        with st.expander("Context diff", expanded=True):
            n = max(len(cf.original.passages), len(cf.edited.passages))
            for k in range(n):
                old = cf.original.passages[k] if k < len(cf.original.passages) else ""
                new = cf.edited.passages[k] if k < len(cf.edited.passages) else ""
                if old != new:
                    st.markdown(f"Passage {k + 1}")
                    st.html(word_diff_html(old, new))
    n_o, n_e, n = cf.flag_counts()
    preset = next((p for p in EXPECT if cf.name.endswith(p)), None)
    expected = f" (this preset should leave {EXPECT[preset]})" if preset else ""
    moved = "fewer" if n_e < n_o else ("more" if n_e > n_o else "as many")
    st.markdown(
        f"**Flags:** {n_o} of {n} {plural(n, 'detector')} flag the original, {n_e} the "
        f"edited version: {moved}{expected}."
    )
    if lines := verdict_lines(model, shipped, cf):
        st.markdown(lines)
    if cf.answer_mode == "regenerate":
        st.markdown(f"**Regenerated answer:** {md(cf.edited.response)}")
    frame = scores_frame(cf)
    if frame.empty:
        st.info("No detector is shipped for this model, so there is nothing to re-score.")
    else:
        whole_table(  # every detector, no inner scroll
            frame,
            numbers=("original", "edited"),
            column_config={"change": st.column_config.NumberColumn(format="%+.3f")},
        )
    summary = summary_frame(cf)
    if not summary.empty:
        st.markdown("**Summaries** (SPAD: mean of each probability source over the answer tokens)")
        whole_table(
            summary,
            numbers=("original", "edited"),
            column_config={"change": st.column_config.NumberColumn(format="%+.3f")},
        )
    got = token_rows(cf, model)
    if got is not None and len(got[1]) > 1:
        st.markdown(
            "**Token scores, original vs edited** (orig, edited, and Δ = edited − original: blue = lower, red = higher)"
        )
        st.html(multirow_html(got[0], got[1]))


def save_load(state: AppState, model: LoadedModel) -> None:
    """Save the shown session, reload a saved one, export it as JSON."""
    store = get_store()
    cf = state.cf.result
    c1, c2, c3 = st.columns([3, 1, 1], vertical_alignment="bottom")
    if cf is not None:
        with c1:
            seed_widget(KEY_NAME, cf.name)
            name = st.text_input("Session name", key=KEY_NAME)
        if c2.button("Save", key=KEY_SAVE, icon=":material/save:", width="stretch"):
            try:
                saved = dataclasses.replace(cf, name=name, id=None)
                cf_id = store.save_counterfactual(saved)
                state.cf.result = dataclasses.replace(saved, id=cf_id)
                st.success(f"Saved as #{cf_id} “{md(name)}”.")
            except RagscopeError as e:
                st.error(f"Not saved: {md(e)}")
        c3.download_button(
            "Export JSON",
            data=(state.cf.result or cf).to_json(),
            file_name=f"counterfactual-{cf.original.id}.json",
            mime="application/json",
            icon=":material/download:",
            width="stretch",
        )
    saved_rows = store.list_counterfactuals(model.info.key)
    if saved_rows:
        by_id = {r[0]: f"#{r[0]} {r[1]} ({r[2]}, {r[3]})" for r in saved_rows}
        d1, d2 = st.columns([4, 1], vertical_alignment="bottom")
        with d1:
            pick = st.selectbox(
                "Saved sessions", list(by_id), key=KEY_SAVED, format_func=by_id.__getitem__
            )
        if d2.button("Load", key=KEY_LOAD, icon=":material/folder_open:", width="stretch"):
            try:
                state.cf.result = load_session(store, int(pick))
                st.session_state.pop(KEY_NAME, None)
                st.rerun()
            except RagscopeError as e:
                st.error(f"Could not load #{pick}: {md(e)}")


def compare_estimate(
    state: AppState,
    model: LoadedModel,
    shipped: DetectorSet,
    example: RAGExample,
    max_tokens: int | None,
) -> WorkEstimate:
    """How long Compare takes: both sides scored (one, when the original's was scored to
    time this estimate and is kept; the set's verdicts on each side come from its own
    pass, :func:`core.interventions.counterfactual.judge_pair`), and the new answer
    generated (``max_tokens``: regenerate)."""
    est = answer_estimate(
        model,
        example,
        shipped,
        2,
        action=ACTION,
        # Before a Compare has run here: one side scored as Compare scores it.
        time_one=lambda ex: timed_side(state, model, shipped, ex),
        fixed_seconds=generation_seconds(model, max_tokens, example) if max_tokens else 0.0,
    )
    ahead = state.cf.scored
    if (
        ahead is not None
        and ahead[0] == shipped.cache_id
        and ahead[1].example == on_template(example)
    ):
        # the original's side, scored to time this estimate, is kept for the Compare
        return dataclasses.replace(
            est, n_cached=1, chars_to_trace=est.chars_to_trace - answer_tokens(model, example)
        )
    return est


def timed_side(
    state: AppState, model: LoadedModel, shipped: DetectorSet, example: RAGExample
) -> float:
    """The seconds one side of a Compare takes, timed by scoring ``example`` as Compare
    scores its original (in the background, :func:`app.state.estimates.deferred_timing`);
    the side is kept for the Compare that follows."""
    warm_scoring(model, shipped.fitted)
    side = score_original(model, shipped.fitted, example)
    state.cf.scored = (shipped.cache_id, side)
    return side.seconds


def compare(
    state: AppState,
    model: LoadedModel,
    shipped: DetectorSet,
    example: RAGExample,
    edited_passages: tuple[str, ...],
    max_tokens: int,
) -> None:
    """Score the original and the edited version (the answer regenerated under the
    edited context, or kept), keep the result, and record the scoring's pace."""
    try:
        with st.spinner("Scoring the original and the edited version…"):
            if state.cf.answer_mode == "regenerate":
                edited = regenerate(model, example, edited_passages, max_new_tokens=max_tokens)
            else:
                edited = edit_example(example, edited_passages)
            ahead, state.cf.scored = state.cf.scored, None
            t0 = time.perf_counter()
            pair = judge_pair(
                model,
                shipped,  # the set that judges the answer (open_answer_page)
                example,
                edited,
                name=f"{example.id}: {edit_name(edited_passages, example.passages)}",
                answer_mode=state.cf.answer_mode,  # type: ignore[arg-type]
                # the original's side scored to time the estimate, when it is this set's
                scored=ahead[1] if ahead is not None and ahead[0] == shipped.cache_id else None,
            )
            # The scoring's pace (the generation is estimated on its own): both sides,
            # the one scored ahead at the time it took then.
            took = time.perf_counter() - t0
            cf = pair.counterfactual
            if ahead is not None and cf.original_scores is ahead[1].scores:
                took += ahead[1].seconds
            record_answers(model, shipped, ACTION, [example] * 2, took)
            # The set's verdict on each side, from that side's own pass, for every page.
            keep_judgement(model, pair.original)
            keep_judgement(model, pair.edited)
            state.cf.result = cf
            st.session_state.pop(KEY_NAME, None)
    except RagscopeError as e:
        st.error(f"The comparison failed: {md(e)}  \nFix: edit the passages and try again.")


def main() -> None:
    opened = open_answer_page(
        "Counterfactual context",
        "Change the passages and see whether the detectors' flags move the way they should: "
        "support a flagged claim and the flag should go; state it differently and it should "
        "stay.",
        lambda state: state.cf,
        ANSWER_KEYS,
    )
    if opened is None:
        return
    state, model, shipped, example = opened
    sig = input_signature(example, None)
    edited_passages = edit_passages(example, sig)
    c1, c2, c3 = st.columns([2, 1, 1], vertical_alignment="bottom")
    state.cf.answer_mode = bind(
        P_MODE,
        KEY_MODE,
        lambda: c1.radio(
            "Answer", list(MODES), key=KEY_MODE, format_func=MODES.__getitem__, horizontal=True
        ),
        parse=one_of(MODES),
        seed=state.cf.answer_mode,
        default=next(iter(MODES)),
        what="answer mode",
        where=" or ".join(MODES),
        instead=MODES.__getitem__,
    )
    with c2:
        seed_widget(KEY_MAX_TOKENS, 96)
        max_tokens = int(
            st.number_input(
                "Max new tokens",
                min_value=8,
                max_value=512,
                step=8,
                key=KEY_MAX_TOKENS,
                disabled=state.cf.answer_mode != "regenerate",
            )
        )
    with c3:
        go = st.button("Compare", key=KEY_COMPARE, type="primary", icon=":material/compare:")
    regen = state.cf.answer_mode == "regenerate"
    if not go:
        estimate_caption(
            lambda: compare_estimate(state, model, shipped, example, max_tokens if regen else None),
            what="versions (the original and the edited)",
            extra="generating the new answer (about as long as the first)" if regen else "",
            kept="this session's memory",
            reread=False,  # each Compare scores its versions anew
        )
    if go:
        compare(state, model, shipped, example, edited_passages, max_tokens)
    st.divider()
    if state.cf.result is not None:
        show_result(state.cf.result, model, shipped)
    save_load(state, model)


main()
