"""CORTEX on the tiny model: paired features, the contextual residual, the seeded MLP,
smoothing and ablations, artifacts."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from core.base.errors import DataError, ModelError, NotFittedError
from core.base.examples import RAGExample, Span
from core.data import resolve_dataset
from core.detectors import make_detector
from core.detectors.cortex import CortexDetector, contextual_residual
from core.engine.layout import render
from core.engine.trace import Needs, trace
from core.learning.contract import Features, Run
from core.pipeline.extract import extract_features, run_example
from core.signals.smoothing import answer_score, smooth_tokens

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def balanced() -> list[RAGExample]:
    builtin = resolve_dataset("builtin")[1]
    pos = [e for e in builtin if e.label and e.spans][:12]
    neg = [e for e in builtin if e.label is False][:12]
    return [x for pair in zip(pos, neg, strict=True) for x in pair]


@pytest.fixture(scope="module")
def feats(tiny_model, balanced) -> list[Features]:
    det = make_detector("cortex")
    return list(extract_features(tiny_model, balanced, [det]).features["cortex"])


@pytest.fixture(scope="module")
def fitted(feats, balanced) -> CortexDetector:
    return make_detector("cortex", epochs=5).fit(feats, balanced)


def test_features_are_delta_h_and_the_contextual_residual(tiny_model, toy_example) -> None:
    f = run_example(tiny_model, toy_example, [make_detector("cortex")])["cortex"]
    full = render(toy_example, tiny_model)
    bare = render(toy_example, tiny_model, with_context=False)
    last = tiny_model.info.n_layers - 1
    t_full = trace(
        tiny_model,
        full,
        [Needs.of(["resid_post", "pattern"], layers=[last], positions="all")],
    )
    t_bare = trace(tiny_model, bare, Needs.of(["resid_post"], layers=[last], positions="all"))
    pf, pb = full.response_positions, bare.response_positions
    dh = (t_full.get("resid_post", last)[pf] - t_bare.get("resid_post", last)[pb]).numpy()
    pat = t_full.get("pattern", last).numpy().mean(0)  # [query, key], every head averaged
    T, d = dh.shape
    c = np.empty_like(dh)
    for i in range(T):
        acc = np.zeros(d)
        for j in range(i):
            acc += pat[pf[i], pf[j]] * dh[j]
        c[i] = dh[i] - acc
    assert f.tokens is not None and f.tokens.shape == (T, 2 * d)
    np.testing.assert_allclose(f.tokens[:, :d], dh, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(f.tokens[:, d:], c, rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(f.token_offsets, full.response_offsets)
    # The first answer token has no earlier answer token: its residual is dh itself.
    np.testing.assert_allclose(f.tokens[0, d:], dh[0], rtol=1e-6)


def test_residual_uses_strictly_earlier_tokens_without_renormalising() -> None:
    dh = np.asarray([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    alpha = np.asarray([[0.9, 0.0, 0.0], [0.3, 0.5, 0.0], [0.1, 0.2, 0.4]])
    c = contextual_residual(dh, alpha)
    np.testing.assert_allclose(c[0], dh[0])
    np.testing.assert_allclose(c[1], dh[1] - 0.3 * dh[0])
    np.testing.assert_allclose(c[2], dh[2] - 0.1 * dh[0] - 0.2 * dh[1])


def test_the_bare_pass_traces_only_the_hidden_states(tiny_model, toy_example, monkeypatch) -> None:
    import core.pipeline.extract

    seen: list[tuple[bool, frozenset]] = []
    real = core.pipeline.extract.trace_batch

    def spy(model, layouts, needs, **kw):  # noqa: ANN001, ANN202
        seen.extend((layout.with_context, needs.hooks) for layout in layouts)
        return real(model, layouts, needs, **kw)

    monkeypatch.setattr(core.pipeline.extract, "trace_batch", spy)
    run_example(tiny_model, toy_example, [make_detector("cortex")])
    last = tiny_model.info.n_layers - 1
    assert seen == [
        (True, frozenset({("resid_post", last), ("pattern", last)})),
        (False, frozenset({("resid_post", last)})),
    ]


def test_other_layers_heads_and_ln_final(tiny_model, toy_example) -> None:
    base = run_example(tiny_model, toy_example, [make_detector("cortex")])["cortex"]
    d = tiny_model.info.d_model
    one_head = run_example(tiny_model, toy_example, [make_detector("cortex", attn_heads=(1,))])
    assert not np.allclose(one_head["cortex"].tokens[:, d:], base.tokens[:, d:])
    np.testing.assert_allclose(one_head["cortex"].tokens[:, :d], base.tokens[:, :d])
    ln = run_example(tiny_model, toy_example, [make_detector("cortex", after_ln_final=True)])
    assert not np.allclose(ln["cortex"].tokens[:, :d], base.tokens[:, :d])
    with pytest.raises(ModelError, match="after_ln_final"):
        make_detector("cortex", layer=0, after_ln_final=True).needs(tiny_model.info)
    with pytest.raises(ModelError, match="attn_heads"):
        make_detector("cortex", attn_heads=(99,)).needs(tiny_model.info)
    with pytest.raises(ModelError, match="layer 7"):
        make_detector("cortex", layer=7).needs(tiny_model.info)


def test_answers_that_tokenize_differently_are_refused(tiny_model, toy_example) -> None:
    det = make_detector("cortex")
    other = dataclasses.replace(toy_example, response=toy_example.response + " More words.")
    full = render(toy_example, tiny_model)
    needs = det.needs(tiny_model.info)
    run = Run(
        example=toy_example,
        layout=full,
        trace=trace(tiny_model, full, needs),
        bare=trace(tiny_model, render(other, tiny_model, with_context=False), needs),
        model=tiny_model.info,
    )
    with pytest.raises(DataError, match="tokenizes differently"):
        det.features(run)


def test_fit_is_seeded_and_records_the_loss_curve(feats, balanced, fitted) -> None:
    again = make_detector("cortex", epochs=5).fit(feats, balanced)
    for a, b in zip(
        fitted.mlp_.state_dict().values(), again.mlp_.state_dict().values(), strict=True
    ):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    other = make_detector("cortex", epochs=5, seed=1).fit(feats, balanced)
    assert not np.allclose(
        next(iter(other.mlp_.state_dict().values())).numpy(),
        next(iter(fitted.mlp_.state_dict().values())).numpy(),
    )
    info = fitted.train_info_
    assert len(info["loss_curve"]) == 5 and info["loss_curve"][-1] < info["loss_curve"][0]
    n_pos = info["n_positive_tokens"]
    assert info["pos_weight"] == pytest.approx((info["n_tokens"] - n_pos) / n_pos)
    assert info["n_token_answers"] == len(balanced)
    # Standardised with training statistics, over both halves of [dh; c].
    assert fitted.mean_.shape == (feats[0].tokens.shape[1],)


def test_predict_smooths_tokens_and_takes_the_max_for_the_answer(feats, fitted) -> None:
    f = feats[0]
    raw = fitted.raw_token_scores(f)
    v = fitted.predict(f)
    np.testing.assert_allclose(v.token_scores, smooth_tokens(raw, 0.993), rtol=1e-6)
    assert v.score == pytest.approx(answer_score(raw, 0.93))
    views = fitted.token_views(f)
    np.testing.assert_allclose(views.raw, raw)
    assert views.answer_smoothed.max() == pytest.approx(v.score, rel=1e-6)
    plain = dataclasses.replace(fitted.config, smooth=False)
    det = CortexDetector(plain)
    det.mlp_, det.mean_, det.std_, det.model_key_ = (
        fitted.mlp_,
        fitted.mean_,
        fitted.std_,
        fitted.model_key_,
    )
    v2 = det.predict(f)
    np.testing.assert_allclose(v2.token_scores, raw)
    assert v2.score == pytest.approx(float(raw.max()))
    # token_window: the smoothed token output averaged over 5 tokens in logit space, by
    # hand (edges repeated); the answer score stays the spec's.
    det.config = dataclasses.replace(fitted.config, token_window=5)
    v3 = det.predict(f)
    s = np.clip(np.asarray(smooth_tokens(raw, 0.993), dtype=np.float32), 1e-4, 1 - 1e-4)
    z = np.log(s / (1 - s))
    padded = np.concatenate([np.full(2, z[0]), z, np.full(2, z[-1])])
    want = 1 / (1 + np.exp(-np.array([padded[i : i + 5].mean() for i in range(len(z))])))
    assert len(z) >= 5
    np.testing.assert_allclose(v3.token_scores, want, rtol=1e-5)
    assert v3.score == pytest.approx(v.score)
    for bad in (4, 0, 257, "5", 5.0):
        with pytest.raises(DataError, match="token_window"):
            dataclasses.replace(fitted.config, token_window=bad)


def test_delta_only_ablation_reads_half_the_inputs(feats, balanced) -> None:
    det = make_detector("cortex", inputs="delta", epochs=2).fit(feats, balanced)
    assert det.mean_.shape == (feats[0].tokens.shape[1] // 2,)
    assert det.predict(feats[1]).token_scores.shape == (feats[1].tokens.shape[0],)
    # Ablations change learning only: the cached features serve all of them.
    h = make_detector("cortex").config.feature_hash()
    assert make_detector("cortex", inputs="delta", smooth=False).config.feature_hash() == h
    assert make_detector("cortex", attn_heads=(0,)).config.feature_hash() != h


def _synthetic(n: int, seed: int) -> tuple[list[Features], list[RAGExample]]:
    """Answers of 20 tokens whose hallucinated tokens have a large first feature."""
    rng = np.random.default_rng(seed)
    feats, exs = [], []
    for k in range(n):
        x = rng.normal(size=(20, 8)).astype(np.float32)
        offsets = np.stack([np.arange(20) * 2, np.arange(20) * 2 + 2], axis=1)
        spans: tuple[Span, ...] = ()
        if k % 2:
            x[5:10, 0] += 3.0
            spans = (Span(start=10, end=20, type="baseless"),)
        feats.append(
            Features(
                detector="cortex",
                example_id=f"s{k}",
                model="m",
                names=("a",),
                response=np.zeros(1),
                token_names=tuple(f"t{i}" for i in range(8)),
                tokens=x,
                token_offsets=offsets,
            )
        )
        exs.append(
            RAGExample(
                id=f"s{k}",
                task="qa",
                question="q?",
                passages=("p",),
                response="x" * 40,
                label=bool(k % 2),
                spans=spans,
            )
        )
    return feats, exs


def test_learns_token_labels_from_spans() -> None:
    tr_f, tr_e = _synthetic(60, 0)
    te_f, te_e = _synthetic(20, 1)
    det = make_detector("cortex").fit(tr_f, tr_e)
    y = np.concatenate(
        [
            np.zeros(20) if f.token_labels(e) is None else f.token_labels(e)
            for f, e in zip(te_f, te_e, strict=True)
        ]
    )
    s = np.concatenate([det.raw_token_scores(f) for f in te_f])
    assert roc_auc_score(y, s) > 0.95
    answer = [det.predict(f).score for f in te_f]
    assert roc_auc_score([int(e.label) for e in te_e], answer) > 0.95


def test_training_needs_token_labels() -> None:
    f, e = _synthetic(6, 0)
    no_spans = [dataclasses.replace(x, spans=(), label=x.label) for x in e]
    with pytest.raises(DataError, match="token labels"):
        make_detector("cortex").fit(f, no_spans)


def test_artifact_round_trip_and_refusals(fitted, feats, tmp_path, reseal) -> None:
    folder = fitted.save(tmp_path / "cortex")
    loaded = CortexDetector.load(folder, model_key=fitted.model_key_)
    for f in feats[:3]:
        np.testing.assert_allclose(
            loaded.predict(f).token_scores, fitted.predict(f).token_scores, rtol=1e-6
        )
    cfg = json.loads((folder / "cfg.json").read_text())
    assert len(cfg["train"]["loss_curve"]) == 5
    with pytest.raises(ModelError, match="trained on model"):
        CortexDetector.load(folder, model_key="another-model")
    (folder / "mlp.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(DataError, match="mlp.safetensors does not match the SHA-256"):
        CortexDetector.load(folder)
    reseal(folder)
    with pytest.raises(DataError, match="malformed cortex artifact"):
        CortexDetector.load(folder)
    with pytest.raises(NotFittedError):
        make_detector("cortex").predict(feats[0])
    with pytest.raises(DataError, match="inputs must be"):
        make_detector("cortex", inputs="everything")
