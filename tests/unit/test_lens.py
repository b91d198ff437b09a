"""Logit lens, JSD and PKS on a tiny random model whose final norm is not the identity."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.spatial.distance import jensenshannon

from core.engine.layout import render
from core.engine.model import LoadedModel, load_model
from core.engine.trace import Needs, Trace, trace
from core.signals.lens import (
    jsd_bits,
    layer_jsd,
    lens_logits,
    lens_logprobs,
    lens_probs,
    lens_top_k,
    pks_from_trace,
    pks_needs,
)

ATOL = 1e-4


@pytest.fixture(scope="module")
def model() -> LoadedModel:
    """A private tiny model with random final-norm weights.

    A fresh RMSNorm has unit weights, and then norming twice equals norming once:
    random weights make a missing or doubled final norm show in the numbers.
    """
    m = load_model("tiny", device="cpu", seed=1)
    g = torch.Generator().manual_seed(7)
    norm = m.bridge.ln_final.original_component
    with torch.no_grad():
        norm.weight.copy_(0.5 + 2.0 * torch.rand(norm.weight.shape, generator=g))
    return m


@pytest.fixture(scope="module")
def full(model, toy_example) -> Trace:
    layout = render(toy_example, model)
    needs = Needs.of(
        ["resid_mid", "resid_post", "ln_final", "logits"],
        n_layers=model.info.n_layers,
        positions="all",
    )
    return trace(model, layout, needs)


def _rms_norm(model: LoadedModel, x: torch.Tensor) -> torch.Tensor:
    """The final RMSNorm written out by hand (an independent reference)."""
    norm = model.bridge.ln_final.original_component
    eps = model.hf_model.config.rms_norm_eps
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * norm.weight.detach()


# --------------------------------------------------------------------------- lens


def test_lens_on_last_resid_post_equals_model_logits(model, full):
    last = full.get("resid_post", model.info.n_layers - 1)
    logits = full.get("logits")
    got = lens_logits(model, last)
    assert got.dtype == torch.float32 and got.device.type == "cpu"
    assert got.shape == logits.shape
    assert (got - logits).abs().max().item() <= ATOL
    assert logits.abs().max() > 0.1
    # The check is sharp: without the norm, or with it applied twice, it fails.
    assert (lens_logits(model, last, final_norm=False) - logits).abs().max() > 0.1
    twice = lens_logits(model, full.get("ln_final"))
    assert (twice - logits).abs().max() > 0.1
    # final_norm=False is exactly x W_U (+ b_U).
    _close(lens_logits(model, full.get("ln_final"), final_norm=False), logits)


def test_lens_norm_matches_hand_written_rms_norm(model, full):
    x = full.get("resid_mid", 0)
    expected = _rms_norm(model, x) @ model.bridge.W_U.detach()
    _close(lens_logits(model, x), expected)


@pytest.mark.parametrize("chunk_size", [1, 3, 1000])
def test_chunking_gives_the_same_result(model, full, chunk_size):
    x = full.get("resid_post", 0)[:11]
    _close(lens_logits(model, x, chunk_size=chunk_size), lens_logits(model, x), atol=1e-6)
    mid, post = [full.get("resid_mid", 0)[:11]], [x]
    np.testing.assert_allclose(
        layer_jsd(model, mid, post, chunk_size=chunk_size), layer_jsd(model, mid, post), atol=1e-7
    )
    a, b = lens_top_k(model, x, k=4, chunk_size=chunk_size), lens_top_k(model, x, k=4)
    assert np.array_equal(a.token_ids, b.token_ids)


def test_lens_shapes_and_normalisation(model, full):
    x = full.get("resid_post", 1)[:6]
    lp = lens_logprobs(model, x)
    p = lens_probs(model, x)
    _close(p.sum(-1), torch.ones(6), atol=1e-5)
    _close(lp.exp(), p, atol=1e-7)
    _close(lp, torch.log_softmax(lens_logits(model, x), -1), atol=1e-5)
    # Leading axes are kept; numpy input is accepted.
    batched = lens_logits(model, x.reshape(2, 3, -1).numpy())
    assert batched.shape == (2, 3, model.info.d_vocab)
    _close(batched.reshape(6, -1), lens_logits(model, x), atol=1e-6)
    with pytest.raises(ValueError, match="d_model"):
        lens_logits(model, torch.zeros(2, 5))


def test_top_k(model, full):
    x = full.get("resid_post", 1)[:5]
    top = lens_top_k(model, x, k=3)
    lp = torch.log_softmax(lens_logits(model, x), -1)
    ref = lp.topk(3, dim=-1)
    assert np.array_equal(top.token_ids, ref.indices.numpy())
    np.testing.assert_allclose(top.probs, ref.values.exp().numpy(), rtol=1e-5)
    assert np.all(np.diff(top.probs, axis=1) <= 0)
    ent = -(lp.exp() * lp).sum(-1) / np.log(2)
    np.testing.assert_allclose(top.entropy, ent.numpy(), rtol=1e-5)
    assert top.tokens[0][0] == model.tokenizer.decode([int(top.token_ids[0, 0])])
    df = top.to_frame()
    assert list(df.columns) == ["row", "rank", "token_id", "token", "prob"]
    assert len(df) == 15 and df["rank"].tolist()[:3] == [1, 2, 3]


# --------------------------------------------------------------------------- JSD


def test_jsd_matches_scipy_on_random_rows():
    g = torch.Generator().manual_seed(0)
    a = torch.randn(6, 300, generator=g, dtype=torch.float64) * 2
    b = torch.randn(6, 300, generator=g, dtype=torch.float64) * 2
    ref = jensenshannon(torch.softmax(a, -1).numpy(), torch.softmax(b, -1).numpy(), base=2, axis=-1)
    np.testing.assert_allclose(jsd_bits(a, b).numpy(), ref**2, rtol=1e-10, atol=1e-14)
    # float32 logits, numpy in -> numpy out
    got = jsd_bits(a.float().numpy(), b.float().numpy())
    assert isinstance(got, np.ndarray) and got.dtype == np.float32
    np.testing.assert_allclose(got, ref**2, rtol=1e-5)


def test_jsd_properties():
    g = torch.Generator().manual_seed(1)
    a = torch.randn(20, 50, generator=g) * 4
    b = torch.randn(20, 50, generator=g) * 4
    d = jsd_bits(a, b)
    assert d.shape == (20,)
    assert torch.equal(d, jsd_bits(b, a))  # symmetric
    assert (d >= 0).all() and (d <= 1).all() and (d > 0.01).all()
    assert torch.equal(jsd_bits(a, a), torch.zeros(20))
    # logits and log-probabilities are the same input
    _close(jsd_bits(torch.log_softmax(a, -1), b + 3.0), d, atol=1e-6)
    # disjoint supports: exactly one bit
    p = torch.tensor([[0.0, 0.0, -np.inf, -np.inf]])
    q = torch.tensor([[-np.inf, -np.inf, 1.0, 2.0]])
    assert jsd_bits(p, q).item() == pytest.approx(1.0, abs=1e-7)
    # tiny divergences are resolved, not lost to rounding
    c = a + 1e-4 * torch.randn(20, 50, generator=g)
    small = jsd_bits(a, c)
    exact = jsd_bits(a.double(), c.double())
    assert (small > 0).all()
    np.testing.assert_allclose(small.numpy(), exact.numpy(), rtol=1e-4)
    with pytest.raises(ValueError, match="equal shapes"):
        jsd_bits(a, b[:, :10])


# --------------------------------------------------------------------------- PKS


def test_pks_is_jsd_across_each_ffn_with_one_final_norm(model, full):
    n_layers = model.info.n_layers
    pos = full.layout.generation_positions
    pks = pks_from_trace(model, full)
    assert pks.shape == (n_layers, len(pos)) and pks.dtype == np.float32
    assert (pks > 0).all() and (pks <= 1).all()
    for layer in range(n_layers):
        mid = full.at("resid_mid", layer, pos)
        post = full.at("resid_post", layer, pos)
        ref = jsd_bits(
            (_rms_norm(model, mid) @ model.bridge.W_U).double(),
            (_rms_norm(model, post) @ model.bridge.W_U).double(),
        )
        np.testing.assert_allclose(pks[layer], ref.numpy(), rtol=1e-3, atol=1e-7)
    # The last layer's post side is the model's own output distribution.
    last_mid = full.at("resid_mid", n_layers - 1, pos)
    ref = jsd_bits(lens_logits(model, last_mid), full.at("logits", None, pos))
    np.testing.assert_allclose(pks[-1], ref.numpy(), rtol=1e-3, atol=1e-7)


def test_pks_without_final_norm_and_layer_subsets(model, full):
    pos = full.layout.generation_positions[:4]
    raw = pks_from_trace(model, full, layers=[1, 0], positions=pos, final_norm=False)
    W_U = model.bridge.W_U.detach()
    for i, layer in enumerate([1, 0]):
        ref = jsd_bits(
            full.at("resid_mid", layer, pos) @ W_U, full.at("resid_post", layer, pos) @ W_U
        )
        np.testing.assert_allclose(raw[i], ref.numpy(), rtol=1e-3, atol=1e-7)
    normed = pks_from_trace(model, full, layers=[1, 0], positions=pos)
    assert not np.allclose(raw, normed, rtol=0.05)


def test_layer_jsd_validates_and_accepts_stacked(model, full):
    mid = torch.stack([full.get("resid_mid", 0), full.get("resid_mid", 1)])
    post = torch.stack([full.get("resid_post", 0), full.get("resid_post", 1)])
    np.testing.assert_allclose(layer_jsd(model, mid, post), layer_jsd(model, list(mid), list(post)))
    with pytest.raises(ValueError, match="mid layers"):
        layer_jsd(model, mid[:1], post)
    with pytest.raises(ValueError, match="different numbers of rows"):
        layer_jsd(model, [mid[0][:3]], [post[0][:4]])


def test_pks_needs():
    needs = pks_needs(3, layers=[2])
    assert needs.hooks == {("resid_mid", 2), ("resid_post", 2)}
    assert needs.positions == {"generation"}
    assert len(pks_needs(2).hooks) == 4


def _close(a: torch.Tensor, b: torch.Tensor, atol: float = ATOL) -> None:
    assert a.shape == b.shape
    diff = (a - b).abs().max().item()
    assert diff <= atol, f"max |diff| = {diff}"


def test_jsd_float32_matches_float64():
    g = torch.Generator().manual_seed(1)
    a = torch.randn(16, 5000, generator=g) * 3
    b = a + torch.randn(16, 5000, generator=g) * torch.linspace(1e-3, 2.0, 16)[:, None]
    exact = jsd_bits(a, b)
    fast = jsd_bits(a, b, precision="float32")
    torch.testing.assert_close(fast.double(), exact.double(), rtol=0, atol=1e-6)
    assert bool((jsd_bits(a, a, precision="float32") == 0).all())
    with pytest.raises(ValueError, match="precision"):
        jsd_bits(a, b, precision="float16")
