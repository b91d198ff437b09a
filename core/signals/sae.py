"""Sparse autoencoders on the residual stream (RAGLens, ``specs/raglens.md``).

No pretrained SAE exists for the embedded SmolLM2-135M, so ragscope trains one
with sae-lens (its TopK SAE classes and :class:`sae_lens.SAETrainer`), fed with
activations our own trace engine collects, and ships it in sae-lens's save
format (``cfg.json`` + ``sae_weights.safetensors``) under ``assets/sae/``,
with a sidecar :data:`META_FILE` that records the model, the hook, the exact
training data (per source: examples, tokens and a content hash), the settings
and the measured quality.

Pipeline (``ragscope sae train`` / ``ragscope sae eval``):

1. :func:`sae_corpus`: RAG-style prompts and answers (built-in corpus, the
   embedded model's own answers, and the development sets in
   ``../shared/data`` when present). About 10% of the sources (by
   :func:`~core.evaluation.evaluate.source_key`) are held out for evaluation.
2. :func:`collect_activations`: ``resid_post`` of one layer at every position
   but the first (the BOS token's residual is an outlier that would dominate
   the loss); the forward pass stops right after that layer.
3. :func:`train_sae`: a TopK SAE (``k`` active features per token) trained by
   sae-lens on shuffled passes over those activations, activations scaled to
   an average norm of ``sqrt(d_model)`` during training and the scale folded
   back into the weights, so the saved SAE reads raw residuals.
4. :func:`evaluate_sae` on the held-out sources: fraction of variance
   explained, mean L0, dead-feature fraction and the increase in next-token
   cross-entropy when the reconstruction is spliced into the forward pass.

Feature activations (:meth:`LoadedSAE.encode`): ``post`` = the SAE's own
TopK output; ``pre`` = the ReLU of the encoder pre-activations before the
top-k cut (what the RAGLens public code pooled). The detector records which.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from core.base.errors import DataError, ModelError, brief
from core.base.examples import RAGExample, example_hash, source_key
from core.base.paths import cache_dir
from core.base.safeio import MiB, json_default, read_json_file, regular_file, sha256_file
from core.data import BUILTIN_ANSWERS, builtin_answers_path, resolve_dataset, shared_data_dir
from core.engine.layout import render
from core.engine.model import LoadedModel
from core.engine.sae_compat import import_sae_lens
from core.engine.trace import hooked_logits, resid_post_name, residuals_until

if TYPE_CHECKING:
    import torch
    from jaxtyping import Float

META_FILE = "ragscope_sae.json"
"""Sidecar of a ragscope-trained SAE: model, hook, training data, settings, quality."""
META_VERSION = 1
Activation = Literal["post", "pre"]
ACTIVATIONS: tuple[str, ...] = ("post", "pre")
HELD_OUT_MOD = 10
"""A source is held out when ``int(sha256(source_key)) % HELD_OUT_MOD == 0`` (about 10%)."""
Progress = Callable[[int, int], None]


def sae_lens() -> Any:
    """The ``sae_lens`` module (imported through :mod:`core.engine.sae_compat`)."""

    return import_sae_lens()


def default_layer(n_layers: int) -> int:
    """The middle block (the paper found mid layers best for QA and summaries)."""
    return n_layers // 2


def hook_name(layer: int) -> str:
    """The TransformerLens hook the SAE reads: ``blocks.{layer}.hook_resid_post``."""
    return resid_post_name(layer)


# --------------------------------------------------------------------------- corpus


DEFAULT_SOURCES: tuple[str, ...] = (
    "builtin",
    "builtin-answers",
    "shared:ragtruth_qa_dev.jsonl",
    "shared:dolly_ac_dev.jsonl",
    "shared:finqa_qwen3_interpdetect.jsonl",
)
"""Training text: ``builtin`` and ``builtin-answers`` ship with ragscope; ``shared:FILE``
are the development sets in ``../shared/data`` (skipped, and recorded as skipped, when
that folder is absent)."""


@dataclass(frozen=True, kw_only=True)
class CorpusSource:
    """One dataset of the SAE corpus, as recorded in the SAE's metadata."""

    spec: str
    name: str
    n_examples: int
    content_sha256: str
    file: str | None = None
    file_sha256: str | None = None


@dataclass(frozen=True, kw_only=True, eq=False)
class SaeCorpus:
    """The examples an SAE is trained and evaluated on, with their provenance."""

    train: tuple[RAGExample, ...]
    held_out: tuple[RAGExample, ...]
    sources: tuple[CorpusSource, ...]
    skipped: tuple[str, ...] = ()


def is_held_out(example: RAGExample) -> bool:
    """Whether ``example``'s source belongs to the SAE's held-out evaluation text."""

    digest = hashlib.sha256(source_key(example).encode("utf-8")).hexdigest()
    return int(digest, 16) % HELD_OUT_MOD == 0


def sae_corpus(specs: Sequence[str] = DEFAULT_SOURCES) -> SaeCorpus:
    """Resolve the training text (see :data:`DEFAULT_SOURCES`) and split off the held-out part.

    Raises:
        DataError: A spec that is not ``shared:`` cannot be resolved, or nothing is left.
    """

    train: list[RAGExample] = []
    held: list[RAGExample] = []
    sources: list[CorpusSource] = []
    skipped: list[str] = []
    for spec in specs:
        file: Path | None = None
        if spec.startswith("shared:"):
            folder = shared_data_dir()
            file = folder / spec.removeprefix("shared:") if folder is not None else None
            if file is None or not file.is_file():
                skipped.append(spec)
                continue
            name, exs = resolve_dataset(str(file), on_error="skip")
        else:
            name, exs = resolve_dataset(spec)
            if spec == BUILTIN_ANSWERS:
                file = builtin_answers_path()
            elif Path(spec).is_file():
                file = Path(spec)
        digest = hashlib.sha256()
        for h in sorted(example_hash(e) for e in exs):
            digest.update(h.encode("ascii"))
        sources.append(
            CorpusSource(
                spec=spec,
                name=name,
                n_examples=len(exs),
                content_sha256=digest.hexdigest(),
                file=file.name if file is not None else None,
                file_sha256=sha256_file(file) if file is not None else None,
            )
        )
        for e in exs:
            (held if is_held_out(e) else train).append(e)
    if not train or not held:
        raise DataError(
            f"the SAE corpus {list(specs)} gave {len(train)} training and {len(held)} held-out "
            "examples; add sources (builtin is always available)"
        )
    return SaeCorpus(
        train=tuple(train), held_out=tuple(held), sources=tuple(sources), skipped=tuple(skipped)
    )


# --------------------------------------------------------------------------- activations


def example_ids(model: LoadedModel, example: RAGExample) -> np.ndarray:
    """The token ids the model reads for ``example`` (prompt and answer, as traced)."""

    return np.asarray(render(example, model).token_ids, dtype=np.int64)


def collect_activations(
    model: LoadedModel,
    examples: Iterable[RAGExample],
    layer: int,
    *,
    max_tokens: int | None = None,
    progress: Progress | None = None,
) -> np.ndarray:
    """``[N, d_model]`` float16 residuals of every example at every position but the first.

    Stops once ``max_tokens`` rows are collected.
    """
    exs = list(examples)
    parts: list[np.ndarray] = []
    n = 0
    for i, ex in enumerate(exs):
        ids = example_ids(model, ex)
        x = residuals_until(model, ids, layer)[1:]
        parts.append(x.numpy().astype(np.float16))
        n += x.shape[0]
        if progress:
            progress(i + 1, len(exs))
        if max_tokens is not None and n >= max_tokens:
            break
    if not parts:
        raise DataError("no examples to collect activations from")
    out = np.concatenate(parts)
    if not np.isfinite(out).all():
        raise ModelError(f"layer {layer} residuals overflow float16; train on float32 instead")
    return out[:max_tokens] if max_tokens is not None else out


# --------------------------------------------------------------------------- training


@dataclass(frozen=True, kw_only=True)
class SaeSettings:
    """How an SAE is trained (recorded with it).

    Attributes:
        layer: Block whose ``resid_post`` the SAE reads (``None``: the middle one).
        expansion: ``d_sae = expansion * d_model``.
        k: Active features per token (TopK SAE).
        training_tokens: Activation rows the trainer sees (passes over the data repeat).
        batch_size: Rows per step.
        lr: Adam learning rate (constant, with warm-up, decayed over the last 20%).
        seed: Seed of the initialisation and the shuffles.
        dtype: Storage dtype of the saved weights (``float32`` or ``float16``).
    """

    layer: int | None = None
    expansion: int = 8
    k: int = 32
    training_tokens: int = 2_000_000
    batch_size: int = 1024
    lr: float = 1e-3
    seed: int = 0
    dtype: str = "float32"

    def __post_init__(self) -> None:
        if self.expansion < 1 or self.k < 1 or self.batch_size < 1 or self.training_tokens < 1:
            raise ValueError("expansion, k, batch_size and training_tokens must be >= 1")
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if self.dtype not in ("float32", "float16"):
            raise ValueError(f"dtype must be float32 or float16, got {self.dtype!r}")


def _batches(acts: np.ndarray, batch_size: int, seed: int) -> Iterator[torch.Tensor]:
    """Endless shuffled passes over the rows, as float32 tensors of ``batch_size`` rows."""
    import torch

    rng = np.random.default_rng(seed)
    n = acts.shape[0]
    while True:
        order = rng.permutation(n)
        for s in range(0, n - batch_size + 1, batch_size):
            yield torch.from_numpy(acts[np.sort(order[s : s + batch_size])].astype(np.float32))


def train_sae(acts: np.ndarray, settings: SaeSettings, *, progress: Progress | None = None) -> Any:
    """Train a TopK SAE with sae-lens on ``acts`` (``[N, d_model]``); returns the inference SAE.

    The trainer scales activations to an average norm of ``sqrt(d_model)`` and
    folds the scale into the weights at the end (sae-lens's
    ``expected_average_only_in``), so the returned SAE reads raw residuals.
    """
    import torch

    sl = sae_lens()
    from sae_lens.config import SAETrainerConfig

    if acts.ndim != 2 or acts.shape[0] < settings.batch_size:
        raise DataError(
            f"need at least one batch ({settings.batch_size} rows) of activations, got {acts.shape}"
        )
    torch.manual_seed(settings.seed)
    d_in = int(acts.shape[1])
    cfg = sl.TopKTrainingSAEConfig(
        d_in=d_in,
        d_sae=settings.expansion * d_in,
        k=settings.k,
        normalize_activations="expected_average_only_in",
        device="cpu",
        dtype="float32",
    )
    sae = sl.TopKTrainingSAE(cfg)
    n_steps = max(1, settings.training_tokens // settings.batch_size)
    trainer_cfg = SAETrainerConfig(
        total_training_samples=n_steps * settings.batch_size,
        train_batch_size_samples=settings.batch_size,
        lr=settings.lr,
        lr_end=settings.lr / 10,
        lr_warm_up_steps=min(100, n_steps // 10),
        lr_decay_steps=n_steps // 5,
        device="cpu",
        dead_feature_window=max(1, min(1000, n_steps // 4)),
        feature_sampling_window=max(1, min(2000, n_steps // 2)),
        logger=sl.LoggingConfig(log_to_wandb=False),
        n_batches_for_norm_estimate=min(100, max(1, acts.shape[0] // settings.batch_size)),
    )
    data = _batches(acts, settings.batch_size, settings.seed)
    if progress is not None:
        data = _counting(data, n_steps, progress)
    trainer = sl.SAETrainer(cfg=trainer_cfg, sae=sae, data_provider=data)
    trained = trainer.fit()
    return _to_inference(trained, settings.dtype)


def _counting(it: Iterator[Any], total: int, progress: Progress) -> Iterator[Any]:
    done = 0
    for item in it:
        yield item
        done += 1
        if done <= total:
            progress(done, total)


def _to_inference(trained: Any, dtype: str) -> Any:
    """The trainer's SAE as the plain inference class (via sae-lens's own save format)."""
    import tempfile

    sl = sae_lens()
    with tempfile.TemporaryDirectory() as tmp:
        trained.save_inference_model(tmp)
        sae = sl.SAE.load_from_disk(tmp, device="cpu")
    if dtype == "float16":
        import torch

        sae = sae.to(dtype=torch.float16)
    return sae.eval()


# --------------------------------------------------------------------------- loaded SAE


@dataclass(eq=False)
class LoadedSAE:
    """An SAE ready to encode one layer's residuals of one model.

    Attributes:
        sae: The sae-lens SAE (inference class).
        layer: The block whose ``resid_post`` it reads.
        model_key: :attr:`~core.engine.model.ModelInfo.key` of the model it was trained on
            (``None`` for registry SAEs: checked by ``d_in`` only).
        name: A short label (folder name or registry id).
        meta: The sidecar metadata (training data, settings, quality), if any.
        path: Where it was loaded from.
    """

    sae: Any
    layer: int
    model_key: str | None
    name: str
    meta: dict[str, Any] = field(default_factory=dict)
    path: Path | None = None

    @property
    def d_sae(self) -> int:
        return int(self.sae.cfg.d_sae)

    @property
    def d_in(self) -> int:
        return int(self.sae.cfg.d_in)

    @property
    def key(self) -> str:
        """Identity for caches: name + a hash of the weights' file (or the registry id)."""
        digest = self.meta.get("weights_sha256", "")
        return f"{self.name}:{digest[:12]}" if digest else self.name

    def check_model(self, model_key: str, d_model: int) -> None:
        """Refuse a model the SAE was not trained on."""
        if self.model_key is not None and self.model_key != model_key:
            raise ModelError(
                f"the SAE {self.name!r} was trained on {self.model_key!r}, not {model_key!r}; "
                "train one for this model with `ragscope sae train --model ...`"
            )
        if self.d_in != d_model:
            raise ModelError(
                f"the SAE {self.name!r} reads {self.d_in}-dim residuals; the model's are "
                f"{d_model}-dim"
            )

    def encode(
        self, x: Float[torch.Tensor, "n d_model"], activation: Activation = "post"
    ) -> Float[torch.Tensor, "n d_sae"]:
        """Feature activations of residual rows (float32 CPU); see the module docstring."""
        import torch

        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
        sae = self.sae
        dt = sae.W_enc.dtype
        with torch.inference_mode():
            xin = x.to(sae.W_enc.device, dt)
            if activation == "post":
                out = sae.encode(xin)
            else:
                out = torch.relu(sae.process_sae_in(xin) @ sae.W_enc + sae.b_enc)
        return out.to("cpu", torch.float32)

    def decode(self, f: Float[torch.Tensor, "n d_sae"]) -> Float[torch.Tensor, "n d_model"]:
        """Reconstruction of residual rows from (post) feature activations, float32 CPU."""
        import torch

        sae = self.sae
        with torch.inference_mode():
            out = sae.decode(f.to(sae.W_dec.device, sae.W_dec.dtype))
        return out.to("cpu", torch.float32)

    def direction(self, feature: int) -> Float[torch.Tensor, " d_model"]:
        """Decoder direction of one feature (float32 CPU)."""
        import torch

        if not 0 <= feature < self.d_sae:
            raise ValueError(f"feature {feature} is outside 0..{self.d_sae - 1}")
        return self.sae.W_dec[feature].detach().to("cpu", torch.float32)


def save_sae(
    sae: Any, folder: str | Path, *, layer: int, model_key: str, meta: Mapping[str, Any]
) -> Path:
    """Write ``sae`` in sae-lens format plus :data:`META_FILE` (with the weights' hash)."""
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    weights, _cfg = sae.save_model(out)
    record = {
        "version": META_VERSION,
        "model": model_key,
        "layer": int(layer),
        "hook": hook_name(layer),
        "weights_sha256": sha256_file(Path(weights)),
        **dict(meta),
    }
    (out / META_FILE).write_text(json.dumps(record, indent=2, default=json_default) + "\n")
    return out


SAE_JSON_LIMIT = 4 * MiB


def _checked_sae_files(path: Path) -> dict[str, Any]:
    """Check what loading an SAE folder reads, before sae-lens reads it: ``cfg.json``
    and :data:`META_FILE` are bounded JSON objects, ``sae_weights.safetensors`` is a
    plain file (no symlink, FIFO, ...) whose SHA-256 matches the one :data:`META_FILE`
    records. sae-lens reads only these (JSON and safetensors; no pickle). Returns the
    sidecar (empty when absent: a plain sae-lens folder).

    Raises:
        DataError: A file is missing, not a plain file, oversized, not a JSON object,
            or the weights do not match the recorded hash.
    """
    retrain = "retrain it with `ragscope sae train`"
    docs: dict[str, dict[str, Any]] = {}
    for name in ("cfg.json", META_FILE):
        f = path / name
        if name == META_FILE and not f.exists():
            docs[name] = {}
            continue
        value = read_json_file(f, SAE_JSON_LIMIT, what=f"SAE {name}", follow_symlinks=False)
        if not isinstance(value, dict):
            raise DataError(f"must hold a JSON object; {retrain}", source=str(f))
        docs[name] = value
    weights = path / "sae_weights.safetensors"
    if not weights.exists():
        raise DataError(f"sae_weights.safetensors is missing; {retrain}", source=str(path))
    regular_file(weights, follow_symlinks=False)
    meta = docs[META_FILE]
    digest = meta.get("weights_sha256")
    if digest is not None and sha256_file(weights) != digest:
        raise DataError(
            f"sae_weights.safetensors does not match the SHA-256 recorded in {META_FILE} "
            f"(damaged or edited since it was written); {retrain}",
            source=str(path),
        )
    return meta


def load_sae(folder: str | Path) -> LoadedSAE:
    """Load an SAE saved by :func:`save_sae` (or any sae-lens folder with our sidecar).

    Raises:
        DataError: The folder is missing, incomplete or malformed (names the fix).
    """
    path = Path(folder)
    if not (path / "cfg.json").is_file():
        raise DataError(
            "no SAE here (cfg.json is missing); train one with `ragscope sae train`",
            source=str(path),
        )
    meta = _checked_sae_files(path)
    try:
        # float32 in memory whatever the stored dtype (fp16 on disk halves the repo size).
        sae = sae_lens().SAE.load_from_disk(str(path), device="cpu").float().eval()
    except (OSError, ValueError, KeyError, TypeError, RuntimeError) as e:
        raise DataError(
            f"malformed SAE folder ({brief(e)}); retrain it with `ragscope sae train`",
            source=str(path),
        ) from e
    layer = meta.get("layer")
    if layer is None:
        layer = _layer_from_hook(str(sae.cfg.metadata.hook_name or ""), source=str(path))
    return LoadedSAE(
        sae=sae,
        layer=int(layer),
        model_key=meta.get("model"),
        name=path.name,
        meta=meta,
        path=path,
    )


def _layer_from_hook(hook: str, *, source: str) -> int:
    parts = hook.split(".")
    if len(parts) >= 3 and parts[0] == "blocks" and parts[1].isdigit() and "resid" in parts[2]:
        return int(parts[1])
    raise DataError(
        f"cannot tell which layer the SAE reads (hook {hook!r}); ragscope needs a "
        "blocks.<layer>.hook_resid_* SAE",
        source=source,
    )


def load_pretrained(release: str, sae_id: str) -> LoadedSAE:
    """An SAE from sae-lens's registry (``SAE.from_pretrained``), for bigger public models.

    Offline (``HF_HUB_OFFLINE=1``, or no network) this fails with a clear error instead
    of hanging on a download.
    """
    sl = sae_lens()
    try:
        sae = sl.SAE.from_pretrained(release, sae_id, device="cpu")
    except Exception as e:  # network, unknown release, missing file: one clear message
        raise ModelError(
            f"could not load the pretrained SAE {release}/{sae_id} ({type(e).__name__}: "
            f"{str(e)[:200]}); registry SAEs need network access the first time (then they "
            "are cached); offline, train one with `ragscope sae train`"
        ) from e
    hook = str(sae.cfg.metadata.hook_name or "")
    layer = _layer_from_hook(hook, source=f"{release}/{sae_id}")
    return LoadedSAE(sae=sae.eval(), layer=layer, model_key=None, name=f"{release}/{sae_id}")


# --------------------------------------------------------------------------- quality


@dataclass(frozen=True, kw_only=True)
class SaeQuality:
    """How well an SAE reconstructs held-out residuals (``ragscope sae eval``).

    Attributes:
        fve: Fraction of variance explained, ``1 - SSE / SST`` over all tokens (SST
            around the per-dimension mean).
        mean_l0: Mean number of active features per token.
        dead_fraction: Features that never fired on the held-out tokens.
        ce_clean: Mean next-token cross-entropy (nats) of the plain model.
        ce_spliced: The same with the SAE's reconstruction in place of the residual
            (every position but the first).
        ce_zero: The same with the residual zero-ablated (the scale of ``ce_increase``).
        n_examples: Held-out examples read.
        n_tokens: Residual rows evaluated.
    """

    fve: float
    mean_l0: float
    dead_fraction: float
    ce_clean: float
    ce_spliced: float
    ce_zero: float
    n_examples: int
    n_tokens: int

    @property
    def ce_increase(self) -> float:
        return self.ce_spliced - self.ce_clean

    @property
    def ce_recovered(self) -> float:
        """``1 - (ce_spliced - ce_clean) / (ce_zero - ce_clean)`` (1 = lossless)."""
        denom = self.ce_zero - self.ce_clean
        return 1.0 - self.ce_increase / denom if denom > 0 else float("nan")

    def to_dict(self) -> dict[str, float | int]:
        return {
            **asdict(self),
            "ce_increase": self.ce_increase,
            "ce_recovered": self.ce_recovered,
        }

    def to_text(self) -> str:
        return (
            f"held-out: {self.n_examples} examples, {self.n_tokens} tokens\n"
            f"fraction of variance explained  {self.fve:.4f}\n"
            f"mean L0 (active features/token) {self.mean_l0:.1f}\n"
            f"dead features                   {100 * self.dead_fraction:.2f}%\n"
            f"next-token CE clean / spliced   {self.ce_clean:.4f} / {self.ce_spliced:.4f} nats "
            f"(+{self.ce_increase:.4f}; zero-ablated {self.ce_zero:.4f}; "
            f"{100 * self.ce_recovered:.1f}% of the loss recovered)"
        )


def _ce(logits: torch.Tensor, ids: torch.Tensor) -> tuple[float, int]:
    """Summed next-token cross-entropy (nats) over positions 1.. and the count."""
    import torch

    lp = torch.log_softmax(logits[0, :-1].double(), dim=-1)
    nll = -lp.gather(1, ids[0, 1:, None]).squeeze(1)
    return float(nll.sum()), int(nll.numel())


def _eval_one(
    model: LoadedModel, sae: LoadedSAE, ids: torch.Tensor, name: str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, dict[str, float], int]:
    """One example: residuals, features, reconstruction, summed CE per variant, CE count."""
    import torch

    store: dict[str, torch.Tensor] = {}

    def capture(act: torch.Tensor, hook: object) -> None:
        store["x"] = act[0, 1:].detach().to("cpu", torch.float32)

    def splice(act: torch.Tensor, hook: object) -> torch.Tensor:
        out = act.clone()
        out[0, 1:] = store["rec"].to(act.device, act.dtype)
        return out

    def zero(act: torch.Tensor, hook: object) -> torch.Tensor:
        out = act.clone()
        out[0, 1:] = 0
        return out

    with model.lock, torch.inference_mode():
        clean = hooked_logits(model, ids, [(name, capture)])
        f = sae.encode(store["x"])
        store["rec"] = sae.decode(f)
        spliced = hooked_logits(model, ids, [(name, splice)])
        zeroed = hooked_logits(model, ids, [(name, zero)])
    sums: dict[str, float] = {}
    count = 0
    for key, logits in (("clean", clean), ("spliced", spliced), ("zero", zeroed)):
        sums[key], count = _ce(logits.cpu(), ids.cpu())
    return store["x"], f, store["rec"], sums, count


def evaluate_sae(
    model: LoadedModel,
    sae: LoadedSAE,
    examples: Sequence[RAGExample],
    *,
    max_tokens: int | None = None,
    progress: Progress | None = None,
) -> SaeQuality:
    """Measure ``sae`` on ``examples`` (see :class:`SaeQuality`)."""
    import torch

    sae.check_model(model.info.key, model.info.d_model)
    name = hook_name(sae.layer)
    d_sae = sae.d_sae
    fired = torch.zeros(d_sae, dtype=torch.bool)
    sse = 0.0
    s1 = torch.zeros(sae.d_in, dtype=torch.float64)
    s2 = torch.zeros(sae.d_in, dtype=torch.float64)
    n_tok = l0_sum = 0
    ce = {"clean": 0.0, "spliced": 0.0, "zero": 0.0}
    ce_n = 0
    n_ex = 0
    for i, ex in enumerate(examples):
        ids = torch.as_tensor(example_ids(model, ex), device=model.device).unsqueeze(0)
        x, f, rec, sums, count = _eval_one(model, sae, ids, name)
        for key, total in sums.items():
            ce[key] += total
        ce_n += count
        xd = x.double()
        sse += float(((xd - rec.double()) ** 2).sum())
        s1 += xd.sum(0)
        s2 += (xd**2).sum(0)
        active = f > 0
        fired |= active.any(0)
        l0_sum += int(active.sum())
        n_tok += x.shape[0]
        n_ex += 1
        if progress:
            progress(i + 1, len(examples))
        if max_tokens is not None and n_tok >= max_tokens:
            break
    if n_tok == 0:
        raise DataError("no held-out tokens to evaluate the SAE on")
    sst = float((s2 - s1**2 / n_tok).sum())
    return SaeQuality(
        fve=1.0 - sse / sst if sst > 0 else float("nan"),
        mean_l0=l0_sum / n_tok,
        dead_fraction=float((~fired).float().mean()),
        ce_clean=ce["clean"] / ce_n,
        ce_spliced=ce["spliced"] / ce_n,
        ce_zero=ce["zero"] / ce_n,
        n_examples=n_ex,
        n_tokens=n_tok,
    )


# --------------------------------------------------------------------------- recipe


def corpus_record(corpus: SaeCorpus) -> dict[str, Any]:
    """What :data:`META_FILE` records about the training text."""
    return {
        "sources": [asdict(s) for s in corpus.sources],
        "skipped": list(corpus.skipped),
        "held_out_rule": f"sha256(source_key) % {HELD_OUT_MOD} == 0",
        "n_train_examples": len(corpus.train),
        "n_held_out_examples": len(corpus.held_out),
    }


def cached_activations(
    model: LoadedModel,
    corpus: SaeCorpus,
    layer: int,
    *,
    progress: Progress | None = None,
    log: Callable[[str], None] = lambda m: None,
) -> np.ndarray:
    """:func:`collect_activations` of the corpus's training part, kept in the cache folder.

    Keyed by model, layer and the sources' content hashes, so a retraining with
    other settings skips the (long) collection.
    """

    key = hashlib.sha256(
        json.dumps(
            [model.info.key, layer, [s.content_sha256 for s in corpus.sources]], sort_keys=True
        ).encode("utf-8")
    ).hexdigest()[:16]
    path = cache_dir() / "sae" / f"acts-{key}.npy"
    if path.is_file():
        log(f"activations from the cache: {path}")
        return np.load(path, mmap_mode="r")
    acts = collect_activations(model, corpus.train, layer, progress=progress)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.npy")
    np.save(tmp, acts)
    tmp.replace(path)
    return acts


def train_and_save(
    model: LoadedModel,
    out: str | Path,
    settings: SaeSettings,
    *,
    sources: Sequence[str] = DEFAULT_SOURCES,
    eval_tokens: int | None = 100_000,
    log: Callable[[str], None] = lambda m: None,
    progress: Callable[[str], Progress | None] = lambda desc: None,
) -> tuple[LoadedSAE, SaeQuality]:
    """The whole ``ragscope sae train``: corpus, activations, training, evaluation, save."""
    t0 = time.perf_counter()
    layer = settings.layer if settings.layer is not None else default_layer(model.info.n_layers)
    if not 0 <= layer < model.info.n_layers:
        raise ValueError(f"layer {layer} is outside 0..{model.info.n_layers - 1}")
    corpus = sae_corpus(sources)
    log(
        f"corpus: {len(corpus.train)} training and {len(corpus.held_out)} held-out examples "
        f"from {', '.join(s.name for s in corpus.sources)}"
        + (f" (absent, skipped: {', '.join(corpus.skipped)})" if corpus.skipped else "")
    )
    acts = cached_activations(model, corpus, layer, progress=progress("activations"), log=log)
    t_collect = time.perf_counter() - t0
    log(f"activations: {acts.shape[0]} tokens x {acts.shape[1]} at {hook_name(layer)}")
    sae = train_sae(acts, settings, progress=progress("training"))
    t_train = time.perf_counter() - t0 - t_collect
    loaded = LoadedSAE(sae=sae, layer=layer, model_key=model.info.key, name=Path(out).name)
    quality = evaluate_sae(
        model, loaded, corpus.held_out, max_tokens=eval_tokens, progress=progress("evaluation")
    )
    meta = {
        "architecture": "topk",
        "settings": asdict(dataclasses.replace(settings, layer=layer)),
        "corpus": corpus_record(corpus),
        "activation_tokens": int(acts.shape[0]),
        "training_passes": settings.training_tokens / acts.shape[0],
        "quality": quality.to_dict(),
        "seconds": {
            "collect": t_collect,
            "train": t_train,
            "total": time.perf_counter() - t0,
        },
        "libraries": _versions(),
    }
    save_sae(sae, out, layer=layer, model_key=model.info.key, meta=meta)
    return load_sae(out), quality


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for pkg in ("sae-lens", "torch", "transformer-lens"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = "?"
    return out
