"""Benchmark: how well each detector separates hallucinated from faithful answers.

Reads the evaluation runs saved in :func:`core.evaluation.evaluate.runs_dir` (by this page or
by ``ragscope evaluate``): the metric table with bootstrap CIs, ROC and
precision-recall curves, per-task and per-generator breakdowns, and a confusion
matrix at a threshold you move. Several runs can be picked to compare them. New
runs are launched here too, with progress; features come from the on-disk cache
when an example was analysed before, so a repeated run is quick.

Cross-validations (``ragscope evaluate --cv K`` / ``ragscope train --cv K``) get their
own section: pooled out-of-fold metrics with CIs, each fold's AUROC, AUROC by
generator and dataset, and the reliability diagram of the calibrated scores. Cross-domain
matrices (``ragscope evaluate --matrix A,B,C``) show as a training x test heatmap.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from functools import partial
from typing import TypeVar

import numpy as np
import pandas as pd
import streamlit as st

from app.components.charts import (
    ScoreSeries,
    breakdown_figure,
    confusion_figure,
    pr_figure,
    roc_figure,
)
from app.components.curve_charts import CURVE_METRICS, curve_figure, curve_frame
from app.components.cv_charts import (
    DATASET_METRICS,
    MATRIX_METRICS,
    breakdown_frame,
    breakdown_table,
    comparison_figure,
    comparison_frame,
    comparison_table,
    cv_frame,
    cv_metric_table,
    describe_cv,
    fmt,
    fmt_ci,
    fold_frame,
    fold_spread_figure,
    matrix_figure,
    matrix_frame,
    matrix_table,
    oof_frame,
    reliability_figure,
    reliability_frame,
    series_name,
)
from app.components.exports import plot
from app.components.set_quality import show_set_quality
from app.state.datasets import get_store
from app.state.detectors import shipped_detectors
from app.state.links import (
    P_CV,
    P_DETECTOR,
    P_MATRIX,
    P_METRIC,
    P_RUN,
    bind,
    follow_list,
    linked,
    one_of,
    publish,
)
from app.state.model import get_model
from app.state.runs import (
    CORPUS,
    KEY_BENCH_BREAKDOWN_METRIC,
    KEY_BENCH_CONFUSION,
    KEY_BENCH_CURVE_METRIC,
    KEY_BENCH_CURVE_RUNS,
    KEY_BENCH_CV_DATASET_METRIC,
    KEY_BENCH_CV_RELIABILITY,
    KEY_BENCH_CV_RUNS,
    KEY_BENCH_DETECTORS,
    KEY_BENCH_LAUNCH,
    KEY_BENCH_LIMIT,
    KEY_BENCH_MATRIX_DETECTOR,
    KEY_BENCH_MATRIX_METRIC,
    KEY_BENCH_MATRIX_RUN,
    KEY_BENCH_RUNS,
    KEY_BENCH_TEST,
    KEY_BENCH_TRAIN,
    SAME_DATASET,
    DatasetSummary,
    SavedRuns,
    dataset_summary,
    download_key,
    eval_dataset_choices,
    saved_runs,
    threshold_key,
)
from app.state.session import AppState, app_state, seed_widget
from app.text import code, md
from core.base.errors import RagscopeError
from core.base.paths import runs_dir
from core.data import make_splits
from core.detectors import runnable_detectors
from core.engine.model import LoadedModel
from core.evaluation.cv_run import CVRun
from core.evaluation.evaluate import DetectorResult, EvalRun, Splits, evaluate
from core.evaluation.matrix import MatrixRun
from core.learning.metrics import SPAN_F1_NOTE, ci_columns, confusion_counts, response_metrics
from core.pipeline.extract import FeatureCache
from core.pipeline.sets import ANSWER_JUDGE
from core.review.export import safe_csv

BREAKDOWN_METRICS: tuple[str, ...] = ("AUROC", "F1")
EMPTY_STATE = (
    "No saved runs yet. Launch one with **Launch a new run** above, or from a terminal: "
    "`ragscope evaluate --dataset builtin` (cross-validation: "
    "`ragscope evaluate --cv 5 --dataset builtin`)."
)
MISSING = "-"
R = TypeVar("R")  # a saved run of one kind (EvalRun, CVRun)


def _table_height(n_rows: int) -> int:
    """Pixels that show a dataframe's header and ``n_rows`` rows without a scrollbar."""
    return 35 * (n_rows + 1) + 3


# --------------------------------------------------------------------------- formatting


def _date(iso: str) -> str:
    try:
        return datetime.fromisoformat(iso).strftime("%Y-%m-%d %H:%M UTC")
    except ValueError:
        return iso


def _model_name(key: str) -> str:
    return key.split("|", 1)[0]


def run_label(run: EvalRun) -> str:
    """How a run is named in pickers: name, model, train -> test, date."""
    return (
        f"{run.name} · {_model_name(run.model)} · {run.train_dataset} → {run.test_dataset}"
        f" · {_date(run.created_at)}"
    )


def metric_table(runs: Sequence[EvalRun]) -> pd.DataFrame:
    """One row per run and detector: test metrics to 3 decimals, the CI as ``[lo, hi]``."""
    rows = []
    for run in runs:
        for _, r in run.to_frame().iterrows():
            ci = fmt_ci([r[c] for c in ci_columns("AUROC")])
            row = {"run": run.name} if len(runs) > 1 else {}
            row |= {
                "detector": r["detector"],
                "AUROC": fmt(r["AUROC"]),
                "AUROC 95% CI": ci,
                "AP": fmt(r["AP"]),
                "balanced acc": fmt(r["balanced acc"]),
                "F1": fmt(r["F1"]),
                "precision": fmt(r["precision"]),
                "recall": fmt(r["recall"]),
                "Pearson r": fmt(r["Pearson r"]),
                "threshold": fmt(r["threshold"]),
                "token AP": fmt(r["token AP"]),
                "token AUROC": fmt(r["token AUROC"]),
            }
            rows.append(row)
    return pd.DataFrame(rows)


def details_table(runs: Sequence[EvalRun]) -> pd.DataFrame:
    """What each run was: model, data, splits, hashes and feature-extraction stats."""
    cols: dict[str, list[str]] = {}
    for run in runs:
        sizes, hashes, ex = run.split_sizes, run.data_hashes, run.extraction
        n_test, n_pos = len(run.test_labels), int(sum(run.test_labels))
        epm = ex.get("examples_per_minute")
        cols[run.name] = [
            run.model,
            run.train_dataset,
            run.test_dataset,
            _date(run.created_at),
            " / ".join(str(sizes.get(s, 0)) for s in ("train", "validation", "test")),
            f"{n_pos} hallucinated, {n_test - n_pos} faithful",
            " / ".join(f"{hashes.get(s, MISSING)}" for s in ("train", "validation", "test")),
            ", ".join(f"{r.detector} {r.config_hash}" for r in run.results),
            f"{ex.get('computed', MISSING)} computed, {ex.get('cache_hits', MISSING)} from cache"
            + (f", {ex['n_errors']} failed" if ex.get("n_errors") else ""),
            f"{ex['seconds']:.1f} s" if "seconds" in ex else MISSING,
            fmt(epm, 1),
        ]
    index = [
        "model",
        "train dataset",
        "test dataset",
        "created",
        "examples train / validation / test",
        "test labels",
        "data hashes train / validation / test",
        "detector config hashes",
        "feature extraction",
        "extraction time",
        "examples / min",
    ]
    return pd.DataFrame(cols, index=index)


def _breakdown_table(frame: pd.DataFrame) -> pd.DataFrame:
    out = frame.copy()
    for c in ("AUROC", "F1"):
        out[c] = [fmt(v) for v in out[c]]
    return out


# --------------------------------------------------------------------------- new run


def _summary_note(spec: str, labels: Mapping[str, str]) -> DatasetSummary | None:
    """The dataset's counts under its picker, or its error; ``None`` when unreadable."""
    try:
        s = dataset_summary(spec)
    except RagscopeError as e:
        if spec == CORPUS:
            st.error(
                f"The built-in labelled corpus is not available yet: {md(e)}. "
                "Pick another dataset meanwhile."
            )
        else:
            st.error(f"{md(labels.get(spec, spec))} cannot be read: {md(e)}")
        return None
    unl = f", {s.n_unlabelled} unlabelled (evaluation needs labels)" if s.n_unlabelled else ""
    st.caption(f"{s.n} examples: {s.n_hallucinated} hallucinated, {s.n_faithful} faithful{unl}.")
    return s


def launch_form(state: AppState, model: LoadedModel, *, expanded: bool) -> bool:
    """The new-run form (datasets, detectors, limit); True when Run was pressed."""
    with st.expander("Launch a new run", expanded=expanded, icon=":material/play_arrow:"):
        try:
            labels = eval_dataset_choices()
        except RagscopeError as e:
            st.error(md(e))
            labels = {
                "demo": "Demo examples (12, hand-written)",
                CORPUS: "Built-in labelled corpus",
            }
        specs = list(labels)
        if state.bench.train not in labels:
            state.bench.train = "demo"
        if st.session_state.get(KEY_BENCH_TRAIN) not in labels:
            st.session_state.pop(KEY_BENCH_TRAIN, None)
        test_specs = [SAME_DATASET, *specs]
        if state.bench.test not in test_specs:
            state.bench.test = SAME_DATASET
        if st.session_state.get(KEY_BENCH_TEST) not in test_specs:
            st.session_state.pop(KEY_BENCH_TEST, None)
        seed_widget(KEY_BENCH_TRAIN, state.bench.train)
        seed_widget(KEY_BENCH_TEST, state.bench.test)

        c1, c2 = st.columns(2)
        with c1:
            state.bench.train = st.selectbox(
                "Train on",
                specs,
                key=KEY_BENCH_TRAIN,
                format_func=lambda s: labels[s],
                help="Split by source into train / validation / test (70 / 15 / 15).",
            )
            ok = _summary_note(state.bench.train, labels) is not None
        with c2:
            state.bench.test = st.selectbox(
                "Test on",
                test_specs,
                key=KEY_BENCH_TEST,
                format_func=lambda s: (
                    "The same dataset (its test split)" if s == SAME_DATASET else labels[s]
                ),
                help="Cross-dataset: fit and pick thresholds on the first, test on all of this.",
            )
            if state.bench.test != SAME_DATASET:
                ok = _summary_note(state.bench.test, labels) is not None and ok

        names = runnable_detectors(model)  # e.g. no raglens without an SAE for the model
        if state.bench.detectors is None:
            state.bench.detectors = list(names)
        seed_widget(KEY_BENCH_DETECTORS, [d for d in state.bench.detectors if d in names])
        seed_widget(KEY_BENCH_LIMIT, state.bench.limit)
        c3, c4 = st.columns([3, 1])
        with c3:
            state.bench.detectors = st.multiselect("Detectors", names, key=KEY_BENCH_DETECTORS)
        with c4:
            state.bench.limit = int(
                st.number_input(
                    "Example limit (0 = all)",
                    min_value=0,
                    step=50,
                    key=KEY_BENCH_LIMIT,
                    help="About this many examples per dataset, whole sources kept together.",
                )
            )
        if not state.bench.detectors:
            st.caption("Pick at least one detector.")
        return st.button(
            "Run the evaluation",
            key=KEY_BENCH_LAUNCH,
            type="primary",
            icon=":material/play_arrow:",
            disabled=not ok or not state.bench.detectors,
        )


def launch_run(state: AppState, model: LoadedModel) -> EvalRun | None:
    """Evaluate the form's detectors with progress, save the run, and select it.

    Fitting, threshold picking and bootstrap CIs follow ``ragscope evaluate``.
    """
    detectors = list(state.bench.detectors or [])
    test = None if state.bench.test == SAME_DATASET else state.bench.test
    try:
        with st.status(
            f"Evaluating {', '.join(detectors)} on {md(model.info.display_name)}…", expanded=True
        ) as status:
            train_name, test_name, splits = make_splits(
                state.bench.train, test, limit=state.bench.limit or None
            )
            st.write(
                f"Datasets: train on **{md(train_name)}**, test on **{md(test_name or train_name)}** · "
                + " · ".join(f"{k} {len(v)}" for k, v in splits.items())
            )
            bar = st.progress(0.0, text="Extracting features…")

            def progress(done: int, total: int) -> None:
                text = (
                    f"Features: {done} / {total} examples"
                    if done < total
                    else f"Features: {total} / {total} examples · fitting and scoring…"
                )
                bar.progress(done / max(total, 1), text=text)

            run = evaluate(
                model,
                detectors,
                Splits.of(splits, train_name, test_name),
                cache=FeatureCache(get_store()),
                progress=progress,
            )
            json_path, _ = run.save(runs_dir())
            status.update(label=f"Saved run {md(run.name)}", state="complete", expanded=False)
    except RagscopeError as e:
        st.error(f"The run failed: {md(e)}")
        return None
    state.bench.runs = [run.name]
    st.session_state[KEY_BENCH_RUNS] = [run.name]  # the picker below is not drawn yet
    ex = run.extraction
    st.success(
        f"Saved **{md(run.name)}** to {code(json_path)} ({ex.get('computed')} examples computed, "
        f"{ex.get('cache_hits')} from the feature cache); it is selected below."
    )
    return run


# --------------------------------------------------------------------------- saved runs


def _where(saved: SavedRuns, names: Sequence[str]) -> str:
    """``"2 in `folder`, 1 shipped with ragscope"`` for the runs ``names`` (Markdown)."""
    n_shipped = sum(1 for n in names if n in saved.shipped)
    out = f"{len(names) - n_shipped} in {code(saved.folder)}"
    return out + (f", {n_shipped} shipped with ragscope" if n_shipped else "")


def _keep_options(key: str, options: Sequence[str]) -> None:
    """Drop a multiselect's remembered values that are no longer options (a run was
    deleted, another run picked) before the widget is drawn."""
    widget = st.session_state.get(key)
    if widget is not None and any(v not in options for v in widget):
        st.session_state[key] = [v for v in widget if v in options]


def _keep_option(key: str, options: Sequence[str]) -> None:
    """Forget a selectbox's remembered value when it is no longer an option."""
    if key in st.session_state and st.session_state[key] not in options:
        st.session_state.pop(key)


def _file_stem(name: str) -> str:
    """A run name as a safe download file name stem."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._") or "run"


def _download(label: str, frame: pd.DataFrame, file_name: str, key: str) -> None:
    """A CSV download of ``frame`` (formula-like text cells neutralised), written when
    the button is pressed (a run's per-answer scores can be large)."""
    st.download_button(
        label,
        partial(safe_csv, frame),
        file_name=file_name,
        mime="text/csv",
        key=key,
        icon=":material/download:",
        disabled=frame.empty,
    )


def _pick_saved(
    saved: SavedRuns,
    runs: Mapping[str, R],
    chosen: list[str] | None,
    key: str,
    what: str,
    label: Callable[[R], str],
    param: str,
) -> list[str]:
    """A multiselect of saved ``runs`` (newest first, the newest picked at first; names
    no longer saved dropped), the names in the URL's ``param``; returns the picked names."""
    names = list(runs)
    link = follow_list(param, one_of(names))
    if link.value is not None:
        chosen = link.value
        st.session_state[key] = chosen
    chosen = [n for n in (names[:1] if chosen is None else chosen) if n in runs]
    _keep_options(key, names)
    seed_widget(key, chosen)
    picked = st.multiselect(
        f"{what} ({_where(saved, names)}; yours first, each newest first; pick several to compare)",
        names,
        key=key,
        format_func=lambda n: label(runs[n]) + (" · shipped" if n in saved.shipped else ""),
    )
    publish(
        param,
        ",".join(picked),
        missing=link.missing,
        what="saved run",
        where=f"among the {what.lower()} saved here",
        instead=md(", ".join(picked) or "none"),
    )
    return list(picked)


def pick_runs(state: AppState, saved: SavedRuns) -> list[EvalRun]:
    """The run picker (newest first; several = compare)."""
    state.bench.runs = _pick_saved(
        saved, saved.runs, state.bench.runs, KEY_BENCH_RUNS, "Saved runs", run_label, P_RUN
    )
    return [saved.runs[n] for n in state.bench.runs]


def _series_name(run: EvalRun, r: DetectorResult, compare: bool) -> str:
    return f"{run.name} · {r.detector}" if compare else r.detector


def show_metrics(runs: Sequence[EvalRun]) -> None:
    """The metric table and what each run was."""
    st.subheader("Test metrics")
    for run in runs:
        if run.evidence:
            st.warning(f"**Too few answers** in {md(run.name)}: {md(run.evidence)}")
    table = metric_table(runs)
    st.dataframe(table, hide_index=True, width="stretch", height=_table_height(len(table)))
    st.caption(
        "Response level, on the test split; AUROC with a bootstrap 95% CI. Precision, recall, "
        "F1 and balanced accuracy use the threshold picked on the validation split. "
        f"`{MISSING}`: undefined (e.g. the test labels hold one class only, or the detector "
        "gives no token scores). One split's test part is small, so its intervals are wide: "
        "cross-validation (`ragscope evaluate --cv 5`) scores every answer of a dataset once, out of fold."
    )
    with st.expander("Run details: model, data, hashes, feature extraction", expanded=True):
        details = details_table(runs)
        # Tall enough for every row: the table is short and a scrollbar would hide the end.
        st.dataframe(details, width="stretch", height=_table_height(len(details)))


def show_curves(runs: Sequence[EvalRun]) -> None:
    """ROC and PR curves, one trace per detector (per run when comparing)."""
    st.subheader("ROC and precision-recall curves")
    compare = len(runs) > 1
    series = [
        ScoreSeries(
            name=_series_name(run, r, compare),
            labels=np.asarray(run.test_labels),
            scores=np.asarray(r.scores),
        )
        for run in runs
        for r in run.results
    ]
    left, right = st.columns(2)
    with left:
        plot(roc_figure(series), key="benchmark.roc")
    with right:
        plot(pr_figure(series), key="benchmark.pr")
    st.caption(
        "Positive = hallucinated. Dashed: chance (ROC) and the share of hallucinated "
        "test answers (PR), what a detector without skill scores."
    )


def show_breakdowns(state: AppState, runs: Sequence[EvalRun]) -> None:
    """AUROC or F1 per task and per generator, as grouped bars and tables."""
    st.subheader("Breakdowns")
    compare = len(runs) > 1
    seed_widget(KEY_BENCH_BREAKDOWN_METRIC, state.bench.breakdown_metric)
    state.bench.breakdown_metric = st.radio(
        "Bars show",
        BREAKDOWN_METRICS,
        key=KEY_BENCH_BREAKDOWN_METRIC,
        horizontal=True,
        help="F1 at each detector's validation threshold.",
    )
    cols = st.columns(2)
    for col, by in zip(cols, ("task", "generator"), strict=True):
        frames = []
        for run in runs:
            f = run.breakdown(by=by)  # type: ignore[arg-type]
            if compare:
                f["detector"] = [f"{run.name} · {d}" for d in f["detector"]]
            frames.append(f)
        frame = pd.concat(frames, ignore_index=True)
        with col:
            st.markdown(f"**Per {by}**")
            plot(
                breakdown_figure(frame, by, metric=state.bench.breakdown_metric),
                key=f"benchmark.breakdown.{by}",
            )
            st.dataframe(_breakdown_table(frame), hide_index=True, width="stretch")


def show_confusion(state: AppState, runs: Sequence[EvalRun]) -> None:
    """The confusion matrix and precision / recall / F1 at a threshold you move."""
    st.subheader("Confusion matrix at a threshold")
    compare = len(runs) > 1
    pairs: dict[str, tuple[EvalRun, DetectorResult]] = {
        f"{run.name}/{r.detector}": (run, r) for run in runs for r in run.results
    }
    if not pairs:
        st.info("The picked runs hold no detector results.")
        return
    if state.bench.confusion not in pairs:
        state.bench.confusion = next(iter(pairs))
    # Comparing runs names each option by its run too: a widget of its own, since the
    # browser keeps showing a kept option under the label it had before.
    box = KEY_BENCH_CONFUSION + (".compare" if compare else "")
    if st.session_state.get(box) not in pairs:
        st.session_state.pop(box, None)
    seed_widget(box, state.bench.confusion)
    c1, c2 = st.columns([1, 2], vertical_alignment="bottom")
    with c1:
        state.bench.confusion = st.selectbox(
            "Detector",
            list(pairs),
            key=box,
            format_func=lambda k: _series_name(*pairs[k], compare),
        )
    run, r = pairs[state.bench.confusion]
    y = np.asarray(run.test_labels)
    s = np.asarray(r.scores, dtype=np.float64)
    key = threshold_key(run.name, r.detector)
    lo = min(0.0, math.floor(float(s.min()))) if s.size else 0.0
    hi = max(1.0, math.ceil(float(s.max()))) if s.size else 1.0
    seed_widget(key, float(min(max(r.threshold, lo), hi)))
    with c2:
        t = float(
            st.slider(
                "Threshold (score ≥ threshold flags the answer as hallucinated)",
                min_value=lo,
                max_value=hi,
                step=0.001,
                format="%.3f",
                key=key,
                help=f"Starts at the threshold picked on the validation split, {r.threshold:.3f}.",
            )
        )
    m = response_metrics(y, s, t, n_boot=0)
    counts = confusion_counts(y, s, t)
    left, right = st.columns([3, 2], gap="large")
    with left:
        plot(confusion_figure(counts), key="benchmark.confusion")
    with right:
        at_val = r.metrics
        moved = not math.isclose(t, r.threshold, abs_tol=5e-4)
        tiles = st.columns(2) + st.columns(2)
        for tile, (label, name) in zip(
            tiles,
            (
                ("Precision", "precision"),
                ("Recall", "recall"),
                ("F1", "f1"),
                ("Balanced accuracy", "balanced_accuracy"),
            ),
            strict=True,
        ):
            v, v0 = m.get(name), at_val.get(name)
            delta = (
                f"{v - v0:+.3f} vs validation threshold"
                if moved and v is not None and v0 is not None
                else None
            )
            tile.metric(label, fmt(v), delta=delta)
    st.caption(
        f"At threshold {t:.3f}: TP {counts.tp} · FP {counts.fp} · TN {counts.tn} · "
        f"FN {counts.fn} of {counts.n} test answers (validation threshold {r.threshold:.3f})."
    )


# --------------------------------------------------------------------------- cross-validation


def cv_run_label(run: CVRun) -> str:
    """How a cross-validation is named in pickers: name, model, k, datasets, date."""
    return (
        f"{run.name} · {_model_name(run.model)} · {run.k}-fold on {' + '.join(run.datasets)}"
        f" · {_date(run.created_at)}"
    )


def pick_cv_runs(state: AppState, saved: SavedRuns) -> list[CVRun]:
    """The cross-validation picker (newest first; several = compare)."""
    state.bench.cv_runs = _pick_saved(
        saved,
        saved.cv,
        state.bench.cv_runs,
        KEY_BENCH_CV_RUNS,
        "Cross-validation runs",
        cv_run_label,
        P_CV,
    )
    return [saved.cv[n] for n in state.bench.cv_runs]


def show_cv_tables(runs: Sequence[CVRun]) -> None:
    """Per run: what it was, and its pooled out-of-fold metric table (CSV downloads)."""
    st.subheader("Out-of-fold metrics")
    for run in runs:
        st.markdown(f"**{md(run.name)}** · model {code(_model_name(run.model))}")
        st.caption(md(describe_cv(run)) + f" · created {md(_date(run.created_at))}.")
        for warn in filter(None, [run.evidence, *run.dataset_evidence.values()]):
            st.warning(f"**Too few answers** in {md(run.name)}: {md(warn)}")
        table = cv_metric_table(run)
        st.dataframe(table, hide_index=True, width="stretch", height=_table_height(len(table)))
        c1, c2 = st.columns(2)
        with c1:
            _download(
                "Metrics (CSV)",
                cv_frame(run),
                f"{_file_stem(run.name)}-metrics.csv",
                download_key("cv.metrics", run.name),
            )
        with c2:
            _download(
                "Out-of-fold scores per answer (CSV)",
                oof_frame(run),
                f"{_file_stem(run.name)}-scores.csv",
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
    _download(
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
        _download(
            "Paired differences (CSV)",
            comparison_frame(run),
            f"{_file_stem(run.name)}-paired.csv",
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
        _download(
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
        _download("Per dataset (CSV)", by_set, "cv-by-dataset.csv", download_key("cv.dataset"))


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
    _keep_options(KEY_BENCH_CV_RELIABILITY, options)
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
        _download(
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
    show_set_quality(shipped_detectors(get_model()))
    runs = pick_cv_runs(state, saved)
    if not runs:
        st.info("Pick one or more cross-validation runs above.")
        return
    show_cv_tables(runs)
    show_fold_spread(runs)
    show_comparisons(runs)
    show_cv_breakdowns(state, runs)
    show_reliability(state, runs)


# --------------------------------------------------------------------------- cross-domain


def matrix_run_label(run: MatrixRun) -> str:
    """How a matrix run is named in its picker: name, model, datasets, date."""
    return (
        f"{run.name} · {_model_name(run.model)} · {' × '.join(run.datasets)}"
        f" · {_date(run.created_at)}"
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
        state.bench.matrix_run = names[0]
    _keep_option(KEY_BENCH_MATRIX_RUN, names)
    state.bench.matrix_run = bind(
        P_MATRIX,
        KEY_BENCH_MATRIX_RUN,
        lambda: st.selectbox(
            f"Matrix run ({_where(saved, names)}; newest first)",
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
    _keep_option(KEY_BENCH_MATRIX_DETECTOR, detectors)
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
        f"{code(_model_name(run.model))}, diagonal {run.k}-fold, created "
        f"{md(_date(run.created_at))}); 95% CIs from a bootstrap over sources on hover and "
        "below. Empty cells: pairs not run."
    )
    st.dataframe(matrix_table(run, det, metric), width="stretch")
    _download(
        "Every cell of every detector (CSV)",
        matrix_frame(run),
        f"{_file_stem(run.name)}-matrix.csv",
        download_key("matrix", run.name),
    )


# --------------------------------------------------------------------------- page


TAB_TEST = "Held-out test runs"
TAB_CV = "Cross-validation"
TAB_MATRIX = "Cross-domain matrix"
TAB_CURVES = "Review learning curves"

# Detectors the reliability diagram draws until the user picks (more lines tangle): the
# run's overall judge alone when it has one, else its first three.
RELIABILITY_DEFAULT = 3


def main() -> None:
    state = app_state()
    model = get_model()
    st.title("Benchmark")
    st.caption(
        "How well each detector separates hallucinated from faithful answers, on held-out "
        "test data. Runs are saved by this page and by `ragscope evaluate`."
    )
    saved = saved_runs()
    if launch_form(state, model, expanded=not saved.runs):
        if launch_run(state, model) is not None:
            saved = saved_runs()
    for name, why in saved.unreadable:
        st.warning(f"Skipped {code(name)}: {md(why)}")
    if saved.empty:
        st.info(EMPTY_STATE)
        return
    sections = [
        (label, show)
        for label, show, there in (
            (TAB_TEST, show_test_runs, bool(saved.runs)),
            (TAB_CV, show_cv, bool(saved.cv)),
            (TAB_MATRIX, show_matrix, bool(saved.matrices)),
            (TAB_CURVES, show_review_curves, bool(saved.curves)),
        )
        if there
    ]
    # One tab per kind of run: the page shows one section at a time, not all at once.
    tabs = st.tabs([label for label, _ in sections]) if len(sections) > 1 else [st.container()]
    for tab, (_, show) in zip(tabs, sections, strict=True):
        with tab:
            show(state, saved)


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
    newest: dict[str, str] = {}
    for n in names:  # newest first: the first of each dataset
        newest.setdefault(saved.curves[n].dataset, n)
    _keep_options(KEY_BENCH_CURVE_RUNS, names)
    picked = st.multiselect(
        "Runs",
        names,
        default=list(newest.values()),
        key=KEY_BENCH_CURVE_RUNS,
        format_func=lambda n: f"{saved.curves[n].dataset} · {_date(saved.curves[n].created_at)}",
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


def show_test_runs(state: AppState, saved: SavedRuns) -> None:
    """The train / validation / test runs: pick, then metrics, curves, breakdowns, confusion."""
    if saved.cv or saved.matrices:
        st.header("Held-out test runs", anchor="held-out-test-runs")
    runs = pick_runs(state, saved)
    if not runs:
        st.info("Pick one or more saved runs above.")
        return
    show_metrics(runs)
    show_curves(runs)
    show_breakdowns(state, runs)
    show_confusion(state, runs)


main()
