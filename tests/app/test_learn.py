"""The Learn page (AppTest, tiny model, the demo detectors): every step of the logit-lens
primer and of the CORTEX walkthrough, with the numbers it shows checked against
:mod:`core.analysis.teach` computed directly."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

from app.components.head_charts import ecs_figure
from core.analysis.teach import cortex_walk, lens_curve
from core.data import builtin_examples
from core.detectors import load_shipped

PAGE = "views/learn.py"
PRESET = "demo-04-mount-kelsey"


def _values(at: AppTest, name: str) -> np.ndarray:
    """The values of the token heatmap whose legend names ``name``."""
    for el in at.get("html"):
        body = el.proto.body
        if f"{name}: " in body:
            vals = re.findall(re.escape(name) + r": ([-0-9.e+]+|nan)", body)
            return np.asarray([float(v) for v in vals])
    raise AssertionError(f"no heatmap of {name!r}")


def _step(at: AppTest) -> str:
    return at.get("progress")[0].proto.text


def _next(at: AppTest) -> AppTest:
    at.button(key="learn.next").click().run()
    assert not at.exception, [e.value for e in at.exception]
    return at


@pytest.fixture
def preset():
    return next(e for e in builtin_examples() if e.id == PRESET)


def test_primer_steps_show_the_lens_numbers(
    open_page: Callable[[str], AppTest],
    chart: Callable[[AppTest, str], dict],
    plotly_array,
    tiny_model,
    preset,
) -> None:
    at = open_page(PAGE)
    curve = lens_curve(tiny_model, preset)
    assert _step(at) == "Step 1 of 4: The answer, as the model scores it"
    assert at.button(key="learn.back").disabled
    np.testing.assert_allclose(_values(at, "p(token)"), curve.final, atol=0.0051)
    assert any("softmax" in m.value for m in at.get("latex"))

    _next(at)
    assert _step(at) == "Step 2 of 4: Reading the middle of the network"
    t = int(np.argmin(curve.final))
    fig = chart(at, "Probability of")
    np.testing.assert_allclose(plotly_array(fig["data"][0]["y"]), curve.probs[:, t], atol=1e-9)
    assert fig["layout"]["shapes"][0]["x0"] == curve.jump_layer(t)
    # the last block under the lens is the model itself
    np.testing.assert_allclose(curve.probs[-1], curve.final, atol=1e-9)

    _next(at)
    assert _step(at) == "Step 3 of 4: Every token, every block"
    z = plotly_array(chart(at, "Logit-lens probability")["data"][0]["z"])
    np.testing.assert_allclose(z.reshape(curve.probs.shape), curve.probs, atol=1e-9)

    _next(at)
    assert _step(at) == "Step 4 of 4: Try it"
    assert at.button(key="learn.next").disabled
    at.button(key="learn.back").click().run()
    assert _step(at).startswith("Step 3 of 4")
    _next(at)
    # "try it" opens the same answer on the Counterfactual context page
    from app.state.counterfactual import KEY_CF_EXAMPLE

    at.button(key="learn.try").click().run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.selectbox(key=KEY_CF_EXAMPLE).value == PRESET


def test_cortex_steps_show_the_detectors_numbers(
    with_demo_detectors: Path,
    open_page: Callable[[str], AppTest],
    chart: Callable[[AppTest, str], dict],
    plotly_array,
    tiny_model,
    preset,
) -> None:
    at = open_page(PAGE)
    at.radio(key="learn.walk").set_value("CORTEX").run()
    det = load_shipped("cortex", tiny_model.info.key, with_demo_detectors)
    walk = cortex_walk(tiny_model, det, preset)
    titles = [
        "Two readings of one answer",
        "What is new at each token",
        "Token scores",
        "From scores to spans",
        "Try it",
    ]
    assert _step(at) == f"Step 1 of 5: {titles[0]}"
    np.testing.assert_allclose(_values(at, "‖Δh‖"), walk.dh_norm, atol=0.0051)
    _next(at)
    bars = chart(at, "Change from the passages")["data"]
    np.testing.assert_allclose(plotly_array(bars[1]["y"]), walk.c_norm, rtol=1e-6)
    assert (walk.c_norm <= walk.dh_norm * 10).all()
    _next(at)
    np.testing.assert_allclose(_values(at, "raw score"), walk.raw, atol=0.0051)
    _next(at)
    assert _step(at) == f"Step 4 of 5: {titles[3]}"
    np.testing.assert_allclose(_values(at, "smoothed"), walk.smoothed(0.993), atol=0.0051)
    at.slider(key="learn.p_stay").set_value(0.5).run()
    np.testing.assert_allclose(
        _values(at, "smoothed"), np.clip(walk.raw, 1e-4, 1 - 1e-4), atol=0.0051
    )
    n_spans = len(walk.spans(0.5))
    assert any(c.value.startswith(f"{n_spans} span(s)") for c in at.caption)
    _next(at)
    assert _step(at) == f"Step 5 of 5: {titles[4]}"


def test_cortex_without_a_trained_detector_says_how(open_page: Callable[[str], AppTest]) -> None:
    at = open_page(PAGE)
    at.radio(key="learn.walk").set_value("CORTEX").run()
    assert any("ragscope train --detectors cortex" in i.value for i in at.info)


def _walk(at: AppTest, name: str) -> AppTest:
    at.radio(key="learn.walk").set_value(name).run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def test_spad_steps_add_up_to_the_models_probability(
    open_page: Callable[[str], AppTest],
    chart: Callable[[AppTest, str], dict],
    plotly_array,
    page_text: Callable[[AppTest], str],
    tiny_model,
    preset,
) -> None:
    from core.engine.layout import render
    from core.engine.trace import trace
    from core.signals.attribution import spad_needs, token_sources

    at = _walk(open_page(PAGE), "SPAD")
    src = token_sources(
        tiny_model,
        trace(tiny_model, render(preset, tiny_model), spad_needs(tiny_model.info.n_layers)),
    )
    assert _step(at) == "Step 1 of 5: A probability, taken apart"
    t = int(np.argmin(src.p_final))
    bars = plotly_array(chart(at, "How p(")["data"][0]["y"])
    assert bars.size == 2 * tiny_model.info.n_layers + 3  # Init, attn/FFN per block, norm, total
    assert bars[:-1].sum() == pytest.approx(float(src.p_final[t]), abs=1e-5)
    assert bars[-1] == pytest.approx(float(src.p_final[t]), abs=1e-6)
    _next(at)
    assert chart(at, "Seven sources of every answer token")
    _next(at)
    assert chart(at, "Mean sources per part of speech")
    _next(at)
    assert "No trained spad detector" in page_text(at)  # the demo detectors have none
    _next(at)
    assert _step(at) == "Step 5 of 5: Try it"


def test_raglens_steps_sum_to_the_detectors_score(
    app_env: Path,
    tiny_sae,
    monkeypatch: pytest.MonkeyPatch,
    open_page: Callable[[str], AppTest],
    chart: Callable[[AppTest, str], dict],
    plotly_array,
    page_text: Callable[[AppTest], str],
    tiny_model,
    preset,
) -> None:
    import os

    from core.analysis.teach import raglens_walk
    from core.data import resolve_dataset
    from core.detectors import make_detector
    from core.pipeline.extract import extract_features

    monkeypatch.setenv("RAGSCOPE_SAE_DIR", str(tiny_sae.path))
    builtin = resolve_dataset("builtin")[1]
    train = [e for e in builtin if e.label][:12] + [e for e in builtin if e.label is False][:12]
    det = make_detector("raglens", sae=str(tiny_sae.path), top_k=10, max_rounds=100)
    det.fit(list(extract_features(tiny_model, train, [det]).features["raglens"]), train)
    det.save(Path(os.environ["RAGSCOPE_DETECTORS_DIR"]) / "raglens")
    walk = raglens_walk(tiny_model, det, preset)

    at = _walk(open_page(PAGE), "RAGLens")
    assert _step(at) == "Step 1 of 5: A dictionary of directions"
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Variance kept on this answer"] == f"{walk.fve:.1%}"
    assert metrics["Active features per token"] == f"{walk.l0.mean():.0f}"
    assert 0.0 < walk.fve <= 1.0
    _next(at)
    k = walk.features[0]
    np.testing.assert_allclose(_values(at, f"F{k} activation"), walk.activations[:, 0], atol=0.0051)
    _next(at)
    table = at.dataframe[0].value
    np.testing.assert_allclose(table["max over the answer"], walk.pooled[: len(table)], rtol=1e-6)
    _next(at)
    assert chart(at, "This answer's largest shape values")
    logit = walk.intercept + sum(walk.contributions.values())
    assert 1 / (1 + np.exp(-logit)) == pytest.approx(walk.score, abs=1e-6)
    assert f"the detector's score {walk.score:.3f}" in page_text(at)
    _next(at)
    assert _step(at) == "Step 5 of 5: Try it"


def test_redeep_steps_read_the_heads_and_the_ffn(
    open_page: Callable[[str], AppTest],
    chart: Callable[[AppTest, str], dict],
    plotly_array,
    no_exception: Callable[[AppTest], None],
    page_text: Callable[[AppTest], str],
    tiny_model,
    preset,
) -> None:
    from core.analysis.heads_layers import head_view
    from core.analysis.teach import ffn_lens

    at = _walk(open_page(PAGE), "ReDeEP / InterpDetect")
    assert _step(at) == "Step 1 of 6: A head that copies"
    hv = head_view(tiny_model, preset)
    mean_ecs = hv.token_ecs.mean(0)
    layer, head = np.unravel_index(int(np.argmax(mean_ecs)), mean_ecs.shape)  # no detector
    assert f"Head {head} of block {layer}" in page_text(at)
    _next(at)
    t = len(hv.response_tokens) // 2
    metrics = {m.label: m.value for m in at.metric}
    assert metrics[f"ECS of “{hv.response_tokens[t]}”"] == f"{hv.token_ecs[t, layer, head]:.3f}"
    _next(at)
    pks_layer = int(np.argmax(hv.pks.mean(1)))
    f = ffn_lens(tiny_model, preset, pks_layer)
    np.testing.assert_allclose(f.jsd, hv.pks[pks_layer], atol=1e-5)  # PKS, two ways
    metrics = {m.label: m.value for m in at.metric}
    assert metrics[f"PKS at block {pks_layer}, token “{hv.response_tokens[t]}”"] == (
        f"{f.jsd[t]:.4f} bits"
    )
    _next(at)
    assert chart(at, "Mean ECS of every head")
    at.button(key="learn.stats").click().run()  # over the first corpus answers
    no_exception(at)
    from core.analysis.heads_layers import HeadStats
    from core.data import load_builtin
    from core.detectors import make_detector
    from core.pipeline.extract import extract_features

    exs = load_builtin()[:24]
    feats = extract_features(tiny_model, exs, [make_detector("interpdetect")])
    stats = HeadStats.from_features(list(feats.features["interpdetect"]), list(feats.examples))
    want = ecs_figure(stats, "difference").data[0].z
    got = plotly_array(chart(at, ecs_figure(stats, "difference").layout.title.text)["data"][0]["z"])
    np.testing.assert_allclose(got.reshape(np.shape(want)), want, atol=1e-9, equal_nan=True)
    _next(at)
    assert "No trained redeep_token detector" in page_text(at)
    _next(at)
    assert _step(at) == "Step 6 of 6: Try it"


def test_the_counterfactual_pages_edit_can_be_walked_through(
    open_page: Callable[[str], AppTest], page_text: Callable[[AppTest], str], tiny_model, preset
) -> None:
    from app.state.session import STATE_KEY
    from core.interventions.counterfactual import (
        Counterfactual,
        edit_example,
        on_template,
        support_span,
    )

    at = open_page(PAGE)
    original = on_template(preset)
    edited = edit_example(original, support_span(original))
    at.session_state[STATE_KEY].cf.result = Counterfactual(
        name="support it", model=tiny_model.info.key, original=original, edited=edited,
        answer_mode="fixed",
    )  # fmt: skip
    at.run()
    choice = at.radio(key="learn.source")
    assert "The Counterfactual page's edited answer" in choice.options
    choice.set_value("The Counterfactual page's edited answer").run()
    assert not at.exception, [e.value for e in at.exception]
    assert "Edited on the Counterfactual context page: “support it”." in page_text(at)
    want = lens_curve(tiny_model, edited)
    np.testing.assert_allclose(_values(at, "p(token)"), want.final, atol=0.0051)
    assert edited.passages != preset.passages
