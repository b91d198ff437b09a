"""SHAP summary: which of SPAD's 126 POS x source features drive its verdicts.

SPAD splits each answer token's probability into seven sources (Query, RAG, Past,
Self, FFN, LN, Init) and averages them per part of speech: 126 features such as
``RAG_NOUN`` or ``LN_NUM``, read by an XGBoost classifier. This page explains that
classifier on a few examples of the chosen dataset and split with exact TreeSHAP
values: a beeswarm (one point per answer and feature), the mean ``|SHAP|`` per
feature, and the 7 x 18 grid of mean SHAP by source and part of speech.

The classifier is the shipped ``spad`` artifact for the loaded model; without one,
a quick fit on a few labelled training examples stands in (clearly labelled), so
the page still shows how to read it. Each example costs one traced pass the first
time; its features then come from the shared feature cache.
"""

from __future__ import annotations

import streamlit as st

from app.components.artifacts import quick_fit_row, show_broken_artifacts
from app.components.example_picker import (
    ExampleKeys,
    PickedExamples,
    compute_row,
    pick_examples,
    show_request_failures,
    split_label,
)
from app.components.exports import plot
from app.components.shap_charts import bar_figure, grid_figure, summary_figure
from app.components.train_job import train_detectors_panel
from app.state.detectors import DetectorSet, detector_set
from app.state.heads import FeatureRequest, heads_examples
from app.state.links import P_GRID, P_TOP, bind, integer, one_of
from app.state.model import get_model
from app.state.session import AppState, app_state
from app.state.spad_views import (
    KEY_SHAP_COMPUTE,
    KEY_SHAP_GRID,
    KEY_SHAP_LIMIT,
    KEY_SHAP_QUICK_FIT,
    KEY_SHAP_SOURCE,
    KEY_SHAP_SPLIT,
    KEY_SHAP_TOP,
    SPAD,
    SpadChoice,
    quick_fit_examples,
    shap_summary,
    spad_choice,
    train_command,
)
from app.text import code, md
from core.analysis.shap_values import GridKind, ShapResult
from core.base.errors import RagscopeError
from core.base.examples import RAGExample
from core.base.words import plural
from core.engine.model import LoadedModel
from core.learning.metrics import evidence_warning

# Page scripts run with Streamlit's magic: a bare string would be drawn, so no
# attribute docstrings here.
MAX_EXAMPLES = 400  # each example costs a traced pass the first time
GRID_LABELS = {"mean": "mean SHAP (signed)", "mean_abs": "mean |SHAP|"}
EXAMPLE_KEYS = ExampleKeys(source=KEY_SHAP_SOURCE, split=KEY_SHAP_SPLIT, limit=KEY_SHAP_LIMIT)


# --------------------------------------------------------------------------- examples


def controls(state: AppState) -> PickedExamples | None:
    """Examples source, split and number (:func:`pick_examples`).

    Returns:
        The picked examples, or ``None`` when the dataset cannot be read (the error is
        shown).
    """
    return pick_examples(
        state.shap.selection,
        state.dataset,
        EXAMPLE_KEYS,
        st.columns([2.6, 1.1, 1], vertical_alignment="bottom"),
        # Explain held-out answers by default: the shipped detector learnt from train.
        default_split="test",
        max_limit=MAX_EXAMPLES,
        limit_help="Answers to explain; each costs one traced pass the first time",
    )


# --------------------------------------------------------------------------- detector


def detector_section(
    state: AppState,
    model: LoadedModel,
    shipped: DetectorSet,
    examples: list[RAGExample],
    chosen: list[RAGExample],
    label: str,
) -> SpadChoice | None:
    """Which spad detector is explained: the shipped one, else the quick fit (offered)."""
    show_broken_artifacts(shipped, (SPAD,))
    choice = spad_choice(model, shipped, state.spad_quick)
    if choice is not None and not choice.quick:
        d = choice.shipped
        assert d is not None
        facts = [f"trained on {md(d.trained_on)}" if d.trained_on else None]
        facts.append(f"{d.n_train} training answers" if d.n_train else None)
        facts.append(f"AUROC {d.auroc:.3f} ({d.auroc_from})" if d.auroc is not None else None)
        shown = ", ".join(f for f in facts if f)
        st.caption(
            f"Explaining the shipped **spad** detector for {md(model.info.display_name)}"
            + (f" ({shown})" if shown else "")
            + "."
        )
        return choice
    st.info(
        f"No trained spad detector for {md(model.info.display_name)}. Make one with "
        f"{code(train_command(SPAD, shipped.folder))} and reload this page."
    )
    split, train = quick_fit_examples(examples, chosen, state.shap.selection.limit)
    where = (
        f"{len(train)} labelled examples of the train split of {md(label)}"
        if split == "train"
        else f"the {len(train)} labelled examples chosen above (in-sample: "
        f"{md(label)} declares no train split)"
    )
    quick_fit_row(
        state,
        model,
        train,
        split=split,
        dataset_label=label,
        note=f"Meanwhile, a **quick fit** shows how to read this page: spad fitted on {where}, "
        "with fixed shallow trees (no search). Too few examples to trust its verdicts.",
        key=KEY_SHAP_QUICK_FIT,
    )
    choice = spad_choice(model, shipped, state.spad_quick)
    if choice is not None and choice.fit is not None:
        q = choice.fit
        st.warning(
            f"**Quick fit** (not a trained detector): spad fitted in this session on "
            f"{len(q.ids)} {plural(len(q.ids), 'answer')} of {md(q.dataset_label)} "
            f"({split_label(q.split)}: "
            f"{q.n_hallucinated} hallucinated, {q.n_faithful} faithful) in {q.seconds:.1f} s. "
            "Its SHAP values show how the page works, not what SPAD learns from real data.",
            icon=":material/bolt:",
        )
    return choice


# --------------------------------------------------------------------------- SHAP


def compute_section(state: AppState, model: LoadedModel, picked: PickedExamples) -> None:
    """The examples note and the Compute button (extracts spad features with progress)."""
    request = compute_row(
        model,
        picked,
        state.shap.selection,
        detector=SPAD,
        button="Compute SHAP values",
        key=KEY_SHAP_COMPUTE,
        progress_text="spad features:",
    )
    if request is not None:
        state.shap.request = request


def show_summary(
    state: AppState,
    model: LoadedModel,
    choice: SpadChoice | None,
    key: str,
    examples: list[RAGExample],
) -> None:
    """The beeswarm, the bar chart and the source x POS grid of the last computed examples."""
    req: FeatureRequest | None = state.shap.request
    if req is None:
        st.info("Press **Compute SHAP values** to explain these answers.")
        return
    if req.model != model.instance_key:
        st.info("These features were read with another model; press **Compute SHAP values**.")
        return
    selection = state.shap.selection
    if (req.dataset_key, req.split, req.limit) != (key, selection.split, selection.limit):
        st.info(
            f"Showing {len(req.ids)} {plural(len(req.ids), 'example')} of "
            f"{md(req.dataset_label)} "
            f"({split_label(req.split)}); press **Compute SHAP values** for the choice above."
        )
    if not show_request_failures(req):
        return
    if choice is None:
        st.info(
            f"spad features of {len(req.ids)} {plural(len(req.ids), 'answer')} are ready; "
            "press **Quick fit** above "
            "(or train spad) to see what the classifier makes of them."
        )
        return
    try:
        pool = examples if req.dataset_key == key else heads_examples(req.source, state.dataset)[2]
        result = shap_summary(model, req, pool, choice)
    except RagscopeError as e:
        st.error(f"The SHAP values could not be computed: {md(e)}")
        return
    by_id = {e.id: e for e in pool}
    draw(state, result, req, choice, [by_id[i].label for i in result.example_ids])


def _summary_header(
    result: ShapResult, req: FeatureRequest, choice: SpadChoice, labels: list[bool | None]
) -> None:
    """What was explained, on which answers, and warnings when the ranking means little."""
    n_hal = sum(1 for v in labels if v is True)
    n_fai = sum(1 for v in labels if v is False)
    which = "the quick fit" if choice.quick else "the shipped spad detector"
    st.markdown(
        f"TreeSHAP of {which} on **{len(result)}** answers ({n_hal} hallucinated, {n_fai} "
        f"faithful) · base value {result.base:+.3f} log-odds · features: {req.computed} "
        f"traced, {req.cache_hits} from the cache ({req.seconds:.1f} s)"
    )
    if choice.fit is not None:
        seen = len(set(result.example_ids) & set(choice.fit.ids))
        if seen:
            st.caption(
                f"{seen} of these {len(result)} {plural(len(result), 'answer')} "
                f"{plural(seen, 'was', 'were')} in the quick fit's training data: "
                f"{plural(seen, 'its SHAP values are', 'their SHAP values are')} in-sample."
            )
    labelled = [int(v) for v in labels if v is not None]
    few = evidence_warning(labelled, f"These {len(result)} answers")
    if few:
        st.warning(
            f"**Too few answers** to rank features by: {md(few)} The ranking below shows "
            "how the classifier read these answers, not which features matter in general."
        )
    if not result.values.any():
        st.warning(
            "The classifier learnt no split from its training answers: every SHAP value is 0 "
            "and every answer gets the base value. Train on more examples."
        )


def _pick_top(state: AppState, n_features: int) -> int:
    """The "Features shown" number (reset to 15 when out of range for this result)."""
    if not 1 <= state.shap.top <= n_features:
        state.shap.top = min(15, n_features)
        st.session_state.pop(KEY_SHAP_TOP, None)
    c_top, _ = st.columns([1, 4])
    return bind(
        P_TOP,
        KEY_SHAP_TOP,
        lambda: int(
            c_top.number_input(
                "Features shown",
                min_value=1,
                max_value=n_features,
                step=5,
                key=KEY_SHAP_TOP,
                help="The features with the largest mean |SHAP value|",
            )
        ),
        parse=integer(1, n_features),
        seed=state.shap.top,
        default=str(min(15, n_features)),
        what="number of features",
        where=f"a number from 1 to {n_features}",
    )


def _grid_section(state: AppState, result: ShapResult) -> None:
    """The grid-cells choice, the source x POS grid and its caption."""
    state.shap.grid = bind(
        P_GRID,
        KEY_SHAP_GRID,
        lambda: st.radio(
            "Grid cells",
            list(GRID_LABELS),
            key=KEY_SHAP_GRID,
            format_func=GRID_LABELS.__getitem__,
            horizontal=True,
        ),
        parse=one_of(GRID_LABELS),
        seed=state.shap.grid,
        default=next(iter(GRID_LABELS)),
        what="grid",
        where=" or ".join(GRID_LABELS),
        instead=GRID_LABELS.__getitem__,
    )
    kind: GridKind = "mean" if state.shap.grid == "mean" else "mean_abs"
    plot(grid_figure(result, kind), key="shap.figure.grid")
    st.caption(
        "Every spad feature is one cell: a source (rows) averaged over the answer tokens of "
        "one part of speech (columns). The paper's story: faithful answers take their nouns "
        "from the passages (RAG_NOUN), hallucinated ones lean on the final LayerNorm and the "
        "FFNs (LN_NUM, FFN_…). Tags absent from an answer give 0 for all seven sources."
    )


def draw(
    state: AppState,
    result: ShapResult,
    req: FeatureRequest,
    choice: SpadChoice,
    labels: list[bool | None],
) -> None:
    _summary_header(result, req, choice, labels)
    state.shap.top = _pick_top(state, len(result.names))
    left, right = st.columns([3, 2], gap="medium")
    with left:
        plot(summary_figure(result, state.shap.top, labels=labels), key="shap.figure.beeswarm")
    with right:
        plot(bar_figure(result, state.shap.top), key="shap.figure.bar")
    st.caption(
        "Each point is one answer: its SHAP value for that feature, in log-odds of "
        "\u201challucinated\u201d (right of 0 pushes towards hallucinated), coloured by the "
        "feature's value among these answers (blue low, red high). A feature's values plus "
        "the base value add up to the answer's margin exactly. Bars: mean |SHAP| (red when "
        "the feature pushes towards hallucinated on average, blue towards faithful)."
    )
    _grid_section(state, result)
    with st.expander("Table: every feature"):
        st.dataframe(
            result.to_frame(),
            hide_index=True,
            width="stretch",
            column_config={
                c: st.column_config.NumberColumn(c, format="%.4f")
                for c in ("mean |SHAP|", "mean SHAP", "mean value")
            },
        )


# --------------------------------------------------------------------------- page


def main() -> None:
    state = app_state()
    model = get_model()
    st.title("SHAP summary")
    st.caption(
        "SPAD splits each answer token's probability into seven sources (the query, the "
        "passages (RAG), earlier answer tokens (Past), the token itself (Self), the FFNs, the "
        "final LayerNorm (LN) and the initial embedding (Init)) and averages them per part of "
        "speech: 126 features like RAG_NOUN. Which of them move its XGBoost classifier?"
    )
    train_detectors_panel(model)
    picked = controls(state)
    if picked is None:
        return
    shipped = detector_set(model)
    choice = detector_section(state, model, shipped, picked.examples, picked.chosen, picked.label)
    st.divider()
    compute_section(state, model, picked)
    show_summary(state, model, choice, picked.key, picked.examples)


main()
