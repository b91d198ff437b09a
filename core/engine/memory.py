"""What a traced pass costs in memory, said before the work (issue 68).

A trace's peak is the process as it stands (the model's weights, what it holds) plus:

- the activations it keeps (:attr:`TraceCost.kept`: each hook's rows at its positions,
  known exactly from the needs and the layout before the pass);
- the attention the model computes on the way (:attr:`TraceCost.attention`): the
  scores and their softmax of one layer at a time, ``[head, queries, keys]`` twice in
  float32, where the queries are a chunk's (:data:`core.engine.trace.CHUNK_TOKENS`)
  for a long prompt and every position otherwise;
- the keys and values cached between a long prompt's chunks (:attr:`TraceCost.cache`);
- what the detectors compute from the kept rows (:attr:`TraceCost.features`): copies of
  them in float64 and the like, counted as :data:`FEATURE_COPIES` of the kept bytes, and
  the blocks of their vocabulary-wide lens products (:data:`LENS_BLOCK` rows).

``ragscope bench --long`` measures the real peaks (``ru_maxrss`` in a subprocess) beside
this estimate. Before tracing, :func:`check_budget` refuses an input whose estimate
exceeds the budget (``RAGSCOPE_MEMORY_BUDGET``, default :data:`DEFAULT_SHARE` of the
machine's memory), naming its size and what would fit, instead of letting the process
be killed.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

import psutil

from core.base.errors import DataError

BUDGET_ENV = "RAGSCOPE_MEMORY_BUDGET"
"""A process's memory budget for tracing, e.g. ``6G``, ``4096M`` or bytes."""

DEFAULT_SHARE = 0.6
"""Without :data:`BUDGET_ENV`, the budget is this share of the machine's memory."""

FEATURE_COPIES = 2.0
"""The detectors' own work on a trace, in copies of its kept bytes (float64 copies of
the rows they read; measured by ``ragscope bench --long``)."""

LENS_BLOCK = 4 * 256
"""Rows of the vocabulary the detectors' lens products hold at once (blocks of 256 rows,
:data:`core.signals.attribution.PROBE_CHUNK`, and their softmax copies), counted with
:data:`FEATURE_COPIES` as their work."""

ATTENTION_COPIES = 6
"""Tensors of one layer's ``[head, queries, keys]`` attention alive at once in the
model's eager attention (the scores, scaled, masked, their softmax, its copies on the
way to the hook), as measured by ``ragscope bench --long``."""

_UNITS = {"": 1, "b": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}
_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([kmgt]?)(?:i?b)?\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """Bytes of a size such as ``5G``, ``5 GiB``, ``4096M``, ``1.5g`` or ``123456``.

    Raises:
        DataError: Not a size.
    """
    m = _SIZE.match(text)
    if m is None:
        raise DataError(
            f"{text[:40]!r} is not a size; write e.g. 6G, 4096M or a number of bytes",
            source=BUDGET_ENV,
        )
    n = float(m.group(1)) * _UNITS[m.group(2).lower()]
    if not math.isfinite(n) or n < 1:
        raise DataError(f"{text[:40]!r} is not a usable size", source=BUDGET_ENV)
    return int(n)


def machine_bytes() -> int:
    """The machine's physical memory."""
    return int(psutil.virtual_memory().total)


def memory_budget(env: Mapping[str, str] | None = None) -> int:
    """The budget in bytes: ``RAGSCOPE_MEMORY_BUDGET`` when set, else
    :data:`DEFAULT_SHARE` of the machine's memory.

    Raises:
        DataError: The variable is not a size.
    """
    raw = (os.environ if env is None else env).get(BUDGET_ENV, "").strip()
    if raw:
        return parse_size(raw)
    return int(machine_bytes() * DEFAULT_SHARE)


def process_bytes() -> int:
    """This process's resident memory now."""
    return int(psutil.Process().memory_info().rss)


def gib(n: float) -> str:
    """``n`` bytes in GiB (or MiB below one), for a message."""
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


@dataclass(frozen=True, kw_only=True)
class TraceCost:
    """The bytes a traced pass adds to the process (see the module doc).

    Attributes:
        tokens: The longest layout's tokens.
        kept: The activations kept.
        attention: One layer's attention while it is computed.
        cache: The keys and values cached between chunks (0 in one pass).
        features: The detectors' work on the kept activations.
    """

    tokens: int
    kept: int
    attention: int
    cache: int
    features: int

    @property
    def total(self) -> int:
        return self.kept + self.attention + self.cache + self.features

    def __add__(self, other: TraceCost) -> TraceCost:
        """Two passes held together (a no-context pass run while the first is kept): the
        longer's tokens, the kept activations, the caches and the work of both, the
        larger attention (one layer at a time)."""
        return TraceCost(
            tokens=max(self.tokens, other.tokens),
            kept=self.kept + other.kept,
            attention=max(self.attention, other.attention),
            cache=max(self.cache, other.cache),
            features=self.features + other.features,
        )


LONG_INPUT = 1024
"""Inputs longer than this many tokens are long: a page says their memory before the
click, and the trace runs them in chunks (:data:`core.engine.trace.CHUNK_ABOVE`)."""


def describe_cost(
    cost: TraceCost, *, budget: int | None = None, held: int | None = None
) -> str | None:
    """The memory a pass will take, in words (Markdown), against the budget: what a page
    shows before its button; ``None`` for an input that is not long
    (:data:`LONG_INPUT`) and fits."""
    limit = memory_budget() if budget is None else budget
    now = process_bytes() if held is None else held
    need = now + cost.total
    if need <= limit and cost.tokens <= LONG_INPUT:
        return None
    if need > limit:
        return (
            f"Memory: this {cost.tokens:,}-token input needs about **{gib(need)}** "
            f"({gib(cost.total)} for the pass), over the budget of {gib(limit)} "
            f"({BUDGET_ENV}): it will be refused. Send fewer passages or a shorter answer, or "
            "choose a lighter set."
        )
    return (
        f"Memory: about **{gib(need)}** of the {gib(limit)} budget for this "
        f"{cost.tokens:,}-token input ({gib(cost.total)} for the pass)."
    )


class MemoryBudgetError(DataError):
    """An input whose trace would exceed the memory budget: refused before the work.

    Attributes:
        cost: The estimate.
        budget: The budget it exceeds.
    """

    def __init__(self, message: str, *, cost: TraceCost, budget: int, source: str | None):
        super().__init__(message, source=source)
        self.cost = cost
        self.budget = budget


def check_budget(
    cost: TraceCost,
    *,
    source: str | None = None,
    fits: int | None = None,
    budget: int | None = None,
    held: int | None = None,
) -> None:
    """Refuse, before the pass, a trace whose estimate with what the process holds now
    exceeds the budget.

    Args:
        cost: The trace's estimate.
        source: The input, for the message (an example id).
        fits: About how many tokens would fit the budget, for the message.
        budget: The budget (default :func:`memory_budget`).
        held: What the process holds now (default :func:`process_bytes`).

    Raises:
        MemoryBudgetError: Over the budget.
    """
    limit = memory_budget() if budget is None else budget
    now = process_bytes() if held is None else held
    if now + cost.total <= limit:
        return
    if now >= limit:
        room = "; the process holds more than that already, before any pass"
    elif fits is not None and 0 < fits < cost.tokens:
        room = f"; about {fits:,} tokens would fit"
    else:
        room = ""
    raise MemoryBudgetError(
        f"this input is {cost.tokens:,} tokens; tracing it needs about "
        f"{gib(now + cost.total)} ({gib(now)} already held, {gib(cost.total)} for the pass), "
        f"over the memory budget of {gib(limit)}{room}. Judge it with a lighter set "
        "(e.g. --set fast), send fewer passages or a shorter answer, or raise "
        f"{BUDGET_ENV} (e.g. {BUDGET_ENV}=8G) on a machine that has the memory",
        cost=cost,
        budget=limit,
        source=source,
    )
