"""Trace engine on the tiny model: numerics against plain HF, hook consistency, Needs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from core.data import load_builtin
from core.engine.layout import render
from core.engine.trace import (
    HOOK_KINDS,
    LAYERLESS,
    Needs,
    Trace,
    hook_name,
    response_needs,
    token_surprisal,
    trace,
    trace_batch,
)

ATOL = 1e-4
PER_LAYER = [k for k in HOOK_KINDS if k not in LAYERLESS]


@pytest.fixture(scope="module")
def layout(tiny_model, toy_example):
    return render(toy_example, tiny_model)


@pytest.fixture(scope="module")
def ref_logits(tiny_reference, layout) -> torch.Tensor:
    """Logits of a plain HF forward (no bridge, no hooks) over the layout, ``[pos, vocab]``."""
    with torch.inference_mode():
        ids = torch.as_tensor(layout.token_ids).unsqueeze(0)
        return tiny_reference(input_ids=ids).logits[0].float()


@pytest.fixture(scope="module")
def full(tiny_model, layout) -> Trace:
    """Every kind at every layer, at the response and generation positions."""
    needs = Needs.of(
        HOOK_KINDS, n_layers=tiny_model.info.n_layers, positions=("response", "generation")
    )
    return trace(tiny_model, layout, needs)


def _close(a: torch.Tensor, b: torch.Tensor, atol: float = ATOL) -> None:
    assert a.shape == b.shape
    diff = (a - b).abs().max().item()
    assert diff <= atol, f"max |diff| = {diff}"


# --------------------------------------------------------------------------- numerics


@pytest.mark.parametrize("positions", ["all", "response"])
def test_logits_equal_plain_hf_forward(tiny_model, layout, ref_logits, positions):
    tr = trace(tiny_model, layout, Needs.of(["logits"], positions=positions))
    keep = tr.positions
    logits = tr.get("logits")
    assert logits.dtype == torch.float32 and logits.device.type == "cpu"
    _close(logits, ref_logits[torch.as_tensor(keep)])
    assert logits.abs().max() > 0.01  # not trivially zero


def test_resid_stream_decomposes(full, tiny_model):
    n_layers = tiny_model.info.n_layers
    for layer in range(n_layers):
        pre = full.get("resid_pre", layer)
        mid = full.get("resid_mid", layer)
        post = full.get("resid_post", layer)
        _close(mid, pre + full.get("attn_out", layer))
        _close(post, mid + full.get("mlp_out", layer))
        assert full.get("attn_out", layer).abs().max() > 1e-3  # the checks are not vacuous
        assert full.get("mlp_out", layer).abs().max() > 1e-3
        if layer + 1 < n_layers:
            _close(full.get("resid_pre", layer + 1), post)


def test_hooks_match_the_reference_modules(full, tiny_reference, layout):
    hf = tiny_reference
    keep = torch.as_tensor(full.positions)
    ids = torch.as_tensor(layout.token_ids)
    last = full.get("resid_post", hf.config.num_hidden_layers - 1)
    with torch.inference_mode():
        # Embeddings enter the residual stream unscaled (Llama).
        _close(full.get("resid_pre", 0), hf.model.embed_tokens(ids)[keep])
        # z is the per-head input of the output projection.
        for layer in range(hf.config.num_hidden_layers):
            o_proj = hf.model.layers[layer].self_attn.o_proj
            _close(o_proj(full.get("z", layer).flatten(1)), full.get("attn_out", layer))
        # ln_final is the final RMSNorm of the last residual; scale is the RMS.
        _close(full.get("ln_final"), hf.model.norm(last))
        eps = hf.config.rms_norm_eps
        _close(full.get("ln_final_scale"), last.pow(2).mean(-1, keepdim=True).add(eps).sqrt())
        _close(hf.lm_head(full.get("ln_final")), full.get("logits"))


def test_shapes_of_every_kind(full, tiny_model, layout):
    info = tiny_model.info
    n_pos = len(full.positions)
    for layer in range(info.n_layers):
        for kind in ("resid_pre", "resid_mid", "resid_post", "attn_out", "mlp_out"):
            assert full.get(kind, layer).shape == (n_pos, info.d_model), kind
        assert full.get("z", layer).shape == (n_pos, info.n_heads, info.d_head)
        assert full.get("pattern", layer).shape == (info.n_heads, n_pos, len(layout))
        assert full.get("key_mass", layer).shape == (info.n_heads, n_pos, 3)
        assert full.get("key_mass", layer).dtype == torch.float64  # sums of many keys
    assert full.get("ln_final").shape == (n_pos, info.d_model)
    assert full.get("ln_final_scale").shape == (n_pos, 1)
    assert full.get("logits").shape == (n_pos, info.d_vocab)
    assert set(full.acts) == {(k, None) for k in LAYERLESS} | {
        (k, layer) for k in PER_LAYER for layer in range(info.n_layers)
    }
    assert full.nbytes == sum(t.numel() * t.element_size() for t in full.acts.values())


def test_pattern_rows_are_causal_distributions(full, tiny_model):
    q = torch.as_tensor(full.positions)
    for layer in range(tiny_model.info.n_layers):
        pat = full.get("pattern", layer)
        _close(pat.sum(-1), torch.ones(pat.shape[:2]), atol=1e-5)
        assert (pat >= 0).all()
        keys = torch.arange(pat.shape[-1])
        future = keys[None, :] > q[:, None]  # [query, key]
        assert future.any()
        assert pat[:, future].abs().max() == 0, "no attention to later tokens"
        # Not degenerate: queries attend to more than themselves.
        assert (pat.max(-1).values < 1 - 1e-3).any()


def test_at_selects_rows_and_pattern_queries(full, layout):
    pos = layout.response_positions[[0, -1]]
    rows = full.rows(pos)
    assert np.array_equal(full.positions[rows], pos)
    assert torch.equal(full.at("resid_post", 0, pos), full.get("resid_post", 0)[rows])
    assert torch.equal(full.at("pattern", 1, pos), full.get("pattern", 1)[:, rows])


# --------------------------------------------------------------------------- positions


def test_kept_positions(tiny_model, layout):
    def kept(positions):
        tr = trace(tiny_model, layout, Needs.of(["resid_post"], layers=[1], positions=positions))
        assert tr.get("resid_post", 1).shape[0] == len(tr.positions)
        return tr.positions

    resp = layout.response_positions
    assert np.array_equal(kept("response"), resp)
    assert np.array_equal(kept("generation"), resp - 1)
    ctx = np.concatenate([np.arange(s.start, s.end) for s in layout.passage_segments])
    assert np.array_equal(kept("context"), ctx)
    assert np.array_equal(kept("all"), np.arange(len(layout)))
    both = kept(("response", "generation"))
    assert np.array_equal(both, np.arange(resp[0] - 1, resp[-1] + 1))
    assert np.array_equal(kept(("all", "context")), np.arange(len(layout)))


def test_rows_and_get_errors(tiny_model, layout):
    tr = trace(tiny_model, layout, Needs.of(["resid_post"], layers=[0], positions="response"))
    with pytest.raises(KeyError, match="Needs"):
        tr.get("resid_post", 1)
    with pytest.raises(KeyError, match="Needs"):
        tr.get("logits")
    with pytest.raises(KeyError, match="Needs.positions"):
        tr.rows([0])
    with pytest.raises(KeyError, match="not kept"):
        tr.at("resid_post", 0, [int(layout.response.start) - 1])


# --------------------------------------------------------------------------- Needs


def test_needs_union():
    a = Needs.of(["resid_post"], layers=[0, 1], positions="response")
    b = Needs.of(["logits", "z"], layers=[1], positions="generation")
    c = Needs(hooks=frozenset({("pattern", 0)}), positions=frozenset({"context"}))
    ab = a | b
    assert ab.hooks == {("resid_post", 0), ("resid_post", 1), ("logits", None), ("z", 1)}
    assert ab.positions == {"response", "generation"}
    u = Needs.union([a, b, c])
    assert u.hooks == ab.hooks | {("pattern", 0)}
    assert u.positions == {"response", "generation", "context"}
    assert Needs.union([a]) == a
    assert Needs.of(["mlp_out"], n_layers=3).hooks == {("mlp_out", i) for i in range(3)}
    names = u.hook_names()
    assert names["blocks.1.attn.hook_z"] == ("z", 1)
    assert names["blocks.0.attn.hook_pattern"] == ("pattern", 0)
    assert all("logits" not in n for n in names)  # logits come from the output


def test_hook_names_are_transformer_lens_own_and_stay_what_feature_caches_were_built_with() -> None:
    want = {
        ("resid_pre", 2): "blocks.2.hook_resid_pre",
        ("resid_mid", 2): "blocks.2.hook_resid_mid",
        ("resid_post", 2): "blocks.2.hook_resid_post",
        ("attn_out", 2): "blocks.2.hook_attn_out",
        ("mlp_out", 2): "blocks.2.hook_mlp_out",
        ("z", 2): "blocks.2.attn.hook_z",
        ("pattern", 2): "blocks.2.attn.hook_pattern",
        ("key_mass", 2): "blocks.2.attn.hook_pattern",  # reduced in the pattern's hook
        ("ln_final", None): "ln_final.hook_out",
        ("ln_final_scale", None): "ln_final.hook_scale",
    }
    assert {key: hook_name(*key) for key in want} == want
    assert set(HOOK_KINDS) - {"logits"} == {kind for kind, _ in want}
    for bad in (("logits", None), ("resid_post", None), ("bogus", 1)):
        with pytest.raises(ValueError, match="no hook point"):
            hook_name(*bad)


@pytest.mark.parametrize(
    ("hooks", "positions", "match"),
    [
        ({("bogus", 0)}, {"all"}, "unknown hook kind 'bogus'"),
        ({("logits", 0)}, {"all"}, "'logits' takes no layer"),
        ({("ln_final", 3)}, {"all"}, "'ln_final' takes no layer"),
        ({("resid_pre", None)}, {"all"}, "'resid_pre' needs a layer"),
        (set(), {"everywhere"}, "unknown position set 'everywhere'"),
        (set(), set(), "Needs.positions is empty"),
    ],
)
def test_needs_validation(hooks, positions, match):
    with pytest.raises(ValueError, match=match):
        Needs(hooks=frozenset(hooks), positions=frozenset(positions))


def test_needs_of_and_union_errors():
    with pytest.raises(ValueError, match="needs n_layers"):
        Needs.of(["resid_pre"])
    with pytest.raises(ValueError, match="no needs"):
        Needs.union([])


def test_trace_takes_several_needs(tiny_model, layout):
    a = Needs.of(["resid_post"], layers=[0], positions="response")
    b = response_needs()
    tr = trace(tiny_model, layout, [a, b])
    assert set(tr.acts) == {("resid_post", 0), ("logits", None)}
    assert np.array_equal(
        tr.positions, np.union1d(layout.response_positions, layout.generation_positions)
    )


# --------------------------------------------------------------------------- hooks are removed


def test_no_hooks_remain_after_trace(tiny_model, layout, full):
    bridge = tiny_model.bridge
    points = dict(bridge.hook_dict)
    assert "blocks.0.hook_resid_pre" in points
    leftover = [n for n, hp in points.items() if hp._forward_hooks or hp._backward_hooks]
    assert leftover == []
    # A second, smaller trace returns only its own keys (no stale saver fires).
    tr = trace(tiny_model, layout, Needs.of(["mlp_out"], layers=[1], positions="response"))
    assert set(tr.acts) == {("mlp_out", 1)}
    assert torch.equal(tr.get("mlp_out", 1), full.get("mlp_out", 1)[full.rows(tr.positions)])
    assert [n for n, hp in points.items() if hp._forward_hooks] == []


def test_hooks_removed_when_the_forward_fails(tiny_model, layout, monkeypatch):
    bridge = tiny_model.bridge
    real_forward = bridge.forward

    def boom(*args, **kwargs):
        raise RuntimeError("forward failed (simulated)")

    monkeypatch.setattr(bridge, "forward", boom)
    with pytest.raises(RuntimeError, match="simulated"):
        trace(tiny_model, layout, Needs.of(["resid_post"], layers=[0], positions="response"))
    monkeypatch.setattr(bridge, "forward", real_forward)
    assert [n for n, hp in bridge.hook_dict.items() if hp._forward_hooks] == []


# --------------------------------------------------------------------------- surprisal


def test_token_surprisal_by_hand(tiny_model, layout, ref_logits):
    tr = trace(tiny_model, layout, response_needs())
    assert np.array_equal(tr.positions, layout.generation_positions)
    got = token_surprisal(tr)
    assert got.shape == (len(layout.response_ids),) and got.dtype == np.float32
    logp = torch.log_softmax(ref_logits.double(), dim=-1)
    g = torch.as_tensor(layout.generation_positions)
    y = torch.as_tensor(layout.response_ids)
    want = (-logp[g, y] / np.log(2.0)).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
    assert (got > 0).all()


def test_combined_needs_keep_each_hook_at_its_own_positions(tiny_model, layout, full):
    # ReDeEP's shape: patterns at the generation positions, final hidden states at the
    # passages; the union must not widen the patterns to the passage rows.
    pat = Needs.of(["pattern"], layers=[0], positions="generation")
    hid = Needs.of(["ln_final"], positions=["context", "generation"])
    u = pat | hid
    assert u.plan() == {
        ("pattern", 0): {"generation"},
        ("ln_final", None): {"context", "generation"},
    }
    tr = trace(tiny_model, layout, u)
    g, c = layout.generation_positions, layout.context_positions()
    assert tr.get("pattern", 0).shape[1] == len(g)
    assert np.array_equal(tr.positions_of("pattern", 0), g)
    assert np.array_equal(tr.positions_of("ln_final"), np.union1d(c, g))
    assert np.array_equal(tr.positions, np.union1d(c, g))
    torch.testing.assert_close(tr.at("pattern", 0, g), full.at("pattern", 0, g))
    every = trace(tiny_model, layout, Needs.of(["ln_final"], positions="all"))
    torch.testing.assert_close(tr.at("ln_final", None, c), every.at("ln_final", None, c))
    with pytest.raises(KeyError, match="not kept for pattern@0"):
        tr.at("pattern", 0, c[:1])
    # A hook asked for by both keeps the union of their positions.
    both = Needs.of(["resid_post"], layers=[1], positions="response") | Needs.of(
        ["resid_post"], layers=[1], positions="generation"
    )
    assert both.plan()[("resid_post", 1)] == {"response", "generation"}
    with pytest.raises(ValueError, match="pair the given hooks"):
        Needs(hooks=frozenset({("resid_post", 0)}), slots=frozenset({("z", 0, "all")}))


# --------------------------------------------------------------------------- batched traces

# Batched matrix products may sum in another order than one-at-a-time ones: activations
# agree to float32 rounding, within this absolute tolerance on the tiny model.
BATCH_ATOL = 1e-5


def _mixed_examples():
    pool = sorted(load_builtin(None), key=lambda e: (sum(map(len, e.passages)), e.id))
    return [pool[0], pool[len(pool) // 2], pool[5], pool[-40]]  # short, long, short, longer


def test_batched_trace_equals_one_at_a_time(tiny_model):
    layouts = [render(e, tiny_model) for e in _mixed_examples()]
    assert len({len(lay) for lay in layouts}) == len(layouts)  # mixed lengths: padding
    needs = Needs.of(
        HOOK_KINDS, n_layers=tiny_model.info.n_layers, positions=("response", "generation")
    )
    batched = trace_batch(tiny_model, layouts, needs)
    for lay, got in zip(layouts, batched, strict=True):
        want = trace(tiny_model, lay, needs)
        assert got.layout is lay and np.array_equal(got.positions, want.positions)
        assert set(got.acts) == set(want.acts)
        for key, t in want.acts.items():
            _close(got.acts[key], t, BATCH_ATOL)  # shapes too: patterns keep only own keys
            assert np.array_equal(got.positions_of(*key), want.positions_of(*key))
    assert [n for n, hp in tiny_model.bridge.hook_dict.items() if hp._forward_hooks] == []


def test_batched_extraction_equals_one_at_a_time_for_every_detector(tiny_model):
    from core.base.errors import DataError
    from core.base.examples import RAGExample
    from core.detectors import make_detector, runnable_detectors
    from core.pipeline.extract import iter_features

    exs = _mixed_examples()
    too_long = RAGExample(
        id="too-long", question="q?", passages=("word " * 5000,), response="An answer."
    )
    exs = [*exs[:2], too_long, *exs[2:]]
    dets = [make_detector(n) for n in runnable_detectors(tiny_model)]
    single = list(iter_features(tiny_model, exs, dets, on_error="skip"))
    batched = list(iter_features(tiny_model, exs, dets, on_error="skip", batch_size=3))
    assert [x.example.id for x in batched] == [e.id for e in exs]  # in order
    for one, many in zip(single, batched, strict=True):
        if one.example is too_long:  # a bad example fails alone, in its batch
            assert isinstance(many.error, DataError) and many.features is None
            continue
        assert many.error is None and many.computed
        for name, f in one.features.items():
            g = many.features[name]
            assert g.names == f.names and g.token_names == f.token_names
            np.testing.assert_allclose(g.response, f.response, atol=BATCH_ATOL, rtol=1e-4)
            for a, b in ((g.tokens, f.tokens), (g.chunks, f.chunks)):
                assert (a is None) == (b is None)
                if a is not None:
                    np.testing.assert_allclose(a, b, atol=BATCH_ATOL, rtol=1e-4)
    with pytest.raises(ValueError, match="batch_size"):
        next(iter_features(tiny_model, exs, dets, batch_size=0))


def test_a_trace_unembeds_only_the_positions_it_keeps(tiny_model, tiny_reference):
    """The lm_head runs on the kept logit positions only (the union over a batch), and
    each example still gets the plain forward's logits at its own positions."""
    layouts = [render(e, tiny_model) for e in _mixed_examples()]
    seen: list[int] = []
    handle = tiny_model.hf_model.lm_head.register_forward_hook(
        lambda _m, args, _out: seen.append(int(args[0].shape[1]))
    )
    try:
        traced = trace_batch(tiny_model, layouts, response_needs())
        union = set().union(*(lay.generation_positions.tolist() for lay in layouts))
        assert seen == [len(union)] and len(union) < max(len(lay) for lay in layouts)
        for lay, tr in zip(layouts, traced, strict=True):
            with torch.inference_mode():
                ids = torch.as_tensor(lay.token_ids).unsqueeze(0)
                ref = tiny_reference(input_ids=ids).logits[0].float()
            _close(tr.get("logits"), ref[torch.as_tensor(lay.generation_positions)], BATCH_ATOL)
        seen.clear()
        trace(tiny_model, layouts[0], Needs.of(["resid_post"], layers=[0], n_layers=1))
        assert seen == [1]  # no logits asked for: only the last position is unembedded
    finally:
        handle.remove()


# --------------------------------------------------------------------------- long prompts


@pytest.mark.parametrize("chunk", [1, 7, 64])
def test_a_chunked_trace_equals_one_pass(tiny_model, layout, chunk):
    """A long prompt is traced in chunks of queries reading the cached keys (issue 68):
    every kind at every kept position, attention rows padded to every key, equal to one
    pass's (chunks of one token included: each a decoding step)."""
    needs = Needs.of(
        HOOK_KINDS,
        n_layers=tiny_model.info.n_layers,
        positions=("response", "generation", "context"),
    )
    want = trace(tiny_model, layout, needs)
    got = trace(tiny_model, layout, needs, chunk_tokens=chunk)
    assert set(got.acts) == set(want.acts)
    for key, t in want.acts.items():
        _close(got.acts[key], t, BATCH_ATOL)  # shapes too: every key of the prompt
        assert np.array_equal(got.positions_of(*key), want.positions_of(*key))
    assert [n for n, hp in tiny_model.bridge.hook_dict.items() if hp._forward_hooks] == []


def test_a_prompt_longer_than_the_chunk_threshold_is_chunked(tiny_model, layout, monkeypatch):
    """Past :data:`core.engine.trace.CHUNK_ABOVE` tokens the pass is chunked by itself,
    and below it a layout runs in one pass, as before (its numbers bit for bit)."""
    import core.engine.trace as engine

    calls: list[int] = []
    real = engine._chunked_pass

    def counted(model, lay, keep, names, wants_logits, chunk):
        calls.append(chunk)
        return real(model, lay, keep, names, wants_logits, chunk)

    monkeypatch.setattr(engine, "_chunked_pass", counted)
    needs = Needs.of(
        ["pattern", "logits"], n_layers=tiny_model.info.n_layers, positions="generation"
    )
    one = trace(tiny_model, layout, needs)
    assert calls == []
    monkeypatch.setattr(engine, "CHUNK_ABOVE", len(layout) - 1)
    chunked = trace(tiny_model, layout, needs)
    assert calls == [engine.CHUNK_TOKENS]
    for key, t in one.acts.items():
        _close(chunked.acts[key], t, BATCH_ATOL)
    with pytest.raises(ValueError, match="chunk_tokens"):
        trace(tiny_model, layout, needs, chunk_tokens=0)
