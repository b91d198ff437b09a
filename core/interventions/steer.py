"""SAE steering (RAGLens appendix C): set one SAE feature at one answer position and let
the model continue.

:func:`steered` is a context manager: inside it, every forward pass sets SAE feature
``k``'s activation at absolute position ``p`` to ``value`` by adding
``(value - z_k(p)) * W_dec[k]`` to the residual stream the SAE reads
(``blocks.<layer>.hook_resid_post``), where ``z_k(p)`` is the feature's current
(post-TopK) activation there. The hook is removed on exit (also on errors), and the
model's lock is held for the whole block.

:func:`steer_continuation` teacher-forces the answer's first ``position + 1`` tokens,
steers the last of them, and decodes greedily from there (each step re-runs the
whole sequence, so the steered position keeps its value); :func:`steer_values` does
it for several values (the paper's -20 / 0 / 20) side by side.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from core.base.errors import DataError, ModelError
from core.base.examples import RAGExample
from core.engine.generate import stop_ids
from core.engine.layout import render
from core.engine.model import LoadedModel, decode
from core.engine.trace import patched, resid_post_name
from core.signals.sae import LoadedSAE

DEFAULT_VALUES: tuple[float, ...] = (-20.0, 0.0, 20.0)


@contextmanager
def steered(
    model: LoadedModel, sae: LoadedSAE, feature: int, position: int, value: float
) -> Iterator[None]:
    """Inside the block, SAE feature ``feature`` reads ``value`` at absolute ``position``.

    Raises:
        DataError: The feature is outside the SAE, or the position is negative.
        ModelError: The SAE was trained on another model.
    """
    import torch

    sae.check_model(model.info.key, model.info.d_model)
    if not 0 <= feature < sae.d_sae:
        raise DataError(f"SAE feature {feature} is outside 0..{sae.d_sae - 1}", field="feature")
    if position < 0:
        raise DataError(f"position must be >= 0, got {position}", field="position")
    direction = sae.sae.W_dec[feature].detach().to(model.device, torch.float32)

    def hook(act: torch.Tensor, hook: object) -> torch.Tensor:
        if act.shape[1] <= position:
            return act
        x = act[:, position].float()
        z = sae.encode(x.cpu(), "post")[:, feature].to(act.device)
        out = act.clone()
        out[:, position] = (x + (float(value) - z)[:, None] * direction).to(act.dtype)
        return out

    with patched(model, [(resid_post_name(sae.layer), hook)]):
        yield


@dataclass(frozen=True, kw_only=True)
class Steering:
    """One steered continuation.

    Attributes:
        feature: The SAE feature set.
        position: The answer token (index in the answer) it was set at.
        value: The activation it was set to (``None``: not steered).
        prefix: The teacher-forced answer text up to and including that token.
        continuation: What the model wrote after it.
        token_ids: The continuation's token ids.
    """

    feature: int
    position: int
    value: float | None
    prefix: str
    continuation: str
    token_ids: tuple[int, ...]


def steer_continuation(
    model: LoadedModel,
    sae: LoadedSAE,
    example: RAGExample,
    *,
    feature: int,
    position: int,
    value: float | None,
    max_new_tokens: int = 32,
) -> Steering:
    """Greedy continuation of the answer's first ``position + 1`` tokens with the feature
    set to ``value`` at that token (``None``: no steering, the reference).

    Raises:
        DataError: ``position`` is not an answer token, or the layout is too long.
    """
    import torch

    layout = render(example, model)
    resp = layout.response_positions
    if not 0 <= position < len(resp):
        raise DataError(
            f"position {position} is not an answer token (the answer has {len(resp)})",
            field="position",
        )
    if max_new_tokens < 1:
        raise DataError("max_new_tokens must be >= 1", field="max_new_tokens")
    ids = list(layout.token_ids[: int(resp[position]) + 1])
    if len(ids) + max_new_tokens > model.info.n_ctx:
        raise DataError("the prompt and continuation exceed the model's context; shorten it")
    stops = stop_ids(model)
    out: list[int] = []
    abs_pos = int(resp[position])

    def run() -> None:
        with torch.inference_mode():
            for _ in range(max_new_tokens):
                logits = model.bridge(torch.as_tensor([ids + out], device=model.device))
                nxt = int(logits[0, -1].argmax())
                if nxt in stops:
                    break
                out.append(nxt)

    if value is None:
        with model.lock:
            run()
    else:
        with steered(model, sae, feature, abs_pos, value):
            run()
    tok = model.tokenizer
    prefix_ids = [int(i) for i in layout.token_ids[int(resp[0]) : abs_pos + 1]]
    return Steering(
        feature=feature,
        position=position,
        value=value,
        prefix=decode(tok, prefix_ids, clean_up_tokenization_spaces=False),
        continuation=decode(tok, out, clean_up_tokenization_spaces=False),
        token_ids=tuple(out),
    )


def steer_values(
    model: LoadedModel,
    sae: LoadedSAE,
    example: RAGExample,
    *,
    feature: int,
    position: int,
    values: Sequence[float] = DEFAULT_VALUES,
    max_new_tokens: int = 32,
) -> list[Steering]:
    """:func:`steer_continuation` for each value (the paper's -20 / 0 / 20 by default)."""
    if not values:
        raise ModelError("give at least one steering value")
    return [
        steer_continuation(
            model,
            sae,
            example,
            feature=feature,
            position=position,
            value=v,
            max_new_tokens=max_new_tokens,
        )
        for v in values
    ]
