"""SHAP values of the spad detector (core.analysis.shap_values): shapes, additivity; and their figures
(app.components.shap_charts).

The detector is fitted on synthetic 126-feature vectors with a planted signal (low
RAG on nouns and high LN on numerals mean hallucinated), so no model runs here.
"""

from __future__ import annotations

import numpy as np
import pytest

from app.components.shap_charts import (
    bar_figure,
    grid_figure,
    pos_sources_figure,
    summary_figure,
    swarm_offsets,
    token_sources_figure,
    waterfall_figure,
)
from core.analysis.shap_values import ShapResult, as_2d, pos_means, shap_values
from core.base.errors import ModelError, NotFittedError
from core.base.examples import RAGExample
from core.detectors import make_detector
from core.learning.contract import Features
from core.signals.attribution import FEATURE_NAMES, POS_TAGS, SOURCES, pos_features

MODEL = "synthetic|L2xH4/KV2|D64|V512|float32"
RAG_NOUN = FEATURE_NAMES.index("RAG_NOUN")
LN_NUM = FEATURE_NAMES.index("LN_NUM")


def _features(n: int, seed: int = 0) -> tuple[list[Features], list[RAGExample]]:
    rng = np.random.default_rng(seed)
    feats, examples = [], []
    for i in range(n):
        y = i % 2
        x = rng.normal(0.0, 0.05, len(FEATURE_NAMES))
        x[RAG_NOUN] += 0.3 - 0.2 * y + rng.normal(0, 0.04)
        x[LN_NUM] += -0.1 + 0.2 * y + rng.normal(0, 0.04)
        feats.append(
            Features(
                detector="spad", example_id=f"s{i}", model=MODEL, names=FEATURE_NAMES, response=x
            )
        )
        examples.append(
            RAGExample(id=f"s{i}", question="Q?", passages=("P.",), response="A.", label=bool(y))
        )
    return feats, examples


@pytest.fixture(scope="module")
def fitted():
    feats, examples = _features(48)
    det = make_detector("spad", n_iter=3, cv=2).fit(feats, examples)
    return det, feats


def test_shap_values_are_additive_and_equal_pred_contribs(fitted) -> None:
    det, feats = fitted
    res = shap_values(det, feats)
    assert isinstance(res, ShapResult)
    assert res.values.shape == (len(feats), len(FEATURE_NAMES)) and res.values.dtype == np.float64
    assert isinstance(res.base, float)
    margin = det.margins(feats)
    np.testing.assert_allclose(res.values.sum(1) + res.base, margin, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(res.margins, margin, rtol=1e-5, atol=1e-5)
    contribs = det.contributions(feats)
    np.testing.assert_allclose(res.values, contribs[:, :-1], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(res.base, contribs[0, -1], rtol=1e-5, atol=1e-6)
    # The detector's verdict explanation is the same numbers.
    verdict = det.predict(feats[3])
    np.testing.assert_allclose(
        [verdict.explanation[n] for n in FEATURE_NAMES], res.values[3], rtol=1e-5, atol=1e-6
    )
    np.testing.assert_allclose(res.scores[3], verdict.score, rtol=1e-5)
    assert res.example_ids == tuple(f.example_id for f in feats)


def test_one_example_still_gives_a_2d_array(fitted) -> None:
    det, feats = fitted
    res = shap_values(det, feats[:1])
    assert res.values.shape == (1, len(FEATURE_NAMES))
    np.testing.assert_allclose(res.margins, det.margins(feats[:1]), rtol=1e-5, atol=1e-5)


def test_planted_features_lead_the_ranking(fitted) -> None:
    det, feats = fitted
    res = shap_values(det, feats)
    assert set(res.top(2)) == {RAG_NOUN, LN_NUM}
    frame = res.to_frame()
    assert set(frame["feature"][:2]) == {"RAG_NOUN", "LN_NUM"}
    assert list(frame.columns) == [
        "feature",
        "source",
        "tag",
        "mean |SHAP|",
        "mean SHAP",
        "mean value",
        "direction",
    ]
    # Planted: less RAG on nouns and more LN on numerals in hallucinated answers.
    by = frame.set_index("feature")["direction"]
    assert by["RAG_NOUN"] < -0.5 and by["LN_NUM"] > 0.5
    grid = res.grid("mean_abs")
    assert grid.shape == (len(SOURCES), len(POS_TAGS))
    assert grid[SOURCES.index("RAG"), POS_TAGS.index("NOUN")] == pytest.approx(
        res.mean_abs[RAG_NOUN]
    )
    np.testing.assert_allclose(res.grid("mean").ravel(), res.values.mean(0))
    # Low RAG on nouns pushes towards hallucinated: SHAP falls as the value rises.
    r = np.corrcoef(res.data[:, RAG_NOUN], res.values[:, RAG_NOUN])[0, 1]
    assert r < -0.5


def test_as_2d_normalises_every_shap_output_shape() -> None:
    n, f = 3, 5
    v = np.arange(n * f, dtype=np.float64).reshape(n, f)
    for raw, expected in (
        (v, 0.25),
        ([-v, v], [-0.25, 0.25]),  # per-class list
        (np.stack([-v, v], axis=-1), np.asarray([-0.25, 0.25])),  # (n, f, k)
        (np.stack([-v, v]), np.asarray([-0.25, 0.25])),  # (k, n, f)
        (v.astype(np.float32), np.float32(0.25)),
    ):
        out, base = as_2d(raw, expected, n, f)
        assert out.shape == (n, f) and out.dtype == np.float64
        np.testing.assert_array_equal(out, v)
        assert base == pytest.approx(0.25)
    out, base = as_2d(v[0], [0.5], 1, f)  # one sample, 1-D
    assert out.shape == (1, f) and base == 0.5

    class Explanation:
        values = v
        base_values = np.full(n, 0.75)

    out, base = as_2d(Explanation(), None, n, f)
    np.testing.assert_array_equal(out, v)
    assert base == 0.75
    with pytest.raises(ModelError, match="expected \\(3, 5\\)"):
        as_2d(v[:, :4], 0.0, n, f)


def test_unfitted_or_foreign_features_are_refused(fitted) -> None:
    det, feats = fitted
    with pytest.raises(NotFittedError):
        shap_values(make_detector("spad"), feats)
    other = Features(
        detector="spad",
        example_id="x",
        model="another|model",
        names=FEATURE_NAMES,
        response=np.zeros(len(FEATURE_NAMES)),
    )
    with pytest.raises(ModelError, match="another\\|model"):
        shap_values(det, [other])


def test_summary_bar_grid_and_waterfall_figures(fitted) -> None:
    det, feats = fitted
    res = shap_values(det, feats)
    labels = [f.example_id.endswith(("1", "3", "5", "7", "9")) for f in feats]
    summary = summary_figure(res, top=8, labels=labels)
    n_points = sum(len(t.x) for t in summary.data)
    assert n_points == 8 * len(feats)
    assert list(summary.layout.yaxis.ticktext) == [FEATURE_NAMES[k] for k in res.top(8)]
    # Colour is the feature's value: the highest RAG_NOUN value is the reddest point.
    row = res.top(8).index(RAG_NOUN)
    pts = summary.data[0]
    ys = np.asarray(pts.y)
    on_row = np.abs(ys - row) < 0.5
    assert on_row.sum() == len(feats)
    assert max(np.asarray(pts.marker.color)[on_row]) == 1.0

    bar = bar_figure(res, top=5)
    assert list(bar.data[0].y) == [FEATURE_NAMES[k] for k in res.top(5)]
    np.testing.assert_allclose(bar.data[0].x, np.sort(res.mean_abs)[::-1][:5])

    grid = grid_figure(res)
    assert np.asarray(grid.data[0].z).shape == (7, 18)
    assert list(grid.data[0].y) == list(SOURCES) and list(grid.data[0].x) == list(POS_TAGS)

    wf = waterfall_figure(res, 2, top=6)
    w = wf.data[0]
    assert list(w.measure) == ["absolute"] + ["relative"] * 7 + ["total"]
    assert w.y[-2] == f"{len(FEATURE_NAMES) - 6} other features"
    np.testing.assert_allclose(sum(w.x[:-1]), w.x[-1], rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(w.x[-1], det.margins(feats)[2], rtol=1e-5, atol=1e-5)
    assert f"score {res.scores[2]:.3f}" in wf.layout.title.text


def test_swarm_offsets_spread_equal_values_and_stay_in_the_row() -> None:
    x = np.asarray([0.0, 0.0, 0.0, 0.0, 1.0])
    off = swarm_offsets(x)
    assert len(set(off[:4].round(9))) == 4 and off[4] == 0.0
    assert np.abs(off).max() <= 0.38
    assert np.all(swarm_offsets(np.zeros(1)) == 0.0)


def test_token_sources_figure_stacks_to_p_final_and_marks_gold() -> None:
    rng = np.random.default_rng(1)
    values = rng.normal(0.0, 0.1, (6, 7))
    tokens = ["The", " bridge", " was", " built", " in", " 1820"]
    pos = ["DET", "NOUN", "AUX", "VERB", "ADP", "NUM"]
    labels = [0, 0, 0, 0, 1, 1]
    fig = token_sources_figure(values, tokens, pos, labels=labels)
    bars = [t for t in fig.data if t.type == "bar"]
    assert [b.name for b in bars] == list(SOURCES)
    stacked = np.sum([np.asarray(b.y) for b in bars], axis=0)
    p_final = next(t for t in fig.data if t.name == "P_final (sum)")
    np.testing.assert_allclose(stacked, p_final.y)
    gold = next(t for t in fig.data if t.name == "gold hallucination span")
    assert list(gold.x) == [4, 5]
    assert len(fig.layout.shapes) == 1  # one band over the two adjacent gold tokens
    assert list(fig.layout.xaxis.ticktext) == ["The", "bridge", "was", "built", "in", "1820"]
    no_gold = token_sources_figure(values, tokens, pos)
    assert not any(t.name == "gold hallucination span" for t in no_gold.data)
    with pytest.raises(ValueError, match="6 tokens"):
        token_sources_figure(values[:5], tokens, pos)


def test_pos_aggregation_gives_the_spad_features_of_present_tags() -> None:
    rng = np.random.default_rng(2)
    values = rng.normal(0.0, 0.1, (5, 7))
    pos = ["NOUN", "NUM", "NOUN", "PUNCT", "NOUN"]
    tags, means, counts = pos_means(values, pos)
    assert tags == ["NOUN", "NUM", "PUNCT"] and list(counts) == [3, 1, 1]
    grid = pos_features(values, pos).reshape(len(SOURCES), len(POS_TAGS))
    for t, m in zip(tags, means, strict=True):
        np.testing.assert_allclose(m, grid[:, POS_TAGS.index(t)], rtol=1e-6, atol=1e-7)
    fig = pos_sources_figure(values, pos)
    assert list(fig.data[0].x) == ["NOUN (3)", "NUM (1)", "PUNCT (1)"]
    np.testing.assert_allclose(fig.data[-1].y, means.sum(1))


def test_a_quick_fit_without_search_still_splits_on_a_few_examples() -> None:
    from core.detectors.spad import NO_SEARCH_PARAMS

    feats, examples = _features(16, seed=3)
    det = make_detector("spad", n_iter=0, holdout=0.0).fit(feats, examples)
    assert det.best_params_ == NO_SEARCH_PARAMS
    assert det.train_info_["n_iter"] == 0 and det.train_info_["cv_folds"] == 0
    assert det.train_info_["early_stopping"]["held_out"] == 0
    res = shap_values(det, feats)
    assert res.values.any(), "the booster learnt no split"
    assert set(res.top(2)) & {RAG_NOUN, LN_NUM}
    with pytest.raises(ValueError, match="n_iter must be >= 0"):
        make_detector("spad", n_iter=-1)
