"""Model folders and GGUF files handed over by a stranger (issue 36, points 1 and 8).

A Hugging Face folder never gets its own Python code run (no prompt, no marker file) and
never has pickled weights read; a GGUF file's header is read and checked before
transformers sees it, so a crafted header is a quick :class:`ModelError` naming the field,
never a traceback, a hang or a huge allocation. Every hostile file is built here."""

from __future__ import annotations

import builtins
import json
import struct
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFEndian, GGUFWriter
from safetensors.numpy import save_file

from core.base.errors import ModelError
from core.engine import chat_template
from core.engine import model as model_mod
from core.engine.gguf_check import check_gguf
from core.engine.model import LoadedModel, embedded_gguf_path, load_model
from core.engine.weights import check_hf_folder, dequantize_gguf, gguf_file

# --------------------------------------------------------------------------- folders

_EVIL_CODE = """
import pathlib
pathlib.Path({marker!r}).write_text("the folder's code ran")
from transformers import PretrainedConfig, PreTrainedModel


class EvilConfig(PretrainedConfig):
    model_type = "evil"


class EvilModel(PreTrainedModel):
    config_class = EvilConfig
"""


_TINY_LLAMA = {
    "model_type": "llama",
    "hidden_size": 8,
    "intermediate_size": 16,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "vocab_size": 16,
}
"""A config whose model is tiny (should a check be missing, nothing big is built)."""


@pytest.fixture
def no_prompt(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Any question on the terminal fails the test (and stdin is closed)."""
    asked: list[str] = []

    def refuse(prompt: str = "") -> str:
        asked.append(prompt)
        return "y"  # what a careless user types; it must never be asked

    monkeypatch.setattr(builtins, "input", refuse)
    monkeypatch.setattr(sys, "stdin", None)
    return asked


def _evil_folder(root: Path, *, config_with_map: bool, marker: Path) -> Path:
    folder = root / "evil-model"
    folder.mkdir()
    auto_map = {
        "AutoConfig": "configuration_evil.EvilConfig",
        "AutoModelForCausalLM": "configuration_evil.EvilModel",
        "AutoTokenizer": ["tokenization_evil.EvilTokenizer", None],
    }
    config: dict[str, object] = {"model_type": "evil", "architectures": ["EvilModel"]}
    if config_with_map:
        config["auto_map"] = auto_map
    (folder / "config.json").write_text(json.dumps(config))
    if not config_with_map:  # the tokenizer's config asks for the code instead
        (folder / "config.json").write_text(json.dumps(_TINY_LLAMA))
        (folder / "tokenizer_config.json").write_text(json.dumps({"auto_map": auto_map}))
    (folder / "configuration_evil.py").write_text(_EVIL_CODE.format(marker=str(marker)))
    (folder / "tokenization_evil.py").write_text(_EVIL_CODE.format(marker=str(marker)))
    (folder / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")
    return folder


@pytest.mark.parametrize("in_config", [True, False], ids=["config.json", "tokenizer_config"])
def test_a_folder_with_code_is_refused_without_running_or_asking(
    tmp_path: Path, no_prompt: list[str], in_config: bool
) -> None:
    marker = tmp_path / "MARKER"
    folder = _evil_folder(tmp_path, config_with_map=in_config, marker=marker)
    name = "config.json" if in_config else "tokenizer_config.json"
    with pytest.raises(ModelError) as exc:
        load_model(str(folder), device="cpu")
    msg = str(exc.value)
    assert str(folder) in msg and f"{name} has an auto_map" in msg
    assert "configuration_evil.py" in msg and "never runs a model's code" in msg
    assert not marker.exists(), "the folder's code ran"
    assert no_prompt == [], "transformers asked on the terminal"


def test_transformers_itself_is_told_never_to_run_code(
    tmp_path: Path, no_prompt: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past ragscope's own check (disabled here), transformers still refuses the code."""
    monkeypatch.setattr("core.engine.model.check_hf_folder", lambda folder: None)
    marker = tmp_path / "MARKER"
    folder = _evil_folder(tmp_path, config_with_map=True, marker=marker)
    with pytest.raises(ModelError, match="cannot load model"):
        load_model(str(folder), device="cpu")
    assert not marker.exists(), "the folder's code ran"
    assert no_prompt == [], "transformers asked on the terminal"


def test_a_folder_of_pickles_is_refused(tmp_path: Path, no_prompt: list[str]) -> None:
    folder = tmp_path / "pickled"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(_TINY_LLAMA))
    (folder / "pytorch_model.bin").write_bytes(b"\x80\x04K\x01.")  # pickle of 1
    with pytest.raises(ModelError) as exc:
        load_model(str(folder), device="cpu")
    msg = str(exc.value)
    assert str(folder) in msg and "holds no safetensors weights" in msg
    assert "only pytorch_model.bin, which are pickles" in msg
    # Next to safetensors weights a pickle is simply never read.
    (folder / "model.safetensors").write_bytes(b"")
    check_hf_folder(folder)


def test_a_huge_tokenizer_or_a_crowded_folder_is_refused_before_parsing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tokenizers library parses tokenizer.json whole: its size is checked first
    (a sparse file, no disk), and so is the number of entries listed."""
    folder = tmp_path / "big"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(_TINY_LLAMA))
    (folder / "model.safetensors").write_bytes(b"")
    with open(folder / "tokenizer.json", "wb") as f:
        f.truncate(129 * 1024 * 1024)
    start = time.monotonic()
    with pytest.raises(ModelError, match=r"tokenizer.json of 135,266,304 bytes, over the"):
        load_model(str(folder), device="cpu")
    assert time.monotonic() - start < 2
    (folder / "tokenizer.json").unlink()
    monkeypatch.setattr("core.engine.weights.FOLDER_ENTRIES_LIMIT", 5)
    for i in range(6):
        (folder / f"shard-{i}.txt").write_text("x")
    with pytest.raises(ModelError, match=r"holds over 5 entries"):
        check_hf_folder(folder)


def test_transformers_itself_reads_no_pickle(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past ragscope's own check (disabled here), transformers is told safetensors only."""
    monkeypatch.setattr("core.engine.model.check_hf_folder", lambda folder: None)
    folder = tmp_path / "pickled"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(_TINY_LLAMA))
    (folder / "pytorch_model.bin").write_bytes(b"\x80\x04K\x01.")
    with pytest.raises(ModelError, match=r"cannot load model.*safetensors"):
        load_model(str(folder), device="cpu")


def test_a_gguf_is_read_alone_not_with_the_code_beside_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """transformers gets a private folder holding only the GGUF: a config.json with an
    auto_map and Python files next to the file are never seen."""
    gguf = _write_gguf(tmp_path / "evil-model" / "model.gguf")
    marker = tmp_path / "MARKER"
    (gguf.parent / "config.json").write_text(json.dumps({"auto_map": {"AutoConfig": "c.C"}}))
    (gguf.parent / "c.py").write_text(_EVIL_CODE.format(marker=str(marker)))
    seen: list[tuple[set[str], dict[str, object]]] = []

    def record(folder: str, **kwargs: object) -> object:
        seen.append(({p.name for p in Path(folder).iterdir()}, kwargs))
        raise OSError("stop here (test)")

    monkeypatch.setattr("transformers.AutoTokenizer.from_pretrained", record)
    with pytest.raises(ModelError, match="transformers cannot load the GGUF file"):
        dequantize_gguf(gguf, tmp_path / "cache")
    ((files, kwargs),) = seen
    assert files == {"model.gguf"}
    assert kwargs["trust_remote_code"] is False
    assert not marker.exists()


def _sized_folder(root: Path, **config: object) -> Path:
    """A folder whose config states ``config`` over a few bytes of safetensors weights."""
    folder = root / "sized"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({**_TINY_LLAMA, **config}))
    save_file(
        {"model.embed_tokens.weight": np.zeros((16, 8), np.float32)}, folder / "model.safetensors"
    )
    return folder


@pytest.mark.parametrize(
    ("config", "pattern"),
    [
        (
            {"num_hidden_layers": 1000, "hidden_size": 576, "intermediate_size": 1536},
            r"field 'num_hidden_layers' \(1000\) with hidden_size 576.*implies at least "
            r"2,433,033,216 parameters, but its safetensors files hold 128",
        ),
        ({"num_hidden_layers": 3000}, r"field 'num_hidden_layers' is 3000 \(a whole number"),
        ({"hidden_size": 1 << 40}, r"field 'hidden_size' is 1099511627776"),
        ({"vocab_size": "many"}, r"field 'vocab_size' is many"),
        ({"text_config": {"n_embd": -1}}, r"field 'n_embd' is -1"),
    ],
)
def test_a_folder_whose_config_outgrows_its_weights_is_refused_quickly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, config: dict[str, object], pattern: str
) -> None:
    def never(*args: object, **kwargs: object) -> object:
        raise AssertionError("transformers saw the hostile folder")

    monkeypatch.setattr("transformers.AutoModelForCausalLM.from_pretrained", never)
    folder = _sized_folder(tmp_path, **config)
    t0 = time.perf_counter()
    with pytest.raises(ModelError, match=pattern) as exc:
        load_model(str(folder), device="cpu")
    assert time.perf_counter() - t0 < 1.0
    assert str(folder) in str(exc.value)


def test_a_folder_with_broken_safetensors_is_refused(tmp_path: Path) -> None:
    folder = _sized_folder(tmp_path, num_hidden_layers=30, hidden_size=576)
    (folder / "model.safetensors").write_bytes((1 << 40).to_bytes(8, "little") + b"{")
    with pytest.raises(ModelError, match="model.safetensors is not a readable safetensors file"):
        check_hf_folder(folder)


def test_a_well_formed_folder_loads(
    tmp_path: Path, tiny_model: LoadedModel, no_prompt: list[str]
) -> None:
    """A saved model (config, safetensors, tokenizer) passes the checks and loads."""
    folder = tmp_path / "saved"
    model_mod._tiny_hf_model(tiny_model.tokenizer, seed=0).save_pretrained(folder)
    tiny_model.tokenizer.save_pretrained(folder)
    (folder / "pytorch_model.bin").write_bytes(b"\x80\x04K\x01.")  # beside safetensors: unread
    check_hf_folder(folder)
    loaded = load_model(str(folder), device="cpu")
    assert loaded.info.n_layers == tiny_model.info.n_layers
    assert no_prompt == []


# --------------------------------------------------------------------------- chat templates

_LOOPS = (
    "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
    "{{ messages[0]['content'] }}"
)
_HUGE = "{{ 'x' * 1500000000 }}{{ messages[0]['content'] }}"


@pytest.mark.parametrize(
    ("template", "reason"),
    [
        (_LOOPS, "ran over 2 s"),
        (_HUGE, "memory"),
        ("{{ messages[0]['content'] | upper }}", "verbatim"),
    ],
    ids=["loops", "huge-string", "rewrites-content"],
)
def test_a_hostile_chat_template_is_refused_at_load_naming_the_model_and_limit(
    tmp_path: Path,
    tiny_model: LoadedModel,
    monkeypatch: pytest.MonkeyPatch,
    template: str,
    reason: str,
) -> None:
    """A model's template is code: it renders in a bounded child process, so a template
    that loops for minutes or builds gigabytes is refused in seconds, before any trace."""
    monkeypatch.setattr(chat_template, "RENDER_SECONDS", 2.0)
    monkeypatch.setattr(chat_template, "RENDER_MEMORY", 1024**3)
    folder = tmp_path / "templated"
    model_mod._tiny_hf_model(tiny_model.tokenizer, seed=0).save_pretrained(folder)
    tiny_model.tokenizer.save_pretrained(folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["chat_template"] = template
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    (folder / "chat_template.jinja").unlink(missing_ok=True)
    t0 = time.perf_counter()
    with pytest.raises(ModelError, match=reason) as exc:
        load_model(str(folder), device="cpu")
    assert time.perf_counter() - t0 < 60
    assert str(folder) in str(exc.value)


def test_a_template_renders_as_transformers_would_and_never_reads_the_content(
    tiny_model: LoadedModel,
) -> None:
    tok = tiny_model.tokenizer
    content = "{{ 'x' * 1500000000 }} {% for i in range(9) %}{% endfor %}"
    for msgs in (
        [{"role": "user", "content": content}],
        [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": content},
            {"role": "user", "content": "f"},
        ],
    ):
        want = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        assert chat_template.render_chat(tok, msgs) == want
    too_many = [{"role": "user", "content": "x"}] * (chat_template.MAX_MESSAGES + 1)
    with pytest.raises(ModelError, match="messages is over"):
        chat_template.render_chat(tok, too_many)


# --------------------------------------------------------------------------- GGUF headers

_WIDTH, _FF, _VOCAB = 32, 64, 8


def _write_gguf(
    path: Path, *, blocks: int = 2, endian: GGUFEndian = GGUFEndian.LITTLE, **overrides: int
) -> Path:
    """A small, well-formed Llama GGUF (F32 tensors); ``overrides`` set ``llama.KEY`` to a
    uint64 (so 2^40 fits) in place of the true value."""
    path.parent.mkdir(parents=True, exist_ok=True)
    w = GGUFWriter(str(path), "llama", endianess=endian)
    sizes = {
        "block_count": blocks,
        "context_length": 256,
        "embedding_length": _WIDTH,
        "feed_forward_length": _FF,
        "attention.head_count": 4,
        "attention.head_count_kv": 2,
    }
    for key, value in sizes.items():
        if key in overrides:
            w.add_uint64(f"llama.{key}", overrides[key])
        else:
            w.add_uint32(f"llama.{key}", value)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model("gpt2")
    w.add_token_list([f"t{i}" for i in range(_VOCAB)])
    rng = np.random.default_rng(0)

    def tensor(name: str, *shape: int) -> None:
        w.add_tensor(name, rng.standard_normal(shape).astype(np.float32))

    tensor("token_embd.weight", _VOCAB, _WIDTH)
    tensor("output_norm.weight", _WIDTH)
    for b in range(blocks):
        tensor(f"blk.{b}.attn_norm.weight", _WIDTH)
        tensor(f"blk.{b}.attn_q.weight", _WIDTH, _WIDTH)
        tensor(f"blk.{b}.attn_k.weight", _WIDTH // 2, _WIDTH)
        tensor(f"blk.{b}.attn_v.weight", _WIDTH // 2, _WIDTH)
        tensor(f"blk.{b}.attn_output.weight", _WIDTH, _WIDTH)
        tensor(f"blk.{b}.ffn_norm.weight", _WIDTH)
        tensor(f"blk.{b}.ffn_gate.weight", _FF, _WIDTH)
        tensor(f"blk.{b}.ffn_up.weight", _FF, _WIDTH)
        tensor(f"blk.{b}.ffn_down.weight", _WIDTH, _FF)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _patch(path: Path, offset: int, fmt: str, value: int) -> Path:
    data = bytearray(path.read_bytes())
    struct.pack_into(fmt, data, offset, value)
    path.write_bytes(bytes(data))
    return path


def _offset_field(path: Path, tensor: str) -> int:
    """Byte offset of a 1-D tensor's ``offset`` field in the header."""
    data = path.read_bytes()
    name = tensor.encode()
    at = data.index(struct.pack("<Q", len(name)) + name) + 8 + len(name)
    return at + 4 + 8 + 4  # n_dims (u32), one dim (u64), type (u32)


def _truncated(path: Path, keep: int) -> Path:
    path.write_bytes(path.read_bytes()[:keep])
    return path


_HOSTILE: dict[str, tuple[Callable[[Path], Path], str]] = {
    "block_count 3000": (
        lambda p: _write_gguf(p, block_count=3000),
        r"field 'llama.block_count'.*outside \[1, 1024\]",
    ),
    "block_count beyond the tensors": (
        lambda p: _write_gguf(p, block_count=40),
        r"field 'llama.block_count' is 40 but the file holds tensors for 2 blocks",
    ),
    "huge embedding_length": (
        lambda p: _write_gguf(p, embedding_length=1 << 40),
        r"field 'llama.embedding_length'.*outside",
    ),
    "embedding_length unlike the tensors": (
        lambda p: _write_gguf(p, embedding_length=65536),
        r"field 'llama.embedding_length' is 65536 but token_embd.weight is 32 wide",
    ),
    "sizes the tensors do not hold": (
        lambda p: _write_gguf(p, feed_forward_length=1 << 19),
        r"field 'llama.embedding_length' with block_count 2, feed_forward_length 524288.*"
        r"implies at least",
    ),
    "truncated header": (
        lambda p: _truncated(_write_gguf(p), p.read_bytes().index(b"t5")),
        r"field 'tokenizer.ggml.tokens.*truncated",
    ),
    "truncated in the counts": (
        lambda p: _truncated(_write_gguf(p), 30),
        r"field 'key 0.*truncated",
    ),
    "absurd tensor count": (
        lambda p: _patch(_write_gguf(p), 8, "<Q", 1 << 60),
        r"field 'tensor_count' is 1152921504606846976 \(the limit is 65536\)",
    ),
    "absurd kv count": (
        lambda p: _patch(_write_gguf(p), 16, "<Q", 1 << 60),
        r"field 'kv_count' is 1152921504606846976",
    ),
    "kv count past the header": (
        lambda p: _patch(_write_gguf(p), 16, "<Q", 4000),
        r"field 'key \d+'",  # tensor entries read as keys: one makes no sense
    ),
    "2^40 key length": (
        lambda p: _patch(_write_gguf(p), 24, "<Q", 1 << 40),
        r"field 'key 0' claims a length of 1099511627776 bytes",
    ),
    "tensor data past the end": (
        lambda p: _truncated(_write_gguf(p), -64),
        r"field 'blk.1.ffn_down.weight \(offset\)'.*past the end of the file",
    ),
    "tensor offset past the end": (
        lambda p: _patch(_write_gguf(p), _offset_field(p, "output_norm.weight"), "<Q", 1 << 50),
        r"field 'output_norm.weight \(offset\)'.*past the end of the file",
    ),
    "version 1": (
        lambda p: _patch(_write_gguf(p), 4, "<I", 1),
        r"field 'version' is 1",
    ),
}


@pytest.mark.parametrize("case", sorted(_HOSTILE))
def test_hostile_gguf_headers_are_refused_quickly_naming_the_field(
    tmp_path: Path, case: str
) -> None:
    make, pattern = _HOSTILE[case]
    path = make(tmp_path / "hostile.gguf")
    t0 = time.perf_counter()
    with pytest.raises(ModelError, match=pattern) as exc:
        gguf_file(str(path))
    assert time.perf_counter() - t0 < 0.5
    assert str(path) in str(exc.value)


@pytest.mark.parametrize("case", ["block_count 3000", "truncated header", "2^40 key length"])
def test_load_model_refuses_hostile_gguf_before_transformers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    def never(*args: object, **kwargs: object) -> object:
        raise AssertionError("transformers saw the hostile file")

    monkeypatch.setenv("RAGSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr("transformers.AutoTokenizer.from_pretrained", never)
    monkeypatch.setattr("transformers.AutoModelForCausalLM.from_pretrained", never)
    make, pattern = _HOSTILE[case]
    path = make(tmp_path / "hostile.gguf")
    t0 = time.perf_counter()
    with pytest.raises(ModelError, match=pattern):
        load_model(str(path), device="cpu")
    assert time.perf_counter() - t0 < 1.0
    with pytest.raises(ModelError, match=pattern):  # and the dequantizer checks on its own
        dequantize_gguf(path, tmp_path / "cache" / "x")


def test_well_formed_ggufs_pass(tmp_path: Path) -> None:
    header = check_gguf(_write_gguf(tmp_path / "ok.gguf", blocks=3))
    assert header.architecture == "llama"
    assert header.arch_value("block_count") == 3
    assert len(header.tensors) == 2 + 3 * 9
    big = check_gguf(_write_gguf(tmp_path / "big.gguf", endian=GGUFEndian.BIG))
    assert big.arch_value("embedding_length") == _WIDTH
    embedded = check_gguf(embedded_gguf_path())  # the real model: header only, ~20 ms
    assert embedded.arch_value("block_count") == 30
    assert embedded.arch_value("embedding_length") == 576
    assert len(embedded.tensors) == 272
