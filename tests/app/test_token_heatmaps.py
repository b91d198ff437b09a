"""The Token heatmaps page on the tiny model (AppTest).

CORTEX and context_gain are fitted on the demo examples and written to a temporary
``RAGSCOPE_DETECTORS_DIR``; the page's rows are checked against the detectors and
:mod:`core.signals.smoothing` run directly.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import numpy as np
from streamlit.testing.v1 import AppTest

from app.components.heatmap_spans import nothing_flagged
from app.state.heatmaps import (
    KEY_FLAG_ROW,
    KEY_NEXT,
    KEY_ONLY_FLAGGED,
    KEY_P_STAY,
    KEY_ROWS,
    KEY_SCAN,
    KEY_SMOOTH_ALL,
    KEY_THRESHOLD,
)
from app.state.heatmaps import KEY_HEATMAP_DATASET as KEY_DATASET
from app.state.heatmaps import KEY_HEATMAP_EXAMPLE as KEY_EXAMPLE
from app.state.session import STATE_KEY
from core.data import builtin_examples
from core.detectors import load_shipped
from core.engine.model import LoadedModel
from core.pipeline.extract import run_example
from core.signals.smoothing import smooth_tokens

PAGE = "views/token_heatmaps.py"
EXAMPLE = "demo-02-waggle-dance"  # one gold span


def _html(at: AppTest) -> str:
    hits = [h.value for h in at.html if 'class="rs-mr"' in h.value]
    assert len(hits) == 1
    return hits[0]


def _row_values(html: str, row: str) -> np.ndarray:
    """A row's per-token values, read back from the token hovers."""
    titles = re.findall(r'class="rs-mr-tok[^"]*" data-tok="\d+" title="([^"]*)"', html)
    out = []
    for t in titles:
        m = re.search(re.escape(row) + r": ([0-9.]+|n/a)", t)
        assert m, (row, t)
        out.append(np.nan if m.group(1) == "n/a" else float(m.group(1)))
    return np.asarray(out)


def _open(open_page: Callable[[str], AppTest], example: str = EXAMPLE) -> AppTest:
    at = open_page(PAGE)
    at.selectbox(key=KEY_EXAMPLE).select(example).run()
    return at


def test_without_detectors_the_page_names_the_train_command(
    open_page: Callable[[str], AppTest], page_text: Callable[[AppTest], str]
) -> None:
    at = _open(open_page)
    train = "ragscope train --model tiny --dataset builtin --seed 0 --detectors cortex"
    assert train in page_text(at)
    html = _html(at)
    assert ">gold span</td>" in html and ">surprisal (bits)</td>" in html
    assert "CORTEX raw" not in html
    assert "No detector here scores single tokens" in page_text(at)


def test_rows_are_the_detectors_own_scores(
    with_demo_detectors: Path,
    open_page: Callable[[str], AppTest],
    no_exception: Callable[[AppTest], None],
    chart: Callable[[AppTest, str], dict],
    tiny_model: LoadedModel,
) -> None:
    at = _open(open_page)
    no_exception(at)
    html = _html(at)
    ex = next(e for e in builtin_examples() if e.id == EXAMPLE)
    cortex = load_shipped("cortex", tiny_model.info.key, with_demo_detectors)
    gain = load_shipped("context_gain", tiny_model.info.key, with_demo_detectors)
    feats = run_example(tiny_model, ex, [cortex, gain])
    raw = cortex.raw_token_scores(feats["cortex"])
    np.testing.assert_allclose(_row_values(html, "CORTEX raw"), raw, atol=6e-4)
    np.testing.assert_allclose(
        _row_values(html, "CORTEX smoothed"), smooth_tokens(raw, 0.993), atol=6e-4
    )
    np.testing.assert_allclose(
        _row_values(html, "context_gain"),
        gain.predict(feats["context_gain"]).token_scores,
        atol=6e-4,
    )
    # The training loss curve of the artifact, epoch by epoch.
    loss = chart(at, "CORTEX loss per epoch")
    np.testing.assert_allclose(loss["data"][0]["y"], cortex.train_info_["loss_curve"])
    assert len(loss["data"][0]["y"]) == 3
    gold = re.findall(r"gold span: (hallucinated|faithful)", html)
    assert "hallucinated" in gold and "faithful" in gold
    # p_stay 0.5 is no smoothing: the smoothed row equals the raw one.
    at.slider(key=KEY_P_STAY).set_value(0.5).run()
    html = _html(at)
    np.testing.assert_allclose(
        _row_values(html, "CORTEX smoothed"), np.clip(raw, 1e-4, 1 - 1e-4), atol=6e-4
    )
    # The same smoothing can be applied to the other detectors' rows.
    at.slider(key=KEY_P_STAY).set_value(0.9).run()
    at.toggle(key=KEY_SMOOTH_ALL).set_value(True).run()
    g = gain.predict(feats["context_gain"]).token_scores
    np.testing.assert_allclose(
        _row_values(_html(at), "context_gain"), smooth_tokens(g, 0.9), atol=6e-4
    )
    # Rows can be hidden.
    at.multiselect(key=KEY_ROWS).unselect("surprisal (bits)").run()
    assert ">surprisal (bits)</td>" not in _html(at)
    no_exception(at)


def test_threshold_flags_spans_and_next_steps_through_them(
    with_demo_detectors: Path,
    open_page: Callable[[str], AppTest],
    no_exception: Callable[[AppTest], None],
) -> None:
    at = _open(open_page)
    at.selectbox(key=KEY_FLAG_ROW).select("CORTEX raw").run()
    at.slider(key=KEY_THRESHOLD).set_value(0.0).run()
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Predicted spans"] == "1"  # every token flagged: one span
    assert metrics["Gold spans"] == "1"
    assert metrics["Span F1 (overlap)"] == "1.00"
    html = _html(at)
    n_tok = len(re.findall(r'data-tok="\d+"', html))
    assert len(re.findall(r"rs-mr-tok rs-mr-flag", html)) == n_tok
    at.button(key=KEY_NEXT).click().run()
    no_exception(at)
    assert len(re.findall(r"rs-mr-focus", _html(at))) >= n_tok
    assert any("Span 1 of 1" in m.value for m in at.markdown)
    at.slider(key=KEY_THRESHOLD).set_value(1.0).run()
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Predicted spans"] == "0" and metrics["Span F1 (overlap)"] == "0.00"
    assert "rs-mr-flag" not in _html(at).split("</style>", 1)[1]


def test_scan_keeps_only_flagged_answers(
    with_demo_detectors: Path,
    open_page: Callable[[str], AppTest],
    no_exception: Callable[[AppTest], None],
    page_text: Callable[[AppTest], str],
) -> None:
    at = _open(open_page)
    at.button(key=KEY_SCAN).click().run()
    no_exception(at)
    state = at.session_state[STATE_KEY]
    scanned = next(iter(state.heatmap.scan.values()))
    assert len(scanned) == len(builtin_examples())
    at.slider(key=KEY_THRESHOLD).set_value(0.0).run()
    at.toggle(key=KEY_ONLY_FLAGGED).set_value(True).run()
    assert len(at.selectbox(key=KEY_EXAMPLE).options) == len(scanned)
    at.slider(key=KEY_THRESHOLD).set_value(1.0).run()
    assert "No scanned answer is flagged" in page_text(at)
    no_exception(at)
    assert at.selectbox(key=KEY_DATASET).value is not None


def test_a_threshold_that_flags_nothing_says_what_would() -> None:
    text = "The bridge opened in 1820 over the river."
    offsets = np.array([[0, 3], [3, 10], [10, 17], [17, 20], [20, 25], [25, 30]])
    vals = np.array([0.05, 0.10, 0.12, 0.08, 0.046, 0.07])
    said = nothing_flagged(vals, offsets, text, 0.232)
    # three decimals, as the threshold and the score are printed on every page
    assert said.startswith("No token reaches the threshold 0.232. The highest score here is 0.120")
    assert "\u201copened\u201d (characters 10\u201317)" in said
    assert "a threshold at or below 0.120 would flag it" in said
    assert nothing_flagged(np.zeros(0), np.zeros((0, 2), int), "", 0.5) == (
        "This answer has no scored token."
    )
