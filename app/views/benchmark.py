"""Benchmark: how well each detector separates hallucinated from faithful answers.

Reads the evaluation runs saved in :func:`core.evaluation.evaluate.runs_dir` (by this page or
by ``ragscope evaluate``): the metric table with bootstrap CIs, ROC and
precision-recall curves, per-task and per-generator breakdowns, and a confusion
matrix at a threshold you move. Several runs can be picked to compare them. New
runs are launched here too, with progress; features come from the on-disk cache
when an example was analysed before, so a repeated run is quick.

Cross-validations (``ragscope evaluate --cv K`` / ``ragscope train --cv K``), cross-domain
matrices (``--matrix``) and review learning curves (``--review-curve``) each get a tab of
their own (:mod:`app.components.cv_sections`); the pickers of saved runs are
:mod:`app.components.run_picker`'s.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

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
from app.components.cv_sections import show_cv, show_matrix, show_review_curves
from app.components.cv_tables import MISSING, fmt, fmt_ci
from app.components.exports import plot
from app.components.run_picker import (
    date_label,
    model_name,
    pick_saved,
    table_height,
)
from app.components.set_quality import benchmark_subtitle, show_set_quality
from app.state.datasets import get_store
from app.state.detectors import detector_set
from app.state.links import P_RUN
from app.state.model import get_model
from app.state.runs import (
    CORPUS,
    KEY_BENCH_BREAKDOWN_METRIC,
    KEY_BENCH_CONFUSION,
    KEY_BENCH_DETECTORS,
    KEY_BENCH_LAUNCH,
    KEY_BENCH_LIMIT,
    KEY_BENCH_RUNS,
    KEY_BENCH_TEST,
    KEY_BENCH_TRAIN,
    SAME_DATASET,
    DatasetSummary,
    SavedRuns,
    dataset_summary,
    eval_dataset_choices,
    saved_runs,
    threshold_key,
)
from app.state.session import AppState, app_state, seed_widget
from app.text import code, md
from core.base.errors import RagscopeError
from core.base.paths import runs_dir
from core.base.words import plural
from core.data import make_splits
from core.detectors import runnable_detectors
from core.engine.model import LoadedModel
from core.evaluation.evaluate import DetectorResult, EvalRun, Splits, evaluate
from core.learning.metrics import ci_columns, confusion_counts, response_metrics
from core.pipeline.extract import FeatureCache

BREAKDOWN_METRICS: tuple[str, ...] = ("AUROC", "F1")
EMPTY_STATE = (
    "No saved runs yet. Launch one with **Launch a new run** above, or from a terminal: "
    "`ragscope evaluate --dataset builtin` (cross-validation: "
    "`ragscope evaluate --cv 5 --dataset builtin`)."
)


# --------------------------------------------------------------------------- formatting


def run_label(run: EvalRun) -> str:
    """How a run is named in pickers: name, model, train -> test, date."""
    return (
        f"{run.name} · {model_name(run.model)} · {run.train_dataset} → {run.test_dataset}"
        f" · {date_label(run.created_at)}"
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
            date_label(run.created_at),
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
    st.caption(
        f"{s.n} {plural(s.n, 'example')}: {s.n_hallucinated} hallucinated, "
        f"{s.n_faithful} faithful{unl}."
    )
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
                of = f"{done} / {total} {plural(total, 'example')}"
                text = f"Features: {of}" + ("" if done < total else " · fitting and scoring…")
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
    computed = ex.get("computed")
    examples = plural(computed, "example") if isinstance(computed, int) else "examples"
    st.success(
        f"Saved **{md(run.name)}** to {code(json_path)} ({computed} {examples} computed, "
        f"{ex.get('cache_hits')} from the feature cache); it is selected below."
    )
    return run


# --------------------------------------------------------------------------- saved runs


def pick_runs(state: AppState, saved: SavedRuns) -> list[EvalRun]:
    """The run picker (newest first; several = compare)."""
    state.bench.runs = pick_saved(
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
    st.dataframe(table, hide_index=True, width="stretch", height=table_height(len(table)))
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
        st.dataframe(details, width="stretch", height=table_height(len(details)))


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


# --------------------------------------------------------------------------- page


TAB_SET = "Loaded set"
TAB_TEST = "Held-out test runs"
TAB_CV = "Cross-validation"
TAB_MATRIX = "Cross-domain matrix"
TAB_CURVES = "Review learning curves"


def main() -> None:
    state = app_state()
    model = get_model()
    st.title("Benchmark")
    st.caption(benchmark_subtitle(detector_set(model)))
    saved = saved_runs()
    if launch_form(state, model, expanded=not saved.runs):
        if launch_run(state, model) is not None:
            saved = saved_runs()
    for name, why in saved.unreadable:
        st.warning(f"Skipped {code(name)}: {md(why)}")
    sections = [
        (label, show)
        for label, show, there in (
            (TAB_SET, show_loaded_set, True),
            (TAB_TEST, show_test_runs, bool(saved.runs)),
            (TAB_CV, show_cv, bool(saved.cv)),
            (TAB_MATRIX, show_matrix, bool(saved.matrices)),
            (TAB_CURVES, show_review_curves, bool(saved.curves)),
        )
        if there
    ]
    # One tab per kind of run: the page shows one section at a time, not all at once; it
    # opens on the numbers that describe the loaded set, older runs a click away.
    tabs = st.tabs([label for label, _ in sections]) if len(sections) > 1 else [st.container()]
    for tab, (_, show) in zip(tabs, sections, strict=True):
        with tab:
            show(state, saved)


def show_loaded_set(state: AppState, saved: SavedRuns) -> None:
    """The loaded set's quality card (:mod:`app.components.set_quality`)."""
    show_set_quality(detector_set(get_model()))
    if saved.empty:
        st.info(EMPTY_STATE)


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
