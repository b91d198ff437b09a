"""ReDeEP detectors: selection on synthetic features, real tiny-model features, artifacts."""

from __future__ import annotations

import itertools
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

import core.detectors.common
from core.base.errors import DataError, ModelError, NotFittedError
from core.base.examples import RAGExample
from core.data import resolve_dataset
from core.detectors import make_detector
from core.detectors.common import head_name
from core.detectors.interpdetect import InterpDetectConfig
from core.detectors.redeep import (
    RedeepChunkConfig,
    RedeepChunkDetector,
    RedeepTokenConfig,
    RedeepTokenDetector,
    copying_heads,
)
from core.engine.layout import render
from core.engine.trace import trace
from core.evaluation.evaluate import EvalOptions, Splits, evaluate
from core.learning.contract import Features, tokens_from_chunks
from core.pipeline.extract import FeatureCache, extract_features, run_example
from core.signals.chunking import chunk_example
from core.signals.ecs import chunk_ecs, chunk_means, token_ecs
from core.signals.lens import pks_from_trace
from core.storage import Store

CHUNK = {"chunk_size": 64, "chunk_overlap": 10}  # several recursive chunks per short answer


@pytest.fixture(scope="module", autouse=True)
def _one_thread(one_torch_thread):
    """Tiny, latency-bound forwards: one torch thread (see tests/conftest.py)."""


# --------------------------------------------------------------------------- selection (synthetic)

HEADS = ("ECS_L1H0", "ECS_L0H3", "ECS_L1H2", "ECS_L0H1")
LAYERS = ("PKS_L0", "PKS_L1", "PKS_L2")
NAMES = HEADS + LAYERS
GOOD_HEAD, GOOD_LAYER = 2, 1  # ECS_L1H2 is low on hallucinations, PKS_L1 high


def _synthetic(n: int, seed: int, shift: float = 0.0) -> tuple[list[Features], list[RAGExample]]:
    """Responses whose ECS_L1H2 tokens sit lower and PKS_L1 tokens higher when hallucinated.

    Both signals are noisy per response (neither alone is perfect); the other
    columns are noise. ``shift`` moves every value (validation outside the
    training range).
    """
    rng = np.random.default_rng(seed)
    feats, exs = [], []
    for i in range(n):
        y = i % 2
        t = int(rng.integers(3, 8))
        ecs = rng.uniform(0, 1, size=(t, len(HEADS)))
        pks = rng.uniform(0, 1, size=(t, len(LAYERS)))
        ecs[:, GOOD_HEAD] = (0.3 if y else 0.6) + rng.normal(0, 0.15) + 0.05 * rng.random(t)
        pks[:, GOOD_LAYER] = (0.6 if y else 0.3) + rng.normal(0, 0.15) + 0.05 * rng.random(t)
        tokens = np.concatenate([ecs, pks], axis=1) + shift
        offs = np.stack([np.arange(t), np.arange(t) + 1], axis=1)
        feats.append(
            Features(
                detector="redeep_token",
                example_id=f"s{seed}-{i}",
                model="synthetic",
                names=NAMES,
                response=tokens.mean(0),
                token_names=NAMES,
                tokens=tokens,
                token_offsets=offs,
            )
        )
        exs.append(
            RAGExample(
                id=f"s{seed}-{i}", question="Q?", passages=("P.",), response="R", label=bool(y)
            )
        )
    return feats, exs


def _labels(exs: list[RAGExample]) -> np.ndarray:
    return np.asarray([int(bool(e.label)) for e in exs])


def _grid_reference(train, validation, cfg: RedeepTokenConfig):
    """The best (AUROC, heads, layers, beta, ranges) over the grid, written out directly."""
    (f_tr, e_tr), (f_va, e_va) = train, validation
    y_tr, y_va = _labels(e_tr), _labels(e_va)
    resp = np.stack([f.response for f in f_tr]).astype(np.float64)
    units = np.concatenate([f.tokens for f in f_tr]).astype(np.float64)
    v_resp = np.stack([f.response for f in f_va]).astype(np.float64)
    nh = len(HEADS)
    h_auc = [roc_auc_score(1 - y_tr, resp[:, i]) for i in range(nh)]
    l_auc = [roc_auc_score(y_tr, resp[:, nh + i]) for i in range(len(LAYERS))]
    h_order = sorted(range(nh), key=lambda i: -h_auc[i])
    l_order = sorted(range(len(LAYERS)), key=lambda i: -l_auc[i])
    best = None
    ns = sorted({min(n, nh) for n in cfg.heads_grid})
    ks = sorted({min(k, len(LAYERS)) for k in cfg.layers_grid})
    for n, k, beta in itertools.product(ns, ks, cfg.beta_grid):
        hs, ls = h_order[:n], l_order[:k]
        e_units = units[:, hs].sum(1)
        p_units = units[:, [nh + i for i in ls]].sum(1)
        e_rng, p_rng = (e_units.min(), e_units.max()), (p_units.min(), p_units.max())
        e = (v_resp[:, hs].sum(1) - e_rng[0]) / (e_rng[1] - e_rng[0])
        p = (v_resp[:, [nh + i for i in ls]].sum(1) - p_rng[0]) / (p_rng[1] - p_rng[0])
        auc = roc_auc_score(y_va, p - beta * e)
        if best is None or auc > best[0] + 1e-12:
            best = (auc, tuple(hs), tuple(ls), beta, e_rng, p_rng)
    return best, h_auc, l_auc


def test_selection_ranks_and_chooses_the_informative_head_and_layer() -> None:
    train = _synthetic(30, seed=1)
    validation = _synthetic(20, seed=2, shift=3.0)
    cfg = RedeepTokenConfig(
        heads_grid=(1, 2, 4), layers_grid=(1, 2, 3), beta_grid=(0.0, 0.5, 1.0, 2.0)
    )
    det = RedeepTokenDetector(cfg).fit(*train, validation=validation)
    # Ranking: the informative head and layer come first, with sklearn's AUCs.
    assert max(det.head_auc_, key=det.head_auc_.get) == HEADS[GOOD_HEAD]
    assert max(det.layer_auc_, key=det.layer_auc_.get) == LAYERS[GOOD_LAYER]
    best, h_auc, l_auc = _grid_reference(train, validation, cfg)
    assert [det.head_auc_[n] for n in HEADS] == pytest.approx(h_auc)
    assert [det.layer_auc_[n] for n in LAYERS] == pytest.approx(l_auc)
    sel = det.selection_
    assert sel.heads[0] == GOOD_HEAD and sel.layers[0] == GOOD_LAYER
    assert det.selected_heads[0] == (1, 2) and det.selected_layers[0] == 1
    # The chosen grid point is the reference's, and its recorded AUROC is sklearn's on validation.
    auc, hs, ls, beta, e_rng, p_rng = best
    assert (sel.heads, sel.layers, sel.beta) == (hs, ls, beta)
    y_va = _labels(validation[1])
    v_resp = np.stack([f.response for f in validation[0]])
    # Both signals count: the chosen rule weighs ECS and beats either signal alone.
    alone = (
        roc_auc_score(1 - y_va, v_resp[:, GOOD_HEAD]),
        roc_auc_score(y_va, v_resp[:, len(HEADS) + GOOD_LAYER]),
    )
    assert beta > 0 and auc > max(alone)
    assert sel.auc == pytest.approx(auc)
    assert sel.auc == pytest.approx(roc_auc_score(y_va, det.unit_h(v_resp)))
    assert det.train_info_["selected_on"] == "validation"
    assert det.train_info_["auc_rule"] == pytest.approx(auc)
    # Min-max ranges: training units only (validation is shifted far outside them).
    assert sel.ecs_range == pytest.approx(e_rng) and sel.pks_range == pytest.approx(p_rng)
    units = np.concatenate([f.tokens for f in train[0] + validation[0]]).astype(np.float64)
    assert sel.ecs_range[1] < units[:, list(sel.heads)].sum(1).max()
    # pinned: N, K and beta as chosen; a detector built with them selects nothing else
    pins = det.pinned()
    assert pins == {
        "heads_grid": (len(hs),),
        "layers_grid": (len(ls),),
        "beta_grid": (beta,),
    }
    again = RedeepTokenDetector(replace(cfg, **pins)).fit(*train)
    assert (again.selection_.heads, again.selection_.layers, again.selection_.beta) == (
        hs,
        ls,
        beta,
    )


def test_selection_without_validation_uses_training_responses() -> None:
    train = _synthetic(30, seed=1)
    cfg = RedeepTokenConfig(heads_grid=(1, 2), layers_grid=(1, 2), beta_grid=(0.0, 1.0))
    det = RedeepTokenDetector(cfg).fit(*train)
    best, _, _ = _grid_reference(train, train, cfg)
    assert det.train_info_["selected_on"] == "train"
    assert (det.selection_.heads, det.selection_.layers, det.selection_.beta) == best[1:4]
    assert det.selection_.auc == pytest.approx(best[0])


def _own_sources(exs: list[RAGExample]) -> list[RAGExample]:
    """The same answers, each with its own source (grouped CV needs several)."""
    return [
        RAGExample(id=e.id, question=f"Q{i}?", passages=("P.",), response="R", label=e.label)
        for i, e in enumerate(exs)
    ]


def test_probe_scorer_reads_every_column_and_round_trips(tmp_path: Path) -> None:
    feats, exs = _synthetic(60, seed=3)
    exs = _own_sources(exs)
    val_f, val_e = _synthetic(30, seed=4)
    val_e = _own_sources(val_e)
    cfg = RedeepTokenConfig(
        heads_grid=(1, 2), layers_grid=(1, 2), beta_grid=(0.0, 1.0), scorer="probe"
    )
    det = RedeepTokenDetector(cfg).fit(feats, exs, validation=(val_f, val_e))
    info = det.train_info_
    assert info["probe_C"] in (0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1.0)
    assert np.isfinite(info["probe_cv_log_loss"]) and info["auc_probe"] > 0.8
    # The probe weighs the two informative columns most, in the paper's directions.
    coef = det.probe_.coef_
    assert coef.shape == (len(NAMES),)
    assert np.argsort(-np.abs(coef))[:2].tolist() in (
        [GOOD_HEAD, len(HEADS) + GOOD_LAYER],
        [len(HEADS) + GOOD_LAYER, GOOD_HEAD],
    )
    assert coef[GOOD_HEAD] < 0 < coef[len(HEADS) + GOOD_LAYER]
    v = det.predict(val_f[0])
    assert v.score == pytest.approx(v.explanation["probe_score"])
    assert v.score == pytest.approx(det.probe_.predict_proba(val_f[0].tokens.mean(0)[None])[0])
    np.testing.assert_allclose(v.token_scores, det.probe_.predict_proba(val_f[0].tokens), rtol=1e-6)
    back = RedeepTokenDetector.load(det.save(tmp_path / "r"), model_key="synthetic")
    assert back.config.scorer == "probe"
    assert back.predict(val_f[0]).score == pytest.approx(v.score)
    # Other scorers fit no probe; asking a probe-less artifact for the probe fails clearly.
    rule = RedeepTokenDetector(replace(cfg, scorer="rule")).fit(feats, exs)
    assert rule.probe_ is None and "probe_C" not in rule.train_info_
    rule.config = cfg
    with pytest.raises(ModelError, match="retrain"):
        rule.predict(val_f[0])


def test_fit_refuses_mixed_models_and_mismatched_lengths() -> None:
    feats, exs = _synthetic(6, seed=3)
    with pytest.raises(DataError, match="one Features per example"):
        RedeepTokenDetector().fit(feats, exs[:-1])
    other = Features(
        detector="redeep_token",
        example_id="x",
        model="another",
        names=NAMES,
        response=np.zeros(len(NAMES)),
    )
    with pytest.raises(ModelError, match="different models"):
        RedeepTokenDetector().fit([*feats[:-1], other], exs)


# --------------------------------------------------------------------------- real features


def _pairs(n: int) -> list[list[RAGExample]]:
    """``n`` built-in qa sources (a faithful and a hallucinated answer each), shortest first."""
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
    return pairs[:n]


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory):
    with Store(tmp_path_factory.mktemp("db") / "redeep.sqlite3") as s:
        yield s


@pytest.fixture(scope="module")
def real(tiny_model, store):
    """Token and chunk features of 4 faithful + 4 hallucinated built-in answers (cached)."""
    exs = [e for p in _pairs(4) for e in p]
    dets = [make_detector("redeep_token"), make_detector("redeep_chunk", **CHUNK)]
    ext = extract_features(tiny_model, exs, dets, cache=FeatureCache(store))
    assert list(ext.examples) == exs
    return ext


def _split(real):
    ex, tok, chk = real.examples, real.features["redeep_token"], real.features["redeep_chunk"]
    # Sources alternate in pairs: train on 2 sources, validate on the other 2.
    return (ex[:4], tok[:4], chk[:4]), (ex[4:], tok[4:], chk[4:])


@pytest.fixture(scope="module")
def fitted(real):
    (e_tr, t_tr, c_tr), (e_va, t_va, c_va) = _split(real)
    out = {}
    for scorer in ("rule", "logistic"):
        out["redeep_token", scorer] = make_detector("redeep_token", scorer=scorer).fit(
            t_tr, e_tr, validation=(t_va, e_va)
        )
        out["redeep_chunk", scorer] = make_detector("redeep_chunk", scorer=scorer, **CHUNK).fit(
            c_tr, e_tr, validation=(c_va, e_va)
        )
    return out


def test_real_features_have_the_layout_shapes(tiny_model, real) -> None:
    heads = copying_heads(tiny_model, 32, "exact")
    assert len(heads) == 8  # fewer than 32 heads: every head is a candidate
    names = tuple(head_name(*h) for h in heads) + ("PKS_L0", "PKS_L1")
    n_chunks = []
    for ex, ft, fc in zip(
        real.examples, real.features["redeep_token"], real.features["redeep_chunk"], strict=True
    ):
        layout = render(ex, tiny_model)
        n = len(layout.response_positions)
        assert ft.names == ft.token_names == fc.names == fc.chunk_names == names
        assert ft.tokens.shape == (n, 10) and fc.tokens is None
        np.testing.assert_array_equal(ft.token_offsets, layout.response_offsets)
        np.testing.assert_allclose(ft.response, ft.tokens.mean(0), rtol=1e-5, atol=1e-7)
        cs = chunk_example(layout, "recursive", **CHUNK)
        assert fc.chunks.shape == (len(cs.response), 10)
        np.testing.assert_array_equal(fc.chunk_offsets, cs.response_offsets)
        np.testing.assert_array_equal(fc.token_offsets, layout.response_offsets)
        np.testing.assert_allclose(fc.response, fc.chunks.mean(0), rtol=1e-5, atol=1e-7)
        n_chunks.append(len(cs.response))
    assert max(n_chunks) >= 3


def test_real_feature_columns_are_ecs_of_each_head_and_pks_of_each_layer(tiny_model, real) -> None:
    ex, ft, fc = (
        real.examples[1],
        real.features["redeep_token"][1],
        real.features["redeep_chunk"][1],
    )
    det = make_detector("redeep_token")
    layout = render(ex, tiny_model)
    tr = trace(tiny_model, layout, det.needs(tiny_model.info))
    heads = copying_heads(tiny_model, 32, "exact")
    pks = pks_from_trace(tiny_model, tr)  # [layer, T]
    np.testing.assert_allclose(ft.tokens[:, :8], token_ecs(tr, heads), atol=1e-6)
    np.testing.assert_allclose(ft.tokens[:, 8:], pks.T, rtol=1e-3, atol=1e-7)
    cs = chunk_example(layout, "recursive", **CHUNK)
    ce = chunk_ecs(tr, cs, [0, 1], pool="mean")
    np.testing.assert_allclose(
        fc.chunks[:, :8], np.stack([ce.ecs[:, ly, h] for ly, h in heads], 1), atol=1e-6
    )
    np.testing.assert_allclose(fc.chunks[:, 8:], chunk_means(pks, cs), rtol=1e-3, atol=1e-7)


def test_predictions_scores_and_explanations(real, fitted) -> None:
    for name in ("redeep_token", "redeep_chunk"):
        rule, logistic = fitted[name, "rule"], fitted[name, "logistic"]
        assert rule.selection_ == logistic.selection_  # the scorer only changes the verdict
        differs = False
        for f in real.features[name]:
            v, w = rule.predict(f), logistic.predict(f)
            for verdict in (v, w):
                assert 0.0 <= verdict.score <= 1.0
                assert verdict.token_scores.shape == (f.token_offsets.shape[0],)
                assert ((verdict.token_scores >= 0) & (verdict.token_scores <= 1)).all()
                assert {"rule_score", "logistic_score", "H", "ECS_n", "PKS_n"} <= set(
                    verdict.explanation
                )
            assert v.score == pytest.approx(v.explanation["rule_score"])
            assert w.score == pytest.approx(w.explanation["logistic_score"])
            assert v.explanation["rule_score"] == pytest.approx(w.explanation["rule_score"])
            assert v.explanation["logistic_score"] == pytest.approx(w.explanation["logistic_score"])
            # H = PKS_n - beta * ECS_n of the unit sums, scaled with the training range.
            sel = rule.selection_
            units = (f.tokens if name == "redeep_token" else f.chunks).astype(np.float64)
            e = units[:, list(sel.heads)].sum(1).mean()
            p = units[:, [8 + i for i in sel.layers]].sum(1).mean()
            e_n = (e - sel.ecs_range[0]) / (sel.ecs_range[1] - sel.ecs_range[0])
            p_n = (p - sel.pks_range[0]) / (sel.pks_range[1] - sel.pks_range[0])
            assert v.explanation["ECS_n"] == pytest.approx(e_n)
            assert v.explanation["PKS_n"] == pytest.approx(p_n)
            assert v.explanation["H"] == pytest.approx(p_n - sel.beta * e_n)
            assert v.hallucinated == (v.score >= rule.threshold_)
            differs |= not np.allclose(v.token_scores, w.token_scores)
            if name == "redeep_token":
                assert v.chunk_scores is None
                continue
            assert v.chunk_scores.shape == (f.chunks.shape[0],)
            np.testing.assert_allclose(
                v.token_scores,
                tokens_from_chunks(v.chunk_scores, f.chunk_offsets, f.token_offsets),
            )
            # Each token gets the highest score of the chunks it overlaps.
            for (a, b), s in zip(f.token_offsets, v.token_scores, strict=True):
                hit = [
                    c
                    for c, (ca, cb) in zip(v.chunk_scores, f.chunk_offsets, strict=True)
                    if ca < b and a < cb
                ]
                assert s == pytest.approx(max(hit, default=0.0))
        # The configured scorer also scores the units.
        assert differs


@pytest.mark.parametrize("name", ["redeep_token", "redeep_chunk"])
def test_artifact_round_trip(tiny_model, real, fitted, tmp_path: Path, name: str, reseal) -> None:
    det = fitted[name, "logistic"]
    cls = type(det)
    with pytest.raises(NotFittedError, match=f"ragscope train --detectors {name}"):
        cls(det.config).predict(real.features[name][0])
    det.threshold_ = 0.42
    folder = det.save(tmp_path / name)
    again = cls.load(folder, model_key=tiny_model.info.key)
    assert again.config == det.config and again.threshold_ == 0.42
    assert again.selection_ == det.selection_ and again.names_ == det.names_
    for f in real.features[name]:
        v, w = det.predict(f), again.predict(f)
        assert w.score == v.score and w.hallucinated == v.hallucinated
        np.testing.assert_array_equal(w.token_scores, v.token_scores)
        if name == "redeep_chunk":
            np.testing.assert_array_equal(w.chunk_scores, v.chunk_scores)
        assert dict(w.explanation) == pytest.approx(dict(v.explanation))
    with pytest.raises(ModelError, match="trained on model"):
        cls.load(folder, model_key="another-model")
    other = RedeepChunkDetector if cls is RedeepTokenDetector else RedeepTokenDetector
    with pytest.raises(DataError, match="is for detector"):
        other.load(folder)
    weights = json.loads((folder / "weights.json").read_text())
    # Valid JSON that lost a field, or selects a column it does not have: the fix is named.
    for broken in (
        {k: v for k, v in weights.items() if k != "selection"},
        {**weights, "selection": {**weights["selection"], "layers": [99]}},
    ):
        (folder / "weights.json").write_text(json.dumps(broken))
        with pytest.raises(DataError, match="weights.json does not match the SHA-256"):
            cls.load(folder)
        reseal(folder)
        with pytest.raises(
            DataError, match=f"malformed {name} artifact.*ragscope train --detectors {name}"
        ) as err:
            cls.load(folder)
        assert str(folder) in str(err.value)
    (folder / "weights.json").write_text(json.dumps(weights)[:40])
    reseal(folder)
    with pytest.raises(
        DataError, match=r"invalid JSON at line 1, column \d+ \(Unterminated.*ragscope train"
    ):
        cls.load(folder)


def test_predict_refuses_features_of_another_model(real, fitted) -> None:
    f = real.features["redeep_token"][0]
    alien = Features(
        detector=f.detector,
        example_id=f.example_id,
        model="another-model",
        names=f.names,
        response=f.response,
        token_names=f.token_names,
        tokens=f.tokens,
        token_offsets=f.token_offsets,
    )
    with pytest.raises(ModelError, match="another-model"):
        fitted["redeep_token", "rule"].predict(alien)


@pytest.mark.parametrize("cls", [RedeepTokenConfig, RedeepChunkConfig, InterpDetectConfig])
def test_fit_only_options_keep_the_feature_hash(cls) -> None:
    base = cls()
    fit_only = {
        RedeepTokenConfig: {"scorer": "logistic", "beta_grid": (0.5,), "heads_grid": (1,)},
        RedeepChunkConfig: {"scorer": "logistic", "beta_grid": (0.5,), "layers_grid": (2,)},
        InterpDetectConfig: {"classifiers": ("lr",), "corr_threshold": 0.8, "seed": 3},
    }[cls]
    for key, value in fit_only.items():
        other = cls(**{key: value})
        assert key in cls.FIT_ONLY
        assert other.feature_hash() == base.feature_hash()
        assert other.config_hash() != base.config_hash()
    feature_options = {
        RedeepTokenConfig: {"topk_frac": 0.2, "ecs_scope": "prompt", "n_copy_heads": 4},
        RedeepChunkConfig: {"topk_frac": 0.2, "pool": "sum", "chunk_size": 256},
        InterpDetectConfig: {"pool": "mean", "embedder": "model", "pks_final_norm": False},
    }[cls]
    for key, value in feature_options.items():
        other = cls(**{key: value})
        assert other.feature_hash() != base.feature_hash()
        assert other.config_hash() != base.config_hash()


# --------------------------------------------------------------------------- shared PKS, splits


def test_pks_is_computed_once_for_redeep_and_interpdetect(tiny_model, monkeypatch) -> None:
    calls: list[bool] = []
    real_pks = core.detectors.common.pks_from_trace

    def counting(*args, **kwargs):
        calls.append(kwargs.get("final_norm", True))
        return real_pks(*args, **kwargs)

    # every detector reads PKS through core.detectors.common.shared_pks
    monkeypatch.setattr(core.detectors.common, "pks_from_trace", counting)
    ex = _pairs(1)[0][1]
    feats = run_example(
        tiny_model, ex, [make_detector("redeep_token"), make_detector("interpdetect")]
    )
    assert calls == [True]
    # Both detectors read the same PKS: interpdetect's chunk PKS is the mean of redeep's token PKS.
    cs = chunk_example(render(ex, tiny_model), "sentence")
    np.testing.assert_allclose(
        feats["interpdetect"].chunks[:, -2:],
        chunk_means(feats["redeep_token"].tokens[:, -2:].T, cs),
        rtol=1e-5,
        atol=1e-9,
    )
    calls.clear()
    run_example(
        tiny_model,
        ex,
        [make_detector("redeep_token"), make_detector("interpdetect", pks_final_norm=False)],
    )
    assert sorted(calls) == [False, True]  # another lens is another value


def test_evaluate_never_lets_the_test_split_reach_fit(tiny_model, real, store, monkeypatch) -> None:
    seen: dict[str, list[str]] = {"train": [], "validation": [], "features": []}
    original = RedeepTokenDetector.fit

    def spy(self, features, examples, *, validation=None):
        seen["train"] += [e.id for e in examples]
        seen["features"] += [f.example_id for f in features]
        if validation is not None:
            seen["validation"] += [e.id for e in validation[1]]
            seen["features"] += [f.example_id for f in validation[0]]
        return original(self, features, examples, validation=validation)

    monkeypatch.setattr(RedeepTokenDetector, "fit", spy)
    exs = list(real.examples)
    train, validation, test = exs[:4], exs[4:6], exs[6:]
    run = evaluate(
        tiny_model,
        ["redeep_token"],
        Splits(train=train, validation=validation, test=test, train_dataset="builtin"),
        EvalOptions(n_boot=0),
        cache=FeatureCache(store),
    )
    assert run.extraction["cache_hits"] == len(exs)  # features came from the module's cache
    test_ids = {e.id for e in test}
    assert seen["train"] == [e.id for e in train]
    assert seen["validation"] == [e.id for e in validation]
    assert not test_ids & set(seen["features"])
    assert set(run.test_ids) == test_ids and len(run.results[0].scores) == len(test)
