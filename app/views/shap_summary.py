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

from app.state import (
    ALL_SPLITS,
    HEADS_FROM_CORPUS,
    HEADS_FROM_HOME,
    KEY_SHAP_COMPUTE,
    KEY_SHAP_GRID,
    KEY_SHAP_LIMIT,
    KEY_SHAP_QUICK_FIT,
    KEY_SHAP_SOURCE,
    KEY_SHAP_SPLIT,
    KEY_SHAP_TOP,
    SPAD,
    AppState,
    FeatureRequest,
    ShippedDetectors,
    SpadChoice,
    app_state,
    example_splits,
    extract_request,
    fit_quick_spad,
    get_model,
    heads_examples,
    model_key,
    quick_fit_examples,
    seed_widget,
    shap_summary,
    shipped_detectors,
    spad_choice,
    stats_examples,
    train_command,
)
from core.errors import RagscopeError
from core.examples import RAGExample
from core.model import LoadedModel
from core.shapviz import ShapResult

# Page scripts run with Streamlit's magic: a bare string would be drawn, so no
# attribute docstrings here.
MAX_EXAMPLES = 400  # each example costs a traced pass the first time
SPLIT_LABELS = {ALL_SPLITS: "all splits"}
GRID_LABELS = {"mean": "mean SHAP (signed)", "mean_abs": "mean |SHAP|"}


def _split_label(split: str | None) -> str:
    return SPLIT_LABELS.get(split or ALL_SPLITS, split or ALL_SPLITS)


# --------------------------------------------------------------------------- examples


def controls(
    state: AppState,
) -> tuple[str, str, list[RAGExample], list[RAGExample], list[RAGExample]] | None:
    """Examples source, split and number.

    Returns:
        ``(dataset key, label, every example, the split's examples, the chosen ones)``,
        or ``None`` when the dataset cannot be read (the error is shown).
    """
    labels = {
        HEADS_FROM_HOME: f"The Home dataset ({state.dataset.label})",
        HEADS_FROM_CORPUS: "Built-in labelled corpus",
    }
    if state.shap_source not in labels:
        state.shap_source = HEADS_FROM_HOME
    seed_widget(KEY_SHAP_SOURCE, state.shap_source)
    c1, c2, c3 = st.columns([2.6, 1.1, 1], vertical_alignment="bottom")
    before = state.shap_source
    with c1:
        state.shap_source = st.selectbox(
            "Examples", list(labels), key=KEY_SHAP_SOURCE, format_func=labels.__getitem__
        )
    if state.shap_source != before:  # another dataset: start from its default split
        state.shap_split = None
        st.session_state.pop(KEY_SHAP_SPLIT, None)
    try:
        key, label, examples = heads_examples(state.shap_source, state.dataset)
    except RagscopeError as e:
        st.error(f"{labels[state.shap_source]} cannot be read: {e}")
        return None
    splits = example_splits(examples)
    if state.shap_split not in splits:
        # Explain held-out answers by default: the shipped detector learnt from train.
        state.shap_split = "test" if "test" in splits else ALL_SPLITS
        st.session_state.pop(KEY_SHAP_SPLIT, None)
    seed_widget(KEY_SHAP_SPLIT, state.shap_split)
    with c2:
        state.shap_split = st.selectbox(
            "Split",
            splits,
            key=KEY_SHAP_SPLIT,
            format_func=_split_label,
            disabled=len(splits) == 1,
            help="The split the dataset declares for each example (the corpus has three)",
        )
    seed_widget(KEY_SHAP_LIMIT, state.shap_limit)
    with c3:
        state.shap_limit = int(
            st.number_input(
                "At most",
                min_value=2,
                max_value=MAX_EXAMPLES,
                step=4,
                key=KEY_SHAP_LIMIT,
                help="Answers to explain; each costs one traced pass the first time",
            )
        )
    pool = [e for e in examples if state.shap_split in (ALL_SPLITS, e.provenance.split)]
    chosen = stats_examples(examples, state.shap_split, state.shap_limit)
    return key, label, examples, pool, chosen


def _progress_bar(text: str):
    bar = st.progress(0.0, text=text)

    def progress(done: int, total: int) -> None:
        bar.progress(done / max(total, 1), text=f"{text} {done} / {total} examples")

    return bar, progress


# --------------------------------------------------------------------------- detector


def detector_section(
    state: AppState,
    model: LoadedModel,
    shipped: ShippedDetectors,
    examples: list[RAGExample],
    chosen: list[RAGExample],
    label: str,
) -> SpadChoice | None:
    """Which spad detector is explained: the shipped one, else the quick fit (offered)."""
    for b in shipped.broken:
        if b.name == SPAD:
            st.error(
                f"The **spad** artifact in `{b.folder}` could not be loaded: {b.reason}  \n"
                f"Fix: retrain it with `{train_command(SPAD, shipped.folder)}`, or remove "
                "the folder."
            )
    choice = spad_choice(model, shipped, state.spad_quick)
    if choice is not None and not choice.quick:
        d = choice.shipped
        assert d is not None
        facts = [f"trained on {d.trained_on}" if d.trained_on else None]
        facts.append(f"{d.n_train} training answers" if d.n_train else None)
        facts.append(f"test AUROC {d.test_auroc:.3f}" if d.test_auroc is not None else None)
        shown = ", ".join(f for f in facts if f)
        st.caption(
            f"Explaining the shipped **spad** detector for {model.info.display_name}"
            + (f" ({shown})" if shown else "")
            + "."
        )
        return choice
    st.info(
        f"No trained spad detector for {model.info.display_name}. Make one with "
        f"`{train_command(SPAD, shipped.folder)}` and reload this page."
    )
    split, train = quick_fit_examples(examples, chosen, state.shap_limit)
    where = (
        f"{len(train)} labelled examples of the train split of {label}"
        if split == "train"
        else f"the {len(train)} labelled examples chosen above (in-sample: "
        f"{label} declares no train split)"
    )
    c_note, c_button = st.columns([4, 1], vertical_alignment="center")
    with c_note:
        st.caption(
            f"Meanwhile, a **quick fit** shows how to read this page: spad fitted on {where}, "
            "with fixed shallow trees (no search). Too few examples to trust its verdicts."
        )
    with c_button:
        fit = st.button(
            "Quick fit",
            key=KEY_SHAP_QUICK_FIT,
            icon=":material/bolt:",
            disabled=len(train) < 4,
            width="stretch",
        )
    if fit:
        bar, progress = _progress_bar("Quick fit: spad features,")
        try:
            state.spad_quick = fit_quick_spad(
                model, train, dataset_label=label, split=split, progress=progress
            )
        except RagscopeError as e:
            st.error(f"The quick fit failed: {e}")
        bar.empty()
    choice = spad_choice(model, shipped, state.spad_quick)
    if choice is not None and choice.fit is not None:
        q = choice.fit
        st.warning(
            f"**Quick fit** (not a trained detector): spad fitted in this session on "
            f"{len(q.ids)} answers of {q.dataset_label} ({_split_label(q.split)}: "
            f"{q.n_hallucinated} hallucinated, {q.n_faithful} faithful) in {q.seconds:.1f} s. "
            "Its SHAP values show how the page works, not what SPAD learns from real data.",
            icon=":material/bolt:",
        )
    return choice


# --------------------------------------------------------------------------- SHAP


def compute_section(
    state: AppState,
    model: LoadedModel,
    key: str,
    label: str,
    pool: list[RAGExample],
    chosen: list[RAGExample],
) -> None:
    """The examples note and the Compute button (extracts spad features with progress)."""
    n_hal = sum(1 for e in chosen if e.label is True)
    n_fai = sum(1 for e in chosen if e.label is False)
    c_note, c_button = st.columns([4, 1], vertical_alignment="center")
    with c_note:
        st.caption(
            f"{len(chosen)} of the {len(pool)} examples ({_split_label(state.shap_split)}) of "
            f"{label}: {n_hal} hallucinated, {n_fai} faithful. Each is traced once with "
            f"{model.info.display_name}; later runs read its features from the feature cache."
        )
    with c_button:
        compute = st.button(
            "Compute SHAP values",
            key=KEY_SHAP_COMPUTE,
            type="primary",
            icon=":material/query_stats:",
            disabled=not chosen,
            width="stretch",
        )
    if compute:
        bar, progress = _progress_bar("spad features:")
        try:
            state.shap_request = extract_request(
                model,
                chosen,
                SPAD,
                source=state.shap_source,
                dataset_key=key,
                dataset_label=label,
                split=state.shap_split or ALL_SPLITS,
                limit=state.shap_limit,
                progress=progress,
            )
        except RagscopeError as e:
            st.error(f"The features could not be extracted: {e}")
        bar.empty()


def show_summary(
    state: AppState,
    model: LoadedModel,
    choice: SpadChoice | None,
    key: str,
    examples: list[RAGExample],
) -> None:
    """The beeswarm, the bar chart and the source x POS grid of the last computed examples."""
    req: FeatureRequest | None = state.shap_request
    if req is None:
        st.info("Press **Compute SHAP values** to explain these answers.")
        return
    if req.model != model_key(model):
        st.info("These features were read with another model; press **Compute SHAP values**.")
        return
    if (req.dataset_key, req.split, req.limit) != (key, state.shap_split, state.shap_limit):
        st.info(
            f"Showing {len(req.ids)} examples of {req.dataset_label} "
            f"({_split_label(req.split)}); press **Compute SHAP values** for the choice above."
        )
    if req.n_failed:
        st.warning(
            f"{req.n_failed} example(s) could not be analysed and were left out: "
            + " · ".join(req.errors)
        )
    if not req.ids:
        st.error("None of the examples could be analysed; pick other examples.")
        return
    if choice is None:
        st.info(
            f"spad features of {len(req.ids)} answers are ready; press **Quick fit** above "
            "(or train spad) to see what the classifier makes of them."
        )
        return
    try:
        pool = examples if req.dataset_key == key else heads_examples(req.source, state.dataset)[2]
        result = shap_summary(model, req, pool, choice)
    except RagscopeError as e:
        st.error(f"The SHAP values could not be computed: {e}")
        return
    by_id = {e.id: e for e in pool}
    draw(state, result, req, choice, [by_id[i].label for i in result.example_ids])


def draw(
    state: AppState,
    result: ShapResult,
    req: FeatureRequest,
    choice: SpadChoice,
    labels: list[bool | None],
) -> None:
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
                f"{seen} of these {len(result)} answers were in the quick fit's training data: "
                "their SHAP values are in-sample."
            )
    if not result.values.any():
        st.warning(
            "The classifier learnt no split from its training answers: every SHAP value is 0 "
            "and every answer gets the base value. Train on more examples."
        )
    n_features = len(result.names)
    if not 1 <= state.shap_top <= n_features:
        state.shap_top = min(15, n_features)
        st.session_state.pop(KEY_SHAP_TOP, None)
    seed_widget(KEY_SHAP_TOP, state.shap_top)
    c_top, _ = st.columns([1, 4])
    with c_top:
        state.shap_top = int(
            st.number_input(
                "Features shown",
                min_value=1,
                max_value=n_features,
                step=5,
                key=KEY_SHAP_TOP,
                help="The features with the largest mean |SHAP value|",
            )
        )
    left, right = st.columns([3, 2], gap="medium")
    with left:
        st.plotly_chart(
            result.summary_figure(state.shap_top, labels=labels),
            width="stretch",
            key="shap.figure.beeswarm",
        )
    with right:
        st.plotly_chart(result.bar_figure(state.shap_top), width="stretch", key="shap.figure.bar")
    st.caption(
        "Each point is one answer: its SHAP value for that feature, in log-odds of "
        "\u201challucinated\u201d (right of 0 pushes towards hallucinated), coloured by the "
        "feature's value among these answers (blue low, red high). A feature's values plus "
        "the base value add up to the answer's margin exactly. Bars: mean |SHAP| (red when "
        "the feature pushes towards hallucinated on average, blue towards faithful)."
    )
    seed_widget(KEY_SHAP_GRID, state.shap_grid)
    state.shap_grid = st.radio(
        "Grid cells",
        list(GRID_LABELS),
        key=KEY_SHAP_GRID,
        format_func=GRID_LABELS.__getitem__,
        horizontal=True,
    )
    st.plotly_chart(
        result.grid_figure(state.shap_grid),  # type: ignore[arg-type]
        width="stretch",
        key="shap.figure.grid",
    )
    st.caption(
        "Every spad feature is one cell: a source (rows) averaged over the answer tokens of "
        "one part of speech (columns). The paper's story: faithful answers take their nouns "
        "from the passages (RAG_NOUN), hallucinated ones lean on the final LayerNorm and the "
        "FFNs (LN_NUM, FFN_…). Tags absent from an answer give 0 for all seven sources."
    )
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
    picked = controls(state)
    if picked is None:
        return
    key, label, examples, pool, chosen = picked
    shipped = shipped_detectors(model)
    choice = detector_section(state, model, shipped, examples, chosen, label)
    st.divider()
    compute_section(state, model, key, label, pool, chosen)
    show_summary(state, model, choice, key, examples)


main()
