"""The floor on evidence the pages share: correlations and class comparisons from too few
answers say so (core.learning.metrics), and the pages draw them greyed (app.components.charts)."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from app.components.charts import GREY, greyed
from core.analysis.detector_agreement import VerdictTable, agreement_evidence
from core.analysis.heads_layers import HeadStats
from core.learning.metrics import MIN_CLASS_ANSWERS, MIN_CORRELATION_ANSWERS, correlation_warning


def test_correlations_need_a_stated_number_of_answers() -> None:
    few = correlation_warning(3)
    assert few and "come from 3 answers" in few
    assert f"({MIN_CORRELATION_ANSWERS - 3} more answers needed)" in few
    assert correlation_warning(1) and "1 answer:" in correlation_warning(1)
    assert correlation_warning(MIN_CORRELATION_ANSWERS) is None


def _table(n: int, gold: list[int]) -> VerdictTable:
    rng = np.random.default_rng(0)
    return VerdictTable(
        example_ids=tuple(f"e{i}" for i in range(n)),
        detectors=("a", "b"),
        scores=rng.random((n, 2)),
        calls=np.zeros((n, 2), dtype=np.int8),
        gold=np.asarray(gold, dtype=np.int8),
    )


def test_agreement_says_when_its_correlations_and_gold_comparisons_are_thin() -> None:
    corr, gold = agreement_evidence(_table(4, [1, 0, -1, -1]))
    assert corr and "come from 4 answers" in corr
    assert gold and "1 hallucinated and 1 faithful" in gold
    n = MIN_CORRELATION_ANSWERS
    labels = [1] * MIN_CLASS_ANSWERS + [0] * (n - MIN_CLASS_ANSWERS)
    assert agreement_evidence(_table(n, labels)) == (None, None)


def _stats(n_faithful: int, n_hallucinated: int, level: str = "response") -> HeadStats:
    grid = np.zeros((2, 3))
    return HeadStats(
        level=level,  # type: ignore[arg-type]
        model="m",
        ecs_faithful=grid,
        ecs_hallucinated=grid,
        ecs_r=grid,
        pks_faithful=np.zeros(2),
        pks_hallucinated=np.zeros(2),
        pks_r=np.zeros(2),
        n_faithful=n_faithful,
        n_hallucinated=n_hallucinated,
    )


def test_head_statistics_say_how_many_more_answers_they_need() -> None:
    thin = _stats(1, 1).evidence
    assert thin and "1 hallucinated and 1 faithful" in thin and "9 more answers of each" in thin
    assert "sentences" in (_stats(2, 30, "chunk").evidence or "")
    assert _stats(MIN_CLASS_ANSWERS, MIN_CLASS_ANSWERS).evidence is None


def test_greyed_draws_every_trace_in_grey_with_a_note() -> None:
    fig = go.Figure([go.Heatmap(z=[[1, -1]]), go.Bar(y=[1, 2]), go.Scatter(y=[1, 2])])
    out = greyed(fig, "thin")
    heat, bar, line = out.data
    assert heat.colorscale == go.Heatmap(colorscale="Greys").colorscale
    assert bar.marker.color == GREY and line.line.color == GREY
    assert [a.text for a in out.layout.annotations] == ["thin"]
