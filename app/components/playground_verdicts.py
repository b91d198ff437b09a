"""The Playground's detectors: the verdict table of the detectors shipped for the loaded
model (with its calibration choice and training caption), the analysis that shows each
verdict as soon as its detector is done, and the note while they still load."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import streamlit as st

from app.components.estimate import FEW_SECONDS, format_seconds
from app.components.set_spans import set_spans_section
from app.state.analysis import Analysis, analyse, input_signature, known_analysis, remember_traced
from app.state.detectors import ArtifactCard, DetectorSet, detector_set
from app.state.estimates import ANALYSE, answers_seconds, record_answers
from app.state.links import P_CALIBRATE, bind, follow_widget, one_of, publish
from app.state.playground import CALIBRATE_AUTO, CALIBRATE_POOLED, KEY_CALIBRATE_AS
from app.state.session import AppState
from app.state.verdicts import (
    DetectorVerdicts,
    Warming,
    detector_verdicts,
    known_verdicts,
    stream_verdicts,
    verdict_frame,
)
from app.text import code, md
from core.base.errors import RagscopeError
from core.base.examples import RAGExample
from core.base.paths import repo_root
from core.base.words import plural
from core.data import BUILTIN
from core.engine.layout import render
from core.engine.model import LoadedModel
from core.engine.trace import Trace, response_needs
from core.evaluation.recipe import DEFAULT_DETECTORS, TrainRecipe
from core.learning.contract import Verdict
from core.pipeline.extract import memory_note
from core.pipeline.judge import Judged

if TYPE_CHECKING:
    import pandas as pd
    from streamlit.delta_generator import DeltaGenerator


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
    shipped: DetectorSet
    result: DetectorVerdicts | None = None
    error: str | None = None

    @property
    def token_verdicts(self) -> dict[str, Verdict]:
        """Detector name -> verdict, for the detectors that give token scores."""
        return self.result.with_token_scores() if self.result is not None else {}


def run_detectors(model: LoadedModel, a: Analysis) -> DetectorPanel:
    """Load the shipped detectors for ``model`` and run them all on ``a`` (both cached):
    the set's, or its expert's for the answer's dataset."""
    shipped = detector_set(model)
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
    if answer is not None and answer.no_signal_note:
        st.caption(md(answer.no_signal_note))
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


def training_caption(shipped: DetectorSet) -> str:
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
    colour = {"flagged": "#b3261e", "not flagged": "#1e7d32"}.get(str(value), "#6b6b6b")
    return f"color: {colour}; font-weight: 600"


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
    shipped = detector_set(model)
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

    def on_trace(tr: Trace) -> None:
        if ride:
            merged.append(
                remember_traced(
                    model, example, tr, response_ids=response_ids, answer_source=answer_source
                )
            )

    _stream_shown(model, example, sig, shipped, ride=ride, on_trace=on_trace)
    if merged:
        return merged[0]
    if have is not None:
        return have
    with st.spinner("Tracing the answer…"):
        return analyse(model, example, response_ids=response_ids, answer_source=answer_source)


def _stream_shown(
    model: LoadedModel,
    example: RAGExample,
    sig: str,
    shipped: DetectorSet,
    *,
    ride: bool,
    on_trace: Callable[[Trace], None],
) -> None:
    """Run every shipped detector on ``example`` inside a status box: a line per traced
    pass, a progress bar, and the verdict table growing as each detector is done
    (``ride``: the surprisal rides in the shared pass, handed to ``on_trace``)."""
    judged: list[tuple[ArtifactCard, Verdict]] = []
    total = len(shipped.for_example(example).detectors)
    passes = {"trace": "the answer with the passages", "bare": "the answer without them"}

    detectors = plural(total, "detector")
    with st.status(f"Analysing the answer with {total} {detectors}…", expanded=True) as status:
        bar = st.progress(0.0, text="Tracing the answer…")
        table = st.empty()

        def on_step(step: Judged, det: ArtifactCard | None) -> None:
            if det is None:
                st.write(f"Traced {passes[step.step.stage]} ({step.seconds:.2f} s)")
            else:
                assert step.verdict is not None
                judged.append((det, step.verdict))
                dets, verdicts = zip(*judged, strict=True)
                verdict_table(table, verdict_frame(list(dets), list(verdicts)))
            bar.progress(len(judged) / total, text=f"{len(judged)} of {total} {detectors} done")

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
            record_answers(model, shipped, ANALYSE, [example], result.seconds)
            status.update(
                label=f"{total} {detectors} judged the answer in {result.seconds:.1f} s",
                state="complete",
                expanded=False,
            )


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


def analyse_estimate(model: LoadedModel, example: RAGExample | None) -> None:
    """How long Analyse will take on ``example``, paced on the last Analyse here
    (:func:`app.state.estimates.answers_seconds`), under the button."""
    shipped = detector_set(model)
    if example is None or not shipped.detectors:
        return
    memory = memory_note(model, example, shipped.for_example(example).fitted)
    if memory is not None:  # a long input's memory, before the click (issue 68)
        st.caption(memory)
    seconds = answers_seconds(model, shipped, ANALYSE, [example])
    if seconds is None:
        st.caption(
            "Estimated time: not known yet; the first Analyse on this server times it, and "
            "later ones are estimated from it."
        )
        return
    head = "a few seconds" if seconds < FEW_SECONDS else f"about {format_seconds(seconds)}"
    st.caption(
        f"Estimated time on this machine: **{head}** for the {len(shipped.detectors)} "
        "detectors (paced on the last Analyse here)."
    )


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
