"""The two literature probes: SAPLMA (residual-stream probe) and Lookback Lens (attention
ratios) -- their features against direct computations, their learning on planted
signals, and their artifacts."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from core.base.errors import DataError, ModelError
from core.base.examples import RAGExample, Span
from core.data import resolve_dataset
from core.detectors import make_detector
from core.detectors.lookback_lens import (
    LookbackLensDetector,
    lookback_from_mass,
    lookback_ratios,
    window_means,
)
from core.detectors.saplma import SaplmaDetector, default_layers
from core.engine.layout import render
from core.engine.trace import Needs, trace
from core.learning.contract import Features
from core.pipeline.extract import extract_features, run_example
from core.signals.smoothing import TOKEN_WINDOWS, window_mean, window_probs

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def balanced() -> list[RAGExample]:
    builtin = resolve_dataset("builtin")[1]
    pos = [e for e in builtin if e.label and e.spans][:10]
    neg = [e for e in builtin if e.label is False][:10]
    return [x for pair in zip(pos, neg, strict=True) for x in pair]


@pytest.fixture(scope="module")
def feats(tiny_model, balanced) -> dict[str, tuple[Features, ...]]:
    dets = [make_detector("saplma", layers=(0, 1)), make_detector("lookback_lens")]
    return dict(extract_features(tiny_model, balanced, dets).features)


# ----------------------------------------------------------------------------- SAPLMA


def test_default_layers_sit_in_the_middle_and_upper_half() -> None:
    assert default_layers(30) == (10, 14, 19, 24)
    assert default_layers(2) == (0, 1)
    assert all(0 <= ly < 7 for ly in default_layers(7))


def test_saplma_features_are_the_residual_stream_at_the_answer(tiny_model, toy_example) -> None:
    f = run_example(tiny_model, toy_example, [make_detector("saplma", layers=(0, 1))])["saplma"]
    lay = render(toy_example, tiny_model)
    tr = trace(tiny_model, lay, Needs.of(["resid_post"], layers=[0, 1], positions="all"))
    pos = lay.response_positions
    want = np.concatenate([tr.get("resid_post", ly)[pos].numpy() for ly in (0, 1)], axis=1)
    assert f.tokens is not None
    np.testing.assert_allclose(f.tokens, want, rtol=1e-6, atol=1e-6)
    d = want.shape[1] // 2
    np.testing.assert_allclose(
        f.response,
        [np.linalg.norm(want[:, :d], axis=1).mean(), np.linalg.norm(want[:, d:], axis=1).mean()],
        rtol=1e-5,
    )
    np.testing.assert_array_equal(f.token_offsets, lay.response_offsets)


def _planted(n: int, layers: tuple[int, ...], signal_layer: int, pool: str, seed: int = 0):
    """Synthetic SAPLMA features: only ``signal_layer``'s ``pool`` carries the label."""
    rng = np.random.default_rng(seed)
    d, feats, exs = 6, [], []
    for i in range(n):
        label = bool(i % 2)
        t = int(rng.integers(3, 7))
        blocks = []
        for ly in layers:
            b = rng.normal(size=(t, d)).astype(np.float32)
            if ly == signal_layer:
                if pool == "last":
                    b[-1, 0] += 3.0 if label else -3.0
                else:
                    b[:, 1] += 2.0 if label else -2.0
            blocks.append(b)
        tokens = np.concatenate(blocks, axis=1)
        resp = "x" * t
        ex = RAGExample(
            id=f"s{i}",
            question=f"q{i}",
            passages=(f"passage {i}",),
            response=resp,
            label=label,
            spans=(Span(start=0, end=t),) if label else (),
        )
        feats.append(
            Features(
                detector="saplma",
                example_id=ex.id,
                model="m",
                names=tuple(f"L{ly}.norm_mean" for ly in layers),
                response=np.zeros(len(layers), np.float32),
                token_names=tuple(f"L{ly}.{k}" for ly in layers for k in range(d)),
                tokens=tokens,
                token_offsets=np.asarray([[k, k + 1] for k in range(t)]),
            )
        )
        exs.append(ex)
    return feats, exs


@pytest.mark.parametrize("pool", ["mean", "last"])
def test_saplma_selects_the_layer_and_pooling_that_carry_the_signal(pool: str) -> None:
    f, e = _planted(80, (3, 7, 9), signal_layer=7, pool=pool)
    fv, ev = _planted(40, (3, 7, 9), signal_layer=7, pool=pool, seed=1)
    det = SaplmaDetector().fit(f, e, validation=(fv, ev))
    assert (det.layer_, det.pool_) == (7, pool)
    assert det.train_info_["selected_on"] == "validation AUROC"
    # without a validation split, grouped cross-validation on training finds it too
    det2 = SaplmaDetector().fit(f, e)
    assert (det2.layer_, det2.pool_) == (7, pool)
    ft, et = _planted(40, (3, 7, 9), signal_layer=7, pool=pool, seed=2)
    scores = np.asarray([det.predict(x).score for x in ft])
    y = np.asarray([x.label for x in et])
    assert scores[y].mean() > scores[~y].mean() + 0.3


def test_saplma_token_scores_come_from_the_same_probe(feats, balanced) -> None:
    f = list(feats["saplma"])
    det = SaplmaDetector(SaplmaDetector.Config(layers=(0, 1))).fit(f, balanced)
    v = det.predict(f[0])
    block = det._block(f[0], det.layer_)
    assert v.token_scores is not None and v.token_scores.shape == (block.shape[0],)
    np.testing.assert_allclose(v.token_scores, det.probe_.predict_proba(block), rtol=1e-5)
    pooled = block.mean(0) if det.pool_ == "mean" else block[-1]
    assert v.score == pytest.approx(float(det.probe_.predict_proba(pooled[None])[0]), rel=1e-6)


@pytest.mark.parametrize("learner", ["logistic", "mlp"])
def test_saplma_artifact_round_trip(tmp_path, feats, balanced, learner: str) -> None:
    f = list(feats["saplma"])
    det = make_detector("saplma", layers=(0, 1), learner=learner, hidden=(8, 4)).fit(f, balanced)
    det.save(tmp_path / "a")
    back = SaplmaDetector.load(tmp_path / "a", model_key=det.model_key_)
    for x in f[:4]:
        a, b = det.predict(x), back.predict(x)
        assert a.score == pytest.approx(b.score, abs=1e-6)
        np.testing.assert_allclose(a.token_scores, b.token_scores, atol=1e-6)


def _rewrite_weights(folder, **changes) -> None:
    """Edit an artifact's ``weights.json`` and re-record its hashes (a file edited by
    hand, not a damaged one: only the loader's own checks can refuse it)."""
    from core.learning.artifact import artifact_hashes

    w = json.loads((folder / "weights.json").read_text())
    (folder / "weights.json").write_text(json.dumps({**w, **changes}))
    cfg = json.loads((folder / "cfg.json").read_text())
    cfg["files"] = artifact_hashes(folder)
    (folder / "cfg.json").write_text(json.dumps(cfg))


def test_saplma_refuses_an_artifact_whose_layer_is_not_recorded(tmp_path, feats, balanced) -> None:
    det = make_detector("saplma", layers=(0, 1)).fit(list(feats["saplma"]), balanced)
    det.save(tmp_path / "a")
    _rewrite_weights(tmp_path / "a", layer=5)
    with pytest.raises(DataError, match="layer 5"):
        SaplmaDetector.load(tmp_path / "a")


def _split_signal(n: int, seed: int):
    """SAPLMA features whose label is readable only from two layers together: layer 3's
    mean carries ``u``, layer 9's carries ``label - u``."""
    f, e = _planted(n, (3, 9), signal_layer=-1, pool="mean", seed=seed)
    rng = np.random.default_rng(seed + 100)
    out = []
    for x, ex in zip(f, e, strict=True):
        t = x.tokens.copy()
        u = rng.normal(0, 2.0)
        s = (1.5 if ex.label else -1.5) - u
        t[:, 1] += u  # layer 3, column 1
        t[:, 6 + 1] += s  # layer 9, column 1
        out.append(dataclasses.replace(x, tokens=t))
    return out, e


def test_saplma_concat_probes_all_layers_side_by_side(tmp_path) -> None:
    f, e = _split_signal(120, 0)
    fv, ev = _split_signal(60, 1)
    single = SaplmaDetector().fit(f, e, validation=(fv, ev))
    both = make_detector("saplma", concat=True).fit(f, e, validation=(fv, ev))
    assert both.concat_ and both.layer_ is None and both.train_info_["layer"] == "all"
    assert {"layer": "all", "pool": "mean"} in [
        {k: c[k] for k in ("layer", "pool")} for c in both.train_info_["candidates"]
    ]
    ft, et = _split_signal(60, 2)
    y = np.asarray([x.label for x in et])
    auc = lambda d: roc_auc_score(y, [d.predict(x).score for x in ft])  # noqa: E731
    assert auc(both) > auc(single) + 0.1
    v = both.predict(ft[0])
    np.testing.assert_allclose(v.token_scores, both.probe_.predict_proba(ft[0].tokens), rtol=1e-5)
    assert "layers 3, 9" in next(iter(v.explanation))
    both.save(tmp_path / "c")
    back = SaplmaDetector.load(tmp_path / "c", model_key=both.model_key_)
    assert back.predict(ft[0]).score == pytest.approx(v.score, abs=1e-9)
    # Features of other layers cannot be read by a probe of layers side by side.
    other = dataclasses.replace(ft[0], names=("L3.norm_mean", "L8.norm_mean"))
    with pytest.raises(ModelError, match="side by side"):
        back.predict(other)


def _token_signal(n: int, seed: int):
    """SAPLMA features where a hallucinated answer shows at layer 3 in every token (what
    the answer probe reads) and its span's tokens (its first half) at layer 9 only;
    faithful answers have no spans (all tokens faithful)."""
    f, e = _planted(n, (3, 9), signal_layer=-1, pool="mean", seed=seed)
    out_f, out_e = [], []
    for x, ex in zip(f, e, strict=True):
        t = x.tokens.copy()
        k = max(1, t.shape[0] // 2)
        if ex.label:
            t[:, 1] += 3.0  # layer 3, column 1: every token (the answer-level signal)
            t[:k, 6 + 2] += 2.5  # layer 9, column 2: the span's tokens only
            ex = dataclasses.replace(ex, spans=(Span(start=0, end=k),))
        out_f.append(dataclasses.replace(x, tokens=t))
        out_e.append(ex)
    return out_f, out_e


def test_saplma_token_probe_learns_the_gold_token_labels(tmp_path) -> None:
    from sklearn.metrics import average_precision_score

    f, e = _token_signal(120, 0)
    fv, ev = _token_signal(60, 1)
    ft, et = _token_signal(60, 2)
    plain = make_detector("saplma").fit(f, e, validation=(fv, ev))
    tok = make_detector("saplma", token_probe=True, token_sample=200).fit(f, e, validation=(fv, ev))
    assert tok.token_layer_ == 9 and tok.train_info_["token_layer"] == 9
    assert set(tok.train_info_["token_layer_ap"]) == {"3", "9"}
    # The answer score is the answer probe's either way.
    assert tok.predict(ft[0]).score == pytest.approx(plain.predict(ft[0]).score)

    def token_ap(det) -> float:
        ys, ss = [], []
        for x, ex in zip(ft, et, strict=True):
            lab = x.token_labels(ex)
            lab = np.zeros(len(x.token_offsets), int) if lab is None else lab
            ys.append(lab)
            ss.append(det.predict(x).token_scores)
        return float(average_precision_score(np.concatenate(ys), np.concatenate(ss)))

    assert token_ap(tok) > token_ap(plain) + 0.1
    v = tok.predict(ft[0])
    z = tok.token_probe_.decision_function(tok._block(ft[0], 9))
    np.testing.assert_allclose(
        v.token_scores, 1 / (1 + np.exp(-window_mean(z, tok.token_window_))), rtol=1e-5
    )
    tok.save(tmp_path / "t")
    back = SaplmaDetector.load(tmp_path / "t", model_key=tok.model_key_)
    np.testing.assert_allclose(back.predict(ft[0]).token_scores, v.token_scores, atol=1e-6)
    with pytest.raises(DataError):
        make_detector("saplma", token_c=0)


def _span_runs(n: int, seed: int, *, scattered: bool):
    """Two-layer SAPLMA features of 30-40-token answers; a hallucinated answer's span
    tokens carry a weak shift at layer 9 (column 2) under token noise. ``scattered``:
    the span tokens are every third token (no runs), else one run of 12 tokens."""
    rng = np.random.default_rng(seed)
    d, feats, exs = 6, [], []
    for i in range(n):
        label = bool(i % 2)
        t = int(rng.integers(30, 41))
        tokens = rng.normal(size=(t, 2 * d)).astype(np.float32)
        hot = np.zeros(t, bool)
        if label:
            if scattered:
                hot[int(rng.integers(0, 3)) :: 3] = True
            else:
                a = int(rng.integers(0, t - 12))
                hot[a : a + 12] = True
            tokens[hot, d + 2] += 1.2
        starts = np.flatnonzero(hot & ~np.r_[False, hot[:-1]])
        ends = np.flatnonzero(hot & ~np.r_[hot[1:], False]) + 1
        ex = RAGExample(
            id=f"r{seed}-{i}",
            question=f"q{i}",
            passages=(f"passage {i}",),
            response="x" * t,
            label=label,
            spans=tuple(Span(start=int(a), end=int(b)) for a, b in zip(starts, ends, strict=True)),
        )
        feats.append(
            Features(
                detector="saplma",
                example_id=ex.id,
                model="m",
                names=("L3.norm_mean", "L9.norm_mean"),
                response=np.zeros(2, np.float32),
                token_names=tuple(f"L{ly}.{k}" for ly in (3, 9) for k in range(d)),
                tokens=tokens,
                token_offsets=np.asarray([[k, k + 1] for k in range(t)]),
            )
        )
        exs.append(ex)
    return feats, exs


@pytest.mark.parametrize("scattered", [False, True])
def test_saplma_token_window_is_chosen_on_validation(tmp_path, scattered) -> None:
    """Spans that run over many tokens get a smoothing window (and a better token AP than
    the same probe unsmoothed); spans of single tokens keep each token's own score."""
    from sklearn.metrics import average_precision_score

    f, e = _span_runs(120, 0, scattered=scattered)
    fv, ev = _span_runs(60, 1, scattered=scattered)
    ft, et = _span_runs(60, 2, scattered=scattered)
    tok = make_detector("saplma", token_probe=True).fit(f, e, validation=(fv, ev))
    assert tok.token_layer_ == 9
    assert set(tok.train_info_["token_window_ap"]) == {str(w) for w in TOKEN_WINDOWS}
    assert (tok.token_window_ == 1) == scattered
    y = np.concatenate(
        [
            np.zeros(len(x.token_offsets), int) if (lab := x.token_labels(ex)) is None else lab
            for x, ex in zip(ft, et, strict=True)
        ]
    )

    def ap(window: int) -> float:
        tok.token_window_ = window
        return float(
            average_precision_score(y, np.concatenate([tok.predict(x).token_scores for x in ft]))
        )

    chosen = tok.token_window_
    if scattered:
        assert ap(1) > ap(9)
    else:
        assert ap(chosen) > ap(1) + 0.1
    tok.token_window_ = chosen
    tok.save(tmp_path / "w")
    assert json.loads((tmp_path / "w" / "weights.json").read_text())["token_window"] == chosen
    back = SaplmaDetector.load(tmp_path / "w", model_key=tok.model_key_)
    np.testing.assert_allclose(
        back.predict(ft[1]).token_scores, tok.predict(ft[1]).token_scores, atol=1e-6
    )


def test_saplma_token_probe_without_validation_chooses_on_held_out_sources() -> None:
    """Inside an ensemble members get no validation part: the token probe then ranks its
    layers and windows on a fifth of its own training sources, and still finds the layer
    that carries the spans (9), not the answer probe's (3)."""
    f, e = _token_signal(180, 0)
    tok = make_detector("saplma", token_probe=True, token_sample=200).fit(f, e)
    assert tok.layer_ == 3 and tok.token_layer_ == 9
    assert set(tok.train_info_["token_window_ap"]) == {str(w) for w in TOKEN_WINDOWS}
    # Too few sources to hold any out: the answer probe's layer, unsmoothed.
    few = make_detector("saplma", token_probe=True, token_sample=200).fit(f[:3], e[:3])
    assert few.token_layer_ == few.layer_ and few.token_window_ == 1
    assert few.train_info_["token_window_ap"] == {}


def test_saplma_answer_from_the_token_probes_peak(tmp_path) -> None:
    """answer=token_peak: the answer score is the token probe's highest logit averaged over
    peak_window-token windows (the answer probe still fitted, shown unused); saved, loaded
    and checked; without span labels to fit the token probe the answer probe scores."""
    f, e = _span_runs(120, 0, scattered=False)
    fv, ev = _span_runs(60, 1, scattered=False)
    ft, et = _span_runs(60, 2, scattered=False)
    det = make_detector("saplma", token_probe=True, answer="token_peak", peak_window=9)
    det.fit(f, e, validation=(fv, ev))
    assert det.answer_ == "token_peak" and det.train_info_["answer"] == "token_peak"
    x = ft[0]
    z = det.token_probe_.decision_function(det._block(x, det.token_layer_))
    v = det.predict(x)
    assert v.score == pytest.approx(1 / (1 + np.exp(-window_mean(z, 9).max())))
    assert next(iter(v.explanation)).startswith("token probe peak (layer 9, 9-token windows)")
    plain = make_detector("saplma", token_probe=True).fit(f, e, validation=(fv, ev))
    np.testing.assert_allclose(v.token_scores, plain.predict(x).token_scores, atol=1e-6)
    assert plain.predict(x).score != pytest.approx(v.score)
    y = [ex.label for ex in et]
    assert roc_auc_score(y, [det.predict(g).score for g in ft]) > 0.9
    det.save(tmp_path / "peak")
    back = SaplmaDetector.load(tmp_path / "peak", model_key=det.model_key_)
    assert back.predict(x).score == pytest.approx(v.score, abs=1e-9)
    for bad in ("tokens", ["token_peak"], 1):
        _rewrite_weights(tmp_path / "peak", answer=bad)
        with pytest.raises(DataError, match="answer"):
            SaplmaDetector.load(tmp_path / "peak")
    plain.save(tmp_path / "plain")
    _rewrite_weights(tmp_path / "plain", answer="token_peak", token_probe=None)
    with pytest.raises(DataError, match="answer"):
        SaplmaDetector.load(tmp_path / "plain")
    # No span labels: no token probe, so the answer probe scores (and says so).
    bare = [dataclasses.replace(ex, spans=()) if ex.label else ex for ex in e]
    nospan = make_detector("saplma", token_probe=True, answer="token_peak").fit(f, bare)
    assert nospan.answer_ == "probe" and "no token probe" in nospan.train_info_["answer"]
    for bad_cfg in ({"answer": "peak", "token_probe": True}, {"answer": "token_peak"}):
        with pytest.raises(DataError, match="answer"):
            make_detector("saplma", **bad_cfg)
    for w in (4, 0, 301):
        with pytest.raises(DataError, match="peak_window"):
            make_detector("saplma", token_probe=True, peak_window=w)


@pytest.mark.parametrize("bad", [4, 0, 1001, "9", 9.0, True, None])
def test_saplma_refuses_a_bad_token_window(tmp_path, bad) -> None:
    f, e = _token_signal(80, 0)
    fv, ev = _token_signal(40, 1)
    make_detector("saplma", token_probe=True, token_sample=200).fit(f, e, validation=(fv, ev)).save(
        tmp_path / "a"
    )
    _rewrite_weights(tmp_path / "a", token_window=bad)
    with pytest.raises(DataError, match="token window"):
        SaplmaDetector.load(tmp_path / "a")


def test_window_mean_averages_neighbours_and_keeps_width_one() -> None:
    x = np.asarray([0.0, 0.0, 3.0, 0.0, 0.0])
    np.testing.assert_allclose(window_mean(x, 3), [0, 1, 1, 1, 0])
    np.testing.assert_allclose(window_mean(x, 1), x)
    np.testing.assert_allclose(window_mean(np.asarray([1.0, 2.0]), 5), [1.4, 1.6])
    assert window_mean(np.zeros(0), 5).shape == (0,)
    for bad in (2, -1, 257, 3.0):
        with pytest.raises(DataError, match="odd int"):
            window_mean(x, bad)


# ----------------------------------------------------------------------------- Lookback Lens


def test_lookback_ratios_against_a_loop() -> None:
    rng = np.random.default_rng(0)
    seq, heads = 12, 3
    answer = np.arange(8, 12)  # p_1..p_4
    gen = answer - 1
    full = rng.random((heads, seq, seq))
    full = np.tril(full)
    full /= full.sum(-1, keepdims=True)
    pat = full[:, gen, :]
    ctx = np.asarray([2, 3, 4, 5])
    got = lookback_ratios(pat, ctx, answer)
    for h in range(heads):
        for j in range(len(answer)):
            a_ctx = full[h, gen[j], ctx].mean()
            earlier = answer[:j]
            a_new = full[h, gen[j], earlier].mean() if j else 0.0
            assert got[j, h] == pytest.approx(a_ctx / (a_ctx + a_new), rel=1e-5)
    assert np.allclose(got[0], 1.0)  # nothing written yet: all lookback


@pytest.mark.parametrize("chunk", [None, 5])
def test_lookback_from_the_mass_reduced_in_the_pass_equals_the_ratios_of_the_rows(
    tiny_model, toy_example, chunk
) -> None:
    """The trace reduces each layer's attention to its sums over the key groups as the
    pass runs (issue 68: no long prompt's rows kept); Lookback Lens's ratios from those
    sums equal the ratios of the kept rows, for both meanings of "context", in one pass
    or in chunks."""
    from core.engine.trace import KEY_GROUPS, key_groups

    lay = render(toy_example, tiny_model)
    L = tiny_model.info.n_layers
    needs = Needs.of(["pattern", "key_mass"], n_layers=L, positions="generation")
    tr = trace(tiny_model, lay, needs, chunk_tokens=chunk)
    answer = lay.response_positions
    contexts = {"context": lay.context_positions(), "prompt": np.arange(int(answer[0]))}
    for name, ctx in contexts.items():
        group = KEY_GROUPS.index(name)
        assert np.array_equal(key_groups(lay)[group], ctx)
        for layer in range(L):
            g = lay.generation_positions
            want = lookback_ratios(tr.at("pattern", layer, g).numpy(), ctx, answer)
            got = lookback_from_mass(tr.at("key_mass", layer, g).numpy(), len(ctx), group)
            np.testing.assert_allclose(got, want, atol=1e-6)
    det = make_detector("lookback_lens")
    assert {k for k, _ in det.needs(tiny_model.info).hooks} == {"key_mass"}  # no rows kept


def test_window_means_cover_every_token() -> None:
    x = np.arange(20, dtype=np.float32).reshape(10, 2)
    means, bounds = window_means(x, 4, 3)
    assert bounds.tolist() == [[0, 4], [3, 7], [6, 10]]
    for m, (a, b) in zip(means, bounds, strict=True):
        np.testing.assert_allclose(m, x[a:b].mean(0))
    short, b2 = window_means(x[:2], 8)
    assert b2.tolist() == [[0, 2]] and np.allclose(short[0], x[:2].mean(0))


def test_lookback_features_match_the_trace(tiny_model, toy_example) -> None:
    f = run_example(tiny_model, toy_example, [make_detector("lookback_lens")])["lookback_lens"]
    lay = render(toy_example, tiny_model)
    n_layers = tiny_model.info.n_layers
    tr = trace(tiny_model, lay, Needs.of(["pattern"], n_layers=n_layers, positions="all"))
    ans, ctx = lay.response_positions, lay.context_positions()
    h = tiny_model.info.n_heads
    assert f.tokens is not None and f.tokens.shape == (len(ans), n_layers * h)
    for layer in range(n_layers):
        full = tr.get("pattern", layer).numpy()  # [head, q, k]
        for head in range(h):
            for j, p in enumerate(ans):
                g = p - 1
                a_ctx = full[head, g, ctx].mean()
                a_new = full[head, g, ans[:j]].mean() if j else 0.0
                want = a_ctx / (a_ctx + a_new)
                assert f.tokens[j, layer * h + head] == pytest.approx(want, rel=1e-4, abs=1e-6)
    np.testing.assert_allclose(f.response, f.tokens.mean(0), rtol=1e-5)
    # the paper's context (the whole prompt) differs from the passages alone
    g = run_example(tiny_model, toy_example, [make_detector("lookback_lens", context="prompt")])
    assert not np.allclose(g["lookback_lens"].tokens, f.tokens)


def _planted_windows(n: int, seed: int = 0):
    """Lookback features whose head 0 ratio drops inside hallucinated spans."""
    rng = np.random.default_rng(seed)
    feats, exs = [], []
    for i in range(n):
        label = bool(i % 2)
        t = int(rng.integers(12, 24))
        x = rng.uniform(0.4, 0.6, size=(t, 4)).astype(np.float32)
        spans = ()
        if label:
            a = int(rng.integers(0, t - 6))
            x[a : a + 6, 0] -= 0.3
            spans = (Span(start=a, end=a + 6),)
        ex = RAGExample(
            id=f"w{i}",
            question=f"q{i}",
            passages=(f"p{i}",),
            response="y" * t,
            label=label,
            spans=spans,
        )
        names = tuple(f"LR_L0H{h}" for h in range(4))
        feats.append(
            Features(
                detector="lookback_lens",
                example_id=ex.id,
                model="m",
                names=names,
                response=x.mean(0),
                token_names=names,
                tokens=x,
                token_offsets=np.asarray([[k, k + 1] for k in range(t)]),
            )
        )
        exs.append(ex)
    return feats, exs


def test_lookback_windows_find_the_low_ratio_spans(tmp_path) -> None:
    f, e = _planted_windows(80)
    fv, ev = _planted_windows(40, seed=1)
    det = LookbackLensDetector().fit(f, e, validation=(fv, ev))
    assert det.window_model_ is not None
    # head 0 is the signal, with a negative weight (a low ratio means hallucinated)
    assert np.argmax(np.abs(det.window_model_.coef_)) == 0 and det.window_model_.coef_[0] < 0
    ft, et = _planted_windows(20, seed=2)
    hits = []
    for x, ex in zip(ft, et, strict=True):
        v = det.predict(x)
        assert v.token_scores.shape == (x.tokens.shape[0],)
        if ex.spans:
            s = ex.spans[0]
            inside = v.token_scores[s.start : s.end].mean()
            outside = np.delete(v.token_scores, np.arange(s.start, s.end)).mean()
            hits.append(inside > outside)
    assert np.mean(hits) >= 0.9
    det.save(tmp_path / "l")
    back = LookbackLensDetector.load(tmp_path / "l", model_key="m")
    assert back.response_mode_ == det.response_mode_
    # pinned: the answer score chosen on validation; a fixed one pins nothing
    assert det.pinned() == {"response": det.response_mode_}
    fixed = LookbackLensDetector(dataclasses.replace(det.config, **det.pinned())).fit(f, e)
    assert fixed.response_mode_ == det.response_mode_ and fixed.pinned() == {}
    for x in ft[:3]:
        assert back.predict(x).score == pytest.approx(det.predict(x).score, abs=1e-9)
    # token_window: the same token scores averaged over 9 tokens in logit space.
    wide = LookbackLensDetector(dataclasses.replace(det.config, token_window=9))
    wide.__dict__.update({k: v for k, v in det.__dict__.items() if k != "config"})
    x = max(ft, key=lambda g: g.tokens.shape[0])
    assert wide.predict(x).score == pytest.approx(det.predict(x).score)
    np.testing.assert_allclose(
        wide.predict(x).token_scores, window_probs(det.predict(x).token_scores, 9), rtol=1e-6
    )
    assert not np.allclose(wide.predict(x).token_scores, det.predict(x).token_scores)
    with pytest.raises(DataError, match="token_window"):
        make_detector("lookback_lens", token_window=2)


def test_lookback_without_token_labels_scores_windows_with_the_answer_model(
    feats, balanced
) -> None:
    f = list(feats["lookback_lens"])
    no_spans = [
        RAGExample(
            id=e.id, question=e.question, passages=e.passages, response=e.response, label=e.label
        )
        if e.label
        else e
        for e in balanced
    ]
    # hallucinated answers without spans teach no windows; faithful ones alone are one class
    det = LookbackLensDetector().fit(f, no_spans)
    assert det.window_model_ is None and det.response_mode_ == "answer"
    v = det.predict(f[0])
    assert v.token_scores is not None and v.token_scores.shape == (f[0].tokens.shape[0],)
    with pytest.raises(DataError, match="token labels"):
        make_detector("lookback_lens", response="windows").fit(f, no_spans)


def test_both_probes_are_ensemble_members_and_token_scorers() -> None:
    from core.learning.contract import scores_tokens

    assert {"saplma", "lookback_lens"} <= set(make_detector("ensemble").config.members)
    assert scores_tokens(make_detector("saplma")) and scores_tokens(make_detector("lookback_lens"))


def test_window_probs_average_in_logit_space() -> None:
    p = np.asarray([0.5, 0.5, 0.9, 0.5, 0.5], dtype=np.float32)
    z = np.log(9.0) / 3
    np.testing.assert_allclose(window_probs(p, 3), 1 / (1 + np.exp(-np.r_[0, z, z, z, 0])))
    np.testing.assert_array_equal(window_probs(p, 1), p)
    assert window_probs(np.zeros(0), 5).shape == (0,)
    assert np.all(np.isfinite(window_probs(np.asarray([0.0, 1.0, 1.0]), 3)))
    with pytest.raises(DataError, match="odd int"):
        window_probs(p, 4)
