"""Copying-head scores: brute force over materialised OV circuits, GQA mapping, paper mode, cache."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import core.signals.copying_heads as heads
from app.components.head_charts import copying_figure
from core.base.errors import ModelError
from core.engine.layout import render
from core.engine.trace import Needs, trace
from core.signals.copying_heads import (
    CopyingConfig,
    CopyingScores,
    OVWeights,
    copying_scores,
    eigen_copying_score,
    gershgorin_stats,
    iqr_outliers,
    kv_head_index,
    ov_eigenvalues,
    ov_weights,
    rank_combined_score,
)


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    """Every test gets its own cache dir and an empty in-process cache."""
    monkeypatch.setenv("RAGSCOPE_CACHE_DIR", str(tmp_path))
    heads.clear_cache()
    yield
    heads.clear_cache()


def _random_weights(vocab: int = 300, seed: int = 0) -> OVWeights:
    """2 layers, 4 query heads sharing 2 kv heads, d_model 32, d_head 8."""
    g = torch.Generator().manual_seed(seed)
    d_model, d_head = 32, 8
    return OVWeights(
        W_E=torch.randn(vocab, d_model, generator=g, dtype=torch.float64),
        W_U=torch.randn(d_model, vocab, generator=g, dtype=torch.float64),
        W_V=torch.randn(2, 2, d_model, d_head, generator=g, dtype=torch.float64) / 5,
        W_O=torch.randn(2, 4, d_head, d_model, generator=g, dtype=torch.float64) / 5,
        kv_index=kv_head_index(4, 2),
    )


def _subset_weights(w: OVWeights, ids: np.ndarray) -> OVWeights:
    """The model's own OV matrices with the vocabulary restricted to ``ids``."""
    s = torch.as_tensor(ids)
    return OVWeights(
        W_E=w.W_E[s].double(),
        W_U=w.W_U[:, s].double(),
        W_V=w.W_V.double(),
        W_O=w.W_O.double(),
        kv_index=w.kv_index,
    )


def _full_circuit(w: OVWeights, layer: int, head: int) -> np.ndarray:
    """``M = W_E W_V[kv(h)] W_O[h] W_U`` materialised, ``[vocab, vocab]`` float64."""
    kv = int(w.kv_index[head])
    m = w.W_E.double() @ w.W_V[layer, kv].double() @ w.W_O[layer, head].double() @ w.W_U.double()
    return m.numpy()


def _assert_same_spectrum(small: np.ndarray, full: np.ndarray, rtol: float = 1e-6) -> None:
    """Every eigenvalue of the small matrix is one of M's non-zero ones, and vice versa."""
    scale = np.abs(full).max()
    nonzero = full[np.abs(full) > 1e-7 * scale]
    assert len(nonzero) == len(small), (len(nonzero), len(small))
    for a, b in ((small, nonzero), (nonzero, small)):
        dist = np.abs(a[:, None] - b[None, :]).min(1)
        assert dist.max() <= rtol * scale, dist.max()


# --------------------------------------------------------------------------- exact mode


@pytest.mark.parametrize("source", ["random", "tiny-subset"])
def test_exact_mode_equals_brute_force_over_the_full_circuit(source, tiny_model):
    if source == "random":
        w = _random_weights(vocab=120)
    else:  # the tiny model's real matrices on 160 random tokens of its vocabulary
        rng = np.random.default_rng(0)
        ids = np.sort(rng.choice(tiny_model.info.d_vocab, 160, replace=False))
        w = _subset_weights(ov_weights(tiny_model), ids)
    eig = ov_eigenvalues(w)
    n_layers, n_heads, d_head = eig.shape
    assert (n_layers, n_heads) == (2, 4) and d_head == w.W_V.shape[-1]
    scores = eigen_copying_score(eig)
    for layer in range(n_layers):
        for head in range(n_heads):
            full = np.linalg.eigvals(_full_circuit(w, layer, head))
            _assert_same_spectrum(eig[layer, head], full)
            brute = full.real.sum() / np.abs(full).sum()
            assert scores[layer, head] == pytest.approx(brute, abs=1e-6)
    assert (np.abs(scores) <= 1).all() and np.ptp(scores) > 0.05


def test_copying_score_statistic():
    assert eigen_copying_score(np.array([2.0, 1.0, 0.0])) == pytest.approx(1.0)
    assert eigen_copying_score(np.array([-2.0, -1.0])) == pytest.approx(-1.0)
    assert eigen_copying_score(np.array([1j, -1j])) == pytest.approx(0.0)
    assert eigen_copying_score(np.array([3.0, -1.0])) == pytest.approx(0.5)
    assert eigen_copying_score(np.zeros(4)) == 0.0
    # An identity-like OV circuit copies: score 1.
    w = _random_weights(vocab=64)
    w_id = OVWeights(
        W_E=w.W_E, W_U=w.W_E.T.clone(), W_V=w.W_V, W_O=w.W_V.transpose(-1, -2)[:, [0, 0, 1, 1]],
        kv_index=w.kv_index,
    )  # fmt: skip
    assert np.allclose(eigen_copying_score(ov_eigenvalues(w_id)), 1.0)


def test_model_scores_equal_an_independent_computation_from_hf_weights(tiny_model, tiny_reference):
    """Slice the plain HF projections by hand (no bridge) and map heads like ``repeat_kv``."""
    res = copying_scores(tiny_model, cache=False)
    hf = tiny_reference
    cfg = hf.config
    d_head = cfg.head_dim
    n_rep = cfg.num_attention_heads // cfg.num_key_value_heads
    with torch.no_grad():
        W_E = hf.model.embed_tokens.weight.double()
        W_U = hf.lm_head.weight.double().T
        G = W_U @ W_E
        for layer, block in enumerate(hf.model.layers):
            v = block.self_attn.v_proj.weight.double()  # [kv * d_head, d_model]
            o = block.self_attn.o_proj.weight.double()  # [d_model, heads * d_head]
            for head in range(cfg.num_attention_heads):
                kv = head // n_rep
                W_V = v[kv * d_head : (kv + 1) * d_head].T
                W_O = o[:, head * d_head : (head + 1) * d_head].T
                ev = np.linalg.eigvals((W_O @ G @ W_V).numpy())
                ref = ev.real.sum() / np.abs(ev).sum()
                assert res.scores[layer, head] == pytest.approx(ref, abs=1e-5)
    assert res.scores.shape == (tiny_model.info.n_layers, tiny_model.info.n_heads)
    assert res.mode == "exact" and res.model_key == tiny_model.info.key
    assert res.eigenvalues is not None and res.eigenvalues.shape == (2, 4, d_head)
    assert res.kv_index.tolist() == [0, 0, 1, 1]


# --------------------------------------------------------------------------- GQA


def test_ov_weights_and_kv_map_reproduce_the_forward_pass(tiny_model, toy_example):
    """z[h] = pattern[h] @ (ln1(resid_pre) W_V[kv(h)]) and attn_out = sum_h z[h] W_O[h]."""
    layout = render(toy_example, tiny_model)
    n_layers = tiny_model.info.n_layers
    tr = trace(
        tiny_model,
        layout,
        Needs.of(["resid_pre", "z", "pattern", "attn_out"], n_layers=n_layers, positions="all"),
    )
    w = ov_weights(tiny_model)
    interleaved = np.arange(tiny_model.info.n_heads) % tiny_model.info.n_kv_heads
    assert not np.array_equal(interleaved, w.kv_index)
    for layer in range(n_layers):
        ln1 = tiny_model.hf_model.model.layers[layer].input_layernorm
        with torch.no_grad():
            x = ln1(tr.get("resid_pre", layer))
        v = torch.einsum("pd,kdh->kph", x, w.W_V[layer].float())  # [kv, pos, d_head]
        pattern, z = tr.get("pattern", layer), tr.get("z", layer)

        def z_for(kv_map: np.ndarray, pattern=pattern, v=v) -> torch.Tensor:
            return torch.einsum("hqk,hkd->qhd", pattern, v[torch.as_tensor(kv_map)])

        assert (z_for(w.kv_index) - z).abs().max() < 1e-4
        assert (z_for(interleaved) - z).abs().max() > 1e-2  # the test can tell the maps apart
        out = torch.einsum("phd,hdm->pm", z, w.W_O[layer].float())
        assert (out - tr.get("attn_out", layer)).abs().max() < 1e-4


def test_kv_head_perturbations_move_exactly_the_heads_that_read_it(tiny_model):
    w = ov_weights(tiny_model)
    base = eigen_copying_score(ov_eigenvalues(w))

    def scores_with(W_V=None, W_O=None) -> np.ndarray:
        ww = OVWeights(
            W_E=w.W_E,
            W_U=w.W_U,
            W_V=w.W_V if W_V is None else W_V,
            W_O=w.W_O if W_O is None else W_O,
            kv_index=w.kv_index,
        )
        return eigen_copying_score(ov_eigenvalues(ww))

    # Negating kv head 1 of layer 1 negates the scores of query heads 2 and 3 only.
    W_V = w.W_V.clone()
    W_V[1, 1] *= -1
    s = scores_with(W_V=W_V)
    np.testing.assert_allclose(s[1, 2:], -base[1, 2:], atol=1e-6)
    np.testing.assert_allclose(s[1, :2], base[1, :2], atol=1e-6)
    np.testing.assert_allclose(s[0], base[0], atol=1e-6)
    # Zeroing kv head 0 of layer 0 silences query heads 0 and 1.
    W_V = w.W_V.clone()
    W_V[0, 0] = 0
    s = scores_with(W_V=W_V)
    assert s[0, 0] == 0 and s[0, 1] == 0
    np.testing.assert_allclose(s[0, 2:], base[0, 2:], atol=1e-6)
    # Heads 0 and 1 share a kv head: swapping their W_O swaps their scores.
    W_O = w.W_O.clone()
    W_O[0, [0, 1]] = W_O[0, [1, 0]]
    s = scores_with(W_O=W_O)
    np.testing.assert_allclose(s[0, [0, 1]], base[0, [1, 0]], atol=1e-6)
    # Heads 1 and 2 do not: swapping their W_O changes their scores.
    W_O = w.W_O.clone()
    W_O[0, [1, 2]] = W_O[0, [2, 1]]
    s = scores_with(W_O=W_O)
    assert not np.allclose(s[0, [1, 2]], base[0, [2, 1]], atol=1e-3)


def test_kv_head_index():
    assert kv_head_index(9, 3).tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert kv_head_index(4, 4).tolist() == [0, 1, 2, 3]
    with pytest.raises(ModelError, match="multiple"):
        kv_head_index(4, 3)


# --------------------------------------------------------------------------- paper mode


@pytest.mark.parametrize("source", ["tiny", "heavy-tailed"])
def test_gershgorin_stats_equal_brute_force(source, tiny_model):
    if source == "tiny":
        w, ids = ov_weights(tiny_model), np.arange(100, 400)
    else:  # a few loud token embeddings give Gershgorin outliers
        w, ids = _random_weights(vocab=300, seed=3), np.arange(20, 300)
        scale = torch.ones(300, 1, dtype=torch.float64)
        scale[::37] = 12.0
        w = OVWeights(W_E=w.W_E * scale, W_U=w.W_U, W_V=w.W_V, W_O=w.W_O, kv_index=w.kv_index)
    trace_, outliers = gershgorin_stats(w, ids, chunk_rows=64)
    t2, o2 = gershgorin_stats(w, ids, chunk_rows=1000)
    np.testing.assert_allclose(trace_, t2, rtol=1e-5, atol=1e-7)
    assert np.array_equal(outliers, o2)
    sub = _subset_weights(w, ids)
    for layer in range(2):
        for head in range(4):
            m = _full_circuit(sub, layer, head)  # [S, S]
            d = np.diag(m)
            r = np.abs(m).sum(1) - np.abs(d)
            pts = np.concatenate([d - r, d + r])
            q1, q3 = np.percentile(pts, [25, 75])
            lo, hi = q1 - 1.5 * (q3 - q1), q3 + 1.5 * (q3 - q1)
            assert trace_[layer, head] == pytest.approx(np.trace(m), rel=1e-4, abs=1e-6)
            assert abs(int(outliers[layer, head]) - int(((pts < lo) | (pts > hi)).sum())) <= 1
    if source == "heavy-tailed":
        assert outliers.min() > 0 and np.ptp(trace_) > 0


def test_iqr_outliers_and_rank_combination():
    assert iqr_outliers(np.array([1.0, 2, 3, 4, 100])) == 1
    assert iqr_outliers(np.array([1.0, 2, 3, 4, 5])) == 0
    assert iqr_outliers(np.array([-50.0, 2, 3, 4, 100]), factor=100) == 0
    trace_ = np.array([[5.0, -10.0], [1.0, 0.0]])
    outliers = np.array([[0, 3], [0, 1]])
    # outlier ranks (asc, average ties) [1.5, 4, 1.5, 3]; |trace| ranks (desc) [2, 1, 3, 4]
    expected = 1 - (np.array([[3.5, 5.0], [4.5, 7.0]]) - 2) / 6
    np.testing.assert_allclose(rank_combined_score(trace_, outliers), expected)


def test_paper_mode_runs_and_ranks(tiny_model):
    cfg = CopyingConfig(mode="paper", n_tokens=300)
    res = copying_scores(tiny_model, cfg, chunk_rows=128)
    assert res.mode == "paper" and res.scores.shape == (2, 4)
    assert res.trace is not None and res.n_outliers is not None and res.eigenvalues is None
    np.testing.assert_allclose(res.scores, rank_combined_score(res.trace, res.n_outliers))
    assert (res.scores >= 0).all() and (res.scores <= 1).all()
    # The default subset is the first non-special ids.
    ids = heads.default_token_subset(tiny_model, 300)
    special = set(tiny_model.tokenizer.all_special_ids)
    assert len(ids) == 300 and not special & set(ids.tolist())
    assert ids[0] == min(set(range(400)) - special)
    t, _ = gershgorin_stats(ov_weights(tiny_model), ids)
    np.testing.assert_allclose(res.trace, t, rtol=1e-5, atol=1e-7)
    # An explicit subset is honoured.
    other = copying_scores(
        tiny_model, CopyingConfig(mode="paper", token_ids=tuple(range(1000, 1200)))
    )
    assert not np.allclose(other.trace, res.trace)


# --------------------------------------------------------------------------- cache


def _boom(*args, **kwargs):
    raise AssertionError("recomputed although cached")


@pytest.mark.parametrize("mode", ["exact", "paper"])
def test_disk_cache_is_reused(tiny_model, tmp_path, monkeypatch, mode):
    cfg = CopyingConfig(mode=mode, n_tokens=200)
    first = copying_scores(tiny_model, cfg)
    files = list((tmp_path / "heads").glob(f"*-{mode}.npz"))
    assert len(files) == 1
    heads.clear_cache()  # only the disk cache is left
    monkeypatch.setattr(heads, "_compute", _boom)
    second = copying_scores(tiny_model, cfg)
    assert np.array_equal(second.scores, first.scores)
    assert second.mode == mode and second.model_key == tiny_model.info.key
    for name in ("eigenvalues", "trace", "n_outliers"):
        a, b = getattr(first, name), getattr(second, name)
        assert (a is None) == (b is None) and (a is None or np.array_equal(a, b))
    # Now in memory too: the file is no longer read.
    files[0].unlink()
    assert copying_scores(tiny_model, cfg) is second
    # Another paper-mode subset is another entry; exact mode does not depend on it.
    other = CopyingConfig(mode=mode, n_tokens=250, iqr_factor=2.0)
    if mode == "paper":
        with pytest.raises(AssertionError, match="recomputed"):
            copying_scores(tiny_model, other)
    else:
        assert copying_scores(tiny_model, other) is second


def test_cache_survives_a_corrupt_file(tiny_model, tmp_path):
    first = copying_scores(tiny_model)
    (path,) = (tmp_path / "heads").glob("*-exact.npz")
    path.write_bytes(b"not an npz")
    heads.clear_cache()
    again = copying_scores(tiny_model)
    np.testing.assert_allclose(again.scores, first.scores)
    assert path.stat().st_size > 100  # rewritten


def test_cache_false_neither_reads_nor_writes(tiny_model, tmp_path):
    copying_scores(tiny_model, cache=False)
    assert not (tmp_path / "heads").exists()


# --------------------------------------------------------------------------- result type


def test_top_heads_frame_round_trip_and_figure(tiny_model):
    res = copying_scores(tiny_model, cache=False)
    top = res.top_heads()
    assert len(top) == 8  # fewer heads than 32: all of them
    values = [res.scores[li, h] for li, h in top]
    assert values == sorted(values, reverse=True)
    assert top[0] == tuple(int(i) for i in np.unravel_index(np.argmax(res.scores), (2, 4)))
    assert res.top_heads(3) == top[:3] and res.top_heads(0) == []
    df = res.to_frame()
    assert list(df.columns) == ["layer", "head", "kv_head", "score", "rank"]
    assert df.loc[df["rank"] == 1, ["layer", "head"]].iloc[0].tolist() == list(top[0])
    assert df["kv_head"].tolist() == [0, 0, 1, 1, 0, 0, 1, 1]
    back = CopyingScores.from_frame(df.sample(frac=1.0, random_state=0))
    assert np.array_equal(back.scores, res.scores)
    assert back.mode == "exact" and back.model_key == res.model_key
    assert back.top_heads() == top
    fig = copying_figure(res)
    assert np.asarray(fig.data[0].z).shape == (2, 4)
    assert len(fig.data[1].x) == 8


def test_top_heads_default_is_32_on_larger_models():
    res = CopyingScores(
        scores=np.arange(60, dtype=float).reshape(6, 10),
        mode="exact",
        model_key="m",
        kv_index=np.arange(10) // 5,
        config=CopyingConfig(),
    )
    top = res.top_heads()
    assert len(top) == 32 and top[0] == (5, 9) and top[-1] == (2, 8)


def test_validation():
    with pytest.raises(ValueError, match="unknown copying-score mode"):
        CopyingConfig(mode="fast")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="n_tokens"):
        CopyingConfig(n_tokens=1)
    with pytest.raises(ValueError, match="token_ids"):
        CopyingConfig(mode="paper", token_ids=(3,))
    assert CopyingConfig(mode="paper", token_ids=(5, 3, 5)).token_ids == (3, 5)
    with pytest.raises(ValueError, match="mode"):
        CopyingScores(
            scores=np.zeros((2, 2)), mode="paper", model_key="m", kv_index=[0, 1],
            config=CopyingConfig(),
        )  # fmt: skip
    with pytest.raises(ValueError, match="mode and model_key"):
        import pandas as pd

        CopyingScores.from_frame(pd.DataFrame({"layer": [0], "head": [0], "score": [1.0]}))
