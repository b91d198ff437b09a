"""SPAD on the tiny model: the exact seven-source split, POS aggregation, the XGBoost detector."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
import torch

from core.base.errors import DataError, ModelError, NotFittedError
from core.base.examples import source_key
from core.data import resolve_dataset
from core.detectors import make_detector
from core.detectors.spad import BIAS, BOOSTER_FILE, SpadConfig, SpadDetector, split_errors
from core.engine.layout import render
from core.engine.trace import Needs, trace
from core.pipeline.extract import extract_features, run_example
from core.signals.attribution import (
    ATTENTION_SOURCES,
    FEATURE_NAMES,
    POS_TAGS,
    SOURCES,
    head_weights,
    pos_features,
    response_pos,
    source_fractions,
    source_masks,
    spad_needs,
    token_pos,
    token_sources,
)


@pytest.fixture(scope="module", autouse=True)
def _one_thread(one_torch_thread):
    """Tiny, latency-bound forwards: one torch thread (see tests/conftest.py)."""


@pytest.fixture(scope="module")
def builtin():
    return resolve_dataset("builtin")[1]


@pytest.fixture(scope="module")
def examples(builtin, toy_example):
    """The toy example (2 passages) and built-in ones with 1, 2 and 3 passages, several tasks."""
    picked = [toy_example]
    for want in (("qa", 3), ("qa", 1), ("summary", 1), ("data2txt", 1)):
        picked.append(next(e for e in builtin if (e.task, len(e.passages)) == want))
    return picked


@pytest.fixture(scope="module")
def traced(tiny_model, examples):
    out = []
    for ex in examples:
        layout = render(ex, tiny_model)
        tr = trace(tiny_model, layout, spad_needs(tiny_model.info.n_layers))
        out.append((ex, tr, token_sources(tiny_model, tr)))
    return out


# --------------------------------------------------------------------------- the split


def test_seven_sources_sum_to_p_final_for_every_token(traced) -> None:
    assert {len(ex.passages) for ex, _, _ in traced} >= {1, 2, 3}
    for ex, tr, s in traced:
        assert s.names == SOURCES and s.values.dtype == np.float32
        assert s.values.shape == (len(tr.layout.response_ids), 7)
        total = s.values.astype(np.float64).sum(1)
        assert np.abs(total - s.p_final).max() < 1e-4, ex.id
        # Much tighter in fact, relative to the (tiny, ~1/vocab) probabilities.
        np.testing.assert_allclose(total, s.p_final, rtol=1e-5, err_msg=ex.id)
        assert s.max_error < 1e-4
        np.testing.assert_array_equal(s.token_ids, tr.layout.response_ids)
        np.testing.assert_array_equal(s.generation_positions, tr.layout.generation_positions)
        # Per-layer parts add up to the FFN source and to the four attention sources.
        np.testing.assert_allclose(s.d_ffn.sum(1), s.values[:, 4], rtol=1e-5, atol=1e-12)
        np.testing.assert_allclose(s.d_attn.sum(1), s.values[:, :4].sum(1), rtol=1e-4, atol=1e-11)
        df = s.to_frame(response_pos(tr.layout))
        assert list(df.columns) == [
            "j",
            "start",
            "end",
            "token",
            *SOURCES,
            "P_final",
            "pos",
        ]
        assert len(df) == len(s)


def test_p_final_is_the_softmax_of_the_plain_models_logits(traced, tiny_reference) -> None:
    for ex, tr, s in traced[:2]:
        ids = torch.as_tensor(tr.layout.token_ids)[None]
        with torch.inference_mode():
            logits = tiny_reference(ids).logits[0].double()
        g = torch.as_tensor(tr.layout.generation_positions)
        y = torch.as_tensor(tr.layout.response_ids)
        p = torch.softmax(logits[g], -1).gather(1, y[:, None]).squeeze(1).numpy()
        np.testing.assert_allclose(s.p_final, p, rtol=1e-4, err_msg=ex.id)


def _phi(x: torch.Tensor, W_U: torch.Tensor, y: int) -> float:
    """The probe without the final norm, in float64."""
    return float(torch.softmax(x.double() @ W_U, -1)[y])


def test_each_source_matches_a_direct_loop_for_one_token(
    tiny_model, tiny_reference, traced
) -> None:
    info = tiny_model.info
    W_U = tiny_reference.lm_head.weight.detach().double().T  # [d_model, vocab]; no bias
    for ex, tr, s in traced[:2]:
        layout = tr.layout
        j = len(layout.response_ids) // 2
        g = int(layout.generation_positions[j])
        y = int(layout.response_ids[j])

        def at(kind: str, layer: int | None, tr=tr, g=g) -> torch.Tensor:
            return tr.at(kind, layer, [g])[0]

        init = _phi(at("resid_pre", 0), W_U, y)
        pre = [_phi(at("resid_pre", 0), W_U, y)] + [
            _phi(at("resid_post", ly - 1), W_U, y) for ly in range(1, info.n_layers)
        ]
        mid = [_phi(at("resid_mid", ly), W_U, y) for ly in range(info.n_layers)]
        post = [_phi(at("resid_post", ly), W_U, y) for ly in range(info.n_layers)]
        d_attn = [m - p for m, p in zip(mid, pre, strict=True)]
        d_ffn = [p - m for p, m in zip(post, mid, strict=True)]
        logits = at("logits", None).double()
        p_final = float(torch.softmax(logits, -1)[y])
        ln = p_final - post[-1]

        w_engine = head_weights(tiny_model, tr)
        frac_engine = source_fractions(tr, info.n_layers)
        split = dict.fromkeys(("Query", "RAG", "Past", "Self"), 0.0)
        for ly in range(info.n_layers):
            # W_O of each query head straight from the HF o_proj: [d_model, head * d_head].
            o = tiny_reference.model.layers[ly].self_attn.o_proj.weight.detach().double()
            z = at("z", ly).double()  # [head, d_head]
            dz = [
                float(z[h] @ o[:, h * info.d_head : (h + 1) * info.d_head].T @ W_U[:, y])
                for h in range(info.n_heads)
            ]
            w = [math.exp(v - max(dz)) for v in dz]
            w = [v / sum(w) for v in w]
            # Tight: the random heads' logits differ by ~1e-3, so w is far from uniform
            # at this tolerance.
            np.testing.assert_allclose(w_engine[ly, j], w, rtol=0, atol=1e-8)
            assert np.ptp(w) > 1e-5
            A = tr.at("pattern", ly, [g])[:, 0].double()  # [head, key]
            for h in range(info.n_heads):
                mass = dict.fromkeys(split, 0.0)
                for k in range(len(layout)):
                    kind = layout.segment_at(k).kind
                    if k == g:
                        src = "Self"
                    elif k > g:
                        assert float(A[h, k]) == 0.0  # causal
                        continue
                    elif kind == "passage":
                        src = "RAG"
                    elif kind == "response":
                        src = "Past"
                    else:
                        src = "Query"
                    mass[src] += float(A[h, k])
                total = sum(mass.values())
                np.testing.assert_allclose(
                    frac_engine[ly, j, h], [mass[k] / total for k in ATTENTION_SOURCES], atol=1e-12
                )
                for src in split:
                    split[src] += d_attn[ly] * w[h] * mass[src] / total
        want = [split["Query"], split["RAG"], split["Past"], split["Self"], sum(d_ffn), ln, init]
        got = s.values[j].astype(np.float64)
        # The engine's probes run in float32: compare on the scale of the token's values.
        scale = max(abs(v) for v in want[:4])
        np.testing.assert_allclose(got[:4], want[:4], rtol=1e-3, atol=1e-3 * scale, err_msg=ex.id)
        # Differences of float32 probes of ~1e-3 carry ~5e-11 of rounding (measured
        # against float64 over every probe of these answers, for both the gathered
        # logit - logsumexp and the log-softmax form of the probe).
        np.testing.assert_allclose(got[4:], want[4:], rtol=1e-3, atol=1e-10, err_msg=ex.id)
        np.testing.assert_allclose(s.d_attn[j], d_attn, rtol=1e-3, atol=1e-10)
        np.testing.assert_allclose(s.d_ffn[j], d_ffn, rtol=1e-3, atol=1e-10)
        assert s.p_final[j] == pytest.approx(p_final, rel=1e-5)
        assert ex.passages and split["RAG"] != 0.0


def test_source_masks_partition_the_keys_before_each_generation_position(traced) -> None:
    _, tr, _ = traced[0]
    layout = tr.layout
    m = source_masks(layout)
    g = layout.generation_positions
    p1 = layout.response.start
    assert m.shape == (len(g), 4, len(layout))
    cover = m.sum(1)
    for j, gj in enumerate(g):
        np.testing.assert_array_equal(cover[j, : gj + 1], 1.0)  # each key in one source
        np.testing.assert_array_equal(cover[j, gj + 1 :], 0.0)
        assert m[j, 3, gj] == 1.0
        np.testing.assert_array_equal(np.flatnonzero(m[j, 2]), np.arange(p1, gj))  # Past
    np.testing.assert_array_equal(np.flatnonzero(m[0, 1]), layout.context_positions())
    assert m[0, 2].sum() == 0  # the first token has no past


def test_grouped_query_attention_uses_per_query_head_outputs(tiny_model, traced) -> None:
    info = tiny_model.info
    assert info.n_kv_heads < info.n_heads  # the tiny model IS grouped-query
    _, tr, _ = traced[0]
    g = tr.layout.generation_positions
    extra = trace(
        tiny_model,
        tr.layout,
        Needs.of(["attn_out"], n_layers=info.n_layers, positions="generation"),
    )
    W_O = tiny_model.bridge.W_O.detach()
    assert tuple(W_O.shape) == (info.n_layers, info.n_heads, info.d_head, info.d_model)
    for ly in range(info.n_layers):
        z = tr.at("z", ly, g)
        assert z.shape[1] == info.n_heads and tr.at("pattern", ly, g).shape[0] == info.n_heads
        # Sum over query heads of z W_O[h] is the attention output (Llama: no b_O).
        np.testing.assert_allclose(
            torch.einsum("thd,hdm->tm", z, W_O[ly]).numpy(),
            extra.at("attn_out", ly, g).numpy(),
            rtol=1e-4,
            atol=1e-5,
        )


# --------------------------------------------------------------------------- POS


def test_tokens_take_the_tag_of_the_word_they_overlap_most() -> None:
    text = "Ada Lovelace built it. \n\n"
    words = [
        (0, 3, "PROPN"),
        (4, 12, "PROPN"),
        (13, 18, "VERB"),
        (19, 21, "PRON"),
        (21, 22, "PUNCT"),
        (23, 25, "SPACE"),
    ]
    # "Ada" | " Love" | "lace" | " bu" | "ilt it" | "." | " " | "\n\n"
    offsets = np.asarray(
        [(0, 3), (3, 8), (8, 12), (12, 15), (15, 21), (21, 22), (22, 23), (23, 25)]
    )
    tags = token_pos(text, offsets, words)
    assert tags == ("PROPN", "PROPN", "PROPN", "VERB", "VERB", "PUNCT", "SPACE", "SPACE")
    # Ties go to the first word; unknown tags become X; no word at all -> X.
    assert token_pos("ab", np.asarray([(0, 2)]), [(0, 1, "NOUN"), (1, 2, "VERB")]) == ("NOUN",)
    assert token_pos("ab", np.asarray([(0, 2)]), [(0, 2, "CONJ")]) == ("X",)
    assert token_pos("ab", np.asarray([(0, 2)]), []) == ("X",)


def test_spacy_tags_propagate_to_sub_word_tokens(tiny_model) -> None:
    from core.base.examples import RAGExample

    ex = RAGExample(
        id="pos", question="When?", passages=("It opened in 1820.",), response="It opened in 1820."
    )
    layout = render(ex, tiny_model)
    tags = response_pos(layout)
    toks = layout.response_token_strings()
    assert len(tags) == len(toks)
    by_text = {}
    for t, tag in zip(toks, tags, strict=True):
        by_text.setdefault(t.strip(), set()).add(tag)
    digits = [t for t in toks if t.strip().isdigit()]
    assert len(digits) > 1  # the number is split into several tokens...
    assert all(tags[i] == "NUM" for i, t in enumerate(toks) if t.strip().isdigit())  # ...all NUM
    assert by_text["opened"] == {"VERB"} and by_text["."] == {"PUNCT"}
    assert all(tag in POS_TAGS for tag in tags)


def test_pos_features_are_means_per_tag_source_first() -> None:
    assert len(FEATURE_NAMES) == 126 == len(SOURCES) * len(POS_TAGS)
    assert FEATURE_NAMES[:2] == ("Query_ADJ", "Query_ADP")
    assert "RAG_NOUN" in FEATURE_NAMES and "LN_NUM" in FEATURE_NAMES
    assert FEATURE_NAMES[-1] == "Init_SPACE"
    vals = np.arange(21, dtype=np.float32).reshape(3, 7)
    f = pos_features(vals, ["NOUN", "NUM", "NOUN"])
    col = {n: i for i, n in enumerate(FEATURE_NAMES)}
    assert f.shape == (126,)
    assert f[col["Query_NOUN"]] == pytest.approx(7.0)  # mean of 0 and 14
    assert f[col["RAG_NUM"]] == pytest.approx(8.0)
    assert f[col["Init_NOUN"]] == pytest.approx(13.0)
    assert f[col["LN_VERB"]] == 0.0  # absent tag
    assert np.count_nonzero(f) == 14  # two tags x seven sources
    with pytest.raises(ValueError, match="values must be"):
        pos_features(vals, ["NOUN"])


# --------------------------------------------------------------------------- detector


@pytest.fixture(scope="module")
def balanced(builtin):
    pos = [e for e in builtin if e.label][:5]
    neg = [e for e in builtin if e.label is False][:5]
    return [x for pair in zip(pos, neg, strict=True) for x in pair]


@pytest.fixture(scope="module")
def fitted(tiny_model, balanced):
    det = make_detector("spad", n_iter=3, cv=2)
    feats = list(extract_features(tiny_model, balanced, [det]).features["spad"])
    det.fit(feats, balanced)
    return det, feats


def test_features_hold_the_126_pos_means_and_the_token_split(tiny_model, toy_example) -> None:
    det = make_detector("spad")
    f = run_example(tiny_model, toy_example, [det])["spad"]
    assert f.names == FEATURE_NAMES and f.token_names == (*SOURCES, "P_final")
    layout = render(toy_example, tiny_model)
    s = token_sources(tiny_model, trace(tiny_model, layout, spad_needs(tiny_model.info.n_layers)))
    np.testing.assert_allclose(f.tokens[:, :7], s.values, rtol=1e-6, atol=1e-12)
    np.testing.assert_allclose(f.tokens[:, 7], s.p_final, rtol=1e-6, atol=1e-12)
    assert split_errors([f])[0] == pytest.approx(s.max_error, abs=1e-6)
    np.testing.assert_array_equal(f.token_offsets, layout.response_offsets)
    np.testing.assert_allclose(f.response, pos_features(s.values, response_pos(layout)), atol=1e-12)
    # The chunk size is a memory knob: not part of the feature cache key.
    assert make_detector("spad", chunk_size=7).config.feature_hash() == det.config.feature_hash()


def test_split_errors_read_the_stored_token_split(tiny_model, toy_example) -> None:
    f = run_example(tiny_model, toy_example, [make_detector("spad")])["spad"]
    assert split_errors([f])[0] < 1e-6
    tokens = f.tokens.copy()
    tokens[2, 5] += 1e-3  # LN of the third token off by 1e-3
    bad = dataclasses.replace(f, tokens=tokens)
    np.testing.assert_allclose(split_errors([f, bad]), [split_errors([f])[0], 1e-3], atol=1e-6)
    nll = run_example(tiny_model, toy_example, [make_detector("nll")])["nll"]
    with pytest.raises(DataError, match="not spad token features"):
        split_errors([nll])


def test_fit_predict_and_contributions_sum_to_the_margin(fitted) -> None:
    det, feats = fitted
    assert det.train_info_["n_train"] == 10 and det.train_info_["scale_pos_weight"] == 1.0
    assert det.train_info_["early_stopping"]["held_out"] == 2
    assert set(det.best_params_) >= {"max_depth", "learning_rate", "n_estimators"}
    margins = det.margins(feats)
    contrib = det.contributions(feats)
    assert contrib.shape == (10, 127)
    np.testing.assert_allclose(contrib.sum(1), margins, rtol=1e-5, atol=1e-5)
    for f, m in zip(feats[:3], margins, strict=False):
        v = det.predict(f)
        assert v.detector == "spad" and 0.0 <= v.score <= 1.0
        assert set(v.explanation) == {*FEATURE_NAMES, BIAS}
        assert sum(v.explanation.values()) == pytest.approx(m, abs=1e-5)
        assert v.score == pytest.approx(1 / (1 + math.exp(-m)), abs=1e-6)
        assert v.hallucinated == (v.score >= det.threshold_)


def test_save_load_round_trip_gives_identical_predictions(fitted, tmp_path) -> None:
    det, feats = fitted
    det.threshold_ = 0.4
    out = det.save(tmp_path / "spad")
    assert (out / BOOSTER_FILE).is_file() and (out / "cfg.json").is_file()
    back = SpadDetector.load(out, model_key=feats[0].model)
    assert back.threshold_ == 0.4 and back.config == det.config
    for f in feats:
        a, b = det.predict(f), back.predict(f)
        assert a.score == b.score and a.hallucinated == b.hallucinated
        assert dict(a.explanation) == dict(b.explanation)
    with pytest.raises(ModelError, match="retrain"):
        SpadDetector.load(out, model_key="another-model")


def test_malformed_or_foreign_artifacts_are_refused(fitted, tmp_path) -> None:
    det, _ = fitted
    out = det.save(tmp_path / "spad")
    (out / BOOSTER_FILE).write_text("{not json")
    with pytest.raises(DataError, match="ragscope train --detectors spad"):
        SpadDetector.load(out)
    (out / BOOSTER_FILE).unlink()
    with pytest.raises(DataError, match="ragscope train --detectors spad"):
        SpadDetector.load(out)
    cfg = json.loads((out / "cfg.json").read_text())
    (out / "cfg.json").write_text(json.dumps({**cfg, "detector": "nll"}))
    with pytest.raises(DataError, match="'nll', not 'spad'"):
        SpadDetector.load(out)


def test_unfitted_and_one_class_training_fail_clearly(fitted, balanced) -> None:
    _, feats = fitted
    with pytest.raises(NotFittedError, match="spad"):
        make_detector("spad").predict(feats[0])
    faithful = [(f, e) for f, e in zip(feats, balanced, strict=True) if e.label is False]
    with pytest.raises(DataError, match="hallucinated and faithful"):
        make_detector("spad").fit([f for f, _ in faithful], [e for _, e in faithful])
    with pytest.raises(ValueError, match="holdout"):
        make_detector("spad", holdout=0.6)


def test_learner_options_nan_for_absent_tags_auc_search_and_round_trip(
    fitted, balanced, tmp_path
) -> None:
    _, feats = fitted
    # A tag absent from an answer has all seven sources at zero; a present tag sums to
    # P_final > 0, so "all zero" identifies absence exactly.
    grid = np.stack([f.response for f in feats]).reshape(len(feats), len(SOURCES), -1)
    absent = np.all(grid == 0.0, axis=1)
    assert absent.any() and (~absent).any()
    det = SpadDetector(
        SpadConfig(n_iter=2, cv=2, scoring="roc_auc", stop_metric="auc", missing="nan")
    )
    X = det._design([f.response for f in feats]).reshape(grid.shape)
    assert np.isnan(X).transpose(0, 2, 1)[absent].all()
    assert not np.isnan(X).transpose(0, 2, 1)[~absent].any()
    np.testing.assert_array_equal(X.transpose(0, 2, 1)[~absent], grid.transpose(0, 2, 1)[~absent])
    # The zero-filled design (the spec's) is the features unchanged.
    spec = SpadDetector(SpadConfig(n_iter=2, cv=2))
    np.testing.assert_array_equal(
        spec._design([f.response for f in feats]), grid.reshape(len(feats), -1)
    )
    det.fit(feats, balanced)
    assert "cv_roc_auc" in det.train_info_ and "cv_f1" not in det.train_info_
    # Early stopping on AUC, without the hold-out: every searched tree is kept.
    nohold = SpadDetector(SpadConfig(n_iter=0, cv=2, holdout=0.0)).fit(feats, balanced)
    assert nohold.train_info_["early_stopping"] == {"held_out": 0, "n_trees": 100}
    back = SpadDetector.load(det.save(tmp_path / "spad"), model_key=feats[0].model)
    assert back.config == det.config and back.config.missing == "nan"
    for f in feats:
        assert back.predict(f).score == det.predict(f).score
    for bad in ({"scoring": "f2"}, {"stop_metric": "error"}, {"missing": "mean"}):
        with pytest.raises(ValueError):
            SpadConfig(**bad)
    # Learner-only options leave the feature hash alone (cached features stay valid).
    assert (
        SpadConfig(scoring="roc_auc", missing="nan").feature_hash() == SpadConfig().feature_hash()
    )


def test_grouped_search_and_hold_out_keep_each_sources_answers_together(
    fitted, balanced, monkeypatch
) -> None:
    """With ``grouped`` the randomized search's folds and the early-stopping hold-out
    never split one source's answers (here pairs of answers share a source)."""
    import dataclasses

    from sklearn.model_selection import RandomizedSearchCV

    from core.detectors.spad import _grouped_holdout

    _, feats = fitted
    paired = [
        dataclasses.replace(e, provenance=dataclasses.replace(e.provenance, group=f"src{i // 4}"))
        for i, e in enumerate(balanced)
    ]
    groups = np.asarray([source_key(e) for e in paired])
    y = np.asarray([int(e.label) for e in paired])
    seen: list[list[tuple[np.ndarray, np.ndarray]]] = []
    real_fit = RandomizedSearchCV.fit

    def spy(self, X, yy, groups=None, **kw):
        seen.append(list(self.cv.split(X, yy, groups)))
        return real_fit(self, X, yy, groups=groups, **kw)

    monkeypatch.setattr(RandomizedSearchCV, "fit", spy)
    det = SpadDetector(SpadConfig(n_iter=2, cv=2, grouped=True, holdout=0.3)).fit(feats, paired)
    assert seen and all(not set(groups[tr]) & set(groups[te]) for tr, te in seen[-1]), (
        "a source's answers on both sides of a search fold"
    )
    assert det.train_info_["early_stopping"]["held_out"] > 0
    tr, va = _grouped_holdout(y, groups, 0.3, 0)
    assert not set(groups[tr]) & set(groups[va]) and set(y[va]) == {0, 1}
    # Ungrouped (the former behaviour) splits sources across folds here.
    SpadDetector(SpadConfig(n_iter=2, cv=2, grouped=False)).fit(feats, paired)
    assert any(set(groups[tr]) & set(groups[te]) for tr, te in seen[-1])


def test_fixed_params_skip_the_search_and_pin_the_searched_booster(
    fitted, balanced, monkeypatch
) -> None:
    """``pinned()`` gives the searched hyper-parameters as ``params``; a detector built
    with them fits that booster without a search (what cross-fitted calibration's
    refits use), and hostile ``params`` are refused."""
    from sklearn.model_selection import RandomizedSearchCV

    from core.detectors.spad import search_space

    det, feats = fitted
    pins = det.pinned()
    assert pins == {"params": det.best_params_} and set(pins["params"]) == set(search_space())
    searched: list[int] = []
    real_fit = RandomizedSearchCV.fit
    monkeypatch.setattr(
        RandomizedSearchCV,
        "fit",
        lambda self, *a, **k: searched.append(1) or real_fit(self, *a, **k),
    )
    again = SpadDetector(SpadConfig(n_iter=3, cv=2, holdout=0.0, **pins)).fit(feats, balanced)
    assert not searched
    assert again.best_params_ == det.best_params_ and again.train_info_["n_iter"] == 0
    assert again.train_info_["early_stopping"]["n_trees"] == det.best_params_["n_estimators"]
    # learner-only: the cached features stay valid
    assert SpadConfig(**pins).feature_hash() == SpadConfig().feature_hash()
    for bad in (
        {"max_depth": 2.5},
        {"n_estimators": True},
        {"learning_rate": float("nan")},
        {"gamma": -1.0},
        {"subsample": 0.0},
        {"learning_rate": 1.5},
        {"booster": "dart"},
        {"subsample": "0.5"},
    ):
        with pytest.raises(ValueError, match="params"):
            SpadConfig(params=bad)
    with pytest.raises(ValueError, match="mapping"):
        SpadConfig(params=[("max_depth", 2)])  # type: ignore[arg-type]
    with pytest.raises(NotFittedError):
        SpadDetector().pinned()
