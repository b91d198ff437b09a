"""HeadStats against direct numpy/scipy computations, and HeadView on the tiny model."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from scipy.stats import pearsonr

from app.components.head_charts import attention_figure, ecs_figure, pks_figure
from core.analysis.heads_layers import (
    HeadStats,
    align_chunk_scores,
    feature_grid,
    head_view,
    pearson_columns,
)
from core.base.errors import DataError, ModelError
from core.base.examples import RAGExample, Span
from core.engine.model import LoadedModel
from core.learning.contract import Features
from core.signals.ecs import token_ecs, top_context_positions

N_LAYERS, N_HEADS = 3, 4
KEY = "test-model|L3xH4"


def _names(n_layers: int = N_LAYERS, n_heads: int = N_HEADS) -> tuple[str, ...]:
    heads = tuple(f"ECS_L{ly}H{h}" for ly in range(n_layers) for h in range(n_heads))
    return heads + tuple(f"PKS_L{ly}" for ly in range(n_layers))


def _example(i: int, label: bool | None, response: str = "One. Two.") -> RAGExample:
    return RAGExample(id=f"e{i}", question="Q?", passages=("P.",), response=response, label=label)


def _features(
    i: int, response: np.ndarray, chunks: np.ndarray | None = None, model: str = KEY
) -> Features:
    names = _names()
    rows = chunks if chunks is not None else response[None, :]
    offsets = np.asarray([[0, 4], [5, 9]][: rows.shape[0]])
    return Features(
        detector="interpdetect",
        example_id=f"e{i}",
        model=model,
        names=names,
        response=response,
        chunk_names=names,
        chunks=rows,
        chunk_offsets=offsets,
    )


@pytest.fixture
def data() -> tuple[list[Features], list[RAGExample], np.ndarray, np.ndarray]:
    """Ten labelled answers (4 hallucinated) and two unlabelled, random features."""
    rng = np.random.default_rng(3)
    n_feat = len(_names())
    X = rng.normal(size=(12, n_feat)).astype(np.float32)
    labels: list[bool | None] = [True, False, False, True, False, True, False, False, True, False]
    labels += [None, None]
    feats = [_features(i, X[i]) for i in range(12)]
    exs = [_example(i, lab) for i, lab in enumerate(labels)]
    y = np.asarray([int(bool(lab)) for lab in labels[:10]])
    return feats, exs, X[:10].astype(np.float64), y


# --------------------------------------------------------------------------- statistics


def test_response_stats_match_numpy_and_scipy(data) -> None:
    feats, exs, X, y = data
    s = HeadStats.from_features(feats, exs)
    ecs = X[:, : N_LAYERS * N_HEADS].reshape(-1, N_LAYERS, N_HEADS)
    pks = X[:, N_LAYERS * N_HEADS :]
    assert (s.n_faithful, s.n_hallucinated, s.n_unlabelled) == (6, 4, 2)
    assert s.example_ids == tuple(f"e{i}" for i in range(10))
    np.testing.assert_allclose(s.ecs_faithful, ecs[y == 0].mean(0), rtol=1e-6)
    np.testing.assert_allclose(s.ecs_hallucinated, ecs[y == 1].mean(0), rtol=1e-6)
    np.testing.assert_allclose(s.ecs_difference, ecs[y == 0].mean(0) - ecs[y == 1].mean(0))
    np.testing.assert_allclose(s.pks_faithful, pks[y == 0].mean(0), rtol=1e-6)
    np.testing.assert_allclose(s.pks_hallucinated, pks[y == 1].mean(0), rtol=1e-6)
    for ly in range(N_LAYERS):
        for h in range(N_HEADS):
            want = pearsonr(ecs[:, ly, h], 1 - y).statistic
            assert s.ecs_r[ly, h] == pytest.approx(want, abs=1e-9)
        assert s.pks_r[ly] == pytest.approx(pearsonr(pks[:, ly], y).statistic, abs=1e-9)
    # ECS r with the inverted label is minus r with the label.
    np.testing.assert_allclose(
        s.ecs_r.ravel(), -pearson_columns(X[:, : N_LAYERS * N_HEADS], y), atol=1e-12
    )


def test_chunk_stats_label_sentences_by_span_overlap() -> None:
    rng = np.random.default_rng(0)
    n_feat = len(_names())
    rows = [rng.normal(size=(2, n_feat)) for _ in range(4)]
    exs = [
        # A gold span in the second sentence only.
        RAGExample(
            id="e0",
            question="Q?",
            passages=("P.",),
            response="One. Two.",
            spans=(Span(start=5, end=8),),
        ),
        _example(1, False),
        _example(2, True),  # hallucinated without spans: every sentence counts as such
        _example(3, None),  # unlabelled: left out
    ]
    feats = [_features(i, r.mean(0), r) for i, r in enumerate(rows)]
    s = HeadStats.from_features(feats, exs, level="chunk")
    X = np.concatenate(rows[:3])
    y = np.asarray([0, 1, 0, 0, 1, 1])
    assert (s.n_faithful, s.n_hallucinated, s.n_unlabelled, s.unit) == (3, 3, 1, "sentences")
    ecs = X[:, : N_LAYERS * N_HEADS]
    np.testing.assert_allclose(s.ecs_faithful.ravel(), ecs[y == 0].mean(0), rtol=1e-6)
    np.testing.assert_allclose(s.ecs_hallucinated.ravel(), ecs[y == 1].mean(0), rtol=1e-6)
    want = [pearsonr(ecs[:, j], 1 - y).statistic for j in range(ecs.shape[1])]
    np.testing.assert_allclose(s.ecs_r.ravel(), want, atol=1e-6)


def test_one_class_gives_nan_without_warnings() -> None:
    rng = np.random.default_rng(1)
    feats = [_features(i, rng.normal(size=len(_names()))) for i in range(3)]
    exs = [_example(i, False) for i in range(3)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        s = HeadStats.from_features(feats, exs)
        frame = s.to_frame()
        figs = [ecs_figure(s, k) for k in ("faithful", "hallucinated", "difference", "r")]
        figs.append(pks_figure(s))
    assert (s.n_faithful, s.n_hallucinated) == (3, 0)
    assert np.isfinite(s.ecs_faithful).all()
    assert np.isnan(s.ecs_hallucinated).all() and np.isnan(s.ecs_r).all()
    assert np.isnan(s.pks_r).all() and np.isnan(frame["ecs_r"]).all()
    assert s.top_heads(3) == []  # no defined correlation to rank by
    # NaN cells stay NaN in the figure (plotly draws them blank).
    assert np.isnan(np.asarray(figs[3].data[0].z, dtype=float)).all()


def test_constant_column_gives_nan_r_and_others_stay_defined(data) -> None:
    feats, exs, X, y = data
    col = 5  # ECS_L1H1
    const = []
    for f in feats:
        r = f.response.copy()
        r[col] = 0.1  # equal floats whose mean is not exactly 0.1
        const.append(_features(int(f.example_id[1:]), r))
    s = HeadStats.from_features(const, exs)
    assert np.isnan(s.ecs_r[1, 1])
    assert s.ecs_faithful[1, 1] == pytest.approx(0.1) and s.ecs_difference[1, 1] == pytest.approx(0)
    assert np.isfinite(np.delete(s.ecs_r.ravel(), col)).all()


def test_pearson_columns_edge_cases() -> None:
    x = np.asarray([[1.0, 2.0, np.nan], [2.0, 2.0, 1.0], [3.0, 2.0, 0.0]])
    r = pearson_columns(x, np.asarray([0, 1, 1]))
    assert r[0] == pytest.approx(pearsonr(x[:, 0], [0, 1, 1]).statistic)
    assert np.isnan(r[1]) and np.isnan(r[2])  # constant, not finite
    assert np.isnan(pearson_columns(x[:1], np.asarray([1]))).all()  # one row
    assert np.isnan(pearson_columns(x, np.asarray([1, 1, 1]))).all()  # constant label


def test_frames_and_figures_carry_the_arrays(data) -> None:
    feats, exs, _, _ = data
    s = HeadStats.from_features(feats, exs)
    df = s.to_frame()
    assert len(df) == N_LAYERS * N_HEADS
    row = df[(df["layer"] == 2) & (df["head"] == 3)].iloc[0]
    assert row["ecs_r"] == pytest.approx(s.ecs_r[2, 3])
    assert row["ecs_difference"] == pytest.approx(s.ecs_difference[2, 3])
    layers = s.layer_frame()
    np.testing.assert_allclose(layers["pks_r"], s.pks_r)
    np.testing.assert_allclose(layers["pks_difference"], s.pks_hallucinated - s.pks_faithful)
    fig = ecs_figure(s, "difference", marked=[(0, 1), (2, 3)])
    np.testing.assert_allclose(np.asarray(fig.data[0].z, dtype=float), s.ecs_difference)
    assert list(fig.data[1].x) == ["H1", "H3"] and list(fig.data[1].y) == ["L0", "L2"]
    pks = pks_figure(s)
    np.testing.assert_allclose(np.asarray(pks.data[0].y, dtype=float), s.pks_faithful)
    np.testing.assert_allclose(np.asarray(pks.data[1].y, dtype=float), s.pks_hallucinated)
    np.testing.assert_allclose(np.asarray(pks.data[2].y, dtype=float), s.pks_r)
    best = s.top_heads(2)
    assert s.ecs_r[best[0]] == np.nanmax(s.ecs_r) and s.ecs_r[best[0]] >= s.ecs_r[best[1]]


def test_bad_inputs_raise_typed_errors(data) -> None:
    feats, exs, _, _ = data
    with pytest.raises(DataError, match="one Features per example"):
        HeadStats.from_features(feats, exs[:-1])
    with pytest.raises(DataError, match="no features"):
        HeadStats.from_features([], [])
    other = [*feats[:-1], _features(11, feats[-1].response, model="another|model")]
    with pytest.raises(ModelError, match="several models"):
        HeadStats.from_features(other, exs)
    with pytest.raises(DataError, match="every head"):
        feature_grid(("ECS_L0H0", "ECS_L0H2", "PKS_L0"))  # a copying-head subset, not a grid
    assert feature_grid(_names(2, 3))[:2] == (2, 3)


def test_align_chunk_scores() -> None:
    src = np.asarray([[0, 10], [10, 20]])
    np.testing.assert_array_equal(align_chunk_scores([0.2, 0.7], src, src), [0.2, 0.7])
    out = align_chunk_scores([0.2, 0.7], src, np.asarray([[0, 5], [5, 15], [30, 40]]))
    np.testing.assert_allclose(out[:2], [0.2, 0.7])
    assert np.isnan(out[2])


# --------------------------------------------------------------------------- one answer


@pytest.fixture(scope="module")
def view(tiny_model: LoadedModel, toy_example: RAGExample):
    return head_view(tiny_model, toy_example)


def test_head_view_matches_the_ecs_functions(
    view, tiny_model: LoadedModel, toy_example: RAGExample
) -> None:
    from core.engine.layout import render
    from core.engine.trace import trace
    from core.signals.ecs import ecs_needs

    info = tiny_model.info
    layout = render(toy_example, tiny_model)
    tr = trace(tiny_model, layout, ecs_needs(info.n_layers))
    n_t = len(layout.response_positions)
    assert view.attention.shape == (info.n_layers, info.n_heads, n_t, len(view.context))
    assert view.token_ecs.shape == (n_t, info.n_layers, info.n_heads)
    for head in [(0, 0), (1, 3)]:
        np.testing.assert_array_equal(
            view.top_positions[head], top_context_positions(tr, head, topk_frac=0.1)
        )
        np.testing.assert_allclose(view.head_ecs(head), token_ecs(tr, [head])[:, 0], atol=1e-6)
        rows = tr.at("pattern", head[0], layout.generation_positions)[head[1]].numpy()
        np.testing.assert_allclose(view.attention[head], rows[:, view.context], atol=1e-7)
    # Attention to the passages is part of a softmax row: at most 1.
    assert (view.attention.sum(-1) <= 1 + 1e-5).all()


def test_head_view_tables_and_figure(view, toy_example: RAGExample) -> None:
    head = (1, 2)
    tokens = view.token_frame(head)
    assert len(tokens) == len(view.response_tokens)
    assert (tokens["gold"] == "hallucinated").any() and (tokens["gold"] == "faithful").any()
    np.testing.assert_allclose(tokens["ECS"], view.head_ecs(head), atol=1e-6)
    chunks = view.chunk_frame(head)
    assert list(chunks.columns) == [
        "response chunk",
        "attended context chunk",
        "ECS",
        "PKS",
        "gold",
    ]
    assert chunks["response chunk"].iloc[0] == toy_example.response  # one short chunk
    assert chunks["gold"].iloc[0] == "hallucinated"
    assert chunks["attended context chunk"].iloc[0].startswith("[passage ")
    pks_all = view.chunk_pks[0].mean()
    assert chunks["PKS"].iloc[0] == pytest.approx(pks_all, rel=1e-5)
    assert view.chunk_frame(head, pks_layers=[1])["PKS"].iloc[0] == pytest.approx(
        view.chunk_pks[0, 1], rel=1e-5
    )
    fig = attention_figure(view, head)
    np.testing.assert_allclose(np.asarray(fig.data[0].z, dtype=float), view.attention[head])
    assert "L1H2" in fig.layout.title.text
    assert len(fig.data[1].x) == view.top_positions[head].size  # the top-k marks
    other = attention_figure(view, (0, 1))
    assert not np.allclose(np.asarray(other.data[0].z, dtype=float), view.attention[head])
    with pytest.raises(ValueError, match="outside"):
        view.token_frame((9, 0))
