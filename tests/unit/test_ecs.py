"""External Context Score (core.signals.ecs) against plain-loop computations on tiny-model traces."""

from __future__ import annotations

import math
import zlib

import numpy as np
import pytest
import torch

from core.base.examples import RAGExample
from core.engine.layout import Layout, render
from core.engine.model import LoadedModel
from core.engine.trace import Needs, Trace, trace
from core.signals.chunking import ChunkSet, chunk_example
from core.signals.ecs import (
    chunk_attention,
    chunk_ecs,
    chunk_embeddings,
    chunk_means,
    ecs_needs,
    ecs_rows,
    token_ecs,
    top_context_positions,
    top_k,
)
from core.signals.lens import pks_needs

N_LAYERS, N_HEADS = 2, 4
# Every head of the tiny model, in a scrambled order: columns must follow it.
HEADS = [(1, 3), (0, 0), (1, 0), (0, 2), (0, 1), (1, 2), (0, 3), (1, 1)]


@pytest.fixture(scope="module", autouse=True)
def _one_thread(one_torch_thread):
    """Tiny, latency-bound forwards: one torch thread (see tests/conftest.py)."""


@pytest.fixture(scope="module")
def example() -> RAGExample:
    """Two passages and a response of several sentences (several chunks on both sides)."""
    return RAGExample(
        id="ecs-1",
        question="Who built the Old Bridge, and what is it made of?",
        passages=(
            "The Old Bridge was built by Ada Lovell in 1820. It crosses the river Wend. "
            "Its three arches were restored in 1962.",
            "The bridge is made of grey limestone. A toll was charged until 1890.",
        ),
        response="Ada Lovell built the Old Bridge in 1820. It is made of red granite. "
        "The toll ended in 1890.",
        label=True,
    )


@pytest.fixture(scope="module")
def layout(tiny_model: LoadedModel, example: RAGExample) -> Layout:
    return render(example, tiny_model)


@pytest.fixture(scope="module")
def full(tiny_model: LoadedModel, layout: Layout) -> Trace:
    """Patterns and final hidden states at every position (the reference's input)."""
    needs = Needs.of(["pattern"], n_layers=N_LAYERS, positions="all") | Needs.of(
        ["ln_final"], positions="all"
    )
    tr = trace(tiny_model, layout, needs)
    assert tr.positions_of("pattern", 0).tolist() == list(range(len(layout)))
    return tr


@pytest.fixture(scope="module")
def minimal(tiny_model: LoadedModel, layout: Layout) -> Trace:
    """Only what ecs_needs asks for."""
    return trace(tiny_model, layout, ecs_needs(N_LAYERS))


@pytest.fixture(scope="module")
def chunks(layout: Layout) -> ChunkSet:
    cs = chunk_example(layout, "sentence")
    assert len(cs.response) >= 3 and len(cs.context) >= 4
    return cs


def _patterns(tr: Trace) -> list[np.ndarray]:
    return [tr.get("pattern", ly).numpy().astype(np.float64) for ly in range(N_LAYERS)]


def _cos(a: np.ndarray, b: np.ndarray) -> float:
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def _brute_token_ecs(tr: Trace, heads, ctx: np.ndarray, frac: float) -> np.ndarray:
    """ECS per response token and head, one token and one head at a time."""
    pats = _patterns(tr)
    x = tr.get("ln_final").numpy().astype(np.float64)
    k = max(1, math.ceil(frac * len(ctx)))
    g_all = tr.layout.generation_positions
    out = np.zeros((len(g_all), len(heads)))
    for j, g in enumerate(g_all):
        for col, (ly, h) in enumerate(heads):
            ranked = sorted(ctx.tolist(), key=lambda p: -pats[ly][h, g, p])
            # The reference is well defined only without a tie at the k-th place.
            if k < len(ranked):
                assert pats[ly][h, g, ranked[k - 1]] > pats[ly][h, g, ranked[k]]
            e = np.mean([x[p] for p in ranked[:k]], axis=0)
            out[j, col] = _cos(e, x[g])
    return out


# --------------------------------------------------------------------------- token ECS


@pytest.mark.parametrize("frac", [0.1, 0.35])
def test_token_ecs_equals_a_per_token_per_head_loop(full, minimal, layout, frac) -> None:
    ctx = layout.context_positions()
    want = _brute_token_ecs(full, HEADS, ctx, frac)
    got = token_ecs(full, HEADS, topk_frac=frac)
    assert got.shape == (len(layout.response_positions), len(HEADS)) and got.dtype == np.float32
    np.testing.assert_allclose(got, want, atol=1e-5)
    # What ecs_needs asks for is enough, and gives the same numbers.
    np.testing.assert_allclose(token_ecs(minimal, HEADS, topk_frac=frac), want, atol=1e-5)
    # The heads differ (a test that cannot tell columns apart would pass anything).
    assert np.ptp(want.mean(0)) > 1e-3
    # A subset of heads gives the same columns.
    np.testing.assert_allclose(
        token_ecs(minimal, HEADS[3:5], topk_frac=frac), want[:, 3:5], atol=1e-5
    )


def test_top_context_positions_are_the_top_k_passage_tokens(full, layout) -> None:
    ctx = layout.context_positions()
    k = max(1, math.ceil(0.1 * len(ctx)))
    pats = _patterns(full)
    for head in HEADS[:3]:
        top = top_context_positions(full, head)
        assert top.shape == (len(layout.generation_positions), k)
        assert np.isin(top, ctx).all()
        for j, g in enumerate(layout.generation_positions):
            ranked = sorted(ctx.tolist(), key=lambda p: -pats[head[0]][head[1], g, p])
            assert set(top[j].tolist()) == set(ranked[:k])


def test_prompt_scope_ranks_the_whole_prompt(full, layout) -> None:
    ctx = layout.context_positions()
    prompt = np.arange(layout.response.start)
    outside = []
    for head in HEADS:
        top = top_context_positions(full, head, scope="prompt")
        assert top.shape[1] == max(1, math.ceil(0.1 * len(prompt)))
        assert np.isin(top, prompt).all()
        outside.append(~np.isin(top, ctx))
    # Some heads look at the template / instruction / question, which "passages" never ranks.
    assert np.concatenate(outside).any()
    want = _brute_token_ecs(full, HEADS, prompt, 0.1)
    got = token_ecs(full, HEADS, scope="prompt")
    np.testing.assert_allclose(got, want, atol=1e-5)
    assert np.abs(got - token_ecs(full, HEADS, scope="passages")).max() > 1e-3
    with pytest.raises(ValueError, match="unknown ECS scope"):
        token_ecs(full, HEADS, scope="everything")  # type: ignore[arg-type]


def test_no_context_layout_gives_zeros(tiny_model, example) -> None:
    bare = render(example, tiny_model, with_context=False)
    assert bare.context_positions().size == 0
    tr = trace(tiny_model, bare, ecs_needs(N_LAYERS))
    n = len(bare.response_positions)
    got = token_ecs(tr, HEADS)
    assert got.shape == (n, len(HEADS)) and not got.any()
    assert top_context_positions(tr, (0, 1)).shape == (n, 0)
    cs = chunk_example(bare, "sentence")
    assert cs.context == () and len(cs.response) >= 3
    ce = chunk_ecs(tr, cs, [0, 1], sentence_embedder=FakeEmbedder())
    assert ce.ecs.shape == (len(cs.response), 2, N_HEADS) and not ce.ecs.any()
    assert (ce.attended == -1).all() and ce.similarity.shape == (len(cs.response), 0)


def test_ecs_rows_and_topk_validate(full) -> None:
    assert [top_k(n, 0.1) for n in (1, 9, 10, 11, 60)] == [1, 1, 1, 2, 6]
    pattern = torch.rand(2, 3, 5)
    with pytest.raises(ValueError, match="k must be in"):
        ecs_rows(pattern, torch.rand(5, 4), torch.rand(3, 4), 6)
    with pytest.raises(ValueError, match="topk_frac"):
        token_ecs(full, HEADS, topk_frac=0.0)


# --------------------------------------------------------------------------- chunks


class FakeEmbedder:
    """A deterministic stand-in for MiniLM: a seeded random vector per text."""

    dim = 16

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def embed(self, texts):
        self.calls.append(list(texts))
        rows = [np.random.default_rng(zlib.crc32(t.encode())).normal(size=self.dim) for t in texts]
        return np.asarray(rows, dtype=np.float32).reshape(-1, self.dim)


def _brute_chunk_attention(tr: Trace, cs: ChunkSet, pool: str) -> np.ndarray:
    pats = _patterns(tr)
    out = np.zeros((N_LAYERS, N_HEADS, len(cs.response), len(cs.context)))
    for ly in range(N_LAYERS):
        for h in range(N_HEADS):
            for r, rc in enumerate(cs.response):
                for c, cc in enumerate(cs.context):
                    vals = [
                        pats[ly][h, p - 1, key]
                        for p in range(rc.tok_start, rc.tok_end)
                        for key in range(cc.tok_start, cc.tok_end)
                    ]
                    out[ly, h, r, c] = np.mean(vals) if pool == "mean" else np.sum(vals)
    return out


@pytest.mark.parametrize("pool", ["mean", "sum"])
def test_chunk_attention_equals_loops_over_chunk_tokens(full, minimal, chunks, pool) -> None:
    want = _brute_chunk_attention(full, chunks, pool)
    got = chunk_attention(minimal, chunks, [0, 1], pool=pool)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(
        chunk_attention(minimal, chunks, [1], pool=pool)[0], want[1], rtol=1e-5
    )
    with pytest.raises(ValueError, match="unknown pool"):
        chunk_attention(minimal, chunks, [0], pool="max")  # type: ignore[arg-type]


def test_mean_and_sum_pooling_pick_different_chunks(full, chunks) -> None:
    # Sum favours long chunks: the two poolings are not the same ranking up to a constant.
    mean = _brute_chunk_attention(full, chunks, "mean")
    total = _brute_chunk_attention(full, chunks, "sum")
    assert (mean.argmax(-1) != total.argmax(-1)).any()


@pytest.mark.parametrize("pool", ["mean", "sum"])
def test_chunk_ecs_is_the_cosine_with_the_most_attended_context_chunk(
    full, minimal, chunks, pool
) -> None:
    emb = FakeEmbedder()
    ce = chunk_ecs(minimal, chunks, [0, 1], pool=pool, sentence_embedder=emb)
    # One embedding call: the response chunks, then the context chunks.
    assert emb.calls == [[c.text for c in chunks.response] + [c.text for c in chunks.context]]
    vec = {t: v for t, v in zip(emb.calls[0], FakeEmbedder().embed(emb.calls[0]), strict=True)}
    w = _brute_chunk_attention(full, chunks, pool)
    n_r = len(chunks.response)
    assert ce.ecs.shape == ce.attended.shape == (n_r, N_LAYERS, N_HEADS) and ce.layers == (0, 1)
    for r, rc in enumerate(chunks.response):
        for c, cc in enumerate(chunks.context):
            assert ce.similarity[r, c] == pytest.approx(_cos(vec[rc.text], vec[cc.text]), abs=1e-6)
        for ly in range(N_LAYERS):
            for h in range(N_HEADS):
                star = int(np.argmax(w[ly, h, r]))
                assert ce.attended[r, ly, h] == star
                want = _cos(vec[rc.text], vec[chunks.context[star].text])
                assert ce.ecs[r, ly, h] == pytest.approx(want, abs=1e-6)
    if pool == "mean":
        # Heads attend to different chunks, so the argmax (not a fixed chunk) drives ECS.
        assert len(set(ce.attended.reshape(-1).tolist())) > 1


def test_chunk_embeddings_from_the_model_need_response_hidden_states(
    tiny_model, layout, chunks, minimal
) -> None:
    tr = trace(tiny_model, layout, ecs_needs(N_LAYERS, hidden_at_response=True))
    x = tr.get("ln_final")
    er, ec = chunk_embeddings(tr, chunks, embedder="model")
    for got, cs in ((er, chunks.response), (ec, chunks.context)):
        assert got.shape == (len(cs), x.shape[1])
        for row, c in zip(got, cs, strict=True):
            rows = [tr.at("ln_final", None, [p])[0].double().numpy() for p in c.positions]
            np.testing.assert_allclose(row, np.mean(rows, axis=0), rtol=1e-6, atol=1e-9)
    with pytest.raises(KeyError, match="was not kept"):
        chunk_embeddings(minimal, chunks, embedder="model")
    with pytest.raises(ValueError, match="unknown chunk embedder"):
        chunk_embeddings(minimal, chunks, embedder="bge")  # type: ignore[arg-type]


def test_chunk_means_equal_loops(chunks) -> None:
    n = len(chunks.layout.response_positions)
    values = np.random.default_rng(3).normal(size=(3, n))
    r0 = chunks.layout.response.start
    got = chunk_means(values, chunks)
    assert got.shape == (len(chunks.response), 3)
    for r, rc in enumerate(chunks.response):
        for row in range(3):
            want = np.mean([values[row, p - r0] for p in range(rc.tok_start, rc.tok_end)])
            assert got[r, row] == pytest.approx(want, rel=1e-5)
    # Chunks of different tokens get different means (the weights are per chunk).
    assert np.ptp(got[:, 0]) > 0


# --------------------------------------------------------------------------- needs


def test_ecs_needs_keeps_patterns_at_generation_and_hidden_at_context(tiny_model, layout) -> None:
    plan = ecs_needs(N_LAYERS).plan()
    assert plan == {
        ("pattern", 0): {"generation"},
        ("pattern", 1): {"generation"},
        ("ln_final", None): {"generation", "context"},
    }
    assert ecs_needs(N_LAYERS, scope="prompt").plan()[("ln_final", None)] == {"generation", "all"}
    assert ecs_needs(N_LAYERS, hidden_at_response=True).plan()[("ln_final", None)] == {
        "generation",
        "context",
        "response",
    }
    assert set(ecs_needs(N_LAYERS, layers=[1]).plan()) == {("pattern", 1), ("ln_final", None)}
    # Combined with PKS (as ReDeEP traces it), each hook keeps its own positions.
    both = ecs_needs(N_LAYERS) | pks_needs(N_LAYERS)
    plan = both.plan()
    assert plan[("pattern", 0)] == {"generation"}
    assert plan[("ln_final", None)] == {"generation", "context"}
    assert plan[("resid_mid", 1)] == {"generation"}
    tr = trace(tiny_model, layout, both)
    g, ctx = layout.generation_positions, layout.context_positions()
    np.testing.assert_array_equal(tr.positions_of("pattern", 1), g)
    np.testing.assert_array_equal(tr.positions_of("ln_final"), np.union1d(ctx, g))
    assert tuple(tr.get("pattern", 0).shape) == (N_HEADS, len(g), len(layout))
    assert tr.get("ln_final").shape[0] == len(np.union1d(ctx, g)) < len(layout)
