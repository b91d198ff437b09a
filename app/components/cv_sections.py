"""The Benchmark's sections for runs that score every answer out of fold: cross-validation
(``ragscope evaluate --cv K``: metric tables, fold spread, paired comparisons, breakdowns,
calibration), the cross-domain matrix (``--matrix``) and the review learning curves
(``--review-curve``)."""

from __future__ import annotations

from collections.abc import Sequence

import streamlit as st

from app.components.charts import breakdown_figure
from app.components.curve_charts import CURVE_METRICS, curve_figure, curve_frame
from app.components.cv_charts import (
    comparison_figure,
    fold_spread_figure,
    matrix_figure,
    reliability_figure,
)
from app.components.cv_tables import (
    DATASET_METRICS,
    MATRIX_METRICS,
    MISSING,
    breakdown_frame,
    breakdown_table,
    comparison_frame,
    comparison_table,
    cv_frame,
    cv_metric_table,
    describe_cv,
    fold_frame,
    matrix_frame,
    matrix_table,
    oof_frame,
    reliability_frame,
    series_name,
)
from app.components.exports import plot
from app.components.run_picker import (
    date_label,
    download_csv,
    file_stem,
    keep_option,
    keep_options,
    model_name,
    pick_saved,
    set_cv_run,
    where_saved,
)
from app.state.detectors import detector_set
from app.state.links import (
    P_CV,
    P_DETECTOR,
    P_MATRIX,
    P_METRIC,
    bind,
    linked,
    one_of,
    publish,
)
from app.state.model import get_model
from app.state.runs import (
    KEY_BENCH_CURVE_METRIC,
    KEY_BENCH_CURVE_RUNS,
    KEY_BENCH_CV_DATASET_METRIC,
    KEY_BENCH_CV_RELIABILITY,
    KEY_BENCH_CV_RUNS,
    KEY_BENCH_MATRIX_DETECTOR,
    KEY_BENCH_MATRIX_METRIC,
    KEY_BENCH_MATRIX_RUN,
    SavedRuns,
    download_key,
    newest,
    newest_per,
)
from app.state.session import AppState, seed_widget
from app.text import code, md
from core.evaluation.cv_run import CVRun
from core.evaluation.matrix import MatrixRun
from core.learning.metrics import SPAN_F1_NOTE
from core.pipeline.sets import ANSWER_JUDGE

# Detectors the reliability diagram draws until the user picks (more lines tangle): the
# run's overall judge alone when it has one, else its first three.
RELIABILITY_DEFAULT = 3


def cv_run_label(run: CVRun) -> str:
    """How a cross-validation is named in pickers: name, model, k, datasets, date."""
    return (
        f"{run.name} · {model_name(run.model)} · {run.k}-fold on {' + '.join(run.datasets)}"
        f" · {date_label(run.created_at)}"
    )


def pick_cv_runs(state: AppState, saved: SavedRuns) -> list[CVRun]:
    """The cross-validation picker (newest first; several = compare), opening on the
    loaded set's run (the one its card on the first tab reads), else the newest."""
    state.bench.cv_runs = pick_saved(
        saved,
        saved.cv,
        state.bench.cv_runs,
        KEY_BENCH_CV_RUNS,
        "Cross-validation runs",
        cv_run_label,
        P_CV,
        first=set_cv_run(detector_set(get_model())),
    )
    return [saved.cv[n] for n in state.bench.cv_runs]


def show_cv_tables(runs: Sequence[CVRun]) -> None:
    """Per run: what it was, and its pooled out-of-fold metric table (CSV downloads)."""
    st.subheader("Out-of-fold metrics")
    for run in runs:
        st.markdown(f"**{md(run.name)}** · model {code(model_name(run.model))}")
        st.caption(md(describe_cv(run)) + f" · created {md(date_label(run.created_at))}.")
        for warn in filter(None, [run.evidence, *run.dataset_evidence.values()]):
            st.warning(f"**Too few answers** in {md(run.name)}: {md(warn)}")
        # Static: every detector and metric in view, headers wrapped (a grid this wide
        # scrolled sideways).
        st.table(cv_metric_table(run), hide_index=True)
        c1, c2 = st.columns(2)
        with c1:
            download_csv(
                "Metrics (CSV)",
                cv_frame(run),
                f"{file_stem(run.name)}-metrics.csv",
                download_key("cv.metrics", run.name),
            )
        with c2:
            download_csv(
                "Out-of-fold scores per answer (CSV)",
                oof_frame(run),
                f"{file_stem(run.name)}-scores.csv",
                download_key("cv.scores", run.name),
            )
    st.caption(
        "Every answer is scored once, by the detector fitted without its fold (whole sources "
        "stay in one fold). AUROC and AP pool those scores, with 95% CIs from a bootstrap over "
        "sources; balanced accuracy and F1 use each fold's own threshold; ECE is the expected "
        "calibration error of the calibrated scores. *Length-matched* AUROC compares only "
        "hallucinated and faithful answers of similar length (same length quintile): what a "
        f"detector sees beyond answer length. `{MISSING}`: undefined (one class only, "
        "or no token scores)."
    )
    if any(r.spans for run in runs for r in run.results):
        st.caption(
            SPAN_F1_NOTE + " Precision / recall / F1 of each detector's whole-word spans at "
            "the token threshold of the fold that judged the answer."
        )


def show_fold_spread(runs: Sequence[CVRun]) -> None:
    """Each fold's AUROC against the pooled AUROC and its CI."""
    st.subheader("Spread over the folds")
    plot(fold_spread_figure(runs), key="benchmark.cv.spread")
    download_csv(
        "Per-fold metrics (CSV)",
        fold_frame(runs),
        "cv-folds.csv",
        download_key("cv.folds"),
    )


def show_comparisons(runs: Sequence[CVRun]) -> None:
    """Per run: each detector's AUROC against the best one's and against answer
    length's on the same answers, with paired CIs and p-values."""
    st.subheader("Are the differences real?")
    for i, run in enumerate(runs):
        if len(runs) > 1:
            st.markdown(f"**{md(run.name)}**")
        if not run.comparisons.get("rows"):
            st.caption(
                "This run was saved before paired comparisons were recorded: re-run it "
                "(`ragscope evaluate --cv K` on the same data) to get them."
            )
            continue
        plot(comparison_figure(run), key=f"benchmark.cv.compare.{i}")
        with st.expander("Numbers"):
            st.dataframe(comparison_table(run), hide_index=True, width="stretch")
        download_csv(
            "Paired differences (CSV)",
            comparison_frame(run),
            f"{file_stem(run.name)}-paired.csv",
            download_key("cv.paired", run.name),
        )
    st.caption(
        "Two detectors' AUROCs are compared on the same answers: each bootstrap resample "
        "draws whole sources and scores both on it, so the interval is for the difference "
        "itself (two overlapping CIs in the table above do not mean two detectors are "
        "equal, nor do two separate ones prove a difference). An interval that excludes 0 "
        "is a difference beyond the luck of the draw; p is two-sided and not adjusted for "
        "the number of comparisons. *vs answer length*: what a detector adds over the "
        "trivial baseline of ranking answers by their length."
    )


def show_cv_breakdowns(state: AppState, runs: Sequence[CVRun]) -> None:
    """AUROC per generator and, for runs that combine datasets, a metric per dataset."""
    st.subheader("By generator and by dataset")
    by_gen = breakdown_frame(runs, "generator")
    by_set = breakdown_frame(runs, "dataset")
    several_sets = any(len(run.datasets) > 1 or len(set(run.example_datasets)) > 1 for run in runs)
    # Headings in a row of their own, so both charts start at the same height.
    heads = st.columns(2, vertical_alignment="bottom") if several_sets else [st.container()]
    heads[0].markdown("**AUROC per generator**")
    if several_sets:
        with heads[1]:
            seed_widget(KEY_BENCH_CV_DATASET_METRIC, state.bench.cv_dataset_metric)
            state.bench.cv_dataset_metric = st.radio(
                "Per dataset",
                DATASET_METRICS,
                key=KEY_BENCH_CV_DATASET_METRIC,
                horizontal=True,
                help="Pooled out-of-fold answers of each dataset; balanced accuracy at each "
                "fold's threshold; ECE: lower is better calibrated. *Own calibration*: "
                "each dataset's answers judged by the calibration and threshold fitted on "
                "that dataset alone inside the fold (what the shipped detectors do for an "
                "answer of one of their training datasets). *Token AP*: over the "
                "dataset's labelled tokens; *span F1*: the detector's whole-word spans "
                "against the gold spans by character overlap, over the dataset's answers "
                "(runs from before either was recorded show none).",
            )
    cols = st.columns(2) if several_sets else [st.container()]
    with cols[0]:
        plot(breakdown_figure(by_gen, "generator", metric="AUROC"), key="benchmark.cv.generator")
        with st.expander("Numbers per generator"):
            st.dataframe(breakdown_table(by_gen), hide_index=True, width="stretch")
        download_csv(
            "Per generator (CSV)", by_gen, "cv-by-generator.csv", download_key("cv.generator")
        )
    if not several_sets:
        return
    with cols[1]:
        plot(
            breakdown_figure(by_set, "dataset", metric=state.bench.cv_dataset_metric),
            key="benchmark.cv.dataset",
        )
        with st.expander("Numbers per dataset"):
            st.dataframe(breakdown_table(by_set), hide_index=True, width="stretch")
        download_csv("Per dataset (CSV)", by_set, "cv-by-dataset.csv", download_key("cv.dataset"))


def show_reliability(state: AppState, runs: Sequence[CVRun]) -> None:
    """The reliability diagram of the calibrated out-of-fold scores, for picked detectors."""
    st.subheader("Calibration")
    compare = len(runs) > 1
    pairs = {
        f"{run.name}/{r.detector}": (series_name(run, r.detector, compare), r.reliability)
        for run in runs
        for r in run.results
    }
    if not pairs:
        st.info("The picked runs hold no detector results.")
        return
    options = list(pairs)
    if state.bench.cv_reliability is None:
        first = [r.detector for r in runs[0].results]
        chosen = [ANSWER_JUDGE] if ANSWER_JUDGE in first else first[:RELIABILITY_DEFAULT]
        state.bench.cv_reliability = [f"{runs[0].name}/{d}" for d in chosen]
    state.bench.cv_reliability = [p for p in state.bench.cv_reliability if p in pairs]
    keep_options(KEY_BENCH_CV_RELIABILITY, options)
    seed_widget(KEY_BENCH_CV_RELIABILITY, state.bench.cv_reliability)
    picked = st.multiselect(
        "Detectors",
        options,
        key=KEY_BENCH_CV_RELIABILITY,
        format_func=lambda k: pairs[k][0],
    )
    state.bench.cv_reliability = list(picked)
    if not picked:
        st.caption("Pick one or more detectors to see their reliability diagram.")
        return
    series = dict(pairs[k] for k in picked)
    left, right = st.columns(2, gap="large")
    with left:
        plot(reliability_figure(series), key="benchmark.cv.reliability")
    with right:
        st.caption(
            "Each point is a bin of answers by calibrated score (0-0.1, 0.1-0.2, ...): its "
            "mean score against the share of its answers that are hallucinated; the larger "
            "the marker, the more answers. On the dashed diagonal a score of 0.8 means 8 in "
            "10 such answers are hallucinated. ECE (in the legend) is the answer-weighted "
            "mean distance from it."
        )
        download_csv(
            "Reliability bins (CSV)",
            reliability_frame(series),
            "cv-reliability.csv",
            download_key("cv.reliability"),
        )


def show_cv(state: AppState, saved: SavedRuns) -> None:
    """The cross-validation section."""
    st.header("Cross-validation", anchor="cross-validation")
    st.caption(
        "Out-of-fold results of `ragscope evaluate --cv K` and `ragscope train --cv K`: every "
        "answer scored by a detector that never saw its source, so the numbers hold for new "
        "questions."
    )
    runs = pick_cv_runs(state, saved)
    if not runs:
        st.info("Pick one or more cross-validation runs above.")
        return
    show_cv_tables(runs)
    show_fold_spread(runs)
    show_comparisons(runs)
    show_cv_breakdowns(state, runs)
    show_reliability(state, runs)


def matrix_run_label(run: MatrixRun) -> str:
    """How a matrix run is named in its picker: name, model, datasets, date."""
    return (
        f"{run.name} · {model_name(run.model)} · {' × '.join(run.datasets)}"
        f" · {date_label(run.created_at)}"
    )


def show_matrix(state: AppState, saved: SavedRuns) -> None:
    """The cross-domain matrix section: one run, one detector, one metric as a heatmap."""
    st.header("Cross-domain matrix", anchor="cross-domain-matrix")
    st.caption(
        "From `ragscope evaluate --matrix A,B,C`: a detector trained (with its threshold "
        "and calibration) on the row's data and tested on the column's. The dotted diagonal "
        "is cross-validation within one dataset; 'all but X' trains on every other dataset."
    )
    runs = saved.matrices
    names = list(runs)
    if state.bench.matrix_run not in runs:
        state.bench.matrix_run = newest(runs)  # by the time it records, wherever it is
    keep_option(KEY_BENCH_MATRIX_RUN, names)
    state.bench.matrix_run = bind(
        P_MATRIX,
        KEY_BENCH_MATRIX_RUN,
        lambda: st.selectbox(
            f"Matrix run ({where_saved(saved, names)}; newest first)",
            names,
            key=KEY_BENCH_MATRIX_RUN,
            format_func=lambda n: (
                matrix_run_label(runs[n]) + (" · shipped" if n in saved.shipped else "")
            ),
        ),
        parse=one_of(names),
        seed=state.bench.matrix_run,
        what="matrix run",
        where="among the matrix runs saved here",
    )
    run = runs[state.bench.matrix_run]
    detectors = list(run.cells)
    if not detectors:  # an empty run: a detector the link names is missing
        publish(P_DETECTOR, None, missing=linked(P_DETECTOR), what="detector", where="in it")
        st.info(f"{md(run.name)} holds no detector results.")
        return
    if state.bench.matrix_detector not in detectors:
        state.bench.matrix_detector = detectors[0]
    keep_option(KEY_BENCH_MATRIX_DETECTOR, detectors)
    c1, c2 = st.columns(2, vertical_alignment="bottom")
    state.bench.matrix_detector = bind(
        P_DETECTOR,
        KEY_BENCH_MATRIX_DETECTOR,
        lambda: c1.selectbox("Detector", detectors, key=KEY_BENCH_MATRIX_DETECTOR),
        parse=one_of(detectors),
        seed=state.bench.matrix_detector,
        what="detector",
        where=f"in the matrix run {code(run.name)} ({', '.join(detectors)})",
    )
    state.bench.matrix_metric = bind(
        P_METRIC,
        KEY_BENCH_MATRIX_METRIC,
        lambda: c2.radio(
            "Metric", list(MATRIX_METRICS), key=KEY_BENCH_MATRIX_METRIC, horizontal=True
        ),
        parse=one_of(list(MATRIX_METRICS)),
        seed=state.bench.matrix_metric,
        default=next(iter(MATRIX_METRICS)),
        what="metric",
        where=" or ".join(MATRIX_METRICS),
    )
    det, metric = state.bench.matrix_detector, state.bench.matrix_metric
    plot(matrix_figure(run, det, metric), key="benchmark.matrix")
    st.caption(
        f"{md(metric)} of {code(det)} on {len(run.datasets)} datasets (model "
        f"{code(model_name(run.model))}, diagonal {run.k}-fold, created "
        f"{md(date_label(run.created_at))}); 95% CIs from a bootstrap over sources on hover and "
        "below. Empty cells: pairs not run."
    )
    st.dataframe(matrix_table(run, det, metric), width="stretch")
    download_csv(
        "Every cell of every detector (CSV)",
        matrix_frame(run),
        f"{file_stem(run.name)}-matrix.csv",
        download_key("matrix", run.name),
    )


def show_review_curves(state: AppState, saved: SavedRuns) -> None:
    """How many reviewed answers a dataset needs before the set adapted to it reads its
    other answers well (``ragscope evaluate --review-curve DATASET``)."""
    st.header("Review learning curves", anchor="review-learning-curves")
    st.caption(
        "Reviewers simulated by a labelled dataset's gold labels; the set adapted after n "
        "reviews (random order: calibration; uncertainty order: only its first random "
        "batch calibrates) and scored on the answers not reviewed. Dotted grey: the set "
        "unadapted on the same answers; dashed: the dataset's own 5-fold CV of the same "
        "procedure. Bands: 2.5% to 97.5% over seeds."
    )
    names = list(saved.curves)
    keep_options(KEY_BENCH_CURVE_RUNS, names)
    picked = st.multiselect(
        "Runs",
        names,
        default=newest_per(saved.curves, lambda run: run.dataset),  # each dataset's newest
        key=KEY_BENCH_CURVE_RUNS,
        format_func=lambda n: (
            f"{saved.curves[n].dataset} · {date_label(saved.curves[n].created_at)}"
        ),
    )
    metric = st.radio(
        "Show",
        list(CURVE_METRICS),
        format_func=CURVE_METRICS.__getitem__,
        horizontal=True,
        key=KEY_BENCH_CURVE_METRIC,
    )
    runs = [saved.curves[n] for n in picked]
    if not runs:
        st.info("Pick one or more runs above.")
        return
    plot(curve_figure(runs, metric), key=f"benchmark.review_curves.{metric}")
    for run in runs:
        with st.expander(f"{md(run.dataset)}: every point", icon=":material/table:"):
            st.caption(
                f"{run.n_answers} answers, {run.n_hallucinated} hallucinated; the "
                f"{md(run.set_name)} set's {md(run.judge)} read out of fold from "
                f"{', '.join(code(r) for r in run.runs[:1])}; {run.seeds} seeds."
            )
            st.dataframe(curve_frame(run), hide_index=True, width="stretch")
