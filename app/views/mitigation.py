"""Mitigation: make the model answer again, and see whether the detectors agree it helped.

Three ways, on one answer (the Home dataset, the built-in corpus, or the
Playground's analysed answer):

- **Feedback**: a follow-up turn tells the model its answer may be unsupported
  (instance level) or quotes the spans a detector flagged (token level); the model
  answers again and every shipped detector scores both answers.
- **AARF** (ReDeEP): greedy decoding that, on the steps where the token-level ReDeEP
  score passes tau, scales the selected copying heads by alpha2 and the selected
  layers' MLPs by beta2; the steps it intervened on are listed.
- **SAE steering** (RAGLens): set one SAE feature at one answer position to -20, 0 or
  20 (or your values) and let the model continue; the continuations side by side.
"""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import streamlit as st

from app.components.answer_picker import AnswerKeys
from app.components.artifacts import open_answer_page
from app.components.diff import word_diff_html
from app.components.estimate import estimate_caption
from app.components.exports import whole_table
from app.state.detectors import DetectorSet, detector_set
from app.state.estimates import answer_estimate, generation_seconds, record_answers
from app.state.links import P_METHOD, bind, one_of
from app.state.mitigation import (
    KEY_AARF,
    KEY_ALPHA2,
    KEY_BETA2,
    KEY_DATASET,
    KEY_EXAMPLE,
    KEY_FEATURE,
    KEY_FEEDBACK,
    KEY_GUIDE,
    KEY_HEADS_ONLY,
    KEY_MAX_TOKENS,
    KEY_METHOD,
    KEY_POSITION,
    KEY_REJUDGE,
    KEY_SOURCE,
    KEY_STEER,
    KEY_TAU,
    KEY_TEMPERATURE,
    KEY_VALUES,
)
from app.state.session import AppState, seed_widget
from app.state.spad_views import train_command
from app.state.verdicts import answer_verdicts
from app.text import code, md, md_lines
from core.base.errors import RagscopeError
from core.detectors import DETECTORS
from core.detectors.raglens import load_config_sae
from core.engine.layout import render
from core.interventions.aarf import AARFOptions, aarf_generate
from core.interventions.counterfactual import on_template
from core.interventions.mitigate import (
    FeedbackTurn,
    answer_change,
    feedback_regenerate,
    feedback_turn,
)
from core.interventions.steer import steer_continuation
from core.learning.contract import flag_threshold, scores_tokens
from core.pipeline.judge import AnswerVerdict
from core.pipeline.span_judge import span_judge
from core.signals.smoothing import flagged_spans

if TYPE_CHECKING:
    from core.base.examples import RAGExample
    from core.engine.model import LoadedModel

# Page scripts run with Streamlit's magic: a bare string would be drawn, so no
# attribute docstrings here.
ANSWER_KEYS = AnswerKeys(source=KEY_SOURCE, dataset=KEY_DATASET, example=KEY_EXAMPLE)
ACTION = "mitigation"  # what Regenerate's judging pace is recorded as (app.state.estimates)
METHODS = {"feedback": "Feedback", "aarf": "AARF (ReDeEP)", "steer": "SAE steering (RAGLens)"}
INSTANCE = "instance level (no detail)"


def before_after(
    model: LoadedModel, shipped: DetectorSet, original: RAGExample, answers: dict[str, str]
) -> pd.DataFrame:
    """The set's verdict on each answer (columns: its probability and flag; ``threshold``
    from the same calibration, one column per answer where they differ), one row per
    detector and a first row for the overall verdict. Each answer is judged as
    :func:`app.state.verdicts.answer_verdicts` judges it, so the original's numbers are
    the ones the Playground shows."""
    base = on_template(original)
    judged: dict[str, AnswerVerdict] = {}
    for label, text in answers.items():
        if not text.strip():
            continue
        ex = (
            original
            if text == original.response
            else dataclasses.replace(base, response=text, spans=(), label=None)
        )
        got = answer_verdicts(model, ex, shipped).answer
        if got is not None:
            judged[label] = got
    if not judged:
        return pd.DataFrame()
    first = next(iter(judged.values()))
    names = [f"overall ({first.judge})", *first.verdicts]
    cells: dict[str, dict[str, tuple[float, float | None, str]]] = {}
    for label, a in judged.items():
        overall = "flagged" if a.hallucinated else "not flagged"
        cells[label] = {names[0]: (a.probability, a.threshold, overall)}
        for n, v in a.verdicts.items():
            cells[label][n] = (v.score, v.threshold, v.call)
    one_threshold = all(len({c[n][1] for c in cells.values() if n in c}) == 1 for n in names)
    rows = []
    for n in names:
        row: dict[str, object] = {"detector": n}
        if one_threshold:
            row["threshold"] = next(c[n][1] for c in cells.values() if n in c)
        for label, c in cells.items():
            if n not in c:
                continue
            p, thr, call = c[n]
            row[label] = p
            if not one_threshold:
                row[f"{label} threshold"] = thr
            row[f"{label} verdict"] = call
        rows.append(row)
    return pd.DataFrame(rows)


def kept_scores(
    state: AppState,
    model: LoadedModel,
    shipped: DetectorSet,
    example: RAGExample,
    answers: dict[str, str],
) -> None:
    """The kept run's scores (``state.mit.result[3]``), judged again on request when they
    were computed with another set than the one that judges the answer now."""
    res = state.mit.result
    assert res is not None
    stale = detector_set(model).stale(state.mit.judged_with, example)
    if stale is not None:
        st.warning(f"These scores were {md(stale)}.", icon=":material/history:")
        if st.button("Judge both answers with the set in use", key=KEY_REJUDGE):
            try:
                with st.spinner("Judging both answers…"):
                    frame = before_after(model, shipped, example, answers)
            except RagscopeError as e:
                st.error(f"Judging failed: {md(e)}")
            else:
                state.mit.result = (*res[:3], frame, *res[4:])
                state.mit.judged_with = shipped.set_id
                st.rerun()
    show_scores(res[3])


def show_scores(frame: pd.DataFrame) -> None:
    if frame.empty:
        st.info("No detector is shipped for this model, so the answers are not re-scored.")
        return
    probabilities = [c for c in frame.columns if c != "detector" and not c.endswith("verdict")]
    whole_table(frame, numbers=probabilities)  # every detector, no inner scroll
    st.caption(
        "Each answer judged by the detector set as on the Playground: the calibrated "
        "probability, flagged when it reaches the threshold of the same calibration; the "
        "first row is the set's overall verdict."
    )


def guide_spans(
    model: LoadedModel, shipped: DetectorSet, name: str, example: RAGExample
) -> list[tuple[int, int]]:
    """The answer's character spans detector ``name`` flags at its token threshold, read
    off the set's verdict on the answer (:func:`app.state.verdicts.answer_verdicts`: the
    token scores every page shows)."""
    v = answer_verdicts(model, example, shipped).verdict(name)
    if v is None or v.token_scores is None or v.token_offsets is None:
        return []
    det = shipped.card(name).detector
    return flagged_spans(
        np.asarray(v.token_scores), np.asarray(v.token_offsets), flag_threshold(det)
    )


def _feedback_regenerate(
    state: AppState,
    model: LoadedModel,
    example: RAGExample,
    shipped: Any,
    turn: FeedbackTurn,
    *,
    spans: list[tuple[int, int]],
    level: str,
    max_tokens: int,
    temperature: float,
) -> None:
    """Regenerate with the feedback turn and judge both answers (kept in the state)."""
    try:
        with st.spinner("The model answers again…"):
            gen = feedback_regenerate(
                model,
                on_template(example),
                spans=spans,
                level=level,  # type: ignore[arg-type]
                max_new_tokens=max_tokens,
                temperature=temperature,
            )
            if not gen.text.strip():
                raise RagscopeError(
                    "the model wrote an empty answer; raise the temperature or the length"
                )
            t0 = time.perf_counter()
            frame = before_after(
                model,
                shipped,
                example,
                {"original": example.response, "after feedback": gen.text},
            )
            # The judging's pace (the generation is estimated on its own).
            record_answers(model, shipped, ACTION, [example], time.perf_counter() - t0)
        state.mit.result = ("feedback", example.id, gen.text, frame, turn)
        state.mit.judged_with = shipped.set_id
    except RagscopeError as e:
        st.error(f"Regeneration failed: {md(e)}")


def _feedback_result(
    state: AppState, model: LoadedModel, shipped: DetectorSet, example: RAGExample
) -> None:
    """The answer after feedback, struck against the first, and both answers' scores."""
    res = state.mit.result
    if res is not None and res[0] == "feedback" and res[1] == example.id:
        sent: FeedbackTurn = res[4]
        change = answer_change(example.response, res[2])
        st.markdown(
            f"**New answer** after the {sent.sent}-level feedback (struck: left out; green: new)"
        )
        st.html(word_diff_html(example.response, res[2], "rs-answer-diff"))
        if change.identical:
            st.info(
                "The new answer is **identical to the first**, so every verdict below is "
                "unchanged: the feedback did not move the model. A temperature above 0, "
                "token-level feedback that quotes spans, or another method may."
            )
        else:
            st.caption(f"Changed from the first answer: {change.describe()}.")
        answers = {"original": example.response, "after feedback": res[2]}
        kept_scores(state, model, shipped, example, answers)


def feedback_section(
    state: AppState, model: LoadedModel, example: RAGExample, shipped: Any, max_tokens: int
) -> None:
    dets = {d.name: d for d in shipped.detectors}
    token_dets = [n for n, d in dets.items() if scores_tokens(d.detector)]
    options = [INSTANCE, *token_dets]
    if state.mit.guide not in options:
        judge = span_judge([dets[n].detector for n in token_dets])
        state.mit.guide = judge.name if judge is not None else options[-1]
        st.session_state.pop(KEY_GUIDE, None)
    seed_widget(KEY_GUIDE, state.mit.guide)
    c1, c3, c4 = st.columns([3, 1, 1], vertical_alignment="bottom")
    with c1:
        state.mit.guide = st.selectbox(
            "Feedback",
            options,
            key=KEY_GUIDE,
            format_func=lambda n: n if n == INSTANCE else f"token level: spans {n} flags",
        )
    with c3:
        seed_widget(KEY_TEMPERATURE, 0.0)
        temperature = float(
            st.number_input(
                "Temperature", 0.0, 2.0, step=0.1, key=KEY_TEMPERATURE, help="0 = greedy"
            )
        )
    with c4:
        go = st.button("Regenerate", key=KEY_FEEDBACK, type="primary", icon=":material/replay:")
    spans: list[tuple[int, int]] = []
    if state.mit.guide != INSTANCE:
        guide = dets[state.mit.guide]
        try:
            with st.spinner("Reading the answer's flags…"):
                spans = guide_spans(model, shipped, guide.name, example)
        except RagscopeError as e:
            st.error(f"{md(guide.name)} could not read this answer: {md(e)}")
            return
    level = "instance" if state.mit.guide == INSTANCE else "token"
    turn = feedback_turn(example, spans, level)  # type: ignore[arg-type]
    if turn.fell_back:
        st.warning(
            f"{md(state.mit.guide)} flags no span of this answer at its token threshold "
            f"({flag_threshold(dets[state.mit.guide].detector):.3f}), so there is nothing "
            "to quote: the **instance-level** message below is sent instead. Token "
            "heatmaps shows its token scores."
        )
    quoting = f", quoting {len(turn.quotes)} flagged span(s)" if turn.quotes else ""
    st.markdown(f"**Feedback turn sent** ({turn.sent} level{quoting}): {md(turn.message)}")
    if not go:
        estimate_caption(
            lambda: answer_estimate(
                model,
                example,
                shipped,
                1,
                action=ACTION,
                fixed_seconds=generation_seconds(model, max_tokens, example),
            ),
            what="answers (the new one, judged by the set at the original's pace)",
            extra="generating the new answer (about as long as the first)",
        )
    if go:
        _feedback_regenerate(
            state,
            model,
            example,
            shipped,
            turn,
            spans=spans,
            level=level,
            max_tokens=max_tokens,
            temperature=temperature,
        )
    _feedback_result(state, model, shipped, example)


def aarf_section(
    state: AppState, model: LoadedModel, example: RAGExample, shipped: Any, max_tokens: int
) -> None:

    dets = {d.name: d for d in shipped.detectors}
    heads = DETECTORS.explained("head-tokens")
    if heads not in dets:
        st.info(
            f"AARF reads a trained {heads} detector, and none is shipped for this model: "
            f"{code(train_command(heads, shipped.folder))}."
        )
        return
    det = dets[heads]
    c1, c2, c3, c4, c5 = st.columns([1, 1, 1, 1.2, 1], vertical_alignment="bottom")
    seed_widget(KEY_ALPHA2, 2.0)
    seed_widget(KEY_BETA2, 0.8)
    seed_widget(KEY_TAU, round(float(det.threshold_), 3))
    seed_widget(KEY_HEADS_ONLY, True)
    alpha2 = float(c1.number_input("alpha2 (heads)", 0.1, 20.0, step=0.5, key=KEY_ALPHA2))
    beta2 = float(c2.number_input("beta2 (MLPs)", 0.05, 5.0, step=0.05, key=KEY_BETA2))
    tau = float(c3.number_input("tau", 0.0, 1.0, step=0.01, key=KEY_TAU, format="%.3f"))
    heads_only = c4.toggle(
        "Heads only",
        key=KEY_HEADS_ONLY,
        help="Leave the MLPs alone: the paper's beta2 = 0.2 on many MLPs derails a 135M model",
    )
    go = c5.button("Run AARF", key=KEY_AARF, type="primary", icon=":material/tune:")
    if go:
        try:
            with st.spinner("Decoding with AARF (each step re-reads the whole answer)…"):
                options = AARFOptions(
                    tau=tau,
                    alpha2=alpha2,
                    beta2=beta2,
                    max_new_tokens=max_tokens,
                    layers=() if heads_only else None,
                )
                res = aarf_generate(model, on_template(example), det.detector, options)
                frame = before_after(
                    model,
                    shipped,
                    example,
                    {"plain greedy": res.plain_text or "", "AARF": res.text},
                )
            state.mit.result = ("aarf", example.id, res, frame)
            state.mit.judged_with = shipped.set_id
        except (RagscopeError, ValueError) as e:
            st.error(f"AARF failed: {md(e)}")
    r = state.mit.result
    if r is not None and r[0] == "aarf" and r[1] == example.id:
        res = r[2]
        st.markdown(
            f"**Plain greedy:** {md(res.plain_text)}  \n**AARF:** {md(res.text)}  \n"
            f"{res.n_intervened} of {res.n_steps} steps intervened on."
        )
        answers = {"plain greedy": res.plain_text or "", "AARF": res.text}
        kept_scores(state, model, shipped, example, answers)
        with st.expander("Steps"):
            st.dataframe(res.to_frame(model.tokenizer), hide_index=True, width="stretch")


def steer_section(
    state: AppState, model: LoadedModel, example: RAGExample, shipped: Any, max_tokens: int
) -> None:

    dets = {d.name: d for d in shipped.detectors}
    sae_detector = dets.get(DETECTORS.explained("sae-features"))
    spec = sae_detector.detector.config.sae if sae_detector is not None else ""
    try:
        sae = load_config_sae(spec)
        sae.check_model(model.info.key, model.info.d_model)
    except RagscopeError as e:
        st.info(
            f"SAE steering needs an SAE for this model ({md(e)}); train one with "
            "`ragscope sae train`."
        )
        return
    ranked = list(getattr(sae_detector and sae_detector.detector, "selected_", ()))
    layout = render(on_template(example), model)
    tokens = layout.response_token_strings()
    c1, c2, c3, c4 = st.columns([1.2, 2, 1.2, 1], vertical_alignment="bottom")
    seed_widget(KEY_FEATURE, int(ranked[0]) if ranked else 0)
    feature = int(
        c1.number_input(
            "SAE feature",
            0,
            sae.d_sae - 1,
            step=1,
            key=KEY_FEATURE,
            help="Default: the feature RAGLens ranks first",
        )
    )
    seed_widget(KEY_POSITION, min(len(tokens) - 1, max(0, len(tokens) // 3)))
    with c2:
        position = st.select_slider(
            "Answer position",
            options=list(range(len(tokens))),
            key=KEY_POSITION,
            format_func=lambda j: f"{j}: {tokens[j]!r}",
        )
    seed_widget(KEY_VALUES, "-20, 0, 20")
    raw = c3.text_input("Values", key=KEY_VALUES, help="Comma-separated activations to set")
    go = c4.button("Steer", key=KEY_STEER, type="primary", icon=":material/alt_route:")
    if go:
        try:
            values = [float(v) for v in raw.split(",") if v.strip()]
            if not values:
                raise ValueError("give at least one value")
        except ValueError as e:
            st.error(f"Values must be numbers separated by commas ({md(e)}).")
            return
        try:
            with st.spinner("Continuing the answer under each value…"):
                runs = [
                    steer_continuation(
                        model,
                        sae,
                        on_template(example),
                        feature=feature,
                        position=int(position),
                        value=v,
                        max_new_tokens=max_tokens,
                    )
                    for v in [None, *values]
                ]
            state.mit.result = ("steer", example.id, runs, None)
        except RagscopeError as e:
            st.error(f"Steering failed: {md(e)}")
    r = state.mit.result
    if r is not None and r[0] == "steer" and r[1] == example.id:
        runs = r[2]
        st.markdown(f"**Prefix** (teacher-forced): {md(runs[0].prefix)}")
        cols = st.columns(len(runs))
        for col, run in zip(cols, runs, strict=True):
            with col.container(border=True):
                st.markdown(
                    "**not steered**"
                    if run.value is None
                    else f"**F{run.feature} = {run.value:g}**"
                )
                st.markdown(md_lines(run.continuation) if run.continuation else "(stops at once)")


def main() -> None:
    opened = open_answer_page(
        "Mitigation",
        "Make the model answer again — told what was flagged, with ReDeEP's attention "
        "reweighting, or with an SAE feature pushed up or down — and see whether the "
        "detectors think it helped.",
        lambda state: state.mit,
        ANSWER_KEYS,
    )
    if opened is None:
        return
    state, model, shipped, example = opened
    seed_widget(KEY_MAX_TOKENS, 48)
    m1, m2 = st.columns([4, 1], vertical_alignment="bottom")
    state.mit.method = bind(
        P_METHOD,
        KEY_METHOD,
        lambda: m1.radio(
            "Method",
            list(METHODS),
            key=KEY_METHOD,
            format_func=METHODS.__getitem__,
            horizontal=True,
        ),
        parse=one_of(METHODS),
        seed=state.mit.method,
        default=next(iter(METHODS)),
        what="method",
        where=" or ".join(METHODS),
        instead=METHODS.__getitem__,
    )
    with m2:
        max_tokens = int(st.number_input("Max new tokens", 4, 512, step=8, key=KEY_MAX_TOKENS))
    st.divider()
    section = {"feedback": feedback_section, "aarf": aarf_section, "steer": steer_section}
    section[state.mit.method](state, model, example, shipped, max_tokens)


main()
