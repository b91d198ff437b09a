"""Playground: pick or write a RAG example, get an answer, and read it token by token.

The answer is either written by the model here (streamed) or pasted. "Analyse" runs
one forward pass over prompt + answer and shows each answer token's surprisal (bits)
as a heatmap with the gold hallucination spans underlined, the prompt's segment strip,
and the full token table.

The detectors shipped for the loaded model (``assets/detectors``, or
``RAGSCOPE_DETECTORS_DIR``) judge the same answer from one shared trace: a verdict
table, and their token scores as an alternative colouring of the heatmap. "Analyse"
traces the answer ONCE for the surprisal and every detector and shows each verdict as
soon as its detector is done (:func:`app.state.stream_verdicts`); a display control
afterwards recomputes nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import streamlit as st

from app.components.exports import plot
from app.components.heatmap import ADAPT_BELOW, detector_scale, render_token_heatmap
from app.components.segments import segment_figure, segment_rows
from app.components.set_spans import set_spans_section
from app.state.analysis import Analysis, analyse, input_signature, known_analysis, remember_traced
from app.state.datasets import load_examples
from app.state.detectors import ShippedDetector, ShippedDetectors, shipped_detectors
from app.state.links import (
    HOME_DATASETS_HERE,
    OWN_ID,
    P_CALIBRATE,
    P_DATASET,
    P_DETECTOR,
    P_EXAMPLE,
    P_INPUT,
    OwnInput,
    bind,
    dataset_spec,
    follow,
    follow_home_dataset,
    follow_widget,
    input_id,
    input_problem,
    linked,
    one_of,
    parse_input,
    publish,
)
from app.state.model import get_model
from app.state.playground import (
    ANSWER_GENERATE,
    ANSWER_PASTE,
    ANSWER_SOURCES,
    CALIBRATE_AUTO,
    CALIBRATE_POOLED,
    COLOR_SURPRISAL,
    INPUT_DATASET,
    INPUT_MODES,
    INPUT_OWN,
    KEY_ADD_PASSAGE,
    KEY_ANALYSE,
    KEY_ANSWER_SOURCE,
    KEY_CALIBRATE_AS,
    KEY_COLOR_BY,
    KEY_EXAMPLE,
    KEY_FIXED_SCALE,
    KEY_GENERATE,
    KEY_INPUT_MODE,
    KEY_MAX_TOKENS,
    KEY_OWN_QUESTION,
    KEY_OWN_TASK,
    KEY_PASTED,
    KEY_TEMPERATURE,
    GeneratedAnswer,
    passage_key,
    question_signature,
    remove_passage_key,
)
from app.state.session import AppState, app_state, seed_widget
from app.state.verdicts import (
    DetectorVerdicts,
    Warming,
    detector_verdicts,
    known_verdicts,
    stream_verdicts,
    verdict_frame,
    warm_detectors,
)
from app.text import code, md, md_lines
from core.base.errors import DataError, RagscopeError
from core.base.examples import TASKS, RAGExample
from core.base.paths import repo_root
from core.data import BUILTIN
from core.engine.generate import AnswerStream, GenerationConfig
from core.engine.layout import render
from core.engine.model import LoadedModel
from core.engine.trace import Trace, response_needs
from core.evaluation.recipe import DEFAULT_DETECTORS, TrainRecipe
from core.learning.contract import Verdict, align_token_scores, flag_threshold
from core.pipeline.judge import Judged

if TYPE_CHECKING:
    import pandas as pd
    from streamlit.delta_generator import DeltaGenerator


@dataclass(frozen=True, kw_only=True)
class Draft:
    """The question side of the input (everything but the answer).

    Attributes:
        key: Identifies the input for prefilling (dataset + example id, or ``own``).
        task: The task.
        question: The question (``None`` when there is none).
        passages: The passages.
        prompt: A dataset example's verbatim prompt, if it carries one.
        example: The dataset example (with its own response and gold labels).
    """

    key: str
    task: str
    question: str | None
    passages: tuple[str, ...]
    prompt: str | None = None
    example: RAGExample | None = None

    @property
    def signature(self) -> str:
        return question_signature(self.task, self.question, self.passages, self.prompt)

    def with_answer(self, answer: str) -> RAGExample:
        """The example to analyse; gold labels are kept only for the dataset's own answer.

        Raises:
            DataError: The answer is empty, or the own example is incomplete.
        """
        if self.example is not None:
            if answer == self.example.response:
                return self.example
            return self.example.with_response(answer)
        return RAGExample(
            id=OWN_ID,
            task=self.task,  # type: ignore[arg-type]
            question=self.question,
            passages=self.passages,
            response=answer,
        )


# --------------------------------------------------------------------------- input


def _first_words(text: str | None, n: int = 9) -> str:
    words = (text or "").split()
    return " ".join(words[:n]) + (" …" if len(words) > n else "")


def pick_example(state: AppState) -> Draft | None:
    """The dataset example selectbox and the example's question, passages and labels."""
    link = follow_home_dataset()
    ref = state.dataset
    publish(
        P_DATASET,
        dataset_spec(ref),
        missing=link.missing,
        what="dataset",
        where=HOME_DATASETS_HERE,
        instead=f"the dataset picked on Home, {md(ref.label)}",
    )
    try:
        examples = load_examples(ref)
    except RagscopeError as e:
        st.error(md(e))
        return None
    if not examples:
        st.warning(f"{md(ref.label)} holds no examples; pick another dataset on Home.")
        return None
    by_id = {e.id: e for e in examples}
    remembered = state.example_id.get(ref.key)
    if st.session_state.get(KEY_EXAMPLE) not in by_id:
        st.session_state.pop(KEY_EXAMPLE, None)

    def label(ex_id: str) -> str:
        ex = by_id[ex_id]
        gold = {True: " · hallucinated", False: " · faithful", None: ""}[ex.label]
        return f"{ex_id} — {_first_words(ex.question or ex.response)}{gold}"

    ex_id = bind(
        P_EXAMPLE,
        KEY_EXAMPLE,
        lambda: st.selectbox(
            f"Example from {md(ref.label)}", list(by_id), key=KEY_EXAMPLE, format_func=label
        ),
        parse=one_of(by_id),
        seed=remembered if remembered in by_id else examples[0].id,
        what="example",
        where=f"in {md(ref.label)}",
    )
    state.example_id[ref.key] = ex_id
    ex = by_id[ex_id]
    show_example(ex)
    return Draft(
        key=f"{ref.key}/{ex.id}",
        task=ex.task,
        question=ex.question,
        passages=ex.passages,
        prompt=ex.prompt,
        example=ex,
    )


def show_example(ex: RAGExample) -> None:
    """The example's question, passages and gold labels, compactly."""
    meta = [f"task **{ex.task}**"]
    if ex.label is not None:
        meta.append("gold: **hallucinated**" if ex.label else "gold: **faithful**")
    if ex.spans:
        meta.append(f"{len(ex.spans)} gold span{'s' if len(ex.spans) > 1 else ''}")
    if ex.provenance.generator:
        meta.append(f"answer by {md(ex.provenance.generator)}")
    st.caption(" · ".join(meta))
    if ex.question:
        st.markdown(f"**Question:** {md(ex.question)}")
    with st.expander(f"Passages ({len(ex.passages)})", expanded=len(ex.passages) <= 2):
        for k, p in enumerate(ex.passages):
            st.markdown(f"**Passage {k + 1}**")
            st.text(p)
    if ex.spans:
        with st.expander("Gold hallucination spans"):
            for s in ex.spans:
                kind = f" ({md(s.type)})" if s.type else ""
                note = f" — {md(s.note)}" if s.note else ""
                st.markdown(f"- “{md(ex.response[s.start : s.end])}”{kind}{note}")


def fill_own_input(state: AppState, x: OwnInput) -> None:
    """Put a link's own input into the Playground's widgets: task, question, passages
    and the pasted answer (the passages written before are replaced)."""
    state.input_mode = st.session_state[KEY_INPUT_MODE] = INPUT_OWN
    state.own_task = st.session_state[KEY_OWN_TASK] = x.task
    state.own_question = st.session_state[KEY_OWN_QUESTION] = x.question
    for pid in state.own_passages:
        st.session_state.pop(passage_key(pid), None)
    first = state.next_passage_id
    state.own_passages = {first + k: p for k, p in enumerate(x.passages)}
    state.next_passage_id = first + len(x.passages)
    for pid, text in state.own_passages.items():
        st.session_state[passage_key(pid)] = text
    state.answer_source = st.session_state[KEY_ANSWER_SOURCE] = ANSWER_PASTE
    state.pasted = st.session_state[KEY_PASTED] = x.answer
    state.prefilled_for = "own"


def publish_own_input(state: AppState, signature: str | None, missing: str | None) -> None:
    """The analysed own input into the URL (``input``), so a copied link reopens the same
    analysis; dropped when the view shows no analysis of the current own input."""
    a = state.analysis
    shown = None
    too_long = False
    if (
        state.input_mode == INPUT_OWN
        and a is not None
        and a.example.id == OWN_ID
        and a.signature == signature
    ):
        ex = a.example
        shown = input_id(
            OwnInput(
                task=ex.task, question=ex.question or "", passages=ex.passages, answer=ex.response
            )
        )
        too_long = shown is None
    problem = input_problem(missing) if missing is not None else None
    publish(
        P_INPUT,
        shown,
        missing=missing,
        what="Playground input",
        where=f"readable ({problem}; links to an input are made by this page)"
        if problem
        else "readable (links to an input are made by this page)",
        instead="the input below" if state.input_mode == INPUT_OWN else "a dataset example",
    )
    if too_long:
        st.caption("This input is too long to travel in a link; the page's URL does not reopen it.")


def own_input(state: AppState) -> Draft:
    """The user's own task, question and passages (add/remove passages)."""
    seed_widget(KEY_OWN_TASK, state.own_task)
    seed_widget(KEY_OWN_QUESTION, state.own_question)
    c1, c2 = st.columns([1, 4])
    with c1:
        state.own_task = st.selectbox("Task", TASKS, key=KEY_OWN_TASK)
    with c2:
        state.own_question = st.text_input(
            "Question", key=KEY_OWN_QUESTION, placeholder="What do you want to ask?"
        )
    only_one = len(state.own_passages) == 1
    for k, pid in enumerate(list(state.own_passages)):
        seed_widget(passage_key(pid), state.own_passages[pid])
        c_text, c_remove = st.columns([20, 1], vertical_alignment="center")
        with c_text:
            state.own_passages[pid] = st.text_area(
                f"Passage {k + 1}",
                key=passage_key(pid),
                height=100,
                placeholder="A retrieved passage the answer should rely on",
            )
        with c_remove:
            st.button(
                "",
                icon=":material/delete:",
                key=remove_passage_key(pid),
                help="Remove this passage",
                disabled=only_one,
                on_click=state.remove_passage,
                args=(pid,),
            )
    st.button(
        "Add a passage", icon=":material/add:", key=KEY_ADD_PASSAGE, on_click=state.add_passage
    )
    question = state.own_question.strip() or None
    passages = tuple(p for p in state.own_passages.values() if p.strip())
    return Draft(key="own", task=state.own_task, question=question, passages=passages)


# --------------------------------------------------------------------------- answer


def generate_answer(state: AppState, model: LoadedModel, draft: Draft) -> GeneratedAnswer | None:
    """Controls to let the model write the answer (streamed); the current answer if any."""
    c1, c2, c3 = st.columns([1, 1, 1], vertical_alignment="bottom")
    seed_widget(KEY_MAX_TOKENS, state.max_tokens)
    seed_widget(KEY_TEMPERATURE, state.temperature)
    with c1:
        state.max_tokens = int(
            st.number_input("Max new tokens", 1, 1024, step=16, key=KEY_MAX_TOKENS)
        )
    with c2:
        state.temperature = float(
            st.slider(
                "Temperature",
                0.0,
                1.5,
                step=0.05,
                key=KEY_TEMPERATURE,
                help="0 = greedy (the model's most likely token each step)",
            )
        )
    with c3:
        clicked = st.button("Write the answer", key=KEY_GENERATE, icon=":material/edit_note:")
    if clicked:
        try:
            stream = AnswerStream(
                model,
                task=draft.task,
                question=draft.question,
                passages=draft.passages,
                prompt=draft.prompt,
                config=GenerationConfig(
                    max_new_tokens=state.max_tokens, temperature=state.temperature
                ),
            )
            with st.container(border=True):
                st.write_stream(stream)
            gen = stream.result()
        except (RagscopeError, ValueError) as e:
            st.error(md(e))
            return None
        state.generation = GeneratedAnswer(
            for_input=draft.signature,
            text=gen.text,
            token_ids=gen.token_ids,
            stop=gen.stop,
            seconds=gen.seconds,
        )
        state.analysis = None
        g = state.generation
        st.caption(_generation_note(g))
        return g
    g = state.generation
    if g is None or g.for_input != draft.signature:
        st.info("Press **Write the answer** to let the model answer this question.")
        return None
    with st.container(border=True):
        st.markdown(md_lines(g.text) if g.text.strip() else "*(empty answer)*")
    st.caption(_generation_note(g))
    return g


def _generation_note(g: GeneratedAnswer) -> str:
    why = "end of answer" if g.stop == "eos" else "max tokens reached"
    return f"{len(g.token_ids)} tokens in {g.seconds:.1f} s ({why})."


def paste_answer(state: AppState, draft: Draft) -> str:
    """The paste box, prefilled with the dataset example's own response."""
    if state.prefilled_for != draft.key:
        if draft.example is not None:
            state.pasted = draft.example.response
            st.session_state[KEY_PASTED] = state.pasted
        state.prefilled_for = draft.key
    seed_widget(KEY_PASTED, state.pasted)
    state.pasted = st.text_area(
        "Answer to analyse",
        key=KEY_PASTED,
        height=120,
        placeholder="Paste the answer any model (or person) gave",
    )
    if draft.example is not None and state.pasted != draft.example.response:
        st.caption("Edited answer: the dataset's gold spans no longer apply and are not shown.")
    return state.pasted


# --------------------------------------------------------------------------- results


@dataclass(frozen=True, kw_only=True, eq=False)
class DetectorPanel:
    """The shipped detectors' side of one analysis, worked out before anything is drawn.

    Attributes:
        model_spec: The loaded model's spec (``embedded``, ``tiny``, ...), for commands.
        model_name: The loaded model's display name.
        shipped: The detectors found for the model, and the artifacts that failed to load.
        result: Their verdicts on the analysed answer (``None`` when they could not run).
        error: Why they could not run on this answer.
    """

    model_spec: str
    model_name: str
    shipped: ShippedDetectors
    result: DetectorVerdicts | None = None
    error: str | None = None

    @property
    def token_verdicts(self) -> dict[str, Verdict]:
        """Detector name -> verdict, for the detectors that give token scores."""
        return self.result.with_token_scores() if self.result is not None else {}


def run_detectors(model: LoadedModel, a: Analysis) -> DetectorPanel:
    """Load the shipped detectors for ``model`` and run them all on ``a`` (both cached):
    the set's, or its expert's for the answer's dataset."""
    shipped = shipped_detectors(model)
    result: DetectorVerdicts | None = None
    error: str | None = None
    try:
        result = detector_verdicts(model, a, shipped)
    except RagscopeError as e:
        error = str(e)
    return DetectorPanel(
        model_spec=model.info.name,
        model_name=model.info.display_name,
        shipped=shipped,
        result=result,
        error=error,
    )


def _shown_folder(folder: Path) -> str:
    """``folder`` relative to the checkout when inside it (as commands there name it)."""

    try:
        return str(folder.resolve().relative_to(repo_root()))
    except ValueError:
        return str(folder)


def train_command(panel: DetectorPanel, detector: str | None = None) -> str:
    """The ``ragscope train`` command that makes the missing artifacts for this model."""
    recipe = TrainRecipe(
        model=panel.model_spec,
        dataset=BUILTIN,
        detectors=(detector,) if detector else DEFAULT_DETECTORS,
    )
    return recipe.command(out=_shown_folder(panel.shipped.folder))


def _calibration_label(choice: str, own: str | None) -> str:
    if choice == CALIBRATE_AUTO:
        return f"its own dataset ({own})" if own else "automatic (all training data)"
    if choice == CALIBRATE_POOLED:
        return "all training data"
    return choice


def pick_calibration(
    state: AppState, result: DetectorVerdicts, own: str | None
) -> DetectorVerdicts:
    """The "Judge the answer as one from" control, shown when the detectors keep
    per-dataset calibrations; the verdicts under the chosen calibration (recomputed from
    the kept raw scores, no pass). ``own``: the training dataset whose calibration judged
    the answer automatically, if any."""
    datasets = result.judge_as_options()
    options = [CALIBRATE_AUTO, CALIBRATE_POOLED, *datasets]
    where = "a training dataset the detectors keep a calibration or an expert for" + (
        f" ({', '.join(md(d) for d in datasets)})" if datasets else ""
    )
    if not datasets:
        link = follow_widget(P_CALIBRATE, KEY_CALIBRATE_AS, one_of(options))
        publish(P_CALIBRATE, None, missing=link.missing, what="calibration", where=where)
        return result
    if st.session_state.get(KEY_CALIBRATE_AS) not in options:
        st.session_state.pop(KEY_CALIBRATE_AS, None)
    state.calibrate_as = bind(
        P_CALIBRATE,
        KEY_CALIBRATE_AS,
        lambda: st.selectbox(
            "Judge the answer as one from",
            options,
            key=KEY_CALIBRATE_AS,
            format_func=lambda c: _calibration_label(c, own),
            help="Base rates differ between datasets (half the built-in answers are "
            "hallucinated, a fifth of RAGTruth's), so the same raw score means a different "
            "probability, and crosses a different threshold, on each. Automatic: the "
            "answer's own dataset when the detectors were trained on it (or on another "
            "split of it), else all their training data. Pick a dataset to judge an answer "
            "of your own as if it were one of that dataset's.",
        ),
        parse=one_of(options),
        seed=state.calibrate_as if state.calibrate_as in options else CALIBRATE_AUTO,
        default=CALIBRATE_AUTO,
        what="calibration",
        where=where,
        instead=lambda c: md(_calibration_label(c, own)),
    )
    if state.calibrate_as == CALIBRATE_AUTO:
        return result
    return result.calibrated_as(
        None if state.calibrate_as == CALIBRATE_POOLED else state.calibrate_as
    )


def show_detector_verdicts(panel: DetectorPanel, state: AppState) -> None:
    """The verdict table of the shipped detectors, or why there is none."""
    st.subheader("Detector verdicts")
    shipped = panel.shipped
    for b in shipped.broken:
        st.error(
            f"The **{md(b.name)}** detector artifact in {code(b.folder)} could not be loaded: "
            f"{md(b.reason)}  \nFix: retrain it with {code(train_command(panel, b.name))}, or "
            "remove the folder."
        )
    if not shipped.detectors:
        if not shipped.broken:
            st.info(_no_detectors_message(panel))
        return
    if panel.result is None:
        publish(P_CALIBRATE, None)
        st.error(f"The detectors could not judge this answer: {md(panel.error)}")
        return
    own = next((v.calibrated_for for v in panel.result.verdicts if v.calibrated_for), None)
    answer = panel.result.answer
    if answer is not None and answer.deferred_from and panel.result.example is not None:
        own = f"{panel.result.example.provenance.dataset}, by the {answer.set_name} set"
    line = st.empty()  # the verdict opens the section, above the calibration choice
    result = pick_calibration(state, panel.result, own)
    answer = result.answer
    if answer is not None:
        colour = "red" if answer.hallucinated else "green"
        line.markdown(f"#### :{colour}-background[{md(answer.summary)}]")
    verdict_table(st.container(), result.to_frame())
    if answer is not None and panel.result.example is not None:
        set_spans_section(answer, panel.result.example.response)
    st.caption(training_caption(result.judged_by or shipped))
    st.caption(
        "Each detector reads this answer and gives a score from 0 to 1. Where *calibrated* "
        "is ticked, the score is a probability calibrated on held-out answers of the data "
        "it was trained on (of answers scored 0.8, about 80% were hallucinated); otherwise "
        "it only ranks answers. A detector trained on several datasets, whose base rates "
        "differ, judges an answer from one of them by that dataset's own calibration and "
        "threshold (*calibrated for*), and any other answer by those of all its training "
        "data. It is *flagged* when the score reaches the threshold of the same "
        "calibration, chosen on held-out answers when it was trained. The overall verdict "
        "is the ensemble's (it stacks the others), or, in a set without one, whether half "
        "the detectors flag the answer. AUROC is how well "
        "the scores separated hallucinated from faithful answers it never learned from "
        "(0.5 = chance, 1 = perfect): pooled over the folds of a cross-validation, or on a "
        "held-out test split (the AUROC from column says which). "
        + (f"All {n} detectors read" if (n := len(panel.result.verdicts)) > 1 else "It reads")
        + f" one shared trace of the answer ({panel.result.seconds:.1f} s)."
    )


def training_caption(shipped: ShippedDetectors) -> str:
    """What the set's detectors were trained on, said once: ``Detector set **default**:
    trained on builtin + ragtruth_qa_dev (2,614 answers), 5-fold CV.``; a training only
    some detectors had names them."""
    parts = []
    for label in shipped.trained_on:
        cards = [d for d in shipped.detectors if d.trained_on == label]
        n = max((d.n_train or 0 for d in cards), default=0)
        names = (
            ""
            if len(cards) == len(shipped.detectors)
            else (" (" + ", ".join(d.name for d in cards) + ")")
        )
        parts.append(f"{md(label)}{f' ({n:,} answers)' if n else ''}{names}")
    trained = "; ".join(parts) if parts else "unrecorded data"
    checked = ", ".join(dict.fromkeys(d.auroc_from for d in shipped.detectors if d.auroc_from))
    own = [(d.name, d.own_stackers) for d in shipped.detectors if d.own_stackers]
    stackers = "".join(
        f" Its {md(name)} reads answers of {', '.join(md(s) for s in sets)} with a stacker "
        "of that dataset's own, fitted on its answers alone."
        for name, sets in own
    )
    head = f"Detector set **{md(shipped.name)}**"
    if shipped.deferred_from:
        head = (
            f"Judged by the **{md(shipped.name)}** set, the {md(shipped.deferred_from)} set's "
            "expert for answers of its training data"
        )
    return (
        f"{head}: trained on {trained}"
        + (f", AUROC from {checked}." if checked else ".")
        + stackers
    )


def _verdict_colour(value: object) -> str:
    return f"color: {'#b3261e' if value == 'flagged' else '#1e7d32'}; font-weight: 600"


def _number(value: object) -> str:
    try:
        x = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):  # None, pd.NA: a fact the artifact does not record
        return ""
    return "" if math.isnan(x) else f"{x:.3f}"


def verdict_table(where: DeltaGenerator, frame: pd.DataFrame) -> None:
    """The verdict table (whole, or growing while the detectors run) into ``where``: a
    static table, so every row and column is in view (no inner scroll; long cells wrap),
    the verdicts coloured."""
    styled = (
        frame.style.map(_verdict_colour, subset=["verdict"])
        .format(_number, subset=["score", "threshold", "AUROC"])
        .format(lambda b: "✓" if b else "", subset=["calibrated"])
    )
    where.table(styled, hide_index=True)


def analyse_streamed(
    model: LoadedModel,
    example: RAGExample,
    *,
    response_ids: tuple[int, ...] | None,
    answer_source: str,
) -> Analysis:
    """Analyse the answer and run every shipped detector on it, showing each verdict
    as soon as its detector is done.

    The surprisal rides in the detectors' shared pass (one forward pass with the
    passages for everything, plus one without them when a detector asks), unless the
    answer's own tokens differ from its re-tokenized text (a generated answer can):
    then the surprisal gets its own pass over the exact tokens. Known results are
    not recomputed.

    Raises:
        DataError: The answer cannot be laid out.
        ModelError: The forward pass failed.
    """
    shipped = shipped_detectors(model)
    have = known_analysis(model, example, response_ids=response_ids, answer_source=answer_source)
    sig = input_signature(example, response_ids)
    if not shipped.detectors or known_verdicts(model, example, sig, shipped) is not None:
        if have is not None:
            return have
        with st.spinner("Tracing the answer…"):
            return analyse(model, example, response_ids=response_ids, answer_source=answer_source)
    ride = have is None and (
        response_ids is None or tuple(render(example, model).response_ids) == response_ids
    )
    merged: list[Analysis] = []
    judged: list[tuple[ShippedDetector, Verdict]] = []
    total = len(shipped.for_example(example).detectors)
    passes = {"trace": "the answer with the passages", "bare": "the answer without them"}

    def on_trace(tr: Trace) -> None:
        if ride:
            merged.append(
                remember_traced(
                    model, example, tr, response_ids=response_ids, answer_source=answer_source
                )
            )

    with st.status(f"Analysing the answer with {total} detectors…", expanded=True) as status:
        bar = st.progress(0.0, text="Tracing the answer…")
        table = st.empty()

        def on_step(step: Judged, det: ShippedDetector | None) -> None:
            if det is None:
                st.write(f"Traced {passes[step.step.stage]} ({step.seconds:.2f} s)")
            else:
                assert step.verdict is not None
                judged.append((det, step.verdict))
                dets, verdicts = zip(*judged, strict=True)
                verdict_table(table, verdict_frame(list(dets), list(verdicts)))
            bar.progress(len(judged) / total, text=f"{len(judged)} of {total} detectors done")

        try:
            result = stream_verdicts(
                model,
                example,
                sig,
                shipped,
                on_step=on_step,
                extra=response_needs() if ride else None,
                on_trace=on_trace,
                retry=True,  # Analyse was pressed: a failure kept from before is tried again
            )
        except RagscopeError:  # the verdicts' panel below says why
            status.update(label="The detectors could not judge this answer", state="error")
        else:
            table.empty()  # the whole table follows below, in the detectors' order
            status.update(
                label=f"{total} detectors judged the answer in {result.seconds:.1f} s",
                state="complete",
                expanded=False,
            )
    if merged:
        return merged[0]
    if have is not None:
        return have
    with st.spinner("Tracing the answer…"):
        return analyse(model, example, response_ids=response_ids, answer_source=answer_source)


def _no_detectors_message(panel: DetectorPanel) -> str:
    shipped = panel.shipped
    where = code(_shown_folder(shipped.folder))
    others = ""
    if shipped.other_models:
        names = ", ".join(code(m.split("|", 1)[0]) for m in shipped.other_models)
        others = (
            f" (the detectors there were trained for {names}, and a detector only reads "
            "the model it was trained on)"
        )
    return (
        f"No trained detectors for {md(panel.model_name)} in {where}{others}. Make them with "
        f"{code(train_command(panel))} and reload this page."
    )


def _colour_label(choice: str) -> str:
    return "surprisal (bits)" if choice == COLOR_SURPRISAL else f"{choice} token score"


def pick_colouring(state: AppState, panel: DetectorPanel) -> Verdict | None:
    """The "Colour tokens by" control; the chosen detector's verdict (``None``: surprisal).

    Shown only when some shipped detector gives token scores.
    """
    by_name = panel.token_verdicts
    options = [COLOR_SURPRISAL, *by_name]
    where = (
        f"a detector shipped for {md(panel.model_name)} that scores tokens "
        f"({', '.join(md(n) for n in by_name) or 'none does'})"
    )
    if not by_name:
        link = follow_widget(P_DETECTOR, KEY_COLOR_BY, one_of(options))
        publish(P_DETECTOR, None, missing=link.missing, what="detector", where=where)
        return None
    if st.session_state.get(KEY_COLOR_BY) not in options:
        st.session_state.pop(KEY_COLOR_BY, None)
    state.color_by = bind(
        P_DETECTOR,
        KEY_COLOR_BY,
        lambda: st.radio(
            "Colour tokens by",
            options,
            key=KEY_COLOR_BY,
            horizontal=True,
            format_func=_colour_label,
            help="The model's own surprisal, or a trained detector's score for each token",
        ),
        parse=one_of(options),
        seed=state.color_by if state.color_by in options else COLOR_SURPRISAL,
        default=COLOR_SURPRISAL,
        what="detector",
        where=where,
        instead=lambda c: md(_colour_label(c)),
    )
    return by_name.get(state.color_by)


def detector_token_scores(a: Analysis, verdict: Verdict) -> np.ndarray:
    """``verdict``'s token scores on the analysed answer's tokens, shape ``[resp]``."""
    assert verdict.token_scores is not None and verdict.token_offsets is not None
    return align_token_scores(
        verdict.token_scores, verdict.token_offsets, a.layout.response_offsets
    )


def show_analysis(
    a: Analysis, current_signature: str | None, panel: DetectorPanel, state: AppState
) -> None:
    """Metrics, token heatmap, detector verdicts, segment strip and token table."""
    st.subheader("The answer, token by token")
    if current_signature != a.signature:
        st.info("The input changed since this analysis; press **Analyse** to update it.")
    s = a.surprisal
    tokens = a.layout.response_token_strings()
    worst = int(np.argmax(s))
    c1, c2, c3, c4 = st.columns(4)
    c1.metric("Mean surprisal", f"{float(s.mean()):.2f} bits")
    c2.metric(
        "Max surprisal", f"{float(s.max()):.2f} bits", help=f"token {md(repr(tokens[worst]))}"
    )
    c3.metric("Answer tokens", len(tokens), help=f"{len(a.layout)} tokens with the prompt")
    c4.metric("Trace", f"{a.trace_seconds * 1000:.0f} ms", help="one forward pass, CPU/GPU time")
    colour = pick_colouring(state, panel)
    source = {
        "generated": "written by the model",
        "pasted": "pasted",
        "dataset": "from the dataset",
    }
    scale = None
    if colour is not None:
        fixed = st.toggle(
            "Fixed 0–1 scale",
            key=KEY_FIXED_SCALE,
            help="Token scores are probabilities. By default an answer whose scores are all "
            f"below {ADAPT_BELOW} is coloured from 0 to its own highest score",
        )
        values = detector_token_scores(a, colour)
        judged = panel.result.judged_by if panel.result is not None else None
        det = (judged or panel.shipped).card(colour.detector).detector
        scale = detector_scale(values, flag_threshold(det), fixed=fixed)
    meaning = (
        "Colour: surprisal, −log₂ p(token | prompt, earlier answer tokens); darker = the model "
        "expected it less."
        if scale is None or colour is None
        else f"Colour: the {colour.detector} detector's score for each token; darker = more "
        f"likely part of a hallucination by its reckoning. {scale.note}"
    )
    st.caption(
        f"{md(a.model_name)} read the answer "
        f"({md(source.get(a.answer_source, a.answer_source))}). "
        f"{meaning} Hover a token for details."
        + (
            " Tokens underlined in blue lie inside a gold hallucination span."
            if a.labels is not None
            else ""
        )
    )
    render_token_heatmap(
        tokens,
        s if colour is None else detector_token_scores(a, colour),
        labels=a.labels,
        positions=a.layout.response_positions.tolist(),
        value_name=_colour_label(COLOR_SURPRISAL if colour is None else colour.detector),
        vmin=None if scale is None else scale.vmin,
        vmax=None if scale is None else scale.vmax,
    )

    show_detector_verdicts(panel, state)

    st.subheader("What the model read")
    rows = segment_rows(a.layout.segments)
    plot(segment_figure(a.layout.segments), key="playground.segments")
    st.caption(
        " · ".join(f"{md(r.label)}: {r.n_tokens}" for r in rows) + f" — {len(a.layout)} tokens"
    )
    with st.expander("Token table"):
        st.dataframe(a.token_frame(), hide_index=True, width="stretch", height=360)


# --------------------------------------------------------------------------- page


def warming_note(warming: Warming | None) -> None:
    """What is still loading in the background (:func:`app.state.verdicts.warm_detectors`):
    a first Analyse now waits for it."""
    if warming is None or not warming.running:
        return
    st.caption(
        f":material/hourglass_top: The detectors are still loading in the background "
        f"({warming.ready} of {warming.detectors} ready: imports, spaCy, the SAE, the "
        "sentence embedder); an Analyse now waits for them, later ones do not."
    )


def main() -> None:
    state = app_state()
    model = get_model()
    st.title("Playground")
    st.caption(
        "Pick an example (the dataset is chosen on Home) or write your own, give an answer, "
        "and see how the model reads it."
    )

    own_link = follow(P_INPUT, parse_input)
    if own_link.value is not None:  # a link to an input written here: reopen its analysis
        fill_own_input(state, own_link.value)
    elif linked(P_DATASET) or linked(P_EXAMPLE):  # a link to an example of a dataset
        state.input_mode = st.session_state[KEY_INPUT_MODE] = INPUT_DATASET
    seed_widget(KEY_INPUT_MODE, state.input_mode)
    state.input_mode = st.radio("Input", INPUT_MODES, key=KEY_INPUT_MODE, horizontal=True)
    if state.input_mode != INPUT_DATASET:  # the view shows no dataset's example
        publish(P_DATASET, None)
        publish(P_EXAMPLE, None)
    draft = pick_example(state) if state.input_mode == INPUT_DATASET else own_input(state)
    if draft is None:
        publish_own_input(state, None, own_link.missing)
        return

    st.divider()
    seed_widget(KEY_ANSWER_SOURCE, state.answer_source)
    state.answer_source = st.radio("Answer", ANSWER_SOURCES, key=KEY_ANSWER_SOURCE, horizontal=True)
    response_ids: tuple[int, ...] | None = None
    if state.answer_source == ANSWER_GENERATE:
        gen = generate_answer(state, model, draft)
        answer = gen.text if gen is not None else None
        response_ids = gen.token_ids if gen is not None else None
        answer_source = "generated"
    else:
        answer = paste_answer(state, draft)
        same = draft.example is not None and answer == draft.example.response
        answer_source = "dataset" if same else "pasted"

    # The current input's signature tells whether a shown analysis is stale.
    current: RAGExample | None = None
    if answer is not None:
        try:
            current = draft.with_answer(answer)
        except DataError:
            current = None
    signature = input_signature(current, response_ids) if current is not None else None

    clicked = st.button("Analyse", key=KEY_ANALYSE, type="primary", icon=":material/troubleshoot:")
    warming_note(warm_detectors(model, shipped_detectors(model)))
    if clicked or own_link.value is not None:
        try:
            if answer is None:
                raise DataError("there is no answer yet: let the model write one, or paste one")
            state.linked_answer = None  # pages show this analysis from now on
            analysed = analyse_streamed(
                model,
                draft.with_answer(answer),
                response_ids=response_ids,
                answer_source=answer_source,
            )
            own = answer_source == "dataset"  # the Home dataset's own answer, unchanged
            state.analysis = replace(analysed, dataset=dataset_spec(state.dataset) if own else None)
        except RagscopeError as e:
            state.analysis = None
            st.error(md(e))
    publish_own_input(state, signature, own_link.missing)
    if state.analysis is not None:
        st.divider()
        panel = run_detectors(model, state.analysis)
        show_analysis(state.analysis, signature, panel, state)


main()
