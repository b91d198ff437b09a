"""Batches of unequal lengths (issue 68): a padded pass never pads a short prompt to a
long one, a long prompt is traced alone (in chunks), and a batch over the memory budget
is halved until it fits, the one answer that never fits refused alone."""

from __future__ import annotations

import sys

import pytest

import core.pipeline.extract as extract
from core.base.errors import DataError
from core.base.examples import RAGExample
from core.detectors import make_detector
from core.engine.memory import MemoryBudgetError, TraceCost
from core.engine.trace import CHUNK_ABOVE, _large_buffers_unmapped
from core.pipeline.extract import LENGTH_SLACK, iter_features, length_groups


def test_groups_by_length_and_long_prompts_alone() -> None:
    lengths = [300, 2000, 310, 5000, 200, 240, 1100, 320]
    groups = length_groups(lengths)
    assert sorted(i for g in groups for i in g) == list(range(len(lengths)))  # each once
    for g in groups:
        got = [lengths[i] for i in g]
        assert max(got) <= LENGTH_SLACK * min(got)  # no short prompt padded to a long one
        if max(got) > CHUNK_ABOVE:
            assert len(g) == 1  # traced alone, in chunks
    assert [lengths[g[0]] for g in groups] == sorted(lengths[g[0]] for g in groups)
    assert [[lengths[i] for i in g] for g in groups][:2] == [[200, 240], [300, 310, 320]]
    assert length_groups([]) == []


def _examples() -> list[RAGExample]:
    sizes = [5, 60, 6, 120, 7, 61]  # words of passage: three lengths, mixed in order
    return [
        RAGExample(
            id=f"x{i}", question="Who built it?", passages=("The bridge stands. " * n,),
            response="Ada built it.",
        )
        for i, n in enumerate(sizes)
    ]  # fmt: skip


def test_a_mixed_batch_is_traced_in_groups_of_like_lengths(tiny_model, monkeypatch) -> None:
    passes: list[list[int]] = []
    real = extract.trace_batch

    def recorded(model, layouts, needs, **kw):
        passes.append([len(lay) for lay in layouts])
        return real(model, layouts, needs, **kw)

    monkeypatch.setattr(extract, "trace_batch", recorded)
    dets = [make_detector("lookback_lens"), make_detector("nll")]
    exs = _examples()
    got = list(iter_features(tiny_model, exs, dets, batch_size=6))
    assert [g.example.id for g in got] == [e.id for e in exs]  # in order all the same
    assert all(g.error is None for g in got)
    assert sorted(len(p) for p in passes) == [1, 2, 3]  # the short three, the middle two, one
    for p in passes:
        assert max(p) <= LENGTH_SLACK * min(p), passes


def test_a_batch_over_the_budget_is_halved_and_only_what_never_fits_fails(
    tiny_model, monkeypatch
) -> None:
    real = extract.trace_batch
    cost = TraceCost(tokens=1, kept=1, attention=0, cache=0, features=0)

    def budgeted(model, layouts, needs, **kw):
        # a pass of more than one answer is over the budget, and so is x3 alone
        if len(layouts) > 1 or layouts[0].example_id == "x3":
            raise MemoryBudgetError("over the budget", cost=cost, budget=1, source="t")
        return real(model, layouts, needs, **kw)

    monkeypatch.setattr(extract, "trace_batch", budgeted)
    exs = _examples()
    got = list(
        iter_features(tiny_model, exs, [make_detector("nll")], batch_size=6, on_error="skip")
    )
    failed = {g.example.id: g.error for g in got if g.error is not None}
    assert set(failed) == {"x3"} and isinstance(failed["x3"], DataError)
    assert "over the budget" in str(failed["x3"])
    with pytest.raises(MemoryBudgetError):
        list(iter_features(tiny_model, exs, [make_detector("nll")], batch_size=6))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_large_buffers_are_given_back_to_the_system_on_glibc() -> None:
    """A chunked pass's buffers of a few MB are mapped and unmapped, not left as holes in
    the heap that a growing prompt cannot reuse (at 8k tokens the process otherwise
    peaked at 4-14 GB instead of about 2)."""
    assert _large_buffers_unmapped() is True
