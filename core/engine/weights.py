"""Where a model's weights come from when they are a GGUF file: a path, or Ollama's store.

- ``path/to/model.gguf``: any GGUF file whose architecture transformers can dequantize
  (:data:`supported_architectures`).
- ``ollama:NAME[:TAG]`` (also ``ollama:NAMESPACE/NAME:TAG`` and
  ``ollama:HOST/NAMESPACE/NAME:TAG``): a model pulled with Ollama, read from its local
  store — ``$OLLAMA_MODELS`` or ``~/.ollama/models`` — through the tag's manifest
  (``manifests/HOST/NAMESPACE/NAME/TAG``, JSON) to the model layer's blob
  (``blobs/sha256-<hex>``), which is a GGUF file. No Ollama server is needed.

Either way the GGUF is dequantized once, with transformers, into a float checkpoint in
the cache (:func:`dequantize_gguf`; written to a temporary folder and renamed into
place, so an interrupted run never leaves half a cache), keyed by the file's path,
size and modification time; later loads read that checkpoint.

Everything read here is treated as hostile: manifests are size-bounded JSON whose
digests must look like SHA-256 digests, names and tags may not climb out of the store,
and a GGUF file's whole header is read and checked (:func:`core.engine.gguf_check.check_gguf`)
before transformers sees it, from a private folder that holds nothing else.

A Hugging Face folder is checked too (:func:`check_hf_folder`): ragscope never runs a
model's own Python code (no ``auto_map`` in its configs; transformers is always called
with ``trust_remote_code=False``) and reads weights only from safetensors, never from
pickles (``pytorch_model.bin``, ``*.pt``, ``*.ckpt``).
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import math
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from safetensors import SafetensorError, safe_open

from core.base.errors import DataError, ModelError
from core.base.paths import cache_dir
from core.base.safeio import read_json_file, regular_file
from core.engine.gguf_check import LIMITS, check_gguf, implied_parameters, plausible

OLLAMA_PREFIX = "ollama:"
OLLAMA_HOST = "registry.ollama.ai"
OLLAMA_NAMESPACE = "library"
OLLAMA_MODEL_MEDIA = "application/vnd.ollama.image.model"
MANIFEST_LIMIT = 1 << 20
"""Most bytes of an Ollama manifest read (real ones are about 1 KB)."""
CONFIG_LIMIT = 32 << 20
"""Most bytes of a model folder's JSON config read (real ones are under 1 MB)."""
CONFIG_FILES = (
    "config.json",
    "tokenizer_config.json",
    "generation_config.json",
    "preprocessor_config.json",
    "processor_config.json",
)
"""The configs in which transformers honours an ``auto_map`` (code of the folder's own)."""
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")
TOKENIZER_SUFFIXES = (".json", ".txt", ".model", ".jinja", ".tiktoken")
TOKENIZER_LIMIT = 128 * 1024 * 1024
"""The largest tokenizer or config file a model folder may hold (Llama 3's tokenizer.json
is 9 MB, Gemma's 33 MB); the Rust tokenizers library parses what it is given whole."""
FOLDER_ENTRIES_LIMIT = 10_000
"""The most entries a model folder may hold (hub models hold tens)."""
HUB_FILES = ["*.json", "*.safetensors", "*.txt", "*.model", "*.jinja", "*.tiktoken"]
"""What is fetched of a hub model: configs, safetensors weights, tokenizer files; never
Python files or pickles."""
TRUST = {"trust_remote_code": False}
"""Passed to every transformers ``from_pretrained``: a model's own code never runs (and
transformers never asks on the terminal whether it may)."""
CACHE_FORMAT = 1
"""Bump when the dequantized cache layout changes."""

_PART = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_DIGEST = re.compile(r"^sha256[:-]([0-9a-f]{64})$")

Progress = Callable[[str, float], None]


def is_gguf_spec(spec: str) -> bool:
    """Whether a model spec names a GGUF file (by its suffix) or an Ollama model."""
    return spec.startswith(OLLAMA_PREFIX) or spec.lower().endswith(".gguf")


def ollama_store() -> Path:
    """Ollama's model store: ``$OLLAMA_MODELS``, else ``~/.ollama/models``."""
    env = os.environ.get("OLLAMA_MODELS")
    return Path(env).expanduser() if env else Path.home() / ".ollama" / "models"


def parse_ollama(spec: str) -> tuple[str, str, str, str]:
    """``(host, namespace, name, tag)`` of ``ollama:[[HOST/]NAMESPACE/]NAME[:TAG]``.

    Raises:
        ModelError: Not an ``ollama:`` spec, or a part that is not a plain name (no
            ``..``, slashes beyond the three parts, or odd characters).
    """
    if not spec.startswith(OLLAMA_PREFIX):
        raise ModelError(f"{spec!r} is not an Ollama model; write ollama:NAME[:TAG]")
    rest = spec[len(OLLAMA_PREFIX) :]
    path, _, tag = rest.rpartition(":") if ":" in rest else (rest, "", "latest")
    parts = path.split("/")
    if not 1 <= len(parts) <= 3:
        raise ModelError(f"{spec!r}: write ollama:NAME[:TAG] or ollama:NAMESPACE/NAME[:TAG]")
    host, namespace = OLLAMA_HOST, OLLAMA_NAMESPACE
    if len(parts) == 3:
        host, namespace, name = parts
    elif len(parts) == 2:
        namespace, name = parts
    else:
        (name,) = parts
    for what, part in (("host", host), ("namespace", namespace), ("name", name), ("tag", tag)):
        if not _PART.match(part) or part in (".", ".."):
            raise ModelError(
                f"{spec!r}: the {what} {part!r} is not a model name (letters, digits, '.', "
                "'_' and '-')"
            )
    return host, namespace, name, tag


def _installed(store: Path, limit: int = 20) -> list[str]:
    """Up to ``limit`` models in the store, as ``ollama:`` specs (for error messages)."""
    root = store / "manifests"
    found: list[str] = []
    if not root.is_dir():
        return found
    for host in sorted(root.iterdir()):
        for ns in sorted(host.iterdir()) if host.is_dir() else []:
            for name in sorted(ns.iterdir()) if ns.is_dir() else []:
                for tag in sorted(name.iterdir()) if name.is_dir() else []:
                    prefix = "" if ns.name == OLLAMA_NAMESPACE else f"{ns.name}/"
                    if host.name != OLLAMA_HOST:
                        prefix = f"{host.name}/{ns.name}/"
                    found.append(f"{OLLAMA_PREFIX}{prefix}{name.name}:{tag.name}")
                    if len(found) >= limit:
                        return found
    return found


def resolve_ollama(spec: str, store: Path | None = None) -> Path:
    """The GGUF blob of an Ollama model in the local store.

    Raises:
        ModelError: No store, the model or tag is not in it (naming those that are),
            a manifest that is not one, or a missing blob.
    """
    host, namespace, name, tag = parse_ollama(spec)
    store = store or ollama_store()
    if not store.is_dir():
        raise ModelError(
            f"no Ollama model store at {store}: pull the model with `ollama pull "
            f"{name}:{tag}`, or point OLLAMA_MODELS at the folder that holds manifests/ and blobs/"
        )
    manifest = store / "manifests" / host / namespace / name / tag
    if not manifest.is_file():
        have = _installed(store)
        raise ModelError(
            f"{spec} is not in the Ollama store at {store} (no {manifest.relative_to(store)}); "
            + (f"it holds {', '.join(have)}" if have else "it holds no models")
            + f". Pull it with `ollama pull {name}:{tag}`"
        )
    try:
        doc = read_json_file(manifest, MANIFEST_LIMIT, what="Ollama manifest")
    except DataError as e:
        raise ModelError(f"the Ollama manifest of {spec} cannot be read: {e}") from e
    layers = doc.get("layers") if isinstance(doc, dict) else None
    if not isinstance(layers, list):
        raise ModelError(f"the Ollama manifest {manifest} has no list of layers; re-pull {spec}")
    digests = [
        layer.get("digest")
        for layer in layers
        if isinstance(layer, dict) and layer.get("mediaType") == OLLAMA_MODEL_MEDIA
    ]
    if len(digests) != 1 or not isinstance(digests[0], str):
        raise ModelError(
            f"the Ollama manifest {manifest} names {len(digests)} model layers (expected one); "
            f"re-pull {spec}"
        )
    m = _DIGEST.match(digests[0])
    if m is None:
        raise ModelError(f"the Ollama manifest {manifest} has a malformed digest {digests[0]!r}")
    blob = store / "blobs" / f"sha256-{m.group(1)}"
    if not blob.is_file():
        raise ModelError(f"the weights of {spec} ({blob.name}) are missing from {store / 'blobs'}")
    return blob


def gguf_file(spec: str) -> Path:
    """The GGUF file a spec names (a path, or an ``ollama:`` model), checked to be one.

    Raises:
        ModelError: Missing, not a regular file, or not starting with the GGUF magic.
    """
    path = resolve_ollama(spec) if spec.startswith(OLLAMA_PREFIX) else Path(spec).expanduser()
    try:
        regular_file(path)
    except DataError as e:
        raise ModelError(f"cannot read the GGUF file {path}: {e}") from e
    check_gguf(path, architectures=supported_architectures())
    return path


@contextlib.contextmanager
def gguf_alone(gguf: Path) -> Iterator[tuple[str, str]]:
    """``(folder, file name)`` of a private folder holding only a link to ``gguf``, to hand
    transformers: it reads nothing that lies beside the file (a ``config.json`` or
    ``tokenizer_config.json`` with an ``auto_map``, Python files)."""
    with tempfile.TemporaryDirectory(prefix="ragscope-gguf-") as tmp:
        link = Path(tmp) / "model.gguf"
        link.symlink_to(gguf.resolve())
        yield tmp, link.name


_CONFIG_SIZES = {
    # config key(s) (Llama style, GPT-2 style) -> the most it may state
    ("num_hidden_layers", "n_layer"): LIMITS.block_count,
    ("hidden_size", "n_embd"): LIMITS.embedding_length,
    ("intermediate_size", "n_inner"): LIMITS.feed_forward_length,
    ("vocab_size",): LIMITS.vocab,
    ("num_attention_heads", "n_head", "num_key_value_heads"): LIMITS.head_count,
    ("head_dim",): LIMITS.head_dim,
    ("max_position_embeddings", "n_positions", "n_ctx"): LIMITS.context_length,
    ("num_local_experts", "num_experts"): LIMITS.experts,
}
"""The sizes of a transformers config that decide what it allocates."""


def _config(folder: Path, name: str) -> Any:
    try:
        return read_json_file(folder / name, CONFIG_LIMIT, what=f"model {name}")
    except DataError as e:
        raise ModelError(f"the model folder {folder} has an unreadable {name}: {e}") from e


def _config_size(folder: Path, config: dict[str, Any], keys: tuple[str, ...], most: int) -> int:
    """The first of ``keys`` the config states, checked to be a whole number in
    ``[0, most]`` (0 when none is stated)."""
    for key in keys:
        value = config.get(key)
        if value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= most:
            raise ModelError(
                f"the model folder {folder} is refused: config.json field {key!r} is "
                f"{str(value)[:40]} (a whole number from 0 to {most}). The config is damaged "
                "or crafted"
            )
        return value
    return 0


def _safetensors_elements(folder: Path) -> int:
    """How many weights the folder's safetensors files hold (their headers only)."""
    total = 0
    for path in sorted(folder.glob("*.safetensors")):
        try:
            with safe_open(path, framework="numpy") as f:
                total += sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys())
        except (SafetensorError, OSError) as e:
            raise ModelError(
                f"the weights file {path} is not a readable safetensors file: {e}"
            ) from e
    return total


def _check_config_sizes(folder: Path, config: dict[str, Any]) -> None:
    """Refuse sizes out of bounds, or a model far bigger than the weights that are there
    (a ``num_hidden_layers`` of 3000 over a few kilobytes of weights)."""
    sized = [config] + [v for v in config.values() if isinstance(v, dict)]  # text_config...
    for part in sized:
        size = {
            keys[0]: _config_size(folder, part, keys, most) for keys, most in _CONFIG_SIZES.items()
        }
        implied = implied_parameters(
            vocab=size["vocab_size"],
            width=size["hidden_size"],
            blocks=size["num_hidden_layers"],
            ff=size["intermediate_size"],
            experts=size["num_local_experts"],
        )
        if implied <= 1 << 20:
            continue
        present = _safetensors_elements(folder)
        if not plausible(implied, present):
            raise ModelError(
                f"the model folder {folder} is refused: config.json field 'num_hidden_layers' "
                f"({size['num_hidden_layers']}) with hidden_size {size['hidden_size']}, "
                f"intermediate_size {size['intermediate_size']} and vocab_size "
                f"{size['vocab_size']} implies at least {implied:,} parameters, but its "
                f"safetensors files hold {present:,}. The config does not describe these weights"
            )


def check_hf_folder(folder: Path) -> None:
    """Refuse a Hugging Face model folder that asks to run its own code, whose weights
    are only pickles, or whose config states sizes its weights do not have, before
    transformers sees it.

    Raises:
        ModelError: A config with an ``auto_map`` (naming the file, the code it names and
            the folder's Python files), or pickled weights and no ``*.safetensors``
            (naming the pickles). A folder with no weights at all is left to transformers,
            which says what is missing (it is never allowed to read a pickle). A
            config size out of bounds, or implying a model far bigger than the
            safetensors hold (naming the field).
    """
    entries = list(itertools.islice(folder.iterdir(), FOLDER_ENTRIES_LIMIT + 1))
    if len(entries) > FOLDER_ENTRIES_LIMIT:
        raise ModelError(
            f"the model folder {folder} holds over {FOLDER_ENTRIES_LIMIT:,} entries; a model "
            "folder holds its config, tokenizer and weight files: is this the right folder?"
        )
    for p in entries:
        if p.suffix in TOKENIZER_SUFFIXES and p.is_file() and p.stat().st_size > TOKENIZER_LIMIT:
            raise ModelError(
                f"the model folder {folder} holds {p.name} of {p.stat().st_size:,} bytes, over "
                f"the {TOKENIZER_LIMIT:,}-byte limit for a tokenizer or config file; the file "
                "is damaged or crafted: download the model again"
            )
    for name in CONFIG_FILES:
        if not (folder / name).is_file():
            continue
        doc = _config(folder, name)
        auto_map = doc.get("auto_map") if isinstance(doc, dict) else None
        if auto_map is not None:
            code = sorted(p.name for p in folder.glob("*.py"))[:10]
            raise ModelError(
                f"the model folder {folder} asks to run its own Python code ({name} has an "
                f"auto_map: {str(auto_map)[:200]}"
                + (f"; the folder holds {', '.join(code)}" if code else "")
                + "). ragscope never runs a model's code: use a model whose architecture "
                "transformers ships (its config.json has no auto_map), or its GGUF file"
            )
    pickles = sorted(p.name for p in entries if p.suffix in PICKLE_SUFFIXES)[:10]
    if pickles and not any(folder.glob("*.safetensors")):
        raise ModelError(
            f"the model folder {folder} holds no safetensors weights (only "
            f"{', '.join(pickles)}, which are pickles). ragscope reads weights only from "
            "safetensors or GGUF, never from pickles, which can run code: get the model's "
            "model.safetensors (most hub models have one) or its GGUF file"
        )
    config = _config(folder, "config.json") if (folder / "config.json").is_file() else None
    if isinstance(config, dict):
        _check_config_sizes(folder, config)


def gguf_cache_path(path: Path) -> Path:
    """The cache folder of a GGUF file's dequantized weights: keyed by the file's
    resolved path, size and modification time (a re-pulled file gets a new folder)."""
    st = path.stat()
    ident = f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}".encode()
    stem = re.sub(r"[^A-Za-z0-9._-]+", "-", path.stem)[:48] or "model"
    return (
        cache_dir()
        / "models"
        / f"gguf-{stem}-{hashlib.sha256(ident).hexdigest()[:16]}-v{CACHE_FORMAT}"
    )


def supported_architectures() -> list[str]:
    """The GGUF architectures this transformers can dequantize."""
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    return sorted(a for a in GGUF_SUPPORTED_ARCHITECTURES if a not in ("general", "tokenizer"))


def cache_complete(path: Path) -> bool:
    """Whether a dequantized cache folder holds config, weights and tokenizer."""
    return (
        (path / "config.json").is_file()
        and (path / "model.safetensors").is_file()
        and (path / "tokenizer.json").is_file()
    )


def dequantize_gguf(
    gguf: Path, target: Path, progress: Progress | None = None, *, force: bool = False
) -> Path:
    """Dequantize ``gguf`` once with transformers and save float weights + tokenizer in
    ``target`` (returned; reused when complete unless ``force``).

    Raises:
        ModelError: An architecture transformers cannot dequantize (naming those it can),
            or a file it cannot parse.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if cache_complete(target) and not force:
        return target
    if progress:
        progress(f"Dequantizing {gguf.name} (first load only)", 0.05)
    check_gguf(gguf, architectures=supported_architectures())
    try:
        with gguf_alone(gguf) as (folder, name):
            tok = AutoTokenizer.from_pretrained(folder, gguf_file=name, **TRUST)
            quant = AutoModelForCausalLM.from_pretrained(
                folder, gguf_file=name, dtype=torch.float32, **TRUST
            )
    except (ValueError, KeyError, OSError) as e:
        raise ModelError(
            f"transformers cannot load the GGUF file {gguf}: {str(e).rstrip('.')}. It dequantizes these "
            f"architectures: {', '.join(supported_architectures())}"
        ) from e
    if progress:
        progress("Saving float weights to the cache", 0.6)
    # A model loaded from GGUF carries a quantization config that transformers
    # refuses to serialise; rebuild a plain float model from its weights.
    cfg_dict: dict[str, Any] = quant.config.to_dict()
    for key in ("quantization_config", "_model_name_or_path"):
        cfg_dict.pop(key, None)
    config = type(quant.config).from_dict(cfg_dict)
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32, **TRUST)
    plain.load_state_dict(quant.state_dict(), strict=True)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=target.parent))
    try:
        plain.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        if target.exists():
            shutil.rmtree(target)
        tmp.rename(target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    if progress:
        progress("Cached", 0.7)
    return target
