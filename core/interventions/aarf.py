"""AARF: ReDeEP's generation-time mitigation (``specs/redeep.md``, "AARF mitigation").

Greedy decoding that watches itself. At every step the token-level ReDeEP
score of the position that produces the next token is read by hooks on the
pass that produces that token. Decoding is incremental: each step runs only
the new token through the model against the KV cache of the sequence so far
(the hooks see the new position's attention row over every key and its
residuals), so a step costs about one greedy decoding step:

- ECS of each of the detector's candidate copying heads at that position
  against the passage positions (the same math as
  :func:`core.signals.ecs.token_ecs`, through :func:`core.signals.ecs.ecs_rows`); the
  passages' final hidden states are read once per answer, since causal
  attention never changes them;
- PKS of every layer at that position (:func:`core.signals.lens.layer_jsd`).

The row goes through the fitted detector exactly as a response token's row
does in :meth:`~core.detectors.redeep.RedeepDetector.predict`: ``H = PKS_n -
beta * ECS_n`` and the detector's calibrated probability. When the score
exceeds ``tau`` the step is redone under :func:`scaled_components` (the
selected copying heads' outputs times ``alpha2``, the selected layers' MLP
outputs times ``beta2``) and the token is taken from those logits. The scaled
model keeps its own KV cache, since scaling changes every later position's keys
and values: an intervened step runs the scaled model only over the tokens its
cache lacks (the whole prompt at the first intervention, then the tokens since
the previous one), which equals re-running the whole sequence scaled.
``kv_cache=False`` re-runs the whole sequence at every step instead, the
reference the cached path is tested against.

Which scale ``tau`` is on: by default the detector's calibrated probability
(in [0, 1], the scale of its ``threshold_``, which is also the default
``tau``); with ``score="h"`` the raw ``H`` on the detector's min-max
normalised scale (the paper's statement), where ``tau`` must be given. A
step intervenes when ``score > tau`` (strictly), so ``tau=1.0`` on the
probability scale never intervenes and a negative ``tau`` always does.

:class:`StepScorer` is that per-step reading on its own (for live displays);
:func:`rescore_answers` reads several answers to the same prompt with any
fitted detectors (the before/after comparison the spec asks for).
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from core.base.errors import DataError, ModelError
from core.base.examples import RAGExample, Task
from core.detectors import DETECTORS
from core.detectors.common import parse_head
from core.engine.generate import AnswerStream, Generation, GenerationConfig, StopReason, stop_ids
from core.engine.layout import encode_prompt, prompt_pieces
from core.engine.model import LoadedModel, decode
from core.engine.trace import Needs, hooked_logits, hooked_step, patched
from core.learning.contract import Detector, require_fitted
from core.pipeline.extract import run_example
from core.signals.ecs import ecs_rows, top_k
from core.signals.lens import layer_jsd

if TYPE_CHECKING:
    import pandas as pd
    import torch
    from jaxtyping import Bool, Float, Int

Head = tuple[int, int]
ScoreScale = Literal["probability", "h"]
SCORE_SCALES: tuple[str, ...] = ("probability", "h")

DEFAULT_ALPHA2 = 5.0
DEFAULT_BETA2 = 0.2
DEFAULT_MAX_NEW_TOKENS = 64


# --------------------------------------------------------------------------- intervention


def _check_scales(alpha2: float, beta2: float) -> None:
    if not (np.isfinite(alpha2) and alpha2 > 0):
        raise ValueError(f"alpha2 must be a finite number > 0, got {alpha2!r}")
    if not (np.isfinite(beta2) and beta2 > 0):
        raise ValueError(f"beta2 must be a finite number > 0, got {beta2!r}")


def _check_components(
    model: LoadedModel, heads: Iterable[Head], layers: Iterable[int]
) -> tuple[dict[int, list[int]], list[int]]:
    """Heads grouped by layer and the sorted layers, each checked against the model."""
    n_layers, n_heads = model.info.n_layers, model.info.n_heads
    by_layer: dict[int, list[int]] = {}
    for pair in heads:
        layer, head = (int(x) for x in pair)
        if not 0 <= layer < n_layers:
            raise ValueError(f"head {pair!r}: layer {layer} is outside 0..{n_layers - 1}")
        if not 0 <= head < n_heads:
            raise ValueError(f"head {pair!r}: head {head} is outside 0..{n_heads - 1}")
        if head not in by_layer.setdefault(layer, []):
            by_layer[layer].append(head)
    out_layers: set[int] = set()
    for layer in layers:
        if not 0 <= int(layer) < n_layers:
            raise ValueError(f"layer {layer!r} is outside 0..{n_layers - 1}")
        out_layers.add(int(layer))
    return by_layer, sorted(out_layers)


@contextlib.contextmanager
def scaled_components(
    model: LoadedModel,
    heads: Iterable[Head],
    layers: Iterable[int],
    *,
    alpha2: float,
    beta2: float,
) -> Iterator[None]:
    """Scale some heads' and MLPs' outputs on every forward pass inside the block.

    Each selected query head's slice of ``hook_z`` (its attention-weighted
    values, ``[batch, pos, head, d_head]``) is multiplied by ``alpha2``, so its
    contribution through ``W_O`` to the residual stream scales by ``alpha2``;
    each selected layer's ``hook_mlp_out`` is multiplied by ``beta2``. The
    hooks are removed on exit, also when the block raises, and hooks attached
    by others are left alone. The model's lock is held for the whole block, so
    other threads never run a forward pass with these hooks on (the lock is
    re-entrant: forward passes inside the block run as usual).

    Args:
        model: The loaded model.
        heads: ``(layer, query head)`` pairs to scale (duplicates count once).
        layers: Layers whose MLP output is scaled.
        alpha2: Factor on the heads (> 0; the paper's intent is > 1).
        beta2: Factor on the MLPs (> 0; the paper's intent is < 1).

    Raises:
        ValueError: a factor is not positive, or a head or layer is not in the model.
    """
    import torch

    _check_scales(alpha2, beta2)
    by_layer, mlp_layers = _check_components(model, heads, layers)
    n_heads = model.info.n_heads

    def head_scaler(scale: torch.Tensor):  # noqa: ANN202
        def hook(act: torch.Tensor, hook: object) -> torch.Tensor:
            if act.ndim != 4 or act.shape[2] != n_heads:
                raise ModelError(
                    f"hook_z has shape {tuple(act.shape)}, not [batch, pos, {n_heads}, d_head]; "
                    "per-head scaling is not supported for this model"
                )
            return act * scale.to(act.device, act.dtype)[:, None]

        return hook

    def mlp_hook(act: torch.Tensor, hook: object) -> torch.Tensor:
        return act * beta2

    fwd: list[tuple[str, Any]] = []
    for layer, hs in sorted(by_layer.items()):
        scale = torch.ones(n_heads)
        scale[hs] = float(alpha2)
        (name,) = Needs.of(["z"], layers=[layer]).hook_names()
        fwd.append((name, head_scaler(scale)))
    if mlp_layers:
        fwd += [(name, mlp_hook) for name in Needs.of(["mlp_out"], layers=mlp_layers).hook_names()]
    with patched(model, fwd):
        yield


# --------------------------------------------------------------------------- prompts


@dataclass(frozen=True, kw_only=True)
class AnswerPrompt:
    """What to answer: the question and passages, without a response.

    Attributes:
        passages: The retrieved passages (at least one non-empty).
        question: The question (optional for summary / data2txt).
        task: Selects ragscope's prompt wording.
        prompt: A verbatim prompt that contains the question and passages.
        id: Name used for the examples built from it (re-scoring).
    """

    passages: tuple[str, ...]
    question: str | None = None
    task: Task = "qa"
    prompt: str | None = None
    id: str = "prompt"

    def __post_init__(self) -> None:
        object.__setattr__(self, "passages", tuple(self.passages))
        if not self.passages or not any(p.strip() for p in self.passages):
            raise DataError("give at least one non-empty passage to answer from", field="passages")

    @classmethod
    def from_example(cls, example: RAGExample) -> AnswerPrompt:
        """The prompt of ``example`` (its response is ignored)."""
        return cls(
            passages=example.passages,
            question=example.question,
            task=example.task,
            prompt=example.prompt,
            id=example.id,
        )

    def example(self, response: str, *, id: str | None = None) -> RAGExample:
        """An unlabelled example with ``response`` as its answer."""
        return RAGExample(
            id=id or self.id,
            task=self.task,
            question=self.question,
            passages=self.passages,
            response=response,
            prompt=self.prompt,
        )


def _as_prompt(example_or_prompt: RAGExample | AnswerPrompt) -> AnswerPrompt:
    if isinstance(example_or_prompt, AnswerPrompt):
        return example_or_prompt
    if isinstance(example_or_prompt, RAGExample):
        return AnswerPrompt.from_example(example_or_prompt)
    raise TypeError(
        f"expected a RAGExample or an AnswerPrompt, got {type(example_or_prompt).__name__}"
    )


# --------------------------------------------------------------------------- scoring a step


@dataclass(frozen=True, kw_only=True, eq=False)
class StepScore:
    """The token-level ReDeEP reading of one decoding step.

    Attributes:
        logits: ``[d_vocab]`` float32 CPU next-token logits of the un-intervened pass.
        ecs: ``[candidate head]`` ECS of the detector's candidate heads (``names_`` order).
        pks: ``[layer]`` PKS of the detector's layers (``names_`` order).
        h: ``PKS_n - beta * ECS_n``.
        probability: The detector's calibrated probability of ``h``.
    """

    logits: Float[torch.Tensor, " d_vocab"]
    ecs: Float[np.ndarray, " head"]
    pks: Float[np.ndarray, " layer"]
    h: float
    probability: float


class StepScorer:
    """Scores the position that produces the next answer token, one forward pass per call.

    Reads a growing answer to one prompt: call it with the answer's tokens so
    far and it returns the next-token logits and the detector's reading of
    that position, exactly as the detector reads a response token given as
    text (:meth:`~core.detectors.redeep.RedeepDetector.predict`). The
    context's final hidden states are read on the first call and reused.

    Args:
        model: The loaded model the detector was fitted on.
        detector: A fitted ``redeep_token`` detector.
        example_or_prompt: What is being answered.

    Attributes:
        prompt_ids: The prompt's tokens (laid out as :func:`core.engine.layout.render` does).
        context: Absolute positions ECS ranks (the passages, or the whole
            prompt with the detector's ``ecs_scope="prompt"``).
        heads: The detector's candidate heads, in feature order.
        pks_layers: The detector's PKS layers, in feature order.
    """

    def __init__(
        self,
        model: LoadedModel,
        detector: Any,
        example_or_prompt: RAGExample | AnswerPrompt,
        *,
        kv_cache: bool = True,
    ) -> None:

        _check_detector(detector, model)
        self.model = model
        self.detector = detector
        self.prompt = _as_prompt(example_or_prompt)
        p = self.prompt
        pieces = prompt_pieces(
            task=p.task, question=p.question, passages=p.passages, prompt=p.prompt, source=p.id
        )
        ids, segments = encode_prompt(model.tokenizer, pieces)
        self.prompt_ids: tuple[int, ...] = tuple(ids)
        cfg = detector.config
        self.context = _context_positions(segments, len(ids), cfg.ecs_scope)
        names: tuple[str, ...] = detector.names_
        self.heads = [parse_head(n) for n in names if n.startswith("ECS_")]
        self.pks_layers = [int(n.removeprefix("PKS_L")) for n in names if n.startswith("PKS_")]
        if len(self.heads) + len(self.pks_layers) != len(names):
            raise DataError(
                f"{detector.name}: unexpected feature names {list(names)[:4]}...; "
                "AARF reads ECS_L*H* and PKS_L* features"
            )
        _check_components(model, self.heads, self.pks_layers)
        self.final_norm = bool(cfg.pks_final_norm)
        self.k = top_k(self.context.size, cfg.topk_frac) if self.context.size else 0
        self._x_ctx: torch.Tensor | None = None
        self._by_layer: dict[int, list[int]] = {}
        for col, (layer, _) in enumerate(self.heads):
            self._by_layer.setdefault(layer, []).append(col)
        needs = Needs.of(["ln_final"])
        if self._by_layer and self.context.size:
            needs = needs | Needs.of(["pattern"], layers=sorted(self._by_layer))
        if self.pks_layers:
            needs = needs | Needs.of(["resid_mid", "resid_post"], layers=self.pks_layers)
        self._names = needs.hook_names()
        self.kv_cache = kv_cache
        self._past: Any = None  # the KV cache of the tokens in self._seen
        self._seen: tuple[int, ...] = ()
        self._last: StepScore | None = None

    def __call__(self, answer_ids: Sequence[int] = ()) -> StepScore:
        """Score the step after ``answer_ids`` (the answer's tokens so far).

        With ``kv_cache`` (the default), an answer that extends the one of the previous
        call runs only its new tokens through the model, attending to the cached keys and
        values of the rest; any other answer starts over from the prompt. Without it,
        every call runs the whole sequence (the reference the cached path is tested
        against: same tokens, scores equal to float rounding).
        """
        import torch

        model = self.model
        seq = (*self.prompt_ids, *(int(t) for t in answer_ids))
        if self.kv_cache and seq == self._seen and self._last is not None:
            return self._last
        extend = self.kv_cache and self._past is not None and seq[: len(self._seen)] == self._seen
        start = len(self._seen) if extend else 0
        store: dict[tuple[str, int | None], torch.Tensor] = {}
        ctx_t = torch.as_tensor(self.context)
        # The context's final hidden states come from a pass that starts at position 0.
        first = self._x_ctx is None and self.context.size > 0 and start == 0
        ctx_dev = ctx_t.to(model.device)

        def saver(key: tuple[str, int | None]):  # noqa: ANN202
            # Float32 CPU copies, as core.engine.trace keeps them: the detector's
            # features were computed from exactly such copies.
            def save(act: torch.Tensor, hook: object) -> None:
                a = act[0]
                if key[0] == "pattern":
                    store[key] = a[:, -1, :].detach().to("cpu", torch.float32)  # [head, key]
                    return
                store[key] = a[-1:].detach().to("cpu", torch.float32)  # [1, d_model]
                if key[0] == "ln_final" and first:
                    ctx_rows = a.index_select(0, ctx_dev)
                    store[("ln_ctx", None)] = ctx_rows.detach().to("cpu", torch.float32)

            return save

        x = torch.as_tensor([seq[start:]], device=model.device)
        hooks = [(name, saver(key)) for name, key in self._names.items()]
        if self.kv_cache:
            # Forget the old state first: a failed pass may have half-extended the cache.
            past = self._past if extend else None
            self._past, self._seen, self._last = None, (), None
            logits, past = hooked_step(model, x, hooks, past)
            self._past, self._seen = past, seq
        else:
            logits = hooked_logits(model, x, hooks)
        last = logits[0, -1].float().cpu()
        missing = [n for n, key in self._names.items() if key not in store]
        if missing:
            raise ModelError(f"hooks did not fire on {model.info.display_name}: {missing[:5]}")
        if first:
            self._x_ctx = store[("ln_ctx", None)].double()

        ecs = np.zeros(len(self.heads), dtype=np.float32)
        if self._x_ctx is not None:
            x_g = store[("ln_final", None)].double()
            for layer, cols in self._by_layer.items():
                hs = torch.as_tensor([self.heads[c][1] for c in cols])
                a = store[("pattern", layer)][hs][:, None, :][:, :, ctx_t]  # [h, 1, ctx]
                ecs[cols] = ecs_rows(a, self._x_ctx, x_g, self.k)[:, 0].numpy().astype(np.float32)
        pks = np.zeros(len(self.pks_layers), dtype=np.float32)
        if self.pks_layers:
            mid = [store[("resid_mid", ly)] for ly in self.pks_layers]
            post = [store[("resid_post", ly)] for ly in self.pks_layers]
            # float32 divergences, as the detector's own PKS features are computed.
            pks = layer_jsd(model, mid, post, final_norm=self.final_norm, precision="float32")[:, 0]
        # The same float32 row a teacher-forced Features would hold for this token.
        row = np.concatenate([ecs, pks])[None, :].astype(np.float64)
        det = self.detector
        h = det.unit_h(row)
        e_n, p_n = det.selection_.sums(row[:, : len(self.heads)], row[:, len(self.heads) :])
        prob = det.probability(h, e_n, p_n)
        self._last = StepScore(
            logits=last, ecs=ecs, pks=pks, h=float(h[0]), probability=float(prob[0])
        )
        return self._last


def _check_detector(detector: Any, model: LoadedModel) -> None:

    name = getattr(detector, "name", type(detector).__name__)
    if getattr(detector, "level", None) != "token" or not hasattr(detector, "unit_h"):
        raise ValueError(
            f"AARF needs a fitted token-level ReDeEP detector (redeep_token), got {name!r}"
        )
    require_fitted(detector, "selection_", name)
    key = getattr(detector, "model_key_", None)
    if key and key != model.info.key:
        raise ModelError(
            f"{name} was trained on {key!r}, not on the loaded {model.info.key!r}; "
            "load the model it was made for or retrain it on this one"
        )


def _context_positions(segments: Sequence[Any], n_prompt: int, scope: str) -> np.ndarray:
    if scope == "prompt":
        return np.arange(n_prompt, dtype=np.int64)
    if scope == "passages":
        parts = [np.arange(s.start, s.end) for s in segments if s.kind == "passage"]
        return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, dtype=np.int64)
    raise ValueError(f"unknown ECS scope {scope!r}; use 'passages' or 'prompt'")


# --------------------------------------------------------------------------- generation


@dataclass(frozen=True, kw_only=True, eq=False)
class AARFResult:
    """An AARF answer, step by step, with the plain greedy answer beside it.

    A step is one decoding step: the position that produces the next token.
    When decoding stopped on an end-of-sequence token, the last step is the
    one that chose it (its token is not part of :attr:`text`).

    Attributes:
        prompt: What was answered.
        text: The AARF answer.
        token_ids: Its tokens (the stop token excluded).
        stop: ``"eos"`` or ``"max_tokens"``.
        h: ``[step]`` token-level ``H`` of each step (un-intervened forward pass).
        probability: ``[step]`` the detector's calibrated probability of ``h``.
        intervened: ``[step]`` whether the step was redone under the scaling.
        step_tokens: ``[step]`` the token each step chose (the stop token included).
        base_tokens: ``[step]`` the greedy token of the un-intervened logits
            (equals ``step_tokens`` on steps that did not intervene).
        score_scale: Which of ``h`` / ``probability`` was compared with ``tau``.
        tau: The threshold used.
        alpha2: Factor on the selected copying heads.
        beta2: Factor on the selected layers' MLPs.
        heads: The scaled ``(layer, head)`` pairs (the detector's selected heads).
        layers: The layers whose MLPs were scaled (the detector's selected layers).
        detector: Name of the scoring detector.
        plain: The plain greedy answer to the same prompt (``None`` if not asked).
        seconds: Wall time of the AARF decoding (the plain answer excluded).
        step_logits: ``[step, d_vocab]`` the logits each token was taken from
            (only with ``keep_logits=True``).
        base_logits: ``[step, d_vocab]`` the un-intervened logits of each step
            (only with ``keep_logits=True``).
    """

    prompt: AnswerPrompt
    text: str
    token_ids: tuple[int, ...]
    stop: StopReason
    h: Float[np.ndarray, " step"]
    probability: Float[np.ndarray, " step"]
    intervened: Bool[np.ndarray, " step"]
    step_tokens: Int[np.ndarray, " step"]
    base_tokens: Int[np.ndarray, " step"]
    score_scale: ScoreScale
    tau: float
    alpha2: float
    beta2: float
    heads: tuple[Head, ...]
    layers: tuple[int, ...]
    detector: str
    plain: Generation | None
    seconds: float
    step_logits: Float[np.ndarray, "step d_vocab"] | None = None
    base_logits: Float[np.ndarray, "step d_vocab"] | None = None

    @property
    def scores(self) -> Float[np.ndarray, " step"]:
        """The per-step score on ``tau``'s scale (:attr:`score_scale`)."""
        return self.probability if self.score_scale == "probability" else self.h

    @property
    def n_steps(self) -> int:
        return int(self.intervened.shape[0])

    @property
    def n_intervened(self) -> int:
        return int(self.intervened.sum())

    @property
    def plain_text(self) -> str | None:
        return None if self.plain is None else self.plain.text

    @property
    def changed(self) -> bool:
        """Whether the AARF answer differs from the plain greedy one (False without it)."""
        return self.plain is not None and self.plain.token_ids != self.token_ids

    def answers(self) -> dict[str, str]:
        """``{"plain": ..., "aarf": ...}`` (without ``plain`` when it was not generated)."""
        out = {} if self.plain is None else {"plain": self.plain.text}
        out["aarf"] = self.text
        return out

    def rescore(self, model: LoadedModel, detectors: Sequence[Detector]) -> AnswerScores:
        """Both answers re-scored by every fitted detector (:func:`rescore_answers`)."""
        return rescore_answers(model, self.prompt, self.answers(), detectors)

    def to_frame(self, tokenizer: Any = None) -> pd.DataFrame:
        """One row per step: chosen and plain token, ``H``, probability, intervened."""
        import pandas as pd

        frame = pd.DataFrame(
            {
                "step": np.arange(self.n_steps),
                "token_id": self.step_tokens,
                "base_token_id": self.base_tokens,
                "h": self.h,
                "probability": self.probability,
                "intervened": self.intervened,
            }
        )
        if tokenizer is not None:
            frame.insert(2, "token", [tokenizer.decode([int(t)]) for t in self.step_tokens])
            frame.insert(4, "base_token", [tokenizer.decode([int(t)]) for t in self.base_tokens])
        return frame


@dataclass(frozen=True, kw_only=True)
class AARFOptions:
    """How :func:`aarf_generate` decodes and when it intervenes.

    Attributes:
        tau: Intervene when the step's score exceeds it. Default: the
            detector's ``threshold_`` (probability scale only).
        score: ``"probability"`` (the detector's calibrated probability, in
            [0, 1]; default) or ``"h"`` (``PKS_n - beta * ECS_n``).
        alpha2: Factor on the selected copying heads' outputs (paper: 5 on
            RAGTruth, 2 on Dolly).
        beta2: Factor on the selected layers' MLP outputs (paper: 0.2 / 0.5).
        max_new_tokens: Stop after this many tokens.
        plain: Also generate the plain greedy answer (:func:`core.engine.generate.generate`)
            for the before/after comparison.
        keep_logits: Keep every step's logits (``[step, d_vocab]``, for audits and tests).
        heads: Scale these ``(layer, head)`` instead of the detector's selected heads
            (the score still reads the detector's heads).
        layers: Scale these layers' MLPs instead of the detector's selected layers
            (``()`` scales none; e.g. leave out layer 0, whose MLP the token embeddings
            lean on).
        kv_cache: Decode incrementally (default): the plain model's KV cache serves the
            score of each step, which reads only the new position; an intervened step runs
            the scaled model over just the tokens its own cache lacks. ``False`` re-runs the
            whole sequence at every step (the reference: same tokens, scores equal to
            float rounding).
    """

    tau: float | None = None
    score: ScoreScale = "probability"
    alpha2: float = DEFAULT_ALPHA2
    beta2: float = DEFAULT_BETA2
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    plain: bool = True
    keep_logits: bool = False
    heads: Iterable[Head] | None = None
    layers: Iterable[int] | None = None
    kv_cache: bool = True


def aarf_generate(
    model: LoadedModel,
    example_or_prompt: RAGExample | AnswerPrompt,
    detector: Any,
    options: AARFOptions = AARFOptions(),
) -> AARFResult:
    """Greedy decoding with AARF (see the module docstring).

    Args:
        model: The loaded model the detector was fitted on.
        example_or_prompt: What to answer (an example's response is ignored).
        detector: A fitted ``redeep_token`` detector; its selected heads and
            layers are the ones scaled.
        options: The threshold, factors, length and components (:class:`AARFOptions`).

    Raises:
        ValueError: bad factors, ``tau``, ``score`` or detector.
        NotFittedError: the detector is not fitted.
        ModelError: the detector was trained on another model.
        DataError: the prompt cannot be laid out or is too long.
    """
    import torch

    score, alpha2, beta2 = options.score, options.alpha2, options.beta2
    max_new_tokens, kv_cache = options.max_new_tokens, options.kv_cache
    _check_detector(detector, model)
    _check_scales(alpha2, beta2)
    if score not in SCORE_SCALES:
        raise ValueError(f"score must be one of {SCORE_SCALES}, got {score!r}")
    tau = options.tau
    if tau is None:
        if score != "probability":
            raise ValueError("give tau when score='h' (the detector's threshold is a probability)")
        tau = float(detector.threshold_)
    if not np.isfinite(tau):
        raise ValueError(f"tau must be a finite number, got {tau!r}")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    prompt = _as_prompt(example_or_prompt)
    heads = tuple(
        (int(a), int(b))
        for a, b in (detector.selected_heads if options.heads is None else options.heads)
    )
    layers = tuple(
        int(x) for x in (detector.selected_layers if options.layers is None else options.layers)
    )
    _check_components(model, heads, layers)

    baseline = None
    if options.plain:
        stream = AnswerStream(
            model,
            task=prompt.task,
            question=prompt.question,
            passages=prompt.passages,
            prompt=prompt.prompt,
            config=GenerationConfig(max_new_tokens=max_new_tokens),
        )
        for _ in stream:
            pass
        baseline = stream.result()

    scorer = StepScorer(model, detector, prompt, kv_cache=kv_cache)
    scaled_past: Any = None  # KV cache of the scaled model over seq[:scaled_len]
    scaled_len = 0
    n_prompt = len(scorer.prompt_ids)
    if n_prompt + max_new_tokens > model.info.n_ctx:
        raise DataError(
            f"prompt of {n_prompt} tokens + {max_new_tokens} new tokens exceeds the "
            f"model's context of {model.info.n_ctx}; shorten the passages"
        )
    stops = stop_ids(model)

    answer: list[int] = []
    hs: list[float] = []
    probs: list[float] = []
    flags: list[bool] = []
    chosen: list[int] = []
    base: list[int] = []
    used_logits: list[np.ndarray] = []
    base_logits: list[np.ndarray] = []
    stop: StopReason = "max_tokens"
    t0 = time.perf_counter()
    for _ in range(max_new_tokens):
        s = scorer(answer)
        value = s.probability if score == "probability" else s.h
        logits = s.logits
        act = value > tau
        if act:
            seq = [*scorer.prompt_ids, *answer]
            with (
                scaled_components(model, heads, layers, alpha2=alpha2, beta2=beta2),
                torch.inference_mode(),
            ):
                if kv_cache:
                    # The scaled model's own cache, caught up over the tokens since
                    # its last intervened step (the whole prompt on the first one).
                    x = torch.as_tensor([seq[scaled_len:]], device=model.device)
                    out, scaled_past = model.bridge(
                        x, return_type="logits_and_cache", past_key_values=scaled_past
                    )
                    scaled_len = len(seq)
                else:
                    x = torch.as_tensor([seq], device=model.device)
                    out = model.bridge(x, return_type="logits")
            logits = out[0, -1].float().cpu()
        nxt = int(torch.argmax(logits))
        hs.append(s.h)
        probs.append(s.probability)
        flags.append(act)
        chosen.append(nxt)
        base.append(int(torch.argmax(s.logits)))
        if options.keep_logits:
            used_logits.append(logits.numpy().copy())
            base_logits.append(s.logits.numpy().copy())
        if nxt in stops:
            stop = "eos"
            break
        answer.append(nxt)
    seconds = time.perf_counter() - t0
    text = decode(
        model.tokenizer, answer, skip_special_tokens=False, clean_up_tokenization_spaces=False
    )
    return AARFResult(
        prompt=prompt,
        text=text,
        token_ids=tuple(answer),
        stop=stop,
        h=np.asarray(hs, dtype=np.float64),
        probability=np.asarray(probs, dtype=np.float64),
        intervened=np.asarray(flags, dtype=bool),
        step_tokens=np.asarray(chosen, dtype=np.int64),
        base_tokens=np.asarray(base, dtype=np.int64),
        score_scale=score,
        tau=float(tau),
        alpha2=float(alpha2),
        beta2=float(beta2),
        heads=heads,
        layers=layers,
        detector=str(getattr(detector, "name", DETECTORS.explained("head-tokens"))),
        plain=baseline,
        seconds=seconds,
        step_logits=np.stack(used_logits) if options.keep_logits else None,
        base_logits=np.stack(base_logits) if options.keep_logits else None,
    )


# --------------------------------------------------------------------------- re-scoring


@dataclass(frozen=True, kw_only=True)
class AnswerScore:
    """One detector's verdict on one answer.

    Attributes:
        answer: The answer's label (e.g. ``plain``, ``aarf``).
        detector: Detector name.
        score: Response score in [0, 1] (``None`` when the answer could not be read).
        hallucinated: The detector's call at its threshold (``None`` likewise).
        error: Why the answer could not be scored (e.g. it is empty).
    """

    answer: str
    detector: str
    score: float | None
    hallucinated: bool | None
    error: str | None = None


@dataclass(frozen=True, kw_only=True)
class AnswerScores:
    """Several answers to one prompt, each scored by several detectors."""

    rows: tuple[AnswerScore, ...]

    def score(self, answer: str, detector: str) -> float | None:
        """The score of ``answer`` by ``detector``."""
        for r in self.rows:
            if r.answer == answer and r.detector == detector:
                return r.score
        raise KeyError(f"no row for answer {answer!r} and detector {detector!r}")

    def to_frame(self) -> pd.DataFrame:
        """Long table: one row per (answer, detector)."""
        import pandas as pd

        return pd.DataFrame(
            [dataclasses.asdict(r) for r in self.rows],
            columns=["answer", "detector", "score", "hallucinated", "error"],
        )


def rescore_answers(
    model: LoadedModel,
    example_or_prompt: RAGExample | AnswerPrompt,
    answers: Mapping[str, str],
    detectors: Sequence[Detector],
) -> AnswerScores:
    """Score each answer as the response to the same prompt with every fitted detector.

    Each answer is analysed as an unlabelled response (no gold spans), one
    traced pass per answer for all detectors together
    (:func:`core.pipeline.extract.run_example`). An answer that cannot be analysed (an
    empty one, for instance) gets rows with ``score=None`` and the reason.

    Args:
        model: The loaded model the detectors were fitted on.
        example_or_prompt: The prompt the answers respond to.
        answers: Label -> answer text (e.g. :meth:`AARFResult.answers`).
        detectors: Fitted detectors.
    """

    prompt = _as_prompt(example_or_prompt)
    rows: list[AnswerScore] = []
    for label, text in answers.items():
        try:
            ex = prompt.example(text, id=f"{prompt.id}:{label}")
            feats = run_example(model, ex, detectors)
        except DataError as e:
            rows += [
                AnswerScore(
                    answer=label, detector=d.name, score=None, hallucinated=None, error=str(e)
                )
                for d in detectors
            ]
            continue
        for d in detectors:
            v = d.predict(feats[d.name])
            rows.append(
                AnswerScore(
                    answer=label, detector=d.name, score=v.score, hallucinated=v.hallucinated
                )
            )
    return AnswerScores(rows=tuple(rows))
