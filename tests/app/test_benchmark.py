"""The Benchmark page (AppTest, tiny model) and its chart builders (pure functions).

Cross-validation and cross-domain matrix runs are made by the real code
(:func:`core.evaluation.crossval.cross_validate`, :func:`core.evaluation.matrix.domain_matrix`) on the tiny
model and a stratified slice of the built-in corpus, once per module.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest
from sklearn.metrics import average_precision_score, roc_auc_score
from streamlit.testing.v1 import AppTest

from app.components.charts import (
    ScoreSeries,
    breakdown_figure,
    confusion_figure,
    plain,
    pr_figure,
    roc_figure,
    roc_points,
)
from app.components.cv_charts import matrix_figure, reliability_figure
from app.components.cv_tables import breakdown_frame, cv_metric_table
from app.components.set_quality import benchmark_subtitle
from app.state.runs import (
    KEY_BENCH_CONFUSION,
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
    KEY_BENCH_TRAIN,
    dataset_summary,
    threshold_key,
)
from app.state.session import STATE_KEY
from app.text import md
from core.base.examples import RAGExample, source_key
from core.data import load_builtin, stratified_head
from core.engine.model import LoadedModel
from core.evaluation.crossval import CVOptions, cross_validate
from core.evaluation.cv_run import CVRun
from core.evaluation.evaluate import DetectorResult, EvalRun
from core.evaluation.matrix import MatrixRun, domain_matrix
from core.learning.metrics import SPAN_F1_NOTE, confusion_counts, response_metrics
from core.pipeline.extract import FeatureCache
from core.pipeline.sets import DetectorSet, load_set
from core.storage import Store

BENCHMARK = "views/benchmark.py"
RUN_NAME = "synthetic-run"
DETECTORS = ("nll", "lexical")
TASKS = ("qa", "summary", "data2txt")
GENERATORS = ("gen-a", "gen-b")


def synthetic_run(
    name: str = RUN_NAME, *, n: int = 40, seed: int = 0, one_class: bool = False
) -> EvalRun:
    """A saved-run-shaped result: 2 detectors with seeded random scores that lean right."""
    rng = np.random.default_rng(seed)
    y = np.zeros(n, dtype=int) if one_class else rng.permutation(np.arange(n) % 2)
    results = []
    for k, det in enumerate(DETECTORS):
        s = np.clip(0.35 + (0.25 - 0.1 * k) * y + rng.normal(0, 0.18, n), 0, 1).round(4)
        threshold = 0.47 + 0.02 * k
        results.append(
            DetectorResult(
                detector=det,
                config_hash=f"cfg{k}",
                threshold=threshold,
                metrics=response_metrics(y, s, threshold, n_boot=200),
                token_metrics=None if k else {"n_tokens": 900, "ap": 0.41, "auroc": 0.66},
                validation_metrics=None,
                scores=tuple(float(v) for v in s),
            )
        )
    return EvalRun(
        name=name,
        created_at="2026-01-02T03:04:05+00:00",
        model="tiny-random-llama (seed 0)|L2xH4/KV2|D64|V49152|float32",
        train_dataset="synthetic",
        test_dataset="synthetic",
        data_hashes={"train": "aaaa1111", "validation": "bbbb2222", "test": "cccc3333"},
        split_sizes={"train": 180, "validation": 40, "test": n},
        test_ids=tuple(f"t{i}" for i in range(n)),
        test_labels=tuple(int(v) for v in y),
        test_tasks=tuple(TASKS[i % 3] for i in range(n)),
        test_generators=tuple(GENERATORS[i % 2] for i in range(n)),
        results=tuple(results),
        extraction={
            "computed": 200,
            "cache_hits": 60,
            "n_errors": 0,
            "seconds": 30.0,
            "examples_per_minute": 520.0,
        },
    )


# --------------------------------------------------------------------------- app fixtures


@pytest.fixture
def runs_dir(
    app_env: Path, app_cache_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Path:
    """A fresh cache dir per test (so a fresh, empty runs dir), sharing the model cache."""
    cache = tmp_path / "cache"
    cache.mkdir()
    models = app_cache_dir / "models"
    models.mkdir(exist_ok=True)
    (cache / "models").symlink_to(models, target_is_directory=True)
    monkeypatch.setenv("RAGSCOPE_CACHE_DIR", str(cache))
    return cache / "runs"


def _no_exception(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]


def _text(at: AppTest) -> str:
    return "\n".join([m.value for m in at.markdown] + [c.value for c in at.caption])


def _charts(at: AppTest) -> dict[str, dict]:
    """Plotly figures on the page by their element key's tail (``roc``, ``pr``, ...)."""
    out = {}
    for el in at.get("plotly_chart"):
        spec = json.loads(el.proto.spec)
        out[el.proto.id.rsplit("benchmark.", 1)[-1].split("-")[0]] = spec
    return out


def _benchmark(make_app: Callable[[], AppTest]) -> AppTest:
    at = make_app().run()
    at.switch_page(BENCHMARK).run()
    _no_exception(at)
    return at


def _confusion_caption(at: AppTest) -> dict[str, int]:
    cap = next(c.value for c in at.caption if c.value.startswith("At threshold"))
    return {k.lower(): int(v) for k, v in re.findall(r"\b(TP|FP|TN|FN) (\d+)", cap)}


# --------------------------------------------------------------------------- page


def test_saved_run_shows_table_curves_breakdowns_and_confusion(
    make_app: Callable[[], AppTest], runs_dir: Path
) -> None:
    run = synthetic_run()
    run.save(runs_dir)
    at = _benchmark(make_app)
    assert at.title[0].value == "Benchmark"
    assert at.multiselect(key=KEY_BENCH_RUNS).value == [RUN_NAME]  # newest is picked

    table = at.dataframe[0].value
    assert list(table["detector"]) == list(DETECTORS)
    nll = table.iloc[0]
    m = run.results[0].metrics
    assert nll["AUROC"] == f"{m['auroc']:.3f}"
    lo, hi = m["auroc_ci"]
    assert nll["AUROC 95% CI"] == f"[{lo:.3f}, {hi:.3f}]"
    assert nll["token AP"] == "0.410"
    assert table.iloc[1]["token AP"] == "-"  # lexical gave no token scores here

    details = at.dataframe[1].value
    assert details.loc["model", RUN_NAME].startswith("tiny-random-llama")
    assert details.loc["data hashes train / validation / test", RUN_NAME] == (
        "aaaa1111 / bbbb2222 / cccc3333"
    )
    assert details.loc["examples / min", RUN_NAME] == "520.0"
    assert "60 from cache" in details.loc["feature extraction", RUN_NAME]

    charts = _charts(at)
    assert set(charts) == {"roc", "pr", "breakdown.task", "breakdown.generator", "confusion"}
    roc_names = [t["name"] for t in charts["roc"]["data"]]
    y = np.asarray(run.test_labels)
    for r in run.results:
        assert f"{r.detector} (AUROC {roc_auc_score(y, r.scores):.3f})" in roc_names
    pr_names = [t["name"] for t in charts["pr"]["data"]]
    assert "prevalence (0.500)" in pr_names
    assert f"nll (AP {average_precision_score(y, run.results[0].scores):.3f})" in pr_names

    by_task = at.dataframe[2].value
    assert set(by_task["task"]) == set(TASKS)
    assert len(by_task) == len(TASKS) * len(DETECTORS)
    assert set(at.dataframe[3].value["generator"]) == set(GENERATORS)

    # The confusion matrix starts at nll's validation threshold.
    expected = run.results[0].metrics["confusion"]
    assert _confusion_caption(at) == expected
    z = charts["confusion"]["data"][0]["z"]
    assert z == [[expected["tp"], expected["fn"]], [expected["fp"], expected["tn"]]]


def test_moving_the_threshold_recomputes_the_confusion_matrix(
    make_app: Callable[[], AppTest], runs_dir: Path
) -> None:
    run = synthetic_run()
    run.save(runs_dir)
    at = _benchmark(make_app)
    at.selectbox(key=KEY_BENCH_CONFUSION).set_value(f"{RUN_NAME}/lexical").run()
    key = threshold_key(RUN_NAME, "lexical")
    assert at.slider(key=key).value == pytest.approx(run.results[1].threshold)
    y = np.asarray(run.test_labels)
    s = np.asarray(run.results[1].scores)
    before = _confusion_caption(at)
    for t in (0.3, 0.62):
        at.slider(key=key).set_value(t).run()
        _no_exception(at)
        expected = response_metrics(y, s, t, n_boot=0)
        assert _confusion_caption(at) == expected["confusion"]
        z = _charts(at)["confusion"]["data"][0]["z"]
        c = expected["confusion"]
        assert z == [[c["tp"], c["fn"]], [c["fp"], c["tn"]]]
        metrics = {el.label: el.value for el in at.metric}
        assert metrics["Precision"] == f"{expected['precision']:.3f}"
        assert metrics["Recall"] == f"{expected['recall']:.3f}"
        assert metrics["F1"] == f"{expected['f1']:.3f}"
        assert _confusion_caption(at) != before


def test_comparing_two_runs_and_a_one_class_run(
    make_app: Callable[[], AppTest], runs_dir: Path
) -> None:
    synthetic_run().save(runs_dir)
    synthetic_run("one-class", seed=1, one_class=True).save(runs_dir)
    at = _benchmark(make_app)
    at.multiselect(key=KEY_BENCH_RUNS).set_value(["one-class", RUN_NAME]).run()
    _no_exception(at)
    table = at.dataframe[0].value
    assert list(table["run"]) == ["one-class", "one-class", RUN_NAME, RUN_NAME]
    one = table[table["run"] == "one-class"]
    assert set(one["AUROC"]) == {"-"} and set(one["AUROC 95% CI"]) == {"-"}
    # The one-class run says so above the table (the same words as its markdown).
    warned = [w.value for w in at.warning if "Too few answers" in w.value]
    assert len(warned) == 1 and "one-class" in warned[0] and "all faithful" in warned[0]
    roc = _charts(at)["roc"]
    names = [t["name"] for t in roc["data"]]
    assert any(n.startswith(f"{RUN_NAME} · nll (AUROC ") for n in names)
    assert not any(n.startswith("one-class") for n in names)
    assert "one class only" in roc["layout"]["annotations"][0]["text"]


def test_launch_a_run_on_the_demo_set_saves_and_shows_it(
    make_app: Callable[[], AppTest], runs_dir: Path
) -> None:
    at = _benchmark(make_app)
    assert any("No saved runs yet" in i.value for i in at.info)
    assert at.selectbox(key=KEY_BENCH_TRAIN).value == "demo"
    at.multiselect(key=KEY_BENCH_DETECTORS).set_value(["nll", "lexical"])
    at.number_input(key=KEY_BENCH_LIMIT).set_value(12)
    at.button(key=KEY_BENCH_LAUNCH).click().run()
    _no_exception(at)
    assert not at.error, [e.value for e in at.error]
    saved = sorted(runs_dir.glob("*.json"))
    assert len(saved) == 1
    run = EvalRun.load(saved[0])
    assert [r.detector for r in run.results] == ["nll", "lexical"]
    assert run.train_dataset == "demo" and run.split_sizes["test"] > 0
    assert any(run.name in s.value for s in at.success)
    assert at.multiselect(key=KEY_BENCH_RUNS).value == [run.name]
    assert at.session_state[STATE_KEY].bench.runs == [run.name]
    assert list(at.dataframe[0].value["detector"]) == ["nll", "lexical"]
    assert "roc" in _charts(at)

    # A rerun keeps the new run picked; a repeat run takes its features from the cache.
    at.button(key=KEY_BENCH_LAUNCH).click().run()
    _no_exception(at)
    again = EvalRun.load(sorted(runs_dir.glob("*.json"), key=lambda p: p.stat().st_mtime)[-1])
    assert again.extraction["cache_hits"] == 12


def test_unavailable_corpus_is_an_error_not_an_exception(
    make_app: Callable[[], AppTest], runs_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from core.base.errors import DataError

    def missing(*args: object, **kwargs: object) -> list:
        raise DataError("the built-in corpus is missing")

    monkeypatch.setattr("core.data.catalog.load_builtin", missing)
    dataset_summary.clear()  # a summary of the real corpus may be cached already
    at = _benchmark(make_app)
    at.selectbox(key=KEY_BENCH_TRAIN).set_value("builtin").run()
    _no_exception(at)
    assert any("not available yet" in e.value for e in at.error)
    assert at.button(key=KEY_BENCH_LAUNCH).disabled


def test_empty_runs_dir_shows_how_to_make_a_run(
    make_app: Callable[[], AppTest], runs_dir: Path
) -> None:
    at = _benchmark(make_app)
    info = " ".join(i.value for i in at.info)
    assert "No saved runs yet" in info
    assert "ragscope evaluate --dataset builtin" in info
    assert not at.get("plotly_chart")
    assert not at.dataframe


def test_the_benchmark_opens_on_the_loaded_sets_card(
    make_app: Callable[[], AppTest], runs_dir: Path, with_demo_detectors: Path, tiny_model
) -> None:
    synthetic_run().save(runs_dir)  # an older run: one tab away, not what the page opens on
    at = _benchmark(make_app)
    dset = load_set(tiny_model.info.key)
    assert at.tabs[0].label == "Loaded set"
    first = at.tabs[0]
    assert [s.value for s in first.subheader] == [f"The {dset.name} set, as it judges answers"]
    # The demo detectors record no cross-validation: said, and each one's number is shown
    # with what it was measured on.
    assert any("No cross-validation describes" in i.value for i in first.info)
    (members,) = [d.value for d in first.dataframe]
    assert list(members["detector"]) == list(dset.names)
    assert members["recorded AUROC"].tolist() == pytest.approx(
        [c.auroc for c in dset.detectors], nan_ok=True
    )
    assert list(members["measured on"]) == [c.auroc_from or "not recorded" for c in dset.detectors]


# --------------------------------------------------------------------------- charts


def _series(seed: int = 0, n: int = 60) -> ScoreSeries:
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, n)
    return ScoreSeries(name="det", labels=y, scores=rng.random(n) + 0.3 * y)


def test_roc_curve_runs_from_origin_to_one_and_legend_has_sklearn_auroc() -> None:
    s = _series()
    c = roc_points(s)
    assert c is not None
    assert (c.x[0], c.y[0]) == (0.0, 0.0)
    assert (c.x[-1], c.y[-1]) == (1.0, 1.0)
    assert np.all(np.diff(c.x) >= 0) and np.all(np.diff(c.y) >= 0)
    auroc = roc_auc_score(s.labels, s.scores)
    assert c.area == pytest.approx(auroc)
    fig = roc_figure([s])
    names = [t.name for t in fig.data]
    assert names == ["chance (0.5)", f"det (AUROC {auroc:.3f})"]
    assert list(fig.data[0].x) == [0, 1] and list(fig.data[0].y) == [0, 1]


def test_pr_figure_has_ap_and_the_prevalence_line() -> None:
    s = _series(seed=3)
    fig = pr_figure([s])
    ap = average_precision_score(s.labels, s.scores)
    prev = s.labels.mean()
    assert [t.name for t in fig.data] == [f"prevalence ({prev:.3f})", f"det (AP {ap:.3f})"]
    assert list(fig.data[0].y) == pytest.approx([prev, prev])


def test_one_class_series_draws_no_curve_but_says_why() -> None:
    s = ScoreSeries(name="flat", labels=np.zeros(5, dtype=int), scores=np.linspace(0, 1, 5))
    assert roc_points(s) is None
    for fig in (roc_figure([s]), pr_figure([s])):
        assert not any(t.name and t.name.startswith("flat") for t in fig.data)
        assert "flat" in fig.layout.annotations[0].text


def test_curve_legends_escape_names_from_saved_runs() -> None:
    """A run or detector name is shown as text: no link, no markup, no hover placeholder."""
    name = 'run <a href="http://e.test">x</a> %{x}'
    s = dataclasses.replace(_series(), name=name)
    for fig in (roc_figure([s]), pr_figure([s])):
        t = fig.data[-1]
        assert t.name.startswith("run &lt;a href=")
        assert (
            "<a" not in t.name and name not in t.hovertemplate and "e.test" not in t.hovertemplate
        )
    flat = ScoreSeries(name="<b>flat</b>", labels=np.zeros(5, dtype=int), scores=np.ones(5))
    assert "&lt;b&gt;flat" in roc_figure([flat]).layout.annotations[0].text


def test_series_shapes_must_match() -> None:
    with pytest.raises(ValueError, match="must be equal"):
        ScoreSeries(name="bad", labels=np.zeros(3), scores=np.zeros(4))


def test_confusion_counts_match_response_metrics_and_the_figure() -> None:
    y = np.array([1, 1, 1, 0, 0, 0, 0, 1])
    s = np.array([0.9, 0.6, 0.2, 0.7, 0.1, 0.5, 0.3, 0.5])
    c = confusion_counts(y, s, 0.5)
    assert (c.tp, c.fp, c.tn, c.fn) == (3, 2, 2, 1)  # score == threshold flags
    assert vars(c) == response_metrics(y, s, 0.5, n_boot=0)["confusion"]
    assert c.n == len(y)
    fig = confusion_figure(c)
    assert np.asarray(fig.data[0].z).tolist() == [[3, 1], [2, 2]]
    assert list(fig.data[0].y) == ["hallucinated", "faithful"]  # rows: actual


def test_breakdown_figure_groups_bars_by_detector_with_gaps_for_undefined() -> None:
    run = synthetic_run()
    frame = run.breakdown(by="task")
    frame.loc[0, "AUROC"] = None
    fig = breakdown_figure(frame, "task")
    assert [t.name for t in fig.data] == list(DETECTORS)
    assert list(fig.data[0].x) == sorted(TASKS)
    first = dict(zip(fig.data[0].x, fig.data[0].y, strict=True))
    assert first[frame.loc[0, "task"]] is None
    assert fig.layout.barmode == "group"
    # Labels that do not fit their bar are hidden, never printed over each other.
    assert fig.layout.uniformtext.mode == "hide" and fig.layout.uniformtext.minsize >= 8
    assert {t.textangle for t in fig.data} == {0}


def test_shipped_runs_are_listed_after_local_ones_and_shadowed_by_name(
    make_app: Callable[[], AppTest],
    runs_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    shipped = tmp_path / "shipped-runs"
    synthetic_run("shipped-b", seed=3).save(shipped)
    synthetic_run("shipped-a", seed=4).save(shipped)
    synthetic_run("mine", seed=5).save(shipped)  # shadowed by the local run of that name
    monkeypatch.setenv("RAGSCOPE_SHIPPED_RUNS_DIR", str(shipped))
    local = synthetic_run("mine", seed=6)
    local.save(runs_dir)
    at = _benchmark(make_app)
    picker = at.multiselect(key=KEY_BENCH_RUNS)
    opts = list(picker.options)
    assert [o.split(" · ")[0] for o in opts] == ["mine", "shipped-a", "shipped-b"]
    assert [o.endswith(" · shipped") for o in opts] == [False, True, True]
    assert picker.value == ["mine"]  # the local, newest run is picked first
    assert "1 in" in picker.label and "2 shipped with ragscope" in picker.label
    # The local run wins over the shipped one of the same name.
    table = at.dataframe[0].value
    assert table.iloc[0]["AUROC"] == f"{local.results[0].metrics['auroc']:.3f}"


def test_runs_are_listed_newest_first_by_the_time_they_record(
    make_app: Callable[[], AppTest],
    runs_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """In a fresh clone every shipped file has the same date: the order comes from each
    run's own creation time, this machine's runs first, each part newest first."""
    shipped = tmp_path / "shipped-runs"
    for name, month in (("a-old", 1), ("b-newest", 3), ("c-middle", 2)):
        run = dataclasses.replace(
            synthetic_run(name), created_at=f"2026-0{month}-01T00:00:00+00:00"
        )
        run.save(shipped)
    monkeypatch.setenv("RAGSCOPE_SHIPPED_RUNS_DIR", str(shipped))
    for name, month in (("z-mine-old", 4), ("y-mine-new", 5)):
        run = dataclasses.replace(
            synthetic_run(name), created_at=f"2026-0{month}-01T00:00:00+00:00"
        )
        run.save(runs_dir)
    at = _benchmark(make_app)
    picker = at.multiselect(key=KEY_BENCH_RUNS)
    assert [o.split(" · ")[0] for o in picker.options] == [
        "y-mine-new",
        "z-mine-old",
        "b-newest",
        "c-middle",
        "a-old",
    ]
    assert picker.value == ["y-mine-new"] and "newest first" in picker.label


# --------------------------------------------------------------------------- cross-validation

CV_DETECTORS = ("nll", "lexical")
CV_NAME = "cv-tiny"
MATRIX_NAME = "matrix-tiny"


def _by_task(examples: list[RAGExample], *, generators: tuple[str, ...]) -> dict[str, list]:
    """The examples as one dataset per task (as if read from three files); the generator
    alternates by source over ``generators``."""
    sources = sorted({source_key(e) for e in examples})
    out: dict[str, list[RAGExample]] = {}
    for e in examples:
        gen = generators[sources.index(source_key(e)) % len(generators)]
        prov = dataclasses.replace(e.provenance, dataset=e.task, generator=gen, split=None)
        out.setdefault(e.task, []).append(dataclasses.replace(e, provenance=prov))
    return out


@pytest.fixture(scope="module")
def crossval_runs(tiny_model: LoadedModel, one_torch_thread: None) -> tuple[CVRun, MatrixRun]:
    """A 3-fold cross-validation over three datasets with two generators, and a
    cross-domain matrix over the same three (features extracted once)."""
    examples = stratified_head(load_builtin(), 90)
    with Store(":memory:") as store:
        cache = FeatureCache(store)
        parts = _by_task(examples, generators=GENERATORS)
        cv = cross_validate(
            tiny_model,
            CV_DETECTORS,
            [e for p in parts.values() for e in p],
            # the page, not the calibration, is under test (and fast)
            CVOptions(k=3, n_boot=50, name=CV_NAME, calibration="split"),
            cache=cache,
        )
        # One generator: the diagonal's 2-fold cross-validations need strata that big.
        matrix = domain_matrix(
            tiny_model,
            CV_DETECTORS,
            _by_task(examples, generators=GENERATORS[:1]),
            CVOptions(k=2, n_boot=30, name=MATRIX_NAME, calibration="split"),
            cache=cache,
        )
    return cv, matrix


def _none_for_nan(values: object) -> list[float | None]:
    return [None if v is None or math.isnan(float(v)) else float(v) for v in values]  # type: ignore[attr-defined]


def _trace(spec: dict, name_start: str) -> dict:
    return next(t for t in spec["data"] if str(t.get("name", "")).startswith(name_start))


def _download_labels(at: AppTest) -> list[str]:
    return [el.proto.label for el in at.get("download_button")]


def _check_cv_table(at: AppTest, cv: CVRun, text: str) -> None:
    """The CV run's metric table, value for value: a static table, every detector and
    metric in view (as a grid this wide it scrolled sideways)."""
    table = at.table[0].value
    assert list(table["detector"]) == list(CV_DETECTORS)
    for (_, row), r in zip(table.iterrows(), cv.results, strict=True):
        p = r.pooled
        assert row["AUROC"] == f"{p['auroc']:.3f}"
        assert row["AUROC 95% CI"] == f"[{p['auroc_ci'][0]:.3f}, {p['auroc_ci'][1]:.3f}]"
        assert row["AUROC length-matched"] == f"{p['auroc_length_matched']:.3f}"
        mean, sd = r.spread()
        assert row["folds mean ± sd"] == f"{mean:.3f} ± {sd:.3f}"
        assert row["AP"] == f"{p['ap']:.3f}"
        assert row["AP 95% CI"] == f"[{p['ap_ci'][0]:.3f}, {p['ap_ci'][1]:.3f}]"
        assert row["balanced acc"] == f"{p['balanced_accuracy']:.3f}"
        assert row["F1"] == f"{p['f1']:.3f}"
        assert row["ECE"] == f"{p['ece']:.3f}"
        assert row["token AP"] == f"{r.token['ap']:.3f}"
        assert row["token AUROC"] == f"{r.token['auroc']:.3f}"
        sp = r.spans
        assert row["span P/R/F1 (char)"] == (
            "-" if sp is None else f"{sp['precision']:.3f} / {sp['recall']:.3f} / {sp['f1']:.3f}"
        )
    assert cv.result("nll").spans is not None  # nll scores tokens: its spans are measured
    assert SPAN_F1_NOTE in text


def _check_spread_and_comparisons(at: AppTest, charts: dict, cv: CVRun) -> None:
    # Fold spread: each fold's AUROC on its detector's row, the pooled AUROC with its CI.
    spread = charts["cv.spread"]
    folds, pooled = _trace(spread, "AUROC of each fold"), _trace(spread, "pooled")
    assert pooled["y"] == list(CV_DETECTORS)
    for i, r in enumerate(cv.results):
        xs = [x for x, y in zip(folds["x"], folds["y"], strict=True) if y == r.detector]
        assert xs == pytest.approx([f["auroc"] for f in r.folds])
        lo, hi = r.pooled["auroc_ci"]
        assert pooled["x"][i] == pytest.approx(r.pooled["auroc"])
        assert pooled["error_x"]["array"][i] == pytest.approx(hi - r.pooled["auroc"])
        assert pooled["error_x"]["arrayminus"][i] == pytest.approx(r.pooled["auroc"] - lo)

    # Paired differences: each detector against the best one and against answer length.
    comp = charts["cv.compare.0"]
    best = cv.comparisons["reference"]
    vs_best = _trace(comp, f"Δ AUROC vs the best detector ({best})")
    vs_len = _trace(comp, "Δ AUROC vs answer length")
    assert vs_best["y"] == vs_len["y"] == list(CV_DETECTORS)
    # Side by side within a detector's row, not drawn over each other.
    assert comp["layout"]["scattermode"] == "group"
    assert vs_best["offsetgroup"] != vs_len["offsetgroup"]
    for i, d in enumerate(CV_DETECTORS):
        row = cv.comparisons["rows"][d]
        if d == best:
            assert vs_best["x"][i] is None
        else:
            assert vs_best["x"][i] == pytest.approx(row["vs_best"]["delta"])
        lo, hi = row["vs_length"]["ci"]
        assert vs_len["x"][i] == pytest.approx(row["vs_length"]["delta"])
        assert vs_len["error_x"]["arrayminus"][i] == pytest.approx(row["vs_length"]["delta"] - lo)
    paired = next(
        t.value for t in at.dataframe if any("vs answer length" in c for c in t.value.columns)
    )
    assert list(paired["detector"]) == list(CV_DETECTORS)


def _check_matrix(at: AppTest, charts: dict, matrix: MatrixRun) -> None:
    # The cross-domain heatmap: z is the run's own training x test table.
    heat = charts["matrix"]["data"][0]
    assert heat["type"] == "heatmap"
    assert heat["x"] == list(matrix.datasets) and heat["y"] == matrix.rows()
    assert heat["z"] == [_none_for_nan(row) for row in matrix.frame("nll", "auroc").to_numpy()]
    assert any(v is None for row in heat["z"] for v in row)  # pairs not run stay blank
    assert "" in {c for row in heat["text"] for c in row}
    shown = at.dataframe[-1].value
    assert list(shown.columns) == list(matrix.datasets)
    c = matrix.cells["nll"]["qa"]["summary"]
    lo, hi = c["auroc_ci"]
    assert shown.loc["qa", "summary"] == f"{c['auroc']:.3f} [{lo:.3f}, {hi:.3f}]"
    assert shown.loc["all but qa", "summary"] == ""


def test_cv_and_matrix_runs_show_their_sections(
    make_app: Callable[[], AppTest], runs_dir: Path, crossval_runs: tuple[CVRun, MatrixRun]
) -> None:
    cv, matrix = crossval_runs
    cv.save(runs_dir)
    matrix.save(runs_dir)
    at = _benchmark(make_app)
    headers = [h.value for h in at.header]
    assert headers == ["Cross-validation", "Cross-domain matrix"]  # no test runs: no section
    assert not any("No saved runs yet" in i.value for i in at.info)
    assert at.multiselect(key=KEY_BENCH_CV_RUNS).value == [CV_NAME]
    assert at.selectbox(key=KEY_BENCH_MATRIX_RUN).value == MATRIX_NAME

    # The run's description and its metric table, value for value.
    text = _text(at)
    assert f"3-fold source-grouped cross-validation on {md('data2txt, qa, summary')}" in text
    assert f"{len(cv.labels)} answers, {sum(cv.labels)} hallucinated" in text
    assert md(f"answer length alone: AUROC {cv.baseline['answer_length']['auroc']:.3f}") in text
    assert not cv.evidence and not cv.dataset_evidence
    assert not any("Too few answers" in w.value for w in at.warning)
    _check_cv_table(at, cv, text)
    charts = _charts(at)
    assert {"cv.spread", "cv.generator", "cv.dataset", "cv.reliability", "matrix"} <= set(charts)

    _check_spread_and_comparisons(at, charts, cv)

    # Per generator and per dataset: one bar trace per detector.
    gens = charts["cv.generator"]
    assert [t["name"] for t in gens["data"]] == list(CV_DETECTORS)
    for t, r in zip(gens["data"], cv.results, strict=True):
        assert t["x"] == sorted(r.by_generator) == sorted(GENERATORS)
        assert t["y"] == _none_for_nan(r.by_generator[g]["auroc"] for g in t["x"])
    sets = charts["cv.dataset"]
    assert sets["data"][0]["x"] == ["data2txt", "qa", "summary"]
    assert sets["layout"]["yaxis"]["title"]["text"] == "AUROC"

    # The reliability diagram: every detector of the run by default, its bins as points.
    assert at.multiselect(key=KEY_BENCH_CV_RELIABILITY).value == [
        f"{CV_NAME}/{d}" for d in CV_DETECTORS
    ]
    rel = charts["cv.reliability"]
    assert _trace(rel, "perfectly calibrated")["x"] == [0, 1]
    for r in cv.results:
        t = _trace(rel, f"{r.detector} (ECE {r.reliability.ece:.3f})")
        assert t["x"] == _none_for_nan(r.reliability.mean_predicted)
        assert t["y"] == _none_for_nan(r.reliability.observed)
        sizes = t["marker"]["size"]
        assert [s > 0 for s in sizes] == [c > 0 for c in r.reliability.counts]

    _check_matrix(at, charts, matrix)

    labels = _download_labels(at)
    for label in (
        "Metrics (CSV)",
        "Out-of-fold scores per answer (CSV)",
        "Per-fold metrics (CSV)",
        "Per generator (CSV)",
        "Per dataset (CSV)",
        "Reliability bins (CSV)",
        "Paired differences (CSV)",
        "Every cell of every detector (CSV)",
    ):
        assert label in labels


def test_the_per_dataset_auroc_bars_carry_their_confidence_intervals(
    make_app: Callable[[], AppTest], runs_dir: Path, crossval_runs: tuple[CVRun, MatrixRun]
) -> None:
    """Each dataset's AUROC bar has its source-grouped 95% interval as an error bar, read
    from the run (not recomputed by the page)."""
    cv, _ = crossval_runs
    cv.save(runs_dir)
    at = _benchmark(make_app)
    at.radio(key=KEY_BENCH_CV_DATASET_METRIC).set_value("AUROC").run()
    _no_exception(at)
    lexical = cv.result("lexical")
    t = next(t for t in _charts(at)["cv.dataset"]["data"] if t["name"] == "lexical")
    for x, y, up, down in zip(
        t["x"], t["y"], t["error_y"]["array"], t["error_y"]["arrayminus"], strict=True
    ):
        lo, hi = lexical.by_dataset[x]["auroc_ci"]
        assert y + up == pytest.approx(hi) and y - down == pytest.approx(lo)
    assert "95% CI" in t["hovertemplate"]


def test_a_malformed_interval_in_a_run_file_reads_as_none(
    crossval_runs: tuple[CVRun, MatrixRun],
) -> None:
    """A run file's per-dataset interval that is not two numbers (hand-edited, or from
    elsewhere) shows as no interval, never as an error."""
    cv, _ = crossval_runs
    r = cv.result("lexical")
    name = next(iter(r.by_dataset))
    for bad in (7, [0.5], "ab", None):
        broken = dataclasses.replace(
            r, by_dataset={**r.by_dataset, name: {**r.by_dataset[name], "auroc_ci": bad}}
        )
        run = dataclasses.replace(cv, results=(broken,))
        row = breakdown_frame([run], "dataset").set_index("dataset").loc[name]
        assert row["AUROC 95% CI low"] is None or row["AUROC 95% CI low"] != row["AUROC 95% CI low"]
        assert row["AUROC"] == pytest.approx(r.by_dataset[name]["auroc"])


def test_cv_and_matrix_pickers_redraw_the_charts(
    make_app: Callable[[], AppTest], runs_dir: Path, crossval_runs: tuple[CVRun, MatrixRun]
) -> None:
    cv, matrix = crossval_runs
    cv.save(runs_dir)
    matrix.save(runs_dir)
    at = _benchmark(make_app)

    at.radio(key=KEY_BENCH_CV_DATASET_METRIC).set_value("ECE").run()
    _no_exception(at)
    sets = _charts(at)["cv.dataset"]
    assert sets["layout"]["yaxis"]["title"]["text"] == "ECE"
    lexical = cv.result("lexical")
    t = next(t for t in sets["data"] if t["name"] == "lexical")
    assert t["y"] == pytest.approx([lexical.by_dataset[d]["ece"] for d in t["x"]])

    at.radio(key=KEY_BENCH_CV_DATASET_METRIC).set_value("token AP").run()
    _no_exception(at)
    t = next(t for t in _charts(at)["cv.dataset"]["data"] if t["name"] == "lexical")
    want = [lexical.by_dataset[d]["token_ap"] for d in t["x"]]
    assert any(w is not None for w in want)
    assert [None if v is None else pytest.approx(v) for v in want] == [
        None if v is None or v != v else v for v in t["y"]
    ]

    at.radio(key=KEY_BENCH_CV_DATASET_METRIC).set_value("span F1 (char)").run()
    _no_exception(at)
    t = next(t for t in _charts(at)["cv.dataset"]["data"] if t["name"] == "lexical")
    want = [(lexical.by_dataset[d]["spans"] or {}).get("f1") for d in t["x"]]
    assert any(w is not None for w in want)
    assert [None if v is None else pytest.approx(v) for v in want] == [
        None if v is None or v != v else v for v in t["y"]
    ]

    at.multiselect(key=KEY_BENCH_CV_RELIABILITY).set_value([f"{CV_NAME}/lexical"]).run()
    _no_exception(at)
    names = [t["name"] for t in _charts(at)["cv.reliability"]["data"]]
    assert names == ["perfectly calibrated", f"lexical (ECE {lexical.reliability.ece:.3f})"]

    at.selectbox(key=KEY_BENCH_MATRIX_DETECTOR).set_value("lexical").run()
    at.radio(key=KEY_BENCH_MATRIX_METRIC).set_value("AP").run()
    _no_exception(at)
    heat = _charts(at)["matrix"]
    assert heat["data"][0]["z"] == [
        _none_for_nan(row) for row in matrix.frame("lexical", "ap").to_numpy()
    ]
    assert heat["layout"]["title"]["text"].startswith("AP of lexical")
    c = matrix.cells["lexical"]["summary"]["qa"]
    assert at.dataframe[-1].value.loc["summary", "qa"] == (
        f"{c['ap']:.3f} [{c['ap_ci'][0]:.3f}, {c['ap_ci'][1]:.3f}]"
    )
    assert at.session_state[STATE_KEY].bench.matrix_metric == "AP"


def test_two_cv_runs_next_to_test_runs(
    make_app: Callable[[], AppTest], runs_dir: Path, crossval_runs: tuple[CVRun, MatrixRun]
) -> None:
    cv, _ = crossval_runs
    synthetic_run().save(runs_dir)
    cv.save(runs_dir)
    # Also saved as before paired comparisons were recorded.
    other = dataclasses.replace(cv, name="cv *other* [x](http://e.test)", comparisons={}, groups=())
    # Written by hand: CVRun.save names the file after the run, and this name has a "/".
    (runs_dir / "other.json").write_text(json.dumps(other.to_dict()))
    at = _benchmark(make_app)
    assert [h.value for h in at.header] == ["Held-out test runs", "Cross-validation"]
    assert at.multiselect(key=KEY_BENCH_RUNS).value == [RUN_NAME]  # test runs as before
    assert list(at.dataframe[0].value["detector"]) == list(DETECTORS)

    picker = at.multiselect(key=KEY_BENCH_CV_RUNS)
    assert picker.value == [other.name]  # the newest
    picker.set_value([other.name, CV_NAME]).run()
    _no_exception(at)
    # One table per run, each under its (escaped) name.
    assert any(m.value.startswith(f"**{md(other.name)}**") for m in at.markdown)
    assert any(m.value.startswith(f"**{CV_NAME}**") for m in at.markdown)
    cv_tables = [t.value for t in at.table if "folds mean ± sd" in t.value.columns]
    assert len(cv_tables) == 2
    # Paired differences for the run that has them; the older one says how to get them.
    assert any("saved before paired comparisons" in c.value for c in at.caption)
    assert [k for k in _charts(at) if k.startswith("cv.compare")] == ["cv.compare.1"]
    spread = _charts(at)["cv.spread"]
    assert _trace(spread, "pooled")["y"] == [
        plain(f"{n} · {d}") for n in (other.name, CV_NAME) for d in CV_DETECTORS
    ]


def test_every_tab_opens_on_the_loaded_sets_run_or_the_newest(
    make_app: Callable[[], AppTest],
    runs_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    demo_detectors_dir: Path,
    crossval_runs: tuple[CVRun, MatrixRun],
) -> None:
    """The first tab describes the loaded set from the CV run its artifacts record: the
    Cross-validation tab opens on that run, even beside a newer one; the other tabs open
    on their newest run by the time it records, a newer shipped one before an older one
    of this machine (they opened on this machine's first, however old)."""
    cv, matrix = crossval_runs
    detectors = tmp_path / "detectors"
    shutil.copytree(demo_detectors_dir, detectors)
    cfg_path = detectors / "nll" / "cfg.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["metrics"] = {**cfg.get("metrics", {}), "cv": {"run": CV_NAME, "k": 3}}
    cfg_path.write_text(json.dumps(cfg))
    monkeypatch.setenv("RAGSCOPE_DETECTORS_DIR", str(detectors))

    def dated(run: Any, name: str, month: int) -> Any:  # any kind of run
        return dataclasses.replace(run, name=name, created_at=f"2026-0{month}-01T00:00:00+00:00")

    shipped = tmp_path / "shipped-runs"
    dated(cv, CV_NAME, 1).save(runs_dir)  # the set's run
    dated(cv, "cv-newer", 2).save(runs_dir)
    dated(synthetic_run(), "test-mine-old", 1).save(runs_dir)
    dated(synthetic_run(), "test-shipped-new", 3).save(shipped)
    dated(matrix, "matrix-mine-old", 1).save(runs_dir)
    dated(matrix, "matrix-shipped-new", 3).save(shipped)
    monkeypatch.setenv("RAGSCOPE_SHIPPED_RUNS_DIR", str(shipped))
    at = _benchmark(make_app)
    assert at.tabs[0].label == "Loaded set"
    assert at.multiselect(key=KEY_BENCH_CV_RUNS).value == [CV_NAME]
    assert at.multiselect(key=KEY_BENCH_RUNS).value == ["test-shipped-new"]
    assert at.selectbox(key=KEY_BENCH_MATRIX_RUN).value == "matrix-shipped-new"
    # what the numbers come from, not "on held-out test data" for every tab
    subtitle = at.caption[0].value
    assert "held-out test data" not in subtitle and "opening on the loaded set's run" in subtitle


def test_the_subtitle_says_what_the_loaded_sets_numbers_come_from() -> None:
    @dataclasses.dataclass
    class Card:
        auroc_from: str | None

    @dataclasses.dataclass
    class Set:
        name: str
        judge_name: str | None
        measured: str | None

        def card(self, name: str) -> Card:
            return Card(self.measured)

    def subtitle(*args: Any) -> str:
        return benchmark_subtitle(cast(DetectorSet, Set(*args)))  # a set's shape is enough

    cv = subtitle("default", "ensemble", "5-fold CV")
    assert "The default set's numbers come from the 5-fold cross-validation its artifacts " in cv
    assert "not a held-out test split" in cv
    assert "The builtin set's numbers come from its test split." in subtitle(
        "builtin", "ensemble", "test split"
    )
    assert "set's numbers" not in subtitle("custom", None, None)


def test_unreadable_runs_are_listed_and_the_rest_still_shows(
    make_app: Callable[[], AppTest],
    runs_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    crossval_runs: tuple[CVRun, MatrixRun],
) -> None:
    cv, matrix = crossval_runs
    runs_dir.mkdir(parents=True)
    (runs_dir / "truncated.json").write_text('{"kind": "cv", "format": 1, "name": ')
    bad = cv.to_dict()
    bad["name"], bad["labels"] = "short-labels", bad["labels"][:5]
    (runs_dir / "short-labels.json").write_text(json.dumps(bad))
    bad_matrix = {**matrix.to_dict(), "name": "flat-cells", "cells": {"nll": [1, 2]}}
    (runs_dir / "flat-cells.json").write_text(json.dumps(bad_matrix))
    cv.save(runs_dir)
    shipped = tmp_path / "shipped-runs"
    matrix.save(shipped)
    dataclasses.replace(cv, name="shipped-cv").save(shipped)
    monkeypatch.setenv("RAGSCOPE_SHIPPED_RUNS_DIR", str(shipped))
    at = _benchmark(make_app)
    warnings = " ".join(w.value for w in at.warning)
    for name in ("truncated.json", "short-labels.json", "flat-cells.json"):
        assert f"`{name}`" in warnings
    assert "5 labels" in warnings and "cells must be" in warnings
    opts = list(at.multiselect(key=KEY_BENCH_CV_RUNS).options)
    assert [o.split(" · ")[0] for o in opts] == [CV_NAME, "shipped-cv"]
    assert [o.endswith(" · shipped") for o in opts] == [False, True]
    assert at.selectbox(key=KEY_BENCH_MATRIX_RUN).value == MATRIX_NAME
    assert {"cv.spread", "matrix"} <= set(_charts(at))


def test_reliability_and_matrix_figures_escape_names(
    crossval_runs: tuple[CVRun, MatrixRun],
) -> None:
    cv, matrix = crossval_runs
    name = '<a href="https://e.test">x</a>'
    fig = reliability_figure({name: cv.results[1].reliability})
    assert fig.data[1].name == f"{plain(name)} (ECE {cv.results[1].reliability.ece:.3f})"
    assert "<a" not in fig.data[1].name and "<a" not in fig.data[1].hovertemplate
    cell = matrix.cells["nll"]["qa"]["summary"]
    odd = dataclasses.replace(
        matrix, datasets=(name, "b"), cells={name: {name: {"b": cell}, "b": {name: cell}}}
    )
    heat = matrix_figure(odd, name)
    assert list(heat.data[0].x) == list(heat.data[0].y) == [plain(name), "b"]
    assert heat.data[0].z[0][1] == pytest.approx(cell["auroc"]) and heat.data[0].z[0][0] is None
    assert "<a" not in heat.layout.title.text


def test_every_shipped_detector_gets_its_own_colour() -> None:
    # The per-generator bars and curves colour series by position: with fewer colours
    # than detectors, two detectors share one and the legend cannot tell them apart.
    from app.components.charts import PALETTE
    from core.detectors import available_detectors

    assert len(set(PALETTE)) == len(PALETTE) >= len(available_detectors())


def test_a_cv_run_saved_before_span_f1_shows_a_dash(
    crossval_runs: tuple[CVRun, MatrixRun],
) -> None:
    old = crossval_runs[0].to_dict()
    for r in old["results"]:
        del r["spans"]
    table = cv_metric_table(CVRun.from_dict(old))
    assert list(table["span P/R/F1 (char)"]) == ["-"] * len(CV_DETECTORS)


def test_a_cv_run_with_a_part_of_one_class_says_so_above_its_table(
    make_app: Callable[[], AppTest], runs_dir: Path, crossval_runs: tuple[CVRun, MatrixRun]
) -> None:
    cv, _ = crossval_runs
    # The same run, with every qa answer relabelled faithful: qa holds one class only.
    labels = tuple(
        0 if d == "qa" else y for d, y in zip(cv.example_datasets, cv.labels, strict=True)
    )
    few = dataclasses.replace(cv, name="cv-one-class-qa", labels=labels)
    few.save(runs_dir)
    assert not few.evidence and list(few.dataset_evidence) == ["qa"]
    at = _benchmark(make_app)
    shown = [w.value for w in at.warning if "Too few answers" in w.value]
    assert shown == [f"**Too few answers** in {md(few.name)}: {md(few.dataset_evidence['qa'])}"]
    assert "all faithful" in shown[0]
    assert f"**Too few answers.** {few.dataset_evidence['qa']}" in few.to_markdown()
