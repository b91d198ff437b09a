"""A trace's memory is estimated from its plan and refused before the work when it would
exceed the budget (issue 68): sizes, the budget's variable, the message, the estimate
against the kept bytes, and a refusal that runs no pass."""

from __future__ import annotations

import pytest

from core.base.errors import DataError
from core.engine.layout import render
from core.engine.memory import (
    BUDGET_ENV,
    DEFAULT_SHARE,
    LONG_INPUT,
    MemoryBudgetError,
    TraceCost,
    check_budget,
    describe_cost,
    machine_bytes,
    memory_budget,
    parse_size,
)
from core.engine.trace import HOOK_KINDS, Needs, trace, trace_cost

GIB = 2**30


@pytest.mark.parametrize(
    ("text", "n"),
    [("6G", 6 * GIB), ("6 GiB", 6 * GIB), ("4096M", 4 * GIB), ("1.5g", int(1.5 * GIB)),
     ("123456", 123456), ("2gb", 2 * GIB), ("512k", 512 * 1024)],
)  # fmt: skip
def test_sizes(text: str, n: int) -> None:
    assert parse_size(text) == n


@pytest.mark.parametrize("bad", ["", "lots", "-1G", "0", "6X", "1e99999G", "nanG"])
def test_a_bad_size_names_the_variable_and_the_fix(bad: str) -> None:
    with pytest.raises(DataError, match=BUDGET_ENV):
        parse_size(bad)


def test_the_budget_is_the_variable_else_a_share_of_the_machine() -> None:
    assert memory_budget({BUDGET_ENV: "3G"}) == 3 * GIB
    assert memory_budget({}) == int(machine_bytes() * DEFAULT_SHARE)
    with pytest.raises(DataError, match=BUDGET_ENV):
        memory_budget({BUDGET_ENV: "plenty"})


def _cost(tokens: int, total: int) -> TraceCost:
    return TraceCost(tokens=tokens, kept=total, attention=0, cache=0, features=0)


def test_over_the_budget_is_refused_with_the_size_and_what_fits() -> None:
    check_budget(_cost(8000, GIB), budget=3 * GIB, held=GIB)  # 2 GiB of 3: fits
    with pytest.raises(MemoryBudgetError) as got:
        check_budget(_cost(8000, 4 * GIB), budget=3 * GIB, held=GIB, fits=4000, source="a-1")
    msg = str(got.value)
    assert msg.startswith("a-1: this input is 8,000 tokens")
    assert "about 4,000 tokens would fit" in msg and "3.0 GiB" in msg and BUDGET_ENV in msg
    assert "--set fast" in msg  # and the other ways out
    assert got.value.budget == 3 * GIB and got.value.cost.total == 4 * GIB
    with pytest.raises(MemoryBudgetError, match="holds more than that already"):
        check_budget(_cost(100, 1), budget=GIB, held=2 * GIB, fits=0)


def test_a_page_says_a_long_inputs_memory_and_a_refusal_before_the_click() -> None:
    short = _cost(LONG_INPUT, GIB // 4)
    assert describe_cost(short, budget=4 * GIB, held=GIB) is None  # nothing to say
    long = _cost(LONG_INPUT + 1, GIB // 4)
    said = describe_cost(long, budget=4 * GIB, held=GIB)
    assert said is not None and "of the 4.0 GiB budget" in said and "1,025-token" in said
    over = describe_cost(short, budget=GIB, held=GIB)
    assert over is not None and "it will be refused" in over


def test_the_estimate_counts_exactly_what_the_trace_keeps(tiny_model, toy_example) -> None:
    lay = render(toy_example, tiny_model)
    needs = Needs.of(
        HOOK_KINDS, n_layers=tiny_model.info.n_layers, positions=("response", "generation")
    )
    cost = trace_cost(tiny_model, [lay], needs)
    assert cost.kept == trace(tiny_model, lay, needs).nbytes
    assert cost.tokens == len(lay) and cost.cache == 0  # one pass: no chunks cached
    chunked = trace_cost(tiny_model, [lay], needs, chunk_tokens=4)
    assert chunked.cache > 0 and chunked.attention < cost.attention
    assert chunked.kept == cost.kept


def test_a_refused_trace_runs_no_pass(tiny_model, toy_example, monkeypatch) -> None:
    lay = render(toy_example, tiny_model)
    ran: list[object] = []
    monkeypatch.setattr(tiny_model.bridge, "run_with_hooks", lambda *a, **k: ran.append(a))
    monkeypatch.setenv(BUDGET_ENV, "1M")  # less than the process holds already
    with pytest.raises(MemoryBudgetError, match=f"{toy_example.id}: this input is {len(lay)}"):
        trace(tiny_model, lay, Needs.of(["logits"], positions="generation"))
    assert ran == []
