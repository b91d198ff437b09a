"""InterpDetect: chunk targets, feature selection, classifier choice, skops artifacts."""

from __future__ import annotations

import builtins
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import skops.io as sio
from sklearn.metrics import f1_score
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import FunctionTransformer, StandardScaler

import core.detectors.interpdetect as interp
from core.base.errors import DataError, ModelError, NotFittedError
from core.base.examples import RAGExample, Span
from core.data import resolve_dataset
from core.detectors import make_detector
from core.detectors.interpdetect import (
    PIPELINE_FILE,
    InterpDetectDetector,
    chunk_targets,
    select_features,
)
from core.engine.layout import render
from core.learning.contract import Features, tokens_from_chunks
from core.pipeline.extract import extract_features
from core.signals.chunking import chunk_example

CLASSIFIER_TYPES = {
    "lr": "LogisticRegression",
    "svc": "SVC",
    "rf": "RandomForestClassifier",
    "xgb": "XGBClassifier",
}


@pytest.fixture(scope="module", autouse=True)
def _one_thread(one_torch_thread):
    """Tiny, latency-bound forwards: one torch thread (see tests/conftest.py)."""


# --------------------------------------------------------------------------- targets

RESPONSE = "Ada built it in 1820. It is made of red granite. It spans the Wend."


def _chunked(offsets: list[tuple[int, int]]) -> Features:
    names = ("ECS_L0H0", "PKS_L0")
    return Features(
        detector="interpdetect",
        example_id="t",
        model="m",
        names=names,
        response=np.zeros(2),
        chunk_names=names,
        chunks=np.zeros((len(offsets), 2)),
        chunk_offsets=np.asarray(offsets),
    )


def _example(**kw) -> RAGExample:
    return RAGExample(id="t", question="Q?", passages=("P.",), response=RESPONSE, **kw)


def test_chunk_targets_follow_spans_then_the_response_label() -> None:
    # Three sentences, the middle two overlapping by a few characters.
    f = _chunked([(0, 21), (18, 48), (49, 67)])
    granite = RESPONSE.index("red granite")
    span = Span(start=granite, end=granite + len("red granite"))
    np.testing.assert_array_equal(chunk_targets(f, _example(spans=(span,))), [0, 1, 0])
    # A span across a chunk boundary marks both chunks; end is exclusive.
    np.testing.assert_array_equal(
        chunk_targets(f, _example(spans=(Span(start=19, end=20),))), [1, 1, 0]
    )
    np.testing.assert_array_equal(
        chunk_targets(f, _example(spans=(Span(start=48, end=49),))), [0, 0, 0]
    )
    np.testing.assert_array_equal(
        chunk_targets(f, _example(spans=(Span(start=0, end=2), Span(start=60, end=62)))),
        [1, 0, 1],
    )
    # Response-level labels without spans: every chunk takes the label.
    np.testing.assert_array_equal(chunk_targets(f, _example(label=True)), [1, 1, 1])
    np.testing.assert_array_equal(chunk_targets(f, _example(label=False)), [0, 0, 0])
    with pytest.raises(DataError, match="no label"):
        chunk_targets(f, _example())


# --------------------------------------------------------------------------- selection


def test_select_features_drops_constant_duplicate_and_correlated_columns() -> None:
    rng = np.random.default_rng(0)
    n = 120
    y = rng.permutation(np.arange(n) % 2)
    signal = y + rng.normal(0, 0.6, n)
    noise = rng.normal(0, 1, n)
    rare = np.zeros(n)
    rare[rng.choice(n, 3, replace=False)] = 1.0  # one value in 97.5% of rows
    mostly = np.zeros(n)
    mostly[rng.choice(n, 18, replace=False)] = 1.0  # one value in 85% of rows: kept
    X = pd.DataFrame(
        {
            "signal": signal,
            "const": np.full(n, 3.0),
            "noise": noise,
            "rare": rare,
            "twin": 2.0 * signal + rng.normal(0, 0.3, n),  # |r| about 0.98 with signal
            "noise_copy": noise.copy(),
            "mostly": mostly,
            "other": rng.normal(0, 1, n),
        }
    )
    assert 0.9 < np.corrcoef(X["signal"], X["twin"])[0, 1] < 0.995
    kept = select_features(X, y, const_tol=0.95, corr_threshold=0.9, seed=0)
    assert not {"const", "rare", "noise_copy"} & set(kept)
    assert len({"signal", "twin"} & set(kept)) == 1
    assert {"noise", "mostly", "other"} <= set(kept)
    assert len(kept) == 4
    # A looser tolerance keeps the near-constant column; a stricter threshold keeps the twin.
    assert "rare" in select_features(X, y, const_tol=0.99, corr_threshold=0.9, seed=0)
    assert {"signal", "twin"} <= set(
        select_features(X, y, const_tol=0.95, corr_threshold=0.995, seed=0)
    )


def test_select_features_on_constant_data_is_a_data_error() -> None:
    X = pd.DataFrame({"a": np.ones(20), "b": np.zeros(20)})
    with pytest.raises(DataError, match="cannot select features.*constant"):
        select_features(X, np.arange(20) % 2, const_tol=0.95, corr_threshold=0.9, seed=0)


# --------------------------------------------------------------------------- real features


def _pairs(n: int) -> list[RAGExample]:
    """``n`` built-in qa sources (faithful, hallucinated), shortest passages first."""
    _, examples = resolve_dataset("builtin")
    groups: dict[str, list[RAGExample]] = {}
    for e in examples:
        if e.task == "qa":
            groups.setdefault(e.provenance.group, []).append(e)
    pairs = [
        sorted(g, key=lambda e: bool(e.label))
        for g in groups.values()
        if sorted(bool(e.label) for e in g) == [False, True]
    ]
    pairs.sort(key=lambda g: (sum(map(len, g[0].passages)), g[0].id))
    return [e for g in pairs[:n] for e in g]


@pytest.fixture(scope="module")
def real(tiny_model):
    """InterpDetect features of 5 faithful + 5 hallucinated built-in answers."""
    exs = _pairs(5)
    ext = extract_features(tiny_model, exs, [make_detector("interpdetect")])
    assert list(ext.examples) == exs
    feats = ext.features["interpdetect"]
    # Train on 3 sources, validate on the other 2.
    return (exs[:6], list(feats[:6])), (exs[6:], list(feats[6:]))


def _fit(real, **config) -> InterpDetectDetector:
    (e_tr, f_tr), (e_va, f_va) = real
    return make_detector("interpdetect", **config).fit(f_tr, e_tr, validation=(f_va, e_va))


@pytest.fixture(scope="module")
def fitted(real) -> InterpDetectDetector:
    return _fit(real)


def _all_features(real) -> list[Features]:
    return real[0][1] + real[1][1]


def test_features_are_one_row_per_response_sentence(tiny_model, real) -> None:
    names = tuple(f"ECS_L{ly}H{h}" for ly in range(2) for h in range(4)) + ("PKS_L0", "PKS_L1")
    for ex, f in zip(real[0][0] + real[1][0], _all_features(real), strict=True):
        layout = render(ex, tiny_model)
        cs = chunk_example(layout, "sentence")
        assert f.names == f.chunk_names == names
        assert f.chunks.shape == (len(cs.response), len(names)) and len(cs.response) >= 2
        np.testing.assert_array_equal(f.chunk_offsets, cs.response_offsets)
        np.testing.assert_array_equal(f.token_offsets, layout.response_offsets)
        np.testing.assert_allclose(f.response, f.chunks.mean(0), rtol=1e-5, atol=1e-7)
        assert ((f.chunks[:, :8] >= -1 - 1e-6) & (f.chunks[:, :8] <= 1 + 1e-6)).all()


def test_fit_keeps_the_classifier_with_the_best_validation_f1(real, fitted) -> None:
    det = fitted
    assert list(det.candidates_) == ["lr", "svc", "rf", "xgb"]
    best = max(det.candidates_.values())
    first_best = next(n for n, f1 in det.candidates_.items() if f1 == best)
    assert det.classifier_name_ == first_best
    assert type(det.pipeline_[-1]).__name__ == CLASSIFIER_TYPES[first_best]
    assert det.train_info_["f1_on"] == "validation" and det.train_info_["classifier"] == first_best
    assert set(det.kept_) <= set(det.names_) and len(det.kept_) == det.train_info_["n_kept"]
    # The recorded F1 is the response-level F1 (score = max chunk probability) on the
    # validation split, at the threshold that maximises it.
    (e_va, f_va) = real[1]
    scores = np.asarray([det.predict(f).score for f in f_va])
    y_va = np.asarray([int(bool(e.label)) for e in e_va])
    best_f1 = max(f1_score(y_va, (scores >= t).astype(int), zero_division=0) for t in scores)
    assert det.candidates_[first_best] == pytest.approx(best_f1)
    # Chunk targets: the training chunks that overlap the hallucinated spans.
    (e_tr, f_tr) = real[0]
    y = np.concatenate([chunk_targets(f, e) for f, e in zip(f_tr, e_tr, strict=True)])
    assert det.train_info_["n_chunks"] == len(y)
    assert det.train_info_["n_positive_chunks"] == int(y.sum()) > 0


def test_classifier_choice_follows_validation_f1(real, monkeypatch) -> None:
    # Controlled validation scores: svc and xgb tie for the best, svc comes first.
    fake = {
        "LogisticRegression": 0.2,
        "CalibratedClassifierCV": 0.9,  # the SVC, with calibrated probabilities
        "RandomForestClassifier": 0.5,
        "XGBClassifier": 0.9,
    }
    current: dict[str, InterpDetectDetector] = {}
    real_probs = InterpDetectDetector._chunk_probs

    def spy(self, f):
        current["det"] = self
        return real_probs(self, f)

    def f1(chunk_prob, y, threshold=0.5):
        return fake[type(current["det"].pipeline_[-1]).__name__]

    monkeypatch.setattr(InterpDetectDetector, "_chunk_probs", spy)
    monkeypatch.setattr(interp, "_response_f1", f1)
    det = _fit(real)
    assert det.candidates_ == {"lr": 0.2, "svc": 0.9, "rf": 0.5, "xgb": 0.9}
    assert det.classifier_name_ == "svc"
    assert type(det.pipeline_[-1].estimator).__name__ == "SVC"


def test_restricting_the_candidates_to_logistic_regression(real) -> None:
    det = _fit(real, classifiers=("lr",))
    assert list(det.candidates_) == ["lr"] and det.classifier_name_ == "lr"
    assert type(det.pipeline_[-1]).__name__ == "LogisticRegression"
    assert isinstance(det.pipeline_[0], StandardScaler)
    with pytest.raises(ValueError, match="classifiers must be"):
        make_detector("interpdetect", classifiers=("knn",))


def test_pinned_keeps_the_chosen_classifier_and_lr_c_regularises(real, fitted) -> None:
    """``pinned()`` names the classifier chosen on validation (cross-fitted calibration
    refits only that one); ``lr_c`` is the logistic regression's C, checked."""
    assert fitted.pinned() == {"classifiers": (fitted.classifier_name_,)}
    again = _fit(real, **fitted.pinned())
    assert list(again.candidates_) == [fitted.classifier_name_]
    lr = _fit(real, classifiers=("lr",), lr_c=0.05)
    assert lr.pipeline_[-1].C == 0.05
    assert _fit(real, classifiers=("lr",)).pipeline_[-1].C == 1.0  # scikit-learn's default
    assert make_detector("interpdetect", lr_c=0.05).config.feature_hash() == (
        make_detector("interpdetect").config.feature_hash()
    )
    for bad in (0, -1.0, float("nan"), float("inf"), True, "0.1"):
        with pytest.raises(ValueError, match="lr_c"):
            make_detector("interpdetect", lr_c=bad)
    with pytest.raises(NotFittedError):
        InterpDetectDetector().pinned()


def test_predict_scores_the_response_by_its_most_suspicious_chunk(real, fitted) -> None:
    det = fitted
    with pytest.raises(NotFittedError, match="ragscope train --detectors interpdetect"):
        InterpDetectDetector().predict(real[0][1][0])
    for f in _all_features(real):
        v = det.predict(f)
        X = pd.DataFrame(f.chunks.astype(np.float64), columns=list(f.names))[list(det.kept_)]
        probs = det.pipeline_.predict_proba(X)[:, 1]
        np.testing.assert_allclose(v.chunk_scores, probs, rtol=1e-6)
        assert v.score == pytest.approx(probs.max())
        assert v.explanation["max_chunk_probability"] == pytest.approx(v.score)
        assert v.explanation["n_chunks"] == len(probs)
        assert v.hallucinated == (v.score >= det.threshold_)
        np.testing.assert_array_equal(
            v.token_scores, tokens_from_chunks(v.chunk_scores, f.chunk_offsets, f.token_offsets)
        )
        assert v.token_scores.max() == pytest.approx(v.score)
    f = real[1][1][0]
    score = det.predict(f).score
    try:
        det.threshold_ = score
        assert det.predict(f).hallucinated is True
        det.threshold_ = float(np.nextafter(score, 1.0))
        assert det.predict(f).hallucinated is False
    finally:
        det.threshold_ = 0.5
    alien = Features(
        detector=f.detector,
        example_id=f.example_id,
        model="another-model",
        names=f.names,
        response=f.response,
        chunk_names=f.chunk_names,
        chunks=f.chunks,
        chunk_offsets=f.chunk_offsets,
    )
    with pytest.raises(ModelError, match="another-model"):
        det.predict(alien)


# --------------------------------------------------------------------------- artifacts


@pytest.mark.parametrize("name", ["lr", "svc", "rf", "xgb"])
def test_skops_artifact_round_trip(tiny_model, real, tmp_path: Path, name: str) -> None:
    det = _fit(real, classifiers=(name,))
    det.threshold_ = 0.3
    folder = det.save(tmp_path / name)
    assert (folder / PIPELINE_FILE).is_file()
    again = InterpDetectDetector.load(folder, model_key=tiny_model.info.key)
    assert again.config == det.config and again.threshold_ == 0.3
    assert again.kept_ == det.kept_ and again.classifier_name_ == name
    assert again.candidates_ == det.candidates_
    for f in _all_features(real):
        v, w = det.predict(f), again.predict(f)
        assert w.score == v.score and w.hallucinated == v.hallucinated
        np.testing.assert_array_equal(w.chunk_scores, v.chunk_scores)
        np.testing.assert_array_equal(w.token_scores, v.token_scores)
    with pytest.raises(ModelError, match="trained on model"):
        InterpDetectDetector.load(folder, model_key="another-model")


class Payload:
    """Not a scikit-learn, XGBoost or NumPy type."""

    def __init__(self) -> None:
        self.x = 1


def _untrusted(kind: str):
    if kind == "custom class":
        return Payload()
    # A scikit-learn pipeline whose first step would call a builtin on the input.
    return Pipeline([("f", FunctionTransformer(func=builtins.exec)), ("s", StandardScaler())])


@pytest.mark.parametrize("kind", ["custom class", "builtin function"])
def test_artifact_with_an_untrusted_type_is_refused(
    fitted, tmp_path: Path, kind: str, reseal
) -> None:
    folder = fitted.save(tmp_path / "art")
    path = folder / PIPELINE_FILE
    sio.dump(_untrusted(kind), path)
    reseal(folder)
    bad = sio.get_untrusted_types(file=path)
    assert bad  # skops itself does not trust it
    with pytest.raises(DataError, match="refusing to load") as err:
        InterpDetectDetector.load(folder)
    assert any(t.rsplit(".", 1)[-1] in str(err.value) for t in bad)
    assert "ragscope train --detectors interpdetect" in str(err.value)


def test_malformed_artifacts_name_the_fix(fitted, tmp_path: Path, reseal) -> None:
    folder = fitted.save(tmp_path / "art")
    weights = json.loads((folder / "weights.json").read_text())
    (folder / "weights.json").write_text(json.dumps({**weights, "kept": ["NOT_A_FEATURE"]}))
    reseal(folder)
    with pytest.raises(DataError, match="malformed interpdetect artifact.*ragscope train"):
        InterpDetectDetector.load(folder)
    (folder / "weights.json").write_text(json.dumps(weights))
    (folder / PIPELINE_FILE).write_bytes(b"not a zip file")
    reseal(folder)
    with pytest.raises(DataError, match="not a readable skops file.*ragscope train") as err:
        InterpDetectDetector.load(folder)
    assert str(folder) in str(err.value)
    (folder / PIPELINE_FILE).unlink()
    with pytest.raises(DataError, match="missing pipeline.skops"):
        InterpDetectDetector.load(folder)
