"""RAGLens on the tiny model with a small trained SAE: pooled features, MI selection,
EBM, exact contributions, artifacts."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch

from app.components.gam_charts import contributions_figure, importance_figure, shape_function_figure
from core.base.errors import DataError, ModelError, NotFittedError
from core.data import resolve_dataset
from core.detectors import make_detector
from core.detectors.raglens import INTERCEPT, RaglensDetector, feature_name
from core.engine.layout import render
from core.engine.trace import Needs, trace
from core.learning.mi import mutual_information, top_features
from core.pipeline.extract import extract_features, run_example
from core.signals.sae import save_sae


@pytest.fixture(scope="module")
def sae_dir(tiny_sae):
    return str(tiny_sae.path)


@pytest.fixture(scope="module")
def balanced():
    builtin = resolve_dataset("builtin")[1]
    pos = [e for e in builtin if e.label][:20]
    neg = [e for e in builtin if e.label is False][:20]
    return [x for pair in zip(pos, neg, strict=True) for x in pair]


@pytest.fixture(scope="module")
def fitted(tiny_model, sae_dir, balanced):
    det = make_detector("raglens", sae=sae_dir, top_k=12, max_rounds=200)
    feats = list(extract_features(tiny_model, balanced, [det]).features["raglens"])
    det.fit(feats, balanced)
    return det, feats


def test_features_max_pool_the_sae_over_the_answer(tiny_model, tiny_sae, sae_dir, toy_example):
    for activation in ("pre", "post"):
        det = make_detector("raglens", sae=sae_dir, activation=activation)
        f = run_example(tiny_model, toy_example, [det])["raglens"]
        layout = render(toy_example, tiny_model)
        tr = trace(tiny_model, layout, Needs.of(["resid_post"], layers=[1], positions="response"))
        z = tiny_sae.encode(tr.at("resid_post", 1, layout.response_positions), activation)
        np.testing.assert_allclose(f.response, z.max(0).values.numpy(), rtol=1e-6)
        assert f.names[:2] == ("F0", "F1") and len(f.names) == tiny_sae.d_sae
        assert f.tokens is None


def test_sae_identity_is_part_of_the_feature_key(tiny_sae, sae_dir, tmp_path):
    a = make_detector("raglens", sae=sae_dir).config.feature_hash()
    assert make_detector("raglens", sae=sae_dir, top_k=3).config.feature_hash() == a
    assert make_detector("raglens", sae=sae_dir, activation="post").config.feature_hash() != a
    other = tmp_path / "other"
    shutil.copytree(sae_dir, other)
    with torch.no_grad():
        tiny_sae.sae.W_enc.mul_(2.0)
    try:
        save_sae(tiny_sae.sae, other, layer=1, model_key=tiny_sae.model_key, meta={})
    finally:
        with torch.no_grad():
            tiny_sae.sae.W_enc.mul_(0.5)
    assert make_detector("raglens", sae=str(other)).config.feature_hash() != a
    with pytest.raises(DataError, match="ragscope sae train"):
        make_detector("raglens", sae=str(tmp_path / "none")).config.feature_hash()


def test_selection_is_the_top_mutual_information(fitted, balanced):
    from core.learning.labels import response_labels

    det, feats = fitted
    X = np.stack([f.response for f in feats])
    mi = mutual_information(X, response_labels(balanced), bins=50)
    assert det.selected_ == tuple(int(k) for k in top_features(mi, 12))
    assert det.train_info_["n_train"] == 40 and det.train_info_["n_hallucinated"] == 20


def test_contributions_sum_to_the_margin_and_the_score(fitted):
    det, feats = fitted
    contrib = det.contributions(feats)
    margins = det.margins(feats)
    np.testing.assert_allclose(contrib.sum(1), margins, rtol=1e-6, atol=1e-9)
    v = det.predict(feats[0])
    assert v.score == pytest.approx(1 / (1 + np.exp(-margins[0])), rel=1e-6)
    assert set(v.explanation) == {feature_name(k) for k in det.selected_} | {INTERCEPT}
    assert sum(v.explanation.values()) == pytest.approx(margins[0], rel=1e-6)
    imp = det.importances()
    assert sorted(k for k, _ in imp) == sorted(det.selected_)
    assert [s for _, s in imp] == sorted((s for _, s in imp), reverse=True)
    shape = det.shape_function(imp[0][0])
    assert shape["edges"].size == shape["scores"].size + 1
    with pytest.raises(ValueError, match="not among"):
        det.shape_function(-1)


def test_save_load_round_trip_and_sae_change_is_refused(
    fitted, tmp_path, tiny_sae, sae_dir, monkeypatch
):
    det, feats = fitted
    out = det.save(tmp_path / "raglens")
    with pytest.raises(DataError, match="outside this artifact and the shipped assets"):
        RaglensDetector.load(out, model_key=det.model_key_)
    monkeypatch.setenv("RAGSCOPE_SAE_DIR", sae_dir)  # the operator trusts that SAE folder
    again = RaglensDetector.load(out, model_key=det.model_key_)
    np.testing.assert_allclose(
        [again.predict(f).score for f in feats], [det.predict(f).score for f in feats]
    )
    assert again.selected_ == det.selected_
    # Retraining the SAE in place makes the artifact stale: refused, with the fix.
    moved = tmp_path / "sae-copy"
    shutil.copytree(sae_dir, moved)
    cfg = (out / "cfg.json").read_text().replace(sae_dir, str(moved))
    (out / "cfg.json").write_text(cfg)
    monkeypatch.setenv("RAGSCOPE_SAE_DIR", str(moved))
    save_sae(tiny_sae.sae, moved, layer=1, model_key=tiny_sae.model_key, meta={"retrained": 1})
    (moved / "ragscope_sae.json").write_text(
        (moved / "ragscope_sae.json")
        .read_text()
        .replace('"weights_sha256": "', '"weights_sha256": "x')
    )
    with pytest.raises(ModelError, match="another SAE"):
        RaglensDetector.load(out, model_key=det.model_key_)


def test_unfitted_foreign_and_one_class_fail_clearly(fitted, balanced, sae_dir):
    det, feats = fitted
    with pytest.raises(NotFittedError):
        make_detector("raglens", sae=sae_dir).predict(feats[0])
    with pytest.raises(DataError, match="hallucinated and faithful"):
        make_detector("raglens", sae=sae_dir).fit(feats[::2], balanced[::2])
    with pytest.raises(ValueError, match="activation"):
        make_detector("raglens", activation="mean")
    with pytest.raises(ModelError, match="trained on"):
        make_detector("raglens", sae=sae_dir).token_activations(
            type(
                "R", (), {"trace": object(), "model": type("M", (), {"key": "x", "d_model": 64})()}
            )()
        )


def test_figures_show_the_ebm_numbers(fitted):
    det, feats = fitted
    imp = det.importances()
    bars = importance_figure(det, top=5).data[0]
    assert list(bars.y) == [f"F{k}" for k, _ in imp[:5]][::-1]
    np.testing.assert_allclose(bars.x, [v for _, v in imp[:5]][::-1])
    k = imp[0][0]
    fig = shape_function_figure(det, k)
    sf = det.shape_function(k)
    line = fig.data[0]
    assert len(line.x) == 2 * sf["scores"].size
    np.testing.assert_allclose(line.y[::2], sf["scores"])
    np.testing.assert_allclose(line.x[::2], sf["edges"][:-1])
    v = det.predict(feats[0])
    c = contributions_figure(v.explanation, top=4).data[0]
    top4 = sorted(
        (kv for kv in v.explanation.items() if kv[0] != INTERCEPT), key=lambda kv: -abs(kv[1])
    )[:4]
    assert list(c.y) == [n for n, _ in top4][::-1]
    assert list(c.marker.color) == ["#d62728" if x > 0 else "#1f77b4" for x in c.x]


def test_explain_answer_matches_features_and_tokens(fitted, tiny_model, balanced):
    det, feats = fitted
    ans = det.explain_answer(tiny_model, balanced[0])
    assert ans.verdict.score == pytest.approx(det.predict(feats[0]).score, rel=1e-6)
    assert ans.activations.shape == (len(ans.tokens), len(det.selected_))
    # Max over tokens of each selected feature = the pooled feature the EBM read.
    np.testing.assert_allclose(
        ans.activations.max(0), feats[0].response[list(det.selected_)], rtol=1e-5
    )
    for k in ans.top_positive(3):
        assert ans.verdict.explanation[feature_name(k)] > 0
    np.testing.assert_array_equal(ans.activations_of(det.selected_[1]), ans.activations[:, 1])


def test_raw_residual_variant_needs_no_sae(tiny_model, balanced, tmp_path):
    det = make_detector("raglens", sae=str(tmp_path / "no-sae"), raw_layer=0, top_k=6)
    feats = list(extract_features(tiny_model, balanced, [det]).features["raglens"])
    layout = render(balanced[0], tiny_model)
    tr = trace(tiny_model, layout, Needs.of(["resid_post"], layers=[0], positions="response"))
    want = tr.at("resid_post", 0, layout.response_positions).max(0).values.numpy()
    np.testing.assert_allclose(feats[0].response, want, rtol=1e-6)
    assert feats[0].names[:2] == ("H0", "H1") and len(feats[0].names) == tiny_model.info.d_model
    det.fit(feats, balanced)
    v = det.predict(feats[0])
    assert all(k.startswith("H") for k in v.explanation if k != INTERCEPT)
    again = RaglensDetector.load(det.save(tmp_path / "raw"), model_key=det.model_key_)
    assert again.predict(feats[0]).score == pytest.approx(v.score)
    with pytest.raises(ModelError, match="outside"):
        make_detector("raglens", raw_layer=7).needs(tiny_model.info)


def test_runnable_detectors_leave_out_raglens_without_an_sae_for_the_model(
    tiny_model, tiny_sae, monkeypatch, tmp_path
):
    from core.detectors import available_detectors, runnable_detectors

    monkeypatch.setenv("RAGSCOPE_SAE_DIR", str(tmp_path / "none"))
    assert "raglens" in available_detectors()
    assert "raglens" not in runnable_detectors(tiny_model)
    assert "no SAE" in make_detector("raglens").unavailable(tiny_model.info)
    monkeypatch.setenv("RAGSCOPE_SAE_DIR", str(tiny_sae.path))
    assert "raglens" in runnable_detectors(tiny_model)
    assert set(available_detectors()) - set(runnable_detectors(tiny_model)) == set()
