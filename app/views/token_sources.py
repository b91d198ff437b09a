"""Token sources: where each answer token's probability comes from (SPAD).

One traced pass splits the probability the model gives each answer token exactly into
seven sources: attention to the query (Query), to the passages (RAG), to earlier answer
tokens (Past) and to the token's own position (Self), the FFNs, the final LayerNorm
(LN) and the initial embedding (Init). The page stacks them per token (tokens inside a
gold hallucination span marked), or averages them per part of speech (SPAD's features),
and shows the SHAP waterfall of the answer's spad verdict when a spad detector exists
(the shipped artifact, or this session's quick fit).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import streamlit as st

from app.components.answer_picker import (
    pick_answer_source,
    pick_example,
    playground_answer,
    publish_playground_answer,
)
from app.components.artifacts import quick_fit_row, show_broken_artifacts
from app.components.example_picker import dataset_labels, first_words, pick_page_dataset
from app.components.exports import plot
from app.components.shap_charts import pos_sources_figure, token_sources_figure, waterfall_figure
from app.components.train_job import train_detectors_panel
from app.state.detectors import DetectorSet, detector_set
from app.state.heads import (
    ALL_SPLITS,
    HEADS_EXAMPLE_DATASET,
    HEADS_EXAMPLE_PLAYGROUND,
    HEADS_FROM_HOME,
    heads_examples,
    stats_examples,
)
from app.state.links import P_BY_POS, P_INPUT, bind, flag, flag_id, publish
from app.state.model import get_model
from app.state.session import AppState, app_state
from app.state.spad_views import (
    KEY_TOKENS_BY_POS,
    KEY_TOKENS_DATASET,
    KEY_TOKENS_EXAMPLE,
    KEY_TOKENS_EXAMPLE_SOURCE,
    KEY_TOKENS_QUICK_FIT,
    QUICK_FIT_MIN,
    SPAD,
    AnswerSources,
    SpadChoice,
    answer_shap,
    answer_sources,
    quick_fit_examples,
    spad_choice,
    train_command,
)
from app.state.verdicts import answer_verdicts
from app.text import code, md
from core.analysis.shap_values import ShapResult
from core.base.errors import RagscopeError
from core.base.examples import RAGExample
from core.engine.model import LoadedModel
from core.learning.contract import Verdict
from core.signals.attribution import SOURCES

# Page scripts run with Streamlit's magic: a bare string would be drawn, so no
# attribute docstrings here.
WATERFALL_TOP = 10


def dataset_examples(state: AppState) -> tuple[str, str, list[RAGExample]] | None:
    """``(key, label, examples)`` of the page's dataset choice, or ``None`` (error shown)."""
    labels = dataset_labels(state.dataset)
    if state.tokens.dataset not in labels:
        state.tokens.dataset = HEADS_FROM_HOME
    try:
        return heads_examples(state.tokens.dataset, state.dataset)
    except RagscopeError as e:
        st.error(f"{md(labels[state.tokens.dataset])} cannot be read: {md(e)}")
        return None


# --------------------------------------------------------------------------- input


def pick_answer(
    state: AppState,
) -> tuple[RAGExample, tuple[int, ...] | None, list[RAGExample]] | None:
    """The answer to split: ``(example, response ids, the dataset's examples)``."""
    there = playground_answer(state) is not None
    options = ([HEADS_EXAMPLE_PLAYGROUND] if there else []) + [HEADS_EXAMPLE_DATASET]
    state.tokens.example_source = pick_answer_source(
        state.tokens.example_source,
        options,
        key=KEY_TOKENS_EXAMPLE_SOURCE,
        dataset_name="An example from a dataset",
    )
    if state.tokens.example_source == HEADS_EXAMPLE_PLAYGROUND and there:
        ex, ids = publish_playground_answer(state)
        picked = dataset_examples(state)
        return ex, ids, (picked[2] if picked is not None else [])
    publish(P_INPUT, None)

    c1, c2 = st.columns([2, 3], vertical_alignment="bottom")
    state.tokens.dataset = pick_page_dataset(
        state, KEY_TOKENS_DATASET, c1, seed=state.tokens.dataset
    )
    picked = dataset_examples(state)
    if picked is None:
        return None
    key, label, examples = picked
    if not examples:
        st.info("This dataset holds no examples; pick another one.")
        return None
    with c2:
        ex = pick_example(
            examples, state.tokens.example_id.get(key), key=KEY_TOKENS_EXAMPLE, dataset_label=label
        )
    state.tokens.example_id[key] = ex.id
    st.caption(f"Answer: \u201c{md(first_words(ex.response, 40))}\u201d")
    return ex, None, examples


# --------------------------------------------------------------------------- sources


def show_sources(state: AppState, answer: AnswerSources) -> None:
    """The stacked bars per token (or per POS tag), their caption and the table."""
    src = answer.sources
    labels = answer.labels
    n_gold = int(labels.sum()) if labels is not None else 0
    st.markdown(
        f"**{len(src)}** answer tokens · the seven sources add up to each token's "
        f"probability within {src.max_error:.1e} · mean P(token) {src.p_final.mean():.3f} · "
        f"traced in {answer.seconds:.1f} s"
    )
    state.tokens.by_pos = bind(
        P_BY_POS,
        KEY_TOKENS_BY_POS,
        lambda: st.toggle(
            "Aggregate by part of speech",
            key=KEY_TOKENS_BY_POS,
            help="The mean seven-vector of the tokens of each POS tag: SPAD's features",
        ),
        parse=flag,
        to_id=flag_id,
        seed=state.tokens.by_pos,
        default=flag_id(False),
        where="1 or 0",
    )
    if state.tokens.by_pos:
        fig = pos_sources_figure(src.values, answer.pos)
        plot(fig, key="tokens.figure.pos")
        st.caption(
            "Each bar is the mean split of the answer's tokens of one part of speech (their "
            "number in brackets); the diamond is their mean probability. These 7 numbers per "
            "tag are the spad features the classifier reads (absent tags count as zeros)."
        )
    else:
        fig = token_sources_figure(
            src.values,
            list(src.tokens),
            answer.pos,
            labels=labels.tolist() if labels is not None else None,
        )
        plot(fig, key="tokens.figure.bars")
        gold = (
            f" The {n_gold} tokens inside a gold hallucination span sit on a blue band with a "
            "▲ under them."
            if n_gold
            else (" No gold span in this answer." if labels is not None else "")
        )
        st.caption(
            "Each column is one answer token (hover for its POS tag and all seven numbers). "
            "Parts above 0 raise the token's probability, parts below lower it; they add up "
            "to the probability the model gave the token (the black diamond). RAG: attention "
            "to the passages; Query: to the prompt and question; Past: to earlier answer "
            "tokens; Self: to its own position; FFN, LN: the feed-forward layers and the final "
            f"norm; Init: the token embedding read directly.{gold}"
        )
    with st.expander("Table: every answer token"):
        df = src.to_frame(answer.pos)
        if labels is not None:
            df["gold"] = np.where(labels == 1, "hallucinated", "faithful")
        st.dataframe(
            df,
            hide_index=True,
            width="stretch",
            height=320,
            column_config={
                c: st.column_config.NumberColumn(c, format="%.4f") for c in [*SOURCES, "P_final"]
            },
        )


# --------------------------------------------------------------------------- SHAP


def quick_fit_offer(
    state: AppState, model: LoadedModel, shipped: DetectorSet, examples: list[RAGExample]
) -> None:
    """The train command, and a button for a quick fit on a few labelled examples."""
    st.info(
        f"No trained spad detector for {md(model.info.display_name)}, so no verdict to "
        f"explain. Make one with {code(train_command(SPAD, shipped.folder))} and reload this "
        "page."
    )
    pool = stats_examples(examples, ALL_SPLITS, QUICK_FIT_MIN)
    split, train = quick_fit_examples(examples, pool, QUICK_FIT_MIN)
    dataset = dataset_labels(state.dataset)[state.tokens.dataset]
    where = "the train split of " if split == "train" else ""
    quick_fit_row(
        state,
        model,
        train,
        split=split,
        dataset_label=dataset,
        note=f"Or make a **quick fit** on {len(train)} labelled answers of {where}{md(dataset)} "
        "(seconds; too few examples to trust its verdicts, enough to show the waterfall).",
        key=KEY_TOKENS_QUICK_FIT,
    )


def show_waterfall(
    state: AppState,
    model: LoadedModel,
    answer: AnswerSources,
    examples: list[RAGExample],
    response_ids: tuple[int, ...] | None,
) -> None:
    """The SHAP waterfall of the answer's spad verdict (shipped detector or quick fit);
    the shipped detector's probability, threshold and flag are the set's verdict on the
    answer (:func:`app.state.verdicts.answer_verdicts`, as the Playground shows them)."""
    st.subheader("Why spad scores this answer as it does")
    shipped = detector_set(model).for_example(answer.example)  # its expert, if any
    show_broken_artifacts(shipped, (SPAD,))
    choice = spad_choice(model, shipped, state.spad_quick)
    if choice is None:
        quick_fit_offer(state, model, shipped, examples)
        choice = spad_choice(model, shipped, state.spad_quick)
        if choice is None:
            return
    verdict = None
    try:
        result = answer_shap(answer, choice)
        if choice.fit is None:
            with st.spinner("Reading the detector set's verdict on the answer…"):
                judged = answer_verdicts(model, answer.example, shipped, response_ids=response_ids)
            verdict = judged.verdict(SPAD)
    except RagscopeError as e:
        st.error(f"The SHAP values could not be computed: {md(e)}")
        return
    draw_waterfall(choice, result, answer, verdict)


def verdict_sentence(choice: SpadChoice, raw: float, verdict: Verdict | None, gold: str) -> str:
    """What the spad detector says of the answer. The shipped detector's probability,
    threshold and flag are the set's verdict (``verdict``); the waterfall's score (the
    sigmoid of its margin) is the raw score before calibration, labelled raw and never
    compared with the calibrated threshold. A quick fit keeps no calibration: its raw
    score is what its threshold was chosen on."""
    if verdict is not None:
        flagged = "flagged as hallucinated" if verdict.hallucinated else verdict.call
        threshold = verdict.threshold if verdict.threshold is not None else float("nan")
        cal = f"{verdict.calibrated_for}'s" if verdict.calibrated_for else "the same"
        head = (
            f"The shipped spad detector gives this answer a probability of "
            f"**{verdict.score:.3f}** (threshold {threshold:.3f} from {cal} calibration: "
            f"{flagged}; gold: {gold}), as the Playground shows."
        )
        if verdict.raw_score is None:
            return head + " The waterfall explains this score."
        return (
            f"{head} The waterfall explains its raw score {raw:.3f} (before calibration; "
            "not compared with the threshold)."
        )
    which = "The quick fit" if choice.fit is not None else "The spad detector"
    threshold = float(getattr(choice.detector, "threshold_", 0.5))
    if getattr(choice.detector, "calibration_", None) is not None:
        return f"{which} gives this answer a raw score of **{raw:.3f}** (gold: {gold})."
    flagged = "flagged as hallucinated" if raw >= threshold else "not flagged"
    return (
        f"{which} gives this answer a score of **{raw:.3f}** (uncalibrated; threshold "
        f"{threshold:.3f}: {flagged}; gold: {gold})."
    )


def draw_waterfall(
    choice: SpadChoice, result: ShapResult, answer: AnswerSources, verdict: Verdict | None
) -> None:
    gold = {True: "hallucinated", False: "faithful", None: "unlabelled"}[answer.example.label]
    if choice.fit is not None:
        q = choice.fit
        inside = (
            " This answer was one of its training examples." if answer.example.id in q.ids else ""
        )
        st.warning(
            f"**Quick fit** (not a trained detector): fitted in this session on {len(q.ids)} "
            f"answers of {md(q.dataset_label)}.{inside}",
            icon=":material/bolt:",
        )
    st.markdown(verdict_sentence(choice, float(result.scores[0]), verdict, gold))
    plot(waterfall_figure(result, 0, top=WATERFALL_TOP), key="tokens.figure.waterfall")
    st.caption(
        f"From the base value (the average margin over its training data) each bar adds one "
        f"feature's exact SHAP value, the {WATERFALL_TOP} largest first, then the other "
        "features together; red pushes towards hallucinated, blue towards faithful. The last "
        "bar is the answer's margin in log-odds; the raw score is its sigmoid. Feature values are "
        "the answer's mean source share for that part of speech (see the POS aggregation above)."
    )
    with st.expander("Table: this answer's contributions"):
        frame = pd.DataFrame(
            {
                "feature": list(result.names),
                "value": result.data[0],
                "SHAP": result.values[0],
            }
        )
        frame = frame.reindex(frame["SHAP"].abs().sort_values(ascending=False).index)
        st.dataframe(
            frame,
            hide_index=True,
            width="stretch",
            height=320,
            column_config={
                "value": st.column_config.NumberColumn("value", format="%.4f"),
                "SHAP": st.column_config.NumberColumn("SHAP", format="%+.4f"),
            },
        )


# --------------------------------------------------------------------------- page


def main() -> None:
    state = app_state()
    model = get_model()
    st.title("Token sources")
    st.caption(
        "Where does the probability of each answer token come from? SPAD splits it exactly "
        "into seven sources, read from one forward pass: attention to the query, the "
        "passages (RAG), earlier answer tokens (Past) and the token itself (Self), the FFNs, "
        "the final LayerNorm (LN) and the initial embedding (Init)."
    )
    train_detectors_panel(model)
    picked = pick_answer(state)
    if picked is None:
        return
    example, response_ids, examples = picked
    try:
        with st.spinner("Tracing the answer and splitting every token's probability…"):
            answer = answer_sources(model, example, response_ids=response_ids)
    except RagscopeError as e:
        st.error(
            f"This answer could not be analysed: {md(e)}  \nFix: pick another example, or "
            "correct it in the Playground."
        )
        return
    show_sources(state, answer)
    st.divider()
    show_waterfall(state, model, answer, examples, response_ids)


main()
