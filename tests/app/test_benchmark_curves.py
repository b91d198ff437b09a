"""The Benchmark's review learning curves (AppTest and the pure chart functions): the
shipped runs of the three dev sets, one curve per dataset and order with its band, the
unadapted and own-CV references, and every point's numbers as the run records them."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from app.components.curve_charts import curve_figure, curve_frame
from app.state.runs import KEY_BENCH_CURVE_METRIC, KEY_BENCH_CURVE_RUNS
from core.evaluation.review_curve import CurveRun

SHIPPED = Path(__file__).resolve().parents[2] / "assets" / "runs"
CURVES = sorted(SHIPPED.glob("*review-curve-*.json"))


def test_the_dev_sets_curves_are_shipped() -> None:
    datasets = {CurveRun.load(p).dataset for p in CURVES}
    assert {"dolly_ac_dev", "finqa_qwen3_interpdetect", "ragtruth_qa_dev"} <= datasets


def test_the_figure_draws_each_order_its_band_and_both_references() -> None:
    run = CurveRun.load(next(p for p in CURVES if "dolly" in p.name))
    fig = curve_figure([run], "ece")
    names = [t.name for t in fig.data if t.name]
    assert "dolly_ac_dev, random order" in names and "dolly_ac_dev, uncertainty order" in names
    assert "dolly_ac_dev, unadapted" in names
    bands = [t for t in fig.data if t.fill == "toself"]
    assert len(bands) == 1  # the random order's 2.5-97.5% band
    line = next(t for t in fig.data if t.name == "dolly_ac_dev, random order")
    p50 = run.point("random", 50)
    assert p50 is not None and list(line.y)[list(line.x).index(50)] == p50.adapted["ece"][0]
    own = next(t for t in fig.data if t.name == "dolly_ac_dev, own 5-fold CV")
    assert set(own.y) == {run.own_cv["ece"]}
    frame = curve_frame(run)
    row = frame[(frame["order"] == "random") & (frame["reviews"] == 50)].iloc[0]
    mean, lo, hi = p50.adapted["ece"]
    assert row["ECE"] == f"{mean:.3f} [{lo:.3f}, {hi:.3f}]"
    assert row["refit kept"] == f"{p50.refit_share:.0%}"
    # a refit metric's grey reference is the same metric of the unadapted reading
    refit = curve_figure([run], "refit_ece")
    grey = next(t for t in refit.data if t.name == "dolly_ac_dev, unadapted")
    assert list(grey.y)[list(grey.x).index(50)] == p50.unadapted["ece"][0]


def test_the_benchmark_shows_the_curves_of_the_shipped_runs(
    make_app: Callable[[], AppTest], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shipped = tmp_path / "shipped"
    shipped.mkdir()
    for p in CURVES:
        shutil.copy(p, shipped / p.name)
    monkeypatch.setenv("RAGSCOPE_SHIPPED_RUNS_DIR", str(shipped))
    at = make_app().run()
    at.switch_page("views/benchmark.py").run()
    assert not at.exception, [e.value for e in at.exception]
    assert any(h.value == "Review learning curves" for h in at.header)
    picker = at.multiselect(key=KEY_BENCH_CURVE_RUNS)
    assert len(picker.value) == 3  # the newest run of each dataset
    assert at.radio(key=KEY_BENCH_CURVE_METRIC).value == "ece"
    at.radio(key=KEY_BENCH_CURVE_METRIC).set_value("refit_auroc").run()
    assert not at.exception
    assert len(at.get("plotly_chart")) == 1
    assert len(at.dataframe) == 3
