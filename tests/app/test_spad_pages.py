"""The SHAP summary and Token sources pages on the tiny model (AppTest).

Without a spad artifact both pages name the train command and offer a quick fit;
with one (fitted here on the demo examples and written to a temporary
``RAGSCOPE_DETECTORS_DIR``) they explain it. The charts are checked against
:mod:`core.analysis.shap_values` and :func:`core.signals.attribution.token_sources` computed directly.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

from app.state.heads import HEADS_EXAMPLE_PLAYGROUND
from app.state.session import STATE_KEY
from app.state.spad_views import (
    KEY_SHAP_COMPUTE,
    KEY_SHAP_GRID,
    KEY_SHAP_LIMIT,
    KEY_SHAP_QUICK_FIT,
    KEY_SHAP_TOP,
    KEY_TOKENS_BY_POS,
    KEY_TOKENS_EXAMPLE,
    KEY_TOKENS_EXAMPLE_SOURCE,
    KEY_TOKENS_QUICK_FIT,
)
from core.analysis.shap_values import shap_values
from core.data import builtin_examples
from core.detectors import load_shipped, make_detector
from core.engine.layout import render
from core.engine.model import LoadedModel
from core.engine.trace import trace
from core.pipeline.extract import extract_features, run_example
from core.pipeline.judge import judge
from core.pipeline.sets import load_set
from core.signals.attribution import SOURCES, response_pos, spad_needs, token_sources

SHAP = "views/shap_summary.py"
TOKENS = "views/token_sources.py"
EXAMPLE = "demo-02-waggle-dance"  # a built-in example with one gold span
OTHER = "demo-01-lighthouse"  # faithful, no span


# --------------------------------------------------------------------------- helpers


def _example(ex_id: str):
    return next(e for e in builtin_examples() if e.id == ex_id)


@pytest.fixture(scope="module")
def spad_artifact(tiny_model: LoadedModel, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A spad detector fitted on the demo examples with the tiny model."""
    out = tmp_path_factory.mktemp("spad-detectors")
    examples = builtin_examples()
    det = make_detector("spad", n_iter=3, cv=2)
    feats = extract_features(tiny_model, examples, [det]).features["spad"]
    det.fit(list(feats), examples).save(
        out / "spad", extra={"trained_on": {"dataset": "demo", "n": {"train": len(examples)}}}
    )
    return out


# --------------------------------------------------------------------------- SHAP summary


def test_shap_page_quick_fit_without_an_artifact(
    open_page: Callable[[str], AppTest],
    no_exception: Callable[[AppTest], None],
    charts: Callable[[AppTest], dict[str, dict]],
    chart: Callable[[AppTest, str], dict],
    page_text: Callable[[AppTest], str],
    plotly_array: Callable[[object], np.ndarray],
    tiny_model: LoadedModel,
) -> None:
    at = open_page(SHAP)
    assert "No trained spad detector" in page_text(at)
    train = "ragscope train --model tiny --dataset builtin --seed 0 --detectors spad"
    assert train in page_text(at)
    assert "Press **Compute SHAP values**" in page_text(at)
    at.number_input(key=KEY_SHAP_LIMIT).set_value(8).run()
    at.button(key=KEY_SHAP_COMPUTE).click().run()
    no_exception(at)
    request = at.session_state[STATE_KEY].shap.request
    assert request.detector == "spad" and len(request.ids) == 8
    assert "press **Quick fit** above" in page_text(at)
    assert not charts(at)

    at.button(key=KEY_SHAP_QUICK_FIT).click().run()
    no_exception(at)
    quick = at.session_state[STATE_KEY].spad_quick
    assert quick is not None and set(quick.ids) == set(request.ids)  # demo: no train split
    assert any("**Quick fit** (not a trained detector)" in w.value for w in at.warning)
    assert "8 of these 8 answers were in the quick fit's training data" in page_text(at)
    # eight answers cannot rank 126 features as a fact: said above the charts
    assert any(w.value.startswith("**Too few answers** to rank features by") for w in at.warning)

    # The figures show exactly the quick fit's TreeSHAP values on these examples.
    by_id = {e.id: e for e in builtin_examples()}
    examples = [by_id[i] for i in request.ids]
    feats = extract_features(tiny_model, examples, [make_detector("spad")]).features["spad"]
    want = shap_values(quick.detector, feats)
    top = at.session_state[STATE_KEY].shap.top
    beeswarm = chart(at, "SHAP values of the top")
    n_points = sum(len(plotly_array(t["x"])) for t in beeswarm["data"])
    assert n_points == min(top, 126) * len(examples)
    assert beeswarm["layout"]["yaxis"]["ticktext"] == [want.names[k] for k in want.top(top)]
    bar = chart(at, "Mean |SHAP| of the top")
    np.testing.assert_allclose(
        plotly_array(bar["data"][0]["x"]), want.mean_abs[want.top(top)], rtol=1e-6
    )
    grid = chart(at, "Mean SHAP value by source")
    np.testing.assert_allclose(
        plotly_array(grid["data"][0]["z"]), want.grid("mean"), rtol=1e-6, atol=1e-9
    )


def test_shap_page_explains_the_shipped_detector(
    open_page: Callable[[str], AppTest],
    no_exception: Callable[[AppTest], None],
    chart: Callable[[AppTest, str], dict],
    page_text: Callable[[AppTest], str],
    plotly_array: Callable[[object], np.ndarray],
    monkeypatch: pytest.MonkeyPatch,
    spad_artifact: Path,
    tiny_model: LoadedModel,
) -> None:
    monkeypatch.setenv("RAGSCOPE_DETECTORS_DIR", str(spad_artifact))
    at = open_page(SHAP)
    assert "Explaining the shipped **spad** detector" in page_text(at)
    assert "No trained spad detector" not in page_text(at)
    assert not _has_button(at, KEY_SHAP_QUICK_FIT)
    at.number_input(key=KEY_SHAP_LIMIT).set_value(4).run()
    at.button(key=KEY_SHAP_COMPUTE).click().run()
    no_exception(at)
    request = at.session_state[STATE_KEY].shap.request
    assert len(request.ids) == 4 and request.computed == 4

    det = load_shipped("spad", tiny_model.info.key, spad_artifact)
    by_id = {e.id: e for e in builtin_examples()}
    feats = extract_features(
        tiny_model, [by_id[i] for i in request.ids], [make_detector("spad")]
    ).features["spad"]
    want = shap_values(det, feats)
    np.testing.assert_allclose(want.margins, det.margins(feats), rtol=1e-5, atol=1e-5)
    grid = chart(at, "Mean SHAP value by source")
    np.testing.assert_allclose(
        plotly_array(grid["data"][0]["z"]), want.grid("mean"), rtol=1e-6, atol=1e-9
    )

    # Fewer features, and the grid of mean |SHAP|.
    at.number_input(key=KEY_SHAP_TOP).set_value(5).run()
    assert len(chart(at, "SHAP values of the top 5")["layout"]["yaxis"]["ticktext"]) == 5
    assert len(chart(at, "Mean |SHAP| of the top 5")["data"][0]["y"]) == 5
    at.radio(key=KEY_SHAP_GRID).set_value("mean_abs").run()
    no_exception(at)
    grid = chart(at, "Mean |SHAP value| by source")
    np.testing.assert_allclose(plotly_array(grid["data"][0]["z"]), want.grid("mean_abs"), rtol=1e-6)
    # A second Compute reads the features from the cache.
    at.button(key=KEY_SHAP_COMPUTE).click().run()
    assert at.session_state[STATE_KEY].shap.request.cache_hits == 4


def _has_button(at: AppTest, key: str) -> bool:
    return any(b.key == key for b in at.button)


# --------------------------------------------------------------------------- Token sources


def test_token_sources_bars_pos_toggle_and_quick_fit(
    open_page: Callable[[str], AppTest],
    no_exception: Callable[[AppTest], None],
    charts: Callable[[AppTest], dict[str, dict]],
    chart: Callable[[AppTest, str], dict],
    page_text: Callable[[AppTest], str],
    plotly_array: Callable[[object], np.ndarray],
    tiny_model: LoadedModel,
) -> None:
    at = open_page(TOKENS)
    assert at.selectbox(key=KEY_TOKENS_EXAMPLE).value == EXAMPLE  # first with a gold span
    example = _example(EXAMPLE)
    layout = render(example, tiny_model)
    src = token_sources(tiny_model, trace(tiny_model, layout, spad_needs(tiny_model.info.n_layers)))
    sources = chart(at, "Seven sources of each answer token")
    bars = [t for t in sources["data"] if t["type"] == "bar"]
    assert [b["name"] for b in bars] == list(SOURCES)
    for i, b in enumerate(bars):
        np.testing.assert_allclose(plotly_array(b["y"]), src.values[:, i], rtol=1e-5, atol=1e-9)
    diamonds = next(t for t in sources["data"] if t["name"] == "P_final (sum)")
    np.testing.assert_allclose(plotly_array(diamonds["y"]), src.p_final, rtol=1e-4, atol=1e-9)
    gold = next(t for t in sources["data"] if t["name"] == "gold hallucination span")
    labels = layout.token_labels()
    assert list(plotly_array(gold["x"]).astype(int)) == np.flatnonzero(labels == 1).tolist()
    assert "inside a gold hallucination span sit on a blue band" in page_text(at)

    # Aggregated by part of speech: one bar per tag present, the spad feature means.
    at.toggle(key=KEY_TOKENS_BY_POS).set_value(True).run()
    no_exception(at)
    assert not [t for t in charts(at) if t.startswith("Seven sources")]
    pos_chart = chart(at, "Mean of the seven sources per part of speech")
    tags = response_pos(layout)
    present = sorted(set(tags))
    assert len(pos_chart["data"][0]["x"]) == len(present)
    noun = next(k for k, x in enumerate(pos_chart["data"][0]["x"]) if x.startswith("NOUN ("))
    rag = plotly_array(pos_chart["data"][SOURCES.index("RAG")]["y"])[noun]
    mask = np.asarray(tags) == "NOUN"
    np.testing.assert_allclose(rag, src.values[mask, SOURCES.index("RAG")].mean(), rtol=1e-5)
    assert at.session_state[STATE_KEY].tokens.by_pos is True

    # No spad detector: no waterfall, the command and a quick fit that makes one.
    assert "Make one with `ragscope train --model tiny" in page_text(at)
    assert not [t for t in charts(at) if t.startswith("SHAP waterfall")]
    at.button(key=KEY_TOKENS_QUICK_FIT).click().run()
    no_exception(at)
    quick = at.session_state[STATE_KEY].spad_quick
    assert quick is not None and len(quick.ids) >= 4
    waterfall = chart(at, f"SHAP waterfall of {EXAMPLE}")
    feats = run_example(tiny_model, example, [make_detector("spad")])["spad"]
    margin = float(quick.detector.margins([feats])[0])
    assert plotly_array(waterfall["data"][0]["x"])[-1] == pytest.approx(margin, rel=1e-4, abs=1e-5)
    assert any("**Quick fit**" in w.value for w in at.warning)


def test_token_sources_waterfall_of_the_shipped_detector(
    open_page: Callable[[str], AppTest],
    no_exception: Callable[[AppTest], None],
    chart: Callable[[AppTest, str], dict],
    page_text: Callable[[AppTest], str],
    plotly_array: Callable[[object], np.ndarray],
    monkeypatch: pytest.MonkeyPatch,
    spad_artifact: Path,
    tiny_model: LoadedModel,
) -> None:
    monkeypatch.setenv("RAGSCOPE_DETECTORS_DIR", str(spad_artifact))
    at = open_page(TOKENS)
    at.selectbox(key=KEY_TOKENS_EXAMPLE).set_value(OTHER).run()
    no_exception(at)
    assert "No trained spad detector" not in page_text(at)
    det = load_shipped("spad", tiny_model.info.key, spad_artifact)
    feats = run_example(tiny_model, _example(OTHER), [make_detector("spad")])["spad"]
    verdict = det.predict(feats)
    # The probability, threshold and flag are the set's verdict (judge), as the
    # Playground shows them; the waterfall's score is raw and says so.
    judged = judge(tiny_model, _example(OTHER), load_set(tiny_model.info.key)).verdicts["spad"]
    flag = "flagged as hallucinated" if judged.hallucinated else "not flagged"
    assert (
        f"a probability of **{judged.score:.3f}** (threshold {judged.threshold:.3f} from the "
        f"same calibration: {flag}; gold: faithful)" in page_text(at)
    )
    if judged.raw_score is not None:
        assert f"explains its raw score {verdict.raw_score:.3f}" in page_text(at)
    w = chart(at, f"SHAP waterfall of {OTHER}")["data"][0]
    x = plotly_array(w["x"])
    assert w["measure"][0] == "absolute" and w["measure"][-1] == "total"
    assert len(x) == 1 + 10 + 1 + 1  # base, top 10, the rest, the margin
    np.testing.assert_allclose(x[:-1].sum(), x[-1], rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(x[-1], det.margins([feats])[0], rtol=1e-4, atol=1e-5)
    # The largest contribution comes first, as the detector's own explanation ranks it.
    expl = {k: v for k, v in verdict.explanation.items() if k != "bias"}
    first = max(expl, key=lambda k: abs(expl[k]))
    assert w["y"][1].startswith(f"{first} = ")


def test_token_sources_default_to_the_playground_answer(
    open_after_analysis: Callable[[str, str], AppTest],
    chart: Callable[[AppTest, str], dict],
    page_text: Callable[[AppTest], str],
    plotly_array: Callable[[object], np.ndarray],
) -> None:
    at = open_after_analysis(OTHER, TOKENS)
    assert at.radio(key=KEY_TOKENS_EXAMPLE_SOURCE).value == HEADS_EXAMPLE_PLAYGROUND
    assert f"Example `{OTHER}`" in page_text(at)
    analysis = at.session_state[STATE_KEY].analysis
    sources = chart(at, "Seven sources of each answer token")
    assert len(plotly_array(sources["data"][0]["y"])) == len(analysis.layout.response_positions)
