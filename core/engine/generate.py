"""Answer generation for an example's prompt: greedy or sampled, streamed.

The prompt is laid out exactly as :func:`core.engine.layout.render` lays it out, so a
generated answer analysed afterwards is read in the context it was written in.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from core.base.errors import DataError
from core.base.examples import RAGExample
from core.engine.layout import encode_prompt, prompt_pieces
from core.engine.model import LoadedModel, decode

if TYPE_CHECKING:
    import torch

StopReason = Literal["eos", "max_tokens", "cancelled"]


@dataclass(frozen=True, kw_only=True)
class GenerationConfig:
    """How to generate.

    Attributes:
        max_new_tokens: Stop after this many tokens.
        temperature: 0 for greedy decoding; > 0 samples.
        top_p: Nucleus sampling mass (sampling only).
        seed: Seed for sampling (``None``: not reproducible).
    """

    max_new_tokens: int = 128
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = 0

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")


@dataclass(frozen=True, kw_only=True)
class Generation:
    """A finished answer."""

    text: str
    token_ids: tuple[int, ...]
    stop: StopReason
    seconds: float
    prompt_tokens: int


def stop_ids(model: LoadedModel) -> set[int]:
    tok = model.tokenizer
    ids = {tok.eos_token_id}
    eos_cfg = getattr(model.hf_model.generation_config, "eos_token_id", None)
    if isinstance(eos_cfg, int):
        ids.add(eos_cfg)
    elif isinstance(eos_cfg, list):
        ids.update(eos_cfg)
    return {i for i in ids if i is not None}


class AnswerStream:
    """Iterate to receive the answer as text pieces, token by token.

    After iteration, :attr:`token_ids`, :attr:`stop` and :meth:`result` tell
    what was generated and why it stopped. The stop token is not part of the
    answer. Works directly with ``st.write_stream``.
    """

    def __init__(
        self,
        model: LoadedModel,
        *,
        task: str = "qa",
        question: str | None,
        passages: Sequence[str],
        prompt: str | None = None,
        config: GenerationConfig | None = None,
    ) -> None:
        self.model = model
        self.config = config or GenerationConfig()
        self.should_stop: Callable[[], bool] | None = None
        if not passages or not any(p.strip() for p in passages):
            raise DataError("give at least one non-empty passage to answer from", field="passages")
        pieces = prompt_pieces(task=task, question=question, passages=passages, prompt=prompt)
        self.prompt_ids, _ = encode_prompt(model.tokenizer, pieces)
        if len(self.prompt_ids) + self.config.max_new_tokens > model.info.n_ctx:
            raise DataError(
                f"prompt of {len(self.prompt_ids)} tokens + {self.config.max_new_tokens} new tokens "
                f"exceeds the model's context of {model.info.n_ctx}; shorten the passages"
            )
        self._reset()

    @classmethod
    def from_ids(
        cls,
        model: LoadedModel,
        prompt_ids: Sequence[int],
        config: GenerationConfig | None = None,
        *,
        should_stop: Callable[[], bool] | None = None,
    ) -> AnswerStream:
        """A stream that continues ready-made prompt token ids (e.g. a multi-turn chat).

        ``should_stop`` is asked before every token; when it answers true the stream
        ends there with :attr:`stop` ``"cancelled"`` (a server's client went away).
        """
        self = cls.__new__(cls)
        self.model = model
        self.config = config or GenerationConfig()
        self.should_stop = should_stop
        self.prompt_ids = [int(i) for i in prompt_ids]
        if not self.prompt_ids:
            raise DataError("the prompt has no tokens")
        if len(self.prompt_ids) + self.config.max_new_tokens > model.info.n_ctx:
            raise DataError(
                f"prompt of {len(self.prompt_ids)} tokens + {self.config.max_new_tokens} new tokens "
                f"exceeds the model's context of {model.info.n_ctx}; shorten the passages"
            )
        self._reset()
        return self

    def _reset(self) -> None:
        self.token_ids: list[int] = []
        self.stop: StopReason | None = None
        self.seconds = 0.0
        self._started = False

    def __iter__(self) -> Iterator[str]:
        import torch

        if self._started:
            raise RuntimeError("this stream was already iterated; start a new one")
        self._started = True
        cfg, model = self.config, self.model
        stops = stop_ids(model)
        gen = None
        if cfg.temperature > 0 and cfg.seed is not None:
            gen = torch.Generator(device=model.device).manual_seed(cfg.seed)
        ids = torch.as_tensor([self.prompt_ids], device=model.device)
        past = None
        shown = ""
        t0 = time.perf_counter()
        for _ in range(cfg.max_new_tokens):
            if self.should_stop is not None and self.should_stop():
                self.stop = "cancelled"
                break
            with model.lock, torch.inference_mode():
                res = model.hf_model(input_ids=ids, past_key_values=past, use_cache=True)
            past = res.past_key_values
            nxt = _pick(res.logits[0, -1].float(), cfg, gen)
            if nxt in stops:
                self.stop = "eos"
                break
            self.token_ids.append(nxt)
            text = self.text
            # Hold back a partial multibyte character until its last byte arrives.
            settled = text.rstrip("\ufffd")
            if len(settled) > len(shown):
                yield settled[len(shown) :]
                shown = settled
            ids = torch.as_tensor([[nxt]], device=model.device)
        else:
            self.stop = "max_tokens"
        self.seconds = time.perf_counter() - t0
        if len(self.text) > len(shown):
            yield self.text[len(shown) :]

    @property
    def text(self) -> str:
        return decode(
            self.model.tokenizer,
            self.token_ids,
            skip_special_tokens=False,
            clean_up_tokenization_spaces=False,
        )

    def result(self) -> Generation:
        if self.stop is None:
            raise RuntimeError("iterate the stream to the end before asking for its result")
        return Generation(
            text=self.text,
            token_ids=tuple(self.token_ids),
            stop=self.stop,
            seconds=self.seconds,
            prompt_tokens=len(self.prompt_ids),
        )


def _pick(logits: torch.Tensor, cfg: GenerationConfig, gen: torch.Generator | None) -> int:
    import torch

    if cfg.temperature == 0:
        return int(torch.argmax(logits))
    probs = torch.softmax(logits / cfg.temperature, dim=-1)
    if cfg.top_p < 1:
        sorted_p, order = torch.sort(probs, descending=True)
        cum = torch.cumsum(sorted_p, dim=-1)
        cut = cum - sorted_p > cfg.top_p
        sorted_p[cut] = 0
        probs = torch.zeros_like(probs).scatter(0, order, sorted_p)
        probs /= probs.sum()
    return int(torch.multinomial(probs, 1, generator=gen))


def generate(
    model: LoadedModel, example: RAGExample, config: GenerationConfig | None = None
) -> Generation:
    """Generate a whole answer for ``example``'s question and passages (its response is ignored)."""
    answer = AnswerStream(
        model,
        task=example.task,
        question=example.question,
        passages=example.passages,
        prompt=example.prompt,
        config=config,
    )
    for _ in answer:
        pass
    return answer.result()
