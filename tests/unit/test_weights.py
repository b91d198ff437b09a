"""Bring your own model: a GGUF file by path, or an Ollama model from its local store.

The embedded GGUF, laid out as an Ollama store (manifest + blob), loads through
``ollama:`` with the same logits as the embedded model; bad stores, manifests, names
and files give a clear :class:`ModelError`, never a crash."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from core.base.errors import ModelError
from core.engine.model import LoadedModel, embedded_gguf_path, load_model
from core.engine.weights import (
    OLLAMA_MODEL_MEDIA,
    gguf_cache_path,
    gguf_file,
    parse_ollama,
    resolve_ollama,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _store(root: Path, blob_source: Path, *, name: str = "smollm2", tag: str = "135m") -> Path:
    """An Ollama store holding ``blob_source`` as ``NAME:TAG`` (blob linked, not copied)."""
    digest = hashlib.sha256(f"{blob_source}".encode()).hexdigest()  # any 64 hex digits
    (root / "blobs").mkdir(parents=True, exist_ok=True)
    blob = root / "blobs" / f"sha256-{digest}"
    if not blob.exists():
        blob.symlink_to(blob_source)
    manifest = root / "manifests" / "registry.ollama.ai" / "library" / name / tag
    manifest.parent.mkdir(parents=True, exist_ok=True)
    layers = [
        {"mediaType": OLLAMA_MODEL_MEDIA, "digest": f"sha256:{digest}", "size": 1},
        {"mediaType": "application/vnd.ollama.image.template", "digest": "sha256:" + "0" * 64},
    ]
    manifest.write_text(json.dumps({"schemaVersion": 2, "layers": layers}))
    return manifest


def _logits(model: LoadedModel, text: str) -> np.ndarray:
    ids = model.tokenizer(text, return_tensors="pt").input_ids.to(model.device)
    with torch.no_grad():
        return model.hf_model(ids).logits[0].float().cpu().numpy()


def test_ollama_model_loads_with_the_embedded_models_logits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, embedded_model: LoadedModel
) -> None:
    store = tmp_path / "ollama"
    _store(store, embedded_gguf_path())
    monkeypatch.setenv("OLLAMA_MODELS", str(store))
    monkeypatch.setenv("RAGSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    m = load_model("ollama:smollm2:135m", device="cpu")
    assert m.info.display_name == "ollama:smollm2:135m"
    assert "ollama:smollm2:135m" in m.source and "sha256-" in m.source  # where weights came from
    assert (m.info.n_layers, m.info.n_heads, m.info.d_vocab) == (
        embedded_model.info.n_layers,
        embedded_model.info.n_heads,
        embedded_model.info.d_vocab,
    )
    text = "The capital of France is Paris."
    np.testing.assert_allclose(
        _logits(m, text), _logits(embedded_model, text), rtol=1e-4, atol=1e-4
    )
    # dequantized once, into the cache; the same file by path reuses nothing else
    blob = resolve_ollama("ollama:smollm2:135m")
    assert (gguf_cache_path(blob) / "model.safetensors").is_file()


def test_a_gguf_file_of_an_unsupported_architecture_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import gguf

    monkeypatch.setenv("RAGSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    path = tmp_path / "odd.gguf"
    w = gguf.GGUFWriter(str(path), "nosucharch")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((4, 8), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ModelError, match="nosucharch.*dequantizes these architectures:.*llama"):
        load_model(str(path), device="cpu")
    assert not list((tmp_path / "cache").rglob("model.safetensors"))  # nothing half-written
    not_gguf = tmp_path / "weights.gguf"
    not_gguf.write_bytes(b"PK\x03\x04 not a gguf")
    with pytest.raises(ModelError, match="not a GGUF file"):
        load_model(str(not_gguf), device="cpu")
    with pytest.raises(ModelError, match="cannot read the GGUF file"):
        load_model(str(tmp_path / "missing.gguf"), device="cpu")


def test_ollama_specs_and_stores_are_checked(tmp_path: Path) -> None:
    assert parse_ollama("ollama:llama3") == ("registry.ollama.ai", "library", "llama3", "latest")
    assert parse_ollama("ollama:me/m:q4") == ("registry.ollama.ai", "me", "m", "q4")
    assert parse_ollama("ollama:h.io/me/m:1") == ("h.io", "me", "m", "1")
    for bad in ("ollama:../etc:passwd", "ollama:a/b/c/d", "ollama:m:..", "ollama:", "llama3"):
        with pytest.raises(ModelError):
            parse_ollama(bad)
    with pytest.raises(ModelError, match="no Ollama model store"):
        resolve_ollama("ollama:m", tmp_path / "nowhere")
    store = tmp_path / "store"
    manifest = _store(store, embedded_gguf_path())
    with pytest.raises(
        ModelError, match=r"not in the Ollama store.*ollama:smollm2:135m.*ollama pull"
    ):
        resolve_ollama("ollama:qwen3:8b", store)
    good = manifest.read_text()
    for broken, msg in (
        ("{not json", "cannot be read"),
        ('{"layers": 3}', "no list of layers"),
        ('{"layers": []}', "0 model layers"),
        (
            json.dumps({"layers": [{"mediaType": OLLAMA_MODEL_MEDIA, "digest": "sha256:../../x"}]}),
            "malformed digest",
        ),
        (
            json.dumps(
                {"layers": [{"mediaType": OLLAMA_MODEL_MEDIA, "digest": "sha256:" + "a" * 64}]}
            ),
            "missing",
        ),
        ("[" * 10_000 + "]" * 10_000, "cannot be read"),
    ):
        manifest.write_text(broken)
        with pytest.raises(ModelError, match=msg):
            resolve_ollama("ollama:smollm2:135m", store)
    manifest.write_bytes(b" " * (2 << 20))  # over the size limit: refused before parsing
    with pytest.raises(ModelError, match="limit"):
        resolve_ollama("ollama:smollm2:135m", store)
    manifest.write_text(good)
    assert gguf_file(str(resolve_ollama("ollama:smollm2:135m", store))).name.startswith("sha256-")
