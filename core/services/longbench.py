"""``ragscope bench --long``: long prompts' peak memory and time (issue 68).

For each prompt size (tokens of the whole layout) and each answer (a short one and a
long one), three runs, each in its own subprocess so that its peak resident memory
(``ru_maxrss``) is its own: a plain forward pass (the model as Hugging Face runs it,
PyTorch's fused attention, no hooks), and judging with the ``fast`` and the ``default``
set. Each judged row also gives the estimate the budget check makes before the work
(:func:`core.pipeline.extract.example_cost`, over what the process held then), so the
bench verifies the accounting that refuses inputs; a run the budget refuses is a row
that says so.

The prompts are real passages: the built-in demo examples' passages concatenated (each
once per round) until the layout reaches the size, the last one cut by words; the short
answer is the first demo answer, the long one demo answers joined (:data:`LONG_WORDS`).

    python -m core.services.longbench SPEC TOKENS ANSWER WHAT   # one row, as JSON
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from core.base.errors import RagscopeError
from core.base.examples import RAGExample
from core.data import builtin_examples
from core.engine.layout import render
from core.engine.memory import MemoryBudgetError, gib, process_bytes
from core.engine.model import (
    EMBEDDED,
    LoadedModel,
    embedded_cache_path,
    embedded_tokenizer,
    load_model,
)
from core.pipeline.extract import example_cost
from core.pipeline.judge import judge_answer, warm_up
from core.pipeline.sets import load_set

SIZES: tuple[int, ...] = (1024, 2048, 4096, 8192)
"""The prompt sizes the bench runs by default (tokens of the whole layout)."""

ANSWERS: tuple[str, ...] = ("short", "long")
WHATS: tuple[str, ...] = ("forward", "fast", "default")

LONG_WORDS = 360
"""The long answer: demo answers joined (in turn) until it has this many words (about
500 tokens)."""

ROW_TIMEOUT_S = 1800
"""A row's subprocess is stopped after this long (reported as such)."""


@dataclass(frozen=True, kw_only=True)
class LongRow:
    """One run: ``what`` (forward, fast, default) on a ``tokens``-token prompt.

    Attributes:
        seconds: The forward pass, or the judging, alone (the model loaded before).
        peak_mib: The subprocess's peak resident memory.
        held_mib: What it held just before the work (the model, the set's detectors).
        estimate_mib: The budget check's estimate of the peak (judged rows).
        refused: The budget check's message, when it refused the input.
        error: What went wrong otherwise (a crash, a timeout).
    """

    what: str
    answer: str
    tokens: int
    answer_tokens: int
    seconds: float | None
    peak_mib: float | None
    held_mib: float | None = None
    estimate_mib: float | None = None
    refused: str | None = None
    error: str | None = None


def long_example(model: LoadedModel | object, n_tokens: int, answer: str) -> RAGExample:
    """A RAG example of about ``n_tokens`` (its whole layout) of real passages, with the
    ``short`` or ``long`` answer (module doc)."""
    demo = builtin_examples()
    question = demo[0].question
    response = demo[0].response
    while answer == "long" and len(response.split()) < LONG_WORDS:
        response += " " + demo[len(response.split()) % len(demo)].response
    pool = [p for e in demo for p in e.passages]
    passages: list[str] = [pool[0]]

    def make(ps: Sequence[str]) -> RAGExample:
        return RAGExample(
            id=f"long-{n_tokens}-{answer}", question=question, passages=tuple(ps), response=response
        )

    while len(render(make(passages), model, max_tokens=10**7)) < n_tokens:
        passages.append(pool[len(passages) % len(pool)])
    words = passages[-1].split()
    lo, hi = 1, len(words)  # the most words of the last passage that stay within n_tokens
    while lo < hi:
        mid = (lo + hi + 1) // 2
        trial = [*passages[:-1], " ".join(words[:mid])]
        if len(render(make(trial), model, max_tokens=10**7)) <= n_tokens:
            lo = mid
        else:
            hi = mid - 1
    last = make([*passages[:-1], " ".join(words[:lo])])
    if len(render(last, model, max_tokens=10**7)) > n_tokens and len(passages) > 1:
        return make(passages[:-1])  # not even one word of the last passage fits
    return last


def _mib(n: float) -> float:
    return n / 2**20


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def plain_forward_s(hf: Any, token_ids: Sequence[int], device: str) -> float:
    """Seconds of one plain forward pass of ``hf`` (a Hugging Face causal LM) over
    ``token_ids``, the last position's logits only."""
    import torch

    ids = torch.as_tensor(list(token_ids), device=device).unsqueeze(0)
    with torch.inference_mode():
        hf(ids[:, :16])  # warm up
        t0 = time.perf_counter()
        hf(ids, logits_to_keep=1)
        return time.perf_counter() - t0


def _forward_row(spec: str, n_tokens: int, answer: str) -> LongRow:
    """The plain forward: for the embedded model, Hugging Face's own module with
    PyTorch's fused attention, loaded alone (no bridge, no hooks: the baseline a user
    compares against); another model as ragscope loads it."""
    import torch
    from transformers import AutoModelForCausalLM

    if spec == EMBEDDED:
        tok = embedded_tokenizer()
        hf = AutoModelForCausalLM.from_pretrained(
            embedded_cache_path(), attn_implementation="sdpa", dtype=torch.float32
        )
        layout = render(long_example(tok, n_tokens, answer), tok)
        seconds = plain_forward_s(hf, layout.token_ids.tolist(), "cpu")
    else:
        model = load_model(spec)
        layout = render(long_example(model, n_tokens, answer), model)
        seconds = plain_forward_s(model.hf_model, layout.token_ids.tolist(), model.device)
    return LongRow(
        what="forward",
        answer=answer,
        tokens=len(layout),
        answer_tokens=len(layout.response_positions),
        seconds=seconds,
        peak_mib=_peak_mib(),
    )


def measure(spec: str, n_tokens: int, answer: str, what: str) -> LongRow:
    """One row, in this process (the subprocess's work)."""
    if what == "forward":
        return _forward_row(spec, n_tokens, answer)
    model = load_model(spec)
    example = long_example(model, n_tokens, answer)
    layout = render(example, model)
    base: dict[str, Any] = {
        "what": what,
        "answer": answer,
        "tokens": len(layout),
        "answer_tokens": len(layout.response_positions),
    }
    dset = load_set(model.info.key, None if what == "default" else what)
    judged = dset.for_example(example)
    warm_up(model, judged.fitted)
    held = process_bytes()
    estimate = held + example_cost(model, example, judged.fitted).total
    t0 = time.perf_counter()
    try:
        judge_answer(model, example, dset, by=judged)
    except MemoryBudgetError as e:
        return LongRow(
            **base,
            seconds=None,
            peak_mib=_peak_mib(),
            held_mib=_mib(held),
            estimate_mib=_mib(estimate),
            refused=str(e),
        )
    return LongRow(
        **base,
        seconds=time.perf_counter() - t0,
        peak_mib=_peak_mib(),
        held_mib=_mib(held),
        estimate_mib=_mib(estimate),
    )


def run_row(spec: str, n_tokens: int, answer: str, what: str) -> LongRow:
    """:func:`measure` in a subprocess of its own (its peak is its own)."""
    cmd = [sys.executable, "-m", "core.services.longbench", spec, str(n_tokens), answer, what]
    failed: dict[str, Any] = {
        "what": what,
        "answer": answer,
        "tokens": n_tokens,
        "answer_tokens": 0,
    }
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=ROW_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return LongRow(**failed, seconds=None, peak_mib=None, error=f"over {ROW_TIMEOUT_S} s")
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    if out.returncode != 0 or not lines:
        tail = (out.stderr or out.stdout).strip().splitlines()[-1:] or ["no output"]
        return LongRow(
            **failed, seconds=None, peak_mib=None, error=f"exit {out.returncode}: {tail[0][:300]}"
        )
    return LongRow(**json.loads(lines[-1]))


def run_long_bench(
    spec: str = EMBEDDED,
    sizes: Sequence[int] = SIZES,
    answers: Sequence[str] = ANSWERS,
    whats: Sequence[str] = WHATS,
    log: Callable[[str], None] | None = None,
) -> list[LongRow]:
    """Every row, one subprocess each (module doc)."""
    rows = []
    for n in sizes:
        for answer in answers:
            for what in whats:
                if log:
                    log(f"long prompt: {what}, {n} tokens, {answer} answer ...")
                rows.append(run_row(spec, n, answer, what))
                if log:  # each row as it comes: a long run's partial results are kept
                    log(json.dumps(asdict(rows[-1])))
    return rows


def long_text(rows: Sequence[LongRow]) -> str:
    """The rows as a table, each judged row's time also as a ratio to the plain forward
    of the same prompt (measured in the same run)."""
    fwd = {(r.tokens, r.answer): r.seconds for r in rows if r.what == "forward"}
    lines = [
        "| tokens (answer) | run | seconds | x plain forward | peak RSS | estimated |",
        "| --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        f = fwd.get((r.tokens, r.answer))
        ratio = f"{r.seconds / f:.2f}" if r.seconds and f and r.what != "forward" else ""
        secs = (
            f"{r.seconds:.1f}"
            if r.seconds is not None
            else ("refused" if r.refused else (r.error or ""))
        )
        peak = gib(r.peak_mib * 2**20) if r.peak_mib else ""
        est = gib(r.estimate_mib * 2**20) if r.estimate_mib else ""
        lines.append(
            f"| {r.tokens:,} ({r.answer_tokens}) | {r.what} | {secs} | {ratio} | {peak} | {est} |"
        )
    return "\n".join(lines)


def long_dicts(rows: Sequence[LongRow]) -> list[dict[str, object]]:
    return [asdict(r) for r in rows]


def main(argv: Sequence[str] | None = None) -> int:
    """One row as a JSON line on stdout: ``SPEC TOKENS ANSWER WHAT``."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 4 or args[2] not in ANSWERS or args[3] not in WHATS:
        print(f"usage: SPEC TOKENS {'|'.join(ANSWERS)} {'|'.join(WHATS)}", file=sys.stderr)
        return 2
    try:
        row = measure(args[0], int(args[1]), args[2], args[3])
    except (RagscopeError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(json.dumps(asdict(row)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
